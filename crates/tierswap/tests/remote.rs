//! The remote tier against a real Redis cluster on loopback (3 primaries, 3 replicas, made
//! by `scripts/redis-cluster.sh` for each test and stopped by a guard even when the test
//! fails): every byte comes back; a primary killed while pages come back loses nothing
//! with `replicas = 1`; a cluster stopped mid-run leaves the program running on pool and
//! file, and only the pages that were remote-only fail, with SIGBUS, counted and logged.

mod common;

use std::io::Write;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::{fill_page, noise_page, run_alone, start, PAGE};
use tierswap::backend::resp::ClusterClient;
use tierswap::{FaultMode, Hint, Pager, PagerConfig, RemoteConfig, Stats};

/// A cluster started for one test; stopped when dropped.
struct Cluster {
    dir: PathBuf,
    base: u16,
    seeds: Vec<String>,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/redis-cluster.sh")
}

impl Cluster {
    /// Starts a cluster on ports `base..base+6`. Servers an earlier run of these tests left
    /// on those ports (a test process killed before its guard ran) are shut down first.
    fn start(name: &str, base: u16) -> Cluster {
        assert!(
            Command::new("redis-server").arg("--version").output().is_ok(),
            "redis-server is not installed (scripts/setup.sh installs it)"
        );
        for port in base..base + 6 {
            let p = port.to_string();
            let dir = Command::new("redis-cli").args(["-p", &p, "config", "get", "dir"]).output();
            if dir.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("tierswap-redis-")) {
                eprintln!("shutting down a server an earlier test run left on port {port}");
                let _ = Command::new("redis-cli").args(["-p", &p, "shutdown", "nosave"]).output();
            }
        }
        let dir = std::env::temp_dir().join(format!("tierswap-redis-{name}-{}", std::process::id()));
        let out = Command::new(script()).arg("start").arg(&dir).arg(base.to_string()).output().unwrap();
        // The guard exists before the check, so a half-started cluster is stopped too.
        let mut c = Cluster { dir, base, seeds: Vec::new() };
        assert!(
            out.status.success(),
            "redis-cluster.sh start failed: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let url = String::from_utf8_lossy(&out.stdout).trim().to_string();
        c.seeds = url.trim_start_matches("redis://").split(',').map(str::to_string).collect();
        assert_eq!(c.seeds.len(), 6, "six nodes: {url}");
        c
    }

    fn stop(&self) {
        let _ = Command::new(script()).arg("stop").arg(&self.dir).arg(self.base.to_string()).status();
    }

    fn ports(&self) -> impl Iterator<Item = u16> {
        self.base..self.base + 6
    }

    fn cli(&self, port: u16, args: &[&str]) -> String {
        let out = Command::new("redis-cli").arg("-p").arg(port.to_string()).args(args).output().unwrap();
        String::from_utf8_lossy(&out.stdout).to_string()
    }

