//! The file tier: a log of sealed, still-compressed records in one unlinked 0600 file.
//!
//! Space is allocated when writeback writes, never before (001: "allocate physical space at
//! writeback"), a unit (64 KiB by default) at a time: many records per write, written
//! sequentially into the lowest free unit, which is what flash likes. A unit whose last
//! record is freed goes back on the free set (and the file is truncated when it was the
//! tail); its blocks stay allocated for the next unit written there ([`FileTier::free`]).
//! The file is opened O_DIRECT where the filesystem allows, so swapped data does not sit in
//! the page cache outside the budget.
//!
//! Every record is sealed when its unit is written, one of two ways chosen at creation
//! ([`crate::PagerConfig::encrypt`]): encrypted and authenticated with AES-256-GCM under
//! a key that exists only in this process's memory (the default), or checksummed with
//! crc32c only. Both layouts are drawn above [`Sealer::seal_record`]. A record read back is
//! returned only when it opens for the slot, length, file offset and unit write generation
//! the caller expects: a flipped bit, a record moved to another offset or slot, or an older
//! copy of a unit written back over the current one (replay) fails as [`FileError::Corrupt`].
//! The generations live here, in memory, one per unit, never in the file.
//!
//! Owns: the file, unit allocation, record sealing, the key. Calls: the OS
//! (pread/pwrite/ftruncate, getrandom, mlock).

use std::fs::File;
use std::io;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use aes_gcm::aead::consts::U12;
use aes_gcm::aead::inout::InOutBuf;
use aes_gcm::{AeadInOut, Aes256Gcm, Key, KeyInit, Nonce, Tag};
use zeroize::Zeroize;

use crate::page::{round_up, PAGE_SIZE};
use crate::sys;

/// Bytes of a record header (the crc32c header, or the GCM tag).
pub const RECORD_HEADER_BYTES: usize = 16;
const MAGIC: u16 = 0x7453;
/// Bytes of a GCM tag.
const TAG_BYTES: usize = 16;
/// Bytes of the file key.
const KEY_BYTES: usize = 32;
/// Alignment of direct IO offsets and lengths.
const IO_ALIGN: usize = PAGE_SIZE;
/// Default bytes per unit (one write).
pub use crate::config::DEFAULT_FILE_UNIT_BYTES as DEFAULT_UNIT_BYTES;

/// A file tier error.
#[derive(Debug, thiserror::Error)]
pub enum FileError {
    /// The OS refused a read or write.
    #[error("swap file {op} at offset {offset}: {source}")]
    Io {
        /// read or write.
        op: &'static str,
        /// Byte offset in the file.
        offset: u64,
        /// The OS error.
        source: io::Error,
    },
    /// A record did not open: its checksum or tag, slot, length, offset or generation differ.
    #[error("swap file record at offset {offset} for slot {slot} is corrupt ({what})")]
    Corrupt {
        /// Byte offset of the record.
        offset: u64,
        /// The slot the entry expected.
        slot: u64,
        /// Which check failed.
        what: &'static str,
    },
    /// The file tier is drained and takes no new records.
    #[error("the file tier is drained")]
    Off,
    /// The unit write counter, which makes every nonce unique under the key, ran out.
    #[error("the swap file's unit write counter is exhausted under its key; restart the pager for a new key")]
    CounterExhausted,
}

/// Bytes a record of `len` payload bytes takes in a unit (either sealing).
#[inline]
pub const fn record_bytes(len: usize) -> usize {
    round_up(RECORD_HEADER_BYTES + len, 16)
}

/// The IO-aligned file span `[from, to)` a read of file bytes `[lo, hi)` takes (O_DIRECT).
/// A read ahead and the read it serves compute their spans here, so they match.
fn io_span(lo: u64, hi: u64) -> (u64, u64) {
    (lo - lo % IO_ALIGN as u64, round_up(hi as usize, IO_ALIGN) as u64)
}

fn record_crc(slot: u64, len: u16, payload: &[u8]) -> u32 {
    let c = crc32c::crc32c(&len.to_le_bytes());
    let c = crc32c::crc32c_append(c, &slot.to_le_bytes());
    crc32c::crc32c_append(c, payload)
}

/// A buffer aligned for direct IO, from our own mmap (not the program's allocator).
pub struct AlignedBuf {
    addr: usize,
    len_bytes: usize,
}

// SAFETY: an owned mapping, like a Box<[u8]>.
unsafe impl Send for AlignedBuf {}

impl AlignedBuf {
    /// A zeroed buffer of `len_bytes` rounded up to pages.
    pub fn new(len_bytes: usize) -> io::Result<AlignedBuf> {
        let len_bytes = crate::page::round_up_pages(len_bytes);
        Ok(AlignedBuf { addr: sys::mmap_anon(len_bytes, 0)?, len_bytes })
    }

    /// The bytes.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: our mapping of len_bytes, alive as long as self.
        unsafe { std::slice::from_raw_parts(self.addr as *const u8, self.len_bytes) }
    }

    /// The bytes, mutably.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: our mapping of len_bytes, alive as long as self, borrowed mutably once.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, self.len_bytes) }
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len_bytes
    }

    /// Never empty.
    pub fn is_empty(&self) -> bool {
        false
    }
}

impl Drop for AlignedBuf {
    fn drop(&mut self) {
        // SAFETY: our mapping; no borrow outlives self.
        let _ = unsafe { sys::munmap(self.addr, self.len_bytes) };
    }
}

/// The pager's file key: 32 bytes from the OS random source, in a page of its own mapped
/// outside the program's allocator, locked so the kernel does not swap it out (best
/// effort: RLIMIT_MEMLOCK may refuse), left out of core dumps, and zeroed before it is
/// unmapped. It is never written anywhere and has no readable `Debug`.
pub struct SealKey {
    addr: usize,
}

// SAFETY: an owned mapping written once, at creation, and only read afterwards.
unsafe impl Send for SealKey {}
// SAFETY: after creation the key page is only read, through `&self`.
unsafe impl Sync for SealKey {}

impl SealKey {
    /// A fresh key from getrandom(2).
    pub fn generate() -> io::Result<SealKey> {
        let addr = sys::mmap_anon(PAGE_SIZE, 0)?;
        // From here `key`'s Drop zeroes and unmaps the page on every error path.
        let mut key = SealKey { addr };
        // SAFETY: our fresh page; mlock and MADV_DONTDUMP change how the kernel keeps it, not
        // its contents. Failing either weakens only where the key could leak, so it is ignored.
        unsafe {
            libc::mlock(addr as *const libc::c_void, PAGE_SIZE);
            let _ = sys::madvise(addr, PAGE_SIZE, libc::MADV_DONTDUMP);
        }
        getrandom::fill(key.bytes_mut()).map_err(|e| {
            io::Error::other(format!(
                "cannot draw the swap file key from the OS random source (getrandom): {e}; \
                 check that /dev/urandom works, or leave out the file tier"
            ))
        })?;
        Ok(key)
    }

    fn bytes_mut(&mut self) -> &mut [u8] {
        // SAFETY: the first KEY_BYTES of our own page, alive as long as self, borrowed
        // mutably through &mut self.
        unsafe { std::slice::from_raw_parts_mut(self.addr as *mut u8, KEY_BYTES) }
    }

    /// A cipher for one use; it copies the key to the stack and zeroes that copy on drop.
    fn cipher(&self) -> Aes256Gcm {
        // SAFETY: the first KEY_BYTES of our own page, alive as long as self; after
        // `generate` nothing writes them until Drop. `Key<Aes256Gcm>` is `Array<u8, U32>`, a
        // repr(transparent) newtype of `[u8; 32]` (align 1), so the page start is a valid one.
        let key = unsafe { &*(self.addr as *const Key<Aes256Gcm>) };
        Aes256Gcm::new(key)
    }
}

impl std::fmt::Debug for SealKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SealKey(<secret>)")
    }
}

impl Drop for SealKey {
    fn drop(&mut self) {
        self.bytes_mut().zeroize();
        // SAFETY: our page; no borrow outlives self.
        let _ = unsafe { sys::munmap(self.addr, PAGE_SIZE) };
    }
}

/// Everything a record's seal binds besides its bytes: who it belongs to and where and
/// when it was written. The reader rebuilds it from the swap entry and the unit index,
/// never from the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RecordPlace {
    /// The slot the record holds.
    pub slot: u64,
    /// Payload bytes (1..=4096).
    pub len_bytes: usize,
    /// File offset of the record's first byte.
    pub offset: u64,
    /// Byte offset of the record within its unit.
    pub idx_in_unit: u32,
    /// The unit's write generation: the tier's unit write counter when the unit was written.
    pub generation: u64,
}

impl RecordPlace {
    /// `| generation (u64 LE) | offset in unit (u32 LE) |`: unique per record under one
    /// key, because no two unit writes share a generation and no two records of one write
    /// share an offset.
    fn nonce(&self) -> Nonce<U12> {
        let mut n = [0u8; 12];
        n[..8].copy_from_slice(&self.generation.to_le_bytes());
        n[8..].copy_from_slice(&self.idx_in_unit.to_le_bytes());
        Nonce::from(n)
    }

    /// `| slot (u64 LE) | len (u16 LE) | file offset (u64 LE) | generation (u64 LE) |`
    fn aad(&self) -> [u8; 26] {
        let mut a = [0u8; 26];
        a[..8].copy_from_slice(&self.slot.to_le_bytes());
        a[8..10].copy_from_slice(&(self.len_bytes as u16).to_le_bytes());
        a[10..18].copy_from_slice(&self.offset.to_le_bytes());
        a[18..].copy_from_slice(&self.generation.to_le_bytes());
        a
    }
}

/// How the records of one tier are sealed.
pub enum Sealer {
    /// crc32c over length, slot and payload: catches accidents, not an attacker.
    Crc32c,
    /// AES-256-GCM under the pager's ephemeral key.
    Aead(SealKey),
}

impl std::fmt::Debug for Sealer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Sealer::Crc32c => "Sealer::Crc32c",
            Sealer::Aead(_) => "Sealer::Aead",
        })
    }
}

/// Why a record did not open (the `what` of [`FileError::Corrupt`]).
const AUTH_FAILED: &str = "authentication failed: tampered with, replayed or moved";

impl Sealer {
    /// A sealer for `encrypt` (a fresh key) or crc32c only.
    pub fn new(encrypt: bool) -> io::Result<Sealer> {
        Ok(if encrypt { Sealer::Aead(SealKey::generate()?) } else { Sealer::Crc32c })
    }

    /// Whether records are encrypted.
    pub fn is_encrypted(&self) -> bool {
        matches!(self, Sealer::Aead(_))
    }

