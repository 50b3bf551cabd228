//! The stress workload: N threads create and destroy many managed regions and
//! read and write random ranges of them while the pager is forced to stage, evict and drain
//! under a tiny budget and pool, so that every path (staging, pool, file, writeback,
//! readahead, large swap-in, drain) runs all the time; optionally with fault injection.
//!
//! Every byte read is compared with a shadow model. The model is small: per page a key, a
//! base version and at most one patch (a word range holding a later version); the bytes of
//! a version are generated from (key, version, word), so nothing is kept but these numbers.
//!
//! Accesses go through probes that survive SIGBUS: a load or store instruction armed with a
//! magic value in a register, which the SIGBUS handler recognises, steps over and marks as
//! failed. So a poisoned page (the engine could not read it back, e.g. an injected read
//! error) is seen by the thread that touched it, in place, without killing the process.
//! The engine logs every page it poisons on stderr; this module taps stderr (a pipe in
//! place of fd 2, forwarded to the real stderr) and checks that the pages that gave SIGBUS
//! are exactly the pages the engine logged, one log line per poisoning.
//!
//! A region is held by one worker at a time (taken from a shared pool and put back), so the
//! model needs no locks per page; evict/stage/drain run from any worker against everyone's
//! pages at once, which is where the races are.
//!
//! A watchdog declares a hang when a worker makes no progress for `watchdog` (default 30 s):
//! it says which worker is stuck where, writes the report and exits with status 3.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufRead, BufReader, Write};
use std::os::fd::FromRawFd;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicU8, AtomicUsize, Ordering::Relaxed};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle, TermLike};
use serde::Serialize;
use tierswap::inject::{self, Kind};
use tierswap::{Hint, Pager, PagerConfig, Region, Tier};

const PAGE: usize = 4096;
const WORDS: usize = PAGE / 8;

/// Something the stress workers do.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    /// Read a random range of a region and compare every word with the model.
    Read,
    /// Write a random range of a region (whole pages or a word range of a page).
    Write,
    /// Create a region with `Pager::region`.
    Create,
    /// Drop a region (library regions; detached ones with `munmap`).
    Destroy,
    /// Create a region with `Pager::map_detached` (memory the program owns).
    Detached,
    /// `Pager::evict_all`: every page out now.
    Evict,
    /// `Pager::stage_all`: every present page to the inactive list.
    Stage,
    /// `Pager::drain(Tier::File)` then `resume`.
    Drain,
    /// `madvise(MADV_DONTNEED)` on a range: the pages read back as zeros.
    Dontneed,
    /// `mremap` a detached region (move, grow or shrink).
    Mremap,
    /// `munmap` a detached region.
    Munmap,
}

impl Op {
    /// Every op, in report order.
    pub const ALL: [Op; 11] = [
        Op::Read,
        Op::Write,
        Op::Create,
        Op::Destroy,
        Op::Detached,
        Op::Evict,
        Op::Stage,
        Op::Drain,
        Op::Dontneed,
        Op::Mremap,
        Op::Munmap,
    ];

    /// The ops on by default: everything but the ones that need the engine to follow the
    /// program's madvise/mremap/munmap (userfaultfd REMOVE/REMAP/UNMAP events).
    pub const DEFAULT: [Op; 8] =
        [Op::Read, Op::Write, Op::Create, Op::Destroy, Op::Detached, Op::Evict, Op::Stage, Op::Drain];

    /// The name in `--ops` and reports.
    pub const fn name(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Write => "write",
            Op::Create => "create",
            Op::Destroy => "destroy",
            Op::Detached => "detached",
            Op::Evict => "evict",
            Op::Stage => "stage",
            Op::Drain => "drain",
            Op::Dontneed => "dontneed",
            Op::Mremap => "mremap",
            Op::Munmap => "munmap",
        }
    }

    fn idx(self) -> usize {
        self as usize
    }
}

/// Parses `--ops`: names comma-separated, or `default`, or `all`.
pub fn parse_ops(s: &str) -> Result<Vec<Op>, StressError> {
    let mut ops = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        match part {
            "all" => ops.extend(Op::ALL),
            "default" => ops.extend(Op::DEFAULT),
            name => ops.push(Op::ALL.into_iter().find(|o| o.name() == name).ok_or_else(|| {
                StressError::Ops(format!(
                    "unknown op '{name}': ops are {}, or default, or all",
                    Op::ALL.iter().map(|o| o.name()).collect::<Vec<_>>().join(", ")
                ))
            })?),
        }
    }
    ops.sort();
    ops.dedup();
    if !ops.contains(&Op::Read) {
        return Err(StressError::Ops("--ops needs read (nothing would be verified)".into()));
    }
    if !ops.contains(&Op::Create) {
        return Err(StressError::Ops("--ops needs create (there would be no region)".into()));
    }
    Ok(ops)
}

/// Parses a duration: `500ms`, `20s`, `10m`, `1h`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<Duration, StressError> {
    let t = s.trim();
    let bad = || StressError::Duration(s.to_string());
    let (digits, unit_ms) = if let Some(d) = t.strip_suffix("ms") {
        (d, 1)
    } else if let Some(d) = t.strip_suffix('s') {
        (d, 1000)
    } else if let Some(d) = t.strip_suffix('m') {
        (d, 60_000)
    } else if let Some(d) = t.strip_suffix('h') {
        (d, 3_600_000)
    } else {
        (t, 1000)
    };
    let n: u64 = digits.trim().parse().map_err(|_| bad())?;
    let ms = n.checked_mul(unit_ms).ok_or_else(bad)?;
    if ms == 0 {
        return Err(bad());
    }
    Ok(Duration::from_millis(ms))
}

/// `--inject all`: every kind at once, at rates that leave the run mostly working.
pub const INJECT_ALL: &str = "pool_alloc:1/10,compress_fail:1/10,compress_garbage:1/500,file_write_short:1/4,\
file_write_eio:1/20,file_write_enospc:1/20,file_read_short:1/4,file_read_eio:1/200,read_slow:1ms@1/50,\
write_slow:1ms@1/50,fault_stall:1ms@1/200";

/// `--inject recoverable`: every kind that must end in a correct page (no read error, no
/// garbage object: nothing that poisons a page), at the rates of [`INJECT_ALL`].
pub const INJECT_RECOVERABLE: &str = "pool_alloc:1/10,compress_fail:1/10,file_write_short:1/4,\
file_write_eio:1/20,file_write_enospc:1/20,file_read_short:1/4,read_slow:1ms@1/50,write_slow:1ms@1/50,\
fault_stall:1ms@1/200";

/// A stress run that cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StressError {
    /// `--ops` did not parse or leaves out something needed.
    #[error("{0}")]
    Ops(String),
    /// A duration did not parse.
    #[error("cannot parse duration '{0}': use a number with ms, s, m or h, e.g. 10m")]
    Duration(String),
    /// `--inject` without the hooks built in.
    #[error("--inject needs a tierswap built with fault injection: cargo build --release -p tierswap-cli --features fault-injection")]
    NotBuilt,
    /// `--inject` did not parse.
    #[error("--inject: {0}")]
    Inject(#[from] inject::InjectError),
    /// The pager did not start.
    #[error("cannot start the pager: {0}")]
    Pager(#[from] tierswap::Error),
    /// The probes exist for x86-64 only.
    #[error("the stress workload's SIGBUS-safe probes exist only on x86-64")]
    Arch,
    /// Setting up the stderr tap or the signal handler failed.
    #[error("stress setup: {0}")]
    Setup(String),
}

/// What to run.
#[derive(Clone, Debug)]
pub struct StressSpec {
    /// The engine's name: `tierswap`, or the variant whose settings `pager` has.
    pub engine: String,
    /// Worker threads.
    pub threads: usize,
    /// How long.
    pub duration: Duration,
    /// Ops on.
    pub ops: Vec<Op>,
    /// Fault injection plan, if any.
    pub inject: Option<inject::Spec>,
    /// Seed of the workers' choices (and of the injection plan when it names none).
    pub seed: u64,
    /// The pager's configuration (a tiny budget and pool make every path run).
    pub pager: PagerConfig,
    /// Live managed memory the workers aim at, bytes.
    pub mem_bytes: u64,
    /// No progress by a worker for this long is a hang.
    pub watchdog: Duration,
    /// Show a progress bar (on a terminal).
    pub progress: bool,
    /// Write the report as JSON here.
    pub json: Option<PathBuf>,
    /// Also write the engine's log lines here (repeats of one "staging … failed" line per
    /// address left out).
    pub engine_log: Option<PathBuf>,
}

/// An injected kind and what the run saw of its consequences.
#[derive(Clone, Debug, Serialize)]
pub struct Accounting {
    /// The kind.
    pub kind: String,
    /// Hook calls with a rule.
    pub calls: u64,
    /// Injections.
    pub injected: u64,
    /// How it ended, in words (the counters that show it).
    pub evidence: String,
    /// Whether the evidence matches the injections.
    pub ok: bool,
}

/// What a stress run did and saw. Field names are the JSON `--json` writes.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StressReport {
    /// The engine (`tierswap` or a variant's name).
    pub engine: String,
    /// Workers.
    pub threads: usize,
    /// Seconds run.
    pub duration_s: f64,
    /// The seed.
    pub seed: u64,
    /// Ops on.
    pub ops_enabled: Vec<String>,
    /// The injection plan (spec string), if any.
    pub inject: Option<String>,
    /// The pager's configuration.
    pub pager: serde_json::Value,
    /// Ops done by kind.
    pub ops: BTreeMap<String, u64>,
    /// Ops done in all.
    pub ops_total: u64,
    /// Page reads whose every word in the read range was compared with the model.
    pub pages_verified: u64,
    /// Bytes compared.
    pub bytes_verified: u64,
    /// Pages written (whole or a word range).
    pub pages_written: u64,
    /// Reads done on a region other workers may be reading at the same time.
    pub shared_reads: u64,
    /// Regions created (library and detached).
    pub regions_created: u64,
    /// Regions dropped or unmapped.
    pub regions_destroyed: u64,
    /// Drains: pages moved off the file, and records left unreadable.
    pub drain_moved: u64,
    /// See `drain_moved`.
    pub drain_unreadable: u64,
    /// Page reads that found a wrong word, plus accesses that returned data from a page that
    /// had given SIGBUS before (a poisoned page must stay poisoned).
    pub mismatches: u64,
    /// The first few mismatches, described.
    pub mismatch_examples: Vec<String>,
    /// Pages that gave SIGBUS (first access after each poisoning).
    pub sigbus_pages: u64,
    /// Later accesses to poisoned pages that gave SIGBUS again, as they must.
    pub sigbus_repeat: u64,
    /// Poisoned pages that later did not give SIGBUS (read or written normally): counted in
    /// `mismatches` too.
    pub poison_lifted: u64,
    /// Pages the engine logged as poisoned ("cannot be read back … SIGBUS").
    pub poison_logged: u64,
    /// Of those, for a read error.
    pub poison_logged_io: u64,
    /// Of those, for corrupt data (a record or object that does not decode).
    pub poison_logged_corrupt: u64,
    /// Pages that gave SIGBUS without a log line (must be empty).
    pub sigbus_unlogged: Vec<String>,
    /// Pages logged as poisoned whose SIGBUS no access saw (must be empty).
    pub logged_not_seen: Vec<String>,
    /// Injections per kind.
    pub injected: Vec<inject::KindReport>,
    /// Each injected kind against what the run saw.
    pub accounting: Vec<Accounting>,
    /// Every injected fault accounted for, every SIGBUS logged.
    pub accounted: bool,
    /// Hangs (0 or 1: the watchdog ends the run at the first).
    pub hangs: u64,
    /// The hang, described.
    pub hang: Option<String>,
    /// The engine's counters at the end.
    pub counters: BTreeMap<String, u64>,
    /// Engine log lines seen on stderr, and how many were not shown.
    pub engine_log_lines: u64,
    /// See `engine_log_lines`.
    pub engine_log_suppressed: u64,
    /// Engine lines reporting an internal error (a broken invariant the engine survived):
    /// any fails the run.
    pub engine_internal_errors: u64,
}

