/* The program changes its managed mappings and the pager must follow (userfaultfd REMOVE,
 * UNMAP and REMAP events):
 *  - madvise(MADV_DONTNEED) and MADV_FREE on managed memory (present and swapped-out pages):
 *    the range reads back as zeros, the rest keeps its bytes, the range can be used again;
 *  - mremap: grow in place or moved (MAYMOVE), shrink, move to a chosen address (FIXED):
 *    every byte that was kept is where it should be, grown parts read zero;
 *  - realloc of large blocks keeps the bytes;
 *  - map / unmap churn: a new mapping where an old one was sees nothing of the old one;
 *  - munmap / free of everything at the end: the exit stats show the slots freed.
 * Exit 0: every byte right. */
#include "common.h"

int main(void) {
    int bad = 0;
    size_t n = 24 * MIB;

    /* madvise on mmap'd and malloc'd memory, mostly swapped out by the time of the call. */
    uint8_t *b = xmmap(n);
    uint8_t *a = xmalloc(n);
    fill(b, n, 11);
    fill(a, n, 12);
    if (madvise(b + 4 * MIB, 8 * MIB, MADV_DONTNEED)) die("madvise DONTNEED");
    /* a is malloc'd: its pointer need not be page-aligned (it is under the shim, not under glibc). */
    uint8_t *freed = (uint8_t *)(((uintptr_t)a + 2 * MIB + PAGE_BYTES - 1) & ~(uintptr_t)(PAGE_BYTES - 1)) + 3 * PAGE_BYTES;
    size_t freed_len = 5 * MIB, freed_off = (size_t)(freed - a);
    if (madvise(freed, freed_len, MADV_FREE)) die("madvise FREE");
    bad |= check("b before the DONTNEED range", b, 4 * MIB, 11);
    bad |= check_zero("b after MADV_DONTNEED", b + 4 * MIB, 8 * MIB);
    bad |= check_at("b after the DONTNEED range", b + 12 * MIB, n - 12 * MIB, 11, 12 * MIB);
    bad |= check("a before the FREE range", a, freed_off, 12);
    bad |= check_zero("a after MADV_FREE", freed, freed_len);
    bad |= check_at("a after the FREE range", freed + freed_len, n - freed_off - freed_len, 12, freed_off + freed_len);
    /* Used again after the advice: new bytes stick. */
    fill_at(b + 4 * MIB, 8 * MIB, 13, 4 * MIB);
    fill(a, n, 14);
    bad |= check_at("b refilled after DONTNEED", b + 4 * MIB, 8 * MIB, 13, 4 * MIB);
    bad |= check("a refilled after FREE", a, n, 14);

    /* mremap: grow (the kernel may move it), shrink, move to a reserved address. */
    size_t m = 8 * MIB;
    uint8_t *c = xmmap(m);
    fill(c, m, 15);
    uint8_t *c2 = mremap(c, m, 3 * m, MREMAP_MAYMOVE);
    if (c2 == MAP_FAILED) die("mremap grow");
    bad |= check("mremap grown: old part", c2, m, 15);
    bad |= check_zero("mremap grown: new part", c2 + m, 2 * m);
    fill_at(c2 + m, 2 * m, 15, m);
    bad |= check("mremap grown: all", c2, 3 * m, 15);
    uint8_t *c3 = mremap(c2, 3 * m, 2 * m, 0);
    if (c3 != c2) die("mremap shrink");
    bad |= check("mremap shrunk", c3, 2 * m, 15);
    uint8_t *target = mmap(NULL, 2 * m, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (target == MAP_FAILED) die("mmap target");
    uint8_t *c4 = mremap(c3, 2 * m, 2 * m, MREMAP_MAYMOVE | MREMAP_FIXED, target);
    if (c4 != target) die("mremap fixed");
    bad |= check("mremap moved to a chosen address", c4, 2 * m, 15);
    fill(c4, 2 * m, 16);
    bad |= check("moved mapping written again", c4, 2 * m, 16);

    /* realloc of large blocks: grow twice, shrink. */
    uint8_t *r = xmalloc(3 * MIB);
    fill(r, 3 * MIB, 17);
    r = realloc(r, 20 * MIB);
    if (!r) die("realloc grow");
    bad |= check("realloc grown", r, 3 * MIB, 17);
    fill(r, 20 * MIB, 18);
    r = realloc(r, 30 * MIB);
    if (!r) die("realloc grow again");
    bad |= check("realloc grown again", r, 20 * MIB, 18);
    r = realloc(r, 5 * MIB);
    if (!r) die("realloc shrink");
    bad |= check("realloc shrunk", r, 5 * MIB, 18);

    /* Churn: the kernel hands the same addresses out again after each munmap, and a new
     * mapping there must not see anything of the old one. */
    for (int i = 0; i < 40; i++) {
        size_t len = (size_t)(2 + i % 5) * MIB;
        uint8_t *p = i % 2 ? xmalloc(len) : xmmap(len);
        if (!(i % 2)) bad |= check_zero("fresh mmap after munmap churn", p, len);
        fill(p, len, 100 + (uint64_t)i);
        bad |= check("churned mapping", p, len, 100 + (uint64_t)i);
        if (i % 2) free(p); else munmap(p, len);
        if (bad) break;
    }

    /* Give everything back: the pager's slots and pool bytes must go with it. */
    free(r);
    munmap(c4, 2 * m);
    free(a);
    munmap(b, n);
    if (!bad) printf("mapops ok\n");
    fflush(stdout);
    return bad;
}
