//! The programs lab's report: medians per program × distribution × engine, throughput ratios
//! to the kernel's engines measured in the same invocation, the kernel's zswap pool, the
//! client's headroom, tierswap's counters per request; the table and the JSON document.
//!
//! Owns: [`Summary`], [`table`], [`Document`]. Calls nothing that touches the machine.

use std::collections::BTreeMap;

use serde::Serialize;

use super::{Outcome, ProgramRun, ProgramsSpec};
use crate::machine::Machine;
use crate::report::Spread;

/// The median of `xs` (NaN when empty).
pub fn median(xs: &[f64]) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    Spread::of(xs).median
}

/// tierswap's counters the table divides by the timed requests: the evidence of where a
/// request's time goes (faults, large swap-ins, pages read from the file or the pool).
pub const PER_REQUEST_COUNTERS: [(&str, &str); 6] = [
    ("faults", "faults"),
    ("swpin_large", "large swap-ins"),
    ("swpin_large_pages", "large swap-in pages"),
    ("pswpin", "file pages in"),
    ("file_unit_reads", "file reads"),
    ("zswpin", "pool pages in"),
];

/// The per-request counters a kernel engine has (`system::kernel_swapin_counters`); its
/// rows show the others as not counted.
pub const KERNEL_COUNTERS: [&str; 3] = ["faults", "pswpin", "zswpin"];

/// One program × distribution × engine over its runs.
#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    /// Program.
    pub program: String,
    /// Key distribution.
    pub distribution: String,
    /// Engine label.
    pub engine: String,
    /// Runs that completed.
    pub runs: usize,
    /// Seconds to load the dataset (sqlite: to read the table into its cache), median.
    pub load_s: f64,
    /// Requests per second.
    pub throughput_rps: Spread,
    /// Median over runs of each run's p50, µs.
    pub p50_us: f64,
    /// Likewise p99.
    pub p99_us: f64,
    /// Likewise p99.9.
    pub p999_us: f64,
    /// Median throughput ÷ kernel-disk's (same program and distribution, same invocation).
    pub vs_kernel_disk: Option<f64>,
    /// Median throughput ÷ kernel-zswap's.
    pub vs_kernel_zswap: Option<f64>,
    /// Median footprint peak (see `ProgramRun::footprint_max_bytes`).
    pub footprint_bytes: f64,
    /// Median VmHWM.
    pub rss_bytes: f64,
    /// Median kernel pool peak (kernel engines).
    pub kernel_pool_bytes: f64,
    /// Values that came back wrong, warm-ups included, over all runs.
    pub mismatches: u64,
    /// Values verified, over all runs.
    pub values_verified: u64,
    /// Median client capacity (requests per client CPU second).
    pub client_capacity_rps: f64,
    /// tierswap: median per timed request of [`PER_REQUEST_COUNTERS`], by counter name.
    pub per_request: BTreeMap<String, f64>,
}

