//! The file tier under faults: a corrupted, replayed or moved record is never returned as
//! data (the touching thread gets SIGBUS, other pages read fine), no plaintext reaches the
//! disk when records are encrypted, nobody else can open the swap file, and a full disk
//! loses no page.

mod common;

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::FileExt;
use std::process::Command;

use common::{config, fill_page, filled_region, noise_page, page_matches_at, run_alone, start, PAGE};
use tierswap::{FaultMode, Hint, Pager, PagerConfig};

/// The pager's swap file, reopened through /proc/self/fd (buffered, unlike the pager's
/// O_DIRECT descriptor, so a test can read and write any byte).
fn open_swap_file(p: &Pager) -> std::fs::File {
    let fd = p.swap_file().expect("the pager has a file tier").as_raw_fd();
    std::fs::OpenOptions::new().read(true).write(true).open(format!("/proc/self/fd/{fd}")).unwrap()
}

/// Flips one bit in the middle of the payload (crc32c) or ciphertext (encrypted) of the
/// record at `offset` with `len` payload bytes; returns the file offset of the byte.
fn flip_record_bit(f: &std::fs::File, offset: u64, len: usize) -> u64 {
    let pos = offset + 16 + len as u64 / 2;
    let mut b = [0u8; 1];
    f.read_exact_at(&mut b, pos).unwrap();
    f.write_all_at(&[b[0] ^ 0x40], pos).unwrap();
    f.sync_all().unwrap();
    pos
}

/// Runs this test binary again as a child for `test` with `env` set; returns the signal
/// that ended it (if one did), its exit code, stdout and stderr.
fn run_child(test: &str, env: &[(&str, String)]) -> (Option<i32>, Option<i32>, String, String) {
    use std::os::unix::process::ExitStatusExt;
    let (out, stdout, stderr) = run_alone(test, env);
    (out.status.signal(), out.status.code(), stdout, stderr)
}

/// The pager a SIGBUS handler reports on (see [`report_checksum_errors_on_sigbus`]).
static SIGBUS_PAGER: std::sync::atomic::AtomicPtr<Pager> = std::sync::atomic::AtomicPtr::new(std::ptr::null_mut());

extern "C" fn on_sigbus(_sig: i32) {
    let p = SIGBUS_PAGER.load(std::sync::atomic::Ordering::SeqCst);
    if !p.is_null() {
        // SAFETY: the pager outlives the child's touch (it is leaked below). Reading its
        // counters from the handler is not async-signal-safe in general, but the thread that
        // faulted holds no lock of ours or of the allocator: it was reading a page.
        let n = unsafe { (*p).stats().counters.checksum_errors };
        let line = format!("checksum_errors {n}\n");
        // SAFETY: writing our own buffer to stdout.
        unsafe { libc::write(1, line.as_ptr().cast(), line.len()) };
    }
    // SA_RESETHAND put the default action back: returning retries the access, which
    // faults on the poisoned page again and ends the process by SIGBUS.
}

/// In a child about to touch a bad page: print the pager's checksum_errors when SIGBUS
/// comes, then die of it as usual.
fn report_checksum_errors_on_sigbus(p: Pager) {
    SIGBUS_PAGER.store(Box::into_raw(Box::new(p)), std::sync::atomic::Ordering::SeqCst);
    // SAFETY: a zeroed sigaction with a handler of the right type; SA_RESETHAND makes it
    // run once.
    unsafe {
        let mut sa: libc::sigaction = std::mem::zeroed();
        sa.sa_sigaction = on_sigbus as extern "C" fn(i32) as usize;
        sa.sa_flags = libc::SA_RESETHAND;
        libc::sigemptyset(&mut sa.sa_mask);
        assert_eq!(libc::sigaction(libc::SIGBUS, &sa, std::ptr::null_mut()), 0);
    }
}

/// Runs in a child process (see the tests below): evicts 64 pages to the file, flips a
/// bit of page 3's record, reads every other page, then touches page 3.
fn corrupted_child(encrypt: bool) {
    let n = 64;
    let (pager, r) = all_on_disk_with(n, encrypt);
    let mem = r.as_slice();
    let (_, off, len) = r.file_record(3).expect("page 3 is on the file");
    let pos = flip_record_bit(&open_swap_file(&pager), off, len);
    eprintln!("corrupted byte at file offset {pos}");
    let mut good = 0;
    for pg in (0..n).filter(|&pg| pg != 3) {
        assert!(page_matches_at(mem, pg, 0), "page {pg}");
        good += 1;
    }
    println!("good pages {good}");
    std::io::stdout().flush().unwrap();
    report_checksum_errors_on_sigbus(pager);
    // SAFETY: reading a page of our own region.
    let v = unsafe { std::ptr::read_volatile(mem.as_ptr().add(3 * PAGE + 8)) };
    println!("read corrupted page: {v}");
    std::process::exit(0);
}

