//! The tree's budget: one budget shared by every pager of a process tree, as a memory
//! cgroup's limit covers a program and its children.
//!
//! `tierswap run` creates a ledger file (on tmpfs) and names it in `TIERSWAP_TREE`; every
//! pager of the tree (the program's, each forked child's, each exec'd program's) maps it
//! shared and takes one row. A pager publishes its footprint in its row and reads its
//! *share* of the budget from the sum of all rows: when the tree is under the budget, each
//! may grow by an equal part of the room left; when it is over, each process is asked down in
//! proportion to its size (`share`), so the biggest gives back the most and a process that
//! stopped growing keeps shrinking while another grows. The pager's reclaim thread
//! refreshes both every few milliseconds ([`Member::refresh`]); everything that reads the
//! budget reads the share ([`Member::target`]).
//!
//! Memory layout of the ledger (native endian; every field an atomic, written with plain
//! loads and stores or compare-exchange: processes of the tree touch it without a lock):
//!
//! ```text
//!  offset 0: header (64 bytes)
//!   0        8          12         16           24          28          32        36
//!  +--------+----------+----------+------------+-----------+-----------+---------+--...+
//!  | MAGIC  | version  | rows (N) | budget (B) | root pid  | rows used | warned  |unused|
//!  +--------+----------+----------+------------+-----------+-----------+---------+--...+
//!   rows used: one past the highest row ever claimed (scans stop there).
//!   warned: 1 once a member has said the tree is over its budget (said once per tree).
//!  offset 64 + 64 * i: row i (64 bytes, one cache line), i < N
//!   0       4        8            16          24            32          40         48
//!  +-------+--------+------------+-----------+-------------+-----------+----------+--...+
//!  | pid   | parent | footprint  | target    | start time  | image     | beat     |unused|
//!  +-------+--------+------------+-----------+-------------+-----------+----------+--...+
//!   pid 0: a free row; a process claims one by compare-exchange 0 → its pid.
//!   footprint, target: bytes.  start time: /proc/PID/stat field 22 (clock ticks after
//!   boot), which tells a dead member from a new process that reuses its pid.
//!   image: 8 of the random bytes the kernel gives each exec (AT_RANDOM): a process that
//!   execs keeps its pid and start time, and its new image frees the rows of the old
//!   ([`start_image`]), whose pagers are gone.
//!   beat: CLOCK_MONOTONIC milliseconds of the member's last refresh; a member heard from
//!   within [`FRESH`] is alive without a look at /proc.
//! ```
//!
//! A member that exits normally frees its row ([`Member::leave`]); one that is killed or
//! calls `_exit` is found dead by the others (no such pid, a zombie, or another start
//! time) and its row freed. The last member out removes the file.
//!
//! Written here: a shared array of atomics in a file mapping is a dozen lines, and the
//! crates that offer shared-memory maps bring allocation and locks this must not have (the
//! reclaim thread reads it between evictions).

use std::fs::OpenOptions;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// "TSTREE01".
const MAGIC: u64 = u64::from_le_bytes(*b"TSTREE01");
const VERSION: u32 = 1;
/// Rows of a ledger: processes of one tree with a pager at the same time.
pub const ROWS: u32 = 255;
const HEADER_BYTES: usize = 64;
const ROW_BYTES: usize = 64;
/// Bytes of a ledger file.
pub const LEDGER_BYTES: usize = HEADER_BYTES + ROW_BYTES * ROWS as usize;
/// How often a member looks for dead ones.
const REAP_EVERY: Duration = Duration::from_millis(250);
/// A member whose beat is this recent is alive: only the others' rows are read from /proc
/// (with 64 members each looking at all every 250 ms, /proc reads would be 16,000 a second).
/// A live member's reclaim thread beats every 2–5 ms, so one silent this long is likely
/// gone; at a second, the children of a forking server, left zombies by `_exit` until the
/// server collects them, kept their rows (and the footprints every share counts) for up to
/// 1.25 s after their exit.
const FRESH: Duration = Duration::from_millis(100);
/// How often the share is recomputed at most.
const REFRESH_EVERY: Duration = Duration::from_millis(2);

