//! Reading a swapped page back: the bytes behind a locked swap entry, from whichever
//! backend holds them, into a page buffer (the swap-in side of the kernel's swap_io).
//!
//! Owns: [`read_entry`], the buffers a reader needs ([`IoBufs`]).
//! Calls: the swap space's entries, the backends, the pool share (file reads it notes).

use std::sync::atomic::Ordering;

use super::Shared;
use crate::backend::compress::Decompressor;
use crate::backend::file::{AlignedBuf, Served, UnitCache};
use crate::backend::pool::PoolHandle;
use crate::backend::remote::RemotePrefetch;
use crate::backend::zero::fill_pattern;
use crate::page::PAGE_SIZE;
use crate::swap::{SwapEntry, Tag};

/// One reader's buffers (a fault thread's, a child server's): nothing is allocated on the
/// way from a swap entry to its page.
pub(crate) struct IoBufs {
    /// One page being assembled for UFFDIO_COPY.
    pub(crate) page: AlignedBuf,
    /// The last file bytes read (pages evicted together come back together).
    pub(crate) unit: UnitCache,
    /// What [`read_entry`] needs besides the page and the unit copy.
    pub(crate) read: ReadIo,
}

/// A reader's compressed-bytes buffer, decompressor and remote prefetch.
pub(crate) struct ReadIo {
    /// Compressed bytes read from the file or the remote.
    pub(crate) compressed: Vec<u8>,
    /// Its own decompression context, made here (see [`Decompressor`]).
    pub(crate) dec: Decompressor,
    /// Remote objects of a swap-in range, fetched in one round trip per node.
    pub(crate) remote: RemotePrefetch,
}

impl IoBufs {
    /// Buffers for file units of `unit_bytes` and remote prefetches of `remote_pages`.
    pub(crate) fn new(unit_bytes: usize, remote_pages: usize) -> std::io::Result<IoBufs> {
        Ok(IoBufs {
            page: AlignedBuf::new(PAGE_SIZE)?,
            unit: UnitCache::new(unit_bytes)?,
            read: ReadIo {
                compressed: vec![0u8; PAGE_SIZE],
                dec: Decompressor::new()?,
                remote: RemotePrefetch::new(remote_pages),
            },
        })
    }
}

/// Why a slot's bytes could not be read.
#[derive(Debug)]
pub(crate) enum ReadFail {
    /// Checksum or structure mismatch.
    Corrupt(String),
    /// IO error.
    Io(String),
}

impl std::fmt::Display for ReadFail {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadFail::Corrupt(m) => write!(f, "corrupt: {m}"),
            ReadFail::Io(m) => write!(f, "read error: {m}"),
        }
    }
}

/// Reads the bytes of locked entry `e` (slot `slot`) into `page`. `Ok(false)` means a zero
/// page (nothing written to `page`). File records go through `unit`, the copy of file
/// bytes read last.
pub(crate) fn read_entry(
    s: &Shared,
    slot: u64,
    e: SwapEntry,
    page: &mut [u8],
    unit: &mut UnitCache,
    io: &mut ReadIo,
) -> Result<bool, ReadFail> {
    let ReadIo { compressed, dec, remote: remote_pf } = io;
    let page = &mut page[..PAGE_SIZE];
    let codec = if e.recompressed() {
        s.config.recompress.ok_or_else(|| {
            ReadFail::Corrupt(format!("slot {slot} is marked recompressed, but this pager recompresses nothing"))
        })?
    } else {
        s.config.compressor
    };
    match e.tag() {
        Tag::Zero => {
            s.counters.swpin_zero.fetch_add(1, Ordering::Relaxed);
            Ok(false)
        }
        Tag::SameFilled => {
            fill_pattern(page, e.pattern());
            s.counters.swpin_samefill.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }
        Tag::Pool => {
            let (h, len) = e.addr_len();
            let handle = PoolHandle::from_raw(h).ok_or_else(|| ReadFail::Corrupt(format!("bad pool handle {h:#x}")))?;
            // SAFETY: the entry is locked and points at this object, so it stays allocated
            // until we unlock.
            let obj = unsafe { s.tiers.pool.object(handle, len) };
            if len == PAGE_SIZE {
                page.copy_from_slice(obj);
            } else {
                dec.decompress(codec, obj, page).map_err(|err| {
                    ReadFail::Corrupt(format!("pool object of slot {slot} does not decompress: {err}"))
                })?;
            }
            s.counters.zswpin.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }
        Tag::File => {
            let file =
                s.tiers.file.as_ref().ok_or_else(|| ReadFail::Corrupt("file entry without a file tier".into()))?;
            let (off, len) = e.addr_len();
            let served = file.read_cached(off, len, slot, unit, compressed).map_err(|err| match err {
                crate::backend::file::FileError::Corrupt { .. } => {
                    s.counters.checksum_errors.fetch_add(1, Ordering::Relaxed);
                    ReadFail::Corrupt(err.to_string())
                }
                _ => {
                    s.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                    ReadFail::Io(err.to_string())
                }
            })?;
            if served != Served::Cached && s.tiers.pool_share.is_adaptive() {
                s.tiers.pool_share.note_file_read(file.bytes_written_since(off));
            }
            match served {
                Served::Cached => s.counters.file_unit_hits.fetch_add(1, Ordering::Relaxed),
                Served::Read => s.counters.file_unit_reads.fetch_add(1, Ordering::Relaxed),
                Served::Reread => {
                    s.counters.file_reads_batched_stale.fetch_add(1, Ordering::Relaxed);
                    s.counters.file_unit_reads.fetch_add(1, Ordering::Relaxed)
                }
                Served::Filled => 0,
            };
            if len == PAGE_SIZE {
                page.copy_from_slice(&compressed[..PAGE_SIZE]);
            } else {
                dec.decompress(codec, &compressed[..len], page).map_err(|err| {
                    ReadFail::Corrupt(format!("file record of slot {slot} does not decompress: {err}"))
                })?;
            }
            s.counters.pswpin.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }
        Tag::Remote => {
            let remote = s
                .tiers
                .remote
                .as_ref()
                .ok_or_else(|| ReadFail::Corrupt("remote entry without a remote tier".into()))?;
            let (version, len) = e.addr_len();
            remote.get_prefetched(remote_pf, slot, version, len, compressed, &s.counters).map_err(|err| {
                s.counters.remote_read_failed.fetch_add(1, Ordering::Relaxed);
                ReadFail::Io(format!("remote tier: {err}"))
            })?;
            if len == PAGE_SIZE {
                page.copy_from_slice(&compressed[..PAGE_SIZE]);
            } else {
                dec.decompress(codec, &compressed[..len], page).map_err(|err| {
                    ReadFail::Corrupt(format!("remote object of slot {slot} does not decompress: {err}"))
                })?;
            }
            s.counters.remote_in.fetch_add(1, Ordering::Relaxed);
            Ok(true)
        }
        Tag::Free | Tag::Reserved => Err(ReadFail::Corrupt(format!("slot {slot} is {:?}, not a placed page", e.tag()))),
    }
}