    /// Seals the staged record `rec` (its [`record_bytes`] bytes, payload at 16, staged by
    /// [`UnitWriter::push`]) in place for `at`.
    ///
    /// crc32c (`encrypt = false`):
    /// ```text
    ///  0        2        4            8                  16                 16 + len
    /// +--------+--------+------------+------------------+--------------------+---------+
    /// | magic  |  len   |  crc32c    |  slot (u64 LE)   |  payload (len B)   | pad→16  |
    /// +--------+--------+------------+------------------+--------------------+---------+
    ///  crc32c covers len, slot and payload; the record opens only when magic, len, slot
    ///  and crc all match what the swap entry expects.
    /// ```
    /// AES-256-GCM (the default):
    /// ```text
    ///  0                                  16                      16 + len
    /// +-----------------------------------+-----------------------+---------+
    /// |  GCM tag (16 B)                   |  ciphertext (len B)   | pad→16  |
    /// +-----------------------------------+-----------------------+---------+
    ///  nonce (never stored): | unit generation (u64 LE) | offset in unit (u32 LE) |
    ///  AAD   (never stored): | slot (u64) | len (u16) | file offset (u64) | generation (u64) |
    /// ```
    /// Nothing on disk says which slot a ciphertext is for or how long it is: the reader
    /// brings slot and length from the swap entry, the generation from the unit index in
    /// memory. An older copy of the unit, a record at another offset, or any flipped bit
    /// fails the tag. The record is the same size either way.
    pub fn seal_record(&self, rec: &mut [u8], at: &RecordPlace) -> Result<(), FileError> {
        let len = at.len_bytes;
        match self {
            Sealer::Crc32c => {
                let crc = record_crc(at.slot, len as u16, &rec[16..16 + len]);
                rec[0..2].copy_from_slice(&MAGIC.to_le_bytes());
                rec[2..4].copy_from_slice(&(len as u16).to_le_bytes());
                rec[4..8].copy_from_slice(&crc.to_le_bytes());
                rec[8..16].copy_from_slice(&at.slot.to_le_bytes());
            }
            Sealer::Aead(key) => {
                let (head, body) = rec.split_at_mut(TAG_BYTES);
                let tag = key
                    .cipher()
                    .encrypt_inout_detached(&at.nonce(), &at.aad(), InOutBuf::from(&mut body[..len]))
                    .map_err(|_| FileError::Corrupt { offset: at.offset, slot: at.slot, what: "cannot seal" })?;
                head.copy_from_slice(&tag);
            }
        }
        Ok(())
    }

    /// Undoes [`Sealer::seal_record`] in the writer (after a failed write), restoring the
    /// staged record so the unit can be written again.
    fn unseal_record(&self, rec: &mut [u8], at: &RecordPlace) {
        if let Sealer::Aead(key) = self {
            let (head, body) = rec.split_at_mut(TAG_BYTES);
            let opened = Tag::try_from(&head[..]).map_err(|_| ()).and_then(|tag| {
                let body = InOutBuf::from(&mut body[..at.len_bytes]);
                key.cipher().decrypt_inout_detached(&at.nonce(), &at.aad(), body, &tag).map_err(|_| ())
            });
            debug_assert!(opened.is_ok(), "a record this writer just sealed must open");
        }
        stage_header(rec, at.slot, at.len_bytes);
    }

    /// Opens the sealed record `rec` (its [`record_bytes`] bytes) for `at` into
    /// `out[..len]`. On error `out` holds no byte of the record.
    pub fn open_record(&self, rec: &[u8], at: &RecordPlace, out: &mut [u8]) -> Result<(), FileError> {
        let len = at.len_bytes;
        let corrupt = |what| FileError::Corrupt { offset: at.offset, slot: at.slot, what };
        if rec.len() < record_bytes(len) || out.len() < len {
            return Err(corrupt("record shorter than its length"));
        }
        match self {
            Sealer::Crc32c => {
                if u16::from_le_bytes([rec[0], rec[1]]) != MAGIC {
                    return Err(corrupt("bad magic"));
                }
                let rlen = u16::from_le_bytes([rec[2], rec[3]]);
                if rlen as usize != len {
                    return Err(corrupt("length differs from the swap entry"));
                }
                let rslot = u64::from_le_bytes([rec[8], rec[9], rec[10], rec[11], rec[12], rec[13], rec[14], rec[15]]);
                if rslot != at.slot {
                    return Err(corrupt("record belongs to another slot"));
                }
                let payload = &rec[16..16 + len];
                if u32::from_le_bytes([rec[4], rec[5], rec[6], rec[7]]) != record_crc(at.slot, rlen, payload) {
                    return Err(corrupt("checksum mismatch"));
                }
                out[..len].copy_from_slice(payload);
            }
            Sealer::Aead(key) => {
                let tag = Tag::try_from(&rec[..TAG_BYTES]).map_err(|_| corrupt("record shorter than its tag"))?;
                // Decrypts straight from the read buffer into the caller's: no copy of the
                // ciphertext, no allocation. The tag is checked before anything is written.
                let io = InOutBuf::new(&rec[TAG_BYTES..TAG_BYTES + len], &mut out[..len])
                    .map_err(|_| corrupt("record shorter than its length"))?;
                key.cipher()
                    .decrypt_inout_detached(&at.nonce(), &at.aad(), io, &tag)
                    .map_err(|_| corrupt(AUTH_FAILED))?;
            }
        }
        Ok(())
    }
}

/// Writes the staging header of a record (the crc32c header without its crc): what
/// [`UnitWriter::push`] leaves until the unit is sealed.
fn stage_header(rec: &mut [u8], slot: u64, len: usize) {
    rec[0..2].copy_from_slice(&MAGIC.to_le_bytes());
    rec[2..4].copy_from_slice(&(len as u16).to_le_bytes());
    rec[4..8].fill(0);
    rec[8..16].copy_from_slice(&slot.to_le_bytes());
}

/// A fault thread's copy of file bytes it read (see [`FileTier::fill`]): whole units, the
/// records of one 64 KiB block, or the pages of one record. Bytes `[start, end)` of the
/// file sit in `buf[..end - start]`; `start` is IO-aligned, and the copy overlaps at most
/// two adjacent units from `first_unit` on, each with the write generation it had when
/// read.
///
/// What the next miss reads is learnt from what the copies before it served:
/// - whole units (the default, and always when [`UnitCache::whole`] is set): pays when a
///   later request, outside the block the copy was read for, is served from it (in-order
///   access: the next block's records follow in the same unit);
/// - the block's records: pays when a later request of the same block is served
///   from it (a lone fault, then the rest of its block as one large swap-in);
/// - the record alone (4–8 KiB: ~70 µs against ~140 µs for 64 KiB on this machine's disk):
///   scattered faults.
///
/// Whole reads stop after two whole copies in a row served no other block, and come back
/// when two smaller copies in a row each served another block or fell in the unit of the
/// read before; block
/// reads come back when a read needs records among or beside those the last read was for.
pub struct UnitCache {
    /// A unit and a block's worth more ([`UnitCache::bytes`]): a request's records may
    /// straddle a unit boundary.
    buf: AlignedBuf,
    start: u64,
    end: u64,
    first_unit: u64,
    /// Write generation of `first_unit` and the unit after it, when read.
    generations: [u64; 2],
    /// Which of those two units the copy holds whole.
    whole_unit: [bool; 2],
    /// The request the last read was for: the records it needed then (served by that IO,
    /// so not counted as hits) and the records of their block.
    fresh: (u64, u64),
    for_block: (u64, u64),
    /// The copy read whole units / the block's records beyond the need.
    read_whole: bool,
    read_block: bool,
    /// It served a request outside its block / a later request inside it.
    served_beyond: bool,
    served_block: bool,
    /// The bytes last read came from a read ahead (`FileTier::read_ahead_record`): a record
    /// that does not open is read again, as a cached one is.
    from_ahead: bool,
    /// Read whole units on a miss whatever was learnt (a readahead follows and wants them).
    pub whole: bool,
    whole_pays: bool,
    /// Whole copies in a row that served no other block.
    whole_idle: u8,
    /// Smaller copies in a row that served another block, or read in the unit the one
    /// before had read in.
    small_beyond: u8,
    block_pays: bool,
}

impl UnitCache {
    /// A fill served from the copy: what served it, for what the copy learns.
    fn note_hit(&mut self, need: (u64, u64)) {
        if !within(need, self.for_block) {
            self.served_beyond = true;
        } else if !within(need, self.fresh) {
            self.served_block = true;
        }
        self.fresh = NO_RANGE;
    }

    /// A miss for file bytes `need` (units of `ub` bytes): learn from the copy it replaces
    /// whether whole units, or the rest of a block, would have paid.
    fn learn_from_miss(&mut self, need: (u64, u64), ub: u64, evidence: u8) {
        if self.end <= self.start {
            return;
        }
        if self.read_whole {
            // Two whole copies in a row that served no other block: stop (one alone may be
            // a stream's gap, such as a page that was in the pool).
            self.whole_idle = if self.served_beyond { 0 } else { self.whole_idle.saturating_add(1) };
            self.whole_pays = self.whole_idle < 2;
        } else {
            // A smaller copy served another block, or two smaller reads fell in one unit:
            // the whole unit would have served both. Once is what scattered faults do by
            // chance (pages evicted together share a unit, and a record's 4 KiB read holds
            // its neighbours): redis under uniform GETs turned whole reads back on every few
            // faults, and a third of its file reads were 128 KiB ones at 2–3× the time of a
            // 4–8 KiB read (`bench programs`, `perf trace`). Twice in a row is a stream.
            let beyond = self.served_beyond || self.first_unit == need.0 / ub || self.first_unit == (need.1 - 1) / ub;
            self.small_beyond = if beyond { self.small_beyond.saturating_add(1) } else { 0 };
            if self.small_beyond >= evidence {
                (self.whole_pays, self.whole_idle, self.small_beyond) = (true, 0, 0);
            }
        }
        if self.read_block {
            self.block_pays = self.served_block || self.served_beyond;
        } else if self.fresh.0 <= need.1 && need.0 <= self.fresh.1 {
            // The last read was for records among or beside the ones needed now (a lone
            // fault, then the rest of its block): reading the block then would have saved
            // this read. (Not the block: a lone fault in the next block of a stride is no
            // such evidence.)
            self.block_pays = true;
        }
    }
}

impl UnitCache {
    /// An empty cache for units of `unit_bytes`.
    pub fn new(unit_bytes: usize) -> io::Result<UnitCache> {
        Ok(UnitCache {
            buf: AlignedBuf::new(UnitCache::bytes(unit_bytes))?,
            start: 0,
            end: 0,
            first_unit: 0,
            generations: [0; 2],
            whole_unit: [false; 2],
            fresh: NO_RANGE,
            for_block: NO_RANGE,
            read_whole: false,
            read_block: false,
            served_beyond: false,
            served_block: false,
            from_ahead: false,
            whole: false,
            whole_pays: true,
            whole_idle: 0,
            small_beyond: 0,
            block_pays: true,
        })
    }