#[repr(C)]
struct Header {
    magic: AtomicU64,
    version: AtomicU32,
    rows: AtomicU32,
    budget: AtomicU64,
    root: AtomicU32,
    used: AtomicU32,
    warned: AtomicU32,
}

#[repr(C)]
struct Row {
    pid: AtomicU32,
    parent: AtomicU32,
    footprint: AtomicU64,
    target: AtomicU64,
    start: AtomicU64,
    image: AtomicU64,
    beat: AtomicU64,
}

impl Row {
    /// Gives the row of member `pid` back (its footprint first, so a scan that still sees
    /// the pid counts nothing for it); false when the row was not `pid`'s any more.
    fn free(&self, pid: u32) -> bool {
        self.footprint.store(0, Ordering::Relaxed);
        self.pid.compare_exchange(pid, 0, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }
}

const _: () = assert!(std::mem::size_of::<Header>() <= HEADER_BYTES);
const _: () = assert!(std::mem::size_of::<Row>() <= ROW_BYTES);

/// One process's line of the ledger, as `tierswap stat` shows it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Line {
    /// The process.
    pub pid: u32,
    /// Its parent when it joined.
    pub parent: u32,
    /// Its pager's footprint, bytes.
    pub footprint: u64,
    /// Its share of the budget, bytes.
    pub target: u64,
}

/// A mapped ledger.
struct Ledger {
    base: usize,
}

// SAFETY: the mapping is shared memory of atomics only; every access goes through them.
unsafe impl Send for Ledger {}
// SAFETY: as above.
unsafe impl Sync for Ledger {}

impl Drop for Ledger {
    fn drop(&mut self) {
        // SAFETY: our own mapping of LEDGER_BYTES; no reference into it outlives self.
        unsafe {
            libc::munmap(self.base as *mut libc::c_void, LEDGER_BYTES);
        }
    }
}

impl Ledger {
    fn map(path: &Path, create_budget: Option<u64>) -> std::io::Result<Ledger> {
        let file = OpenOptions::new().read(true).write(true).create(create_budget.is_some()).open(path)?;
        if create_budget.is_some() {
            file.set_len(LEDGER_BYTES as u64)?;
        } else if file.metadata()?.len() < LEDGER_BYTES as u64 {
            return Err(std::io::Error::other("not a tierswap tree ledger (too short)"));
        }
        // SAFETY: a fresh shared mapping of the file, which is LEDGER_BYTES long.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                LEDGER_BYTES,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                file.as_raw_fd(),
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error());
        }
        let l = Ledger { base: p as usize };
        if let Some(budget) = create_budget {
            let h = l.header();
            h.version.store(VERSION, Ordering::Relaxed);
            h.rows.store(ROWS, Ordering::Relaxed);
            h.budget.store(budget, Ordering::Relaxed);
            h.root.store(std::process::id(), Ordering::Relaxed);
            h.magic.store(MAGIC, Ordering::Release);
        } else {
            let h = l.header();
            if h.magic.load(Ordering::Acquire) != MAGIC || h.version.load(Ordering::Relaxed) != VERSION {
                return Err(std::io::Error::other("not a tierswap tree ledger (bad magic or version)"));
            }
        }
        Ok(l)
    }

    fn header(&self) -> &Header {
        // SAFETY: the mapping is LEDGER_BYTES long, page-aligned, and lives as long as self;
        // Header is atomics only.
        unsafe { &*(self.base as *const Header) }
    }

    fn row(&self, i: usize) -> &Row {
        assert!(i < ROWS as usize);
        // SAFETY: row i lies inside the mapping (i < ROWS), 64-byte aligned; atomics only.
        unsafe { &*((self.base + HEADER_BYTES + i * ROW_BYTES) as *const Row) }
    }

    fn budget(&self) -> u64 {
        self.header().budget.load(Ordering::Relaxed)
    }

    /// Rows that may be taken: one past the highest ever claimed.
    fn used(&self) -> usize {
        (self.header().used.load(Ordering::Acquire) as usize).min(ROWS as usize)
    }

    fn lines(&self) -> Vec<Line> {
        (0..self.used())
            .filter_map(|i| {
                let r = self.row(i);
                let pid = r.pid.load(Ordering::Acquire);
                (pid != 0).then(|| Line {
                    pid,
                    parent: r.parent.load(Ordering::Relaxed),
                    footprint: r.footprint.load(Ordering::Relaxed),
                    target: r.target.load(Ordering::Relaxed),
                })
            })
            .collect()
    }

    /// Frees the rows of members that are gone; returns how many live rows remain.
    fn reap(&self) -> usize {
        let mut live = 0;
        let now = crate::sys::monotonic_ms();
        for i in 0..self.used() {
            let r = self.row(i);
            let pid = r.pid.load(Ordering::Acquire);
            if pid == 0 {
                continue;
            }
            let fresh = now.saturating_sub(r.beat.load(Ordering::Relaxed)) < FRESH.as_millis() as u64;
            if (fresh && exists(pid)) || alive(pid, r.start.load(Ordering::Relaxed)) {
                live += 1;
            } else {
                r.free(pid);
            }
        }
        live
    }
}

