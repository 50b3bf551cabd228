//! Engine variants: one `--engine` entry names an engine and, for tierswap, settings that
//! differ from the command's flags, so that two builds of the policy run side by side in one
//! lab, alternating run by run (docs/design.md, Alternation and warm-up).
//!
//! Syntax: `ENGINE[:SETTING[:SETTING…]]`, with SETTING one of `policy=locality|order0|always`,
//! `swapin-max=SIZE` (4K to 2M, a power of two), `readahead=SIZE` (the disk readahead
//! window's cap, likewise; 4K turns readahead off), `fault-around-max=SIZE` (first-touch
//! fault-around's largest window, likewise), and the switches `fault-around`,
//! `workingset`, `keep-clean`, `encrypt`, `pin` (a fault thread pinned to each CPU), `idle-bg` (the
//! reclaim and writeback threads under SCHED_IDLE), `batch-release` (evicted blocks'
//! mirror copies dropped 8 at a time), `batch-stage` (up to 16 blocks staged per move),
//! `reread-to-pool` (a clean page read back from the file twice goes to the pool next),
//! `learn-blocks` (a lone fault brings its 64 KiB block
//! in whole once blocks are seen read whole), `direct-reclaim` (a fault thread
//! waiting for room evicts itself), `stage-ahead` (the reclaim thread keeps 2 MiB staged
//! ahead of its eviction, for direct reclaimers), each
//! also as `no-…`, `spin=US`, `threads=N` (fault threads), `nice=N` (the
//! reclaim and writeback threads' nice value, 0 to 19) and
//! `fault=thread|signal`, `compressor=lz4|zstd|zstd-LEVEL|zstd-fast[-N]`,
//! `recompress=none|zstd|zstd-LEVEL|zstd-fast[-N]`,
//! `budget=SIZE` (this engine's own
//! budget instead of `--budget`), `pool-max=SIZE` and `tiers=zero+pool+file` (local tiers,
//! '+' between them: the variant drops a remote tier the flags gave, so the remote and the
//! file tier run side by side). Examples:
//! `tierswap:policy=order0`, `tierswap:no-fault-around:swapin-max=2M`. No brackets, no
//! spaces: the list goes through a shell unquoted. The entry's text is its label in the
//! table, the JSON and the plots. This module owns parsing and applying; it makes no engine.

use tierswap::{Compressor, FaultMode, PagerConfig, SwapinPolicy};

use crate::EngineKind;

/// The settings a variant may change, as they are spelled in a spec (for error messages).
pub const SETTINGS: &str = "policy=locality|order0|always, swapin-max=SIZE (4K..2M), readahead=SIZE (4K..2M, 4K: off), fault-around-max=SIZE (4K..2M), \
     [no-]fault-around, [no-]workingset, [no-]keep-clean, [no-]encrypt, [no-]pin, [no-]idle-bg, [no-]batch-release, [no-]batch-stage, [no-]reread-to-pool, [no-]pool-adapt, [no-]learn-blocks, [no-]direct-reclaim, [no-]stage-ahead, [no-]follow, [no-]throttle-headroom, [no-]read-next-unit, prefetch=N (stride prefetch window cap in pages, 0 or no-prefetch: off), spin=US, threads=N, nice=N, fault=thread|signal, compressor=lz4|zstd|zstd-LEVEL|zstd-fast[-N], recompress=none|zstd|zstd-LEVEL|zstd-fast[-N], budget=SIZE, pool-max=SIZE, tiers=zero+pool+file";

/// Largest swap-in in bytes a user may ask for (512 pages).
const SWAPIN_MAX_BYTES: u64 = (tierswap::config::MAX_SWAPIN_PAGES as u64) * PAGE_BYTES;
const PAGE_BYTES: u64 = 4096;
/// The largest stride prefetch window a variant may ask for, in pages.
const MAX_PREFETCH_PAGES: u32 = 1024;

