//! The file tier: a log of checksummed, still-compressed records in one unlinked 0600 file.
//!
//! Space is allocated when writeback writes, never before (001: "allocate physical space at
//! writeback"), a unit (64 KiB by default) at a time: many records per write, written
//! sequentially into the lowest free unit, which is what flash likes. A unit whose last
//! record is freed is punched out of the file (and the file truncated when it was the tail).
//! The file is opened O_DIRECT where the filesystem allows, so swapped data does not sit in
//! the page cache outside the budget.
//!
//! A record on disk:
//! ```text
//!  0        2        4            8                  16                 16 + len
//! +--------+--------+------------+------------------+--------------------+---------+
//! | magic  |  len   |  crc32c    |  slot (u64 LE)   |  payload (len B)   | pad→16  |
//! +--------+--------+------------+------------------+--------------------+---------+
//!  crc32c covers len, slot and payload; a record read back is returned only when magic,
//!  len, slot and crc all match what the swap entry expects.
//! ```
//! Owns: the file, unit allocation, record encoding. Calls: the OS (pread/pwrite/fallocate).

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use crate::page::{round_up, PAGE_SIZE};
use crate::sys;

/// Bytes of a record header.
pub const RECORD_HEADER_BYTES: usize = 16;
const MAGIC: u16 = 0x7453;
/// Alignment of direct IO offsets and lengths.
const IO_ALIGN: usize = PAGE_SIZE;
/// Default bytes per unit (one write).
pub const DEFAULT_UNIT_BYTES: usize = 64 << 10;

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
    /// A record did not match its checksum, slot, or length.
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
}