/// This program image's token: the first 8 of the random bytes the kernel put on the stack
/// at exec (AT_RANDOM), new at every exec.
fn image_token() -> u64 {
    // SAFETY: getauxval has no preconditions; AT_RANDOM points to 16 bytes that live as
    // long as the process (0 where the auxiliary vector lacks it).
    unsafe {
        let p = libc::getauxval(libc::AT_RANDOM) as *const u8;
        if p.is_null() {
            return 0;
        }
        u64::from_ne_bytes(std::ptr::read_unaligned(p as *const [u8; 8]))
    }
}

/// A program image of the tree starts (the shim, at every exec): frees the rows this
/// process's earlier images left (a forked child that started a pager, then exec'd: its
/// pager is gone, its row would count a footprint nobody holds until the process exits),
/// and returns the pid of the tree's root (the program `tierswap run` started), if `path`
/// is a ledger.
pub fn start_image(path: &Path) -> Option<u32> {
    let l = Ledger::map(path, None).ok()?;
    let (pid, image) = (std::process::id(), image_token());
    for i in 0..l.used() {
        let r = l.row(i);
        if r.pid.load(Ordering::Acquire) == pid && r.image.load(Ordering::Relaxed) != image {
            r.free(pid);
        }
    }
    Some(l.header().root.load(Ordering::Relaxed))
}

/// Whether a process `pid` exists (a zombie does: only for a member heard from lately).
fn exists(pid: u32) -> bool {
    // SAFETY: signal 0 only checks that the process exists and may be signalled.
    let r = unsafe { libc::kill(pid as libc::pid_t, 0) };
    r == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// Whether `pid` is the live process that started at `start` (a zombie is not).
fn alive(pid: u32, start: u64) -> bool {
    match stat_of(pid) {
        Some((state, s)) => state != b'Z' && state != b'X' && (start == 0 || s == start),
        None => false,
    }
}

/// A process's state letter and start time from /proc/PID/stat.
fn stat_of(pid: u32) -> Option<(u8, u64)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    parse_stat(&text)
}

/// State (field 3) and start time (field 22) of a /proc/PID/stat line; the command name
/// (field 2) may hold spaces and parentheses, so fields are counted after its last ')'.
fn parse_stat(text: &str) -> Option<(u8, u64)> {
    let rest = &text[text.rfind(')')? + 1..];
    let mut fields = rest.split_ascii_whitespace();
    let state = *fields.next()?.as_bytes().first()?;
    let start = fields.nth(18)?.parse().ok()?;
    Some((state, start))
}

