//! Forked children: the parent's pager serves the pages a child cannot see.
//!
//! Owns: the fork snapshot, one server thread per child, the hand-over of a child's pages
//! when the parent goes, and (signal mode) the link a child asks for its pages through.
//! Calls: the memory manager (reading and releasing slots, the children's state in
//! `mm::children`), `uffd` on the child's userfaultfd, `sys` for the link's sockets.
//!
//! With EVENT_FORK the kernel gives the parent's pager the child's userfaultfd, the child's
//! copies of the program ranges registered with it. Present pages the kernel shares
//! copy-on-write; missing ones (swapped, staged: mirrors are MADV_DONTFORK) fault to us.
//! A page present and clean in the parent (write-protected, keeping its slot) comes to the
//! child with its write protection: the child's first write to it is a write-protect fault,
//! and lifting the protection is all it needs (the bytes are right).
//!
//! The snapshot is taken when the FORK event is handled: while it is queued the parent's
//! own installs fail with EAGAIN (the kernel raises mmap_changing), so no page becomes
//! present meanwhile; a staged page evicted meanwhile has the same bytes in its slot. So
//! the ptes seen then are the ptes at fork. Between the read (which lets the fork finish)
//! and the snapshot, forkgate.rs keeps installs away for glibc's fork(): the reader holds
//! the event lock from before the fork until the snapshot is taken, and no fault is served
//! meanwhile. Swapped pages: the child takes a reference on the slot (the swap count), and
//! the parent's swap-in or discard only drops its own, so a page shared by parent and child
//! is stored once. Staged pages are copied at once (bounded by the inactive list). Nothing
//! is read from swap until the child touches a page: fork + exec costs one walk of the
//! page tables.
//!
//! One thread per child serves its faults and events; when the child's mm is gone (exit or
//! exec) it drops every reference the child held.
//!
//! **Grants** (thread mode, in a tree): a child's own pager links to its server through
//! the mailbox below ([`link_to_parent`]), and the server hands that pager, piece by piece,
//! the inherited memory the child takes in ([`grant`]; events/grant.rs says when and how).
//!
//! **Hand-over.** The child's userfaultfd lives in the parent: when the parent exits, the
//! kernel unregisters the child's ranges and a page the child has not had yet would read
//! as zeros. So before the parent's pager goes (its `Pager` dropped, or the process calling
//! `exit`), every child server installs all the pages its child still needs, then stops
//! (`mm::children::hand_over`). A parent killed by a signal cannot do that.
//!
//! **Signal mode.** A child's userfaultfd inherits UFFD_FEATURE_SIGBUS: its faults raise
//! SIGBUS in the child instead of queueing a message, and the child has no pager threads.
//! Its SIGBUS handler asks the parent's pager over a socket ([`ask_parent`]), which installs
//! the page through the child's userfaultfd and answers. Which userfaultfd is the child's
//! is told by a mailbox: one page registered on the pager's userfaultfd that the parent
//! never touches, so it is missing in every child too; the fork handler installs in the
//! child's copy the child's id. The child reads it without faulting (`process_vm_readv` of
//! itself answers EFAULT until it is there), writes its pid into it (its own copy: a claim
//! a grandchild inherits and so cannot take over), and sends the id with one end of a
//! socket pair of its own to the pager over a socket every child inherits. The mailbox has
//! a page per generation: a grandchild finds its parent's page claimed and reads the next,
//! which the server of its parent filled when it handled that fork. A child forks only
//! after claiming its own page (a fork handler does it), so none is taken for another.
//! Descendants deeper than the mailbox, or forked with a raw clone before their parent
//! claimed its page, are not served: a fault on a swapped page ends them with SIGBUS.
//!
//! ```text
//!  mailbox page g (a descendant's copy) hello (descendant → pager), with SCM_RIGHTS
//!  +--------+--------+----------+       +--------+--------+------+
//!  | MAGIC  |   id   | claim pid|       | MAGIC  |   id   | pid  |   3 × u64
//!  +--------+--------+----------+       +--------+--------+------+
//!  request: | addr | flags (1 write, 2 present page) |   reply: | status (0 retry, 1 not ours) |
//!  grant (thread mode, server → child): | start | len |       2 × u64
//! ```

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, IntoRawFd, OwnedFd};
use std::sync::atomic::{AtomicI32, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::config::FaultMode;
use crate::events::grant::{self, Pieces, GRANT_MAX_PIECES};
use crate::mm::children::{Link, MAGIC, MAILBOX_PAGES};
use crate::mm::slots::put_slot;
use crate::mm::swap_io::{read_entry, IoBufs};
use crate::mm::Shared;
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{PteState, PTES_PER_CHUNK};
use crate::swap::entry::MAX_COUNT;
use crate::sys;
use crate::uffd::{self, Event, Uffd};

/// Request flag: a write access.
const REQ_WRITE: u64 = 1;
/// Request flag: the page was present (a write-protect fault).
const REQ_PRESENT: u64 = 2;
/// Reply: retry the access (served, or to be served once an event is handled).
const REPLY_RETRY: u64 = 0;
/// Reply: the address is not this pager's: the SIGBUS is the program's.
const REPLY_NOT_OURS: u64 = 1;
/// How long a child waits for its mailbox (installed when the parent handles the fork).
const MAILBOX_WAIT: Duration = Duration::from_secs(5);

/// Where a child's missing page comes from.
#[derive(Clone, Copy)]
enum Src {
    /// A slot the child holds a reference on.
    Slot(u64),
    /// A copy in the child's own buffer, at this page index.
    Copy(usize),
}

/// A forked child whose missing pages the parent serves.
struct Child {
    uffd: Uffd,
    /// Page address in the child → where its fork-time bytes are.
    pages: BTreeMap<usize, Src>,
    /// Thread mode: the inherited memory not granted to the child's own pager yet.
    pieces: Pieces,
    /// Copies of pages (staged at fork, or slots whose count is full).
    copies: Vec<u8>,
    /// The id in the child's mailbox (0: none: in signal mode its faults are not served,
    /// in thread mode nothing is granted to it).
    id: u64,
    /// The mailbox page is not installed yet (an event of the child's was queued).
    mailbox_pending: bool,
    /// The child's pid, as its hello gave it (0 before).
    pid: u32,
    /// Its mailbox page (its generation below the pager's process, from 0).
    gen: usize,
    /// The 64 KiB block of its last fault, for [`Child::streams`].
    last_block: usize,
    /// The child's end of its link, once its hello came (signal mode: its requests; thread
    /// mode: its grants).
    link: Option<OwnedFd>,
    /// Thread mode: pieces due at the link that the child never faulted in, granted a run
    /// at a time after the others (`grant_deferred`), in address order.
    deferred: VecDeque<(usize, usize)>,
    /// When the last run of `deferred` went.
    last_deferred: Instant,
}

/// What installing one of a child's pages came to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Install {
    /// The page is in the child now.
    Done,
    /// The child had a page there already.
    Exists,
    /// An event of the child's is queued (the kernel answered EAGAIN): after it.
    Retry,
    /// The address is not registered in the child (unmapped, or never ours).
    NotMapped,
    /// The child's mm is gone.
    Gone,
}

