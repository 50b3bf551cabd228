//! Forked children whose parent goes first: the parent's pager serves a child's missing
//! pages through the child's userfaultfd, which dies with the parent. Before the parent's
//! pager goes (its `Pager` dropped, or the process calling `exit` with the pager still
//! alive), it hands each child every page the child still needs; the child, reading long
//! after its parent is gone, gets every fork-time byte. Both fault modes, both ways out.
//!
//! Each case runs in a process of its own (a fork shares every page of the process with
//! the child for a moment, and the parent must really exit): the test re-runs this binary
//! with one case named in the environment, and reads the grandchild's verdict from a file.

mod common;

use std::ffi::OsStr;
use std::time::{Duration, Instant};

use common::{counter_word, pager, run_alone, PAGE};
use tierswap::{FaultMode, Hint};

const CASE_ENV: &str = "TIERSWAP_CHILDREN_CASE";
const VERDICT_ENV: &str = "TIERSWAP_CHILDREN_VERDICT";

/// Word i of page p (a page of noise for every fourth page, so the pool and the file both
/// hold some: noise does not compress).
fn word(p: usize, i: usize) -> u64 {
    if p % 4 == 3 {
        let mut x = ((p * 512 + i) as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
        x ^= x >> 29;
        x.wrapping_mul(0xBF58_476D_1CE4_E5B9)
    } else {
        counter_word(p, i, 77)
    }
}

/// How the parent leaves.
#[derive(Clone, Copy)]
enum Exit {
    /// Drops its pager and region, then returns (the process exits).
    Drop,
    /// Keeps them (as the LD_PRELOAD shim does) and calls `exit`.
    Exit,
}

/// Runs `case` in a process of its own and returns what its child wrote at the end.
fn run_case(case: &str) -> String {
    let verdict = std::env::temp_dir().join(format!("tierswap-children-{}-{case}", std::process::id()));
    let _ = std::fs::remove_file(&verdict);
    let (out, stdout, stderr) = run_alone(case, &[(CASE_ENV, OsStr::new(case)), (VERDICT_ENV, verdict.as_os_str())]);
    assert!(out.status.success(), "the parent process failed: {:?}\n{stdout}\n{stderr}", out.status);
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        if let Ok(v) = std::fs::read_to_string(&verdict) {
            if v.ends_with('\n') {
                let _ = std::fs::remove_file(&verdict);
                return v;
            }
        }
        assert!(Instant::now() < deadline, "the child never reported (a hang?)\n{stdout}\n{stderr}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The parent: fills 1024 pages (4 MiB) under an 8 MiB budget, sends them all out, reads
/// 64 back clean, forks, and leaves at once. The child waits until its parent is gone,
/// then reads every page, writes each, and reports how many pages were wrong.
fn parent(mode: FaultMode, tiers: &str, exit: Exit) {
    let n = 1024;
    let p = pager(8 << 20, tiers, mode, 1);
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        for (i, w) in r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE].chunks_exact_mut(8).enumerate() {
            w.copy_from_slice(&word(pg, i).to_le_bytes());
        }
    }
    p.evict_all();
    let mut sum = 0u64;
    for pg in 0..64 {
        sum = sum.wrapping_add(r.as_slice()[pg * PAGE] as u64);
    }
    std::hint::black_box(sum);
    let verdict = std::env::var(VERDICT_ENV).unwrap();
    let parent_pid = std::process::id() as i32;
    let base = r.as_ptr() as usize;
    // SAFETY: the child waits for its parent to go, then reads and writes memory, writes one
    // file and calls _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0);
    if pid == 0 {
        // SAFETY: getppid has no preconditions.
        while unsafe { libc::getppid() } == parent_pid {
            std::thread::sleep(Duration::from_millis(5));
        }
        let mut bad = 0;
        for pg in 0..n {
            // SAFETY: the child's copy of the region, mapped for its whole length.
            let page = unsafe { std::slice::from_raw_parts((base + pg * PAGE) as *const u8, PAGE) };
            if page.chunks_exact(8).enumerate().any(|(i, w)| w != word(pg, i).to_le_bytes()) {
                bad += 1;
            }
            // SAFETY: as above; the child's own page.
            unsafe { std::ptr::write_volatile((base + pg * PAGE) as *mut u64, !word(pg, 0)) };
        }
        let _ = std::fs::write(&verdict, format!("bad pages {bad} of {n}\n"));
        // SAFETY: ends the child at once.
        unsafe { libc::_exit(0) };
    }
    match exit {
        Exit::Drop => {
            drop(r);
            drop(p);
        }
        Exit::Exit => {
            std::mem::forget(r);
            std::mem::forget(p);
            std::process::exit(0);
        }
    }
}

fn case(name: &str, mode: FaultMode, tiers: &str, exit: Exit) {
    if std::env::var(CASE_ENV).as_deref() == Ok(name) {
        return parent(mode, tiers, exit);
    }
    let v = run_case(name);
    assert_eq!(v, "bad pages 0 of 1024\n", "every page the child read after its parent had gone was as at the fork");
}

#[test]
fn a_child_reads_its_pages_after_the_parent_dropped_its_pager() {
    case("a_child_reads_its_pages_after_the_parent_dropped_its_pager", FaultMode::Thread, "zero,pool,file", Exit::Drop);
}

#[test]
fn a_child_reads_its_pages_after_the_parent_called_exit() {
    case("a_child_reads_its_pages_after_the_parent_called_exit", FaultMode::Thread, "zero,pool,file", Exit::Exit);
}

#[test]
fn a_signal_mode_child_reads_its_pages_after_the_parent_dropped_its_pager() {
    case(
        "a_signal_mode_child_reads_its_pages_after_the_parent_dropped_its_pager",
        FaultMode::Signal,
        "zero,pool,file",
        Exit::Drop,
    );
}

#[test]
fn a_signal_mode_child_reads_its_pages_after_the_parent_called_exit() {
    case(
        "a_signal_mode_child_reads_its_pages_after_the_parent_called_exit",
        FaultMode::Signal,
        "zero,pool",
        Exit::Exit,
    );
}
