//! The file tier under faults: a corrupted record is never returned as data (the touching
//! thread gets SIGBUS, other pages read fine), and a full disk loses no page.

use std::io::{Read, Seek, SeekFrom, Write};
use std::process::Command;

use tierswap::{Hint, Pager, PagerConfig, Tiers};

const PAGE: usize = 4096;

fn fill_page(buf: &mut [u8], p: usize) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&((p as u64) * 512 + i as u64).to_le_bytes());
    }
}

fn page_ok(buf: &[u8], p: usize) -> bool {
    buf.chunks_exact(8).enumerate().all(|(i, w)| w == ((p as u64) * 512 + i as u64).to_le_bytes())
}

/// A region of `n` pages of `p`, page `i` filled with counter data for `i`.
fn filled_region(p: &Pager, n: usize) -> tierswap::Region {
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg);
    }
    r
}

/// The pager's swap file, reopened through /proc/self/fd.
fn open_swap_file() -> std::fs::File {
    for e in std::fs::read_dir("/proc/self/fd").unwrap().flatten() {
        if let Ok(target) = std::fs::read_link(e.path()) {
            let t = target.to_string_lossy().to_string();
            if t.contains("(deleted)") || t.contains("tierswap") || t.starts_with("/tmp/#") {
                if let Ok(f) = std::fs::OpenOptions::new().read(true).write(true).open(e.path()) {
                    if f.metadata().map(|m| m.len() > 0).unwrap_or(false) {
                        return f;
                    }
                }
            }
        }
    }
    panic!("no swap file among this process's fds");
}

/// Flips one payload byte of the record of `slot` (records are parsed from the start).
fn corrupt_record(f: &mut std::fs::File, slot: u64) -> u64 {
    let mut data = Vec::new();
    f.seek(SeekFrom::Start(0)).unwrap();
    f.read_to_end(&mut data).unwrap();
    let unit = 64 << 10;
    for base in (0..data.len()).step_by(unit) {
        let mut at = base;
        while at + 16 <= data.len().min(base + unit) {
            let magic = u16::from_le_bytes([data[at], data[at + 1]]);
            if magic != 0x7453 {
                break;
            }
            let len = u16::from_le_bytes([data[at + 2], data[at + 3]]) as usize;
            let s = u64::from_le_bytes(data[at + 8..at + 16].try_into().unwrap());
            if s == slot {
                let pos = (at + 16 + len / 2) as u64;
                f.seek(SeekFrom::Start(pos)).unwrap();
                f.write_all(&[data[at + 16 + len / 2] ^ 0x40]).unwrap();
                f.sync_all().unwrap();
                return pos;
            }
            at += (16 + len).div_ceil(16) * 16;
        }
    }
    panic!("no record for slot {slot}");
}

/// Runs in a child process (see the test below): evicts 64 pages to the file, corrupts
/// page 3's record, reads every other page, then touches page 3.
fn corrupted_child() {
    let n = 64;
    let (_pager, r) = all_on_disk(n);
    let mem = r.as_slice();
    let mut f = open_swap_file();
    let pos = corrupt_record(&mut f, 3);
    eprintln!("corrupted byte at file offset {pos}");
    let mut good = 0;
    for pg in (0..n).filter(|&pg| pg != 3) {
        assert!(page_ok(&mem[pg * PAGE..(pg + 1) * PAGE], pg), "page {pg}");
        good += 1;
    }
    println!("good pages {good}");
    std::io::stdout().flush().unwrap();
    // SAFETY: reading a page of our own region.
    let v = unsafe { std::ptr::read_volatile(mem.as_ptr().add(3 * PAGE + 8)) };
    println!("read corrupted page: {v}");
    std::process::exit(0);
}

#[test]
fn corrupted_record_gives_sigbus_to_the_reader_only() {
    if std::env::var("TIERSWAP_CORRUPT_CHILD").is_ok() {
        corrupted_child();
        return;
    }
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "corrupted_record_gives_sigbus_to_the_reader_only", "--nocapture", "--test-threads=1"])
        .env("TIERSWAP_CORRUPT_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    use std::os::unix::process::ExitStatusExt;
    assert_eq!(out.status.signal(), Some(libc::SIGBUS), "the reader gets SIGBUS: {stdout}\n{stderr}");
    assert!(stdout.contains("good pages 63"), "every other page read correctly: {stdout}\n{stderr}");
    assert!(!stdout.contains("read corrupted page"), "no data came back: {stdout}");
    assert!(stderr.contains("checksum mismatch") && stderr.contains("SIGBUS"), "the log names it: {stderr}");
}