    /// Bytes of the buffer for units of `unit_bytes`: a unit, and room for a block's
    /// records that straddle into the next (the next whole, for 64 KiB units).
    pub fn bytes(unit_bytes: usize) -> usize {
        let block_span = round_up(crate::page::BLOCK_PAGES * record_bytes(PAGE_SIZE), IO_ALIGN);
        unit_bytes + unit_bytes.min(block_span)
    }

    /// Whether a miss now would read more than the records it needs: worth finding the
    /// records of the rest of the block (and locking one in each unit they reach).
    pub fn wants_block(&self) -> bool {
        self.whole || self.whole_pays || self.block_pays
    }

    /// Bytes of the copy (tests).
    #[cfg(test)]
    fn span(&self) -> u64 {
        self.end - self.start
    }

    /// Whether file bytes `[lo, hi)` are in the copy, with their units' generations `now`
    /// (indexed from `lo`'s unit).
    fn holds(&self, lo: u64, hi: u64, unit_bytes: u64, now: [u64; 2]) -> bool {
        if self.start > lo || hi > self.end {
            return false;
        }
        let (u0, u1) = (lo / unit_bytes, (hi - 1) / unit_bytes);
        (u0..=u1).all(|u| {
            let i = (u - self.first_unit) as usize;
            i < 2 && self.generations[i] == now[(u - u0) as usize]
        })
    }
}

/// Where [`FileTier::read_cached`] found a record.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Served {
    /// In a copy read before this request: a hit.
    Cached,
    /// In the copy the request's [`FileTier::fill`] read just before.
    Filled,
    /// Not in the copy: read now (one IO).
    Read,
    /// Read now (one IO) after the bytes a read ahead brought did not open: the generation
    /// check should make this never happen (`FileTier::read_ahead_record`).
    Reread,
}

/// A byte range that holds nothing and touches nothing.
const NO_RANGE: (u64, u64) = (u64::MAX, u64::MAX);

/// Whether `inner` lies within `outer` (half-open byte ranges).
fn within(inner: (u64, u64), outer: (u64, u64)) -> bool {
    outer.0 <= inner.0 && inner.1 <= outer.1
}

/// One unit being filled with records before it is written. Records sit in it staged
/// (plain); [`FileTier::write_unit`] seals them in place as it writes the unit, and
/// unseals them first if the same records are written again. A writer serves one tier.
pub struct UnitWriter {
    buf: AlignedBuf,
    used_bytes: usize,
    /// (slot, payload length) of each record, in order: what sealing binds.
    staged: Vec<(u64, u16)>,
    /// Set by a successful write: the first `n` records are sealed for (base, generation).
    sealed: Option<(u64, u64, usize)>,
}

impl UnitWriter {
    /// A writer for units of `unit_bytes`.
    pub fn new(unit_bytes: usize) -> io::Result<UnitWriter> {
        Ok(UnitWriter {
            buf: AlignedBuf::new(unit_bytes)?,
            used_bytes: 0,
            staged: Vec::with_capacity(64),
            sealed: None,
        })
    }

    /// Appends a record for `slot`; returns its offset within the unit, or `None` when the
    /// unit has no room left for it.
    pub fn push(&mut self, slot: u64, payload: &[u8]) -> Option<usize> {
        assert!(!payload.is_empty() && payload.len() <= PAGE_SIZE);
        let rec = record_bytes(payload.len());
        if self.used_bytes + rec > self.buf.len() {
            return None;
        }
        let off = self.used_bytes;
        let b = &mut self.buf.as_mut_slice()[off..off + rec];
        stage_header(b, slot, payload.len());
        b[16..16 + payload.len()].copy_from_slice(payload);
        b[16 + payload.len()..].fill(0);
        self.used_bytes += rec;
        self.staged.push((slot, payload.len() as u16));
        Some(off)
    }

    /// Records in the unit.
    pub fn records(&self) -> usize {
        self.staged.len()
    }

    /// Bytes used.
    pub fn used_bytes(&self) -> usize {
        self.used_bytes
    }

    /// Bytes the write of this unit puts on disk (used bytes rounded up to the IO size).
    pub fn io_bytes(&self) -> usize {
        round_up(self.used_bytes, IO_ALIGN)
    }

    /// Empties the writer for the next unit.
    pub fn clear(&mut self) {
        self.used_bytes = 0;
        self.staged.clear();
        self.sealed = None;
    }
}

/// Each staged record's offset in the writer and its place when the unit is written at
/// `base` with `generation`.
fn places(staged: &[(u64, u16)], base: u64, generation: u64) -> impl Iterator<Item = (usize, RecordPlace)> + '_ {
    let mut off = 0usize;
    staged.iter().map(move |&(slot, len)| {
        let at = off;
        off += record_bytes(len as usize);
        let place =
            RecordPlace { slot, len_bytes: len as usize, offset: base + at as u64, idx_in_unit: at as u32, generation };
        (at, place)
    })
}

struct Units {
    /// Live record bytes per unit.
    live_bytes: Vec<u32>,
    /// Per unit: the generation of its last write (the value of `next_generation` then).
    /// Sealed into every record of the unit, so a copy of an older write of the same
    /// unit does not open; it also tells whether a cached copy is still the unit on disk.
    generation: Vec<u64>,
    /// The unit write counter: never repeats under the tier's key, starts at 1.
    next_generation: u64,
    /// Units with no live record below `live_bytes.len()`, lowest used first.
    free: std::collections::BTreeSet<u32>,
}

/// The file tier of one pager.
pub struct FileTier {
    file: File,
    path_shown: PathBuf,
    direct: bool,
    unit_bytes: usize,
    sealer: Sealer,
    units: Mutex<Units>,
    live_bytes: AtomicU64,
    live_records: AtomicU64,
    units_in_use: AtomicU64,
    /// Whole reads take the unit after the records' last one too, when the buffer holds it
    /// ([`FileTier::set_read_next_unit`]).
    read_next_unit: std::sync::atomic::AtomicBool,
    /// Smaller copies in a row whose evidence turns whole reads back on
    /// ([`FileTier::set_whole_evidence`]).
    whole_evidence: std::sync::atomic::AtomicU8,
}

impl FileTier {
    /// How many smaller copies in a row must each have served another block (or read in
    /// the unit of the read before) before whole-unit reads come back
    /// (`PagerConfig::file_whole_evidence`; at least 1).
    pub fn set_whole_evidence(&self, copies: u8) {
        self.whole_evidence.store(copies.max(1), Ordering::Relaxed);
    }

    /// Whole-unit reads also take the next unit (`PagerConfig::file_read_next_unit`): a
    /// 128 KiB read where the records reach one 64 KiB unit. That unit is not held by the
    /// reader, so a write can be filling it while it is read; its copy then claims the new
    /// generation with older bytes, and [`FileTier::read_cached`] reads a record that does
    /// not open from such a copy again from the disk before calling it corrupt.
    pub fn set_read_next_unit(&self, on: bool) {
        self.read_next_unit.store(on, Ordering::Relaxed);
    }

    /// Creates the swap file in `dir`: O_TMPFILE (never visible in the directory), else a
    /// uniquely named file unlinked at once; mode 0600 either way. With `encrypt`, records
    /// are encrypted under a key drawn now, which lives only in this tier's memory.
    pub fn create(dir: &Path, unit_bytes: usize, encrypt: bool) -> io::Result<FileTier> {
        let unit_bytes = round_up(unit_bytes.max(IO_ALIGN), IO_ALIGN);
        let sealer = Sealer::new(encrypt)?;
        let (file, direct) = open_unlinked(dir)?;
        Ok(FileTier {
            file,
            path_shown: dir.join("(unlinked tierswap swap file)"),
            direct,
            unit_bytes,
            sealer,
            units: Mutex::new(Units {
                live_bytes: Vec::new(),
                generation: Vec::new(),
                next_generation: 1,
                free: Default::default(),
            }),
            live_bytes: AtomicU64::new(0),
            live_records: AtomicU64::new(0),
            units_in_use: AtomicU64::new(0),
            read_next_unit: std::sync::atomic::AtomicBool::new(false),
            whole_evidence: std::sync::atomic::AtomicU8::new(crate::config::DEFAULT_FILE_WHOLE_EVIDENCE as u8),
        })
    }

    /// Bytes per unit.
    pub fn unit_bytes(&self) -> usize {
        self.unit_bytes
    }

    /// Whether reads and writes bypass the page cache.
    pub fn is_direct(&self) -> bool {
        self.direct
    }

    /// Whether records are encrypted (else only checksummed).
    pub fn is_encrypted(&self) -> bool {
        self.sealer.is_encrypted()
    }

    /// The directory it lives in, for messages.
    pub fn describe(&self) -> &Path {
        &self.path_shown
    }

    /// The open file (tests use it to corrupt records behind the pager's back).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Bytes of unit writes since the unit holding `offset` was written: how much more a
    /// pool would have had to hold to keep its records out of the file.
    pub fn bytes_written_since(&self, offset: u64) -> u64 {
        let u = self.units.lock().unwrap_or_else(|e| e.into_inner());
        let written = u.generation.get((offset / self.unit_bytes as u64) as usize).copied().unwrap_or(0);
        u.next_generation.saturating_sub(written + 1) * self.unit_bytes as u64
    }

    /// The generation of `unit`'s last write (0: never written).
    fn generation_of(&self, unit: u64) -> u64 {
        let u = self.units.lock().unwrap_or_else(|e| e.into_inner());
        u.generation.get(unit as usize).copied().unwrap_or(0)
    }

    /// Where the record at file `offset` must be, as the caller's swap entry says.
    fn place(&self, offset: u64, len: usize, slot: u64, generation: u64) -> RecordPlace {
        let unit_bytes = self.unit_bytes as u64;
        RecordPlace { slot, len_bytes: len, offset, idx_in_unit: (offset % unit_bytes) as u32, generation }
    }

    /// Seals every record of `w` for a write at `base` with `generation`; on error the
    /// records sealed so far are restored.
    fn seal_unit(&self, w: &mut UnitWriter, base: u64, generation: u64) -> Result<(), FileError> {
        let buf = w.buf.as_mut_slice();
        let mut failed = None;
        for (k, (at, place)) in places(&w.staged, base, generation).enumerate() {
            if let Err(e) = self.sealer.seal_record(&mut buf[at..at + record_bytes(place.len_bytes)], &place) {
                failed = Some((k, e));
                break;
            }
        }
        match failed {
            None => Ok(()),
            Some((k, e)) => {
                self.unseal_unit(w, base, generation, k);
                Err(e)
            }
        }
    }