impl StressReport {
    /// Whether the run passed: no mismatch, no hang, everything accounted for.
    pub fn passed(&self) -> bool {
        self.mismatches == 0 && self.hangs == 0 && self.accounted && self.engine_internal_errors == 0
    }

    /// The exit status: 0 passed, 3 hang, 1 anything else.
    pub fn exit_code(&self) -> u8 {
        if self.hangs > 0 {
            3
        } else if self.passed() {
            0
        } else {
            1
        }
    }

    /// The report as text.
    pub fn text(&self) -> String {
        use std::fmt::Write as _;
        let mut t = String::new();
        let c = |k: &str| self.counters.get(k).copied().unwrap_or(0);
        let _ = writeln!(
            t,
            "stress: {}, {} threads, {:.0} s, seed {}, ops {}",
            self.engine,
            self.threads,
            self.duration_s,
            self.seed,
            self.ops_enabled.join(",")
        );
        let _ = writeln!(t, "injection: {}", self.inject.as_deref().unwrap_or("none"));
        let ops: Vec<String> = self.ops.iter().map(|(k, v)| format!("{k} {v}")).collect();
        let _ = writeln!(t, "operations: {} ({})", self.ops_total, ops.join(", "));
        let _ = writeln!(
            t,
            "pages verified: {} ({} MiB compared), pages written: {}, shared reads {}, regions created {} / destroyed {}",
            self.pages_verified,
            self.bytes_verified >> 20,
            self.pages_written,
            self.shared_reads,
            self.regions_created,
            self.regions_destroyed
        );
        if !self.injected.is_empty() {
            let k: Vec<String> =
                self.injected.iter().map(|k| format!("{} {}/{}", k.kind, k.injected, k.calls)).collect();
            let _ = writeln!(t, "faults injected (injected/calls): {}", k.join(", "));
        }
        for a in &self.accounting {
            let _ =
                writeln!(t, "  {:<18} {:>7}  {}  {}", a.kind, a.injected, if a.ok { "ok " } else { "BAD" }, a.evidence);
        }
        let _ = writeln!(
            t,
            "SIGBUS: {} pages (+{} repeated), engine logged {} (read error {}, corrupt {}); unlogged {}, logged but not seen {}",
            self.sigbus_pages,
            self.sigbus_repeat,
            self.poison_logged,
            self.poison_logged_io,
            self.poison_logged_corrupt,
            self.sigbus_unlogged.len(),
            self.logged_not_seen.len()
        );
        let _ = writeln!(
            t,
            "engine: faults {}, pool out {} in {}, file out {} in {}, writeback {}, readahead {} (hit {}), stride prefetch {} (hit {}), large swap-ins {}, staged {} / reactivated {}, drained {} pages, throttled {}",
            c("faults"),
            c("zswpout"),
            c("zswpin"),
            c("pswpout"),
            c("pswpin"),
            c("zswpwb"),
            c("swap_ra"),
            c("swap_ra_hit"),
            c("swap_prefetch"),
            c("swap_prefetch_hit"),
            c("swpin_large"),
            c("pgdeactivate"),
            c("pgactivate"),
            self.drain_moved,
            c("throttled_faults"),
        );
        let _ = writeln!(
            t,
            "engine events: unmap {}, remap {} (displaced {}), remove {}, stale faults {}, uncounted moves {}",
            c("event_unmap"),
            c("event_remap"),
            c("remap_displaced"),
            c("event_remove"),
            c("faults_stale"),
            c("move_uncounted"),
        );
        let _ = writeln!(t, "engine log: {} lines ({} not shown)", self.engine_log_lines, self.engine_log_suppressed);
        for m in &self.mismatch_examples {
            let _ = writeln!(t, "  mismatch: {m}");
        }
        for m in self.sigbus_unlogged.iter().take(10) {
            let _ = writeln!(t, "  SIGBUS without a log line: {m}");
        }
        for m in self.logged_not_seen.iter().take(10) {
            let _ = writeln!(t, "  logged poisoned, no SIGBUS seen: {m}");
        }
        if let Some(h) = &self.hang {
            let _ = writeln!(t, "HANG: {h}");
        }
        let _ = writeln!(
            t,
            "mismatches: {} (poisoned pages that stopped giving SIGBUS: {}), hangs: {}, accounted: {}, internal errors: {} => {}",
            self.mismatches,
            self.poison_lifted,
            self.hangs,
            if self.accounted { "yes" } else { "NO" },
            self.engine_internal_errors,
            if self.passed() { "PASS" } else { "FAIL" }
        );
        t
    }
}

// ---------------------------------------------------------------------------------------
// Randomness and page contents.

fn mix(mut x: u64) -> u64 {
    // splitmix64's finaliser.
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// splitmix64.
struct Rng(u64);

impl Rng {
    fn new(seed: u64) -> Rng {
        Rng(mix(seed ^ 0x7469_6572_7377_6170))
    }
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        mix(self.0)
    }
    /// Uniform in 0..n (n ≥ 1).
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
    /// Uniform in lo..=hi.
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo + 1)
    }
    fn chance(&mut self, num: u64, den: u64) -> bool {
        self.next() % den < num
    }
}

/// Word `i` of version `ver` of the page with key `key`. Version 0 is the zero page; other
/// versions are, by a hash of (key, ver): zero (1/8), one repeated byte or word (1/8),
/// incompressible (1/8), or compressible (5/8).
fn gen_word(key: u64, ver: u32, i: usize) -> u64 {
    if ver == 0 {
        return 0;
    }
    let h = mix(key.wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ((ver as u64) << 1 | 1));
    match h % 8 {
        0 => 0,
        // A repeated byte (fits a same-filled swap entry) or a repeated word (may not).
        1 if h & 0x100 != 0 => 0x0101_0101_0101_0101u64.wrapping_mul((h >> 16) & 0xff | 1),
        1 => h | 1,
        2 => mix(h ^ i as u64),
        _ => (h << 16) ^ (i as u64 / 4),
    }
}

/// One page of the shadow model: version `base` everywhere except words `lo..hi`, which hold
/// version `patch`. (Whether the page is poisoned is kept beside, in atomics, because
/// readers sharing a region mark it.)
#[derive(Clone, Copy, Debug, Default)]
struct PageModel {
    key: u64,
    base: u32,
    patch: u32,
    lo: u16,
    hi: u16,
}

impl PageModel {
    fn fresh(key: u64) -> PageModel {
        PageModel { key, ..Default::default() }
    }
    fn expected(&self, i: usize) -> u64 {
        let ver = if (self.lo as usize..self.hi as usize).contains(&i) { self.patch } else { self.base };
        gen_word(self.key, ver, i)
    }
}

