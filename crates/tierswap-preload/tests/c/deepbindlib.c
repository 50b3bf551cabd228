/* The library deepbind.c opens with RTLD_DEEPBIND: it checks and frees blocks the program
 * allocated, and allocates blocks the program frees, each with the malloc family it binds
 * to itself. */
#include "common.h"

int lib_check_and_free(uint8_t *p, size_t n, uint64_t seed) {
    int bad = check("given to the library", p, n, seed);
    free(p);
    return bad;
}

uint8_t *lib_alloc(size_t n, uint64_t seed) {
    uint8_t *p = malloc(n);
    if (p) fill(p, n, seed);
    return p;
}

uint8_t *lib_grow(uint8_t *p, size_t n) { return realloc(p, n); }
