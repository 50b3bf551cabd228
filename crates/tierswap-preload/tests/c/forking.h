/* Shared by the fork tests' C programs (crates/tierswap-cli/tests/fork.rs runs them): page
 * contents of one kind each, so a case can put pages in the state it is about (zero and
 * same-filled pages go to the zero tier, counters compress, noise does not); the pager's
 * gauges read from inside the program through its control socket; a child's end as a verdict.
 * Children of a threaded parent call only what is safe after fork: these helpers touch
 * memory, write(2) to stderr through stdio's unbuffered stream, and _exit. */
#ifndef TIERSWAP_TEST_FORKING_H
#define TIERSWAP_TEST_FORKING_H

#include "common.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>

#define PAGE_WORDS (PAGE_BYTES / 8)
/* A child writes this many bytes at the start of a page: the rest must keep the page's
 * fork-time bytes (a write to a swapped-out page must bring the page in, not zeros). */
#define HEAD_BYTES 64

enum kind { KIND_MIXED, KIND_COUNTERS, KIND_NOISE, KIND_ZERO, KIND_SAMEFILL, KIND_TEXT };

static inline int parse_kind(const char *s, enum kind *k) {
    static const char *names[] = {"mixed", "counters", "noise", "zero", "samefill", "text"};
    for (int i = 0; i < 6; i++)
        if (!strcmp(s, names[i])) {
            *k = (enum kind)i;
            return 0;
        }
    return -1;
}

/* Word idx_word of a buffer of kind k filled for `seed`. Counters compress well with zstd
 * but only to about half with lz4; text compresses well with both. Same-filled pages repeat one
 * non-zero word, a different one per page: a 32-bit value twice, a pattern the swap entry
 * holds itself (a word that is not one goes to the pool). */
static inline uint64_t kind_word(enum kind k, uint64_t seed, uint64_t idx_word) {
    uint64_t page = idx_word / PAGE_WORDS;
    switch (k) {
    case KIND_MIXED: return pattern_word(seed, idx_word);
    case KIND_COUNTERS: return (seed << 40) ^ idx_word;
    case KIND_NOISE: return mix64((seed << 40) ^ idx_word);
    case KIND_ZERO: return 0;
    case KIND_TEXT: /* a 64-byte line naming the page, repeated: compresses well with lz4 too */
        return idx_word % 8 ? 0x2020202020202000ULL | (idx_word % 8) : seed << 48 | page;
    case KIND_SAMEFILL: {
        uint64_t x = (mix64((seed << 32) ^ page) & 0xffffffffULL) | 1;
        return x << 32 | x;
    }
    }
    return 0;
}

/* What a child writes at the head of page `page` (HEAD_BYTES, never zero, never a page's
 * repeated word). */
static inline uint64_t head_word(uint64_t seed, uint64_t page, uint64_t i) {
    return mix64((0xc41dULL << 48) ^ (seed << 32) ^ (page << 4) ^ i) | 0x8000000000000000ULL;
}

/* Writes every word of buf[0..n) for kind k; the stores are volatile so that zero pages are
 * really written (a compiler may turn malloc + zero stores into calloc, which touches nothing). */
static inline void kind_fill(uint8_t *buf, size_t n, enum kind k, uint64_t seed) {
    volatile uint64_t *w = (volatile uint64_t *)buf;
    for (size_t i = 0; i < n / 8; i++) w[i] = kind_word(k, seed, i);
}

/* Compares page `page` of buf with kind k (from byte `from` of the page on). Returns the
 * number of wrong bytes and the first wrong offset in *first. */
static inline size_t page_wrong(const uint8_t *buf, size_t page, enum kind k, uint64_t seed, size_t from,
                                size_t *first) {
    const uint64_t *w = (const uint64_t *)(buf + page * PAGE_BYTES);
    size_t wrong = 0;
    for (size_t i = from / 8; i < PAGE_WORDS; i++) {
        uint64_t want = kind_word(k, seed, page * PAGE_WORDS + i);
        if (w[i] == want) continue;
        for (size_t b = 0; b < 8; b++)
            if ((uint8_t)(w[i] >> (8 * b)) != (uint8_t)(want >> (8 * b))) {
                if (!wrong) *first = page * PAGE_BYTES + i * 8 + b;
                wrong++;
            }
    }
    return wrong;
}

