//! Reports: medians and spreads per workload and engine, ratios to the kernel and of
//! tierswap's variants to plain tierswap, the tables and the JSON document.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::machine::Machine;
use crate::RunResult;

/// Median, min and max of a set of samples.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub struct Spread {
    /// Median (mean of the middle two for an even count).
    pub median: f64,
    /// Smallest.
    pub min: f64,
    /// Largest.
    pub max: f64,
}

impl Spread {
    /// Of `xs` (all zeros if empty).
    pub fn of(xs: &[f64]) -> Spread {
        if xs.is_empty() {
            return Spread::default();
        }
        let mut v = xs.to_vec();
        v.sort_by(|a, b| a.total_cmp(b));
        let n = v.len();
        let median = if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 };
        Spread { median, min: v[0], max: v[n - 1] }
    }
}

/// tierswap's counters that show whether its swap-in and reclaim policies acted: the
/// second table prints their medians per workload and tierswap engine.
pub const POLICY_COUNTERS: [&str; 12] = [
    "swpin_large",
    "swpin_large_pages",
    "swpin_large_fallback",
    "fault_around_pages",
    "swap_prefetch",
    "swap_prefetch_hit",
    "swpout_clean",
    "workingset_refault",
    "workingset_activate",
    "pool_limit_grow",
    "pool_limit_shrink",
    "pswpin",
];

/// tierswap's counters of the tiers below the pool: the third table prints their medians
/// beside the refault phase's µs per fault, so the remote tier and the file tier (e.g.
/// `--tiers zero,pool,remote=… --engine tierswap,tierswap:tiers=zero+pool+file`) compare
/// row by row. The round-trip percentiles are of the refault phase alone.
pub const TIER_COUNTERS: [&str; 7] =
    ["pswpin", "pswpout", "remote_out", "remote_in", "remote_rtt_p50_us", "remote_rtt_p99_us", "remote_errors"];

/// Whether `engine` is a tierswap variant (`tierswap:…`), compared with plain `tierswap`.
fn is_tierswap_variant(engine: &str) -> bool {
    engine.starts_with("tierswap:")
}

/// One workload on one engine, over its runs.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Workload.
    pub workload: String,
    /// Engine.
    pub engine: String,
    /// Runs.
    pub runs: usize,
    /// Swap-out (fill under the budget) seconds.
    pub swapout_s: Spread,
    /// Refault seconds.
    pub refault_s: Spread,
    /// Refault µs per touched page.
    pub refault_us_per_page: Spread,
    /// p99 fault latency, µs.
    pub fault_p99_us: Spread,
    /// Highest footprint / budget over all runs.
    pub footprint_max_ratio: f64,
    /// Mismatching pages over all runs.
    pub mismatches: u64,
    /// Pages verified over all runs.
    pub pages_verified: u64,
    /// Median refault ÷ kernel-zswap's median refault, same workload.
    pub refault_vs_zswap: Option<f64>,
    /// Median refault ÷ kernel-zram's median refault, same workload.
    pub refault_vs_zram: Option<f64>,
    /// Median swap-out ÷ kernel-zswap's.
    pub swapout_vs_zswap: Option<f64>,
    /// tierswap variants: plain tierswap's median refault ÷ this variant's, same workload
    /// (below 1: plain tierswap is faster).
    pub tierswap_refault_over_this: Option<f64>,
    /// Free seconds (usemem).
    pub free_s: Spread,
    /// Faults in the refault phase, where the engine counts them (tierswap).
    pub refault_faults: Spread,
    /// Medians of [`POLICY_COUNTERS`] over the runs (tierswap engines; empty for the kernel's).
    pub policy_counters: BTreeMap<String, f64>,
    /// Refault µs per fault of the refault phase, where the engine counts faults (tierswap).
    pub refault_us_per_fault: Spread,
    /// Medians of [`TIER_COUNTERS`] over the runs (tierswap engines; empty for the kernel's).
    pub tier_counters: BTreeMap<String, f64>,
}