/// The FORK event: snapshot what the child cannot see (swapped and staged pages) and start
/// its server thread.
pub(crate) fn fork(s: &Arc<Shared>, child_uffd: Uffd) {
    let mut scratch = match IoBufs::new(s.config.file_unit_bytes, 1) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("tierswap: cannot serve a forked child ({e}); its swapped pages read as zeros");
            return;
        }
    };
    let mut child = Child {
        uffd: child_uffd,
        pages: BTreeMap::new(),
        pieces: Pieces::default(),
        copies: Vec::new(),
        id: 0,
        mailbox_pending: false,
        pid: 0,
        gen: 0,
        last_block: usize::MAX - 1,
        link: None,
        deferred: VecDeque::new(),
        last_deferred: Instant::now(),
    };
    for r in s.all_regions() {
        for c in 0..r.n_pages.div_ceil(PTES_PER_CHUNK) {
            if !r.ptes.chunk_in_use(c) {
                continue;
            }
            let end = ((c + 1) * PTES_PER_CHUNK).min(r.n_pages);
            child.pieces.add(r.page_addr(c * PTES_PER_CHUNK), r.page_addr(end));
            for i in c * PTES_PER_CHUNK..end {
                let old = r.ptes.lock(i);
                let src = match old.state() {
                    PteState::Swapped => child.share_slot(s, old.slot(), &mut scratch),
                    PteState::Staged => {
                        // SAFETY: the staged page's bytes in the mirror, under its pte lock.
                        let page = unsafe { std::slice::from_raw_parts(r.mirror_addr(i) as *const u8, PAGE_SIZE) };
                        s.counters.fork_copied_pages.fetch_add(1, Ordering::Relaxed);
                        Some(child.add_copy(page))
                    }
                    _ => None,
                };
                r.ptes.unlock(i, old, old);
                if let Some(src) = src {
                    child.pages.insert(r.page_addr(i), src);
                }
            }
        }
    }
    child.post_mailbox(s);
    spawn_server(s, child, scratch);
}

impl Child {
    /// Gives the child its id in its mailbox page, now or (an event of the child's queued)
    /// once its server has read its events.
    fn post_mailbox(&mut self, s: &Shared) {
        if let Some(l) = &s.fork.children.link {
            self.id = l.new_id(self.gen);
            self.mailbox_pending = self.id != 0 && !l.install_mailbox(&self.uffd, self.gen, self.id);
        }
    }