/* Pages [p0, p1) of buf (page numbers count from buf) are kind k for seed, except the first
 * HEAD_BYTES of each page when `heads` is non-zero: those are head_word(head_seed, …).
 * Prints the first mismatch and the count. Returns 0 when every byte is right. */
static inline int kind_check_pages(const char *what, const uint8_t *buf, size_t p0, size_t p1, enum kind k,
                                   uint64_t seed, int heads, uint64_t head_seed) {
    size_t wrong = 0, first = (size_t)-1, pages_wrong = 0;
    for (size_t p = p0; p < p1; p++) {
        size_t f = 0, here = page_wrong(buf, p, k, seed, heads ? HEAD_BYTES : 0, &f);
        if (heads) {
            const uint64_t *w = (const uint64_t *)(buf + p * PAGE_BYTES);
            for (size_t i = 0; i < HEAD_BYTES / 8; i++)
                if (w[i] != head_word(head_seed, p, i)) {
                    if (!here) f = p * PAGE_BYTES + i * 8;
                    here += 8;
                }
        }
        if (here) {
            if (first == (size_t)-1) first = f;
            wrong += here;
            pages_wrong++;
        }
    }
    if (wrong) {
        fprintf(stderr, "MISMATCH %s: %zu bytes wrong in %zu of pages %zu..%zu, first at offset %zu (page %zu)\n",
                what, wrong, pages_wrong, p0, p1, first, first / PAGE_BYTES);
        return 1;
    }
    return 0;
}

/* kind_check_pages over all of buf[0..n). */
static inline int kind_check(const char *what, const uint8_t *buf, size_t n, enum kind k, uint64_t seed, int heads,
                             uint64_t head_seed) {
    return kind_check_pages(what, buf, 0, n / PAGE_BYTES, k, seed, heads, head_seed);
}

/* Writes the first HEAD_BYTES of pages [p0, p1) of buf with head_word(head_seed, …). */
static inline void write_heads_pages(uint8_t *buf, size_t p0, size_t p1, uint64_t head_seed) {
    for (size_t p = p0; p < p1; p++) {
        volatile uint64_t *w = (volatile uint64_t *)(buf + p * PAGE_BYTES);
        for (size_t i = 0; i < HEAD_BYTES / 8; i++) w[i] = head_word(head_seed, p, i);
    }
}

/* write_heads_pages over all of buf[0..n). */
static inline void write_heads(uint8_t *buf, size_t n, uint64_t head_seed) {
    write_heads_pages(buf, 0, n / PAGE_BYTES, head_seed);
}

/* Waits for child `pid` and says how it ended: 0 when it exited 0. */
static inline int reap(pid_t pid, const char *who) {
    int st;
    if (waitpid(pid, &st, 0) != pid) die("waitpid");
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return 0;
    if (WIFSIGNALED(st))
        fprintf(stderr, "MISMATCH %s was killed by signal %d (%s)\n", who, WTERMSIG(st), strsignal(WTERMSIG(st)));
    else
        fprintf(stderr, "MISMATCH %s exited with %d (its bytes were wrong; its messages are above)\n", who,
                WEXITSTATUS(st));
    return 1;
}

/* Gives stdout a buffer outside managed memory: stdio's own would be a managed page that
 * printing swaps in and out, moving the gauges the tests compare by a page. */
static inline void stdout_unmanaged(void) {
    static char buf[1 << 14];
    setvbuf(stdout, buf, _IOFBF, sizeof buf);
}

static inline void sleep_ms(long ms) {
    struct timespec t = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&t, &t) && errno == EINTR) {}
}

/* The pager's gauges (the fields of `tierswap stat PID --format json` named alike). */
struct gauges {
    long long present_pages, staged_pages, swap_slots, swap_zero_pages, swap_samefill_pages, pool_stored_pages,
        pool_stored_bytes, file_pages, file_bytes;
};

