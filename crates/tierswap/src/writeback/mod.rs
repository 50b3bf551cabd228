//! Pool writeback: a thread of its own moves the coldest pool objects to the file, still
//! compressed and packed many to a 64 KiB unit, so the pool stays under its limit without
//! holding up eviction or faults.
//!
//! It starts when the pool passes `pool_max` and stops once it is under the accept
//! threshold (90 % of the limit, zswap's `accept_threshold_percent`), so it works in
//! batches rather than one object at a time at the limit. Reclaim also asks for a step
//! when the budget is exceeded and nothing else can be evicted. Clusters are taken oldest
//! first (the age list of the swap space); an entry with its referenced bit gets a second
//! chance. A page written back is not a refault when it comes back: it was never in use.
//!
//! With a remote tier, writeback goes there first: the same coldest objects, sealed, one
//! pipelined batch per step ([`crate::backend::remote::RemoteTier::put_batch`]). A batch
//! that fails (store slow, down, or not durable as configured) leaves its pages in the
//! pool, the remote is left alone for a second, and the step goes to the file tier if
//! there is one; so does a step while the pool is half again over its limit (the remote is
//! too slow to keep up). Deletes of freed remote objects are sent from here too, in batches.
//!
//! Recompression (zram's `recompress`, done where zswap would write back): with
//! `recompress` set, a cold object still in the pool's compressor is first recompressed
//! with that codec. If it shrinks by a quarter or more it stays in the pool, its entry's
//! codec bit set, and its cluster goes back to the young end of the age list; if not, it is
//! written back at once. An object met again while recompressed waits as long as the pool
//! still holds objects to recompress (`Shared::pool_recompressible`): the step walks on, up
//! to 64 clusters, to recompress those instead. Only when none is within reach are
//! recompressed objects written to the file, as they are, with their codec bit (to the
//! remote tier they go on their second visit, without waiting). So the disk sees what does
//! not shrink, and what still does not fit once everything in the pool has been shrunk.

mod drain;

pub(crate) use drain::drain_file;
pub use drain::DrainReport;

use std::collections::VecDeque;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::compress::{compress_uncounted, decompress, COMPRESS_BUF_BYTES};
use crate::backend::file::UnitWriter;
use crate::backend::pool::{Pool, PoolHandle};
use crate::mm::slots::{count_recompressible, recompressible};
use crate::mm::Shared;
use crate::page::PAGE_SIZE;
use crate::policy::pool_share::Change;
use crate::swap::cluster::SLOTS_PER_CLUSTER;
use crate::swap::{SwapEntry, SwapSpace, Tag};
use crate::sys::fatal;

/// Clusters written back per step (up to 1024 objects, ~16 units of 64 KiB).
const WRITEBACK_CLUSTERS: usize = 2;
/// Writeback, once started, goes on until the pool is under this share of its limit.
pub const ACCEPT_THRESHOLD_PERCENT: u64 = 90;
/// Clusters one writeback step walks past recompressed objects, looking for objects to
/// recompress, before it writes the recompressed ones back.
const RECOMPRESS_WALK_CLUSTERS: usize = 64;

pub(crate) struct Writeback {
    s: Arc<Shared>,
    writer: Option<UnitWriter>,
    warned_write_error: bool,
    warned_remote_error: bool,
    /// The last step found no tier to take its objects, or its write failed.
    failed: bool,
    /// The last step met only recompressed objects it deferred: this one writes them.
    no_defer: bool,
    /// Recompression buffers: the decompressed page and the new object.
    page: Vec<u8>,
    recompressed: Vec<u8>,
    /// Compaction's pass over the swap table.
    compaction: Compaction,
}

/// Steps in a row that write nothing, without an error, before writeback counts as failing
/// (objects busy or given a second chance are taken by the next step or the one after).
const IDLE_STEPS_FAILING: u32 = 3;

