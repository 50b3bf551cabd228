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
/// At 95 (with [`DEFAULT_POOL_FLOOR_PCT`] at 5) redis, python-dict and sqlite under 256 MiB
/// took 10–28 % fewer faults a request and served 1–11 % more, Node.js worker threads
/// sorting and stringifying 3.2 M objects under 240 MiB ran in 65 s instead of 146 s, and
/// the seed suite measured the same (`docs/lab/active-protect/`).
pub const DEFAULT_ACTIVE_PROTECT_PCT: u32 = 95;
/// The inactive list's size, percent of the budget (see [`PagerConfig::inactive_pct`]).
pub const DEFAULT_INACTIVE_PCT: u32 = 12;
/// Default number of smaller file reads in a row whose evidence turns whole-unit reads
/// back on (see `PagerConfig::file_whole_evidence`).
pub const DEFAULT_FILE_WHOLE_EVIDENCE: u32 = 2;
/// Default floor of the pool limit that follows the workload, percent of the budget: a
/// crowded active list may take the pool down to 5 % of the budget, where the pages proved
/// hot fit (short refaults alone still stop at half).
pub const DEFAULT_POOL_FLOOR_PCT: u32 = 5;
/// Default adaptive spin of the fault threads, µs (see `PagerConfig::fault_spin_us`).
pub const DEFAULT_FAULT_SPIN_US: u32 = 0;
/// Default time a fault thread polls its file read's completion before it sleeps, µs (see
/// `PagerConfig::file_read_spin_us`).
pub const DEFAULT_FILE_READ_SPIN_US: u32 = 200;
/// Default number of file reads a fault thread keeps in flight for the faults of several
/// program threads (see `PagerConfig::file_batch_reads`).
pub const DEFAULT_FILE_BATCH_READS: u32 = 8;
/// The most file reads a fault thread may have in flight ahead of its faults (the read-ahead
/// buffers of its ring, `ioring::AHEAD_SLOTS`).
pub const MAX_BATCH_READS: u32 = 8;
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
    /// A page a fast zstd level cannot bring under the pool's 3/4 of a page is compressed
    /// again with its literals Huffman-coded (`backend::compress::compress_page`): text with
    /// few repeats goes to the pool at ~65 % instead of raw to the disk (`sort` of 416 MB of
    /// words under 469 MiB: 41.9 s against 65.8). Lab variant `[no-]literal-retry`.
    pub literal_retry: bool,
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
    /// Whole-unit file reads, once stopped, come back after this many smaller reads in a
    /// row each served another block from its copy or fell in the unit the read before had
    /// read in (1 to 8). Once is what scattered faults do by chance; at 1, redis under
    /// uniform GETs read a third of its file faults as 128 KiB at 2–3× the time.
    pub file_whole_evidence: u32,
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
    /// Protection ([`PagerConfig::active_protect_pct`]) is suspended while workingset
    /// activations run at more than this percentage of the evictions (a running rate, each
    /// 4,096 evictions weighed in at 1/8), and holds again once they are 10 points under: when
    /// nearly every evicted page comes back as working set, "active" may single nothing out,
    /// and the hand gives every page one more round instead. At 70, `sort -S 1G` of 416 MB of
    /// words under 469 MiB ran 0.85× its time and no server of the programs lab, no seed
    /// workload nor Node.js building a Map ever reached it; but a JVM whose collector walks a
    /// heap 3.5× the budget (ParallelGC), suspended as sort is, took 1.29× its time with 19 %
    /// more faults. 0 (the default): protection whatever the activations. Lab variant
    /// `protect-selective=PCT`.
    pub protect_selective_pct: u32,
    /// The least the pool limit goes down to when it follows the workload
    /// ([`PagerConfig::pool_adapts`]), percent of the budget: where a crowded active list
    /// (pages proved hot over [`PagerConfig::active_protect_pct`] of the present ones) may
    /// take it. Short refaults alone take it down to half the budget, against which they
    /// are weighed (`policy/pool_share.rs`).
    pub pool_floor_pct: u32,
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
    /// Pool compaction (zsmalloc's idea): when a quarter of the pool's spans is free room,
    /// at most once a second, the writeback thread walks the swap table and moves objects
    /// out of spans at most half in use into fuller spans of their class; the emptied spans
    /// go back. Off: the pool then holds more objects under the same limit rather than
    /// leaving room to the program's pages (docs/design.md, "Pool handle and spans"). Lab
    /// variant `[no-]compact`.
    pub pool_compact: bool,
    /// Workingset detection measures a refault's distance from the page's own eviction,
    /// stamped in its swapped pte, instead of from its cluster's stamp (the cluster's first
    /// fill, restamped by every clean page evicted again onto a kept slot in it). With
    /// cluster stamps, clean re-evictions scattered over every cluster made every refault
    /// look recent: memcached's random gets activated 100 % of their refaults. On by
    /// default, with `pool_weigh`, which needs it (docs/lab/write-predict/). Lab variant
    /// `[no-]page-stamp`.
    pub workingset_page_stamp: bool,
    /// With `pool_adapt`: the pool limit moves by what the pool's refaults say it is worth
    /// (`policy/pool_share.rs`, `tick_weighed`): the working set's refaults from the pool
    /// (pages its room would have kept resident) against its other refaults (file faults it
    /// saved, ~3 pool faults each), down to `pool_floor_pct`; instead of short refaults and
    /// reclaim's crowded looks. On by default: with page stamps, the block only for nearby
    /// writes and write prediction it served more requests than without on every program
    /// of the programs lab but python-dict's uniform lookups (within their spread); the seed
    /// suite within its spread but concurrent, 7 % slower in a rerun with the same counters
    /// (docs/lab/write-predict/). Lab variant `[no-]pool-weigh`.
    pub pool_weigh: bool,
    /// With `pool_weigh`: a refault from the pool counts against the pool when it came back
    /// within the pool's room in pages (its bytes ÷ 4 KiB: what that room would have kept
    /// resident) and as a file fault saved from farther; off (the default), within the
    /// budget's pages. Weighed against the budget, a pool whose pages number fewer than the
    /// budget's can only refault "hot" and is taken down to its floor, however well its
    /// pages compress: perl building a hash of 1 M strings (~380 MiB, packing ~5:1) under
    /// 128 MiB took 203–208 s with the pool at its 6 MiB floor, 110–118 s with this rule
    /// keeping it at 72 MiB (the kernel's disk swap: 224 s). Off by default: in the
    /// programs lab it served memcached 1.13–1.16× but python-dict 0.83× / 0.94×, whose
    /// small hot objects the bigger pool squeezed, and a JVM took 228 s against 195 with a
    /// pool grown to 144 MiB that saved no file read (docs/lab/pool-room/). Lab variant
    /// `[no-]pool-room`.
    pub pool_weigh_room: bool,
    /// A write fault on a clean page makes its whole 64 KiB block writable (giving up the
    /// kept slots of its present pages) only when the region's previous write fault was in
    /// the same block or a neighbour, or the page before it is written already (present
    /// without a kept slot): a program writing back what it read sequentially.
    /// Other writes give up only the written page's slot, so the pages around it stay clean
    /// and leave again without compression or IO. Off: every write fault takes its block.
    /// On by default (docs/lab/write-predict/). Lab variant `[no-]wp-adapt`.
    pub wp_block_adapt: bool,
    /// A read fault swapping in a page of a region where most pages read in clean are then
    /// written (a write fault follows at least every second one) installs the page writable
    /// at once, without its kept slot, as the kernel maps a swapped-in page writable: the
    /// write that follows costs no fault. One read fault in 8 still comes in clean, to keep
    /// measuring. On by default (docs/lab/write-predict/). Lab variant `[no-]write-predict`.
    pub write_predict: bool,
    /// Clean pages: a page swapped in from the pool keeps its slot while it stays
    /// unwritten, so evicting it again costs no compression.
    pub keep_clean: bool,
    /// Encrypt and authenticate the file tier's records (AES-256-GCM, an ephemeral
    /// per-pager key); `false` keeps only the crc32c checksum.
    pub encrypt: bool,
    /// Microseconds a fault thread keeps polling the userfaultfd after serving a fault
    /// before it sleeps (faults come in bursts; waking a sleeping thread on another CPU costs
    /// tens of µs on VMs, docs/design.md, Fault hand-off and wake-ups). 0 sleeps at once.
    pub fault_spin_us: u32,
    /// Microseconds a fault thread polls the completion of its file read (submitted on an
    /// io_uring of its own) before it sleeps in the kernel; 0 reads with pread(2) and
    /// sleeps at once. Waking a thread whose vCPU halted while the disk read costs 15–25 µs
    /// of a ~60 µs read here (`ioring.rs`); the program waits on that read meanwhile. 200 µs
    /// covers a 4–8 KiB read with room (docs/lab/read-spin/: the programs lab served
    /// 1.01–1.27× the requests a second with it).
    pub file_read_spin_us: u32,
    /// While it polls a file read's completion, a fault thread gives its CPU to any other
    /// runnable thread there between looks, and sleeps until the completion once one took
    /// it (`ioring::yield_while_polling`): the polling then costs a program with more
    /// threads than CPUs nothing, and a program blocked on its fault (nothing else
    /// runnable) as little as before. Programs lab ÷ plain polling 0.94–1.39, p99 lower in
    /// 7 of 8 rows (docs/lab/read-yield/). Needs `file_read_spin_us` > 0.
    pub file_read_yield: bool,
    /// Up to this many file reads in flight for the faults of several program threads: when
    /// a fault thread reads several faults at once (one read of the userfaultfd), the file
    /// read of each faulting page's record goes out ahead on the thread's ring (`ioring.rs`)
    /// and the faults are then served one by one, each finding its bytes read or in flight;
    /// as they are served, the thread reads the faults queued since and starts theirs. The
    /// disk here serves 4 KiB random reads ~2.5× as fast four at a time as one at a time;
    /// four to sixteen threads faulting on the file at random were served 1.3–2× as fast,
    /// memcached's uniform requests 1.23–1.36× (docs/lab/batch-reads/). 0 reads one fault's record
    /// at a time. At most `MAX_BATCH_READS`; needs `file_read_spin_us` > 0.
    pub file_batch_reads: u32,
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
    /// The inactive list's size (staged pages, present in memory but unmapped from the
    /// program, so that a touch is seen as a fault), percent of the budget's pages (at least
    /// 256 pages). This is how pages are proved hot without accessed bits: a page touched
    /// while staged comes back for the cost of a move and is activated; one not touched
    /// before it reaches the list's end is evicted. The kernel keeps its inactive anon list
    /// as large as the active one below 1 GiB (`inactive_ratio` 1), and reads the accessed
    /// bits of the pages on it for free; each touch costs us a fault, and with the list
    /// filled a quarter of the budget served python-dict 1.10–1.21× the lookups half did
    /// (docs/lab/inactive-fill/). Without [`PagerConfig::stage_fill`] the list never
    /// reaches this size: it is a cap. 12 by default; lab variant `inactive=PCT`.
    pub inactive_pct: u32,
    /// Reclaim stages up to four batches for each one it evicts while the inactive list is
    /// under [`PagerConfig::inactive_pct`], so the list reaches its size. Off, it stages one
    /// batch per batch evicted (two under a 2 MiB reserve, [`PagerConfig::stage_ahead`]), and
    /// the list never grows past a few MiB whatever its target: a page had ~40 ms to prove
    /// itself at python-dict's eviction rate. Off by default: filled (with the two settings
    /// below, at 25 %), python-dict served 1.21× / 1.09× its lookups and redis the same, but
    /// a JVM whose collector walks its whole heap took 2.8 M staged faults on top of the
    /// same 2.06 M refaults, 294 s against 226 (docs/lab/inactive-fill/). Lab variant
    /// `[no-]stage-fill`.
    pub stage_fill: bool,
    /// With workingset detection, the inactive list shrinks (halving, down to 256 pages)
    /// while activations exceed a quarter of evictions, on the reasoning that staging only
    /// adds a move out and back when nothing fits. On by default; only without
    /// [`PagerConfig::inactive_adapt`]. Lab variant `[no-]thrash-shrink`.
    pub inactive_thrash_shrink: bool,
    /// The inactive list takes its full size ([`PagerConfig::inactive_pct`]) only while at
    /// least a quarter of the refaults come within that many evictions of their eviction
    /// (a list that long would have caught them as staged faults); otherwise it halves
    /// toward its 2 MiB reserve: a full list only adds staged faults where pages are
    /// touched at random over much more than the budget (redis's uniform GETs). Takes the
    /// place of [`PagerConfig::inactive_thrash_shrink`]. Off by default (see
    /// [`PagerConfig::stage_fill`]); lab variant `[no-]inactive-adapt`.
    pub inactive_adapt: bool,
    /// A fault on a staged page brings its staged neighbours back with it (fault-around)
    /// only when it lands within two pages of where the region's previous staged fault
    /// left off: a program running along the address space. A lone touch brings its page
    /// alone, and the untouched neighbours stay on the inactive list to be judged; brought
    /// back, they sat present for a whole round of the hand while touched pages elsewhere
    /// were evicted. Off (the default): every staged fault takes its block. Lab variant
    /// `[no-]staged-adapt`.
    pub staged_around_adapt: bool,
    /// First-touch fault-around also where a first touch lands right after a present page
    /// (one of several fills taking turns in one region: a heap's size-class spans), 64 KiB
    /// at a time; without it only where the region's last first touch ended. Python
    /// building and reading back 65 MB of JSON took 90 k first-touch faults without it and
    /// 56–58 k with it (docs/design.md, Fault-around). Lab variant `[no-]touch-follow`.
    pub first_touch_follow: bool,
    /// The window of first-touch fault-around after a present page doubles, like an in-order
    /// fill's, while first touches keep landing after present pages (off: 64 KiB each).
    /// Lab variant `[no-]touch-follow-grow`.
    pub first_touch_follow_grow: bool,
    /// `tierswap run`'s heap keeps large mappings the program freed (up to a 32nd of the
    /// budget, 32 MiB at most) for its next large allocations instead of unmapping each,
    /// while the footprint is at most half the budget: a Python JSON round trip under a
    /// budget it fits 9.6–10.9 s → 8.4–10.5 s. Kept under pressure too, the kept pages cost
    /// the working set room (programs lab, medians of 3: python-dict 0.88 / 0.76), which the
    /// half-budget rule avoids (docs/design.md, "Large allocations kept for reuse"). Read by
    /// the shim only. Lab variant `[no-]keep-freed`.
    pub keep_freed_large: bool,
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
    /// The ledger of the process tree whose budget this pager shares (`tierswap run` makes
    /// one per run, `TIERSWAP_TREE`; see [`crate::tree`]): the pager's budget is then its
    /// share of the tree's, never more than `budget_bytes`. None: `budget_bytes` alone.
    pub tree: Option<PathBuf>,
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
            literal_retry: true,
            recompress: DEFAULT_RECOMPRESS,
            pool_max_bytes: None,
            swap_dir: None,
            fault_threads: 0,
            readahead_max_pages: DEFAULT_READAHEAD_MAX_PAGES,
            stride_prefetch_max_pages: DEFAULT_STRIDE_PREFETCH_MAX_PAGES,
            reread_to_pool: false,
            file_unit_bytes: DEFAULT_FILE_UNIT_BYTES,
            file_read_next_unit: true,
            file_whole_evidence: DEFAULT_FILE_WHOLE_EVIDENCE,
            swapin_policy: SwapinPolicy::default(),
            swapin_max_pages: DEFAULT_SWAPIN_MAX_PAGES,
            swapin_start_pages: DEFAULT_SWAPIN_START_PAGES,
            active_protect_pct: DEFAULT_ACTIVE_PROTECT_PCT,
            protect_selective_pct: 0,
            pool_floor_pct: DEFAULT_POOL_FLOOR_PCT,
            swapin_learn_blocks: true,
            fault_around: true,
            fault_around_max_pages: DEFAULT_FAULT_AROUND_MAX_PAGES,
            workingset: true,
            keep_clean: true,
            encrypt: true,
            fault_spin_us: DEFAULT_FAULT_SPIN_US,
            file_read_spin_us: DEFAULT_FILE_READ_SPIN_US,
            file_read_yield: true,
            file_batch_reads: DEFAULT_FILE_BATCH_READS,
            background_nice: DEFAULT_BACKGROUND_NICE,
            fault_pin: DEFAULT_FAULT_PIN,
            fault_follow: true,
            batch_release: true,
            batch_stage: true,
            background_idle: false,
            direct_reclaim: DEFAULT_DIRECT_RECLAIM,
            stage_ahead: true,
            inactive_pct: DEFAULT_INACTIVE_PCT,
            stage_fill: false,
            inactive_thrash_shrink: true,
            inactive_adapt: false,
            staged_around_adapt: false,
            first_touch_follow: true,
            first_touch_follow_grow: false,
            keep_freed_large: true,
            throttle_headroom: true,
            pool_adapt: true,
            pool_compact: false,
            workingset_page_stamp: true,
            pool_weigh: true,
            pool_weigh_room: false,
            wp_block_adapt: true,
            write_predict: true,
            remote: None,
            fault_mode: FaultMode::default(),
            tree: None,
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

    /// The least the pool limit goes down to: `pool_floor_pct` of the budget when it
    /// follows the workload, else [`PagerConfig::pool_max_bytes`] (where it stays).
    pub fn pool_limit_floor(&self) -> u64 {
        if self.pool_adapts() {
            (self.budget_bytes / 100 * self.pool_floor_pct as u64).min(self.pool_limit_top())
        } else {
            self.pool_max_bytes()
        }
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
        if !(1..=75).contains(&self.inactive_pct) {
            return Err(ConfigError::Inactive(self.inactive_pct));
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
    /// The inactive list's share is outside 1–75 %.
    #[error("inactive list of {0} % of the budget: give 1 to 75 (e.g. inactive=50)")]
    Inactive(u32),
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

/// The engine settings a lab variant (`tierswap bench --engine tierswap:SETTING…`) or
/// `tierswap run --set` may change, as they are spelled (for help and error messages).
pub const SETTINGS: &str = "policy=locality|order0|always, swapin-max=SIZE (4K..2M), swapin-start=SIZE (a stream's first large swap-in, 4K..2M), active-protect=PCT (active pages' share of the present pages reclaim passes over, 0: off), protect-selective=PCT (that protection suspended while activations run above PCT % of evictions, 0: never, the default), pool-floor=PCT (the least the pool limit that follows the workload goes down to, percent of the budget), inactive=PCT (the inactive list's size, percent of the budget, 1..75), readahead=SIZE (4K..2M, 4K: off), fault-around-max=SIZE (4K..2M), \
     [no-]fault-around, [no-]workingset, [no-]keep-clean, [no-]encrypt, [no-]pin, [no-]idle-bg, [no-]batch-release, [no-]batch-stage, [no-]reread-to-pool, [no-]pool-adapt, [no-]compact, [no-]page-stamp, [no-]pool-weigh, [no-]pool-room, [no-]wp-adapt, [no-]write-predict, [no-]learn-blocks, [no-]direct-reclaim, [no-]stage-ahead, [no-]stage-fill, [no-]thrash-shrink, [no-]inactive-adapt, [no-]staged-adapt, [no-]touch-follow, [no-]touch-follow-grow, [no-]literal-retry, [no-]keep-freed, [no-]follow, [no-]throttle-headroom, [no-]read-next-unit, [no-]read-yield, whole-evidence=N (smaller file reads in a row that turn whole-unit reads back on, 1..8), prefetch=N (stride prefetch window cap in pages, 0 or no-prefetch: off), spin=US, read-spin=US (a fault thread polls its file read's completion this long, 200 by default, 0: pread), batch-reads=N (up to N file reads in flight for the faults of several program threads, 0..8, 8 by default; 0: one at a time), threads=N, nice=N, fault=thread|signal, compressor=lz4|zstd|zstd-LEVEL|zstd-fast[-N], recompress=none|zstd|zstd-LEVEL|zstd-fast[-N], budget=SIZE, pool-max=SIZE, tiers=zero+pool+file";

/// The largest stride prefetch window a setting may ask for, in pages.
const MAX_SETTING_PREFETCH_PAGES: u32 = 1024;
/// The most fault threads `threads=N` takes.
const MAX_SETTING_FAULT_THREADS: usize = 64;
/// The longest adaptive spin `spin=US` takes, µs.
const MAX_SETTING_SPIN_US: u32 = 100_000;

/// One engine setting: a change to one field of a [`PagerConfig`], parsed from its text
/// (`no-follow`, `swapin-max=16K`, …; [`SETTINGS`] lists them). The seed lab's variants
/// (`tierswap bench --engine tierswap:SETTING…`), the programs lab and `tierswap run --set`
/// (the shim's `TIERSWAP_SETTINGS`) all read settings here, so a policy compared in one lab
/// is spelled and applied the same way in the other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Setting {
    /// `policy=…`: how a fault picks the size of a swap-in.
    Policy(SwapinPolicy),
    /// `swapin-max=SIZE`: largest swap-in, in pages.
    SwapinMaxPages(u32),
    /// `swapin-start=SIZE`: a stream's first large swap-in, in pages.
    SwapinStartPages(u32),
    /// `active-protect=PCT`: the share of present pages active pages may hold before
    /// reclaim demotes them (0: off).
    ActiveProtectPct(u32),
    /// `protect-selective=PCT`: protection suspended while activations run above this share
    /// of the evictions (0: never).
    ProtectSelectivePct(u32),
    /// `pool-floor=PCT`: the least the adaptive pool limit goes down to, percent of the budget.
    PoolFloorPct(u32),
    /// `whole-evidence=N`: smaller file reads in a row that turn whole-unit reads back on.
    WholeEvidence(u32),
    /// `readahead=SIZE`: cap of the disk readahead window, in pages (1: off).
    ReadaheadMaxPages(u32),
    /// `prefetch=N` / `no-prefetch`: stride prefetch's largest window, in pages (0: off).
    PrefetchMaxPages(u32),
    /// `fault-around` / `no-fault-around`.
    FaultAround(bool),
    /// `fault-around-max=SIZE`: first-touch fault-around's largest window, in pages.
    FaultAroundMaxPages(u32),
    /// `workingset` / `no-workingset`.
    Workingset(bool),
    /// `keep-clean` / `no-keep-clean`.
    KeepClean(bool),
    /// `pin` / `no-pin`: one fault thread pinned to each CPU.
    Pin(bool),
    /// `idle-bg` / `no-idle-bg`: the reclaim and writeback threads under SCHED_IDLE.
    IdleBackground(bool),
    /// `batch-release` / `no-batch-release`: evicted blocks dropped 8 at a time.
    BatchRelease(bool),
    /// `batch-stage` / `no-batch-stage`: up to 16 blocks of a 2 MiB chunk staged per move.
    BatchStage(bool),
    /// `reread-to-pool` / `no-reread-to-pool`: a clean page read back from its file slot a
    /// second time gives the slot up, so its next eviction stores it in the pool.
    RereadToPool(bool),
    /// `pool-adapt` / `no-pool-adapt`: the pool limit follows the workload between half and
    /// five eighths of the budget.
    PoolAdapt(bool),
    /// `compact` / `no-compact`: pool compaction.
    PoolCompact(bool),
    /// `page-stamp` / `no-page-stamp`: refault distances from the page's own eviction.
    PageStamp(bool),
    /// `pool-weigh` / `no-pool-weigh`: the pool limit follows what its refaults say it is worth.
    PoolWeigh(bool),
    /// `pool-room` / `no-pool-room`: pool refaults weighed against the pool's room, not the budget.
    PoolRoom(bool),
    /// `wp-adapt` / `no-wp-adapt`: a write fault takes its whole block only after another nearby.
    WpAdapt(bool),
    /// `write-predict` / `no-write-predict`: read faults install writable where writes follow.
    WritePredict(bool),
    /// `learn-blocks` / `no-learn-blocks`: a lone fault brings its block in whole once
    /// blocks are seen read whole.
    LearnBlocks(bool),
    /// `direct-reclaim` / `no-direct-reclaim`: fault threads evict while they wait for room.
    DirectReclaim(bool),
    /// `stage-ahead` / `no-stage-ahead`: the reclaim thread keeps 2 MiB staged ahead of its
    /// own eviction, for direct reclaimers to evict from.
    StageAhead(bool),
    /// `inactive=PCT`: the inactive list's size, percent of the budget.
    InactivePct(u32),
    /// `stage-fill` / `no-stage-fill`: reclaim stages ahead until the inactive list is full.
    StageFill(bool),
    /// `thrash-shrink` / `no-thrash-shrink`: the inactive list shrinks while activations
    /// exceed a quarter of evictions.
    ThrashShrink(bool),
    /// `inactive-adapt` / `no-inactive-adapt`: the inactive list full only while refaults come near.
    InactiveAdapt(bool),
    /// `staged-adapt` / `no-staged-adapt`: a staged fault brings its block only where it
    /// continues the region's last one.
    StagedAdapt(bool),
    /// `touch-follow` / `no-touch-follow`: first-touch fault-around after a present page too.
    TouchFollow(bool),
    /// `literal-retry` / `no-literal-retry`: a page a fast level leaves over the pool's
    /// limit compressed again with its literals coded.
    LiteralRetry(bool),
    /// `touch-follow-grow` / `no-touch-follow-grow`: that fault-around's window doubles.
    TouchFollowGrow(bool),
    /// `keep-freed` / `no-keep-freed`: `run`'s heap keeps freed large mappings for reuse.
    KeepFreed(bool),
    /// `read-next-unit` / `no-read-next-unit`: whole-unit file reads take the next unit too.
    ReadNextUnit(bool),
    /// `spin=US`: the fault threads' adaptive spin.
    SpinUs(u32),
    /// `read-spin=US`: how long a fault thread polls its file read's completion.
    ReadSpinUs(u32),
    /// `read-yield` / `no-read-yield`: a fault thread polling its file read gives its CPU
    /// to other runnable threads.
    ReadYield(bool),
    /// `batch-reads=N`: file reads in flight for the faults of several program threads.
    BatchReads(u32),
    /// `follow` / `no-follow`: one fault thread polls, the one on the program's CPU.
    Follow(bool),
    /// `throttle-headroom` / `no-throttle-headroom`: reclaim evicts on to its low watermark
    /// only while faults wait for room (else after any fault).
    ThrottleHeadroom(bool),
    /// `threads=N`: this many fault threads (0: one per CPU).
    FaultThreads(usize),
    /// `nice=N`: the reclaim and writeback threads' nice value.
    Nice(i32),
    /// `encrypt` / `no-encrypt`.
    Encrypt(bool),
    /// `tiers=zero+pool+file`: these local tiers and no remote tier (a lab runs the remote
    /// and the file tier side by side this way).
    LocalTiers(Tiers),
    /// `fault=thread|signal`: who serves a fault.
    Fault(FaultMode),
    /// `compressor=…`: the pool's compressor.
    Compressor(Compressor),
    /// `recompress=…`: the codec cold pool objects are recompressed with, or none.
    Recompress(Option<Compressor>),
    /// `budget=SIZE`: the budget, in bytes.
    Budget(u64),
    /// `pool-max=SIZE`: the pool limit, in bytes.
    PoolMax(u64),
}

impl Setting {
    /// Writes this setting into `config`.
    pub fn apply(self, config: &mut PagerConfig) {
        match self {
            Setting::Policy(p) => config.swapin_policy = p,
            Setting::SwapinMaxPages(n) => config.swapin_max_pages = n,
            Setting::SwapinStartPages(n) => config.swapin_start_pages = n,
            Setting::ActiveProtectPct(p) => config.active_protect_pct = p,
            Setting::ProtectSelectivePct(p) => config.protect_selective_pct = p,
            Setting::PoolFloorPct(p) => config.pool_floor_pct = p,
            Setting::ReadaheadMaxPages(n) => config.readahead_max_pages = n,
            Setting::PrefetchMaxPages(n) => config.stride_prefetch_max_pages = n,
            Setting::FaultAround(on) => config.fault_around = on,
            Setting::FaultAroundMaxPages(n) => config.fault_around_max_pages = n,
            Setting::Workingset(on) => config.workingset = on,
            Setting::KeepClean(on) => config.keep_clean = on,
            Setting::Encrypt(on) => config.encrypt = on,
            Setting::Pin(on) => config.fault_pin = on,
            Setting::IdleBackground(on) => config.background_idle = on,
            Setting::BatchRelease(on) => config.batch_release = on,
            Setting::BatchStage(on) => config.batch_stage = on,
            Setting::RereadToPool(on) => config.reread_to_pool = on,
            Setting::PoolAdapt(on) => config.pool_adapt = on,
            Setting::PoolCompact(on) => config.pool_compact = on,
            Setting::PageStamp(on) => config.workingset_page_stamp = on,
            Setting::PoolWeigh(on) => config.pool_weigh = on,
            Setting::PoolRoom(on) => config.pool_weigh_room = on,
            Setting::WpAdapt(on) => config.wp_block_adapt = on,
            Setting::WritePredict(on) => config.write_predict = on,
            Setting::LearnBlocks(on) => config.swapin_learn_blocks = on,
            Setting::DirectReclaim(on) => config.direct_reclaim = on,
            Setting::StageAhead(on) => config.stage_ahead = on,
            Setting::InactivePct(p) => config.inactive_pct = p,
            Setting::StageFill(on) => config.stage_fill = on,
            Setting::ThrashShrink(on) => config.inactive_thrash_shrink = on,
            Setting::StagedAdapt(on) => config.staged_around_adapt = on,
            Setting::TouchFollow(on) => config.first_touch_follow = on,
            Setting::LiteralRetry(on) => config.literal_retry = on,
            Setting::TouchFollowGrow(on) => config.first_touch_follow_grow = on,
            Setting::KeepFreed(on) => config.keep_freed_large = on,
            Setting::InactiveAdapt(on) => config.inactive_adapt = on,
            Setting::ReadNextUnit(on) => config.file_read_next_unit = on,
            Setting::WholeEvidence(n) => config.file_whole_evidence = n,
            Setting::SpinUs(us) => config.fault_spin_us = us,
            Setting::ReadSpinUs(us) => config.file_read_spin_us = us,
            Setting::ReadYield(on) => config.file_read_yield = on,
            Setting::BatchReads(n) => config.file_batch_reads = n,
            Setting::FaultThreads(n) => config.fault_threads = n,
            Setting::Follow(on) => config.fault_follow = on,
            Setting::ThrottleHeadroom(on) => config.throttle_headroom = on,
            Setting::Nice(n) => config.background_nice = n,
            Setting::LocalTiers(t) => {
                config.tiers = t;
                config.remote = None;
            }
            Setting::Fault(m) => config.fault_mode = m,
            Setting::Compressor(c) => config.compressor = c,
            Setting::Recompress(c) => config.recompress = c,
            Setting::Budget(b) => config.budget_bytes = b,
            Setting::PoolMax(b) => config.pool_max_bytes = Some(b),
        }
    }

    /// Parses a list of settings, `a:b:c` (a lab variant's form) or `a,b,c` (`tierswap
    /// run --set`'s), either separator between any two. An empty entry is an error.
    pub fn parse_list(list: &str) -> Result<Vec<Setting>, String> {
        list.split([':', ',']).map(Setting::parse).collect()
    }

    /// Parses one `key[=value]`; the error is one line naming the bad key or value and what
    /// is valid.
    pub fn parse(setting: &str) -> Result<Setting, String> {
        let (key, value) = match setting.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (setting.trim(), None),
        };
        let switch = |make: fn(bool) -> Setting, on: bool| match value {
            None => Ok(make(on)),
            Some(_) => Err(format!("setting '{key}' is a switch and takes no value")),
        };
        let needs = |example: &str| format!("setting '{key}' needs a value, e.g. {key}={example}");
        // A number in `range`, else "KEY 'V' is not WHAT, e.g. KEY=EXAMPLE".
        let number = |example: &str, what: &str, range: std::ops::RangeInclusive<i64>| {
            let v = value.ok_or_else(|| needs(example))?;
            v.parse::<i64>()
                .ok()
                .filter(|n| range.contains(n))
                .ok_or_else(|| format!("{key} '{v}' is not {what}, e.g. {key}={example}"))
        };
        match key {
            "policy" => {
                let v = value.ok_or_else(|| needs("order0"))?;
                v.parse::<SwapinPolicy>()
                    .map(Setting::Policy)
                    .map_err(|_| format!("policy '{v}' is not a swap-in policy: use policy=locality, order0 or always"))
            }
            "swapin-max" => {
                pages_setting(key, value.ok_or_else(|| needs("64K"))?, "4K", "64K").map(Setting::SwapinMaxPages)
            }
            "swapin-start" => {
                pages_setting(key, value.ok_or_else(|| needs("8K"))?, "4K", "8K").map(Setting::SwapinStartPages)
            }
            "active-protect" => {
                number("50", "a percentage from 0 (off) to 100", 0..=100).map(|p| Setting::ActiveProtectPct(p as u32))
            }
            "protect-selective" => number("70", "a percentage from 0 (off) to 100", 0..=100)
                .map(|p| Setting::ProtectSelectivePct(p as u32)),
            "inactive" => {
                number("50", "a percentage of the budget from 1 to 75", 1..=75).map(|p| Setting::InactivePct(p as u32))
            }
            "whole-evidence" => {
                number("2", "a count of reads from 1 to 8", 1..=8).map(|n| Setting::WholeEvidence(n as u32))
            }
            "pool-floor" => {
                number("25", "a percentage of the budget from 1 to 62", 1..=62).map(|p| Setting::PoolFloorPct(p as u32))
            }
            "readahead" => {
                pages_setting(key, value.ok_or_else(|| needs("4K"))?, "4K (off)", "4K").map(Setting::ReadaheadMaxPages)
            }
            "fault-around-max" => {
                pages_setting(key, value.ok_or_else(|| needs("64K"))?, "4K", "256K").map(Setting::FaultAroundMaxPages)
            }
            "prefetch" => number(
                "32",
                &format!("a number of pages from 0 (off) to {MAX_SETTING_PREFETCH_PAGES}"),
                0..=MAX_SETTING_PREFETCH_PAGES as i64,
            )
            .map(|n| Setting::PrefetchMaxPages(n as u32)),
            "no-prefetch" => switch(|_| Setting::PrefetchMaxPages(0), false),
            "fault-around" => switch(Setting::FaultAround, true),
            "no-fault-around" => switch(Setting::FaultAround, false),
            "workingset" => switch(Setting::Workingset, true),
            "no-workingset" => switch(Setting::Workingset, false),
            "pin" => switch(Setting::Pin, true),
            "no-pin" => switch(Setting::Pin, false),
            "idle-bg" => switch(Setting::IdleBackground, true),
            "no-idle-bg" => switch(Setting::IdleBackground, false),
            "batch-release" => switch(Setting::BatchRelease, true),
            "no-batch-release" => switch(Setting::BatchRelease, false),
            "batch-stage" => switch(Setting::BatchStage, true),
            "no-batch-stage" => switch(Setting::BatchStage, false),
            "reread-to-pool" => switch(Setting::RereadToPool, true),
            "no-reread-to-pool" => switch(Setting::RereadToPool, false),
            "pool-adapt" => switch(Setting::PoolAdapt, true),
            "no-pool-adapt" => switch(Setting::PoolAdapt, false),
            "compact" => switch(Setting::PoolCompact, true),
            "no-compact" => switch(Setting::PoolCompact, false),
            "page-stamp" => switch(Setting::PageStamp, true),
            "no-page-stamp" => switch(Setting::PageStamp, false),
            "pool-weigh" => switch(Setting::PoolWeigh, true),
            "no-pool-weigh" => switch(Setting::PoolWeigh, false),
            "pool-room" => switch(Setting::PoolRoom, true),
            "no-pool-room" => switch(Setting::PoolRoom, false),
            "wp-adapt" => switch(Setting::WpAdapt, true),
            "no-wp-adapt" => switch(Setting::WpAdapt, false),
            "write-predict" => switch(Setting::WritePredict, true),
            "no-write-predict" => switch(Setting::WritePredict, false),
            "read-yield" => switch(Setting::ReadYield, true),
            "no-read-yield" => switch(Setting::ReadYield, false),
            "read-next-unit" => switch(Setting::ReadNextUnit, true),
            "no-read-next-unit" => switch(Setting::ReadNextUnit, false),
            "learn-blocks" => switch(Setting::LearnBlocks, true),
            "no-learn-blocks" => switch(Setting::LearnBlocks, false),
            "direct-reclaim" => switch(Setting::DirectReclaim, true),
            "no-direct-reclaim" => switch(Setting::DirectReclaim, false),
            "throttle-headroom" => switch(Setting::ThrottleHeadroom, true),
            "no-throttle-headroom" => switch(Setting::ThrottleHeadroom, false),
            "follow" => switch(Setting::Follow, true),
            "no-follow" => switch(Setting::Follow, false),
            "stage-ahead" => switch(Setting::StageAhead, true),
            "no-stage-ahead" => switch(Setting::StageAhead, false),
            "stage-fill" => switch(Setting::StageFill, true),
            "no-stage-fill" => switch(Setting::StageFill, false),
            "thrash-shrink" => switch(Setting::ThrashShrink, true),
            "no-thrash-shrink" => switch(Setting::ThrashShrink, false),
            "inactive-adapt" => switch(Setting::InactiveAdapt, true),
            "no-inactive-adapt" => switch(Setting::InactiveAdapt, false),
            "staged-adapt" => switch(Setting::StagedAdapt, true),
            "no-staged-adapt" => switch(Setting::StagedAdapt, false),
            "literal-retry" => switch(Setting::LiteralRetry, true),
            "no-literal-retry" => switch(Setting::LiteralRetry, false),
            "touch-follow" => switch(Setting::TouchFollow, true),
            "no-touch-follow" => switch(Setting::TouchFollow, false),
            "touch-follow-grow" => switch(Setting::TouchFollowGrow, true),
            "no-touch-follow-grow" => switch(Setting::TouchFollowGrow, false),
            "keep-freed" => switch(Setting::KeepFreed, true),
            "no-keep-freed" => switch(Setting::KeepFreed, false),
            "keep-clean" => switch(Setting::KeepClean, true),
            "no-keep-clean" => switch(Setting::KeepClean, false),
            "encrypt" => switch(Setting::Encrypt, true),
            "no-encrypt" => switch(Setting::Encrypt, false),
            "spin" => number(
                "50",
                &format!("a number of microseconds from 0 to {MAX_SETTING_SPIN_US}"),
                0..=MAX_SETTING_SPIN_US as i64,
            )
            .map(|us| Setting::SpinUs(us as u32)),
            "read-spin" => number(
                "200",
                &format!("a number of microseconds from 0 (pread) to {MAX_SETTING_SPIN_US}"),
                0..=MAX_SETTING_SPIN_US as i64,
            )
            .map(|us| Setting::ReadSpinUs(us as u32)),
            "batch-reads" => number(
                "4",
                &format!("a number of file reads from 0 (one at a time) to {MAX_BATCH_READS}"),
                0..=MAX_BATCH_READS as i64,
            )
            .map(|n| Setting::BatchReads(n as u32)),
            "threads" => number(
                "1",
                &format!("a number of fault threads from 0 (one per CPU) to {MAX_SETTING_FAULT_THREADS}"),
                0..=MAX_SETTING_FAULT_THREADS as i64,
            )
            .map(|n| Setting::FaultThreads(n as usize)),
            "nice" => number("10", "a nice value from 0 to 19 for the reclaim and writeback threads", 0..=19)
                .map(|n| Setting::Nice(n as i32)),
            "tiers" => {
                let v = value.ok_or_else(|| needs("zero+pool+file"))?;
                v.replace('+', ",")
                    .parse::<Tiers>()
                    .map(Setting::LocalTiers)
                    .map_err(|e| format!("tiers '{v}': {e} (local tiers joined by '+', e.g. tiers=zero+pool+file)"))
            }
            "fault" => {
                let v = value.ok_or_else(|| needs("signal"))?;
                v.parse::<FaultMode>()
                    .map(Setting::Fault)
                    .map_err(|_| format!("fault '{v}' is not a fault mode: use fault=thread or fault=signal"))
            }
            "budget" | "pool-max" => {
                let v = value.ok_or_else(|| needs("512M"))?;
                let bytes = parse_size(v)
                    .ok()
                    .filter(|&b| b >= 1 << 20)
                    .ok_or_else(|| format!("{key} '{v}' is not a size of 1M or more, e.g. {key}=512M"))?;
                Ok(if key == "budget" { Setting::Budget(bytes) } else { Setting::PoolMax(bytes) })
            }
            "compressor" => {
                let v = value.ok_or_else(|| needs("zstd"))?;
                v.parse::<Compressor>().map(Setting::Compressor).map_err(|_| {
                    format!("compressor '{v}' is not a compressor: use compressor=lz4, zstd, zstd-LEVEL (1 to 19), zstd-fast or zstd-fast-N (1 to 7)")
                })
            }
            "recompress" => {
                let v = value.ok_or_else(|| needs("none"))?;
                parse_recompress(v).map(Setting::Recompress).map_err(|_| {
                    format!("recompress '{v}' is not a codec: use recompress=none, zstd, zstd-LEVEL (1 to 19), zstd-fast-N (1 to 7) or lz4")
                })
            }
            "" => {
                Err(format!("an empty setting (two ':' or ',' in a row, or one at an end?): settings are {SETTINGS}"))
            }
            other => Err(format!("unknown setting '{other}': settings are {SETTINGS}")),
        }
    }
}

