//! The programs lab's client: connections that speak each program's protocol behind one
//! trait, the load, and the timed phase — a fixed number of requests over a few
//! connections, every value read back compared with what the client knows the key holds,
//! every request's latency kept.
//!
//! Owns: [`Conn`], [`Versions`], [`run_phase`]. Calls: keys.rs for values and keys.

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::{Barrier, Mutex};
use std::time::{Duration, Instant};

use serde::Serialize;

use super::keys::{value_of, KeyChooser, Rng};

/// One connection to a program: the requests the lab makes, in the program's protocol.
pub trait Conn: Send {
    /// Reads key `idx` into `out`; false when the program has no such key.
    fn get(&mut self, idx: u64, out: &mut Vec<u8>) -> std::io::Result<bool>;
    /// Stores `value` under key `idx`, waiting for the program's answer.
    fn set(&mut self, idx: u64, value: &[u8]) -> std::io::Result<()>;
    /// Stores keys `first..first + count` at version 0, pipelined as the protocol allows.
    fn load(&mut self, first: u64, count: u64, value_bytes: usize) -> std::io::Result<()>;
}

/// Which version of its value every key holds: a SET writes the next version, a GET accepts
/// any version a SET racing with it could have left (a key's SETs are serialized by its
/// stripe lock, and its version moves on only once the program has answered).
pub struct Versions {
    by_key: Vec<AtomicU32>,
    stripes: Vec<Mutex<()>>,
}

impl Versions {
    /// Every key of `n` at version 0.
    pub fn new(n: u64) -> Versions {
        Versions {
            by_key: (0..n).map(|_| AtomicU32::new(0)).collect(),
            stripes: (0..1024).map(|_| Mutex::new(())).collect(),
        }
    }

    fn get(&self, idx: u64) -> u32 {
        self.by_key[idx as usize].load(Ordering::Acquire)
    }
}

/// What a phase does.
#[derive(Clone, Debug)]
pub struct PhaseSpec {
    /// Requests timed, over all connections.
    pub requests: u64,
    /// Requests made before the clock starts (verified too), over all connections.
    pub warmup: u64,
    /// Percent of requests that are SETs (the rest GETs).
    pub set_percent: u32,
    /// Bytes per value.
    pub value_bytes: usize,
    /// Seed of the request streams (each connection derives its own).
    pub seed: u64,
}

/// What a phase measured.
#[derive(Clone, Debug, Default, Serialize)]
pub struct PhaseOutcome {
    /// Requests timed.
    pub requests: u64,
    /// Of those, GETs.
    pub gets: u64,
    /// Of those, SETs.
    pub sets: u64,
    /// Seconds from the common start to the last connection's last answer.
    pub elapsed_s: f64,
    /// Requests per second.
    pub throughput_rps: f64,
    /// Latency percentiles of the timed requests, µs.
    pub p50_us: f64,
    /// See `p50_us`.
    pub p99_us: f64,
    /// See `p50_us`.
    pub p999_us: f64,
    /// Largest latency, µs.
    pub max_us: f64,
    /// Values read (warm-up included) that were neither the loaded nor a written version,
    /// or were missing.
    pub mismatches: u64,
    /// Values read and compared, warm-up included.
    pub values_verified: u64,
    /// CPU seconds the client's connection threads used in the timed part.
    pub client_cpu_s: f64,
    /// Requests the client could make per CPU second of its own: above the program's
    /// throughput, the client is not what limits it.
    pub client_capacity_rps: f64,
}

