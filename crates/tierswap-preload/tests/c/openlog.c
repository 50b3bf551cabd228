/* A preloaded library of a program's own that interposes the open family, as fakeroot or
 * eatmydata do: it writes "openlog HOW PATH" to stderr for every path that contains
 * "openlog-marker", then calls the next definition (dlsym RTLD_NEXT). Built as a shared
 * library; `tierswap run` puts its shim before it in LD_PRELOAD, so these must still be
 * called for every file that is not a memory cgroup's limit file. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

static void note(const char *how, const char *path) {
    if (path && strstr(path, "openlog-marker")) {
        char buf[512];
        int n = snprintf(buf, sizeof buf, "openlog %s %s\n", how, path);
        if (n > 0 && write(2, buf, (size_t)n) < 0) _exit(3);
    }
}

static mode_t mode_of(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

#define NEXT(name, type) ((type)dlsym(RTLD_NEXT, name))

int open(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_of(flags, ap);
    va_end(ap);
    note("open", path);
    return NEXT("open", int (*)(const char *, int, ...))(path, flags, mode);
}

int open64(const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_of(flags, ap);
    va_end(ap);
    note("open64", path);
    return NEXT("open64", int (*)(const char *, int, ...))(path, flags, mode);
}

int openat(int dirfd, const char *path, int flags, ...) {
    va_list ap;
    va_start(ap, flags);
    mode_t mode = mode_of(flags, ap);
    va_end(ap);
    note("openat", path);
    return NEXT("openat", int (*)(int, const char *, int, ...))(dirfd, path, flags, mode);
}

FILE *fopen(const char *path, const char *mode) {
    note("fopen", path);
    return NEXT("fopen", FILE * (*)(const char *, const char *))(path, mode);
}
