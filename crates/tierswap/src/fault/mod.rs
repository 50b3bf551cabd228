//! The swap-in path: fault threads read the userfaultfd and serve each missing-page fault
//! from wherever the page is: first touch (zero page), staging (move back), or a swap slot
//! (zero / same-filled / pool / file, then UFFDIO_COPY).
//!
//! A fault thread serves one fault at a time under the pte lock, so a page is swapped in
//! once however many threads touch it; a second message for the same page finds it present
//! and only wakes the waiters. The faults of several program threads read together still
//! have their file reads in flight together ([`BatchReads`]): the reads go out ahead, the
//! faults are served one by one. Nothing here allocates on the fault path: each thread owns
//! its buffers.

mod ahead;
mod first_touch;
pub(crate) mod signal;
mod staged;
mod swapin;
mod wp;

use crate::reclaim::direct::wait_for_room;
use ahead::{prefetch_stride, read_ahead, readahead_range};
use first_touch::{first_touch_around, install_zero};
use staged::unstage_around;
use swapin::{arm_poison, swap_in, Planned};
use wp::handle_wp_fault;

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::file::AlignedBuf;
use crate::mm::swap_io::IoBufs;
use crate::mm::{Lookup, Shared};
use crate::page::PAGE_SIZE;
use crate::pagetable::{Pte, PteState};
use crate::swap::Tag;
use crate::sys::{self, fatal, pin_to_cpu};
use crate::uffd::{self, Event};

/// Per-thread buffers of the fault path.
pub(crate) struct Scratch {
    /// Reading swapped pages back.
    pub(crate) io: IoBufs,
    /// The pages of a swap-in being assembled for UFFDIO_COPY (up to the largest swap-in).
    range: AlignedBuf,
    /// Per page of the swap-in range: what happens to it.
    plan: Vec<Planned>,
    /// Serving in the faulting thread (signal mode): no readahead after the fault, which
    /// would delay the program instead of running beside it.
    pub(crate) in_thread: bool,
    /// A fault thread's direct reclaim, when configured (thread mode only).
    direct: Option<crate::reclaim::DirectReclaim>,
}

impl Scratch {
    pub(crate) fn new(unit_bytes: usize, swapin_max_pages: u32) -> std::io::Result<Scratch> {
        let max_pages = swapin_max_pages.max(1) as usize;
        Ok(Scratch {
            io: IoBufs::new(unit_bytes, max_pages)?,
            range: AlignedBuf::new(max_pages * PAGE_SIZE)?,
            plan: Vec::with_capacity(max_pages),
            in_thread: false,
            direct: None,
        })
    }
}

