//! What a user chooses: budget, tiers, compressor, region hints; and the parsers for them.

use std::path::PathBuf;

use thiserror::Error;

/// The smallest budget a pager accepts: room for its fault threads' in-flight pages,
/// one inactive batch and the pool's first spans. Below this reclaim cannot keep up.
pub const MIN_BUDGET_BYTES: u64 = 4 << 20;

/// Default largest swap-in: 64 KiB, the reference RFC's order (000).
pub const DEFAULT_SWAPIN_MAX_PAGES: u32 = 16;
/// Default first large swap-in of a stream, in pages (8 KiB).
pub const DEFAULT_SWAPIN_START_PAGES: u32 = 2;
/// Default share of present pages active pages may hold before reclaim demotes them (0: off).
pub const DEFAULT_ACTIVE_PROTECT_PCT: u32 = 0;
/// Default adaptive spin of the fault threads, µs (see `PagerConfig::fault_spin_us`).
pub const DEFAULT_FAULT_SPIN_US: u32 = 0;
/// Default nice value of the reclaim and writeback threads (see
/// `PagerConfig::background_nice`).
pub const DEFAULT_BACKGROUND_NICE: i32 = 0;
/// Whether fault threads reclaim directly by default (see `PagerConfig::direct_reclaim`).
pub const DEFAULT_DIRECT_RECLAIM: bool = true;
/// Whether fault threads are pinned one per CPU by default (see `PagerConfig::fault_pin`).
pub const DEFAULT_FAULT_PIN: bool = true;
/// First-touch fault-around's default largest window, in pages (256 KiB).
pub const DEFAULT_FAULT_AROUND_MAX_PAGES: u32 = 64;
/// First-touch fault-around's largest window allowed, in pages (2 MiB).
pub const MAX_FAULT_AROUND_PAGES: usize = 512;
/// Largest swap-in a user may ask for: 2 MiB.
pub const MAX_SWAPIN_PAGES: u32 = 512;
/// Default cap of the disk readahead window, in pages (128 KiB).
pub const DEFAULT_READAHEAD_MAX_PAGES: u32 = 32;
/// Default cap of stride prefetch's window, in pages.
pub const DEFAULT_STRIDE_PREFETCH_MAX_PAGES: u32 = 32;
/// Default bytes per file unit (one write).
pub const DEFAULT_FILE_UNIT_BYTES: usize = 64 << 10;

/// How a region will be accessed (the `madvise` hint analogue); steers large swap-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum Hint {
    /// No hint: large swap-in needs locality evidence.
    #[default]
    Normal,
    /// MADV_SEQUENTIAL: large swap-in admitted.
    Sequential,
    /// MADV_RANDOM: large swap-in vetoed.
    Random,
}

/// The compressor of the in-memory pool.
///
/// The default is zstd's fast level 1 (`zstd-fast`, level -1): the pool shares the budget
/// with the program's pages, and every object the pool cannot hold goes to the disk, so
/// density is speed. On the lab's pages it stores a page in ~565 bytes against lz4's
/// ~2,060 for ~14 µs of compression against ~7 (a 4 KiB context, literals left raw) and
/// ~5.8 µs of decompression against ~3.5: in the acceptance lab every refault of the seed
/// suite was as fast or faster than with lz4 (sparse ones 2.4–2.6×), swap-out 13–21 %
/// slower on the counter workloads and faster on `mixed` (docs/design.md, Defaults and the labs behind them).
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Compressor {
    /// LZ4 block format (lz4_flex): the fastest, ratio ~2 on typical heaps.
    Lz4,
    /// Zstandard at the given level: better ratio, slower decompression.
    Zstd {
        /// Compression level: 1 to 19, or a fast level -1 to -7 (`zstd --fast=N`:
        /// literals left uncompressed, faster still).
        level: i32,
    },
}

/// The fastest zstd level offered, as `zstd-fast-N` (level -N).
pub const ZSTD_FAST_MAX: i32 = 7;

/// The default pool compressor: zstd's fast level 1 (see [`Compressor`]).
pub const DEFAULT_COMPRESSOR: Compressor = Compressor::Zstd { level: -1 };

impl Default for Compressor {
    fn default() -> Compressor {
        DEFAULT_COMPRESSOR
    }
}

/// The default recompression codec: none. zstd (level 1) stores the lab's counter pages in
/// ~570 bytes against lz4's ~2,060, and a sparse refault then decompresses one in ~10 µs
/// instead of reading the disk (~130 µs); but recompressing costs ~30 µs of CPU per object
/// while the program evicts, and on 2 CPUs swap-out took 2.3× as long in the lab. So it
/// is opt-in (`recompress: Some(Compressor::Zstd { level: 1 })`, `--recompress zstd`).
pub const DEFAULT_RECOMPRESS: Option<Compressor> = None;

/// Parses `--recompress`: a compressor, or `none`.
pub fn parse_recompress(s: &str) -> Result<Option<Compressor>, ConfigError> {
    if s.trim().eq_ignore_ascii_case("none") {
        Ok(None)
    } else {
        s.parse().map(Some)
    }
}