/// The largest swap-in of `bytes` as pages: a power of two from 4 KiB to 2 MiB. The error
/// starts with the value, so a caller prefixes the flag or key: "--swapin-max 3K is not…".
pub fn swapin_max_pages(bytes: u64) -> Result<u32, String> {
    let page_bytes = crate::page::PAGE_SIZE as u64;
    if !(page_bytes..=MAX_SWAPIN_PAGES as u64 * page_bytes).contains(&bytes) || !bytes.is_power_of_two() {
        return Err(format!(
            "{} is not a power of two from 4K to 2M: give e.g. 64K (16 pages, the default) or 2M",
            show_bytes(bytes)
        ));
    }
    Ok((bytes / page_bytes) as u32)
}

/// A `key=SIZE` setting counted in pages: a power of two from 4K (`low`, as the message
/// names it) to 2M; `example` is a valid value for the message.
fn pages_setting(key: &str, v: &str, low: &str, example: &str) -> Result<u32, String> {
    let bytes = parse_size(v).map_err(|_| {
        format!("{key} '{v}' is not a size: give a power of two from {low} to 2M, e.g. {key}={example}")
    })?;
    swapin_max_pages(bytes).map_err(|e| format!("{key}={e}"))
}

/// `bytes` as a message writes a size: "3K", "2M", "4097 bytes".
fn show_bytes(bytes: u64) -> String {
    match bytes {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => format!("{b} bytes"),
    }
}

