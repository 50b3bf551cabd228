/* Failed calls of the mmap family report the kernel's errno, managed memory or not: one
 * line per call, "NAME ERRNO-NAME", the same natively and under the shim. */
#include "common.h"

static const char *name(int e) {
    switch (e) {
    case 0: return "ok";
    case EEXIST: return "EEXIST";
    case EINVAL: return "EINVAL";
    case ENOMEM: return "ENOMEM";
    case EBADF: return "EBADF";
    case EPERM: return "EPERM";
    default: return "other";
    }
}

static void say(const char *call, int failed) { printf("%s %s\n", call, failed ? name(errno) : "ok"); }

int main(void) {
    size_t sizes[] = {16 * 1024, 4 * MIB}; /* below and above the minimum size */
    for (int k = 0; k < 2; k++) {
        size_t n = sizes[k];
        printf("size %zu\n", n);
        uint8_t *p = xmmap(2 * n);
        memset(p, 1, 2 * n);
        void *q = mmap(p, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
        say("mmap-noreplace-over-a-mapping", q == MAP_FAILED);
        say("mmap-bad-fd", mmap(NULL, n, PROT_READ, MAP_PRIVATE, 12345, 0) == MAP_FAILED);
        say("munmap-unaligned", munmap(p + 1, PAGE_BYTES) != 0);
        say("mprotect-unaligned", mprotect(p + 1, PAGE_BYTES, PROT_READ) != 0);
        say("madvise-unaligned", madvise(p + 1, PAGE_BYTES, MADV_DONTNEED) != 0);
        /* Growing the first half in place runs into a mapping made in the second half's place. */
        if (munmap(p + n, n)) die("munmap second half");
        if (mmap(p + n, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED, -1, 0) != p + n)
            die("mmap fixed after the first half");
        say("mremap-grow-in-place", mremap(p, n, 2 * n, 0) == MAP_FAILED);
        say("mremap-dontunmap-bad-flags", mremap(p, n, n, MREMAP_DONTUNMAP) == MAP_FAILED);
    }
    printf("errnos ok\n");
    return 0;
}
