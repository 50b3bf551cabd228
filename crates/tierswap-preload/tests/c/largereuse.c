/* Large allocations freed and made again, as a program building buffers over and over does:
 * each round mallocs buffers of 300 KiB to 6 MiB, fills them, frees them; then callocs the
 * same sizes (every byte must read zero, whatever the memory held before), reallocs one
 * bigger (its bytes must follow), and checks every byte. A forked child does the same on
 * its own while the parent keeps its buffers. Under a budget of a few MiB the pages also go
 * out and come back. HOLD_MIB (0 by default) more MiB are filled first and held to the end,
 * checked then: a program whose footprint is most of its budget.
 * Usage: largereuse ROUNDS [HOLD_MIB]. Exit 0: every byte right. */
#include "common.h"

#include <sys/wait.h>

static size_t size_of(int round, int i) { return (300 << 10) + (size_t)((round * 7 + i * 13) % 23) * (256 << 10); }

static int rounds_of(int rounds, uint64_t seed) {
    int bad = 0;
    for (int r = 0; r < rounds; r++) {
        uint8_t *b[4];
        for (int i = 0; i < 4; i++) {
            b[i] = xmalloc(size_of(r, i));
            fill(b[i], size_of(r, i), seed + r * 4 + i);
        }
        for (int i = 0; i < 4; i++) {
            bad += check("malloc'd", b[i], size_of(r, i), seed + r * 4 + i);
            free(b[i]);
        }
        for (int i = 0; i < 4; i++) {
            size_t n = size_of(r, i);
            uint8_t *z = calloc(1, n);
            if (!z) { perror("calloc"); return 1; }
            for (size_t k = 0; k < n; k++)
                if (z[k]) { fprintf(stderr, "calloc'd byte %zu of %zu is %u\n", k, n, z[k]); bad++; break; }
            fill(z, n, seed + 1000 + i);
            uint8_t *g = realloc(z, n + (1 << 20));
            if (!g) { perror("realloc"); return 1; }
            bad += check("realloc'd", g, n, seed + 1000 + i);
            free(g);
        }
    }
    return bad;
}

int main(int argc, char **argv) {
    int rounds = argc > 1 ? atoi(argv[1]) : 50;
    size_t hold_n = (argc > 2 ? (size_t)atoi(argv[2]) : 0) * MIB;
    uint8_t *hold = hold_n ? xmalloc(hold_n) : NULL;
    if (hold) fill(hold, hold_n, 77);
    size_t n = 6 * MIB;
    uint8_t *keep = xmalloc(n);
    fill(keep, n, 90);
    int bad = rounds_of(rounds, 100);
    pid_t pid = fork();
    if (pid < 0) { perror("fork"); return 1; }
    if (pid == 0) {
        int cbad = rounds_of(rounds, 5000) + check("inherited", keep, n, 90);
        printf("child %s\n", cbad ? "BAD" : "ok");
        fflush(stdout);
        _exit(cbad != 0);
    }
    bad += rounds_of(rounds, 9000);
    int st;
    if (waitpid(pid, &st, 0) != pid) { perror("waitpid"); return 1; }
    bad += !WIFEXITED(st) || WEXITSTATUS(st) != 0;
    bad += check("kept", keep, n, 90);
    if (hold) bad += check("held", hold, hold_n, 77);
    printf("largereuse %s\n", bad ? "BAD" : "ok");
    return bad != 0;
}
