//! Fault injection: make the pool refuse objects, the compressor fail or lie about a length,
//! the swap file's writes and reads fail, come up short or go slow, and fault threads stall,
//! at a chosen rate, deterministically for a seed, counted per kind.
//!
//! Built only with the `fault-injection` cargo feature. Without it every hook is a constant
//! `false` / a plain call that the compiler folds away, and [`install`] refuses with
//! [`InjectError::NotBuilt`]: a normal build pays nothing.
//!
//! A plan comes from a spec string (the `TIERSWAP_INJECT` environment variable, read once at
//! the first hook, or [`install`] with a parsed [`Spec`]):
//!
//! ```text
//! TIERSWAP_INJECT="pool_alloc:1/50,file_write_eio:1/100,read_slow:5ms@1/20,seed=7"
//! ```
//!
//! `KIND:N/D` injects at N of every D calls of the hook (`KIND:always` = 1/1); kinds that
//! take a delay (`read_slow`, `write_slow`, `fault_stall`) write `KIND:DELAY@N/D` with DELAY in
//! `us`, `ms` or `s`. Whether call number `i` of a kind is hit is a hash of (seed, kind, i):
//! the same seed gives the same sequence of decisions per kind.
//!
//! What the engine does with each (RELIABILITY.md): a refused pool object goes to the file or
//! stays staged; a failed compression is treated as incompressible; a garbage (short) length
//! stores a stream that no longer decodes to a page, so the page's next touch gets SIGBUS with
//! a logged reason; a failed write keeps the pages in memory; a short write or read is
//! finished by the IO loop; a failed read gets the touching thread SIGBUS; slow IO and stalls
//! only cost time.
//!
//! Owns: the injection plan and its counters. Calls: nothing of the engine.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::Duration;

/// A place where a failure can be injected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    /// The pool refuses an object as if its arena were full.
    PoolAlloc,
    /// Compression fails (the page is treated as incompressible).
    CompressFail,
    /// Compression returns a length shorter than the stream it wrote.
    CompressGarbage,
    /// A swap file write transfers only part of the buffer (the write loop must finish it).
    FileWriteShort,
    /// A swap file write fails with EIO.
    FileWriteEio,
    /// A swap file write fails with ENOSPC.
    FileWriteEnospc,
    /// A swap file read transfers only part of the buffer (the read loop must finish it).
    FileReadShort,
    /// A swap file read fails with EIO.
    FileReadEio,
    /// A swap file read sleeps first.
    ReadSlow,
    /// A swap file write sleeps first.
    WriteSlow,
    /// A fault thread sleeps before serving a fault.
    FaultStall,
}

impl Kind {
    /// Every kind, in report order.
    pub const ALL: [Kind; 11] = [
        Kind::PoolAlloc,
        Kind::CompressFail,
        Kind::CompressGarbage,
        Kind::FileWriteShort,
        Kind::FileWriteEio,
        Kind::FileWriteEnospc,
        Kind::FileReadShort,
        Kind::FileReadEio,
        Kind::ReadSlow,
        Kind::WriteSlow,
        Kind::FaultStall,
    ];

    /// The name in a spec.
    pub const fn name(self) -> &'static str {
        match self {
            Kind::PoolAlloc => "pool_alloc",
            Kind::CompressFail => "compress_fail",
            Kind::CompressGarbage => "compress_garbage",
            Kind::FileWriteShort => "file_write_short",
            Kind::FileWriteEio => "file_write_eio",
            Kind::FileWriteEnospc => "file_write_enospc",
            Kind::FileReadShort => "file_read_short",
            Kind::FileReadEio => "file_read_eio",
            Kind::ReadSlow => "read_slow",
            Kind::WriteSlow => "write_slow",
            Kind::FaultStall => "fault_stall",
        }
    }

    /// Whether the kind is a delay (takes `DELAY@N/D`).
    pub const fn is_delay(self) -> bool {
        matches!(self, Kind::ReadSlow | Kind::WriteSlow | Kind::FaultStall)
    }

    #[cfg_attr(not(feature = "fault-injection"), allow(dead_code))]
    const fn idx(self) -> usize {
        self as usize
    }
}