/// The writeback thread's loop.
pub(crate) fn writeback_thread(s: Arc<Shared>) {
    crate::sys::lower_priority(s.config.background_nice, s.config.background_idle, "writeback");
    let mut w = match Writeback::new(s) {
        Ok(w) => w,
        Err(e) => fatal(&format!("writeback cannot map its write buffer: {e}")),
    };
    let mut active = false;
    let mut idle_steps = 0u32;
    let mut last_delete = std::time::Instant::now();
    let mut last_tick = std::time::Instant::now();
    loop {
        w.s.wake.wb_kick.wait(Duration::from_millis(10));
        if w.s.wake.shutdown.load(Ordering::Acquire) {
            return;
        }
        if w.s.tiers.pool_share.is_adaptive() && last_tick.elapsed() >= Duration::from_millis(10) {
            last_tick = std::time::Instant::now();
            match w.s.tiers.pool_share.tick(w.s.counters.workingset_refault.load(Ordering::Relaxed)) {
                Change::Grew => w.s.counters.pool_limit_grow.fetch_add(1, Ordering::Relaxed),
                Change::Shrank => w.s.counters.pool_limit_shrink.fetch_add(1, Ordering::Relaxed),
                Change::Kept => 0,
            };
        }
        if w.s.config.pool_compact {
            let moved = w.compact_step();
            w.s.counters.pool_compact_moved.fetch_add(moved, Ordering::Relaxed);
        }
        if let Some(r) = &w.s.tiers.remote {
            if r.deletes_due() || (last_delete.elapsed() > Duration::from_secs(1) && !r.is_down()) {
                r.flush_deletes(&w.s.counters);
                last_delete = std::time::Instant::now();
            }
        }
        let max = w.s.pool_limit();
        loop {
            if w.s.wake.shutdown.load(Ordering::Acquire) || w.s.tiers.file_off.load(Ordering::Acquire) {
                break;
            }
            let pool = w.s.tiers.pool.total_bytes();
            active = if active { pool > max / 100 * ACCEPT_THRESHOLD_PERCENT } else { pool > max };
            let wanted = w.s.wake.wb_wanted.swap(false, Ordering::AcqRel);
            if !active && !wanted {
                break;
            }
            let n = w.writeback(WRITEBACK_CLUSTERS);
            idle_steps = if n == 0 { idle_steps.saturating_add(1) } else { 0 };
            // A step that wrote nothing because its clusters' objects were busy or had a
            // second chance coming is not a failure: faults keep waiting for the next one.
            let failing =
                n == 0 && w.s.tiers.pool.stored_objects() > 0 && (w.failed || idle_steps >= IDLE_STEPS_FAILING);
            w.s.wake.wb_failing.store(failing, Ordering::Release);
            w.s.kick_reclaim();
            if n == 0 {
                // Nothing could be written (all busy, or the disk refuses): try again later.
                active = false;
                break;
            }
        }
    }
}

/// Slots one compaction step walks (64 clusters, one step a 10 ms tick); a pass over
/// 330,000 slots (a 1 GiB program under 256 MiB) takes 11 steps.
const COMPACT_SLOTS: u64 = 64 * SLOTS_PER_CLUSTER as u64;
/// Rest between compaction passes. Without it, passes back to back (a third of a second of
/// the writeback thread's CPU each second, class locks taken on every pool object) cost
/// sqlite's lookups 11–23 % and tripled their p99.
const COMPACT_REST: Duration = Duration::from_secs(1);

/// Compaction's state: a pass walks the whole swap table once, a step a tick.
struct Compaction {
    /// The slot the next step starts at.
    cursor: u64,
    /// Slots left in the pass under way; 0 between passes.
    left: u64,
    /// No pass starts before this.
    rest_until: Instant,
}

/// The pool's spans' free room (free slots and tails): `(free, total)` bytes.
fn pool_free_room(pool: &Pool) -> (u64, u64) {
    let total = pool.total_bytes();
    (total.saturating_sub(pool.stored_bytes()), total)
}

/// What [`claim_pool_slot`] found.
enum Claim {
    /// The slot's pool object, its entry locked: the caller writes it back.
    Got(SwapEntry),
    /// Not a pool object (any more): nothing to do.
    Skip,
    /// A pool object to write back later: busy, or given a second chance.
    LeftBehind,
}

