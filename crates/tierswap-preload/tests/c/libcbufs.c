/* Buffers glibc allocates for itself and hands to system calls, with every other page
 * evicted in between: a stdout stream's buffer (written by write(2) when it is flushed,
 * at exit here), a directory stream's dirent buffer (getdents64), getline's line (read(2)
 * through a FILE's buffer). Under a budget of 8 MiB the program fills and checks 32 MiB
 * between making each buffer and the system call that uses it.
 * Prints LINES numbered lines while the churn goes on, then "libcbufs ok" when the
 * directory listing and the lines read back with getline were right; the test counts
 * the numbered lines. */
#include "common.h"

#include <dirent.h>

#define LINES 200
#define SEED 11

static void churn(uint8_t *a, size_t n, uint64_t seed) {
    fill(a, n, seed);
    if (check("churn", a, n, seed)) exit(1);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: libcbufs DIR (a directory this program may write in)\n");
        return 2;
    }
    size_t n = 32 * MIB;
    uint8_t *a = xmalloc(n);
    /* A file of LINES lines to read back with getline. */
    char path[4096];
    snprintf(path, sizeof path, "%s/libcbufs-lines.txt", argv[1]);
    FILE *w = fopen(path, "w");
    if (!w) die("fopen for writing");
    for (int i = 0; i < LINES; i++) fprintf(w, "line %d of the file\n", i);
    if (fclose(w)) die("fclose");

    /* stdout is a pipe: fully buffered, flushed at exit. */
    for (int i = 0; i < LINES; i++) {
        printf("numbered line %d\n", i);
        if (i % 50 == 0) churn(a, n, SEED + i);
    }

    DIR *d = opendir(argv[1]);
    if (!d) die("opendir");
    churn(a, n, SEED + 1000);
    int found = 0;
    for (struct dirent *e; (e = readdir(d));)
        if (!strcmp(e->d_name, "libcbufs-lines.txt")) found = 1;
    closedir(d);
    if (!found) {
        fprintf(stderr, "MISMATCH readdir did not list libcbufs-lines.txt\n");
        return 1;
    }

    FILE *r = fopen(path, "r");
    if (!r) die("fopen for reading");
    char *line = NULL;
    size_t cap = 0;
    int k = 0;
    for (ssize_t got; (got = getline(&line, &cap, r)) > 0; k++) {
        char want[64];
        snprintf(want, sizeof want, "line %d of the file\n", k);
        if (strcmp(line, want)) {
            fprintf(stderr, "MISMATCH getline %d read '%s'\n", k, line);
            return 1;
        }
        if (k % 64 == 0) churn(a, n, SEED + 2000 + k);
    }
    if (ferror(r) || k != LINES) {
        fprintf(stderr, "MISMATCH getline read %d lines of %d (error %d)\n", k, LINES, ferror(r));
        return 1;
    }
    free(line);
    fclose(r);
    churn(a, n, SEED + 3000);
    printf("libcbufs ok\n");
    return 0;
}
