//! tierswap as a lab engine: the workload runs in this process on a pager's region. A
//! variant (`tierswap:policy=order0`) is this engine with its settings applied to each run's
//! configuration, reported under its own label.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use tierswap::{Pager, PagerConfig, Tier};

use crate::progress::Progress;
use crate::vmstat::{read_vmstat, vmstat_delta};
use crate::workload::{self, Mem, WorkloadKind};
use crate::{Engine, EngineError, EngineKind, EngineSpec, RunResult, RunSpec};

/// Runs workloads on tierswap, or on one variant of it.
pub struct TierswapEngine {
    /// The `--engine` entry: label and settings.
    variant: EngineSpec,
    /// Show progress bars.
    progress: bool,
}

impl TierswapEngine {
    /// The engine of `variant` (plain `tierswap` or `tierswap:…`).
    pub fn new(variant: EngineSpec, progress: bool) -> TierswapEngine {
        TierswapEngine { variant, progress }
    }
}

impl Default for TierswapEngine {
    fn default() -> Self {
        TierswapEngine::new(EngineSpec::plain(EngineKind::Tierswap), false)
    }
}

impl Engine for TierswapEngine {
    fn kind(&self) -> EngineKind {
        EngineKind::Tierswap
    }

    fn label(&self) -> String {
        self.variant.label().to_string()
    }

    fn setup(&mut self) -> Result<(), EngineError> {
        tierswap::uffd::Uffd::new(tierswap::uffd::features::MOVE, true)
            .map(|_| ())
            .map_err(|e| EngineError::Unavailable { engine: self.label(), reason: e.to_string() })
    }

    fn run(&mut self, spec: &RunSpec) -> Result<RunResult, EngineError> {
        let label = self.label();
        let fail = |reason: String| EngineError::Failed {
            engine: label.clone(),
            workload: spec.workload.name().into(),
            reason,
        };
        // The run's budget, unless the variant sets its own (`budget=`, for comparisons at
        // equal memory with kernel engines whose pool the memcg does not charge).
        let config = self.variant.pager(&PagerConfig { budget_bytes: spec.budget_bytes, ..spec.pager.clone() });
        let budget_bytes = config.budget_bytes;
        let config_json = serde_json::to_value(&config).unwrap_or_default();
        let config_has_remote = config.remote.is_some();
        let pager = Arc::new(Pager::new(config).map_err(|e| fail(e.to_string()))?);
        let mut region =
            pager.region(spec.size_bytes as usize, spec.workload.hint()).map_err(|e| fail(e.to_string()))?;
        let mem = Mem { ptr: region.as_mut_slice().as_mut_ptr(), len: region.len() };
        let n_pages = (region.len() / 4096) as u64;

        // Sample the footprint every 2 ms while the run lasts.
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(0));
        let sampler = {
            let (pager, stop, peak) = (pager.clone(), stop.clone(), peak.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    peak.fetch_max(pager.footprint_bytes(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(2));
                }
            })
        };

        let vm0 = read_vmstat();
        let bar = Progress::new(self.progress, n_pages, &format!("{} {label} fill", spec.workload.name()));
        let t0 = Instant::now();
        workload::fill(spec.workload, mem, spec.threads, &|n| bar.set(n));
        let fill_s = t0.elapsed().as_secs_f64();
        bar.finish();
        pager.settle(Duration::from_secs(120));
        let swapout_s = t0.elapsed().as_secs_f64();

        let before = pager.stats();
        let order_len = if spec.workload.is_threaded() {
            n_pages
        } else {
            workload::refault_order(spec.workload, n_pages as usize).len() as u64
        };
        let bar = Progress::new(self.progress, order_len, &format!("{} {label} refault", spec.workload.name()));
        let t1 = Instant::now();
        let drainer = (spec.workload == WorkloadKind::Drain).then(|| {
            let pager = pager.clone();
            std::thread::spawn(move || {
                let t = Instant::now();
                let report = pager.drain(Tier::File);
                (report, t.elapsed())
            })
        });
        let v = workload::refault(spec.workload, mem, spec.threads, &|n| bar.set(n));
        let refault_s = t1.elapsed().as_secs_f64();
        bar.finish();
        let mut extra = Vec::new();
        if let Some(d) = drainer {
            let (report, took) = d.join().map_err(|_| fail("the drain thread panicked".into()))?;
            let report = report.map_err(|e| fail(format!("drain: {e}")))?;
            if report.left != 0 || report.file_len_bytes != 0 {
                return Err(fail(format!("drain left pages on the file: {report:?}")));
            }
            pager.resume(Tier::File);
            extra.push(("drain_moved".to_string(), report.moved));
            extra.push(("drain_ms".to_string(), took.as_millis() as u64));
        }
        let after = pager.stats();

        let t2 = Instant::now();
        drop(region);
        let free_s = t2.elapsed().as_secs_f64();
        stop.store(true, Ordering::Relaxed);
        let _ = sampler.join();
        let vm1 = read_vmstat();
        let end = pager.stats();
        if end.swap_slots != 0 {
            return Err(fail(format!("{} swap slots still in use after the region was dropped", end.swap_slots)));
        }

        // Latency percentiles of the refault phase alone.
        let phase = tierswap::Stats {
            fault_latency_us: after.fault_latency_us.iter().zip(&before.fault_latency_us).map(|(a, b)| a - b).collect(),
            ..Default::default()
        };
        if config_has_remote {
            // Round trips of the refault phase alone: what a remote fault waits for.
            let rtt = tierswap::Stats {
                fault_latency_us: after
                    .remote_latency_us
                    .iter()
                    .zip(&before.remote_latency_us)
                    .map(|(a, b)| a - b)
                    .collect(),
                ..Default::default()
            };
            extra.push(("remote_rtt_p50_us".to_string(), rtt.fault_latency_percentile_us(50.0)));
            extra.push(("remote_rtt_p99_us".to_string(), rtt.fault_latency_percentile_us(99.0)));
            extra.push(("remote_pages_at_refault".to_string(), before.remote_pages));
        }
        // Every counter's change over the refault phase alone, as `refault.NAME` (not the
        // footprint's high-water mark, which is no count).
        for ((name, a), (_, b)) in after.counters.pairs().into_iter().zip(before.counters.pairs()) {
            if name != "footprint_max" {
                extra.push((format!("refault.{name}"), a.saturating_sub(b)));
            }
        }
        let footprint_max = peak.load(Ordering::Relaxed).max(after.counters.footprint_max);
        Ok(RunResult {
            workload: spec.workload.name().into(),
            engine: label.clone(),
            run: spec.run,
            size_bytes: spec.size_bytes,
            budget_bytes,
            fill_s,
            swapout_s,
            refault_s,
            refault_pages: v.pages_touched,
            refault_faults: after.counters.faults - before.counters.faults,
            free_s,
            pages_verified: v.pages_verified,
            mismatches: v.mismatches,
            footprint_max_bytes: footprint_max,
            memcg_max_bytes: 0,
            kernel_pool_max_bytes: 0,
            fault_p50_us: phase.fault_latency_percentile_us(50.0),
            fault_p99_us: phase.fault_latency_percentile_us(99.0),
            counters: after.counters.pairs().into_iter().map(|(k, v)| (k.to_string(), v)).chain(extra).collect(),
            kernel_vmstat: vmstat_delta(&vm0, &vm1),
            compressor: format!("{:?}", spec.pager.compressor).to_lowercase(),
            pager: config_json,
        })
    }

    fn teardown(&mut self) {}
}
