//! Page compression for the pool and the file tier: zstd (its fast level 1 by default) or
//! LZ4, into a caller's buffer, no allocation on the paths that run per page.

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

thread_local! {
    static ZSTD_C: RefCell<Option<(i32, zstd::bulk::Compressor<'static>)>> = const { RefCell::new(None) };
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
        let mut x = 88172645463325252u64;
        let page: Vec<u8> = (0..512)
            .flat_map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                x.to_le_bytes()
            })
            .collect();
        assert_eq!(compressed_len(Compressor::Lz4, &page), None);
        assert_eq!(compressed_len(Compressor::Zstd { level: 1 }, &page), None);
        assert_eq!(compressed_len(Compressor::Zstd { level: -1 }, &page), None);
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