/// One setting a variant changes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Override {
    /// `policy=…`: how a fault picks the size of a swap-in.
    Policy(SwapinPolicy),
    /// `swapin-max=SIZE`: largest swap-in, in pages.
    SwapinMaxPages(u32),
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
    /// `learn-blocks` / `no-learn-blocks`: a lone fault brings its block in whole once
    /// blocks are seen read whole.
    LearnBlocks(bool),
    /// `direct-reclaim` / `no-direct-reclaim`: fault threads evict while they wait for room.
    DirectReclaim(bool),
    /// `stage-ahead` / `no-stage-ahead`: the reclaim thread keeps 2 MiB staged ahead of its
    /// own eviction, for direct reclaimers to evict from.
    StageAhead(bool),
    /// `read-next-unit` / `no-read-next-unit`: whole-unit file reads take the next unit too.
    ReadNextUnit(bool),
    /// `spin=US`: the fault threads' adaptive spin.
    SpinUs(u32),
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
    /// `tiers=zero+pool+file`: these local tiers and no remote tier.
    LocalTiers(tierswap::Tiers),
    /// `fault=thread|signal`: who serves a fault.
    Fault(FaultMode),
    /// `compressor=…`: the pool's compressor.
    Compressor(Compressor),
    /// `recompress=…`: the codec cold pool objects are recompressed with, or none.
    Recompress(Option<Compressor>),
    /// `budget=SIZE`: this engine's budget, in bytes.
    Budget(u64),
    /// `pool-max=SIZE`: the pool limit, in bytes.
    PoolMax(u64),
}

impl Override {
    /// Writes this setting into `config`.
    pub fn apply(self, config: &mut PagerConfig) {
        match self {
            Override::Policy(p) => config.swapin_policy = p,
            Override::SwapinMaxPages(n) => config.swapin_max_pages = n,
            Override::ReadaheadMaxPages(n) => config.readahead_max_pages = n,
            Override::PrefetchMaxPages(n) => config.stride_prefetch_max_pages = n,
            Override::FaultAround(on) => config.fault_around = on,
            Override::FaultAroundMaxPages(n) => config.fault_around_max_pages = n,
            Override::Workingset(on) => config.workingset = on,
            Override::KeepClean(on) => config.keep_clean = on,
            Override::Encrypt(on) => config.encrypt = on,
            Override::Pin(on) => config.fault_pin = on,
            Override::IdleBackground(on) => config.background_idle = on,
            Override::BatchRelease(on) => config.batch_release = on,
            Override::BatchStage(on) => config.batch_stage = on,
            Override::RereadToPool(on) => config.reread_to_pool = on,
            Override::PoolAdapt(on) => config.pool_adapt = on,
            Override::LearnBlocks(on) => config.swapin_learn_blocks = on,
            Override::DirectReclaim(on) => config.direct_reclaim = on,
            Override::StageAhead(on) => config.stage_ahead = on,
            Override::ReadNextUnit(on) => config.file_read_next_unit = on,
            Override::SpinUs(us) => config.fault_spin_us = us,
            Override::FaultThreads(n) => config.fault_threads = n,
            Override::Follow(on) => config.fault_follow = on,
            Override::ThrottleHeadroom(on) => config.throttle_headroom = on,
            Override::Nice(n) => config.background_nice = n,
            Override::LocalTiers(t) => {
                config.tiers = t;
                config.remote = None;
            }
            Override::Fault(m) => config.fault_mode = m,
            Override::Compressor(c) => config.compressor = c,
            Override::Recompress(c) => config.recompress = c,
            Override::Budget(b) => config.budget_bytes = b,
            Override::PoolMax(b) => config.pool_max_bytes = Some(b),
        }
    }

