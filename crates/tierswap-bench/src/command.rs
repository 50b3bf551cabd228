//! The command lab: any program, run to its end under each engine at one budget, engines
//! alternating round by round: its wall time, whether its output came out the same, its
//! swap-ins and its peak memory, against the kernel's swap at the same limit.
//!
//! The programs lab drives servers with its own client; a batch program (a sort, a
//! compiler, a managed runtime's job) is judged by how long it takes and what it prints.
//! Its standard output is read through a pipe and hashed (SHA-256), its standard input is
//! empty, its standard error goes to a log whose end is shown when it fails. Engines are the
//! programs lab's ([`ProgramEngine`]), started the same way; every system setting a kernel
//! engine touches is put back at the end, on error and on Ctrl-C too.
//!
//! Owns: [`CommandSpec`], [`CommandRun`], [`table`]. Calls: `programs::launch` to start the
//! program, `kernel::system` for the memcg's counters.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use serde::Serialize;
use sha2::{Digest, Sha256};

use crate::kernel::system::{self, System, PREFIX};
use crate::programs::launch::{self, log_tail, LaunchContext, ProgramEngine};
use crate::programs::report::median;

/// What to run, how often and under what.
#[derive(Clone, Debug)]
pub struct CommandSpec {
    /// The program and its arguments.
    pub argv: Vec<OsString>,
    /// Engines, in the order of the first round.
    pub engines: Vec<ProgramEngine>,
    /// The budget of `tierswap run` and the kernel engines' memcg limit.
    pub budget_bytes: u64,
    /// Rounds of every engine; the order reverses every other round.
    pub runs: usize,
    /// Swap files, tierswap's swap file and the logs go under this directory.
    pub dir: PathBuf,
    /// The tierswap binary.
    pub tierswap_bin: PathBuf,
    /// A run still going after this long is killed and counted as failed.
    pub timeout: Duration,
}

/// One run of the program under one engine.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CommandRun {
    /// The engine's label.
    pub engine: String,
    /// The round, from 0.
    pub run: usize,
    /// Seconds from start to exit.
    pub wall_s: f64,
    /// Bytes the program wrote to its standard output.
    pub output_bytes: u64,
    /// Their SHA-256, in hex.
    pub output_sha256: String,
    /// Faults that read a page back (tierswap: `faults_swapped`; kernel: the memcg's
    /// `pgmajfault`), pages read from the disk (`pswpin`) and from the compressed pool
    /// (`zswpin`); absent where not counted.
    pub counters: BTreeMap<String, u64>,
    /// The memory the engine held at its peak: tierswap's footprint, the memcg's usage and
    /// the kernel's compressed pool, or the program's VmHWM unconstrained.
    pub peak_bytes: u64,
    /// Why the run failed (a non-zero exit, a signal, the timeout, the kernel's OOM kill).
    pub error: Option<String>,
}

