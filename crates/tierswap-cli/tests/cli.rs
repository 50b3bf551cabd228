//! The command line: bad input gets one line saying what to do, and exit code 2.

use std::os::unix::process::CommandExt;
use std::process::{Command, Output};

fn tierswap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tierswap")).args(args).output().expect("run tierswap")
}

fn assert_usage_error(args: &[&str], needle: &str) {
    let out = tierswap(args);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
    assert!(err.contains(needle), "{args:?}: expected '{needle}' in: {err}");
    assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
}

#[test]
fn bad_input_is_one_line_and_exit_2() {
    assert_usage_error(&["bench", "--workload", "usama_1g", "--size", "12Q"], "cannot parse size '12Q'");
    assert_usage_error(&["bench", "--workload", "usama_1g", "--budget", "lots"], "--budget");
    assert_usage_error(&["bench", "--workload", "nope"], "unknown workload 'nope': workloads are usama_1g");
    assert_usage_error(&["bench", "--workload", "seq64", "--engine", "zfs"], "unknown engine 'zfs'");
    assert_usage_error(&["bench", "--workload", "seq64", "--budget", "1M"], "below the minimum");
    assert_usage_error(&["bench", "--workload", "seq64", "--tiers", "zero"], "nowhere to store");
    assert_usage_error(&["bench", "--workload", "seq64", "--pool-max", "150%"], "--pool-max");
    assert_usage_error(&["bench"], "no workload");
    assert_usage_error(&["bench", "--suite", "big"], "unknown suite");
    assert_usage_error(&["bench", "--workload", "seq64", "--runs", "0"], "--runs");
    assert_usage_error(&["bench", "metadata", "--swapped", "x"], "--swapped");
    assert_usage_error(
        &["bench", "--workload", "seq64", "--policy", "fast"],
        "--policy: unknown swap-in policy 'fast'",
    );
    assert_usage_error(
        &["bench", "--workload", "seq64", "--swapin-max", "3K"],
        "--swapin-max 3K is not a power of two",
    );
    assert_usage_error(&["bench", "--workload", "seq64", "--swapin-max", "4M"], "from 4K to 2M");
    assert_usage_error(&["bench", "--workload", "seq64", "--swapin-max", "0"], "from 4K to 2M");
    assert_usage_error(&["bench", "--workload", "seq64", "--swapin-max", "lots"], "--swapin-max: cannot parse size");
    assert_usage_error(
        &["bench", "--workload", "seq64", "--engine", "tierswap,tierswap:polcy=order0"],
        "unknown setting 'polcy': settings are policy=locality|order0|always",
    );
    assert_usage_error(&["bench", "--workload", "seq64", "--engine", "tierswap:policy=fast"], "policy 'fast'");
    assert_usage_error(&["bench", "--workload", "seq64", "--engine", "tierswap:swapin-max=3K"], "swapin-max=3K");
    assert_usage_error(&["bench", "--workload", "seq64", "--engine", "kernel-zram:no-encrypt"], "tierswap only");
    assert_usage_error(&["bench", "--workload", "seq64", "--engine", "tierswap,tierswap"], "given twice");
    assert_usage_error(&["bench", "--workload", "seq64", "--engine", "tierswap[policy=order0]"], "no brackets");
    // The switches take no value.
    assert_eq!(tierswap(&["bench", "--workload", "seq64", "--no-encrypt=yes"]).status.code(), Some(2));
    // clap's own usage errors exit 2 too.
    assert_eq!(tierswap(&["bench", "--no-such-flag"]).status.code(), Some(2));
    for args in [
        &["bench", "--workload", "seq64", "--size", "12Q"][..],
        &["bench", "--workload", "nope"],
        &["bench", "--workload", "seq64", "--swapin-max", "3K"],
        &["bench", "--workload", "seq64", "--engine", "tierswap:x"],
    ] {
        let err = String::from_utf8_lossy(&tierswap(args).stderr).to_string();
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(err.starts_with("tierswap: "));
    }
}

#[test]
fn help_explains() {
    let out = tierswap(&["bench", "--help"]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    for word in [
        "--workload",
        "--suite",
        "--engine",
        "--size",
        "--budget",
        "--runs",
        "--json",
        "floor",
        "metadata",
        "--policy",
        "--swapin-max",
        "--no-fault-around",
        "--no-workingset",
        "--no-keep-clean",
        "--no-encrypt",
        "tierswap:policy=order0",
        "thrash",
        "mixed",
    ] {
        assert!(text.contains(word), "--help lacks {word}");
    }
}

#[test]
fn without_userfaultfd_permission_it_says_what_to_enable() {
    // SAFETY: getuid has no preconditions.
    if unsafe { libc::getuid() } != 0 {
        panic!("this test drops to uid 65534 and needs root to do so (CI runs as root)");
    }
    let unprivileged = std::fs::read_to_string("/proc/sys/vm/unprivileged_userfaultfd").unwrap_or_default();
    assert_eq!(unprivileged.trim(), "0", "the test assumes vm.unprivileged_userfaultfd=0 (the default)");
    let tmp = std::env::temp_dir().join(format!("tierswap-cli-test-{}", std::process::id()));
    std::fs::create_dir_all(&tmp).unwrap();
    // SAFETY: chmod of our own fresh directory path.
    unsafe { libc::chmod(std::ffi::CString::new(tmp.to_str().unwrap()).unwrap().as_ptr(), 0o777) };
    let out = Command::new(env!("CARGO_BIN_EXE_tierswap"))
        .args(["bench", "--workload", "seq64", "--size", "4M", "--budget", "4M", "--runs", "1", "--quiet"])
        .env("TMPDIR", &tmp)
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run tierswap as nobody");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("CAP_SYS_PTRACE"), "{err}");
    assert!(err.contains("/dev/userfaultfd"), "{err}");
    let left: Vec<_> = std::fs::read_dir(&tmp).unwrap().collect();
    assert!(left.is_empty(), "nothing left behind in TMPDIR");
    std::fs::remove_dir_all(&tmp).unwrap();
}
