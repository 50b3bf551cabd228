//! The redis lab: an unmodified redis-server (Debian's, jemalloc) loaded with reproducible
//! keys, every value read back and compared, GET throughput measured with redis-benchmark,
//! and a BGSAVE whose RDB must load into a fresh server with the same content — side by
//! side, in one run, under three setups:
//!
//! - `unconstrained`: the server alone, no budget (the ceiling);
//! - `kernel-zswap`: the server in a memory cgroup limited to the budget, the kernel's zswap
//!   in front of a swap file (the baseline tierswap must match);
//! - `tierswap`: the server under `tierswap run --budget B`, no kernel swap at all.
//!
//! The system settings the kernel setup changes are recorded and put back by
//! [`crate::kernel::system::System`], also on error and Ctrl-C.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::kernel::system::{self, System, PREFIX};

/// How the server runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Setup {
    /// No budget.
    Unconstrained,
    /// A memcg limited to the budget, kernel zswap over a swap file.
    KernelZswap,
    /// `tierswap run --budget`.
    Tierswap,
}

impl Setup {
    /// The name in tables and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Setup::Unconstrained => "unconstrained",
            Setup::KernelZswap => "kernel-zswap",
            Setup::Tierswap => "tierswap",
        }
    }

    /// Parses a comma-separated list.
    pub fn parse_list(s: &str) -> Result<Vec<Setup>, String> {
        s.split(',')
            .filter(|x| !x.trim().is_empty())
            .map(|x| match x.trim() {
                "unconstrained" => Ok(Setup::Unconstrained),
                "kernel-zswap" => Ok(Setup::KernelZswap),
                "tierswap" => Ok(Setup::Tierswap),
                other => Err(format!("unknown setup '{other}': give unconstrained, kernel-zswap or tierswap")),
            })
            .collect()
    }
}

/// What to run.
#[derive(Clone, Debug)]
pub struct RedisSpec {
    /// Keys to load.
    pub keys: u64,
    /// Bytes per value.
    pub value_bytes: usize,
    /// The budget of the constrained setups.
    pub budget_bytes: u64,
    /// Setups, run in this order each round.
    pub setups: Vec<Setup>,
    /// Rounds (the table shows medians).
    pub runs: usize,
    /// GET requests redis-benchmark makes per run.
    pub get_requests: u64,
    /// The `tierswap` binary (for `tierswap run`).
    pub tierswap_bin: PathBuf,
    /// Where the swap file of the kernel setup and the RDB files go.
    pub work_dir: PathBuf,
    /// Run BGSAVE and check the RDB.
    pub bgsave: bool,
}

/// One setup's run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct RedisRun {
    /// Setup name.
    pub setup: String,
    /// Round.
    pub run: usize,
    /// Seconds to load every key.
    pub load_s: f64,
    /// Seconds to read every key back and compare it.
    pub verify_s: f64,
    /// Values that came back different or missing.
    pub mismatches: u64,
    /// redis-benchmark GET requests per second (-P 32, 12 clients, random keys).
    pub get_rps: f64,
    /// Peak memory: the process's VmHWM (unconstrained, tierswap) or the memcg's peak plus
    /// zswap's pool (kernel-zswap; memcg v1 charges neither).
    pub peak_bytes: u64,
    /// tierswap's own footprint peak, when the stats said it.
    pub footprint_bytes: Option<u64>,
    /// BGSAVE finished, and the RDB loaded into a fresh server with every value equal.
    pub bgsave_ok: Option<bool>,
    /// What went wrong, if anything.
    pub error: Option<String>,
}