fn thread_cpu_s() -> f64 {
    // SAFETY: getrusage fills the struct we pass; RUSAGE_THREAD is this thread.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: as above; `ru` is a valid, writable rusage.
    if unsafe { libc::getrusage(libc::RUSAGE_THREAD, &mut ru) } != 0 {
        return 0.0;
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    tv(ru.ru_utime) + tv(ru.ru_stime)
}

/// The `p`-th percentile (0..100) of sorted `ns`, in µs (nearest rank).
fn percentile_us(sorted_ns: &[u64], p: f64) -> f64 {
    if sorted_ns.is_empty() {
        return 0.0;
    }
    // The small epsilon keeps 99.9 % of 1000 at rank 999 despite binary fractions.
    let rank = ((p / 100.0) * sorted_ns.len() as f64 - 1e-9).ceil() as usize;
    sorted_ns[rank.clamp(1, sorted_ns.len()) - 1] as f64 / 1000.0
}

/// What one connection's thread brings back.
#[derive(Default)]
struct ThreadOutcome {
    lat_ns: Vec<u64>,
    gets: u64,
    sets: u64,
    mismatches: u64,
    verified: u64,
    elapsed: Duration,
    cpu_s: f64,
}

/// One request: a GET verified against `versions`, or a SET of the key's next version.
#[allow(clippy::too_many_arguments)]
fn one_request(
    conn: &mut dyn Conn,
    versions: &Versions,
    idx: u64,
    is_set: bool,
    value_bytes: usize,
    got: &mut Vec<u8>,
    want: &mut Vec<u8>,
    out: &mut ThreadOutcome,
    timed: bool,
) -> std::io::Result<()> {
    if is_set {
        let _stripe =
            versions.stripes[(idx % versions.stripes.len() as u64) as usize].lock().unwrap_or_else(|e| e.into_inner());
        let next = versions.get(idx) + 1;
        value_of(idx, next, value_bytes, want);
        let t0 = Instant::now();
        conn.set(idx, want)?;
        let ns = t0.elapsed().as_nanos() as u64;
        versions.by_key[idx as usize].store(next, Ordering::Release);
        if timed {
            out.lat_ns.push(ns);
            out.sets += 1;
        }
        return Ok(());
    }
    let before = versions.get(idx);
    let t0 = Instant::now();
    let found = conn.get(idx, got)?;
    let ns = t0.elapsed().as_nanos() as u64;
    let after = versions.get(idx);
    if timed {
        out.lat_ns.push(ns);
        out.gets += 1;
    }
    out.verified += 1;
    // A SET of this key may have been applied but not yet answered: one past `after`.
    let ok = found
        && (before..=after.saturating_add(1)).any(|v| {
            value_of(idx, v, value_bytes, want);
            *got == *want
        });
    if !ok {
        out.mismatches += 1;
    }
    Ok(())
}

/// Runs one phase on `conns` (one thread each): `spec.warmup` requests, then
/// `spec.requests` timed ones, keys from `chooser`. Stops early (an error) when `stop` is set.
pub fn run_phase(
    conns: &mut [Box<dyn Conn>],
    versions: &Versions,
    chooser: &KeyChooser,
    spec: &PhaseSpec,
    stop: &(dyn Fn() -> bool + Sync),
) -> std::io::Result<PhaseOutcome> {
    let n_conns = conns.len().max(1) as u64;
    let barrier = Barrier::new(conns.len());
    let abort = AtomicBool::new(false);
    let results: Vec<std::io::Result<ThreadOutcome>> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .enumerate()
            .map(|(i, conn)| {
                let (barrier, abort) = (&barrier, &abort);
                let share = |total: u64| total / n_conns + u64::from((i as u64) < total % n_conns);
                let (warm, timed) = (share(spec.warmup), share(spec.requests));
                s.spawn(move || -> std::io::Result<ThreadOutcome> {
                    let mut rng = Rng::new(spec.seed.wrapping_mul(0x100_0000_01B3) ^ (i as u64 + 1));
                    let mut out = ThreadOutcome { lat_ns: Vec::with_capacity(timed as usize), ..Default::default() };
                    let (mut got, mut want) = (Vec::new(), Vec::new());
                    let mut step = |out: &mut ThreadOutcome, timed: bool, rng: &mut Rng| {
                        let idx = chooser.next(rng);
                        let is_set = rng.below(100) < spec.set_percent as u64;
                        one_request(
                            &mut **conn,
                            versions,
                            idx,
                            is_set,
                            spec.value_bytes,
                            &mut got,
                            &mut want,
                            out,
                            timed,
                        )
                    };
                    let mut res = Ok(());
                    for k in 0..warm {
                        if k % 1024 == 0 && (abort.load(Ordering::Relaxed) || stop()) {
                            abort.store(true, Ordering::Relaxed);
                            break;
                        }
                        if let Err(e) = step(&mut out, false, &mut rng) {
                            abort.store(true, Ordering::Relaxed);
                            res = Err(e);
                            break;
                        }
                    }
                    // Everyone waits here, a failed thread too, so nobody waits forever.
                    barrier.wait();
                    res?;
                    let (t0, cpu0) = (Instant::now(), thread_cpu_s());
                    for k in 0..timed {
                        if k % 1024 == 0 && (abort.load(Ordering::Relaxed) || stop()) {
                            abort.store(true, Ordering::Relaxed);
                            return Err(std::io::Error::other("interrupted"));
                        }
                        if let Err(e) = step(&mut out, true, &mut rng) {
                            abort.store(true, Ordering::Relaxed);
                            return Err(e);
                        }
                    }
                    out.elapsed = t0.elapsed();
                    out.cpu_s = thread_cpu_s() - cpu0;
                    Ok(out)
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("a client thread panicked"))))
            .collect()
    });
    let mut all = PhaseOutcome::default();
    let mut lat = Vec::with_capacity(spec.requests as usize);
    let mut elapsed = Duration::ZERO;
    for r in results {
        let t = r?;
        all.gets += t.gets;
        all.sets += t.sets;
        all.mismatches += t.mismatches;
        all.values_verified += t.verified;
        all.client_cpu_s += t.cpu_s;
        elapsed = elapsed.max(t.elapsed);
        lat.extend(t.lat_ns);
    }
    if abort.load(Ordering::Relaxed) {
        return Err(std::io::Error::other("interrupted"));
    }
    lat.sort_unstable();
    all.requests = lat.len() as u64;
    all.elapsed_s = elapsed.as_secs_f64();
    all.throughput_rps = all.requests as f64 / all.elapsed_s.max(1e-9);
    all.p50_us = percentile_us(&lat, 50.0);
    all.p99_us = percentile_us(&lat, 99.0);
    all.p999_us = percentile_us(&lat, 99.9);
    all.max_us = lat.last().map_or(0.0, |&ns| ns as f64 / 1000.0);
    all.client_capacity_rps = all.requests as f64 / all.client_cpu_s.max(1e-9);
    Ok(all)
}

