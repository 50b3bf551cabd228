/* Small anonymous mappings (below the minimum size), the way runtimes make them (Ruby maps
 * each 16 KiB heap page with an mmap of 32 KiB and unmaps the misaligned ends), under a
 * budget of 8 MiB, with every byte compared:
 *  A. 1,600 aligned 16 KiB pages made Ruby's way (25 MiB), and 400 mappings of 4 KiB to
 *     252 KiB (~25 MiB more), each filled with its own stream;
 *  B. every mapping read back; then half the aligned pages unmapped and mapped again:
 *     the new ones read zeros, the others keep their bytes;
 *  C. mremap of small mappings: shrink (the rest kept), grow in place or moved
 *     (MREMAP_MAYMOVE: the old bytes moved along, the grown part zeros), grow without
 *     MAYMOVE (in place or ENOMEM, nothing lost either way), move to a fixed address;
 *  D. a page made read-only and then unmapped: the next small mapping is writable;
 *  E. a fixed mapping over part of a small mapping: zeros there, the rest kept;
 *  F. a forked child reads every surviving mapping and unmaps some of its own copies; the
 *     parent's keep their bytes, and it reads them all again.
 * Prints "rss_kib A N" and "rss_kib B N" (VmRSS): ~50 MiB of small mappings under 8 MiB
 * stay near the budget only if they are managed. Exit 0 and "smallmaps ok": every byte
 * right. */
#include "common.h"

#include <sys/wait.h>

#define KIB ((size_t)1 << 10)
#define RUBY_PAGES 1600
#define OTHER 400

/* Ruby's heap page: 16 KiB aligned to 16 KiB, from an mmap of 32 KiB whose ends go. */
static uint8_t *ruby_page(void) {
    uint8_t *p = xmmap(32 * KIB);
    uintptr_t aligned = ((uintptr_t)p + 16 * KIB - 1) & ~(uintptr_t)(16 * KIB - 1);
    size_t head = aligned - (uintptr_t)p, tail = 32 * KIB - head - 16 * KIB;
    if (head && munmap(p, head)) die("munmap head");
    if (tail && munmap((uint8_t *)aligned + 16 * KIB, tail)) die("munmap tail");
    return (uint8_t *)aligned;
}

static uint8_t *page[RUBY_PAGES];
static uint8_t *other[OTHER];
static size_t other_len[OTHER];

static int check_all(const char *when) {
    int bad = 0;
    char what[96];
    for (int i = 0; i < RUBY_PAGES; i++) {
        if (!page[i]) continue;
        snprintf(what, sizeof what, "%s: heap page %d", when, i);
        bad |= check(what, page[i], 16 * KIB, 1000 + i);
    }
    for (int i = 0; i < OTHER; i++) {
        if (!other[i]) continue;
        snprintf(what, sizeof what, "%s: mapping %d of %zu bytes", when, i, other_len[i]);
        bad |= check(what, other[i], other_len[i], 5000 + i);
    }
    return bad;
}

