/* A server's way of dropping root: the parent (root) fills memory of its own, then forks
 * workers that give up root at once (setgroups, setgid, setuid to 65534) and only then
 * allocate and fill memory of their own; each worker checks its own memory and what it
 * inherited, the parent its own after they exit. Usage: dropuid WORKERS. Exit 0: every
 * byte right in every process. */
#include "common.h"

#include <grp.h>
#include <sys/wait.h>

int main(int argc, char **argv) {
    int workers = argc > 1 ? atoi(argv[1]) : 2;
    size_t n = 12 * MIB;
    uint8_t *mine = xmalloc(n);
    fill(mine, n, 51);
    for (int w = 0; w < workers; w++) {
        pid_t pid = fork();
        if (pid < 0) { perror("fork"); return 1; }
        if (pid == 0) {
            gid_t none[1] = {65534};
            if (setgroups(1, none) || setgid(65534) || setuid(65534)) { perror("drop root"); _exit(3); }
            if (getuid() != 65534 || geteuid() != 65534) { fprintf(stderr, "still uid %d\n", (int)geteuid()); _exit(3); }
            size_t m = 16 * MIB;
            uint8_t *own = xmalloc(m);
            fill(own, m, 60 + w);
            int bad = check("worker's own", own, m, 60 + w) + check("inherited", mine, n, 51);
            printf("worker %d uid %d %s\n", w, (int)getuid(), bad ? "BAD" : "ok");
            fflush(stdout);
            exit(bad ? 1 : 0);
        }
    }
    int bad = 0, st;
    while (wait(&st) > 0) bad |= !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    bad |= check("parent's", mine, n, 51);
    printf("dropuid %s\n", bad ? "BAD" : "ok");
    return bad;
}