impl std::str::FromStr for Compressor {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let s = s.trim().to_ascii_lowercase();
        match s.as_str() {
            "lz4" => Ok(Compressor::Lz4),
            "zstd" => Ok(Compressor::Zstd { level: 1 }),
            "zstd-fast" | "zstd:fast" => Ok(Compressor::Zstd { level: -1 }),
            _ => {
                let level =
                    |t: &str, range: std::ops::RangeInclusive<i32>| t.parse::<i32>().ok().filter(|l| range.contains(l));
                let fast = s.strip_prefix("zstd-fast-").or_else(|| s.strip_prefix("zstd:fast:"));
                let normal = s.strip_prefix("zstd:").or_else(|| s.strip_prefix("zstd-"));
                match (fast, normal) {
                    (Some(n), _) => level(n, 1..=ZSTD_FAST_MAX).map(|n| -n),
                    (None, Some(l)) => level(l, 1..=19),
                    (None, None) => None,
                }
                .map(|level| Compressor::Zstd { level })
                .ok_or_else(|| ConfigError::Compressor(s.clone()))
            }
        }
    }
}

/// Which tiers a pager may use, top (fastest) to bottom.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct Tiers {
    /// Zero and same-filled pages stored in the swap entry itself.
    pub zero: bool,
    /// The compressed in-memory pool.
    pub pool: bool,
    /// The disk file (unlinked, 0600) below the pool.
    pub file: bool,
}

impl Default for Tiers {
    fn default() -> Self {
        Tiers { zero: true, pool: true, file: true }
    }
}

impl std::str::FromStr for Tiers {
    type Err = ConfigError;
    /// Parses a comma-separated list such as `zero,pool,file`.
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        let mut t = Tiers { zero: false, pool: false, file: false };
        for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
            match word {
                "zero" => t.zero = true,
                "pool" => t.pool = true,
                "file" => t.file = true,
                other => return Err(ConfigError::Tier(other.to_string())),
            }
        }
        if !t.pool && !t.file {
            return Err(ConfigError::NoStorageTier(s.to_string()));
        }
        Ok(t)
    }
}

/// The remote tier: a Redis / Valkey cluster holding sealed compressed records
/// ([`crate::backend::remote`]).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RemoteConfig {
    /// Cluster seeds, `host:port` each: any node of the cluster (the slot map is read from them).
    pub seeds: Vec<String>,
    /// A write is done once this many replicas have it too (`WAIT`); 0 takes the
    /// primary's acknowledgement.
    pub replicas: u32,
    /// Timeout of one connect, read or write, and of `WAIT`, in milliseconds.
    pub timeout_ms: u64,
    /// Time to live of every object, a backstop for pagers that die without deleting
    /// their keys, in milliseconds. A page remote for longer is lost: keep it long.
    pub ttl_ms: u64,
    /// Attempts a fault makes to read a remote page before the thread gets SIGBUS.
    pub fault_tries: u32,
    /// Wait before the second attempt, doubled for each further one (capped at 1 s), ms.
    pub retry_backoff_ms: u64,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            seeds: Vec::new(),
            replicas: 0,
            timeout_ms: 1000,
            ttl_ms: 7 * 24 * 3600 * 1000,
            fault_tries: 3,
            retry_backoff_ms: 300,
        }
    }
}

/// Parses a `--tiers` list that may name a remote tier:
/// `zero,pool,remote=redis://host:port[,host:port…][,file]`. Words after `remote=` that
/// are not tier names are further seeds.
pub fn parse_tiers(s: &str) -> Result<(Tiers, Option<RemoteConfig>), ConfigError> {
    let mut rest = Vec::new();
    let mut remote: Option<RemoteConfig> = None;
    for word in s.split(',').map(str::trim).filter(|w| !w.is_empty()) {
        if let Some(url) = word.strip_prefix("remote=") {
            let seed = url
                .strip_prefix("redis://")
                .or_else(|| url.strip_prefix("valkey://"))
                .ok_or_else(|| ConfigError::Remote(word.to_string()))?;
            remote = Some(RemoteConfig { seeds: vec![check_seed(seed, word)?], ..RemoteConfig::default() });
        } else if matches!(word, "zero" | "pool" | "file") {
            rest.push(word);
        } else if let Some(r) = remote.as_mut() {
            let seed = word.strip_prefix("redis://").unwrap_or(word);
            r.seeds.push(check_seed(seed, word)?);
        } else {
            return Err(ConfigError::Tier(word.to_string()));
        }
    }
    let mut tiers = Tiers { zero: false, pool: false, file: false };
    for w in rest {
        match w {
            "zero" => tiers.zero = true,
            "pool" => tiers.pool = true,
            _ => tiers.file = true,
        }
    }
    if !tiers.pool && !tiers.file {
        return Err(ConfigError::NoStorageTier(s.to_string()));
    }
    if remote.is_some() && !tiers.pool {
        return Err(ConfigError::RemoteWithoutPool(s.to_string()));
    }
    Ok((tiers, remote))
}

