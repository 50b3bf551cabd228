//! What the tests of `tierswap run` share: the binary and the shim beside it, a private
//! directory per test, the C programs of crates/tierswap-preload/tests/c compiled into it,
//! runs with a deadline, and the counters the shim writes at exit.
//!
//! The shim is the cdylib beside the `tierswap` binary in the target directory:
//! `cargo test --workspace` builds it; `cargo test -p tierswap-cli` alone does not, and then
//! these tests say so.

// Each test binary compiles this module for itself and uses a part of it.
#![allow(dead_code)]

use std::io::Read;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::time::{Duration, SystemTime};

/// A run longer than this is a hang.
pub const TIMEOUT: Duration = Duration::from_secs(90);

/// The `tierswap` binary under test.
pub fn tierswap_bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tierswap"))
}

/// The shim beside the binary, checked to be newer than its sources (a stale shim would test
/// old code).
pub fn preload() -> PathBuf {
    let so = tierswap_bin().with_file_name("libtierswap_preload.so");
    let built = std::fs::metadata(&so).and_then(|m| m.modified()).unwrap_or_else(|_| {
        panic!(
            "{} is missing: build the shim first (cargo build --release -p tierswap-preload; cargo test --workspace does)",
            so.display()
        )
    });
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("../tierswap-preload/src");
    let newest = std::fs::read_dir(&src)
        .unwrap()
        .filter_map(|e| e.ok()?.metadata().ok()?.modified().ok())
        .max()
        .unwrap_or(SystemTime::UNIX_EPOCH);
    assert!(
        built >= newest,
        "{} is older than its sources: rebuild it (cargo build --release -p tierswap-preload)",
        so.display()
    );
    so
}

/// A private directory (0755 so a test may run its programs as another user), removed at drop.
pub struct TestDir(pub PathBuf);

