//! `tierswap bench floor`: what the same pages cost to copy and to (de)compress on one core,
//! the physical floor under every refault number: the lab's counter-filled pages, or the
//! pages of a file (`--data`: a heap dump, a program's input) to see what a program's own
//! data costs.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::time::Instant;

use tierswap::backend::compress::{compress_page, decompress, COMPRESS_BUF_BYTES, INCOMPRESSIBLE_LIMIT};
use tierswap::Compressor;

use crate::workload::{self, Mem, WorkloadKind};

/// Bytes of a page.
const PAGE: usize = 4096;

/// One line of the floor table.
#[derive(Debug, serde::Serialize)]
pub struct FloorRow {
    /// What was measured.
    pub what: String,
    /// GB/s of page bytes (10^9 bytes per second), median of 3; NaN where nothing was
    /// decompressed (every page refused).
    pub gb_per_s: f64,
    /// µs per 4 KiB page; NaN as `gb_per_s`.
    pub us_per_page: f64,
    /// Compression ratio (page bytes / compressed bytes, a page that does not compress
    /// counted whole), where it applies.
    pub ratio: Option<f64>,
    /// Percent of the pages the pool would refuse as incompressible (longer than 3/4 of a
    /// page compressed), where it applies.
    pub raw_pct: Option<f64>,
}

fn median3(mut f: impl FnMut() -> f64) -> f64 {
    let mut v = [f(), f(), f()];
    v.sort_by(|a, b| a.total_cmp(b));
    v[1]
}

/// `size_bytes` of the lab's counter-filled pages.
pub fn counter_pages(size_bytes: usize) -> Vec<u8> {
    let size_bytes = size_bytes.max(1 << 20) & !4095;
    let mut src = vec![0u8; size_bytes];
    workload::fill(WorkloadKind::Seq64, Mem { ptr: src.as_mut_ptr(), len: size_bytes }, 1, &|_| {});
    src
}

/// Up to `size_bytes` of the pages of `file`, taken evenly across it (every k-th page) so
/// that a heap dump's or an input's parts are all represented; all-zero pages are left
/// out (the zero tier takes those without compression). `None` when nothing is left.
/// Reads the file once in order, keeping only the indexes of its non-zero pages (4 bytes
/// a page), then reads the chosen pages: a dump the size of the machine's memory fits.
pub fn file_pages(file: &File, size_bytes: usize) -> io::Result<Option<Vec<u8>>> {
    const CHUNK: usize = 1 << 20;
    let mut nonzero: Vec<u32> = Vec::new();
    let mut buf = vec![0u8; CHUNK];
    let mut offset = 0u64;
    loop {
        let n = read_full_at(file, &mut buf, offset)?;
        for (i, page) in buf[..n].chunks_exact(PAGE).enumerate() {
            if page.iter().any(|&b| b != 0) {
                let idx = offset / PAGE as u64 + i as u64;
                let idx = u32::try_from(idx)
                    .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a file of over 16 TiB"))?;
                nonzero.push(idx);
            }
        }
        if n < CHUNK {
            break;
        }
        offset += CHUNK as u64;
    }
    let want = (size_bytes / PAGE).max(1);
    let step = nonzero.len().div_ceil(want).max(1);
    let mut src = Vec::with_capacity(want.min(nonzero.len()) * PAGE);
    let mut page = [0u8; PAGE];
    for &idx in nonzero.iter().step_by(step).take(want) {
        file.read_exact_at(&mut page, idx as u64 * PAGE as u64)?;
        src.extend_from_slice(&page);
    }
    Ok((!src.is_empty()).then_some(src))
}