    /// Keys of any pager held by the primaries.
    fn all_keys(&self) -> usize {
        let mut c = ClusterClient::connect(&self.seeds, Duration::from_secs(2)).unwrap();
        c.scan_keys(b"ts:*").unwrap().len()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.stop();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Page `pg` of data set `set`: counters for most pages (compressible), noise for every
/// seventh (incompressible: stored raw), zeros for every fifth when `zeros`.
fn page_content(set: u64, pg: usize, zeros: bool, buf: &mut [u8]) {
    if zeros && pg.is_multiple_of(5) {
        buf.fill(0);
    } else if pg % 7 == 3 {
        noise_page(buf, (set << 32) | pg as u64);
    } else {
        fill_page(buf, pg, set << 40);
    }
}

fn fill(r: &mut tierswap::Region, set: u64, zeros: bool) {
    let mem = r.as_mut_slice();
    for (pg, page) in mem.chunks_exact_mut(PAGE).enumerate() {
        page_content(set, pg, zeros, page);
    }
}

/// Pages of `r` that differ from data set `set` (every byte compared), for pages where
/// `which(pg)` holds.
fn mismatches(r: &tierswap::Region, set: u64, zeros: bool, which: impl Fn(usize) -> bool) -> (usize, usize) {
    let mut want = vec![0u8; PAGE];
    let (mut bad, mut checked) = (0, 0);
    for (pg, page) in r.as_slice().chunks_exact(PAGE).enumerate().filter(|&(pg, _)| which(pg)) {
        page_content(set, pg, zeros, &mut want);
        checked += 1;
        if page != &want[..] {
            bad += 1;
        }
    }
    (bad, checked)
}

fn config(c: &Cluster, file: bool, replicas: u32, fault_tries: u32) -> PagerConfig {
    let tiers = if file { "zero,pool,file" } else { "zero,pool" };
    PagerConfig {
        pool_max_bytes: Some(8 << 20),
        remote: Some(RemoteConfig {
            seeds: c.seeds[..2].to_vec(),
            replicas,
            fault_tries,
            retry_backoff_ms: 100,
            ..Default::default()
        }),
        ..common::config(64 << 20, tiers, FaultMode::Thread, 2)
    }
}

/// Evicts everything, then writes the pool back until it is empty (or nothing moves).
fn evict_to_writeback(p: &Pager) -> Stats {
    p.evict_all();
    let mut stalls = 0;
    while p.stats().pool_stored_pages > 0 && stalls < 200 {
        if p.writeback_now() == 0 {
            // The writeback thread holds some entries, or every tier refuses: a few more tries.
            stalls += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    p.stats()
}

#[test]
fn pages_round_trip_through_the_cluster_every_byte() {
    let c = Cluster::start("roundtrip", 7200);
    let p = start(config(&c, false, 0, 3));
    let n = 4096;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    fill(&mut r, 1, true);
    let st = evict_to_writeback(&p);
    let zero_pages = (0..n).filter(|pg| pg % 5 == 0).count() as u64;
    assert_eq!(st.pool_stored_pages, 0, "the pool was written back: {st:?}");
    assert_eq!(st.remote_pages, n as u64 - zero_pages, "every non-zero page is remote: {st:?}");
    assert_eq!(st.counters.remote_out, st.remote_pages, "remote_out counts the pages written");
    assert!(st.counters.remote_bytes > 0 && st.counters.remote_bytes < st.remote_pages * PAGE as u64 + 1);
    assert_eq!(st.counters.remote_errors, 0);
    assert_eq!(p.remote_keys().unwrap().unwrap() as u64, st.remote_pages, "one object per remote page");
    assert!(st.remote_latency_us.iter().sum::<u64>() > 0, "round trips are timed");

    // Nothing on the servers is plaintext: no stored value contains a page's counters.
    let mut probe = vec![0u8; PAGE];
    page_content(1, 1, true, &mut probe);
    let mut client = ClusterClient::connect(&c.seeds, Duration::from_secs(2)).unwrap();
    let keys = client.scan_keys(b"ts:*").unwrap();
    let mut buf = vec![0u8; 8192];
    for k in keys.iter().take(64) {
        let len = client.get_into(k, &mut buf).unwrap().expect("the key exists");
        assert!(!buf[..len].windows(64).any(|w| w == &probe[64..128]), "plaintext on the server");
    }

    let (bad, checked) = mismatches(&r, 1, true, |_| true);
    assert_eq!((bad, checked), (0, n), "every byte came back");
    let st2 = p.stats();
    assert_eq!(st2.counters.remote_in, st.remote_pages, "each remote page read once: {st2:?}");
    assert_eq!(st2.counters.remote_read_failed, 0);
    assert_eq!(st2.remote_pages, st.remote_pages, "pages read back keep their remote copy while clean");

    // Writing the pages frees their slots (write-protect faults), and freed slots delete
    // their objects (batched, sent by the writeback thread).
    fill(&mut r, 1, true);
    assert_eq!(p.stats().remote_pages, 0, "written pages gave up their remote copy");
    let deadline = Instant::now() + Duration::from_secs(10);
    while p.remote_keys().unwrap().unwrap() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(p.remote_keys().unwrap().unwrap(), 0, "objects of freed slots are deleted");

    // At exit the pager deletes what it still has out there.
    fill(&mut r, 2, false);
    let st = evict_to_writeback(&p);
    assert!(st.remote_pages > 0);
    assert!(c.all_keys() > 0);
    drop(r);
    drop(p);
    assert_eq!(c.all_keys(), 0, "the pager's keys are gone after it exits");
}

#[test]
fn a_primary_killed_during_refault_loses_nothing_with_one_replica() {
    let c = Cluster::start("failover", 7220);
    let p = start(config(&c, false, 1, 30));
    let n = 8192;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    fill(&mut r, 3, false);
    let st = evict_to_writeback(&p);
    assert_eq!(st.remote_pages, n as u64, "{st:?}");
    // Kill the primary holding the most of our objects.
    let (port, keys) = c
        .ports()
        .filter(|&pt| c.cli(pt, &["role"]).starts_with("master"))
        .map(|pt| (pt, c.cli(pt, &["dbsize"]).trim().parse::<u64>().unwrap_or(0)))
        .max_by_key(|&(_, k)| k)
        .unwrap();
    assert!(keys > 0, "the victim holds objects");
    let pid: i32 =
        std::fs::read_to_string(c.dir.join(port.to_string()).join("redis.pid")).unwrap().trim().parse().unwrap();
    // SAFETY: kill(2) on the pid of a redis-server this test started.
    assert_eq!(unsafe { libc::kill(pid, libc::SIGKILL) }, 0);
    let t0 = Instant::now();
    let (bad, checked) = mismatches(&r, 3, false, |_| true);
    let took = t0.elapsed();
    let st = p.stats();
    eprintln!(
        "killed primary {port} ({keys} objects); refault took {took:?}; remote_in {} remote_errors {}",
        st.counters.remote_in, st.counters.remote_errors
    );
    assert_eq!((bad, checked), (0, n), "every byte came back across the failover");
    assert_eq!(st.counters.remote_in, n as u64);
    assert_eq!(st.counters.remote_read_failed, 0);
    let nodes = c.cli(c.base + if port == c.base { 1 } else { 0 }, &["cluster", "nodes"]);
    assert!(nodes.lines().any(|l| l.contains(&format!(":{port}@")) && l.contains("fail")), "{nodes}");
}

/// Pages of data set A (with zeros) that never go remote when there is a file tier.
fn not_remote(pg: usize) -> bool {
    pg.is_multiple_of(5) || pg % 7 == 3
}

/// The child of [`stopping_the_cluster_keeps_the_program_running_on_pool_and_file`].
fn cluster_down_child(dir: &str, base: &str) {
    let seeds: Vec<String> = (0..6).map(|i| format!("127.0.0.1:{}", base.parse::<u16>().unwrap() + i)).collect();
    let c = Cluster { dir: dir.into(), base: base.parse().unwrap(), seeds };
    let p = start(config(&c, true, 0, 3));
    let n = 1024;
    let mut a = p.region(n * PAGE, Hint::Normal).unwrap();
    fill(&mut a, 5, true);
    let st = evict_to_writeback(&p);
    // Incompressible pages go straight to the file; everything else went remote.
    assert_eq!(st.file_pages, st.counters.pool_reject_incompressible, "{st:?}");
    assert!(st.remote_pages > 0, "{st:?}");
    let (file_before, remote_out) = (st.file_pages, st.counters.remote_out);
    c.stop();
    std::mem::forget(c);
    println!("cluster stopped");

    // New evictions go to the pool and the file.
    let mut b = p.region(n * PAGE, Hint::Normal).unwrap();
    fill(&mut b, 6, false);
    let st = evict_to_writeback(&p);
    assert!(
        st.file_pages > file_before + st.counters.pool_reject_incompressible / 2,
        "pool writeback fell back to the file: {st:?}"
    );
    assert_eq!(st.counters.remote_out, remote_out, "nothing counted as remote while it is down");
    assert!(st.counters.remote_errors > 0, "the failed batch is counted");
    let (bad_b, checked_b) = mismatches(&b, 6, false, |_| true);
    // Pages of A that never went remote (zero pages, incompressible pages on the file) read.
    let (bad_a, checked_a) = mismatches(&a, 5, true, not_remote);
    println!("good pages {} bad {}", checked_b + checked_a - bad_a - bad_b, bad_a + bad_b);
    std::io::stdout().flush().unwrap();

    // A remote-only page: retried, then SIGBUS.
    SIGBUS_PAGER.store(Box::into_raw(Box::new(p)), std::sync::atomic::Ordering::SeqCst);
    // SAFETY: a zeroed sigaction with a handler of the right type, run once.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as extern "C" fn(i32) as usize;
        sa.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()), 0);
    }
    let t0 = Instant::now();
    T0.store(Box::into_raw(Box::new(t0)), std::sync::atomic::Ordering::SeqCst);
    // SAFETY: reading a page of our own region.
    let v = unsafe { std::ptr::read_volatile(a.as_slice().as_ptr().add(PAGE + 8)) };
    println!("read a remote-only page: {v}");
    std::process::exit(0);
}

static SIGBUS_PAGER: std::sync::atomic::AtomicPtr<Pager> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());
static T0: std::sync::atomic::AtomicPtr<Instant> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_sigbus(_sig: i32) {
    let p = SIGBUS_PAGER.load(std::sync::atomic::Ordering::SeqCst);
    let t0 = T0.load(std::sync::atomic::Ordering::SeqCst);
    if !p.is_null() && !t0.is_null() {
        // SAFETY: both are leaked above and outlive the handler. Reading counters and
        // formatting here is not async-signal-safe in general, but the faulting thread was
        // in a plain load and holds no lock of ours or of the allocator.
        let (st, ms) = unsafe { ((*p).stats(), (*t0).elapsed().as_millis()) };
        let line = format!(
            "sigbus remote_read_failed {} remote_errors {} after_ms {ms}\n",
            st.counters.remote_read_failed, st.counters.remote_errors
        );
        // SAFETY: writing our own buffer to stdout.
        unsafe { libc::write(1, line.as_ptr().cast(), line.len()) };
    }
    // SA_RESETHAND put the default action back: the retried access ends the process.
}

