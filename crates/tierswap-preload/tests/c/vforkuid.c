/* A forked child, still waiting to start its pager, vforks; the vfork child gives up root
 * (setgid, setuid to 65534) and execs `id -u`. The vfork child shares the child's memory, so
 * a pager started there before the setuid (as a forked child's is) would be the child's,
 * its threads and descriptors gone with the exec. Then the child fills and checks 16 MiB of
 * its own. Usage: vforkuid. Exit 0: every byte right. */
#include "common.h"

#include <sys/wait.h>

int main(void) {
    size_t n = 4 * MIB;
    uint8_t *mine = xmalloc(n);
    fill(mine, n, 81);
    pid_t c = fork();
    if (c < 0) { perror("fork"); return 1; }
    if (c == 0) {
        pid_t g = vfork();
        if (g == 0) {
            if (setgid(65534) || setuid(65534)) _exit(5);
            execl("/usr/bin/id", "id", "-u", (char *)NULL);
            _exit(6);
        }
        int st;
        if (waitpid(g, &st, 0) != g || !WIFEXITED(st) || WEXITSTATUS(st) != 0) { fprintf(stderr, "id failed\n"); exit(1); }
        size_t k = 16 * MIB;
        uint8_t *own = xmalloc(k);
        fill(own, k, 82);
        int bad = check("child's own", own, k, 82) + check("inherited", mine, n, 81);
        printf("child %s\n", bad ? "BAD" : "ok");
        exit(bad);
    }
    int st;
    if (waitpid(c, &st, 0) != c) { perror("waitpid"); return 1; }
    int bad = !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    bad |= check("parent's", mine, n, 81);
    printf("vforkuid %s\n", bad ? "BAD" : "ok");
    return bad;
}
