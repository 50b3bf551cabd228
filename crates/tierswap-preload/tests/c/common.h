/* Shared by the C programs that test libtierswap_preload.so (crates/tierswap-cli/tests/run.rs
 * compiles and runs them under `tierswap run`). Every buffer is filled with a pattern that is
 * a pure function of (seed, byte offset), so any range can be checked against what went in
 * without keeping a copy. Pages cycle through the kinds the pager stores differently: zero,
 * same-filled, compressible counters and incompressible noise. */
#ifndef TIERSWAP_TEST_COMMON_H
#define TIERSWAP_TEST_COMMON_H

#define _GNU_SOURCE
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#define MIB ((size_t)1 << 20)
#define PAGE_BYTES 4096

static inline uint64_t mix64(uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
}

/* The 8-byte word number idx_word of the stream `seed`. */
static inline uint64_t pattern_word(uint64_t seed, uint64_t idx_word) {
    uint64_t page = idx_word / (PAGE_BYTES / 8);
    switch ((page + seed) % 8) {
    case 0: return 0;
    case 1: return 0x0101010101010101ULL * ((seed * 7 + page) & 0xff);
    case 2: case 3: case 4: case 5: return (seed << 40) ^ idx_word;
    default: return mix64((seed << 40) ^ idx_word);
    }
}

static inline uint8_t pattern_byte(uint64_t seed, uint64_t off) {
    return (uint8_t)(pattern_word(seed, off / 8) >> (8 * (off % 8)));
}

/* Fills buf[0..len) with stream `seed` starting at stream offset `off` (multiples of 8 are fast). */
static inline void fill_at(uint8_t *buf, size_t len, uint64_t seed, uint64_t off) {
    size_t i = 0;
    if (off % 8 == 0 && (uintptr_t)buf % 8 == 0) {
        for (; i + 8 <= len; i += 8)
            *(uint64_t *)(buf + i) = pattern_word(seed, (off + i) / 8);
    }
    for (; i < len; i++)
        buf[i] = pattern_byte(seed, off + i);
}

static inline void fill(uint8_t *buf, size_t len, uint64_t seed) { fill_at(buf, len, seed, 0); }

/* Compares buf[0..len) with stream `seed` from offset `off`; prints the first mismatch and
 * the number of wrong bytes. Returns 0 when every byte is right. */
static inline int check_at(const char *what, const uint8_t *buf, size_t len, uint64_t seed, uint64_t off) {
    size_t wrong = 0, first = (size_t)-1;
    size_t i = 0;
    if (off % 8 == 0 && (uintptr_t)buf % 8 == 0) {
        for (; i + 8 <= len; i += 8) {
            if (*(const uint64_t *)(buf + i) == pattern_word(seed, (off + i) / 8)) continue;
            for (size_t j = i; j < i + 8; j++)
                if (buf[j] != pattern_byte(seed, off + j)) {
                    if (first == (size_t)-1) first = j;
                    wrong++;
                }
        }
    }
    for (; i < len; i++)
        if (buf[i] != pattern_byte(seed, off + i)) {
            if (first == (size_t)-1) first = i;
            wrong++;
        }
    if (wrong) {
        fprintf(stderr, "MISMATCH %s: %zu of %zu bytes wrong, first at offset %zu (got %02x, want %02x)\n", what,
                wrong, len, first, buf[first], pattern_byte(seed, off + first));
        return 1;
    }
    return 0;
}

static inline int check(const char *what, const uint8_t *buf, size_t len, uint64_t seed) {
    return check_at(what, buf, len, seed, 0);
}

/* Every byte of buf[0..len) is zero. */
static inline int check_zero(const char *what, const uint8_t *buf, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (buf[i]) {
            fprintf(stderr, "MISMATCH %s: byte %zu is %02x, want 00 (after DONTNEED/FREE)\n", what, i, buf[i]);
            return 1;
        }
    return 0;
}

static void die(const char *what) {
    fprintf(stderr, "FAILED %s: %s\n", what, strerror(errno));
    exit(99);
}

/* This process's resident memory (VmRSS), KiB. */
static inline long rss_kib(void) {
    FILE *f = fopen("/proc/self/status", "r");
    if (!f) die("open /proc/self/status");
    char line[256];
    long kib = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "VmRSS: %ld kB", &kib) == 1) break;
    fclose(f);
    return kib;
}

static inline uint8_t *xmalloc(size_t n) {
    uint8_t *p = malloc(n);
    if (!p) die("malloc");
    return p;
}

static inline uint8_t *xmmap(size_t n) {
    void *p = mmap(NULL, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) die("mmap");
    return p;
}

#endif
