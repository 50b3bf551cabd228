//! Services under `tierswap run`, as operators start them: as another user (switched by
//! `run --user`, by a launcher, or by the service itself the way util-linux's `setpriv` or
//! a server's workers do), renaming their processes, watched with `tierswap stat`. A process
//! not run by root is managed only with CAP_SYS_PTRACE (the kernel's condition for
//! userfaultfd's fork events); a program that changes its own thread's capabilities before a
//! setuid-family call must find the pager's threads where its own thread is (glibc aborts
//! the process otherwise); a pager must never start inside glibc's locks. These tests need
//! root (CI runs as root) and uid/gid 65534.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use common::{compile, preload, run_to_end, run_within, stats, tierswap_bin, tierswap_run, TestDir};

fn need_root() {
    // SAFETY: getuid has no preconditions.
    assert_eq!(unsafe { libc::getuid() }, 0, "this test switches to uid 65534 and needs root (CI runs as root)");
}

/// A directory uid 65534 can write its stats and swap file in.
fn open_dir(name: &str) -> TestDir {
    let dir = TestDir::new(name);
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// `tierswap run FLAGS -- PROG ARGS` with its swap file and sockets in `dir` (writable by
/// uid 65534), to the end.
fn run_in(dir: &TestDir, flags: &[&str], prog: &Path, args: &[&str]) -> common::Ran {
    let mut cmd = tierswap_run(flags, prog, args);
    cmd.env("TMPDIR", &dir.0);
    run_to_end(cmd)
}

/// The stats files the tree wrote, by pid.
fn stats_files(dir: &Path) -> Vec<serde_json::Value> {
    let mut all: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("stats-"))
        .map(|n| stats(&dir.join(n)))
        .collect();
    all.sort_by_key(|s| s["shim"]["pid"].as_u64());
    all
}

/// `run --user 65534:65534`: the program runs as that user with CAP_SYS_PTRACE its only
/// capability, and is managed, its fork followed: fork.c's child sees the parent's memory
/// at the fork byte for byte (served through the fork event), and its exec'd program gets
/// a pager of its own. Without the capability kept no pager could start (no stats at all).
#[test]
fn run_user_switches_and_stays_managed() {
    need_root();
    let dir = open_dir("user-switch");
    let prog = compile(&dir, "fork");
    let st = dir.path("stats-%p.json");
    let ran =
        run_in(&dir, &["--user", "65534:65534", "--budget", "8M", "--stats-on-exit", st.to_str().unwrap()], &prog, &[]);
    assert!(ran.status.success() && ran.stdout.contains("fork ok"), "{}", ran.describe());
    assert!(!ran.stderr.contains("not managing"), "managed: {}", ran.describe());
    let all = stats_files(&dir.0);
    assert_eq!(all.len(), 2, "the parent and its exec'd program wrote stats: {all:?}");
    let parent = &all[0];
    assert!(parent["counters"]["event_fork"].as_u64().unwrap() >= 1, "the fork was followed: {parent}");
    assert!(parent["counters"]["faults_swapped"].as_u64().unwrap() > 0, "pages went out and came back: {parent}");

    // What the program sees of itself.
    let ran = run_in(
        &dir,
        &["--user", "65534:65534", "--budget", "8M"],
        Path::new("/bin/sh"),
        &["-c", "id -u; id -g; grep -E '^Cap(Eff|Amb)' /proc/self/status"],
    );
    assert!(ran.status.success(), "{}", ran.describe());
    let lines: Vec<_> = ran.stdout.lines().map(|l| l.split_whitespace().collect::<Vec<_>>().join(" ")).collect();
    // CAP_SYS_PTRACE is bit 19.
    assert_eq!(lines, ["65534", "65534", "CapEff: 0000000000080000", "CapAmb: 0000000000080000"], "{}", ran.describe());

    let mut cmd = Command::new(tierswap_bin());
    cmd.args(["run", "--user", "no-such-user-here", "--", "/bin/true"]).env("TIERSWAP_PRELOAD", preload());
    let ran = run_to_end(cmd);
    assert_eq!(ran.status.code(), Some(2), "{}", ran.describe());
    assert!(ran.stderr.contains("--user 'no-such-user-here': no such user"), "{}", ran.describe());
}

