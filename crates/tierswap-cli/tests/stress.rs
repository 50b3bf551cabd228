//! `tierswap bench --workload stress`: 20 s with 4 threads, with every fault injection kind
//! and without any (and with the program's madvise/mremap/munmap). Every byte read is compared with the stress model inside the binary;
//! here we check its report: no wrong byte, no hang, every SIGBUS a page the engine logged
//! as poisoned (and the other way round), every injection seen in the engine's counters,
//! and every path of the engine exercised. Also: the watchdog ends a stuck run with exit 3,
//! and bad stress flags are one-line errors.

use std::path::PathBuf;
use std::process::{Command, Output};

use serde_json::Value;

fn tierswap(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tierswap")).args(args).output().expect("run tierswap")
}

fn json_path(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("tierswap-stress-test-{}-{name}.json", std::process::id()))
}

/// Runs a stress and returns (exit code, report, stdout + stderr).
fn stress(name: &str, extra: &[&str]) -> (Option<i32>, Value, String) {
    let path = json_path(name);
    let mut args = vec!["bench", "--workload", "stress", "--quiet", "--json", path.to_str().unwrap()];
    args.extend_from_slice(extra);
    let out = tierswap(&args);
    let text = format!("{}\n{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    let report: Value = serde_json::from_str(
        &std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{name}: no report ({e}):\n{text}")),
    )
    .unwrap();
    let _ = std::fs::remove_file(&path);
    (out.status.code(), report, text)
}

fn n(v: &Value, key: &str) -> u64 {
    v[key].as_u64().unwrap_or_else(|| panic!("{key} missing in {v}"))
}

fn counter(v: &Value, key: &str) -> u64 {
    n(&v["counters"], key)
}

fn injected(v: &Value, kind: &str) -> u64 {
    v["injected"].as_array().unwrap().iter().find(|k| k["kind"] == kind).map_or(0, |k| n(k, "injected"))
}

/// Which swap-in policy a stress run used: it decides which of two paths runs for sure.
#[derive(Clone, Copy, PartialEq)]
enum Policy {
    /// The default: large swap-in runs; readahead only past a faulting 64 KiB block, which
    /// the stress's small regions rarely reach, so it is not required.
    Locality,
    /// `--policy order0`: one page per fault, so no large swap-in, and readahead on every
    /// disk stream.
    Order0,
}

/// What holds for every stress run: nothing wrong, nothing hung, every op and every path of
/// the engine exercised (stride prefetch included: one read in eight walks a stride; large
/// swap-in or readahead, as the policy decides).
fn check_common(v: &Value, text: &str, policy: Policy) {
    assert_eq!(n(v, "mismatches"), 0, "no page came back wrong: {:?}\n{text}", v["mismatch_examples"]);
    assert_eq!(n(v, "hangs"), 0, "{text}");
    assert_eq!(v["accounted"], true, "{text}");
    assert!(v["sigbus_unlogged"].as_array().unwrap().is_empty(), "{text}");
    assert!(v["logged_not_seen"].as_array().unwrap().is_empty(), "{text}");
    assert_eq!(n(v, "sigbus_pages"), n(v, "poison_logged"), "one SIGBUS page per logged poisoning: {text}");
    assert_eq!(n(v, "threads"), 4);
    assert!(v["duration_s"].as_f64().unwrap() >= 20.0, "{text}");
    for op in ["read", "write", "create", "destroy", "detached", "evict", "stage", "drain"] {
        assert!(n(&v["ops"], op) > 0, "op {op} ran: {text}");
    }
    assert!(n(v, "pages_verified") > 10_000, "{text}");
    assert!(n(v, "pages_written") > 10_000, "{text}");
    assert!(n(v, "regions_destroyed") > 10, "{text}");
    for c in [
        "zswpout",
        "zswpin",
        "pswpout",
        "pswpin",
        "zswpwb",
        "pgdeactivate",
        "pgactivate",
        "swpout_zero",
        "swpout_samefill",
        "pool_reject_incompressible",
        "swap_prefetch",
    ] {
        assert!(counter(v, c) > 0, "the engine's {c} path ran: {text}");
    }
    match policy {
        Policy::Locality => assert!(counter(v, "swpin_large") > 0, "the large swap-in path ran: {text}"),
        Policy::Order0 => {
            assert_eq!(counter(v, "swpin_large"), 0, "order0 swaps in one page per fault: {text}");
            assert!(counter(v, "swap_ra") > 0, "the readahead path ran: {text}");
            assert!(counter(v, "swap_ra_hit") > 0, "read-ahead pages were used: {text}");
        }
    }
}