    /// Restores the first `n` records of a sealed `w` to their staged form.
    fn unseal_unit(&self, w: &mut UnitWriter, base: u64, generation: u64, n: usize) {
        let buf = w.buf.as_mut_slice();
        for (at, place) in places(&w.staged, base, generation).take(n) {
            self.sealer.unseal_record(&mut buf[at..at + record_bytes(place.len_bytes)], &place);
        }
    }

    /// Seals the records of a filled unit and writes it; returns the file offset of its
    /// first byte. On error nothing is allocated. Either way `w` keeps its records: it may
    /// be written again (each write gets a new place and generation) or cleared.
    pub fn write_unit(&self, w: &mut UnitWriter) -> Result<u64, FileError> {
        debug_assert!(w.records() > 0);
        if let Some((base, generation, n)) = w.sealed.take() {
            self.unseal_unit(w, base, generation, n);
        }
        let (unit, generation) = {
            let mut u = self.units.lock().unwrap_or_else(|e| e.into_inner());
            let generation = u.next_generation;
            u.next_generation = generation.checked_add(1).ok_or(FileError::CounterExhausted)?;
            let unit = match u.free.pop_first() {
                Some(x) => x,
                None => {
                    u.live_bytes.push(0);
                    u.generation.push(0);
                    (u.live_bytes.len() - 1) as u32
                }
            };
            u.generation[unit as usize] = generation;
            // Claimed before the write so no other writer takes it; released on error.
            u.live_bytes[unit as usize] = w.used_bytes as u32;
            (unit, generation)
        };
        let offset = unit as u64 * self.unit_bytes as u64;
        let len = round_up(w.used_bytes, IO_ALIGN);
        let sealed = self.seal_unit(w, offset, generation);
        let written = sealed.and_then(|()| {
            // The tail past the last record may hold an earlier unit's bytes: zeros go to disk.
            let used = w.used_bytes;
            w.buf.as_mut_slice()[used..len].fill(0);
            match crate::inject::write_all_at(&self.file, &w.buf.as_slice()[..len], offset) {
                Ok(()) => Ok(()),
                Err(source) => {
                    let n = w.records();
                    self.unseal_unit(w, offset, generation, n);
                    Err(FileError::Io { op: "write", offset, source })
                }
            }
        });
        if let Err(e) = written {
            let mut u = self.units.lock().unwrap_or_else(|e| e.into_inner());
            u.live_bytes[unit as usize] = 0;
            u.free.insert(unit);
            return Err(e);
        }
        w.sealed = Some((offset, generation, w.records()));
        self.live_bytes.fetch_add(w.used_bytes as u64, Ordering::Relaxed);
        self.live_records.fetch_add(w.records() as u64, Ordering::Relaxed);
        self.units_in_use.fetch_add(1, Ordering::Relaxed);
        Ok(offset)
    }

    /// Reads the record at `offset` for `slot` with `len` payload bytes into `out[..len]`,
    /// opening its seal. `scratch` must hold 2 pages + len.
    pub fn read(
        &self,
        offset: u64,
        len: usize,
        slot: u64,
        scratch: &mut AlignedBuf,
        out: &mut [u8],
    ) -> Result<(), FileError> {
        let generation = self.generation_of(offset / self.unit_bytes as u64);
        let rec = record_bytes(len);
        let (start, end) = io_span(offset, offset + rec as u64);
        let window = (end - start) as usize;
        assert!(window <= scratch.len(), "read scratch too small");
        let buf = &mut scratch.as_mut_slice()[..window];
        crate::inject::read_exact_at(&self.file, buf, start).map_err(|source| FileError::Io {
            op: "read",
            offset,
            source,
        })?;
        let at = (offset - start) as usize;
        self.sealer.open_record(&buf[at..at + rec], &self.place(offset, len, slot, generation), out)
    }

    /// The write generations of `unit` and the unit after it (0: never written).
    fn generations_from(&self, unit: u64) -> [u64; 2] {
        let u = self.units.lock().unwrap_or_else(|e| e.into_inner());
        let g = |x: u64| u.generation.get(x as usize).copied().unwrap_or(0);
        [g(unit), g(unit + 1)]
    }

    /// Makes `cache` hold the records in file bytes `need` (whole records, of at most two
    /// adjacent units): a hit, or one read (two when a kept whole unit sits between).
    /// `block` ⊇ `need` spans the records of the same 64 KiB block the caller expects to
    /// read soon; a miss reads them too, or whole units, when that has paid before (see
    /// [`UnitCache`]). Returns the number of reads. A `need` beyond two units is left to
    /// [`FileTier::read_cached`] record by record (`Ok(0)`, nothing read).
    ///
    /// The caller holds locked a swap entry of a record in every unit `block` overlaps, so
    /// no such unit is freed and rewritten meanwhile, and the generations read here stay
    /// those of the bytes read.
    pub fn fill(&self, cache: &mut UnitCache, need: (u64, u64), block: (u64, u64)) -> Result<u32, FileError> {
        let ub = self.unit_bytes as u64;
        let cap = cache.buf.len() as u64;
        debug_assert!(need.0 < need.1 && within(need, block), "need {need:?} outside block {block:?}");
        // Whether a read of [lo, hi) (IO-aligned) fits the buffer and two units.
        let fits = |(lo, hi): (u64, u64)| {
            let (from, to) = io_span(lo, hi);
            (hi - 1) / ub <= lo / ub + 1 && to - from <= cap
        };
        if !fits(need) {
            return Ok(0);
        }
        let block = if fits(block) { block } else { need };
        let u0 = block.0 / ub;
        let now = self.generations_from(u0);
        let need_now = if need.0 / ub == u0 { now } else { [now[1], 0] };
        if cache.holds(need.0, need.1, ub, need_now) {
            cache.note_hit(need);
            return Ok(0);
        }
        cache.learn_from_miss(need, ub, self.whole_evidence.load(Ordering::Relaxed));
        // The record's own span read ahead (faults read together, `read_ahead_record`) is
        // taken as it is: a larger read now would wait for the disk again.
        let ahead = (need.1 - 1) / ub == need.0 / ub && {
            let (from, to) = io_span(need.0, need.1);
            crate::ioring::holds_ahead(&self.file, from, (to - from) as usize, need_now[0])
        };
        let wider = !ahead && (cache.whole || cache.whole_pays || cache.block_pays);
        let (lo, hi) = if wider { block } else { need };
        let first = lo / ub;
        let next = self.read_next_unit.load(Ordering::Relaxed) as u64;
        let gens = match (first == u0, next) {
            (true, _) => now,
            (false, 0) => [now[1], 0],
            (false, _) => self.generations_from(first),
        };
        // Whole units from `first` to the last the records reach (and the one after, with
        // `read_next_unit`), as much of them as the buffer holds (two 64 KiB units; one
        // large unit and the start of the next), if that covers the records.
        let last = (hi - 1) / ub;
        let whole_to = ((last + 1 + next) * ub).min(first * ub + cap);
        let whole = !ahead && (cache.whole || cache.whole_pays) && round_up(hi as usize, IO_ALIGN) as u64 <= whole_to;
        let (reads, valid_to) = if whole {
            self.read_whole_units(cache, first, whole_to, gens, need.0)?
        } else {
            // A span inside one unit may come from a read ahead of that unit's generation.
            let tag = ((hi - 1) / ub == first).then_some(gens[0]);
            self.read_span(cache, (lo, hi), need.0, tag)?
        };
        cache.end = valid_to;
        cache.first_unit = first;
        cache.generations = gens;
        cache.fresh = need;
        cache.for_block = block;
        cache.read_whole = whole;
        cache.read_block = !whole && (lo, hi) == block && block != need;
        cache.served_beyond = false;
        cache.served_block = false;
        Ok(reads)
    }

    /// Reads whole units `[first, whole_to)` into `cache` (written at generations `gens`):
    /// a unit the copy holds whole and current moves to its new place instead of being read
    /// again; the rest in one read. Returns the reads and the end of the valid bytes.
    fn read_whole_units(
        &self,
        cache: &mut UnitCache,
        first: u64,
        whole_to: u64,
        gens: [u64; 2],
        for_record: u64,
    ) -> Result<(u32, u64), FileError> {
        let ub = self.unit_bytes as u64;
        let old = (cache.start, cache.end, cache.first_unit, cache.generations, cache.whole_unit);
        let parts =
            [(first * ub, ((first + 1) * ub).min(whole_to)), ((first + 1) * ub, whole_to.max((first + 1) * ub))];
        let mut kept = [false; 2];
        for (i, &(from, to)) in parts.iter().enumerate() {
            let j = (first + i as u64).wrapping_sub(old.2) as usize;
            if to - from == ub && j < 2 && old.4[j] && old.3[j] == gens[i] && old.0 <= from && to <= old.1 {
                let at = (from - old.0) as usize;
                let dest = i * self.unit_bytes;
                cache.buf.as_mut_slice().copy_within(at..at + self.unit_bytes, dest);
                kept[i] = true;
            }
        }
        cache.end = cache.start; // nothing valid while it is rebuilt
        cache.from_ahead = false;
        let mut valid_to = first * ub;
        let mut reads = 0;
        let mut i = 0;
        while i < 2 {
            let (from, to) = parts[i];
            if kept[i] || from >= to {
                valid_to = to.max(valid_to);
                i += 1;
                continue;
            }
            // One read for this part and the next if that is missing too.
            let to = if i == 0 && !kept[1] { whole_to } else { to };
            let at = (from - first * ub) as usize;
            let want = (to - from) as usize;
            let got = self.read_into(&mut cache.buf.as_mut_slice()[at..at + want], from, for_record, None)?;
            reads += 1;
            valid_to = from + got as u64;
            if got < want {
                // The file ends here (its tail unit is shorter than a unit).
                break;
            }
            i = if to == whole_to { 2 } else { i + 1 };
        }
        cache.start = first * ub;
        cache.whole_unit = [true, whole_to == (first + 2) * ub];
        Ok((reads, valid_to))
    }

    /// Reads the IO-aligned span around file bytes `[lo, hi)` into `cache`. Returns the
    /// reads (one) and the end of the valid bytes.
    /// `tag`: the generation of the one unit the span lies in, under which a read ahead of
    /// it may serve it.
    fn read_span(
        &self,
        cache: &mut UnitCache,
        (lo, hi): (u64, u64),
        for_record: u64,
        tag: Option<u64>,
    ) -> Result<(u32, u64), FileError> {
        let (from, to) = io_span(lo, hi);
        cache.end = cache.start;
        let want = (to - from) as usize;
        let taken = crate::ioring::aheads_taken();
        let got = self.read_into(&mut cache.buf.as_mut_slice()[..want], from, for_record, tag)?;
        cache.from_ahead = crate::ioring::aheads_taken() != taken;
        cache.start = from;
        cache.whole_unit = [false; 2];
        Ok((1, from + got as u64))
    }