#[cfg(test)]
mod setting_tests {
    use super::*;

    /// The fields of `b` that differ from `a`, by their names in `PagerConfig`.
    fn changed(a: &PagerConfig, b: &PagerConfig) -> Vec<String> {
        let (a, b) = (serde_json::to_value(a).unwrap(), serde_json::to_value(b).unwrap());
        let (a, b) = (a.as_object().unwrap(), b.as_object().unwrap());
        a.iter().filter(|(k, v)| b.get(*k) != Some(v)).map(|(k, _)| k.clone()).collect()
    }

    fn applied(base: &PagerConfig, text: &str) -> PagerConfig {
        let mut c = base.clone();
        Setting::parse(text).unwrap_or_else(|e| panic!("{text}: {e}")).apply(&mut c);
        c
    }

    /// Each switch, its field: `x` sets it, `no-x` clears it, and nothing else moves.
    const SWITCHES: &[(&str, &str)] = &[
        ("fault-around", "fault_around"),
        ("workingset", "workingset"),
        ("keep-clean", "keep_clean"),
        ("encrypt", "encrypt"),
        ("pin", "fault_pin"),
        ("idle-bg", "background_idle"),
        ("batch-release", "batch_release"),
        ("batch-stage", "batch_stage"),
        ("reread-to-pool", "reread_to_pool"),
        ("pool-adapt", "pool_adapt"),
        ("compact", "pool_compact"),
        ("page-stamp", "workingset_page_stamp"),
        ("pool-weigh", "pool_weigh"),
        ("pool-room", "pool_weigh_room"),
        ("wp-adapt", "wp_block_adapt"),
        ("write-predict", "write_predict"),
        ("learn-blocks", "swapin_learn_blocks"),
        ("direct-reclaim", "direct_reclaim"),
        ("stage-ahead", "stage_ahead"),
        ("stage-fill", "stage_fill"),
        ("thrash-shrink", "inactive_thrash_shrink"),
        ("staged-adapt", "staged_around_adapt"),
        ("touch-follow", "first_touch_follow"),
        ("literal-retry", "literal_retry"),
        ("touch-follow-grow", "first_touch_follow_grow"),
        ("keep-freed", "keep_freed_large"),
        ("inactive-adapt", "inactive_adapt"),
        ("follow", "fault_follow"),
        ("throttle-headroom", "throttle_headroom"),
        ("read-next-unit", "file_read_next_unit"),
        ("read-yield", "file_read_yield"),
    ];