/// A process's share of the tree's budget `budget` (bytes): `own` is its footprint, `sum`
/// the tree's (own included), `members` how many processes have a row, `cap` its own
/// configured budget. Under the budget, it may grow by an equal part of the room left (all
/// of it alone; shares are looked at again every few milliseconds, so a lone grower gets
/// the rest soon, while members growing at once cannot each take all of it); over, it is
/// asked down in proportion to its size. With more than one member each share has a grace of
/// 1/32 of an equal share, so that a process is not made to evict its own pages for every
/// page another grew by before its next look (the graces sum to 1/32 of the budget, what
/// the high watermark keeps below it), and a floor of a quarter of an equal share, so that
/// a process starting late is not squeezed to nothing by those already there.
pub fn share(own: u64, sum: u64, members: u64, budget: u64, cap: u64) -> u64 {
    let members = members.max(1);
    let grace = if members > 1 { budget / (32 * members) } else { 0 };
    let floor = budget / (4 * members);
    let sum = sum.max(own);
    let t = if sum <= budget {
        own + (budget - sum) / members + grace
    } else {
        ((own as u128 * budget as u128) / sum as u128) as u64 + grace
    };
    t.max(floor).min(cap)
}

/// Makes the ledger at `path` again, whole or not at all: written beside it, then linked
/// into place (a process doing the same at once wins, or we do; neither sees half a file).
fn recreate(path: &Path, budget: u64) -> std::io::Result<()> {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    let tmp = path.with_file_name(format!("{name}.new.{}", std::process::id()));
    create(&tmp, budget)?;
    let linked = std::fs::hard_link(&tmp, path);
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => Err(e),
        _ => Ok(()),
    }
}

/// Creates the ledger for a tree with `budget` bytes at `path` (`tierswap run`).
pub fn create(path: &Path, budget: u64) -> std::io::Result<()> {
    Ledger::map(path, Some(budget)).map(drop)
}

/// Where `tierswap run` puts the ledger of the tree rooted at `pid`: tmpfs when there is
/// one (the file is 16 KiB and written every few milliseconds).
pub fn default_path(pid: u32) -> PathBuf {
    let dir = if Path::new("/dev/shm").is_dir() { PathBuf::from("/dev/shm") } else { std::env::temp_dir() };
    dir.join(format!("tierswap-tree.{pid}"))
}

/// The ledgers in `dir` whose members are all gone (a tree whose last process was killed),
/// removed; returns how many.
pub fn sweep(dir: &Path) -> usize {
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    let mut removed = 0;
    for e in entries.flatten() {
        let name = e.file_name();
        // `tierswap-tree.ROOT`, or `tierswap-tree.ROOT.uUID` (a root image's own, when it
        // could not write its tree's).
        let Some(root) = name.to_str().and_then(|n| n.strip_prefix("tierswap-tree.")) else { continue };
        let Ok(root) = root.split('.').next().unwrap_or(root).parse::<u32>() else { continue };
        if stat_of(root).is_some() {
            continue;
        }
        if let Ok(l) = Ledger::map(&e.path(), None) {
            if l.reap() == 0 && std::fs::remove_file(e.path()).is_ok() {
                removed += 1;
            }
        }
    }
    removed
}

/// The tree's budget and every member's line, for `tierswap stat`.
pub fn read(path: &Path) -> std::io::Result<(u64, Vec<Line>)> {
    let l = Ledger::map(path, None)?;
    l.reap();
    Ok((l.budget(), l.lines()))
}

/// This pager's membership in a tree.
pub struct Member {
    ledger: Ledger,
    path: PathBuf,
    row: usize,
    pid: u32,
    cap: u64,
    /// The share in force, bytes (read by everything that reads the budget).
    target: AtomicU64,
    /// The tree's summed footprint when the share was last computed, bytes.
    total: AtomicU64,
    /// When the share was last computed and the dead last looked for (reclaim thread).
    last: Mutex<(Instant, Instant)>,
    /// The row was given back: nothing is published any more.
    left: AtomicBool,
}

