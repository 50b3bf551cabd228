//! The swap table entry: one u64 per slot of the virtual swap space, saying which backend
//! holds the slot's bytes and where.

use crate::backend::Backend;

/// A swap table entry.
///
/// ```text
///  63  62  61   59 58      51 50                                       0
/// +---+---+-------+----------+------------------------------------------+
/// | L | R |  tag  |  count   |              location (51 bits)          |
/// +---+---+-------+----------+------------------------------------------+
///  L      lock bit: a thread is moving or reading the slot's bytes
///  R      referenced (second chance for pool writeback)
///  tag    0 Free, 1 Reserved, 2 Zero, 3 SameFilled, 4 Pool, 5 File, 6 Remote
///  count  swap count: ptes referring to the slot (more than one after fork)
///  location, by tag:
///    Zero        0
///    SameFilled  the fill pattern, see [`encode_pattern`]
///    Pool        | C | pool handle (38)           | length - 1 (12) |
///    File        | C | file offset / 16 (38)      | length - 1 (12) |
///    Remote      | C | object version (38)        | length - 1 (12) |
///                 50  49                        12  11              0
///  C      codec: 0 the pool's compressor, 1 the recompression codec (the object was
///         recompressed in the pool while cold, and keeps that codec on the file or remote)
/// ```
/// An all-zero word is a free slot, which is what a released swap table page reads as.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct SwapEntry(u64);

/// What kind of entry a [`SwapEntry`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Tag {
    /// Not allocated.
    Free,
    /// Allocated, bytes not placed yet.
    Reserved,
    /// A zero page.
    Zero,
    /// A page of one repeated 8-byte pattern.
    SameFilled,
    /// In the compressed pool.
    Pool,
    /// In the file tier.
    File,
    /// In a remote store.
    Remote,
}

impl Tag {
    const fn bits(self) -> u64 {
        match self {
            Tag::Free => 0,
            Tag::Reserved => 1,
            Tag::Zero => 2,
            Tag::SameFilled => 3,
            Tag::Pool => 4,
            Tag::File => 5,
            Tag::Remote => 6,
        }
    }

    const fn from_bits(b: u64) -> Tag {
        match b {
            0 => Tag::Free,
            1 => Tag::Reserved,
            2 => Tag::Zero,
            3 => Tag::SameFilled,
            4 => Tag::Pool,
            5 => Tag::File,
            // 7 is never written; read it as Remote rather than panic on a torn word.
            _ => Tag::Remote,
        }
    }

    /// The backend a placed entry lives in (`None` for Free/Reserved).
    pub const fn backend(self) -> Option<Backend> {
        match self {
            Tag::Free | Tag::Reserved => None,
            Tag::Zero => Some(Backend::Zero),
            Tag::SameFilled => Some(Backend::SameFilled),
            Tag::Pool => Some(Backend::Pool),
            Tag::File => Some(Backend::File),
            Tag::Remote => Some(Backend::Remote),
        }
    }

    /// Whether the bytes are in memory (zero, same-filled, pool): no IO to read them.
    pub const fn in_memory(self) -> bool {
        matches!(self, Tag::Zero | Tag::SameFilled | Tag::Pool)
    }

    /// Index for per-tag counters (0..8).
    pub const fn index(self) -> usize {
        self.bits() as usize
    }
}

/// Bits of the location field.
pub const LOCATION_BITS: u32 = 51;
/// Bits of an object length field (length - 1, so 1..=4096).
const LEN_BITS: u32 = 12;
/// Bits of a pool handle, file offset/16 or remote version (the location's top bit is the
/// codec bit): what a backend's address may use.
pub use crate::backend::ADDR_BITS;
const _: () =
    assert!(ADDR_BITS == LOCATION_BITS - LEN_BITS - 1, "the location holds an address, a length and the codec bit");
/// The codec bit of a Pool, File or Remote location.
const RECOMPRESSED: u64 = 1 << (LOCATION_BITS - 1);
/// Largest swap count.
pub const MAX_COUNT: u32 = 255;