    /// Installs the pending mailbox page; false while it must still wait.
    fn retry_mailbox(&mut self, s: &Shared) -> bool {
        if let (true, Some(l)) = (self.mailbox_pending, &s.fork.children.link) {
            self.mailbox_pending = !l.install_mailbox(&self.uffd, self.gen, self.id);
        }
        !self.mailbox_pending
    }

    fn add_copy(&mut self, page: &[u8]) -> Src {
        let k = self.copies.len() / PAGE_SIZE;
        self.copies.extend_from_slice(&page[..PAGE_SIZE]);
        Src::Copy(k)
    }

    /// Takes another reference on `slot` for this child, or copies its bytes when its
    /// count is full.
    fn share_slot(&mut self, s: &Shared, slot: u64, scratch: &mut IoBufs) -> Option<Src> {
        let e = s.tiers.swap.lock(slot);
        if e.count() < MAX_COUNT {
            s.tiers.swap.unlock(slot, e, e.with_count(e.count() + 1));
            s.counters.fork_shared_slots.fetch_add(1, Ordering::Relaxed);
            return Some(Src::Slot(slot));
        }
        s.counters.fork_copied_pages.fetch_add(1, Ordering::Relaxed);
        let buf = scratch.page.as_mut_slice();
        let res = read_entry(s, slot, e, buf, &mut scratch.unit, &mut scratch.read);
        s.tiers.swap.unlock(slot, e, e);
        match res {
            Ok(true) => Some(self.add_copy(&scratch.page.as_slice()[..PAGE_SIZE])),
            Ok(false) => None,
            Err(fail) => {
                eprintln!("tierswap: a forked child's page (slot {slot}) cannot be read ({fail}); it reads zeros");
                None
            }
        }
    }

    /// Drops everything in `[start, end)`.
    fn drop_range(&mut self, s: &Shared, start: usize, end: usize) {
        let keys: Vec<usize> = self.pages.range(start..end).map(|(&a, _)| a).collect();
        for a in keys {
            self.forget(s, a);
        }
    }

    /// Whether a fault at `addr` continues the child's last one in order (same 64 KiB block
    /// or the next); notes it as the last.
    fn streams(&mut self, addr: usize) -> bool {
        let block = addr / (BLOCK_PAGES * PAGE_SIZE);
        let in_order = block == self.last_block || block == self.last_block.wrapping_add(1);
        self.last_block = block;
        in_order
    }

    /// The child has no use for its fork-time page at `addr` any more: its reference goes.
    fn forget(&mut self, s: &Shared, addr: usize) {
        if let Some(Src::Slot(slot)) = self.pages.remove(&addr) {
            put_slot(s, slot);
        }
    }

    fn release(&mut self, s: &Shared) {
        for (_, src) in std::mem::take(&mut self.pages) {
            if let Src::Slot(slot) = src {
                put_slot(s, slot);
            }
        }
        self.copies = Vec::new();
    }

    /// A grandchild: it shares what this child still has from us.
    fn fork(&self, s: &Arc<Shared>, uffd: Uffd, scratch: &mut IoBufs) {
        let gen = self.gen + 1;
        let mut g = Child {
            uffd,
            pages: BTreeMap::new(),
            pieces: self.pieces.for_fork(),
            copies: Vec::new(),
            id: 0,
            mailbox_pending: false,
            pid: 0,
            gen,
            last_block: usize::MAX - 1,
            link: None,
            deferred: VecDeque::new(),
            last_deferred: Instant::now(),
        };
        for (&a, &v) in &self.pages {
            let src = match v {
                Src::Slot(slot) => g.share_slot(s, slot, scratch),
                Src::Copy(k) => {
                    s.counters.fork_copied_pages.fetch_add(1, Ordering::Relaxed);
                    Some(g.add_copy(&self.copies[k * PAGE_SIZE..(k + 1) * PAGE_SIZE]))
                }
            };
            if let Some(src) = src {
                g.pages.insert(a, src);
            }
        }
        g.post_mailbox(s);
        match IoBufs::new(s.config.file_unit_bytes, 1) {
            Ok(gs) => spawn_server(s, g, gs),
            Err(_) => g.release(s),
        }
    }
}

fn spawn_server(s: &Arc<Shared>, child: Child, scratch: IoBufs) {
    let s2 = s.clone();
    let mut holder = Some((child, scratch));
    s.fork.children.server_started();
    let res = std::thread::Builder::new().name("tierswap-child".into()).spawn(move || {
        sys::block_signals();
        if let Some((child, scratch)) = holder.take() {
            serve(&s2, child, scratch);
        }
        s2.fork.children.server_stopped();
    });
    if let Err(e) = res {
        s.fork.children.server_stopped();
        eprintln!("tierswap: cannot start a thread for a forked child ({e}); its swapped pages read as zeros");
    }
}