    /// Each valued setting with a value other than the default, the field it sets and the
    /// field's value after, as JSON.
    fn valued() -> Vec<(&'static str, &'static str, serde_json::Value)> {
        use serde_json::json;
        vec![
            ("policy=order0", "swapin_policy", json!("Order0")),
            ("policy=always", "swapin_policy", json!("Always")),
            ("swapin-max=4K", "swapin_max_pages", json!(1)),
            ("swapin-max=2M", "swapin_max_pages", json!(512)),
            ("swapin-start=64K", "swapin_start_pages", json!(16)),
            ("active-protect=50", "active_protect_pct", json!(50)),
            ("protect-selective=70", "protect_selective_pct", json!(70)),
            ("inactive=50", "inactive_pct", json!(50)),
            ("pool-floor=25", "pool_floor_pct", json!(25)),
            ("whole-evidence=1", "file_whole_evidence", json!(1)),
            ("readahead=4K", "readahead_max_pages", json!(1)),
            ("readahead=256K", "readahead_max_pages", json!(64)),
            ("fault-around-max=64K", "fault_around_max_pages", json!(16)),
            ("prefetch=8", "stride_prefetch_max_pages", json!(8)),
            ("no-prefetch", "stride_prefetch_max_pages", json!(0)),
            ("spin=50", "fault_spin_us", json!(50)),
            ("read-spin=50", "file_read_spin_us", json!(50)),
            ("batch-reads=4", "file_batch_reads", json!(4)),
            ("threads=1", "fault_threads", json!(1)),
            ("nice=10", "background_nice", json!(10)),
            ("fault=signal", "fault_mode", json!("Signal")),
            ("compressor=lz4", "compressor", json!("Lz4")),
            ("compressor=zstd-3", "compressor", json!({"Zstd": {"level": 3}})),
            ("compressor=zstd-fast-2", "compressor", json!({"Zstd": {"level": -2}})),
            ("recompress=zstd-3", "recompress", json!({"Zstd": {"level": 3}})),
            ("budget=563M", "budget_bytes", json!(563u64 << 20)),
            ("pool-max=307M", "pool_max_bytes", json!(307u64 << 20)),
            ("tiers=zero+pool", "tiers", json!({"zero": true, "pool": true, "file": false})),
        ]
    }