int main(void) {
    int bad = 0;

    /* A */
    for (int i = 0; i < RUBY_PAGES; i++) {
        page[i] = ruby_page();
        if ((uintptr_t)page[i] % (16 * KIB)) die("heap page not aligned");
        fill(page[i], 16 * KIB, 1000 + i);
    }
    for (int i = 0; i < OTHER; i++) {
        other_len[i] = (size_t)(1 + (mix64(i) % 63)) * PAGE_BYTES;
        other[i] = xmmap(other_len[i]);
        fill(other[i], other_len[i], 5000 + i);
    }
    printf("rss_kib A %ld\n", rss_kib());

    /* B */
    bad |= check_all("B, first read");
    for (int i = 0; i < RUBY_PAGES; i += 2) {
        if (munmap(page[i], 16 * KIB)) die("munmap heap page");
        page[i] = ruby_page();
        bad |= check_zero("B: a heap page mapped again", page[i], 16 * KIB);
        fill(page[i], 16 * KIB, 1000 + i);
    }
    bad |= check_all("B, after half the heap pages were mapped again");
    printf("rss_kib B %ld\n", rss_kib());

    /* C: shrink, grow (moved or in place), grow without MAYMOVE, move to a fixed address. */
    for (int i = 0; i < 40; i++) {
        size_t len = other_len[i];
        if (len > 2 * PAGE_BYTES) {
            size_t keep = len / 2 / PAGE_BYTES * PAGE_BYTES;
            if (mremap(other[i], len, keep, 0) != other[i]) die("mremap shrink");
            other_len[i] = keep;
            len = keep;
        }
        size_t grown = len + (size_t)(1 + i % 5) * PAGE_BYTES;
        uint8_t *q = mremap(other[i], len, grown, MREMAP_MAYMOVE);
        if (q == MAP_FAILED) die("mremap grow");
        bad |= check("C: grown mapping, old part", q, len, 5000 + i);
        bad |= check_zero("C: grown mapping, new part", q + len, grown - len);
        other[i] = q;
        /* The stream goes on over the grown part. */
        fill_at(q + len, grown - len, 5000 + i, len);
        other_len[i] = grown;
    }
    for (int i = 40; i < 60; i++) {
        uint8_t *q = mremap(other[i], other_len[i], other_len[i] + PAGE_BYTES, 0);
        if (q == MAP_FAILED) {
            if (errno != ENOMEM) die("mremap grow in place");
        } else {
            if (q != other[i]) die("mremap without MAYMOVE moved");
            bad |= check_zero("C: grown in place, new part", q + other_len[i], PAGE_BYTES);
            fill_at(q + other_len[i], PAGE_BYTES, 5000 + i, other_len[i]);
            other_len[i] += PAGE_BYTES;
        }
    }
    {
        uint8_t *target = xmmap(512 * KIB);
        munmap(target, 512 * KIB);
        uint8_t *q = mremap(other[60], other_len[60], other_len[60], MREMAP_MAYMOVE | MREMAP_FIXED, target);
        if (q != target) die("mremap to a fixed address");
        other[60] = q;
    }
    bad |= check_all("C, after the mremaps");

    /* D */
    {
        uint8_t *ro = xmmap(8 * KIB);
        fill(ro, 8 * KIB, 77);
        if (mprotect(ro, 8 * KIB, PROT_READ)) die("mprotect read-only");
        bad |= check("D: read-only page", ro, 8 * KIB, 77);
        if (munmap(ro, 8 * KIB)) die("munmap read-only");
        for (int k = 0; k < 64; k++) {
            uint8_t *w = xmmap(8 * KIB);
            bad |= check_zero("D: a new small mapping", w, 8 * KIB);
            memset(w, 0x5a, 8 * KIB); /* SIGSEGV here if it came back read-only */
            if (munmap(w, 8 * KIB)) die("munmap D");
        }
    }

    /* E */
    {
        size_t len = other_len[100];
        if (len >= 3 * PAGE_BYTES) {
            uint8_t *at = other[100] + PAGE_BYTES;
            void *p = mmap(at, PAGE_BYTES, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0);
            if (p != at) die("fixed mapping over a small mapping");
            bad |= check("E: before the fixed page", other[100], PAGE_BYTES, 5100);
            bad |= check_zero("E: the fixed page", at, PAGE_BYTES);
            bad |= check_at("E: after the fixed page", at + PAGE_BYTES, len - 2 * PAGE_BYTES, 5100, 2 * PAGE_BYTES);
            fill_at(at, PAGE_BYTES, 5100, PAGE_BYTES);
        }
    }

    /* F */
    fflush(stdout);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) {
        int cbad = check_all("F, in the child");
        for (int i = 0; i < OTHER; i += 3)
            if (munmap(other[i], other_len[i])) die("munmap in the child");
        uint8_t *mine = xmmap(64 * KIB);
        fill(mine, 64 * KIB, 9999);
        cbad |= check("F: the child's own small mapping", mine, 64 * KIB, 9999);
        _exit(cbad ? 1 : 0);
    }
    int status;
    if (waitpid(pid, &status, 0) != pid) die("waitpid");
    if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
        fprintf(stderr, "MISMATCH F: the child saw wrong bytes (status %d)\n", status);
        bad = 1;
    }
    bad |= check_all("F, in the parent after the child");

    for (int i = 0; i < RUBY_PAGES; i++)
        if (munmap(page[i], 16 * KIB)) die("munmap at the end");
    for (int i = 0; i < OTHER; i++)
        if (munmap(other[i], other_len[i])) die("munmap at the end");
    if (bad) return 1;
    printf("smallmaps ok\n");
    return 0;
}
