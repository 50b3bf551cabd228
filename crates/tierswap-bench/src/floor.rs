//! `tierswap bench floor`: what the same pages cost to copy and to (de)compress on one core,
//! the physical floor under every refault number.

use std::time::Instant;

use tierswap::backend::compress::{compress, decompress, COMPRESS_BUF_BYTES};
use tierswap::Compressor;

use crate::workload::{self, Mem, WorkloadKind};

/// One line of the floor table.
#[derive(Debug, serde::Serialize)]
pub struct FloorRow {
    /// What was measured.
    pub what: String,
    /// GB/s of page bytes (10^9 bytes per second), median of 3.
    pub gb_per_s: f64,
    /// µs per 4 KiB page.
    pub us_per_page: f64,
    /// Compression ratio (page bytes / compressed bytes), where it applies.
    pub ratio: Option<f64>,
}

fn median3(mut f: impl FnMut() -> f64) -> f64 {
    let mut v = [f(), f(), f()];
    v.sort_by(|a, b| a.total_cmp(b));
    v[1]
}

/// Measures on `size_bytes` of the lab's counter-filled pages.
pub fn measure(size_bytes: usize) -> Vec<FloorRow> {
    let size_bytes = size_bytes.max(1 << 20) & !4095;
    let mut src = vec![0u8; size_bytes];
    workload::fill(WorkloadKind::Seq64, Mem { ptr: src.as_mut_ptr(), len: size_bytes }, 1, &|_| {});
    let pages = size_bytes / 4096;
    let mut dst = vec![0u8; size_bytes];
    let mut rows = Vec::new();
    let row = |what: &str, secs: f64, ratio: Option<f64>| FloorRow {
        what: what.into(),
        gb_per_s: size_bytes as f64 / secs / 1e9,
        us_per_page: secs * 1e6 / pages as f64,
        ratio,
    };
    let t = median3(|| {
        let t0 = Instant::now();
        dst.copy_from_slice(&src);
        std::hint::black_box(&dst);
        t0.elapsed().as_secs_f64()
    });
    rows.push(row("memcpy", t, None));
    for (name, c) in [
        ("lz4", Compressor::Lz4),
        ("zstd 1", Compressor::Zstd { level: 1 }),
        ("zstd fast-1", Compressor::Zstd { level: -1 }),
    ] {
        let mut comp = vec![0u8; pages * COMPRESS_BUF_BYTES / 2 + COMPRESS_BUF_BYTES];
        let mut lens = vec![0usize; pages];
        let mut scratch = vec![0u8; COMPRESS_BUF_BYTES];
        let mut total = 0usize;
        let t = median3(|| {
            total = 0;
            let t0 = Instant::now();
            for p in 0..pages {
                let n = compress(c, &src[p * 4096..(p + 1) * 4096], &mut scratch, 4096).unwrap_or(4096);
                lens[p] = n;
                total += n;
            }
            t0.elapsed().as_secs_f64()
        });
        // Lay the compressed pages out for the decompression pass.
        let mut offs = Vec::with_capacity(pages);
        let mut at = 0;
        for p in 0..pages {
            let n = compress(c, &src[p * 4096..(p + 1) * 4096], &mut scratch, 4096).unwrap_or(0);
            comp[at..at + n].copy_from_slice(&scratch[..n]);
            offs.push((at, n));
            at += n;
        }
        rows.push(row(&format!("{name} compress"), t, Some(size_bytes as f64 / total.max(1) as f64)));
        let t = median3(|| {
            let t0 = Instant::now();
            for (p, &(o, n)) in offs.iter().enumerate() {
                if n > 0 {
                    let _ = decompress(c, &comp[o..o + n], &mut dst[p * 4096..(p + 1) * 4096]);
                }
            }
            t0.elapsed().as_secs_f64()
        });
        rows.push(row(&format!("{name} decompress"), t, None));
    }
    rows
}

/// The floor table as text.
pub fn table(rows: &[FloorRow], size_bytes: usize) -> String {
    let mut s = format!("floor on one core, {} MiB of counter-filled pages (the lab's data):\n", size_bytes >> 20);
    s += &format!("{:<22} {:>8} {:>12} {:>7}\n", "", "GB/s", "µs/page", "ratio");
    for r in rows {
        s += &format!(
            "{:<22} {:>8.2} {:>12.3} {:>7}\n",
            r.what,
            r.gb_per_s,
            r.us_per_page,
            r.ratio.map_or("".into(), |x| format!("{x:.2}"))
        );
    }
    s
}
