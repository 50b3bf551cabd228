/* Exit status passthrough. Usage: status exit N | status kill SIGNUM | status fill-and-check
 * | status socket DIR (says whether DIR/<pid>.sock, the pager's control socket, is there).
 * Fills 16 MiB of managed memory first, so the pager is busy when the program ends. */
#include "common.h"

#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>

int main(int argc, char **argv) {
    if (argc < 2) {
        fprintf(stderr, "usage: status exit N | kill SIGNUM | fill-and-check | socket DIR\n");
        return 2;
    }
    /* Unbuffered: a stdio buffer is malloc'd, so managed, and in signal mode a write(2)
     * from it while it is swapped out fails with EFAULT (README, Limits): the verdict line
     * would be lost at exit though every byte checked was right. */
    setvbuf(stdout, NULL, _IONBF, 0);
    printf("started\n");
    fflush(stdout);
    size_t n = 16 * MIB;
    uint8_t *a = xmalloc(n);
    fill(a, n, 5);
    int bad = check("a", a, n, 5);
    if (!strcmp(argv[1], "exit") && argc == 3) exit(bad ? 1 : atoi(argv[2]));
    if (!strcmp(argv[1], "kill") && argc == 3) {
        struct rlimit no_core = {0, 0};
        setrlimit(RLIMIT_CORE, &no_core);
        kill(getpid(), atoi(argv[2]));
        fprintf(stderr, "still alive after kill(self, %s)\n", argv[2]);
        return 98;
    }
    if (!strcmp(argv[1], "socket") && argc == 3) {
        char path[4096];
        struct stat st;
        snprintf(path, sizeof path, "%s/%d.sock", argv[2], (int)getpid());
        printf(stat(path, &st) == 0 ? "socket there\n" : "no socket\n");
        return bad;
    }
    if (!strcmp(argv[1], "fill-and-check")) {
        if (!bad) printf("status ok\n");
        return bad;
    }
    fprintf(stderr, "status: unknown mode %s\n", argv[1]);
    return 2;
}
