//! `tierswap run` and `libtierswap_preload.so` against real programs: C programs compiled
//! by the test (crates/tierswap-preload/tests/c) fill managed memory, well beyond a budget of
//! a few MiB so pages really go to the pool and the file, and check every byte they get back
//! (exit 0 only when every byte is right). The counters the shim writes at exit
//! (`--stats-on-exit`) show the pages did leave memory and come back.
//!
//! The shim is the cdylib beside the `tierswap` binary in the target directory:
//! `cargo test --workspace` builds it; `cargo test -p tierswap-cli` alone does not, and then
//! these tests say so.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{
    assert_swapped_both_ways, compile, compile_library, preload, run_to_end, run_within, stats, tierswap_bin,
    tierswap_run, TestDir,
};

/// Runs `tierswap run ARGS`, which must refuse them: exit 2, nothing on stdout, one line on
/// stderr naming tierswap, and the program (which would create `marker`) never run.
/// Returns that line.
fn refused(args: &[&str], marker: &Path) -> String {
    let mut cmd = Command::new(tierswap_bin());
    cmd.arg("run").args(args).env("TIERSWAP_PRELOAD", preload());
    let ran = run_to_end(cmd);
    assert_eq!(ran.status.code(), Some(2), "{args:?}: {}", ran.describe());
    assert!(ran.stdout.is_empty(), "{args:?}: nothing on stdout: {}", ran.describe());
    assert_eq!(ran.stderr.lines().count(), 1, "{args:?}: exactly one line: {}", ran.describe());
    assert!(ran.stderr.starts_with("tierswap"), "{args:?}: {}", ran.describe());
    assert!(!marker.exists(), "{args:?}: the program must not run");
    ran.stderr
}

#[test]
fn syscalls_read_and_write_swapped_out_memory() {
    let dir = TestDir::new("syscalls");
    let prog = compile(&dir, "syscalls");
    let st = dir.path("stats.json");
    let ran = run_to_end(tierswap_run(
        &["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()],
        &prog,
        &[dir.0.to_str().unwrap()],
    ));
    assert!(ran.status.success() && ran.stdout.contains("syscalls ok"), "{}", ran.describe());
    assert!(ran.stderr.is_empty(), "a managed run says nothing unless asked (--log): {}", ran.describe());
    assert_swapped_both_ways(&stats(&st), 8 << 20);
}

#[test]
fn threads_share_managed_memory() {
    let dir = TestDir::new("threads");
    let prog = compile(&dir, "threads");
    let st = dir.path("stats.json");
    let ran = run_to_end(tierswap_run(&["--budget", "16M", "--stats-on-exit", st.to_str().unwrap()], &prog, &["4"]));
    assert!(ran.status.success() && ran.stdout.contains("threads ok"), "{}", ran.describe());
    let s = stats(&st);
    assert_swapped_both_ways(&s, 16 << 20);
    // The small objects came from the shim's heap (one 1 GiB arena at least).
    assert!(s["shim"]["arena_bytes"].as_u64().unwrap() >= 1 << 30, "{}", s["shim"]);
}

#[test]
fn exit_codes_pass_through() {
    let dir = TestDir::new("exit");
    let prog = compile(&dir, "status");
    for (code, strict) in [(0, false), (1, false), (37, false), (255, false), (37, true)] {
        let flags: &[&str] = if strict { &["--budget", "8M", "--strict"] } else { &["--budget", "8M"] };
        let ran = run_to_end(tierswap_run(flags, &prog, &["exit", &code.to_string()]));
        assert_eq!(ran.status.code(), Some(code), "{}", ran.describe());
        assert!(ran.stdout.contains("started"), "{}", ran.describe());
    }
}

/// A program that exits takes its pager's control socket with it: `tierswap stat` does
/// not list it after (the program sees the socket while it runs).
#[test]
fn a_program_that_exits_takes_its_control_socket_with_it() {
    let dir = TestDir::new("socket");
    let prog = compile(&dir, "status");
    let control = dir.path("control");
    let mut cmd = tierswap_run(&["--budget", "8M"], &prog, &["socket", control.to_str().unwrap()]);
    cmd.env("TIERSWAP_CONTROL_DIR", &control);
    let ran = run_to_end(cmd);
    assert!(ran.status.success() && ran.stdout.contains("socket there"), "{}", ran.describe());
    let left: Vec<_> = std::fs::read_dir(&control).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert!(left.is_empty(), "sockets left after the program exited: {left:?}");
}

/// A program that installs its own SIGBUS handler (redis, the JVM, Go's runtime do) keeps
/// being served in signal mode: the pager's handler stays the kernel's, the program's gets
/// the SIGBUS that are not the pager's (a `kill`), asking for the action returns the
/// program's handler, and the default action put back and raised ends the process by
/// SIGBUS. The same program in thread mode, where nothing is interposed, behaves the same.
#[test]
fn a_program_with_its_own_sigbus_handler_is_still_served() {
    let dir = TestDir::new("ownsigbus");
    let prog = compile(&dir, "ownsigbus");
    for mode in ["thread", "signal"] {
        for how in ["sigaction", "signal"] {
            let ran = run_within(
                tierswap_run(&["--budget", "8M", "--fault-mode", mode], &prog, &[how]),
                Duration::from_secs(60),
            );
            assert!(ran.stdout.contains("ownsigbus ok"), "{mode} {how}: {}", ran.describe());
            assert_eq!(ran.status.signal(), Some(libc::SIGBUS), "{mode} {how}: {}", ran.describe());
        }
    }
}

#[test]
fn signals_pass_through() {
    let dir = TestDir::new("signals");
    let prog = compile(&dir, "status");
    for sig in [libc::SIGSEGV, libc::SIGTERM, libc::SIGKILL] {
        let ran = run_to_end(tierswap_run(&["--budget", "8M"], &prog, &["kill", &sig.to_string()]));
        assert_eq!(ran.status.signal(), Some(sig), "{}", ran.describe());
        // A shell waiting for it sees 128 + the signal, as for the program run directly.
        let script = format!(
            "'{}' run --budget 8M -- '{}' kill {sig} >/dev/null 2>&1; echo $?",
            tierswap_bin().display(),
            prog.display()
        );
        let mut sh = Command::new("sh");
        sh.args(["-c", &script]).env("TIERSWAP_PRELOAD", preload());
        let ran = run_to_end(sh);
        assert_eq!(ran.stdout.trim(), (128 + sig).to_string(), "{}", ran.describe());
    }
}

/// A program's handlers of the signals it blocks for a moment run on its own thread once it
/// unblocks them, never on a pager thread (tests/c/sigthread.c: 20 rounds of SIGCHLD and
/// SIGALRM held blocked; bash, whose SIGCHLD handler ran on the control socket's thread,
/// crashed in most runs of a loop of pipelines); and a shell's loop of pipelines runs
/// through with every line right.
#[test]
fn a_programs_signal_handlers_run_on_its_own_threads() {
    let dir = TestDir::new("sigthread");
    let prog = compile(&dir, "sigthread");
    for _ in 0..3 {
        let ran = run_to_end(tierswap_run(&["--budget", "16M"], &prog, &["20"]));
        assert!(ran.status.success() && ran.stdout.trim() == "sigthread ok 40", "{}", ran.describe());
    }
    let script = "for i in $(seq 1 300); do echo $i | cut -c1-8; done";
    let ran = run_to_end(tierswap_run(&["--budget", "64M"], Path::new("/bin/bash"), &["-c", script]));
    let want: String = (1..=300).map(|i| format!("{i}\n")).collect();
    assert!(ran.status.success() && ran.stdout == want, "{}", ran.describe());
}

/// Bad flags, a missing program, an unknown flag: one line on stderr, nothing on stdout,
/// exit 2, and the program never starts.
#[test]
fn bad_arguments_are_one_line_and_exit_2() {
    let dir = TestDir::new("badargs");
    let marker = dir.path("ran");
    let prog = dir.path("prog.sh");
    std::fs::write(&prog, format!("#!/bin/sh\ntouch '{}'\n", marker.display())).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let not_exec = dir.path("data.txt");
    std::fs::write(&not_exec, "not a program\n").unwrap();
    let p = prog.to_str().unwrap();
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (vec!["--budget", "12Q", "--", p], "--budget '12Q'"),
        (vec!["--budget", "1M", "--", p], "below the minimum"),
        (vec!["--tiers", "zero", "--", p], "nowhere to store"),
        (vec!["--tiers", "pool,disk", "--", p], "unknown tier 'disk'"),
        (vec!["--pool-max", "150%", "--", p], "--pool-max"),
        (vec!["--min-size", "1K", "--", p], "--min-size"),
        (vec!["--malloc", "some", "--", p], "--malloc 'some'"),
        (vec!["--compressor", "gzip", "--", p], "--compressor 'gzip'"),
        (vec!["--swap-dir", "/nonexistent/dir", "--", p], "not a directory"),
        (vec!["--"], "no program"),
        (vec![], "no program"),
        (vec!["--", "/nonexistent/program"], "cannot run '/nonexistent/program': No such file or directory"),
        (vec!["--", "no-such-program-anywhere"], "cannot run 'no-such-program-anywhere'"),
        (vec!["--", not_exec.to_str().unwrap()], "Permission denied"),
        (vec!["--", dir.0.to_str().unwrap()], "Permission denied"),
        (vec!["--no-such-flag", "--", p], "--no-such-flag"),
        (vec!["--budget"], "--budget"),
        (vec!["--strict=yes", "--", p], "--strict"),
    ];
    for (args, needle) in cases {
        let stderr = refused(&args, &marker);
        assert!(stderr.contains(needle), "{args:?}: expected '{needle}' in: {stderr}");
    }
    // The same program with good flags does run (the cases above failed for their flag).
    let ran = run_to_end(tierswap_run(&["--budget", "8M", "--compressor", "lz4"], &prog, &[]));
    assert!(ran.status.success() && marker.exists(), "{}", ran.describe());
}