#[test]
fn stopping_the_cluster_keeps_the_program_running_on_pool_and_file() {
    if let (Ok(dir), Ok(base)) =
        (std::env::var("TIERSWAP_REMOTE_CHILD_DIR"), std::env::var("TIERSWAP_REMOTE_CHILD_BASE"))
    {
        return cluster_down_child(&dir, &base);
    }
    let c = Cluster::start("down", 7240);
    use std::os::unix::process::ExitStatusExt;
    let base = c.base.to_string();
    let (out, stdout, stderr) = run_alone(
        "stopping_the_cluster_keeps_the_program_running_on_pool_and_file",
        &[
            ("TIERSWAP_REMOTE_CHILD_DIR", c.dir.as_os_str()),
            ("TIERSWAP_REMOTE_CHILD_BASE", std::ffi::OsStr::new(&base)),
        ],
    );
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "the reader of a remote-only page gets SIGBUS:\n{stdout}\n{stderr}"
    );
    assert!(stdout.contains("cluster stopped"), "{stdout}\n{stderr}");
    let local_a = (0..1024).filter(|&pg| not_remote(pg)).count();
    assert!(
        stdout.contains(&format!("good pages {} bad 0", 1024 + local_a)),
        "every page not remote-only read correctly:\n{stdout}\n{stderr}"
    );
    assert!(!stdout.contains("read a remote-only page"), "no data came back: {stdout}");
    let line = stdout.lines().find(|l| l.starts_with("sigbus ")).unwrap_or_else(|| panic!("no sigbus line: {stdout}"));
    let field = |name: &str| -> u64 {
        let w: Vec<&str> = line.split_whitespace().collect();
        w.iter().position(|&x| x == name).and_then(|i| w.get(i + 1)).and_then(|v| v.parse().ok()).unwrap()
    };
    assert!(field("remote_read_failed") >= 1, "the failed page is counted: {line}");
    assert!(field("remote_errors") >= 3, "each try is counted: {line}");
    let ms = field("after_ms");
    assert!((300..10_000).contains(&ms), "retried with backoff (100 + 200 ms), then gave up: {line}");
    assert!(stderr.contains("remote tier") && stderr.contains("SIGBUS"), "the log says why: {stderr}");
}

