//! The real-programs lab: unmodified servers and interpreters from Debian — redis-server,
//! memcached, python3 with a dict, python3 with sqlite3 — each loaded with a reproducible
//! dataset, then driven by the lab's own client with a fixed number of requests in two key
//! distributions (uniform; Zipfian θ = 0.99, scrambled), every value read back verified,
//! throughput and p50/p99/p99.9 latency measured — under `tierswap run`, in a memcg over the
//! kernel's disk swap, zswap or zram, and unconstrained, side by side in one invocation,
//! engines alternating run by run.
//!
//! Owns: the plan and the runs (this file); keys.rs (data and distributions), client.rs (the
//! timed phase), conns.rs (protocols), python.rs (the Python programs), launch.rs (starting
//! a program under an engine), report.rs (table, JSON), plot.rs. Calls: kernel::system for
//! every system setting, tierswap::control for the pager's live counters.

pub mod client;
pub mod conns;
pub mod keys;
pub mod launch;
pub mod plot;
pub mod python;
pub mod report;

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::kernel::system::{self, System, PREFIX};
use client::{Conn, PhaseOutcome, PhaseSpec, Versions};
use conns::{MemcachedConn, PipeConn, RespConn};
use keys::{Distribution, KeyChooser};
use launch::{log_tail, LaunchContext, ProgramEngine, Running};

/// A program the lab runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Program {
    /// redis-server, GETs only.
    Redis,
    /// redis-server, 90 % GET, 10 % SET.
    RedisMixed,
    /// memcached, 90 % get, 10 % set (text protocol).
    Memcached,
    /// python3 holding a dict of byte strings, 90 % lookups, 10 % updates.
    PythonDict,
    /// python3's sqlite3, point selects by primary key with the table in its page cache.
    Sqlite,
}

impl Program {
    /// Every program, in report order.
    pub const ALL: [Program; 5] =
        [Program::Redis, Program::RedisMixed, Program::Memcached, Program::PythonDict, Program::Sqlite];

    /// The name on the command line and in reports.
    pub fn name(self) -> &'static str {
        match self {
            Program::Redis => "redis",
            Program::RedisMixed => "redis-mixed",
            Program::Memcached => "memcached",
            Program::PythonDict => "python-dict",
            Program::Sqlite => "sqlite",
        }
    }

    /// Parses a comma-separated list.
    pub fn parse_list(s: &str) -> Result<Vec<Program>, String> {
        let mut out = Vec::new();
        for name in s.split(',').map(str::trim).filter(|x| !x.is_empty()) {
            let p = Program::ALL.into_iter().find(|p| p.name() == name).ok_or_else(|| {
                format!("unknown program '{name}': programs are redis, redis-mixed, memcached, python-dict, sqlite")
            })?;
            if !out.contains(&p) {
                out.push(p);
            }
        }
        if out.is_empty() {
            return Err("no program: give e.g. --program redis,memcached".into());
        }
        Ok(out)
    }

    /// Percent of requests that write.
    pub fn set_percent(self) -> u32 {
        match self {
            Program::Redis | Program::Sqlite => 0,
            Program::RedisMixed | Program::Memcached | Program::PythonDict => 10,
        }
    }

    /// Connections the client opens (the Python programs serve one pipe).
    pub fn connections(self) -> usize {
        match self {
            Program::Redis | Program::RedisMixed | Program::Memcached => 4,
            Program::PythonDict | Program::Sqlite => 1,
        }
    }

    /// Whether the load goes over every connection at once: memcached serves each on a
    /// thread of its own, and its load touches old items (hash chains, the LRU tail), so
    /// one connection waits out every fault of the load in turn (145 s under tierswap and
    /// 64-127 s on kernel-disk at 1,000,000 keys and 256 MiB). redis is single-threaded and
    /// loads in key order, as `bench redis` does.
    pub fn parallel_load(self) -> bool {
        self == Program::Memcached
    }

    /// What the requests are, for the report header.
    pub fn describe(self) -> &'static str {
        match self {
            Program::Redis => "redis-server, GET, 4 connections",
            Program::RedisMixed => "redis-server, 90 % GET / 10 % SET, 4 connections",
            Program::Memcached => "memcached (text protocol), 90 % get / 10 % set, 4 connections",
            Program::PythonDict => "python3, a dict of bytes, 90 % lookups / 10 % updates, one pipe",
            Program::Sqlite => "python3 sqlite3, SELECT by primary key, cache_size > table, one pipe",
        }
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct ProgramsSpec {
    /// Programs, in order.
    pub programs: Vec<Program>,
    /// Engines, alternating run by run.
    pub engines: Vec<ProgramEngine>,
    /// The budget (memcg limit, `tierswap run --budget`).
    pub budget_bytes: u64,
    /// Rounds per program (medians in the table).
    pub runs: usize,
    /// Timed requests per distribution and run.
    pub requests: u64,
    /// Keys loaded (dataset ÷ value size).
    pub keys: u64,
    /// Bytes per value.
    pub value_bytes: usize,
    /// Rerun tierswap at the kernel-zswap total (limit + pool) after each program's rounds.
    pub equal_memory: bool,
    /// Swap files, databases, scripts and logs go under this directory (a disk filesystem).
    pub dir: PathBuf,
    /// The tierswap binary.
    pub tierswap_bin: PathBuf,
    /// Progress bars.
    pub progress: bool,
}