/// Locks `slot` for writeback if it holds a pool object that was not referenced since the
/// last pass; a referenced one loses its bit instead (second chance).
fn claim_pool_slot(s: &Shared, slot: u64) -> Claim {
    let e = s.tiers.swap.load(slot);
    if e.tag() != Tag::Pool {
        return Claim::Skip;
    }
    if e.locked() {
        return Claim::LeftBehind;
    }
    let Some(e) = s.tiers.swap.try_lock(slot) else {
        return Claim::LeftBehind;
    };
    if e.tag() != Tag::Pool {
        s.tiers.swap.unlock(slot, e, e);
        return Claim::Skip;
    }
    if e.referenced() {
        s.tiers.swap.unlock(slot, e, e.with_referenced(false));
        return Claim::LeftBehind;
    }
    Claim::Got(e)
}

impl Writeback {
    pub(crate) fn new(s: Arc<Shared>) -> std::io::Result<Writeback> {
        let writer = match s.tiers.file {
            Some(_) => Some(UnitWriter::new(s.config.file_unit_bytes)?),
            None => None,
        };
        Ok(Writeback {
            s,
            writer,
            warned_write_error: false,
            warned_remote_error: false,
            failed: false,
            no_defer: false,
            page: vec![0; PAGE_SIZE],
            recompressed: vec![0; COMPRESS_BUF_BYTES],
            compaction: Compaction { cursor: 0, left: 0, rest_until: Instant::now() },
        })
    }