impl std::str::FromStr for Kind {
    type Err = InjectError;
    fn from_str(s: &str) -> Result<Kind, InjectError> {
        Kind::ALL.into_iter().find(|k| k.name() == s).ok_or_else(|| InjectError::Spec {
            spec: s.to_string(),
            why: format!(
                "unknown kind; kinds are {}",
                Kind::ALL.iter().map(|k| k.name()).collect::<Vec<_>>().join(", ")
            ),
        })
    }
}

/// A fault injection error.
#[derive(Debug, thiserror::Error)]
pub enum InjectError {
    /// A spec did not parse.
    #[error("fault injection spec '{spec}': {why} (form: KIND:N/D or KIND:DELAY@N/D, comma-separated, seed=N)")]
    Spec {
        /// The part that did not parse.
        spec: String,
        /// What is wrong with it.
        why: String,
    },
    /// This build has no injection hooks.
    #[error("this build has no fault injection: rebuild with `--features fault-injection`")]
    NotBuilt,
}

/// One kind's rule: inject at `num` of every `den` calls, sleeping `delay` for delay kinds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Rule {
    /// The place.
    pub kind: Kind,
    /// Hits per `den` calls.
    pub num: u32,
    /// Calls per `num` hits (≥ 1, ≥ `num`).
    pub den: u32,
    /// How long a delay kind sleeps.
    pub delay: Duration,
}

/// An injection plan: rules and a seed.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Spec {
    /// The rules, at most one per kind (a later one replaces an earlier one).
    pub rules: Vec<Rule>,
    /// The seed of the decisions.
    pub seed: u64,
}

impl Spec {
    /// An empty plan (nothing injected) with seed 0.
    pub fn new() -> Spec {
        Spec::default()
    }

    /// Sets the seed.
    pub fn seed(mut self, seed: u64) -> Spec {
        self.seed = seed;
        self
    }

    /// Injects `kind` at `num` of every `den` calls.
    pub fn rule(self, kind: Kind, num: u32, den: u32) -> Spec {
        self.delay(kind, Duration::ZERO, num, den)
    }

    /// Injects delay kind `kind`, sleeping `delay`, at `num` of every `den` calls.
    pub fn delay(mut self, kind: Kind, delay: Duration, num: u32, den: u32) -> Spec {
        self.rules.retain(|r| r.kind != kind);
        self.rules.push(Rule { kind, num: num.min(den.max(1)), den: den.max(1), delay });
        self
    }
}

fn parse_duration(s: &str) -> Option<Duration> {
    let (digits, mul_us) = if let Some(d) = s.strip_suffix("us") {
        (d, 1)
    } else if let Some(d) = s.strip_suffix("ms") {
        (d, 1_000)
    } else if let Some(d) = s.strip_suffix('s') {
        (d, 1_000_000)
    } else {
        return None;
    };
    let n: u64 = digits.trim().parse().ok()?;
    Some(Duration::from_micros(n.checked_mul(mul_us)?))
}

