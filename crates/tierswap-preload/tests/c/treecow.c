/* A saving child beside a writing parent, as in a redis BGSAVE: the parent fills PARENT_MIB
 * (resident: the tree's budget holds it), forks a child that reads all of it (pages still
 * shared copy-on-write with the parent, which the child's own pager takes over as shared),
 * then rewrites all of it, 1 MiB every 10 ms: each write gives the parent a new copy and
 * leaves the old one mapped by the child alone. The child holds HOLD_MS after the parent's
 * last write and reads everything again. Every byte the child reads must be the fork-time
 * bytes, every byte the parent reads its own rewrite.
 * Usage: treecow PARENT_MIB HOLD_MS
 * Prints "treecow ok" and exits 0 when every byte was right. */
#include "common.h"

#include <sys/wait.h>

#define SEED_FORK 7
#define SEED_REWRITE 9

static void send_byte(int fd) {
    char c = 'x';
    if (write(fd, &c, 1) != 1)
        die("write to a pipe");
}

static void wait_byte(int fd) {
    char c;
    for (;;) {
        ssize_t r = read(fd, &c, 1);
        if (r == 1)
            return;
        if (r < 0 && errno == EINTR)
            continue;
        die("read from a pipe");
    }
}

static int child(const uint8_t *mem, size_t len, int hold_ms, int to_parent, int from_parent) {
    /* A worker, not a child about to exec: its own pager starts at its first allocation
     * this long after the fork. */
    usleep(30000);
    free(xmalloc(64));
    int bad = check("the child's first read of what it inherited", mem, len, SEED_FORK);
    send_byte(to_parent);
    wait_byte(from_parent);
    usleep((useconds_t)hold_ms * 1000);
    bad |= check("the child's read after the parent's rewrite", mem, len, SEED_FORK);
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: treecow PARENT_MIB HOLD_MS\n");
        return 2;
    }
    size_t len = (size_t)atol(argv[1]) * MIB;
    int hold_ms = atoi(argv[2]);
    uint8_t *mem = xmalloc(len);
    fill(mem, len, SEED_FORK);
    int up[2], down[2];
    if (pipe(up) || pipe(down))
        die("pipe");
    pid_t pid = fork();
    if (pid < 0)
        die("fork");
    if (pid == 0) {
        close(up[0]);
        close(down[1]);
        exit(child(mem, len, hold_ms, up[1], down[0]));
    }
    close(up[1]);
    close(down[0]);
    wait_byte(up[0]);
    for (size_t off = 0; off < len; off += MIB) {
        size_t n = len - off < MIB ? len - off : MIB;
        fill_at(mem + off, n, SEED_REWRITE, off);
        usleep(10000);
    }
    send_byte(down[1]);
    int st, bad = 0;
    if (waitpid(pid, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "the child failed (status %#x)\n", st);
        bad = 1;
    }
    bad |= check("the parent's rewrite", mem, len, SEED_REWRITE);
    if (!bad)
        printf("treecow ok\n");
    return bad;
}
