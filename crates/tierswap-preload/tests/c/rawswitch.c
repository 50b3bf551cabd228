/* A launcher that switches to uid/gid 65534 with the raw system calls (as libcap's capsh
 * does, past the shim's uid family), keeping CAP_SYS_PTRACE as an ambient capability, then
 * execs PROG ARGS. Usage: rawswitch PROG ARGS... */
#define _GNU_SOURCE
#include <linux/capability.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc < 2) { fprintf(stderr, "usage: rawswitch PROG ARGS...\n"); return 2; }
    struct __user_cap_header_struct hdr = {_LINUX_CAPABILITY_VERSION_3, 0};
    struct __user_cap_data_struct data[2] = {{0}};
    unsigned bit = 1u << CAP_SYS_PTRACE;
    if (prctl(PR_SET_KEEPCAPS, 1, 0, 0, 0) || syscall(SYS_setgroups, 0, NULL)
        || syscall(SYS_setresgid, 65534, 65534, 65534) || syscall(SYS_setresuid, 65534, 65534, 65534)) {
        perror("switch");
        return 3;
    }
    data[0].effective = data[0].permitted = data[0].inheritable = bit;
    if (syscall(SYS_capset, &hdr, data) || prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, CAP_SYS_PTRACE, 0, 0)) {
        perror("keep CAP_SYS_PTRACE");
        return 3;
    }
    execvp(argv[1], argv + 1);
    perror("exec");
    return 127;
}