/// An address no program maps (below any executable, above mmap_min_addr): a zero-page
/// request there fails with ENOENT while the child lives and ESRCH once its mm is gone,
/// changing nothing either way.
const PROBE_ADDR: usize = 0x10000;
/// How long a server waits on a quiet child before it first asks whether the child's mm is
/// gone (an exec or an exit raises nothing on the child's userfaultfd), in ms; each quiet
/// wait after doubles it, up to [`PROBE_MAX_MS`]. Most children exec or exit at once (a
/// shell's, `system()`'s): a server that waited 100 ms for each lingered, and a shell
/// forking every 2 ms had ~50 of them, each a thread whose stack every later fork copied
/// and every child's exec tore down again (a fork + exec of /bin/true from a managed
/// process: 1.9 ms against 0.68 natively).
const PROBE_FIRST_MS: i32 = 1;
const PROBE_MAX_MS: i32 = 100;

/// Serves a forked child until its mm is gone (or, handing over, until it has every page
/// it needs), then drops its references.
fn serve(s: &Arc<Shared>, mut child: Child, mut scratch: IoBufs) {
    let mut events = Vec::with_capacity(64);
    let link = s.fork.children.link.as_ref();
    let none = -1;
    let mut quiet_ms = PROBE_FIRST_MS;
    loop {
        if s.wake.shutdown.load(Ordering::Acquire) {
            break;
        }
        let handing_over = s.fork.children.handing_over.load(Ordering::Acquire);
        child.retry_mailbox(s);
        let fds = [
            child.uffd.as_raw_fd(),
            s.wake.stop_fd.as_raw_fd(),
            s.fork.children.bell.as_raw_fd(),
            link.map_or(none, |l| l.hello_rx.as_raw_fd()),
            link.map_or(none, |l| l.inbox_bell.as_raw_fd()),
            child.link.as_ref().map_or(none, |f| f.as_raw_fd()),
        ];
        let deferring = !handing_over && !child.deferred.is_empty();
        let timeout = match (handing_over, deferring) {
            (true, _) => 0,
            (_, true) => grant::DEFERRED_QUIET.as_millis() as i32,
            _ => quiet_ms,
        };
        let ready = match uffd::poll_fds(&fds, timeout) {
            Ok(r) => r,
            Err(_) => break,
        };
        if ready == 0 && deferring {
            if !grant_deferred(s, &mut child, &mut scratch) && gone(&child) {
                break;
            }
            continue;
        }
        if ready == 0 && !handing_over {
            if gone(&child) {
                break;
            }
            quiet_ms = (quiet_ms * 2).min(PROBE_MAX_MS);
            continue;
        }
        quiet_ms = PROBE_FIRST_MS;
        if deferring && child.last_deferred.elapsed() >= grant::DEFERRED_BUSY {
            grant_deferred(s, &mut child, &mut scratch);
        }
        if ready & 1 != 0 && !serve_events(s, &mut child, &mut events, &mut scratch) {
            break;
        }
        if let Some(l) = link {
            if ready & 0b1_1000 != 0 {
                l.receive_hellos();
                if child.id != 0 && child.link.is_none() {
                    if let Some((fd, pid)) = l.take_link(child.id) {
                        child.link = Some(fd);
                        child.pid = pid;
                    }
                    if child.link.is_some() && s.config.fault_mode == FaultMode::Thread {
                        grant_due(s, &mut child, &mut scratch);
                    }
                }
            }
            if ready & 0b10_0000 != 0 && !serve_requests(s, &mut child, &mut scratch) {
                child.link = None;
            }
        }
        if handing_over && !hand_over_some(s, &mut child, &mut scratch) {
            break;
        }
    }
    if let Some(l) = link {
        l.forget(child.id);
    }
    child.release(s);
}

/// Reads and handles the child's queued messages. False once its userfaultfd fails (its
/// mm is gone).
fn serve_events(s: &Arc<Shared>, child: &mut Child, events: &mut Vec<Event>, scratch: &mut IoBufs) -> bool {
    events.clear();
    if child.uffd.read_events(events, 64).is_err() {
        return false;
    }
    for ev in events.drain(..) {
        match ev {
            Event::PageFault { addr, wp: true, .. } => {
                lift_protection(s, child, addr);
                note_fault(s, child, addr, scratch);
            }
            Event::PageFault { addr, write, .. } => {
                if child.pid != 0 && child.link.is_some() {
                    grant::wait_for_child_room(s, child.pid, child.pieces.ungranted_bytes());
                }
                if child.streams(addr) {
                    install_around(s, child, addr, scratch);
                }
                if install(s, child, addr, write, scratch) == Install::Gone {
                    return false;
                }
                note_fault(s, child, addr, scratch);
            }
            Event::Remove { start, end } => child.drop_range(s, start, end),
            Event::Unmap { start, end } => {
                child.drop_range(s, start, end);
                child.pieces.cut(start, end);
            }
            Event::Remap { from, to, len } => {
                // What moved (and what it landed on) is served here for good.
                child.pieces.cut(from, from + len);
                child.pieces.cut(to, to + len);
                let moved: Vec<(usize, Src)> = child.pages.range(from..from + len).map(|(&a, &v)| (a, v)).collect();
                for (a, v) in moved {
                    child.pages.remove(&a);
                    child.pages.insert(a - from + to, v);
                }
            }
            Event::Fork { uffd } => child.fork(s, uffd, scratch),
            Event::Unknown(_) => {}
        }
    }
    true
}

