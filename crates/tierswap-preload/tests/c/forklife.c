/* A forked child's life and what it leaves behind. Buffers of 8-16 MiB of mixed pages, run
 * under a budget of a few MiB, so most pages are swapped out at the fork; the pager's gauges
 * (read through its control socket, printed as `gauges LABEL …` lines) say what it holds
 * at each step, and the test compares them.
 *
 * Usage: forklife MODE [RESULT]
 *   exit, kill  buffers A, B (6 MiB each) and C (4 MiB); the child reads half of C and
 *               checks it, then waits; the parent checks A and B and frees them (the child
 *               still holds their swapped pages), then the child exits (exit) or is killed
 *               with SIGKILL (kill); the parent checks and rewrites C, frees it, and the
 *               pager must be back to what it held before the buffers were made. Gauges:
 *               base, before-fork, child-alive, ab-freed, child-gone, end.
 *   shared      the child reads every page of A, then writes the head of every page, while
 *               the parent does nothing: the parent's swap slots, pool and file bytes stay
 *               as they were at the fork. Gauges: before-fork, child-read, child-wrote.
 *   grandchild  the child reads half of A, writes the heads of its first quarter and forks;
 *               the grandchild sees the child's bytes at its fork (its heads, the parent's
 *               fork-time bytes elsewhere), writes heads of its own; neither the child nor
 *               the parent sees them.
 *   orphan      the parent exits right after the fork; the child waits for that, then reads
 *               every page and checks it. It reports to RESULT (its stdout and stderr):
 *               "child pid N", then "orphan ok" or MISMATCH lines.
 * Exit 0 and "forklife ok": every byte right, in every process. */
#include "forking.h"

#define SEED_A 31
#define SEED_B 32
#define SEED_C 36
#define CHILD_HEADS 33
#define GRANDCHILD_HEADS 34
#define PARENT_HEADS 35

static int write_byte(int fd, char c) {
    return write(fd, &c, 1) == 1 ? 0 : -1;
}

static char read_byte(int fd) {
    char c = 0;
    for (;;) {
        ssize_t r = read(fd, &c, 1);
        if (r == 1) return c;
        if (r == 0) return 0;
        if (errno != EINTR) die("read from a pipe");
    }
}

static int exit_or_kill(int killed) {
    struct gauges g;
    settle_gauges("base", &g, 10000);
    size_t n_ab = 6 * MIB, n_c = 4 * MIB;
    uint8_t *a = xmalloc(n_ab), *b = xmalloc(n_ab), *c = xmalloc(n_c);
    kind_fill(a, n_ab, KIND_MIXED, SEED_A);
    kind_fill(b, n_ab, KIND_MIXED, SEED_B);
    kind_fill(c, n_c, KIND_MIXED, SEED_C);
    settle_gauges("before-fork", &g, 10000);
    int ready[2], go[2];
    if (pipe(ready) || pipe(go)) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        int bad = kind_check_pages("child: first half of C at the fork", c, 0, n_c / PAGE_BYTES / 2, KIND_MIXED,
                                   SEED_C, 0, 0);
        if (write_byte(ready[1], bad ? 'b' : 'r')) die("child: write to the parent");
        read_byte(go[0]);
        _exit(bad);
    }
    /* Only the child holds these ends now: a child that dies gives end of file. */
    close(ready[1]);
    close(go[0]);
    int bad = 0;
    char said = read_byte(ready[0]);
    if (said != 'r') {
        fprintf(stderr, "MISMATCH the child read wrong bytes or died before it was ready (it said '%c')\n",
                said ? said : '0');
        bad = 1;
    }
    settle_gauges("child-alive", &g, 10000);
    bad |= kind_check("parent: A while the child lives", a, n_ab, KIND_MIXED, SEED_A, 0, 0);
    bad |= kind_check("parent: B while the child lives", b, n_ab, KIND_MIXED, SEED_B, 0, 0);
    free(a);
    free(b);
    settle_gauges("ab-freed", &g, 10000);
    struct gauges with_child = g;
    if (killed) {
        if (kill(pid, SIGKILL)) die("kill the child");
        int st;
        if (waitpid(pid, &st, 0) != pid) die("waitpid");
        if (!WIFSIGNALED(st) || WTERMSIG(st) != SIGKILL) {
            fprintf(stderr, "MISMATCH the child ended with status %d, not by the SIGKILL sent\n", st);
            bad = 1;
        }
    } else {
        write_byte(go[1], 'x'); /* EPIPE when the child died: reap says how */
        bad |= reap(pid, "the child");
    }
    /* The pager notices the child is gone within its poll period, then drops what it held. */
    settle_gauges_after_change("child-gone", &g, &with_child, 10000);
    bad |= kind_check("parent: C after the child", c, n_c, KIND_MIXED, SEED_C, 0, 0);
    write_heads(c, n_c, PARENT_HEADS);
    bad |= kind_check("parent: its own heads on C", c, n_c, KIND_MIXED, SEED_C, 1, PARENT_HEADS);
    free(c);
    settle_gauges("end", &g, 10000);
    return bad;
}