    /// Parses one `key[=value]`; the error names the bad key or value and what is valid.
    fn parse(setting: &str) -> Result<Override, String> {
        let (key, value) = match setting.split_once('=') {
            Some((k, v)) => (k.trim(), Some(v.trim())),
            None => (setting.trim(), None),
        };
        let switch = |make: fn(bool) -> Override, on: bool| match value {
            None => Ok(make(on)),
            Some(_) => Err(format!("setting '{key}' is a switch and takes no value")),
        };
        let needs = |example: &str| format!("setting '{key}' needs a value, e.g. {key}={example}");
        match key {
            "policy" => {
                let v = value.ok_or_else(|| needs("order0"))?;
                v.parse::<SwapinPolicy>()
                    .map(Override::Policy)
                    .map_err(|_| format!("policy '{v}' is not a swap-in policy: use policy=locality, order0 or always"))
            }
            "swapin-max" => {
                pages_setting(key, value.ok_or_else(|| needs("64K"))?, "4K", "64K").map(Override::SwapinMaxPages)
            }
            "readahead" => {
                pages_setting(key, value.ok_or_else(|| needs("4K"))?, "4K (off)", "4K").map(Override::ReadaheadMaxPages)
            }
            "fault-around-max" => pages_setting(key, value.ok_or_else(|| needs("64K"))?, "4K", "256K")
                .map(Override::FaultAroundMaxPages),
            "prefetch" => value
                .ok_or_else(|| needs("32"))?
                .parse::<u32>()
                .ok()
                .filter(|n| *n <= MAX_PREFETCH_PAGES)
                .map(Override::PrefetchMaxPages)
                .ok_or_else(|| {
                    format!(
                        "prefetch '{}' is not a number of pages from 0 (off) to {MAX_PREFETCH_PAGES}, e.g. prefetch=32",
                        value.unwrap_or("")
                    )
                }),
            "no-prefetch" => switch(|_| Override::PrefetchMaxPages(0), false),
            "fault-around" => switch(Override::FaultAround, true),
            "no-fault-around" => switch(Override::FaultAround, false),
            "workingset" => switch(Override::Workingset, true),
            "no-workingset" => switch(Override::Workingset, false),
            "pin" => switch(Override::Pin, true),
            "no-pin" => switch(Override::Pin, false),
            "idle-bg" => switch(Override::IdleBackground, true),
            "no-idle-bg" => switch(Override::IdleBackground, false),
            "batch-release" => switch(Override::BatchRelease, true),
            "no-batch-release" => switch(Override::BatchRelease, false),
            "batch-stage" => switch(Override::BatchStage, true),
            "no-batch-stage" => switch(Override::BatchStage, false),
            "reread-to-pool" => switch(Override::RereadToPool, true),
            "no-reread-to-pool" => switch(Override::RereadToPool, false),
            "pool-adapt" => switch(Override::PoolAdapt, true),
            "no-pool-adapt" => switch(Override::PoolAdapt, false),
            "read-next-unit" => switch(Override::ReadNextUnit, true),
            "no-read-next-unit" => switch(Override::ReadNextUnit, false),
            "learn-blocks" => switch(Override::LearnBlocks, true),
            "no-learn-blocks" => switch(Override::LearnBlocks, false),
            "direct-reclaim" => switch(Override::DirectReclaim, true),
            "no-direct-reclaim" => switch(Override::DirectReclaim, false),
            "throttle-headroom" => switch(Override::ThrottleHeadroom, true),
            "no-throttle-headroom" => switch(Override::ThrottleHeadroom, false),
            "follow" => switch(Override::Follow, true),
            "no-follow" => switch(Override::Follow, false),
            "stage-ahead" => switch(Override::StageAhead, true),
            "no-stage-ahead" => switch(Override::StageAhead, false),
            "spin" => value
                .ok_or_else(|| needs("50"))?
                .parse::<u32>()
                .ok()
                .filter(|us| *us <= 100_000)
                .map(Override::SpinUs)
                .ok_or_else(|| {
                    format!(
                        "spin '{}' is not a number of microseconds from 0 to 100000, e.g. spin=50",
                        value.unwrap_or("")
                    )
                }),
            "threads" => value
                .ok_or_else(|| needs("1"))?
                .parse::<usize>()
                .ok()
                .filter(|n| *n <= 64)
                .map(Override::FaultThreads)
                .ok_or_else(|| {
                    format!(
                        "threads '{}' is not a number of fault threads from 0 (one per CPU) to 64, e.g. threads=1",
                        value.unwrap_or("")
                    )
                }),
            "nice" => value
                .ok_or_else(|| needs("10"))?
                .parse::<i32>()
                .ok()
                .filter(|n| (0..=19).contains(n))
                .map(Override::Nice)
                .ok_or_else(|| {
                    format!(
                        "nice '{}' is not a nice value from 0 to 19 for the reclaim and writeback threads, e.g. nice=10",
                        value.unwrap_or("")
                    )
                }),
            "tiers" => {
                let v = value.ok_or_else(|| needs("zero+pool+file"))?;
                v.replace('+', ",")
                    .parse::<tierswap::Tiers>()
                    .map(Override::LocalTiers)
                    .map_err(|e| format!("tiers '{v}': {e} (local tiers joined by '+', e.g. tiers=zero+pool+file)"))
            }
            "fault" => {
                let v = value.ok_or_else(|| needs("signal"))?;
                v.parse::<FaultMode>()
                    .map(Override::Fault)
                    .map_err(|_| format!("fault '{v}' is not a fault mode: use fault=thread or fault=signal"))
            }
            "budget" | "pool-max" => {
                let v = value.ok_or_else(|| needs("512M"))?;
                let bytes = tierswap::parse_size(v)
                    .ok()
                    .filter(|&b| b >= 1 << 20)
                    .ok_or_else(|| format!("{key} '{v}' is not a size of 1M or more, e.g. {key}=512M"))?;
                Ok(if key == "budget" { Override::Budget(bytes) } else { Override::PoolMax(bytes) })
            }
            "compressor" => {
                let v = value.ok_or_else(|| needs("zstd"))?;
                v.parse::<Compressor>().map(Override::Compressor).map_err(|_| {
                    format!("compressor '{v}' is not a compressor: use compressor=lz4, zstd, zstd-LEVEL (1 to 19), zstd-fast or zstd-fast-N (1 to 7)")
                })
            }
            "recompress" => {
                let v = value.ok_or_else(|| needs("none"))?;
                tierswap::config::parse_recompress(v).map(Override::Recompress).map_err(|_| {
                    format!("recompress '{v}' is not a codec: use recompress=none, zstd, zstd-LEVEL (1 to 19), zstd-fast-N (1 to 7) or lz4")
                })
            }
            "keep-clean" => switch(Override::KeepClean, true),
            "no-keep-clean" => switch(Override::KeepClean, false),
            "encrypt" => switch(Override::Encrypt, true),
            "no-encrypt" => switch(Override::Encrypt, false),
            "" => Err(format!("an empty setting (two ':' in a row?): settings are {SETTINGS}")),
            other => Err(format!("unknown setting '{other}': settings are {SETTINGS}")),
        }
    }
}