    /// Recompresses locked pool entry `e` of `slot` with the recompression codec if that
    /// shrinks the object by a quarter or more: the entry (unlocked) then points at the new
    /// object with its codec bit set. Returns false, the entry still locked and unchanged,
    /// when there is no recompression, the object is already recompressed, raw or small,
    /// or does not shrink enough: the caller writes it back.
    fn try_recompress(&mut self, slot: u64, e: SwapEntry) -> bool {
        let s = &*self.s;
        let Some(codec) = s.config.recompress else {
            return false;
        };
        if !recompressible(s, e) {
            return false;
        }
        let (h, len) = e.addr_len();
        let Some(handle) = PoolHandle::from_raw(h) else {
            return false;
        };
        // SAFETY: the entry is locked, so the object stays allocated while we read it.
        let obj = unsafe { s.tiers.pool.object(handle, len) };
        // An object that does not decompress is written back as it is: its reader reports it.
        if decompress(s.config.compressor, obj, &mut self.page).is_err() {
            return false;
        }
        let Some(n) = compress_uncounted(codec, &self.page, &mut self.recompressed, len - len / 4) else {
            s.counters.pool_recompress_rejected.fetch_add(1, Ordering::Relaxed);
            return false;
        };
        let Ok(new_handle) = s.tiers.pool.store(&self.recompressed[..n]) else {
            return false;
        };
        let new = e.with_place(Tag::Pool, SwapEntry::pool(new_handle.raw(), n).with_recompressed(true).location());
        s.tiers.swap.unlock(slot, e, new);
        s.tiers.pool.free(handle, len);
        count_recompressible(s, e, false);
        s.counters.pool_recompressed.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// One tick of compaction. A pass starts when a quarter or more of the pool's spans
    /// (and 1 MiB) is free room, at most once a [`COMPACT_REST`]: objects freed at random
    /// (swap-ins, writeback) leave spans partly empty, and redis under random GETs at
    /// 256 MiB held 66 MiB of objects in 100 MiB of spans, room the program's pages are
    /// short of. The pass walks [`COMPACT_SLOTS`] a tick until it has seen every slot or
    /// the free room is down to an eighth. Returns objects moved.
    fn compact_step(&mut self) -> u64 {
        let (free, total) = pool_free_room(&self.s.tiers.pool);
        if self.compaction.left == 0 {
            if free * 4 < total || free < 1 << 20 || Instant::now() < self.compaction.rest_until {
                return 0;
            }
            self.compaction.left = self.s.tiers.swap.clusters_ever_used() as u64 * SLOTS_PER_CLUSTER as u64;
        } else if free * 8 <= total {
            self.compaction.left = 0;
        }
        let walk = self.compaction.left.min(COMPACT_SLOTS);
        let moved = self.compact(walk);
        self.compaction.left -= walk;
        if self.compaction.left == 0 {
            self.compaction.rest_until = Instant::now() + COMPACT_REST;
        }
        moved
    }

    /// Compaction: walks up to `max_slots` slots on from where the last step stopped and
    /// moves each pool object that sits in a span at most half in use into a fuller span of
    /// its class (`Pool::relocate`), under its entry's lock, as recompression does; a busy
    /// entry is passed over. Returns objects moved.
    fn compact(&mut self, max_slots: u64) -> u64 {
        let s = &*self.s;
        let end = s.tiers.swap.clusters_ever_used() as u64 * SLOTS_PER_CLUSTER as u64;
        let mut moved = 0;
        for _ in 0..max_slots.min(end) {
            let slot = self.compaction.cursor % end;
            self.compaction.cursor = (slot + 1) % end;
            let e = s.tiers.swap.load(slot);
            if e.tag() != Tag::Pool || e.locked() {
                continue;
            }
            let Some(e) = s.tiers.swap.try_lock(slot) else { continue };
            let (h, len) = e.addr_len();
            // Locked, the object stays where it is while relocate looks at its span.
            let moved_to = match PoolHandle::from_raw(h) {
                Some(handle) if e.tag() == Tag::Pool => s.tiers.pool.relocate(handle, len).map(|new| (handle, new)),
                _ => None,
            };
            match moved_to {
                Some((handle, new_handle)) => {
                    let place = SwapEntry::pool(new_handle.raw(), len).with_recompressed(e.recompressed());
                    s.tiers.swap.unlock(slot, e, e.with_place(Tag::Pool, place.location()));
                    s.tiers.pool.free(handle, len);
                    moved += 1;
                }
                None => s.tiers.swap.unlock(slot, e, e),
            }
        }
        moved
    }

    /// Writes back the pool objects of the `n_clusters` coldest clusters to the file, many
    /// per write. Returns objects written.
    pub(crate) fn writeback(&mut self, n_clusters: usize) -> usize {
        let s = self.s.clone();
        self.failed = false;
        // A remote that cannot keep up (the pool half again over its limit) counts as slow:
        // with a file tier, this step goes there instead.
        let pool_max = s.pool_limit();
        let remote_behind =
            s.tiers.file.is_some() && s.tiers.pool.total_bytes() > pool_max.saturating_add(pool_max / 2);
        if !remote_behind && s.tiers.remote.as_ref().is_some_and(|r| !r.is_down()) {
            if let Some(n) = self.writeback_remote(n_clusters) {
                return n;
            }
        }
        if s.tiers.file.is_none() {
            self.failed = true;
            return 0;
        }
        // Drain holds this while it empties the file: no new units meanwhile.
        let _gate = s.tiers.file_gate.read().unwrap_or_else(|e| e.into_inner());
        if s.tiers.file_off.load(Ordering::Acquire) {
            self.failed = true;
            return 0;
        }
        let Some(mut w) = self.writer.take() else {
            return 0;
        };
        let mut held: Vec<(u64, SwapEntry, usize)> = Vec::new();
        let mut written = 0;
        // Recompressed objects wait while recompression can still make room elsewhere in
        // the pool; the step then walks on, up to RECOMPRESS_WALK_CLUSTERS, to find it.
        let defer = !self.no_defer && s.tiers.pool_recompressible.load(Ordering::Relaxed) > 0;
        let mut deferred = 0;
        let mut walked = 0;
        let mut queue: VecDeque<u32> = s.tiers.swap.take_coldest(n_clusters).into();
        'clusters: while let Some(cid) = queue.pop_front() {
            walked += 1;
            let mut left_behind = false;
            for slot in SwapSpace::cluster_slots(cid) {
                let e = match claim_pool_slot(&s, slot) {
                    Claim::Got(e) => e,
                    Claim::Skip => continue,
                    Claim::LeftBehind => {
                        left_behind = true;
                        continue;
                    }
                };
                if e.recompressed() && defer {
                    s.tiers.swap.unlock(slot, e, e);
                    deferred += 1;
                    left_behind = true;
                    continue;
                }
                if self.try_recompress(slot, e) {
                    // Stays in the pool: its cluster comes round again before it goes.
                    written += 1;
                    left_behind = true;
                    continue;
                }
                let (h, len) = e.addr_len();
                let Some(handle) = PoolHandle::from_raw(h) else {
                    s.tiers.swap.unlock(slot, e, e);
                    continue;
                };
                // SAFETY: the entry is locked, so the object stays allocated while we copy.
                let obj = unsafe { s.tiers.pool.object(handle, len) };
                let off = match w.push(slot, obj) {
                    Some(off) => off,
                    None => {
                        match self.commit_writeback(&mut w, &mut held) {
                            Some(n) => written += n,
                            None => {
                                s.tiers.swap.unlock(slot, e, e);
                                // The clusters not done yet keep their (cold) place in line.
                                s.tiers.swap.requeue_cold(cid);
                                for cid in queue.drain(..) {
                                    s.tiers.swap.requeue_cold(cid);
                                }
                                break 'clusters;
                            }
                        }
                        match w.push(slot, obj) {
                            Some(off) => off,
                            None => {
                                s.tiers.swap.unlock(slot, e, e);
                                continue;
                            }
                        }
                    }
                };
                held.push((slot, e, off));
            }
            if left_behind {
                s.tiers.swap.requeue_cold(cid);
            }
            if queue.is_empty() && written == 0 && deferred > 0 && walked < RECOMPRESS_WALK_CLUSTERS {
                queue.extend(s.tiers.swap.take_coldest(1));
            }
        }
        // A step that only deferred makes the next one write recompressed objects back:
        // what recompression could still shrink was out of reach (busy, or not yet on the
        // age list).
        self.no_defer = written == 0 && deferred > 0;
        if !held.is_empty() {
            if let Some(n) = self.commit_writeback(&mut w, &mut held) {
                written += n;
            }
        }
        self.writer = Some(w);
        written
    }