/// `--fault-mode` takes thread or signal; anything else is one line naming the flag and the
/// choices, exit 2, and the program never starts. The shim itself refuses a bad
/// TIERSWAP_FAULT_MODE (set by hand, without `tierswap run`) with one warning and runs the
/// program unmanaged.
#[test]
fn bad_fault_modes_are_one_line_and_exit_2() {
    let dir = TestDir::new("badfaultmode");
    let marker = dir.path("ran");
    let prog = dir.path("prog.sh");
    std::fs::write(&prog, format!("#!/bin/sh\ntouch '{}'\n", marker.display())).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = prog.to_str().unwrap();
    for args in [
        vec!["--fault-mode", "threads", "--", p],
        vec!["--fault-mode", "", "--", p],
        vec!["--fault-mode", "sigbus", "--", p],
        vec!["--fault-mode=thread,signal", "--", p],
    ] {
        let stderr = refused(&args, &marker);
        assert!(
            stderr.starts_with("tierswap run: --fault-mode") && stderr.contains("use thread or signal"),
            "{args:?}: {stderr}"
        );
    }
    // Either case is taken. (Not with a shell: in signal mode a system call writing into
    // malloc'd memory not touched yet fails with EFAULT, and sh's getcwd does.)
    let status = compile(&dir, "status");
    let ran = run_to_end(tierswap_run(
        &["--budget", "8M", "--fault-mode", "Signal", "--compressor", "lz4"],
        &status,
        &["exit", "0"],
    ));
    assert!(ran.status.success() && ran.stdout.contains("started"), "{}", ran.describe());

    let mut cmd = Command::new(&status);
    cmd.arg("fill-and-check").env("LD_PRELOAD", preload()).env("TIERSWAP_FAULT_MODE", "sigbus");
    let ran = run_to_end(cmd);
    assert!(ran.status.success() && ran.stdout.contains("status ok"), "{}", ran.describe());
    assert_eq!(ran.stderr.lines().count(), 1, "one warning: {}", ran.describe());
    assert!(
        ran.stderr.starts_with("tierswap: not managing the memory of status")
            && ran.stderr.contains("TIERSWAP_FAULT_MODE=sigbus: unknown fault mode 'sigbus': use thread or signal"),
        "{}",
        ran.describe()
    );
}