/// Bytes a record of `len` payload bytes takes in a unit.
#[inline]
pub const fn record_bytes(len: usize) -> usize {
    round_up(RECORD_HEADER_BYTES + len, 16)
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

/// Checks a record (magic, length, slot, checksum) and returns its payload.
fn verify_record(r: &[u8], offset: u64, len: usize, slot: u64) -> Result<&[u8], FileError> {
    let corrupt = |what| FileError::Corrupt { offset, slot, what };
    if u16::from_le_bytes([r[0], r[1]]) != MAGIC {
        return Err(corrupt("bad magic"));
    }
    let rlen = u16::from_le_bytes([r[2], r[3]]);
    if rlen as usize != len {
        return Err(corrupt("length differs from the swap entry"));
    }
    let rslot = u64::from_le_bytes(r[8..16].try_into().unwrap_or([0; 8]));
    if rslot != slot {
        return Err(corrupt("record belongs to another slot"));
    }
    let payload = &r[16..16 + len];
    if u32::from_le_bytes([r[4], r[5], r[6], r[7]]) != record_crc(slot, rlen, payload) {
        return Err(corrupt("checksum mismatch"));
    }
    Ok(payload)
}

/// A fault thread's copy of the last unit it read (see [`FileTier::read_cached`]).
pub struct UnitCache {
    buf: AlignedBuf,
    unit: u64,
    generation: u32,
    valid_bytes: usize,
}

impl UnitCache {
    /// An empty cache for units of `unit_bytes`.
    pub fn new(unit_bytes: usize) -> io::Result<UnitCache> {
        Ok(UnitCache { buf: AlignedBuf::new(unit_bytes)?, unit: u64::MAX, generation: 0, valid_bytes: 0 })
    }
}

/// One unit being filled with records before it is written.
pub struct UnitWriter {
    buf: AlignedBuf,
    used_bytes: usize,
    records: usize,
}

impl UnitWriter {
    /// A writer for units of `unit_bytes`.
    pub fn new(unit_bytes: usize) -> io::Result<UnitWriter> {
        Ok(UnitWriter { buf: AlignedBuf::new(unit_bytes)?, used_bytes: 0, records: 0 })
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
        let len = payload.len() as u16;
        let crc = record_crc(slot, len, payload);
        let b = &mut self.buf.as_mut_slice()[off..off + rec];
        b[0..2].copy_from_slice(&MAGIC.to_le_bytes());
        b[2..4].copy_from_slice(&len.to_le_bytes());
        b[4..8].copy_from_slice(&crc.to_le_bytes());
        b[8..16].copy_from_slice(&slot.to_le_bytes());
        b[16..16 + payload.len()].copy_from_slice(payload);
        b[16 + payload.len()..].fill(0);
        self.used_bytes += rec;
        self.records += 1;
        Some(off)
    }

    /// Records in the unit.
    pub fn records(&self) -> usize {
        self.records
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
        self.records = 0;
    }
}

struct Units {
    /// Live record bytes per unit.
    live_bytes: Vec<u32>,
    /// Times each unit was written: a cached copy of a unit is good while this matches.
    generation: Vec<u32>,
    /// Units with no live record below `live_bytes.len()`, lowest used first.
    free: std::collections::BTreeSet<u32>,
}

/// The file tier of one pager.
pub struct FileTier {
    file: File,
    path_shown: PathBuf,
    direct: bool,
    unit_bytes: usize,
    units: Mutex<Units>,
    live_bytes: AtomicU64,
    live_records: AtomicU64,
    units_in_use: AtomicU64,
}

impl FileTier {
    /// Creates the swap file in `dir`: O_TMPFILE (never visible in the directory), else a
    /// uniquely named file unlinked at once; mode 0600 either way.
    pub fn create(dir: &Path, unit_bytes: usize) -> io::Result<FileTier> {
        let unit_bytes = round_up(unit_bytes.max(IO_ALIGN), IO_ALIGN);
        let (file, direct) = open_unlinked(dir)?;
        Ok(FileTier {
            file,
            path_shown: dir.join("(unlinked tierswap swap file)"),
            direct,
            unit_bytes,
            units: Mutex::new(Units { live_bytes: Vec::new(), generation: Vec::new(), free: Default::default() }),
            live_bytes: AtomicU64::new(0),
            live_records: AtomicU64::new(0),
            units_in_use: AtomicU64::new(0),
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

    /// The directory it lives in, for messages.
    pub fn describe(&self) -> &Path {
        &self.path_shown
    }

    /// The open file (tests use it to corrupt records behind the pager's back).
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Writes a filled unit; returns the file offset of its first byte. On error nothing is
    /// allocated and the records must stay where they were.
    pub fn write_unit(&self, w: &UnitWriter) -> Result<u64, FileError> {
        debug_assert!(w.records > 0);
        let unit = {
            let mut u = self.units.lock().unwrap_or_else(|e| e.into_inner());
            let unit = match u.free.pop_first() {
                Some(x) => x,
                None => {
                    u.live_bytes.push(0);
                    u.generation.push(0);
                    (u.live_bytes.len() - 1) as u32
                }
            };
            u.generation[unit as usize] = u.generation[unit as usize].wrapping_add(1);
            // Claimed before the write so no other writer takes it; released on error.
            u.live_bytes[unit as usize] = w.used_bytes as u32;
            unit
        };
        let offset = unit as u64 * self.unit_bytes as u64;
        let len = round_up(w.used_bytes, IO_ALIGN);
        if let Err(source) = self.file.write_all_at(&w.buf.as_slice()[..len], offset) {
            let mut u = self.units.lock().unwrap_or_else(|e| e.into_inner());
            u.live_bytes[unit as usize] = 0;
            u.free.insert(unit);
            return Err(FileError::Io { op: "write", offset, source });
        }
        self.live_bytes.fetch_add(w.used_bytes as u64, Ordering::Relaxed);
        self.live_records.fetch_add(w.records as u64, Ordering::Relaxed);
        self.units_in_use.fetch_add(1, Ordering::Relaxed);
        Ok(offset)
    }

    /// Reads the record at `offset` for `slot` with `len` payload bytes into `out[..len]`,
    /// checking magic, length, slot and checksum. `scratch` must hold 2 pages + len.
    pub fn read(
        &self,
        offset: u64,
        len: usize,
        slot: u64,
        scratch: &mut AlignedBuf,
        out: &mut [u8],
    ) -> Result<(), FileError> {
        let rec = record_bytes(len);
        let start = offset - offset % IO_ALIGN as u64;
        let end = round_up((offset + rec as u64) as usize, IO_ALIGN) as u64;
        let window = (end - start) as usize;
        assert!(window <= scratch.len(), "read scratch too small");
        let buf = &mut scratch.as_mut_slice()[..window];
        self.file.read_exact_at(buf, start).map_err(|source| FileError::Io { op: "read", offset, source })?;
        let at = (offset - start) as usize;
        out[..len].copy_from_slice(verify_record(&buf[at..at + rec], offset, len, slot)?);
        Ok(())
    }

    /// Like [`FileTier::read`], but through `cache`: the whole unit holding the record is
    /// read in one IO and kept, so the records written together with it (pages evicted
    /// together) come from memory. Returns whether the record came from the cache.
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
    ) -> Result<bool, FileError> {
        let unit = offset / self.unit_bytes as u64;
        let generation = {
            let u = self.units.lock().unwrap_or_else(|e| e.into_inner());
            u.generation.get(unit as usize).copied().unwrap_or(0)
        };
        let hit = cache.unit == unit && cache.generation == generation && cache.valid_bytes > 0;
        if !hit {
            assert!(cache.buf.len() >= self.unit_bytes, "unit cache smaller than a unit");
            cache.valid_bytes = 0;
            let base = unit * self.unit_bytes as u64;
            let buf = &mut cache.buf.as_mut_slice()[..self.unit_bytes];
            let mut got = 0;
            // The tail unit may be shorter on disk than a full unit.
            while got < buf.len() {
                match self.file.read_at(&mut buf[got..], base + got as u64) {
                    Ok(0) => break,
                    Ok(n) => got += n,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    Err(source) => return Err(FileError::Io { op: "read", offset, source }),
                }
            }
            cache.unit = unit;
            cache.generation = generation;
            cache.valid_bytes = got;
        }
        let at = (offset - unit * self.unit_bytes as u64) as usize;
        let rec = record_bytes(len);
        if at + rec > cache.valid_bytes {
            cache.valid_bytes = 0;
            return Err(FileError::Corrupt { offset, slot, what: "record beyond the end of the file" });
        }
        let payload = verify_record(&cache.buf.as_slice()[at..at + rec], offset, len, slot);
        match payload {
            Ok(p) => {
                out[..len].copy_from_slice(p);
                Ok(hit)
            }
            Err(e) => {
                // Never trust this copy again.
                cache.valid_bytes = 0;
                Err(e)
            }
        }
    }

    /// Frees a record; a unit left with no live record is punched out of the file.
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
            // Generations stay: a unit written again later must not match an old copy.
            let n = u.live_bytes.len() as u32;
            u.free.retain(|&x| x < n);
            let _ = self.file.set_len(n as u64 * self.unit_bytes as u64);
        } else {
            u.free.insert(unit as u32);
            punch_hole(&self.file, unit as u64 * self.unit_bytes as u64, self.unit_bytes as u64);
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

    /// Heap bytes of unit bookkeeping.
    pub fn metadata_bytes(&self) -> u64 {
        let u = self.units.lock().unwrap_or_else(|e| e.into_inner());
        (u.live_bytes.capacity() * 4 + u.free.len() * 8) as u64
    }
}

fn punch_hole(file: &File, offset: u64, len: u64) {
    use std::os::fd::AsRawFd;
    // SAFETY: fallocate on our own fd; punching a hole only deallocates blocks of freed units.
    unsafe {
        libc::fallocate(
            file.as_raw_fd(),
            libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
            offset as libc::off_t,
            len as libc::off_t,
        );
    }
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

    fn tier() -> FileTier {
        FileTier::create(&std::env::temp_dir(), DEFAULT_UNIT_BYTES).unwrap()
    }

    #[test]
    fn write_read_free_shrink() {
        let t = tier();
        let mut w = UnitWriter::new(t.unit_bytes()).unwrap();
        let mut placed = Vec::new();
        let mut slot = 0u64;
        while let Some(off) = w.push(slot, &vec![(slot % 251) as u8; 1000 + (slot as usize % 7)]) {
            placed.push((slot, off));
            slot += 1;
        }
        assert!(w.records() >= 60, "a 64K unit packs ~64 records of ~1K");
        let base = t.write_unit(&w).unwrap();
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
        // Second unit, then free the first entirely: it becomes a hole and is reused.
        let base2 = t.write_unit(&w).unwrap();
        assert_eq!(base2, t.unit_bytes() as u64);
        for &(slot, off) in &placed {
            t.free(base + off as u64, 1000 + (slot as usize % 7));
        }
        assert_eq!(t.blocks(), 16);
        assert_eq!(t.write_unit(&w).unwrap(), 0, "lowest free unit reused");
        for base in [0, base2] {
            for &(slot, off) in &placed {
                t.free(base + off as u64, 1000 + (slot as usize % 7));
            }
        }
        assert_eq!(t.live_bytes(), 0);
        assert_eq!(t.file_len_bytes(), 0, "file truncated when the tail frees");
    }

    #[test]
    fn flipped_byte_is_detected() {
        let t = tier();
        let mut w = UnitWriter::new(t.unit_bytes()).unwrap();
        let off = w.push(9, &[7u8; 300]).unwrap();
        let base = t.write_unit(&w).unwrap();
        let mut scratch = AlignedBuf::new(3 * PAGE_SIZE).unwrap();
        let mut out = vec![0u8; PAGE_SIZE];
        t.read(base + off as u64, 300, 9, &mut scratch, &mut out).unwrap();
        // Flip one payload byte behind the tier's back (through a buffered fd on the same file).
        let pos = base + off as u64 + 16 + 100;
        let mut b = [0u8; PAGE_SIZE];
        let page = pos - pos % PAGE_SIZE as u64;
        let mut sc = AlignedBuf::new(PAGE_SIZE).unwrap();
        t.file().read_exact_at(&mut sc.as_mut_slice()[..PAGE_SIZE], page).unwrap();
        b.copy_from_slice(&sc.as_slice()[..PAGE_SIZE]);
        b[(pos - page) as usize] ^= 0x20;
        sc.as_mut_slice()[..PAGE_SIZE].copy_from_slice(&b);
        t.file().write_all_at(&sc.as_slice()[..PAGE_SIZE], page).unwrap();
        assert!(matches!(
            t.read(base + off as u64, 300, 9, &mut scratch, &mut out),
            Err(FileError::Corrupt { what: "checksum mismatch", .. })
        ));
    }

    #[test]
    fn unit_cache_serves_neighbours_and_never_a_stale_copy() {
        let t = tier();
        let mut w = UnitWriter::new(t.unit_bytes()).unwrap();
        let offs: Vec<usize> = (0..20u64).map(|slot| w.push(slot, &[slot as u8 + 1; 900]).unwrap()).collect();
        let base = t.write_unit(&w).unwrap();
        let mut cache = UnitCache::new(t.unit_bytes()).unwrap();
        let mut out = vec![0u8; PAGE_SIZE];
        for (slot, &off) in offs.iter().enumerate() {
            let hit = t.read_cached(base + off as u64, 900, slot as u64, &mut cache, &mut out).unwrap();
            assert_eq!(hit, slot > 0, "one IO for the unit, then hits");
            assert!(out[..900].iter().all(|&b| b == slot as u8 + 1));
        }
        // Free the unit, write the same slot at the same place with other bytes: the cached
        // copy must not be served.
        for (slot, &off) in offs.iter().enumerate() {
            t.free(base + off as u64, 900);
            let _ = slot;
        }
        w.clear();
        let off0 = w.push(0, &[0xEE; 900]).unwrap();
        let base2 = t.write_unit(&w).unwrap();
        assert_eq!((base2, off0), (base, offs[0]), "same unit, same offset");
        let hit = t.read_cached(base2 + off0 as u64, 900, 0, &mut cache, &mut out).unwrap();
        assert!(!hit, "a rewritten unit is read again");
        assert!(out[..900].iter().all(|&b| b == 0xEE));
    }

    #[test]
    fn file_is_private() {
        use std::os::unix::fs::PermissionsExt;
        let t = tier();
        let mode = t.file().metadata().unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        use std::os::unix::fs::MetadataExt;
        assert_eq!(t.file().metadata().unwrap().nlink(), 0, "unlinked");
    }
}