    #[test]
    fn every_switch_sets_and_clears_its_own_field() {
        for &(name, field) in SWITCHES {
            let on = applied(&PagerConfig::default(), name);
            let off = applied(&PagerConfig::default(), &format!("no-{name}"));
            assert_eq!(changed(&on, &off), [field], "{name} and no-{name} differ in {field} alone");
            let (on, off) = (serde_json::to_value(&on).unwrap(), serde_json::to_value(&off).unwrap());
            assert_eq!((&on[field], &off[field]), (&serde_json::json!(true), &serde_json::json!(false)), "{name}");
            assert!(Setting::parse(&format!("{name}=1")).unwrap_err().contains("is a switch and takes no value"));
        }
    }

    #[test]
    fn every_valued_setting_sets_its_own_field() {
        let base = PagerConfig::default();
        for (text, field, want) in valued() {
            let c = applied(&base, text);
            assert_eq!(changed(&base, &c), [field], "{text} changes {field} alone");
            assert_eq!(serde_json::to_value(&c).unwrap()[field], want, "{text}");
        }
        let signal = PagerConfig { fault_mode: FaultMode::Signal, recompress: Some(Compressor::Lz4), ..base.clone() };
        assert_eq!(applied(&signal, "fault=thread").fault_mode, FaultMode::Thread);
        assert_eq!(applied(&signal, "recompress=none").recompress, None);
        assert_eq!(applied(&base, "policy=locality").swapin_policy, SwapinPolicy::Locality);
    }

