//! `tierswap stat` against real pagers: this test process (a pager and its control socket
//! in a private directory, found through TIERSWAP_CONTROL_DIR) and a helper process (this
//! test binary re-run as `helper`) whose exit `--watch` must notice.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Arc;

use tierswap::control::{self, ControlOptions, ControlServer};
use tierswap::{Hint, Pager, PagerConfig, Tiers};

const PAGE: usize = 4096;
const HELPER_ENV: &str = "TIERSWAP_STAT_TEST_HELPER_DIR";

/// One test at a time: a test that forks (a child dropping to another uid) would share
/// the pages of another test's region with the child, and UFFDIO_MOVE refuses shared pages
/// (EBUSY), so that test's evict_all would leave pages behind.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn serial() -> std::sync::MutexGuard<'static, ()> {
    SERIAL.lock().unwrap_or_else(|e| e.into_inner())
}

struct TestDir(PathBuf);

impl TestDir {
    fn new(name: &str) -> TestDir {
        let d = std::env::temp_dir().join(format!("tierswap-stat-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TestDir(d)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn pager() -> Arc<Pager> {
    let config = PagerConfig {
        budget_bytes: 64 << 20,
        tiers: "zero,pool".parse::<Tiers>().unwrap(),
        fault_threads: 2,
        ..Default::default()
    };
    match Pager::new(config) {
        Ok(p) => Arc::new(p),
        Err(e) => panic!("cannot start a pager (these tests need userfaultfd: run as root): {e}"),
    }
}

fn server(p: &Arc<Pager>, dir: &Path, cmdline: &str) -> ControlServer {
    let q = p.clone();
    ControlServer::start(
        move || q.stats(),
        ControlOptions { dir: Some(dir.to_path_buf()), cmdline: Some(cmdline.into()) },
    )
    .expect("start the control server")
}

/// Page `pg`'s content: zero, same-filled or counters by `pg % 4`.
fn expected_page(pg: usize) -> Vec<u8> {
    match pg % 4 {
        0 => vec![0; PAGE],
        1 => vec![0xab; PAGE],
        _ => (0..PAGE / 8).flat_map(|i| ((pg as u64) * 512 + i as u64).to_le_bytes()).collect(),
    }
}

/// Fills `n` pages, evicts them all, reads the first half back comparing every byte.
fn work(p: &Pager, n: usize) -> tierswap::Region {
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE].copy_from_slice(&expected_page(pg));
    }
    assert_eq!(p.evict_all(), n);
    for pg in 0..n / 2 {
        assert!(r.as_slice()[pg * PAGE..(pg + 1) * PAGE] == expected_page(pg)[..], "page {pg} came back wrong");
    }
    r
}

fn tierswap(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_tierswap")).args(args).env(control::DIR_ENV, dir).output().expect("run tierswap")
}

fn stdout(o: &Output) -> String {
    assert!(o.status.success(), "tierswap failed: {}", String::from_utf8_lossy(&o.stderr));
    String::from_utf8(o.stdout.clone()).unwrap()
}

/// Prometheus text as `series → value`, checking each metric's TYPE comes before it.
fn parse_prometheus(text: &str) -> (HashMap<String, f64>, HashMap<String, String>) {
    let mut values = HashMap::new();
    let mut types = HashMap::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut it = rest.split(' ');
            types.insert(it.next().unwrap().to_string(), it.next().unwrap().to_string());
            continue;
        }
        if line.starts_with('#') || line.is_empty() {
            continue;
        }
        let (series, value) = line.rsplit_once(' ').unwrap_or_else(|| panic!("bad line {line:?}"));
        let name = series.split('{').next().unwrap();
        let family = ["_bucket", "_count", "_sum"]
            .iter()
            .find_map(|s| name.strip_suffix(s).filter(|f| types.contains_key(*f)))
            .unwrap_or(name);
        assert!(types.contains_key(family), "{name} before its # TYPE");
        let v: f64 = value.parse().unwrap_or_else(|_| panic!("bad value in {line:?}"));
        assert!(values.insert(series.to_string(), v).is_none(), "{series} twice");
    }
    (values, types)
}

