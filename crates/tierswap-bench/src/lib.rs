//! The tierswap lab. Every engine (tierswap itself, the kernel's zswap, zram and disk
//! swap) runs the same [`workload`] code on the same data under the same budget, so the
//! numbers in one report are comparable side by side.
#![deny(missing_docs)]

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

pub mod command;
pub mod floor;
pub mod kernel;
pub mod lab;
pub mod machine;
pub mod metadata;
pub mod plot;
pub mod programs;
pub mod progress;
pub mod redis;
pub mod report;
pub mod stress;
pub mod tierswap_engine;
pub mod variant;
pub mod vmstat;
pub mod workload;

pub use variant::EngineSpec;
pub use workload::WorkloadKind;

/// Which engine a run used.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EngineKind {
    /// tierswap, in this process.
    Tierswap,
    /// The kernel's zswap over a swap file, in a memory cgroup.
    KernelZswap,
    /// The kernel's zram (lz4) as the swap device, in a memory cgroup.
    KernelZram,
    /// The kernel's disk swap file, zswap off, in a memory cgroup.
    KernelDisk,
}

impl EngineKind {
    /// The name used on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            EngineKind::Tierswap => "tierswap",
            EngineKind::KernelZswap => "kernel-zswap",
            EngineKind::KernelZram => "kernel-zram",
            EngineKind::KernelDisk => "kernel-disk",
        }
    }

    /// Every engine, in report order.
    pub const ALL: [EngineKind; 4] =
        [EngineKind::Tierswap, EngineKind::KernelZswap, EngineKind::KernelZram, EngineKind::KernelDisk];
}

impl std::str::FromStr for EngineKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        EngineKind::ALL.into_iter().find(|e| e.name() == s.trim()).ok_or_else(|| {
            format!(
                "unknown engine '{s}': engines are tierswap, kernel-zswap, kernel-zram, kernel-disk (comma-separated)"
            )
        })
    }
}

/// One run to do: a workload on an engine.
#[derive(Clone, Debug, Serialize)]
pub struct RunSpec {
    /// The workload.
    pub workload: WorkloadKind,
    /// Bytes of memory the workload touches.
    pub size_bytes: u64,
    /// The memory budget (memcg limit for the kernel engines).
    pub budget_bytes: u64,
    /// Threads for the concurrent workloads (0: one per CPU).
    pub threads: usize,
    /// Run number within the invocation (0-based), for alternation and the report.
    pub run: usize,
    /// tierswap's configuration (ignored by kernel engines, except the budget).
    #[serde(skip)]
    pub pager: tierswap::PagerConfig,
}

/// What one run measured. Field names are the JSON the lab writes.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct RunResult {
    /// The workload's name.
    pub workload: String,
    /// The engine's label: its name, or a variant's spec such as `tierswap:policy=order0`.
    pub engine: String,
    /// Run number.
    pub run: usize,
    /// Bytes touched.
    pub size_bytes: u64,
    /// Budget.
    pub budget_bytes: u64,
    /// Seconds to fill the memory, the swap-out forced by the budget included.
    pub fill_s: f64,
    /// Seconds from the start of the fill until the footprint is under the budget.
    pub swapout_s: f64,
    /// Seconds of the timed refault phase (integrity check included).
    pub refault_s: f64,
    /// Pages touched in the refault phase.
    pub refault_pages: u64,
    /// Faults taken in the refault phase, where the engine can tell.
    pub refault_faults: u64,
    /// Seconds to free the memory (usemem-like workloads), else 0.
    pub free_s: f64,
    /// Pages whose every byte was compared with what was written.
    pub pages_verified: u64,
    /// Pages that differed.
    pub mismatches: u64,
    /// Highest footprint sampled (≤ 10 ms apart): the pager's footprint (pages, pool,
    /// metadata); for the kernel engines the memcg's usage plus the compressed pool (zswap's
    /// pool or zram's memory), which cgroup v1 does not charge to the memcg.
    pub footprint_max_bytes: u64,
    /// Kernel engines: highest memcg usage alone.
    #[serde(default)]
    pub memcg_max_bytes: u64,
    /// Kernel engines: highest compressed pool size (Zswap in /proc/meminfo, or zram's
    /// mem_used_total).
    #[serde(default)]
    pub kernel_pool_max_bytes: u64,
    /// p50 / p99 fault latency in µs where the engine records it.
    pub fault_p50_us: u64,
    /// See `fault_p50_us`.
    pub fault_p99_us: u64,
    /// The engine's own counters (tierswap's stats), by name.
    pub counters: BTreeMap<String, u64>,
    /// /proc/vmstat deltas over the run (kernel engines; also recorded for tierswap).
    pub kernel_vmstat: BTreeMap<String, u64>,
    /// Compressor used (lz4 for tierswap and zram, zswap's for kernel-zswap).
    pub compressor: String,
    /// tierswap: the configuration the run used (the flags with the variant's settings
    /// applied); null for the kernel engines.
    #[serde(default)]
    pub pager: serde_json::Value,
}