// ---------------------------------------------------------------------------------------
// Probes: one load or store that reports SIGBUS instead of dying of it (x86-64).

/// `mov rax, qword ptr [rdi]`.
const LOAD: [u8; 3] = [0x48, 0x8b, 0x07];
/// `mov qword ptr [rdi], rsi`.
const STORE: [u8; 3] = [0x48, 0x89, 0x37];
/// In rdx while a probe's instruction runs: tells the handler the fault is a probe's.
const ARMED: u64 = 0x7473_2d70_726f_6265;
/// Put in rdx by the handler: the probe's access got SIGBUS.
const FAILED: u64 = 0x7473_2d66_6169_6c64;

#[cfg(target_arch = "x86_64")]
extern "C" fn on_sigbus(_sig: i32, _info: *mut libc::siginfo_t, ctx: *mut libc::c_void) {
    // SAFETY: the kernel passes a ucontext_t for an SA_SIGINFO handler; we read the
    // interrupted instruction (mapped code: it just ran) and change only the interrupted
    // thread's saved registers.
    unsafe {
        let uc = &mut *(ctx as *mut libc::ucontext_t);
        let g = &mut uc.uc_mcontext.gregs;
        if g[libc::REG_RDX as usize] as u64 == ARMED {
            let insn = std::ptr::read(g[libc::REG_RIP as usize] as usize as *const [u8; 3]);
            if insn == LOAD || insn == STORE {
                g[libc::REG_RIP as usize] += 3;
                g[libc::REG_RDX as usize] = FAILED as i64;
                return;
            }
        }
        // Not a probe: die of SIGBUS as usual (the instruction faults again on return).
        libc::signal(libc::SIGBUS, libc::SIG_DFL);
    }
}

#[cfg(target_arch = "x86_64")]
fn install_probe_handler() -> Result<(), StressError> {
    // SAFETY: a zeroed sigaction with an SA_SIGINFO handler of the right type.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as extern "C" fn(i32, *mut libc::siginfo_t, *mut libc::c_void) as usize;
        sa.sa_flags = libc::SA_SIGINFO;
        libc::sigemptyset(&mut sa.sa_mask);
        if libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()) != 0 {
            return Err(StressError::Setup(format!("sigaction(SIGBUS): {}", std::io::Error::last_os_error())));
        }
    }
    Ok(())
}

#[cfg(not(target_arch = "x86_64"))]
fn install_probe_handler() -> Result<(), StressError> {
    Err(StressError::Arch)
}

/// Loads the word at `p`; `None` if the access got SIGBUS.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn probe_load(p: *const u64) -> Option<u64> {
    let v: u64;
    let tag: u64;
    // SAFETY: `p` is an aligned word of a mapping the caller holds; a SIGBUS on it is turned
    // into tag = FAILED by the handler, which skips exactly this 3-byte instruction.
    unsafe {
        std::arch::asm!(
            "mov rax, qword ptr [rdi]",
            in("rdi") p,
            out("rax") v,
            inout("rdx") ARMED => tag,
            options(nostack, preserves_flags),
        );
    }
    (tag != FAILED).then_some(v)
}

/// Stores `v` at `p`; false if the access got SIGBUS.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn probe_store(p: *mut u64, v: u64) -> bool {
    let tag: u64;
    // SAFETY: as for `probe_load`; the handler skips the store.
    unsafe {
        std::arch::asm!(
            "mov qword ptr [rdi], rsi",
            in("rdi") p,
            in("rsi") v,
            inout("rdx") ARMED => tag,
            options(nostack, preserves_flags),
        );
    }
    tag != FAILED
}

#[cfg(not(target_arch = "x86_64"))]
fn probe_load(_p: *const u64) -> Option<u64> {
    unreachable!("refused at start")
}

#[cfg(not(target_arch = "x86_64"))]
fn probe_store(_p: *mut u64, _v: u64) -> bool {
    unreachable!("refused at start")
}

// ---------------------------------------------------------------------------------------
// The stderr tap: fd 2 becomes a pipe read here, forwarded to the real stderr.

/// Printed on stderr at the end: when the tap reads it, every earlier line has been read.
const SENTINEL: &str = "tierswap-stress: end of the engine log";
/// Engine lines shown; the rest are counted.
const SHOWN_ENGINE_LINES: u64 = 20;

struct TapState {
    /// Per page address: poisonings logged minus first SIGBUSes seen.
    balance: Mutex<HashMap<usize, i64>>,
    logged: AtomicU64,
    logged_io: AtomicU64,
    logged_corrupt: AtomicU64,
    lines: AtomicU64,
    suppressed: AtomicU64,
    internal: AtomicU64,
    ended: (Mutex<bool>, Condvar),
    bar: Mutex<Option<ProgressBar>>,
    t0: Instant,
}

impl Default for TapState {
    fn default() -> Self {
        TapState {
            balance: Default::default(),
            logged: Default::default(),
            logged_io: Default::default(),
            logged_corrupt: Default::default(),
            lines: Default::default(),
            suppressed: Default::default(),
            internal: Default::default(),
            ended: Default::default(),
            bar: Default::default(),
            t0: Instant::now(),
        }
    }
}

struct Tap {
    state: Arc<TapState>,
    /// The real stderr.
    orig_fd: i32,
    reader: Option<std::thread::JoinHandle<()>>,
}

/// The page address a poison line names.
fn poisoned_addr(line: &str) -> Option<usize> {
    if !(line.contains("cannot be read back") && line.contains("SIGBUS")) {
        return None;
    }
    let hex = line.split("page at 0x").nth(1)?;
    let end = hex.find(|c: char| !c.is_ascii_hexdigit()).unwrap_or(hex.len());
    usize::from_str_radix(&hex[..end], 16).ok()
}

impl Tap {
    fn start(state: Arc<TapState>, log_path: Option<&PathBuf>) -> Result<Tap, StressError> {
        let mut log = match log_path {
            Some(p) => Some(std::io::BufWriter::new(
                File::create(p).map_err(|e| StressError::Setup(format!("cannot create {}: {e}", p.display())))?,
            )),
            None => None,
        };
        let mut staging_seen = std::collections::HashSet::new();
        let err = |what: &str| StressError::Setup(format!("{what}: {}", std::io::Error::last_os_error()));
        let mut fds = [0i32; 2];
        // SAFETY: pipe2 fills the two fds; fcntl/dup2/close act on fds we own or on fd 2.
        let orig_fd = unsafe {
            if libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) != 0 {
                return Err(err("pipe2"));
            }
            let orig = libc::fcntl(2, libc::F_DUPFD_CLOEXEC, 3);
            if orig < 0 {
                return Err(err("dup of stderr"));
            }
            if libc::dup2(fds[1], 2) < 0 {
                return Err(err("dup2 over stderr"));
            }
            libc::close(fds[1]);
            orig
        };
        arm_abort_drain(fds[0], orig_fd);
        // SAFETY: fds[0] is the pipe's read end, owned by the reader from here on.
        let read_end = unsafe { File::from_raw_fd(fds[0]) };
        // SAFETY: a second descriptor of the real stderr for the reader to write to.
        let out_fd = unsafe { libc::fcntl(orig_fd, libc::F_DUPFD_CLOEXEC, 3) };
        if out_fd < 0 {
            return Err(err("dup of stderr"));
        }
        // SAFETY: out_fd is fresh and owned by the reader.
        let mut out = unsafe { File::from_raw_fd(out_fd) };
        let st = state.clone();
        let reader = std::thread::Builder::new()
            .name("stress-log".into())
            .spawn(move || {
                let mut r = BufReader::new(read_end);
                let mut buf = Vec::new();
                let mut shown = 0;
                loop {
                    buf.clear();
                    match r.read_until(b'\n', &mut buf) {
                        Ok(0) | Err(_) => break,
                        Ok(_) => {}
                    }
                    let line = String::from_utf8_lossy(&buf);
                    let line = line.trim_end_matches('\n');
                    if line == SENTINEL {
                        let (m, cv) = &st.ended;
                        *m.lock().unwrap_or_else(|e| e.into_inner()) = true;
                        cv.notify_all();
                        continue;
                    }
                    let engine = line.starts_with("tierswap: ");
                    if engine {
                        st.lines.fetch_add(1, Relaxed);
                        if line.contains("internal error") {
                            st.internal.fetch_add(1, Relaxed);
                        }
                    }
                    if let Some(addr) = poisoned_addr(line) {
                        st.logged.fetch_add(1, Relaxed);
                        if line.contains("(read error") {
                            st.logged_io.fetch_add(1, Relaxed);
                        } else {
                            st.logged_corrupt.fetch_add(1, Relaxed);
                        }
                        *st.balance.lock().unwrap_or_else(|e| e.into_inner()).entry(addr).or_insert(0) += 1;
                    }
                    if let (true, Some(w)) = (engine, log.as_mut()) {
                        // Reclaim retries a poisoned page's staging over and over: keep the first.
                        let repeat = line.contains("staging pages at") && !staging_seen.insert(line.to_string());
                        if !repeat {
                            let _ = writeln!(w, "{:.3} {line}", st.t0.elapsed().as_secs_f64());
                            // The process may abort any moment: nothing stays in the buffer.
                            let _ = w.flush();
                        }
                    }
                    // A pager giving up (a dead thread, a fatal error) is always shown.
                    let fatal = line.contains("abort")
                        || line.contains("panick")
                        || line.contains("fatal")
                        || line.contains("internal error");
                    if engine && shown >= SHOWN_ENGINE_LINES && !fatal {
                        st.suppressed.fetch_add(1, Relaxed);
                        continue;
                    }
                    if engine {
                        shown += 1;
                    }
                    let bar = st.bar.lock().unwrap_or_else(|e| e.into_inner()).clone();
                    let mut write = || {
                        let _ = writeln!(out, "{line}");
                    };
                    match bar {
                        Some(b) => b.suspend(write),
                        None => write(),
                    }
                }
            })
            .map_err(|e| StressError::Setup(format!("cannot start the log thread: {e}")))?;
        Ok(Tap { state, orig_fd, reader: Some(reader) })
    }

    /// Waits until every line written so far has been read, then gives fd 2 back.
    fn stop(mut self) {
        disarm_abort_drain();
        eprintln!("{SENTINEL}");
        {
            let (m, cv) = &self.state.ended;
            let g = m.lock().unwrap_or_else(|e| e.into_inner());
            let _ = cv.wait_timeout_while(g, Duration::from_secs(30), |ended| !*ended);
        }
        // SAFETY: orig_fd is the real stderr we kept; dup2 puts it back on fd 2, closing the
        // pipe's write end, so the reader sees EOF.
        unsafe {
            libc::dup2(self.orig_fd, 2);
            libc::close(self.orig_fd);
        }
        if let Some(r) = self.reader.take() {
            let _ = r.join();
        }
    }
}