    /// Starts reading the record at `offset` (`len` payload bytes) ahead on this thread's
    /// ring (`ioring::read_ahead`), tagged with its unit's write generation, for a fault
    /// that waits behind the one being served; [`FileTier::fill`] takes the bytes when it
    /// reads the same span under the same generation. `still_there` looks at the caller's
    /// swap entry again: it is called after the generation is read, so a record it still
    /// finds in the unit was written before that generation was read (entries point at a
    /// unit only once its write is done), and the bytes read cannot be a write in progress.
    /// Returns whether a read went out.
    pub fn read_ahead_record(&self, offset: u64, len: usize, still_there: impl FnOnce() -> bool) -> bool {
        let ub = self.unit_bytes as u64;
        let end = offset + record_bytes(len) as u64;
        if (end - 1) / ub != offset / ub {
            return false;
        }
        let generation = self.generation_of(offset / ub);
        if !still_there() {
            return false;
        }
        let (from, to) = io_span(offset, end);
        crate::ioring::read_ahead(&self.file, from, (to - from) as usize, generation)
    }

    /// Reads file bytes from `from` into `buf`, short only at the end of the file.
    fn read_into(&self, buf: &mut [u8], from: u64, for_offset: u64, tag: Option<u64>) -> Result<usize, FileError> {
        let mut got = 0;
        while got < buf.len() {
            match crate::inject::read_tagged(&self.file, &mut buf[got..], from + got as u64, tag) {
                Ok(0) => break,
                Ok(n) => got += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => return Err(FileError::Io { op: "read", offset: for_offset, source }),
            }
        }
        Ok(got)
    }

    /// Like [`FileTier::read`], but through `cache` (see [`FileTier::fill`]): the record
    /// comes from the copy when it is there, else a read brings it, with the records
    /// around it when that has paid. Returns where it was found. The record is opened
    /// straight into `out`.
    ///
    /// The caller holds the slot's swap entry locked, so the record stays live and its unit
    /// cannot be rewritten meanwhile; the unit's generation tells whether a cached copy is
    /// still the unit on disk.
    pub fn read_cached(
        &self,
        offset: u64,
        len: usize,
        slot: u64,
        cache: &mut UnitCache,
        out: &mut [u8],
    ) -> Result<Served, FileError> {
        let ub = self.unit_bytes as u64;
        let rec = (offset, offset + record_bytes(len) as u64);
        let unit = offset / ub;
        if (rec.1 - 1) / ub != unit {
            return Err(FileError::Corrupt { offset, slot, what: "record across a unit boundary" });
        }
        let generation = self.generation_of(unit);
        let mut gens = [generation, 0];
        let served = if !cache.holds(rec.0, rec.1, ub, gens) {
            if let Err(e) = self.fill(cache, rec, rec) {
                cache.end = cache.start;
                return Err(e);
            }
            gens[0] = generation;
            Served::Read
        } else if within(rec, cache.fresh) {
            Served::Filled
        } else {
            if !within(rec, cache.for_block) {
                cache.served_beyond = true;
            } else {
                cache.served_block = true;
            }
            Served::Cached
        };
        if !cache.holds(rec.0, rec.1, ub, gens) {
            cache.end = cache.start;
            return Err(FileError::Corrupt { offset, slot, what: "record beyond the end of the file" });
        }
        let at = (rec.0 - cache.start) as usize;
        let place = self.place(offset, len, slot, generation);
        match self.sealer.open_record(&cache.buf.as_slice()[at..at + record_bytes(len)], &place, out) {
            Ok(()) => Ok(served),
            Err(_) if served == Served::Cached || cache.from_ahead => {
                // A copy read for another request may hold a unit that was being written
                // as it was read (see `set_read_next_unit`), and so may a read ahead the
                // generation check let through: read this record's bytes again.
                let again = if served != Served::Cached { Served::Reread } else { Served::Read };
                cache.end = cache.start;
                cache.from_ahead = false;
                self.read_cached(offset, len, slot, cache, out).map(|_| again)
            }
            Err(e) => {
                // Never trust this copy again.
                cache.end = cache.start;
                Err(e)
            }
        }
    }

    /// Frees a record. A unit left with no live record goes on the free set, where the next
    /// unit written takes the lowest; the file is cut short only when that unit was its
    /// tail. Dead units in the middle keep their blocks: punching them out
    /// (FALLOC_FL_PUNCH_HOLE) cost a discard each on a filesystem mounted with `discard`, as
    /// this project's machine is, in the thread freeing the record (a fault thread when a
    /// page comes back) and under the units' lock: a Python program swapping 1.2 GB of
    /// incompressible bytes in and out under 256M took 33–38 s with them and 24–26 s
    /// without (docs/lab/no-punch/). The file's size then follows its peak of units in use,
    /// as a swap file's does.
    pub fn free(&self, offset: u64, len: usize) {
        let rec = record_bytes(len) as u32;
        let unit = (offset / self.unit_bytes as u64) as usize;
        let mut u = self.units.lock().unwrap_or_else(|e| e.into_inner());
        let Some(live) = u.live_bytes.get_mut(unit) else {
            return;
        };
        *live = live.saturating_sub(rec);
        self.live_bytes.fetch_sub(rec as u64, Ordering::Relaxed);
        self.live_records.fetch_sub(1, Ordering::Relaxed);
        if *live != 0 {
            return;
        }
        self.units_in_use.fetch_sub(1, Ordering::Relaxed);
        if unit + 1 == u.live_bytes.len() {
            // The tail: drop it and any free units before it, and shrink the file.
            u.live_bytes.pop();
            while u.live_bytes.last() == Some(&0) {
                let last = (u.live_bytes.len() - 1) as u32;
                u.free.remove(&last);
                u.live_bytes.pop();
            }
            // A unit written again later gets a newer generation from the counter, so
            // forgetting these cannot let an old copy match.
            let n = u.live_bytes.len() as u32;
            u.generation.truncate(n as usize);
            u.free.retain(|&x| x < n);
            let _ = self.file.set_len(n as u64 * self.unit_bytes as u64);
        } else {
            u.free.insert(unit as u32);
        }
    }

    /// Live payload + header bytes.
    pub fn live_bytes(&self) -> u64 {
        self.live_bytes.load(Ordering::Relaxed)
    }

    /// Live records.
    pub fn live_records(&self) -> u64 {
        self.live_records.load(Ordering::Relaxed)
    }

    /// 4 KiB blocks of units holding live records.
    pub fn blocks(&self) -> u64 {
        self.units_in_use.load(Ordering::Relaxed) * (self.unit_bytes / PAGE_SIZE) as u64
    }

    /// The file's size now.
    pub fn file_len_bytes(&self) -> u64 {
        self.file.metadata().map(|m| m.len()).unwrap_or(0)
    }

    /// Heap bytes of unit bookkeeping: live bytes and write generation per unit (12 B per
    /// unit, ~0.0008 B per 4 KiB page at 64 KiB units), the free set, and the key's page.
    pub fn metadata_bytes(&self) -> u64 {
        let u = self.units.lock().unwrap_or_else(|e| e.into_inner());
        let key = if self.sealer.is_encrypted() { PAGE_SIZE } else { 0 };
        (u.live_bytes.capacity() * 4 + u.generation.capacity() * 8 + u.free.len() * 8 + key) as u64
    }
}

/// What sealing and opening one record costs on this machine (see [`measure_record_cost`]).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct RecordCost {
    /// Payload bytes per record.
    pub payload_bytes: usize,
    /// crc32c: checksum and header, per record.
    pub crc_seal_us: f64,
    /// crc32c: check and copy out, per record.
    pub crc_open_us: f64,
    /// AES-256-GCM: encrypt in place and tag, per record.
    pub aead_seal_us: f64,
    /// AES-256-GCM: check the tag and decrypt into the caller's buffer, per record.
    pub aead_open_us: f64,
}

/// Times sealing and opening `records` records of `payload_bytes` (1..=4096) each way, in
/// memory, no IO: what encryption adds per record on the write path (a unit write) and on
/// the fault path (a read from the unit cache). Uses a throwaway key.
pub fn measure_record_cost(payload_bytes: usize, records: usize) -> io::Result<RecordCost> {
    let len = payload_bytes.clamp(1, PAGE_SIZE);
    let records = records.max(1);
    let mut rec = vec![0u8; record_bytes(len)];
    let mut x = 0x2545_f491_4f6c_dd1du64;
    for b in &mut rec[16..16 + len] {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        *b = x as u8;
    }
    let mut out = vec![0u8; PAGE_SIZE];
    let mut time = |sealer: &Sealer| -> Result<(f64, f64), FileError> {
        let mut place = RecordPlace { slot: 7, len_bytes: len, offset: 0, idx_in_unit: 0, generation: 0 };
        let t0 = std::time::Instant::now();
        for g in 1..=records as u64 {
            // A new generation each time: even a throwaway key never sees a nonce twice.
            place.generation = g;
            sealer.seal_record(std::hint::black_box(&mut rec), &place)?;
        }
        let seal = t0.elapsed();
        let t0 = std::time::Instant::now();
        for _ in 0..records {
            sealer.open_record(std::hint::black_box(&rec), &place, &mut out)?;
            std::hint::black_box(&out);
        }
        let open = t0.elapsed();
        let per = |d: std::time::Duration| d.as_secs_f64() * 1e6 / records as f64;
        Ok((per(seal), per(open)))
    };
    let (crc_seal_us, crc_open_us) = time(&Sealer::Crc32c).map_err(io::Error::other)?;
    let (aead_seal_us, aead_open_us) = time(&Sealer::new(true)?).map_err(io::Error::other)?;
    Ok(RecordCost { payload_bytes: len, crc_seal_us, crc_open_us, aead_seal_us, aead_open_us })
}

