//! The remote tier: pool objects written back to a Redis / Valkey cluster, still
//! compressed, sealed exactly like the file tier's records (AES-256-GCM under a key of
//! this tier's own that never leaves the process), so the store never sees plaintext.
//!
//! Every write of a page gets a fresh version from a counter that never repeats under the
//! key; the version lives in the swap entry (`| codec (1) | version (38) | length - 1 (12) |`), names
//! the object and goes into the seal:
//! ```text
//!  key   : ts:{<pager id, 16 hex>.<version / 512, hex>}<version % 512, hex>
//!  value : | GCM tag (16 B)      | ciphertext (len B) | pad→16 |
//!  nonce : | version (u64 LE) | 0xFFFF_FFFF |      (never stored)
//!  AAD   : | slot | len | u64::MAX | version |     (never stored; u64::MAX: "remote")
//! ```
//! An object moved to another key, an older object for the same slot (replay), or any
//! flipped bit does not open. The hash tag puts 512 consecutive versions (one writeback
//! batch, pages evicted together) in one cluster slot; batches spread over the primaries.
//!
//! Writes are batches: every SET of a batch for one node is pipelined with a `PX` TTL
//! (the backstop for a pager that dies without cleaning up) and, with `replicas > 0`, a
//! `WAIT replicas timeout`: a batch is done only when every node acknowledged it durable
//! as configured. Freed objects are deleted in batches; at exit the pager's keys are
//! found with SCAN and deleted. Reads retry with backoff ([`RemoteTier::get`]).
//!
//! Owns: the cluster clients, the tier's key, the version counter. Calls:
//! [`super::resp`], [`super::file::Sealer`].

use std::io::Write as _;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::file::{record_bytes, FileError, RecordPlace, Sealer};
use super::resp::{ClusterClient, Cmd, Reply, RespError};
use crate::backend::ADDR_BITS;
use crate::config::RemoteConfig;
use crate::page::PAGE_SIZE;
use crate::stats::Counters;

/// Longest key: "ts:{" 16 ".", 10 "}" 3.
const KEY_BYTES: usize = 40;
/// Deletes queued before the writeback thread is asked to send them.
pub const DELETE_BATCH: usize = 1024;
/// How long writeback leaves the remote alone after a failed batch.
const DOWN_BACKOFF: Duration = Duration::from_secs(1);
/// How long a remote that fails every write is still counted on to come back: the pager
/// keeps the budget (faults wait for writeback) this long into an outage, then goes over
/// it rather than hang the program (see [`RemoteTier::retrying`]).
pub const WRITE_GRACE: Duration = Duration::from_secs(10);
/// Largest retry wait of a fault.
const MAX_BACKOFF: Duration = Duration::from_secs(1);
/// The file offset field of a remote record's AAD: no file record has it.
const REMOTE_MARKER: u64 = u64::MAX;

/// A remote tier error.
#[derive(Debug, thiserror::Error)]
pub enum RemoteError {
    /// The cluster did not answer, or not durably enough.
    #[error("{0}")]
    Store(#[from] RespError),
    /// A SET was refused.
    #[error("remote store refused a write: {0}")]
    Refused(String),
    /// The object is gone (expired, deleted, or lost in a failover without replicas).
    #[error("remote object for slot {slot} (version {version}) does not exist")]
    Missing {
        /// The slot.
        slot: u64,
        /// The version the swap entry expects.
        version: u64,
    },
    /// The object did not open: tampered with, replayed or moved.
    #[error("remote object for slot {slot}: {source}")]
    Corrupt {
        /// The slot.
        slot: u64,
        /// What the seal said.
        source: FileError,
    },
    /// The version counter ran out (2^38 writes under one key).
    #[error("the remote tier's version counter is exhausted; restart the pager for a new key")]
    CounterExhausted,
}

impl RemoteError {
    /// Whether trying again later may succeed.
    pub fn is_transient(&self) -> bool {
        matches!(self, RemoteError::Store(RespError::Io { .. } | RespError::Down(_) | RespError::Server { .. }))
    }
}

/// Most objects one prefetch fetches (the largest swap-in).
pub const PREFETCH_MAX: usize = crate::config::MAX_SWAPIN_PAGES as usize;
/// Bytes per object in a prefetch buffer: the largest record.
const PREFETCH_STRIDE: usize = record_bytes(PAGE_SIZE);

/// A fault thread's buffer of objects fetched for one swap-in range
/// ([`RemoteTier::prefetch`]), allocated once, sized for the largest swap-in.
pub struct RemotePrefetch {
    n: usize,
    versions: Vec<u64>,
    lens: Vec<usize>,
    got: Vec<Option<usize>>,
    keys: Vec<[u8; KEY_BYTES]>,
    key_lens: Vec<usize>,
    buf: Vec<u8>,
}

impl RemotePrefetch {
    /// A buffer for ranges of up to `max_pages` pages (0 when the pager has no remote
    /// tier: the buffer then takes no memory and prefetches nothing).
    pub fn new(max_pages: usize) -> RemotePrefetch {
        let m = max_pages.min(PREFETCH_MAX);
        RemotePrefetch {
            n: 0,
            versions: vec![0; m],
            lens: vec![0; m],
            got: vec![None; m],
            keys: vec![[0u8; KEY_BYTES]; m],
            key_lens: vec![0; m],
            buf: vec![0u8; m * PREFETCH_STRIDE],
        }
    }