/// Summaries in the order the workloads and engines first appear in `results`.
pub fn summarize(results: &[RunResult]) -> Vec<Summary> {
    let mut keys: Vec<(String, String)> = Vec::new();
    for r in results {
        let k = (r.workload.clone(), r.engine.clone());
        if !keys.contains(&k) {
            keys.push(k);
        }
    }
    let mut out: Vec<Summary> =
        keys.iter()
            .map(|(w, e)| {
                let rs: Vec<&RunResult> = results.iter().filter(|r| &r.workload == w && &r.engine == e).collect();
                let col = |f: &dyn Fn(&RunResult) -> f64| Spread::of(&rs.iter().map(|r| f(r)).collect::<Vec<_>>());
                Summary {
                    workload: w.clone(),
                    engine: e.clone(),
                    runs: rs.len(),
                    swapout_s: col(&|r| r.swapout_s),
                    refault_s: col(&|r| r.refault_s),
                    refault_us_per_page: col(&|r| {
                        if r.refault_pages > 0 {
                            r.refault_s * 1e6 / r.refault_pages as f64
                        } else {
                            0.0
                        }
                    }),
                    fault_p99_us: col(&|r| r.fault_p99_us as f64),
                    footprint_max_ratio: rs
                        .iter()
                        .map(|r| {
                            if r.budget_bytes > 0 {
                                r.footprint_max_bytes as f64 / r.budget_bytes as f64
                            } else {
                                0.0
                            }
                        })
                        .fold(0.0, f64::max),
                    mismatches: rs.iter().map(|r| r.mismatches).sum(),
                    pages_verified: rs.iter().map(|r| r.pages_verified).sum(),
                    refault_vs_zswap: None,
                    refault_vs_zram: None,
                    swapout_vs_zswap: None,
                    tierswap_refault_over_this: None,
                    free_s: col(&|r| r.free_s),
                    refault_faults: col(&|r| r.refault_faults as f64),
                    policy_counters: counter_medians(&rs, &POLICY_COUNTERS),
                    refault_us_per_fault: col(&|r| {
                        if r.refault_faults > 0 {
                            r.refault_s * 1e6 / r.refault_faults as f64
                        } else {
                            0.0
                        }
                    }),
                    tier_counters: counter_medians(&rs, &TIER_COUNTERS),
                }
            })
            .collect();
    let base = |out: &[Summary], w: &str, e: &str| {
        out.iter().find(|s| s.workload == w && s.engine == e).map(|s| (s.refault_s.median, s.swapout_s.median))
    };
    for i in 0..out.len() {
        let w = out[i].workload.clone();
        let ratio = |a: f64, b: f64| if b > 0.0 { Some(a / b) } else { None };
        if let Some((rz, sz)) = base(&out, &w, "kernel-zswap") {
            out[i].refault_vs_zswap = ratio(out[i].refault_s.median, rz);
            out[i].swapout_vs_zswap = ratio(out[i].swapout_s.median, sz);
        }
        if let Some((rz, _)) = base(&out, &w, "kernel-zram") {
            out[i].refault_vs_zram = ratio(out[i].refault_s.median, rz);
        }
        if is_tierswap_variant(&out[i].engine) {
            if let Some((rt, _)) = base(&out, &w, "tierswap") {
                out[i].tierswap_refault_over_this = ratio(rt, out[i].refault_s.median);
            }
        }
    }
    out
}

/// Medians over `rs` of the counters in `names` that any run has (a run without one counts 0).
fn counter_medians(rs: &[&RunResult], names: &[&str]) -> BTreeMap<String, f64> {
    names
        .iter()
        .filter(|name| rs.iter().any(|r| r.counters.contains_key(**name)))
        .map(|name| {
            let xs: Vec<f64> = rs.iter().map(|r| r.counters.get(*name).copied().unwrap_or(0) as f64).collect();
            (name.to_string(), Spread::of(&xs).median)
        })
        .collect()
}

fn spread(s: &Spread, digits: usize) -> String {
    format!("{:.d$} ({:.d$}–{:.d$})", s.median, s.min, s.max, d = digits)
}

fn opt_ratio(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.2}"))
}