impl std::str::FromStr for Spec {
    type Err = InjectError;
    fn from_str(s: &str) -> Result<Spec, InjectError> {
        let mut spec = Spec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let bad = |why: &str| InjectError::Spec { spec: part.to_string(), why: why.to_string() };
            if let Some(seed) = part.strip_prefix("seed=") {
                spec.seed = seed.trim().parse().map_err(|_| bad("the seed is a number"))?;
                continue;
            }
            let (name, rest) = part.split_once(':').ok_or_else(|| bad("no ':' after the kind"))?;
            let kind: Kind = name.trim().parse()?;
            let (delay, rate) = match rest.split_once('@') {
                Some((d, r)) => (Some(parse_duration(d.trim()).ok_or_else(|| bad("a delay is N us, ms or s"))?), r),
                None => (None, rest),
            };
            if kind.is_delay() != delay.is_some() {
                return Err(bad(if kind.is_delay() {
                    "this kind needs a delay: KIND:DELAY@N/D"
                } else {
                    "this kind takes no delay: KIND:N/D"
                }));
            }
            let (num, den) = match rate.trim() {
                "always" => (1, 1),
                r => {
                    let (n, d) = r.split_once('/').ok_or_else(|| bad("a rate is N/D or always"))?;
                    let n: u32 = n.trim().parse().map_err(|_| bad("a rate is N/D with numbers"))?;
                    let d: u32 = d.trim().parse().map_err(|_| bad("a rate is N/D with numbers"))?;
                    if d == 0 || n > d {
                        return Err(bad("a rate N/D needs 0 < D and N ≤ D"));
                    }
                    (n, d)
                }
            };
            spec = spec.delay(kind, delay.unwrap_or(Duration::ZERO), num, den);
        }
        Ok(spec)
    }
}

impl std::fmt::Display for Spec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for r in &self.rules {
            if r.kind.is_delay() {
                write!(f, "{}:{}us@{}/{},", r.kind.name(), r.delay.as_micros(), r.num, r.den)?;
            } else {
                write!(f, "{}:{}/{},", r.kind.name(), r.num, r.den)?;
            }
        }
        write!(f, "seed={}", self.seed)
    }
}

/// Calls and hits of one kind since the plan was installed.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct KindReport {
    /// The kind.
    pub kind: &'static str,
    /// Times the hook ran with a rule for the kind.
    pub calls: u64,
    /// Times it injected.
    pub injected: u64,
}

/// What was injected, per kind (kinds without a rule are left out).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct Report {
    /// One entry per kind with a rule.
    pub kinds: Vec<KindReport>,
}

impl Report {
    /// Injections of `kind`.
    pub fn injected(&self, kind: Kind) -> u64 {
        self.kinds.iter().find(|k| k.kind == kind.name()).map_or(0, |k| k.injected)
    }

    /// Injections of every kind.
    pub fn total(&self) -> u64 {
        self.kinds.iter().map(|k| k.injected).sum()
    }
}

/// Whether this build has the hooks.
pub const ENABLED: bool = cfg!(feature = "fault-injection");