/// The largest swap-in of `bytes` as pages: a power of two from 4 KiB to 2 MiB. The error
/// starts with the value, so a caller prefixes the flag or key: "--swapin-max 3K is not…".
pub fn swapin_max_pages(bytes: u64) -> Result<u32, String> {
    if !(PAGE_BYTES..=SWAPIN_MAX_BYTES).contains(&bytes) || !bytes.is_power_of_two() {
        return Err(format!(
            "{} is not a power of two from 4K to 2M: give e.g. 64K (16 pages, the default) or 2M",
            show_bytes(bytes)
        ));
    }
    Ok((bytes / PAGE_BYTES) as u32)
}

/// A `key=SIZE` setting counted in pages: a power of two from 4K (`low`, as the message
/// names it) to 2M; `example` is a valid value for the message.
fn pages_setting(key: &str, v: &str, low: &str, example: &str) -> Result<u32, String> {
    let bytes = tierswap::parse_size(v).map_err(|_| {
        format!("{key} '{v}' is not a size: give a power of two from {low} to 2M, e.g. {key}={example}")
    })?;
    swapin_max_pages(bytes).map_err(|e| format!("{key}={e}"))
}

fn show_bytes(b: u64) -> String {
    match b {
        b if b >= 1 << 20 && b % (1 << 20) == 0 => format!("{}M", b >> 20),
        b if b >= 1 << 10 && b % (1 << 10) == 0 => format!("{}K", b >> 10),
        b => format!("{b} bytes"),
    }
}

/// One `--engine` entry: the engine, its label, and (tierswap only) its settings.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EngineSpec {
    /// Which engine.
    pub kind: EngineKind,
    /// Settings applied over the configuration built from the flags, in order.
    pub overrides: Vec<Override>,
    label: String,
}

impl EngineSpec {
    /// The plain engine, no settings: labelled with its name.
    pub fn plain(kind: EngineKind) -> EngineSpec {
        EngineSpec { kind, overrides: Vec::new(), label: kind.name().to_string() }
    }

    /// The name in the table, the JSON and the plots: the spec as given, spaces trimmed.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Whether this is tierswap with settings of its own (not the plain `tierswap` row).
    pub fn is_variant(&self) -> bool {
        !self.overrides.is_empty()
    }

