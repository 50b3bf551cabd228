/* A program with its own SIGBUS handler, as redis, the JVM and Go's runtime have.
 * Usage: ownsigbus sigaction|signal. Fills 16 MiB of managed memory, installs its handler
 * (through sigaction(2) with SA_SIGINFO, or signal(3)), checks that asking for the action
 * returns that handler, checks every byte (in signal mode the pager serves those faults
 * with the program's handler in place), sends itself a SIGBUS, which its handler must get
 * exactly once, and prints "ownsigbus ok". Then it puts the default action back and
 * raises SIGBUS, as a crash handler does: the process must end by SIGBUS. */
#include "common.h"

#include <signal.h>
#include <sys/resource.h>

static volatile sig_atomic_t got, got_code;

static void on_bus_info(int sig, siginfo_t *si, void *ctx) {
    (void)ctx;
    if (sig == SIGBUS) got++;
    got_code = si->si_code;
}

static void on_bus(int sig) {
    if (sig == SIGBUS) got++;
    got_code = SI_USER;
}

int main(int argc, char **argv) {
    if (argc != 2 || (strcmp(argv[1], "sigaction") && strcmp(argv[1], "signal"))) {
        fprintf(stderr, "usage: ownsigbus sigaction|signal\n");
        return 2;
    }
    /* Unbuffered: see status.c. */
    setvbuf(stdout, NULL, _IONBF, 0);
    struct rlimit no_core = {0, 0};
    setrlimit(RLIMIT_CORE, &no_core);
    size_t n = 16 * MIB;
    uint8_t *a = xmalloc(n);
    fill(a, n, 9);
    int info = !strcmp(argv[1], "sigaction");
    if (info) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_bus_info;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        if (sigaction(SIGBUS, &sa, NULL) != 0) { perror("sigaction"); return 1; }
    } else if (signal(SIGBUS, on_bus) == SIG_ERR) {
        perror("signal");
        return 1;
    }
    struct sigaction now;
    if (sigaction(SIGBUS, NULL, &now) != 0) { perror("sigaction query"); return 1; }
    void *want = info ? (void *)on_bus_info : (void *)on_bus;
    void *have = info ? (void *)now.sa_sigaction : (void *)now.sa_handler;
    if (have != want || !!(now.sa_flags & SA_SIGINFO) != info) {
        fprintf(stderr, "the SIGBUS action read back is not the program's handler\n");
        return 1;
    }
    if (check("a", a, n, 9)) return 1;
    if (got) {
        fprintf(stderr, "the program's handler got %d SIGBUS while its memory was read\n", (int)got);
        return 1;
    }
    kill(getpid(), SIGBUS);
    if (got != 1 || got_code != SI_USER) {
        fprintf(stderr, "the program's handler got %d SIGBUS (code %d) for one kill\n", (int)got, (int)got_code);
        return 1;
    }
    if (check("a again", a, n, 9)) return 1;
    printf("ownsigbus ok\n");
    signal(SIGBUS, SIG_DFL);
    raise(SIGBUS);
    fprintf(stderr, "still alive after raise(SIGBUS) with the default action\n");
    return 98;
}