/// A value: `value_bytes` of a 64-letter alphabet from a PRNG seeded by the key's index
/// (typical of tokens and encoded blobs; as hard on lz4 and lzo as on a real cache).
pub fn value_of(idx: u64, value_bytes: usize, out: &mut Vec<u8>) {
    const ALPHABET: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    out.clear();
    let mut x = idx.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ 0xD1B5_4A32_D192_ED03;
    while out.len() < value_bytes {
        // xorshift64*
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        let mut r = x.wrapping_mul(0x2545_F491_4F6C_DD1D);
        for _ in 0..10 {
            if out.len() == value_bytes {
                break;
            }
            out.push(ALPHABET[(r & 63) as usize]);
            r >>= 6;
        }
    }
}

/// The key redis-benchmark's `__rand_int__` makes for `idx` (12 digits, zero-padded).
pub fn key_of(idx: u64) -> String {
    format!("key:{idx:012}")
}

/// A pipelining RESP client, enough for SET, GET and admin commands.
pub struct Client {
    w: std::io::BufWriter<TcpStream>,
    r: BufReader<TcpStream>,
}

/// A RESP reply.
#[derive(Debug, PartialEq, Eq)]
pub enum Reply {
    /// +OK and friends.
    Simple(String),
    /// -ERR …
    Error(String),
    /// :n
    Int(i64),
    /// $n … (None: $-1)
    Bulk(Option<Vec<u8>>),
    /// *n … (arrays are not needed here; their element count)
    Array(i64),
}

impl Client {
    /// Connects to 127.0.0.1:`port`, waiting up to `wait` for the server to listen.
    pub fn connect(port: u16, wait: Duration) -> std::io::Result<Client> {
        let deadline = Instant::now() + wait;
        loop {
            match TcpStream::connect(("127.0.0.1", port)) {
                Ok(s) => {
                    s.set_nodelay(true)?;
                    s.set_read_timeout(Some(Duration::from_secs(600)))?;
                    let r = BufReader::with_capacity(1 << 20, s.try_clone()?);
                    let w = std::io::BufWriter::with_capacity(1 << 20, s);
                    return Ok(Client { w, r });
                }
                Err(e) if Instant::now() >= deadline => return Err(e),
                Err(_) => std::thread::sleep(Duration::from_millis(50)),
            }
        }
    }

    /// Queues one command.
    pub fn send(&mut self, args: &[&[u8]]) -> std::io::Result<()> {
        write!(self.w, "*{}\r\n", args.len())?;
        for a in args {
            write!(self.w, "${}\r\n", a.len())?;
            self.w.write_all(a)?;
            self.w.write_all(b"\r\n")?;
        }
        Ok(())
    }

    /// Sends what is queued.
    pub fn flush(&mut self) -> std::io::Result<()> {
        self.w.flush()
    }

    /// Reads one reply.
    pub fn reply(&mut self) -> std::io::Result<Reply> {
        let mut line = Vec::new();
        self.r.read_until(b'\n', &mut line)?;
        if line.len() < 3 || !line.ends_with(b"\r\n") {
            return Err(std::io::Error::new(std::io::ErrorKind::UnexpectedEof, "the server closed the connection"));
        }
        let body = String::from_utf8_lossy(&line[1..line.len() - 2]).into_owned();
        let int = |s: &str| {
            s.parse::<i64>().map_err(|_| std::io::Error::new(std::io::ErrorKind::InvalidData, format!("bad reply {s}")))
        };
        Ok(match line[0] {
            b'+' => Reply::Simple(body),
            b'-' => Reply::Error(body),
            b':' => Reply::Int(int(&body)?),
            b'*' => Reply::Array(int(&body)?),
            b'$' => {
                let n = int(&body)?;
                if n < 0 {
                    Reply::Bulk(None)
                } else {
                    let mut v = vec![0u8; n as usize + 2];
                    self.r.read_exact(&mut v)?;
                    v.truncate(n as usize);
                    Reply::Bulk(Some(v))
                }
            }
            _ => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    format!("not a RESP reply: {}", String::from_utf8_lossy(&line)),
                ))
            }
        })
    }

    /// One command, one reply.
    pub fn call(&mut self, args: &[&[u8]]) -> std::io::Result<Reply> {
        self.send(args)?;
        self.flush()?;
        self.reply()
    }
}