/// The fault thread's loop.
pub(crate) fn fault_thread(s: Arc<Shared>, index: usize) {
    if s.config.fault_pin {
        pin_to_cpu(index, "fault thread");
    }
    s.wake.watch.register(index);
    if s.config.file_read_spin_us > 0 && s.config.tiers.file && index < crate::ioring::MAX_RINGS {
        let spin = Duration::from_micros(s.config.file_read_spin_us as u64);
        match crate::ioring::spin_reads(spin) {
            Ok(()) => crate::ioring::yield_while_polling(s.config.file_read_yield),
            Err(e) => {
                // Said once a process (io_uring may be off for all: a container's seccomp
                // profile, kernel.io_uring_disabled).
                static SAID: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);
                if !SAID.swap(true, Ordering::Relaxed) {
                    eprintln!("tierswap: fault threads read the swap file with pread, not polled: no io_uring ({e})");
                }
            }
        }
    }
    // When this thread, leading, next looks where the program runs (mm/watch.rs).
    let mut next_look = Instant::now();
    let mut scratch = match Scratch::new(s.config.file_unit_bytes, s.config.swapin_max_pages) {
        Ok(b) => b,
        Err(e) => fatal(&format!("a fault thread cannot map its buffers: {e}")),
    };
    // Room for what a fork's wait reads before anything is handled (forkgate.rs): one
    // message per program thread blocked in a fault or an event, and the fork's own.
    let mut events = Vec::with_capacity(FORK_WAIT_MESSAGES);
    let mut mirror_events = Vec::with_capacity(64);
    let spin = Duration::from_micros(s.config.fault_spin_us as u64);
    // When this thread last served something: it polls without sleeping until `spin` after.
    let mut last_served: Option<Instant> = None;
    if s.config.reclaims_directly() {
        match crate::reclaim::DirectReclaim::new(s.clone()) {
            Ok(d) => scratch.direct = Some(d),
            Err(e) => {
                eprintln!("tierswap: fault thread {index} will not reclaim directly: cannot map its buffers: {e}")
            }
        }
    }
    let fds = [s.uffd.as_raw_fd(), s.mirror_uffd.as_raw_fd(), s.wake.stop_fd.as_raw_fd()];
    // Every allocation of this thread's start is behind it: a fork may begin now.
    s.fault_thread_started();
    while !s.wake.shutdown.load(Ordering::Acquire) {
        if !s.wake.watch.polls(index) {
            // A mirror fault (a hole the leader's direct reclaim reads, say) is served by
            // whoever is free: followers wait on the mirrors' userfaultfd too.
            if s.wake.watch.sleep(index, s.mirror_uffd.as_raw_fd(), s.wake.stop_fd.as_raw_fd()) {
                serve_mirror_faults(&s, &mut mirror_events);
            }
            last_served = None;
            continue;
        }
        let spinning = last_served.is_some_and(|t| t.elapsed() < spin);
        let mut mirror = spinning;
        if !spinning {
            match uffd::poll_fds(&fds, 200) {
                Ok(ready) if ready & 0b011 != 0 => mirror = ready & 0b010 != 0,
                Ok(_) => continue,
                Err(e) => fatal(&format!("polling the userfaultfd failed: {e}")),
            }
        }
        if mirror {
            serve_mirror_faults(&s, &mut mirror_events);
        }
        let Some(_busy) = crate::forkgate::try_enter() else {
            fork_wait(&s, &mut events, &mut mirror_events, &mut scratch);
            continue;
        };
        events.clear();
        {
            // Events are read and handled one reader at a time, in queue order (events/mod.rs).
            let _ev = s.gates.event_lock.lock().unwrap_or_else(|e| e.into_inner());
            match s.read_program_events(&mut events, 64, spinning) {
                Ok(0) if spinning => {
                    std::hint::spin_loop();
                    continue;
                }
                Ok(_) => {}
                Err(e) => fatal(&format!("reading the userfaultfd failed: {e}")),
            }
            handle_non_faults(&s, &mut events);
        }
        if !spin.is_zero() && !events.is_empty() {
            last_served = Some(Instant::now());
        }
        if s.wake.watch.note(index, &events) {
            s.counters.fault_follow_all.fetch_add(1, Ordering::Relaxed);
        }
        let mut reads = BatchReads::begin(&s, &events);
        let mut served_tid = 0;
        let mut i = 0;
        while i < events.len() {
            let ev = std::mem::replace(&mut events[i], Event::Unknown(0));
            i += 1;
            if let Event::PageFault { tid, .. } = ev {
                served_tid = tid;
            }
            serve_fault_event(&s, ev, &mut scratch);
            if let Some(b) = reads.as_mut().filter(|b| b.started > 0) {
                if events.len() < REFILL_MESSAGES {
                    refill(&s, index, &mut events);
                }
                b.start(&s, &events, i);
            }
        }
        events.clear();
        if let Some(b) = reads {
            b.finish(&s);
        }
        if s.wake.watch.follow(index, served_tid, &mut next_look) {
            s.counters.fault_follow_moves.fetch_add(1, Ordering::Relaxed);
        }
    }
}

/// The file reads a batch of faults started ahead of serving them
/// (`PagerConfig::file_batch_reads`): when one read of the userfaultfd brought the faults of
/// several program threads, the file reads of their swapped pages go out together, so that
/// the disk serves them side by side while the faults are served one by one as before, each
/// taking its record's bytes from its read (`FileTier::read_ahead_record`). As faults are
/// served, reads start for the next ones, up to `file_batch_reads` outstanding. A page that
/// changes meanwhile (served by another thread, written back elsewhere) leaves its read
/// unused; those are forgotten when the batch ends.
struct BatchReads {
    /// Messages before this one have been looked at for a read.
    next: usize,
    /// Reads started.
    started: u64,
    /// This thread's reads served from reads ahead before the batch (`ioring::aheads_taken`).
    taken_before: u64,
}

