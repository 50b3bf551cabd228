//! Draining the file tier ("swapoff"): every record moves into the pool still compressed,
//! only the swap entries change (no pte does), and the emptied file is truncated.
//!
//! Owns: nothing. Calls: the swap space's entries, the file and the pool.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use crate::backend::file::{FileError, UnitCache};
use crate::mm::slots::count_recompressible;
use crate::mm::Shared;
use crate::page::PAGE_SIZE;
use crate::swap::{SwapEntry, SwapSpace, Tag};

/// What a [`Pager::drain`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct DrainReport {
    /// Pages moved off the tier.
    pub moved: u64,
    /// Pages whose record could not be read (left in place; their next touch gets SIGBUS).
    pub unreadable: u64,
    /// Pages left on the tier (unreadable, or nowhere to put them).
    pub left: u64,
    /// The file's size afterwards, bytes.
    pub file_len_bytes: u64,
}

/// Empties the file tier into the pool ("swapoff" without walking a page table): stops new
/// writes to the file, waits for the unit in flight, then walks the swap table cluster by
/// cluster and re-points every file entry at a pool copy of its record (still compressed),
/// freeing the record. Faults and evictions go on meanwhile; each entry changes under its
/// lock. The file shrinks to nothing as its units empty.
pub(crate) fn drain_file(s: &Arc<Shared>) -> DrainReport {
    let mut report = DrainReport::default();
    let Some(file) = s.tiers.file.as_ref() else {
        return report;
    };
    s.tiers.file_off.store(true, Ordering::Release);
    drop(s.tiers.file_gate.write().unwrap_or_else(|e| e.into_inner()));
    let mut cache = match UnitCache::new(file.unit_bytes()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("tierswap: drain cannot map a read buffer: {e}");
            report.left = s.tiers.swap.count(Tag::File);
            report.file_len_bytes = file.file_len_bytes();
            return report;
        }
    };
    let mut payload = vec![0u8; PAGE_SIZE];
    let mut unreadable = std::collections::HashSet::new();
    for cid in 0..s.tiers.swap.clusters_ever_used() {
        if s.wake.shutdown.load(Ordering::Acquire) {
            break;
        }
        for slot in SwapSpace::cluster_slots(cid) {
            if s.tiers.swap.load(slot).tag() != Tag::File {
                continue;
            }
            let e = s.tiers.swap.lock(slot);
            if e.tag() != Tag::File {
                s.tiers.swap.unlock(slot, e, e);
                continue;
            }
            let (off, len) = e.addr_len();
            match file.read_cached(off, len, slot, &mut cache, &mut payload) {
                Ok(_) => {}
                Err(err) => {
                    if matches!(err, FileError::Corrupt { .. }) {
                        s.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
                    } else {
                        s.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                    }
                    eprintln!("tierswap: drain leaves slot {slot} on the file: {err}");
                    unreadable.insert(slot);
                    s.tiers.swap.unlock(slot, e, e);
                    continue;
                }
            }
            let handle = match s.tiers.pool.store(&payload[..len]) {
                Ok(h) => h,
                Err(err) => {
                    eprintln!("tierswap: drain stops: the pool cannot take more ({err:?})");
                    s.tiers.swap.unlock(slot, e, e);
                    report.left = s.tiers.swap.count(Tag::File);
                    report.unreadable = unreadable.len() as u64;
                    report.file_len_bytes = file.file_len_bytes();
                    return report;
                }
            };
            let place = SwapEntry::pool(handle.raw(), len).with_recompressed(e.recompressed());
            let new = e.with_place(Tag::Pool, place.location());
            s.tiers.swap.unlock(slot, e, new);
            count_recompressible(s, new, true);
            file.free(off, len);
            report.moved += 1;
        }
        // Let reclaim keep up with the pool growing.
        if s.footprint_bytes() > s.high_watermark() {
            s.kick_reclaim();
        }
    }
    s.kick_reclaim();
    report.unreadable = unreadable.len() as u64;
    report.left = s.tiers.swap.count(Tag::File);
    report.file_len_bytes = file.file_len_bytes();
    report
}