/// Runs the lab. Every system setting is put back before this returns.
pub fn run(spec: &CommandSpec, say: &mut dyn FnMut(&str)) -> Result<Vec<CommandRun>, String> {
    if spec.argv.is_empty() {
        return Err("no command: give it after --, as in tierswap bench command -- sort big.txt".into());
    }
    launch::check_engines(&spec.engines, &spec.tierswap_bin)?;
    let kernel = spec.engines.iter().any(ProgramEngine::is_kernel);
    if !spec.dir.is_dir() {
        return Err(format!("--dir {}: not a directory", spec.dir.display()));
    }
    let mut sys = if kernel { Some(System::acquire()?) } else { None };
    let work = spec.dir.join(format!("{PREFIX}command-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let mut runs = Vec::new();
    'rounds: for round in 0..spec.runs {
        let mut order: Vec<&ProgramEngine> = spec.engines.iter().collect();
        if round % 2 == 1 {
            order.reverse();
        }
        for engine in order {
            if crate::lab::interrupted() {
                break 'rounds;
            }
            let r = one_run(spec, engine, round, &work, &mut sys);
            say(&run_line(&r));
            runs.push(r);
        }
    }
    if let Some(mut s) = sys.take() {
        s.restore();
    }
    let _ = std::fs::remove_dir_all(&work);
    Ok(runs)
}

/// One run: start, hash the output to its end, wait, read the counters and peaks.
fn one_run(
    spec: &CommandSpec,
    engine: &ProgramEngine,
    round: usize,
    work: &Path,
    sys: &mut Option<System>,
) -> CommandRun {
    let mut r = CommandRun { engine: engine.label(), run: round, ..Default::default() };
    let dir = work.join(format!("{}-{round}", engine.label().replace([':', '=', '/'], "_")));
    let log = dir.join("stderr.log");
    if let Err(e) = std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display())) {
        r.error = Some(e);
        return r;
    }
    let stats_path = dir.join("tierswap-stats.json");
    let ctx = LaunchContext {
        budget_bytes: spec.budget_bytes,
        swap_dir: &spec.dir,
        swap_bytes: swap_room(&spec.dir, spec.budget_bytes),
        tierswap_bin: &spec.tierswap_bin,
        stats_path: &stats_path,
        name: &format!("command-{round}"),
    };
    let vm_before = crate::vmstat::read_vmstat();
    let t0 = Instant::now();
    match launch::start(engine, &spec.argv, true, &log, &ctx, sys) {
        Ok(mut running) => {
            drop(running.child.stdin.take());
            let reader = running.child.stdout.take().map(|out| std::thread::spawn(move || hash_all(out)));
            let (status, hwm_seen) = wait(&mut running, spec.timeout);
            r.wall_s = t0.elapsed().as_secs_f64();
            if let Some(Ok((n, hex))) = reader.map(|h| h.join().unwrap_or_else(|_| Err("reader panicked".into()))) {
                r.output_bytes = n;
                r.output_sha256 = hex;
            }
            r.error = match status {
                // A pipeline whose producer the kernel killed can still exit 0.
                Ok(s) if s.success() && !running.oom_note().is_empty() => {
                    Some(format!("{s}, but the kernel OOM-killed a process of it in its memcg"))
                }
                Ok(s) if s.success() => None,
                Ok(s) => Some(format!("{s}{}{}", running.oom_note(), log_tail(&log))),
                Err(e) => Some(format!("{e}{}", log_tail(&log))),
            };
            let (peaks, hwm) = running.peaks();
            r.peak_bytes = if engine.is_kernel() {
                peaks.memcg_plus_pool_bytes.max(peaks.memcg_bytes)
            } else {
                hwm.max(hwm_seen).max(peaks.rss_bytes)
            };
            if let Some(cg) = &running.cgroup {
                r.counters = kernel_counters(cg, &vm_before);
            }
            drop(running);
            if matches!(engine, ProgramEngine::Tierswap { .. }) {
                read_tierswap_stats(&stats_path, &mut r);
            }
        }
        Err(e) => r.error = Some(e),
    }
    if engine.is_kernel() {
        if let Some(s) = sys.as_mut() {
            s.swapoff_all();
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
    r
}

/// A kernel engine's counters for the run: its memcg's major faults, and the pages read in
/// since `vm_before`, machine-wide (one program runs at a time).
fn kernel_counters(cg: &Path, vm_before: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    let mut c = system::kernel_swapin_counters(cg);
    let vm = crate::vmstat::vmstat_delta(vm_before, &crate::vmstat::read_vmstat());
    for name in ["pswpin", "zswpin"] {
        match vm.get(name) {
            Some(&v) => c.insert(name.to_string(), v),
            None => c.remove(name),
        };
    }
    c
}

/// The kernel engines' swap file: 16 GiB (room for a program many times its budget), or
/// half the free space of `dir` where that is less, and at least 4 × the budget.
fn swap_room(dir: &Path, budget: u64) -> u64 {
    let free = std::ffi::CString::new(dir.as_os_str().as_encoded_bytes()).ok().and_then(|c| {
        // SAFETY: statvfs is plain integers, for which all zeros is a valid value.
        let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
        // SAFETY: `c` is a NUL-terminated path and `st` a statvfs the call may write.
        let ok = unsafe { libc::statvfs(c.as_ptr(), &mut st) } == 0;
        ok.then(|| st.f_bavail as u64 * st.f_frsize as u64)
    });
    (16u64 << 30).min(free.map_or(u64::MAX, |f| f / 2)).max(4 * budget)
}

/// Waits for the program's exit, killing it at the timeout or on Ctrl-C. Returns how it
/// ended and its VmHWM as last read before it did (every 10 ms: a reaped process has none).
fn wait(running: &mut launch::Running, timeout: Duration) -> (Result<std::process::ExitStatus, String>, u64) {
    let deadline = Instant::now() + timeout;
    let mut hwm = 0;
    let end = loop {
        hwm = hwm.max(launch::proc_status_bytes(running.pid(), "VmHWM:"));
        match running.child.try_wait() {
            Ok(Some(s)) => break Ok(s),
            Ok(None) => {}
            Err(e) => break Err(format!("cannot wait for the program: {e}")),
        }
        if crate::lab::interrupted() {
            let _ = running.child.kill();
            let _ = running.child.wait();
            break Err("interrupted".into());
        }
        if Instant::now() >= deadline {
            let _ = running.child.kill();
            let _ = running.child.wait();
            break Err(format!("still running after {} s: killed (--timeout)", timeout.as_secs()));
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    (end, hwm)
}

/// Reads `out` to its end: its length and SHA-256 (hex).
fn hash_all(mut out: impl Read) -> Result<(u64, String), String> {
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    let mut n = 0u64;
    loop {
        match out.read(&mut buf) {
            Ok(0) => break,
            Ok(k) => {
                h.update(&buf[..k]);
                n += k as u64;
            }
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.to_string()),
        }
    }
    Ok((n, h.finalize().iter().map(|b| format!("{b:02x}")).collect()))
}

/// tierswap's counters at exit, named as the kernel's (`faults` = `faults_swapped`).
fn read_tierswap_stats(path: &Path, r: &mut CommandRun) {
    let Some(v) = std::fs::read_to_string(path).ok().and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
    else {
        return;
    };
    for (ours, name) in [("faults_swapped", "faults"), ("pswpin", "pswpin"), ("zswpin", "zswpin")] {
        if let Some(x) = v.pointer(&format!("/counters/{ours}")).and_then(|x| x.as_u64()) {
            r.counters.insert(name.to_string(), x);
        }
    }
    if let Some(fp) = v.pointer("/counters/footprint_max").and_then(|x| x.as_u64()) {
        r.peak_bytes = fp;
    }
}

/// One line per finished run, for the log.
pub fn run_line(r: &CommandRun) -> String {
    match &r.error {
        Some(e) => format!("{:<24} run {}: FAILED after {:.1} s: {e}", r.engine, r.run + 1, r.wall_s),
        None => format!(
            "{:<24} run {}: {:.1} s, {} bytes out (sha256 {}), faults {}",
            r.engine,
            r.run + 1,
            r.wall_s,
            r.output_bytes,
            &r.output_sha256[..r.output_sha256.len().min(12)],
            r.counters.get("faults").map_or("-".to_string(), |f| f.to_string())
        ),
    }
}

/// An argument as a shell would take it back, on one line: quoted when it holds blanks or
/// quotes, control characters escaped.
fn shown(arg: &str) -> String {
    let line: String =
        arg.chars().flat_map(|c| if c.is_control() { c.escape_default().collect() } else { vec![c] }).collect();
    if !arg.is_empty() && !arg.contains(|c: char| c.is_whitespace() || "'\"$`\\".contains(c)) {
        line
    } else {
        format!("'{}'", line.replace('\'', "'\\''"))
    }
}

/// The engine whose output the others are compared with: unconstrained if it ran, else the
/// first run that finished.
fn reference(runs: &[CommandRun]) -> Option<&CommandRun> {
    runs.iter()
        .filter(|r| r.error.is_none())
        .find(|r| r.engine == "unconstrained")
        .or_else(|| runs.iter().find(|r| r.error.is_none()))
}

/// Whether any run failed or printed something else than the reference run.
pub fn any_bad(runs: &[CommandRun]) -> bool {
    let want = reference(runs).map(|r| r.output_sha256.clone());
    runs.iter().any(|r| r.error.is_some() || Some(&r.output_sha256) != want.as_ref())
}

/// The table: one row per engine, medians of its finished runs, wall time ÷ the kernel
/// engine's (the first kernel engine given), outputs checked against the reference run.
pub fn table(spec: &CommandSpec, runs: &[CommandRun]) -> String {
    let mut out = String::new();
    let cmd: Vec<String> = spec.argv.iter().map(|a| shown(&a.to_string_lossy())).collect();
    out.push_str(&format!(
        "command lab: {} — budget {} MiB, {} run(s), engines alternating\n\n",
        cmd.join(" "),
        spec.budget_bytes >> 20,
        spec.runs
    ));
    let want = reference(runs).map(|r| r.output_sha256.clone());
    let med = |engine: &str, f: &dyn Fn(&CommandRun) -> Option<f64>| {
        let xs: Vec<f64> = runs.iter().filter(|r| r.engine == engine && r.error.is_none()).filter_map(f).collect();
        median(&xs)
    };
    let base = spec.engines.iter().find(|e| e.is_kernel()).map(ProgramEngine::label);
    let base_wall = base.as_deref().map(|b| med(b, &|r| Some(r.wall_s)));
    out.push_str(&format!(
        "{:<26} {:>4} {:>9} {:>9} {:>11} {:>11} {:>11} {:>8}  {}\n",
        "engine", "ok", "wall s", "÷kernel", "faults", "disk pages", "pool pages", "peak MiB", "output"
    ));
    let num = |x: f64| if x.is_nan() { "-".to_string() } else { format!("{x:.0}") };
    for e in &spec.engines {
        let label = e.label();
        let mine: Vec<&CommandRun> = runs.iter().filter(|r| r.engine == label).collect();
        let ok = mine.iter().filter(|r| r.error.is_none()).count();
        let wall = med(&label, &|r| Some(r.wall_s));
        let ratio = match base_wall {
            Some(b) if !b.is_nan() && !wall.is_nan() => format!("{:.2}", wall / b),
            _ => "-".into(),
        };
        let counter = |name: &str| num(med(&label, &|r| r.counters.get(name).map(|&v| v as f64)));
        let peak = med(&label, &|r| Some((r.peak_bytes >> 20) as f64));
        let same = mine.iter().filter(|r| r.error.is_none() && Some(&r.output_sha256) == want.as_ref()).count();
        let output = if ok == 0 {
            "-".to_string()
        } else if same == ok {
            "same".to_string()
        } else {
            format!("DIFFERS in {} of {ok}", ok - same)
        };
        out.push_str(&format!(
            "{:<26} {:>4} {:>9} {:>9} {:>11} {:>11} {:>11} {:>8}  {}\n",
            label,
            format!("{ok}/{}", mine.len()),
            if wall.is_nan() { "-".into() } else { format!("{wall:.2}") },
            ratio,
            counter("faults"),
            counter("pswpin"),
            counter("zswpin"),
            num(peak),
            output
        ));
    }
    out.push_str(
        "\nwall s: median of the finished runs; ÷kernel: ÷ the first kernel engine's median; faults: faults that read a\n\
         page back (tierswap: faults_swapped; kernel: the memcg's pgmajfault); disk pages, pool pages: pages read from\n\
         the swap file and from the compressed pool (kernel: pswpin, zswpin of /proc/vmstat); peak: tierswap's footprint,\n\
         the memcg's usage + the kernel's compressed pool, or VmHWM unconstrained; output: the standard output's\n\
         SHA-256 against the unconstrained run's (else the first finished run's).\n",
    );
    for r in runs.iter().filter(|r| r.error.is_some()) {
        out.push_str(&format!("{}\n", run_line(r)));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(engine: &str, wall: f64, sha: &str, faults: u64, error: Option<&str>) -> CommandRun {
        CommandRun {
            engine: engine.into(),
            wall_s: wall,
            output_sha256: sha.into(),
            counters: [("faults".to_string(), faults)].into(),
            error: error.map(String::from),
            ..Default::default()
        }
    }

    #[test]
    fn the_table_compares_with_the_kernel_and_flags_a_different_output() {
        let spec = CommandSpec {
            argv: vec!["sort".into(), "big.txt".into()],
            engines: launch::parse_engines("tierswap,kernel-disk,unconstrained").unwrap(),
            budget_bytes: 256 << 20,
            runs: 3,
            dir: "/var/tmp".into(),
            tierswap_bin: "tierswap".into(),
            timeout: Duration::from_secs(60),
        };
        let runs = vec![
            run("tierswap", 30.0, "aa", 100, None),
            run("kernel-disk", 10.0, "aa", 40, None),
            run("unconstrained", 5.0, "aa", 0, None),
            run("tierswap", 20.0, "aa", 300, None),
            run("kernel-disk", 12.0, "bb", 50, None),
            run("tierswap", 40.0, "aa", 200, None),
            run(
                "kernel-disk",
                0.5,
                "",
                0,
                Some("signal: 9 (SIGKILL) (the kernel OOM-killed the program in its memcg)"),
            ),
        ];
        let t = table(&spec, &runs);
        let row = |name: &str| t.lines().find(|l| l.starts_with(&format!("{name} "))).unwrap().to_string();
        // tierswap: median of 20, 30, 40 = 30 s against the kernel's median of 10 and 12 = 11.
        let ts = row("tierswap");
        assert!(ts.contains("3/3") && ts.contains("30.00") && ts.contains("2.73") && ts.contains("200"), "{ts}");
        assert!(ts.ends_with("same"), "{ts}");
        let k = row("kernel-disk");
        assert!(k.contains("2/3") && k.contains("11.00") && k.contains("1.00"), "{k}");
        assert!(k.ends_with("DIFFERS in 1 of 2"), "{k}");
        assert!(t.contains("FAILED after 0.5 s: signal: 9"), "{t}");
        assert!(any_bad(&runs));
        assert!(!any_bad(&runs[..4].iter().filter(|r| r.engine != "kernel-disk").cloned().collect::<Vec<_>>()));
    }

    #[test]
    fn output_is_hashed_to_its_end() {
        let data: Vec<u8> = (0..200_000u32).map(|i| (i * 7) as u8).collect();
        let (n, hex) = hash_all(&data[..]).unwrap();
        assert_eq!(n, data.len() as u64);
        let want: String = Sha256::digest(&data).iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, want);
        assert_eq!(hash_all(&b""[..]).unwrap().1, "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
    }
}