const BATCH: u64 = 1000;

/// SETs keys 0..n, pipelined; returns seconds.
pub fn load(c: &mut Client, n: u64, value_bytes: usize, tick: &dyn Fn(u64)) -> std::io::Result<f64> {
    let t0 = Instant::now();
    let mut v = Vec::with_capacity(value_bytes);
    let mut i = 0;
    while i < n {
        let end = (i + BATCH).min(n);
        for k in i..end {
            value_of(k, value_bytes, &mut v);
            c.send(&[b"SET", key_of(k).as_bytes(), &v])?;
        }
        c.flush()?;
        for _ in i..end {
            match c.reply()? {
                Reply::Simple(_) => {}
                other => {
                    return Err(std::io::Error::other(format!("SET answered {other:?}")));
                }
            }
        }
        i = end;
        tick(i);
    }
    Ok(t0.elapsed().as_secs_f64())
}

/// GETs keys 0..n and compares each value; returns (seconds, mismatches).
pub fn verify(c: &mut Client, n: u64, value_bytes: usize, tick: &dyn Fn(u64)) -> std::io::Result<(f64, u64)> {
    let t0 = Instant::now();
    let mut v = Vec::with_capacity(value_bytes);
    let mut bad = 0;
    let mut i = 0;
    while i < n {
        let end = (i + BATCH).min(n);
        for k in i..end {
            c.send(&[b"GET", key_of(k).as_bytes()])?;
        }
        c.flush()?;
        for k in i..end {
            value_of(k, value_bytes, &mut v);
            match c.reply()? {
                Reply::Bulk(Some(got)) if got == v => {}
                _ => bad += 1,
            }
        }
        i = end;
        tick(i);
    }
    Ok((t0.elapsed().as_secs_f64(), bad))
}

fn free_port() -> u16 {
    std::net::TcpListener::bind(("127.0.0.1", 0)).and_then(|l| l.local_addr()).map_or(6399, |a| a.port())
}

/// A running server and what it needs cleaned up.
struct Server {
    child: Child,
    port: u16,
    cgroup: Option<PathBuf>,
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if let Some(cg) = &self.cgroup {
            system::remove_cgroup(cg);
        }
    }
}

fn info_field(c: &mut Client, section: &str, field: &str) -> std::io::Result<Option<String>> {
    match c.call(&[b"INFO", section.as_bytes()])? {
        Reply::Bulk(Some(text)) => Ok(String::from_utf8_lossy(&text)
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{field}:")).map(|v| v.trim().to_string()))),
        _ => Ok(None),
    }
}

fn proc_kib(pid: u32, field: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field).and_then(|v| v.split_whitespace().next()).and_then(|v| v.parse().ok()))
        .unwrap_or(0)
}

fn zswap_pool_bytes() -> u64 {
    system::read("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find(|l| l.starts_with("Zswap:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|kb| kb.parse::<u64>().ok())
        .map_or(0, |kb| kb * 1024)
}

/// Whether redis-server and redis-benchmark are installed.
pub fn check_tools() -> Result<(), String> {
    for tool in ["redis-server", "redis-benchmark"] {
        if Command::new(tool).arg("--version").stdout(Stdio::null()).stderr(Stdio::null()).status().is_err() {
            return Err(format!(
                "no `{tool}`: install it with `apt-get install redis-server redis-tools` (then `systemctl disable --now redis-server`)"
            ));
        }
    }
    Ok(())
}

