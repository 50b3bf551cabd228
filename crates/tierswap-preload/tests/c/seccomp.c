/* The pager loses the use of its userfaultfd while the program runs: a seccomp filter
 * (applied to every thread, as sandboxes do) makes read and ioctl on the userfaultfd fail with
 * EPERM. The pager's fault threads can no longer serve a fault: the process must end with
 * SIGABRT and a message naming tierswap, never hang and never go on with wrong bytes.
 * The program then touches swapped-out memory and would report a mismatch if it got one. */
#include "common.h"

#include <dirent.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>

static int find_userfaultfd(void) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) die("opendir /proc/self/fd");
    struct dirent *e;
    int found = -1;
    while ((e = readdir(d))) {
        char path[300], target[128];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t n = readlink(path, target, sizeof target - 1);
        if (n <= 0) continue;
        target[n] = 0;
        if (strstr(target, "userfaultfd")) found = atoi(e->d_name);
    }
    closedir(d);
    return found;
}

int main(void) {
    size_t n = 24 * MIB;
    uint8_t *a = xmalloc(n);
    fill(a, n, 41);
    int uffd = find_userfaultfd();
    if (uffd < 0) {
        fprintf(stderr, "seccomp: no userfaultfd in /proc/self/fd: not running under tierswap?\n");
        return 3;
    }
    struct sock_filter filter[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_read, 1, 0),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ioctl, 0, 3),
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0])),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)uffd, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    struct sock_fprog prog = {sizeof filter / sizeof filter[0], filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) die("PR_SET_NO_NEW_PRIVS");
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog)) die("seccomp TSYNC");
    /* Swapped-out pages: each needs the pager, which cannot serve any more. */
    int bad = check("memory after the pager lost its userfaultfd", a, n, 41);
    fprintf(stderr, "seccomp: still running after the pager lost its userfaultfd (bad %d)\n", bad);
    return 1;
}