impl SwapEntry {
    const LOCK: u64 = 1 << 63;
    const REF: u64 = 1 << 62;
    const TAG_SHIFT: u32 = 59;
    const COUNT_SHIFT: u32 = 51;
    const LOC_MASK: u64 = (1 << LOCATION_BITS) - 1;

    /// The free entry.
    pub const FREE: SwapEntry = SwapEntry(0);

    /// An entry with the given tag, count and location.
    pub const fn new(tag: Tag, count: u32, location: u64) -> SwapEntry {
        SwapEntry(
            (tag.bits() << Self::TAG_SHIFT)
                | (((count & MAX_COUNT) as u64) << Self::COUNT_SHIFT)
                | (location & Self::LOC_MASK),
        )
    }

    /// A zero page with one reference.
    pub const fn zero() -> SwapEntry {
        SwapEntry::new(Tag::Zero, 1, 0)
    }

    /// A same-filled page, if the pattern fits the entry (see [`encode_pattern`]).
    pub fn same_filled(pattern: u64) -> Option<SwapEntry> {
        encode_pattern(pattern).map(|loc| SwapEntry::new(Tag::SameFilled, 1, loc))
    }

    /// A pool object of `len` bytes (1..=4096) at `handle` (< 2^38), compressed with the
    /// pool's compressor.
    pub fn pool(handle: u64, len: usize) -> SwapEntry {
        SwapEntry::new(Tag::Pool, 1, pack_addr_len(handle, len))
    }

    /// A file record of `len` bytes of payload whose header starts at byte `offset`
    /// (a multiple of 16, < 2^42).
    pub fn file(offset: u64, len: usize) -> SwapEntry {
        debug_assert_eq!(offset % 16, 0);
        SwapEntry::new(Tag::File, 1, pack_addr_len(offset / 16, len))
    }

    /// The tag.
    pub const fn tag(self) -> Tag {
        Tag::from_bits((self.0 >> Self::TAG_SHIFT) & 0b111)
    }

    /// The swap count.
    pub const fn count(self) -> u32 {
        ((self.0 >> Self::COUNT_SHIFT) & MAX_COUNT as u64) as u32
    }

    /// The location field.
    pub const fn location(self) -> u64 {
        self.0 & Self::LOC_MASK
    }

    /// Whether the lock bit is set.
    pub const fn locked(self) -> bool {
        self.0 & Self::LOCK != 0
    }

    /// Whether the referenced bit is set.
    pub const fn referenced(self) -> bool {
        self.0 & Self::REF != 0
    }

    /// With the referenced bit set or cleared.
    pub const fn with_referenced(self, r: bool) -> SwapEntry {
        if r {
            SwapEntry(self.0 | Self::REF)
        } else {
            SwapEntry(self.0 & !Self::REF)
        }
    }

    /// With another swap count.
    pub const fn with_count(self, count: u32) -> SwapEntry {
        SwapEntry(
            (self.0 & !((MAX_COUNT as u64) << Self::COUNT_SHIFT)) | (((count & MAX_COUNT) as u64) << Self::COUNT_SHIFT),
        )
    }

    /// With the same count and referenced bit, and another tag and location.
    pub const fn with_place(self, tag: Tag, location: u64) -> SwapEntry {
        SwapEntry(
            (self.0 & (Self::LOCK | Self::REF | ((MAX_COUNT as u64) << Self::COUNT_SHIFT)))
                | (tag.bits() << Self::TAG_SHIFT)
                | (location & Self::LOC_MASK),
        )
    }

    pub(crate) const fn with_lock(self) -> SwapEntry {
        SwapEntry(self.0 | Self::LOCK)
    }

    pub(crate) const fn without_lock(self) -> SwapEntry {
        SwapEntry(self.0 & !Self::LOCK)
    }