#[test]
fn a_full_disk_loses_no_page() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "mounting a small tmpfs needs root (CI runs as root)");
    let dir = std::env::temp_dir().join(format!("tierswap-full-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let ok = Command::new("mount").args(["-t", "tmpfs", "-o", "size=1m", "tierswap-test"]).arg(&dir).status().unwrap();
    assert!(ok.success(), "mount a 1 MiB tmpfs");
    struct Unmount(std::path::PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
            let _ = std::fs::remove_dir(&self.0);
        }
    }
    let _guard = Unmount(dir.clone());
    let p = Pager::new(PagerConfig {
        budget_bytes: 4 << 20,
        tiers: "zero,pool,file".parse::<Tiers>().unwrap(),
        pool_max_bytes: Some(1 << 20),
        swap_dir: Some(dir.clone()),
        fault_threads: 2,
        ..Default::default()
    })
    .unwrap();
    let n = 4096; // 16 MiB of pages through a 1 MiB disk
    let r = filled_region(&p, n);
    p.evict_all();
    let mem = r.as_slice();
    let bad = (0..n).filter(|&pg| !page_ok(&mem[pg * PAGE..(pg + 1) * PAGE], pg)).count();
    assert_eq!(bad, 0, "no page lost to a full disk");
    let st = p.stats();
    assert!(st.counters.writeback_errors > 0, "the full disk was noticed: {:?}", st.counters);
    assert!(st.pool_total_size > 1 << 20, "the pool grew over its limit to hold the pages: {st:?}");
    assert!(st.file_bytes <= 1 << 20, "the file holds what fit: {st:?}");
    drop(r);
    assert_eq!(p.stats().swap_slots, 0);
}

#[test]
fn the_swap_file_is_private_and_unlinked() {
    use std::os::unix::fs::MetadataExt;
    let n = 16;
    let (_pager, r) = all_on_disk(n);
    let f = open_swap_file();
    let m = f.metadata().unwrap();
    assert_eq!(m.mode() & 0o777, 0o600, "only the owner may read or write the swap file");
    assert_eq!(m.nlink(), 0, "the swap file has no name anyone could open");
    let mem = r.as_slice();
    assert!((0..n).all(|pg| page_ok(&mem[pg * PAGE..(pg + 1) * PAGE], pg)));
}

/// A pager whose evicted pages all go to the file (no pool), and a region of `n` counter
/// pages, all evicted.
fn all_on_disk(n: usize) -> (Pager, tierswap::Region) {
    let p = Pager::new(PagerConfig {
        budget_bytes: 8 << 20,
        tiers: "zero,file".parse::<Tiers>().unwrap(),
        fault_threads: 1,
        ..Default::default()
    })
    .unwrap();
    let r = filled_region(&p, n);
    p.evict_all();
    assert_eq!(r.page_states(), (0, 0, n), "every page on disk");
    (p, r)
}

#[test]
fn readahead_follows_a_sequential_refault_and_stops_on_a_random_one() {
    let n = 8192; // 32 MiB through an 8 MiB budget
    let (p, r) = all_on_disk(n);
    let mem = r.as_slice();
    // Sequential over the first half.
    for pg in 0..n / 2 {
        assert!(page_ok(&mem[pg * PAGE..(pg + 1) * PAGE], pg), "page {pg}");
    }
    let seq = p.stats().counters;
    assert!(seq.swap_ra > 0, "a sequential refault reads ahead: {seq:?}");
    let ratio = seq.swap_ra_hit as f64 / seq.swap_ra as f64;
    assert!(ratio >= 0.8, "read-ahead pages get used: {} of {}", seq.swap_ra_hit, seq.swap_ra);
    assert!(r.readahead_window() > 1);
    // Sparse random reads over the second half: 128 distinct pages, one in 32 on average,
    // so pages read ahead around them go unused.
    let half = n / 2;
    for k in 0..128u64 {
        // splitmix64 of k: no structure a window could exploit.
        let mut z = k.wrapping_add(1).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        let pg = half + ((z ^ (z >> 31)) % half as u64) as usize;
        assert!(page_ok(&mem[pg * PAGE..(pg + 1) * PAGE], pg), "page {pg}");
    }
    let rnd = p.stats().counters;
    assert_eq!(r.readahead_window(), 1, "random faults shrink the window to one page");
    let disk_faults = (rnd.pswpin - seq.pswpin) - (rnd.swap_ra - seq.swap_ra);
    let off = rnd.swap_ra_off - seq.swap_ra_off;
    assert!(off * 10 >= disk_faults * 8, "most random disk faults read nothing ahead: {off} of {disk_faults}");
    let ra = rnd.swap_ra - seq.swap_ra;
    assert!(
        ra < 128,
        "the window halved to one within a few faults: {ra} pages read ahead ({} used)",
        rnd.swap_ra_hit - seq.swap_ra_hit
    );
}

fn fill_version(buf: &mut [u8], p: usize, ver: u64) {
    for (i, w) in buf.chunks_exact_mut(8).enumerate() {
        w.copy_from_slice(&(((p as u64) * 512 + i as u64) ^ (ver << 40)).to_le_bytes());
    }
}

