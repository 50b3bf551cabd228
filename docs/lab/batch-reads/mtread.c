// THREADS program threads each reading one page at random from MIB MiB of malloc, checking
// every page it reads: a stamp in its first word and every 37th word after it. Odd pages
// are random words (incompressible), even pages mostly one repeated word; the checked words
// are the page's own in both. Prints the reads a second of the timed phase.
//   cc -O2 -pthread -o mtread mtread.c; ./mtread MIB THREADS READS_PER_THREAD
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static unsigned char *mem;
static size_t pages;
static int reads;
static uint64_t bad;

static uint64_t mix(uint64_t x) {
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    return x;
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static int checked(int k) { return k % 37 == 1; }

static void *reader(void *arg) {
    uint64_t s = (uintptr_t)arg * 0x9e3779b97f4a7c15ULL + 1, b = 0;
    for (int i = 0; i < reads; i++) {
        s = mix(s + i);
        size_t pg = s % pages;
        const uint64_t *q = (const uint64_t *)(mem + pg * 4096);
        if (q[0] != pg * 2654435761u) b++;
        for (int k = 1; k < 512; k++)
            if (checked(k) && q[k] != mix(pg * 512 + k)) { b++; break; }
    }
    __atomic_add_fetch(&bad, b, __ATOMIC_RELAXED);
    return 0;
}

int main(int argc, char **argv) {
    if (argc != 4) { fprintf(stderr, "usage: mtread MIB THREADS READS_PER_THREAD\n"); return 2; }
    size_t mib = atoi(argv[1]);
    int threads = atoi(argv[2]);
    reads = atoi(argv[3]);
    if (threads < 1 || threads > 64) { fprintf(stderr, "threads: 1..64\n"); return 2; }
    pages = (mib << 20) / 4096;
    mem = malloc(pages * 4096);
    for (size_t pg = 0; pg < pages; pg++) {
        uint64_t *q = (uint64_t *)(mem + pg * 4096);
        q[0] = pg * 2654435761u;
        for (int k = 1; k < 512; k++)
            q[k] = (pg & 1) || checked(k) ? mix(pg * 512 + k) : 0x20646f6f67206f6bULL;
    }
    pthread_t th[64];
    double t0 = now();
    for (long i = 0; i < threads; i++) pthread_create(&th[i], 0, reader, (void *)(i + 1));
    for (int i = 0; i < threads; i++) pthread_join(th[i], 0);
    double d = now() - t0;
    printf("threads %d: %.0f reads/s, bad %lu\n", threads, threads * (double)reads / d, (unsigned long)bad);
    return bad != 0;
}