    /// Whether a Pool, File or Remote entry's bytes are in the recompression codec rather
    /// than the pool's compressor.
    pub const fn recompressed(self) -> bool {
        matches!(self.tag(), Tag::Pool | Tag::File | Tag::Remote) && self.0 & RECOMPRESSED != 0
    }

    /// A Pool, File or Remote entry with the codec bit set or cleared.
    pub const fn with_recompressed(self, r: bool) -> SwapEntry {
        if r {
            SwapEntry(self.0 | RECOMPRESSED)
        } else {
            SwapEntry(self.0 & !RECOMPRESSED)
        }
    }

    /// Pool handle and length of a Pool entry, file offset and length of a File entry,
    /// version and length of a Remote entry.
    pub const fn addr_len(self) -> (u64, usize) {
        let loc = self.location();
        let addr = (loc >> LEN_BITS) & ((1 << ADDR_BITS) - 1);
        let len = (loc & ((1 << LEN_BITS) - 1)) as usize + 1;
        match self.tag() {
            Tag::File => (addr * 16, len),
            _ => (addr, len),
        }
    }

    /// The fill pattern of a SameFilled entry.
    pub fn pattern(self) -> u64 {
        decode_pattern(self.location())
    }

    /// The raw word.
    pub const fn raw(self) -> u64 {
        self.0
    }

    /// From a raw word (every bit pattern decodes).
    pub const fn from_raw(raw: u64) -> SwapEntry {
        SwapEntry(raw)
    }
}

impl std::fmt::Debug for SwapEntry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "SwapEntry({:?} x{} loc {:#x}", self.tag(), self.count(), self.location())?;
        if self.locked() {
            write!(f, " L")?;
        }
        if self.referenced() {
            write!(f, " R")?;
        }
        write!(f, ")")
    }
}

fn pack_addr_len(addr: u64, len: usize) -> u64 {
    assert!(addr < (1 << ADDR_BITS), "address {addr:#x} does not fit {ADDR_BITS} bits");
    assert!((1..=4096).contains(&len), "object length {len} outside 1..=4096");
    (addr << LEN_BITS) | (len as u64 - 1)
}

/// Encodes an 8-byte fill pattern into the 51-bit location, when it fits:
///
/// ```text
///  50  49                                          0
/// +---+---------------------------------------------+
/// | 0 |  value, sign-extended from bit 49 to 64     |   small / negative / pointer-like values
/// +---+---------------------------------------------+
/// | 1 | 0..0 |      x (32 bits)                      |   x repeated twice (floats, 32-bit ints, bytes)
/// +---+---------------------------------------------+
/// ```
/// Every byte-repeated pattern (0xffff…, 0x4141…) and every value within ±2^49 fits. A
/// pattern that fits neither way returns `None` and goes to the pool, where it compresses
/// to a few dozen bytes.
pub fn encode_pattern(p: u64) -> Option<u64> {
    let sext = ((p << 14) as i64 >> 14) as u64;
    if sext == p {
        return Some(p & ((1 << 50) - 1));
    }
    if (p >> 32) == (p & 0xffff_ffff) {
        return Some((1 << 50) | (p & 0xffff_ffff));
    }
    None
}

