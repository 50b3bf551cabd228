//! Counters, named as in /proc/vmstat and memory.stat so an mm person greps for what they know.
//!
//! [`Counters`] is the live, lock-free set the paths bump; [`Stats`] is a snapshot of it
//! (plus gauges the pager computes), readable as a struct and as JSON.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};

use serde::Serialize;

/// Buckets of the fault latency histogram: bucket `i` counts faults that took
/// `[2^i, 2^(i+1))` µs (bucket 0 also takes 0 µs); the last bucket takes everything above.
pub const LATENCY_BUCKETS: usize = 24;

macro_rules! counters {
    ($( $(#[$doc:meta])* $name:ident ),* $(,)?) => {
        /// The live event counters, bumped with relaxed atomics on the paths.
        #[derive(Default, Debug)]
        pub struct Counters {
            $( $(#[$doc])* pub $name: AtomicU64, )*
            /// Fault latency histogram, see [`LATENCY_BUCKETS`].
            pub fault_latency_us: [AtomicU64; LATENCY_BUCKETS],
            /// Remote tier round-trip latency histogram (µs), same buckets.
            pub remote_latency_us: [AtomicU64; LATENCY_BUCKETS],
        }

        /// Event counters at one instant.
        #[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
        pub struct CounterSnapshot {
            $( $(#[$doc])* pub $name: u64, )*
        }

        impl Counters {
            /// Reads every counter.
            pub fn snapshot(&self) -> CounterSnapshot {
                CounterSnapshot { $( $name: self.$name.load(Relaxed), )* }
            }
        }

        impl CounterSnapshot {
            /// `(name, value)` for every counter, in declaration order.
            pub fn pairs(&self) -> Vec<(&'static str, u64)> {
                vec![ $( (stringify!($name), self.$name), )* ]
            }
        }
    };
}

counters! {
    /// Pages read back from the file tier.
    pswpin,
    /// Pages written to the file tier (incompressible pages and pool writeback).
    pswpout,
    /// Pages decompressed from the pool.
    zswpin,
    /// Pages compressed into the pool.
    zswpout,
    /// Pool objects written back to the file tier.
    zswpwb,
    /// Steps up of the pool limit (`PagerConfig::pool_adapt`).
    pool_limit_grow,
    /// Steps down of the pool limit.
    pool_limit_shrink,
    /// Cold pool objects recompressed with the recompression codec and kept in the pool
    /// instead of being written back.
    pool_recompressed,
    /// Cold pool objects the recompression codec did not shrink by a quarter (written back
    /// as they were).
    pool_recompress_rejected,
    /// Pool objects compaction moved out of spans at most half in use into fuller ones of
    /// their class (the emptied spans go back to the kernel).
    pool_compact_moved,
    /// Zero pages swapped in (no storage read).
    swpin_zero,
    /// Zero pages swapped out (no storage used).
    swpout_zero,
    /// Same-filled pages swapped in.
    swpin_samefill,
    /// Same-filled pages swapped out.
    swpout_samefill,
    /// Swap-ins of more than one page in one call.
    swpin_large,
    /// Pages brought in by large swap-ins (the faulting pages included).
    swpin_large_pages,
    /// Pages a large swap-in admitted but served order-0 (backend changed meanwhile).
    swpin_large_fallback,
    /// Large swap-ins whose range spanned more than one backend (pool, zero, file).
    swpin_large_mixed,
    /// Faults where admission vetoed a large swap-in for lack of locality.
    swpin_large_veto,
    /// Neighbours mapped by a fault in the same call (fault-around): staged pages moved
    /// back, or untouched pages after a first touch that continues the last one's run.
    fault_around_pages,
    /// Pages evicted again while still clean: their slot was kept, no compression, no IO.
    swpout_clean,
    /// Pages read ahead from the file tier.
    swap_ra,
    /// Read-ahead pages touched afterwards.
    swap_ra_hit,
    /// Disk faults served with a window of one page: no readahead, for lack of locality.
    swap_ra_off,
    /// Pages stride prefetch brought into place before the program touched them.
    swap_prefetch,
    /// Prefetched pages the program went through on its stride without a fault.
    swap_prefetch_hit,
    /// Refaults of pages evicted recently enough to count as working set.
    workingset_refault,
    /// Refaulted pages activated at once.
    workingset_activate,
    /// Looks at the active pages' share (one per 4,096 present pages reclaim's hand meets)
    /// made while protection was suspended: activations were too many an eviction to
    /// single pages out (`PagerConfig::protect_selective_pct`).
    protect_suspended,
    /// Refaults within the inactive list's full size of their eviction (`inactive_pct` of
    /// the budget): a list that long would have caught them as staged faults.
    workingset_refault_near,
    /// Pages that did not compress below 3/4 of a page.
    pool_reject_incompressible,
    /// Incompressible pages kept raw in the pool because no file tier could take them.
    pool_stored_raw,
    /// Checksum mismatches on file reads (never returned as data).
    checksum_errors,
    /// Failed file writes (data kept in the pool).
    writeback_errors,
    /// Failed file reads, one per failed IO (the records are read again one by one; a
    /// faulting page whose record still cannot be read gets SIGBUS).
    read_errors,
    /// Units (one write each) written to the file tier.
    file_writes,
    /// Payload bytes (pages as stored: compressed, or raw if incompressible) written to the file.
    file_write_bytes,
    /// Reads of the file tier by faults, one IO each: whole units, the records of one
    /// 64 KiB block, or one record's pages (see `UnitCache`).
    file_unit_reads,
    /// File records a fault found in bytes an earlier fault had read.
    file_unit_hits,
    /// File reads a fault thread started together for faults it read together
    /// (`PagerConfig::file_batch_reads`).
    file_reads_batched,
    /// Of those, the reads a fault then took its bytes from.
    file_reads_batched_used,
    /// Records whose bytes from such a read did not open, read again from the disk (none
    /// expected: the unit's write generation is checked before the bytes are used).
    file_reads_batched_stale,
    /// Bytes written to the file (whole IOs: records, headers, alignment); divided by
    /// `file_writes` it is the average write size.
    file_io_bytes,
    /// Page faults served.
    faults,
    /// First-touch faults (no data yet).
    faults_first_touch,
    /// Write-protect faults: a write to a clean page, which gives up its kept slot.
    faults_wp,
    /// Faults served by moving a staged page back.
    faults_staged,
    /// Faults served from a swap slot.
    faults_swapped,
    /// Pages moved to the inactive list (staging).
    pgdeactivate,
    /// Staged pages moved back on a touch (inactive refault).
    pgactivate,
    /// Staged pages evicted to a backend.
    pgsteal,
    /// Of those, pages a fault thread evicted itself while its fault waited for room
    /// (direct reclaim, `PagerConfig::direct_reclaim`); the rest the reclaim thread did.
    pgsteal_direct,
    /// Faults that waited for reclaim to bring the footprint under the budget.
    throttled_faults,
    /// Of those, faults that slept for room: direct reclaim was off, found nothing to evict,
    /// or evicted and the footprint was still over (the kernel's name for a direct
    /// reclaimer it throttles). Time the program's CPU may idle.
    pgscan_direct_throttle,
    /// Times the lead moved to the fault thread on the CPU the faulting program thread runs
    /// on (`PagerConfig::fault_follow`, mm/watch.rs).
    fault_follow_moves,
    /// Times every fault thread went back to polling the userfaultfd: faults of two program
    /// threads close together, or a leading fault thread going to sleep for room.
    fault_follow_all,
    /// Times the footprint could not be kept under budget: a reclaim pass with nothing left
    /// to evict, or a fault that waited 2 s for room and went on.
    over_budget_events,
    /// Highest footprint seen by the pager's own sampling.
    footprint_max,
    /// MADV_DONTNEED / MADV_REMOVE of managed memory by the program (userfaultfd REMOVE).
    event_remove,
    /// munmap of managed memory by the program (userfaultfd UNMAP).
    event_unmap,
    /// mremap of managed memory by the program (userfaultfd REMAP).
    event_remap,
    /// fork of a process with managed memory (userfaultfd FORK).
    event_fork,
    /// Waits (200 µs each) of a new mapping for the UNMAP / REMAP event of the mapping the
    /// kernel had at its address before, still in the pager's map (`Shared::claim_range`).
    stale_extent_waits,
    /// Stale extents found where a REMAP put its new range (a mapping whose own UNMAP /
    /// REMAP was still to come), set aside until that event came (events/mod.rs, `Displaced`).
    remap_displaced,
    /// Pages a staging UFFDIO_MOVE moved without counting them (Linux 6.18: EEXIST on its
    /// own uncounted batch), found in the staging window and taken as moved.
    move_uncounted,
    /// Pages reclaim left present because the program made them other than plain
    /// read-write (mprotect): UFFDIO_MOVE wants equal protections (mm/protect.rs).
    stage_skipped_protected,
    /// Moves over several pages, staging (reclaim/stage.rs) or a staged fault's move back
    /// (fault/staged.rs), that met the end of one of the kernel's VMAs (the program set
    /// flags on part of its range with madvise: MADV_HUGEPAGE, MADV_RANDOM…); the rest of
    /// each such run moved a page at a time.
    move_split_vma,
    /// Pages a staging move refused as shared (EBUSY: present at a fork and only read since,
    /// the kernel keeps them marked shared) that reclaim then made the process's own again
    /// with a pinning read, once no child was left (reclaim/stage.rs, `unshare_busy`).
    stage_unshared,
    /// Pages of forked children served from the parent's swap.
    child_faults,
    /// Swapped pages a fork shared with the child by slot (a swap count more).
    fork_shared_slots,
    /// Pages a fork copied for the child: staged ones, slots whose count was full, and at a
    /// grandchild's fork the copies its parent still held.
    fork_copied_pages,
    /// Writes of forked children to pages they share with the parent that were present and
    /// clean (write-protected) at the fork: the protection lifted in the child.
    child_wp_faults,
    /// Pages of inherited memory handed over to forked children's own pagers (in a tree,
    /// thread mode: events/grant.rs).
    child_granted_pages,
    /// Pages of memory inherited from the parent that this process's pager took over,
    /// present when it did (events/grant.rs, `serve_grants`).
    adopted_pages,
    /// Pages of inherited memory taken over while shared with the parent that became this
    /// process's alone when the parent wrote or dropped its copy, found by a later look
    /// (mm/mapping.rs, `take_unshared_inherited`).
    adopted_unshared,
    /// Grants of inherited memory this process's pager could not take over (part of the
    /// range unmapped or managed already): the range stays plain memory, every page in it.
    adopt_refused,
    /// 200 µs waits of a child's fault for the child's own pager to get back near its
    /// share (events/grant.rs, `wait_for_child_room`).
    child_room_waits,
    /// Faults on registered memory the pager does not manage (the part an mremap grew),
    /// served with a zero page.
    faults_unmanaged,
    /// Fault messages for an address no region holds, outside any mapping an mremap grew:
    /// messages that outlived their page (the program unmapped or moved it after the fault
    /// was queued, a range wake having let the thread go on). Woken, nothing installed.
    faults_stale,
    /// Faults served in the faulting thread itself, in its SIGBUS handler (signal mode).
    faults_in_thread,
    /// Pages written to the remote tier (acknowledged, and durable as configured).
    remote_out,
    /// Pages read back from the remote tier.
    remote_in,
    /// Payload bytes (compressed records) written to the remote tier.
    remote_bytes,
    /// Remote tier failures: batches not written, reads retried or failed, deletes lost.
    remote_errors,
    /// Remote pages whose fault failed after every retry (the thread got SIGBUS).
    remote_read_failed,
    /// Remote round trips (one per batch per node, one per fault read).
    remote_round_trips,
    /// Remote pages of a swap-in range served from the range's one prefetch round trip.
    remote_prefetch_hits,
}

impl Counters {
    /// Adds one fault of `us` microseconds to the latency histogram.
    pub fn record_fault_latency(&self, us: u64) {
        let bucket = (64 - us.leading_zeros() as usize).saturating_sub(1).min(LATENCY_BUCKETS - 1);
        self.fault_latency_us[bucket].fetch_add(1, Relaxed);
    }

    /// Raises `footprint_max` to `bytes` if it is higher.
    pub fn note_footprint(&self, bytes: u64) {
        self.footprint_max.fetch_max(bytes, Relaxed);
    }

    /// Adds one remote round trip of `us` microseconds to its histogram.
    pub fn record_remote_latency(&self, us: u64) {
        let bucket = (64 - us.leading_zeros() as usize).saturating_sub(1).min(LATENCY_BUCKETS - 1);
        self.remote_latency_us[bucket].fetch_add(1, Relaxed);
    }

    /// Remote latency histogram counts per bucket.
    pub fn remote_latency_histogram(&self) -> Vec<u64> {
        self.remote_latency_us.iter().map(|b| b.load(Relaxed)).collect()
    }

    /// Histogram counts per bucket.
    pub fn latency_histogram(&self) -> Vec<u64> {
        self.fault_latency_us.iter().map(|b| b.load(Relaxed)).collect()
    }
}

/// A pager's state at one instant: counters and gauges.
#[derive(Clone, Debug, Default, Serialize, serde::Deserialize)]
pub struct Stats {
    /// Event counters.
    pub counters: CounterSnapshot,
    /// The budget.
    pub budget: u64,
    /// What counts against the budget now: present + staged pages, pool, metadata.
    pub footprint: u64,
    /// Pages mapped in regions.
    pub present_pages: u64,
    /// Pages on the inactive list (staged).
    pub staged_pages: u64,
    /// Slots in use in the virtual swap space, all backends.
    pub swap_slots: u64,
    /// Slots holding zero pages.
    pub swap_zero_pages: u64,
    /// Slots holding same-filled pages.
    pub swap_samefill_pages: u64,
    /// Compressed bytes the pool holds (objects only).
    pub pool_stored_bytes: u64,
    /// Bytes the pool occupies (spans, counted against the budget).
    pub pool_total_size: u64,
    /// The pool limit in force (`PagerConfig::pool_adapt` moves it).
    #[serde(default)]
    pub pool_limit: u64,
    /// Pages in the pool.
    pub pool_stored_pages: u64,
    /// Pages in the file tier.
    pub file_pages: u64,
    /// Blocks (4 KiB) the file tier occupies.
    pub file_blocks: u64,
    /// Live bytes in the file tier.
    pub file_bytes: u64,
    /// Engine metadata bytes (ptes, swap tables, cluster headers, pool span headers).
    pub metadata_bytes: u64,
    /// Fault latency histogram (µs), see [`LATENCY_BUCKETS`].
    pub fault_latency_us: Vec<u64>,
    /// Remote round-trip latency histogram (µs), see [`LATENCY_BUCKETS`].
    #[serde(default)]
    pub remote_latency_us: Vec<u64>,
    /// Pages in the remote tier.
    #[serde(default)]
    pub remote_pages: u64,
    /// The ledger of the process tree whose budget this pager shares (`budget` is then
    /// its share), if any.
    #[serde(default)]
    pub tree_ledger: Option<String>,
    /// The tree's budget, bytes (0: no tree).
    #[serde(default)]
    pub tree_budget: u64,
}

impl Stats {
    /// The snapshot as a JSON object.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// The `p`-th percentile (0..=100) of fault latency in µs: the upper edge of the
    /// histogram bucket it falls in; 0 when no fault was recorded.
    pub fn fault_latency_percentile_us(&self, p: f64) -> u64 {
        let total: u64 = self.fault_latency_us.iter().sum();
        if total == 0 {
            return 0;
        }
        let rank = ((p / 100.0) * total as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        for (i, n) in self.fault_latency_us.iter().enumerate() {
            seen += n;
            if seen >= rank {
                return 1u64 << (i + 1);
            }
        }
        1u64 << LATENCY_BUCKETS
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets() {
        let c = Counters::default();
        for us in [0, 1, 2, 3, 4, 1000, u64::MAX] {
            c.record_fault_latency(us);
        }
        let h = c.latency_histogram();
        assert_eq!(h[0], 2); // 0 and 1
        assert_eq!(h[1], 2); // 2 and 3
        assert_eq!(h[2], 1); // 4
        assert_eq!(h[9], 1); // 1000 in [512, 1024)
        assert_eq!(h[LATENCY_BUCKETS - 1], 1);
        let s = Stats { fault_latency_us: h, ..Default::default() };
        assert_eq!(s.fault_latency_percentile_us(50.0), 4);
        assert_eq!(s.fault_latency_percentile_us(100.0), 1 << LATENCY_BUCKETS);
    }

    #[test]
    fn snapshot_and_json() {
        let c = Counters::default();
        c.zswpout.fetch_add(3, Relaxed);
        c.note_footprint(10);
        c.note_footprint(5);
        let s = c.snapshot();
        assert_eq!(s.zswpout, 3);
        assert_eq!(s.footprint_max, 10);
        let st = Stats { counters: s, ..Default::default() };
        assert_eq!(st.to_json()["counters"]["zswpout"], 3);
        assert!(st.counters.pairs().iter().any(|&(n, v)| n == "zswpout" && v == 3));
    }
}