/// Why an engine did not run.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The machine does not allow this engine (not root, no zram, no cgroup…): skip it.
    #[error("{engine} skipped: {reason}")]
    Unavailable {
        /// The engine's label.
        engine: String,
        /// One line: why.
        reason: String,
    },
    /// The kernel's OOM killer ended the run inside the memcg (the lab retries once).
    #[error("{engine} was OOM-killed on {workload} inside the {budget_mib} MiB memcg")]
    OomKilled {
        /// The engine's label.
        engine: String,
        /// The workload.
        workload: String,
        /// The memcg limit.
        budget_mib: u64,
    },
    /// The run itself failed.
    #[error("{engine} failed on {workload}: {reason}")]
    Failed {
        /// The engine's label.
        engine: String,
        /// The workload.
        workload: String,
        /// What went wrong.
        reason: String,
    },
}

/// An engine the lab can run workloads on.
pub trait Engine {
    /// Which engine this is.
    fn kind(&self) -> EngineKind;
    /// The name in reports: the engine's, or a variant's spec.
    fn label(&self) -> String {
        self.kind().name().to_string()
    }
    /// Sets the engine up for the whole invocation (swap devices, cgroups…). Everything it
    /// changes must be put back by [`Engine::teardown`], by `Drop`, and on SIGINT/SIGTERM.
    fn setup(&mut self) -> Result<(), EngineError>;
    /// Runs one workload.
    fn run(&mut self, spec: &RunSpec) -> Result<RunResult, EngineError>;
    /// Puts back everything `setup` changed. Idempotent.
    fn teardown(&mut self);
}

/// An engine this build cannot run: its setup says why.
pub struct Missing {
    /// Which engine.
    pub kind: EngineKind,
    /// Why.
    pub reason: String,
}

impl Engine for Missing {
    fn kind(&self) -> EngineKind {
        self.kind
    }
    fn setup(&mut self) -> Result<(), EngineError> {
        Err(EngineError::Unavailable { engine: self.kind.name().into(), reason: self.reason.clone() })
    }
    fn run(&mut self, _: &RunSpec) -> Result<RunResult, EngineError> {
        Err(EngineError::Unavailable { engine: self.kind.name().into(), reason: self.reason.clone() })
    }
    fn teardown(&mut self) {}
}

/// Options of the kernel engines.
#[derive(Clone, Debug, Default)]
pub struct KernelOptions {
    /// Where swap files go (a real disk filesystem, not tmpfs).
    pub swap_dir: Option<std::path::PathBuf>,
    /// zswap's max_pool_percent while the kernel-zswap engine runs.
    pub zswap_max_pool_percent: Option<u32>,
}

/// The engine an `--engine` entry names; a tierswap variant applies its settings to each
/// run's configuration.
pub fn make_engine(spec: &EngineSpec, progress: bool, kernel: &KernelOptions) -> Box<dyn Engine> {
    match spec.kind {
        EngineKind::Tierswap => Box::new(tierswap_engine::TierswapEngine::new(spec.clone(), progress)),
        k => Box::new(kernel::KernelEngine::new(k, kernel.clone())),
    }
}