impl BatchReads {
    /// Starts the batch's first reads if it holds faults of two threads or more (two
    /// messages) and the thread reads on a ring; `None` otherwise.
    fn begin(s: &Shared, events: &[Event]) -> Option<BatchReads> {
        if s.config.file_batch_reads == 0 || s.tiers.file.is_none() || !crate::ioring::spins() {
            return None;
        }
        if events.iter().filter(|e| matches!(e, Event::PageFault { wp: false, .. })).count() < 2 {
            return None;
        }
        let mut b = BatchReads { next: 0, started: 0, taken_before: crate::ioring::aheads_taken() };
        b.start(s, events, 0);
        Some(b)
    }

    /// Starts the reads of the faults from `next` on (none before `served`, the messages
    /// served already) while fewer than `file_batch_reads` are outstanding.
    fn start(&mut self, s: &Shared, events: &[Event], served: usize) {
        let Some(file) = s.tiers.file.as_ref() else { return };
        let max = s.config.file_batch_reads as usize;
        self.next = self.next.max(served);
        while self.next < events.len() && crate::ioring::aheads_outstanding() < max {
            let at = self.next;
            self.next += 1;
            let Event::PageFault { addr, wp: false, .. } = events[at] else { continue };
            let Lookup::Region(r, idx) = s.lookup(addr & !(PAGE_SIZE - 1)) else { continue };
            let pte = r.ptes.load(idx);
            if pte.state() != PteState::Swapped || pte.locked() {
                continue;
            }
            let slot = pte.slot();
            let e = s.tiers.swap.load(slot);
            if e.tag() != Tag::File {
                continue;
            }
            let (offset, len) = e.addr_len();
            if file.read_ahead_record(offset, len, || s.tiers.swap.load(slot) == e && r.ptes.load(idx) == pte) {
                self.started += 1;
            }
        }
    }

    /// Forgets the reads no fault took and counts the batch's.
    fn finish(self, s: &Shared) {
        if self.started == 0 {
            return;
        }
        crate::ioring::forget_ahead();
        let used = crate::ioring::aheads_taken() - self.taken_before;
        s.counters.file_reads_batched.fetch_add(self.started, Ordering::Relaxed);
        s.counters.file_reads_batched_used.fetch_add(used, Ordering::Relaxed);
    }
}

// Every read `file_batch_reads` allows has a read-ahead buffer.
const _: () = assert!(crate::config::MAX_BATCH_READS as usize <= crate::ioring::AHEAD_SLOTS);

/// Messages a batch whose file reads go out together may grow to (see [`refill`]).
const REFILL_MESSAGES: usize = 64;

/// While a batch's file reads are in flight, the threads served first fault again before
/// the batch ends: reads the messages queued since (without waiting, and only if no other
/// thread is reading) and handles their events; their faults join the batch after those
/// already in it (as within one read, the events read with them are handled before them),
/// and their file reads start as the batch's outstanding ones are taken ([`BatchReads`]),
/// so the disk keeps several reads of the program's threads in flight.
fn refill(s: &Arc<Shared>, index: usize, events: &mut Vec<Event>) {
    let before = events.len();
    {
        let Some(_ev) = try_lock(&s.gates.event_lock) else { return };
        let room = REFILL_MESSAGES - before;
        match s.read_program_events(events, room, true) {
            Ok(0) => return,
            Ok(_) => {}
            Err(e) => fatal(&format!("reading the userfaultfd failed: {e}")),
        }
        handle_non_faults(s, &mut events[before..]);
    }
    if s.wake.watch.note(index, &events[before..]) {
        s.counters.fault_follow_all.fetch_add(1, Ordering::Relaxed);
    }
}

/// Messages a fault thread can hold while a fork holds the gate.
const FORK_WAIT_MESSAGES: usize = 256;

