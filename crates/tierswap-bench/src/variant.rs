//! Engine variants: one `--engine` entry names an engine and, for tierswap, settings that
//! differ from the command's flags, so that two builds of the policy run side by side in one
//! lab, alternating run by run (docs/design.md, Alternation and warm-up).
//!
//! Syntax: `ENGINE[:SETTING[:SETTING…]]`, each SETTING one the engine parses and applies
//! ([`tierswap::config::Setting`]; [`tierswap::config::SETTINGS`] lists them: `policy=…`,
//! `swapin-max=SIZE`, switches such as `follow` and their `no-…` forms, `compressor=…`,
//! `budget=SIZE` (this engine's own budget instead of `--budget`), `tiers=zero+pool+file`
//! (local tiers: the variant drops a remote tier the flags gave, so the remote and the file
//! tier run side by side), …). `tierswap run --set` takes the same settings. Examples:
//! `tierswap:policy=order0`, `tierswap:no-fault-around:swapin-max=2M`. No brackets, no
//! spaces: the list goes through a shell unquoted. The entry's text is its label in the
//! table, the JSON and the plots. This module owns the entry and its label; it makes no
//! engine.

use tierswap::PagerConfig;

use crate::EngineKind;

/// `--swapin-max SIZE` as pages (the engine's check, shared with `swapin-max=`).
pub use tierswap::config::swapin_max_pages;
/// One setting a variant changes: the engine's own ([`tierswap::config::Setting`]), so that
/// `tierswap run --set` and the programs lab read variants the same way.
pub use tierswap::config::Setting as Override;
/// The settings a variant may change, as they are spelled in a spec (for error messages).
pub use tierswap::config::SETTINGS;

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
    use tierswap::{Compressor, FaultMode, SwapinPolicy};

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
