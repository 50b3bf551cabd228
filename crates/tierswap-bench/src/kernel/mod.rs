//! The kernel engines: the same workload code in a child process inside a memory cgroup
//! whose limit is the budget, with the kernel's zswap, zram or disk swap behind it.
//!
//! The child is this binary re-executed as `tierswap __bench-child JSON`
//! ([`child_main`]): a fresh process with nothing of the lab's memory, which puts itself in
//! the cgroup before it maps anything. Each run gets a freshly made swap area, swapped off
//! again after the run, so no run inherits another's swap. Everything changed is recorded
//! by [`system::System`] and put back at the end, on error and on Ctrl-C.

pub mod system;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::vmstat::{read_vmstat, vmstat_delta};
use crate::workload::{self, Mem, WorkloadKind};
use crate::{Engine, EngineError, EngineKind, KernelOptions, RunResult, RunSpec};
use system::{read, System, PREFIX};

/// Which cgroup hierarchy holds the memory controller.
#[derive(Clone, Debug)]
enum Cgroups {
    /// cgroup v1 memory controller at this root.
    V1(PathBuf),
    /// cgroup v2 with the memory controller at this root.
    V2(PathBuf),
}

impl Cgroups {
    fn detect() -> Option<Cgroups> {
        let v1 = PathBuf::from("/sys/fs/cgroup/memory");
        if v1.join("memory.limit_in_bytes").exists() {
            return Some(Cgroups::V1(v1));
        }
        let v2 = PathBuf::from("/sys/fs/cgroup");
        if read(v2.join("cgroup.controllers")).unwrap_or_default().split_whitespace().any(|c| c == "memory") {
            return Some(Cgroups::V2(v2));
        }
        None
    }

    fn root(&self) -> &Path {
        match self {
            Cgroups::V1(p) | Cgroups::V2(p) => p,
        }
    }

    fn limit_file(&self) -> &'static str {
        match self {
            Cgroups::V1(_) => "memory.limit_in_bytes",
            Cgroups::V2(_) => "memory.max",
        }
    }

    fn usage_file(&self) -> &'static str {
        match self {
            Cgroups::V1(_) => "memory.usage_in_bytes",
            Cgroups::V2(_) => "memory.current",
        }
    }

    fn peak_file(&self) -> &'static str {
        match self {
            Cgroups::V1(_) => "memory.max_usage_in_bytes",
            Cgroups::V2(_) => "memory.peak",
        }
    }
}

/// The run handed to the child.
#[derive(Serialize, Deserialize)]
struct ChildSpec {
    workload: WorkloadKind,
    size_bytes: u64,
    threads: usize,
    /// The cgroup's `cgroup.procs`, to enter before mapping anything.
    procs: PathBuf,
}

/// What the child measured.
#[derive(Serialize, Deserialize)]
struct ChildResult {
    fill_s: f64,
    refault_s: f64,
    free_s: f64,
    pages_touched: u64,
    pages_verified: u64,
    mismatches: u64,
}

/// A kernel swap engine.
pub struct KernelEngine {
    kind: EngineKind,
    opts: KernelOptions,
    cgroups: Option<Cgroups>,
    system: Option<System>,
    runs: usize,
}

impl KernelEngine {
    /// The engine of `kind` (one of the kernel kinds).
    pub fn new(kind: EngineKind, opts: KernelOptions) -> KernelEngine {
        KernelEngine { kind, opts, cgroups: None, system: None, runs: 0 }
    }

    fn unavailable(&self, reason: impl Into<String>) -> EngineError {
        EngineError::Unavailable { engine: self.kind.name().into(), reason: reason.into() }
    }

    fn failed(&self, spec: &RunSpec, reason: impl Into<String>) -> EngineError {
        EngineError::Failed {
            engine: self.kind.name().into(),
            workload: spec.workload.name().into(),
            reason: reason.into(),
        }
    }