/// While the tap runs: a second descriptor of the pipe's read end (high 32 bits) and the
/// real stderr (low 32 bits), for [`drain_on_abort`]; 0 when unarmed.
static ABORT_DRAIN: AtomicU64 = AtomicU64::new(0);

/// On SIGABRT (the pager's `fatal`, a panic under panic=abort) the engine's last words are
/// in the pipe or on their way through the reader thread, and the process dies before the
/// reader shows them. The handler gives the reader a moment, then copies whatever is still
/// in the pipe to the real stderr itself, and the process ends as it would have.
fn arm_abort_drain(read_fd: i32, orig_fd: i32) {
    // SAFETY: a second descriptor of our pipe's read end, kept for the handler.
    let dup = unsafe { libc::fcntl(read_fd, libc::F_DUPFD_CLOEXEC, 3) };
    if dup < 0 {
        return;
    }
    ABORT_DRAIN.store((dup as u64) << 32 | orig_fd as u32 as u64, Relaxed);
    // SAFETY: installs an async-signal-safe handler (nanosleep, poll, read, write,
    // sigaction, raise only).
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = drain_on_abort as *const () as usize;
        libc::sigemptyset(&mut sa.sa_mask);
        libc::sigaction(libc::SIGABRT, &sa, std::ptr::null_mut());
    }
}

fn disarm_abort_drain() {
    let fds = ABORT_DRAIN.swap(0, Relaxed);
    // SAFETY: back to the default action; then the handler's descriptor is closed.
    unsafe {
        libc::signal(libc::SIGABRT, libc::SIG_DFL);
        if fds != 0 {
            libc::close((fds >> 32) as i32);
        }
    }
}

extern "C" fn drain_on_abort(_sig: libc::c_int) {
    let fds = ABORT_DRAIN.load(Relaxed);
    if fds == 0 {
        return;
    }
    let (read_fd, out_fd) = ((fds >> 32) as i32, fds as u32 as i32);
    // SAFETY: only async-signal-safe calls, on descriptors kept open while armed, into a
    // buffer on this stack.
    unsafe {
        let pause = libc::timespec { tv_sec: 0, tv_nsec: 200_000_000 };
        libc::nanosleep(&pause, std::ptr::null_mut());
        let mut buf = [0u8; 4096];
        loop {
            let mut p = libc::pollfd { fd: read_fd, events: libc::POLLIN, revents: 0 };
            if libc::poll(&mut p, 1, 0) != 1 {
                break;
            }
            let n = libc::read(read_fd, buf.as_mut_ptr() as *mut libc::c_void, buf.len());
            if n <= 0 {
                break;
            }
            libc::write(out_fd, buf.as_ptr() as *const libc::c_void, n as usize);
        }
        // Dies as it would have, once this handler returns (kill -ABRT included).
        let mut dfl: libc::sigaction = std::mem::zeroed();
        dfl.sa_sigaction = libc::SIG_DFL;
        libc::sigaction(libc::SIGABRT, &dfl, std::ptr::null_mut());
        libc::raise(libc::SIGABRT);
    }
}

/// The real stderr as a progress bar's terminal.
#[derive(Debug)]
struct FdTerm {
    out: Mutex<File>,
    fd: i32,
}

impl FdTerm {
    fn put(&self, s: &str) -> std::io::Result<()> {
        self.out.lock().unwrap_or_else(|e| e.into_inner()).write_all(s.as_bytes())
    }
}

impl TermLike for FdTerm {
    fn width(&self) -> u16 {
        // SAFETY: TIOCGWINSZ fills a winsize on our stack.
        unsafe {
            let mut ws: libc::winsize = std::mem::zeroed();
            if libc::ioctl(self.fd, libc::TIOCGWINSZ, &mut ws) == 0 && ws.ws_col > 0 {
                return ws.ws_col;
            }
        }
        80
    }
    fn move_cursor_up(&self, n: usize) -> std::io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.put(&format!("\x1b[{n}A"))
    }
    fn move_cursor_down(&self, n: usize) -> std::io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.put(&format!("\x1b[{n}B"))
    }
    fn move_cursor_right(&self, n: usize) -> std::io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.put(&format!("\x1b[{n}C"))
    }
    fn move_cursor_left(&self, n: usize) -> std::io::Result<()> {
        if n == 0 {
            return Ok(());
        }
        self.put(&format!("\x1b[{n}D"))
    }
    fn write_line(&self, s: &str) -> std::io::Result<()> {
        self.put(&format!("{s}\n"))
    }
    fn write_str(&self, s: &str) -> std::io::Result<()> {
        self.put(s)
    }
    fn clear_line(&self) -> std::io::Result<()> {
        self.put("\r\x1b[2K")
    }
    fn flush(&self) -> std::io::Result<()> {
        self.out.lock().unwrap_or_else(|e| e.into_inner()).flush()
    }
}

// ---------------------------------------------------------------------------------------
// Regions and the shared state.

enum Owner {
    /// A library region: dropping it unmaps it.
    Lib(#[allow(dead_code)] Region),
    /// A `map_detached` mapping: the program (we) unmaps it.
    Detached,
    /// Ended: nothing mapped any more.
    Gone,
}

struct SRegion {
    id: u64,
    base: usize,
    pages: Vec<PageModel>,
    /// Per page: it gave SIGBUS (content unknowable, every access must give SIGBUS again).
    /// The reader that sets it counts the poisoning.
    poison: Vec<AtomicU8>,
    owner: Owner,
    next_ver: u32,
}

// SAFETY: an SRegion is an address range plus its model. Writers hold it alone (taken out
// of the shared pool, behind its RwLock's write lock); readers share it behind the read
// lock and change only the atomic poison flags.
unsafe impl Send for SRegion {}
// SAFETY: as above.
unsafe impl Sync for SRegion {}

/// A page's poison state: it never gave SIGBUS (since its last discard)…
const GOOD: u8 = 0;
/// … it gave SIGBUS, and every access must give SIGBUS again…
const POISONED: u8 = 1;
/// … it gave SIGBUS but later an access did not (counted once, then left alone).
const LIFTED: u8 = 2;

/// A region in the shared pool.
type Slot = Arc<RwLock<SRegion>>;

fn lock_w(slot: &Slot) -> std::sync::RwLockWriteGuard<'_, SRegion> {
    slot.write().unwrap_or_else(|e| e.into_inner())
}

impl SRegion {
    fn len_bytes(&self) -> usize {
        self.pages.len() * PAGE
    }
    fn dead(&self) -> bool {
        matches!(self.owner, Owner::Gone)
    }
    fn poisoned(&self, p: usize) -> bool {
        self.poison[p].load(Relaxed) != GOOD
    }
    fn page_ptr(&self, p: usize) -> *mut u64 {
        (self.base + p * PAGE) as *mut u64
    }
}

/// A worker's heartbeat, for the watchdog.
#[derive(Default)]
struct Beat {
    ops: AtomicU64,
    op: AtomicU8,
    addr: AtomicUsize,
    done: AtomicBool,
}

struct Shared<'a> {
    pager: &'a Pager,
    ops_on: [bool; Op::ALL.len()],
    start: Instant,
    stop: AtomicBool,
    pool: Mutex<Vec<Slot>>,
    live_bytes: AtomicU64,
    mem_bytes: u64,
    next_id: AtomicU64,
    ops: [AtomicU64; Op::ALL.len()],
    pages_verified: AtomicU64,
    bytes_verified: AtomicU64,
    pages_written: AtomicU64,
    created: AtomicU64,
    destroyed: AtomicU64,
    drain_moved: AtomicU64,
    drain_unreadable: AtomicU64,
    mismatches: AtomicU64,
    examples: Mutex<Vec<String>>,
    sigbus_pages: AtomicU64,
    sigbus_repeat: AtomicU64,
    shared_reads: AtomicU64,
    poison_lifted: AtomicU64,
    tap: Arc<TapState>,
    beats: Vec<Beat>,
    /// Milliseconds since start of the last evict / stage / drain (gates).
    last_evict: AtomicU64,
    last_stage: AtomicU64,
    last_drain: AtomicU64,
    /// Detached mappings that cannot be unmapped (no munmap op): kept to the end.
    detached_kept: AtomicUsize,
    has_file: bool,
}