impl ProgramsSpec {
    /// Requests made before the timed ones in each phase (verified, not timed).
    pub fn warmup(&self) -> u64 {
        (self.requests / 10).max(1)
    }

    /// Bytes of data loaded.
    pub fn dataset_bytes(&self) -> u64 {
        self.keys * self.value_bytes as u64
    }
}

/// One timed phase of a run.
#[derive(Clone, Debug, Serialize)]
pub struct PhaseRecord {
    /// The key distribution.
    pub distribution: Distribution,
    /// What the client measured.
    #[serde(flatten)]
    pub outcome: PhaseOutcome,
    /// Mismatches in the warm-up (its reads are verified too).
    pub warmup_mismatches: u64,
    /// Values the warm-up read and compared.
    pub warmup_values_verified: u64,
    /// The counters' increase over the timed requests: tierswap's (faults, swpin_large,
    /// pswpin…) from the pager's control socket; a kernel engine's major faults of its
    /// memcg and pages swapped in (`system::kernel_swapin_counters`).
    pub counters: BTreeMap<String, u64>,
}

/// One program on one engine in one round.
#[derive(Clone, Debug, Default, Serialize)]
pub struct ProgramRun {
    /// Program.
    pub program: String,
    /// Engine label.
    pub engine: String,
    /// Round (0-based).
    pub run: usize,
    /// This run's budget (the equal-memory reruns have their own).
    pub budget_bytes: u64,
    /// tierswap rerun at the kernel-zswap total (`--equal-memory`).
    pub equal_memory: bool,
    /// Seconds to load the dataset (sqlite: to read the table into its cache).
    pub load_s: f64,
    /// The timed phases.
    pub phases: Vec<PhaseRecord>,
    /// The memory the engine held for the program at its highest: tierswap's footprint
    /// peak (its pager's count: pages, pool, metadata); the memcg's usage plus the kernel's
    /// compressed pool (memcg v1 charges neither zswap's pool nor zram); unconstrained: VmHWM.
    pub footprint_max_bytes: u64,
    /// The program's VmHWM (its resident peak; tierswap's pager threads and mirrors included).
    pub rss_max_bytes: u64,
    /// Kernel engines: the memcg's peak usage alone.
    pub memcg_max_bytes: u64,
    /// Kernel engines: the compressed pool's peak (Zswap in /proc/meminfo, zram's memory).
    pub kernel_pool_max_bytes: u64,
    /// tierswap: the counters `tierswap run --stats-on-exit` wrote when the program exited.
    pub tierswap_stats: serde_json::Value,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// Everything a lab did.
#[derive(Default)]
pub struct Outcome {
    /// Every run, failed ones included (with `error`).
    pub runs: Vec<ProgramRun>,
    /// Equal-memory budgets used, per program.
    pub equal_budgets: Vec<(String, u64)>,
    /// Stopped by Ctrl-C / SIGTERM / SIGHUP.
    pub interrupted: bool,
    /// Seconds the lab took.
    pub elapsed_s: f64,
    /// Runs the kernel OOM-killed and the lab ran once more, one line each.
    pub retried: Vec<String>,
}

/// Checks that every program's tools are installed, before anything runs.
pub fn check_tools(programs: &[Program]) -> Result<(), String> {
    let have = |tool: &str| {
        std::process::Command::new(tool)
            .arg(if tool == "memcached" { "-V" } else { "--version" })
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok()
    };
    for p in programs {
        match p {
            Program::Redis | Program::RedisMixed if !have("redis-server") => {
                return Err(
                    "no `redis-server`: install it with `apt-get install redis-server` (scripts/setup.sh does)".into()
                )
            }
            Program::Memcached if !have("memcached") => {
                return Err("no `memcached`: install it with `apt-get install memcached` (scripts/setup.sh does)".into())
            }
            Program::PythonDict => python::check(false)?,
            Program::Sqlite => python::check(true)?,
            _ => {}
        }
    }
    Ok(())
}

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()).map_or(16399, |a| a.port())
}