/// Reads into `buf` from `offset` until it is full or the file ends; the bytes read.
fn read_full_at(file: &File, buf: &mut [u8], offset: u64) -> io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read_at(&mut buf[n..], offset + n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

/// Measures copy and each codec on `src` (whole pages).
pub fn measure(src: &[u8]) -> Vec<FloorRow> {
    let size_bytes = src.len() & !4095;
    let src = &src[..size_bytes];
    let pages = size_bytes / 4096;
    let mut dst = vec![0u8; size_bytes];
    let mut rows = Vec::new();
    let row = |what: &str, secs: f64, ratio: Option<f64>, raw_pct: Option<f64>| FloorRow {
        what: what.into(),
        gb_per_s: size_bytes as f64 / secs / 1e9,
        us_per_page: secs * 1e6 / pages as f64,
        ratio,
        raw_pct,
    };
    let t = median3(|| {
        let t0 = Instant::now();
        dst.copy_from_slice(src);
        std::hint::black_box(&dst);
        t0.elapsed().as_secs_f64()
    });
    rows.push(row("memcpy", t, None, None));
    for (name, c, retry) in [
        ("lz4", Compressor::Lz4, false),
        ("zstd 1", Compressor::Zstd { level: 1 }, false),
        ("zstd fast-1", Compressor::Zstd { level: -1 }, false),
        ("zstd fast-1 retry", Compressor::Zstd { level: -1 }, true),
    ] {
        let mut comp = vec![0u8; pages * COMPRESS_BUF_BYTES / 2 + COMPRESS_BUF_BYTES];
        let mut scratch = vec![0u8; COMPRESS_BUF_BYTES];
        let mut total = 0usize;
        let t = median3(|| {
            total = 0;
            let t0 = Instant::now();
            for p in 0..pages {
                total += compress_page(c, retry, &src[p * 4096..(p + 1) * 4096], &mut scratch, 4096).unwrap_or(4096);
            }
            t0.elapsed().as_secs_f64()
        });
        // Lay the pages the pool would take out for the decompression pass.
        let mut offs = Vec::with_capacity(pages);
        let mut at = 0;
        for p in 0..pages {
            let n = compress_page(c, retry, &src[p * 4096..(p + 1) * 4096], &mut scratch, INCOMPRESSIBLE_LIMIT)
                .unwrap_or(0);
            comp[at..at + n].copy_from_slice(&scratch[..n]);
            offs.push((at, n));
            at += n;
        }
        let raw = offs.iter().filter(|&&(_, n)| n == 0).count();
        let raw_pct = 100.0 * raw as f64 / pages as f64;
        rows.push(row(&format!("{name} compress"), t, Some(size_bytes as f64 / total.max(1) as f64), Some(raw_pct)));
        let t = median3(|| {
            let t0 = Instant::now();
            for (p, &(o, n)) in offs.iter().enumerate() {
                if n > 0 {
                    let _ = decompress(c, &comp[o..o + n], &mut dst[p * 4096..(p + 1) * 4096]);
                }
            }
            t0.elapsed().as_secs_f64()
        });
        // Per page decompressed (the refused pages are not); none held: no figure.
        let secs_per_all = if raw < pages { t * pages as f64 / (pages - raw) as f64 } else { f64::NAN };
        rows.push(row(&format!("{name} decompress"), secs_per_all, None, None));
    }
    rows
}

/// The floor table as text; `data` says what the pages were.
pub fn table(rows: &[FloorRow], size_bytes: usize, data: &str) -> String {
    let mut s = format!("floor on one core, {} MiB of {data}:\n", size_bytes >> 20);
    s += &format!("{:<28} {:>8} {:>10} {:>7} {:>6}\n", "", "GB/s", "µs/page", "ratio", "raw %");
    for r in rows {
        let figure = |x: f64, prec: usize| if x.is_nan() { "-".to_string() } else { format!("{x:.prec$}") };
        s += &format!(
            "{:<28} {:>8} {:>10} {:>7} {:>6}\n",
            r.what,
            figure(r.gb_per_s, 2),
            figure(r.us_per_page, 3),
            r.ratio.map_or("".into(), |x| format!("{x:.2}")),
            r.raw_pct.map_or("".into(), |x| format!("{x:.1}"))
        );
    }
    s += "ratio: page bytes over compressed bytes (a page that does not compress counted whole); raw %: pages\n\
          over 3/4 of a page compressed, which the pool refuses; decompress: µs per page the pool would hold.\n\
          retry: a page the fast level cannot bring under 3/4 of a page compressed again, literals coded.\n";
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_pages_skip_zero_pages_and_spread_over_the_file() {
        let mut data = vec![0u8; 4096 * 10];
        for p in [1usize, 3, 5, 7, 9] {
            data[p * 4096..(p + 1) * 4096].fill(p as u8);
        }
        let (file, path) = temp_file("spread", &data);
        // Two pages wanted of five non-zero ones: every third, pages 1 and 7.
        let got = file_pages(&file, 2 * 4096).unwrap().unwrap();
        assert_eq!(got.len(), 2 * 4096);
        assert_eq!((got[0], got[4096]), (1, 7));
        assert!(got[..4096].iter().all(|&b| b == 1) && got[4096..].iter().all(|&b| b == 7));
        // More wanted than there are: all five, in order.
        let got = file_pages(&file, 1 << 20).unwrap().unwrap();
        let firsts: Vec<u8> = got.chunks(4096).map(|p| p[0]).collect();
        assert_eq!(firsts, [1, 3, 5, 7, 9]);
        std::fs::remove_file(path).unwrap();
        let (zeros, path) = temp_file("zeros", &[0u8; 8192]);
        assert!(file_pages(&zeros, 4096).unwrap().is_none());
        std::fs::remove_file(path).unwrap();
        let (short, path) = temp_file("short", &[1u8; 100]);
        assert!(file_pages(&short, 4096).unwrap().is_none(), "no whole page");
        std::fs::remove_file(path).unwrap();
    }

    #[test]
    fn file_pages_read_past_the_first_chunk() {
        // 1 MiB and 3 pages: the last non-zero pages lie in the second chunk read.
        let pages = 256 + 3;
        let mut data = vec![0u8; pages * 4096];
        for p in [0usize, 255, 256, 258] {
            data[p * 4096..(p + 1) * 4096].fill((p % 251) as u8 + 1);
        }
        let (file, path) = temp_file("chunks", &data);
        let got = file_pages(&file, 1 << 20).unwrap().unwrap();
        let expect: Vec<u8> =
            [0usize, 255, 256, 258].iter().flat_map(|&p| data[p * 4096..(p + 1) * 4096].to_vec()).collect();
        assert_eq!(got, expect);
        std::fs::remove_file(path).unwrap();
    }

    /// A file of `data` in the temporary directory, open for reading, and its path.
    fn temp_file(name: &str, data: &[u8]) -> (File, std::path::PathBuf) {
        let path = std::env::temp_dir().join(format!("tierswap-floor-{}-{name}", std::process::id()));
        std::fs::write(&path, data).unwrap();
        (File::open(&path).unwrap(), path)
    }

    #[test]
    fn the_table_counts_what_the_pool_would_refuse() {
        // Half counter pages, half noise: lz4 and zstd refuse exactly the noise.
        let mut src = counter_pages(1 << 20);
        let mut x = 88172645463325252u64;
        for b in src[(1 << 19)..].chunks_exact_mut(8) {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            b.copy_from_slice(&x.to_le_bytes());
        }
        let rows = measure(&src);
        for r in rows.iter().filter(|r| r.what.ends_with("compress") && !r.what.ends_with("decompress")) {
            assert_eq!(r.raw_pct, Some(50.0), "{}", r.what);
            let ratio = r.ratio.unwrap();
            assert!(ratio > 1.0 && ratio < 2.0, "{}: {ratio}", r.what);
        }
        assert_eq!(rows.len(), 1 + 4 * 2);
    }
}