    fn swap_dir(&self) -> PathBuf {
        // Swap files cannot live on tmpfs: default to /var/tmp, a disk filesystem on Debian.
        self.opts.swap_dir.clone().unwrap_or_else(|| PathBuf::from("/var/tmp"))
    }

    /// The compressor this engine compresses with.
    pub fn compressor(&self) -> String {
        match self.kind {
            EngineKind::KernelZswap => system::read("/sys/module/zswap/parameters/compressor").unwrap_or_default(),
            EngineKind::KernelZram => "lz4".into(),
            _ => "none".into(),
        }
    }

    /// Bytes of compressed pool the kernel holds now: cgroup v1 charges neither zswap's pool
    /// nor zram's memory to the memcg, so the lab adds it to the footprint.
    fn pool_bytes(&self) -> u64 {
        match self.kind {
            EngineKind::KernelZswap => read("/proc/meminfo")
                .unwrap_or_default()
                .lines()
                .find(|l| l.starts_with("Zswap:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<u64>().ok())
                .map_or(0, |kb| kb * 1024),
            EngineKind::KernelZram => read("/sys/block/zram0/mm_stat")
                .unwrap_or_default()
                .split_whitespace()
                .nth(2)
                .and_then(|v| v.parse().ok())
                .unwrap_or(0),
            _ => 0,
        }
    }

    /// Brings this engine's swap up, with room for `size_bytes`.
    fn activate(&mut self, size_bytes: u64) -> Result<(), String> {
        let dir = self.swap_dir();
        let kind = self.kind;
        let pool_pct = self.opts.zswap_max_pool_percent;
        let sys = match &mut self.system {
            Some(sys) => sys,
            None => self.system.insert(System::acquire()?),
        };
        sys.swapoff_all();
        let room = size_bytes + size_bytes / 4 + (64 << 20);
        match kind {
            EngineKind::KernelZswap => {
                // docs/design.md, Kernel baselines: this kernel's zswap offers lzo, lzo-rle, deflate; lzo is what
                // the figures there were measured with.
                let _ = sys.set_zswap("compressor", "lzo");
                sys.set_zswap("enabled", "Y")?;
                if let Some(p) = pool_pct {
                    sys.set_zswap("max_pool_percent", &p.to_string())?;
                }
                sys.swapon_file(&dir, room)?;
            }
            EngineKind::KernelZram => {
                sys.set_zswap("enabled", "N")?;
                sys.swapon_zram(room)?;
            }
            EngineKind::KernelDisk => {
                sys.set_zswap("enabled", "N")?;
                sys.swapon_file(&dir, room)?;
            }
            EngineKind::Tierswap => return Err("not a kernel engine".into()),
        }
        Ok(())
    }
}

impl Engine for KernelEngine {
    fn kind(&self) -> EngineKind {
        self.kind
    }

    fn setup(&mut self) -> Result<(), EngineError> {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err(self.unavailable("needs root (it configures swap, zswap, zram and cgroups)"));
        }
        self.cgroups = Some(
            Cgroups::detect()
                .ok_or_else(|| self.unavailable("no cgroup memory controller (v1 at /sys/fs/cgroup/memory or v2)"))?,
        );
        if !Path::new("/sys/module/zswap/parameters/enabled").exists() {
            return Err(self.unavailable("this kernel has no zswap (needed to switch it on or off)"));
        }
        if self.kind == EngineKind::KernelZram && !Path::new("/sys/block/zram0").exists() {
            let _ = Command::new("modprobe").arg("zram").status();
            if !Path::new("/sys/block/zram0").exists() {
                return Err(self.unavailable("no /dev/zram0 and `modprobe zram` did not make one"));
            }
        }
        for tool in ["mkswap", "swapon", "swapoff"] {
            if Command::new(tool).arg("--version").output().is_err() {
                return Err(self.unavailable(format!("no `{tool}` (apt-get install util-linux)")));
            }
        }
        if self.kind != EngineKind::KernelZram {
            let dir = self.swap_dir();
            if !dir.is_dir() {
                return Err(self.unavailable(format!("swap directory {} does not exist", dir.display())));
            }
        }
        let left = system::restore_leftovers();
        for l in left {
            eprintln!("tierswap: {l}");
        }
        Ok(())
    }

    fn run(&mut self, spec: &RunSpec) -> Result<RunResult, EngineError> {
        if spec.workload == WorkloadKind::Drain {
            return Err(self.unavailable(
                "drain exercises tierswap's Pager::drain; the kernel's analogue, swapoff, is not run here",
            ));
        }
        let cg = self.cgroups.clone().ok_or_else(|| self.failed(spec, "setup did not run"))?;
        self.activate(spec.size_bytes).map_err(|e| self.failed(spec, e))?;
        self.runs += 1;
        let dir = cg.root().join(format!("{PREFIX}{}-{}", std::process::id(), self.runs));
        if let Some(sys) = self.system.as_mut() {
            sys.note_cgroup(&dir);
        }
        let result = self.run_in(&cg, &dir, spec);
        system::remove_cgroup(&dir);
        if let Some(sys) = self.system.as_mut() {
            sys.swapoff_all();
        }
        result
    }

    fn teardown(&mut self) {
        if let Some(mut sys) = self.system.take() {
            sys.restore();
        }
    }
}

impl Drop for KernelEngine {
    fn drop(&mut self) {
        self.teardown();
    }
}

impl KernelEngine {
    fn run_in(&self, cg: &Cgroups, dir: &Path, spec: &RunSpec) -> Result<RunResult, EngineError> {
        std::fs::create_dir(dir)
            .map_err(|e| self.failed(spec, format!("cannot create cgroup {}: {e}", dir.display())))?;
        system::write(dir.join(cg.limit_file()), &spec.budget_bytes.to_string()).map_err(|e| self.failed(spec, e))?;
        let child_spec = ChildSpec {
            workload: spec.workload,
            size_bytes: spec.size_bytes,
            threads: spec.threads,
            procs: dir.join("cgroup.procs"),
        };
        let arg = serde_json::to_string(&child_spec).map_err(|e| self.failed(spec, e.to_string()))?;
        let exe = std::env::current_exe().map_err(|e| self.failed(spec, format!("cannot find this program: {e}")))?;
        let vm0 = read_vmstat();
        let mut child = Command::new(exe)
            .arg("__bench-child")
            .arg(&arg)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .map_err(|e| self.failed(spec, format!("cannot start the workload child: {e}")))?;
        let (mut peak, mut memcg_peak, mut pool_peak) = (0u64, 0u64, 0u64);
        let deadline = Instant::now() + Duration::from_secs(3600);
        let status = loop {
            let usage = read(dir.join(cg.usage_file())).unwrap_or_default().parse::<u64>().unwrap_or(0);
            let pool = self.pool_bytes();
            memcg_peak = memcg_peak.max(usage);
            pool_peak = pool_peak.max(pool);
            peak = peak.max(usage + pool);
            match child.try_wait() {
                Ok(Some(st)) => break st,
                Ok(None) => {}
                Err(e) => return Err(self.failed(spec, format!("waiting for the child: {e}"))),
            }
            if crate::lab::interrupted() || Instant::now() > deadline {
                let _ = child.kill();
                let _ = child.wait();
                return Err(self.failed(spec, "interrupted"));
            }
            std::thread::sleep(Duration::from_millis(5));
        };
        if let Ok(v) = read(dir.join(cg.peak_file())).unwrap_or_default().parse::<u64>() {
            memcg_peak = memcg_peak.max(v);
            peak = peak.max(v);
        }
        let vm1 = read_vmstat();
        let mut out = String::new();
        let mut err = String::new();
        if let Some(mut o) = child.stdout.take() {
            let _ = o.read_to_string(&mut out);
        }
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
        if !status.success() {
            let oom_kills = read(dir.join("memory.oom_control"))
                .or_else(|_| read(dir.join("memory.events")))
                .unwrap_or_default()
                .lines()
                .find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse::<u64>().ok()))
                .unwrap_or(0);
            if oom_kills > 0 {
                return Err(EngineError::OomKilled {
                    engine: self.kind.name().into(),
                    workload: spec.workload.name().into(),
                    budget_mib: spec.budget_bytes >> 20,
                });
            }
            return Err(self.failed(spec, format!("workload child {status}: {}", err.trim())));
        }
        let r: ChildResult = serde_json::from_str(out.trim())
            .map_err(|e| self.failed(spec, format!("bad child output ({e}): {out}")))?;
        Ok(RunResult {
            workload: spec.workload.name().into(),
            engine: self.kind.name().into(),
            run: spec.run,
            size_bytes: spec.size_bytes,
            budget_bytes: spec.budget_bytes,
            fill_s: r.fill_s,
            swapout_s: r.fill_s,
            refault_s: r.refault_s,
            refault_pages: r.pages_touched,
            refault_faults: 0,
            free_s: r.free_s,
            pages_verified: r.pages_verified,
            mismatches: r.mismatches,
            footprint_max_bytes: peak,
            memcg_max_bytes: memcg_peak,
            kernel_pool_max_bytes: pool_peak,
            fault_p50_us: 0,
            fault_p99_us: 0,
            counters: Default::default(),
            kernel_vmstat: vmstat_delta(&vm0, &vm1),
            compressor: self.compressor(),
            pager: serde_json::Value::Null,
        })
    }
}