/// Width of the engine column: the longest label, at least 13.
fn engine_width(summaries: &[Summary]) -> usize {
    summaries.iter().map(|x| x.engine.chars().count()).max().unwrap_or(0).max(13)
}

/// The table, as printed: the main table, then tierswap's policy counters if any ran.
pub fn table(machine: &Machine, header: &str, summaries: &[Summary]) -> String {
    let ew = engine_width(summaries);
    let variants = summaries.iter().any(|x| is_tierswap_variant(&x.engine));
    let mut s = String::new();
    s.push_str(&format!("# {}\n# {}\n", machine.summary(), header));
    s.push_str("# medians over runs, (min–max); ÷zswap ÷zram: this engine's median refault ÷ that kernel engine's; out÷zsw: the same for swap-out\n");
    if variants {
        s.push_str(
            "# ts÷: plain tierswap's median refault ÷ this tierswap variant's (below 1: plain tierswap is faster)\n",
        );
    }
    s.push_str(&format!(
        "{:<16} {:<ew$} {:>4} {:>22} {:>22} {:>20} {:>7} {:>7} {:>8} {:>8} {:>7} {:>7} {:>8}{}\n",
        "workload",
        "engine",
        "runs",
        "swapout s",
        "refault s",
        "µs/page",
        "p99 µs",
        "fp/budg",
        "mismatch",
        "free s",
        "÷zswap",
        "÷zram",
        "out÷zsw",
        if variants { format!(" {:>6}", "ts÷") } else { String::new() },
    ));
    for x in summaries {
        s.push_str(&format!(
            "{:<16} {:<ew$} {:>4} {:>22} {:>22} {:>20} {:>7} {:>7.3} {:>8} {:>8} {:>7} {:>7} {:>8}{}\n",
            x.workload,
            x.engine,
            x.runs,
            spread(&x.swapout_s, 3),
            spread(&x.refault_s, 3),
            spread(&x.refault_us_per_page, 2),
            if x.fault_p99_us.median > 0.0 { format!("{:.0}", x.fault_p99_us.median) } else { "–".into() },
            x.footprint_max_ratio,
            x.mismatches,
            if x.free_s.median > 0.0 { format!("{:.4}", x.free_s.median) } else { "–".into() },
            opt_ratio(x.refault_vs_zswap),
            opt_ratio(x.refault_vs_zram),
            opt_ratio(x.swapout_vs_zswap),
            if variants { format!(" {:>6}", opt_ratio(x.tierswap_refault_over_this)) } else { String::new() },
        ));
    }
    s.push_str(&policy_table(summaries));
    s.push_str(&tier_table(summaries));
    s
}

/// The third table: per tierswap engine, the refault phase's µs per fault and the medians
/// of [`TIER_COUNTERS`]. Only when some run had a remote tier (the file tier's counters
/// alone are in the JSON).
pub fn tier_table(summaries: &[Summary]) -> String {
    if !summaries.iter().any(|x| x.tier_counters.get("remote_out").is_some_and(|&v| v > 0.0)) {
        return String::new();
    }
    let rows: Vec<&Summary> = summaries.iter().filter(|x| !x.tier_counters.is_empty()).collect();
    let ew = engine_width(summaries);
    let mut s = String::from(
        "\n# tierswap tiers below the pool: µs/fault of the refault phase (median, min–max); counters medians over runs, \
         pswpin/pswpout the file tier's pages, rtt the remote round trips of the refault phase\n",
    );
    s.push_str(&format!("{:<16} {:<ew$} {:>4} {:>24}", "workload", "engine", "runs", "µs/fault"));
    for name in TIER_COUNTERS {
        s.push_str(&format!(" {name:>w$}", w = name.len().max(9)));
    }
    s.push('\n');
    for x in rows {
        s.push_str(&format!(
            "{:<16} {:<ew$} {:>4} {:>24}",
            x.workload,
            x.engine,
            x.runs,
            spread(&x.refault_us_per_fault, 1)
        ));
        for name in TIER_COUNTERS {
            let v = x.tier_counters.get(name).map_or("–".into(), |v| format!("{v:.0}"));
            s.push_str(&format!(" {v:>w$}", w = name.len().max(9)));
        }
        s.push('\n');
    }
    s
}

