//! `tierswap bench programs` at smoke size, so the lab cannot rot: an unmodified
//! redis-server (scripts/setup.sh installs it) under `tierswap run` with a budget below its
//! data, under a variant whose settings go through `tierswap run --set`, and unconstrained,
//! one run each; every value the client read came back right, the table has its rows, the
//! JSON its phases and tierswap's counters, and the variant's counters show its settings.
//! Seconds, not minutes.
//!
//! The shim is the cdylib beside the `tierswap` binary: `cargo test --workspace` builds it.

use std::path::PathBuf;
use std::process::{Command, Stdio};

fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_tierswap"))
}

fn have(tool: &str) -> bool {
    Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_ok()
}

/// A variant of settings `tierswap run` has no flag for, passed as `--set`: `swapin-max=4K`
/// and `pool-max=1M` show in its counters (`no-follow` shows in none).
const VARIANT: &str = "tierswap:no-follow:swapin-max=4K:pool-max=1M";

#[test]
fn a_smoke_size_programs_lab_verifies_every_value_and_reports_its_rows() {
    assert!(have("redis-server"), "redis-server is missing: run scripts/setup.sh (apt-get install redis-server)");
    let so = bin().with_file_name("libtierswap_preload.so");
    assert!(so.exists(), "{} is missing: cargo build --release --workspace builds it", so.display());
    let dir = std::env::temp_dir().join(format!("tierswap-programs-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let json = dir.join("lab.json");
    let t0 = std::time::Instant::now();
    let out = Command::new(bin())
        .args(["bench", "programs", "--program", "redis", "--dataset", "6M", "--budget", "4M"])
        .args([
            "--requests",
            "3000",
            "--engine",
            &format!("tierswap,{VARIANT},unconstrained"),
            "--runs",
            "1",
            "--quiet",
        ])
        .arg("--dir")
        .arg(&dir)
        .arg("--json")
        .arg(&json)
        .output()
        .unwrap();
    let took = t0.elapsed();
    let table = String::from_utf8_lossy(&out.stdout);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{table}\n{err}");
    for engine in ["tierswap", VARIANT, "unconstrained"] {
        for dist in ["uniform", "zipfian"] {
            let row = table.lines().find(|l| {
                let w: Vec<&str> = l.split_whitespace().collect();
                w.len() >= 13 && w[0] == "redis" && w[1] == dist && w[2] == engine
            });
            let row = row.unwrap_or_else(|| panic!("no row for redis {dist} {engine}:\n{table}"));
            assert_eq!(row.split_whitespace().last(), Some("0"), "mismatches in {row}");
        }
    }
    assert!(table.contains("client headroom") && table.contains("counters per timed request"), "{table}");
    let doc: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    let runs = doc["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3, "{err}");
    let keys = 6 * 1024;
    for r in runs {
        assert!(r["error"].is_null(), "{r}");
        let phases = r["phases"].as_array().unwrap();
        assert_eq!(phases.len(), 2, "uniform and zipfian: {r}");
        for p in phases {
            assert_eq!(p["mismatches"], 0, "{p}");
            assert_eq!(p["warmup_mismatches"], 0, "{p}");
            assert_eq!(p["requests"], 3000);
            assert_eq!(p["values_verified"], 3000, "every GET was compared");
            assert_eq!(p["warmup_values_verified"], 300, "the warm-up's GETs too");
            assert!(p["throughput_rps"].as_f64().unwrap() > 0.0);
        }
        if r["engine"].as_str().is_some_and(|e| e.starts_with("tierswap")) {
            // The budget is below the data: pages went out and came back during the requests.
            let faults: u64 = phases.iter().map(|p| p["counters"]["faults"].as_u64().unwrap_or(0)).sum();
            assert!(faults > 0, "{r}");
            let c = &r["tierswap_stats"]["counters"];
            assert!(c["zswpout"].as_u64().unwrap_or(0) + c["pswpout"].as_u64().unwrap_or(0) > 0, "{r}");
            assert!(r["footprint_max_bytes"].as_u64().unwrap() <= (4 << 20) + (1 << 20), "over the budget: {r}");
            // Plain tierswap swaps in large and lets its pool limit follow the workload (between
            // the floor, 5 % of the budget, and 5/8 of it); the variant's swapin-max=4K and
            // pool-max=1M reached its pager.
            let (large, pool_limit) = (c["swpin_large"].as_u64().unwrap(), r["tierswap_stats"]["pool_limit"].as_u64());
            if r["engine"] == VARIANT {
                assert_eq!((large, pool_limit), (0, Some(1 << 20)), "{r}");
            } else {
                let (floor, top) = ((4u64 << 20) * 5 / 100, (4u64 << 20) * 5 / 8);
                assert!(large > 0 && pool_limit.is_some_and(|l| l >= floor && l <= top), "{r}");
            }
        }
    }
    assert_eq!(doc["config"]["keys"], keys);
    assert!(took.as_secs() < 60, "a smoke run takes seconds, this one {took:?}");
}

#[test]
fn bad_programs_arguments_are_one_line_and_exit_2() {
    for (args, want) in [
        (vec!["--program", "postgres"], "unknown program 'postgres'"),
        (
            vec!["--engine", "tierswap:policy=fast"],
            "engine 'tierswap:policy=fast': policy 'fast' is not a swap-in policy",
        ),
        (vec!["--engine", "tierswap:polcy=order0"], "unknown setting 'polcy': settings are policy="),
        (vec!["--dataset", "0"], "--dataset"),
        (vec!["--runs", "0"], "--runs"),
    ] {
        let out = Command::new(bin()).args(["bench", "programs"]).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
    }
}