    /// Writes the pool objects of the `n_clusters` coldest clusters to the remote tier as
    /// one batch. Returns objects written, or None when the batch failed (every page stays
    /// in the pool, its clusters stay cold, and the caller tries the file).
    fn writeback_remote(&mut self, n_clusters: usize) -> Option<usize> {
        let s = self.s.clone();
        let remote = s.tiers.remote.as_ref()?;
        // Reclaim holds off filling the pool while this lasts (see `Shared::pool_backpressure`).
        let _in_flight = remote.batch_started();
        let clusters = s.tiers.swap.take_coldest(n_clusters);
        let mut held: Vec<(u64, SwapEntry)> = Vec::new();
        let mut requeue = Vec::new();
        let mut recompressed = 0;
        for &cid in &clusters {
            let mut left_behind = false;
            for slot in SwapSpace::cluster_slots(cid) {
                let e = match claim_pool_slot(&s, slot) {
                    Claim::Got(e) => e,
                    Claim::Skip => continue,
                    Claim::LeftBehind => {
                        left_behind = true;
                        continue;
                    }
                };
                if PoolHandle::from_raw(e.addr_len().0).is_none() {
                    s.tiers.swap.unlock(slot, e, e);
                    continue;
                }
                if self.try_recompress(slot, e) {
                    recompressed += 1;
                    left_behind = true;
                    continue;
                }
                held.push((slot, e));
            }
            if left_behind {
                requeue.push(cid);
            }
        }
        if held.is_empty() {
            for cid in requeue {
                s.tiers.swap.requeue_cold(cid);
            }
            return Some(recompressed);
        }
        let items: Vec<(u64, &[u8])> = held
            .iter()
            .map(|&(slot, e)| {
                let (h, len) = e.addr_len();
                let handle = PoolHandle::from_raw(h).expect("checked above");
                // SAFETY: the entry is locked, so the object stays allocated until it is
                // unlocked below, after the batch no longer refers to it.
                (slot, unsafe { s.tiers.pool.object(handle, len) })
            })
            .collect();
        let res = remote.put_batch(&items, &s.counters);
        drop(items);
        match res {
            Ok(versions) => {
                s.wake.wb_failing.store(false, Ordering::Release);
                if let Some(outage) = remote.mark_written() {
                    if self.warned_remote_error {
                        // The next outage is worth a line of its own.
                        self.warned_remote_error = false;
                        eprintln!("tierswap: the remote tier takes writes again after {} ms", outage.as_millis());
                    }
                }
                let n = held.len();
                for ((slot, e), version) in held.into_iter().zip(versions) {
                    let (h, len) = e.addr_len();
                    let place = SwapEntry::pool(version, len).with_recompressed(e.recompressed());
                    let new = e.with_place(Tag::Remote, place.location());
                    s.tiers.swap.unlock(slot, e, new);
                    if let Some(handle) = PoolHandle::from_raw(h) {
                        s.tiers.pool.free(handle, len);
                        count_recompressible(&s, e, false);
                    }
                    s.counters.zswpwb.fetch_add(1, Ordering::Relaxed);
                }
                for cid in requeue {
                    s.tiers.swap.requeue_cold(cid);
                }
                Some(n + recompressed)
            }
            Err(err) => {
                if !self.warned_remote_error {
                    self.warned_remote_error = true;
                    let next = if s.tiers.file.is_some() {
                        "writing back to the file tier"
                    } else {
                        "keeping pages in the pool"
                    };
                    eprintln!("tierswap: remote writeback failed: {err}; {next} until the remote answers again");
                }
                for (slot, e) in held {
                    s.tiers.swap.unlock(slot, e, e);
                }
                for &cid in &clusters {
                    s.tiers.swap.requeue_cold(cid);
                }
                None
            }
        }
    }