fn open_unlinked(dir: &Path) -> io::Result<(File, bool)> {
    let try_open = |extra: i32| -> io::Result<File> {
        std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .mode(0o600)
            .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC | extra)
            .open(dir)
    };
    match try_open(libc::O_DIRECT) {
        Ok(f) => return Ok((f, true)),
        Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
            if let Ok(f) = try_open(0) {
                return Ok((f, false));
            }
        }
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) || e.raw_os_error() == Some(libc::EISDIR) => {}
        Err(e) => {
            return Err(io::Error::new(
                e.kind(),
                format!("cannot create the swap file in {}: {e}; give --swap-dir a writable directory", dir.display()),
            ))
        }
    }
    // No O_TMPFILE here: create a unique name, unlink it at once.
    for attempt in 0..100u32 {
        let name = dir.join(format!(".tierswap-{}-{}-{attempt}.swap", std::process::id(), nanos()));
        let open = |extra: i32| {
            std::fs::OpenOptions::new()
                .read(true)
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_CLOEXEC | extra)
                .open(&name)
        };
        let (f, direct) = match open(libc::O_DIRECT) {
            Ok(f) => (f, true),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(_) => match open(0) {
                Ok(f) => (f, false),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
                Err(e) => {
                    return Err(io::Error::new(
                        e.kind(),
                        format!(
                            "cannot create the swap file in {}: {e}; give --swap-dir a writable directory",
                            dir.display()
                        ),
                    ))
                }
            },
        };
        std::fs::remove_file(&name)?;
        return Ok((f, direct));
    }
    Err(io::Error::new(io::ErrorKind::AlreadyExists, format!("no free swap file name in {}", dir.display())))
}

