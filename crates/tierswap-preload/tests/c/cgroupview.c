/* Reads a memory cgroup's limit file every way libc opens a file, and other files.
 * Usage: cgroupview LIMIT_FILE OTHER_FILE [PLAIN_FILE]
 * Prints, one line each, the first line of LIMIT_FILE read through open, open64, openat
 * (AT_FDCWD), fopen ("r") and fopen ("re"), each followed by whether the descriptor is
 * close-on-exec (as asked: only "re" and open with O_CLOEXEC are), then "other " and the
 * first line of OTHER_FILE through open; then, given PLAIN_FILE, "plain_open",
 * "plain_open64", "plain_openat" and "plain_fopen" lines for it. A file it cannot open
 * prints "missing". */
#include "common.h"

#include <fcntl.h>

static void from_fd(const char *how, int fd) {
    char buf[64];
    if (fd < 0) {
        printf("%s missing\n", how);
        return;
    }
    int cloexec = (fcntl(fd, F_GETFD) & FD_CLOEXEC) != 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    if (n < 0) die("read");
    buf[n] = 0;
    buf[strcspn(buf, "\n")] = 0;
    printf("%s %s cloexec=%d\n", how, buf, cloexec);
    close(fd);
}

static void from_stream(const char *how, FILE *f) {
    char buf[64];
    if (!f) {
        printf("%s missing\n", how);
        return;
    }
    int cloexec = (fcntl(fileno(f), F_GETFD) & FD_CLOEXEC) != 0;
    if (!fgets(buf, sizeof buf, f)) buf[0] = 0;
    buf[strcspn(buf, "\n")] = 0;
    printf("%s %s cloexec=%d\n", how, buf, cloexec);
    fclose(f);
}

int main(int argc, char **argv) {
    if (argc != 3 && argc != 4) {
        fprintf(stderr, "usage: cgroupview LIMIT_FILE OTHER_FILE [PLAIN_FILE]\n");
        return 2;
    }
    from_fd("open", open(argv[1], O_RDONLY));
    from_fd("open_cloexec", open(argv[1], O_RDONLY | O_CLOEXEC));
    from_fd("open64", open64(argv[1], O_RDONLY));
    from_fd("openat", openat(AT_FDCWD, argv[1], O_RDONLY));
    from_stream("fopen", fopen(argv[1], "r"));
    from_stream("fopen_e", fopen(argv[1], "re"));
    from_fd("other", open(argv[2], O_RDONLY));
    if (argc == 4) {
        from_fd("plain_open", open(argv[3], O_RDONLY));
        from_fd("plain_open64", open64(argv[3], O_RDONLY));
        from_fd("plain_openat", openat(AT_FDCWD, argv[3], O_RDONLY));
        from_stream("plain_fopen", fopen(argv[3], "r"));
    }
    return 0;
}