fn check_seed(seed: &str, word: &str) -> Result<String, ConfigError> {
    let seed = seed.trim_end_matches('/');
    match seed.rsplit_once(':') {
        Some((host, port)) if !host.is_empty() && port.parse::<u16>().is_ok() => Ok(seed.to_string()),
        _ => Err(ConfigError::Remote(word.to_string())),
    }
}

/// Everything a [`crate::Pager`] is built from. `Default` serves on one machine with no setup.
#[derive(Clone, Debug, serde::Serialize)]
pub struct PagerConfig {
    /// The memory budget: present + staged pages + pool bytes + metadata stay under it.
    pub budget_bytes: u64,
    /// Which tiers may hold swapped pages.
    pub tiers: Tiers,
    /// The pool's compressor.
    pub compressor: Compressor,
    /// The codec pool writeback first tries on a cold object before it writes the object to
    /// a lower tier (zram's recompression): an object that shrinks by a quarter or more stays
    /// in the pool in this codec. `None` writes cold objects back as they are.
    pub recompress: Option<Compressor>,
    /// Most bytes the pool may hold before writeback to the file tier; `None` picks
    /// half the budget (see [`PagerConfig::pool_max_bytes`]).
    pub pool_max_bytes: Option<u64>,
    /// Directory of the swap file; `None` means `$TMPDIR` (or /tmp).
    pub swap_dir: Option<PathBuf>,
    /// Fault threads reading the userfaultfd; 0 means one per CPU.
    pub fault_threads: usize,
    /// Cap of the readahead window for disk-backed slots, in pages; 1 turns readahead off.
    pub readahead_max_pages: u32,
    /// Stride prefetch's largest window, in pages (0 turns it off): once a region's lone
    /// swapped-in faults keep one stride, the next pages along it are brought into place
    /// before the program touches them (`policy/stride.rs`). Lab variant `prefetch=N`.
    pub stride_prefetch_max_pages: u32,
    /// A clean page read back from its kept file slot a second time gives the slot up, so
    /// its next eviction stores it in the pool instead of dropping it back to the file: a
    /// hot set read from the file once stops being read from the file on every pass. The
    /// first read marks the file entry (its referenced bit, unused on the file otherwise).
    /// Off by default: with the pool at 192 MiB of 256 it cut a 2 GiB hotset's file reads
    /// from 196,608 to 49,153 but its refault only from 2.42 s to 2.14 s (the hot set still
    /// churns through the pool), and changed nothing on the seed workloads tried
    /// (`docs/lab/pool-192M-spans`). Lab variant `[no-]reread-to-pool`.
    pub reread_to_pool: bool,
    /// Bytes of one file write (a unit of packed records): a power of two, 64 KiB to 4 MiB.
    /// Larger units mean fewer, larger IOs (flash likes them) and larger read buffers.
    pub file_unit_bytes: usize,
    /// A whole-unit file read also takes the unit after the last one its records reach, when
    /// the read buffer holds it (64 KiB units: one 128 KiB read instead of 64 KiB). On by
    /// default: stride64_sparse refaults 1.26–1.39× as fast (half the reads), the rest of
    /// the seed suite within its spread (`docs/lab/read-next-unit`). Lab variant
    /// `[no-]read-next-unit`.
    pub file_read_next_unit: bool,
    /// How a fault in swapped memory picks how many pages to bring in (large swap-in).
    pub swapin_policy: SwapinPolicy,
    /// Largest swap-in, in pages: a power of two from 1 (4 KiB) to 512 (2 MiB); default 16 (64 KiB).
    pub swapin_max_pages: u32,
    /// A stream's first large swap-in, in pages (a power of two, 1 to `swapin_max_pages`;
    /// default 2): a fault right after a lone fault's page brings this many, and each
    /// fault that continues the stream twice as many, up to `swapin_max_pages`. A program
    /// reading objects that straddle a page boundary at random (a 1 KiB value of a server's
    /// heap) continues a "stream" of two pages: starting the window at 64 KiB brought 15
    /// pages nobody wanted with such a fault (`policy/admission.rs`).
    pub swapin_start_pages: u32,
    /// Active pages (a page refaulted from the inactive list, or swapped in within a
    /// budget's worth of evictions of its eviction: the workingset) stay present, passed
    /// over by reclaim's hand for as long as they are at most this percentage of the
    /// present pages it sees; above it, the hand demotes those it meets (they get one more
    /// round). 0: every active page gets one more round only. With it on, a fault on a
    /// staged page activates that page alone, not the neighbours fault-around brings back
    /// with it. A server's small hot objects (a hash table, its entries, keys) are touched
    /// at random every few seconds while a stream of cold values goes out: passed over for
    /// one round only, they were staged and evicted between their touches, and each
    /// request paid for them again.
    pub active_protect_pct: u32,
    /// Under the locality policy, learn whether the program reads whole 64 KiB blocks when
    /// it faults on one out of order: if lone faults are mostly followed by a fault on the
    /// next page, a lone fault brings its whole block in (one fault a block instead of two),
    /// one in eight staying a page to keep measuring (`policy/admission.rs`).
    pub swapin_learn_blocks: bool,
    /// Map staged neighbours of a faulting page in the same call (fault-around).
    pub fault_around: bool,
    /// First-touch fault-around's largest window, in pages (a power of two, 1 to
    /// [`MAX_FAULT_AROUND_PAGES`]; default 64, 256 KiB): a program filling memory in order
    /// gets 64 KiB mapped with its fault, then twice as much each fault while it goes on,
    /// up to this and to 1/64 of the budget.
    pub fault_around_max_pages: u32,
    /// Workingset detection: evicted pages keep an eviction time, and a page refaulted
    /// soon after its eviction is activated at once.
    pub workingset: bool,
    /// The pool's share of the budget follows the workload (`policy/pool_share.rs`): it
    /// starts at five eighths of the budget, goes down toward `pool_max_bytes()` (half)
    /// when refaults show the program's pages no longer fit beside it, and back up on reads
    /// of file records a bigger pool would still hold. Only with the default limit
    /// (`pool_max_bytes` None), a file tier and no remote; on by default. The lab's sparse
    /// refaults went 1.73 → 1.13 ÷ kernel-zswap (random64_sparse) and 1.35 → 1.17
    /// (stride64_sparse), usama_1g 0.67 → 0.61, while a 96 MiB hot set under 256 MiB
    /// (`hotset`, 2 GiB) refaulted in 0.64 s against 0.47 s at a fixed half (variant
    /// `[no-]pool-adapt`).
    pub pool_adapt: bool,
    /// Clean pages: a page swapped in from the pool keeps its slot while it stays
    /// unwritten, so evicting it again costs no compression.
    pub keep_clean: bool,
    /// Encrypt and authenticate the file tier's records (ChaCha20-Poly1305, an ephemeral
    /// per-pager key); `false` keeps only the crc32c checksum.
    pub encrypt: bool,
    /// Microseconds a fault thread keeps polling the userfaultfd after serving a fault
    /// before it sleeps (faults come in bursts; waking a sleeping thread on another CPU costs
    /// tens of µs on VMs, docs/design.md, Fault hand-off and wake-ups). 0 sleeps at once.
    pub fault_spin_us: u32,
    /// Nice value (0 to 19) of the reclaim and writeback threads. Above the fault threads'
    /// 0, the scheduler runs a woken fault thread before them on a busy CPU; 0 treats them
    /// alike.
    pub background_nice: i32,
    /// Direct reclaim: a fault thread whose fault must wait for room evicts staged blocks
    /// itself, beside the reclaim thread, instead of sleeping (the kernel's direct reclaim).
    /// Compression then runs on the program's CPU too, which otherwise idles while it waits.
    /// In signal mode, where a fault waits inside the program's own thread (a signal
    /// handler is no place to evict from), one reclaim helper per CPU does it instead: a
    /// waiting fault wakes them, and the one pinned to the waiting thread's CPU runs there.
    /// On by default with the zstd pool, whose compression costs twice
    /// lz4's: swap-out of 1 GiB of the lab's pages under 256 MiB (pool at 192 MiB) took
    /// 4.3 s with it against 6.0 s without (lab variant `[no-]direct-reclaim`).
    pub direct_reclaim: bool,
    /// While fewer than two batches of pages (2 MiB) are staged, the reclaim thread stages
    /// two batches of blocks for each one it evicts, so that direct reclaimers (fault
    /// threads, reclaim helpers), which evict from the inactive list but never stage, find
    /// blocks there. Staging one batch per batch evicted, the thread refilled only what it
    /// took itself: during the lab's 1 GiB swap-out the fault threads found the list empty
    /// and slept for room ~200 times, 0.5–0.66 s in all, while their CPU idled; with the
    /// reserve ~20 times, and swap-out of usama_1g takes 2.09 s instead of 2.25. Always two
    /// batches did as well there but filled the list to its target, whose pages a sparse
    /// refault then touched (random64_sparse 0.29 → 0.33 s); direct reclaimers staging for
    /// themselves did too, but two threads moving pages in one region contend on its
    /// page-table locks and flush the TLB page by page (the zero workload's refault went
    /// 0.9 → 2.4 s). On by default; lab variant `[no-]stage-ahead`.
    pub stage_ahead: bool,
    /// Reclaim evicts on to its low watermark (1/12 under the budget) only while faults wait
    /// for room: when none did during its last batch it stops at the high watermark (1/32
    /// under). Taking any fault during the batch as the sign (off), a program faulting
    /// slower than reclaim evicts — a sparse refault, whose reclaim thread is its bottleneck
    /// (compressing what each fault displaces) — pays for evictions it never needs:
    /// stride64_sparse refaulted in 0.30 s off against 0.25 s on (`docs/lab/current`, the
    /// `no-throttle-headroom` column). On by default; lab variant `[no-]throttle-headroom`.
    pub throttle_headroom: bool,
    /// Run the reclaim and writeback threads under SCHED_IDLE: a fault thread woken on their
    /// CPU preempts them at once instead of waiting out their time slice. They still run
    /// whenever a CPU has nothing else, which includes every time the program waits for room.
    pub background_idle: bool,
    /// Pin fault thread `i` to the `i`-th CPU this process may run on. The one pinned to the
    /// faulting CPU runs as soon as the faulting thread sleeps, without waking a halted CPU
    /// (docs/design.md, Fault hand-off and wake-ups), and its install wakes the faulting thread on that same CPU. Takes effect
    /// with one fault thread per CPU (the default).
    pub fault_pin: bool,
    /// While one program thread faults at a time, only the fault thread on that thread's
    /// CPU polls the userfaultfd, and the lead moves when the program does; the others
    /// sleep on an eventfd of their own (`mm/watch.rs`). Every poller is woken by every fault:
    /// without following, each fault also wakes the fault threads on the other CPUs, a
    /// cross-CPU wake-up the faulting thread pays for and a switch that takes the other
    /// CPU from the reclaim thread. Faults of two program threads close together put every
    /// fault thread back on the userfaultfd, and so does a leader about to sleep for room.
    /// random64_sparse refaults in 0.23 s instead of 0.31 (`docs/lab/current`, the
    /// `no-follow` column), the other single-threaded refaults 3–7 % faster. Takes effect with `fault_pin` and more than one
    /// fault thread; on by default; lab variant `[no-]follow`.
    pub fault_follow: bool,
    /// Reclaim drops the mirror copies of evicted pages 8 blocks at a time, with one
    /// process_madvise (adjacent blocks merged into one range): one TLB shootdown of the
    /// program's CPU instead of one per block. On by default: refault 1.08× as fast on
    /// usama_1g, 1.12× on samefill, 1.05× on usemem and concurrent, the other workloads
    /// within their spread, and swap-out of usama_1g 2.12 s against 2.32 s, under the
    /// kernel's 2.17 s only with it (`docs/lab/at-62658fd`). A loss once seen with it on was
    /// reclaim reaching into reused addresses (RELIABILITY.md), with it on or off. Lab
    /// variant `[no-]batch-release`.
    pub batch_release: bool,
    /// Reclaim stages up to 16 blocks of a 2 MiB chunk per UFFDIO_MOVE (one per run of
    /// present pages, one TLB shootdown of the program's CPU) instead of one block per
    /// move. On by default: with the zstd-fast pool and direct reclaim,
    /// swap-out 17–19 % faster on usama_1g, random64_sparse, stride64_sparse and
    /// random64_full, and refaults 1.03–1.17× as fast (`docs/lab/batch-stage-zstd`, 5 runs
    /// side by side). It had been off: with lz4 and no direct reclaim it made
    /// random64_sparse 12 % slower (`docs/lab/batch-split`), and 24–26 % with
    /// `batch_release` in three labs. Lab variant `[no-]batch-stage`.
    pub batch_stage: bool,
    /// The remote tier below the pool (pool writeback goes there first), if any.
    pub remote: Option<RemoteConfig>,
    /// Who serves a fault: a fault thread woken by the userfaultfd, or the faulting thread
    /// itself in a SIGBUS handler ([`FaultMode`]).
    pub fault_mode: FaultMode,
}

