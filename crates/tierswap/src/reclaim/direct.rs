//! Waiting for room: a fault that would take the footprint over the budget evicts on its
//! own CPU (direct reclaim), then sleeps until reclaim has made room, or gives up over
//! budget rather than hang.
//!
//! Owns: nothing. Calls: reclaim's direct path, the fault threads' following (watch).

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use std::sync::Arc;

use super::Reclaim;
use crate::mm::Shared;

/// Blocks while the footprint is over the budget and reclaim can still bring it down.
/// It cannot when its last pass found nothing to evict, or when what eviction cannot
/// shrink (a pool that could not be written back, metadata) already fills the budget:
/// then the program goes on over budget, which reclaim counts and reports.
pub(crate) fn wait_for_room(s: &Shared, direct: Option<&mut DirectReclaim>) {
    let hopeless = || s.wake.reclaim_stuck.load(Ordering::Relaxed) || s.footprint_floor() >= s.low_watermark();
    if s.footprint_bytes() <= s.budget() || hopeless() {
        return;
    }
    s.counters.throttled_faults.fetch_add(1, Ordering::Relaxed);
    if let Some(d) = direct {
        // Evict on this CPU rather than sleep on it; what is left to wait for is staging.
        s.kick_reclaim();
        d.run();
        if s.footprint_bytes() <= s.budget() {
            return;
        }
    }
    s.counters.pgscan_direct_throttle.fetch_add(1, Ordering::Relaxed);
    // Every fault thread polls while this one sleeps (mm/watch.rs): another program thread's
    // fault must not wait for this one's room. Not before direct reclaim: ringing the
    // others then, ~1,600 times a 1 GiB fill, cost its swap-out 10 % (2.06 → 2.29 s).
    if s.wake.watch.release_all() {
        s.counters.fault_follow_all.fetch_add(1, Ordering::Relaxed);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let (m, cv) = &s.wake.room;
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    while s.footprint_bytes() > s.budget() && !s.wake.shutdown.load(Ordering::Relaxed) {
        s.kick_reclaim();
        if s.helpers > 0 {
            // A signal-mode fault: its thread sleeps here, and the helper on its CPU evicts.
            s.wake.helper_kick.kick_all();
        }
        let now = Instant::now();
        if now >= deadline {
            // Reclaim cannot make room (nothing evictable left, or nowhere to put it):
            // going over budget beats hanging the program. Counted here too, since reclaim
            // counts only the passes that found nothing to evict.
            s.counters.over_budget_events.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let gen = *g;
        let (g2, _) = cv.wait_timeout(g, Duration::from_millis(5)).unwrap_or_else(|e| e.into_inner());
        g = g2;
        if *g != gen && (s.footprint_bytes() <= s.budget() || hopeless()) {
            return;
        }
    }
}

/// Blocks a direct reclaimer evicts per step (256 KiB) before it looks at the footprint again.
const DIRECT_BATCH_BLOCKS: usize = 4;

/// A fault thread's direct reclaim (`PagerConfig::direct_reclaim`): its own buffers, used
/// only to evict blocks already on the inactive list. Staging, the inactive list's size and
/// writeback stay with the reclaim thread.
pub(crate) struct DirectReclaim(Reclaim);

impl DirectReclaim {
    pub(crate) fn new(s: Arc<Shared>) -> std::io::Result<DirectReclaim> {
        Reclaim::new(s).map(DirectReclaim)
    }

    /// Evicts staged blocks until the footprint is at or under the budget, or the inactive
    /// list has nothing left to evict. Returns pages evicted.
    pub(crate) fn run(&mut self) -> usize {
        let r = &mut self.0;
        let mut total = 0;
        while r.s.footprint_bytes() > r.s.budget() && !r.s.wake.shutdown.load(Ordering::Acquire) {
            let n = r.evict(DIRECT_BATCH_BLOCKS);
            if n == 0 {
                break;
            }
            total += n;
        }
        if total > 0 {
            r.s.counters.pgsteal_direct.fetch_add(total as u64, Ordering::Relaxed);
            r.notify_room();
        }
        total
    }
}

/// A reclaim helper's loop (signal mode, `PagerConfig::reclaims_by_helpers`): helper `index`
/// is pinned to the CPU fault thread `index` would be, sleeps until a fault waits for room,
/// then evicts like a fault thread's direct reclaim. The faulting thread waits in its
/// signal handler, so its CPU is free: the helper pinned there runs at once.
pub(crate) fn helper_thread(s: Arc<Shared>, index: usize) {
    if s.config.fault_pin {
        crate::sys::pin_to_cpu(index, "reclaim helper");
    }
    let mut d = match DirectReclaim::new(s.clone()) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("tierswap: reclaim helper {index} stops: cannot map its buffers: {e}");
            return;
        }
    };
    loop {
        s.wake.helper_kick.wait(Duration::from_millis(100));
        if s.wake.shutdown.load(Ordering::Acquire) {
            return;
        }
        d.run();
    }
}