/// The second table: per tierswap engine, the refault phase's faults and the medians of
/// [`POLICY_COUNTERS`] over the whole run. Empty when no tierswap engine ran.
pub fn policy_table(summaries: &[Summary]) -> String {
    let rows: Vec<&Summary> = summaries.iter().filter(|x| !x.policy_counters.is_empty()).collect();
    if rows.is_empty() {
        return String::new();
    }
    let ew = engine_width(summaries);
    let mut s = String::from(
        "\n# tierswap policy counters: medians over runs; faults of the refault phase, the others over the whole run\n",
    );
    s.push_str(&format!("{:<16} {:<ew$} {:>4} {:>9}", "workload", "engine", "runs", "faults"));
    for name in POLICY_COUNTERS {
        s.push_str(&format!(" {name:>w$}", w = name.len().max(9)));
    }
    s.push('\n');
    for x in rows {
        s.push_str(&format!("{:<16} {:<ew$} {:>4} {:>9.0}", x.workload, x.engine, x.runs, x.refault_faults.median));
        for name in POLICY_COUNTERS {
            let v = x.policy_counters.get(name).map_or("–".into(), |v| format!("{v:.0}"));
            s.push_str(&format!(" {v:>w$}", w = name.len().max(9)));
        }
        s.push('\n');
    }
    s
}