#[test]
fn stress_with_every_fault_kind_loses_nothing() {
    let (code, v, text) = stress("inject", &["--threads", "4", "--duration", "20s", "--inject", "all", "--seed", "7"]);
    assert_eq!(code, Some(0), "{text}");
    check_common(&v, &text, Policy::Locality);
    let kinds: Vec<&str> = v["injected"].as_array().unwrap().iter().map(|k| k["kind"].as_str().unwrap()).collect();
    assert_eq!(kinds.len(), 11, "every kind has a rule: {kinds:?}");
    for k in &kinds {
        assert!(injected(&v, k) > 0, "{k} was injected: {text}");
    }
    let acc = v["accounting"].as_array().unwrap();
    assert_eq!(acc.len(), 11);
    assert!(acc.iter().all(|a| a["ok"] == true), "{text}");
    // The accounting, checked again from the raw numbers.
    assert_eq!(
        counter(&v, "writeback_errors"),
        injected(&v, "file_write_eio") + injected(&v, "file_write_enospc"),
        "every failed write counted: {text}"
    );
    assert_eq!(counter(&v, "read_errors"), injected(&v, "file_read_eio"), "every failed read counted: {text}");
    assert_eq!(counter(&v, "checksum_errors"), 0, "no record fails authentication: {text}");
    assert!(counter(&v, "pool_reject_incompressible") >= injected(&v, "compress_fail"), "{text}");
    let (io, corrupt) = (n(&v, "poison_logged_io"), n(&v, "poison_logged_corrupt"));
    assert!(io > 0 && io <= injected(&v, "file_read_eio"), "read errors give SIGBUS, no more: {text}");
    assert!(corrupt > 0 && corrupt <= injected(&v, "compress_garbage"), "garbage gives SIGBUS, no more: {text}");
    assert_eq!(n(&v, "sigbus_pages"), io + corrupt, "{text}");
    assert!(n(&v, "sigbus_repeat") > 0, "poisoned pages stay poisoned: {text}");
}

/// Signal mode (faults served in the faulting thread's SIGBUS handler, reclaim helpers
/// evicting for faults that wait) under every fault kind and the program's own madvise /
/// mremap / munmap: nothing lost, nothing hung, and the SIGBUS pages exactly the logged
/// poisonings. While a poisoned page's SIGBUS was taken for a fault, it hung within a
/// second. The other bug it found, a page poisoned while a REMOVE in hand discarded
/// it (RELIABILITY.md), showed 1–2 times per 30 s run: 15 s here passed once without
/// that fix, so this catches it only sometimes.
#[test]
fn stress_in_signal_mode_loses_nothing() {
    let (code, v, text) = stress(
        "signal",
        &[
            "--threads",
            "4",
            "--duration",
            "15s",
            "--inject",
            "all",
            "--ops",
            "all",
            "--seed",
            "5",
            "--fault-mode",
            "signal",
        ],
    );
    assert_eq!(code, Some(0), "{text}");
    assert_eq!(n(&v, "mismatches"), 0, "no page came back wrong: {:?}\n{text}", v["mismatch_examples"]);
    assert_eq!(n(&v, "hangs"), 0, "{text}");
    assert_eq!(v["accounted"], true, "{text}");
    assert!(v["sigbus_unlogged"].as_array().unwrap().is_empty(), "{text}");
    assert!(v["logged_not_seen"].as_array().unwrap().is_empty(), "{text}");
    assert_eq!(n(&v, "sigbus_pages"), n(&v, "poison_logged"), "one SIGBUS page per logged poisoning: {text}");
    assert!(n(&v, "poison_logged_corrupt") > 0, "corrupt objects gave SIGBUS: {text}");
    assert!(n(&v, "pages_verified") > 5_000, "{text}");
    for c in ["faults_in_thread", "pgsteal_direct", "zswpin", "pswpin", "event_remove"] {
        assert!(counter(&v, c) > 0, "the engine's {c} path ran: {text}");
    }
}

