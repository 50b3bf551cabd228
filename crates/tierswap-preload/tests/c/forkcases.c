/* A forked child touches pages that were in one state in the parent at the fork, in one
 * way, and must see the fork-time bytes; the parent must keep its own.
 *
 * Usage: forkcases KIND MIB PREP PATTERN
 *   KIND     mixed | counters | text | noise | zero | samefill: what the MIB MiB buffer
 *            holds (mixed cycles through zero, same-filled, compressible and noise pages).
 *   PREP     fill:   fork right after filling (recently evicted pages are still staged);
 *            settle: fork once the pager has finished evicting (pages in the pool / file);
 *            clean:  settle, read every byte back, settle, fork (the pages read last are
 *                    present and clean: write-protected, keeping their swap slot).
 *   PATTERN  read:       the child reads every byte;
 *            read-write: the child reads every byte, then writes the head of every page;
 *            write:      the child writes the head of every page, reading nothing first.
 * After a write the child checks every byte: its heads, and the fork-time bytes behind them.
 * The parent then checks every byte of its own (the child's writes are not its), writes
 * heads of its own and checks again. The gauges just before the fork are printed
 * (`gauges at-fork …`) so the test can tell which state the pages were in.
 * Exit 0 and "forkcases ok": every byte right, in the child and in the parent. */
#include "forking.h"

#define SEED 11
#define CHILD_HEADS 12
#define PARENT_HEADS 13

enum pattern { READ, READ_WRITE, WRITE };

static int child(uint8_t *a, size_t n, enum kind k, enum pattern pat) {
    int bad = 0;
    if (pat == READ || pat == READ_WRITE) bad |= kind_check("child: the fork-time bytes", a, n, k, SEED, 0, 0);
    if (pat == READ_WRITE || pat == WRITE) {
        write_heads(a, n, CHILD_HEADS);
        bad |= kind_check("child: its heads over the fork-time bytes", a, n, k, SEED, 1, CHILD_HEADS);
    }
    return bad;
}

int main(int argc, char **argv) {
    stdout_unmanaged();
    enum kind k;
    enum pattern pat;
    long mib = argc == 5 ? atol(argv[2]) : 0;
    const char *prep = argc == 5 ? argv[3] : "";
    if (argc != 5 || parse_kind(argv[1], &k) || mib < 1 ||
        (strcmp(prep, "fill") && strcmp(prep, "settle") && strcmp(prep, "clean"))) {
        fprintf(stderr, "usage: forkcases mixed|counters|text|noise|zero|samefill MIB fill|settle|clean read|read-write|write\n");
        return 2;
    }
    if (!strcmp(argv[4], "read")) pat = READ;
    else if (!strcmp(argv[4], "read-write")) pat = READ_WRITE;
    else if (!strcmp(argv[4], "write")) pat = WRITE;
    else {
        fprintf(stderr, "forkcases: unknown pattern %s (read, read-write or write)\n", argv[4]);
        return 2;
    }
    printf("forkcases %s %ld MiB %s %s\n", argv[1], mib, prep, argv[4]);
    fflush(stdout);
    size_t n = (size_t)mib * MIB;
    uint8_t *a = xmalloc(n);
    kind_fill(a, n, k, SEED);
    struct gauges g;
    int bad = 0;
    if (strcmp(prep, "fill")) settle_gauges("filled", &g, 10000);
    if (!strcmp(prep, "clean")) {
        bad |= kind_check("parent: read back before the fork", a, n, k, SEED, 0, 0);
        settle_gauges("read-back", &g, 10000);
    }
    read_gauges(&g);
    print_gauges("at-fork", &g);
    pid_t pid = fork();
    if (pid < 0) die("fork");
    if (pid == 0) _exit(child(a, n, k, pat));
    bad |= reap(pid, "the child");
    bad |= kind_check("parent: its own bytes after the child", a, n, k, SEED, 0, 0);
    write_heads(a, n, PARENT_HEADS);
    bad |= kind_check("parent: its own heads after the fork", a, n, k, SEED, 1, PARENT_HEADS);
    free(a);
    if (!bad) printf("forkcases ok\n");
    return bad;
}
