//! How the programs lab starts a program under each engine, and what it watches while the
//! program runs.
//!
//! - `unconstrained`: the program alone;
//! - `tierswap[:SETTING…]`: `tierswap run --budget B [--set SETTING,…] -- PROG`: a
//!   variant's `budget=` becomes `--budget`, every other setting goes through `--set`, where
//!   the shim applies it as the seed lab does (`tierswap::config::Setting`);
//! - `kernel-disk`, `kernel-zswap`, `kernel-zram`: the program in a memory cgroup limited
//!   to B, over a fresh swap file (zswap off, or on with the machine's compressor) or zram.
//!
//! Owns: [`ProgramEngine`], [`Running`] and its sampler. Calls: kernel::system for every
//! system setting (recorded there and put back at the end, on error and on Ctrl-C too).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::kernel::system::{self, System, PREFIX};
use crate::EngineKind;

/// One engine of the programs lab.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ProgramEngine {
    /// No budget.
    Unconstrained,
    /// `tierswap run`: its label (`tierswap` or `tierswap:SETTING…`), its budget, and the
    /// flags its other settings become (`--set …`).
    Tierswap {
        /// The name in the table.
        label: String,
        /// `budget=` of the variant, else the lab's budget.
        budget_bytes: Option<u64>,
        /// `tierswap run` flags other than --budget.
        flags: Vec<String>,
    },
    /// A kernel engine: the program in a memcg.
    Kernel(EngineKind),
}

impl ProgramEngine {
    /// The name in tables and JSON.
    pub fn label(&self) -> String {
        match self {
            ProgramEngine::Unconstrained => "unconstrained".into(),
            ProgramEngine::Tierswap { label, .. } => label.clone(),
            ProgramEngine::Kernel(k) => k.name().into(),
        }
    }

    /// Whether this engine changes the machine's swap settings.
    pub fn is_kernel(&self) -> bool {
        matches!(self, ProgramEngine::Kernel(_))
    }

    /// Parses one `--engine` entry.
    pub fn parse(entry: &str) -> Result<ProgramEngine, String> {
        let entry = entry.trim();
        if entry == "unconstrained" {
            return Ok(ProgramEngine::Unconstrained);
        }
        // The engine's parser checks names and values (the seed lab's, and the shim's
        // under `--set`); `budget=` is the row's budget, the rest go to `--set` as written.
        let spec: crate::EngineSpec = entry.parse()?;
        match spec.kind {
            EngineKind::Tierswap => {}
            k => return Ok(ProgramEngine::Kernel(k)),
        }
        let mut budget_bytes = None;
        let mut set = Vec::new();
        for (text, setting) in entry.split(':').skip(1).map(str::trim).zip(&spec.overrides) {
            match setting {
                tierswap::config::Setting::Budget(b) => budget_bytes = Some(*b),
                _ => set.push(text),
            }
        }
        let flags = if set.is_empty() { Vec::new() } else { vec!["--set".to_string(), set.join(",")] };
        Ok(ProgramEngine::Tierswap { label: spec.label().to_string(), budget_bytes, flags })
    }
}

/// Parses the `--engine` list: every entry once.
pub fn parse_engines(list: &str) -> Result<Vec<ProgramEngine>, String> {
    let mut out: Vec<ProgramEngine> = Vec::new();
    for e in list.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let engine = ProgramEngine::parse(e)?;
        if out.iter().any(|o| o.label() == engine.label()) {
            return Err(format!("engine '{}' is given twice: list each engine once", engine.label()));
        }
        out.push(engine);
    }
    if out.is_empty() {
        return Err("no engine: give e.g. --engine tierswap,kernel-disk,kernel-zswap".into());
    }
    Ok(out)
}

/// Bytes of zswap's compressed pool now (/proc/meminfo's Zswap).
pub fn zswap_pool_bytes() -> u64 {
    meminfo_kib("Zswap:") * 1024
}

fn meminfo_kib(field: &str) -> u64 {
    system::read("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .unwrap_or(0)
}

fn zram_bytes() -> u64 {
    system::read("/sys/block/zram0/mm_stat")
        .unwrap_or_default()
        .split_whitespace()
        .nth(2)
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

/// A field of /proc/PID/status in bytes (VmRSS:, VmHWM:).
pub fn proc_status_bytes(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()))
        .map_or(0, |kib: u64| kib * 1024)
}

