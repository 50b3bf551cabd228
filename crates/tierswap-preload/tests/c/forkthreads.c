/* fork while other threads of the parent fault on managed memory: T threads sweep buffers
 * of their own (read and check every page, then write its first word), well beyond the
 * budget, so their reads and writes keep faulting while the main thread forks F times.
 *
 * Every page of thread t's buffer holds the fill pattern behind an 8-byte tag, the one word
 * the thread writes: tag(t, round, page). A sweep checks each page's pattern and its tag
 * from the last sweep, then writes this sweep's tag; after a sweep the thread publishes its
 * round. An aligned 8-byte store is never torn, so any copy of a page is whole.
 *
 * Each child checks, as of its fork: the main buffer (no thread touches it) byte for byte,
 * and each thread's buffer: the pattern byte for byte, and every tag naming its thread and
 * page with a round from the thread's published round P (read in the child: its value at
 * the fork) to P + 2 (the kernel write-protects a thread's pages for the child one page
 * table at a time, so a thread running on another CPU may finish a sweep and start the next
 * on pages not yet reached). Then the child writes heads over the main buffer and checks.
 * The parent, once its threads stop, checks every byte of every buffer: the tags of the
 * last sweep, nothing the children wrote.
 *
 * Usage: forkthreads T MIB_MAIN MIB_PER_THREAD F. Exit 0 and "forkthreads ok": every byte
 * right, in every child and in the parent. */
#include "forking.h"

#include <pthread.h>

#define SEED_MAIN 61
#define SEED_THREAD 70
#define CHILD_HEADS 62
#define MAX_THREADS 16

static size_t n_threads, main_len, thread_len;
static uint8_t *main_buf;
static uint8_t *thread_buf[MAX_THREADS];
static uint64_t progress[MAX_THREADS];
static int stop;

struct worker {
    size_t t;
    uint64_t rounds;
    int bad;
};

static inline uint64_t tag(uint64_t t, uint64_t round, uint64_t page) {
    return 0x7a6ULL << 52 | t << 44 | round << 24 | page;
}

/* Every byte of page p of thread t's buffer after the tag. */
static int pattern_ok(const uint8_t *buf, size_t p, uint64_t seed, size_t *first) {
    return page_wrong(buf, p, KIND_MIXED, seed, 8, first) == 0;
}

static void *sweep(void *arg) {
    struct worker *w = arg;
    size_t t = w->t, pages = thread_len / PAGE_BYTES;
    uint8_t *buf = thread_buf[t];
    uint64_t seed = SEED_THREAD + t;
    kind_fill(buf, thread_len, KIND_MIXED, seed);
    for (size_t p = 0; p < pages; p++) *(volatile uint64_t *)(buf + p * PAGE_BYTES) = tag(t, 0, p);
    for (uint64_t r = 1; !__atomic_load_n(&stop, __ATOMIC_ACQUIRE); r++) {
        for (size_t p = 0; p < pages; p++) {
            volatile uint64_t *head = (volatile uint64_t *)(buf + p * PAGE_BYTES);
            size_t first = 0;
            int pattern = pattern_ok(buf, p, seed, &first);
            if (*head != tag(t, r - 1, p) || !pattern) {
                fprintf(stderr, "MISMATCH thread %zu, sweep %llu: page %zu holds tag %#llx, want %#llx (pattern %s)\n",
                        t, (unsigned long long)r, p, (unsigned long long)*head,
                        (unsigned long long)tag(t, r - 1, p), pattern ? "right" : "wrong");
                w->bad = 1;
                return NULL;
            }
            *head = tag(t, r, p);
        }
        __atomic_store_n(&progress[t], r, __ATOMIC_RELEASE);
        w->rounds = r;
    }
    return NULL;
}

