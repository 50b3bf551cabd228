/* Forked readers of their parent's memory under one budget for the tree: the parent fills
 * PARENT_MIB (most of it goes out under a small budget), then forks READERS children that
 * each read all of it (its pages come from the parent's pager), write every 8th page of it
 * (their own copies), read it all again, and exit. The first reader forks a child of its
 * own after its first pass, which reads everything again (what that reader took over, and
 * what it still had from the parent). Every byte is compared with its pattern; the parent
 * checks its own memory after they are done. Each reader first unmaps a mapping it
 * inherited: an event of the child's queued while its parent's pager handles the fork.
 * Usage: treeread READERS PARENT_MIB
 * Prints "treeread ok" and exits 0 when every byte was right. */
#include "common.h"

#include <sys/wait.h>

/* The seed of page `k`'s bytes in a reader that wrote every 8th page. */
static uint64_t seed_after_write(size_t k, int r) { return k % 8 == 0 ? 1000 + (uint64_t)r : 7; }

/* Checks every page of `mem` against what reader `r` left there (`r` < 0: the fork-time
 * bytes). */
static int check_pages(const char *what, const uint8_t *mem, size_t len, int r) {
    int bad = 0;
    for (size_t k = 0; k < len / PAGE_BYTES && !bad; k++) {
        uint64_t seed = r < 0 ? 7 : seed_after_write(k, r);
        if (seed == 7)
            bad |= check_at(what, mem + k * PAGE_BYTES, PAGE_BYTES, 7, k * PAGE_BYTES);
        else
            bad |= check(what, mem + k * PAGE_BYTES, PAGE_BYTES, seed * 100000 + k);
    }
    return bad;
}

static int reader(int r, uint8_t *parent, size_t len, uint8_t *spare) {
    if (munmap(spare, MIB))
        die("munmap");
    /* A worker, not a child about to exec: its own pager starts at its first allocation
     * this long after the fork. */
    usleep(30000);
    free(xmalloc(64));
    int bad = check_pages("the parent's memory, first read", parent, len, -1);
    /* The parent's pager grants the pieces a reader never faulted on a few at a time while
     * the reader's userfaultfd is quiet (events/fork.rs, grant_deferred). A page written
     * before its piece's grant is a copy the kernel makes, taken over as the reader's own
     * at the grant, and one written after is a write-protect fault of the reader's pager,
     * which the test counts; and under a budget that holds the parent, a piece granted
     * after the grandchild's fork shares those copies with it and counts them nowhere.
     * A pause, so that every grant lands before the writes. */
    usleep(300000);
    for (size_t k = 0; k < len / PAGE_BYTES; k += 8)
        fill(parent + k * PAGE_BYTES, PAGE_BYTES, (1000 + (uint64_t)r) * 100000 + k);
    pid_t g = -1;
    if (r == 0 && !bad) {
        g = fork();
        if (g < 0)
            die("fork");
        if (g == 0) {
            usleep(30000);
            free(xmalloc(64));
            _exit(check_pages("the parent's memory seen by a grandchild", parent, len, r));
        }
    }
    bad |= check_pages("the parent's memory, second read", parent, len, r);
    if (g > 0) {
        int st;
        if (waitpid(g, &st, 0) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "the grandchild failed (status %#x)\n", st);
            bad = 1;
        }
    }
    return bad;
}

int main(int argc, char **argv) {
    if (argc < 3) {
        fprintf(stderr, "usage: treeread READERS PARENT_MIB\n");
        return 2;
    }
    int readers = atoi(argv[1]);
    size_t len = (size_t)atol(argv[2]) * MIB;
    uint8_t *parent = xmalloc(len);
    fill(parent, len, 7);
    uint8_t *spare = xmmap(MIB);
    fill(spare, MIB, 8);
    for (int r = 0; r < readers; r++) {
        pid_t pid = fork();
        if (pid < 0)
            die("fork");
        if (pid == 0)
            exit(reader(r, parent, len, spare));
    }
    int bad = 0;
    for (int r = 0; r < readers; r++) {
        int st;
        if (wait(&st) < 0 || !WIFEXITED(st) || WEXITSTATUS(st) != 0) {
            fprintf(stderr, "a reader failed (status %#x)\n", st);
            bad = 1;
        }
    }
    bad |= check("the parent's memory", parent, len, 7);
    if (!bad)
        printf("treeread ok\n");
    return bad;
}
