//! What the engine's integration tests share: starting a pager, the page contents they write
//! and check byte for byte, running a test again in a process of its own, waiting on the
//! pager's stats, and a lock for tests that must not overlap. Each test binary compiles its
//! own copy (`mod common;`) and uses what it needs.

#![allow(dead_code)]

use std::ffi::OsStr;
use std::process::{Command, Output};
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tierswap::{FaultMode, Hint, Pager, PagerConfig, Region, Stats, Tiers};

/// Bytes in a page.
pub const PAGE: usize = 4096;

// ---------------------------------------------------------------------------------------
// Pagers

/// A config with `budget_bytes`, `tiers` (as in `zero,pool,file`), `fault_mode` and
/// `fault_threads` (0: one per CPU, `PagerConfig`'s default), every other field at its
/// default; a test sets more by struct update: `PagerConfig { keep_clean: false, ..config(...) }`.
pub fn config(budget_bytes: u64, tiers: &str, fault_mode: FaultMode, fault_threads: usize) -> PagerConfig {
    PagerConfig {
        budget_bytes,
        tiers: tiers.parse::<Tiers>().unwrap_or_else(|e| panic!("tiers {tiers:?}: {e}")),
        fault_mode,
        fault_threads,
        ..Default::default()
    }
}

/// A pager on `config`; one that cannot start fails the test saying what it needs.
pub fn start(config: PagerConfig) -> Pager {
    match Pager::new(config) {
        Ok(p) => p,
        Err(e) => panic!("cannot start a pager (these tests need userfaultfd: run as root): {e}"),
    }
}

/// A pager on [`config`]`(budget_bytes, tiers, fault_mode, fault_threads)`.
pub fn pager(budget_bytes: u64, tiers: &str, fault_mode: FaultMode, fault_threads: usize) -> Pager {
    start(config(budget_bytes, tiers, fault_mode, fault_threads))
}

// ---------------------------------------------------------------------------------------
// Page contents

/// Word `i` of counter page `p` for `salt`: `p * 512 + i + salt`, compressible and unique
/// per page (and per salt, for pages rewritten with another).
pub fn counter_word(p: usize, i: usize, salt: u64) -> u64 {
    (p as u64) * 512 + i as u64 + salt
}

/// Fills `page` with counter page `p` for `salt` ([`counter_word`]).
pub fn fill_page(page: &mut [u8], p: usize, salt: u64) {
    for (i, w) in page.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&counter_word(p, i, salt).to_le_bytes());
    }
}

/// Whether `page` holds counter page `p` for `salt`. Allocates nothing: safe in a forked
/// child of a threaded process.
pub fn page_matches(page: &[u8], p: usize, salt: u64) -> bool {
    page.chunks_exact(8).enumerate().all(|(i, w)| w == counter_word(p, i, salt).to_le_bytes())
}

/// Whether page `p` of `mem` (a mapping's bytes from its first page) holds counter page `p`
/// for `salt`.
pub fn page_matches_at(mem: &[u8], p: usize, salt: u64) -> bool {
    page_matches(&mem[p * PAGE..(p + 1) * PAGE], p, salt)
}

/// Fills `buf` with xorshift64 noise from `seed` (no compressor shrinks it).
pub fn noise_page(buf: &mut [u8], seed: u64) {
    let mut x = noise_start(seed);
    for w in buf.chunks_exact_mut(8) {
        x = xorshift(x);
        w.copy_from_slice(&x.to_le_bytes());
    }
}

/// Whether `buf` holds [`noise_page`]'s noise from `seed`. Allocates nothing.
pub fn noise_matches(buf: &[u8], seed: u64) -> bool {
    let mut x = noise_start(seed);
    buf.chunks_exact(8).all(|w| {
        x = xorshift(x);
        w == x.to_le_bytes()
    })
}

/// The xorshift64 state [`noise_page`] starts from: never zero.
fn noise_start(seed: u64) -> u64 {
    seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1
}

/// One step of xorshift64 (never returns 0 from a state that is not 0).
pub fn xorshift(mut x: u64) -> u64 {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    x
}

/// A region of `n` pages of `p` with `hint`, page `i` filled with counter page `i` for
/// `salt` ([`fill_page`]).
pub fn filled_region(p: &Pager, n: usize, hint: Hint, salt: u64) -> Region {
    let mut r = p.region(n * PAGE, hint).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, salt);
    }
    r
}

// ---------------------------------------------------------------------------------------
// Waiting on the pager

/// The pager's stats once `done` holds of them, or after `secs` seconds.
pub fn stats_when(p: &Pager, secs: u64, done: impl Fn(&Stats) -> bool) -> Stats {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        let st = p.stats();
        if done(&st) || Instant::now() >= deadline {
            return st;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

// ---------------------------------------------------------------------------------------
// A test in a process of its own

/// This test binary again, to run test `name` alone (`--exact`, its output not captured) in
/// a process of its own with `env` set, for the test to see that it is the child.
pub fn rerun_command<V: AsRef<OsStr>>(name: &str, env: &[(&str, V)]) -> Command {
    let mut c = Command::new(std::env::current_exe().unwrap());
    c.args(["--exact", name, "--nocapture", "--test-threads=1"]);
    for (k, v) in env {
        c.env(k, v);
    }
    c
}

/// Runs test `name` alone in a process of its own with `env` set ([`rerun_command`]) and
/// waits for it: its output, and its stdout and stderr as text.
pub fn run_alone<V: AsRef<OsStr>>(name: &str, env: &[(&str, V)]) -> (Output, String, String) {
    let out = rerun_command(name, env).output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    (out, stdout, stderr)
}

// ---------------------------------------------------------------------------------------
// One test at a time

static SERIAL: Mutex<()> = Mutex::new(());

/// Holds off every other test of this binary that takes it (each says why it does) until
/// the guard drops; a test that failed holding it does not fail the others.
pub fn serial() -> MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}