/// Who serves a fault on a swapped-out page.
///
/// - `Thread`: the faulting thread sleeps in the kernel while a fault thread reads the
///   userfaultfd's message and installs the page. Works for every access, a system call's
///   included, but each fault pays a hand-off between CPUs (~80 µs on a VM whose idle vCPU
///   halts, docs/design.md, Fault hand-off and wake-ups).
/// - `Signal`: the userfaultfd raises SIGBUS in the faulting thread (UFFD_FEATURE_SIGBUS) and
///   tierswap's handler installs the page right there: no hand-off (~10 µs a fault here).
///   The limit: an access by the *kernel* (a `read(2)` into a swapped-out buffer, a
///   `write(2)` from one) is not a fault any thread can serve, and the system call fails with
///   EFAULT (or returns short). Use it for memory the program touches itself, not buffers it
///   hands to system calls, or touch them first ([`crate::Region::prefault`]). The program
///   must not replace the SIGBUS handler without calling the previous one for signals that
///   are not its own ([`crate::sigbus`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum FaultMode {
    /// Fault threads serve faults (the default: every access works).
    #[default]
    Thread,
    /// The faulting thread serves its own fault in a SIGBUS handler.
    Signal,
}

impl std::str::FromStr for FaultMode {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "thread" => Ok(FaultMode::Thread),
            "signal" => Ok(FaultMode::Signal),
            other => Err(ConfigError::FaultMode(other.to_string())),
        }
    }
}