#[test]
fn table_json_and_prometheus_show_the_pagers_numbers() {
    let _serial = serial();
    let dir = TestDir::new("formats");
    let p = pager();
    let srv = server(&p, &dir.0, "stat-test --flag");
    let n = 256;
    let r = work(&p, n);
    let pid = std::process::id();
    let pid_s = pid.to_string();
    let want = p.stats();
    assert_eq!(want.swap_zero_pages + want.swap_samefill_pages + want.pool_stored_pages, want.swap_slots);
    assert!(want.counters.faults > 0 && want.swap_slots > 0, "the work did not show: {want:?}");

    // JSON: the pager's reply, every number equal to pager.stats().
    let j: serde_json::Value = serde_json::from_str(&stdout(&tierswap(&dir.0, &["stat", &pid_s, "--format", "json"])))
        .expect("stat --format json prints JSON");
    assert_eq!(j["v"], 1);
    assert_eq!(j["pid"], pid);
    assert_eq!(j["cmdline"], "stat-test --flag");
    assert_eq!(j["stats"], want.to_json());

    // Prometheus: parsed back, every counter and gauge equal; the histogram cumulative.
    let (values, types) = parse_prometheus(&stdout(&tierswap(&dir.0, &["stat", &pid_s, "--format", "prometheus"])));
    let label = format!("{{pid=\"{pid}\"}}");
    for (name, v) in want.counters.pairs() {
        let series = format!("tierswap_{name}{label}");
        assert_eq!(values.get(&series), Some(&(v as f64)), "{series}");
        let kind = if name == "footprint_max" { "gauge" } else { "counter" };
        assert_eq!(types[&format!("tierswap_{name}")], kind, "{name}");
    }
    for (name, v) in [
        ("budget", want.budget),
        ("footprint", want.footprint),
        ("swap_slots", want.swap_slots),
        ("swap_zero_pages", want.swap_zero_pages),
        ("swap_samefill_pages", want.swap_samefill_pages),
        ("pool_stored_pages", want.pool_stored_pages),
        ("pool_total_size", want.pool_total_size),
        ("present_pages", want.present_pages),
        ("file_pages", want.file_pages),
    ] {
        assert_eq!(values.get(&format!("tierswap_{name}{label}")), Some(&(v as f64)), "{name}");
        assert_eq!(types[&format!("tierswap_{name}")], "gauge", "{name}");
    }
    let h = "tierswap_fault_latency_seconds";
    assert_eq!(types[h], "histogram");
    let mut cum = 0;
    for (i, count) in want.fault_latency_us.iter().enumerate().take(want.fault_latency_us.len() - 1) {
        cum += count;
        let le = (1u64 << (i + 1)) as f64 / 1e6;
        assert_eq!(values.get(&format!("{h}_bucket{{pid=\"{pid}\",le=\"{le}\"}}")), Some(&(cum as f64)), "bucket {i}");
    }
    let inf = values[&format!("{h}_bucket{{pid=\"{pid}\",le=\"+Inf\"}}")];
    assert_eq!(inf, want.counters.faults as f64, "every fault in the histogram");
    assert_eq!(values[&format!("{h}_count{label}")], inf);

    // The table: footprint vs budget, the tiers with their pages, the percentiles.
    let t = stdout(&tierswap(&dir.0, &["stat", &pid_s]));
    assert!(t.contains(&format!("pid {pid}  stat-test --flag")), "{t}");
    assert!(t.contains("footprint ") && t.contains("budget 64.0 MiB"), "{t}");
    let row = |tier: &str| -> Vec<String> {
        let line = t.lines().find(|l| l.trim_start().starts_with(tier)).unwrap_or_else(|| panic!("no {tier} row: {t}"));
        line.split_whitespace().map(String::from).collect()
    };
    let zero = row("zero");
    assert_eq!(zero[1], want.swap_zero_pages.to_string(), "{t}");
    assert_eq!(zero[5], want.counters.swpout_zero.to_string(), "{t}");
    let pool = row("pool ");
    assert_eq!(pool[1], want.pool_stored_pages.to_string(), "{t}");
    assert_eq!(pool.last().unwrap(), &want.counters.zswpout.to_string(), "{t}");
    assert!(t.contains(&format!("faults {} ", want.counters.faults)), "{t}");
    assert!(t.contains("p99.9 ≤"), "{t}");

    // Managed against anonymous: the footprint, of all the process's resident anonymous
    // memory; 64 MiB this test holds outside the pager show as not managed.
    let unmanaged: Vec<u8> = vec![1u8; 64 << 20];
    let t = stdout(&tierswap(&dir.0, &["stat", &pid_s]));
    let line = t.lines().find(|l| l.starts_with("managed ")).unwrap_or_else(|| panic!("no managed line: {t}"));
    let mib = |after: &str| -> f64 {
        let rest = &line[line.find(after).unwrap_or_else(|| panic!("{line}")) + after.len()..];
        let mut w = rest.split_whitespace();
        common::mib(w.next().unwrap(), w.next().unwrap())
    };
    let (managed, anonymous, not_managed) = (mib("managed "), mib(" of "), mib("not managed "));
    assert!((managed - want.footprint as f64 / (1 << 20) as f64).abs() < 0.1, "{line} vs footprint {}", want.footprint);
    assert!(not_managed >= 64.0 && (managed + not_managed - anonymous).abs() < 0.2, "{line}");
    assert_eq!(unmanaged.iter().map(|&b| b as usize).sum::<usize>(), 64 << 20);
    drop(unmanaged);

    // The list: our process, its command.
    let l = stdout(&tierswap(&dir.0, &["stat"]));
    let line = l.lines().find(|l| l.split_whitespace().next() == Some(&pid_s)).unwrap_or_else(|| panic!("{l}"));
    assert!(line.contains("stat-test --flag") && line.contains(&format!("{} pg", want.swap_slots)), "{line}");

    // Nothing moved while the commands ran: the comparisons above were of one moment.
    assert_eq!(p.stats().to_json(), want.to_json());
    drop(r);
    drop(srv);
}