impl TestDir {
    /// `$TMPDIR/tierswap-run-test-<our pid>-<name>`, empty.
    pub fn new(name: &str) -> TestDir {
        let d = std::env::temp_dir().join(format!("tierswap-run-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::set_permissions(&d, std::fs::Permissions::from_mode(0o755)).unwrap();
        TestDir(d)
    }

    /// `name` inside the directory.
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles tests/c/NAME.c of the preload crate into `dir`.
pub fn compile(dir: &TestDir, name: &str) -> PathBuf {
    cc(name, dir.path(name), &["-pthread"])
}

/// Compiles tests/c/NAME.c of the preload crate into a program NAME in `dir`, with more
/// compiler and linker flags.
pub fn compile_with(dir: &TestDir, name: &str, flags: &[&str]) -> PathBuf {
    cc(name, dir.path(name), flags)
}

/// Compiles tests/c/NAME.c of the preload crate into a shared library NAME.so in `dir`.
pub fn compile_library(dir: &TestDir, name: &str) -> PathBuf {
    cc(name, dir.path(&format!("{name}.so")), &["-shared", "-fPIC", "-ldl"])
}

fn cc(name: &str, out: PathBuf, flags: &[&str]) -> PathBuf {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("../tierswap-preload/tests/c/{name}.c"));
    let o = Command::new("cc")
        .args(["-O2", "-Wall", "-Wextra", "-Werror"])
        .args(flags)
        .arg("-o")
        .arg(&out)
        .arg(src)
        .output()
        .expect("run cc (the tests compile C programs: install a C compiler)");
    assert!(o.status.success(), "cc {name}.c failed:\n{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// What a run gave back.
pub struct Ran {
    pub status: ExitStatus,
    pub stdout: String,
    pub stderr: String,
}

impl Ran {
    /// The status and both outputs, for a failure message.
    pub fn describe(&self) -> String {
        // A runaway log must not drown the failure: the first and last lines are enough.
        let lines: Vec<&str> = self.stderr.lines().collect();
        let err = if lines.len() > 30 {
            format!(
                "{}\n[… {} lines …]\n{}",
                lines[..10].join("\n"),
                lines.len() - 20,
                lines[lines.len() - 10..].join("\n")
            )
        } else {
            self.stderr.clone()
        };
        format!("status {:?}\nstdout:\n{}\nstderr:\n{err}", self.status, self.stdout)
    }
}

/// Runs `cmd` to the end, killing it after [`TIMEOUT`] (a hang fails the test, it does not
/// hang the suite).
pub fn run_to_end(cmd: Command) -> Ran {
    run_within(cmd, TIMEOUT)
}

/// [`run_to_end`] with its own limit. The program runs in a process group of its own, and
/// on timeout the whole group is killed: a forked child that hangs holding the output pipes
/// must not keep the test waiting.
pub fn run_within(cmd: Command, timeout: Duration) -> Ran {
    let (ran, timed_out) = run_until(cmd, timeout);
    assert!(!timed_out, "the run hung and was killed after {timeout:?}:\n{}", ran.describe());
    ran
}

/// Runs `cmd` in a process group of its own, waiting for it and for every process that holds
/// its output; kills the group after `timeout`. Returns what it gave back and whether it was
/// killed.
pub fn run_until(mut cmd: Command, timeout: Duration) -> (Ran, bool) {
    cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped()).process_group(0);
    let mut child = cmd.spawn().expect("spawn");
    let pid = child.id() as i32;
    let (done_tx, done_rx) = mpsc::channel::<()>();
    let watchdog = std::thread::spawn(move || {
        if done_rx.recv_timeout(timeout) == Err(mpsc::RecvTimeoutError::Timeout) {
            // SAFETY: kill of the process group our child leads; the child is not reaped yet
            // (the waiter has not sent), so the group id is still its own.
            unsafe { libc::kill(-pid, libc::SIGKILL) };
            return true;
        }
        false
    });
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let err_reader = std::thread::spawn(move || {
        let mut s = Vec::new();
        let _ = err.read_to_end(&mut s);
        s
    });
    let mut stdout = Vec::new();
    let _ = out.read_to_end(&mut stdout);
    let stderr = err_reader.join().unwrap();
    let status = child.wait().expect("wait");
    let _ = done_tx.send(());
    let timed_out = watchdog.join().unwrap();
    let ran = Ran {
        status,
        stdout: String::from_utf8_lossy(&stdout).into_owned(),
        stderr: String::from_utf8_lossy(&stderr).into_owned(),
    };
    (ran, timed_out)
}

/// `tierswap run FLAGS -- PROG ARGS` with the shim from the target directory.
pub fn tierswap_run(flags: &[&str], prog: &Path, args: &[&str]) -> Command {
    let mut cmd = Command::new(tierswap_bin());
    cmd.arg("run").args(flags).arg("--").arg(prog).args(args).env("TIERSWAP_PRELOAD", preload());
    cmd
}

/// The counters the shim wrote at exit.
pub fn stats(path: &Path) -> serde_json::Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| {
        panic!("no stats at {} (the shim writes them at exit when it managed): {e}", path.display())
    });
    serde_json::from_str(&text).unwrap()
}

/// Counter `name` of a stats document.
pub fn counter(s: &serde_json::Value, name: &str) -> u64 {
    s["counters"][name].as_u64().unwrap_or_else(|| panic!("no counter {name} in {s}"))
}

/// Gauge `name` (a top-level field: `swap_slots`, `pool_stored_bytes`, …) of a stats document.
pub fn gauge(s: &serde_json::Value, name: &str) -> u64 {
    s[name].as_u64().unwrap_or_else(|| panic!("no gauge {name} in {s}"))
}

/// Pages went out to the pool and the file and came back, and the footprint kept to the budget.
pub fn assert_swapped_both_ways(s: &serde_json::Value, budget_bytes: u64) {
    let pool_out = counter(s, "zswpout");
    let file_out = counter(s, "pswpout");
    let back = counter(s, "zswpin") + counter(s, "pswpin");
    assert!(
        pool_out > 1000 && file_out > 1000,
        "pages must reach the pool and the file: zswpout {pool_out}, pswpout {file_out}"
    );
    assert!(back > 1000, "pages must come back from swap: zswpin + pswpin = {back}");
    // The acceptance bound is 1.05 × budget (scripts/accept-python.sh holds 128 MiB to it); at
    // the 8–16 MiB budgets here, with other tests' pagers on the same 2 CPUs, reclaim lags by
    // up to ~6 % (seen: 17.7 MB at 16 MiB). These tests are about bytes: catch gross overshoot.
    let footprint_max = counter(s, "footprint_max");
    assert!(
        footprint_max as f64 <= budget_bytes as f64 * 1.25,
        "footprint max {footprint_max} above 1.25 × budget {budget_bytes}"
    );
}

/// A size as `tierswap stat` prints it (`12.5 MiB`: a number and its unit), in MiB.
pub fn mib(value: &str, unit: &str) -> f64 {
    let v: f64 = value.parse().unwrap_or_else(|_| panic!("not a size: {value} {unit}"));
    v * match unit {
        "B" => 1.0 / (1 << 20) as f64,
        "KiB" => 1.0 / 1024.0,
        "MiB" => 1.0,
        "GiB" => 1024.0,
        _ => panic!("not a unit: {unit}"),
    }
}
