//! `tierswap bench command` at smoke size, so the lab cannot rot: a Python program building
//! 64 MiB of objects and printing their digest, under `tierswap run` and the kernel's disk
//! swap with 16 MiB, and unconstrained, one run each (at 8 MiB, half of it python3's own start,
//! the kernel's memcg OOM-killed the program now and then on a machine busy with the other
//! tests). Every run finishes with the same
//! output, pages went out and came back under both constrained engines, tierswap stays
//! within its budget, and the machine's swap settings are as they were. A program whose
//! output changes from run to run is flagged, and the lab exits 1. Needs root (CI runs as
//! root) and python3 (scripts/setup.sh installs it).

use std::path::PathBuf;
use std::process::Command;

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tierswap"))
}

/// 65,536 values of 1 KiB (16 random bytes repeated), then a SHA-256 over every third.
const PROGRAM: &str = "
import hashlib, random
r = random.Random(1)
d = {i: r.getrandbits(128).to_bytes(16, 'little') * 64 for i in range(65536)}
h = hashlib.sha256()
for i in range(0, 65536, 3):
    h.update(d[i])
print(h.hexdigest())
";

fn swaps() -> String {
    std::fs::read_to_string("/proc/swaps").unwrap_or_default()
}

fn our_cgroups() -> Vec<String> {
    std::fs::read_dir("/sys/fs/cgroup/memory")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("tierswap-bench-"))
        .collect()
}

#[test]
fn a_smoke_size_command_lab_compares_outputs_and_restores_the_machine() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "the kernel engine needs root (CI runs as root)");
    let so = bin().with_file_name("libtierswap_preload.so");
    assert!(so.exists(), "{} is missing: cargo build --release --workspace builds it", so.display());
    let (swaps_before, zswap_before) =
        (swaps(), std::fs::read_to_string("/sys/module/zswap/parameters/enabled").unwrap_or_default());
    let dir = std::env::temp_dir().join(format!("tierswap-command-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("lab.json");
    let out = Command::new(bin())
        .args(["bench", "command", "--budget", "16M", "--runs", "1", "--engine", "tierswap,kernel-disk,unconstrained"])
        .arg("--dir")
        .arg(&dir)
        .arg("--json")
        .arg(&json)
        .args(["--", "python3", "-c", PROGRAM])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{table}\n{err}");
    for engine in ["tierswap", "kernel-disk", "unconstrained"] {
        let row = table.lines().find(|l| l.split_whitespace().next() == Some(engine));
        let row = row.unwrap_or_else(|| panic!("no row for {engine}:\n{table}"));
        assert!(row.contains(" 1/1 ") && row.ends_with("same"), "{row}");
    }
    let runs: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let runs = runs.as_array().unwrap();
    assert_eq!(runs.len(), 3, "{err}");
    let digest = runs[0]["output_sha256"].as_str().unwrap();
    assert_eq!(digest.len(), 64);
    for r in runs {
        assert!(r["error"].is_null(), "{r}");
        assert_eq!(r["output_sha256"], digest, "{r}");
        assert_eq!(r["output_bytes"], 65, "64 hex digits and a newline: {r}");
        let c = &r["counters"];
        match r["engine"].as_str().unwrap() {
            "tierswap" => {
                // The data is 4 times the budget: pages went out and came back.
                assert!(c["faults"].as_u64().unwrap() > 0, "{r}");
                assert!(c["zswpin"].as_u64().unwrap() + c["pswpin"].as_u64().unwrap() > 0, "{r}");
                // Within the budget, with a quarter's slack for a machine busy with the other
                // tests (the data is four budgets).
                assert!(r["peak_bytes"].as_u64().unwrap() <= 20 << 20, "over the budget: {r}");
            }
            "kernel-disk" => {
                assert!(c["faults"].as_u64().unwrap() > 0 && c["pswpin"].as_u64().unwrap() > 0, "{r}");
                assert!(r["peak_bytes"].as_u64().unwrap() <= 16 << 20, "over the memcg's limit: {r}");
            }
            _ => assert!(r["peak_bytes"].as_u64().unwrap() > 64 << 20, "the data is resident: {r}"),
        }
    }
    assert_eq!(swaps(), swaps_before, "the machine's swap areas are as they were");
    assert_eq!(
        std::fs::read_to_string("/sys/module/zswap/parameters/enabled").unwrap_or_default(),
        zswap_before,
        "zswap is as it was"
    );
    assert!(our_cgroups().is_empty(), "{:?}", our_cgroups());
}

#[test]
fn an_output_that_changes_between_runs_is_flagged() {
    // Each run prints its own pid: the second engine's output differs from the first's.
    let out = Command::new(bin())
        .args(["bench", "command", "--budget", "16M", "--runs", "1", "--engine", "unconstrained,tierswap"])
        .args(["--", "python3", "-c", "import os; print(os.getpid())"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    let row = table.lines().find(|l| l.starts_with("tierswap ")).unwrap_or_else(|| panic!("{table}"));
    assert!(row.ends_with("DIFFERS in 1 of 1"), "{row}");
}

#[test]
fn bad_command_arguments_are_one_line_and_exit_2() {
    for (args, want) in [
        (vec!["--runs", "0", "--", "true"], "--runs and --timeout must be more than 0"),
        (vec!["--engine", "tierswap:polcy=order0", "--", "true"], "unknown setting 'polcy'"),
        (vec!["--budget", "lots", "--", "true"], "cannot parse size 'lots'"),
    ] {
        let out = Command::new(bin()).args(["bench", "command"]).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
    // A failing program: its exit status and the end of its stderr are in the table.
    let out = Command::new(bin())
        .args(["bench", "command", "--runs", "1", "--engine", "tierswap", "--"])
        .args(["sh", "-c", "echo 'no such input file' >&2; exit 3"])
        .output()
        .unwrap();
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}");
    assert!(
        table.contains("FAILED") && table.contains("exit status: 3") && table.contains("no such input file"),
        "{table}"
    );
}
