//! Giving slots back: a reference dropped, and with the last one the backend's storage
//! freed (the kernel's swap_free / swap_entry_free); and the pool's count of objects
//! recompression could still shrink, kept as entries are placed and freed.
//!
//! Owns: nothing. Calls: the swap space's entries, the backends.

use std::sync::atomic::Ordering;

use super::Shared;
use crate::backend::pool::PoolHandle;
use crate::page::PAGE_SIZE;
use crate::swap::{SwapEntry, Tag};

/// Objects shorter than this are not worth recompressing.
pub(crate) const RECOMPRESS_MIN_BYTES: usize = 256;

/// Drops one reference to `slot`; the last one frees the slot and its backend storage.
pub(crate) fn put_slot(s: &Shared, slot: u64) {
    let e = s.tiers.swap.lock(slot);
    release_entry(s, slot, e);
}

/// Drops one reference to locked entry `e` of `slot` and unlocks it: a slot shared with a
/// forked child (count > 1) keeps its bytes for the others.
pub(crate) fn release_entry(s: &Shared, slot: u64, e: SwapEntry) {
    if e.count() > 1 {
        s.tiers.swap.unlock(slot, e, e.with_count(e.count() - 1));
        return;
    }
    free_backend(s, e);
    s.tiers.swap.unlock(slot, e, SwapEntry::FREE);
}

/// Frees the storage behind a placed entry (not the slot).
pub(crate) fn free_backend(s: &Shared, e: SwapEntry) {
    match e.tag() {
        Tag::Pool => {
            let (h, len) = e.addr_len();
            if let Some(handle) = PoolHandle::from_raw(h) {
                s.tiers.pool.free(handle, len);
                crate::mm::slots::count_recompressible(s, e, false);
            }
        }
        Tag::File => {
            if let Some(f) = &s.tiers.file {
                let (off, len) = e.addr_len();
                f.free(off, len);
            }
        }
        Tag::Remote => {
            if let Some(r) = &s.tiers.remote {
                if r.free(e.addr_len().0) {
                    s.kick_writeback(false);
                }
            }
        }
        _ => {}
    }
}

/// Whether pool entry `e` is one recompression could still shrink: in the pool's
/// compressor, compressed (not a raw page) and not tiny, with a recompression codec set.
pub(crate) fn recompressible(s: &Shared, e: SwapEntry) -> bool {
    s.config.recompress.is_some_and(|c| c != s.config.compressor)
        && e.tag() == Tag::Pool
        && !e.recompressed()
        && (RECOMPRESS_MIN_BYTES..PAGE_SIZE).contains(&e.addr_len().1)
}

/// Counts pool entry `e` into `Shared::pool_recompressible` when it is placed (`placed`),
/// or out when its object is freed or moved, if it is [`recompressible`].
pub(crate) fn count_recompressible(s: &Shared, e: SwapEntry, placed: bool) {
    if !recompressible(s, e) {
        return;
    }
    if placed {
        s.tiers.pool_recompressible.fetch_add(1, Ordering::Relaxed);
    } else {
        let _ = s.tiers.pool_recompressible.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |n| n.checked_sub(1));
    }
}
