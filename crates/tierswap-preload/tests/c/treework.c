/* A process tree under one budget: the parent fills its own memory, then forks workers that
 * each build memory of their own (small and large mallocs, made after the fork), check it
 * over several passes, check the parent's memory as of the fork, and exit; the parent checks
 * its own memory after they are done. Every byte is compared with its pattern.
 * Usage: treework WORKERS WORKER_MIB PARENT_MIB PASSES [exit|_exit|orphans]
 * Prints "treework ok" and exits 0 when every byte was right. With `orphans` the parent exits
 * right after the forks (its workers live on) and each worker prints "worker ok" or
 * "worker BAD" instead. */
#include "common.h"

#include <sys/wait.h>

/* A worker's memory: 1 MiB blocks (each its own managed mapping) and, beside them, 1 KiB
 * objects (the shim's small-object heap), each block and object its own pattern stream. */
static int worker(int w, size_t mib, const uint8_t *parent, size_t parent_len, int passes) {
    size_t n_small = mib * 256; /* a quarter of the memory in 1 KiB objects */
    size_t n_blocks = mib - mib / 4;
    uint8_t **blocks = (uint8_t **)xmalloc(n_blocks * sizeof *blocks);
    uint8_t **small = (uint8_t **)xmalloc(n_small * sizeof *small);
    for (size_t k = 0; k < n_blocks; k++) {
        blocks[k] = xmalloc(MIB);
        fill(blocks[k], MIB, 1000 * (uint64_t)(w + 1) + k);
    }
    for (size_t k = 0; k < n_small; k++) {
        small[k] = xmalloc(1024);
        fill(small[k], 1024, 5000000 + 100000 * (uint64_t)(w + 1) + k);
    }
    int bad = 0;
    for (int p = 0; p < passes && !bad; p++) {
        for (size_t k = 0; k < n_blocks && !bad; k++)
            bad |= check("a worker's block", blocks[k], MIB, 1000 * (uint64_t)(w + 1) + k);
        for (size_t k = 0; k < n_small && !bad; k++)
            bad |= check("a worker's object", small[k], 1024, 5000000 + 100000 * (uint64_t)(w + 1) + k);
    }
    bad |= check("the parent's memory seen by a worker", parent, parent_len, 7);
    for (size_t k = 0; k < n_blocks; k++)
        free(blocks[k]);
    for (size_t k = 0; k < n_small; k++)
        free(small[k]);
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 5) {
        fprintf(stderr, "usage: treework WORKERS WORKER_MIB PARENT_MIB PASSES [exit|_exit]\n");
        return 2;
    }
    int workers = atoi(argv[1]), passes = atoi(argv[4]);
    size_t worker_mib = (size_t)atol(argv[2]), parent_len = (size_t)atol(argv[3]) * MIB;
    int plain_exit = argc > 5 && !strcmp(argv[5], "exit");
    int orphans = argc > 5 && !strcmp(argv[5], "orphans");
    uint8_t *parent = xmalloc(parent_len);
    fill(parent, parent_len, 7);
    for (int w = 0; w < workers; w++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            return 1;
        }
        if (pid == 0) {
            if (orphans)
                usleep(200000); /* the parent is gone by then */
            int bad = worker(w, worker_mib, parent, parent_len, passes);
            if (orphans) {
                printf("worker %s\n", bad ? "BAD" : "ok");
                fflush(stdout);
            }
            if (plain_exit)
                exit(bad);
            _exit(bad);
        }
    }
    if (orphans)
        return 0;
    int bad = 0;
    for (int w = 0; w < workers; w++) {
        int st;
        if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "a worker failed (status %#x)\n", st);
            bad = 1;
        }
    }
    bad |= check("the parent's memory", parent, parent_len, 7);
    if (!bad)
        printf("treework ok\n");
    return bad;
}