/// Whether `engines` can run here: root and a memory controller for the kernel engines, the
/// tierswap binary for tierswap's.
pub fn check_engines(engines: &[ProgramEngine], tierswap_bin: &Path) -> Result<(), String> {
    if engines.iter().any(ProgramEngine::is_kernel) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("the kernel engines need root (they configure swap, zswap and a memory cgroup): run as root, or give --engine tierswap,unconstrained".into());
        }
        if system::memcg().is_none() {
            return Err("the kernel engines need a cgroup memory controller (v1 at /sys/fs/cgroup/memory or v2)".into());
        }
    }
    if engines.iter().any(|e| matches!(e, ProgramEngine::Tierswap { .. })) && !tierswap_bin.exists() {
        return Err(format!("no tierswap binary at {}", tierswap_bin.display()));
    }
    Ok(())
}

/// The last few lines of a program's stderr log, for an error message ("" when empty).
pub fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let tail = lines[lines.len().saturating_sub(3)..].join(" | ");
    if tail.is_empty() {
        String::new()
    } else {
        format!("; its stderr ends: {tail}")
    }
}

/// What an error says when the kernel OOM-killed the program inside its memcg.
pub const OOM_NOTE: &str = " (the kernel OOM-killed the program in its memcg)";

/// What starting a program needs besides its command line.
pub struct LaunchContext<'a> {
    /// The budget of the constrained engines.
    pub budget_bytes: u64,
    /// Swap files (kernel) and tierswap's swap file go here.
    pub swap_dir: &'a Path,
    /// Room for the swap file.
    pub swap_bytes: u64,
    /// The tierswap binary.
    pub tierswap_bin: &'a Path,
    /// Where tierswap writes its counters when the program exits.
    pub stats_path: &'a Path,
    /// A name for the cgroup (unique per run).
    pub name: &'a str,
}

/// A program running under an engine; killed, and its cgroup removed, when dropped.
pub struct Running {
    /// The program (for tierswap: `tierswap run` exec'd into it, so the same pid).
    pub child: Child,
    /// The memcg of a kernel engine.
    pub cgroup: Option<PathBuf>,
    engine: ProgramEngine,
    sampler: Option<Sampler>,
}

/// Peaks sampled every 50 ms while the program runs.
#[derive(Clone, Debug, Default)]
pub struct Peaks {
    /// Highest memcg usage.
    pub memcg_bytes: u64,
    /// Highest compressed pool of the kernel (zswap's pool, or zram's memory).
    pub kernel_pool_bytes: u64,
    /// Highest memcg usage + pool at one instant.
    pub memcg_plus_pool_bytes: u64,
    /// Highest VmRSS.
    pub rss_bytes: u64,
}

struct Sampler {
    stop: Arc<AtomicBool>,
    peaks: [Arc<AtomicU64>; 4],
    handle: std::thread::JoinHandle<()>,
}