const MAX_EXAMPLES: usize = 20;

impl Shared<'_> {
    fn on(&self, op: Op) -> bool {
        self.ops_on[op.idx()]
    }

    /// Something failed that should not (a region that could not be made): counted with the
    /// mismatches, so the run fails.
    fn error(&self, what: String) {
        self.mismatch(format!("error: {what}"));
    }

    /// A poisoned page that no longer gives SIGBUS: its bytes are not the program's any more
    /// (a wrong-bytes failure), counted once per page.
    fn poison_lifted(&self, r: &SRegion, p: usize, what: &str) {
        if r.poison[p].swap(LIFTED, Relaxed) == LIFTED {
            return;
        }
        self.poison_lifted.fetch_add(1, Relaxed);
        self.mismatch(format!("region {} page {p} ({:#x}) gave SIGBUS before but {what}", r.id, r.base + p * PAGE));
    }

    fn mismatch(&self, what: String) {
        let what = format!("{what} [{:.3} s]", self.start.elapsed().as_secs_f64());
        self.mismatches.fetch_add(1, Relaxed);
        let mut ex = self.examples.lock().unwrap_or_else(|e| e.into_inner());
        if ex.len() < MAX_EXAMPLES {
            ex.push(what);
        }
    }

    /// A page's first SIGBUS since it was last known good.
    fn first_sigbus(&self, addr: usize) {
        self.sigbus_pages.fetch_add(1, Relaxed);
        *self.tap.balance.lock().unwrap_or_else(|e| e.into_inner()).entry(addr).or_insert(0) -= 1;
    }

    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    /// Opens the gate `last` if `every_ms` passed since it last opened.
    fn gate(&self, last: &AtomicU64, every_ms: u64) -> bool {
        let now = self.now_ms();
        let prev = last.load(Relaxed);
        now >= prev + every_ms && last.compare_exchange(prev, now, Relaxed, Relaxed).is_ok()
    }

    /// A region out of the pool, for ops that change it (lock it for writing: readers that
    /// picked it before may still be reading).
    fn take_region(&self, rng: &mut Rng) -> Option<Slot> {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.is_empty() {
            return None;
        }
        let i = rng.below(pool.len());
        Some(pool.swap_remove(i))
    }

    /// A region left in the pool, to read beside other readers.
    fn peek_region(&self, rng: &mut Rng) -> Option<Slot> {
        let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        if pool.is_empty() {
            return None;
        }
        Some(pool[rng.below(pool.len())].clone())
    }

    fn put_region(&self, r: Slot) {
        self.pool.lock().unwrap_or_else(|e| e.into_inner()).push(r);
    }
}

/// A random range of `n` items: within one page's words mostly, sometimes many pages.
fn pick_pages(rng: &mut Rng, n_pages: usize) -> (usize, usize) {
    let len = match rng.below(10) {
        0..=5 => 1,
        6..=8 => rng.range(1, 16),
        _ => rng.range(16, 64),
    }
    .min(n_pages);
    let first = rng.below(n_pages - len + 1);
    (first, len)
}

/// A strided walk in a region of `n_pages` (at least 8): (first page, pages, stride).
fn pick_stride(rng: &mut Rng, n_pages: usize) -> (usize, usize, usize) {
    let step = rng.range(2, (n_pages / 4).clamp(2, 16));
    let n = rng.range(3, 24).min((n_pages - 1) / step + 1);
    let first = rng.below(n_pages - (n - 1) * step);
    (first, n, step)
}

/// A random word range within a page: the whole page half the time.
fn pick_words(rng: &mut Rng) -> (usize, usize) {
    if rng.chance(1, 2) {
        return (0, WORDS);
    }
    let a = rng.below(WORDS);
    let b = rng.range(a + 1, WORDS);
    (a, b)
}

/// Reads words `w0..w1` of page `p` and compares them with the model.
fn verify_page(sh: &Shared, r: &SRegion, p: usize, w0: usize, w1: usize) {
    let ptr = r.page_ptr(p);
    let m = r.pages[p];
    if r.poisoned(p) {
        // SAFETY: word w0 of page p of a mapping this worker holds.
        match probe_load(unsafe { ptr.add(w0) }) {
            None => {
                sh.sigbus_repeat.fetch_add(1, Relaxed);
            }
            Some(v) => sh.poison_lifted(r, p, &format!("now reads {v:#x}")),
        }
        return;
    }
    let mut bad = 0;
    let mut first_bad = None;
    for i in w0..w1 {
        // SAFETY: word i of page p of a mapping this worker holds.
        match probe_load(unsafe { ptr.add(i) }) {
            None => {
                // Another reader of the same page may have seen it first: one count each.
                if r.poison[p].compare_exchange(GOOD, POISONED, Relaxed, Relaxed).is_ok() {
                    sh.first_sigbus(ptr as usize);
                } else {
                    sh.sigbus_repeat.fetch_add(1, Relaxed);
                }
                return;
            }
            Some(v) => {
                let want = m.expected(i);
                if v != want {
                    bad += 1;
                    first_bad.get_or_insert((i, v, want));
                }
            }
        }
    }
    sh.pages_verified.fetch_add(1, Relaxed);
    sh.bytes_verified.fetch_add(((w1 - w0) * 8) as u64, Relaxed);
    if let Some((i, got, want)) = first_bad {
        sh.mismatch(format!(
            "region {} page {p} ({:#x}): {bad} wrong words of {}..{}, first word {i}: {got:#x}, want {want:#x} (model {m:?})",
            r.id,
            ptr as usize,
            w0,
            w1
        ));
    }
}

/// Writes words `w0..w1` of page `p` as a new version and updates the model.
fn write_page(sh: &Shared, r: &mut SRegion, p: usize, w0: usize, w1: usize) {
    let ptr = r.page_ptr(p);
    let m = r.pages[p];
    if r.poisoned(p) {
        // SAFETY: word w0 of page p of a mapping this worker holds.
        if probe_store(unsafe { ptr.add(w0) }, 0) {
            sh.poison_lifted(r, p, "now takes a store");
        } else {
            sh.sigbus_repeat.fetch_add(1, Relaxed);
        }
        return;
    }
    r.next_ver += 1;
    let ver = r.next_ver;
    // The words this version covers: the new range, joined with the old patch if any.
    let (lo, hi) = if m.hi > m.lo { (w0.min(m.lo as usize), w1.max(m.hi as usize)) } else { (w0, w1) };
    let new = if lo == 0 && hi == WORDS {
        PageModel { key: m.key, base: ver, ..Default::default() }
    } else {
        PageModel { key: m.key, base: m.base, patch: ver, lo: lo as u16, hi: hi as u16 }
    };
    // The first store lands at the op's own offset (that is where the fault comes from).
    for i in (w0..hi).chain(lo..w0) {
        // SAFETY: word i of page p of a mapping this worker holds.
        if !probe_store(unsafe { ptr.add(i) }, gen_word(m.key, ver, i)) {
            sh.first_sigbus(ptr as usize);
            r.poison[p].store(POISONED, Relaxed);
            return;
        }
    }
    r.pages[p] = new;
    sh.pages_written.fetch_add(1, Relaxed);
}

fn create_region(sh: &Shared, rng: &mut Rng, detached: bool) {
    let n_pages = match rng.below(20) {
        0..=13 => rng.range(1, 64),
        14..=18 => rng.range(64, 512),
        _ => rng.range(512, 2048),
    };
    let hint = match rng.below(3) {
        0 => Hint::Normal,
        1 => Hint::Sequential,
        _ => Hint::Random,
    };
    let id = sh.next_id.fetch_add(1, Relaxed);
    let (base, owner) = if detached {
        match sh.pager.map_detached(n_pages * PAGE, hint) {
            Ok(p) => (p as usize, Owner::Detached),
            Err(e) => {
                sh.error(format!("map_detached of {n_pages} pages failed: {e}"));
                return;
            }
        }
    } else {
        match sh.pager.region(n_pages * PAGE, hint) {
            Ok(r) => (r.as_ptr() as usize, Owner::Lib(r)),
            Err(e) => {
                sh.error(format!("region of {n_pages} pages failed: {e}"));
                return;
            }
        }
    };
    let pages = (0..n_pages).map(|i| PageModel::fresh(id << 24 | i as u64)).collect();
    let poison = (0..n_pages).map(|_| AtomicU8::new(GOOD)).collect();
    sh.live_bytes.fetch_add((n_pages * PAGE) as u64, Relaxed);
    sh.created.fetch_add(1, Relaxed);
    sh.put_region(Arc::new(RwLock::new(SRegion { id, base, pages, poison, owner, next_ver: 0 })));
}

/// Ends a region (held for writing): drops a library region, unmaps a detached one. A
/// reader that picked it earlier finds it dead.
fn destroy_region(sh: &Shared, r: &mut SRegion) {
    sh.live_bytes.fetch_sub(r.len_bytes() as u64, Relaxed);
    sh.destroyed.fetch_add(1, Relaxed);
    if let Owner::Detached = r.owner {
        // SAFETY: the mapping came from map_detached and is the program's to unmap; this
        // worker holds the region for writing, so nobody else touches it.
        unsafe { libc::munmap(r.base as *mut libc::c_void, r.len_bytes()) };
    }
    r.owner = Owner::Gone;
}