/// A write to a page the child shares with the parent, present and clean in the parent at
/// the fork: the kernel copied the parent's write protection (kept-slot pages) into the
/// child's page table along with the page. The child's bytes are right; only the
/// protection is the parent's, and nothing of the child's depends on it. Lifted for the
/// whole 64 KiB block (a writer of one page of a block usually writes the rest; pages of
/// it that are missing in the child are left as they are), and the writer woken.
fn lift_protection(s: &Shared, child: &Child, addr: usize) {
    s.counters.child_wp_faults.fetch_add(1, Ordering::Relaxed);
    let block = BLOCK_PAGES * PAGE_SIZE;
    let start = addr & !(block - 1);
    if child.uffd.writeprotect(start, block, false, false).is_err() {
        // Part of the block is not registered in the child (an unmap, a region's edge):
        // the faulting page alone.
        let page_addr = addr & !(PAGE_SIZE - 1);
        if child.uffd.writeprotect(page_addr, PAGE_SIZE, false, false).is_err() {
            let _ = child.uffd.wake(page_addr, PAGE_SIZE);
        }
    }
}

/// A child reading its memory in order (a BGSAVE, a worker walking the data it inherited)
/// faults once per page, each a hand-off to this thread (~80 µs here): when its fault
/// continues its last one's block or the next, the rest of the block's fork-time pages come
/// in with it. Installed like the faulting page, without a wake (nobody waits on them).
fn install_around(s: &Shared, child: &mut Child, addr: usize, scratch: &mut IoBufs) {
    let block = BLOCK_PAGES * PAGE_SIZE;
    let start = addr & !(block - 1);
    let page_addr = addr & !(PAGE_SIZE - 1);
    let around: Vec<usize> =
        child.pages.range(start..start + block).map(|(&a, _)| a).filter(|&a| a != page_addr).collect();
    for a in around {
        if matches!(install(s, child, a, false, scratch), Install::Retry | Install::Gone) {
            // An event of the child's first (or it is gone): the faulting page settles it.
            return;
        }
    }
}

/// Installs the child's page at `addr` from its fork-time source (a zero page where it has
/// none), and wakes its waiters.
fn install(s: &Shared, child: &mut Child, addr: usize, write: bool, scratch: &mut IoBufs) -> Install {
    static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];
    let page_addr = addr & !(PAGE_SIZE - 1);
    if child.mailbox_pending && s.fork.children.link.as_ref().is_some_and(|l| l.is_mailbox_page(page_addr, child.gen)) {
        // Its mailbox, not a zero page: installed (waking the child) once it can be.
        return if child.retry_mailbox(s) { Install::Done } else { Install::Retry };
    }
    let src = child.pages.get(&page_addr).copied();
    let res = match src {
        Some(Src::Slot(slot)) => {
            let e = s.tiers.swap.lock(slot);
            let buf = scratch.page.as_mut_slice();
            let read = read_entry(s, slot, e, buf, &mut scratch.unit, &mut scratch.read);
            s.tiers.swap.unlock(slot, e, e);
            match read {
                Ok(true) => child.uffd.copy(page_addr, &scratch.page.as_slice()[..PAGE_SIZE], false, false),
                Ok(false) if write => child.uffd.copy(page_addr, &ZERO_PAGE, false, false),
                Ok(false) => child.uffd.zeropage(page_addr, PAGE_SIZE, false),
                Err(fail) => {
                    eprintln!(
                        "tierswap: a forked child's page at {page_addr:#x} cannot be read ({fail}); it gets SIGBUS"
                    );
                    child.uffd.poison(page_addr, PAGE_SIZE, false)
                }
            }
        }
        Some(Src::Copy(k)) => {
            child.uffd.copy(page_addr, &child.copies[k * PAGE_SIZE..(k + 1) * PAGE_SIZE], false, false)
        }
        None if write => child.uffd.copy(page_addr, &ZERO_PAGE, false, false),
        None => child.uffd.zeropage(page_addr, PAGE_SIZE, false),
    };
    let outcome = match res {
        Ok(_) => Install::Done,
        Err(uffd::Error::PageExist { .. }) => {
            let _ = child.uffd.wake(page_addr, PAGE_SIZE);
            Install::Exists
        }
        Err(uffd::Error::ProcessGone { .. }) => return Install::Gone,
        // An event of the child's is queued (read next round), or the range went away:
        // the thread faults again, or not at all.
        Err(uffd::Error::NoPage { .. } | uffd::Error::Invalid { .. }) => {
            let _ = child.uffd.wake(page_addr, PAGE_SIZE);
            return Install::NotMapped;
        }
        Err(_) => {
            let _ = child.uffd.wake(page_addr, PAGE_SIZE);
            return Install::Retry;
        }
    };
    if outcome == Install::Done {
        child.pieces.note_installed(page_addr);
    }
    // The child has its page: its reference goes.
    if src.is_some() {
        child.forget(s, page_addr);
        s.counters.child_faults.fetch_add(1, Ordering::Relaxed);
    }
    outcome
}