/// Summaries in the order programs, distributions and engines first appear.
pub fn summarize(runs: &[ProgramRun]) -> Vec<Summary> {
    let mut keys: Vec<(String, String, String)> = Vec::new();
    for r in runs.iter().filter(|r| r.error.is_none()) {
        for p in &r.phases {
            let k = (r.program.clone(), p.distribution.name().to_string(), r.engine.clone());
            if !keys.contains(&k) {
                keys.push(k);
            }
        }
    }
    // Distributions in a fixed order within each program, whichever ran first.
    keys.sort_by_key(|(prog, dist, _)| {
        (runs.iter().position(|r| &r.program == prog).unwrap_or(0), if dist == "uniform" { 0 } else { 1 })
    });
    let mut out: Vec<Summary> = keys
        .into_iter()
        .map(|(program, distribution, engine)| {
            let rows: Vec<(&ProgramRun, &super::PhaseRecord)> = runs
                .iter()
                .filter(|r| r.error.is_none() && r.program == program && r.engine == engine)
                .flat_map(|r| r.phases.iter().filter(|p| p.distribution.name() == distribution).map(move |p| (r, p)))
                .collect();
            let f =
                |g: &dyn Fn(&(&ProgramRun, &super::PhaseRecord)) -> f64| -> Vec<f64> { rows.iter().map(g).collect() };
            let mut per_request = BTreeMap::new();
            let counted = |name: &str| engine.starts_with("tierswap") || KERNEL_COUNTERS.contains(&name);
            for (name, _) in PER_REQUEST_COUNTERS.into_iter().filter(|(name, _)| counted(name)) {
                let xs: Vec<f64> = rows
                    .iter()
                    .filter(|(_, p)| !p.counters.is_empty())
                    .map(|(_, p)| p.counters.get(name).copied().unwrap_or(0) as f64 / p.outcome.requests.max(1) as f64)
                    .collect();
                if !xs.is_empty() {
                    per_request.insert(name.to_string(), median(&xs));
                }
            }
            Summary {
                runs: rows.len(),
                load_s: median(&f(&|(r, _)| r.load_s)),
                throughput_rps: Spread::of(&f(&|(_, p)| p.outcome.throughput_rps)),
                p50_us: median(&f(&|(_, p)| p.outcome.p50_us)),
                p99_us: median(&f(&|(_, p)| p.outcome.p99_us)),
                p999_us: median(&f(&|(_, p)| p.outcome.p999_us)),
                vs_kernel_disk: None,
                vs_kernel_zswap: None,
                footprint_bytes: median(&f(&|(r, _)| r.footprint_max_bytes as f64)),
                rss_bytes: median(&f(&|(r, _)| r.rss_max_bytes as f64)),
                kernel_pool_bytes: median(&f(&|(r, _)| r.kernel_pool_max_bytes as f64)),
                mismatches: rows.iter().map(|(_, p)| p.outcome.mismatches + p.warmup_mismatches).sum(),
                values_verified: rows.iter().map(|(_, p)| p.outcome.values_verified + p.warmup_values_verified).sum(),
                client_capacity_rps: median(&f(&|(_, p)| p.outcome.client_capacity_rps)),
                per_request,
                program,
                distribution,
                engine,
            }
        })
        .collect();
    let base = |out: &[Summary], s: &Summary, engine: &str| {
        out.iter()
            .find(|b| b.program == s.program && b.distribution == s.distribution && b.engine == engine)
            .map(|b| b.throughput_rps.median)
            .filter(|t| *t > 0.0)
    };
    for i in 0..out.len() {
        let (disk, zswap) = (base(&out, &out[i], "kernel-disk"), base(&out, &out[i], "kernel-zswap"));
        let t = out[i].throughput_rps.median;
        out[i].vs_kernel_disk = disk.map(|d| t / d);
        out[i].vs_kernel_zswap = zswap.map(|z| t / z);
    }
    out
}

fn mib(b: f64) -> String {
    if b.is_nan() || b <= 0.0 {
        "-".into()
    } else {
        format!("{:.0}", b / (1u64 << 20) as f64)
    }
}

fn ratio(r: Option<f64>) -> String {
    r.map_or("-".into(), |r| format!("{r:.2}"))
}

fn us(x: f64) -> String {
    if x.is_nan() {
        "-".into()
    } else if x >= 100.0 {
        format!("{x:.0}")
    } else {
        format!("{x:.1}")
    }
}

/// The report's header line.
pub fn header(spec: &ProgramsSpec) -> String {
    format!(
        "budget {} MiB, dataset {} keys × {} B ({} MiB), {} timed requests per distribution (+{} warm-up), {} run(s), engines alternating",
        spec.budget_bytes >> 20,
        spec.keys,
        spec.value_bytes,
        spec.dataset_bytes() >> 20,
        spec.requests,
        spec.warmup(),
        spec.runs
    )
}