fn nanos() -> u128 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::os::unix::fs::FileExt;

    fn tier(encrypt: bool) -> FileTier {
        FileTier::create(&std::env::temp_dir(), DEFAULT_UNIT_BYTES, encrypt).unwrap()
    }

    /// Rewrites `[pos, pos + len)` of the file through `f`, behind the tier's back (whole
    /// aligned pages, as O_DIRECT wants).
    fn tamper(t: &FileTier, pos: u64, len: usize, f: impl FnOnce(&mut [u8])) {
        let start = pos - pos % PAGE_SIZE as u64;
        let io = round_up((pos - start) as usize + len, PAGE_SIZE);
        let mut sc = AlignedBuf::new(io).unwrap();
        t.file().read_exact_at(&mut sc.as_mut_slice()[..io], start).unwrap();
        let at = (pos - start) as usize;
        f(&mut sc.as_mut_slice()[at..at + len]);
        t.file().write_all_at(&sc.as_slice()[..io], start).unwrap();
    }

    /// The file's bytes `[pos, pos + len)`.
    fn peek(t: &FileTier, pos: u64, len: usize) -> Vec<u8> {
        let mut got = Vec::new();
        tamper(t, pos, len, |b| got.extend_from_slice(b));
        got
    }

    #[test]
    fn write_read_free_shrink() {
        for encrypt in [false, true] {
            let t = tier(encrypt);
            let mut w = UnitWriter::new(t.unit_bytes()).unwrap();
            let mut placed = Vec::new();
            let mut slot = 0u64;
            while let Some(off) = w.push(slot, &vec![(slot % 251) as u8; 1000 + (slot as usize % 7)]) {
                placed.push((slot, off));
                slot += 1;
            }
            assert!(w.records() >= 60, "a 64K unit packs ~64 records of ~1K");
            let base = t.write_unit(&mut w).unwrap();
            assert_eq!(base, 0);
            let mut scratch = AlignedBuf::new(3 * PAGE_SIZE).unwrap();
            let mut out = vec![0u8; PAGE_SIZE];
            for &(slot, off) in &placed {
                let len = 1000 + (slot as usize % 7);
                t.read(base + off as u64, len, slot, &mut scratch, &mut out).unwrap();
                assert!(out[..len].iter().all(|&b| b == (slot % 251) as u8));
                // The wrong slot or length is refused, never returned.
                assert!(matches!(
                    t.read(base + off as u64, len, slot + 1, &mut scratch, &mut out),
                    Err(FileError::Corrupt { .. })
                ));
                assert!(matches!(
                    t.read(base + off as u64, len + 1, slot, &mut scratch, &mut out),
                    Err(FileError::Corrupt { .. })
                ));
            }
            assert_eq!(t.blocks(), 16);
            assert_eq!(t.live_records(), placed.len() as u64);
            // The same writer again (it unseals and reseals): second unit. Then free the
            // first entirely: it becomes a hole and is reused.
            let base2 = t.write_unit(&mut w).unwrap();
            assert_eq!(base2, t.unit_bytes() as u64);
            for &(slot, off) in &placed {
                let len = 1000 + (slot as usize % 7);
                t.read(base2 + off as u64, len, slot, &mut scratch, &mut out).unwrap();
                assert!(out[..len].iter().all(|&b| b == (slot % 251) as u8), "encrypt {encrypt}: rewritten writer");
                t.free(base + off as u64, len);
            }
            assert_eq!(t.blocks(), 16);
            assert_eq!(t.write_unit(&mut w).unwrap(), 0, "lowest free unit reused");
            for base in [0, base2] {
                for &(slot, off) in &placed {
                    t.free(base + off as u64, 1000 + (slot as usize % 7));
                }
            }
            assert_eq!(t.live_bytes(), 0);
            assert_eq!(t.file_len_bytes(), 0, "file truncated when the tail frees");
        }
    }

    #[test]
    fn flipped_byte_is_detected() {
        for (encrypt, what) in [(false, "checksum mismatch"), (true, AUTH_FAILED)] {
            let t = tier(encrypt);
            let mut w = UnitWriter::new(t.unit_bytes()).unwrap();
            let off = w.push(9, &[7u8; 300]).unwrap();
            let base = t.write_unit(&mut w).unwrap();
            let mut scratch = AlignedBuf::new(3 * PAGE_SIZE).unwrap();
            let mut out = vec![0u8; PAGE_SIZE];
            t.read(base + off as u64, 300, 9, &mut scratch, &mut out).unwrap();
            tamper(&t, base + off as u64 + 16 + 100, 1, |b| b[0] ^= 0x20);
            out.fill(0x55);
            let r = t.read(base + off as u64, 300, 9, &mut scratch, &mut out);
            assert!(matches!(r, Err(FileError::Corrupt { what: w, .. }) if w == what), "encrypt {encrypt}: {r:?}");
            assert!(out.iter().all(|&b| b == 0x55), "nothing of a bad record reaches the caller");
        }
    }

    #[test]
    fn unit_cache_serves_neighbours_and_never_a_stale_copy() {
        for encrypt in [false, true] {
            let t = tier(encrypt);
            let mut w = UnitWriter::new(t.unit_bytes()).unwrap();
            let offs: Vec<usize> = (0..20u64).map(|slot| w.push(slot, &[slot as u8 + 1; 900]).unwrap()).collect();
            let base = t.write_unit(&mut w).unwrap();
            let mut cache = UnitCache::new(t.unit_bytes()).unwrap();
            let mut out = vec![0u8; PAGE_SIZE];
            for (slot, &off) in offs.iter().enumerate() {
                let served = t.read_cached(base + off as u64, 900, slot as u64, &mut cache, &mut out).unwrap();
                let want = if slot == 0 { Served::Read } else { Served::Cached };
                assert_eq!(served, want, "one IO for the unit, then hits");
                assert!(out[..900].iter().all(|&b| b == slot as u8 + 1));
            }
            // Free the unit, write the same slot at the same place with other bytes: the
            // cached copy must not be served.
            for &off in &offs {
                t.free(base + off as u64, 900);
            }
            w.clear();
            let off0 = w.push(0, &[0xEE; 900]).unwrap();
            let base2 = t.write_unit(&mut w).unwrap();
            assert_eq!((base2, off0), (base, offs[0]), "same unit, same offset");
            let served = t.read_cached(base2 + off0 as u64, 900, 0, &mut cache, &mut out).unwrap();
            assert_eq!(served, Served::Read, "a rewritten unit is read again");
            assert!(out[..900].iter().all(|&b| b == 0xEE));
        }
    }

    #[test]
    fn read_next_unit_serves_the_next_unit_and_a_torn_copy_is_read_again() {
        let t = tier(true);
        let recs = six_units(&t);
        t.set_read_next_unit(true);
        let mut cache = UnitCache::new(t.unit_bytes()).unwrap();
        cache.whole = true;
        // One read brings unit 0 and unit 1: unit 1's records are hits.
        assert_eq!(read_one(&t, &recs, &mut cache, 0, 0).0, Served::Read);
        assert_eq!(cache.span(), 2 * t.unit_bytes() as u64, "two whole units");
        assert_eq!(read_one(&t, &recs, &mut cache, 1, 5).0, Served::Cached);
        // Unit 1's bytes in the copy are not what the disk holds (a unit read while it was
        // being written): its record is read again from the disk, not called corrupt.
        let at = (recs[1][7] - cache.start) as usize + RECORD_HEADER_BYTES + 10;
        cache.buf.as_mut_slice()[at] ^= 0x40;
        assert_eq!(read_one(&t, &recs, &mut cache, 1, 7).0, Served::Read);
        // Damage on the disk is corrupt, whether the copy holding it was read for another
        // record (then read again, and still damaged) or for this one.
        tamper(&t, recs[3][3] + RECORD_HEADER_BYTES as u64 + 10, 1, |b| b[0] ^= 0x40);
        tamper(&t, recs[4][3] + RECORD_HEADER_BYTES as u64 + 10, 1, |b| b[0] ^= 0x40);
        assert_eq!(read_one(&t, &recs, &mut cache, 3, 0).0, Served::Read);
        let mut out = vec![0u8; PAGE_SIZE];
        for (u, slot) in [(3, 63), (4, 83)] {
            let r = t.read_cached(recs[u][3], 3000, slot, &mut cache, &mut out);
            assert!(matches!(r, Err(FileError::Corrupt { .. })), "unit {u}: {r:?}");
        }
    }

    /// Six units of 20 records of 3000 bytes each (records straddle page boundaries); slot
    /// `u * 20 + i` holds bytes `u * 20 + i + 1`. Returns each record's file offset.
    fn six_units(t: &FileTier) -> Vec<Vec<u64>> {
        let mut w = UnitWriter::new(t.unit_bytes()).unwrap();
        let mut recs = Vec::new();
        for u in 0..6u64 {
            let offs: Vec<usize> =
                (0..20u64).map(|i| w.push(u * 20 + i, &[(u * 20 + i) as u8 + 1; 3000]).unwrap()).collect();
            let base = t.write_unit(&mut w).unwrap();
            w.clear();
            recs.push(offs.into_iter().map(|o| base + o as u64).collect::<Vec<u64>>());
        }
        recs
    }

    /// Reads record `i` of unit `u` of [`six_units`] through `cache` and checks its bytes;
    /// returns where it was found and the bytes the cache holds then.
    fn read_one(t: &FileTier, recs: &[Vec<u64>], cache: &mut UnitCache, u: usize, i: usize) -> (Served, u64) {
        let slot = (u * 20 + i) as u64;
        let mut out = vec![0u8; PAGE_SIZE];
        let served = t.read_cached(recs[u][i], 3000, slot, cache, &mut out).unwrap();
        assert!(out[..3000].iter().all(|&b| b == slot as u8 + 1), "slot {slot}");
        (served, cache.span())
    }

    #[test]
    fn lone_reads_take_only_their_records_pages_unless_neighbours_follow() {
        for encrypt in [false, true] {
            let t = tier(encrypt);
            let recs = six_units(&t);
            let ub = t.unit_bytes() as u64;
            let mut cache = UnitCache::new(t.unit_bytes()).unwrap();
            let read = |cache: &mut UnitCache, u, i| read_one(&t, &recs, cache, u, i);
            // Scattered: one record per unit. Two whole copies that serve nothing else,
            // then only the record's pages.
            assert_eq!(read(&mut cache, 0, 5), (Served::Read, ub));
            assert_eq!(read(&mut cache, 1, 7), (Served::Read, ub));
            for u in 2..4 {
                let (served, span) = read(&mut cache, u, 7);
                assert!(
                    served == Served::Read && span <= 2 * PAGE_SIZE as u64,
                    "unit {u}: {span} bytes read for one record"
                );
            }
            // A second lone read in one unit is chance: its record alone. A third in a row
            // reads the whole unit, which serves the next records of that unit; having
            // paid, the next unit is read whole too, and so on.
            let (served, span) = read(&mut cache, 3, 15);
            assert!(served == Served::Read && span <= 2 * PAGE_SIZE as u64, "{span} bytes read for one record");
            assert_eq!(read(&mut cache, 3, 2), (Served::Read, ub));
            assert_eq!(read(&mut cache, 3, 16), (Served::Cached, ub));
            assert_eq!(read(&mut cache, 4, 0), (Served::Read, ub));
            let hits = (1..20).filter(|&i| read(&mut cache, 4, i).0 == Served::Cached).count();
            assert_eq!(hits, 19, "the whole unit served its neighbours");
            // It paid, so the next unit is read whole too.
            assert_eq!(read(&mut cache, 2, 0), (Served::Read, ub));
            // Forced whole (readahead follows): always whole units, here the file's tail
            // unit (shorter on disk than a unit) after a copy that did not pay.
            cache.whole = true;
            let (served, span) = read(&mut cache, 5, 3);
            assert!(served == Served::Read && span > 2 * PAGE_SIZE as u64 && cache.start == 5 * ub, "{span}");
        }
    }

    /// A "block" of [`six_units`]: the last 4 records of unit 1 and the first 12 of unit 2.
    fn block_12(rec: &dyn Fn(usize, usize) -> (u64, u64)) -> (u64, u64) {
        (rec(1, 16).0, rec(2, 11).1)
    }

    #[test]
    fn a_block_read_across_two_units_serves_the_rest_of_its_block() {
        for encrypt in [false, true] {
            let t = tier(encrypt);
            let recs = six_units(&t);
            let ub = t.unit_bytes() as u64;
            let rec = |u: usize, i: usize| (recs[u][i], recs[u][i] + record_bytes(3000) as u64);
            let mut cache = UnitCache::new(t.unit_bytes()).unwrap();
            let read = |cache: &mut UnitCache, u, i| read_one(&t, &recs, cache, u, i);
            // Teach the cache that whole units do not pay: two whole reads that serve
            // nothing else.
            assert_eq!(read(&mut cache, 0, 0), (Served::Read, ub));
            assert_eq!(read(&mut cache, 5, 0).0, Served::Read);
            // A lone fault on a record of a block reads the whole block's bytes in one
            // read, no more.
            let block = block_12(&rec);
            assert_eq!(t.fill(&mut cache, rec(1, 17), block).unwrap(), 1);
            let from = block.0 - block.0 % PAGE_SIZE as u64;
            assert_eq!((cache.start, cache.end), (from, round_up(block.1 as usize, PAGE_SIZE) as u64));
            assert_eq!(read(&mut cache, 1, 17).0, Served::Filled, "the fill brought the faulting record");
            // The rest of the block as one large swap-in: no read, every record a hit.
            let rest = block_12(&rec);
            assert_eq!(t.fill(&mut cache, rest, rest).unwrap(), 0);
            for (u, i) in (16..20).map(|i| (1, i)).chain((0..12).map(|i| (2, i))) {
                if (u, i) != (1, 17) {
                    assert_eq!(read(&mut cache, u, i).0, Served::Cached, "record {i} of unit {u}");
                }
            }
            // Another block elsewhere: the block read paid, so it reads the block again
            // (not whole units, not the record alone).
            let block = (rec(4, 2).0, rec(4, 9).1);
            assert_eq!(t.fill(&mut cache, rec(4, 5), block).unwrap(), 1);
            assert!(cache.start <= block.0 && cache.end >= block.1 && cache.span() < ub, "{}", cache.span());
            // A block read that nothing else used: the next lone read takes its record only.
            assert_eq!(t.fill(&mut cache, rec(3, 5), (rec(3, 0).0, rec(3, 19).1)).unwrap(), 1);
            assert!(cache.span() <= 2 * PAGE_SIZE as u64, "{}", cache.span());
            assert_eq!(read(&mut cache, 3, 5).0, Served::Filled);
            // Block reads come back when a read needs the records beside the last one's:
            // a lone fault reads its record alone, then the rest of its block is needed.
            assert_eq!(t.fill(&mut cache, rec(4, 10), (rec(4, 10).0, rec(4, 15).1)).unwrap(), 1);
            assert!(cache.span() <= 2 * PAGE_SIZE as u64, "{}", cache.span());
            assert!(!cache.block_pays);
            let rest = (rec(4, 11).0, rec(4, 15).1);
            assert_eq!(t.fill(&mut cache, rest, rest).unwrap(), 1);
            assert!(cache.block_pays, "the rest of the block lay beside the lone read");
            // A unit rewritten after its copy was read is never served from the copy: read
            // units 1 and 2 whole, then free unit 2 and write it again in place.
            cache.whole = true;
            assert_eq!(t.fill(&mut cache, rec(1, 19), block_12(&rec)).unwrap(), 1);
            assert_eq!((cache.start, cache.end), (ub, 3 * ub));
            for &off in &recs[2] {
                t.free(off, 3000);
            }
            let mut w = UnitWriter::new(t.unit_bytes()).unwrap();
            let off = w.push(40, &[0xEE; 3000]).unwrap();
            assert_eq!(t.write_unit(&mut w).unwrap() + off as u64, recs[2][0], "unit 2 rewritten in place");
            let mut out = vec![0u8; PAGE_SIZE];
            assert_eq!(t.read_cached(recs[2][0], 3000, 40, &mut cache, &mut out).unwrap(), Served::Read);
            assert!(out[..3000].iter().all(|&b| b == 0xEE));
        }
    }

    #[test]
    fn file_is_private() {
        use std::os::unix::fs::MetadataExt;
        use std::os::unix::fs::PermissionsExt;
        let t = tier(true);
        let mode = t.file().metadata().unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        assert_eq!(t.file().metadata().unwrap().nlink(), 0, "unlinked");
    }

    #[test]
    fn the_key_never_prints() {
        let s = Sealer::new(true).unwrap();
        assert_eq!(format!("{s:?}"), "Sealer::Aead");
        let Sealer::Aead(key) = &s else { unreachable!() };
        assert_eq!(format!("{key:?}"), "SealKey(<secret>)");
        // Two pagers never share a key: the same record seals differently.
        let other = Sealer::new(true).unwrap();
        let place = RecordPlace { slot: 1, len_bytes: 64, offset: 0, idx_in_unit: 0, generation: 1 };
        let mut a = vec![0u8; record_bytes(64)];
        let mut b = a.clone();
        s.seal_record(&mut a, &place).unwrap();
        other.seal_record(&mut b, &place).unwrap();
        assert_ne!(a, b);
    }

    /// Seals `payload` as a record for `place`; returns the sealed record.
    fn sealed(s: &Sealer, payload: &[u8], place: &RecordPlace) -> Vec<u8> {
        let mut rec = vec![0u8; record_bytes(payload.len())];
        stage_header(&mut rec, place.slot, payload.len());
        rec[16..16 + payload.len()].copy_from_slice(payload);
        s.seal_record(&mut rec, place).unwrap();
        rec
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 256, ..ProptestConfig::default() })]

        #[test]
        fn seal_open_round_trip_and_wrong_places_fail(
            payload in proptest::collection::vec(any::<u8>(), 1..=PAGE_SIZE),
            slot: u64,
            offset in (0u64..(1 << 38)).prop_map(|o| o * 16),
            generation in 1u64..u64::MAX,
            which in 0usize..5,
        ) {
            let s = Sealer::new(true).unwrap();
            let len = payload.len();
            let place = RecordPlace { slot, len_bytes: len, offset, idx_in_unit: (offset % (64 << 10)) as u32, generation };
            let rec = sealed(&s, &payload, &place);
            if len >= 16 {
                prop_assert_ne!(&rec[16..16 + len], &payload[..], "the payload is not on disk as is");
            }
            let mut out = vec![0u8; PAGE_SIZE];
            s.open_record(&rec, &place, &mut out).unwrap();
            prop_assert_eq!(&out[..len], &payload[..]);
            // Any one thing the reader expects that differs from the write fails.
            let mut wrong = place;
            match which {
                0 => wrong.slot ^= 1,
                1 => wrong.offset += 16,
                2 => wrong.generation = generation - 1,
                3 => wrong.idx_in_unit ^= 16,
                _ => wrong.len_bytes = if len > 1 { len - 1 } else { 2 },
            }
            let mut out2 = vec![0xA5u8; PAGE_SIZE];
            let r = s.open_record(&rec, &wrong, &mut out2);
            prop_assert!(matches!(r, Err(FileError::Corrupt { .. })), "{:?} opened for {:?}", place, wrong);
            prop_assert!(out2.iter().all(|&b| b == 0xA5), "a failed open writes nothing");
        }

        #[test]
        fn crc_round_trip(payload in proptest::collection::vec(any::<u8>(), 1..=PAGE_SIZE), slot: u64) {
            let s = Sealer::new(false).unwrap();
            let place = RecordPlace { slot, len_bytes: payload.len(), offset: 0, idx_in_unit: 0, generation: 1 };
            let rec = sealed(&s, &payload, &place);
            let mut out = vec![0u8; PAGE_SIZE];
            s.open_record(&rec, &place, &mut out).unwrap();
            prop_assert_eq!(&out[..payload.len()], &payload[..]);
            let other = RecordPlace { slot: slot ^ 1, ..place };
            prop_assert!(s.open_record(&rec, &other, &mut out).is_err());
        }
    }

    /// Writes one unit of as many of `payloads` as fit (slot `first_slot + i` holds payload
    /// i); returns (file offset, length) of each record written.
    fn write_records(t: &FileTier, w: &mut UnitWriter, first_slot: u64, payloads: &[Vec<u8>]) -> Vec<(u64, usize)> {
        w.clear();
        let offs: Vec<usize> =
            payloads.iter().enumerate().map_while(|(i, p)| w.push(first_slot + i as u64, p)).collect();
        let base = t.write_unit(w).unwrap();
        offs.iter().zip(payloads).map(|(&o, p)| (base + o as u64, p.len())).collect()
    }

    #[test]
    fn a_replayed_unit_or_a_moved_record_does_not_open() {
        for encrypt in [true, false] {
            let t = tier(encrypt);
            let mut w = UnitWriter::new(t.unit_bytes()).unwrap();
            let mut cache = UnitCache::new(t.unit_bytes()).unwrap();
            let mut out = vec![0u8; PAGE_SIZE];
            let old: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i; 500]).collect();
            let recs = write_records(&t, &mut w, 100, &old);
            let snapshot = peek(&t, 0, PAGE_SIZE);
            for &(off, len) in &recs {
                t.free(off, len);
            }
            // The same slots, lengths and offsets, newer bytes: only the generation differs.
            let new: Vec<Vec<u8>> = (0..8u8).map(|i| vec![i + 100; 500]).collect();
            let recs2 = write_records(&t, &mut w, 100, &new);
            assert_eq!(recs, recs2, "the unit was rewritten in place");
            tamper(&t, 0, PAGE_SIZE, |b| b.copy_from_slice(&snapshot));
            let (off, len) = recs2[3];
            let r = t.read_cached(off, len, 103, &mut cache, &mut out);
            if !encrypt {
                // The contrast: a checksum alone cannot tell the old unit from the new one.
                assert!(r.is_ok() && out[..len] == old[3][..], "crc32c takes the replayed record: {r:?}");
                continue;
            }
            assert!(matches!(r, Err(FileError::Corrupt { what: AUTH_FAILED, .. })), "replay refused: {r:?}");
            // A record copied over another of the same length (another slot) fails too,
            // whichever slot the reader asks for.
            for &(off, len) in &recs2 {
                t.free(off, len);
            }
            let recs3 = write_records(&t, &mut w, 200, &new);
            let ((a, alen), (b, _)) = (recs3[1], recs3[2]);
            let rec_a = peek(&t, a, record_bytes(alen));
            tamper(&t, b, record_bytes(alen), |x| x.copy_from_slice(&rec_a));
            for slot in [202, 201] {
                let r = t.read_cached(b, alen, slot, &mut cache, &mut out);
                assert!(matches!(r, Err(FileError::Corrupt { .. })), "moved record refused for slot {slot}: {r:?}");
            }
            t.read_cached(a, alen, 201, &mut cache, &mut out).unwrap();
            assert_eq!(out[..alen], new[1][..], "the original still opens");
        }
    }

    #[test]
    fn nonces_never_repeat_across_many_units() {
        let t = tier(true);
        let mut w = UnitWriter::new(t.unit_bytes()).unwrap();
        let mut seen = std::collections::HashSet::new();
        let mut last_generation = 0;
        let mut live: Vec<Vec<(u64, usize)>> = Vec::new();
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..3000u64 {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            let n = 1 + (x >> 59) as usize;
            let payloads: Vec<Vec<u8>> =
                (0..n).map(|i| vec![i as u8; 64 + ((x >> (8 * (i % 7))) as usize % 4000)]).collect();
            let recs = write_records(&t, &mut w, round * 64, &payloads);
            let unit = recs[0].0 / t.unit_bytes() as u64;
            let generation = t.generation_of(unit);
            assert!(generation > last_generation, "generations only grow");
            last_generation = generation;
            for &(off, len) in &recs {
                let place = t.place(off, len, 0, generation);
                assert!(seen.insert(place.nonce()), "nonce repeated at round {round}, offset {off}");
            }
            live.push(recs);
            // Keep a few units live, freeing one at random: units are reused at the same
            // places over and over.
            while live.len() > 8 {
                let k = (x >> 20) as usize % live.len();
                for (off, len) in live.swap_remove(k) {
                    t.free(off, len);
                }
            }
        }
        assert!(t.file_len_bytes() <= 9 * t.unit_bytes() as u64, "units were reused");
    }

    /// One way to damage a written unit.
    #[derive(Clone, Debug)]
    enum Damage {
        /// Flip bit `bit` of byte `at` (both modulo the unit's bytes).
        Flip { at: usize, bit: u8 },
        /// Cut the file to `keep` bytes of the unit.
        Truncate { keep: usize },
        /// Put record `from`'s header over record `to`'s.
        Header { from: usize, to: usize },
        /// Overwrite `len` bytes at `at` with noise from `seed`.
        Noise { at: usize, len: usize, seed: u64 },
        /// Swap two records' bytes (equal lengths only; else a no-op).
        Swap { a: usize, b: usize },
    }

    fn damage() -> impl Strategy<Value = Damage> {
        prop_oneof![
            (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Damage::Flip { at, bit }),
            any::<usize>().prop_map(|keep| Damage::Truncate { keep }),
            (any::<usize>(), any::<usize>()).prop_map(|(from, to)| Damage::Header { from, to }),
            (any::<usize>(), 1usize..200, any::<u64>()).prop_map(|(at, len, seed)| Damage::Noise { at, len, seed }),
            (any::<usize>(), any::<usize>()).prop_map(|(a, b)| Damage::Swap { a, b }),
        ]
    }

    fn fuzz_cases() -> u32 {
        std::env::var("TIERSWAP_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(1000)
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: fuzz_cases(), ..ProptestConfig::default() })]

        /// The record decoder under random damage to a written unit: it never panics, and
        /// it returns the bytes that were written or an error, never other bytes. A record
        /// no damage touched still reads back.
        #[test]
        fn damaged_units_never_return_wrong_bytes(
            encrypt: bool,
            lens in proptest::collection::vec(1usize..=PAGE_SIZE, 1..24),
            seed: u64,
            damages in proptest::collection::vec(damage(), 1..4),
        ) {
            let t = tier(encrypt);
            let mut w = UnitWriter::new(t.unit_bytes()).unwrap();
            let mut x = seed | 1;
            let mut payloads = Vec::new();
            for &len in &lens {
                let p: Vec<u8> = (0..len).map(|_| { x ^= x << 13; x ^= x >> 7; x ^= x << 17; x as u8 }).collect();
                if w.push(0, &p).is_none() { break; }
                payloads.push(p);
            }
            w.clear();
            let recs = write_records(&t, &mut w, 1000, &payloads);
            let used = recs.last().map(|&(o, l)| o as usize + record_bytes(l)).unwrap_or(0);
            let io = round_up(used, PAGE_SIZE);
            let mut file_len = io;
            // Bytes of the unit that damage touched. Truncation comes last, so the other
            // damage finds whole pages to rewrite.
            let mut touched = vec![false; io];
            let mut damages = damages;
            damages.sort_by_key(|d| matches!(d, Damage::Truncate { .. }));
            for d in &damages {
                match *d {
                    Damage::Flip { at, bit } => {
                        let at = at % io;
                        touched[at] = true;
                        tamper(&t, at as u64, 1, |b| b[0] ^= 1 << bit);
                    }
                    Damage::Truncate { keep } => {
                        let keep = keep % io;
                        file_len = file_len.min(keep);
                        t.file().set_len(keep as u64).unwrap();
                    }
                    Damage::Header { from, to } => {
                        let (f, _) = recs[from % recs.len()];
                        let (to, _) = recs[to % recs.len()];
                        if f != to && (f as usize) + 16 <= file_len && (to as usize) + 16 <= file_len {
                            let h = peek(&t, f, 16);
                            touched[to as usize..to as usize + 16].fill(true);
                            tamper(&t, to, 16, |b| b.copy_from_slice(&h));
                        }
                    }
                    Damage::Noise { at, len, seed } => {
                        let at = at % io;
                        let len = len.min(io - at).min(file_len.saturating_sub(at));
                        if len > 0 {
                            touched[at..at + len].fill(true);
                            let mut y = seed | 1;
                            tamper(&t, at as u64, len, |b| for v in b.iter_mut() { y ^= y << 13; y ^= y >> 7; y ^= y << 17; *v = y as u8; });
                        }
                    }
                    Damage::Swap { a, b } => {
                        let (oa, la) = recs[a % recs.len()];
                        let (ob, lb) = recs[b % recs.len()];
                        let n = record_bytes(la);
                        if oa != ob && la == lb && oa as usize + n <= file_len && ob as usize + n <= file_len {
                            let ra = peek(&t, oa, n);
                            let rb = peek(&t, ob, n);
                            tamper(&t, oa, n, |x| x.copy_from_slice(&rb));
                            tamper(&t, ob, n, |x| x.copy_from_slice(&ra));
                            touched[oa as usize..oa as usize + n].fill(true);
                            touched[ob as usize..ob as usize + n].fill(true);
                        }
                    }
                }
            }
            let mut cache = UnitCache::new(t.unit_bytes()).unwrap();
            let mut scratch = AlignedBuf::new(3 * PAGE_SIZE).unwrap();
            let mut out = vec![0u8; PAGE_SIZE];
            for (i, (&(off, len), p)) in recs.iter().zip(&payloads).enumerate() {
                let slot = 1000 + i as u64;
                let span = off as usize..off as usize + record_bytes(len);
                let intact = span.end <= file_len && !touched[span.clone()].iter().any(|&b| b);
                for cached in [true, false] {
                    out.fill(0);
                    let r = if cached {
                        t.read_cached(off, len, slot, &mut cache, &mut out).map(|_| ())
                    } else {
                        t.read(off, len, slot, &mut scratch, &mut out)
                    };
                    match r {
                        Ok(()) => prop_assert_eq!(&out[..len], &p[..], "record {} (cached {}) came back different", i, cached),
                        // The uncached read reads whole pages around the record (direct IO).
                        Err(e) => prop_assert!(
                            !intact || (!cached && round_up(span.end, PAGE_SIZE) > file_len),
                            "untouched record {} (cached {}) failed: {}", i, cached, e
                        ),
                    }
                }
            }
        }
    }

    /// What encryption costs per record on this machine, next to crc32c. Run with
    /// `cargo test --release -p tierswap --lib record_cost -- --ignored --nocapture`.
    #[test]
    #[ignore]
    fn record_cost() {
        for len in [PAGE_SIZE, 2048, 1024] {
            let c = measure_record_cost(len, 200_000).unwrap();
            println!(
                "{len:>5} B payload: crc32c seal {:.3} µs open {:.3} µs | aes-256-gcm seal {:.3} µs open {:.3} µs",
                c.crc_seal_us, c.crc_open_us, c.aead_seal_us, c.aead_open_us
            );
        }
    }
}
