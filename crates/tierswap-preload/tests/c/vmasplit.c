/* Managed memory the program splits into several kernel VMAs with madvise advice that
 * changes a VMA's flags (MADV_HUGEPAGE, MADV_RANDOM, MADV_SEQUENTIAL, MADV_DONTDUMP, as
 * numpy and databases do on their arrays) at boundaries inside 64 KiB blocks, then takes
 * back (MADV_NOHUGEPAGE, MADV_NORMAL, MADV_DODUMP): rounds of writes and reads over it
 * under a budget far smaller, every byte checked. Usage: vmasplit MIB ROUNDS.
 * Exit 0: every byte right. */
#include "common.h"

static const int advice_on[] = {MADV_HUGEPAGE, MADV_RANDOM, MADV_SEQUENTIAL, MADV_DONTDUMP};
static const int advice_off[] = {MADV_NOHUGEPAGE, MADV_NORMAL, MADV_NORMAL, MADV_DODUMP};

int main(int argc, char **argv) {
    size_t mib = argc > 1 ? (size_t)atoi(argv[1]) : 64;
    int rounds = argc > 2 ? atoi(argv[2]) : 3;
    size_t len = mib * MIB, pages = len / PAGE_BYTES;
    uint8_t *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) { perror("mmap"); return 1; }
    int bad = 0;
    uint64_t x = 7;
    for (int r = 0; r < rounds; r++) {
        /* Advice over ranges that start and end off any block boundary: every 3 MiB, a range
         * of 1 MiB + 5 pages starting 3 pages in; the kind of advice changes each round. */
        for (size_t off = 3 * PAGE_BYTES; off + MIB + 5 * PAGE_BYTES < len; off += 3 * MIB) {
            int k = (int)((off / (3 * MIB) + r) % 4);
            if (madvise(p + off, MIB + 5 * PAGE_BYTES, advice_on[k]) != 0 && errno != EINVAL) {
                perror("madvise");
                return 1;
            }
        }
        fill(p, len, 100 + r);
        bad += check("filled", p, len, 100 + r);
        /* Random pages read and some rewritten, then all checked: pages go out and come back
         * across the boundaries. */
        for (size_t i = 0; i < pages; i++) {
            x = mix64(x);
            size_t pg = x % pages;
            bad += check_at("read", p + pg * PAGE_BYTES, PAGE_BYTES, 100 + r, pg * PAGE_BYTES);
        }
        /* Half the advice taken back: some VMAs merge again, others stay apart. */
        for (size_t off = 3 * PAGE_BYTES; off + MIB + 5 * PAGE_BYTES < len; off += 6 * MIB) {
            int k = (int)((off / (3 * MIB) + r) % 4);
            madvise(p + off, MIB + 5 * PAGE_BYTES, advice_off[k]);
        }
        bad += check("after", p, len, 100 + r);
    }
    printf("vmasplit %s\n", bad ? "BAD" : "ok");
    return bad != 0;
}
