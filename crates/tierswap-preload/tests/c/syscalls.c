/* System calls that read or write managed memory while it is swapped out: write() from it
 * into a pipe and a file, read() into it from a pipe and a file, writev/readv, send/recv over
 * a socketpair. Usage: syscalls DIR (a directory for the scratch file). Exit 0: every byte
 * right; 1: a mismatch (printed); 99: a call failed. */
#include "common.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/uio.h>

#define CHUNK (256 * 1024)

static void write_all(int fd, const uint8_t *p, size_t n, const char *what) {
    while (n) {
        ssize_t w = write(fd, p, n);
        if (w < 0) {
            if (errno == EINTR) continue;
            die(what);
        }
        p += w;
        n -= (size_t)w;
    }
}

static void read_all(int fd, uint8_t *p, size_t n, const char *what) {
    while (n) {
        ssize_t r = read(fd, p, n);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            if (r == 0) errno = EPIPE;
            die(what);
        }
        p += r;
        n -= (size_t)r;
    }
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: syscalls DIR\n");
        return 2;
    }
    size_t n = 24 * MIB;
    uint8_t *a = xmalloc(n); /* the malloc family */
    uint8_t *b = xmmap(n);   /* plain mmap */
    uint8_t *c = xmalloc(n);
    fill(a, n, 1);
    fill(b, n, 2);
    fill(c, n, 3);
    int bad = 0;

    /* 1. pipe: write() from a (mostly swapped out by now), read() into c (swapped out too). */
    int p[2];
    if (pipe(p)) die("pipe");
    if (fcntl(p[1], F_SETPIPE_SZ, CHUNK) < 0) die("F_SETPIPE_SZ");
    for (size_t off = 0; off < n; off += CHUNK) {
        write_all(p[1], a + off, CHUNK, "write to pipe");
        read_all(p[0], c + off, CHUNK, "read from pipe");
    }
    bad |= check("pipe: read() into c", c, n, 1);
    close(p[0]);
    close(p[1]);

    /* 2. file: one write() of all of b, then read() the file back into a. */
    char path[4096];
    snprintf(path, sizeof path, "%s/syscalls.%d", argv[1], (int)getpid());
    int fd = open(path, O_RDWR | O_CREAT | O_TRUNC, 0600);
    if (fd < 0) die("open scratch file");
    unlink(path);
    write_all(fd, b, n, "write b to file");
    if (lseek(fd, 0, SEEK_SET) != 0) die("lseek");
    read_all(fd, a, n, "read file into a");
    bad |= check("file: read() into a", a, n, 2);

    /* 3. pwritev from pieces of c and b, preadv back into pieces of a, crossing pages. */
    struct iovec wv[2] = {{c + 4000, 3 * MIB + 100}, {b + 5 * MIB + 8, 2 * MIB}};
    if (pwritev(fd, wv, 2, 0) != (ssize_t)(5 * MIB + 100)) die("pwritev");
    struct iovec rv[2] = {{a + 12345, 1 * MIB}, {a + 8 * MIB, 4 * MIB + 100}};
    if (preadv(fd, rv, 2, 0) != (ssize_t)(5 * MIB + 100)) die("preadv");
    bad |= check_at("preadv: first piece", a + 12345, 1 * MIB, 1, 4000);
    bad |= check_at("preadv: second piece from c", a + 8 * MIB, 2 * MIB + 100, 1, 4000 + 1 * MIB);
    bad |= check_at("preadv: second piece from b", a + 10 * MIB + 100, 2 * MIB, 2, 5 * MIB + 8);
    close(fd);
    /* a is file content again except where preadv wrote: put it back to stream 2 for the end. */
    fill_at(a + 12345, 1 * MIB, 2, 12345);
    fill_at(a + 8 * MIB, 4 * MIB + 100, 2, 8 * MIB);

    /* 4. socketpair: send() from b, recv() into c, in chunks that fit the socket buffer. */
    int sv[2];
    if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv)) die("socketpair");
    /* 64 KiB at a time: less than an AF_UNIX socket buffer, so send() never waits for recv(). */
    for (size_t off = 0; off < n; off += 64 * 1024) {
        if (send(sv[0], b + off, 64 * 1024, 0) != 64 * 1024) die("send");
        if (recv(sv[1], c + off, 64 * 1024, MSG_WAITALL) != 64 * 1024) die("recv");
    }
    bad |= check("socket: recv() into c", c, n, 2);
    close(sv[0]);
    close(sv[1]);

    /* 5. O_DIRECT: the device reads from and writes into the pages themselves (pinned while
     * the IO runs). b is page-aligned (mmap). Skipped where the filesystem refuses O_DIRECT. */
    snprintf(path, sizeof path, "%s/direct.%d", argv[1], (int)getpid());
    fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_DIRECT, 0600);
    if (fd >= 0) {
        unlink(path);
        if (pwrite(fd, b, 8 * MIB, 0) != (ssize_t)(8 * MIB)) die("O_DIRECT pwrite");
        fill(b, 8 * MIB, 9);
        bad |= check("b overwritten before the O_DIRECT read", b, 8 * MIB, 9);
        if (pread(fd, b, 8 * MIB, 0) != (ssize_t)(8 * MIB)) die("O_DIRECT pread");
        bad |= check("O_DIRECT pread into b", b, 8 * MIB, 2);
        close(fd);
        printf("O_DIRECT checked\n");
    } else if (errno != EINVAL) {
        die("open O_DIRECT");
    }

    /* 6. vmsplice: the pipe holds references to c's pages until they are read out. */
    if (pipe(p)) die("pipe for vmsplice");
    if (fcntl(p[1], F_SETPIPE_SZ, CHUNK) < 0) die("F_SETPIPE_SZ");
    for (size_t off = 0; off < n; off += CHUNK) {
        struct iovec iov = {c + off, CHUNK};
        size_t got = 0;
        while (iov.iov_len) {
            ssize_t w = vmsplice(p[1], &iov, 1, 0);
            if (w <= 0) die("vmsplice");
            iov.iov_base = (uint8_t *)iov.iov_base + w;
            iov.iov_len -= (size_t)w;
            /* Drain what went in, into a (a different buffer, the same stream offsets). */
            read_all(p[0], a + off + got, (size_t)w, "read vmspliced");
            got += (size_t)w;
        }
    }
    bad |= check("vmsplice from c, read into a", a, n, 2);
    close(p[0]);
    close(p[1]);

    /* Everything once more, after all the swapping the calls caused. */
    bad |= check("a at the end", a, n, 2);
    bad |= check("b at the end", b, n, 2);
    bad |= check("c at the end", c, n, 2);
    free(a);
    free(c);
    munmap(b, n);
    if (!bad) printf("syscalls ok\n");
    return bad;
}