impl Member {
    /// Joins the tree whose ledger is at `path`, with `cap` bytes as this pager's own
    /// budget (its share never exceeds it). A ledger that is gone is made again with `cap`
    /// as the tree's budget: the last member out removes it, and a process of the tree may
    /// start its pager after that (a daemon's child, once the program that forked it has
    /// exited).
    pub fn join(path: &Path, cap: u64) -> std::io::Result<Member> {
        let ledger = match Ledger::map(path, None) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                recreate(path, cap)?;
                Ledger::map(path, None)?
            }
            other => other?,
        };
        let pid = std::process::id();
        let start = stat_of(pid).map_or(0, |(_, s)| s);
        // SAFETY: getppid has no preconditions.
        let parent = unsafe { libc::getppid() } as u32;
        let claim = |l: &Ledger| {
            (0..ROWS as usize).find(|&i| {
                let r = l.row(i);
                r.pid.load(Ordering::Relaxed) == 0
                    && r.pid.compare_exchange(0, pid, Ordering::AcqRel, Ordering::Relaxed).is_ok()
            })
        };
        // Claims the first free row; a row past the ones in use is taken in order, so the
        // scans' bound only grows.
        let row = match claim(&ledger) {
            Some(r) => r,
            None => {
                ledger.reap();
                claim(&ledger).ok_or_else(|| {
                    std::io::Error::other(format!("the tree's ledger is full ({ROWS} processes with a pager)"))
                })?
            }
        };
        ledger.header().used.fetch_max(row as u32 + 1, Ordering::AcqRel);
        let r = ledger.row(row);
        r.beat.store(crate::sys::monotonic_ms(), Ordering::Relaxed);
        r.parent.store(parent, Ordering::Relaxed);
        r.start.store(start, Ordering::Relaxed);
        r.image.store(image_token(), Ordering::Relaxed);
        r.footprint.store(0, Ordering::Relaxed);
        let budget = ledger.budget();
        let m = Member {
            ledger,
            path: path.to_path_buf(),
            row,
            pid,
            cap,
            target: AtomicU64::new(budget.min(cap)),
            total: AtomicU64::new(0),
            last: Mutex::new((Instant::now() - REFRESH_EVERY, Instant::now())),
            left: AtomicBool::new(false),
        };
        m.recompute(0);
        Ok(m)
    }

    /// The share in force, bytes.
    pub fn target(&self) -> u64 {
        self.target.load(Ordering::Relaxed)
    }

    /// The tree's summed footprint when the share was last computed, bytes.
    pub fn total(&self) -> u64 {
        self.total.load(Ordering::Relaxed)
    }

    /// The tree's budget, bytes.
    pub fn budget(&self) -> u64 {
        self.ledger.budget()
    }

    /// True for the first member of the tree to ask: whoever says the tree is over its
    /// budget says it for all (each process's pager would otherwise say it once).
    pub fn first_to_warn(&self) -> bool {
        self.ledger.header().warned.compare_exchange(0, 1, Ordering::AcqRel, Ordering::Relaxed).is_ok()
    }

    /// The ledger's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Publishes `footprint` and recomputes the share, at most every couple of
    /// milliseconds (the reclaim thread calls it on every step); looks for dead members
    /// every [`REAP_EVERY`]. A forked copy of a member (a child that has not joined) does
    /// nothing.
    pub fn refresh(&self, footprint: u64) {
        if std::process::id() != self.pid {
            return;
        }
        let Ok(mut last) = self.last.try_lock() else { return };
        if self.left.load(Ordering::Acquire) {
            return;
        }
        let now = Instant::now();
        if now.duration_since(last.0) < REFRESH_EVERY {
            return;
        }
        last.0 = now;
        if now.duration_since(last.1) >= REAP_EVERY {
            last.1 = now;
            self.ledger.reap();
        }
        drop(last);
        self.recompute(footprint);
    }

    fn recompute(&self, footprint: u64) {
        let me = self.ledger.row(self.row);
        me.footprint.store(footprint, Ordering::Relaxed);
        me.beat.store(crate::sys::monotonic_ms(), Ordering::Relaxed);
        let (mut sum, mut members) = (0u64, 0u64);
        for i in 0..self.ledger.used() {
            let r = self.ledger.row(i);
            if r.pid.load(Ordering::Acquire) != 0 {
                sum += r.footprint.load(Ordering::Relaxed);
                members += 1;
            }
        }
        let t = share(footprint, sum, members, self.ledger.budget(), self.cap);
        me.target.store(t, Ordering::Relaxed);
        self.target.store(t, Ordering::Relaxed);
        self.total.store(sum, Ordering::Relaxed);
    }

    /// Member `pid`'s footprint and share, bytes (`None`: it has no row).
    pub fn member(&self, pid: u32) -> Option<(u64, u64)> {
        (0..self.ledger.used())
            .map(|i| self.ledger.row(i))
            .find(|r| r.pid.load(Ordering::Acquire) == pid)
            .map(|r| (r.footprint.load(Ordering::Relaxed), r.target.load(Ordering::Relaxed)))
    }

    /// Gives the row back (at exit); the last member out removes the ledger.
    pub fn leave(&self) {
        if std::process::id() != self.pid {
            return;
        }
        // Under the refresh's lock: no refresh is writing the row while it goes.
        let _last = self.last.lock().unwrap_or_else(|e| e.into_inner());
        if self.left.swap(true, Ordering::AcqRel) {
            return;
        }
        if self.ledger.row(self.row).free(self.pid) && self.ledger.reap() == 0 {
            let _ = std::fs::remove_file(&self.path);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const M: u64 = 1 << 20;

    fn me_row(l: &Ledger) -> usize {
        (0..ROWS as usize).find(|&i| l.row(i).pid.load(Ordering::Relaxed) == std::process::id()).unwrap()
    }

    fn temp_path(tag: &str) -> PathBuf {
        std::env::temp_dir().join(format!("tierswap-tree-test.{}.{tag}", std::process::id()))
    }

    #[test]
    fn alone_the_share_is_the_budget() {
        for own in [0, 10 * M, 256 * M, 400 * M] {
            assert_eq!(share(own, own, 1, 256 * M, 256 * M), 256 * M, "own {own}");
        }
        // Never above the pager's own budget.
        assert_eq!(share(0, 0, 1, 256 * M, 64 * M), 64 * M);
    }

    #[test]
    fn under_the_budget_the_room_is_open_to_each() {
        // Two members, 100 + 50 of 256: each may grow by half the 106 left, plus the
        // grace: the shares sum to the budget and the graces.
        let grace = 256 * M / 64;
        let a = share(100 * M, 150 * M, 2, 256 * M, 256 * M);
        let b = share(50 * M, 150 * M, 2, 256 * M, 256 * M);
        assert_eq!(a, 153 * M + grace);
        assert_eq!(b, 103 * M + grace);
        assert_eq!(a + b, 256 * M + 2 * grace);
    }

    #[test]
    fn over_the_budget_each_gives_back_in_proportion() {
        // 300 + 100 of 256: 192 and 64 plus the grace; the shares sum to the budget and
        // the graces (1/32 of it).
        let grace = 256 * M / 64;
        let a = share(300 * M, 400 * M, 2, 256 * M, 256 * M);
        let b = share(100 * M, 400 * M, 2, 256 * M, 256 * M);
        assert_eq!(a, 192 * M + grace);
        assert_eq!(b, 64 * M + grace);
        assert_eq!(a + b, 256 * M + 256 * M / 32);
        // A newcomer with nothing keeps a floor of a quarter of an equal share.
        assert_eq!(share(0, 400 * M, 3, 256 * M, 256 * M), 256 * M / 12);
    }

    #[test]
    fn stat_fields_are_counted_after_the_command_name() {
        let line = "42 (a (b) c) S 1 42 42 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 10";
        assert_eq!(parse_stat(line), Some((b'S', 123456)));
        assert_eq!(parse_stat("garbage"), None);
        let own = stat_of(std::process::id()).expect("own stat");
        assert_ne!(own.0, b'Z');
        assert!(own.1 > 0);
    }

    #[test]
    fn members_publish_share_and_leave() {
        let path = temp_path("members");
        create(&path, 256 * M).unwrap();
        let a = Member::join(&path, 256 * M).unwrap();
        // Our own process may join twice (two pagers); each has its row.
        let b = Member::join(&path, 256 * M).unwrap();
        assert_ne!(a.row, b.row);
        a.recompute(200 * M);
        b.recompute(100 * M);
        a.recompute(200 * M);
        let (budget, lines) = read(&path).unwrap();
        assert_eq!(budget, 256 * M);
        assert_eq!(lines.len(), 2);
        let mut fps: Vec<u64> = lines.iter().map(|l| l.footprint).collect();
        fps.sort();
        assert_eq!(fps, vec![100 * M, 200 * M]);
        assert!(lines.iter().all(|l| l.pid == std::process::id()));
        // 300 of 256: a is asked down to 200·256/300 plus the grace.
        assert_eq!(a.target(), 200 * M * 256 / 300 + 256 * M / 64);
        assert!(a.target() < 200 * M);
        assert_eq!((a.total(), b.total()), (300 * M, 300 * M), "each saw the tree's sum at its last look");
        // The tree is over: one member says so, for all.
        assert!(b.first_to_warn());
        assert!(!a.first_to_warn() && !b.first_to_warn());
        b.leave();
        assert!(path.exists(), "a member is left");
        a.recompute(200 * M);
        assert_eq!(a.target(), 256 * M);
        a.leave();
        assert!(!path.exists(), "the last member out removes the ledger");
        // A process of the tree starting after that makes it again, with its budget.
        let c = Member::join(&path, 64 * M).unwrap();
        assert_eq!(c.budget(), 64 * M);
        assert_eq!(read(&path).unwrap().1.len(), 1);
        c.leave();
        assert!(!path.exists());
    }

    #[test]
    fn a_dead_member_is_reaped_and_a_bad_file_refused() {
        let path = temp_path("reap");
        create(&path, 64 * M).unwrap();
        // SAFETY: the child only joins (which allocates: fine, a fresh single-threaded
        // copy of this test thread's process, glibc's malloc unlocked by fork) and _exits.
        let child = unsafe { libc::fork() };
        assert!(child >= 0);
        if child == 0 {
            let code = match Member::join(&path, 64 * M) {
                Ok(m) => {
                    m.recompute(50 * M);
                    std::mem::forget(m);
                    0
                }
                Err(_) => 1,
            };
            // SAFETY: leaves the child at once, without unwinding into the test harness.
            unsafe { libc::_exit(code) };
        }
        let mut status = 0;
        // SAFETY: waits for our own child.
        assert_eq!(unsafe { libc::waitpid(child, &mut status, 0) }, child);
        assert_eq!(status, 0);
        let l = Ledger::map(&path, None).unwrap();
        assert_eq!(l.lines().len(), 1, "the child's row is there until reaped");
        assert_eq!(l.lines()[0].footprint, 50 * M);
        assert_eq!(l.reap(), 0);
        assert!(l.lines().is_empty());
        // A row of this process from another program image (as if it had exec'd since) goes;
        // this image's own row stays.
        let me = Member::join(&path, M).unwrap();
        let old = (0..ROWS as usize).find(|&i| l.row(i).pid.load(Ordering::Relaxed) == 0).unwrap();
        l.header().used.fetch_max(old as u32 + 1, Ordering::AcqRel);
        l.row(old).image.store(image_token() ^ 1, Ordering::Relaxed);
        l.row(old).pid.store(std::process::id(), Ordering::Release);
        assert_eq!(l.lines().len(), 2);
        assert_eq!(start_image(&path), Some(std::process::id()), "the ledger's creator is its root");
        assert_eq!(l.lines().len(), 1, "the earlier image's row is freed, ours stays");
        std::mem::forget(me);
        assert_eq!(l.reap(), 1);
        l.row(me_row(&l)).pid.store(0, Ordering::Release);
        drop(l);
        // A ledger named as run names it, for a root that is gone and with no member
        // left, is swept; one whose root lives is kept.
        let dir = temp_path("sweep");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::rename(&path, dir.join(format!("tierswap-tree.{child}"))).unwrap();
        create(&dir.join(format!("tierswap-tree.{}", std::process::id())), M).unwrap();
        assert_eq!(sweep(&dir), 1);
        assert!(!dir.join(format!("tierswap-tree.{child}")).exists());
        std::fs::remove_dir_all(&dir).unwrap();
        std::fs::write(&path, b"short").unwrap();
        assert!(Member::join(&path, M).is_err());
        std::fs::write(&path, vec![0u8; LEDGER_BYTES]).unwrap();
        assert!(Member::join(&path, M).is_err());
        std::fs::remove_file(&path).unwrap();
    }
}
