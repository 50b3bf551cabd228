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
    let p = Pager::new(PagerConfig {
        budget_bytes: 8 << 20,
        tiers: "zero,file".parse::<Tiers>().unwrap(),
        fault_threads: 1,
        ..Default::default()
    })
    .unwrap();
    let n = 64;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg);
    }
    p.evict_all();
    assert_eq!(r.page_states(), (0, 0, n), "every page evicted");
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
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg);
    }
    p.evict_all();
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
    let p = Pager::new(PagerConfig {
        budget_bytes: 8 << 20,
        tiers: "zero,file".parse::<Tiers>().unwrap(),
        ..Default::default()
    })
    .unwrap();
    let n = 16;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        fill_page(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg);
    }
    p.evict_all();
    assert_eq!(r.page_states(), (0, 0, n), "every page evicted");
    let f = open_swap_file();
    let m = f.metadata().unwrap();
    assert_eq!(m.mode() & 0o777, 0o600, "only the owner may read or write the swap file");
    assert_eq!(m.nlink(), 0, "the swap file has no name anyone could open");
    let mem = r.as_mut_slice();
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
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg);
    }
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
    for k in 0..128 {
        let pg = half + (k * 1031) % half;
        assert!(page_ok(&mem[pg * PAGE..(pg + 1) * PAGE], pg), "page {pg}");
    }
    let rnd = p.stats().counters;
    assert_eq!(r.readahead_window(), 1, "random faults shrink the window to one page");
    let disk_faults = (rnd.pswpin - seq.pswpin) - (rnd.swap_ra - seq.swap_ra);
    let off = rnd.swap_ra_off - seq.swap_ra_off;
    assert!(off * 10 >= disk_faults * 9, "most random disk faults read nothing ahead: {off} of {disk_faults}");
    let ra = rnd.swap_ra - seq.swap_ra;
    assert!(
        ra < 128,
        "the window halved to one within a few faults: {ra} pages read ahead ({} used)",
        rnd.swap_ra_hit - seq.swap_ra_hit
    );
}
