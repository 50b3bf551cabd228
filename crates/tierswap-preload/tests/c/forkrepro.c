/* The reproducer of a forked child that hung for good: 16 MiB malloc'd and filled, one word
 * of every page read back (under a budget of 8 MiB the pages read last are present and
 * clean in the parent: write-protected, keeping their swap slot), fork; the child reads
 * one word of every page, then writes one word of every page, and exits; the parent waits.
 * Natively the child takes ~10 ms. The words read are compared with what was written, by
 * the child (at the fork, then its own) and by the parent (every byte of its own, after).
 * Exit 0 and "forkrepro ok": every word right and the child exited 0. */
#include "common.h"

#include <sys/wait.h>
#include <time.h>

#define SEED 7

static uint64_t word_at(const uint8_t *a, size_t off) {
    return *(volatile const uint64_t *)(a + off);
}

int main(void) {
    size_t n = 16 * MIB;
    uint8_t *a = xmalloc(n);
    fill(a, n, SEED);
    int bad = 0;
    for (size_t off = 0; off < n; off += PAGE_BYTES)
        if (word_at(a, off) != pattern_word(SEED, off / 8)) bad = 1;
    if (bad) fprintf(stderr, "MISMATCH parent: a word read back before the fork\n");
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        int wrong = 0;
        for (size_t off = 0; off < n; off += PAGE_BYTES)
            if (word_at(a, off) != pattern_word(SEED, off / 8)) wrong = 1;
        for (size_t off = 0; off < n; off += PAGE_BYTES) *(volatile uint64_t *)(a + off) = ~pattern_word(SEED, off / 8);
        for (size_t off = 0; off < n; off += PAGE_BYTES)
            if (word_at(a, off) != ~pattern_word(SEED, off / 8)) wrong |= 2;
        if (wrong & 1) fprintf(stderr, "MISMATCH child: a word read at the fork\n");
        if (wrong & 2) fprintf(stderr, "MISMATCH child: a word it wrote\n");
        _exit(wrong);
    }
    int st;
    if (waitpid(pid, &st, 0) != pid) die("waitpid");
    clock_gettime(CLOCK_MONOTONIC, &t1);
    if (!WIFEXITED(st) || WEXITSTATUS(st)) {
        if (WIFSIGNALED(st))
            fprintf(stderr, "MISMATCH the child was killed by signal %d (%s)\n", WTERMSIG(st), strsignal(WTERMSIG(st)));
        else
            fprintf(stderr, "MISMATCH the child exited with %d\n", WEXITSTATUS(st));
        bad = 1;
    }
    bad |= check("parent: its own bytes after the child", a, n, SEED);
    if (!bad)
        printf("forkrepro ok: the child took %.1f ms\n",
               (t1.tv_sec - t0.tv_sec) * 1e3 + (t1.tv_nsec - t0.tv_nsec) / 1e6);
    return bad;
}