    /// Writes the unit and moves the held entries (locked, in the pool) to the file; on
    /// error unlocks them unchanged. Returns entries moved, or None on error.
    fn commit_writeback(&mut self, w: &mut UnitWriter, held: &mut Vec<(u64, SwapEntry, usize)>) -> Option<usize> {
        let file = self.s.tiers.file.as_ref()?;
        let res = file.write_unit(w);
        let io_bytes = w.io_bytes() as u64;
        w.clear();
        match res {
            Ok(base) => {
                let n = held.len();
                self.s.counters.file_io_bytes.fetch_add(io_bytes, Ordering::Relaxed);
                self.s.counters.file_writes.fetch_add(1, Ordering::Relaxed);
                for (slot, e, off) in held.drain(..) {
                    let (h, len) = e.addr_len();
                    let place = SwapEntry::file(base + off as u64, len).with_recompressed(e.recompressed());
                    let new = e.with_place(Tag::File, place.location());
                    self.s.tiers.swap.unlock(slot, e, new);
                    if let Some(handle) = PoolHandle::from_raw(h) {
                        self.s.tiers.pool.free(handle, len);
                        count_recompressible(&self.s, e, false);
                    }
                    self.s.counters.zswpwb.fetch_add(1, Ordering::Relaxed);
                    self.s.counters.pswpout.fetch_add(1, Ordering::Relaxed);
                    self.s.counters.file_write_bytes.fetch_add(len as u64, Ordering::Relaxed);
                }
                Some(n)
            }
            Err(err) => {
                self.failed = true;
                self.s.counters.writeback_errors.fetch_add(1, Ordering::Relaxed);
                if !self.warned_write_error {
                    self.warned_write_error = true;
                    eprintln!("tierswap: pool writeback failed: {err}; keeping pages in the pool (the footprint may exceed the budget)");
                }
                for (slot, e, _) in held.drain(..) {
                    self.s.tiers.swap.unlock(slot, e, e);
                }
                None
            }
        }
    }
}