/// Handing over: installs up to 64 of the child's remaining pages. False once it has them
/// all, or its mm is gone.
fn hand_over_some(s: &Shared, child: &mut Child, scratch: &mut IoBufs) -> bool {
    let batch: Vec<usize> = child.pages.keys().take(64).copied().collect();
    if batch.is_empty() {
        return false;
    }
    for addr in batch {
        match install(s, child, addr, false, scratch) {
            Install::Done | Install::Exists => {}
            // Not mapped in the child (and no event on its way: that would be EAGAIN):
            // nothing to hand over there.
            Install::NotMapped => child.forget(s, addr),
            // Its events first, next round.
            Install::Retry => return true,
            Install::Gone => return false,
        }
    }
    true
}

impl Child {
    /// Whether piece `[lo, hi)` is due to the child's own pager.
    fn piece_due(&self, lo: usize, hi: usize) -> bool {
        self.pieces.due(lo, self.pages.range(lo..hi).count())
    }
}

/// Thread mode: a fault of the child's at `addr` was served; grants its piece once due.
fn note_fault(s: &Shared, child: &mut Child, addr: usize, scratch: &mut IoBufs) {
    if child.link.is_none() {
        return;
    }
    let Some((lo, hi)) = child.pieces.of(addr) else { return };
    child.pieces.note_fault(lo);
    if grant::crowded(s, child.pid, child.pieces.ungranted_bytes()) || child.piece_due(lo, hi) {
        grant(s, child, &[(lo, hi)], scratch);
    }
}

/// Thread mode, the child's own pager just linked: grants every piece due where the child
/// faulted or was given pages, in runs; the others (never touched: shared with the parent)
/// after them, a run at a time (`grant_deferred`).
fn grant_due(s: &Shared, child: &mut Child, scratch: &mut IoBufs) {
    let (due, later): (Vec<_>, Vec<_>) = child
        .pieces
        .all()
        .into_iter()
        .filter(|&(lo, hi)| child.piece_due(lo, hi))
        .partition(|&(lo, _)| child.pieces.touched(lo));
    child.deferred = later.into();
    let mut k = 0;
    while k < due.len() {
        let mut j = k + 1;
        while j < due.len() && due[j].0 == due[j - 1].1 && j - k < GRANT_MAX_PIECES {
            j += 1;
        }
        grant(s, child, &due[k..j], scratch);
        k = j;
    }
}

/// Hands the run of adjacent `pieces` over to the child's own pager: every fork-time page
/// of ours there is installed in the child, the range is unregistered from the child's
/// userfaultfd we hold (an ioctl on the child's mm, allowed from here), and the child's
/// pager is told to register it with its own and manage what is there. In between, the
/// range is plain memory: a missing page there reads zeros, which is what it holds, since
/// none of ours is left. Nothing is lost when anything fails: an install that must wait
/// keeps the run here (the next fault tries again); an unregister refused (the child
/// mapped something else there) keeps serving it; a grant the child never reads leaves
/// the range unmanaged, all its pages in place.
/// True once the grant is sent.
fn grant(s: &Shared, child: &mut Child, pieces: &[(usize, usize)], scratch: &mut IoBufs) -> bool {
    let (Some(&(lo, _)), Some(&(_, hi))) = (pieces.first(), pieces.last()) else { return false };
    let Some(fd) = child.link.as_ref().map(|f| f.as_raw_fd()) else { return false };
    let ours: Vec<usize> = child.pages.range(lo..hi).map(|(&a, _)| a).collect();
    for a in ours {
        match install(s, child, a, false, scratch) {
            Install::Done => {}
            Install::Exists | Install::NotMapped => child.forget(s, a),
            Install::Retry | Install::Gone => return false,
        }
    }
    for &(lo, _) in pieces {
        child.pieces.remove(lo);
    }
    if child.uffd.unregister(lo, hi - lo).is_err() {
        return false;
    }
    let sent = sys::send_msg_nowait(fd, &grant::message(lo, hi)).is_ok();
    if sent {
        s.counters.child_granted_pages.fetch_add(((hi - lo) / PAGE_SIZE) as u64, Ordering::Relaxed);
    }
    sent
}