/// The tables.
pub fn table(machine: &Machine, spec: &ProgramsSpec, out: &Outcome, summaries: &[Summary]) -> String {
    let mut s = format!("programs lab — {}\n{}\n", machine.summary(), header(spec));
    // The engine column fits the longest name (a variant with its settings).
    let ew = summaries.iter().map(|r| r.engine.chars().count()).max().unwrap_or(0).max(22);
    for p in &spec.programs {
        s += &format!("  {:<12} {}\n", p.name(), p.describe());
    }
    s += &format!(
        "\n{:<12} {:<8} {:<ew$} {:>6} {:>9} {:>8} {:>8} {:>9} {:>6} {:>6} {:>7} {:>7} {:>5}\n",
        "program",
        "dist",
        "engine",
        "load s",
        "req/s",
        "p50 µs",
        "p99 µs",
        "p99.9 µs",
        "÷disk",
        "÷zswap",
        "fp MiB",
        "HWM MiB",
        "mism"
    );
    let mut last = String::new();
    for r in summaries {
        if !last.is_empty() && last != r.program {
            s += "\n";
        }
        last.clone_from(&r.program);
        s += &format!(
            "{:<12} {:<8} {:<ew$} {:>6.1} {:>9.0} {:>8} {:>8} {:>9} {:>6} {:>6} {:>7} {:>7} {:>5}\n",
            r.program,
            r.distribution,
            r.engine,
            r.load_s,
            r.throughput_rps.median,
            us(r.p50_us),
            us(r.p99_us),
            us(r.p999_us),
            ratio(r.vs_kernel_disk),
            ratio(r.vs_kernel_zswap),
            mib(r.footprint_bytes),
            mib(r.rss_bytes),
            r.mismatches
        );
    }
    s += "\nload s: seconds to load the dataset (sqlite: to read its table into the cache), median of runs;\n\
          req/s: timed requests ÷ seconds (median of runs); p50/p99/p99.9: medians of the runs' percentiles;\n\
          ÷disk, ÷zswap: the row's req/s ÷ kernel-disk's / kernel-zswap's in this lab; fp: the memory the engine\n\
          held at its peak (tierswap: its footprint, pool and metadata included; kernel: memcg usage + the\n\
          compressed pool, which memcg v1 does not charge; unconstrained: VmHWM); HWM: the program's VmHWM;\n\
          mism: values read back wrong or missing (warm-ups included; every value read is compared).\n";
    // The kernel's pool, per program.
    let pools: Vec<&Summary> =
        summaries.iter().filter(|r| r.engine == "kernel-zswap" && r.distribution == "uniform").collect();
    if !pools.is_empty() {
        s += &format!(
            "\nkernel-zswap's pool ({}; median of the runs' peaks; outside the memcg limit of {} MiB):\n",
            super::zswap_compressor(),
            spec.budget_bytes >> 20
        );
        for r in pools {
            s += &format!(
                "  {:<12} pool {:>6} MiB -> limit + pool {:>6} MiB\n",
                r.program,
                mib(r.kernel_pool_bytes),
                mib(r.kernel_pool_bytes + spec.budget_bytes as f64)
            );
        }
    }
    if !out.equal_budgets.is_empty() {
        s += "equal memory: tierswap rerun at the kernel-zswap total (rows tierswap:budget=…; ratios against the\n\
              kernel-zswap runs of the same program in this lab):";
        for (p, b) in &out.equal_budgets {
            s += &format!(" {p} {} MiB;", b >> 20);
        }
        s += "\n";
    }
    // The client's headroom: its own capacity against the engines' throughput.
    s += "\nclient headroom (the client's requests per CPU-second of its own, measured beside the fastest engine,\n\
          ÷ that engine's req/s and ÷ the fastest constrained engine's; above 1 the client is not the bottleneck):\n";
    let mut seen: Vec<(String, String)> = Vec::new();
    for r in summaries {
        let key = (r.program.clone(), r.distribution.clone());
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let group: Vec<&Summary> =
            summaries.iter().filter(|x| x.program == r.program && x.distribution == r.distribution).collect();
        let by_rps = |a: &&&Summary, b: &&&Summary| a.throughput_rps.median.total_cmp(&b.throughput_rps.median);
        let Some(fastest) = group.iter().max_by(by_rps).copied() else { continue };
        let constrained = group.iter().filter(|x| x.engine != "unconstrained").max_by(by_rps).copied();
        let cap = fastest.client_capacity_rps;
        s += &format!(
            "  {:<12} {:<8} client {:>7.0} req/CPU-s; {} {:>7.0} req/s: {:.1}×",
            r.program,
            r.distribution,
            cap,
            fastest.engine,
            fastest.throughput_rps.median,
            cap / fastest.throughput_rps.median.max(1e-9)
        );
        if let Some(c) = constrained.filter(|c| c.engine != fastest.engine) {
            s += &format!(
                "; {} {:>7.0} req/s: {:.1}×",
                c.engine,
                c.throughput_rps.median,
                cap / c.throughput_rps.median.max(1e-9)
            );
        }
        s += "\n";
    }
    // Counters per request: tierswap's, and the kernel engines' swap-ins.
    let ts: Vec<&Summary> = summaries.iter().filter(|r| !r.per_request.is_empty()).collect();
    if !ts.is_empty() {
        s += "\ncounters per timed request (medians of the runs; tierswap: from the pager's control socket; kernel: faults are\n\
              the memcg's major faults, file pages in /proc/vmstat's pswpin, pool pages in its zswpin; - not counted):\n";
        s += &format!("{:<12} {:<8} {:<ew$}", "program", "dist", "engine");
        for (_, head) in PER_REQUEST_COUNTERS {
            s += &format!(" {head:>19}");
        }
        s += "\n";
        for r in ts {
            s += &format!("{:<12} {:<8} {:<ew$}", r.program, r.distribution, r.engine);
            for (name, _) in PER_REQUEST_COUNTERS {
                match r.per_request.get(name) {
                    Some(v) => s += &format!(" {v:>19.3}"),
                    None => s += &format!(" {:>19}", "-"),
                }
            }
            s += "\n";
        }
    }
    for line in &out.retried {
        s += &format!("retried: {line}\n");
    }
    for r in out.runs.iter().filter(|r| r.error.is_some()) {
        s += &format!(
            "problem: {} on {} run {}: {}\n",
            r.program,
            r.engine,
            r.run + 1,
            r.error.as_deref().unwrap_or("")
        );
    }
    s += &format!(
        "\nthe lab took {:.0} s ({:.1} min){}\n",
        out.elapsed_s,
        out.elapsed_s / 60.0,
        if out.interrupted { "; interrupted: the table shows the runs that completed" } else { "" }
    );
    s
}