    /// Forgets what it holds.
    pub fn clear(&mut self) {
        self.n = 0;
    }

    /// Whether it holds the object of `version`.
    pub fn holds(&self, version: u64) -> bool {
        self.versions[..self.n].iter().zip(&self.got).any(|(&v, g)| v == version && g.is_some())
    }
}

/// A writeback batch in flight, see [`RemoteTier::batch_started`].
pub struct BatchInFlight<'a>(&'a AtomicU64);

impl Drop for BatchInFlight<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A client and its read buffer, lent to one thread at a time.
struct Lent {
    client: ClusterClient,
    rec: Vec<u8>,
}

/// The remote tier of one pager.
pub struct RemoteTier {
    cfg: RemoteConfig,
    pager_id: u64,
    sealer: Sealer,
    next_version: AtomicU64,
    idle: Mutex<Vec<Lent>>,
    pending_del: Mutex<Vec<u64>>,
    health: Mutex<Health>,
    live_objects: AtomicU64,
    /// Writeback batches on the wire now.
    batches_in_flight: AtomicU64,
}

/// What the last round trips said about the store.
#[derive(Default)]
struct Health {
    /// Writeback leaves the remote alone until then (a round trip failed).
    down_until: Option<Instant>,
    /// The first failure since the last batch written: the outage's start.
    failing_since: Option<Instant>,
}

impl std::fmt::Debug for RemoteTier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RemoteTier({:016x} on {:?})", self.pager_id, self.cfg.seeds)
    }
}

impl RemoteTier {
    /// Connects to the cluster (one client, to check the seeds now rather than at the
    /// first writeback) and draws the tier's key and pager id.
    pub fn connect(cfg: &RemoteConfig) -> Result<RemoteTier, RemoteError> {
        let client = ClusterClient::connect(&cfg.seeds, Duration::from_millis(cfg.timeout_ms))?;
        let sealer = Sealer::new(true).map_err(|e| RespError::Down(format!("cannot draw the remote key: {e}")))?;
        let mut id = [0u8; 8];
        getrandom::fill(&mut id).map_err(|e| RespError::Down(format!("cannot draw a pager id: {e}")))?;
        Ok(RemoteTier {
            cfg: cfg.clone(),
            pager_id: u64::from_le_bytes(id),
            sealer,
            next_version: AtomicU64::new(1),
            idle: Mutex::new(vec![Lent { client, rec: vec![0u8; record_bytes(PAGE_SIZE)] }]),
            pending_del: Mutex::new(Vec::with_capacity(2 * DELETE_BATCH)),
            health: Mutex::new(Health::default()),
            live_objects: AtomicU64::new(0),
            batches_in_flight: AtomicU64::new(0),
        })
    }

    /// The random id naming this pager's keys.
    pub fn pager_id(&self) -> u64 {
        self.pager_id
    }

    /// Objects the tier holds for this pager.
    pub fn live_objects(&self) -> u64 {
        self.live_objects.load(Ordering::Relaxed)
    }

    /// The key of `version`, written into `buf`; returns its length.
    fn key(&self, version: u64, buf: &mut [u8; KEY_BYTES]) -> usize {
        let mut w = &mut buf[..];
        let _ = write!(w, "ts:{{{:016x}.{:x}}}{:x}", self.pager_id, version >> 9, version & 511);
        KEY_BYTES - w.len()
    }