#[test]
fn unknown_pid_is_one_line_and_exit_1() {
    let _serial = serial();
    let dir = TestDir::new("unknown");
    std::fs::create_dir_all(&dir.0).unwrap();
    let mut child = Command::new("true").spawn().unwrap();
    let dead = child.id();
    child.wait().unwrap();
    let out = tierswap(&dir.0, &["stat", &dead.to_string()]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty());
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("pid {dead}")) && err.contains(&dir.0.display().to_string()), "{err}");
}

#[test]
fn another_users_process_is_named_so() {
    let _serial = serial();
    use std::os::unix::process::CommandExt;
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test runs `tierswap stat` as uid 65534 and must start as root");
    let dir = TestDir::new("other-user");
    let p = pager();
    let srv = server(&p, &dir.0, "stat-other-user");
    let pid = std::process::id().to_string();
    let out = Command::new(env!("CARGO_BIN_EXE_tierswap"))
        .args(["stat", &pid])
        .env(control::DIR_ENV, &dir.0)
        .uid(65534)
        .gid(65534)
        .output()
        .expect("run tierswap as uid 65534 (is the target directory readable by everyone?)");
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(out.stdout.is_empty(), "no counters for another user");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(err.contains(&format!("pid {pid}")) && err.contains("another user"), "{err}");
    drop(srv);
}

/// Not a test on its own: the helper process of `watch_…` (runs only with HELPER_ENV set).
/// A pager with swapped pages and a control socket; exits, socket left behind, when its
/// stdin closes.
#[test]
fn helper() {
    let Some(dir) = std::env::var_os(HELPER_ENV) else { return };
    let p = pager();
    let srv = server(&p, Path::new(&dir), "stat-helper");
    let _r = work(&p, 64);
    println!("ready {}", std::process::id());
    let _ = std::io::stdout().flush();
    let mut sink = Vec::new();
    let _ = std::io::stdin().read_to_end(&mut sink);
    std::mem::forget(srv);
    std::process::exit(0);
}