/// The checksum_errors a child's SIGBUS handler printed (readahead that tried the bad
/// record counts too, so it may be more than one).
fn checksum_errors(stdout: &str) -> u64 {
    let n = stdout.lines().find_map(|l| l.split("checksum_errors ").nth(1));
    n.and_then(|n| n.trim().parse().ok()).unwrap_or_else(|| panic!("no checksum_errors line: {stdout}"))
}

/// Runs the corrupted child in `mode` ("crc" or "aead") for `test` and checks that only
/// the reader of the bad page got SIGBUS, and that the log and the counter say why.
fn expect_sigbus_for_the_corrupted_page_only(test: &str, mode: &str, why: &str) {
    let (signal, _, stdout, stderr) = run_child(test, &[("TIERSWAP_CORRUPT_CHILD", mode.to_string())]);
    assert_eq!(signal, Some(libc::SIGBUS), "the reader gets SIGBUS: {stdout}\n{stderr}");
    assert!(stdout.contains("good pages 63"), "every other page read correctly: {stdout}\n{stderr}");
    assert!(!stdout.contains("read corrupted page"), "no data came back: {stdout}");
    assert!(checksum_errors(&stdout) >= 1, "the error is counted: {stdout}");
    assert!(stderr.contains(why) && stderr.contains("SIGBUS"), "the log names it: {stderr}");
}

#[test]
fn corrupted_record_gives_sigbus_to_the_reader_only() {
    match std::env::var("TIERSWAP_CORRUPT_CHILD").as_deref() {
        Ok("crc") => return corrupted_child(false),
        Ok(_) => return,
        Err(_) => {}
    }
    expect_sigbus_for_the_corrupted_page_only(
        "corrupted_record_gives_sigbus_to_the_reader_only",
        "crc",
        "checksum mismatch",
    );
}

#[test]
fn flipped_ciphertext_bit_gives_sigbus_to_the_reader_only() {
    match std::env::var("TIERSWAP_CORRUPT_CHILD").as_deref() {
        Ok("aead") => return corrupted_child(true),
        Ok(_) => return,
        Err(_) => {}
    }
    expect_sigbus_for_the_corrupted_page_only(
        "flipped_ciphertext_bit_gives_sigbus_to_the_reader_only",
        "aead",
        "authentication failed",
    );
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
    let p = start(PagerConfig {
        pool_max_bytes: Some(1 << 20),
        swap_dir: Some(dir.clone()),
        ..config(4 << 20, "zero,pool,file", FaultMode::Thread, 2)
    });
    let n = 4096; // 16 MiB of pages through a 1 MiB disk
    let r = filled_region(&p, n, Hint::Normal, 0);
    p.evict_all();
    let mem = r.as_slice();
    let bad = (0..n).filter(|&pg| !page_matches_at(mem, pg, 0)).count();
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
    let (pager, r) = all_on_disk(n);
    let f = open_swap_file(&pager);
    let m = f.metadata().unwrap();
    assert_eq!(m.mode() & 0o777, 0o600, "only the owner may read or write the swap file");
    assert_eq!(m.nlink(), 0, "the swap file has no name anyone could open");
    let mem = r.as_slice();
    assert!((0..n).all(|pg| page_matches_at(mem, pg, 0)));
}

/// A pager whose evicted pages all go to the file (no pool), and a region of `n` counter
/// pages, all evicted.
fn all_on_disk(n: usize) -> (Pager, tierswap::Region) {
    all_on_disk_with(n, true)
}

/// [`all_on_disk`] with records encrypted or only checksummed.
fn all_on_disk_with(n: usize, encrypt: bool) -> (Pager, tierswap::Region) {
    let p = disk_pager(encrypt);
    let r = filled_region(&p, n, Hint::Normal, 0);
    p.evict_all();
    assert_eq!(r.page_states(), (0, 0, n), "every page on disk");
    (p, r)
}

/// A pager whose evicted pages all go to the file (no pool).
fn disk_pager(encrypt: bool) -> Pager {
    start(PagerConfig { encrypt, ..config(8 << 20, "zero,file", FaultMode::Thread, 1) })
}