#[cfg(feature = "fault-injection")]
mod imp {
    use super::*;
    use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};
    use std::sync::Once;

    const N: usize = Kind::ALL.len();
    #[allow(clippy::declare_interior_mutable_const)]
    const Z32: AtomicU32 = AtomicU32::new(0);
    #[allow(clippy::declare_interior_mutable_const)]
    const Z64: AtomicU64 = AtomicU64::new(0);

    static ENV: Once = Once::new();
    /// Any rule installed: the hooks' fast path.
    static ACTIVE: AtomicBool = AtomicBool::new(false);
    static SEED: AtomicU64 = AtomicU64::new(0);
    static NUM: [AtomicU32; N] = [Z32; N];
    static DEN: [AtomicU32; N] = [Z32; N];
    static DELAY_US: [AtomicU64; N] = [Z64; N];
    static CALLS: [AtomicU64; N] = [Z64; N];
    static HITS: [AtomicU64; N] = [Z64; N];

    fn from_env() {
        ENV.call_once(|| {
            let Ok(text) = std::env::var("TIERSWAP_INJECT") else {
                return;
            };
            match text.parse::<Spec>() {
                Ok(spec) => {
                    set(&spec);
                    eprintln!("tierswap: fault injection on: {spec}");
                }
                Err(e) => eprintln!("tierswap: TIERSWAP_INJECT ignored: {e}"),
            }
        });
    }

    pub(super) fn set(spec: &Spec) {
        ACTIVE.store(false, Relaxed);
        for k in 0..N {
            NUM[k].store(0, Relaxed);
            DEN[k].store(0, Relaxed);
            DELAY_US[k].store(0, Relaxed);
            CALLS[k].store(0, Relaxed);
            HITS[k].store(0, Relaxed);
        }
        SEED.store(spec.seed, Relaxed);
        for r in &spec.rules {
            let k = r.kind.idx();
            DELAY_US[k].store(r.delay.as_micros() as u64, Relaxed);
            DEN[k].store(r.den, Relaxed);
            NUM[k].store(r.num, Relaxed);
        }
        ACTIVE.store(!spec.rules.is_empty(), Relaxed);
    }

    pub(super) fn install(spec: &Spec) -> Result<(), InjectError> {
        // The environment's plan, if any, is read first so it cannot replace this one later.
        from_env();
        set(spec);
        Ok(())
    }

    fn mix(mut x: u64) -> u64 {
        // splitmix64's finaliser.
        x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        x ^ (x >> 31)
    }

    #[inline]
    pub(super) fn hit(kind: Kind) -> bool {
        from_env();
        if !ACTIVE.load(Relaxed) {
            return false;
        }
        let k = kind.idx();
        let num = NUM[k].load(Relaxed);
        if num == 0 {
            return false;
        }
        let den = DEN[k].load(Relaxed).max(1) as u64;
        let i = CALLS[k].fetch_add(1, Relaxed);
        let h = mix(SEED.load(Relaxed) ^ ((k as u64 + 1) << 56) ^ mix(i));
        if h % den < num as u64 {
            HITS[k].fetch_add(1, Relaxed);
            true
        } else {
            false
        }
    }

    pub(super) fn freeze() {
        from_env();
        ACTIVE.store(false, Relaxed);
    }

    pub(super) fn delay_of(kind: Kind) -> Duration {
        Duration::from_micros(DELAY_US[kind.idx()].load(Relaxed))
    }

    pub(super) fn report() -> Report {
        from_env();
        let kinds = Kind::ALL
            .into_iter()
            .filter(|k| NUM[k.idx()].load(Relaxed) > 0)
            .map(|k| KindReport {
                kind: k.name(),
                calls: CALLS[k.idx()].load(Relaxed),
                injected: HITS[k.idx()].load(Relaxed),
            })
            .collect();
        Report { kinds }
    }
}

/// Installs `spec` in place of the current plan (and of `TIERSWAP_INJECT`), zeroing the
/// counters. Refuses with [`InjectError::NotBuilt`] when the hooks are not built.
pub fn install(spec: &Spec) -> Result<(), InjectError> {
    #[cfg(feature = "fault-injection")]
    return imp::install(spec);
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = spec;
        Err(InjectError::NotBuilt)
    }
}

/// Removes every rule (the counters restart at zero).
pub fn clear() {
    let _ = install(&Spec::new());
}

/// Stops injecting but keeps the plan's counts for [`report`]: a run's final accounting
/// compares them with the engine's counters, with nothing more injected meanwhile.
pub fn freeze() {
    #[cfg(feature = "fault-injection")]
    imp::freeze();
}

/// Calls and injections per kind with a rule since the plan was installed (empty when the
/// hooks are not built).
pub fn report() -> Report {
    #[cfg(feature = "fault-injection")]
    return imp::report();
    #[cfg(not(feature = "fault-injection"))]
    Report::default()
}

/// Whether to inject `kind` at this call (counted). Always false without the feature.
#[inline(always)]
pub(crate) fn hit(kind: Kind) -> bool {
    #[cfg(feature = "fault-injection")]
    return imp::hit(kind);
    #[cfg(not(feature = "fault-injection"))]
    {
        let _ = kind;
        false
    }
}

/// Sleeps for delay kind `kind` when its rule says so.
#[inline(always)]
pub(crate) fn pause(kind: Kind) {
    #[cfg(feature = "fault-injection")]
    if imp::hit(kind) {
        std::thread::sleep(imp::delay_of(kind));
    }
    #[cfg(not(feature = "fault-injection"))]
    let _ = kind;
}