/// `madvise(DONTNEED)` a range: the pages must read back as zeros (and are no longer
/// poisoned).
fn dontneed(r: &mut SRegion, rng: &mut Rng) -> bool {
    let (first, n) = pick_pages(rng, r.pages.len());
    // SAFETY: a page range of a mapping this worker holds; DONTNEED drops its contents,
    // which the model records just after.
    let rc = unsafe { libc::madvise((r.base + first * PAGE) as *mut libc::c_void, n * PAGE, libc::MADV_DONTNEED) };
    if rc != 0 {
        return false;
    }
    for p in first..first + n {
        r.pages[p] = PageModel::fresh(r.pages[p].key);
        r.poison[p].store(GOOD, Relaxed);
    }
    true
}

/// `mremap` a detached mapping: move it (same size), grow it or shrink it.
fn mremap(sh: &Shared, r: &mut SRegion, rng: &mut Rng) -> bool {
    let old_n = r.pages.len();
    let new_n = match rng.below(3) {
        0 => old_n,
        1 => (old_n / 2).max(1),
        _ => old_n + rng.range(1, 64),
    };
    // Same size: move to a fresh place (a reservation mremap replaces).
    let (flags, target) = if new_n == old_n {
        // SAFETY: an anonymous PROT_NONE reservation to move onto.
        let t = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                new_n * PAGE,
                libc::PROT_NONE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            )
        };
        if t == libc::MAP_FAILED {
            return false;
        }
        (libc::MREMAP_MAYMOVE | libc::MREMAP_FIXED, t)
    } else {
        (libc::MREMAP_MAYMOVE, std::ptr::null_mut())
    };
    // SAFETY: the mapping is the program's (detached) and this worker holds it; the target,
    // if any, is our own fresh reservation.
    let got = unsafe { libc::mremap(r.base as *mut libc::c_void, old_n * PAGE, new_n * PAGE, flags, target) };
    if got == libc::MAP_FAILED {
        if !target.is_null() {
            // SAFETY: our unused reservation.
            unsafe { libc::munmap(target, new_n * PAGE) };
        }
        return false;
    }
    r.base = got as usize;
    if new_n < old_n {
        r.pages.truncate(new_n);
        r.poison.truncate(new_n);
        sh.live_bytes.fetch_sub(((old_n - new_n) * PAGE) as u64, Relaxed);
    } else if new_n > old_n {
        let id = sh.next_id.fetch_add(1, Relaxed);
        r.pages.extend((old_n..new_n).map(|i| PageModel::fresh(id << 24 | i as u64)));
        r.poison.extend((old_n..new_n).map(|_| AtomicU8::new(GOOD)));
        sh.live_bytes.fetch_add(((new_n - old_n) * PAGE) as u64, Relaxed);
    }
    true
}

/// One read, write, dontneed or mremap on a region this worker holds.
fn region_op(sh: &Shared, r: &mut SRegion, op: Op, rng: &mut Rng, beat: &Beat) {
    match op {
        Op::Read | Op::Write => {
            // One read in eight walks a stride (the engine's stride prefetch then brings
            // the pages further along into place, racing the other workers' ops).
            let (first, n, step) = match r.pages.len() {
                len if op == Op::Read && len >= 8 && rng.chance(1, 8) => pick_stride(rng, len),
                len => {
                    let (first, n) = pick_pages(rng, len);
                    (first, n, 1)
                }
            };
            let (w0, w1) = if n == 1 { pick_words(rng) } else { (0, WORDS) };
            for p in (first..first + n * step).step_by(step) {
                beat.addr.store(r.base + p * PAGE, Relaxed);
                if op == Op::Read {
                    verify_page(sh, r, p, w0, w1);
                } else {
                    write_page(sh, r, p, w0, w1);
                }
            }
        }
        Op::Dontneed => {
            if !dontneed(r, rng) {
                return;
            }
        }
        Op::Mremap => {
            if !matches!(r.owner, Owner::Detached) || !mremap(sh, r, rng) {
                return;
            }
        }
        _ => return,
    }
    sh.ops[op.idx()].fetch_add(1, Relaxed);
}

fn pick_op(sh: &Shared, rng: &mut Rng) -> Op {
    // Weights out of 1000.
    let x = rng.below(1000);
    let want = match x {
        0..=449 => Op::Read,
        450..=799 => Op::Write,
        800..=839 => Op::Create,
        840..=869 => Op::Destroy,
        870..=879 => Op::Detached,
        880..=899 => Op::Evict,
        900..=919 => Op::Stage,
        920..=929 => Op::Drain,
        930..=959 => Op::Dontneed,
        960..=979 => Op::Mremap,
        _ => Op::Munmap,
    };
    if sh.on(want) {
        want
    } else {
        Op::Read
    }
}

fn worker(sh: &Shared, t: usize, seed: u64) {
    let beat = &sh.beats[t];
    let mut rng = Rng::new(seed ^ (t as u64 + 1).wrapping_mul(0x1000_0000_01b3));
    while !sh.stop.load(Relaxed) {
        let mut op = pick_op(sh, &mut rng);
        let below_target = sh.live_bytes.load(Relaxed) < sh.mem_bytes;
        if (op == Op::Create || op == Op::Detached) && !below_target {
            op = Op::Read;
        }
        if (op == Op::Destroy || op == Op::Munmap) && below_target {
            op = Op::Write;
        }
        beat.op.store(op as u8, Relaxed);
        beat.addr.store(0, Relaxed);
        match op {
            Op::Create => {
                create_region(sh, &mut rng, false);
                sh.ops[op.idx()].fetch_add(1, Relaxed);
            }
            Op::Detached => {
                // Without munmap, detached mappings live to the end: a few only.
                let keep = !sh.on(Op::Munmap);
                if keep && sh.detached_kept.fetch_add(1, Relaxed) >= 2 * sh.beats.len() {
                    sh.detached_kept.fetch_sub(1, Relaxed);
                } else {
                    create_region(sh, &mut rng, true);
                    sh.ops[op.idx()].fetch_add(1, Relaxed);
                }
            }
            Op::Destroy | Op::Munmap => {
                if let Some(slot) = sh.take_region(&mut rng) {
                    let mut r = lock_w(&slot);
                    let detached = matches!(r.owner, Owner::Detached);
                    if detached == (op == Op::Munmap) {
                        destroy_region(sh, &mut r);
                        sh.ops[op.idx()].fetch_add(1, Relaxed);
                    } else {
                        drop(r);
                        sh.put_region(slot);
                    }
                }
            }
            Op::Evict => {
                if sh.gate(&sh.last_evict, 200) {
                    sh.pager.evict_all();
                    sh.ops[op.idx()].fetch_add(1, Relaxed);
                }
            }
            Op::Stage => {
                if sh.gate(&sh.last_stage, 100) {
                    sh.pager.stage_all();
                    sh.ops[op.idx()].fetch_add(1, Relaxed);
                }
            }
            Op::Drain => {
                if sh.has_file && sh.gate(&sh.last_drain, 3000) {
                    if let Ok(d) = sh.pager.drain(Tier::File) {
                        sh.drain_moved.fetch_add(d.moved, Relaxed);
                        sh.drain_unreadable.fetch_add(d.unreadable, Relaxed);
                    }
                    sh.pager.resume(Tier::File);
                    sh.ops[op.idx()].fetch_add(1, Relaxed);
                }
            }
            // A third of the reads share their region with other readers (the same pages may
            // fault in two threads at once); the region stays in the pool meanwhile.
            Op::Read if rng.chance(1, 3) => {
                if let Some(slot) = sh.peek_region(&mut rng) {
                    let r = slot.read().unwrap_or_else(|e| e.into_inner());
                    if !r.dead() {
                        let (first, n) = pick_pages(&mut rng, r.pages.len());
                        for p in first..first + n {
                            beat.addr.store(r.base + p * PAGE, Relaxed);
                            verify_page(sh, &r, p, 0, WORDS);
                        }
                        sh.ops[op.idx()].fetch_add(1, Relaxed);
                        sh.shared_reads.fetch_add(1, Relaxed);
                    }
                }
            }
            Op::Read | Op::Write | Op::Dontneed | Op::Mremap => match sh.take_region(&mut rng) {
                Some(slot) => {
                    let mut r = lock_w(&slot);
                    // A short burst on the region: sequential reads, read-after-write.
                    let burst = rng.range(1, 4);
                    region_op(sh, &mut r, op, &mut rng, beat);
                    for _ in 1..burst {
                        let o = if rng.chance(1, 2) { Op::Read } else { Op::Write };
                        region_op(sh, &mut r, o, &mut rng, beat);
                    }
                    drop(r);
                    sh.put_region(slot);
                }
                None => {
                    create_region(sh, &mut rng, false);
                    sh.ops[Op::Create.idx()].fetch_add(1, Relaxed);
                }
            },
        }
        beat.ops.fetch_add(1, Relaxed);
    }
    beat.done.store(true, Relaxed);
}