    /// Every setting [`SETTINGS`] names is tested above: the help text and the parser agree.
    #[test]
    fn the_help_text_names_exactly_the_tested_settings() {
        let valued = valued();
        // Entries are separated by ',' outside parentheses.
        let (mut entries, mut depth, mut from) = (Vec::new(), 0, 0);
        for (i, ch) in SETTINGS.char_indices() {
            match ch {
                '(' => depth += 1,
                ')' => depth -= 1,
                ',' if depth == 0 => {
                    entries.push(SETTINGS[from..i].trim());
                    from = i + 1;
                }
                _ => {}
            }
        }
        entries.push(SETTINGS[from..].trim());
        assert_eq!(entries.len(), SWITCHES.len() + 22, "the switches and 22 valued settings: {entries:?}");
        for entry in entries {
            let name = entry.split([' ', '=']).next().unwrap();
            if let Some(switch) = name.strip_prefix("[no-]") {
                assert!(SWITCHES.iter().any(|(s, _)| *s == switch), "switch {switch} has no test");
            } else {
                assert!(valued.iter().any(|(t, _, _)| t.starts_with(&format!("{name}="))), "{name} has no test");
            }
        }
        for (name, _) in SWITCHES {
            assert!(SETTINGS.contains(&format!("[no-]{name},")), "SETTINGS lacks [no-]{name}");
        }
        for (text, _, _) in &valued {
            let key = text.split('=').next().unwrap();
            assert!(key == "no-prefetch" || SETTINGS.contains(&format!("{key}=")), "SETTINGS lacks {key}=");
        }
    }

