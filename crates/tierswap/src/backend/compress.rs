//! Page compression for the pool and the file tier: zstd (its fast level 1 by default) or
//! LZ4, into a caller's buffer, no allocation on the paths that run per page.
//!
//! zstd's fast (negative) levels leave literals raw: a page of text with few repeats (words,
//! a sort's input, identifiers, base64) comes out longer than the page and would be stored
//! raw on the disk. With the literal retry ([`compress_page`]), a page a fast level cannot
//! bring under the caller's limit is compressed once more with its literals Huffman-coded:
//! random lowercase words go from 4,105 bytes to ~2,690 and into the pool, for ~6 µs more of
//! compression on those pages alone (random bytes: ~2 µs more, still refused). Pages the
//! fast level brings under the limit are not compressed twice: coding the literals of pages
//! it took to 2–3 KiB as well (words beside hex: ~2,730 → ~1,620 bytes) served redis 4–12 %
//! more GETs and sqlite 6–9 % fewer selects in the programs lab (docs/lab/literal-retry/).
//! Decompression reads either frame.

use std::cell::RefCell;

use crate::config::Compressor;
use crate::page::PAGE_SIZE;

/// Compressed pages longer than this are incompressible: storing them compressed would save
/// too little to pay for decompression (zswap and zram use the same ~3/4 page rule).
pub const INCOMPRESSIBLE_LIMIT: usize = 3072;

/// A compressed stream that does not decode to exactly one page.
#[derive(Debug, thiserror::Error)]
pub enum CodecError {
    /// The decoder rejected the stream.
    #[error("corrupt compressed data: {0}")]
    Corrupt(String),
    /// It decoded to the wrong length.
    #[error("decompressed to {got} bytes instead of {want}")]
    Length {
        /// Bytes produced.
        got: usize,
        /// Bytes expected.
        want: usize,
    },
}

/// Where in a [`COMPRESS_BUF_BYTES`] buffer the literal retry writes, past the first
/// attempt's worst case (zstd's bound for one page, 4,174 bytes).
const RETRY_AT: usize = PAGE_SIZE + 128;

thread_local! {
    static ZSTD_C: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    /// The same level with literals Huffman-coded, for the literal retry.
    static ZSTD_LIT: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
    static ZSTD_D: RefCell<Option<zstd::bulk::Decompressor<'static>>> = const { RefCell::new(None) };
}

/// Bytes a compression buffer needs (the worst case of either codec for one page).
pub const COMPRESS_BUF_BYTES: usize = 2 * PAGE_SIZE;

/// Compresses `src` (one page) into `dst` (at least [`COMPRESS_BUF_BYTES`]); returns the
/// compressed length, or `None` when it is longer than `limit` (pass
/// [`INCOMPRESSIBLE_LIMIT`] to test compressibility).
pub fn compress(c: Compressor, src: &[u8], dst: &mut [u8], limit: usize) -> Option<usize> {
    crate::inject::compressed(compress_uncounted(c, src, dst, limit))
}

/// [`compress`], and with `literal_retry` a page that a fast zstd level leaves longer than
/// `limit` is compressed once more with its literals coded; the shorter stream ends up at
/// the start of `dst`.
pub fn compress_page(c: Compressor, literal_retry: bool, src: &[u8], dst: &mut [u8], limit: usize) -> Option<usize> {
    let first = compress_uncounted(c, src, dst, usize::MAX);
    let n = match c {
        Compressor::Zstd { level } if literal_retry && level < 0 && first.is_none_or(|n| n > limit) => {
            match compress_literals(level, src, &mut dst[RETRY_AT..]) {
                Some(m) if first.is_none_or(|n| m < n) => {
                    dst.copy_within(RETRY_AT..RETRY_AT + m, 0);
                    Some(m)
                }
                _ => first,
            }
        }
        _ => first,
    };
    crate::inject::compressed(n.filter(|&n| n <= limit))
}