fn start_server(
    setup: Setup,
    spec: &RedisSpec,
    dir: &Path,
    sys: &mut Option<System>,
    round: usize,
) -> Result<Server, String> {
    let port = free_port();
    let port_s = port.to_string();
    let dir_s = dir.to_string_lossy().into_owned();
    let redis_args = [
        "--port",
        &port_s,
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        &dir_s,
        "--dbfilename",
        "dump.rdb",
        "--daemonize",
        "no",
        "--protected-mode",
        "no",
        "--logfile",
        "",
    ];
    let mut cmd;
    let mut cgroup = None;
    match setup {
        Setup::Unconstrained => {
            cmd = Command::new("redis-server");
            cmd.args(redis_args);
        }
        Setup::Tierswap => {
            cmd = Command::new(&spec.tierswap_bin);
            cmd.arg("run").arg("--budget").arg(format!("{}", spec.budget_bytes)).arg("--").arg("redis-server");
            cmd.args(redis_args);
        }
        Setup::KernelZswap => {
            let (root, limit, _, _) = system::memcg().ok_or("no cgroup memory controller")?;
            let s = match sys {
                Some(s) => s,
                None => sys.insert(System::acquire()?),
            };
            s.swapoff_all();
            let _ = s.set_zswap("compressor", "lzo");
            s.set_zswap("enabled", "Y")?;
            let room = spec.keys * (spec.value_bytes as u64 + 128) * 2 + (256 << 20);
            s.swapon_file(&spec.work_dir, room)?;
            let cg = root.join(format!("{PREFIX}redis-{}-{round}", std::process::id()));
            s.note_cgroup(&cg);
            std::fs::create_dir(&cg).map_err(|e| format!("cannot create cgroup {}: {e}", cg.display()))?;
            system::write(cg.join(limit), &spec.budget_bytes.to_string())?;
            cmd = Command::new("redis-server");
            cmd.args(redis_args);
            system::exec_in_cgroup(&mut cmd, &cg)?;
            cgroup = Some(cg);
        }
    }
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot start redis-server ({}): {e}", setup.name()))?;
    Ok(Server { child, port, cgroup })
}

/// The stats tierswap's shim writes on request, when `tierswap stat` can reach it.
fn tierswap_footprint(tierswap_bin: &Path, pid: u32) -> Option<u64> {
    let out = Command::new(tierswap_bin).args(["stat", &pid.to_string(), "--format", "json"]).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    let s = v.get("stats").unwrap_or(&v);
    s.get("footprint").and_then(|f| f.as_u64()).or_else(|| s.get("footprint_max").and_then(|f| f.as_u64()))
}

fn redis_benchmark(port: u16, spec: &RedisSpec) -> Result<f64, String> {
    let out = Command::new("redis-benchmark")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-t", "get", "-P", "32", "-c", "12"])
        .args(["-n", &spec.get_requests.to_string(), "-r", &spec.keys.to_string(), "--csv"])
        .output()
        .map_err(|e| format!("cannot run redis-benchmark: {e}"))?;
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .find(|l| l.starts_with("\"GET\""))
        .and_then(|l| l.split(',').nth(1))
        .and_then(|v| v.trim_matches('"').parse::<f64>().ok())
        .ok_or_else(|| {
            format!(
                "redis-benchmark ({}) printed no GET line: {} {}",
                out.status,
                text.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            )
        })
}

fn one_run(
    setup: Setup,
    spec: &RedisSpec,
    round: usize,
    sys: &mut Option<System>,
    bar: &indicatif::ProgressBar,
) -> RedisRun {
    let mut r = RedisRun { setup: setup.name().into(), run: round, ..Default::default() };
    if let Err(e) = one_run_inner(setup, spec, round, sys, bar, &mut r) {
        r.error = Some(e);
    }
    if setup == Setup::KernelZswap {
        if let Some(s) = sys.as_mut() {
            s.swapoff_all();
        }
    }
    r
}