    #[test]
    fn local_tiers_drop_a_remote_tier() {
        let (tiers, remote) = parse_tiers("zero,pool,remote=redis://127.0.0.1:7300").unwrap();
        let base = PagerConfig { tiers, remote, ..Default::default() };
        let c = applied(&base, "tiers=zero+pool+file");
        assert_eq!(c.tiers, Tiers { zero: true, pool: true, file: true });
        assert_eq!(c.remote, None);
    }

    #[test]
    fn lists_take_either_separator_in_order() {
        let want = vec![Setting::Follow(false), Setting::SwapinMaxPages(4), Setting::Policy(SwapinPolicy::Order0)];
        assert_eq!(Setting::parse_list("no-follow,swapin-max=16K,policy=order0"), Ok(want.clone()));
        assert_eq!(Setting::parse_list("no-follow:swapin-max=16K:policy=order0"), Ok(want.clone()));
        assert_eq!(Setting::parse_list(" no-follow :swapin-max=16K, policy=order0"), Ok(want));
        let mut c = PagerConfig::default();
        for s in Setting::parse_list("swapin-max=16K,swapin-max=2M").unwrap() {
            s.apply(&mut c);
        }
        assert_eq!(c.swapin_max_pages, 512, "the last one wins");
        for bad in ["", "no-follow,", "no-follow,,pin", ":pin"] {
            assert!(Setting::parse_list(bad).unwrap_err().contains("empty setting"), "{bad:?}");
        }
        let e = Setting::parse_list("no-follow,swapin-max=3K").unwrap_err();
        assert!(e.starts_with("swapin-max=3K is not a power of two from 4K to 2M"), "{e}");
    }

