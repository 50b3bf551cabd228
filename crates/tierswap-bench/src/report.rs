//! Reports: medians and spreads per workload and engine, ratios to the kernel, the table
//! and the JSON document.

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
    /// Free seconds (usemem).
    pub free_s: Spread,
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
                    free_s: col(&|r| r.free_s),
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
    }
    out
}

fn spread(s: &Spread, digits: usize) -> String {
    format!("{:.d$} ({:.d$}–{:.d$})", s.median, s.min, s.max, d = digits)
}

fn opt_ratio(r: Option<f64>) -> String {
    r.map_or("–".into(), |r| format!("{r:.2}"))
}

/// The table, as printed.
pub fn table(machine: &Machine, header: &str, summaries: &[Summary]) -> String {
    let mut s = String::new();
    s.push_str(&format!("# {}\n# {}\n", machine.summary(), header));
    s.push_str("# medians over runs, (min–max); ÷zswap ÷zram: this engine's median refault ÷ that kernel engine's; out÷zsw: the same for swap-out\n");
    s.push_str(&format!(
        "{:<16} {:<13} {:>4} {:>22} {:>22} {:>20} {:>7} {:>7} {:>8} {:>8} {:>7} {:>7} {:>8}\n",
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
        "out÷zsw"
    ));
    for x in summaries {
        s.push_str(&format!(
            "{:<16} {:<13} {:>4} {:>22} {:>22} {:>20} {:>7} {:>7.3} {:>8} {:>8} {:>7} {:>7} {:>8}\n",
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
        ));
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
    }
}