fn one_run_inner(
    setup: Setup,
    spec: &RedisSpec,
    round: usize,
    sys: &mut Option<System>,
    bar: &indicatif::ProgressBar,
    r: &mut RedisRun,
) -> Result<(), String> {
    let dir = spec.work_dir.join(format!("{PREFIX}redis-{}-{}-{round}", std::process::id(), setup.name()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|e| format!("cannot create {}: {e}", dir.display()))?;
    let cleanup = Cleanup(dir.clone());
    let mut server = start_server(setup, spec, &dir, sys, round)?;
    let pid = server.child.id();
    let mut c = Client::connect(server.port, Duration::from_secs(20)).map_err(|e| {
        let mut err = String::new();
        if let Some(mut s) = server.child.stderr.take() {
            let _ = server.child.kill();
            let _ = s.read_to_string(&mut err);
        }
        format!("redis-server ({}) did not come up: {e}; {}", setup.name(), err.trim())
    })?;
    let cg_for_err = server.cgroup.clone();
    let io = |e: std::io::Error| format!("talking to redis-server ({}): {e}{}", setup.name(), oom_note(&cg_for_err));
    let peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let fp_peak = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (peak, fp_peak, stop) = (peak.clone(), fp_peak.clone(), stop.clone());
        let cg = server.cgroup.clone();
        let bin = spec.tierswap_bin.clone();
        std::thread::spawn(move || {
            use std::sync::atomic::Ordering::Relaxed;
            let mut n = 0u64;
            while !stop.load(Relaxed) {
                let v = match (&cg, system::memcg()) {
                    (Some(cg), Some((_, _, usage, _))) => {
                        system::read(cg.join(usage)).ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0)
                            + zswap_pool_bytes()
                    }
                    _ => proc_kib(pid, "VmRSS:") * 1024,
                };
                peak.fetch_max(v, Relaxed);
                if setup == Setup::Tierswap && n.is_multiple_of(10) {
                    if let Some(f) = tierswap_footprint(&bin, pid) {
                        fp_peak.fetch_max(f, Relaxed);
                    }
                }
                n += 1;
                std::thread::sleep(Duration::from_millis(100));
            }
        })
    };
    let label = format!("{} run {}", setup.name(), round + 1);
    bar.set_length(spec.keys);
    bar.set_position(0);
    bar.set_message(format!("{label}: load"));
    r.load_s = load(&mut c, spec.keys, spec.value_bytes, &|i| bar.set_position(i)).map_err(io)?;
    bar.set_message(format!("{label}: verify"));
    bar.set_position(0);
    let (vs, bad) = verify(&mut c, spec.keys, spec.value_bytes, &|i| bar.set_position(i)).map_err(io)?;
    r.verify_s = vs;
    r.mismatches = bad;
    bar.set_message(format!("{label}: redis-benchmark GET"));
    r.get_rps = redis_benchmark(server.port, spec).map_err(|e| format!("{e}{}", oom_note(&server.cgroup)))?;
    if spec.bgsave {
        bar.set_message(format!("{label}: BGSAVE"));
        r.bgsave_ok = Some(bgsave_and_check(&mut c, spec, &dir, bar)?);
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let _ = sampler.join();
    r.peak_bytes = peak.load(std::sync::atomic::Ordering::Relaxed);
    match (&server.cgroup, system::memcg()) {
        (Some(cg), Some((_, _, _, peak_file))) => {
            let p = system::read(cg.join(peak_file)).ok().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            r.peak_bytes = r.peak_bytes.max(p);
        }
        _ => r.peak_bytes = r.peak_bytes.max(proc_kib(pid, "VmHWM:") * 1024),
    }
    let f = fp_peak.load(std::sync::atomic::Ordering::Relaxed);
    r.footprint_bytes = (f > 0).then_some(f);
    drop(server);
    drop(cleanup);
    Ok(())
}

/// " (the kernel OOM-killed redis-server in its memcg)" when it did.
fn oom_note(cg: &Option<PathBuf>) -> &'static str {
    let Some(cg) = cg else { return "" };
    if system::memcg_oom_kills(cg) > 0 {
        " (the kernel OOM-killed redis-server in its memcg)"
    } else {
        ""
    }
}

