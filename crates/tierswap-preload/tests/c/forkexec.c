/* A forked child that execs at once does not keep its server in the parent: 20 times, fork
 * and exec /bin/true, wait for it, wait 20 ms more, and count the threads of this process
 * named tierswap-child (the parent's pager serves each forked child from one until it sees
 * the child's memory gone). Prints "lingering N" (the sum of the 20 counts), then
 * "forkexec ok". */
#include "common.h"

#include <dirent.h>
#include <sys/wait.h>
#include <time.h>

static int child_servers(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) die("opendir /proc/self/task");
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d))) {
        if (e->d_name[0] == '.') continue;
        char path[300], name[32] = {0};
        snprintf(path, sizeof path, "/proc/self/task/%s/comm", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        if (fgets(name, sizeof name, f) && strncmp(name, "tierswap-child", 14) == 0) n++;
        fclose(f);
    }
    closedir(d);
    return n;
}

int main(void) {
    /* Managed memory, so that the fork has something for the parent's pager to serve. */
    size_t n = 4 * MIB;
    uint8_t *p = xmalloc(n);
    fill(p, n, 3);
    int lingering = 0;
    for (int i = 0; i < 20; i++) {
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) {
            execl("/bin/true", "true", (char *)NULL);
            _exit(127);
        }
        int st;
        if (waitpid(pid, &st, 0) != pid || !WIFEXITED(st) || WEXITSTATUS(st) != 0) die("the child");
        struct timespec t = {0, 20 * 1000 * 1000};
        nanosleep(&t, NULL);
        lingering += child_servers();
    }
    printf("lingering %d\n", lingering);
    if (check("the parent's memory after the forks", p, n, 3)) return 1;
    printf("forkexec ok\n");
    return 0;
}
