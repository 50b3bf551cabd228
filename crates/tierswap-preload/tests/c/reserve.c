/* A managed runtime's way with memory (the JVM's heap, Go's arenas, V8's cage): reserve a
 * large range PROT_NONE, commit parts of it later, uncommit them, change protections.
 * Under a budget of 8 MiB, with every byte compared:
 *  A. reserve 64 MiB PROT_NONE|MAP_NORESERVE; commit [0, 24) MiB with mmap(MAP_FIXED, RW)
 *     in place (the address must come back), fill it;
 *  B. commit [24, 40) MiB with mprotect(RW) and fill it in order;
 *  C. uncommit [0, 8) with mmap(MAP_FIXED, PROT_NONE), commit it again: zeros; the rest
 *     of A keeps its bytes;
 *  D. madvise(DONTNEED) [8, 12): zeros, the rest keeps its bytes;
 *  E. mprotect [24, 26) read-only: its bytes read back (swapped or not, while the pages
 *     after it are written); then none, then read-write again: the bytes are still there,
 *     and new writes stick (pages that are not read-write are not evicted: a few MiB);
 *  F. munmap [56, 64) (never committed) and [12, 16): the rest keeps its bytes;
 *  G. MADV_HUGEPAGE on [16, 24), then written and read again;
 *  H. a second reservation asked for at an address (a hint, no MAP_FIXED) that is free:
 *     it comes back there, and 24 MiB committed in it stay under the budget too;
 *  I. an executable fixed mapping over part of a reservation (not managed: the kernel's):
 *     it works, the rest of the reservation keeps its bytes.
 * After A, B and H it prints "rss_kib PHASE N" (VmRSS): with 40 MiB committed and touched,
 * a budget of 8 MiB holds only if the commits were managed. Exit 0 and "reserve ok":
 * every byte right. */
#include "common.h"

static void *xmap(void *addr, size_t n, int prot, int flags) {
    void *p = mmap(addr, n, prot, MAP_PRIVATE | MAP_ANONYMOUS | flags, -1, 0);
    if (p == MAP_FAILED) die("mmap");
    return p;
}

int main(void) {
    int bad = 0;
    const size_t n = 64 * MIB;

    /* A */
    uint8_t *r = xmap(NULL, n, PROT_NONE, MAP_NORESERVE);
    if (xmap(r, 24 * MIB, PROT_READ | PROT_WRITE, MAP_FIXED) != r) die("commit in place moved the range");
    fill(r, 24 * MIB, 1);
    bad |= check("A: committed with MAP_FIXED", r, 24 * MIB, 1);
    printf("rss_kib A %ld\n", rss_kib());

    /* B */
    if (mprotect(r + 24 * MIB, 16 * MIB, PROT_READ | PROT_WRITE)) die("mprotect RW");
    fill_at(r + 24 * MIB, 16 * MIB, 1, 24 * MIB);
    bad |= check("B: A and the part committed with mprotect", r, 40 * MIB, 1);
    printf("rss_kib B %ld\n", rss_kib());

    /* C */
    if (xmap(r, 8 * MIB, PROT_NONE, MAP_FIXED | MAP_NORESERVE) != r) die("uncommit");
    if (mprotect(r, 8 * MIB, PROT_READ | PROT_WRITE)) die("mprotect recommit");
    bad |= check_zero("C: uncommitted and committed again", r, 8 * MIB);
    bad |= check_at("C: the rest", r + 8 * MIB, 32 * MIB, 1, 8 * MIB);

    /* D */
    if (madvise(r + 8 * MIB, 4 * MIB, MADV_DONTNEED)) die("madvise DONTNEED");
    bad |= check_zero("D: after DONTNEED", r + 8 * MIB, 4 * MIB);
    bad |= check_at("D: the rest", r + 12 * MIB, 28 * MIB, 1, 12 * MIB);

    /* E */
    if (mprotect(r + 24 * MIB, 2 * MIB, PROT_READ)) die("mprotect R");
    bad |= check_at("E: read-only", r + 24 * MIB, 2 * MIB, 1, 24 * MIB);
    fill_at(r + 26 * MIB, 14 * MIB, 2, 26 * MIB);
    bad |= check_at("E: read-only, again", r + 24 * MIB, 2 * MIB, 1, 24 * MIB);
    if (mprotect(r + 24 * MIB, 2 * MIB, PROT_NONE)) die("mprotect NONE");
    fill(r, 8 * MIB, 3);
    if (mprotect(r + 24 * MIB, 2 * MIB, PROT_READ | PROT_WRITE)) die("mprotect back to RW");
    bad |= check_at("E: none, then read-write", r + 24 * MIB, 2 * MIB, 1, 24 * MIB);
    fill_at(r + 24 * MIB, 2 * MIB, 4, 24 * MIB);
    bad |= check_at("E: written again", r + 24 * MIB, 2 * MIB, 4, 24 * MIB);
    bad |= check_at("E: the part after", r + 26 * MIB, 14 * MIB, 2, 26 * MIB);
    bad |= check("E: the part before", r, 8 * MIB, 3);

    /* F */
    if (munmap(r + 56 * MIB, 8 * MIB)) die("munmap tail");
    if (munmap(r + 12 * MIB, 4 * MIB)) die("munmap middle");
    bad |= check("F: before the hole", r, 8 * MIB, 3);
    bad |= check_at("F: after the hole", r + 16 * MIB, 8 * MIB, 1, 16 * MIB);
    bad |= check_at("F: further", r + 24 * MIB, 2 * MIB, 4, 24 * MIB);

    /* G */
    if (madvise(r + 16 * MIB, 8 * MIB, MADV_HUGEPAGE)) die("madvise HUGEPAGE");
    fill_at(r + 16 * MIB, 8 * MIB, 5, 16 * MIB);
    bad |= check_at("G: after MADV_HUGEPAGE", r + 16 * MIB, 8 * MIB, 5, 16 * MIB);
    bad |= check("G: the rest", r, 8 * MIB, 3);

    /* H: a free address, found by mapping and unmapping it. */
    uint8_t *want = xmap(NULL, 32 * MIB, PROT_NONE, MAP_NORESERVE);
    if (munmap(want, 32 * MIB)) die("munmap probe");
    uint8_t *h = xmap(want, 32 * MIB, PROT_NONE, MAP_NORESERVE);
    if (h != want) {
        fprintf(stderr, "MISMATCH H: a reservation asked for at %p came back at %p\n", (void *)want, (void *)h);
        bad = 1;
    }
    if (xmap(h, 24 * MIB, PROT_READ | PROT_WRITE, MAP_FIXED) != h) die("commit H");
    fill(h, 24 * MIB, 6);
    bad |= check("H: committed at the hinted address", h, 24 * MIB, 6);
    printf("rss_kib H %ld\n", rss_kib());

    /* I */
    uint8_t *x = xmap(h + 24 * MIB, 4 * MIB, PROT_READ | PROT_WRITE | PROT_EXEC, MAP_FIXED);
    memset(x, 0xc3, 4 * MIB);
    for (size_t i = 0; i < 4 * MIB; i += PAGE_BYTES)
        if (x[i] != 0xc3) {
            fprintf(stderr, "MISMATCH I: the executable mapping lost a byte at %zu\n", i);
            bad = 1;
            break;
        }
    bad |= check("I: the rest of H", h, 24 * MIB, 6);
    bad |= check("I: the first reservation", r, 8 * MIB, 3);

    if (!bad) printf("reserve ok\n");
    return bad;
}