// The caller waits for the child it gets back; the panics here end the test anyway.
#[allow(clippy::zombie_processes)]
fn start_helper(dir: &Path) -> (Child, u32) {
    let mut h = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "helper", "--nocapture", "--test-threads=1"])
        .env(HELPER_ENV, dir)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("start the helper");
    let mut out = BufReader::new(h.stdout.take().unwrap());
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap_or(0) == 0 {
            let status = h.wait();
            panic!("the helper ended before it was ready: {status:?}");
        }
        // libtest prints "test helper ... " first, on the same line.
        if let Some(pid) = line.trim().rsplit_once("ready ").map(|(_, pid)| pid) {
            return (h, pid.parse().unwrap());
        }
    }
}

/// Reads the watch's stdout until a line containing `needle`; returns everything read.
fn read_until(out: &mut impl BufRead, needle: &str) -> String {
    let mut all = String::new();
    let mut line = String::new();
    loop {
        line.clear();
        if out.read_line(&mut line).unwrap() == 0 {
            panic!("output ended before '{needle}': {all}");
        }
        all.push_str(&line);
        if line.contains(needle) {
            return all;
        }
    }
}

#[test]
fn watch_ends_when_the_process_exits_and_the_list_removes_its_socket() {
    let _serial = serial();
    let dir = TestDir::new("watch");
    let (mut helper, hpid) = start_helper(&dir.0);
    let sock = control::socket_path(&dir.0, hpid);
    assert!(sock.exists());
    let mut w = Command::new(env!("CARGO_BIN_EXE_tierswap"))
        .args(["stat", &hpid.to_string(), "--watch", "0.1"])
        .env(control::DIR_ENV, &dir.0)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(w.stdout.take().unwrap());
    let first = read_until(&mut out, "rates:");
    assert!(first.contains(&format!("pid {hpid}  stat-helper")), "{first}");
    // The second frame has rates computed from two snapshots.
    let second = read_until(&mut out, "rates: faults/s");
    assert!(second.contains("swpin/s") && second.contains("MB/s"), "{second}");

    drop(helper.stdin.take()); // the helper exits, its socket stays behind
    assert!(helper.wait().unwrap().success());
    let mut rest = String::new();
    out.read_to_string(&mut rest).unwrap();
    let status = w.wait().unwrap();
    let mut err = String::new();
    w.stderr.take().unwrap().read_to_string(&mut err).unwrap();
    assert!(status.success(), "watch failed: {err}");
    assert_eq!(rest.lines().last(), Some(format!("process {hpid} exited").as_str()), "{rest}");

    // The list removes the dead process's socket and says so.
    assert!(sock.exists());
    let l = tierswap(&dir.0, &["stat"]);
    let lerr = String::from_utf8_lossy(&l.stderr);
    assert!(l.status.success());
    assert!(lerr.contains(&format!("removed the stale socket of pid {hpid}")), "{lerr}");
    assert!(!sock.exists());
    assert!(String::from_utf8_lossy(&l.stdout).starts_with("no process managed by tierswap"));
}

#[test]
fn watch_ends_cleanly_on_ctrl_c() {
    let _serial = serial();
    let dir = TestDir::new("ctrlc");
    let p = pager();
    let srv = server(&p, &dir.0, "stat-ctrlc");
    let r = work(&p, 32);
    let mut w = Command::new(env!("CARGO_BIN_EXE_tierswap"))
        .args(["stat", &std::process::id().to_string(), "--watch"])
        .env(control::DIR_ENV, &dir.0)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(w.stdout.take().unwrap());
    read_until(&mut out, "rates:");
    // SAFETY: kill on our own child's pid.
    assert_eq!(unsafe { libc::kill(w.id() as i32, libc::SIGINT) }, 0);
    let status = w.wait().unwrap();
    assert!(status.success(), "Ctrl-C must end the watch with exit 0, got {status:?}");
    drop(r);
    drop(srv);
}