/// A fault thread about to serve a fault: stalls when `fault_stall` says so.
#[inline(always)]
pub(crate) fn fault_stall() {
    pause(Kind::FaultStall)
}

#[cfg(feature = "fault-injection")]
thread_local! {
    /// Whether this thread is in a [`NoAlloc`] section.
    static NO_ALLOC: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// A section of a pager thread that must not allocate: it runs while a fork may hold
/// malloc's locks (forkgate.rs), so an allocation there could hang the program. With the
/// `fault-injection` feature the thread is marked while the guard lives, and a test's
/// global allocator asks [`in_no_alloc_section`] to count what such sections allocate
/// (tests/fork_safety.rs). Without it, nothing.
#[must_use]
pub(crate) struct NoAlloc(());

/// Marks the calling thread as in a [`NoAlloc`] section until the guard drops.
#[inline(always)]
pub(crate) fn no_alloc() -> NoAlloc {
    #[cfg(feature = "fault-injection")]
    NO_ALLOC.with(|c| c.set(true));
    NoAlloc(())
}

impl Drop for NoAlloc {
    #[inline(always)]
    fn drop(&mut self) {
        #[cfg(feature = "fault-injection")]
        NO_ALLOC.with(|c| c.set(false));
    }
}

/// Whether the calling thread is in a section that must not allocate (always false
/// without the `fault-injection` feature). Allocates nothing: for global allocators.
pub fn in_no_alloc_section() -> bool {
    #[cfg(feature = "fault-injection")]
    return NO_ALLOC.try_with(|c| c.get()).unwrap_or(false);
    #[cfg(not(feature = "fault-injection"))]
    false
}

/// A compressor's answer, possibly failed (`None`) or given a garbage length.
#[inline(always)]
pub(crate) fn compressed(n: Option<usize>) -> Option<usize> {
    let n = n?;
    if hit(Kind::CompressFail) {
        return None;
    }
    if n > 1 && hit(Kind::CompressGarbage) {
        // Shorter than the stream: the tail sequence is cut, so the stored object no longer
        // decodes to a whole page (checked on every decompression).
        return Some(n - 1 - n / 4);
    }
    Some(n)
}

fn os_err(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

/// `file.write_all_at(buf, offset)`, through the write hooks. `buf.len()` and `offset` are
/// page multiples (O_DIRECT), so a short write stops at a page boundary.
#[inline(always)]
pub(crate) fn write_all_at(file: &File, buf: &[u8], offset: u64) -> io::Result<()> {
    if !ENABLED {
        return file.write_all_at(buf, offset);
    }
    pause(Kind::WriteSlow);
    if hit(Kind::FileWriteEio) {
        return Err(os_err(libc::EIO));
    }
    if hit(Kind::FileWriteEnospc) {
        return Err(os_err(libc::ENOSPC));
    }
    let mut done = 0;
    while done < buf.len() {
        let mut want = buf.len() - done;
        let page = crate::page::PAGE_SIZE;
        if want >= 2 * page && hit(Kind::FileWriteShort) {
            want = (want / 2) / page * page;
        }
        match file.write_at(&buf[done..done + want], offset + done as u64) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::WriteZero, "the swap file took no bytes")),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `file.read_at(buf, offset)`, through the read hooks: may fail with EIO or return fewer
/// bytes than asked (a page multiple), as a real read may.
#[inline(always)]
pub(crate) fn read_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    read_tagged(file, buf, offset, None)
}

/// [`read_at`], served from a read ahead under `tag` where one holds the bytes
/// (`ioring::read_tagged`). The hooks come first, so an injected failure fails the read
/// whatever a read ahead holds.
#[inline(always)]
pub(crate) fn read_tagged(file: &File, buf: &mut [u8], offset: u64, tag: Option<u64>) -> io::Result<usize> {
    let read = |buf: &mut [u8]| match tag {
        Some(t) => crate::ioring::read_tagged(file, buf, offset, t),
        None => crate::ioring::read_at(file, buf, offset),
    };
    if !ENABLED {
        return read(buf);
    }
    pause(Kind::ReadSlow);
    if hit(Kind::FileReadEio) {
        return Err(os_err(libc::EIO));
    }
    let page = crate::page::PAGE_SIZE;
    if buf.len() >= 2 * page && hit(Kind::FileReadShort) {
        let short = (buf.len() / 2) / page * page;
        return read(&mut buf[..short]);
    }
    read(buf)
}

/// `file.read_exact_at(buf, offset)`, through the read hooks.
#[inline(always)]
pub(crate) fn read_exact_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<()> {
    let mut got = 0;
    while got < buf.len() {
        match read_at(file, &mut buf[got..], offset + got as u64) {
            Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "the swap file ended early")),
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn specs_parse_and_print() {
        let s: Spec = "pool_alloc:1/50, file_write_eio:1/100,read_slow:5ms@1/20,seed=7".parse().unwrap();
        assert_eq!(s.seed, 7);
        assert_eq!(s.rules.len(), 3);
        assert_eq!(s.rules[0], Rule { kind: Kind::PoolAlloc, num: 1, den: 50, delay: Duration::ZERO });
        assert_eq!(s.rules[2], Rule { kind: Kind::ReadSlow, num: 1, den: 20, delay: Duration::from_millis(5) });
        let again: Spec = s.to_string().parse().unwrap();
        assert_eq!(again, s);
        let a: Spec = "fault_stall:200us@always".parse().unwrap();
        assert_eq!((a.rules[0].num, a.rules[0].den, a.rules[0].delay), (1, 1, Duration::from_micros(200)));
    }

    #[test]
    fn bad_specs_say_what_is_wrong() {
        for (spec, says) in [
            ("pool_allok:1/2", "unknown kind"),
            ("pool_alloc", "no ':'"),
            ("pool_alloc:1/0", "0 < D"),
            ("pool_alloc:3/2", "N ≤ D"),
            ("pool_alloc:5ms@1/2", "takes no delay"),
            ("read_slow:1/2", "needs a delay"),
            ("read_slow:5m@1/2", "us, ms or s"),
            ("seed=x", "seed"),
        ] {
            let e = spec.parse::<Spec>().expect_err(spec).to_string();
            assert!(e.contains(says), "{spec}: {e}");
        }
    }

    #[cfg(feature = "fault-injection")]
    #[test]
    fn decisions_follow_the_rate_and_the_seed() {
        // The only unit test that installs a plan (the others in this crate run beside it).
        let spec = Spec::new().seed(42).rule(Kind::FaultStall, 1, 4);
        install(&spec).unwrap();
        let first: Vec<bool> = (0..4000).map(|_| hit(Kind::FaultStall)).collect();
        let n = first.iter().filter(|&&h| h).count();
        assert!((800..1200).contains(&n), "about 1 in 4: {n}");
        assert_eq!(report().injected(Kind::FaultStall), n as u64);
        assert_eq!(report().kinds[0].calls, 4000);
        assert!(!hit(Kind::PoolAlloc), "no rule, no injection");
        install(&spec).unwrap();
        let second: Vec<bool> = (0..4000).map(|_| hit(Kind::FaultStall)).collect();
        assert_eq!(first, second, "same seed, same decisions");
        install(&spec.clone().seed(43)).unwrap();
        let third: Vec<bool> = (0..4000).map(|_| hit(Kind::FaultStall)).collect();
        assert_ne!(first, third, "another seed, other decisions");
        clear();
        assert!(!hit(Kind::FaultStall));
        assert_eq!(report(), Report::default());
    }

    #[cfg(not(feature = "fault-injection"))]
    #[test]
    fn without_the_feature_install_refuses() {
        assert!(matches!(install(&Spec::new()), Err(InjectError::NotBuilt)));
        assert!(!hit(Kind::PoolAlloc));
    }
}