static inline long long json_field(const char *json, const char *name) {
    char key[64];
    snprintf(key, sizeof key, "\"%s\":", name);
    const char *at = strstr(json, key);
    if (!at) {
        fprintf(stderr, "FAILED no field %s in the control socket's reply\n", name);
        exit(99);
    }
    return strtoll(at + strlen(key), NULL, 10);
}

/* Asks this process's pager for its stats through the control socket
 * ($TIERSWAP_CONTROL_DIR/<pid>.sock, else /run/tierswap/<pid>.sock). Exits 99 when no pager
 * answers: the program runs unmanaged and nothing it would measure means anything. */
static inline void read_gauges(struct gauges *g) {
    static char control_reply[1 << 17];
    const char *dir = getenv("TIERSWAP_CONTROL_DIR");
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s/%d.sock", dir && *dir ? dir : "/run/tierswap", (int)getpid());
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) die("socket");
    if (connect(fd, (struct sockaddr *)&sa, sizeof sa)) {
        fprintf(stderr, "FAILED no pager answers at %s: %s (is the program managed?)\n", sa.sun_path, strerror(errno));
        exit(99);
    }
    if (write(fd, "stats\n", 6) != 6) die("write to the control socket");
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, control_reply + got, sizeof control_reply - 1 - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) die("read from the control socket");
        if (r == 0) break;
        got += (size_t)r;
        if (got == sizeof control_reply - 1) break;
    }
    close(fd);
    control_reply[got] = 0;
    g->present_pages = json_field(control_reply, "present_pages");
    g->staged_pages = json_field(control_reply, "staged_pages");
    g->swap_slots = json_field(control_reply, "swap_slots");
    g->swap_zero_pages = json_field(control_reply, "swap_zero_pages");
    g->swap_samefill_pages = json_field(control_reply, "swap_samefill_pages");
    g->pool_stored_pages = json_field(control_reply, "pool_stored_pages");
    g->pool_stored_bytes = json_field(control_reply, "pool_stored_bytes");
    g->file_pages = json_field(control_reply, "file_pages");
    g->file_bytes = json_field(control_reply, "file_bytes");
}

/* One line the Rust test parses: `gauges LABEL name=value …`. */
static inline void print_gauges(const char *label, const struct gauges *g) {
    printf("gauges %s present_pages=%lld staged_pages=%lld swap_slots=%lld swap_zero_pages=%lld "
           "swap_samefill_pages=%lld pool_stored_pages=%lld pool_stored_bytes=%lld file_pages=%lld file_bytes=%lld\n",
           label, g->present_pages, g->staged_pages, g->swap_slots, g->swap_zero_pages, g->swap_samefill_pages,
           g->pool_stored_pages, g->pool_stored_bytes, g->file_pages, g->file_bytes);
    fflush(stdout);
}

/* Reads the gauges until three reads 100 ms apart agree (the pager has finished what it
 * was doing: reclaim, writeback, a child's release), at most `max_ms`; prints them under
 * LABEL, with `settled=0` when they never agreed. */
static inline void settle_gauges(const char *label, struct gauges *g, long max_ms) {
    struct gauges prev;
    read_gauges(&prev);
    int same = 0;
    long waited = 0;
    while (same < 2 && waited < max_ms) {
        sleep_ms(100);
        waited += 100;
        read_gauges(g);
        same = memcmp(g, &prev, sizeof *g) ? 0 : same + 1;
        prev = *g;
    }
    *g = prev;
    print_gauges(label, g);
    if (same < 2) printf("unsettled %s after %ld ms\n", label, max_ms);
}

/* Like settle_gauges, once the gauges differ from *from (a release the pager does in its own
 * time, e.g. a child's references once it has noticed the child is gone), at most `max_ms`
 * in all. */
static inline void settle_gauges_after_change(const char *label, struct gauges *g, const struct gauges *from,
                                              long max_ms) {
    long waited = 0;
    for (read_gauges(g); !memcmp(g, from, sizeof *g) && waited < max_ms; waited += 50) {
        sleep_ms(50);
        read_gauges(g);
    }
    settle_gauges(label, g, max_ms - waited > 1000 ? max_ms - waited : 1000);
}

#endif