    /// The configuration of this variant: `base` (from the flags) with the settings applied.
    pub fn pager(&self, base: &PagerConfig) -> PagerConfig {
        let mut c = base.clone();
        for o in &self.overrides {
            o.apply(&mut c);
        }
        c
    }
}

impl std::str::FromStr for EngineSpec {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let s = s.trim();
        if s.contains('[') || s.contains(']') {
            return Err(format!(
                "engine '{s}': write variants as tierswap:policy=order0 (':' between settings, no brackets: shells glob them)"
            ));
        }
        let mut parts = s.split(':');
        let kind: EngineKind = parts.next().unwrap_or_default().parse()?;
        let settings: Vec<&str> = parts.map(str::trim).collect();
        if settings.is_empty() {
            return Ok(EngineSpec::plain(kind));
        }
        if kind != EngineKind::Tierswap {
            return Err(format!("engine '{s}': settings apply to tierswap only; give {} without ':…'", kind.name()));
        }
        let overrides = settings
            .iter()
            .map(|t| Override::parse(t))
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("engine '{s}': {e}"))?;
        let label = std::iter::once(kind.name()).chain(settings.iter().copied()).collect::<Vec<_>>().join(":");
        Ok(EngineSpec { kind, overrides, label })
    }
}

/// Parses the `--engine` list: every entry, no label twice.
pub fn parse_engines<S: AsRef<str>>(entries: &[S]) -> Result<Vec<EngineSpec>, String> {
    let mut out: Vec<EngineSpec> = Vec::new();
    for e in entries {
        let spec: EngineSpec = e.as_ref().parse()?;
        if out.iter().any(|o| o.label == spec.label) {
            return Err(format!("engine '{}' is given twice: list each engine or variant once", spec.label));
        }
        out.push(spec);
    }
    if out.is_empty() {
        return Err("no engine: give --engine tierswap[,…]".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<EngineSpec, String> {
        s.parse()
    }

    #[test]
    fn plain_engines_and_variants() {
        assert_eq!(parse("tierswap"), Ok(EngineSpec::plain(EngineKind::Tierswap)));
        assert_eq!(parse(" kernel-zswap ").map(|e| e.kind), Ok(EngineKind::KernelZswap));
        let v = parse("tierswap:policy=order0").unwrap();
        assert_eq!(v.label(), "tierswap:policy=order0");
        assert_eq!(v.overrides, vec![Override::Policy(SwapinPolicy::Order0)]);
        assert!(v.is_variant());
        let v = parse("tierswap: no-fault-around :swapin-max=2M:no-workingset:no-keep-clean:no-encrypt").unwrap();
        assert_eq!(v.label(), "tierswap:no-fault-around:swapin-max=2M:no-workingset:no-keep-clean:no-encrypt");
        let c = v.pager(&PagerConfig::default());
        assert!(!c.fault_around && !c.workingset && !c.keep_clean && !c.encrypt);
        assert_eq!(c.swapin_max_pages, 512);
        assert_eq!(c.swapin_policy, SwapinPolicy::Locality, "untouched settings come from the base");
        let base = PagerConfig { fault_around: false, ..Default::default() };
        assert!(parse("tierswap:fault-around").unwrap().pager(&base).fault_around, "a variant can switch back on");
        assert_eq!(parse("tierswap:swapin-max=4K").unwrap().overrides, vec![Override::SwapinMaxPages(1)]);
        assert_eq!(parse("tierswap:policy=always").unwrap().overrides, vec![Override::Policy(SwapinPolicy::Always)]);
        let v = parse("tierswap:fault=signal").unwrap();
        assert_eq!(v.pager(&PagerConfig::default()).fault_mode, FaultMode::Signal);
        let c = parse("tierswap:compressor=zstd-3").unwrap().pager(&PagerConfig::default()).compressor;
        assert_eq!(c, Compressor::Zstd { level: 3 });
        let c = parse("tierswap:budget=563M:pool-max=307M").unwrap().pager(&PagerConfig::default());
        assert_eq!((c.budget_bytes, c.pool_max_bytes), (563 << 20, Some(307 << 20)));
        let base = PagerConfig { fault_mode: FaultMode::Signal, ..Default::default() };
        assert_eq!(parse("tierswap:fault=thread").unwrap().pager(&base).fault_mode, FaultMode::Thread);
        assert_eq!(parse("tierswap:nice=10").unwrap().pager(&base).background_nice, 10);
        assert!(parse("tierswap:pin").unwrap().pager(&base).fault_pin);
        assert!(!parse("tierswap:no-pin").unwrap().pager(&PagerConfig { fault_pin: true, ..base.clone() }).fault_pin);
        assert!(parse("tierswap:pin=1").is_err());
        assert!(parse("tierswap:pin:idle-bg").unwrap().pager(&base).background_idle);
        assert!(!parse("tierswap:no-batch-release").unwrap().pager(&base).batch_release);
        let both = parse("tierswap:batch-release:batch-stage").unwrap().pager(&base);
        assert!(both.batch_release && both.batch_stage);
        let stage = parse("tierswap:batch-stage").unwrap().pager(&PagerConfig { batch_release: false, ..base.clone() });
        assert!(stage.batch_stage && !stage.batch_release, "each switch sets its own half");
        assert!(!parse("tierswap:no-batch-stage").unwrap().pager(&stage).batch_stage);
        let reread = parse("tierswap:reread-to-pool").unwrap().pager(&base);
        assert!(reread.reread_to_pool && !base.reread_to_pool);
        assert!(!parse("tierswap:no-reread-to-pool").unwrap().pager(&reread).reread_to_pool);
        assert!(!parse("tierswap:no-pool-adapt").unwrap().pager(&base).pool_adapt);
        let fixed = parse("tierswap:no-pool-adapt").unwrap().pager(&base);
        assert!(parse("tierswap:pool-adapt").unwrap().pager(&fixed).pool_adapt);
        assert!(!parse("tierswap:no-learn-blocks").unwrap().pager(&base).swapin_learn_blocks);
        let behind = parse("tierswap:no-stage-ahead").unwrap().pager(&base);
        assert!(base.stage_ahead && !behind.stage_ahead);
        assert!(parse("tierswap:stage-ahead").unwrap().pager(&behind).stage_ahead);
        let all_poll = parse("tierswap:no-follow").unwrap().pager(&base);
        assert!(base.fault_follow && !all_poll.fault_follow);
        assert!(parse("tierswap:follow").unwrap().pager(&all_poll).fault_follow);
        let eager = parse("tierswap:no-throttle-headroom").unwrap().pager(&base);
        assert!(base.throttle_headroom && !eager.throttle_headroom);
        assert!(parse("tierswap:throttle-headroom").unwrap().pager(&eager).throttle_headroom);
        assert_eq!(parse("tierswap:threads=1").unwrap().pager(&base).fault_threads, 1);
        assert!(parse("tierswap:threads=x").unwrap_err().contains("threads 'x' is not a number of fault threads"));
        assert_eq!(parse("tierswap:fault-around-max=64K").unwrap().pager(&base).fault_around_max_pages, 16);
        assert!(parse("tierswap:fault-around-max=3K").is_err());
        assert!(
            parse("tierswap:batch-release")
                .unwrap()
                .pager(&PagerConfig { batch_release: false, ..base.clone() })
                .batch_release
        );
        assert!(parse("tierswap:direct-reclaim").unwrap().pager(&base).direct_reclaim);
        assert_eq!(parse("tierswap:readahead=4K").unwrap().pager(&base).readahead_max_pages, 1);
        assert_eq!(parse("tierswap:readahead=256K").unwrap().pager(&base).readahead_max_pages, 64);
        assert!(parse("tierswap:readahead=12K").unwrap_err().contains("readahead="));
        assert!(parse("tierswap:readahead").is_err());
    }

    #[test]
    fn a_tiers_variant_runs_on_local_tiers_only() {
        let (tiers, remote) = tierswap::parse_tiers("zero,pool,remote=redis://127.0.0.1:7300").unwrap();
        let base = PagerConfig { tiers, remote, ..Default::default() };
        let v = parse("tierswap:tiers=zero+pool+file").unwrap();
        assert_eq!(v.label(), "tierswap:tiers=zero+pool+file");
        let c = v.pager(&base);
        assert_eq!(c.tiers, tierswap::Tiers { zero: true, pool: true, file: true });
        assert_eq!(c.remote, None, "the variant drops the flags' remote tier");
        assert!(base.remote.is_some(), "the base keeps it");
        let e = parse("tierswap:tiers=zero+disk").unwrap_err();
        assert!(e.contains("disk") && e.contains("zero+pool+file"), "{e}");
        assert!(parse("tierswap:tiers").unwrap_err().contains("tiers=zero+pool+file"));
    }

    #[test]
    fn bad_specs_name_the_bad_part_and_the_valid_ones() {
        let err = |s: &str| parse(s).unwrap_err();
        let e = err("tierswap:polcy=order0");
        assert!(e.contains("unknown setting 'polcy'") && e.contains("policy=locality|order0|always"), "{e}");
        assert!(e.contains("[no-]fault-around") && e.contains("[no-]encrypt"), "{e}");
        let e = err("tierswap:policy=fast");
        assert!(e.contains("policy 'fast'") && e.contains("order0"), "{e}");
        assert!(err("tierswap:policy").contains("needs a value, e.g. policy=order0"));
        assert!(err("tierswap:swapin-max=3K").contains("swapin-max=3K is not a power of two from 4K to 2M"));
        assert!(err("tierswap:swapin-max=4M").contains("from 4K to 2M"));
        assert!(err("tierswap:swapin-max=2K").contains("from 4K to 2M"));
        assert!(err("tierswap:swapin-max=lots").contains("swapin-max 'lots' is not a size"));
        assert!(err("tierswap:no-encrypt=yes").contains("'no-encrypt' is a switch"));
        assert!(err("tierswap::no-encrypt").contains("empty setting"));
        assert!(err("tierswap:fault=fast").contains("fault=thread or fault=signal"));
        assert!(err("tierswap:compressor=zstd-40").contains("zstd-LEVEL (1 to 19)"));
        let c = parse("tierswap:compressor=zstd-fast-2").unwrap().pager(&PagerConfig::default()).compressor;
        assert_eq!(c, Compressor::Zstd { level: -2 });
        assert!(err("tierswap:recompress=gzip").contains("recompress=none"));
        let base = PagerConfig::default();
        assert_eq!(parse("tierswap:recompress=none").unwrap().pager(&base).recompress, None);
        assert_eq!(
            parse("tierswap:recompress=zstd-3").unwrap().pager(&base).recompress,
            Some(Compressor::Zstd { level: 3 })
        );
        assert!(err("tierswap:budget=12").contains("budget '12' is not a size of 1M or more"));
        assert!(err("tierswap:nice=-5").contains("nice '-5' is not a nice value from 0 to 19"));
        assert!(err("tierswap:nice").contains("needs a value, e.g. nice=10"));
        assert!(err("tierswap:fault").contains("needs a value, e.g. fault=signal"));
        assert!(err("kernel-zswap:policy=order0").contains("tierswap only"));
        assert!(err("zfs:policy=order0").contains("unknown engine 'zfs'"));
        assert!(err("tierswap[policy=order0]").contains("tierswap:policy=order0"));
        for s in ["tierswap:x", "tierswap:policy=fast", "tierswap[a]"] {
            assert!(err(s).starts_with(&format!("engine '{s}'")), "{}", err(s));
            assert_eq!(err(s).lines().count(), 1);
        }
    }

    #[test]
    fn lists_reject_duplicates() {
        let l = parse_engines(&["tierswap", "tierswap:policy=order0", "kernel-zram"]).unwrap();
        assert_eq!(
            l.iter().map(|e| e.label()).collect::<Vec<_>>(),
            ["tierswap", "tierswap:policy=order0", "kernel-zram"]
        );
        assert!(parse_engines(&["tierswap", " tierswap"]).unwrap_err().contains("given twice"));
        assert!(parse_engines(&["tierswap:no-encrypt", "tierswap: no-encrypt"]).unwrap_err().contains("twice"));
        assert!(parse_engines::<&str>(&[]).is_err());
    }

    #[test]
    fn swapin_max_sizes() {
        assert_eq!(swapin_max_pages(64 << 10), Ok(16));
        assert_eq!(swapin_max_pages(2 << 20), Ok(512));
        assert!(swapin_max_pages(0).is_err());
        assert!(swapin_max_pages(4097).unwrap_err().contains("4097 bytes"));
        assert!(swapin_max_pages(48 << 10).is_err());
    }
}