/// Loads keys `0..n` through `conn` in batches of `batch`, calling `tick` with the keys done.
pub fn load_all(
    conn: &mut dyn Conn,
    n: u64,
    value_bytes: usize,
    batch: u64,
    stop: &dyn Fn() -> bool,
    tick: &dyn Fn(u64),
) -> std::io::Result<()> {
    load_range(conn, 0..n, value_bytes, batch, stop, &|_, through| tick(through))
}

/// Loads keys `keys` through `conn` in batches of `batch`, calling `loaded(count, through)`
/// after each batch (`count` keys, the last one below `through`); stops with an error when
/// `stop` says so.
fn load_range(
    conn: &mut dyn Conn,
    keys: std::ops::Range<u64>,
    value_bytes: usize,
    batch: u64,
    stop: &dyn Fn() -> bool,
    loaded: &dyn Fn(u64, u64),
) -> std::io::Result<()> {
    let mut k = keys.start;
    while k < keys.end {
        if stop() {
            return Err(std::io::Error::other("interrupted"));
        }
        let count = batch.min(keys.end - k);
        conn.load(k, count, value_bytes)?;
        k += count;
        loaded(count, k);
    }
    Ok(())
}

/// Loads keys `0..n` over every connection at once, each a contiguous share in batches of
/// `batch` (for servers with threads of their own: the load's faults overlap).
pub fn load_parallel(
    conns: &mut [Box<dyn Conn>],
    n: u64,
    value_bytes: usize,
    batch: u64,
    stop: &(dyn Fn() -> bool + Sync),
    tick: &(dyn Fn(u64) + Sync),
) -> std::io::Result<()> {
    let parts = conns.len().max(1) as u64;
    let done = std::sync::atomic::AtomicU64::new(0);
    let results: Vec<std::io::Result<()>> = std::thread::scope(|s| {
        let handles: Vec<_> = conns
            .iter_mut()
            .enumerate()
            .map(|(i, conn)| {
                let done = &done;
                let (first, end) = (n * i as u64 / parts, n * (i as u64 + 1) / parts);
                s.spawn(move || {
                    load_range(conn.as_mut(), first..end, value_bytes, batch, stop, &|count, _| {
                        tick(done.fetch_add(count, Ordering::Relaxed) + count)
                    })
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap_or_else(|_| Err(std::io::Error::other("a loading thread panicked"))))
            .collect()
    });
    results.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::programs::keys::Distribution;
    use std::collections::HashMap;
    use std::sync::Arc;

    /// A program in memory: a map shared by the connections; `corrupt` flips one stored byte.
    #[derive(Clone)]
    struct Fake {
        map: Arc<Mutex<HashMap<u64, Vec<u8>>>>,
    }

    impl Conn for Fake {
        fn get(&mut self, idx: u64, out: &mut Vec<u8>) -> std::io::Result<bool> {
            match self.map.lock().unwrap().get(&idx) {
                Some(v) => {
                    out.clear();
                    out.extend_from_slice(v);
                    Ok(true)
                }
                None => Ok(false),
            }
        }
        fn set(&mut self, idx: u64, value: &[u8]) -> std::io::Result<()> {
            self.map.lock().unwrap().insert(idx, value.to_vec());
            Ok(())
        }
        fn load(&mut self, first: u64, count: u64, value_bytes: usize) -> std::io::Result<()> {
            let mut v = Vec::new();
            for k in first..first + count {
                value_of(k, 0, value_bytes, &mut v);
                self.set(k, &v)?;
            }
            Ok(())
        }
    }

    #[test]
    fn a_phase_verifies_every_read_and_catches_a_bad_value() {
        let fake = Fake { map: Arc::new(Mutex::new(HashMap::new())) };
        let n = 500;
        let mut conns: Vec<Box<dyn Conn>> = (0..3).map(|_| Box::new(fake.clone()) as Box<dyn Conn>).collect();
        load_all(&mut *conns[0], n, 64, 64, &|| false, &|_| {}).unwrap();
        let versions = Versions::new(n);
        let spec = PhaseSpec { requests: 3000, warmup: 300, set_percent: 10, value_bytes: 64, seed: 1 };
        let chooser = KeyChooser::new(n, Distribution::Zipfian);
        let out = run_phase(&mut conns, &versions, &chooser, &spec, &|| false).unwrap();
        assert_eq!(out.requests, 3000);
        assert_eq!(out.gets + out.sets, 3000);
        assert!(out.sets > 150 && out.sets < 450, "about 10 % SETs: {}", out.sets);
        assert_eq!(out.mismatches, 0);
        assert!(out.values_verified >= out.gets && out.values_verified <= out.gets + 300, "warm-up GETs verified too");
        assert!(out.p50_us <= out.p99_us && out.p99_us <= out.p999_us && out.p999_us <= out.max_us);
        // One stored value goes bad: the reads of it are counted.
        fake.map.lock().unwrap().values_mut().for_each(|v| v[0] ^= 1);
        let spec = PhaseSpec { set_percent: 0, ..spec };
        let out = run_phase(&mut conns, &versions, &chooser, &spec, &|| false).unwrap();
        assert_eq!(out.mismatches, out.values_verified, "every value was corrupted");
    }

    #[test]
    fn a_parallel_load_stores_every_key_once() {
        let fake = Fake { map: Arc::new(Mutex::new(HashMap::new())) };
        let mut conns: Vec<Box<dyn Conn>> = (0..3).map(|_| Box::new(fake.clone()) as Box<dyn Conn>).collect();
        let last = AtomicU32::new(0);
        load_parallel(&mut conns, 1001, 16, 50, &|| false, &|i| {
            last.fetch_max(i as u32, Ordering::Relaxed);
        })
        .unwrap();
        assert_eq!(last.load(Ordering::Relaxed), 1001);
        let map = fake.map.lock().unwrap();
        assert_eq!(map.len(), 1001);
        let mut want = Vec::new();
        for k in 0..1001 {
            value_of(k, 0, 16, &mut want);
            assert_eq!(map[&k], want);
        }
    }

    #[test]
    fn a_stop_ends_the_phase_with_an_error() {
        let fake = Fake { map: Arc::new(Mutex::new(HashMap::new())) };
        let mut conns: Vec<Box<dyn Conn>> = vec![Box::new(fake)];
        let versions = Versions::new(10);
        let spec = PhaseSpec { requests: 10_000, warmup: 0, set_percent: 0, value_bytes: 8, seed: 1 };
        let chooser = KeyChooser::new(10, Distribution::Uniform);
        assert!(run_phase(&mut conns, &versions, &chooser, &spec, &|| true).is_err());
    }

    #[test]
    fn percentiles_by_nearest_rank() {
        let ns: Vec<u64> = (1..=1000).map(|i| i * 1000).collect();
        assert_eq!(percentile_us(&ns, 50.0), 500.0);
        assert_eq!(percentile_us(&ns, 99.0), 990.0);
        assert_eq!(percentile_us(&ns, 99.9), 999.0);
        assert_eq!(percentile_us(&[], 50.0), 0.0);
    }
}