/// A fork is closing the gate (forkgate.rs): no allocation until it is done. Once the
/// busy sections have ended, hold the event lock and read messages, the fork's included,
/// into room `events` already has; when the gate opens, handle them in queue order (the
/// fork snapshot before any fault, so no page changes between the fork and its snapshot).
/// A fault of the forking thread itself is served at once (malloc is free while it runs).
fn fork_wait(s: &Arc<Shared>, events: &mut Vec<Event>, mirror_events: &mut Vec<Event>, scratch: &mut Scratch) {
    crate::forkgate::wait_while_closing();
    if !crate::forkgate::is_closed() {
        return;
    }
    let mut ev_lock = s.gates.event_lock.lock().unwrap_or_else(|e| e.into_inner());
    events.clear();
    let fds = [s.uffd.as_raw_fd(), s.mirror_uffd.as_raw_fd()];
    let mut forks = 0;
    let busy = loop {
        if let Some(b) = crate::forkgate::enter_unless_closed() {
            break b;
        }
        // Until the gate opens, glibc may hold malloc's locks: nothing here allocates.
        let no_alloc = crate::inject::no_alloc();
        let ready = uffd::poll_fds(&fds, 1).unwrap_or(0);
        if ready & 0b10 != 0 {
            serve_mirror_faults(s, mirror_events);
        }
        let room = events.capacity() - events.len();
        if ready & 0b01 != 0 && room > 0 {
            let before = events.len();
            // Faults served in the faulting threads (signal mode) wait for the snapshot of
            // every fork read here. The kernel lets a fork return the moment its message is
            // read, and the forker then opens the gate: the hold goes up before the read,
            // so that no such fault is served between the read and the count below (its
            // page would be present in the snapshot and missing in the child: zeros).
            s.fork.hold.fetch_add(1, Ordering::SeqCst);
            if s.read_program_events(events, room.min(64), false).is_ok() {
                let new_forks = events[before..].iter().filter(|e| matches!(e, Event::Fork { .. })).count();
                s.fork.hold.fetch_add(new_forks as u32, Ordering::SeqCst);
                forks += new_forks;
            }
            s.fork.hold.fetch_sub(1, Ordering::SeqCst);
        }
        let forker = crate::forkgate::forker();
        let forker_faulted =
            forker != 0 && events.iter().any(|e| matches!(e, Event::PageFault { tid, .. } if *tid as i32 == forker));
        if forker_faulted || s.fork.forker_waiting.load(Ordering::SeqCst) {
            // The forking thread runs in user space (a fork handler, before or after the
            // fork itself), so malloc is free: handle the events read so far, the fork
            // snapshot included, then serve its fault. Other threads' faults wait.
            drop(no_alloc);
            handle_non_faults(s, events);
            s.fork.hold.fetch_sub(forks as u32, Ordering::SeqCst);
            forks = 0;
            s.fork.forker_waiting.store(false, Ordering::SeqCst);
            if forker_faulted {
                // Without the event lock: serving may look for a region under it.
                drop(ev_lock);
                for ev in events.iter_mut() {
                    if matches!(ev, Event::PageFault { tid, .. } if *tid as i32 == forker) {
                        serve_fault_event(s, std::mem::replace(ev, Event::Unknown(0)), scratch);
                    }
                }
                ev_lock = s.gates.event_lock.lock().unwrap_or_else(|e| e.into_inner());
            }
        }
    };
    handle_non_faults(s, events);
    s.fork.hold.fetch_sub(forks as u32, Ordering::SeqCst);
    drop(ev_lock);
    for ev in events.drain(..) {
        serve_fault_event(s, ev, scratch);
    }
    drop(busy);
}

/// Handles the non-fault events of `events` in order, leaving `Unknown` in their place,
/// and then unmarks the regions their reads marked leaving. The caller holds the event
/// lock, and `events` holds everything read since the last call.
fn handle_non_faults(s: &Arc<Shared>, events: &mut [Event]) {
    for ev in events.iter_mut() {
        if !matches!(ev, Event::PageFault { .. } | Event::Unknown(_)) {
            let ev = std::mem::replace(ev, Event::Unknown(0));
            crate::events::handle_event(s, ev);
        }
    }
    s.unmark_leaving();
}

