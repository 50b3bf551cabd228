/* A program that opens a library with RTLD_DEEPBIND by its bare name, found through the
 * program's own RUNPATH ($ORIGIN/sub), as PHP opens its extensions: blocks cross between
 * the program's malloc family and the library's (freed, reallocated on the other side),
 * every byte checked. Usage: deepbind LIBRARY_NAME. Exit 0: every byte right. */
#include "common.h"

#include <dlfcn.h>

int main(int argc, char **argv) {
    const char *name = argc > 1 ? argv[1] : "deepbindlib.so";
    void *lib = dlopen(name, RTLD_NOW | RTLD_DEEPBIND);
    if (!lib) { fprintf(stderr, "dlopen %s: %s\n", name, dlerror()); return 1; }
    int (*check_and_free)(uint8_t *, size_t, uint64_t) = (int (*)(uint8_t *, size_t, uint64_t))dlsym(lib, "lib_check_and_free");
    uint8_t *(*alloc)(size_t, uint64_t) = (uint8_t * (*)(size_t, uint64_t)) dlsym(lib, "lib_alloc");
    uint8_t *(*grow)(uint8_t *, size_t) = (uint8_t * (*)(uint8_t *, size_t)) dlsym(lib, "lib_grow");
    if (!check_and_free || !alloc || !grow) { fprintf(stderr, "dlsym: %s\n", dlerror()); return 1; }
    static const size_t sizes[] = {16, 1000, 100 << 10, 1 << 20, 8 << 20};
    int bad = 0;
    for (int round = 0; round < 20; round++) {
        for (size_t k = 0; k < sizeof sizes / sizeof sizes[0]; k++) {
            size_t n = sizes[k];
            uint64_t seed = (uint64_t)round * 16 + k;
            uint8_t *p = xmalloc(n);
            fill(p, n, seed);
            bad += check_and_free(p, n, seed);
            uint8_t *q = alloc(n, seed + 1000);
            if (!q) { perror("lib_alloc"); return 1; }
            bad += check("from the library", q, n, seed + 1000);
            uint8_t *g = realloc(q, 2 * n);
            if (!g) { perror("realloc"); return 1; }
            bad += check("reallocated here", g, n, seed + 1000);
            free(g);
            uint8_t *r = xmalloc(n);
            fill(r, n, seed + 2000);
            uint8_t *h = grow(r, 2 * n);
            if (!h) { perror("lib_grow"); return 1; }
            bad += check("reallocated there", h, n, seed + 2000);
            free(h);
        }
    }
    printf("deepbind %s\n", bad ? "BAD" : "ok");
    return bad != 0;
}
