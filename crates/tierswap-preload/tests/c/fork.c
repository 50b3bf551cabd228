/* fork under the pager: the child sees exactly the parent's memory at the fork while the
 * parent overwrites it, the parent is untouched by what the child writes, and fork+exec
 * works (the exec'd program gets a pager of its own).
 * Usage: fork [exec-only] (exec-only: leave out the fork-and-compare part); fork exec-child is
 * the exec'd program. Exit 0: every byte right. */
#include "common.h"

#include <sys/wait.h>
#include <time.h>

static int exec_child(void) {
    size_t n = 12 * MIB;
    uint8_t *p = xmalloc(n);
    fill(p, n, 31);
    int bad = check("exec'd program's own memory", p, n, 31);
    free(p);
    return bad;
}

int main(int argc, char **argv) {
    if (argc > 1 && !strcmp(argv[1], "exec-child")) return exec_child();
    size_t n = 24 * MIB;
    uint8_t *a = xmalloc(n);
    uint8_t *b = xmmap(n);
    fill(a, n, 21);
    fill(b, n, 22);
    int exec_only = argc > 1 && !strcmp(argv[1], "exec-only");
    int bad = 0, st;
    pid_t pid;
    if (exec_only) {
        fill(a, n, 25);
        fill(b, n, 26);
        goto exec;
    }
    int to_child[2], to_parent[2];
    if (pipe(to_child) || pipe(to_parent)) die("pipe");
    pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        char c;
        /* Wait until the parent has overwritten everything. */
        if (read(to_child[0], &c, 1) != 1) die("child read");
        int bad = check("child: a as at the fork", a, n, 21);
        bad |= check("child: b as at the fork", b, n, 22);
        /* The child's own writes: its copies only. */
        fill(a, n / 2, 23);
        fill(b, n / 2, 24);
        bad |= check("child: a after its own write", a, n / 2, 23);
        bad |= check_at("child: rest of a", a + n / 2, n / 2, 21, n / 2);
        bad |= check("child: b after its own write", b, n / 2, 24);
        if (write(to_parent[1], "w", 1) != 1) die("child write");
        _exit(bad);
    }
    fill(a, n, 25);
    fill(b, n, 26);
    if (write(to_child[1], "o", 1) != 1) die("parent write");
    char c;
    if (read(to_parent[0], &c, 1) != 1) die("parent read");
    bad |= check("parent: a after its overwrite, child written too", a, n, 25);
    bad |= check("parent: b after its overwrite, child written too", b, n, 26);
    if (waitpid(pid, &st, 0) != pid) die("waitpid");
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "MISMATCH the child failed (status %d)\n", st);
        bad = 1;
    }

exec:
    /* fork + exec of this program, timed. */
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid = fork();
    if (pid < 0) die("fork for exec");
    if (pid == 0) {
        execl("/proc/self/exe", argv[0], "exec-child", (char *)NULL);
        _exit(97);
    }
    if (waitpid(pid, &st, 0) != pid) die("waitpid exec");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "MISMATCH the exec'd child failed (status %d)\n", st);
        bad = 1;
    }
    double exec_child_ms = (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6;
    /* fork + exec of /bin/true: what a program that spawns helpers pays. */
    clock_gettime(CLOCK_MONOTONIC, &t1);
    pid = fork();
    if (pid < 0) die("fork for /bin/true");
    if (pid == 0) {
        execl("/bin/true", "true", (char *)NULL);
        _exit(97);
    }
    if (waitpid(pid, &st, 0) != pid) die("waitpid true");
    struct timespec t2;
    clock_gettime(CLOCK_MONOTONIC, &t2);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        fprintf(stderr, "MISMATCH /bin/true failed (status %d)\n", st);
        bad = 1;
    }
    bad |= check("parent: a at the end", a, n, 25);
    bad |= check("parent: b at the end", b, n, 26);
    if (!bad)
        printf("fork ok; fork+exec of a 12 MiB child %.1f ms; fork+exec of /bin/true %.1f ms\n",
               exec_child_ms, (t2.tv_sec - t1.tv_sec) * 1e3 + (t2.tv_nsec - t1.tv_nsec) / 1e6);
    return bad;
}