struct Cleanup(PathBuf);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// BGSAVE, wait for it, load the RDB into a fresh unconstrained server and compare every value.
fn bgsave_and_check(
    c: &mut Client,
    spec: &RedisSpec,
    dir: &Path,
    bar: &indicatif::ProgressBar,
) -> Result<bool, String> {
    let io = |e: std::io::Error| format!("BGSAVE: {e}");
    match c.call(&[b"BGSAVE"]).map_err(io)? {
        Reply::Simple(_) => {}
        other => return Err(format!("BGSAVE answered {other:?}")),
    }
    let deadline = Instant::now() + Duration::from_secs(1800);
    loop {
        std::thread::sleep(Duration::from_millis(200));
        if info_field(c, "persistence", "rdb_bgsave_in_progress").map_err(io)?.as_deref() == Some("0") {
            break;
        }
        if Instant::now() > deadline {
            return Err("BGSAVE did not finish in 30 minutes".into());
        }
    }
    if info_field(c, "persistence", "rdb_last_bgsave_status").map_err(io)?.as_deref() != Some("ok") {
        bar.println("BGSAVE failed: rdb_last_bgsave_status is not ok (the child died or could not write the RDB)");
        return Ok(false);
    }
    // A fresh server on the RDB, with no budget: what was saved is what it serves.
    let port = free_port();
    let mut fresh = Command::new("redis-server")
        .args(["--port", &port.to_string(), "--save", "", "--appendonly", "no", "--daemonize", "no"])
        .args(["--dir", &dir.to_string_lossy(), "--dbfilename", "dump.rdb", "--logfile", ""])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| format!("cannot start the RDB check server: {e}"))?;
    let res = (|| -> Result<bool, String> {
        let mut c2 = Client::connect(port, Duration::from_secs(10)).map_err(|e| format!("RDB check server: {e}"))?;
        // Loading the RDB happens before the server answers anything but LOADING errors.
        let deadline = Instant::now() + Duration::from_secs(600);
        let n = loop {
            match c2.call(&[b"DBSIZE"]).map_err(|e| format!("RDB check server: {e}"))? {
                Reply::Int(n) => break n,
                _ if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(100)),
                other => return Err(format!("RDB check server: DBSIZE answered {other:?}")),
            }
        };
        if n as u64 != spec.keys {
            bar.println(format!("BGSAVE: the RDB holds {n} keys, not {}", spec.keys));
            return Ok(false);
        }
        bar.set_message("RDB check: verify");
        let (_, bad) = verify(&mut c2, spec.keys, spec.value_bytes, &|i| bar.set_position(i))
            .map_err(|e| format!("RDB check server: {e}"))?;
        Ok(bad == 0)
    })();
    let _ = fresh.kill();
    let _ = fresh.wait();
    res
}