/// Every injected kind against the counters and what the workers saw.
fn account(report: &StressReport, inj: &inject::Report) -> Vec<Accounting> {
    let c = |k: &str| report.counters.get(k).copied().unwrap_or(0);
    let n = |k: Kind| inj.injected(k);
    let no_wrong = report.mismatches == 0;
    inj.kinds
        .iter()
        .map(|k| {
            let kind = Kind::ALL.into_iter().find(|x| x.name() == k.kind).unwrap_or(Kind::PoolAlloc);
            let (evidence, ok) = match kind {
                Kind::PoolAlloc => ("the refused pages went elsewhere: no wrong page".to_string(), no_wrong),
                Kind::CompressFail => (
                    format!("pool_reject_incompressible {} ≥ {}", c("pool_reject_incompressible"), k.injected),
                    c("pool_reject_incompressible") >= k.injected,
                ),
                Kind::CompressGarbage => (
                    format!(
                        "SIGBUS for corrupt objects {} ≤ {} (objects freed unread are never seen); checksum errors {}",
                        report.poison_logged_corrupt,
                        k.injected,
                        c("checksum_errors")
                    ),
                    report.poison_logged_corrupt <= k.injected && c("checksum_errors") == 0,
                ),
                Kind::FileWriteEio | Kind::FileWriteEnospc => {
                    let want = n(Kind::FileWriteEio) + n(Kind::FileWriteEnospc);
                    (
                        format!("writeback_errors {} = EIO + ENOSPC injected {want}; pages kept in memory", c("writeback_errors")),
                        c("writeback_errors") == want && no_wrong,
                    )
                }
                Kind::FileWriteShort | Kind::FileReadShort => {
                    ("finished by the IO loop: no wrong page".to_string(), no_wrong)
                }
                Kind::FileReadEio => (
                    format!(
                        "read_errors {} = {}; SIGBUS for read errors {} ≤ read_errors (drain and readahead retry later)",
                        c("read_errors"),
                        k.injected,
                        report.poison_logged_io
                    ),
                    c("read_errors") == k.injected && report.poison_logged_io <= k.injected,
                ),
                Kind::ReadSlow | Kind::WriteSlow | Kind::FaultStall => {
                    ("only time: no hang, no wrong page".to_string(), no_wrong && report.hangs == 0)
                }
            };
            Accounting { kind: k.kind.to_string(), calls: k.calls, injected: k.injected, evidence, ok }
        })
        .collect()
}