/// The JSON document the lab writes.
#[derive(Serialize)]
pub struct Document<'a> {
    /// The machine.
    pub machine: &'a Machine,
    /// The invocation's settings.
    pub config: serde_json::Value,
    /// Every run.
    pub runs: &'a [RunResult],
    /// Per workload and engine.
    pub summary: &'a [Summary],
    /// Engines skipped and runs failed.
    pub problems: Vec<String>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(w: &str, e: &str, refault_s: f64) -> RunResult {
        RunResult {
            workload: w.into(),
            engine: e.into(),
            refault_s,
            refault_pages: 1000,
            budget_bytes: 100,
            footprint_max_bytes: 103,
            pages_verified: 1000,
            ..Default::default()
        }
    }

    #[test]
    fn medians_spreads_and_ratios() {
        assert_eq!(Spread::of(&[3.0, 1.0, 2.0]), Spread { median: 2.0, min: 1.0, max: 3.0 });
        assert_eq!(Spread::of(&[4.0, 1.0, 2.0, 3.0]).median, 2.5);
        let rs = vec![
            run("seq64", "tierswap", 1.0),
            run("seq64", "kernel-zswap", 2.0),
            run("seq64", "tierswap", 3.0),
            run("seq64", "kernel-zswap", 4.0),
            run("seq64", "tierswap", 2.0),
            run("seq64", "kernel-zswap", 6.0),
        ];
        let s = summarize(&rs);
        assert_eq!(s.len(), 2);
        assert_eq!(s[0].engine, "tierswap");
        assert_eq!(s[0].refault_s.median, 2.0);
        assert_eq!(s[0].refault_vs_zswap, Some(0.5));
        assert_eq!(s[1].refault_vs_zswap, Some(1.0));
        assert_eq!(s[0].refault_vs_zram, None);
        assert_eq!(s[0].pages_verified, 3000);
        assert!((s[0].footprint_max_ratio - 1.03).abs() < 1e-9);
        assert!((s[0].refault_us_per_page.median - 2000.0).abs() < 1e-9);
        let t = table(&Machine::default(), "test", &s);
        assert!(t.contains("seq64") && t.contains("0.50"));
        assert!(!t.contains("ts÷") && !t.contains("policy counters"), "no variant, no tierswap counters: {t}");
    }

    #[test]
    fn variants_compare_with_plain_tierswap_and_show_their_counters() {
        let counted = |e: &str, refault_s: f64, large: u64| {
            let mut r = run("thrash", e, refault_s);
            r.refault_faults = 10;
            r.counters = POLICY_COUNTERS.iter().map(|n| (n.to_string(), 0)).collect();
            r.counters.insert("swpin_large".into(), large);
            r.counters.insert("swpout_clean".into(), 7);
            r
        };
        let rs = vec![
            counted("tierswap", 1.0, 100),
            counted("tierswap:policy=order0", 4.0, 0),
            run("thrash", "kernel-zswap", 2.0),
            counted("tierswap", 3.0, 300),
            counted("tierswap:policy=order0", 4.0, 0),
            run("thrash", "kernel-zswap", 2.0),
        ];
        let s = summarize(&rs);
        assert_eq!(s[0].tierswap_refault_over_this, None, "plain tierswap is the reference");
        assert_eq!(s[1].engine, "tierswap:policy=order0");
        assert_eq!(s[1].tierswap_refault_over_this, Some(0.5), "2.0 ÷ 4.0");
        assert_eq!(s[1].refault_vs_zswap, Some(2.0), "variants get the kernel ratios too");
        assert_eq!(s[2].tierswap_refault_over_this, None);
        assert_eq!(s[0].policy_counters["swpin_large"], 200.0);
        assert_eq!(s[1].policy_counters["swpout_clean"], 7.0);
        assert!(s[2].policy_counters.is_empty(), "the kernel has no tierswap counters");
        let t = table(&Machine::default(), "test", &s);
        assert!(t.contains("ts÷") && t.contains("tierswap policy counters"), "{t}");
        let row = t.lines().find(|l| l.starts_with("thrash") && l.contains("order0") && l.contains("0.50")).unwrap();
        assert!(row.ends_with("0.50"), "{row}");
        let counters: Vec<&str> = t.lines().skip_while(|l| !l.contains("policy counters")).collect();
        assert_eq!(counters.len(), 4, "comment, header, two tierswap rows: {counters:?}");
        assert!(counters[2].contains(" 200 ") && counters[2].contains(" 10 "), "{}", counters[2]);
        assert!(!t.contains("tiers below the pool"), "no remote tier, no tier table: {t}");
    }

    #[test]
    fn the_remote_tier_and_the_file_tier_side_by_side() {
        let tiered = |e: &str, refault_s: f64, faults: u64, remote: bool| {
            let mut r = run("usama_1g", e, refault_s);
            r.refault_faults = faults;
            r.counters.insert("pswpin".into(), if remote { 0 } else { 700 });
            if remote {
                r.counters.insert("remote_out".into(), 900);
                r.counters.insert("remote_in".into(), 800);
                r.counters.insert("remote_rtt_p50_us".into(), 128);
                r.counters.insert("remote_rtt_p99_us".into(), 4096);
            }
            r
        };
        let rs = vec![
            tiered("tierswap", 2.0, 1000, true),
            tiered("tierswap:tiers=zero+pool+file", 1.0, 1000, false),
            tiered("tierswap", 4.0, 1000, true),
            tiered("tierswap:tiers=zero+pool+file", 1.5, 1000, false),
            tiered("tierswap", 3.0, 1000, true),
            tiered("tierswap:tiers=zero+pool+file", 0.5, 1000, false),
        ];
        let s = summarize(&rs);
        assert_eq!(s[0].refault_us_per_fault, Spread { median: 3000.0, min: 2000.0, max: 4000.0 });
        assert_eq!(s[1].refault_us_per_fault.median, 1000.0);
        assert_eq!(s[0].tier_counters["remote_in"], 800.0);
        assert_eq!(s[1].tier_counters.get("remote_in"), None, "no run of the file variant has it");
        let t = table(&Machine::default(), "test", &s);
        let tiers: Vec<&str> = t.lines().skip_while(|l| !l.contains("tiers below the pool")).collect();
        assert_eq!(tiers.len(), 4, "comment, header, two rows: {tiers:?}");
        assert!(tiers[2].contains("3000.0 (2000.0–4000.0)") && tiers[2].contains(" 4096 "), "{}", tiers[2]);
        assert!(tiers[3].contains("tiers=zero+pool+file") && tiers[3].contains(" 700 "), "{}", tiers[3]);
    }
}