/// Runs every setup `runs` times, alternating, and returns every run.
pub fn run(spec: &RedisSpec, progress: bool) -> Result<Vec<RedisRun>, String> {
    check_tools()?;
    if spec.setups.contains(&Setup::KernelZswap) {
        // SAFETY: geteuid has no preconditions.
        if unsafe { libc::geteuid() } != 0 {
            return Err("kernel-zswap needs root (it configures swap, zswap and a memory cgroup)".into());
        }
        if system::memcg().is_none() {
            return Err("kernel-zswap needs a cgroup memory controller".into());
        }
        for l in system::restore_leftovers() {
            eprintln!("tierswap: {l}");
        }
    }
    if spec.setups.contains(&Setup::Tierswap) && !spec.tierswap_bin.exists() {
        return Err(format!("no tierswap binary at {}", spec.tierswap_bin.display()));
    }
    let bar = if progress {
        let b = indicatif::ProgressBar::new(spec.keys);
        b.set_style(
            indicatif::ProgressStyle::with_template("{msg:40} [{bar:30}] {pos}/{len} keys {per_sec} eta {eta}")
                .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
        );
        b
    } else {
        indicatif::ProgressBar::hidden()
    };
    let mut sys: Option<System> = None;
    let mut out = Vec::new();
    for round in 0..spec.runs {
        // ABBA: alternate the order round by round, so no setup always runs first.
        let mut order = spec.setups.clone();
        if round % 2 == 1 {
            order.reverse();
        }
        for setup in order {
            if crate::lab::interrupted() {
                break;
            }
            out.push(one_run(setup, spec, round, &mut sys, &bar));
        }
    }
    bar.finish_and_clear();
    if let Some(mut s) = sys.take() {
        s.restore();
    }
    Ok(out)
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// The table: medians per setup, GET throughput beside tierswap's.
pub fn table(spec: &RedisSpec, runs: &[RedisRun]) -> String {
    let mut s = format!(
        "redis-server, {} keys × {} B values, budget {} MiB, {} run(s) each (medians)\n",
        spec.keys,
        spec.value_bytes,
        spec.budget_bytes >> 20,
        spec.runs
    );
    s += &format!(
        "{:<14} {:>8} {:>9} {:>10} {:>11} {:>9} {:>12} {:>12} {:>7}\n",
        "setup", "load s", "verify s", "mismatch", "GET rps", "ts÷", "peak MiB", "tsfp MiB", "BGSAVE"
    );
    let ts_rps =
        median(runs.iter().filter(|r| r.setup == "tierswap" && r.error.is_none()).map(|r| r.get_rps).collect());
    for setup in &spec.setups {
        let ok: Vec<&RedisRun> = runs.iter().filter(|r| r.setup == setup.name() && r.error.is_none()).collect();
        let rps = median(ok.iter().map(|r| r.get_rps).collect());
        let fp: Vec<f64> = ok.iter().filter_map(|r| r.footprint_bytes.map(|b| b as f64)).collect();
        s += &format!(
            "{:<14} {:>8.2} {:>9.2} {:>10} {:>11.0} {:>9.2} {:>12.1} {:>12} {:>7}\n",
            setup.name(),
            median(ok.iter().map(|r| r.load_s).collect()),
            median(ok.iter().map(|r| r.verify_s).collect()),
            ok.iter().map(|r| r.mismatches).sum::<u64>(),
            rps,
            ts_rps / rps,
            median(ok.iter().map(|r| r.peak_bytes as f64).collect()) / (1u64 << 20) as f64,
            if fp.is_empty() { "-".to_string() } else { format!("{:.1}", median(fp) / (1u64 << 20) as f64) },
            match (
                ok.iter().filter(|r| r.bgsave_ok == Some(true)).count(),
                ok.iter().filter(|r| r.bgsave_ok.is_some()).count()
            ) {
                (_, 0) => "-".to_string(),
                (a, b) => format!("{a}/{b}"),
            }
        );
    }
    for r in runs.iter().filter(|r| r.error.is_some()) {
        s += &format!("problem: {} run {}: {}\n", r.setup, r.run + 1, r.error.as_deref().unwrap_or_default());
    }
    s += "ts÷: tierswap's GET rps ÷ the setup's. peak: the process's VmHWM (unconstrained, tierswap: everything it\n\
          maps, engine included) or the memcg's peak + zswap's pool (kernel-zswap). tsfp: tierswap's own footprint peak\n\
          (tierswap stat). BGSAVE: runs whose RDB loaded into a fresh server with every value equal.\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_reproducible_and_distinct() {
        let (mut a, mut b, mut c) = (Vec::new(), Vec::new(), Vec::new());
        value_of(42, 1024, &mut a);
        value_of(42, 1024, &mut b);
        value_of(43, 1024, &mut c);
        assert_eq!(a.len(), 1024);
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'+' || *x == b'/'));
        assert_eq!(key_of(123), "key:000000000123");
    }

    #[test]
    fn setups_parse() {
        assert_eq!(Setup::parse_list("tierswap,kernel-zswap").unwrap(), vec![Setup::Tierswap, Setup::KernelZswap]);
        assert!(Setup::parse_list("zram").unwrap_err().contains("unknown setup 'zram'"));
    }
}