/// How the fault path picks the size of a swap-in.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
pub enum SwapinPolicy {
    /// Large swap-in where the region's hint or its recent faults show locality (the default).
    #[default]
    Locality,
    /// Always one page per fault (the kernel's order-0 swap-in).
    Order0,
    /// Large swap-in whenever the range qualifies, locality or not (for measurement).
    Always,
}

impl std::str::FromStr for SwapinPolicy {
    type Err = ConfigError;
    fn from_str(s: &str) -> Result<Self, ConfigError> {
        match s.trim().to_ascii_lowercase().as_str() {
            "locality" | "default" => Ok(SwapinPolicy::Locality),
            "order0" => Ok(SwapinPolicy::Order0),
            "always" => Ok(SwapinPolicy::Always),
            other => Err(ConfigError::Policy(other.to_string())),
        }
    }
}

impl Default for PagerConfig {
    fn default() -> Self {
        PagerConfig {
            budget_bytes: 256 << 20,
            tiers: Tiers::default(),
            compressor: Compressor::default(),
            recompress: DEFAULT_RECOMPRESS,
            pool_max_bytes: None,
            swap_dir: None,
            fault_threads: 0,
            readahead_max_pages: DEFAULT_READAHEAD_MAX_PAGES,
            stride_prefetch_max_pages: DEFAULT_STRIDE_PREFETCH_MAX_PAGES,
            reread_to_pool: false,
            file_unit_bytes: DEFAULT_FILE_UNIT_BYTES,
            file_read_next_unit: true,
            swapin_policy: SwapinPolicy::default(),
            swapin_max_pages: DEFAULT_SWAPIN_MAX_PAGES,
            swapin_start_pages: DEFAULT_SWAPIN_START_PAGES,
            active_protect_pct: DEFAULT_ACTIVE_PROTECT_PCT,
            swapin_learn_blocks: true,
            fault_around: true,
            fault_around_max_pages: DEFAULT_FAULT_AROUND_MAX_PAGES,
            workingset: true,
            keep_clean: true,
            encrypt: true,
            fault_spin_us: DEFAULT_FAULT_SPIN_US,
            background_nice: DEFAULT_BACKGROUND_NICE,
            fault_pin: DEFAULT_FAULT_PIN,
            fault_follow: true,
            batch_release: true,
            batch_stage: true,
            background_idle: false,
            direct_reclaim: DEFAULT_DIRECT_RECLAIM,
            stage_ahead: true,
            throttle_headroom: true,
            pool_adapt: true,
            remote: None,
            fault_mode: FaultMode::default(),
        }
    }
}