fn version_ok(buf: &[u8], p: usize, ver: u64) -> bool {
    buf.chunks_exact(8).enumerate().all(|(i, w)| w == (((p as u64) * 512 + i as u64) ^ (ver << 40)).to_le_bytes())
}

#[test]
fn drain_empties_the_file_while_threads_read_and_write() {
    use std::sync::atomic::{AtomicBool, Ordering};
    let p = Pager::new(PagerConfig {
        budget_bytes: 16 << 20,
        tiers: "zero,pool,file".parse::<Tiers>().unwrap(),
        pool_max_bytes: Some(1 << 20),
        fault_threads: 2,
        ..Default::default()
    })
    .unwrap();
    let n = 6144; // 24 MiB
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        fill_version(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 0);
    }
    p.evict_all();
    // Writeback moves the pool down to its limit: most pages end on the file.
    let t0 = std::time::Instant::now();
    while p.stats().file_pages < n as u64 / 2 {
        assert!(t0.elapsed().as_secs() < 30, "writeback never filled the file: {:?}", p.stats());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let before = p.stats();
    let base = r.as_ptr() as usize;
    let stop = AtomicBool::new(false);
    let report = std::thread::scope(|sc| {
        let workers: Vec<_> = (0..2usize)
            .map(|t| {
                let stop = &stop;
                sc.spawn(move || {
                    // Thread t owns the pages with pg % 2 == t and keeps their versions.
                    let mut ver = vec![0u64; n];
                    let mut x = 0x9e37_79b9_7f4a_7c15u64 ^ t as u64;
                    let (mut reads, mut bad) = (0u64, 0u64);
                    while !stop.load(Ordering::Relaxed) {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let pg = ((x >> 33) as usize % (n / 2)) * 2 + t;
                        // SAFETY: page pg of the region, owned by this thread alone.
                        let page = unsafe { std::slice::from_raw_parts_mut((base + pg * PAGE) as *mut u8, PAGE) };
                        if x & 3 == 0 {
                            ver[pg] += 1;
                            fill_version(page, pg, ver[pg]);
                        } else {
                            reads += 1;
                            bad += !version_ok(page, pg, ver[pg]) as u64;
                        }
                    }
                    (ver, reads, bad)
                })
            })
            .collect();
        std::thread::sleep(std::time::Duration::from_millis(20));
        let report = p.drain(tierswap::Tier::File).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        stop.store(true, Ordering::Relaxed);
        let mut vers = vec![0u64; n];
        for (t, w) in workers.into_iter().enumerate() {
            let (ver, reads, bad) = w.join().unwrap();
            assert_eq!(bad, 0, "thread {t} read a wrong byte during drain ({reads} reads)");
            assert!(reads > 0);
            for pg in (t..n).step_by(2) {
                vers[pg] = ver[pg];
            }
        }
        (report, vers)
    });
    let (report, vers) = report;
    let st = p.stats();
    assert!(report.moved > before.file_pages / 2, "most file pages moved by the drain: {report:?} {before:?}");
    assert_eq!((report.left, report.unreadable), (0, 0), "{report:?}");
    assert_eq!(st.file_pages, 0, "the file tier is empty: {st:?}");
    assert_eq!(report.file_len_bytes, 0, "the file is truncated");
    let mem = r.as_slice();
    for pg in 0..n {
        assert!(version_ok(&mem[pg * PAGE..(pg + 1) * PAGE], pg, vers[pg]), "page {pg} after drain");
    }
    // Drained means drained: eviction keeps off the file until resumed.
    p.evict_all();
    assert_eq!(p.stats().file_pages, 0);
    p.resume(tierswap::Tier::File);
}

#[test]
fn larger_file_units_mean_larger_writes() {
    let p = Pager::new(PagerConfig {
        budget_bytes: 8 << 20,
        tiers: "zero,pool,file".parse::<Tiers>().unwrap(),
        pool_max_bytes: Some(1 << 20),
        file_unit_bytes: 1 << 20,
        ..Default::default()
    })
    .unwrap();
    let n = 4096;
    let r = filled_region(&p, n);
    p.evict_all();
    // Pool writeback packs objects of many clusters into each unit.
    let t0 = std::time::Instant::now();
    while p.stats().counters.zswpwb < n as u64 / 2 {
        assert!(t0.elapsed().as_secs() < 30, "writeback stalled: {:?}", p.stats());
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let c = p.stats().counters;
    assert!(c.file_writes > 0 && c.file_io_bytes >= c.file_write_bytes, "{c:?}");
    let avg = c.file_io_bytes / c.file_writes;
    assert!(avg > 256 << 10, "writes fill units of 1 MiB, not 64 KiB: {avg} bytes on average");
    let mem = r.as_slice();
    assert!((0..n).all(|pg| page_ok(&mem[pg * PAGE..(pg + 1) * PAGE], pg)));
    let bad = PagerConfig { file_unit_bytes: 100_000, ..Default::default() };
    assert!(Pager::new(bad).is_err(), "a unit that is not a power of two is refused");
}