/// Runs the stress workload and returns what it saw; on a hang, writes the report, prints
/// it and exits the process with status 3 (a stuck thread cannot be joined).
pub fn run(spec: &StressSpec) -> Result<StressReport, StressError> {
    if !cfg!(target_arch = "x86_64") {
        return Err(StressError::Arch);
    }
    let mut plan = None;
    if let Some(s) = &spec.inject {
        if !inject::ENABLED {
            return Err(StressError::NotBuilt);
        }
        inject::install(s)?;
        plan = Some(s.to_string());
    } else {
        inject::clear();
    }
    install_probe_handler()?;
    let pager = Pager::new(spec.pager.clone())?;
    let tap_state = Arc::new(TapState::default());
    let mut ops_on = [false; Op::ALL.len()];
    for o in &spec.ops {
        ops_on[o.idx()] = true;
    }
    let threads = spec.threads.max(1);
    let sh = Shared {
        pager: &pager,
        ops_on,
        start: Instant::now(),
        stop: AtomicBool::new(false),
        pool: Mutex::new(Vec::new()),
        live_bytes: AtomicU64::new(0),
        mem_bytes: spec.mem_bytes,
        next_id: AtomicU64::new(1),
        ops: Default::default(),
        pages_verified: AtomicU64::new(0),
        bytes_verified: AtomicU64::new(0),
        pages_written: AtomicU64::new(0),
        created: AtomicU64::new(0),
        destroyed: AtomicU64::new(0),
        drain_moved: AtomicU64::new(0),
        drain_unreadable: AtomicU64::new(0),
        mismatches: AtomicU64::new(0),
        examples: Mutex::new(Vec::new()),
        sigbus_pages: AtomicU64::new(0),
        sigbus_repeat: AtomicU64::new(0),
        shared_reads: AtomicU64::new(0),
        poison_lifted: AtomicU64::new(0),
        tap: tap_state.clone(),
        beats: (0..threads).map(|_| Beat::default()).collect(),
        last_evict: AtomicU64::new(0),
        last_stage: AtomicU64::new(0),
        last_drain: AtomicU64::new(0),
        detached_kept: AtomicUsize::new(0),
        has_file: spec.pager.tiers.file,
    };
    let tap = Tap::start(tap_state.clone(), spec.engine_log.as_ref())?;
    let bar = if spec.progress { make_bar(tap.orig_fd, spec.duration) } else { None };
    *tap_state.bar.lock().unwrap_or_else(|e| e.into_inner()) = bar.clone();

    let mut hang: Option<String> = None;
    let mut hang_addr = 0usize;
    std::thread::scope(|scope| {
        for t in 0..threads {
            let sh = &sh;
            let seed = spec.seed;
            std::thread::Builder::new()
                .name(format!("stress-{t}"))
                .spawn_scoped(scope, move || worker(sh, t, seed))
                .expect("a stress worker thread");
        }
        // The main thread: progress, the end, the watchdog.
        let mut last: Vec<(u64, Instant)> = sh.beats.iter().map(|_| (0, Instant::now())).collect();
        let mut last_line = Instant::now();
        loop {
            std::thread::sleep(Duration::from_millis(200));
            let elapsed = sh.start.elapsed();
            if elapsed >= spec.duration {
                sh.stop.store(true, Relaxed);
            }
            let mut all_done = true;
            for (t, b) in sh.beats.iter().enumerate() {
                if b.done.load(Relaxed) {
                    continue;
                }
                all_done = false;
                let n = b.ops.load(Relaxed);
                if n != last[t].0 {
                    last[t] = (n, Instant::now());
                } else if last[t].1.elapsed() >= spec.watchdog {
                    let op = Op::ALL[b.op.load(Relaxed) as usize];
                    hang_addr = b.addr.load(Relaxed);
                    hang = Some(format!(
                        "worker {t} made no progress for {} s, in op {} at {:#x}, after {n} ops",
                        spec.watchdog.as_secs(),
                        op.name(),
                        b.addr.load(Relaxed)
                    ));
                }
            }
            let total: u64 = sh.ops.iter().map(|o| o.load(Relaxed)).sum();
            let status = format!(
                "ops {total}, verified {}, sigbus {}, mismatches {}",
                sh.pages_verified.load(Relaxed),
                sh.sigbus_pages.load(Relaxed),
                sh.mismatches.load(Relaxed)
            );
            match &bar {
                Some(b) => {
                    b.set_position(elapsed.as_secs().min(spec.duration.as_secs()));
                    b.set_message(status);
                }
                None if spec.progress && last_line.elapsed() >= Duration::from_secs(60) => {
                    last_line = Instant::now();
                    eprintln!("tierswap-stress: {} s: {status}", elapsed.as_secs());
                }
                None => {}
            }
            if let Some(h) = &hang {
                // SAFETY: a new descriptor of the real stderr we kept.
                let mut out = unsafe { File::from_raw_fd(libc::dup(tap.orig_fd)) };
                let _ = writeln!(out, "tierswap-stress: HANG: {h}");
                // The engine's stats may wait on the stuck part of the engine: give them a
                // few seconds, else report without them.
                let (tx, rx) = std::sync::mpsc::channel();
                let (sh_ref, plan2) = (&sh, plan.clone());
                scope.spawn(move || {
                    let _ = tx.send(sh_ref.pager.stats());
                });
                let stats = rx.recv_timeout(Duration::from_secs(5)).ok();
                if stats.is_none() {
                    let _ = writeln!(out, "tierswap-stress: the engine's stats did not answer within 5 s either");
                }
                if hang_addr != 0 {
                    // What the engine's region map and trail say of the address (it takes
                    // the map's lock: bounded like the stats).
                    let (tx, rx) = std::sync::mpsc::channel();
                    let sh_ref = &sh;
                    scope.spawn(move || {
                        let _ = tx.send(sh_ref.pager.trail_near(hang_addr));
                    });
                    match rx.recv_timeout(Duration::from_secs(5)) {
                        Ok(t) => {
                            let _ = write!(out, "tierswap-stress: {t}");
                        }
                        Err(_) => {
                            let _ = writeln!(out, "tierswap-stress: the engine's region map did not answer within 5 s");
                        }
                    }
                }
                let mut report = collect_with(spec, &sh, plan2, stats);
                report.hangs = 1;
                report.hang = Some(format!("{h}; threads: {}", thread_states()));
                if let Some(b) = &bar {
                    b.finish_and_clear();
                }
                // The stuck worker cannot be joined: report from here and leave.
                let (text, _) = finish_text(&report, spec.json.as_ref());
                let _ = out.write_all(text.as_bytes());
                print!("{text}");
                let _ = std::io::stdout().flush();
                std::process::exit(3);
            }
            if all_done {
                break;
            }
        }
    });
    if let Some(b) = &bar {
        b.finish_and_clear();
    }
    *tap_state.bar.lock().unwrap_or_else(|e| e.into_inner()) = None;
    // Nothing more is injected from here; a failure injected just before is counted by the
    // engine a moment later: wait (bounded) until the counters show every injection.
    inject::freeze();
    let settle_until = Instant::now() + Duration::from_secs(5);
    let mut report = loop {
        let r = collect(spec, &sh, plan.clone());
        if account(&r, &inject::report()).iter().all(|a| a.ok) || Instant::now() >= settle_until {
            break r;
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    // End the regions (detached ones without munmap stay to the pager's end).
    let regions: Vec<Slot> = std::mem::take(&mut *sh.pool.lock().unwrap_or_else(|e| e.into_inner()));
    for slot in regions {
        let mut r = lock_w(&slot);
        if matches!(r.owner, Owner::Lib(_)) || sh.on(Op::Munmap) {
            destroy_region(&sh, &mut r);
        }
    }
    // The pager ends before the tap: whatever it still logs is counted.
    let inj = inject::report();
    drop(sh);
    drop(pager);
    tap.stop();
    finish_poisons(&mut report, &tap_state);
    report.accounting = account(&report, &inj);
    report.injected = inj.kinds;
    let sigbus_kinds = report.injected.iter().filter(|k| k.kind == "file_read_eio" || k.kind == "compress_garbage");
    let sigbus_budget: u64 = sigbus_kinds.map(|k| k.injected).sum();
    report.accounted = report.accounting.iter().all(|a| a.ok)
        && report.sigbus_unlogged.is_empty()
        && report.logged_not_seen.is_empty()
        && report.sigbus_pages <= sigbus_budget;
    inject::clear();
    Ok(report)
}

/// Every thread of this process: name, state and kernel wait channel, for a hang report.
fn thread_states() -> String {
    let Ok(dir) = std::fs::read_dir("/proc/self/task") else {
        return "(no /proc/self/task)".into();
    };
    let mut out = Vec::new();
    for e in dir.flatten() {
        let p = e.path();
        let read = |f: &str| std::fs::read_to_string(p.join(f)).unwrap_or_default().trim().to_string();
        let stat = read("stat");
        // The state is the field after the parenthesised name.
        let state = stat.rsplit(')').next().and_then(|r| r.split_whitespace().next()).unwrap_or("?").to_string();
        out.push(format!("{} {} {}", read("comm"), state, read("wchan")));
    }
    out.sort();
    out.join(", ")
}

fn make_bar(orig_fd: i32, duration: Duration) -> Option<ProgressBar> {
    // SAFETY: isatty on a descriptor we own.
    if unsafe { libc::isatty(orig_fd) } != 1 {
        return None;
    }
    // SAFETY: a new descriptor of the real stderr, owned by the bar's terminal.
    let fd = unsafe { libc::fcntl(orig_fd, libc::F_DUPFD_CLOEXEC, 3) };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd is fresh and ours.
    let out = unsafe { File::from_raw_fd(fd) };
    let term = FdTerm { out: Mutex::new(out), fd };
    let bar = ProgressBar::with_draw_target(
        Some(duration.as_secs().max(1)),
        ProgressDrawTarget::term_like_with_hz(Box::new(term), 5),
    );
    if let Ok(style) = ProgressStyle::with_template("stress {elapsed_precise} [{bar:30}] {pos}/{len} s  {msg}") {
        bar.set_style(style.progress_chars("=> "));
    }
    Some(bar)
}

/// The report from the shared counters and the engine's stats (poisons and accounting
/// come later).
fn collect(spec: &StressSpec, sh: &Shared, plan: Option<String>) -> StressReport {
    collect_with(spec, sh, plan, Some(sh.pager.stats()))
}

/// [`collect`] with the engine's stats given (none: the engine did not answer).
fn collect_with(spec: &StressSpec, sh: &Shared, plan: Option<String>, stats: Option<tierswap::Stats>) -> StressReport {
    let ops: BTreeMap<String, u64> =
        Op::ALL.iter().filter(|o| sh.on(**o)).map(|o| (o.name().to_string(), sh.ops[o.idx()].load(Relaxed))).collect();
    StressReport {
        engine: spec.engine.clone(),
        threads: sh.beats.len(),
        duration_s: sh.start.elapsed().as_secs_f64(),
        seed: spec.seed,
        ops_enabled: spec.ops.iter().map(|o| o.name().to_string()).collect(),
        inject: plan,
        pager: serde_json::to_value(&spec.pager).unwrap_or_default(),
        ops_total: ops.values().sum(),
        ops,
        pages_verified: sh.pages_verified.load(Relaxed),
        bytes_verified: sh.bytes_verified.load(Relaxed),
        pages_written: sh.pages_written.load(Relaxed),
        shared_reads: sh.shared_reads.load(Relaxed),
        regions_created: sh.created.load(Relaxed),
        regions_destroyed: sh.destroyed.load(Relaxed),
        drain_moved: sh.drain_moved.load(Relaxed),
        drain_unreadable: sh.drain_unreadable.load(Relaxed),
        mismatches: sh.mismatches.load(Relaxed),
        mismatch_examples: sh.examples.lock().unwrap_or_else(|e| e.into_inner()).clone(),
        sigbus_pages: sh.sigbus_pages.load(Relaxed),
        sigbus_repeat: sh.sigbus_repeat.load(Relaxed),
        poison_lifted: sh.poison_lifted.load(Relaxed),
        counters: stats
            .map(|st| st.counters.pairs().into_iter().map(|(k, v)| (k.to_string(), v)).collect())
            .unwrap_or_default(),
        injected: inject::report().kinds,
        ..Default::default()
    }
}

/// Compares the pages that gave SIGBUS with the pages the engine logged.
fn finish_poisons(report: &mut StressReport, tap: &TapState) {
    report.poison_logged = tap.logged.load(Relaxed);
    report.poison_logged_io = tap.logged_io.load(Relaxed);
    report.poison_logged_corrupt = tap.logged_corrupt.load(Relaxed);
    report.engine_log_lines = tap.lines.load(Relaxed);
    report.engine_log_suppressed = tap.suppressed.load(Relaxed);
    report.engine_internal_errors = tap.internal.load(Relaxed);
    let balance = tap.balance.lock().unwrap_or_else(|e| e.into_inner());
    let mut addrs: Vec<(&usize, &i64)> = balance.iter().filter(|(_, &n)| n != 0).collect();
    addrs.sort();
    for (addr, n) in addrs {
        if *n < 0 {
            report.sigbus_unlogged.push(format!("{addr:#x} ({} times)", -n));
        } else {
            report.logged_not_seen.push(format!("{addr:#x} ({n} times)"));
        }
    }
}

/// The report's text, after writing its JSON if asked; the error, if writing failed.
fn finish_text(report: &StressReport, json: Option<&PathBuf>) -> (String, Option<String>) {
    let mut err = None;
    if let Some(path) = json {
        match serde_json::to_string_pretty(report) {
            Ok(text) => {
                if let Err(e) = std::fs::write(path, text) {
                    err = Some(format!("cannot write {}: {e}", path.display()));
                }
            }
            Err(e) => err = Some(format!("cannot encode the report: {e}")),
        }
    }
    (report.text(), err)
}

/// Writes the report's JSON (if asked) and returns its text.
pub fn finish(report: &StressReport, json: Option<&PathBuf>) -> Result<String, String> {
    let (text, err) = finish_text(report, json);
    match err {
        Some(e) => Err(e),
        None => Ok(text),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ops_and_durations_parse() {
        assert_eq!(parse_ops("read,create").unwrap(), vec![Op::Read, Op::Create]);
        assert_eq!(parse_ops("default").unwrap(), Op::DEFAULT.to_vec());
        assert_eq!(parse_ops("all").unwrap(), Op::ALL.to_vec());
        assert!(parse_ops("read,frob").unwrap_err().to_string().contains("unknown op 'frob'"));
        assert!(parse_ops("write,create").unwrap_err().to_string().contains("needs read"));
        assert_eq!(parse_duration("10m").unwrap(), Duration::from_secs(600));
        assert_eq!(parse_duration("20s").unwrap(), Duration::from_secs(20));
        assert_eq!(parse_duration("250ms").unwrap(), Duration::from_millis(250));
        assert_eq!(parse_duration("3").unwrap(), Duration::from_secs(3));
        assert!(parse_duration("10x").is_err() && parse_duration("0s").is_err());
    }

    #[test]
    fn the_model_generates_what_a_write_leaves() {
        // A patch joined with a later one covers both ranges with the later version.
        let mut m = PageModel::fresh(7 << 24 | 3);
        assert!((0..WORDS).all(|i| m.expected(i) == 0));
        m = PageModel { base: 1, ..m };
        let v1: Vec<u64> = (0..WORDS).map(|i| m.expected(i)).collect();
        m = PageModel { patch: 2, lo: 10, hi: 20, ..m };
        assert_eq!(m.expected(9), v1[9]);
        assert_eq!(m.expected(10), gen_word(m.key, 2, 10));
        assert_eq!(m.expected(20), v1[20]);
        // Different keys and versions give different pages (except zero-class ones).
        let differ = (1..200u32).filter(|&v| (0..WORDS).any(|i| gen_word(1, v, i) != gen_word(2, v, i))).count();
        assert!(differ > 150, "{differ}");
    }

    #[test]
    fn poison_lines_parse() {
        let l = "tierswap: page at 0x7f12a000 (slot 5) cannot be read back (read error: x); the accessing thread gets SIGBUS";
        assert_eq!(poisoned_addr(l), Some(0x7f12a000));
        assert_eq!(poisoned_addr("tierswap: something else at 0x1000"), None);
    }

    #[cfg(target_arch = "x86_64")]
    #[test]
    fn probes_read_and_write_plain_memory() {
        let mut w = [0u64; 4];
        assert!(probe_store(&mut w[1], 0xabcd));
        assert_eq!(probe_load(&w[1]), Some(0xabcd));
        assert_eq!(w, [0, 0xabcd, 0, 0]);
    }
}