/// setpriv drops root the way a capability-aware daemon does: PR_SET_KEEPCAPS, setresuid,
/// capset to raise its effective set again, setresgid. Under the shim the process has the
/// pager's threads too, which glibc's setresgid runs the call on: they had lost every
/// capability at the setresuid, failed where setpriv's thread succeeded, and glibc aborted
/// the process (exit 134, nothing said). Now they follow the program's capability changes:
/// the switched program runs, managed (it keeps CAP_SYS_PTRACE), and checks every byte.
#[test]
fn a_program_that_drops_root_itself_is_not_aborted() {
    need_root();
    let dir = open_dir("user-setpriv");
    let status = compile(&dir, "status");
    let st = dir.path("stats-%p.json");
    let args = [
        "--reuid",
        "65534",
        "--regid",
        "65534",
        "--clear-groups",
        "--inh-caps",
        "+sys_ptrace",
        "--ambient-caps",
        "+sys_ptrace",
        status.to_str().unwrap(),
        "fill-and-check",
    ];
    let ran = run_in(&dir, &["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()], Path::new("setpriv"), &args);
    assert!(ran.status.success() && ran.stdout.contains("status ok"), "{}", ran.describe());
    let all = stats_files(&dir.0);
    // setpriv's image execs rather than exits, so status (same pid, as 65534) writes the one file.
    assert_eq!(all.len(), 1, "{all:?}");
    assert!(
        all[0]["counters"]["faults_swapped"].as_u64().unwrap() > 0,
        "status's 16 MiB went out and came back under 8M"
    );
}

/// A program without CAP_SYS_PTRACE (root with it dropped from its bounding set, as a
/// container may run) cannot have fork events: it runs unmanaged after one line that names
/// the capability and how to give it.
#[test]
fn without_cap_sys_ptrace_it_says_how_to_keep_it() {
    need_root();
    let dir = open_dir("user-noptrace");
    let status = compile(&dir, "status");
    let args =
        ["--inh-caps", "-sys_ptrace", "--bounding-set", "-sys_ptrace", status.to_str().unwrap(), "fill-and-check"];
    let ran = run_in(&dir, &["--budget", "8M"], Path::new("setpriv"), &args);
    assert!(ran.status.success() && ran.stdout.contains("status ok"), "{}", ran.describe());
    assert_eq!(ran.stderr.lines().count(), 1, "one warning: {}", ran.describe());
    assert!(
        ran.stderr.contains("not managing the memory of status")
            && ran.stderr.contains("CAP_SYS_PTRACE")
            && ran.stderr.contains("tierswap run --user"),
        "{}",
        ran.describe()
    );
}

/// Workers that give up root right after the fork (dropuid.c: setgroups, setgid, setuid to
/// 65534, then 16 MiB of their own under a budget of 8M): a worker still waiting for its
/// first need starts its pager before the switch, while it may still have fork events, so
/// it is managed (its stats written as 65534) instead of running unmanaged after a warning
/// per worker.
#[test]
fn workers_that_give_up_root_after_the_fork_are_managed() {
    need_root();
    let dir = open_dir("user-dropuid");
    let prog = compile(&dir, "dropuid");
    let st = dir.path("stats-%p.json");
    let ran = run_in(&dir, &["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()], &prog, &["2"]);
    assert!(ran.status.success() && ran.stdout.contains("dropuid ok"), "{}", ran.describe());
    // (A tree this small over its 8M for a moment may say so; an unmanaged worker may not.)
    assert!(!ran.stderr.contains("not managing"), "every worker managed: {}", ran.describe());
    let all = stats_files(&dir.0);
    assert_eq!(all.len(), 3, "the parent and both workers had a pager: {all:?}");
    for worker in &all[1..] {
        assert!(worker["counters"]["faults_swapped"].as_u64().unwrap() > 0, "the worker's pages came back: {worker}");
    }
}

/// A forked child whose first need comes from inside glibc (gettextstart.c: it gives up root
/// with the raw system call, then gettext allocates under its own lock): the pager start,
/// failing without CAP_SYS_PTRACE, formatted its error with strerror, which takes gettext's
/// lock again, and the child hung for ever (PostgreSQL's checkpointer did, in a message of
/// its shutdown). An allocation glibc or the loader asks for no longer starts a pager: the
/// child's own next one does, which fails in the open and says so once.
#[test]
fn a_pager_never_starts_inside_glibc() {
    need_root();
    let dir = open_dir("user-gettext");
    let prog = compile(&dir, "gettextstart");
    let mut cmd = tierswap_run(&["--budget", "8M"], &prog, &[]);
    cmd.env("TMPDIR", &dir.0);
    let ran = run_within(cmd, std::time::Duration::from_secs(30));
    assert!(ran.status.success() && ran.stdout.contains("gettextstart ok"), "{}", ran.describe());
    assert_eq!(ran.stderr.lines().count(), 1, "the child's one warning: {}", ran.describe());
    assert!(ran.stderr.contains("CAP_SYS_PTRACE"), "{}", ran.describe());
}

/// A launcher that switches user with the raw system calls (rawswitch.c, as capsh does)
/// and execs the service: the root image it becomes cannot write `run`'s ledger (root's,
/// 0644), so it starts one of its own for its descendants, and a forked child of the
/// service joins that: one budget for the service's tree rather than one per process, and
/// no line about it.
#[test]
fn a_service_started_by_a_raw_switch_keeps_one_budget() {
    need_root();
    let dir = open_dir("user-rawswitch");
    let launcher = compile(&dir, "rawswitch");
    let prog = compile(&dir, "fork");
    let st = dir.path("stats-%p.json");
    let ran = run_in(
        &dir,
        &["--budget", "8M", "--stats-on-exit", st.to_str().unwrap()],
        &launcher,
        &[prog.to_str().unwrap()],
    );
    assert!(ran.status.success() && ran.stdout.contains("fork ok"), "{}", ran.describe());
    assert!(!ran.stderr.contains("cannot share"), "{}", ran.describe());
    let all = stats_files(&dir.0);
    assert_eq!(all.len(), 2, "fork (as 65534) and its exec'd program: {all:?}");
    for s in &all {
        let ledger = s["tree_ledger"].as_str().unwrap_or_else(|| panic!("in a tree: {s}"));
        assert!(ledger.ends_with(".u65534"), "the service's own ledger: {ledger}");
    }
}

/// `tierswap stat PID` of a service a launcher exec'd after a raw switch: the launcher's
/// image (root) left its socket under root's directory, the service's answers from its
/// user's; stat took the first it found, was refused, and said so. It asks each in turn.
#[test]
fn stat_finds_the_socket_that_answers() {
    need_root();
    let dir = open_dir("user-stat");
    let launcher = compile(&dir, "rawswitch");
    let mut cmd = tierswap_run(&["--budget", "8M"], &launcher, &["/bin/sleep", "3"]);
    cmd.env("TMPDIR", &dir.0).stdin(std::process::Stdio::null());
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    let mut answered = None;
    for _ in 0..40 {
        std::thread::sleep(std::time::Duration::from_millis(50));
        let out = Command::new(tierswap_bin())
            .args(["stat", &pid.to_string(), "--format", "json"])
            .env("TMPDIR", &dir.0)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        if out.status.success() && text.contains("sleep") {
            answered = Some(text);
            break;
        }
        answered = None;
    }
    assert!(child.wait().unwrap().success());
    let _ = std::fs::remove_file(format!("/run/tierswap/{pid}.sock"));
    let text = answered.expect("stat answered for the service");
    let reply: serde_json::Value = serde_json::from_str(&text).unwrap();
    assert_eq!(reply["pid"].as_u64(), Some(pid as u64), "{text}");
}

/// A server renames its processes (PostgreSQL's backends, nginx's workers; here perl's `$0`):
/// `tierswap stat` shows the name they have now, not the one they had when their pager
/// started.
#[test]
fn stat_shows_a_renamed_process_by_its_new_name() {
    let dir = open_dir("renamed");
    let mut cmd = tierswap_run(
        &["--budget", "8M"],
        Path::new("perl"),
        &["-e", "$0 = 'tierswap-renamed-proc'; print qq(renamed\\n); STDOUT->flush; sleep 3"],
    );
    cmd.env("TMPDIR", &dir.0).stdin(std::process::Stdio::null()).stdout(std::process::Stdio::piped());
    let mut child = cmd.spawn().unwrap();
    let pid = child.id();
    let mut line = String::new();
    std::io::BufRead::read_line(&mut std::io::BufReader::new(child.stdout.take().unwrap()), &mut line).unwrap();
    assert_eq!(line.trim(), "renamed");
    let out = Command::new(tierswap_bin()).args(["stat", &pid.to_string(), "--format", "json"]).output().unwrap();
    assert!(child.wait().unwrap().success());
    let text = String::from_utf8_lossy(&out.stdout);
    let reply: serde_json::Value = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(reply["cmdline"].as_str(), Some("tierswap-renamed-proc"), "{text}");
}

/// A forked child still waiting for its first need vforks, and the vfork child gives up
/// root before it execs (vforkuid.c). Its pager must not start there, before the setuid, as
/// a forked child's does: the vfork child shares the child's memory, so the pager would
/// have been the child's, with the vfork child's threads and descriptors, gone at its exec
/// (the child's next mappings failed: "UFFDIO_REGISTER: Bad file descriptor"). The child
/// starts its own and is managed.
#[test]
fn a_vfork_child_giving_up_root_leaves_its_parent_alone() {
    need_root();
    let dir = open_dir("user-vfork");
    let prog = compile(&dir, "vforkuid");
    let st = dir.path("stats-%p.json");
    let ran = run_in(&dir, &["--log", "--budget", "8M", "--stats-on-exit", st.to_str().unwrap()], &prog, &[]);
    assert!(ran.status.success() && ran.stdout.contains("vforkuid ok"), "{}", ran.describe());
    assert!(ran.stdout.contains("65534") && ran.stdout.contains("child ok"), "{}", ran.describe());
    assert!(!ran.stderr.contains("cannot map"), "{}", ran.describe());
    let all = stats_files(&dir.0);
    assert_eq!(all.len(), 2, "the parent and its child each had a pager: {all:?}");
    assert!(all[1]["counters"]["faults_swapped"].as_u64().unwrap() > 0, "the child's pages came back: {}", all[1]);
}
