/* A single-threaded program's signal handlers must run on its own thread, never on one of
 * the pager's: bash blocks SIGCHLD around its job table and its handler assumes it
 * interrupted the shell's only thread (run on another thread it crashed).
 * Usage: sigthread ROUNDS — each round blocks SIGCHLD and SIGALRM, forks a child that
 * exits at once, raises SIGALRM at the process (kill), waits 20 ms with both blocked, then
 * unblocks. A signal the main thread blocks must wait for it: both handlers must then run
 * on the main thread. Prints "sigthread ok N" (N handler runs) or names the stray thread
 * and exits 1. */
#include "common.h"

#include <signal.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>

static volatile sig_atomic_t runs, stray_tid;

static void on_signal(int sig) {
    (void)sig;
    pid_t tid = (pid_t)syscall(SYS_gettid);
    if (tid != getpid()) stray_tid = tid;
    runs++;
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: sigthread ROUNDS\n");
        return 2;
    }
    int rounds = atoi(argv[1]);
    /* Some managed memory, so the pager has started and its threads exist. */
    size_t n = 8 * MIB;
    uint8_t *a = xmalloc(n);
    fill(a, n, 3);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    if (sigaction(SIGCHLD, &sa, NULL) || sigaction(SIGALRM, &sa, NULL)) die("sigaction");
    sigset_t both;
    sigemptyset(&both);
    sigaddset(&both, SIGCHLD);
    sigaddset(&both, SIGALRM);
    for (int r = 0; r < rounds; r++) {
        if (sigprocmask(SIG_BLOCK, &both, NULL)) die("sigprocmask");
        pid_t c = fork();
        if (c < 0) die("fork");
        if (c == 0) _exit(0);
        if (kill(getpid(), SIGALRM)) die("kill");
        struct timespec ts = {0, 20 * 1000 * 1000};
        nanosleep(&ts, NULL);
        if (stray_tid) break;
        if (sigprocmask(SIG_UNBLOCK, &both, NULL)) die("sigprocmask");
        if (waitpid(c, NULL, 0) != c) die("waitpid");
    }
    if (stray_tid) {
        printf("sigthread: a handler ran on thread %d, not the program's %d\n", (int)stray_tid, (int)getpid());
        return 1;
    }
    if (check("buffer", a, n, 3)) return 1;
    printf("sigthread ok %d\n", (int)runs);
    return 0;
}
