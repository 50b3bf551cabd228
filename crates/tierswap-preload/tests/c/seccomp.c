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

/* Every userfaultfd of the process (the pager may have more than one), up to `max`. */
static int find_userfaultfds(int *fds, int max) {
    DIR *d = opendir("/proc/self/fd");
    if (!d) die("opendir /proc/self/fd");
    struct dirent *e;
    int n = 0;
    while ((e = readdir(d)) && n < max) {
        char path[300], target[128];
        snprintf(path, sizeof path, "/proc/self/fd/%s", e->d_name);
        ssize_t len = readlink(path, target, sizeof target - 1);
        if (len <= 0) continue;
        target[len] = 0;
        if (strstr(target, "userfaultfd")) fds[n++] = atoi(e->d_name);
    }
    closedir(d);
    return n;
}

int main(void) {
    size_t n = 24 * MIB;
    uint8_t *a = xmalloc(n);
    fill(a, n, 41);
    int uffds[8];
    int n_uffd = find_userfaultfds(uffds, 8);
    if (n_uffd == 0) {
        fprintf(stderr, "seccomp: no userfaultfd in /proc/self/fd: not running under tierswap?\n");
        return 3;
    }
    /* read or ioctl with args[0] one of the userfaultfds: EPERM; anything else: allowed. */
    struct sock_filter filter[8 + 2 * 8];
    int k = 0;
    filter[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch));
    filter[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0);
    filter[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    filter[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr));
    filter[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_read, 1, 0);
    filter[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_ioctl, 0, (unsigned char)(n_uffd + 1));
    filter[k++] = (struct sock_filter)BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[0]));
    for (int i = 0; i < n_uffd; i++)
        /* match: jump to the EPERM return, past the remaining tests and the ALLOW */
        filter[k++] = (struct sock_filter)BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (unsigned)uffds[i], (unsigned char)(n_uffd - i), 0);
    filter[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW);
    filter[k++] = (struct sock_filter)BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM);
    struct sock_fprog prog = {(unsigned short)k, filter};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0)) die("PR_SET_NO_NEW_PRIVS");
    if (syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, SECCOMP_FILTER_FLAG_TSYNC, &prog)) die("seccomp TSYNC");
    /* Swapped-out pages: each needs the pager, which cannot serve any more. */
    int bad = check("memory after the pager lost its userfaultfd", a, n, 41);
    fprintf(stderr, "seccomp: still running after the pager lost its userfaultfd (bad %d)\n", bad);
    return 1;
}