    /// The SCAN pattern of every key of this pager.
    fn key_pattern(&self) -> Vec<u8> {
        format!("ts:{{{:016x}.*", self.pager_id).into_bytes()
    }

    fn place(slot: u64, len: usize, version: u64) -> RecordPlace {
        // idx_in_unit u32::MAX keeps the nonce apart from any file nonce shape; the key is
        // this tier's own anyway.
        RecordPlace { slot, len_bytes: len, offset: REMOTE_MARKER, idx_in_unit: u32::MAX, generation: version }
    }

    /// Whether writeback should skip the remote for now (a recent batch failed).
    pub fn is_down(&self) -> bool {
        let h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        matches!(h.down_until, Some(t) if Instant::now() < t)
    }

    /// Whether the remote is failing but still counted on: its writes have failed for less
    /// than [`WRITE_GRACE`], and writeback tries it again every second. A failover or a
    /// restart of a node fits in that; a cluster gone for longer does not, and the pager
    /// then stops holding the program to the budget for it.
    pub fn retrying(&self) -> bool {
        let h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        matches!(h.failing_since, Some(t) if t.elapsed() < WRITE_GRACE)
    }

    /// Whether a writeback batch is being made or is on the wire now: its pool objects are
    /// freed when the store acknowledges it.
    pub fn batch_in_flight(&self) -> bool {
        self.batches_in_flight.load(Ordering::Acquire) > 0
    }