#[test]
fn stress_without_injection_is_exact() {
    let (code, v, text) =
        stress("plain", &["--threads", "4", "--duration", "20s", "--seed", "3", "--policy", "order0"]);
    assert_eq!(code, Some(0), "{text}");
    check_common(&v, &text, Policy::Order0);
    assert!(v["injected"].as_array().unwrap().is_empty(), "{text}");
    assert_eq!(n(&v, "sigbus_pages"), 0, "no SIGBUS without a failure: {text}");
    assert_eq!(n(&v, "poison_logged"), 0, "{text}");
    for c in ["read_errors", "writeback_errors", "checksum_errors"] {
        assert_eq!(counter(&v, c), 0, "{c}: {text}");
    }
    assert!(n(&v, "drain_moved") > 0, "drain moved pages off the file: {text}");
}

/// Every op, the program's madvise(DONTNEED) / mremap / munmap of managed memory included,
/// with direct reclaim on.
/// (This hung within minutes while the engine moved discarded ranges with hole-allowing
/// UFFDIO_MOVEs; the watchdog would end such a run with exit 3.)
#[test]
fn stress_with_program_events_is_exact() {
    // With direct reclaim: fault threads evict beside the reclaim thread while the program's
    // munmap and mremap tear regions down under them.
    let (code, v, text) = stress("events", &["--threads", "4", "--duration", "20s", "--seed", "5", "--ops", "all"]);
    assert_eq!(code, Some(0), "{text}");
    check_common(&v, &text, Policy::Locality);
    assert!(counter(&v, "pgsteal_direct") > 0, "fault threads evicted too: {text}");
    for op in ["dontneed", "mremap", "munmap"] {
        assert!(n(&v["ops"], op) > 0, "op {op} ran: {text}");
    }
    for c in ["event_remove", "event_remap", "event_unmap"] {
        assert!(counter(&v, c) > 0, "the engine followed {c}: {text}");
    }
}

#[test]
fn a_stuck_fault_is_a_hang_exit_3() {
    // Every 20th fault stalls 30 s: some worker waits far longer than the 1 s watchdog.
    let (code, v, text) = stress(
        "hang",
        &["--threads", "2", "--duration", "20s", "--watchdog", "1s", "--inject", "fault_stall:30s@1/20"],
    );
    assert_eq!(code, Some(3), "{text}");
    assert_eq!(n(&v, "hangs"), 1, "{text}");
    let hang = v["hang"].as_str().unwrap();
    assert!(hang.contains("worker") && hang.contains("no progress for 1 s"), "{hang}");
    assert!(text.contains("HANG: worker"), "{text}");
    assert!(v["duration_s"].as_f64().unwrap() < 15.0, "ended by the watchdog: {text}");
}

#[test]
fn bad_stress_flags_are_one_line_exit_2() {
    for (args, needle) in [
        (&["bench", "--workload", "stress", "--ops", "read,frob"][..], "unknown op 'frob'"),
        (&["bench", "--workload", "stress", "--ops", "write,create"], "needs read"),
        (&["bench", "--workload", "stress", "--duration", "soon"], "cannot parse duration 'soon'"),
        (&["bench", "--workload", "stress", "--inject", "pool_alloc:2/1"], "--inject"),
        (&["bench", "--workload", "stress,seq64"], "stress runs alone"),
        (&["bench", "--workload", "stress", "--engine", "kernel-zswap"], "one tierswap engine"),
        (&["bench", "--workload", "stress", "--engine", "tierswap,tierswap:batch-release"], "one tierswap engine"),
        (&["bench", "--workload", "seq64", "--duration", "10s"], "--duration is for --workload stress"),
        (&["bench", "--workload", "seq64", "--inject", "all"], "--inject is for --workload stress"),
    ] {
        let out = tierswap(args);
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: expected '{needle}' in: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{args:?}: one line: {err}");
    }
}