/// Compresses `src` at fast `level` with its literals Huffman-coded, into `dst`; `None` if
/// it does not fit.
fn compress_literals(level: i32, src: &[u8], dst: &mut [u8]) -> Option<usize> {
    ZSTD_LIT.with(|cell| {
        let mut cell = cell.borrow_mut();
        if cell.as_ref().map(|(l, _)| *l) != Some(level) {
            let mut z = zstd_page_compressor(level)?;
            z.set_parameter(zstd::zstd_safe::CParameter::LiteralCompressionMode(zstd::zstd_safe::ParamSwitch::Enable))
                .ok()?;
            *cell = Some((level, z));
        }
        let (_, z) = cell.as_mut()?;
        z.compress_to_buffer(src, dst).ok()
    })
}

/// [`compress`] without fault injection: for recompression, whose failure only means the
/// object is written back as it was.
pub fn compress_uncounted(c: Compressor, src: &[u8], dst: &mut [u8], limit: usize) -> Option<usize> {
    debug_assert!(dst.len() >= COMPRESS_BUF_BYTES);
    let n = match c {
        // lz4_flex wants room for the worst case up front.
        Compressor::Lz4 => lz4_flex::block::compress_into(src, dst).ok(),
        Compressor::Zstd { level } => ZSTD_C.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.as_ref().map(|(l, _)| *l) != Some(level) {
                *cell = Some((level, zstd_page_compressor(level)?));
            }
            let (_, z) = cell.as_mut()?;
            z.compress_to_buffer(src, dst).ok()
        }),
    };
    n.filter(|&n| n <= limit)
}

/// A zstd context sized for one page: a 4 KiB window and small match tables. zstd's
/// defaults are sized for long inputs and clear tables of tens of KiB per call; on the
/// lab's pages this cuts compression time by about a quarter at the same ratio. No
/// content size, checksum or dictionary id in the frame: the caller knows the length and
/// checks integrity itself (pool objects live in memory; file records are authenticated).
fn zstd_page_compressor(level: i32) -> Option<zstd::bulk::Compressor<'static>> {
    use zstd::zstd_safe::CParameter;
    let mut z = zstd::bulk::Compressor::new(level).ok()?;
    for p in [
        CParameter::WindowLog(ZSTD_PAGE_WINDOW_LOG),
        CParameter::HashLog(ZSTD_PAGE_WINDOW_LOG - 2),
        CParameter::ChainLog(ZSTD_PAGE_WINDOW_LOG - 1),
        CParameter::ContentSizeFlag(false),
        CParameter::ChecksumFlag(false),
        CParameter::DictIdFlag(false),
    ] {
        z.set_parameter(p).ok()?;
    }
    Some(z)
}

/// log2 of a page: the window a page's compression needs.
const ZSTD_PAGE_WINDOW_LOG: u32 = PAGE_SIZE.trailing_zeros();

/// Decompresses `src` into `dst`, which must come out exactly full (one page).
pub fn decompress(c: Compressor, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
    let want = dst.len();
    let got = match c {
        Compressor::Lz4 => {
            lz4_flex::block::decompress_into(src, dst).map_err(|e| CodecError::Corrupt(e.to_string()))?
        }
        Compressor::Zstd { .. } => ZSTD_D.with(|cell| {
            let mut cell = cell.borrow_mut();
            if cell.is_none() {
                *cell = Some(zstd::bulk::Decompressor::new().map_err(|e| CodecError::Corrupt(e.to_string()))?);
            }
            let z = cell.as_mut().ok_or_else(|| CodecError::Corrupt("no zstd context".into()))?;
            z.decompress_to_buffer(src, dst).map_err(|e| CodecError::Corrupt(e.to_string()))
        })?,
    };
    if got != want {
        return Err(CodecError::Length { got, want });
    }
    Ok(())
}

/// A decompressor made up front, for a reader that must not allocate when it reads: a
/// fault served in the faulting thread's SIGBUS handler runs in the program's thread, where
/// a zstd context made on first use (as [`decompress`] makes one per thread) would be
/// allocated from the program's heap, which may be managed memory being faulted on.
pub struct Decompressor {
    zstd: zstd::bulk::Decompressor<'static>,
}