static int shared(void) {
    size_t n = 16 * MIB;
    struct gauges g;
    uint8_t *a = xmalloc(n);
    kind_fill(a, n, KIND_MIXED, SEED_A);
    settle_gauges("before-fork", &g, 10000);
    int ready[2], go[2];
    if (pipe(ready) || pipe(go)) die("pipe");
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(ready[0]);
        close(go[1]);
        int bad = kind_check("child: A at the fork", a, n, KIND_MIXED, SEED_A, 0, 0);
        if (write_byte(ready[1], 'r')) die("child: write to the parent");
        read_byte(go[0]);
        write_heads(a, n, CHILD_HEADS);
        bad |= kind_check("child: its heads over A at the fork", a, n, KIND_MIXED, SEED_A, 1, CHILD_HEADS);
        if (write_byte(ready[1], 'w')) die("child: write to the parent");
        read_byte(go[0]);
        _exit(bad);
    }
    close(ready[1]);
    close(go[0]);
    int bad = 0;
    if (read_byte(ready[0]) != 'r') {
        fprintf(stderr, "MISMATCH the child died before it had read A\n");
        bad = 1;
    }
    settle_gauges("child-read", &g, 10000);
    write_byte(go[1], 'w');
    if (read_byte(ready[0]) != 'w') {
        fprintf(stderr, "MISMATCH the child died before it had written A\n");
        bad = 1;
    }
    settle_gauges("child-wrote", &g, 10000);
    write_byte(go[1], 'x');
    bad |= reap(pid, "the child");
    bad |= kind_check("parent: A after the child", a, n, KIND_MIXED, SEED_A, 0, 0);
    free(a);
    return bad;
}

static int grandchild(void) {
    size_t n = 16 * MIB;
    size_t pages = n / PAGE_BYTES;
    struct gauges g;
    uint8_t *a = xmalloc(n);
    kind_fill(a, n, KIND_MIXED, SEED_A);
    settle_gauges("before-fork", &g, 10000);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        int bad = kind_check_pages("child: first half of A at the fork", a, 0, pages / 2, KIND_MIXED, SEED_A, 0, 0);
        write_heads_pages(a, 0, pages / 4, CHILD_HEADS);
        pid_t gpid = fork();
        if (gpid < 0) die("child: fork");
        if (gpid == 0) {
            int gbad = kind_check_pages("grandchild: the child's heads on the first quarter", a, 0, pages / 4,
                                        KIND_MIXED, SEED_A, 1, CHILD_HEADS);
            gbad |= kind_check_pages("grandchild: the rest as at the first fork", a, pages / 4, pages, KIND_MIXED,
                                     SEED_A, 0, 0);
            write_heads(a, n, GRANDCHILD_HEADS);
            gbad |= kind_check("grandchild: its own heads", a, n, KIND_MIXED, SEED_A, 1, GRANDCHILD_HEADS);
            _exit(gbad);
        }
        bad |= reap(gpid, "the grandchild");
        bad |= kind_check_pages("child: its heads after the grandchild", a, 0, pages / 4, KIND_MIXED, SEED_A, 1,
                                CHILD_HEADS);
        bad |= kind_check_pages("child: the rest after the grandchild", a, pages / 4, pages, KIND_MIXED, SEED_A, 0, 0);
        _exit(bad);
    }
    int bad = reap(pid, "the child");
    bad |= kind_check("parent: A after the child and the grandchild", a, n, KIND_MIXED, SEED_A, 0, 0);
    write_heads(a, n, PARENT_HEADS);
    bad |= kind_check("parent: its own heads on A", a, n, KIND_MIXED, SEED_A, 1, PARENT_HEADS);
    free(a);
    return bad;
}

/* Without stdio: the child's FILE buffers are the parent's malloc'd memory. */
static void say(int fd, const char *fmt, long v) {
    char line[128];
    int len = snprintf(line, sizeof line, fmt, v);
    if (len > 0 && write(fd, line, (size_t)len) != len) _exit(98);
}

static int orphan(const char *result) {
    size_t n = 16 * MIB;
    struct gauges g;
    uint8_t *a = xmalloc(n);
    kind_fill(a, n, KIND_MIXED, SEED_A);
    settle_gauges("before-fork", &g, 10000);
    int lifeline[2];
    if (pipe(lifeline)) die("pipe");
    pid_t parent = getpid();
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        close(lifeline[1]);
        int fd = open(result, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
        if (fd < 0 || dup2(fd, 1) < 0 || dup2(fd, 2) < 0) _exit(97);
        say(1, "child pid %ld\n", (long)getpid());
        /* End of file once the parent has exited (it holds the only write end). */
        read_byte(lifeline[0]);
        for (int i = 0; i < 1000 && getppid() == parent; i++) sleep_ms(10);
        if (getppid() == parent) {
            say(1, "MISMATCH the parent (pid %ld) closed its pipe but did not exit\n", (long)parent);
            _exit(1);
        }
        int bad = kind_check("orphan: A as at the fork, read after the parent exited", a, n, KIND_MIXED, SEED_A, 0, 0);
        if (!bad) say(1, "orphan ok (%ld MiB checked)\n", (long)(n / MIB));
        _exit(bad);
    }
    close(lifeline[0]);
    printf("parent exits, child %d reads after\n", (int)pid);
    return 0;
}

int main(int argc, char **argv) {
    stdout_unmanaged();
    signal(SIGPIPE, SIG_IGN); /* a child that died: its pipe says EPIPE, reap says how it ended */
    const char *mode = argc > 1 ? argv[1] : "";
    printf("forklife %s\n", mode);
    fflush(stdout);
    int bad;
    if (!strcmp(mode, "exit")) bad = exit_or_kill(0);
    else if (!strcmp(mode, "kill")) bad = exit_or_kill(1);
    else if (!strcmp(mode, "shared")) bad = shared();
    else if (!strcmp(mode, "grandchild")) bad = grandchild();
    else if (!strcmp(mode, "orphan") && argc == 3) bad = orphan(argv[2]);
    else {
        fprintf(stderr, "usage: forklife exit|kill|shared|grandchild|orphan RESULT\n");
        return 2;
    }
    if (!bad) printf("forklife ok\n");
    return bad;
}