impl PagerConfig {
    /// The pool limit in force. Default: half the budget. zswap's default is 20 % of RAM,
    /// but here the pool is inside the budget: a pool too small sends warm pages to disk,
    /// one too large leaves no room for the working set; half keeps refaults in memory for
    /// data compressing 2:1 up to the budget's size again.
    pub fn pool_max_bytes(&self) -> u64 {
        match self.pool_max_bytes {
            Some(b) => b.min(self.budget_bytes),
            None if !self.tiers.file && self.remote.is_none() => self.budget_bytes,
            None => self.budget_bytes / 2,
        }
    }

    /// Whether the pool limit moves (`pool_adapt`, with the default limit, a file tier and
    /// no remote).
    pub fn pool_adapts(&self) -> bool {
        self.pool_adapt && self.pool_max_bytes.is_none() && self.tiers.file && self.remote.is_none()
    }

    /// Where the pool limit starts and the most it grows to: five eighths of the budget
    /// when it follows the workload ([`PagerConfig::pool_adapts`]), else
    /// [`PagerConfig::pool_max_bytes`] (where it stays). At six eighths the lab's sparse
    /// refaults were as fast (1.18 and 1.15 ÷ kernel-zswap against 1.13 and 1.17), but a
    /// 96 MiB hot set under 256 MiB refaulted 2.3× slower than at half, against 1.4× at 5/8.
    pub fn pool_limit_top(&self) -> u64 {
        if self.pool_adapts() {
            (self.budget_bytes / 8 * 5).max(self.pool_max_bytes())
        } else {
            self.pool_max_bytes()
        }
    }

    /// Whether fault threads reclaim directly: `direct_reclaim`, in thread mode only (as
    /// documented there). In signal mode the program's threads serve their own faults and
    /// the fault thread mostly reads the events a fork, munmap or madvise waits on: its
    /// time goes to those, not to evicting.
    pub fn reclaims_directly(&self) -> bool {
        self.direct_reclaim && self.fault_mode == FaultMode::Thread
    }

    /// Whether reclaim helpers evict for faults that wait for room: `direct_reclaim` in
    /// signal mode, where the waiting fault runs in a signal handler of the program's
    /// thread and cannot evict itself.
    pub fn reclaims_by_helpers(&self) -> bool {
        self.direct_reclaim && self.fault_mode == FaultMode::Signal
    }

    /// The swap file's directory in force.
    pub fn swap_dir(&self) -> PathBuf {
        self.swap_dir.clone().unwrap_or_else(std::env::temp_dir)
    }