impl Decompressor {
    /// A decompressor with its zstd context.
    pub fn new() -> std::io::Result<Decompressor> {
        Ok(Decompressor { zstd: zstd::bulk::Decompressor::new()? })
    }

    /// As [`decompress`], with this decompressor's own context.
    pub fn decompress(&mut self, c: Compressor, src: &[u8], dst: &mut [u8]) -> Result<(), CodecError> {
        let want = dst.len();
        let got = match c {
            Compressor::Lz4 => {
                lz4_flex::block::decompress_into(src, dst).map_err(|e| CodecError::Corrupt(e.to_string()))?
            }
            Compressor::Zstd { .. } => {
                self.zstd.decompress_to_buffer(src, dst).map_err(|e| CodecError::Corrupt(e.to_string()))?
            }
        };
        if got != want {
            return Err(CodecError::Length { got, want });
        }
        Ok(())
    }
}

/// Compressed size of a page, for reports: `None` if incompressible.
pub fn compressed_len(c: Compressor, page: &[u8]) -> Option<usize> {
    let mut buf = [0u8; COMPRESS_BUF_BYTES];
    compress(c, page, &mut buf, INCOMPRESSIBLE_LIMIT)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn counter_page() -> Vec<u8> {
        (0..512u64).flat_map(|i| (1000 * 512 + i).to_le_bytes()).collect()
    }

    /// The next value of xorshift64 state `x`.
    fn xorshift(x: &mut u64) -> u64 {
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x
    }

    /// A page of pseudo-random bytes: nothing compresses it.
    fn noise_page() -> Vec<u8> {
        let mut x = 88172645463325252u64;
        (0..512).flat_map(|_| xorshift(&mut x).to_le_bytes()).collect()
    }

    #[test]
    fn round_trip_both_codecs() {
        for c in [
            Compressor::Lz4,
            Compressor::Zstd { level: 1 },
            Compressor::Zstd { level: 3 },
            Compressor::Zstd { level: -1 },
            Compressor::Zstd { level: -7 },
        ] {
            let page = counter_page();
            let mut buf = [0u8; COMPRESS_BUF_BYTES];
            let n = compress(c, &page, &mut buf, INCOMPRESSIBLE_LIMIT).expect("counter pages compress");
            assert!(n < 3000, "{c:?}: {n}");
            let mut out = vec![0u8; PAGE_SIZE];
            decompress(c, &buf[..n], &mut out).unwrap();
            assert_eq!(out, page);
        }
    }

    #[test]
    fn random_pages_are_incompressible() {
        let page = noise_page();
        assert_eq!(compressed_len(Compressor::Lz4, &page), None);
        assert_eq!(compressed_len(Compressor::Zstd { level: 1 }, &page), None);
        assert_eq!(compressed_len(Compressor::Zstd { level: -1 }, &page), None);
    }

    /// A page of lowercase words of 2 to 9 letters, spaces between: no repeats for a fast
    /// level to find, ~4.7 bits of entropy a byte.
    fn words_page(seed: u64) -> Vec<u8> {
        let mut x = seed | 1;
        let mut next = move || xorshift(&mut x);
        let mut page = Vec::with_capacity(PAGE_SIZE);
        while page.len() < PAGE_SIZE {
            for _ in 0..2 + next() % 8 {
                page.push(b'a' + (next() % 26) as u8);
            }
            page.push(b' ');
        }
        page.truncate(PAGE_SIZE);
        page
    }

    /// Words of a small vocabulary beside hex digits, as a server's string values: the
    /// repeated words give a fast level matches, the hex none.
    fn words_hex_page(seed: u64) -> Vec<u8> {
        const WORDS: [&[u8]; 8] =
            [b"alpha ", b"bravo ", b"charlie ", b"delta ", b"echo ", b"foxtrot ", b"golf ", b"hotel "];
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        let mut next = move || xorshift(&mut x);
        let mut page = Vec::with_capacity(PAGE_SIZE + 8);
        while page.len() < PAGE_SIZE / 2 {
            page.extend_from_slice(WORDS[(next() % 8) as usize]);
        }
        while page.len() < PAGE_SIZE {
            page.push(b"0123456789abcdef"[(next() % 16) as usize]);
        }
        page.truncate(PAGE_SIZE);
        page
    }

    fn round_trip(c: Compressor, stream: &[u8], page: &[u8]) {
        let mut out = vec![0u8; PAGE_SIZE];
        decompress(c, stream, &mut out).unwrap();
        assert_eq!(out, page);
    }

    #[test]
    fn the_literal_retry_stores_text_a_fast_level_leaves_raw() {
        let fast = Compressor::Zstd { level: -1 };
        let mut buf = [0u8; COMPRESS_BUF_BYTES];
        for seed in 1..20 {
            let page = words_page(seed);
            assert_eq!(compress_page(fast, false, &page, &mut buf, INCOMPRESSIBLE_LIMIT), None, "seed {seed}");
            let n = compress_page(fast, true, &page, &mut buf, INCOMPRESSIBLE_LIMIT).expect("words compress");
            // ~4.7 bits a letter: about 60 % of the page.
            assert!(n < PAGE_SIZE * 70 / 100, "seed {seed}: {n}");
            round_trip(fast, &buf[..n], &page);
            // Under a tighter limit the retry comes where the fast level passed the pool's.
            let page = words_hex_page(seed);
            let plain =
                compress_page(fast, false, &page, &mut buf, INCOMPRESSIBLE_LIMIT).expect("words and hex compress");
            let limit = plain * 3 / 4;
            assert_eq!(compress_page(fast, false, &page, &mut buf, limit), None, "seed {seed}");
            let n = compress_page(fast, true, &page, &mut buf, limit).expect("coded literals fit");
            round_trip(fast, &buf[..n], &page);
        }
    }

    #[test]
    fn the_literal_retry_leaves_pages_under_the_limit_random_pages_and_other_codecs_alone() {
        let mut a = [0u8; COMPRESS_BUF_BYTES];
        let mut b = [0u8; COMPRESS_BUF_BYTES];
        // Brought under the limit by the fast level: the same stream either way.
        let fast = Compressor::Zstd { level: -1 };
        for page in [counter_page(), words_hex_page(9)] {
            let n = compress_page(fast, false, &page, &mut a, INCOMPRESSIBLE_LIMIT).unwrap();
            assert_eq!(compress_page(fast, true, &page, &mut b, INCOMPRESSIBLE_LIMIT), Some(n));
            assert_eq!(a[..n], b[..n]);
        }
        // Levels that code literals already, and lz4: the retry changes nothing.
        let words = words_page(5);
        for c in [Compressor::Lz4, Compressor::Zstd { level: 1 }] {
            let n = compress_page(c, false, &words, &mut a, INCOMPRESSIBLE_LIMIT);
            assert_eq!(compress_page(c, true, &words, &mut b, INCOMPRESSIBLE_LIMIT), n, "{c:?}");
            if let Some(n) = n {
                assert_eq!(a[..n], b[..n], "{c:?}");
            }
        }
        // Random bytes stay incompressible, and a limit below what the retry reaches refuses.
        assert_eq!(compress_page(fast, true, &noise_page(), &mut a, INCOMPRESSIBLE_LIMIT), None);
        assert_eq!(compress_page(fast, true, &words, &mut a, 1024), None);
    }

    proptest! {
        #[test]
        fn garbage_never_panics_or_passes_as_a_page(data in proptest::collection::vec(any::<u8>(), 0..600)) {
            let mut out = vec![0u8; PAGE_SIZE];
            for c in [Compressor::Lz4, Compressor::Zstd { level: 1 }, Compressor::Zstd { level: -1 }] {
                // Either an error, or (vanishingly unlikely) a stream that really is one page.
                if decompress(c, &data, &mut out).is_ok() {
                    let mut again = vec![0u8; PAGE_SIZE];
                    prop_assert!(decompress(c, &data, &mut again).is_ok());
                    prop_assert_eq!(&out, &again);
                }
            }
        }
    }
}