    /// Counts a writeback batch in flight until the guard is dropped (from claiming its
    /// objects to freeing them).
    pub fn batch_started(&self) -> BatchInFlight<'_> {
        self.batches_in_flight.fetch_add(1, Ordering::AcqRel);
        BatchInFlight(&self.batches_in_flight)
    }

    /// Whether no round trip has failed since the last batch written.
    pub fn healthy(&self) -> bool {
        self.health.lock().unwrap_or_else(|e| e.into_inner()).failing_since.is_none()
    }

    fn mark_down(&self) {
        let mut h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        let now = Instant::now();
        h.down_until = Some(now + DOWN_BACKOFF);
        h.failing_since.get_or_insert(now);
    }

    /// Ends an outage: a batch was written ([`RemoteTier::put_batch`] leaves this to its
    /// caller, which first says writeback works again, so nobody sees a healthy remote
    /// whose writeback still counts as failing). Returns how long the outage it ended
    /// lasted, if there was one.
    pub fn mark_written(&self) -> Option<Duration> {
        let mut h = self.health.lock().unwrap_or_else(|e| e.into_inner());
        h.down_until = None;
        h.failing_since.take().map(|t| t.elapsed())
    }

    fn lend(&self) -> Result<Lent, RemoteError> {
        if let Some(l) = self.idle.lock().unwrap_or_else(|e| e.into_inner()).pop() {
            return Ok(l);
        }
        let client = ClusterClient::connect(&self.cfg.seeds, Duration::from_millis(self.cfg.timeout_ms))?;
        Ok(Lent { client, rec: vec![0u8; record_bytes(PAGE_SIZE)] })
    }

    fn give_back(&self, l: Lent) {
        self.idle.lock().unwrap_or_else(|e| e.into_inner()).push(l);
    }

    /// Writes `items` (slot, compressed payload) as one batch: one pipelined round trip
    /// per node, `WAIT` included when replicas are asked for. Returns each item's version
    /// once every object is acknowledged (and durable as configured). On error nothing
    /// counts as written; objects a node may have taken are queued for deletion, and
    /// writeback leaves the remote alone for a moment. On success the caller ends any
    /// outage with [`RemoteTier::mark_written`].
    pub fn put_batch(&self, items: &[(u64, &[u8])], counters: &Counters) -> Result<Vec<u64>, RemoteError> {
        let n = items.len() as u64;
        let first = self.next_version.fetch_add(n, Ordering::Relaxed);
        if first + n >= 1 << ADDR_BITS {
            return Err(RemoteError::CounterExhausted);
        }
        let mut keys = vec![[0u8; KEY_BYTES]; items.len()];
        let mut key_lens = Vec::with_capacity(items.len());
        let mut values: Vec<Vec<u8>> = Vec::with_capacity(items.len());
        for (i, &(slot, payload)) in items.iter().enumerate() {
            let version = first + i as u64;
            key_lens.push(self.key(version, &mut keys[i]));
            let mut rec = vec![0u8; record_bytes(payload.len())];
            rec[16..16 + payload.len()].copy_from_slice(payload);
            self.sealer
                .seal_record(&mut rec, &Self::place(slot, payload.len(), version))
                .map_err(|source| RemoteError::Corrupt { slot, source })?;
            values.push(rec);
        }
        let ttl = self.cfg.ttl_ms.to_string();
        let cmds: Vec<Cmd<'_>> = (0..items.len())
            .map(|i| {
                let key = &keys[i][..key_lens[i]];
                Cmd { key, args: vec![b"SET", key, &values[i], b"PX", ttl.as_bytes()] }
            })
            .collect();
        let wait = (self.cfg.replicas > 0).then_some((self.cfg.replicas, self.cfg.timeout_ms));
        let mut lent = self.lend().inspect_err(|_| {
            counters.remote_errors.fetch_add(1, Ordering::Relaxed);
            self.mark_down();
        })?;
        let t0 = Instant::now();
        let res = lent.client.pipeline(&cmds, wait);
        let us = t0.elapsed().as_micros() as u64;
        self.give_back(lent);
        let res = res.map_err(RemoteError::from).and_then(|replies| {
            match replies.iter().find(|r| !matches!(r, Reply::Status(s) if s == "OK")) {
                Some(r) => Err(RemoteError::Refused(format!("{r:?}"))),
                None => Ok(()),
            }
        });
        match res {
            Ok(()) => {
                counters.record_remote_latency(us);
                counters.remote_round_trips.fetch_add(1, Ordering::Relaxed);
                counters.remote_out.fetch_add(n, Ordering::Relaxed);
                counters.remote_bytes.fetch_add(items.iter().map(|(_, p)| p.len() as u64).sum(), Ordering::Relaxed);
                self.live_objects.fetch_add(n, Ordering::Relaxed);
                Ok((first..first + n).collect())
            }
            Err(e) => {
                counters.remote_errors.fetch_add(1, Ordering::Relaxed);
                self.mark_down();
                // Some nodes may hold objects of the failed batch: not ours to keep.
                let mut q = self.pending_del.lock().unwrap_or_else(|e| e.into_inner());
                q.extend(first..first + n);
                Err(e)
            }
        }
    }

    /// Reads the object of `slot` at `version` (`len` payload bytes) into `out[..len]`,
    /// opening its seal. A transient failure is retried `fault_tries` times in all, waiting
    /// `retry_backoff_ms` before the second try and twice as long before each further one.
    /// A missing or corrupt object is not retried.
    pub fn get(
        &self,
        slot: u64,
        version: u64,
        len: usize,
        out: &mut [u8],
        counters: &Counters,
    ) -> Result<(), RemoteError> {
        let mut key = [0u8; KEY_BYTES];
        let klen = self.key(version, &mut key);
        let mut backoff = Duration::from_millis(self.cfg.retry_backoff_ms);
        let mut tries = 0;
        loop {
            tries += 1;
            let res = self.get_once(slot, version, len, &key[..klen], out, counters);
            match res {
                Ok(()) => return Ok(()),
                Err(e) if e.is_transient() && tries < self.cfg.fault_tries => {
                    counters.remote_errors.fetch_add(1, Ordering::Relaxed);
                    std::thread::sleep(backoff);
                    backoff = (backoff * 2).min(MAX_BACKOFF);
                }
                Err(e) => {
                    counters.remote_errors.fetch_add(1, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
    }

    fn get_once(
        &self,
        slot: u64,
        version: u64,
        len: usize,
        key: &[u8],
        out: &mut [u8],
        counters: &Counters,
    ) -> Result<(), RemoteError> {
        let mut lent = self.lend()?;
        let t0 = Instant::now();
        let got = lent.client.get_into(key, &mut lent.rec);
        let us = t0.elapsed().as_micros() as u64;
        let res = match got {
            Ok(Some(n)) if n == record_bytes(len) => {
                counters.record_remote_latency(us);
                counters.remote_round_trips.fetch_add(1, Ordering::Relaxed);
                self.sealer
                    .open_record(&lent.rec[..n], &Self::place(slot, len, version), out)
                    .map_err(|source| RemoteError::Corrupt { slot, source })
            }
            Ok(Some(_)) => Err(RemoteError::Corrupt {
                slot,
                source: FileError::Corrupt {
                    offset: REMOTE_MARKER,
                    slot,
                    what: "object length differs from the swap entry",
                },
            }),
            Ok(None) => Err(RemoteError::Missing { slot, version }),
            Err(e) => Err(e.into()),
        };
        self.give_back(lent);
        res
    }

    /// Fetches the objects of `wants` (version, payload length) in one pipelined round
    /// trip per node into `pf`, for a swap-in of a range: the pages' own reads then find
    /// them there ([`RemoteTier::get_prefetched`]). Best effort: whatever is missing or
    /// fails here is read (and retried) one by one later. Nothing is opened yet: each page
    /// is authenticated when its locked swap entry asks for it.
    pub fn prefetch(&self, wants: &[(u64, usize)], pf: &mut RemotePrefetch, counters: &Counters) {
        pf.n = 0;
        let n = wants.len().min(pf.versions.len());
        if n == 0 || self.is_down() {
            return;
        }
        for (i, &(version, len)) in wants[..n].iter().enumerate() {
            pf.versions[i] = version;
            pf.lens[i] = len;
            pf.key_lens[i] = self.key(version, &mut pf.keys[i]);
        }
        let mut key_refs: [&[u8]; PREFETCH_MAX] = [&[]; PREFETCH_MAX];
        for (r, (k, &l)) in key_refs.iter_mut().zip(pf.keys.iter().zip(&pf.key_lens)).take(n) {
            *r = &k[..l];
        }
        let Ok(mut lent) = self.lend() else {
            counters.remote_errors.fetch_add(1, Ordering::Relaxed);
            self.mark_down();
            return;
        };
        let t0 = Instant::now();
        let res = lent.client.get_many_into(&key_refs[..n], &mut pf.buf, PREFETCH_STRIDE, &mut pf.got[..n]);
        let us = t0.elapsed().as_micros() as u64;
        self.give_back(lent);
        match res {
            Ok(()) => {
                counters.record_remote_latency(us);
                counters.remote_round_trips.fetch_add(1, Ordering::Relaxed);
                pf.n = n;
            }
            Err(_) => {
                counters.remote_errors.fetch_add(1, Ordering::Relaxed);
                self.mark_down();
            }
        }
    }

    /// Like [`RemoteTier::get`], served from `pf` when it holds this version.
    pub fn get_prefetched(
        &self,
        pf: &RemotePrefetch,
        slot: u64,
        version: u64,
        len: usize,
        out: &mut [u8],
        counters: &Counters,
    ) -> Result<(), RemoteError> {
        if let Some(i) = pf.versions[..pf.n].iter().position(|&v| v == version) {
            if pf.lens[i] == len && pf.got[i] == Some(record_bytes(len)) {
                let rec = &pf.buf[i * PREFETCH_STRIDE..i * PREFETCH_STRIDE + record_bytes(len)];
                counters.remote_prefetch_hits.fetch_add(1, Ordering::Relaxed);
                return self
                    .sealer
                    .open_record(rec, &Self::place(slot, len, version), out)
                    .map_err(|source| RemoteError::Corrupt { slot, source });
            }
        }
        self.get(slot, version, len, out, counters)
    }

    /// Queues the object of `version` for deletion; returns whether a batch is due (the
    /// writeback thread sends it, see [`RemoteTier::flush_deletes`]).
    pub fn free(&self, version: u64) -> bool {
        self.live_objects.fetch_sub(1, Ordering::Relaxed);
        let mut q = self.pending_del.lock().unwrap_or_else(|e| e.into_inner());
        q.push(version);
        q.len() >= DELETE_BATCH
    }

    /// Whether enough deletes are queued for a batch.
    pub fn deletes_due(&self) -> bool {
        self.pending_del.lock().unwrap_or_else(|e| e.into_inner()).len() >= DELETE_BATCH
    }

    /// Deletes the queued objects, pipelined (UNLINK: the servers free them in the
    /// background). Objects not deleted (store down) are left to their TTL and counted.
    pub fn flush_deletes(&self, counters: &Counters) -> usize {
        let versions: Vec<u64> = std::mem::take(&mut *self.pending_del.lock().unwrap_or_else(|e| e.into_inner()));
        if versions.is_empty() {
            return 0;
        }
        let mut keys = vec![[0u8; KEY_BYTES]; versions.len()];
        let lens: Vec<usize> = versions.iter().enumerate().map(|(i, &v)| self.key(v, &mut keys[i])).collect();
        let cmds: Vec<Cmd<'_>> =
            keys.iter().zip(&lens).map(|(k, &l)| Cmd { key: &k[..l], args: vec![b"UNLINK", &k[..l]] }).collect();
        let res = self.lend().and_then(|mut lent| {
            let r = lent.client.pipeline(&cmds, None).map_err(RemoteError::from);
            self.give_back(lent);
            r
        });
        match res {
            Ok(_) => versions.len(),
            Err(_) => {
                counters.remote_errors.fetch_add(1, Ordering::Relaxed);
                0
            }
        }
    }

    /// Deletes every object of this pager (at exit): the queued ones, then whatever SCAN
    /// still finds under the pager's id. Returns keys deleted by the scan.
    pub fn delete_all(&self) -> Result<usize, RemoteError> {
        self.pending_del.lock().unwrap_or_else(|e| e.into_inner()).clear();
        let mut lent = self.lend()?;
        let res = (|| {
            let keys = lent.client.scan_keys(&self.key_pattern())?;
            let cmds: Vec<Cmd<'_>> = keys.iter().map(|k| Cmd { key: k, args: vec![b"UNLINK", k] }).collect();
            for chunk in cmds.chunks(DELETE_BATCH) {
                lent.client.pipeline(chunk, None)?;
            }
            Ok::<usize, RespError>(keys.len())
        })();
        self.give_back(lent);
        self.live_objects.store(0, Ordering::Relaxed);
        Ok(res?)
    }

    /// Keys of this pager the cluster holds now (tests use it to check cleanup).
    pub fn count_keys(&self) -> Result<usize, RemoteError> {
        let mut lent = self.lend()?;
        let r = lent.client.scan_keys(&self.key_pattern());
        self.give_back(lent);
        Ok(r?.len())
    }
}

impl Drop for RemoteTier {
    fn drop(&mut self) {
        if let Err(e) = self.delete_all() {
            eprintln!(
                "tierswap: cannot delete this pager's remote objects ({e}); they expire after {} s",
                self.cfg.ttl_ms / 1000
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_group_versions_by_512() {
        let t = RemoteTier {
            cfg: RemoteConfig::default(),
            pager_id: 0x0123_4567_89ab_cdef,
            sealer: Sealer::new(true).unwrap(),
            next_version: AtomicU64::new(1),
            idle: Mutex::new(Vec::new()),
            pending_del: Mutex::new(Vec::new()),
            health: Mutex::new(Health::default()),
            live_objects: AtomicU64::new(0),
            batches_in_flight: AtomicU64::new(0),
        };
        let mut b = [0u8; KEY_BYTES];
        let n = t.key(513, &mut b);
        assert_eq!(&b[..n], b"ts:{0123456789abcdef.1}1");
        let n = t.key((1 << ADDR_BITS) - 1, &mut b);
        assert_eq!(&b[..n], b"ts:{0123456789abcdef.1fffffff}1ff");
        let mut c = [0u8; KEY_BYTES];
        let m = t.key(1023, &mut c);
        assert_eq!(super::super::resp::key_slot(&c[..m]), super::super::resp::key_slot(b"{0123456789abcdef.1}"));
        assert_eq!(t.key_pattern(), b"ts:{0123456789abcdef.*");
        // Forget the tier without Drop's cleanup (no cluster here).
        std::mem::forget(t);
    }

    #[test]
    fn sealed_objects_open_only_for_their_slot_and_version() {
        let s = Sealer::new(true).unwrap();
        let payload: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let mut rec = vec![0u8; record_bytes(payload.len())];
        rec[16..16 + payload.len()].copy_from_slice(&payload);
        s.seal_record(&mut rec, &RemoteTier::place(5, payload.len(), 9)).unwrap();
        assert_ne!(&rec[16..16 + payload.len()], &payload[..]);
        let mut out = vec![0u8; PAGE_SIZE];
        s.open_record(&rec, &RemoteTier::place(5, payload.len(), 9), &mut out).unwrap();
        assert_eq!(&out[..payload.len()], &payload[..]);
        assert!(s.open_record(&rec, &RemoteTier::place(6, payload.len(), 9), &mut out).is_err());
        assert!(s.open_record(&rec, &RemoteTier::place(5, payload.len(), 8), &mut out).is_err());
    }
}
