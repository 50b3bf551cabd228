/* A program that closes every descriptor it did not open (as daemons and some launchers do)
 * while its memory is swapped out.
 * Usage: closefds libc  — close() on every fd from 3 up, then close_range(3, ~0) and
 *                         closefrom(3): the shim keeps the pager's own descriptors open, so
 *                         every byte must come back. Then, as a process launcher's
 *                         child does (the JDK's jspawnhelper puts its error pipe on fd 3),
 *                         it dups a descriptor onto every fd from 3 to 40: each dup must
 *                         succeed (the pager's own descriptors sit above the low ones).
 *                         Exit 0: every byte right and every dup done.
 *        closefds raw   — the raw close syscall on every fd from 3 up, past the shim: the pager
 *                         loses its userfaultfd and must abort the process with a message,
 *                         never hang it and never hand out wrong bytes. The program then
 *                         waits on a pipe nobody writes: only the pager can end it. */
#include "common.h"

#include <sys/resource.h>
#include <sys/syscall.h>

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "libc") && strcmp(argv[1], "raw"))) {
        fprintf(stderr, "usage: closefds libc|raw\n");
        return 2;
    }
    int raw = !strcmp(argv[1], "raw");
    size_t n = 24 * MIB;
    uint8_t *a = xmalloc(n);
    uint8_t *b = xmmap(n);
    fill(a, n, 7);
    fill(b, n, 8);
    struct rlimit lim;
    if (getrlimit(RLIMIT_NOFILE, &lim)) die("getrlimit");
    int wait_pipe[2];
    if (pipe(wait_pipe)) die("pipe");
    for (int fd = 3; fd < (int)lim.rlim_cur && fd < 65536; fd++) {
        if (fd == wait_pipe[0] || fd == wait_pipe[1]) continue;
        if (raw)
            syscall(SYS_close, fd);
        else
            close(fd);
    }
    if (raw) {
        /* Touch memory that is swapped out: the pager is gone, so it must abort us. */
        volatile uint8_t sink = 0;
        for (size_t off = 0; off < n; off += PAGE_BYTES) sink ^= a[off];
        char c;
        (void)!read(wait_pipe[0], &c, 1);
        fprintf(stderr, "closefds raw: still running after the pager lost its userfaultfd (sink %u)\n", sink);
        return 1 + check("a after raw close", a, n, 7);
    }
    close_range(3, ~0U, 0);
    closefrom(3);
    int bad = 0;
    for (int fd = 3; fd <= 40; fd++) {
        if (fd == wait_pipe[0] || fd == wait_pipe[1]) continue;
        if (dup2(1, fd) != fd) {
            fprintf(stderr, "MISMATCH dup2 onto fd %d failed: %s\n", fd, strerror(errno));
            bad = 1;
        }
        close(fd);
    }
    bad |= check("malloc'd memory after closing every fd", a, n, 7);
    bad |= check("mmap'd memory after closing every fd", b, n, 8);
    if (!bad) printf("closefds ok\n");
    return bad;
}