/// The user memcached drops to, as Debian's service does (`memcache`), else root's own.
fn memcached_user() -> &'static str {
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    if passwd.lines().any(|l| l.starts_with("memcache:")) {
        "memcache"
    } else {
        "root"
    }
}

/// The hash table size (log2) memcached needs for `keys` items without growing: it grows at
/// 1.5 items per bucket, and a growth walks every item (the expansion thread reads each
/// item's chain pointer under a global item lock). Measured at 1,000,000 keys and a 256 MiB
/// budget, the growths made the load 139 s on kernel-disk and several minutes under tierswap,
/// random faults that say nothing about serving requests; memcached's documentation advises
/// `-o hashpower` for a known item count.
fn memcached_hashpower(keys: u64) -> u32 {
    let buckets = (keys * 2).div_ceil(3).max(1);
    (u64::BITS - (buckets - 1).leading_zeros()).clamp(16, 32)
}

/// A directory removed when dropped.
struct TempDir(PathBuf);

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The lab's working state across runs.
struct Lab<'a> {
    spec: &'a ProgramsSpec,
    work: PathBuf,
    scripts: Option<(PathBuf, PathBuf)>,
    sqlite_db: Option<PathBuf>,
    sys: Option<System>,
    bar: indicatif::ProgressBar,
    seq: usize,
}

/// The counters a timed phase is read by, now: tierswap's from its control socket, a kernel
/// engine's swap-ins from its memcg and /proc/vmstat (`kernel_swapin_counters`); None for
/// an engine with no memcg or a pager that cannot be reached.
fn phase_counters(running: &Running, is_tierswap: bool) -> Option<BTreeMap<String, u64>> {
    if is_tierswap {
        return tierswap_counters(running.pid()).map(|c| c.0);
    }
    running.cgroup.as_deref().map(system::kernel_swapin_counters)
}

/// The pager's counters now, by name, from its control socket (None when it cannot be reached).
fn tierswap_counters(pid: u32) -> Option<(BTreeMap<String, u64>, u64)> {
    let path = tierswap::control::search_dirs()
        .into_iter()
        .map(|d| tierswap::control::socket_path(&d, pid))
        .find(|p| p.symlink_metadata().is_ok())?;
    let reply = tierswap::control::query_stats(&path).ok()?;
    let map = reply.stats.counters.pairs().into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    Some((map, reply.stats.counters.footprint_max))
}