/// Samples the footprint every millisecond until dropped; `max()` is the highest seen (or
/// noted by the pager itself).
struct FootprintSampler {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<(Stats, u64)>>,
}

impl FootprintSampler {
    fn start(p: &std::sync::Arc<Pager>) -> FootprintSampler {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (p, s) = (p.clone(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut worst = p.stats();
            let mut samples = 0;
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                let st = p.stats();
                samples += 1;
                if st.footprint > worst.footprint {
                    worst = st;
                }
                std::thread::sleep(Duration::from_millis(1));
            }
            (worst, samples)
        });
        FootprintSampler { stop, thread: Some(thread) }
    }

    /// The stats at the highest footprint sampled, and the number of samples.
    fn finish(mut self) -> (Stats, u64) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.thread.take().unwrap().join().unwrap()
    }
}

impl Drop for FootprintSampler {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

/// Stops (SIGSTOP) every server of `c` for `for_ms` when told to, then lets them go on.
fn stall_cluster_on_signal(c: &Cluster, for_ms: u64) -> (std::sync::mpsc::Sender<()>, std::thread::JoinHandle<()>) {
    let pids: Vec<i32> = c
        .ports()
        .map(|pt| {
            std::fs::read_to_string(c.dir.join(pt.to_string()).join("redis.pid")).unwrap().trim().parse().unwrap()
        })
        .collect();
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let h = std::thread::spawn(move || {
        if rx.recv().is_err() {
            return;
        }
        for &pid in &pids {
            // SAFETY: kill(2) on the pid of a redis-server this test started.
            unsafe { libc::kill(pid, libc::SIGSTOP) };
        }
        std::thread::sleep(Duration::from_millis(for_ms));
        for &pid in &pids {
            // SAFETY: as above.
            unsafe { libc::kill(pid, libc::SIGCONT) };
        }
    });
    (tx, h)
}

#[test]
fn the_footprint_stays_under_the_budget_with_only_the_remote_below_the_pool() {
    let c = Cluster::start("footprint", 7260);
    let budget: u64 = 32 << 20;
    // The lab's usama_1g ratios: data 4 x budget, pool limit 1/8 of it; no file tier.
    let cfg = PagerConfig { budget_bytes: budget, pool_max_bytes: Some(budget / 8), ..config(&c, false, 0, 3) };
    let p = std::sync::Arc::new(start(cfg));
    let n = (4 * budget) as usize / PAGE;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    // Every server stops answering for 1.5 s (longer than a round trip's timeout) while a
    // quarter of the data is in: a batch on the wire fails, the remote is marked down and
    // retried; the program waits for room meanwhile instead of growing past the budget.
    let (stall, staller) = stall_cluster_on_signal(&c, 1500);
    let sampler = FootprintSampler::start(&p);
    {
        let mem = r.as_mut_slice();
        for (pg, page) in mem.chunks_exact_mut(PAGE).enumerate() {
            if pg == n / 4 {
                stall.send(()).unwrap();
            }
            page_content(8, pg, false, page);
        }
    }
    staller.join().unwrap();
    let (bad, checked) = mismatches(&r, 8, false, |_| true);
    let (worst, samples) = sampler.finish();
    let st = p.stats();
    let peak = worst.footprint.max(st.counters.footprint_max);
    eprintln!(
        "{samples} samples; footprint peak {:.4} x budget (present {} staged {} pool {} B, remote {}); remote_out {} remote_in {} remote_errors {} throttled_faults {}",
        peak as f64 / budget as f64,
        worst.present_pages,
        worst.staged_pages,
        worst.pool_total_size,
        worst.remote_pages,
        st.counters.remote_out,
        st.counters.remote_in,
        st.counters.remote_errors,
        st.counters.throttled_faults
    );
    assert_eq!((bad, checked), (0, n), "every byte came back");
    assert!(samples > 100, "sampled all along: {samples}");
    assert!(peak as f64 <= 1.05 * budget as f64, "footprint peak {peak} over 1.05 x budget {budget}: {worst:?}");
    assert!(st.counters.remote_errors > 0, "the stall was felt: {st:?}");
    assert!(st.counters.remote_out > 0 && st.counters.remote_in > 0, "{st:?}");
    assert!(st.counters.throttled_faults > 0, "faults waited for room: {st:?}");
    assert_eq!(st.counters.over_budget_events, 0, "the pager never gave up on the budget: {st:?}");
}

/// A primary: port, node id, slot ranges (first, last).
type Primary = (u16, String, Vec<(u16, u16)>);

/// The primaries of `c`.
fn primaries(c: &Cluster) -> Vec<Primary> {
    let nodes = c.cli(c.base, &["cluster", "nodes"]);
    let mut out = Vec::new();
    for line in nodes.lines() {
        let w: Vec<&str> = line.split_whitespace().collect();
        if w.len() < 8 || !w[2].contains("master") || w[2].contains("fail") {
            continue;
        }
        let port: u16 = w[1].split('@').next().unwrap().rsplit(':').next().unwrap().parse().unwrap();
        let ranges = w[8..]
            .iter()
            .filter(|r| !r.starts_with('['))
            .map(|r| match r.split_once('-') {
                Some((a, b)) => (a.parse().unwrap(), b.parse().unwrap()),
                None => (r.parse().unwrap(), r.parse().unwrap()),
            })
            .collect();
        out.push((port, w[0].to_string(), ranges));
    }
    out
}

#[test]
fn pages_come_back_while_their_slot_migrates_between_primaries() {
    use tierswap::backend::resp::key_slot;
    let c = Cluster::start("ask", 7280);
    let p = start(config(&c, false, 0, 3));
    let n = 4096;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    fill(&mut r, 9, false);
    let st = evict_to_writeback(&p);
    assert_eq!(st.remote_pages, n as u64, "every page is remote: {st:?}");

    // The hash slot holding the most of our objects (512 versions share one).
    let mut client = ClusterClient::connect(&c.seeds, Duration::from_secs(2)).unwrap();
    let keys = client.scan_keys(b"ts:*").unwrap();
    assert_eq!(keys.len(), n);
    let mut by_slot: std::collections::BTreeMap<u16, Vec<Vec<u8>>> = Default::default();
    for k in keys {
        by_slot.entry(key_slot(&k)).or_default().push(k);
    }
    let (&slot, slot_keys) = by_slot.iter().max_by_key(|(_, v)| v.len()).unwrap();
    assert!(slot_keys.len() >= 64, "a slot with a batch's objects: {}", slot_keys.len());
    let prim = primaries(&c);
    assert_eq!(prim.len(), 3, "{prim:?}");
    let owns = |ranges: &[(u16, u16)]| ranges.iter().any(|&(a, b)| (a..=b).contains(&slot));
    let (src_port, src_id, _) = prim.iter().find(|(_, _, r)| owns(r)).unwrap().clone();
    let (dst_port, dst_id, _) = prim.iter().find(|(pt, _, _)| *pt != src_port).unwrap().clone();

    // Start moving the slot, and move half its keys: the other half stays on the source,
    // which answers ASK for the moved ones (the slot map still names the source).
    let s = slot.to_string();
    assert_eq!(c.cli(dst_port, &["cluster", "setslot", &s, "importing", &src_id]).trim(), "OK");
    assert_eq!(c.cli(src_port, &["cluster", "setslot", &s, "migrating", &dst_id]).trim(), "OK");
    let moved: Vec<&Vec<u8>> = slot_keys.iter().step_by(2).collect();
    let mut args: Vec<String> = ["migrate", "127.0.0.1", &dst_port.to_string(), "", "0", "5000", "KEYS"]
        .iter()
        .map(|x| x.to_string())
        .collect();
    args.extend(moved.iter().map(|k| String::from_utf8(k.to_vec()).unwrap()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    assert_eq!(c.cli(src_port, &args).trim(), "OK");
    let on = |port: u16| c.cli(port, &["cluster", "countkeysinslot", &s]).trim().parse::<usize>().unwrap();
    assert_eq!(on(dst_port), moved.len(), "the moved keys are on the destination");
    assert_eq!(on(src_port), slot_keys.len() - moved.len(), "the rest is still on the source");
    let ask = c.cli(src_port, &["get", std::str::from_utf8(moved[0]).unwrap()]);
    assert!(ask.contains("ASK"), "the source redirects a moved key: {ask}");

    // Every page reads back, the moved ones through ASK (prefetch and single GETs alike).
    let (bad, checked) = mismatches(&r, 9, false, |_| true);
    let st = p.stats();
    assert_eq!((bad, checked), (0, n), "every byte came back across the migration: {st:?}");
    assert_eq!(st.counters.remote_in, n as u64);
    assert_eq!(st.counters.remote_read_failed, 0);

    // Finish the migration; then new pages round-trip and the pager's cleanup finds every key.
    let mut rest: Vec<String> = ["migrate", "127.0.0.1", &dst_port.to_string(), "", "0", "5000", "KEYS"]
        .iter()
        .map(|x| x.to_string())
        .collect();
    let left = c.cli(src_port, &["cluster", "getkeysinslot", &s, "100000"]);
    rest.extend(left.lines().map(str::to_string).filter(|l| !l.is_empty()));
    if rest.len() > 7 {
        let rest: Vec<&str> = rest.iter().map(String::as_str).collect();
        c.cli(src_port, &rest);
    }
    for port in [dst_port, src_port] {
        assert_eq!(c.cli(port, &["cluster", "setslot", &s, "node", &dst_id]).trim(), "OK");
    }
    fill(&mut r, 10, false);
    let st = evict_to_writeback(&p);
    assert_eq!(st.remote_pages, n as u64);
    let (bad, checked) = mismatches(&r, 10, false, |_| true);
    assert_eq!((bad, checked), (0, n), "every byte came back after the slot moved: {:?}", p.stats());
    fill(&mut r, 11, false);
    evict_to_writeback(&p);
    drop(r);
    drop(p);
    assert_eq!(c.all_keys(), 0, "the pager's keys are gone after it exits");
}

#[test]
fn a_cluster_gone_for_good_without_a_file_tier_costs_the_budget_not_the_program() {
    let c = Cluster::start("gone", 7250);
    let budget: u64 = 32 << 20;
    let cfg = PagerConfig { budget_bytes: budget, pool_max_bytes: Some(budget / 8), ..config(&c, false, 0, 3) };
    let p = std::sync::Arc::new(start(cfg));
    let n_a = 2048;
    let mut a = p.region(n_a * PAGE, Hint::Normal).unwrap();
    fill(&mut a, 12, false);
    let st = evict_to_writeback(&p);
    assert!(st.remote_pages > 0, "{st:?}");
    c.stop();
    let t_stop = Instant::now();

    // Four budgets of new data while no server answers: the pool is the only place for it
    // (about two budgets compressed). Within the grace faults wait for the remote; then
    // the program goes on over budget (counted) instead of hanging.
    let samples = std::sync::Arc::new(std::sync::Mutex::new(Vec::<(Duration, u64)>::new()));
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sampler = {
        let (p, samples, stop) = (p.clone(), samples.clone(), stop.clone());
        std::thread::spawn(move || {
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let f = p.footprint_bytes();
                samples.lock().unwrap().push((t_stop.elapsed(), f));
                std::thread::sleep(Duration::from_millis(1));
            }
        })
    };
    let n_b = (4 * budget) as usize / PAGE;
    let mut b = p.region(n_b * PAGE, Hint::Normal).unwrap();
    fill(&mut b, 13, false);
    let filled = t_stop.elapsed();
    let (bad, checked) = mismatches(&b, 13, false, |_| true);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sampler.join().unwrap();
    let st = p.stats();
    let samples = samples.lock().unwrap();
    let grace = tierswap::backend::remote::WRITE_GRACE;
    let within: u64 = samples.iter().filter(|(t, _)| *t < grace).map(|&(_, f)| f).max().unwrap();
    let after: u64 = samples.iter().map(|&(_, f)| f).max().unwrap();
    eprintln!(
        "filled in {filled:?}; footprint within the grace {:.3} x budget, afterwards {:.3}; over_budget_events {}",
        within as f64 / budget as f64,
        after as f64 / budget as f64,
        st.counters.over_budget_events
    );
    assert_eq!((bad, checked), (0, n_b), "every byte of the new data came back");
    assert!(filled >= grace, "faults waited for the remote through the grace: {filled:?}");
    assert!(filled < grace + Duration::from_secs(30), "then the program went on: {filled:?}");
    assert!(within as f64 <= 1.05 * budget as f64, "within the grace the budget held: {within}");
    assert!(after > budget, "afterwards the data (two budgets compressed) is over it: {after}");
    assert!(st.counters.over_budget_events > 0, "going over budget is counted: {st:?}");
    drop(a);
}

#[test]
fn pages_read_from_a_failing_remote_are_not_left_there_alone() {
    let c = Cluster::start("clean", 7270);
    let p = start(config(&c, false, 0, 3));
    let n = 2048;
    let mut a = p.region(n * PAGE, Hint::Normal).unwrap();
    fill(&mut a, 14, false);
    let st = evict_to_writeback(&p);
    assert_eq!(st.remote_pages, n as u64, "{st:?}");
    // B waits in the pool (under its limit) for a writeback that will fail.
    let mut b = p.region(n * PAGE, Hint::Normal).unwrap();
    fill(&mut b, 15, false);
    p.evict_all();
    assert!(p.stats().pool_stored_pages > 0);
    // A is read back (not written): a clean page may keep its remote slot, so that
    // evicting it again costs nothing while the remote is well.
    assert_eq!(mismatches(&a, 14, false, |_| true), (0, n));
    c.stop();
    // A writeback batch of B finds the cluster gone: the remote counts as failing now.
    assert_eq!(p.writeback_now(), 0, "nothing can be written back with the cluster down");
    assert!(p.stats().counters.remote_errors > 0);
    // Evicting A again must not leave the remote as its only copy.
    p.evict_all();
    let (bad_a, checked_a) = mismatches(&a, 14, false, |_| true);
    let (bad_b, checked_b) = mismatches(&b, 15, false, |_| true);
    let st = p.stats();
    assert_eq!((bad_a, checked_a, bad_b, checked_b), (0, n, 0, n), "{st:?}");
    assert_eq!(st.counters.remote_read_failed, 0, "no page needed the remote: {st:?}");
}
