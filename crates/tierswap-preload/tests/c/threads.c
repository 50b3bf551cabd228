/* Threads on managed memory: each of T threads has its own malloc'd buffer and writes its
 * share of one shared mmap'd buffer (pages p with p % T == t), then after a barrier every
 * thread checks the whole shared buffer and its own; several rounds, a new seed each. Each
 * thread also churns small objects (the shim's size-class heap under contention): allocate,
 * fill, check, realloc, free. Usage: threads [T]. Exit 0: every byte right. */
#include "common.h"

#include <pthread.h>

#define ROUNDS 2
#define OBJECTS 5000

static size_t n_threads = 4;
static size_t shared_len = 12 * MIB;
static size_t own_len = 4 * MIB;
static uint8_t *shared;
static pthread_barrier_t barrier;

struct worker {
    size_t t;
    int bad;
};

static int churn_small(size_t t) {
    uint8_t **objs = calloc(OBJECTS, sizeof *objs);
    size_t *lens = calloc(OBJECTS, sizeof *lens);
    if (!objs || !lens) die("calloc");
    int bad = 0;
    uint64_t seed = 5000 + t;
    for (size_t i = 0; i < OBJECTS; i++) {
        lens[i] = 1 + mix64(seed * OBJECTS + i) % 1000;
        objs[i] = xmalloc(lens[i]);
        fill_at(objs[i], lens[i], seed, i * 4096);
    }
    for (size_t i = 0; i < OBJECTS; i++) {
        bad |= check_at("small object", objs[i], lens[i], seed, i * 4096);
        if (bad) break;
        if (i % 2) {
            free(objs[i]);
            objs[i] = NULL;
        } else {
            size_t grown = lens[i] * 3 + 100;
            uint8_t *q = realloc(objs[i], grown);
            if (!q) die("realloc");
            bad |= check_at("realloc'd small object keeps its bytes", q, lens[i], seed, i * 4096);
            fill_at(q, grown, seed + 1, i * 4096);
            objs[i] = q;
            lens[i] = grown;
        }
    }
    for (size_t i = 0; i < OBJECTS; i += 2) {
        if (!bad) bad |= check_at("grown small object", objs[i], lens[i], seed + 1, i * 4096);
        free(objs[i]);
    }
    free(objs);
    free(lens);
    return bad;
}

static void *work(void *arg) {
    struct worker *w = arg;
    size_t t = w->t;
    uint8_t *own = xmalloc(own_len);
    for (int round = 0; round < ROUNDS; round++) {
        uint64_t shared_seed = 1000 + round, own_seed = 100 * (t + 1) + round;
        fill(own, own_len, own_seed);
        for (size_t off = t * PAGE_BYTES; off < shared_len; off += n_threads * PAGE_BYTES)
            fill_at(shared + off, PAGE_BYTES, shared_seed, off);
        pthread_barrier_wait(&barrier);
        w->bad |= check("shared buffer, written by every thread", shared, shared_len, shared_seed);
        w->bad |= check("own buffer", own, own_len, own_seed);
        w->bad |= churn_small(t + round * 100);
        pthread_barrier_wait(&barrier);
    }
    free(own);
    return NULL;
}

int main(int argc, char **argv) {
    if (argc > 1) n_threads = (size_t)atoi(argv[1]);
    if (n_threads < 1 || n_threads > 64) {
        fprintf(stderr, "usage: threads [1..64]\n");
        return 2;
    }
    shared = xmmap(shared_len);
    pthread_barrier_init(&barrier, NULL, (unsigned)n_threads);
    pthread_t th[64];
    struct worker ws[64];
    for (size_t t = 0; t < n_threads; t++) {
        ws[t] = (struct worker){t, 0};
        if (pthread_create(&th[t], NULL, work, &ws[t])) die("pthread_create");
    }
    int bad = 0;
    for (size_t t = 0; t < n_threads; t++) {
        pthread_join(th[t], NULL);
        bad |= ws[t].bad;
    }
    munmap(shared, shared_len);
    if (!bad) printf("threads ok\n");
    return bad;
}