fn serve_fault_event(s: &Shared, ev: Event, scratch: &mut Scratch) {
    match ev {
        Event::PageFault { addr, wp: true, .. } => handle_wp_fault(s, addr),
        Event::PageFault { addr, write, .. } => handle_fault(s, addr, write, scratch),
        _ => {}
    }
}

/// Serves faults on mirrors: only the pager reads mirrors, and only pages it staged; a
/// hole there means the page was zero (it read as such before staging).
fn serve_mirror_faults(s: &Shared, events: &mut Vec<Event>) {
    // Also while a fork holds the gate: nothing here allocates.
    let _no_alloc = crate::inject::no_alloc();
    events.clear();
    if s.mirror_uffd.read_events(events, 64).is_err() {
        return;
    }
    for ev in events.drain(..) {
        if let Event::PageFault { addr, .. } = ev {
            let page_addr = addr & !(PAGE_SIZE - 1);
            match s.mirror_uffd.zeropage(page_addr, PAGE_SIZE, false) {
                Ok(_) => {}
                Err(_) => {
                    let _ = s.mirror_uffd.wake(page_addr, PAGE_SIZE);
                }
            }
        }
    }
}

pub(super) fn handle_fault(s: &Shared, addr: usize, write: bool, scratch: &mut Scratch) {
    crate::inject::fault_stall();
    let t0 = Instant::now();
    let page_addr = addr & !(PAGE_SIZE - 1);
    let (r, idx) = match s.lookup(page_addr) {
        Lookup::Region(r, idx) => (r, idx),
        Lookup::Unknown => {
            unknown_fault(s, page_addr, write);
            return;
        }
    };
    // Make room before adding a page, not while holding its lock.
    let cur = r.ptes.load(idx);
    if cur.state() != PteState::Present && cur.state() != PteState::Staged {
        wait_for_room(s, scratch.direct.as_mut());
    }
    let old = r.ptes.lock(idx);
    match old.state() {
        PteState::None if !s.maps(&r, page_addr) => {
            // The region lost this page to an UNMAP / REMAP handled since our lookup, and
            // the address may belong to a new mapping by now: fault again and find it.
            r.ptes.unlock(idx, old, old);
            s.wake(page_addr, PAGE_SIZE);
        }
        PteState::None => {
            if !install_zero(s, Some(&r), page_addr, write, true) {
                // The range is going away (munmap, mremap): nothing was installed.
                r.ptes.unlock(idx, old, old);
                return;
            }
            s.acct.present_pages.fetch_add(1, Ordering::Relaxed);
            s.counters.faults_first_touch.fetch_add(1, Ordering::Relaxed);
            let around = first_touch_around(s, &r, idx, write);
            r.ptes.unlock(idx, old, Pte::present());
            finish_fault(s, t0);
            s.wake(page_addr, (1 + around) * PAGE_SIZE);
        }
        PteState::Present if old.is_poisoned() => {
            // A message queued before the page was poisoned (a range wake let its thread
            // fault again): re-arm the marker (EEXIST: still there) and let it take SIGBUS.
            // A zero page here would quietly turn a lost page into zeros.
            arm_poison(s, &r, page_addr);
            s.wake(page_addr, PAGE_SIZE);
            r.ptes.unlock(idx, old, old);
        }
        PteState::Present => {
            // Already served (a second message for the page), or the program discarded it:
            // either way a zero page is right, and EEXIST tells us it was the former.
            install_zero(s, Some(&r), page_addr, write, false);
            r.ptes.unlock(idx, old, old);
        }
        PteState::Staged => {
            r.ptes.unlock(idx, old, old);
            let woken = unstage_around(s, &r, idx);
            s.counters.faults_staged.fetch_add(1, Ordering::Relaxed);
            finish_fault(s, t0);
            if let Some((from, to)) = woken {
                s.wake(r.page_addr(from), (to - from) * PAGE_SIZE);
            }
        }
        PteState::Swapped => {
            let (tag, first, n) = swap_in(s, &r, idx, old, write, scratch);
            finish_fault(s, t0);
            // The program runs again only now: its pte and the counters are final.
            s.wake(r.page_addr(first), n * PAGE_SIZE);
            // The program runs again already; bring in its likely next pages meanwhile.
            let prefetched = n == 1 && !scratch.in_thread && prefetch_stride(s, &r, idx, scratch);
            if tag == Some(Tag::File) && n == 1 && !scratch.in_thread && !prefetched {
                // Read the disk pages around it meanwhile.
                // (A large swap-in is its own prefetch: reading ahead past it would stage
                // the stream's next pages, each then costing a fault of its own.)
                let window = r.ra.next(idx, r.hint, s.config.readahead_max_pages);
                if window <= 1 {
                    s.counters.swap_ra_off.fetch_add(1, Ordering::Relaxed);
                } else {
                    let large = s.config.swapin_policy != crate::SwapinPolicy::Order0
                        && s.config.swapin_max_pages > 1
                        && r.hint != crate::config::Hint::Random;
                    let (from, to) = readahead_range(idx, window as usize, r.n_pages, large);
                    if from < to {
                        read_ahead(s, &r, from, to, scratch);
                    }
                }
            }
        }
    }
}