impl Sampler {
    fn start(pid: u32, cgroup: Option<PathBuf>, engine: &ProgramEngine) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let peaks: [Arc<AtomicU64>; 4] = Default::default();
        let pool: fn() -> u64 = match engine {
            ProgramEngine::Kernel(EngineKind::KernelZswap) => zswap_pool_bytes,
            ProgramEngine::Kernel(EngineKind::KernelZram) => zram_bytes,
            _ => || 0,
        };
        let handle = {
            let (stop, peaks) = (stop.clone(), peaks.clone());
            std::thread::spawn(move || {
                let usage_file = system::memcg().map(|m| m.2);
                while !stop.load(Relaxed) {
                    let usage = match (&cgroup, usage_file) {
                        (Some(cg), Some(f)) => system::read(cg.join(f)).ok().and_then(|v| v.parse().ok()).unwrap_or(0),
                        _ => 0,
                    };
                    let p = pool();
                    peaks[0].fetch_max(usage, Relaxed);
                    peaks[1].fetch_max(p, Relaxed);
                    peaks[2].fetch_max(usage + p, Relaxed);
                    peaks[3].fetch_max(proc_status_bytes(pid, "VmRSS:"), Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        Sampler { stop, peaks, handle }
    }

    fn finish(self) -> Peaks {
        self.stop.store(true, Relaxed);
        let _ = self.handle.join();
        let g = |i: usize| self.peaks[i].load(Relaxed);
        Peaks { memcg_bytes: g(0), kernel_pool_bytes: g(1), memcg_plus_pool_bytes: g(2), rss_bytes: g(3) }
    }
}

/// Starts `argv` (the program and its arguments) under `engine`: stdin and stdout piped when
/// `pipes` (else closed), stderr to `log`. For a kernel engine the machine's swap is set up
/// first through `sys` (taken on first use).
pub fn start(
    engine: &ProgramEngine,
    argv: &[std::ffi::OsString],
    pipes: bool,
    log: &Path,
    ctx: &LaunchContext,
    sys: &mut Option<System>,
) -> Result<Running, String> {
    let Some((prog, args)) = argv.split_first() else { return Err("no program to start".into()) };
    let prog_name = prog.to_string_lossy().into_owned();
    let mut cgroup = None;
    let mut cmd = match engine {
        ProgramEngine::Unconstrained => {
            let mut c = Command::new(prog);
            c.args(args);
            c
        }
        ProgramEngine::Tierswap { budget_bytes, flags, .. } => {
            let mut c = Command::new(ctx.tierswap_bin);
            c.arg("run")
                .arg("--budget")
                .arg(budget_bytes.unwrap_or(ctx.budget_bytes).to_string())
                .arg("--swap-dir")
                .arg(ctx.swap_dir)
                .arg("--stats-on-exit")
                .arg(ctx.stats_path)
                .args(flags)
                .arg("--")
                .arg(prog)
                .args(args);
            c
        }
        ProgramEngine::Kernel(kind) => {
            let (root, limit, _, _) =
                system::memcg().ok_or("no cgroup memory controller (v1 at /sys/fs/cgroup/memory or v2)")?;
            let s = match sys {
                Some(s) => s,
                None => sys.insert(System::acquire()?),
            };
            s.swapoff_all();
            match kind {
                EngineKind::KernelZswap => {
                    // The machine's compressor, as a user of zswap gets it.
                    s.set_zswap("enabled", "Y")?;
                    s.swapon_file(ctx.swap_dir, ctx.swap_bytes)?;
                }
                EngineKind::KernelDisk => {
                    s.set_zswap("enabled", "N")?;
                    s.swapon_file(ctx.swap_dir, ctx.swap_bytes)?;
                }
                EngineKind::KernelZram => {
                    s.set_zswap("enabled", "N")?;
                    s.swapon_zram(ctx.swap_bytes)?;
                }
                EngineKind::Tierswap => return Err("tierswap is not a kernel engine".into()),
            }
            let cg = root.join(format!("{PREFIX}{}-{}", std::process::id(), ctx.name));
            s.note_cgroup(&cg);
            std::fs::create_dir(&cg).map_err(|e| format!("cannot create cgroup {}: {e}", cg.display()))?;
            system::write(cg.join(limit), &ctx.budget_bytes.to_string())?;
            let mut c = Command::new(prog);
            c.args(args);
            system::exec_in_cgroup(&mut c, &cg)?;
            cgroup = Some(cg);
            c
        }
    };
    {
        use std::os::unix::process::CommandExt;
        // If the lab dies, so does the program (it would keep the swap area busy).
        // SAFETY: prctl with PR_SET_PDEATHSIG and a signal number is async-signal-safe and
        // touches no memory.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
    }
    let err_file = std::fs::File::create(log).map_err(|e| format!("cannot create {}: {e}", log.display()))?;
    let (stdin, stdout) = if pipes { (Stdio::piped(), Stdio::piped()) } else { (Stdio::null(), Stdio::null()) };
    let child = cmd.stdin(stdin).stdout(stdout).stderr(err_file).spawn().map_err(|e| {
        if let Some(cg) = &cgroup {
            system::remove_cgroup(cg);
        }
        format!("cannot start {prog_name} ({}): {e}", engine.label())
    })?;
    let sampler = Some(Sampler::start(child.id(), cgroup.clone(), engine));
    Ok(Running { child, cgroup, engine: engine.clone(), sampler })
}

impl Running {
    /// The program's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// "(the kernel OOM-killed it in its memcg)" when it did, else "".
    pub fn oom_note(&self) -> &'static str {
        let Some(cg) = &self.cgroup else { return "" };
        if system::memcg_oom_kills(cg) > 0 {
            OOM_NOTE
        } else {
            ""
        }
    }

    /// Stops sampling and returns the peaks, with the memcg's own peak and the process's
    /// VmHWM read now.
    pub fn peaks(&mut self) -> (Peaks, u64) {
        let mut p = self.sampler.take().map(Sampler::finish).unwrap_or_default();
        if let (Some(cg), Some((_, _, _, peak_file))) = (&self.cgroup, system::memcg()) {
            if let Some(v) = system::read(cg.join(peak_file)).ok().and_then(|v| v.parse::<u64>().ok()) {
                p.memcg_bytes = p.memcg_bytes.max(v);
            }
        }
        (p, proc_status_bytes(self.pid(), "VmHWM:"))
    }

    /// Asks the program to exit (SIGTERM) and waits up to `wait`, then kills it. Returns
    /// whether it exited by itself (tierswap's counters are written at a normal exit).
    pub fn stop(&mut self, wait: Duration) -> bool {
        if let Ok(Some(_)) = self.child.try_wait() {
            return true;
        }
        // SAFETY: kill on the pid of a child we have not reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        self.wait_exit(wait)
    }

    /// Waits up to `wait` for the program to exit, then kills it.
    pub fn wait_exit(&mut self, wait: Duration) -> bool {
        let deadline = Instant::now() + wait;
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        false
    }

    /// The engine it runs under.
    pub fn engine(&self) -> &ProgramEngine {
        &self.engine
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if let Some(s) = self.sampler.take() {
            s.finish();
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(cg) = &self.cgroup {
            system::remove_cgroup(cg);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn engines_parse_into_run_flags() {
        let e = parse_engines("tierswap,kernel-disk,kernel-zswap,unconstrained").unwrap();
        assert_eq!(
            e.iter().map(ProgramEngine::label).collect::<Vec<_>>(),
            ["tierswap", "kernel-disk", "kernel-zswap", "unconstrained"]
        );
        let tierswap = |entry: &str| match ProgramEngine::parse(entry) {
            Ok(ProgramEngine::Tierswap { label, budget_bytes, flags }) => (label, budget_bytes, flags),
            other => panic!("{entry}: {other:?}"),
        };
        assert_eq!(tierswap("tierswap"), ("tierswap".to_string(), None, vec![]));
        let (label, budget_bytes, flags) =
            tierswap("tierswap:budget=300M:pool-max=100M:tiers=zero+pool+file: no-pin:policy=order0");
        assert_eq!(label, "tierswap:budget=300M:pool-max=100M:tiers=zero+pool+file:no-pin:policy=order0");
        assert_eq!(budget_bytes, Some(300 << 20));
        assert_eq!(flags, ["--set", "pool-max=100M,tiers=zero+pool+file,no-pin,policy=order0"]);
        // Every setting of the seed lab reaches `tierswap run --set`, and `--set` reads it
        // back as the same settings.
        let (_, budget_bytes, flags) =
            tierswap("tierswap:no-follow:swapin-max=16K:compressor=zstd-fast-2:fault=signal");
        assert_eq!(budget_bytes, None);
        assert_eq!(flags, ["--set", "no-follow,swapin-max=16K,compressor=zstd-fast-2,fault=signal"]);
        let spec: crate::EngineSpec =
            "tierswap:no-follow:swapin-max=16K:compressor=zstd-fast-2:fault=signal".parse().unwrap();
        assert_eq!(tierswap::config::Setting::parse_list(&flags[1]), Ok(spec.overrides));
        let err = ProgramEngine::parse("tierswap:policy=fast").unwrap_err();
        assert!(err.starts_with("engine 'tierswap:policy=fast': policy 'fast' is not a swap-in policy"), "{err}");
        assert!(ProgramEngine::parse("tierswap:budget=lots").unwrap_err().contains("budget 'lots'"));
        assert!(ProgramEngine::parse("tierswap:x").unwrap_err().contains("unknown setting 'x': settings are policy="));
        assert!(parse_engines("tierswap,tierswap").unwrap_err().contains("twice"));
        assert!(parse_engines("zfs").unwrap_err().contains("unknown engine 'zfs'"));
    }
}