/// `--fault-mode` reaches the pager: in signal mode the faulting thread serves every fault
/// itself, in thread mode none; the bytes are right either way; `--help` says what signal
/// mode costs.
#[test]
fn fault_mode_reaches_the_pager() {
    let dir = TestDir::new("faultmode");
    let prog = compile(&dir, "status");
    for mode in ["thread", "signal"] {
        let st = dir.path(&format!("stats-{mode}.json"));
        let ran = run_to_end(tierswap_run(
            &["--budget", "8M", "--fault-mode", mode, "--compressor", "lz4", "--stats-on-exit", st.to_str().unwrap()],
            &prog,
            &["fill-and-check"],
        ));
        assert!(ran.status.success() && ran.stdout.contains("status ok"), "{mode}: {}", ran.describe());
        let s = stats(&st);
        let c = |name| common::counter(&s, name);
        let back = c("zswpin") + c("pswpin") + c("swpin_zero") + c("swpin_samefill");
        assert!(back > 2048, "{mode}: half the 16 MiB read back under 8 MiB comes from swap: {back} pages");
        let (faults, in_thread) = (c("faults"), c("faults_in_thread"));
        if mode == "signal" {
            assert_eq!(in_thread, faults, "signal mode: every fault is served in the faulting thread");
        } else {
            assert_eq!(in_thread, 0, "thread mode serves no fault in the faulting thread ({faults} faults)");
        }
    }
    let out = Command::new(tierswap_bin()).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    for needle in ["--fault-mode", "SIGBUS", "EFAULT", "handler"] {
        assert!(help.contains(needle), "run --help lacks {needle}:\n{help}");
    }
}

/// Runs `prog ARGS` under `--budget 8M` in fault mode `mode`, the stats written to a file
/// of `dir` named after the mode; returns the run and that file.
fn run_in_mode(dir: &TestDir, prog: &Path, mode: &str, args: &[&str]) -> (common::Ran, PathBuf) {
    let st = dir.path(&format!("stats-{mode}.json"));
    let ran = run_to_end(tierswap_run(
        &["--budget", "8M", "--fault-mode", mode, "--stats-on-exit", st.to_str().unwrap()],
        prog,
        args,
    ));
    (ran, st)
}

/// Large allocations freed and made again (largereuse.c: rounds of 300 KiB–6 MiB buffers
/// malloc'd, filled, freed; calloc'd again, every byte zero; realloc'd bigger; a forked
/// child doing the same): every byte right whether the heap keeps freed mappings for reuse
/// or not, and keeping them spares the unmaps (under 1G, 32 MiB of them may be kept), but
/// only while the process is well under its budget: holding 600 MiB of the 1G it keeps
/// nothing.
#[test]
fn large_allocations_freed_and_made_again_keep_their_bytes() {
    let dir = TestDir::new("largereuse");
    let prog = compile(&dir, "largereuse");
    let mut unmaps = Vec::new();
    for (name, set, hold) in
        [("keep", "keep-freed", "0"), ("none", "no-keep-freed", "0"), ("held", "keep-freed", "600")]
    {
        let st = dir.path(&format!("{name}-%p.json"));
        let flags = ["--budget", "1G", "--set", set, "--stats-on-exit", st.to_str().unwrap()];
        let ran = run_to_end(tierswap_run(&flags, &prog, &["30", hold]));
        assert!(ran.status.success() && ran.stdout.contains("largereuse ok"), "{name}: {}", ran.describe());
        let parent = std::fs::read_dir(&dir.0)
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| n.starts_with(&format!("{name}-")))
            .map(|n| stats(&dir.path(&n)))
            .max_by_key(|s| common::counter(s, "event_unmap"))
            .expect("the parent's stats");
        unmaps.push(common::counter(&parent, "event_unmap"));
    }
    assert!(unmaps[0] * 2 < unmaps[1], "kept mappings spare unmaps: {unmaps:?} (keep, none, held)");
    assert!(
        unmaps[2] * 10 >= unmaps[1] * 9,
        "a process over half its budget keeps nothing: {unmaps:?} (keep, none, held)"
    );
    // Under a budget the buffers do not fit beside, nothing is kept, and every byte still
    // comes back from the tiers.
    let st = dir.path("small-%p.json");
    let ran = run_to_end(tierswap_run(&["--budget", "6M", "--stats-on-exit", st.to_str().unwrap()], &prog, &["8"]));
    assert!(ran.status.success() && ran.stdout.contains("largereuse ok"), "{}", ran.describe());
}

/// A library opened with RTLD_DEEPBIND (deepbind.c, as PHP opens its extensions) frees and
/// reallocates blocks the program allocated and the other way round, every byte checked:
/// with the flag the library's free would be glibc's while the program's malloc is the
/// shim's (PHP aborted at start, "double free or corruption"), so the shim's dlopen drops
/// it. The library is found by its bare name through the program's RUNPATH ($ORIGIN/sub):
/// dlopen still searches by its caller's, not by the shim's.
#[test]
fn a_library_opened_with_deepbind_shares_the_programs_malloc() {
    let dir = TestDir::new("deepbind");
    let lib = common::compile_library(&dir, "deepbindlib");
    std::fs::create_dir_all(dir.path("sub")).unwrap();
    std::fs::rename(&lib, dir.path("sub/deepbindlib.so")).unwrap();
    let prog = common::compile_with(&dir, "deepbind", &["-Wl,-rpath,$ORIGIN/sub", "-Wl,--enable-new-dtags"]);
    let native = Command::new(&prog).output().unwrap();
    assert!(native.status.success(), "natively: {}", String::from_utf8_lossy(&native.stderr));
    for malloc in ["all", "off"] {
        let ran = run_to_end(tierswap_run(&["--budget", "64M", "--malloc", malloc], &prog, &[]));
        assert!(ran.status.success() && ran.stdout.contains("deepbind ok"), "--malloc {malloc}: {}", ran.describe());
    }
}