#[test]
fn readahead_follows_a_sequential_refault_and_stops_on_a_random_one() {
    let n = 8192; // 32 MiB through an 8 MiB budget
                  // Readahead into staging is the order-0 path's: with large swap-in a sequential refault
                  // is served in place instead (tests/swapin.rs).
    let p = start(PagerConfig {
        swapin_policy: tierswap::SwapinPolicy::Order0,
        ..config(8 << 20, "zero,file", FaultMode::Thread, 1)
    });
    let r = filled_region(&p, n, Hint::Normal, 0);
    p.evict_all();
    assert_eq!(r.page_states(), (0, 0, n), "every page on disk");
    let mem = r.as_slice();
    // Sequential over the first half.
    for pg in 0..n / 2 {
        assert!(page_matches_at(mem, pg, 0), "page {pg}");
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
        assert!(page_matches_at(mem, pg, 0), "page {pg}");
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

/// Runs `during` while `threads` threads work the `n` pages at `base` (each page `pg` filled
/// with `fill_version(.., pg, 0)`): thread t owns the pages with `pg % threads == t`, and
/// picks one of its own at random to check that it holds the version it last wrote or, one
/// time in `write_every` (a power of two), to write the next version. When `during` returns
/// the threads stop; each must have read some page and no wrong byte (`what` names the
/// run). Returns what `during` returned and every page's last version.
fn with_versioned_threads<R>(
    base: usize,
    n: usize,
    threads: usize,
    write_every: u64,
    seed: u64,
    what: &str,
    during: impl FnOnce() -> R,
) -> (R, Vec<u64>) {
    use std::sync::atomic::{AtomicBool, Ordering};
    let stop = AtomicBool::new(false);
    std::thread::scope(|sc| {
        let workers: Vec<_> = (0..threads)
            .map(|t| {
                let stop = &stop;
                sc.spawn(move || {
                    let mut ver = vec![0u64; n];
                    let mut x = seed ^ t as u64;
                    let (mut reads, mut bad) = (0u64, 0u64);
                    while !stop.load(Ordering::Relaxed) {
                        x = x.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
                        let pg = ((x >> 33) as usize % (n / threads)) * threads + t;
                        // SAFETY: page pg of the region, owned by this thread alone.
                        let page = unsafe { std::slice::from_raw_parts_mut((base + pg * PAGE) as *mut u8, PAGE) };
                        if x & (write_every - 1) == 0 {
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
        let out = during();
        stop.store(true, Ordering::Relaxed);
        let mut vers = vec![0u64; n];
        for (t, w) in workers.into_iter().enumerate() {
            let (ver, reads, bad) = w.join().unwrap();
            assert_eq!(bad, 0, "thread {t} read a wrong byte ({reads} reads, {what})");
            assert!(reads > 0, "thread {t} read nothing ({what})");
            for pg in (t..n).step_by(threads) {
                vers[pg] = ver[pg];
            }
        }
        (out, vers)
    })
}

#[test]
fn drain_empties_the_file_while_threads_read_and_write() {
    let p = start(PagerConfig {
        pool_max_bytes: Some(1 << 20),
        ..config(16 << 20, "zero,pool,file", FaultMode::Thread, 2)
    });
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
    // Two threads read and rewrite their pages while the file drains.
    let (report, vers) = with_versioned_threads(r.as_ptr() as usize, n, 2, 4, 0x9e37_79b9_7f4a_7c15, "drain", || {
        std::thread::sleep(std::time::Duration::from_millis(20));
        let report = p.drain(tierswap::Tier::File).unwrap();
        std::thread::sleep(std::time::Duration::from_millis(20));
        report
    });
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

/// Average bytes per file write when pool writeback alone moves `n` pages of counter data
/// from the pool to a file of `unit` units. The pool holds them all, so reclaim never
/// spills a block to the file itself: every write counted is a writeback write.
fn writeback_write_size(unit: usize, n: usize) -> u64 {
    let p = start(PagerConfig {
        pool_max_bytes: Some(12 << 20),
        file_unit_bytes: unit,
        // lz4's ~2 KiB objects: many to a unit.
        compressor: tierswap::Compressor::Lz4,
        ..config(16 << 20, "zero,pool,file", FaultMode::Thread, 0)
    });
    let r = filled_region(&p, n, Hint::Normal, 0);
    p.evict_all();
    let c = p.stats().counters;
    assert_eq!((c.zswpout, c.file_writes), (n as u64, 0), "every page is in the pool, none in the file: {c:?}");
    let t0 = std::time::Instant::now();
    while p.stats().counters.zswpwb < n as u64 {
        assert!(t0.elapsed().as_secs() < 30, "writeback stalled: {:?}", p.stats());
        p.writeback_now();
    }
    let c = p.stats().counters;
    assert_eq!(c.pswpout, n as u64, "every page reached the file: {c:?}");
    assert!(c.file_writes > 0 && c.file_io_bytes >= c.file_write_bytes, "{c:?}");
    let mem = r.as_slice();
    assert!((0..n).all(|pg| page_matches_at(mem, pg, 0)), "every page reads back from the file");
    assert_eq!(p.stats().counters.pswpin, n as u64, "and they were read from it");
    c.file_io_bytes / c.file_writes
}

#[test]
fn larger_file_units_mean_larger_writes() {
    let n = 2048;
    let big = writeback_write_size(1 << 20, n);
    let small = writeback_write_size(64 << 10, n);
    assert!(small <= 64 << 10, "a write never exceeds its 64 KiB unit: {small} bytes on average");
    assert!(big > 512 << 10, "writes fill units of 1 MiB: {big} bytes on average");
    assert!(big > 8 * small, "1 MiB units write in larger pieces than 64 KiB ones: {big} against {small}");
    let bad = PagerConfig { file_unit_bytes: 100_000, ..Default::default() };
    assert!(Pager::new(bad).is_err(), "a unit that is not a power of two is refused");
}

/// Fills `buf` with bytes no compressor shrinks, from (`p`, `ver`): such a page goes to the
/// file raw, so every record has the same length and units pack the same way each time.
fn fill_noise(buf: &mut [u8], p: usize, ver: u64) {
    let mut x = (p as u64 + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15) ^ ver.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    for w in buf.chunks_exact_mut(8) {
        x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = x;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        w.copy_from_slice(&(z ^ (z >> 31)).to_le_bytes());
    }
}

fn noise_ok(buf: &[u8], p: usize, ver: u64) -> bool {
    let mut want = [0u8; PAGE];
    fill_noise(&mut want, p, ver);
    buf == want
}

/// Runs in a child process (see the test below). Evicts 64 noise pages to the file, keeps
/// the bytes of the unit holding page 3, brings every page back, writes newer bytes and
/// evicts again (the units are rewritten at the same places), writes the old unit back over
/// the new one, checks every page outside it, then touches replayed page number `k`.
fn replay_child(encrypt: bool, k: usize) {
    const UNIT: u64 = 64 << 10;
    let n = 64;
    let p = disk_pager(encrypt);
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    for pg in 0..n {
        fill_noise(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 0);
    }
    p.evict_all();
    let before: Vec<_> = (0..n).map(|pg| r.file_record(pg).expect("every page on the file")).collect();
    let unit = before[3].1 / UNIT;
    let f = open_swap_file(&p);
    let mut old = vec![0u8; UNIT as usize];
    let got = f.read_at(&mut old, unit * UNIT).unwrap();
    old.truncate(got);
    // Back in, newer bytes, out again.
    for pg in 0..n {
        assert!(noise_ok(&r.as_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 0), "page {pg} before the replay");
        fill_noise(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 1);
    }
    p.evict_all();
    let after: Vec<_> = (0..n).map(|pg| r.file_record(pg).expect("every page on the file again")).collect();
    let replayed: Vec<usize> = (0..n).filter(|&pg| after[pg].1 / UNIT == unit).collect();
    let same_place = replayed.iter().filter(|&&pg| after[pg] == before[pg]).count();
    println!("replayed pages {replayed:?}");
    println!("same slot, offset and length as before: {same_place} of {}", replayed.len());
    f.write_all_at(&old, unit * UNIT).unwrap();
    f.sync_all().unwrap();
    let mem = r.as_slice();
    let mut good = 0;
    for pg in (0..n).filter(|pg| !replayed.contains(pg)) {
        assert!(noise_ok(&mem[pg * PAGE..(pg + 1) * PAGE], pg, 1), "page {pg} outside the replayed unit");
        good += 1;
    }
    println!("good pages {good}");
    std::io::stdout().flush().unwrap();
    let pg = replayed[k];
    report_checksum_errors_on_sigbus(p);
    let page = &mem[pg * PAGE..(pg + 1) * PAGE];
    // SAFETY: reading a page of our own region (the region is not dropped before exit).
    let first = unsafe { std::ptr::read_volatile(page.as_ptr()) };
    let what = if noise_ok(page, pg, 0) {
        "stale"
    } else if noise_ok(page, pg, 1) {
        "current"
    } else {
        "garbage"
    };
    println!("read replayed page {pg}: {what} ({first})");
    std::process::exit(0);
}

#[test]
fn a_replayed_unit_gives_sigbus_to_its_readers_only() {
    const TEST: &str = "a_replayed_unit_gives_sigbus_to_its_readers_only";
    if let Ok(v) = std::env::var("TIERSWAP_REPLAY_CHILD") {
        let (mode, k) = v.split_once(':').unwrap();
        return replay_child(mode == "aead", k.parse().unwrap());
    }
    let line = |out: &str, key: &str| -> String {
        // A line may start with the harness's "test NAME ... ".
        let at = |l: &str| l.find(key).map(|i| l[i + key.len()..].to_string());
        out.lines().find_map(at).unwrap_or_else(|| panic!("no {key:?} in {out}"))
    };
    // Encrypted: every page of the replayed unit, one child each, gets SIGBUS.
    let (signal, _, stdout, stderr) = run_child(TEST, &[("TIERSWAP_REPLAY_CHILD", "aead:0".into())]);
    let replayed = line(&stdout, "replayed pages ");
    let count = replayed.matches(',').count() + 1;
    assert!(count >= 2, "the unit held several pages: {stdout}");
    assert!(
        line(&stdout, "same slot, offset and length as before: ").starts_with(&format!("{count} of")),
        "the unit was rewritten with the same slots at the same offsets: only the generation tells the copies apart: {stdout}"
    );
    for k in 0..count {
        let (signal, _, stdout, stderr) = if k == 0 {
            (signal, None, stdout.clone(), stderr.clone())
        } else {
            run_child(TEST, &[("TIERSWAP_REPLAY_CHILD", format!("aead:{k}"))])
        };
        assert_eq!(signal, Some(libc::SIGBUS), "replayed page {k} gives SIGBUS: {stdout}\n{stderr}");
        assert_eq!(line(&stdout, "replayed pages "), replayed, "every child replays the same unit");
        assert_eq!(line(&stdout, "good pages "), (64 - count).to_string(), "every other page byte-exact: {stdout}");
        assert!(!stdout.contains("read replayed page"), "no data came back: {stdout}");
        assert!(checksum_errors(&stdout) >= 1, "the error is counted: {stdout}");
        assert!(stderr.contains("authentication failed") && stderr.contains("SIGBUS"), "the log names it: {stderr}");
    }
    // The contrast: with crc32c only, the old unit passes its checks and old bytes come back.
    let (signal, code, stdout, stderr) = run_child(TEST, &[("TIERSWAP_REPLAY_CHILD", "crc:0".into())]);
    assert_eq!((signal, code), (None, Some(0)), "{stdout}\n{stderr}");
    assert!(stdout.contains(": stale"), "crc32c cannot see a replay: {stdout}");
}

/// Whether `needle` occurs in `hay`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    hay.windows(needle.len()).any(|w| w == needle)
}

#[test]
fn no_plaintext_reaches_the_disk_when_encrypted() {
    const CANARY: &[u8; 64] = b"tierswap plaintext canary: this must never be seen on disk.....!";
    for encrypt in [true, false] {
        let p = start(PagerConfig {
            pool_max_bytes: Some(1 << 20),
            encrypt,
            // lz4's ~2 KiB objects: the pool overflows, so writeback writes pool objects too.
            compressor: tierswap::Compressor::Lz4,
            ..config(8 << 20, "zero,pool,file", FaultMode::Thread, 1)
        });
        // Noise pages go to the file raw at eviction; counter pages compress into the pool
        // and reach the file by writeback. Each holds the canary at byte 1000.
        let n = 1024;
        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
        let page = |pg: usize| {
            let mut b = vec![0u8; PAGE];
            if pg & 1 == 0 {
                fill_noise(&mut b, pg, 7);
            } else {
                fill_page(&mut b, pg, 0);
            }
            b[1000..1064].copy_from_slice(CANARY);
            b
        };
        for pg in 0..n {
            r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE].copy_from_slice(&page(pg));
        }
        p.evict_all();
        let t0 = std::time::Instant::now();
        while p.stats().counters.zswpwb == 0 {
            assert!(t0.elapsed().as_secs() < 30, "writeback never ran: {:?}", p.stats());
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let mut disk = Vec::new();
        std::io::Read::read_to_end(&mut open_swap_file(&p), &mut disk).unwrap();
        assert!(disk.len() > n / 4 * PAGE, "pages went to the file: {} bytes", disk.len());
        if encrypt {
            assert!(!contains(&disk, CANARY), "the canary is on disk in the clear");
            assert!(!contains(&disk, &page(0)[2000..2064]), "raw page bytes are on disk in the clear");
        } else {
            assert!(contains(&disk, CANARY), "without encryption the canary is on disk (the check can fail)");
        }
        let mem = r.as_slice();
        for pg in 0..n {
            assert!(mem[pg * PAGE..(pg + 1) * PAGE] == page(pg)[..], "page {pg} (encrypt {encrypt})");
        }
    }
}

#[test]
fn another_user_cannot_open_the_swap_file_through_proc() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "switching to uid 65534 needs root (CI runs as root)");
    let (p, r) = all_on_disk(16);
    let fd = p.swap_file().unwrap().as_raw_fd();
    let path = format!("/proc/{}/fd/{fd}", std::process::id());
    std::fs::File::open(&path).expect("root can open it: the path is right, so a refusal below means something");
    let cpath = std::ffi::CString::new(path.clone()).unwrap();
    // SAFETY: fork in a test; the child makes raw system calls only and leaves by _exit.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        // SAFETY: plain system calls in the single-threaded child, on memory it owns.
        unsafe {
            let nobody = 65534;
            if libc::syscall(libc::SYS_setgroups, 0, std::ptr::null::<libc::gid_t>()) != 0
                || libc::syscall(libc::SYS_setgid, nobody) != 0
                || libc::syscall(libc::SYS_setuid, nobody) != 0
            {
                libc::_exit(200);
            }
            let fd = libc::open(cpath.as_ptr(), libc::O_RDONLY);
            if fd >= 0 {
                libc::_exit(0);
            }
            libc::_exit(*libc::__errno_location());
        }
    }
    let mut status = 0;
    // SAFETY: waiting for our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    assert!(libc::WIFEXITED(status), "child ended by signal: {status:#x}");
    let code = libc::WEXITSTATUS(status);
    assert_ne!(code, 200, "the child could not become uid 65534");
    assert_ne!(code, 0, "uid 65534 opened {path}");
    assert!(code == libc::EACCES || code == libc::EPERM, "refused, but with errno {code}");
    let mem = r.as_slice();
    assert!((0..16).all(|pg| page_matches_at(mem, pg, 0)));
}

/// What encryption adds to a disk fault end to end: 16 MiB of incompressible pages evicted
/// to the file and read back, in order and in a scattered order, each way. Run with
/// `cargo test --release -p tierswap --test file_tier fault_cost -- --ignored --nocapture`.
#[test]
#[ignore]
fn fault_cost_encrypted_vs_crc32c() {
    let n = 4096;
    for encrypt in [false, true, false, true] {
        // A budget above the region: reading back evicts nothing meanwhile.
        let p = start(PagerConfig { encrypt, ..config(64 << 20, "zero,file", FaultMode::Thread, 1) });
        let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
        for pg in 0..n {
            fill_noise(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 0);
        }
        let mut line = format!("encrypt {encrypt:>5}:");
        for scattered in [false, true] {
            p.evict_all();
            let order: Vec<usize> = if scattered { (0..n).map(|i| (i * 2053) % n).collect() } else { (0..n).collect() };
            let t0 = std::time::Instant::now();
            let mut sum = 0u64;
            for &pg in &order {
                // SAFETY: reading a page of our own region.
                sum += unsafe { std::ptr::read_volatile(r.as_ptr().add(pg * PAGE)) } as u64;
            }
            let us = t0.elapsed().as_secs_f64() * 1e6 / n as f64;
            line += &format!(" {} {us:.2} µs/page", if scattered { "scattered" } else { "in order" });
            std::hint::black_box(sum);
        }
        let mem = r.as_slice();
        assert!((0..n).all(|pg| noise_ok(&mem[pg * PAGE..(pg + 1) * PAGE], pg, 0)));
        let c = p.stats().counters;
        println!(
            "{line} (faults {}, unit reads {}, unit hits {}, read ahead {})",
            c.faults, c.file_unit_reads, c.file_unit_hits, c.swap_ra
        );
    }
}

/// A page whose first half is xorshift noise and second half zeros: lz4 and zstd both store
/// it in a little over 2 KiB, so recompression cannot shrink it by a quarter.
fn fill_half_noise(buf: &mut [u8], p: usize) {
    noise_page(&mut buf[..PAGE / 2], p as u64 + 1);
    buf[PAGE / 2..].fill(0);
}

/// A pager with all three local tiers that recompresses cold pool objects with zstd.
fn recompressing_pager(budget_bytes: u64, pool_max_bytes: u64) -> Pager {
    start(PagerConfig {
        pool_max_bytes: Some(pool_max_bytes),
        // zram's pairing: a fast codec first, a dense one for what goes cold.
        compressor: tierswap::Compressor::Lz4,
        recompress: Some(tierswap::Compressor::Zstd { level: 1 }),
        ..config(budget_bytes, "zero,pool,file", FaultMode::Thread, 0)
    })
}

#[test]
fn recompressed_objects_stay_in_the_pool_then_reach_the_file_in_their_codec() {
    let p = recompressing_pager(8 << 20, 1 << 20);
    // 1 MiB of pages that neither codec shrinks below ~2 KiB, evicted first (the coldest),
    // then 8 MiB of counter pages (lz4 ~2,060 bytes each, zstd ~570).
    let n = 2048;
    let n_noise = 256;
    let mut noise = p.region(n_noise * PAGE, Hint::Normal).unwrap();
    let mem = noise.as_mut_slice();
    for pg in 0..n_noise {
        fill_half_noise(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg);
    }
    p.evict_all();
    let r = filled_region(&p, n, Hint::Normal, 0);
    p.evict_all();
    // Even recompressed, the counter pages do not fit the 1 MiB pool: some recompressed
    // objects come round again and go to the file.
    let t0 = std::time::Instant::now();
    loop {
        let st = p.stats();
        let c = &st.counters;
        if c.pool_recompress_rejected == n_noise as u64
            && c.zswpwb > c.pool_recompress_rejected
            && st.pool_total_size <= 1 << 20
        {
            break;
        }
        assert!(t0.elapsed().as_secs() < 30, "writeback did not settle: {st:?}");
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let st = p.stats();
    let c = &st.counters;
    // Every written-back object was either a half-noise page (rejected) or a counter page
    // recompressed first, so the counter records are zstd-sized on the file (lz4 alone
    // averages over 2,000 bytes).
    assert_eq!(c.pswpout, c.zswpwb, "{st:?}");
    let counter_records = c.pswpout - c.pool_recompress_rejected;
    assert!(c.pool_recompressed >= counter_records, "{st:?}");
    let counter_bytes = c.file_write_bytes - c.pool_recompress_rejected * 2048;
    assert!(counter_records > 0, "{st:?}");
    assert!(counter_bytes / counter_records < 1200, "{counter_bytes} bytes for {counter_records} records: {st:?}");
    // Every byte comes back, from the pool and the file, each decoded with its own codec.
    let (pswpin_then, on_file_then) = (c.pswpin, st.file_pages);
    let mem = r.as_slice();
    for pg in 0..n {
        assert!(page_matches_at(mem, pg, 0), "counter page {pg}");
    }
    let mut want = vec![0u8; PAGE];
    let mem = noise.as_slice();
    for pg in 0..n_noise {
        fill_half_noise(&mut want, pg);
        assert!(mem[pg * PAGE..(pg + 1) * PAGE] == want[..], "half-noise page {pg}");
    }
    let c = p.stats().counters;
    // Reading 9 MiB under an 8 MiB budget evicts some pages again, so a few read twice.
    assert!(c.zswpin + c.pswpin >= (n + n_noise) as u64, "every page read: {c:?}");
    // (Writeback may go on meanwhile, so count against the file's records of the snapshot.)
    assert!(c.pswpin - pswpin_then >= on_file_then, "every record on the file read: {c:?}");
}

#[test]
fn recompressed_objects_read_back_from_the_pool_and_from_the_file() {
    // A pool limit the 4 MiB of pages never reach: the writeback thread stays idle, and
    // each step below is the test's own.
    let p = recompressing_pager(16 << 20, 12 << 20);
    let n = 1024;
    let r = filled_region(&p, n, Hint::Normal, 0);
    p.evict_all();
    let lz4_bytes = p.stats().pool_stored_bytes;
    assert_eq!(p.stats().counters.zswpout, n as u64);
    // First step: every object is recompressed and stays in the pool, a quarter the size.
    assert_eq!(p.writeback_now(), n);
    let st = p.stats();
    assert_eq!((st.counters.pool_recompressed, st.counters.zswpwb), (n as u64, 0), "{st:?}");
    assert!(st.pool_stored_bytes * 3 < lz4_bytes, "{} bytes after, {lz4_bytes} before", st.pool_stored_bytes);
    // Second step: nothing is left to recompress, so the recompressed objects go to the
    // file as they are.
    assert_eq!(p.writeback_now(), n);
    let st = p.stats();
    assert_eq!((st.counters.zswpwb, st.file_pages, st.pool_stored_pages), (n as u64, n as u64, 0), "{st:?}");
    assert!(st.counters.file_write_bytes * 3 < lz4_bytes, "{st:?}");
    // Read back from the file in zstd; then written (a clean page would be dropped, its
    // file record kept), evicted again (lz4, the pool), recompressed, and read back from
    // the pool in zstd.
    let mut r = r;
    let mem = r.as_mut_slice();
    assert!((0..n).all(|pg| page_matches_at(mem, pg, 0)));
    assert_eq!(p.stats().counters.pswpin, n as u64);
    for pg in 0..n {
        fill_page(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg, 0);
    }
    p.evict_all();
    let before = p.stats().counters;
    let recompressed = p.writeback_now();
    let c = p.stats().counters;
    assert!(recompressed > 0 && c.pool_recompressed - before.pool_recompressed == recompressed as u64, "{c:?}");
    let mem = r.as_slice();
    assert!((0..n).all(|pg| page_matches_at(mem, pg, 0)));
    let c = p.stats().counters;
    assert_eq!(c.zswpin - before.zswpin + (c.pswpin - before.pswpin), n as u64, "{c:?}");
}

#[test]
fn compaction_gives_sparse_spans_back_and_every_page_reads_back() {
    let p = start(PagerConfig {
        pool_max_bytes: Some(16 << 20),
        pool_compact: true,
        ..config(48 << 20, "zero,pool,file", FaultMode::Thread, 0)
    });
    // 4,096 half-noise pages in the pool (~2 KiB objects, 8 MiB), then two in three read
    // back at random and written (a clean page would keep its object): their objects are
    // freed and the spans they shared are left partly empty.
    let n = 4096;
    // Random: each fault brings its own page alone.
    let mut r = p.region(n * PAGE, Hint::Random).unwrap();
    let mem = r.as_mut_slice();
    for pg in 0..n {
        fill_half_noise(&mut mem[pg * PAGE..(pg + 1) * PAGE], pg);
    }
    p.evict_all();
    let mut want = vec![0u8; PAGE];
    let mut x = 0x9e37_79b9_7f4a_7c15u64;
    let mut read = vec![false; n];
    for pg in 0..n {
        x ^= x << 13;
        x ^= x >> 7;
        x ^= x << 17;
        if !x.is_multiple_of(3) {
            fill_half_noise(&mut want, pg);
            assert!(mem[pg * PAGE..(pg + 1) * PAGE] == want[..], "page {pg} read back");
            let b = &mut mem[pg * PAGE];
            // SAFETY: a byte of the region, written with its own value.
            unsafe { std::ptr::write_volatile(b, *b) };
            read[pg] = true;
        }
    }
    let st = common::stats_when(&p, 20, |st| {
        st.counters.pool_compact_moved > 0 && (st.pool_total_size as f64) < st.pool_stored_bytes as f64 * 1.4
    });
    let c = &st.counters;
    assert!(c.pool_compact_moved > 0, "nothing moved: {st:?}");
    assert!(
        (st.pool_total_size as f64) < st.pool_stored_bytes as f64 * 1.4,
        "spans {} for {} stored: {st:?}",
        st.pool_total_size,
        st.pool_stored_bytes
    );
    let never_read = read.iter().filter(|r| !**r).count() as u64;
    assert_eq!(c.zswpin + c.pswpin, n as u64 - never_read, "only the pages read came back: {st:?}");
    assert_eq!(st.pool_stored_pages + st.file_pages, never_read, "the others are still stored: {st:?}");
    // Every page again, the moved objects among them.
    for pg in 0..n {
        fill_half_noise(&mut want, pg);
        assert!(mem[pg * PAGE..(pg + 1) * PAGE] == want[..], "page {pg} after compaction");
    }
    let c = p.stats().counters;
    assert!(c.zswpin + c.pswpin >= n as u64, "every page came back from a tier: {c:?}");
}

/// Six program threads fault on file pages at once through one fault thread, each reading
/// and rewriting pages of its own while reclaim keeps writing them back (units freed and
/// written again under the reads started ahead). With `file_batch_reads` the faults read
/// together start their reads together: every byte read matches the page's last version,
/// no record fails its check, and the reads a fault took its bytes from were among those
/// started. Without it none is started.
#[test]
fn faults_read_together_read_the_file_together() {
    for batch in [8u32, 0] {
        let p = start(PagerConfig { file_batch_reads: batch, ..config(8 << 20, "zero,file", FaultMode::Thread, 1) });
        let (n, threads) = (8192usize, 6usize); // 32 MiB through an 8 MiB budget
        let mut r = p.region(n * PAGE, Hint::Random).unwrap();
        for pg in 0..n {
            fill_version(&mut r.as_mut_slice()[pg * PAGE..(pg + 1) * PAGE], pg, 0);
        }
        p.evict_all();
        let what = format!("batch-reads {batch}");
        let ((), vers) =
            with_versioned_threads(r.as_ptr() as usize, n, threads, 8, 0x2545_f491_4f6c_dd1d, &what, || {
                std::thread::sleep(std::time::Duration::from_millis(1500))
            });
        let mem = r.as_slice();
        for pg in 0..n {
            assert!(
                version_ok(&mem[pg * PAGE..(pg + 1) * PAGE], pg, vers[pg]),
                "page {pg} at the end, batch-reads {batch}"
            );
        }
        let c = p.stats().counters;
        assert_eq!((c.checksum_errors, c.read_errors), (0, 0), "batch-reads {batch}: {c:?}");
        assert_eq!(c.file_reads_batched_stale, 0, "no read ahead brought bytes of another write: {c:?}");
        assert!(c.file_unit_reads > 1000, "the threads faulted on the file: {c:?}");
        eprintln!(
            "batch-reads {batch}: {} file reads, {} started together, {} used",
            c.file_unit_reads, c.file_reads_batched, c.file_reads_batched_used
        );
        if batch > 0 {
            assert!(c.file_reads_batched > 0, "faults read together started reads together: {c:?}");
            assert!(
                c.file_reads_batched_used > 0 && c.file_reads_batched_used <= c.file_reads_batched,
                "faults took their bytes from the reads started: {c:?}"
            );
        } else {
            assert_eq!((c.file_reads_batched, c.file_reads_batched_used), (0, 0), "{c:?}");
        }
    }
}