    /// Checks the configuration, saying what to change when it cannot work.
    pub fn validate(&self) -> Result<(), ConfigError> {
        if self.budget_bytes < MIN_BUDGET_BYTES {
            return Err(ConfigError::BudgetTooSmall { budget_bytes: self.budget_bytes });
        }
        if !self.tiers.pool && !self.tiers.file {
            return Err(ConfigError::NoStorageTier(format!("{:?}", self.tiers)));
        }
        let u = self.file_unit_bytes;
        if !u.is_power_of_two() || !(64 << 10..=4 << 20).contains(&u) {
            return Err(ConfigError::FileUnit(u));
        }
        if let Some(r) = &self.remote {
            if r.seeds.is_empty() {
                return Err(ConfigError::Remote("remote= with no seed".into()));
            }
            if !self.tiers.pool {
                return Err(ConfigError::RemoteWithoutPool(format!("{:?}", self.tiers)));
            }
            if r.fault_tries == 0 || r.timeout_ms == 0 || r.ttl_ms == 0 {
                return Err(ConfigError::Remote("remote tries, timeout and ttl must be above 0".into()));
            }
        }
        let m = self.swapin_max_pages;
        if !m.is_power_of_two() || m > MAX_SWAPIN_PAGES {
            return Err(ConfigError::SwapinMax(m as u64 * crate::page::PAGE_SIZE as u64));
        }
        if self.active_protect_pct > 100 {
            return Err(ConfigError::ActiveProtect(self.active_protect_pct));
        }
        let st = self.swapin_start_pages;
        if !st.is_power_of_two() || st > MAX_SWAPIN_PAGES {
            return Err(ConfigError::SwapinStart(st as u64 * crate::page::PAGE_SIZE as u64));
        }
        if !(0..=19).contains(&self.background_nice) {
            return Err(ConfigError::BackgroundNice(self.background_nice));
        }
        Ok(())
    }
}

/// A configuration value that cannot be used.
#[derive(Debug, Error, PartialEq, Eq)]
pub enum ConfigError {
    /// A size like `512M` did not parse.
    #[error("cannot parse size '{0}': use a number with an optional K, M, G or T suffix (powers of 1024), e.g. 512M")]
    Size(String),
    /// The budget is below [`MIN_BUDGET_BYTES`].
    #[error("budget {budget_bytes} bytes is below the minimum of 4M the pager needs (fault threads' in-flight pages, one inactive batch, the pool's first spans): give --budget 4M or more")]
    BudgetTooSmall {
        /// The budget asked for.
        budget_bytes: u64,
    },
    /// An unknown tier name.
    #[error("unknown tier '{0}': tiers are zero, pool and file, comma-separated")]
    Tier(String),
    /// Neither pool nor file: nowhere to put a page.
    #[error("tiers '{0}' have nowhere to store a page: include pool or file")]
    NoStorageTier(String),
    /// A nice value for the background threads outside 0 to 19.
    #[error("background nice {0}: give 0 (as the fault threads) to 19 (the reclaim and writeback threads run last)")]
    BackgroundNice(i32),
    /// A file unit size that is not a power of two between 64 KiB and 4 MiB.
    #[error("file unit of {0} bytes: give a power of two from 64K to 4M")]
    FileUnit(usize),
    /// A largest swap-in that is not a power of two from 4 KiB to 2 MiB.
    #[error("largest swap-in of {0} bytes: give a power of two from 4K to 2M (e.g. --swapin-max 64K)")]
    SwapinMax(u64),
    /// The active pages' share is over 100 %.
    #[error("active pages' share of {0} %: give 0 (off) to 100")]
    ActiveProtect(u32),
    /// The first large swap-in of a stream is not a power of two up to 2 MiB.
    #[error("first swap-in of a stream of {0} bytes: give a power of two from 4K to 2M (e.g. swapin-start=8K)")]
    SwapinStart(u64),
    /// An unknown swap-in policy.
    #[error("unknown swap-in policy '{0}': use locality, order0 or always")]
    Policy(String),
    /// An unknown fault mode.
    #[error("unknown fault mode '{0}': use thread or signal")]
    FaultMode(String),
    /// A remote tier that does not parse.
    #[error("remote tier '{0}': give remote=redis://HOST:PORT[,HOST:PORT…] (cluster seeds)")]
    Remote(String),
    /// A remote tier without the pool it writes back from.
    #[error("tiers '{0}': the remote tier takes pool writeback, so it needs pool")]
    RemoteWithoutPool(String),
    /// An unknown compressor.
    #[error("unknown compressor '{0}': use lz4, zstd, zstd:LEVEL (1-19), zstd-fast or zstd-fast-N (1-7)")]
    Compressor(String),
}