fn delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(k, _)| !k.ends_with("_max"))
        .map(|(k, v)| (k.clone(), v.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .filter(|(_, v)| *v > 0)
        .collect()
}

impl Lab<'_> {
    fn say(&self, line: &str) {
        self.bar.println(line);
        if self.bar.is_hidden() {
            eprintln!("{line}");
        }
    }

    /// The sqlite table, built once per lab by an unconstrained python3 (not timed).
    fn sqlite_db(&mut self) -> Result<PathBuf, String> {
        if let Some(db) = &self.sqlite_db {
            return Ok(db.clone());
        }
        let (_, script) = self.scripts.clone().ok_or("the scripts were not written")?;
        let db = self.work.join("kv.sqlite");
        let _ = std::fs::remove_file(&db);
        self.bar.set_message(format!("sqlite: building the table ({} rows)", self.spec.keys));
        let t0 = Instant::now();
        let mut child = std::process::Command::new(python::python3())
            .arg(&script)
            .arg("build")
            .arg(&db)
            .arg("65536")
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .map_err(|e| format!("cannot start python3 to build the sqlite table: {e}"))?;
        let (Some(stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
            return Err("python3's pipes were not set up".into());
        };
        let mut conn = PipeConn::new(stdin, stdout);
        let res = conn.wait_ready().and_then(|()| {
            client::load_all(&mut conn, self.spec.keys, self.spec.value_bytes, 2000, &crate::lab::interrupted, &|i| {
                self.bar.set_position(i)
            })
        });
        conn.close();
        let out = child.wait_with_output().map_err(|e| format!("waiting for the sqlite build: {e}"))?;
        if let Err(e) = res {
            return Err(format!("building the sqlite table: {e}: {}", String::from_utf8_lossy(&out.stderr).trim()));
        }
        if !out.status.success() {
            return Err(format!(
                "building the sqlite table: python3 {}: {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        let size = std::fs::metadata(&db).map(|m| m.len()).unwrap_or(0);
        self.say(&format!(
            "sqlite: built {} ({} rows, {} MiB) in {:.1} s",
            db.display(),
            self.spec.keys,
            size >> 20,
            t0.elapsed().as_secs_f64()
        ));
        self.sqlite_db = Some(db.clone());
        Ok(db)
    }

    fn one_run(&mut self, program: Program, engine: &ProgramEngine, round: usize, equal: bool) -> ProgramRun {
        let budget = match engine {
            ProgramEngine::Tierswap { budget_bytes: Some(b), .. } => *b,
            ProgramEngine::Unconstrained => 0,
            _ => self.spec.budget_bytes,
        };
        let mut r = ProgramRun {
            program: program.name().into(),
            engine: engine.label(),
            run: round,
            budget_bytes: budget,
            equal_memory: equal,
            ..Default::default()
        };
        if let Err(e) = self.one_run_inner(program, engine, round, &mut r) {
            r.error = Some(e);
        }
        if engine.is_kernel() {
            if let Some(s) = self.sys.as_mut() {
                s.swapoff_all();
            }
        }
        r
    }

    fn one_run_inner(
        &mut self,
        program: Program,
        engine: &ProgramEngine,
        round: usize,
        r: &mut ProgramRun,
    ) -> Result<(), String> {
        let spec = self.spec;
        self.seq += 1;
        let name = format!("{}-{}", program.name(), self.seq);
        let dir = self.work.join(&name);
        std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
        let _cleanup = TempDir(dir.clone());
        {
            // memcached drops to its own user: it writes tierswap's counters at exit here.
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o1777));
        }
        let stats_path = dir.join("tierswap-stats.json");
        let log = dir.join("stderr.log");
        let port = free_port();
        let port_s = port.to_string();
        let dir_s = dir.to_string_lossy().into_owned();
        let table_kib = spec.keys * (spec.value_bytes as u64 + 400) / 1024 + 65536;
        let argv: Vec<OsString> = match program {
            Program::Redis | Program::RedisMixed => [
                "redis-server",
                "--port",
                &port_s,
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--daemonize",
                "no",
                "--dir",
                &dir_s,
                "--logfile",
                "",
            ]
            .iter()
            .map(OsString::from)
            .collect(),
            Program::Memcached => {
                let mib = ((spec.dataset_bytes() * 2) >> 20) + 64;
                let hashpower = format!("hashpower={}", memcached_hashpower(spec.keys));
                [
                    "memcached",
                    "-l",
                    "127.0.0.1",
                    "-p",
                    &port_s,
                    "-U",
                    "0",
                    "-m",
                    &mib.to_string(),
                    "-u",
                    memcached_user(),
                ]
                .iter()
                .map(OsString::from)
                .chain(["-o".into(), hashpower.into()])
                .collect()
            }
            Program::PythonDict => {
                let (dict, _) = self.scripts.clone().ok_or("the scripts were not written")?;
                vec![python::python3().into(), dict.into()]
            }
            Program::Sqlite => {
                let db = self.sqlite_db()?;
                let (_, sqlite) = self.scripts.clone().ok_or("the scripts were not written")?;
                vec![
                    python::python3().into(),
                    sqlite.into(),
                    "serve".into(),
                    db.into(),
                    table_kib.to_string().into(),
                    spec.keys.to_string().into(),
                ]
            }
        };
        let pipes = matches!(program, Program::PythonDict | Program::Sqlite);
        let ctx = LaunchContext {
            budget_bytes: spec.budget_bytes,
            swap_dir: &spec.dir,
            swap_bytes: spec.dataset_bytes() * 2 + (512 << 20),
            tierswap_bin: &spec.tierswap_bin,
            stats_path: &stats_path,
            name: &name,
        };
        let label = format!("{} on {} run {}", program.name(), engine.label(), round + 1);
        self.bar.set_message(format!("{label}: start"));
        let mut running = launch::start(engine, &argv, pipes, &log, &ctx, &mut self.sys)?;
        let fail = |running: &Running, what: &str, e: std::io::Error| {
            format!("{what} ({}): {e}{}{}", engine.label(), running.oom_note(), log_tail(&log))
        };
        let t0 = Instant::now();
        let mut conns: Vec<Box<dyn Conn>> = Vec::new();
        match program {
            Program::Redis | Program::RedisMixed => {
                for _ in 0..program.connections() {
                    let c = RespConn::connect(port, Duration::from_secs(30))
                        .map_err(|e| fail(&running, "redis-server did not come up", e))?;
                    conns.push(Box::new(c));
                }
            }
            Program::Memcached => {
                for _ in 0..program.connections() {
                    let c = MemcachedConn::connect(port, Duration::from_secs(30))
                        .map_err(|e| fail(&running, "memcached did not come up", e))?;
                    conns.push(Box::new(c));
                }
            }
            Program::PythonDict | Program::Sqlite => {
                let (Some(stdin), Some(stdout)) = (running.child.stdin.take(), running.child.stdout.take()) else {
                    return Err("the program's pipes were not set up".into());
                };
                let mut c = PipeConn::new(stdin, stdout);
                self.bar.set_message(format!("{label}: start (sqlite reads its table)"));
                c.wait_ready().map_err(|e| fail(&running, "the Python program did not start", e))?;
                conns.push(Box::new(c));
            }
        }
        if program != Program::Sqlite {
            self.bar.set_message(format!("{label}: load"));
            self.bar.set_length(spec.keys);
            self.bar.set_position(0);
            let bar = &self.bar;
            let res = if program.parallel_load() {
                client::load_parallel(&mut conns, spec.keys, spec.value_bytes, 1000, &crate::lab::interrupted, &|i| {
                    bar.set_position(i)
                })
            } else {
                client::load_all(&mut *conns[0], spec.keys, spec.value_bytes, 1000, &crate::lab::interrupted, &|i| {
                    bar.set_position(i)
                })
            };
            res.map_err(|e| fail(&running, "loading", e))?;
        }
        r.load_s = t0.elapsed().as_secs_f64();
        let versions = Versions::new(spec.keys);
        let mut order = Distribution::ALL.to_vec();
        if round % 2 == 1 {
            order.reverse();
        }
        let is_tierswap = matches!(engine, ProgramEngine::Tierswap { .. });
        for dist in order {
            let chooser = KeyChooser::new(spec.keys, dist);
            let seed = (round as u64) << 8 | dist as u64;
            let base = PhaseSpec {
                requests: spec.warmup(),
                warmup: 0,
                set_percent: program.set_percent(),
                value_bytes: spec.value_bytes,
                seed: seed ^ 0xA5A5,
            };
            self.bar.set_message(format!("{label}: {} warm-up", dist.name()));
            let warm = client::run_phase(&mut conns, &versions, &chooser, &base, &crate::lab::interrupted)
                .map_err(|e| fail(&running, &format!("{} warm-up", dist.name()), e))?;
            let before = phase_counters(&running, is_tierswap);
            self.bar.set_message(format!("{label}: {} {} requests", dist.name(), spec.requests));
            let timed = PhaseSpec { requests: spec.requests, seed, ..base };
            let out = client::run_phase(&mut conns, &versions, &chooser, &timed, &crate::lab::interrupted)
                .map_err(|e| fail(&running, &format!("{} requests", dist.name()), e))?;
            let after = phase_counters(&running, is_tierswap);
            let counters = match (before, after) {
                (Some(b), Some(a)) => delta(&b, &a),
                _ => BTreeMap::new(),
            };
            r.phases.push(PhaseRecord {
                distribution: dist,
                outcome: out,
                warmup_mismatches: warm.mismatches,
                warmup_values_verified: warm.values_verified,
                counters,
            });
        }
        let live_fp = if is_tierswap { tierswap_counters(running.pid()).map(|c| c.1) } else { None };
        let (peaks, hwm) = running.peaks();
        r.rss_max_bytes = hwm.max(peaks.rss_bytes);
        r.memcg_max_bytes = peaks.memcg_bytes;
        r.kernel_pool_max_bytes = peaks.kernel_pool_bytes;
        // Closing the pipe ends the Python programs; the servers get SIGTERM.
        drop(conns);
        self.bar.set_message(format!("{label}: stop"));
        let exited =
            if pipes { running.wait_exit(Duration::from_secs(60)) } else { running.stop(Duration::from_secs(60)) };
        if is_tierswap {
            match std::fs::read_to_string(&stats_path).ok().and_then(|t| serde_json::from_str(&t).ok()) {
                Some(v) => r.tierswap_stats = v,
                None if !exited => self.say(&format!("{label}: the program did not exit in 60 s; no counters at exit")),
                None => self.say(&format!("{label}: no counters at exit in {}", stats_path.display())),
            }
            let at_exit = r.tierswap_stats.pointer("/counters/footprint_max").and_then(|v| v.as_u64());
            r.footprint_max_bytes = at_exit.or(live_fp).unwrap_or(0);
        } else if engine.is_kernel() {
            r.footprint_max_bytes = peaks.memcg_plus_pool_bytes.max(r.memcg_max_bytes);
        } else {
            r.footprint_max_bytes = r.rss_max_bytes;
        }
        drop(running);
        Ok(())
    }
}

/// Runs the lab: for each program, `runs` rounds of every engine (the order reversed every
/// other round), then with `equal_memory` the tierswap reruns. Every system setting is put
/// back before this returns, also when a run fails or the lab is interrupted.
pub fn run(spec: &ProgramsSpec) -> Result<Outcome, String> {
    check_tools(&spec.programs)?;
    let t0 = Instant::now();
    launch::check_engines(&spec.engines, &spec.tierswap_bin)?;
    let kernel = spec.engines.iter().any(ProgramEngine::is_kernel);
    if spec.keys > u32::MAX as u64 {
        return Err(format!("{} keys do not fit the lab's 32-bit key numbers: give a smaller --dataset", spec.keys));
    }
    if !spec.dir.is_dir() {
        return Err(format!("--dir {}: not a directory", spec.dir.display()));
    }
    // The machine's swap settings are taken first, so a second lab is refused before it
    // builds anything.
    let sys = if kernel { Some(System::acquire()?) } else { None };
    let work = spec.dir.join(format!("{PREFIX}programs-{}", std::process::id()));
    std::fs::create_dir_all(&work).map_err(|e| format!("cannot create {}: {e}", work.display()))?;
    let _work_cleanup = TempDir(work.clone());
    let scripts = python::write_scripts(&work)?;
    let bar = if spec.progress && std::io::IsTerminal::is_terminal(&std::io::stderr()) {
        let b = indicatif::ProgressBar::new(spec.keys);
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg:60} [{bar:25}] {pos}/{len} {elapsed}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut lab = Lab { spec, work, scripts: Some(scripts), sqlite_db: None, sys, bar, seq: 0 };
    let mut out = Outcome::default();
    'programs: for &program in &spec.programs {
        let mut gave_up: Vec<String> = Vec::new();
        for round in 0..spec.runs {
            let mut order: Vec<&ProgramEngine> = spec.engines.iter().collect();
            if round % 2 == 1 {
                order.reverse();
            }
            for engine in order {
                if crate::lab::interrupted() {
                    out.interrupted = true;
                    break 'programs;
                }
                if gave_up.contains(&engine.label()) {
                    continue;
                }
                let mut r = lab.one_run(program, engine, round, false);
                if r.error.as_deref().is_some_and(|e| e.contains(launch::OOM_NOTE)) {
                    // memcg v1 does not charge zswap's pool: the kernel can fail to reclaim in
                    // time and OOM-kill inside the limit. One more try, said out loud.
                    lab.say(&format!("{}; retrying once", run_line(&r)));
                    out.retried.push(run_line(&r));
                    r = lab.one_run(program, engine, round, false);
                    if r.error.as_deref().is_some_and(|e| e.contains(launch::OOM_NOTE)) {
                        // Twice in a row: the rounds left would only repeat it.
                        lab.say(&format!(
                            "{} on {}: OOM-killed on its try and its retry; its remaining rounds are skipped",
                            program.name(),
                            engine.label()
                        ));
                        out.retried.push(format!(
                            "{} on {}: OOM-killed twice in round {}, remaining rounds skipped",
                            program.name(),
                            engine.label(),
                            round + 1
                        ));
                        gave_up.push(engine.label());
                    }
                }
                lab.say(&run_line(&r));
                out.runs.push(r);
            }
        }
        if spec.equal_memory {
            let Some(eq) = equal_memory_engine(spec, program, &out.runs) else {
                lab.say(&format!("{}: no kernel-zswap run completed, no equal-memory rerun", program.name()));
                continue;
            };
            if let ProgramEngine::Tierswap { budget_bytes: Some(b), .. } = &eq {
                out.equal_budgets.push((program.name().to_string(), *b));
            }
            for round in 0..spec.runs {
                if crate::lab::interrupted() {
                    out.interrupted = true;
                    break 'programs;
                }
                let r = lab.one_run(program, &eq, round, true);
                lab.say(&run_line(&r));
                out.runs.push(r);
            }
        }
    }
    lab.bar.finish_and_clear();
    if let Some(mut s) = lab.sys.take() {
        s.restore();
    }
    drop(lab);
    out.elapsed_s = t0.elapsed().as_secs_f64();
    Ok(out)
}

/// tierswap at the kernel-zswap total of `program`: the budget plus the median of the
/// kernel-zswap runs' pool peaks, rounded up to a MiB; the plain tierswap engine's flags.
fn equal_memory_engine(spec: &ProgramsSpec, program: Program, runs: &[ProgramRun]) -> Option<ProgramEngine> {
    let pools: Vec<f64> = runs
        .iter()
        .filter(|r| r.program == program.name() && r.engine == "kernel-zswap" && r.error.is_none())
        .map(|r| r.kernel_pool_max_bytes as f64)
        .collect();
    if pools.is_empty() {
        return None;
    }
    let pool = report::median(&pools) as u64;
    let total_mib = (spec.budget_bytes + pool).div_ceil(1 << 20);
    let flags = spec
        .engines
        .iter()
        .find_map(|e| match e {
            ProgramEngine::Tierswap { flags, budget_bytes: None, .. } => Some(flags.clone()),
            _ => None,
        })
        .unwrap_or_default();
    Some(ProgramEngine::Tierswap {
        label: format!("tierswap:budget={total_mib}M"),
        budget_bytes: Some(total_mib << 20),
        flags,
    })
}

/// One line per finished run, for the log.
fn run_line(r: &ProgramRun) -> String {
    if let Some(e) = &r.error {
        return format!("{:<12} {:<24} run {}: FAILED: {e}", r.program, r.engine, r.run + 1);
    }
    let phases: Vec<String> = r
        .phases
        .iter()
        .map(|p| {
            format!(
                "{} {:.0} req/s p99 {:.0} µs, {} mismatches",
                p.distribution.name(),
                p.outcome.throughput_rps,
                p.outcome.p99_us,
                p.outcome.mismatches + p.warmup_mismatches
            )
        })
        .collect();
    format!("{:<12} {:<24} run {}: load {:.1} s; {}", r.program, r.engine, r.run + 1, r.load_s, phases.join("; "))
}

/// Whether the lab found anything wrong: a failed run or a value that came back wrong.
pub fn any_bad(out: &Outcome) -> bool {
    out.runs
        .iter()
        .any(|r| r.error.is_some() || r.phases.iter().any(|p| p.outcome.mismatches + p.warmup_mismatches > 0))
}

/// The kernel engines' compressor, for the header.
pub fn zswap_compressor() -> String {
    system::read("/sys/module/zswap/parameters/compressor").unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn memcached_gets_a_table_that_never_grows() {
        for keys in [1u64, 1000, 98_304, 98_305, 1_000_000, 3_000_000] {
            let power = memcached_hashpower(keys);
            assert!((1u64 << power) * 3 / 2 >= keys, "{keys} keys: 2^{power} buckets grow");
            assert!(power == 16 || (1u64 << (power - 1)) * 3 / 2 < keys, "{keys} keys: 2^{power} is more than needed");
        }
        assert_eq!(memcached_hashpower(1_000_000), 20);
    }

    #[test]
    fn programs_parse() {
        assert_eq!(Program::parse_list("redis, sqlite,redis").unwrap(), [Program::Redis, Program::Sqlite]);
        assert!(Program::parse_list("postgres").unwrap_err().contains("unknown program 'postgres'"));
        assert!(Program::parse_list("").is_err());
    }
}