/// Inverse of [`encode_pattern`].
pub fn decode_pattern(loc: u64) -> u64 {
    if loc & (1 << 50) == 0 {
        (((loc & ((1 << 50) - 1)) << 14) as i64 >> 14) as u64
    } else {
        let x = loc & 0xffff_ffff;
        x | (x << 32)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const TAGS: [Tag; 7] = [Tag::Free, Tag::Reserved, Tag::Zero, Tag::SameFilled, Tag::Pool, Tag::File, Tag::Remote];

    proptest! {
        #[test]
        fn entry_round_trip(t in 0usize..7, count in 0u32..=MAX_COUNT, loc in 0u64..(1 << LOCATION_BITS), r: bool) {
            let e = SwapEntry::new(TAGS[t], count, loc).with_referenced(r);
            prop_assert_eq!(e.tag(), TAGS[t]);
            prop_assert_eq!(e.count(), count);
            prop_assert_eq!(e.location(), loc);
            prop_assert_eq!(e.referenced(), r);
            prop_assert!(!e.locked());
            prop_assert_eq!(e.with_lock().without_lock(), e);
            prop_assert_eq!(SwapEntry::from_raw(e.raw()), e);
            let moved = e.with_lock().with_place(Tag::File, 77);
            prop_assert_eq!(moved.count(), count);
            prop_assert_eq!(moved.referenced(), r);
            prop_assert!(moved.locked());
            prop_assert_eq!(moved.location(), 77);
            prop_assert_eq!(e.with_count(3).count(), 3);
            prop_assert_eq!(e.with_count(3).tag(), TAGS[t]);
        }

        #[test]
        fn pool_and_file_round_trip(addr in 0u64..(1 << ADDR_BITS), len in 1usize..=4096) {
            let e = SwapEntry::pool(addr, len);
            prop_assert_eq!(e.tag(), Tag::Pool);
            prop_assert_eq!(e.addr_len(), (addr, len));
            let f = SwapEntry::file(addr * 16, len);
            prop_assert_eq!(f.tag(), Tag::File);
            prop_assert_eq!(f.addr_len(), (addr * 16, len));
            prop_assert_eq!(f.count(), 1);
        }

        #[test]
        fn the_codec_bit_round_trips_apart_from_the_place(addr in 0u64..(1 << ADDR_BITS), len in 1usize..=4096, count in 1u32..=MAX_COUNT, r: bool, c: bool) {
            for e in [SwapEntry::pool(addr, len), SwapEntry::file(addr * 16, len)] {
                let e = e.with_count(count).with_referenced(r).with_recompressed(c);
                prop_assert_eq!(e.recompressed(), c);
                prop_assert_eq!((e.count(), e.referenced()), (count, r));
                let want = if e.tag() == Tag::File { (addr * 16, len) } else { (addr, len) };
                prop_assert_eq!(e.addr_len(), want);
                prop_assert_eq!(e.with_recompressed(!c).with_recompressed(c), e);
                // Moving the bytes keeps the codec when the caller carries the bit over.
                let moved = e.with_place(Tag::File, SwapEntry::file(16, len).with_recompressed(c).location());
                prop_assert_eq!((moved.recompressed(), moved.addr_len()), (c, (16, len)));
            }
        }

        #[test]
        fn pattern_round_trip(p: u64) {
            if let Some(loc) = encode_pattern(p) {
                prop_assert!(loc < (1 << LOCATION_BITS));
                prop_assert_eq!(decode_pattern(loc), p);
                prop_assert_eq!(SwapEntry::same_filled(p).unwrap().pattern(), p);
            }
        }

        #[test]
        fn byte_and_word_patterns_always_fit(b: u8, w: u32, small in -(1i64 << 49)..(1i64 << 49)) {
            prop_assert!(encode_pattern(u64::from_ne_bytes([b; 8])).is_some());
            prop_assert!(encode_pattern((w as u64) | ((w as u64) << 32)).is_some());
            prop_assert!(encode_pattern(small as u64).is_some());
        }
    }

    #[test]
    fn free_is_zero() {
        assert_eq!(SwapEntry::FREE.raw(), 0);
        assert_eq!(SwapEntry::from_raw(0).tag(), Tag::Free);
        assert_eq!(encode_pattern(0x0123_4567_89ab_cdef), None);
    }

    #[test]
    fn the_codec_bit_is_the_locations_top_bit_and_means_nothing_for_patterns() {
        let e = SwapEntry::pool((1 << ADDR_BITS) - 1, 4096).with_recompressed(true);
        assert_eq!(e.location(), (1 << LOCATION_BITS) - 1);
        // A same-filled pattern uses bit 50 for itself: it never reads as recompressed.
        let s = SwapEntry::same_filled(0x4141_4141_4141_4141).unwrap();
        assert_eq!(s.location() >> 50, 1);
        assert!(!s.recompressed());
    }
}
