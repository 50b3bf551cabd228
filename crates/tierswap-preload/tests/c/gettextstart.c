/* A forked child whose pager would start inside glibc: the child gives up root with the raw
 * system call (as libcap's capsh does, past the shim), waits past the fork's 20 ms, then asks
 * gettext for a message in a domain not loaded yet. glibc allocates under gettext's own lock
 * there; a pager starting in that allocation, failing (no CAP_SYS_PTRACE) and formatting its
 * error took the same lock (strerror) and hung the child for ever. Then it allocates and
 * checks 8 MiB of its own. Usage: gettextstart. Exit 0: the child finished, every byte
 * right. */
#include "common.h"

#include <libintl.h>
#include <locale.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

int main(void) {
    size_t n = 4 * MIB;
    uint8_t *mine = xmalloc(n);
    fill(mine, n, 71);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) {
        if (syscall(SYS_setresgid, 65534, 65534, 65534) || syscall(SYS_setresuid, 65534, 65534, 65534)) {
            perror("setresuid");
            _exit(3);
        }
        if (!setlocale(LC_ALL, "C.UTF-8")) { fprintf(stderr, "no C.UTF-8 locale\n"); _exit(4); }
        struct timespec ms30 = {0, 30 * 1000 * 1000};
        nanosleep(&ms30, NULL);
        const char *m = dgettext("tierswap-test-no-such-domain", "a message");
        size_t k = 8 * MIB;
        uint8_t *own = xmalloc(k);
        fill(own, k, 72);
        int bad = check("child's own", own, k, 72) + check("inherited", mine, n, 71) + (strcmp(m, "a message") != 0);
        printf("child %s\n", bad ? "BAD" : "ok");
        fflush(stdout);
        _exit(bad);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) { perror("waitpid"); return 1; }
    int bad = !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    bad |= check("parent's", mine, n, 71);
    printf("gettextstart %s\n", bad ? "BAD" : "ok");
    return bad;
}