/* A child's look at thread t's buffer: see the top comment. */
static int child_check_thread(size_t t) {
    size_t pages = thread_len / PAGE_BYTES;
    uint64_t published = progress[t];
    const uint8_t *buf = thread_buf[t];
    for (size_t p = 0; p < pages; p++) {
        uint64_t head = *(const uint64_t *)(buf + p * PAGE_BYTES);
        uint64_t round = head >> 24 & 0xfffff;
        size_t first = 0;
        int pattern = pattern_ok(buf, p, SEED_THREAD + t, &first);
        if (head != tag(t, round, p) || round < published || round > published + 2 || !pattern) {
            fprintf(stderr,
                    "MISMATCH child: thread %zu's page %zu holds tag %#llx (round %llu; the thread had published "
                    "round %llu at the fork), pattern %s\n",
                    t, p, (unsigned long long)head, (unsigned long long)round, (unsigned long long)published,
                    pattern ? "right" : "wrong");
            return 1;
        }
    }
    return 0;
}

static int child(void) {
    int bad = kind_check("child: the main buffer at the fork", main_buf, main_len, KIND_MIXED, SEED_MAIN, 0, 0);
    for (size_t t = 0; t < n_threads; t++) bad |= child_check_thread(t);
    write_heads(main_buf, main_len, CHILD_HEADS);
    bad |= kind_check("child: its heads over the main buffer", main_buf, main_len, KIND_MIXED, SEED_MAIN, 1,
                      CHILD_HEADS);
    return bad;
}

int main(int argc, char **argv) {
    stdout_unmanaged();
    if (argc != 5) {
        fprintf(stderr, "usage: forkthreads T MIB_MAIN MIB_PER_THREAD F\n");
        return 2;
    }
    n_threads = (size_t)atoi(argv[1]);
    main_len = (size_t)atol(argv[2]) * MIB;
    thread_len = (size_t)atol(argv[3]) * MIB;
    int forks = atoi(argv[4]);
    if (n_threads < 1 || n_threads > MAX_THREADS || !main_len || !thread_len || forks < 1) {
        fprintf(stderr, "forkthreads: give 1..%d threads, sizes of at least 1 MiB and at least one fork\n",
                MAX_THREADS);
        return 2;
    }
    main_buf = xmalloc(main_len);
    kind_fill(main_buf, main_len, KIND_MIXED, SEED_MAIN);
    for (size_t t = 0; t < n_threads; t++) thread_buf[t] = xmalloc(thread_len);
    pthread_t th[MAX_THREADS];
    struct worker ws[MAX_THREADS];
    for (size_t t = 0; t < n_threads; t++) {
        ws[t] = (struct worker){t, 0, 0};
        if (pthread_create(&th[t], NULL, sweep, &ws[t])) die("pthread_create");
    }
    /* Every thread into its second sweep: its buffer filled, its faults going on. */
    for (size_t t = 0; t < n_threads; t++)
        while (__atomic_load_n(&progress[t], __ATOMIC_ACQUIRE) < 1 && !ws[t].bad) sleep_ms(1);
    int bad = 0;
    for (int f = 0; f < forks; f++) {
        pid_t pid = fork();
        if (pid < 0) die("fork");
        if (pid == 0) _exit(child());
        bad |= reap(pid, "a child");
        sleep_ms(20);
    }
    __atomic_store_n(&stop, 1, __ATOMIC_RELEASE);
    uint64_t sweeps = 0;
    for (size_t t = 0; t < n_threads; t++) {
        pthread_join(th[t], NULL);
        bad |= ws[t].bad;
        sweeps += ws[t].rounds;
    }
    bad |= kind_check("parent: the main buffer after the children", main_buf, main_len, KIND_MIXED, SEED_MAIN, 0, 0);
    for (size_t t = 0; t < n_threads && !bad; t++) {
        size_t pages = thread_len / PAGE_BYTES;
        for (size_t p = 0; p < pages; p++) {
            uint64_t head = *(const uint64_t *)(thread_buf[t] + p * PAGE_BYTES);
            size_t first = 0;
            if (head != tag(t, ws[t].rounds, p) || !pattern_ok(thread_buf[t], p, SEED_THREAD + t, &first)) {
                fprintf(stderr, "MISMATCH parent: thread %zu's page %zu holds tag %#llx, want %#llx after its last sweep\n",
                        t, p, (unsigned long long)head, (unsigned long long)tag(t, ws[t].rounds, p));
                bad = 1;
                break;
            }
        }
    }
    if (!bad) printf("forkthreads ok: %d forks, %llu sweeps of %zu MiB by %zu threads\n", forks,
                     (unsigned long long)sweeps, thread_len / MIB, n_threads);
    return bad;
}