/// The workload child: enters the cgroup, maps the memory, fills, refaults, frees, and prints
/// one JSON line. Returns the exit code.
pub fn child_main(arg: &str) -> i32 {
    match child(arg) {
        Ok(line) => {
            println!("{line}");
            0
        }
        Err(e) => {
            eprintln!("{e}");
            1
        }
    }
}

fn child(arg: &str) -> Result<String, String> {
    let spec: ChildSpec = serde_json::from_str(arg).map_err(|e| format!("bad child arguments: {e}"))?;
    // If the lab dies, so does its workload (it would otherwise keep the cgroup and swap busy).
    // SAFETY: prctl with PR_SET_PDEATHSIG and a signal number has no memory effects.
    unsafe { libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) };
    system::write(&spec.procs, &std::process::id().to_string())?;
    let len = spec.size_bytes as usize;
    // SAFETY: a fresh private anonymous mapping of len bytes.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
            -1,
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(format!("mmap of {len} bytes: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: advice on our own mapping: 4 KiB pages like tierswap's, and the workload's hint.
    unsafe {
        libc::madvise(ptr, len, libc::MADV_NOHUGEPAGE);
        if let Some(advice) = spec.workload.madvise_advice() {
            libc::madvise(ptr, len, advice);
        }
    }
    let mem = Mem { ptr: ptr as *mut u8, len };
    let t0 = Instant::now();
    workload::fill(spec.workload, mem, spec.threads, &|_| {});
    let fill_s = t0.elapsed().as_secs_f64();
    let t1 = Instant::now();
    let v = workload::refault(spec.workload, mem, spec.threads, &|_| {});
    let refault_s = t1.elapsed().as_secs_f64();
    let t2 = Instant::now();
    // SAFETY: our mapping; nothing refers to it any more.
    unsafe { libc::munmap(ptr, len) };
    let free_s = t2.elapsed().as_secs_f64();
    serde_json::to_string(&ChildResult {
        fill_s,
        refault_s,
        free_s,
        pages_touched: v.pages_touched,
        pages_verified: v.pages_verified,
        mismatches: v.mismatches,
    })
    .map_err(|e| e.to_string())
}