/// Managed memory the program splits into several of the kernel's VMAs with advice that
/// sets a VMA's flags (vmasplit.c: MADV_HUGEPAGE, MADV_RANDOM, MADV_SEQUENTIAL and
/// MADV_DONTDUMP over ranges that start and end inside 64 KiB blocks, half of it taken back
/// each round), 64 MiB under 8M: every byte right, nothing said, and moves over a VMA's end
/// went a page at a time (UFFDIO_MOVE takes its range within one VMA: reclaim said "staging
/// pages failed" thousands of times and left those pages resident).
#[test]
fn advice_that_splits_the_kernels_vmas_leaves_every_page_movable() {
    let dir = TestDir::new("vmasplit");
    let prog = compile(&dir, "vmasplit");
    let st = dir.path("stats.json");
    let ran =
        run_to_end(tierswap_run(&["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()], &prog, &["64", "3"]));
    assert!(ran.status.success() && ran.stdout.contains("vmasplit ok"), "{}", ran.describe());
    assert!(!ran.stderr.contains("tierswap:"), "nothing to say: {}", ran.stderr);
    let s = stats(&st);
    assert!(common::counter(&s, "move_split_vma") > 0, "moves met a VMA's end: {s}");
    assert_swapped_both_ways(&s, 8 << 20);
}

/// Buffers glibc allocates for itself and hands to system calls (a stdout stream's buffer
/// flushed at exit, a directory stream's getdents64 buffer, getline's reads through a FILE)
/// keep working when every other page was evicted between their making and their use, in
/// both fault modes: in signal mode a system call on a swapped-out buffer fails with
/// EFAULT, so glibc's own allocations stay glibc's there (libcbufs.c; every numbered
/// line must arrive).
#[test]
fn glibc_buffers_survive_eviction_in_both_fault_modes() {
    let dir = TestDir::new("libcbufs");
    let prog = compile(&dir, "libcbufs");
    for mode in ["thread", "signal"] {
        let (ran, st) = run_in_mode(&dir, &prog, mode, &[dir.0.to_str().unwrap()]);
        assert!(ran.status.success() && ran.stdout.ends_with("libcbufs ok\n"), "{mode}: {}", ran.describe());
        let numbered: Vec<&str> = ran.stdout.lines().filter(|l| l.starts_with("numbered line ")).collect();
        let want: Vec<String> = (0..200).map(|i| format!("numbered line {i}")).collect();
        assert_eq!(numbered, want, "{mode}: every line printed before the churn arrives, in order");
        // The churn of 32 MiB under 8 MiB did evict: pages went out and came back.
        assert_swapped_both_ways(&stats(&st), 8 << 20);
    }
}

/// A runtime's reservations (reserve.c): PROT_NONE reservations become managed, commits in
/// them (mmap MAP_FIXED read-write, mprotect) are managed at once, uncommits (mmap MAP_FIXED
/// PROT_NONE, MADV_DONTNEED, munmap) read back as zeros, read-only and none keep the bytes,
/// an address hint is honoured, an executable fixed mapping is the kernel's; every byte
/// compared, in both fault modes. With 40 MiB committed and touched under a budget of
/// 8 MiB the process's resident memory stays near the budget (unmanaged: 42 MiB and more).
#[test]
fn reservations_commits_and_uncommits_are_managed() {
    let dir = TestDir::new("reserve");
    let prog = compile(&dir, "reserve");
    for mode in ["thread", "signal"] {
        let (ran, st) = run_in_mode(&dir, &prog, mode, &[]);
        assert!(ran.status.success() && ran.stdout.contains("reserve ok"), "{mode}: {}", ran.describe());
        assert!(ran.stderr.is_empty(), "{mode}: nothing to say: {}", ran.describe());
        let rss: Vec<(String, u64)> = ran
            .stdout
            .lines()
            .filter_map(|l| l.strip_prefix("rss_kib "))
            .filter_map(|l| l.split_once(' ').map(|(p, k)| (p.to_string(), k.parse().unwrap())))
            .collect();
        assert_eq!(rss.iter().map(|(p, _)| p.as_str()).collect::<Vec<_>>(), ["A", "B", "H"], "{mode}: {}", ran.stdout);
        for (phase, kib) in &rss {
            // 8 MiB of budget, the program and its libraries, the pager's threads and tables.
            assert!(*kib < 20 << 10, "{mode}: phase {phase}: resident {kib} KiB: the commits were not managed");
        }
        assert_swapped_both_ways(&stats(&st), 8 << 20);
    }
}

/// Small anonymous mappings (below the minimum size: Ruby's heap pages, made as Ruby makes
/// them, and mappings of 4 to 252 KiB) come from managed zones in thread mode (smallmaps.c):
/// every byte right through unmaps and maps again, mremap (shrink, grow in place or moved,
/// to a fixed address), a read-only page unmapped, a fixed mapping over part of one, and a
/// forked child reading and unmapping its copies. ~50 MiB of them under a budget of 8 MiB
/// stay near the budget (the kernel's own small mappings: 77 MiB resident), also when the
/// parent reads them all again after the child is gone (pages it only read since the fork
/// are made its own again, `stage_unshared`; before, they could not be moved out and the
/// footprint reached 12.5 MiB). In signal mode they stay the kernel's (a system call on a
/// swapped-out page would fail there), and every byte is still right.
#[test]
fn small_mappings_are_managed_in_thread_mode() {
    let dir = TestDir::new("smallmaps");
    let prog = compile(&dir, "smallmaps");
    for mode in ["thread", "signal"] {
        let (ran, st) = run_in_mode(&dir, &prog, mode, &[]);
        assert!(ran.status.success() && ran.stdout.contains("smallmaps ok"), "{mode}: {}", ran.describe());
        let rss: Vec<u64> = ran
            .stdout
            .lines()
            .filter_map(|l| l.split_once("rss_kib "))
            .filter_map(|(_, r)| r.split(' ').nth(1)?.parse().ok())
            .collect();
        assert_eq!(rss.len(), 2, "{mode}: {}", ran.stdout);
        if mode == "thread" {
            for kib in &rss {
                assert!(*kib < 20 << 10, "thread: resident {kib} KiB: the small mappings were not managed");
            }
        } else {
            assert!(rss.iter().all(|&kib| kib > 50 << 10), "signal: the small mappings are the kernel's: {rss:?}");
        }
        if mode == "thread" {
            let s = stats(&st);
            assert_swapped_both_ways(&s, 8 << 20);
            assert!(common::counter(&s, "stage_unshared") > 0, "the parent's pages read after the fork were unshared");
        }
    }
}

/// A failed call of the mmap family reports the kernel's errno under the shim, on managed
/// memory and not (errnos.c, the same lines as when run natively): EEXIST for
/// MAP_FIXED_NOREPLACE over a mapping, EBADF, EINVAL for unaligned addresses, ENOMEM for an
/// mremap that cannot grow in place. (The shim's raw system calls once took libc's -1 for
/// -EPERM, and every failure read EPERM.)
#[test]
fn failed_mapping_calls_report_the_kernels_errno() {
    let dir = TestDir::new("errnos");
    let prog = compile(&dir, "errnos");
    let native = common::run_to_end(Command::new(&prog));
    assert!(native.status.success() && native.stdout.ends_with("errnos ok\n"), "natively: {}", native.describe());
    for want in ["EEXIST", "EBADF", "EINVAL", "ENOMEM"] {
        assert!(native.stdout.contains(want), "natively, {want} is one of the answers: {}", native.stdout);
    }
    for mode in ["thread", "signal"] {
        let (ran, _) = run_in_mode(&dir, &prog, mode, &[]);
        assert!(ran.status.success(), "{mode}: {}", ran.describe());
        assert_eq!(ran.stdout, native.stdout, "{mode}: the same errno as natively, call by call");
    }
}

/// Signal mode with the default compressor (zstd-fast): the faulting thread runs the fault
/// path, and every byte the program reads back must be right. (A zstd decompression
/// context made by the program's thread inside its SIGBUS handler came from the shim's
/// malloc, so managed memory; once it was swapped out, a fault inside the handler
/// re-entered it and the process aborted with "RefCell already borrowed". Each fault buffer
/// now has its own context, made up front.)
#[test]
fn signal_mode_serves_faults_with_the_default_compressor() {
    let dir = TestDir::new("signalzstd");
    let prog = compile(&dir, "status");
    let st = dir.path("stats.json");
    let ran = run_to_end(tierswap_run(
        &["--budget", "8M", "--fault-mode", "signal", "--stats-on-exit", st.to_str().unwrap()],
        &prog,
        &["fill-and-check"],
    ));
    assert!(ran.status.success() && ran.stdout.contains("status ok"), "{}", ran.describe());
    let s = stats(&st);
    let zswpin = common::counter(&s, "zswpin");
    assert!(zswpin > 1000, "pages must come back from the zstd pool: zswpin {zswpin}");
    assert_eq!(common::counter(&s, "faults_in_thread"), common::counter(&s, "faults"));
}

/// A bad `--set` is one line naming the setting and the settings there are, exit 2, and the
/// program never starts; the shim refuses a bad TIERSWAP_SETTINGS set by hand (without
/// `tierswap run`) as it refuses its other variables: one warning and the program runs
/// unmanaged, or exit 2 before `main` under TIERSWAP_STRICT=1.
#[test]
fn bad_settings_are_one_line_and_exit_2() {
    let dir = TestDir::new("badsettings");
    let marker = dir.path("ran");
    let prog = dir.path("prog.sh");
    std::fs::write(&prog, format!("#!/bin/sh\ntouch '{}'\n", marker.display())).unwrap();
    std::fs::set_permissions(&prog, std::fs::Permissions::from_mode(0o755)).unwrap();
    let p = prog.to_str().unwrap();
    for (args, needle) in [
        (vec!["--set", "polcy=order0", "--", p], "--set 'polcy=order0': unknown setting 'polcy': settings are policy="),
        (vec!["--set", "no-follow,swapin-max=3K", "--", p], "swapin-max=3K is not a power of two from 4K to 2M"),
        (vec!["--set", "no-follow", "--set", "policy=fast", "--", p], "--set 'no-follow,policy=fast': policy 'fast'"),
        (vec!["--set", "no-follow=1", "--", p], "setting 'no-follow' is a switch and takes no value"),
        (vec!["--set", "no-follow,,pin", "--", p], "an empty setting"),
        (vec!["--set", "", "--", p], "an empty setting"),
        (vec!["--set", "budget=2M", "--", p], "--set 'budget=2M': budget 2097152 bytes is below the minimum of 4M"),
        (vec!["--set", "tiers=zero", "--", p], "nowhere to store a page"),
        (vec!["--set"], "--set"),
    ] {
        let stderr = refused(&args, &marker);
        assert!(stderr.contains(needle), "{args:?}: expected '{needle}' in: {stderr}");
    }
    let ran = run_to_end(tierswap_run(&["--budget", "8M", "--set", "no-follow:swapin-max=16K"], &prog, &[]));
    assert!(ran.status.success() && marker.exists(), "good settings run the program: {}", ran.describe());

    let status = compile(&dir, "status");
    for strict in [false, true] {
        let mut cmd = Command::new(&status);
        cmd.arg("fill-and-check").env("LD_PRELOAD", preload()).env("TIERSWAP_SETTINGS", "no-follow,polcy=order0");
        if strict {
            cmd.env("TIERSWAP_STRICT", "1");
        }
        let ran = run_to_end(cmd);
        assert_eq!(ran.stderr.lines().count(), 1, "strict {strict}: one line: {}", ran.describe());
        assert!(
            ran.stderr.contains("TIERSWAP_SETTINGS=no-follow,polcy=order0: unknown setting 'polcy': settings are"),
            "strict {strict}: {}",
            ran.describe()
        );
        if strict {
            assert_eq!(ran.status.code(), Some(2), "{}", ran.describe());
            assert!(ran.stdout.is_empty(), "the program's main never ran: {}", ran.describe());
        } else {
            assert!(ran.status.success() && ran.stdout.contains("status ok"), "{}", ran.describe());
            assert!(ran.stderr.starts_with("tierswap: not managing the memory of status"), "{}", ran.describe());
        }
    }
}

/// `--set` reaches the pager, after the flags: a program that reads 16 MiB back in order
/// under 8 MiB gets large swap-ins by default and none with `swapin-max=4K`, and a
/// `budget=` setting wins over `--budget`; every byte is right either way. `--help` lists
/// the settings.
#[test]
fn settings_reach_the_pager() {
    let dir = TestDir::new("settings");
    let prog = compile(&dir, "status");
    let run = |name: &str, flags: &[&str]| {
        let st = dir.path(&format!("stats-{name}.json"));
        let mut all = vec!["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()];
        all.extend_from_slice(flags);
        let ran = run_to_end(tierswap_run(&all, &prog, &["fill-and-check"]));
        assert!(ran.status.success() && ran.stdout.contains("status ok"), "{name}: {}", ran.describe());
        assert!(ran.stderr.is_empty(), "{name}: {}", ran.describe());
        stats(&st)
    };
    let back = |s: &serde_json::Value| common::counter(s, "zswpin") + common::counter(s, "pswpin");
    let plain = run("plain", &[]);
    assert!(back(&plain) > 1000, "pages came back from swap: {}", back(&plain));
    assert!(common::counter(&plain, "swpin_large") > 0, "an in-order refault swaps in large by default");
    assert_eq!(common::gauge(&plain, "budget"), 8 << 20);

    let set = run("set", &["--set", "no-follow,swapin-max=4K", "--set", "budget=10M"]);
    assert!(back(&set) > 1000, "pages came back from swap: {}", back(&set));
    assert_eq!(common::counter(&set, "swpin_large"), 0, "swapin-max=4K: one page per swap-in");
    assert_eq!(common::counter(&set, "swpin_large_pages"), 0);
    assert_eq!(common::gauge(&set, "budget"), 10 << 20, "budget= wins over --budget");

    let out = Command::new(tierswap_bin()).args(["run", "--help"]).output().unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{help}");
    for needle in ["--set <SETTINGS>", "no-follow,swapin-max=16K", "[no-]follow", "swapin-max=SIZE", "wins over it"] {
        assert!(help.contains(needle), "run --help lacks {needle}:\n{help}");
    }
}

/// As uid 65534 with vm.unprivileged_userfaultfd=0 and /dev/userfaultfd 0600 the pager cannot
/// start: one warning and the program runs unmanaged (and correctly); --strict: exit 2
/// before the program's main.
#[test]
fn without_userfaultfd_one_warning_or_exit_2_under_strict() {
    // SAFETY: getuid has no preconditions.
    assert_eq!(unsafe { libc::getuid() }, 0, "this test drops to uid 65534 and needs root to do so (CI runs as root)");
    let unprivileged = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    assert_eq!(unprivileged.trim(), "0", "the test needs vm.unprivileged_userfaultfd=0 (the default)");
    let dir = TestDir::new("nouffd");
    // Writable for uid 65534: the swap file and the stats could be made, only userfaultfd is missing.
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let prog = compile(&dir, "status");
    let st = dir.path("stats.json");
    let as_nobody = |strict: bool| {
        let mut flags = vec!["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()];
        if strict {
            flags.push("--strict");
        }
        let mut cmd = tierswap_run(&flags, &prog, &["fill-and-check"]);
        cmd.uid(65534).gid(65534).env("TMPDIR", &dir.0);
        run_to_end(cmd)
    };
    let ran = as_nobody(false);
    assert!(ran.status.success() && ran.stdout.contains("status ok"), "{}", ran.describe());
    assert_eq!(ran.stderr.lines().count(), 1, "one warning: {}", ran.describe());
    assert!(ran.stderr.starts_with("tierswap: not managing the memory of status"), "{}", ran.describe());
    assert!(ran.stderr.contains("userfaultfd"), "the warning names the cause: {}", ran.describe());
    assert!(!st.exists(), "an unmanaged program writes no stats");

    let ran = as_nobody(true);
    assert_eq!(ran.status.code(), Some(2), "{}", ran.describe());
    assert!(ran.stdout.is_empty(), "the program's main never ran: {}", ran.describe());
    assert_eq!(ran.stderr.lines().count(), 1, "one line: {}", ran.describe());
    assert!(ran.stderr.contains("cannot manage") && ran.stderr.contains("userfaultfd"), "{}", ran.describe());
    let left: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name() != "status")
        .map(|e| e.file_name())
        .collect();
    assert!(left.is_empty(), "nothing left in TMPDIR: {left:?}");
}

/// A program the shim cannot reach (statically linked, setuid to another user, a script whose
/// interpreter is one of those) runs unmanaged after one line that says why; --strict: exit
/// 2 before it starts. A dynamically linked program gets no such line and is managed.
#[test]
fn programs_the_shim_cannot_reach_are_named_before_they_start() {
    // SAFETY: getuid has no preconditions.
    assert_eq!(
        unsafe { libc::getuid() },
        0,
        "this test makes a setuid program of uid 65534 and needs root (CI runs as root)"
    );
    let dir = TestDir::new("reach");
    let dynamic = compile(&dir, "status");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tierswap-preload/tests/c/status.c");
    let static_prog = dir.path("status-static");
    let o = Command::new("cc").args(["-O2", "-static", "-pthread", "-o"]).arg(&static_prog).arg(&src).output().unwrap();
    assert!(
        o.status.success(),
        "cc -static status.c (needs the static libc, libc6-dev):\n{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let setuid = dir.path("status-setuid");
    std::fs::copy(&dynamic, &setuid).unwrap();
    std::os::unix::fs::chown(&setuid, Some(65534), Some(65534)).unwrap();
    std::fs::set_permissions(&setuid, std::fs::Permissions::from_mode(0o4755)).unwrap();
    let script = dir.path("script");
    std::fs::write(&script, format!("#!{}\n", static_prog.display())).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let st = dir.path("stats.json");
    let run = |prog: &Path, strict: bool| {
        let mut flags = vec!["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()];
        if strict {
            flags.push("--strict");
        }
        run_to_end(tierswap_run(&flags, prog, &["fill-and-check"]))
    };

    let ran = run(&dynamic, true);
    assert!(ran.status.success() && ran.stdout.contains("status ok"), "{}", ran.describe());
    assert!(!ran.stderr.contains("nothing will be managed"), "{}", ran.describe());
    assert!(st.exists(), "a reachable program is managed and writes its stats");
    std::fs::remove_file(&st).unwrap();

    let cases = [
        (
            &static_prog,
            format!(
                "{} is statically linked: LD_PRELOAD cannot reach its memory; nothing will be managed",
                static_prog.display()
            ),
        ),
        (
            &setuid,
            format!(
                "{} is setuid (to uid 65534): the loader ignores LD_PRELOAD for it; nothing will be managed",
                setuid.display()
            ),
        ),
    ];
    for (prog, why) in &cases {
        let ran = run(prog, false);
        assert!(ran.status.success() && ran.stdout.contains("status ok"), "it still runs: {}", ran.describe());
        assert_eq!(ran.stderr, format!("tierswap run: {why}\n"), "one line, before the program: {}", ran.describe());
        assert!(!st.exists(), "nothing managed, no stats");
        let ran = run(prog, true);
        assert_eq!(ran.status.code(), Some(2), "{}", ran.describe());
        assert!(ran.stdout.is_empty(), "not started: {}", ran.describe());
        assert_eq!(ran.stderr, format!("tierswap run: {why} (--strict: not started)\n"), "{}", ran.describe());
    }
    let ran = run(&script, true);
    assert_eq!(ran.status.code(), Some(2), "{}", ran.describe());
    assert!(ran.stdout.is_empty(), "not started: {}", ran.describe());
    let want = format!("{} (the interpreter of {}) is statically linked", static_prog.display(), script.display());
    assert!(ran.stderr.contains(&want), "names the interpreter and the script: {}", ran.describe());
}

/// A program that closes every descriptor it did not open (daemons do) keeps its memory:
/// the shim keeps the pager's userfaultfd and swap file open.
#[test]
fn closing_every_descriptor_keeps_the_memory() {
    let dir = TestDir::new("closefds");
    let prog = compile(&dir, "closefds");
    let st = dir.path("stats.json");
    let ran = run_to_end(tierswap_run(&["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()], &prog, &["libc"]));
    assert!(ran.status.success() && ran.stdout.contains("closefds ok"), "{}", ran.describe());
    assert!(ran.stderr.is_empty(), "{}", ran.describe());
    let s = stats(&st);
    assert_swapped_both_ways(&s, 8 << 20);
    let refused = s["shim"]["fd_calls_refused"].as_u64().unwrap();
    let protected = s["shim"]["protected_fds"].as_array().unwrap().len() as u64;
    // Each protected descriptor: once by the close loop, once by close_range, once by closefrom.
    assert_eq!(refused, 3 * protected, "{}", s["shim"]);
}

/// A fault thread that cannot go on (here: a seccomp filter, applied to every thread as
/// sandboxes do, makes read and ioctl on the userfaultfd fail) ends the process with SIGABRT
/// and a message naming tierswap: the program touching swapped-out memory never hangs and
/// never reads wrong bytes.
#[test]
fn a_fault_thread_that_cannot_serve_aborts_naming_tierswap() {
    let dir = TestDir::new("seccomp");
    let prog = compile(&dir, "seccomp");
    let ran = run_within(tierswap_run(&["--budget", "8M"], &prog, &[]), Duration::from_secs(30));
    assert_eq!(ran.status.signal(), Some(libc::SIGABRT), "{}", ran.describe());
    assert!(ran.stderr.contains("tierswap: ") && ran.stderr.contains("aborting"), "{}", ran.describe());
    assert!(!ran.stderr.contains("MISMATCH") && !ran.stderr.contains("still running"), "{}", ran.describe());
}

/// A program that closes the pager's userfaultfd behind the shim's back (the raw system
/// call) leaves the pager unable to serve faults: the process must end with SIGABRT and a
/// message naming tierswap, not hang and not run on with wrong bytes.
/// (The fault threads' poll sees POLLNVAL on the closed descriptor: that is fatal.)
#[test]
fn losing_the_userfaultfd_aborts_naming_tierswap() {
    let dir = TestDir::new("rawclose");
    let prog = compile(&dir, "closefds");
    let ran = run_within(tierswap_run(&["--budget", "8M"], &prog, &["raw"]), Duration::from_secs(20));
    assert_eq!(ran.status.signal(), Some(libc::SIGABRT), "{}", ran.describe());
    assert!(ran.stderr.contains("tierswap: "), "{}", ran.describe());
    assert!(!ran.stderr.contains("MISMATCH"), "{}", ran.describe());
}

/// madvise(DONTNEED / FREE) reads zeros and the rest keeps its bytes, mremap (grow, shrink,
/// move) keeps the bytes, realloc keeps them, and once everything is unmapped the pager holds
/// (almost) nothing: slots and pool bytes went with the mappings.
#[test]
fn madvise_munmap_mremap_are_followed() {
    let dir = TestDir::new("mapops");
    let prog = compile(&dir, "mapops");
    let st = dir.path("stats.json");
    let ran = run_to_end(tierswap_run(&["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()], &prog, &[]));
    assert!(ran.status.success() && ran.stdout.contains("mapops ok"), "{}", ran.describe());
    let s = stats(&st);
    assert_swapped_both_ways(&s, 8 << 20);
    // Left at exit: stdio's buffer and such in the small-object arena, a few pages.
    let slots = s["swap_slots"].as_u64().unwrap();
    let pool_pages = s["pool_stored_pages"].as_u64().unwrap();
    let present = s["present_pages"].as_u64().unwrap() + s["staged_pages"].as_u64().unwrap();
    assert!(
        slots <= 16 && pool_pages <= 16 && present <= 64,
        "freed memory still held: slots {slots}, pool pages {pool_pages}, present+staged {present}"
    );
}

/// fork: the child sees exactly the parent's memory at the fork while the parent overwrites
/// it; neither sees the other's writes; fork+exec runs a program with a pager of its own.
#[test]
fn fork_child_sees_the_parent_memory_at_fork() {
    let dir = TestDir::new("fork");
    let prog = compile(&dir, "fork");
    let st = dir.path("stats-%p.json");
    let ran = run_to_end(tierswap_run(&["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()], &prog, &[]));
    assert!(ran.status.success() && ran.stdout.contains("fork ok"), "{}", ran.describe());
    // The parent and the exec'd program wrote stats: the exec'd program fills memory of its
    // own, so its pager starts; /bin/true never needs one, so none starts (a program of the
    // tree other than its root starts its pager at its first need).
    let written: Vec<_> = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("stats-"))
        .collect();
    assert_eq!(written.len(), 2, "{written:?}");
    eprintln!("{}", ran.stdout.trim());
}

/// A forked child that execs at once does not keep its server thread in the parent for
/// long (forkexec.c: 20 × fork, exec /bin/true, wait, 20 ms, count the parent's
/// `tierswap-child` threads). A server asked whether its child was gone only every 100 ms,
/// so a shell forking every 2 ms carried ~50 of them, which every later fork copied and
/// every child's exec tore down: this sum was 74; the servers now ask after 1 ms, then
/// back off.
#[test]
fn a_child_that_execs_does_not_keep_its_server() {
    let dir = TestDir::new("forkexec-servers");
    let prog = compile(&dir, "forkexec");
    let ran = run_to_end(tierswap_run(&["--budget", "8M"], &prog, &[]));
    assert!(ran.status.success() && ran.stdout.contains("forkexec ok"), "{}", ran.describe());
    let lingering: u32 = ran
        .stdout
        .lines()
        .find_map(|l| l.strip_prefix("lingering "))
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no count: {}", ran.stdout));
    assert!(lingering <= 5, "servers of children long gone were still running: {lingering} over 20 looks");
}

/// fork+exec from a managed program: the exec'd program gets a pager of its own (it writes
/// its own stats) and checks its own memory; the parent's memory is intact after; /bin/true,
/// which never needs a pager, starts none.
#[test]
fn fork_and_exec_work() {
    let dir = TestDir::new("forkexec");
    let prog = compile(&dir, "fork");
    let st = dir.path("stats-%p.json");
    let ran =
        run_to_end(tierswap_run(&["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()], &prog, &["exec-only"]));
    assert!(ran.status.success() && ran.stdout.contains("fork ok"), "{}", ran.describe());
    let mut pids: Vec<u64> = std::fs::read_dir(&dir.0)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("stats-"))
        .map(|n| stats(&dir.path(&n))["shim"]["pid"].as_u64().unwrap())
        .collect();
    pids.sort_unstable();
    pids.dedup();
    assert_eq!(pids.len(), 2, "the parent and the exec'd program: {pids:?}");
    eprintln!("{}", ran.stdout.trim());
}

/// The CPUs thread `tid` of process `pid` may run on (its Cpus_allowed_list).
fn cpus_allowed(pid: u32, tid: &str) -> String {
    let status = std::fs::read_to_string(format!("/proc/{pid}/task/{tid}/status")).unwrap_or_default();
    status.lines().find_map(|l| l.strip_prefix("Cpus_allowed_list:")).map(|v| v.trim().to_string()).unwrap_or_default()
}

/// The fault threads of the program `tierswap run FLAGS -- sleep` runs, with the CPUs each
/// may run on, and the program's own CPUs.
fn fault_thread_cpus(flags: &[&str]) -> (Vec<String>, String) {
    let mut child = tierswap_run(flags, Path::new("/bin/sleep"), &["5"]).spawn().expect("start tierswap run");
    let pid = child.id();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    let found = loop {
        let mut cpus = Vec::new();
        for task in std::fs::read_dir(format!("/proc/{pid}/task")).into_iter().flatten().flatten() {
            let tid = task.file_name().to_string_lossy().into_owned();
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.starts_with("tierswap-fault") {
                cpus.push(cpus_allowed(pid, &tid));
            }
        }
        if !cpus.is_empty() || std::time::Instant::now() > deadline {
            break cpus;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    };
    let own = cpus_allowed(pid, &pid.to_string());
    let _ = child.kill();
    let _ = child.wait();
    (found, own)
}

#[test]
fn fault_threads_are_pinned_unless_asked_not_to() {
    let (pinned, own) = fault_thread_cpus(&["--budget", "8M", "--fault-threads", "2"]);
    assert_eq!(pinned.len(), 2, "two fault threads: {pinned:?}");
    for cpus in &pinned {
        assert!(!cpus.is_empty() && !cpus.contains(['-', ',']), "one CPU each: {pinned:?} (the program's: {own})");
    }
    let (free, own) = fault_thread_cpus(&["--budget", "8M", "--fault-threads", "3", "--no-pin"]);
    assert_eq!(free.len(), 3, "three fault threads: {free:?}");
    assert!(free.iter().all(|c| *c == own), "unpinned, they may run where the program may: {free:?} vs {own}");
}

/// This process's memory cgroup's limit file and a file beside it: cgroup v1's memory
/// controller when there is one, else v2's unified hierarchy (at the usual mounts).
fn own_memory_cgroup_files() -> (PathBuf, PathBuf) {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup").expect("read /proc/self/cgroup");
    let line = |want: &dyn Fn(&str, &str) -> bool| {
        cgroup.lines().find_map(|l| {
            let mut f = l.splitn(3, ':');
            let (id, ctl, path) = (f.next()?, f.next()?, f.next()?);
            want(id, ctl).then(|| path.trim_start_matches('/').to_string())
        })
    };
    if let Some(p) = line(&|_, ctl| ctl.split(',').any(|c| c == "memory")) {
        let dir = Path::new("/sys/fs/cgroup/memory").join(p);
        return (dir.join("memory.limit_in_bytes"), dir.join("memory.soft_limit_in_bytes"));
    }
    let p = line(&|id, ctl| id == "0" && ctl.is_empty()).expect("a memory cgroup in /proc/self/cgroup");
    let dir = Path::new("/sys/fs/cgroup").join(p);
    (dir.join("memory.max"), dir.join("memory.high"))
}

/// The first line of a file, or "missing".
fn first_line(p: &Path) -> String {
    std::fs::read_to_string(p).map_or_else(|_| "missing".into(), |s| s.lines().next().unwrap_or("").to_string())
}

/// What tests/c/cgroupview.c prints when the limit file reads `limit`, the other `other`
/// and the plain file (when given) `plain`.
fn cgroupview_output(limit: &str, other: &str, plain: Option<&str>) -> String {
    let line = |how: &str, value: &str, cloexec: u8| {
        if value == "missing" {
            format!("{how} missing\n")
        } else {
            format!("{how} {value} cloexec={cloexec}\n")
        }
    };
    let ways = [("open", 0), ("open_cloexec", 1), ("open64", 0), ("openat", 0), ("fopen", 0), ("fopen_e", 1)];
    let plain_ways = ["plain_open", "plain_open64", "plain_openat", "plain_fopen"];
    ways.iter()
        .map(|&(how, c)| line(how, limit, c))
        .chain(std::iter::once(line("other", other, 0)))
        .chain(plain.into_iter().flat_map(|p| plain_ways.iter().map(move |how| line(how, p, 0))))
        .collect()
}

/// The program reads the budget as its memory cgroup's limit, as it would the limit of a
/// memcg: through open, open64, openat and fopen, close-on-exec as asked; the real limit
/// when that is smaller (a limit file that does not exist, v2's root cgroup, reads as the
/// budget); a file beside it is the kernel's; with --real-cgroup-limit the limit file is too;
/// and a preloaded library of the program's own still opens every other file.
#[test]
fn the_budget_reads_as_the_memory_cgroups_limit() {
    let dir = TestDir::new("cgroupview");
    let prog = compile(&dir, "cgroupview");
    let (limit, other) = own_memory_cgroup_files();
    let budget: u64 = 96 << 20;
    let (real, beside) = (first_line(&limit), first_line(&other));
    let shown = real.parse::<u64>().map_or(budget, |r| r.min(budget));
    let args = [limit.to_str().unwrap(), other.to_str().unwrap()];
    let ran = run_to_end(tierswap_run(&["--budget", "96M"], &prog, &args));
    assert!(ran.status.success() && ran.stderr.is_empty(), "{}", ran.describe());
    assert_eq!(ran.stdout, cgroupview_output(&shown.to_string(), &beside, None), "{}", ran.describe());

    let ran = run_to_end(tierswap_run(&["--budget", "96M", "--real-cgroup-limit"], &prog, &args));
    assert!(ran.status.success() && ran.stderr.is_empty(), "{}", ran.describe());
    assert_eq!(ran.stdout, cgroupview_output(&real, &beside, None), "{}", ran.describe());

    // A library of the program's own that interposes the open family (LD_PRELOAD before
    // run, which puts the shim first) still gets every open of any other file.
    let openlog = compile_library(&dir, "openlog");
    let marker = dir.path("openlog-marker");
    std::fs::write(&marker, "plain bytes\n").unwrap();
    let mut cmd = tierswap_run(&["--budget", "96M"], &prog, &[args[0], args[1], marker.to_str().unwrap()]);
    cmd.env("LD_PRELOAD", &openlog);
    let ran = run_to_end(cmd);
    assert!(ran.status.success(), "{}", ran.describe());
    assert_eq!(ran.stdout, cgroupview_output(&shown.to_string(), &beside, Some("plain bytes")), "{}", ran.describe());
    let m = marker.to_str().unwrap();
    assert_eq!(
        ran.stderr,
        format!("openlog open {m}\nopenlog open64 {m}\nopenlog openat {m}\nopenlog fopen {m}\n"),
        "{}",
        ran.describe()
    );
}