/// The mutex's guard if it is free (a poisoned one too: a copy is checked on every use).
pub(super) fn try_lock<T>(m: &std::sync::Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

fn finish_fault(s: &Shared, t0: Instant) {
    s.counters.faults.fetch_add(1, Ordering::Relaxed);
    s.counters.record_fault_latency(t0.elapsed().as_micros() as u64);
    if s.footprint_bytes() > s.high_watermark() {
        s.kick_reclaim();
    }
}

/// A fault on registered memory the map does not know. Once any event being handled is
/// done (the event lock), look again: a REMAP may have just created its region. Still
/// unknown: memory an mremap grew (the kernel reports only the old length: its mapping
/// holds a region too), which gets a zero page and stays unmanaged. Anything else is a
/// message that outlived its page: queued before the program unmapped or moved it, read
/// after, when the address may be another mapping's by now (a new region not in the map
/// yet, reclaim's staging window), where a zero page would land over its bytes. That one
/// is only woken.
fn unknown_fault(s: &Shared, page_addr: usize, write: bool) {
    {
        let _ev = s.gates.event_lock.lock().unwrap_or_else(|e| e.into_inner());
    }
    if let Lookup::Region(..) = s.lookup(page_addr) {
        // Managed now: let the thread fault again and be served as usual.
        s.wake(page_addr, PAGE_SIZE);
        return;
    }
    let grown = sys::vma_of(page_addr)
        .is_some_and(|(a, b)| !s.regions.map.read().unwrap_or_else(|e| e.into_inner()).overlapping(a, b).is_empty());
    if !grown {
        s.trail.mark(crate::trail::What::Stale, page_addr, page_addr + PAGE_SIZE, 0, 0);
        s.counters.faults_stale.fetch_add(1, Ordering::Relaxed);
        s.wake(page_addr, PAGE_SIZE);
        return;
    }
    if install_zero(s, None, page_addr, write, false) {
        s.counters.faults_unmanaged.fetch_add(1, Ordering::Relaxed);
    }
}

/// Handles the outcome of an install: EEXIST means the page is there already (wake the
/// waiters ourselves, the kernel did not), EAGAIN is retried.
pub(super) fn settle_install(s: &Shared, addr: usize, res: uffd::Result<usize>) -> bool {
    match res {
        Ok(_) => true,
        Err(uffd::Error::PageExist { .. }) => {
            s.wake(addr, PAGE_SIZE);
            true
        }
        Err(uffd::Error::ProcessGone { .. }) => false,
        Err(e) => {
            // The address is no longer mapped (region dropped) or the mm is changing; wake
            // whoever waits so that it retries the access.
            s.wake(addr, PAGE_SIZE);
            // EAGAIN: an event is queued; the woken thread faults again after it.
            if !matches!(e, uffd::Error::NoPage { .. } | uffd::Error::Invalid { .. } | uffd::Error::Again { .. }) {
                eprintln!("tierswap: installing a page at {addr:#x} failed: {e}");
            }
            false
        }
    }
}
