//! The lab against the kernel's own swap: the data really goes through each engine, and the
//! machine is left exactly as it was — after a normal run, after Ctrl-C, and after a run
//! killed outright (then `tierswap bench restore` puts it back). Needs root.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn bin() -> &'static str {
    env!("CARGO_BIN_EXE_tierswap")
}

#[derive(Debug, PartialEq)]
struct SystemState {
    swaps: String,
    zswap_enabled: String,
    zswap_compressor: String,
    zram_disksize: String,
    our_cgroups: Vec<String>,
}

fn read(p: &str) -> String {
    std::fs::read_to_string(p).unwrap_or_default().trim().to_string()
}

fn state() -> SystemState {
    let mut our_cgroups = Vec::new();
    for root in ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"] {
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                let n = e.file_name().to_string_lossy().to_string();
                if n.starts_with("tierswap-bench-") {
                    our_cgroups.push(n);
                }
            }
        }
    }
    SystemState {
        swaps: read("/proc/swaps"),
        zswap_enabled: read("/sys/module/zswap/parameters/enabled"),
        zswap_compressor: read("/sys/module/zswap/parameters/compressor"),
        zram_disksize: read("/sys/block/zram0/disksize"),
        our_cgroups,
    }
}

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the lab's kernel engines need root (CI runs as root)");
    assert!(Path::new("/sys/module/zswap/parameters/enabled").exists(), "this test needs a kernel with zswap");
}

// The tests change system-wide swap state: never run two at once.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn kernel_engines_run_and_restore_everything() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_root();
    let before = state();
    let json = std::env::temp_dir().join(format!("tierswap-lab-test-{}.json", std::process::id()));
    let out = Command::new(bin())
        .args(["bench", "--workload", "seq64,zero", "--size", "48M", "--budget", "12M", "--runs", "1", "--quiet"])
        .args(["--engine", "tierswap,kernel-zswap,kernel-zram,kernel-disk", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert_eq!(state(), before, "the machine is as it was");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 8, "every workload on every engine: {err}");
    for r in runs {
        assert_eq!(r["mismatches"], 0, "{r}");
        let vm = &r["kernel_vmstat"];
        let n = |k: &str| vm[k].as_u64().unwrap_or(0);
        if r["workload"] == "seq64" {
            match r["engine"].as_str().unwrap() {
                "kernel-zswap" => assert!(n("zswpout") > 0, "zswap saw the data: {vm}"),
                "kernel-zram" | "kernel-disk" => assert!(n("pswpout") > 0, "the swap device saw the data: {vm}"),
                _ => assert!(r["counters"]["zswpout"].as_u64().unwrap() > 0),
            }
        }
    }
}

#[test]
fn variants_and_the_new_workloads_run_beside_the_kernel() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_root();
    let before = state();
    let json = std::env::temp_dir().join(format!("tierswap-lab-variants-{}.json", std::process::id()));
    let out = Command::new(bin())
        .args(["bench", "--workload", "thrash,mixed", "--size", "24M", "--budget", "12M", "--runs", "1", "--quiet"])
        .args(["--pool-max", "2M", "--engine", "tierswap,tierswap:policy=order0:no-fault-around,kernel-zram", "--json"])
        .arg(&json)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{err}");
    assert_eq!(state(), before, "the machine is as it was");
    assert!(table.contains("ts÷") && table.contains("tierswap policy counters"), "{table}");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_file(&json);
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 6, "both workloads on every engine: {err}");
    let pages = 24 * 256;
    for r in runs {
        assert_eq!(r["mismatches"], 0, "{r}");
        let want = if r["workload"] == "thrash" { 3 * pages } else { pages };
        assert_eq!(r["pages_verified"], want, "every byte of every touch: {r}");
        match r["engine"].as_str().unwrap() {
            "kernel-zram" => assert!(r["kernel_vmstat"]["pswpout"].as_u64().unwrap_or(0) > 0, "{r}"),
            "tierswap" => assert_eq!(r["pager"]["swapin_policy"], "Locality"),
            "tierswap:policy=order0:no-fault-around" => {
                assert_eq!(r["pager"]["swapin_policy"], "Order0");
                assert_eq!(r["pager"]["fault_around"], false);
                assert!(r["counters"]["swpin_large"].is_u64() && r["counters"]["swpout_clean"].is_u64());
            }
            e => panic!("unexpected engine {e}"),
        }
    }
    let variant = doc["summary"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["engine"] == "tierswap:policy=order0:no-fault-around" && s["workload"] == "thrash")
        .unwrap();
    assert!(variant["tierswap_refault_over_this"].as_f64().unwrap() > 0.0, "{variant}");
}

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < Duration::from_secs(60), "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn ours_active() -> bool {
    let s = state();
    s.swaps.contains("tierswap-bench-") || s.swaps.contains("zram0")
}

fn long_lab(engine: &str) -> std::process::Child {
    Command::new(bin())
        .args(["bench", "--workload", "seq64", "--size", "512M", "--budget", "64M", "--runs", "3", "--quiet"])
        .args(["--engine", engine])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn ctrl_c_mid_run_restores() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_root();
    let before = state();
    let mut lab = long_lab("kernel-zram");
    wait_for("the zram swap to be on", ours_active);
    std::thread::sleep(Duration::from_millis(300));
    // SAFETY: signalling our own child.
    unsafe { libc::kill(lab.id() as i32, libc::SIGINT) };
    let status = lab.wait().unwrap();
    assert_eq!(status.code(), Some(2), "interrupted before any run completed: exit 2");
    assert_eq!(state(), before, "the machine is as it was after Ctrl-C");
}

#[test]
fn killed_halfway_then_restore_puts_it_back() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_root();
    let before = state();
    let mut lab = long_lab("kernel-zswap");
    wait_for("the zswap swap file to be on", ours_active);
    std::thread::sleep(Duration::from_millis(300));
    lab.kill().unwrap();
    lab.wait().unwrap();
    // The workload child dies with its parent (PDEATHSIG); give it a moment.
    std::thread::sleep(Duration::from_millis(200));
    assert_ne!(state(), before, "a SIGKILLed lab cannot clean up after itself");
    let out = Command::new(bin()).args(["bench", "restore"]).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stdout).contains("restored"), "{}", String::from_utf8_lossy(&out.stdout));
    assert_eq!(state(), before, "restore put the machine back");
}

/// Two labs with kernel engines side by side once left zswap enabled: the second recorded
/// the first's "enabled" as the original and put it back last. Now the second is refused,
/// naming the first, and the machine ends as it was.
#[test]
fn a_second_lab_beside_a_running_one_is_refused_and_nothing_is_left() {
    let _g = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    require_root();
    let before = state();
    let mut first = long_lab("kernel-zswap");
    wait_for("the zswap swap file to be on", ours_active);
    let second = Command::new(bin())
        .args(["bench", "--workload", "seq64", "--size", "64M", "--budget", "32M", "--runs", "1", "--quiet"])
        .args(["--engine", "kernel-zswap"])
        .output()
        .unwrap();
    // Stop the first before asserting anything: a failed test must not leave it running.
    // SAFETY: signalling our own child.
    unsafe { libc::kill(first.id() as i32, libc::SIGINT) };
    first.wait().unwrap();
    let err = String::from_utf8_lossy(&second.stderr);
    assert!(!second.status.success(), "the second lab ran beside the first: {err}");
    assert!(err.contains(&format!("another lab (pid {})", first.id())), "{err}");
    assert_eq!(state(), before, "the machine is as it was after both");
}