/// Parses a size: a decimal number with an optional suffix K, M, G, T (powers of 1024,
/// case-insensitive, an optional trailing `B` or `iB`), or a plain byte count.
pub fn parse_size(s: &str) -> Result<u64, ConfigError> {
    let err = || ConfigError::Size(s.to_string());
    let t = s.trim();
    let lower = t.to_ascii_lowercase();
    let body = lower.strip_suffix("ib").or_else(|| lower.strip_suffix('b')).unwrap_or(&lower);
    let (num, shift) = match body.chars().last() {
        Some('k') => (&body[..body.len() - 1], 10),
        Some('m') => (&body[..body.len() - 1], 20),
        Some('g') => (&body[..body.len() - 1], 30),
        Some('t') => (&body[..body.len() - 1], 40),
        _ => (body, 0),
    };
    let num = num.trim();
    if num.is_empty() || !num.chars().all(|c| c.is_ascii_digit() || c == '.') {
        return Err(err());
    }
    if num.contains('.') {
        let v: f64 = num.parse().map_err(|_| err())?;
        let bytes = v * (1u64 << shift) as f64;
        // `u64::MAX as f64` is 2^64, one past the largest u64: reject it too.
        if !bytes.is_finite() || bytes < 0.0 || bytes >= u64::MAX as f64 {
            return Err(err());
        }
        return Ok(bytes.round() as u64);
    }
    let v: u64 = num.parse().map_err(|_| err())?;
    v.checked_mul(1u64 << shift).ok_or_else(err)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("1K"), Ok(1024));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("1GiB"), Ok(1 << 30));
        assert_eq!(parse_size("2T"), Ok(2 << 40));
        assert_eq!(parse_size("1.5G"), Ok(3 << 29));
        assert!(parse_size("").is_err());
        assert!(parse_size("G").is_err());
        assert!(parse_size("-1M").is_err());
        assert!(parse_size("12Q").is_err());
        assert!(parse_size("99999999999999999999T").is_err());
    }

    #[test]
    fn tiers_and_compressors() {
        assert_eq!("zero,pool".parse::<Tiers>(), Ok(Tiers { zero: true, pool: true, file: false }));
        assert!("zero".parse::<Tiers>().is_err());
        assert!("zero,disk".parse::<Tiers>().is_err());
        assert_eq!("zstd:3".parse::<Compressor>(), Ok(Compressor::Zstd { level: 3 }));
        assert!("zstd:99".parse::<Compressor>().is_err());
        assert!("zstd:0".parse::<Compressor>().is_err(), "0 is zstd's 'default', not a level");
        assert!("zstd:-1".parse::<Compressor>().is_err(), "fast levels are spelled zstd-fast-N");
        assert_eq!("zstd-fast".parse::<Compressor>(), Ok(Compressor::Zstd { level: -1 }));
        assert_eq!("ZSTD-FAST-3".parse::<Compressor>(), Ok(Compressor::Zstd { level: -3 }));
        assert_eq!("zstd:fast:7".parse::<Compressor>(), Ok(Compressor::Zstd { level: -7 }));
        assert!("zstd-fast-8".parse::<Compressor>().is_err());
        assert!("zstd-fast-0".parse::<Compressor>().is_err());
        assert!("gzip".parse::<Compressor>().is_err());
        assert_eq!(parse_recompress("none"), Ok(None));
        assert_eq!(parse_recompress("zstd:2"), Ok(Some(Compressor::Zstd { level: 2 })));
        assert!(parse_recompress("nope").is_err());
    }

    #[test]
    fn remote_tier_syntax() {
        let (t, r) = parse_tiers("zero,pool,remote=redis://127.0.0.1:7000,127.0.0.1:7001,file").unwrap();
        assert_eq!(t, Tiers { zero: true, pool: true, file: true });
        let r = r.unwrap();
        assert_eq!(r.seeds, vec!["127.0.0.1:7000".to_string(), "127.0.0.1:7001".to_string()]);
        let (t, r) = parse_tiers("zero,pool,remote=redis://h:1").unwrap();
        assert!(!t.file);
        assert_eq!(r.unwrap().seeds, vec!["h:1".to_string()]);
        assert_eq!(parse_tiers("zero,pool,file").unwrap(), ("zero,pool,file".parse().unwrap(), None));
        assert!(matches!(parse_tiers("pool,remote=http://h:1"), Err(ConfigError::Remote(_))));
        assert!(matches!(parse_tiers("pool,remote=redis://h"), Err(ConfigError::Remote(_))));
        assert!(matches!(parse_tiers("pool,remote=redis://h:1,bogus"), Err(ConfigError::Remote(_))));
        assert!(matches!(parse_tiers("file,remote=redis://h:1"), Err(ConfigError::RemoteWithoutPool(_))));
        assert!(matches!(parse_tiers("pool,h:1"), Err(ConfigError::Tier(_))));
    }

    #[test]
    fn budget_minimum() {
        let c = PagerConfig { budget_bytes: 1 << 20, ..Default::default() };
        assert!(matches!(c.validate(), Err(ConfigError::BudgetTooSmall { .. })));
        assert!(PagerConfig::default().validate().is_ok());
    }

    proptest! {
        #[test]
        fn size_parser_never_panics(s in ".{0,24}") {
            let _ = parse_size(&s);
        }

        #[test]
        fn size_round_trip(v in 0u64..(1 << 40), suffix in 0usize..4) {
            let (text, want) = match suffix {
                0 => (format!("{v}"), Some(v)),
                1 => (format!("{v}K"), v.checked_mul(1 << 10)),
                2 => (format!("{v}M"), v.checked_mul(1 << 20)),
                _ => (format!("{v}G"), v.checked_mul(1 << 30)),
            };
            match want {
                Some(w) => prop_assert_eq!(parse_size(&text), Ok(w)),
                None => prop_assert!(parse_size(&text).is_err()),
            }
        }
    }
}