/// Grants the next run of the child's deferred pieces (at most
/// [`grant::DEFERRED_RUN_PIECES`] adjacent ones still not granted and due); false when
/// nothing was sent.
fn grant_deferred(s: &Shared, child: &mut Child, scratch: &mut IoBufs) -> bool {
    child.last_deferred = Instant::now();
    let mut run: Vec<(usize, usize)> = Vec::with_capacity(grant::DEFERRED_RUN_PIECES);
    while let Some(&(lo, hi)) = child.deferred.front() {
        let adjacent = run.last().is_none_or(|&(_, end)| end == lo);
        if !adjacent || run.len() == grant::DEFERRED_RUN_PIECES {
            break;
        }
        child.deferred.pop_front();
        // Granted meanwhile at a fault there, or cut by an unmap: not this run's.
        if child.pieces.of(lo) == Some((lo, hi)) && child.piece_due(lo, hi) {
            run.push((lo, hi));
        } else if !run.is_empty() {
            break;
        }
    }
    !run.is_empty() && grant(s, child, &run, scratch)
}

/// Whether the child's mm is gone (its exit or exec): the zero-page probe.
fn gone(child: &Child) -> bool {
    matches!(child.uffd.zeropage(PROBE_ADDR, PAGE_SIZE, true), Err(uffd::Error::ProcessGone { .. }))
}

/// Answers the child's requests queued on its link. False once the child has closed it.
/// In thread mode the child sends nothing: its link is readable only once closed.
fn serve_requests(s: &Shared, child: &mut Child, scratch: &mut IoBufs) -> bool {
    let mut buf = [0u8; 16];
    if s.config.fault_mode == FaultMode::Thread {
        let Some(fd) = child.link.as_ref().map(|f| f.as_raw_fd()) else { return false };
        return match sys::recv_msg(fd, &mut buf, true) {
            Ok((0, _)) => false,
            Ok(_) => true,
            Err(e) => e.raw_os_error() == Some(libc::EAGAIN),
        };
    }
    loop {
        let Some(fd) = child.link.as_ref().map(|f| f.as_raw_fd()) else { return false };
        let (addr, flags) = match sys::recv_msg(fd, &mut buf, true) {
            Ok((16, _)) => (
                u64::from_ne_bytes(buf[..8].try_into().unwrap_or([0; 8])) as usize,
                u64::from_ne_bytes(buf[8..].try_into().unwrap_or([0; 8])),
            ),
            Ok((0, _)) => return false,
            Ok(_) => continue,
            Err(e) if e.raw_os_error() == Some(libc::EAGAIN) => return true,
            Err(_) => return false,
        };
        let write = flags & REQ_WRITE != 0;
        let reply = if flags & REQ_PRESENT != 0 {
            lift_protection(s, child, addr);
            REPLY_RETRY
        } else {
            if child.streams(addr) {
                install_around(s, child, addr, scratch);
            }
            match install(s, child, addr, write, scratch) {
                // A page there already, for a write: it can only be one the kernel keeps
                // write-protected for the child (see `lift_protection`).
                Install::Exists if write => {
                    lift_protection(s, child, addr);
                    REPLY_RETRY
                }
                Install::Done | Install::Exists | Install::Retry => REPLY_RETRY,
                Install::NotMapped | Install::Gone => REPLY_NOT_OURS,
            }
        };
        if sys::send_msg(fd, &reply.to_ne_bytes(), None).is_err() {
            return false;
        }
    }
}

/// The pid of the process whose thread is asking its parent's pager now (0: nobody). Other
/// threads of that process wait; a value of another pid was inherited mid-request by a
/// forked child, which takes it over.
static ASKING: AtomicI32 = AtomicI32::new(0);

/// In a forked child of a signal-mode pager, from its SIGBUS handler: asks the pager `s`
/// (the child's copy of the parent's pager) to serve the fault at `addr`. `link` is this
/// process's link to it (pid << 32 | socket, kept by the caller; another pid's is an
/// ancestor's). True: served, retry the access; false: not the pager's fault (pass it on).
/// Async-signal-safe: system calls and atomics only, nothing allocated, no lock of the
/// parent's taken.
pub(crate) fn ask_parent(s: &Shared, link: &AtomicU64, addr: usize, access: Option<(bool, bool)>) -> bool {
    let Some(l) = s.fork.children.link.as_ref() else { return false };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    loop {
        match ASKING.compare_exchange(0, pid, Ordering::Acquire, Ordering::Relaxed) {
            Ok(_) => break,
            Err(holder) if holder == pid => std::thread::yield_now(),
            Err(stale) => {
                if ASKING.compare_exchange(stale, pid, Ordering::Acquire, Ordering::Relaxed).is_ok() {
                    break;
                }
            }
        }
    }
    let answer = ask_locked(l, link, pid, addr, access);
    ASKING.store(0, Ordering::Release);
    answer
}