    #[test]
    fn bad_settings_are_one_line_naming_the_setting_and_what_is_valid() {
        for (bad, needle) in [
            ("polcy=order0", "unknown setting 'polcy': settings are policy=locality|order0|always"),
            ("policy=fast", "policy 'fast' is not a swap-in policy: use policy=locality, order0 or always"),
            ("policy", "setting 'policy' needs a value, e.g. policy=order0"),
            ("swapin-max=3K", "swapin-max=3K is not a power of two from 4K to 2M"),
            ("swapin-max=4M", "swapin-max=4M is not a power of two from 4K to 2M"),
            ("swapin-max=lots", "swapin-max 'lots' is not a size"),
            ("readahead=12K", "readahead=12K is not a power of two"),
            ("fault-around-max=3K", "fault-around-max=3K is not"),
            ("prefetch=2000", "prefetch '2000' is not a number of pages from 0 (off) to 1024"),
            ("spin=-1", "spin '-1' is not a number of microseconds from 0 to 100000"),
            ("threads=x", "threads 'x' is not a number of fault threads"),
            ("threads=65", "threads '65' is not a number of fault threads from 0 (one per CPU) to 64"),
            ("nice=-5", "nice '-5' is not a nice value from 0 to 19"),
            ("nice", "setting 'nice' needs a value, e.g. nice=10"),
            ("fault=fast", "fault=thread or fault=signal"),
            ("compressor=zstd-40", "zstd-LEVEL (1 to 19)"),
            ("recompress=gzip", "recompress=none"),
            ("budget=12", "budget '12' is not a size of 1M or more"),
            ("pool-max=lots", "pool-max 'lots' is not a size of 1M or more"),
            ("tiers=zero+disk", "tiers 'zero+disk': unknown tier 'disk'"),
            ("no-encrypt=yes", "setting 'no-encrypt' is a switch and takes no value"),
            ("", "an empty setting"),
        ] {
            let e = Setting::parse(bad).unwrap_err();
            assert!(e.contains(needle), "{bad:?}: {e}");
            assert_eq!(e.lines().count(), 1, "{bad:?}: one line: {e}");
        }
    }

    #[test]
    fn swapin_max_sizes() {
        assert_eq!(swapin_max_pages(4 << 10), Ok(1));
        assert_eq!(swapin_max_pages(64 << 10), Ok(16));
        assert_eq!(swapin_max_pages(2 << 20), Ok(512));
        assert!(swapin_max_pages(0).is_err());
        assert!(swapin_max_pages(4 << 20).unwrap_err().starts_with("4M is not"));
        assert!(swapin_max_pages(4097).unwrap_err().contains("4097 bytes"));
        assert!(swapin_max_pages(48 << 10).unwrap_err().starts_with("48K is not"));
    }
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