/// The JSON the lab writes.
#[derive(Serialize)]
pub struct Document<'a> {
    /// The machine.
    pub machine: &'a Machine,
    /// The command's settings.
    pub config: serde_json::Value,
    /// Every run, its phases and (tierswap) its counters.
    pub runs: &'a [ProgramRun],
    /// The table's rows.
    pub summary: &'a [Summary],
    /// Equal-memory budgets, per program.
    pub equal_memory_budgets: BTreeMap<String, u64>,
    /// Seconds the lab took.
    pub elapsed_s: f64,
    /// Stopped early.
    pub interrupted: bool,
    /// Runs retried after an OOM kill.
    pub retried: &'a [String],
}

/// The JSON document of a lab.
pub fn document<'a>(
    machine: &'a Machine,
    spec: &ProgramsSpec,
    out: &'a Outcome,
    summaries: &'a [Summary],
) -> Document<'a> {
    Document {
        machine,
        config: serde_json::json!({
            "programs": spec.programs.iter().map(|p| p.name()).collect::<Vec<_>>(),
            "engines": spec.engines.iter().map(|e| e.label()).collect::<Vec<_>>(),
            "budget_bytes": spec.budget_bytes, "runs": spec.runs, "requests": spec.requests,
            "warmup_requests": spec.warmup(), "keys": spec.keys, "value_bytes": spec.value_bytes,
            "dataset_bytes": spec.dataset_bytes(), "equal_memory": spec.equal_memory,
            "zipf_theta": super::keys::ZIPF_THETA, "dir": spec.dir,
        }),
        runs: &out.runs,
        summary: summaries,
        equal_memory_budgets: out.equal_budgets.iter().cloned().collect(),
        elapsed_s: out.elapsed_s,
        interrupted: out.interrupted,
        retried: &out.retried,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::programs::client::PhaseOutcome;
    use crate::programs::keys::Distribution;
    use crate::programs::PhaseRecord;

    fn run(engine: &str, rps: f64, round: usize) -> ProgramRun {
        let phase = |d, rps| PhaseRecord {
            distribution: d,
            outcome: PhaseOutcome { requests: 100, throughput_rps: rps, p99_us: 10.0, ..Default::default() },
            warmup_mismatches: 0,
            warmup_values_verified: 0,
            counters: match engine {
                "tierswap" => [("faults".to_string(), 250), ("swpin_large".to_string(), 10)].into(),
                "kernel-disk" => [("faults".to_string(), 120), ("pswpin".to_string(), 130)].into(),
                _ => BTreeMap::new(),
            },
        };
        ProgramRun {
            program: "redis".into(),
            engine: engine.into(),
            run: round,
            phases: vec![phase(Distribution::Zipfian, rps * 2.0), phase(Distribution::Uniform, rps)],
            ..Default::default()
        }
    }

    #[test]
    fn ratios_are_to_the_kernel_rows_of_the_same_program_and_distribution() {
        let runs = vec![
            run("tierswap", 100.0, 0),
            run("kernel-disk", 400.0, 0),
            run("kernel-zswap", 200.0, 0),
            run("tierswap", 300.0, 1),
            run("kernel-disk", 400.0, 1),
            run("kernel-zswap", 200.0, 1),
        ];
        let s = summarize(&runs);
        assert_eq!(s.len(), 6);
        assert_eq!((s[0].distribution.as_str(), s[0].engine.as_str()), ("uniform", "tierswap"));
        assert_eq!(s[0].throughput_rps.median, 200.0);
        assert_eq!(s[0].vs_kernel_disk, Some(0.5));
        assert_eq!(s[0].vs_kernel_zswap, Some(1.0));
        assert_eq!(s[0].per_request.get("faults"), Some(&2.5));
        assert_eq!(s[0].per_request.get("zswpin"), Some(&0.0), "tierswap counts every column");
        assert_eq!(s[1].engine, "kernel-disk");
        assert_eq!(s[1].per_request.get("faults"), Some(&1.2), "the memcg's major faults");
        assert_eq!(s[1].per_request.get("pswpin"), Some(&1.3));
        assert_eq!(s[1].per_request.get("zswpin"), Some(&0.0), "a kernel counter that did not move");
        assert_eq!(s[1].per_request.get("swpin_large"), None, "the kernel has no large swap-in counter");
        assert!(s[2].per_request.is_empty(), "a kernel run with no counters read shows none");
        assert_eq!(s[3].distribution, "zipfian");
    }
}
