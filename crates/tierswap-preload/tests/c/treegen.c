/* Three generations under one tree budget: the program fills 24 MiB; its forked child builds
 * 24 MiB of its own (so the child's own pager starts) and forks a grandchild, which checks
 * both, builds 16 MiB of its own, and overwrites the child's memory in its own copy; the
 * child and the program check theirs after. Every byte is compared.
 * Prints "treegen ok" and exits 0 when every byte was right. */
#include "common.h"

#include <sys/wait.h>

static int exited_ok(pid_t pid) {
    int st;
    return waitpid(pid, &st, 0) == pid && WIFEXITED(st) && WEXITSTATUS(st) == 0;
}

int main(void) {
    size_t n = 24 * MIB;
    uint8_t *a = xmalloc(n);
    fill(a, n, 11);
    pid_t child = fork();
    if (child == 0) {
        uint8_t *b = xmalloc(n);
        fill(b, n, 12);
        pid_t grandchild = fork();
        if (grandchild == 0) {
            int bad = check("the program's memory, in the grandchild", a, n, 11);
            bad |= check("the child's memory, in the grandchild", b, n, 12);
            uint8_t *d = xmalloc(16 * MIB);
            fill(d, 16 * MIB, 13);
            bad |= check("the grandchild's own memory", d, 16 * MIB, 13);
            fill(b, n, 14);
            _exit(bad);
        }
        int bad = !exited_ok(grandchild);
        bad |= check("the child's memory after the grandchild", b, n, 12);
        bad |= check("the program's memory, in the child", a, n, 11);
        _exit(bad);
    }
    int bad = !exited_ok(child);
    bad |= check("the program's memory", a, n, 11);
    printf("%s\n", bad ? "treegen FAIL" : "treegen ok");
    return bad;
}