fn ask_locked(l: &Link, link: &AtomicU64, pid: i32, addr: usize, access: Option<(bool, bool)>) -> bool {
    let word = link.load(Ordering::Acquire);
    let fd = if word >> 32 == pid as u64 {
        (word & 0xffff_ffff) as i32
    } else {
        match connect(l, pid) {
            Some(fd) => {
                link.store((pid as u64) << 32 | fd as u32 as u64, Ordering::Release);
                fd
            }
            None => return false,
        }
    };
    let (write, present) = access.unwrap_or((true, false));
    let flags = if write { REQ_WRITE } else { 0 } | if present { REQ_PRESENT } else { 0 };
    let mut req = [0u8; 16];
    req[..8].copy_from_slice(&(addr as u64).to_ne_bytes());
    req[8..].copy_from_slice(&flags.to_ne_bytes());
    if sys::send_msg(fd, &req, None).is_err() {
        return false;
    }
    let mut rep = [0u8; 8];
    match sys::recv_msg(fd, &mut rep, false) {
        Ok((8, _)) => u64::from_ne_bytes(rep) == REPLY_RETRY,
        // The pager is gone, or refused this process (a grandchild).
        _ => false,
    }
}

/// Finds this process's mailbox page (the first whose claim is not an ancestor's, waiting
/// for a fork handler to fill it), claims it and sends the pager its hello. Returns this
/// process's end of the link.
fn connect(l: &Link, pid: i32) -> Option<i32> {
    let id = claim(l, pid)?;
    let (mine, theirs) = sys::seqpacket_pair().ok()?;
    let mut hello = [0u8; 24];
    hello[..8].copy_from_slice(&MAGIC.to_ne_bytes());
    hello[8..16].copy_from_slice(&id.to_ne_bytes());
    hello[16..].copy_from_slice(&(pid as u64).to_ne_bytes());
    sys::send_msg(l.hello_tx.as_raw_fd(), &hello, Some(theirs.as_raw_fd())).ok()?;
    drop(theirs);
    Some(mine.into_raw_fd())
}

/// Finds this process's mailbox page and writes `pid` into it as its claim (its own copy);
/// returns the id the page holds.
fn claim(l: &Link, pid: i32) -> Option<u64> {
    let start = Instant::now();
    let mut mb = [0u8; 24];
    let mut gen = 0;
    let id = loop {
        if gen >= MAILBOX_PAGES {
            // Deeper than the mailbox reaches: not served.
            return None;
        }
        let page = l.mailbox + gen * PAGE_SIZE;
        if sys::read_own_memory(page, &mut mb).ok() != Some(24) {
            // Not installed yet (this process is one generation below the last claimed
            // page, or deeper): its fork handler is on the way.
            if start.elapsed() > MAILBOX_WAIT {
                return None;
            }
            std::thread::sleep(Duration::from_micros(100));
            continue;
        }
        let word = |k: usize| u64::from_ne_bytes(mb[k * 8..k * 8 + 8].try_into().unwrap_or([0; 8]));
        let (magic, id, claim) = (word(0), word(1), word(2));
        if magic != MAGIC || id == 0 {
            return None;
        }
        if claim != 0 && claim != pid as u64 {
            // An ancestor's page: ours is further on.
            gen += 1;
            continue;
        }
        // SAFETY: the mailbox page is present in this process (read just above), private
        // to it (a copy a fork handler installed), and nothing else of it uses the page.
        unsafe { std::ptr::write_volatile((page + 16) as *mut u64, pid as u64) };
        break id;
    };
    Some(id)
}

/// Before a forked child of a signal-mode pager forks in turn: claims its mailbox, so that
/// its own child, which inherits the claim, is not taken for it. Async-signal-safe.
pub(crate) fn claim_before_fork(s: &Shared, link: &AtomicU64) {
    let Some(l) = s.fork.children.link.as_ref() else { return };
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if link.load(Ordering::Acquire) >> 32 == pid as u64 {
        return;
    }
    if let Some(fd) = connect(l, pid) {
        link.store((pid as u64) << 32 | fd as u32 as u64, Ordering::Release);
    }
}

/// Thread mode, in a forked child starting a pager of its own: links this process to the
/// server of the pager `s` (the child's copy of its parent's pager), which from then on
/// grants it the inherited memory the child has taken in (see [`grant`]). `None`: no link
/// (the parent's pager is not in a tree, or its server did not install this process's
/// mailbox in time); the inherited memory then stays served by the parent's pager.
pub(crate) fn link_to_parent(s: &Shared) -> Option<OwnedFd> {
    let l = s.fork.children.link.as_ref()?;
    // SAFETY: getpid has no preconditions.
    let fd = connect(l, unsafe { libc::getpid() })?;
    // SAFETY: `connect` returns a fresh descriptor that nothing else owns.
    Some(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// Thread mode, before a forked child without a pager of its own forks in turn: claims
/// its mailbox page (without a hello), so its own child, which inherits the claim, does not
/// take the page for its own and link to this child's server.
pub(crate) fn claim_before_own_pager(s: &Shared) {
    if let Some(l) = s.fork.children.link.as_ref() {
        // SAFETY: getpid has no preconditions.
        let _ = claim(l, unsafe { libc::getpid() });
    }
}
