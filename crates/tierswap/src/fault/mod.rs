//! The swap-in path: fault threads read the userfaultfd and serve each missing-page fault
//! from wherever the page is: first touch (zero page), staging (move back), or a swap slot
//! (zero / same-filled / pool / file, then UFFDIO_COPY).
//!
//! A fault thread serves one fault at a time under the pte lock, so a page is swapped in
//! once however many threads touch it; a second message for the same page finds it present
//! and only wakes the waiters. Nothing here allocates on the fault path: each thread owns
//! its buffers.

pub(crate) mod signal;

use std::os::fd::AsRawFd;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::file::{record_bytes, AlignedBuf, UnitCache};
use crate::backend::remote::RemotePrefetch;
use crate::config::MAX_FAULT_AROUND_PAGES;
use crate::mm::slots::{free_backend, put_slot, release_entry};
use crate::mm::swap_io::{read_entry, IoBufs, ReadFail};
use crate::mm::{Lookup, RegionInner, Shared};
use crate::page::{BLOCK_PAGES, PAGE_SIZE};
use crate::pagetable::{Pte, PteState};
use crate::policy::admission::range_of;
use crate::swap::{SwapEntry, Tag};
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
    // When this thread, leading, next looks where the program runs (watch.rs).
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
            // Events are read and handled one reader at a time, in queue order (events.rs).
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
        let mut served_tid = 0;
        for ev in events.drain(..) {
            if let Event::PageFault { tid, .. } = ev {
                served_tid = tid;
            }
            serve_fault_event(&s, ev, &mut scratch);
        }
        if s.wake.watch.follow(index, served_tid, &mut next_look) {
            s.counters.fault_follow_moves.fetch_add(1, Ordering::Relaxed);
        }
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
            if s.read_program_events(events, room.min(64), false).is_ok() {
                let new_forks = events[before..].iter().filter(|e| matches!(e, Event::Fork { .. })).count();
                if new_forks > 0 {
                    // Faults served in the faulting threads wait for the snapshot.
                    s.fork.hold.fetch_add(new_forks as u32, Ordering::SeqCst);
                    forks += new_forks;
                }
            }
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

fn handle_fault(s: &Shared, addr: usize, write: bool, scratch: &mut Scratch) {
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

/// One page of a swap-in range, from probe to install.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Planned {
    /// The pte as locked (unlocked form); `None` when the page is not part of the swap-in.
    pte: Option<Pte>,
    /// The entry as locked.
    entry: SwapEntry,
    /// What the bytes are once read.
    kind: Kind,
    /// Keep the slot: the page comes in clean and write-protected.
    keep: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    /// Not part of the swap-in (left as it was).
    Skip,
    /// Read: bytes in the range buffer.
    Data,
    /// A zero page (mapped with UFFDIO_ZEROPAGE).
    Zero,
    /// Unreadable: the faulting page gets SIGBUS; a neighbour is left for its own fault.
    Failed,
}

impl Planned {
    const SKIP: Planned = Planned { pte: None, entry: SwapEntry::FREE, kind: Kind::Skip, keep: false };
}

/// Serves a fault on swapped page `idx` (its pte locked, `old`): admission picks how many
/// pages come in; every page of that range still swapped is read from its own backend
/// (mixed ranges: pool, zero, same-filled and file pages side by side, the file's records
/// from one read) and the range is installed in as few ioctls as its runs allow. Wakes
/// nobody: the caller wakes `[first, first + n)` once its bookkeeping is done. Returns the
/// tier the faulting page came from, `first` and `n`.
fn swap_in(
    s: &Shared,
    r: &RegionInner,
    idx: usize,
    old: Pte,
    write: bool,
    scratch: &mut Scratch,
) -> (Option<Tag>, usize, usize) {
    let c = &s.config;
    let d = r.locality.decide(idx, r.hint, c.swapin_policy, c.swapin_max_pages, c.swapin_learn_blocks);
    if d.vetoed {
        s.counters.swpin_large_veto.fetch_add(1, Ordering::Relaxed);
    }
    let mut pages = d.pages;
    if pages as usize > BLOCK_PAGES && !mostly_swapped(s, r, range_of(idx, pages, r.n_pages)) {
        // A large window over memory that is mostly in already: the 64 KiB block will do.
        pages = BLOCK_PAGES as u32;
    }
    let (first, end) = if pages > 1 { range_of(idx, pages, r.n_pages) } else { (idx, idx + 1) };
    let n = end - first;
    // The file copy of the fault threads, shared: the next fault of a stream is often
    // served by the other thread. Taken only if free (else this thread's own); signal
    // mode keeps one per buffer, as its faulting threads run independent streams.
    let mut shared_unit = if scratch.in_thread { None } else { s.tiers.unit_cache.as_ref().and_then(try_lock) };
    let unit = match shared_unit.as_deref_mut() {
        Some(c) => c,
        None => &mut scratch.io.unit,
    };
    // Whole units when a readahead follows this lone page (which wants them); else what
    // the copy has learnt (see UnitCache).
    unit.whole = n == 1 && !scratch.in_thread && r.ra.window() > 1;
    let plan = &mut scratch.plan;
    plan.clear();
    plan.resize(n, Planned::SKIP);

    // Probe: a snapshot of which neighbours are swapped and where their bytes are, taken
    // without locks; then lock the ones still in the same place. A slot whose backend
    // changed between the two (written back, drained) is left for its own fault.
    let mut snapshot = [Tag::Free; crate::config::MAX_SWAPIN_PAGES as usize];
    if n > 1 {
        for j in first..end {
            let p = r.ptes.load(j);
            if j != idx && p.state() == PteState::Swapped && !p.locked() {
                snapshot[j - first] = s.tiers.swap.load(p.payload()).tag();
            }
        }
    }
    let mut fallback = 0u64;
    // File bytes of the range's records.
    let mut need = (u64::MAX, 0u64);
    let pool_roomy = pool_roomy(s);
    // Remote pages of the range come in one round trip per node, fetched before any entry
    // is locked; each is opened against its locked entry (slot and version) when read below.
    scratch.io.remote.clear();
    if let Some(remote) = s.tiers.remote.as_ref() {
        let mut wants = [(0u64, 0usize); crate::config::MAX_SWAPIN_PAGES as usize];
        let mut w = 0;
        for j in first..end {
            let slot = if j == idx { old.payload() } else { r.ptes.load(j).payload() };
            if j != idx && snapshot[j - first] != Tag::Remote {
                continue;
            }
            let e = s.tiers.swap.load(slot);
            if e.tag() == Tag::Remote {
                wants[w] = e.addr_len();
                w += 1;
            }
        }
        if w > 1 {
            remote.prefetch(&wants[..w], &mut scratch.io.remote, &s.counters);
        }
    }
    for j in first..end {
        let k = j - first;
        let (pte, e) = if j == idx {
            (old, s.tiers.swap.lock(old.payload()))
        } else {
            if !snapshot[k].in_memory() && snapshot[k] != Tag::File && snapshot[k] != Tag::Remote {
                continue;
            }
            let Some(p) = r.ptes.try_lock_in(j, PteState::Swapped) else {
                continue;
            };
            let slot = p.payload();
            let e = match s.tiers.swap.try_lock(slot) {
                // A remote neighbour comes only from the range's prefetch: it never waits
                // for a round trip (or retries) of its own.
                Some(e) if e.tag() == Tag::Remote && !scratch.io.remote.holds(e.addr_len().0) => {
                    s.tiers.swap.unlock(slot, e, e);
                    r.ptes.unlock(j, p, p);
                    continue;
                }
                Some(e) if e.tag() == snapshot[k] && e.count() == 1 => e,
                other => {
                    if let Some(e) = other {
                        s.tiers.swap.unlock(slot, e, e);
                    }
                    r.ptes.unlock(j, p, p);
                    fallback += 1;
                    continue;
                }
            };
            (p, e)
        };
        plan[k] = Planned { pte: Some(pte), entry: e, kind: Kind::Skip, keep: false };
        if e.tag() == Tag::File {
            let (off, len) = e.addr_len();
            need = (need.0.min(off), need.1.max(off + record_bytes(len) as u64));
        }
    }

    // The file records of the range in one read where they lie together: those of a large
    // swap-in, or a lone fault's and (when that has paid) the rest of its block's.
    if let (Some(file), true) = (s.tiers.file.as_ref(), need.0 < need.1) {
        let (block, witness) = if n == 1 && unit.wants_block() {
            block_records(s, r, idx, need, file.unit_bytes() as u64)
        } else {
            (need, None)
        };
        match file.fill(unit, need, block) {
            Ok(reads) => {
                s.counters.file_unit_reads.fetch_add(reads as u64, Ordering::Relaxed);
            }
            // Counted; the records are read again one by one below, and a fault whose
            // own record still cannot be read is reported there.
            Err(_) => {
                s.counters.read_errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        if let Some((slot, e)) = witness {
            s.tiers.swap.unlock(slot, e, e);
        }
    }

    for (k, planned) in plan.iter_mut().enumerate() {
        let Planned { pte: Some(pte), entry: e, .. } = *planned else { continue };
        let j = first + k;
        let slot = pte.payload();
        let buf = &mut scratch.range.as_mut_slice()[k * PAGE_SIZE..(k + 1) * PAGE_SIZE];
        let kind = match read_entry(s, slot, e, buf, unit, &mut scratch.io.compressed, &scratch.io.remote) {
            Ok(true) => Kind::Data,
            Ok(false) => Kind::Zero,
            Err(fail) if j == idx && !s.is_leaving(r) => {
                poison(s, r, r.page_addr(idx), slot, &fail);
                Kind::Failed
            }
            Err(_) => {
                // Left swapped: its own fault reports it. So is the faulting page while an
                // event read but not handled concerns its region: a REMOVE in hand discards
                // the page (poisoning it would log a loss of memory the program dropped, and
                // its retried access reads zeros), a REMAP moves it, swapped, and the access
                // at its new place reports it. A fault served in its own thread meets this
                // (it does not queue behind the events as a fault thread's message does).
                s.tiers.swap.unlock(slot, e, e);
                r.ptes.unlock(j, pte, pte);
                *planned = Planned::SKIP;
                continue;
            }
        };
        let keep = kind == Kind::Data && keeps_slot(s, r, e, slot, write && j == idx, pool_roomy);
        *planned = Planned { pte: Some(pte), entry: e, kind, keep };
    }
    drop(shared_unit);

    // Install runs of pages of one kind: one ioctl each, no wake until the end.
    // A write to a zero page gets a zeroed copy of its own (saving the write fault after);
    // its zero neighbours share one UFFDIO_ZEROPAGE.
    let zero_copy_at = write.then_some(idx - first).filter(|&k| plan[k].kind == Kind::Zero);
    let mut k = 0;
    while k < n {
        let p = plan[k];
        if matches!(p.kind, Kind::Skip | Kind::Failed) {
            k += 1;
            continue;
        }
        let run = k;
        while k + 1 < n
            && plan[k + 1].kind == p.kind
            && plan[k + 1].keep == p.keep
            && zero_copy_at != Some(k)
            && zero_copy_at != Some(k + 1)
        {
            k += 1;
        }
        k += 1;
        let addr = r.page_addr(first + run);
        let len = (k - run) * PAGE_SIZE;
        let res = s.guarded(r, || match p.kind {
            Kind::Data => {
                let bytes = &scratch.range.as_slice()[run * PAGE_SIZE..k * PAGE_SIZE];
                s.uffd.copy(addr, bytes, true, p.keep)
            }
            _ if zero_copy_at == Some(run) => {
                static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];
                s.uffd.copy(addr, &ZERO_PAGE, true, false)
            }
            _ => s.uffd.zeropage(addr, len, true),
        });
        if let Err(e) = res {
            // Pages the kernel did not install stay swapped, their slots intact (the
            // program faults on them again); the common cause is the region going away.
            let done = match &e {
                uffd::Error::PageExist { done_bytes, .. }
                | uffd::Error::Again { done_bytes, .. }
                | uffd::Error::NoPage { done_bytes, .. } => done_bytes / PAGE_SIZE,
                _ => 0,
            };
            let _ = settle_install(s, addr + done * PAGE_SIZE, Err(e));
            for q in &mut plan[run + done..k] {
                q.kind = Kind::Skip;
            }
        }
    }

    // Settle each page: installed ones free their slot (or keep it, clean) and turn
    // present; the rest go back as they were.
    let mut installed = 0i64;
    let mut tags = 0u8;
    let mut from_tag = None;
    for (k, &p) in plan.iter().enumerate().take(n) {
        let Some(pte) = p.pte else { continue };
        let j = first + k;
        let slot = pte.payload();
        match p.kind {
            Kind::Data | Kind::Zero => {
                tags |= 1 << p.entry.tag().index();
                if j == idx {
                    from_tag = Some(p.entry.tag());
                }
                let new = if p.keep { Pte::present_clean(slot) } else { Pte::present() };
                // Judged while the slot still carries its eviction time.
                let new = if j == idx { workingset_refault(s, slot, new) } else { new };
                if p.keep {
                    s.tiers.swap.unlock(slot, p.entry, kept_entry(s, p.entry));
                } else {
                    release_entry(s, slot, p.entry);
                }
                r.ptes.unlock(j, pte, new);
                installed += 1;
            }
            Kind::Failed => {
                // Poisoned: the page reads as SIGBUS until the program discards it.
                release_entry(s, slot, p.entry);
                r.ptes.unlock(j, pte, Pte::poisoned());
                installed += 1;
                from_tag = Some(p.entry.tag());
            }
            Kind::Skip => {
                s.tiers.swap.unlock(slot, p.entry, p.entry);
                r.ptes.unlock(j, pte, pte);
            }
        }
    }
    s.acct.present_pages.fetch_add(installed, Ordering::Relaxed);
    s.counters.faults_swapped.fetch_add(1, Ordering::Relaxed);
    if installed > 1 {
        s.counters.swpin_large.fetch_add(1, Ordering::Relaxed);
        s.counters.swpin_large_pages.fetch_add(installed as u64, Ordering::Relaxed);
        if tags.count_ones() > 1 {
            s.counters.swpin_large_mixed.fetch_add(1, Ordering::Relaxed);
        }
    }
    if fallback > 0 {
        s.counters.swpin_large_fallback.fetch_add(fallback, Ordering::Relaxed);
    }
    // The stream goes on from the end of what is now in memory past the fault.
    let mut hi = idx + 1;
    while hi < end && plan[hi - first].pte.is_some() && plan[hi - first].kind != Kind::Skip {
        hi += 1;
    }
    r.locality.note_swapin(hi);
    (from_tag, first, n)
}

/// Whether the pool may keep the objects of clean pages: while it is under its limit. A
/// kept object doubles its page's memory until the page is written or evicted, but it is
/// what makes evicting the page again free; past the limit, writeback moves the coldest
/// objects to the file (kept ones too: their pages stay clean, on a file slot). With a
/// quarter of the limit held free instead, a dense pool (zstd on the lab's pages: 1 GiB in
/// ~110 MiB of a 128 MiB limit) kept nothing, and every page refaulted in order was
/// compressed again when evicted: usemem refaulted 2.2× slower than with lz4.
fn pool_roomy(s: &Shared) -> bool {
    s.tiers.pool.total_bytes() < s.pool_limit()
}

/// Whether a page read from locked entry `e` of `slot` comes in clean, keeping its slot (so
/// evicting it unwritten costs no compression and no IO): not for a write, nor for a slot a
/// forked child shares, nor for a pool object while the pool is short of room, nor (with
/// `reread_to_pool`) for a file record read back clean once already.
fn keeps_slot(s: &Shared, r: &RegionInner, e: SwapEntry, slot: u64, write: bool, pool_roomy: bool) -> bool {
    let tag = e.tag();
    r.clean_tracking
        && !write
        && e.count() == 1
        && slot <= Pte::MAX_KEPT_SLOT
        && (tag == Tag::Remote || (tag == Tag::Pool && pool_roomy) || (tag == Tag::File && !reread(s, e)))
}

/// Whether file entry `e` was read back clean before and, with `reread_to_pool`, should now
/// give its slot up.
fn reread(s: &Shared, e: SwapEntry) -> bool {
    s.config.reread_to_pool && e.referenced()
}

/// The entry a page read in clean leaves in its kept slot: with `reread_to_pool`, a file
/// record is marked read once (see [`PagerConfig::reread_to_pool`]).
///
/// [`PagerConfig::reread_to_pool`]: crate::config::PagerConfig::reread_to_pool
fn kept_entry(s: &Shared, e: SwapEntry) -> SwapEntry {
    if s.config.reread_to_pool && e.tag() == Tag::File {
        e.with_referenced(true)
    } else {
        e
    }
}

/// Stride prefetch after a lone fault on swapped page `idx`, whose thread runs again
/// already: when the region's lone faults keep one stride, the next pages along it come
/// into place now (`policy/stride.rs`), each as a clean page where its tier allows. Stops
/// where the budget would be passed: a prefetch never makes a fault wait for room. Returns
/// whether the faults kept a stride (the caller then reads nothing ahead from the disk).
fn prefetch_stride(s: &Shared, r: &RegionInner, idx: usize, scratch: &mut Scratch) -> bool {
    let max = s.config.stride_prefetch_max_pages;
    if max == 0 || r.hint == crate::config::Hint::Random {
        return false;
    }
    // Another thread deciding for this region meanwhile: this fault only loses its window.
    let Some(p) = r.stride.try_lock().ok().and_then(|mut st| st.fault(idx, r.n_pages, max)) else {
        return false;
    };
    s.counters.swap_prefetch_hit.fetch_add(p.passed as u64, Ordering::Relaxed);
    let mut shared_unit = s.tiers.unit_cache.as_ref().and_then(try_lock);
    let unit = match shared_unit.as_deref_mut() {
        Some(c) => c,
        None => &mut scratch.io.unit,
    };
    // Stride pages evicted together lie together in the file: read whole units.
    unit.whole = true;
    for k in 0..p.count as usize {
        if s.footprint_bytes() + PAGE_SIZE as u64 > s.budget() {
            s.kick_reclaim();
            break;
        }
        let j = p.first + k * p.step;
        prefetch_page(s, r, j, unit, &mut scratch.io.page, &mut scratch.io.compressed, &scratch.io.remote);
    }
    if s.footprint_bytes() > s.high_watermark() {
        s.kick_reclaim();
    }
    true
}

/// Brings swapped page `j` of `r` into place if it is free to take (pte and entry unlocked,
/// not shared with a forked child, not remote): a prefetch never waits, and a page it skips
/// comes in on its own fault as usual. An unreadable page is left for its fault to report.
fn prefetch_page(
    s: &Shared,
    r: &RegionInner,
    j: usize,
    unit: &mut UnitCache,
    page: &mut AlignedBuf,
    compressed: &mut [u8],
    remote: &RemotePrefetch,
) {
    let Some(pte) = r.ptes.try_lock_in(j, PteState::Swapped) else {
        return;
    };
    let slot = pte.payload();
    let e = match s.tiers.swap.try_lock(slot) {
        Some(e) if e.count() == 1 && e.tag() != Tag::Remote => e,
        other => {
            if let Some(e) = other {
                s.tiers.swap.unlock(slot, e, e);
            }
            r.ptes.unlock(j, pte, pte);
            return;
        }
    };
    let addr = r.page_addr(j);
    let data = match read_entry(s, slot, e, page.as_mut_slice(), unit, compressed, remote) {
        Ok(data) => data,
        Err(_) => {
            s.tiers.swap.unlock(slot, e, e);
            r.ptes.unlock(j, pte, pte);
            return;
        }
    };
    let keep = data && keeps_slot(s, r, e, slot, false, pool_roomy(s));
    let res = s.guarded(r, || {
        if data {
            s.uffd.copy(addr, &page.as_slice()[..PAGE_SIZE], false, keep)
        } else {
            s.uffd.zeropage(addr, PAGE_SIZE, false)
        }
    });
    if let Err(err) = res {
        // The range is changing (an event in flight) or going: the page stays swapped.
        let _ = settle_install(s, addr, Err(err));
        s.tiers.swap.unlock(slot, e, e);
        r.ptes.unlock(j, pte, pte);
        return;
    }
    if keep {
        s.tiers.swap.unlock(slot, e, e);
        r.ptes.unlock(j, pte, Pte::present_clean(slot));
    } else {
        release_entry(s, slot, e);
        r.ptes.unlock(j, pte, Pte::present());
    }
    s.acct.present_pages.fetch_add(1, Ordering::Relaxed);
    s.counters.swap_prefetch.fetch_add(1, Ordering::Relaxed);
}

/// For a lone fault on the file record at bytes `rec` (its entry locked): the file bytes
/// spanning it and the records of the rest of its 64 KiB block that lie in its unit or in
/// one unit beside it (the side holding more of them), read without locks. Reaching into
/// the other unit takes a witness: one of its records' entries, locked (and returned for
/// the caller to unlock after the read), so that unit is not rewritten while it is read.
fn block_records(
    s: &Shared,
    r: &RegionInner,
    idx: usize,
    rec: (u64, u64),
    unit_bytes: u64,
) -> ((u64, u64), Option<(u64, SwapEntry)>) {
    let unit = rec.0 / unit_bytes;
    let block_start = idx - idx % BLOCK_PAGES;
    let mut own = rec;
    // Records in the unit before and after: (lowest start, highest end, count, one slot).
    let mut sides = [(u64::MAX, 0u64, 0u32, 0u64); 2];
    for j in block_start..(block_start + BLOCK_PAGES).min(r.n_pages) {
        let p = r.ptes.load(j);
        if j == idx || p.state() != PteState::Swapped || p.locked() {
            continue;
        }
        let e = s.tiers.swap.load(p.payload());
        if e.tag() != Tag::File {
            continue;
        }
        let (off, len) = e.addr_len();
        let span = (off, off + record_bytes(len) as u64);
        let u = off / unit_bytes;
        if u == unit {
            own = (own.0.min(span.0), own.1.max(span.1));
        } else if u + 1 == unit || u == unit + 1 {
            let side = &mut sides[(u > unit) as usize];
            *side = (side.0.min(span.0), side.1.max(span.1), side.2 + 1, p.payload());
        }
    }
    let side = if sides[1].2 >= sides[0].2 { sides[1] } else { sides[0] };
    if side.2 == 0 {
        return (own, None);
    }
    let slot = side.3;
    match s.tiers.swap.try_lock(slot) {
        Some(e) if e.tag() == Tag::File && e.addr_len().0 / unit_bytes != unit => {
            let u = e.addr_len().0 / unit_bytes;
            if u + 1 == unit || u == unit + 1 {
                ((own.0.min(side.0), own.1.max(side.1)), Some((slot, e)))
            } else {
                s.tiers.swap.unlock(slot, e, e);
                (own, None)
            }
        }
        Some(e) => {
            s.tiers.swap.unlock(slot, e, e);
            (own, None)
        }
        None => (own, None),
    }
}

/// The mutex's guard if it is free (a poisoned one too: a copy is checked on every use).
fn try_lock<T>(m: &std::sync::Mutex<T>) -> Option<std::sync::MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Bounded sampling for windows beyond 64 KiB (up to 2 MiB): 16 ptes spread over the range
/// decide whether it is worth probing page by page: at least half of them swapped.
fn mostly_swapped(s: &Shared, r: &RegionInner, (first, end): (usize, usize)) -> bool {
    const SAMPLES: usize = 16;
    let n = end - first;
    let swapped = (0..SAMPLES)
        .map(|k| first + k * n / SAMPLES)
        .filter(|&j| {
            let p = r.ptes.load(j);
            p.state() == PteState::Swapped && !p.locked() && s.tiers.swap.load(p.payload()).count() == 1
        })
        .count();
    swapped * 2 >= SAMPLES
}

/// Workingset detection on the refault of `slot`: if the page was evicted so recently that
/// a little more memory would have kept it (its refault distance, in evictions since, is
/// within the budget), it is working set: count it and activate it at once, so the next
/// aging round passes it over. `new` is the pte the page gets otherwise.
fn workingset_refault(s: &Shared, slot: u64, new: Pte) -> Pte {
    if !s.config.workingset {
        return new;
    }
    let Some(distance) = s.tiers.swap.refault_distance(slot) else {
        return new;
    };
    s.counters.workingset_refault.fetch_add(1, Ordering::Relaxed);
    s.tiers.pool_share.note_refault(distance);
    if distance <= s.workingset_pages() {
        s.counters.workingset_activate.fetch_add(1, Ordering::Relaxed);
        new.with_active(true)
    } else {
        new
    }
}

/// A write to a clean page (one that kept its slot, write-protected): its slot no longer
/// matches what the page will hold, so give it up, then let the write through. The whole
/// 64 KiB block is done at once: a program writing one page of a block it read in usually
/// writes the rest, and each page would cost a fault of its own.
fn handle_wp_fault(s: &Shared, addr: usize) {
    let page_addr = addr & !(PAGE_SIZE - 1);
    let Lookup::Region(r, idx) = s.lookup(page_addr) else {
        s.wake(page_addr, PAGE_SIZE);
        return;
    };
    s.counters.faults_wp.fetch_add(1, Ordering::Relaxed);
    let block_start = idx - idx % BLOCK_PAGES;
    let block_end = (block_start + BLOCK_PAGES).min(r.n_pages);
    let mut locked = [None; BLOCK_PAGES];
    let first = r.ptes.lock(idx);
    if !s.maps(&r, page_addr) {
        // Cut from the region since the lookup (see handle_fault): fault again.
        r.ptes.unlock(idx, first, first);
        s.wake(page_addr, PAGE_SIZE);
        return;
    }
    locked[idx - block_start] = Some(first);
    for i in block_start..block_end {
        if i != idx {
            locked[i - block_start] = r.ptes.try_lock_in(i, PteState::Present);
        }
    }
    // Only pages whose slot is gone (or never kept) may become writable: a page left locked
    // by someone else keeps its protection, and faults again if written.
    let mut i = block_start;
    while i < block_end {
        let Some(old) = locked[i - block_start] else {
            i += 1;
            continue;
        };
        let run = i;
        let mut cur = Some(old);
        while let Some(old) = cur {
            if old.state() == PteState::Present {
                if let Some(kept) = old.kept_slot() {
                    put_slot(s, kept);
                }
            }
            i += 1;
            cur = if i < block_end { locked[i - block_start] } else { None };
        }
        // Pages of the run that are not present (staged or swapped meanwhile) have no pte
        // in the program's range; unprotecting them is a no-op.
        let _ = s.guarded(&r, || s.uffd.writeprotect(r.page_addr(run), (i - run) * PAGE_SIZE, false, true));
        for k in run..i {
            let old = locked[k - block_start].expect("locked above");
            let new = if old.state() == PteState::Present { old.without_kept_slot() } else { old };
            r.ptes.unlock(k, old, new);
        }
    }
    // Wakes the writer: it retries, and takes a missing-page fault if its page was staged.
    s.wake(page_addr, PAGE_SIZE);
}

/// The pages a readahead window of `window` pages (the faulting page `idx` included) reads,
/// as `[from, to)`, in a region of `n_pages`. When large swap-in is possible (`large`), the
/// rest of the faulting 64 KiB block is left alone: the block's next fault brings it in whole
/// in one swap-in, and the file copy holds its records already (`swap_in`), where a
/// read-ahead page costs a fault of its own on first touch. Readahead then only reaches past
/// the block, for a stream that crosses blocks; an empty range reads nothing.
fn readahead_range(idx: usize, window: usize, n_pages: usize, large: bool) -> (usize, usize) {
    let to = idx.saturating_add(window).min(n_pages);
    let from = if large { (idx / BLOCK_PAGES + 1) * BLOCK_PAGES } else { idx + 1 };
    (from.min(to), to)
}

/// Reads the disk-backed pages among `[from, to)` into staging (marked read-ahead), where
/// their first touch finds them in memory. Pages in other tiers, shared by fork, or busy
/// are left alone: readahead is a guess and never waits.
fn read_ahead(s: &Shared, r: &RegionInner, from: usize, to: usize, scratch: &mut Scratch) {
    // The copy the fault just read into, if free (see swap_in).
    let mut shared_unit = if scratch.in_thread { None } else { s.tiers.unit_cache.as_ref().and_then(try_lock) };
    let unit = match shared_unit.as_deref_mut() {
        Some(c) => c,
        None => &mut scratch.io.unit,
    };
    unit.whole = true;
    let mut read = 0u64;
    let mut last_block = usize::MAX;
    for j in from..to {
        let Some(old) = r.ptes.try_lock_in(j, PteState::Swapped) else {
            continue;
        };
        let slot = old.payload();
        let Some(e) = s.tiers.swap.try_lock(slot) else {
            r.ptes.unlock(j, old, old);
            continue;
        };
        let ok = e.tag() == Tag::File
            && e.count() == 1
            && matches!(
                read_entry(
                    s,
                    slot,
                    e,
                    scratch.io.page.as_mut_slice(),
                    unit,
                    &mut scratch.io.compressed,
                    &scratch.io.remote
                ),
                Ok(true)
            )
            && s.mirror_uffd.copy(r.mirror_addr(j), &scratch.io.page.as_slice()[..PAGE_SIZE], true, false).is_ok();
        if !ok {
            // A failed read here is left for the page's own fault, which reports it.
            s.tiers.swap.unlock(slot, e, e);
            r.ptes.unlock(j, old, old);
            continue;
        }
        free_backend(s, e);
        s.tiers.swap.unlock(slot, e, SwapEntry::FREE);
        r.ptes.unlock(j, old, Pte::staged_readahead());
        s.acct.staged_pages.fetch_add(1, Ordering::Relaxed);
        read += 1;
        let block = j / BLOCK_PAGES;
        if block != last_block {
            // On the inactive list, like any staged block: evicted again if unused.
            s.acct.inactive.lock().unwrap_or_else(|e| e.into_inner()).push_back((r.id, block));
            last_block = block;
        }
    }
    s.counters.swap_ra.fetch_add(read, Ordering::Relaxed);
    if read > 0 && s.footprint_bytes() > s.high_watermark() {
        s.kick_reclaim();
    }
}

fn finish_fault(s: &Shared, t0: Instant) {
    s.counters.faults.fetch_add(1, Ordering::Relaxed);
    s.counters.record_fault_latency(t0.elapsed().as_micros() as u64);
    if s.footprint_bytes() > s.high_watermark() {
        s.kick_reclaim();
    }
}

/// Blocks while the footprint is over the budget and reclaim can still bring it down.
/// It cannot when its last pass found nothing to evict, or when what eviction cannot
/// shrink (a pool that could not be written back, metadata) already fills the budget:
/// then the program goes on over budget, which reclaim counts and reports.
fn wait_for_room(s: &Shared, direct: Option<&mut crate::reclaim::DirectReclaim>) {
    let hopeless = || s.wake.reclaim_stuck.load(Ordering::Relaxed) || s.footprint_floor() >= s.low_watermark();
    if s.footprint_bytes() <= s.budget() || hopeless() {
        return;
    }
    s.counters.throttled_faults.fetch_add(1, Ordering::Relaxed);
    if let Some(d) = direct {
        // Evict on this CPU rather than sleep on it; what is left to wait for is staging.
        s.kick_reclaim();
        d.run();
        if s.footprint_bytes() <= s.budget() {
            return;
        }
    }
    s.counters.pgscan_direct_throttle.fetch_add(1, Ordering::Relaxed);
    // Every fault thread polls while this one sleeps (watch.rs): another program thread's
    // fault must not wait for this one's room. Not before direct reclaim: ringing the
    // others then, ~1,600 times a 1 GiB fill, cost its swap-out 10 % (2.06 → 2.29 s).
    if s.wake.watch.release_all() {
        s.counters.fault_follow_all.fetch_add(1, Ordering::Relaxed);
    }
    let deadline = Instant::now() + Duration::from_secs(2);
    let (m, cv) = &s.wake.room;
    let mut g = m.lock().unwrap_or_else(|e| e.into_inner());
    while s.footprint_bytes() > s.budget() && !s.wake.shutdown.load(Ordering::Relaxed) {
        s.kick_reclaim();
        if s.helpers > 0 {
            // A signal-mode fault: its thread sleeps here, and the helper on its CPU evicts.
            s.wake.helper_kick.kick_all();
        }
        let now = Instant::now();
        if now >= deadline {
            // Reclaim cannot make room (nothing evictable left, or nowhere to put it):
            // going over budget beats hanging the program. Counted here too, since reclaim
            // counts only the passes that found nothing to evict.
            s.counters.over_budget_events.fetch_add(1, Ordering::Relaxed);
            return;
        }
        let gen = *g;
        let (g2, _) = cv.wait_timeout(g, Duration::from_millis(5)).unwrap_or_else(|e| e.into_inner());
        g = g2;
        if *g != gen && (s.footprint_bytes() <= s.budget() || hopeless()) {
            return;
        }
    }
}

/// Maps a zero page at `addr` (a zeroed copy for writes, saving the write fault after).
/// Says whether a page is there now.
fn install_zero(s: &Shared, r: Option<&RegionInner>, addr: usize, write: bool, dontwake: bool) -> bool {
    let install = || {
        if write {
            static ZERO_PAGE: [u8; PAGE_SIZE] = [0; PAGE_SIZE];
            s.uffd.copy(addr, &ZERO_PAGE, dontwake, false)
        } else {
            s.uffd.zeropage(addr, PAGE_SIZE, dontwake)
        }
    };
    // Memory no region holds (`r` None) is unmanaged: nothing of ours can be there.
    let res = match r {
        Some(r) => s.guarded(r, install),
        None => install(),
    };
    settle_install(s, addr, res)
}

/// First-touch fault-around: when a first-touch fault at `idx` continues the region's
/// last one (a program filling memory in order), the untouched pages after it are mapped in
/// the same call: zeroed pages of their own for a write (the writes that follow take no
/// fault), the zero page for a read. The window is 64 KiB to start with and doubles while
/// the fill goes on in order, up to `fault_around_max_pages`. Returns how many pages were
/// mapped after `idx`; `idx` itself is installed and locked by the caller.
fn first_touch_around(s: &Shared, r: &RegionInner, idx: usize, write: bool) -> usize {
    let in_order = r.first_touch_next.load(Ordering::Relaxed) == idx;
    if !in_order || !s.config.fault_around {
        r.first_touch_next.store(idx + 1, Ordering::Relaxed);
        r.first_touch_window.store(0, Ordering::Relaxed);
        return 0;
    }
    let budget_pages = (s.budget() / PAGE_SIZE as u64) as usize;
    let max = (s.config.fault_around_max_pages as usize).min(budget_pages / 64).clamp(1, MAX_FAULT_AROUND_PAGES);
    let window = (r.first_touch_window.load(Ordering::Relaxed) * 2).clamp(BLOCK_PAGES.min(max), max);
    r.first_touch_window.store(window, Ordering::Relaxed);
    let to = (idx + window).min(r.n_pages);
    let mut olds = [Pte::NONE; MAX_FAULT_AROUND_PAGES];
    let mut end = idx + 1;
    while end < to {
        let Some(p) = r.ptes.try_lock_in(end, PteState::None) else { break };
        olds[end - idx - 1] = p;
        end += 1;
    }
    let n = end - idx - 1;
    if n == 0 || !s.maps(r, r.page_addr(end - 1)) {
        unlock_unchanged_from(r, &olds, idx + 1, idx + 1, end);
        r.first_touch_next.store(idx + 1, Ordering::Relaxed);
        return 0;
    }
    // Installed a 64 KiB block at a time: one zeroed source serves every chunk.
    static ZEROS: [u8; BLOCK_PAGES * PAGE_SIZE] = [0; BLOCK_PAGES * PAGE_SIZE];
    let mut done = 0;
    while done < n {
        let chunk = (n - done).min(BLOCK_PAGES);
        let (addr, len) = (r.page_addr(idx + 1 + done), chunk * PAGE_SIZE);
        let res = s.guarded(r, || {
            if write {
                s.uffd.copy(addr, &ZEROS[..len], true, false)
            } else {
                s.uffd.zeropage(addr, len, true)
            }
        });
        // A partial install (the range going away, a page the kernel has already) leaves
        // the rest untouched: they fault on their own.
        let (got, whole) = match res {
            Ok(bytes) => (bytes / PAGE_SIZE, bytes == len),
            Err(
                uffd::Error::PageExist { done_bytes, .. }
                | uffd::Error::Again { done_bytes, .. }
                | uffd::Error::NoPage { done_bytes, .. },
            ) => (done_bytes / PAGE_SIZE, false),
            Err(_) => (0, false),
        };
        done += got.min(chunk);
        if !whole {
            break;
        }
    }
    for k in idx + 1..idx + 1 + done {
        r.ptes.unlock(k, olds[k - idx - 1], Pte::present());
    }
    unlock_unchanged_from(r, &olds, idx + 1, idx + 1 + done, end);
    s.acct.present_pages.fetch_add(done as i64, Ordering::Relaxed);
    s.counters.fault_around_pages.fetch_add(done as u64, Ordering::Relaxed);
    r.first_touch_next.store(idx + 1 + done, Ordering::Relaxed);
    done
}

/// Unlocks pages `[from, to)` unchanged, locked as `olds[k - base]`.
fn unlock_unchanged_from(r: &RegionInner, olds: &[Pte], base: usize, from: usize, to: usize) {
    for k in from..to {
        r.ptes.unlock(k, olds[k - base], olds[k - base]);
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
fn settle_install(s: &Shared, addr: usize, res: uffd::Result<usize>) -> bool {
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

/// Moves the staged page at `idx` back, with its staged neighbours in the same 64 KiB block
/// (fault-around: they would otherwise cost a fault each), read-ahead pages excepted.
/// Wakes nobody on success: returns the pages the caller wakes once its bookkeeping is done.
fn unstage_around(s: &Shared, r: &RegionInner, idx: usize) -> Option<(usize, usize)> {
    let block_start = idx - idx % BLOCK_PAGES;
    let block_end = (block_start + BLOCK_PAGES).min(r.n_pages);
    // Lock the faulting page first (waiting), then neighbours opportunistically.
    let first = r.ptes.lock(idx);
    if first.state() != PteState::Staged {
        // Someone else moved it meanwhile: just make sure the waiter wakes.
        r.ptes.unlock(idx, first, first);
        s.wake(r.page_addr(idx), PAGE_SIZE);
        return None;
    }
    let mut locked = [false; BLOCK_PAGES];
    locked[idx - block_start] = true;
    for i in block_start..block_end {
        if i == idx || !s.config.fault_around {
            continue;
        }
        if let Some(old) = r.ptes.try_lock_in(i, PteState::Staged) {
            if old.is_readahead() {
                // A read-ahead page comes in on its own touch, so that swap_ra_hit counts
                // pages really used and the window follows the program, not fault-around.
                r.ptes.unlock(i, old, old);
            } else {
                locked[i - block_start] = true;
            }
        }
    }
    let mut i = block_start;
    let mut moved_pages = 0i64;
    while i < block_end {
        if !locked[i - block_start] {
            i += 1;
            continue;
        }
        let run_start = i;
        while i < block_end && locked[i - block_start] {
            i += 1;
        }
        moved_pages += move_back(s, r, run_start, i);
    }
    s.acct.staged_pages.fetch_sub(moved_pages, Ordering::Relaxed);
    s.acct.present_pages.fetch_add(moved_pages, Ordering::Relaxed);
    s.counters.fault_around_pages.fetch_add(moved_pages.saturating_sub(1) as u64, Ordering::Relaxed);
    s.counters.pgactivate.fetch_add(moved_pages as u64, Ordering::Relaxed);
    Some((block_start, block_end))
}

/// Moves locked staged pages `[from, to)` from the mirror back into the region and unlocks
/// them as present (active). Returns the number of pages moved or zero-filled.
fn move_back(s: &Shared, r: &RegionInner, from: usize, to: usize) -> i64 {
    let mut i = from;
    let mut n = 0;
    let mut again = 0;
    while i < to {
        let len = (to - i) * PAGE_SIZE;
        // SAFETY: the pages [i, to) are locked staged pages: their only copy is at the same
        // offset in the mirror, which only the pager touches, and the program's range there
        // is empty (the program faults on it). Moving them back is what the program expects.
        let res = s.guarded(r, || unsafe { s.uffd.move_pages(r.page_addr(i), r.mirror_addr(i), len, true, false) });
        let mut stop = false;
        let done_pages = match res {
            Ok(bytes) => bytes / PAGE_SIZE,
            Err(uffd::Error::NoPage { done_bytes, .. } | uffd::Error::Again { done_bytes, .. })
                if done_bytes == 0
                    && sys::is_resident(r.mirror_addr(i))
                    && !sys::is_resident(r.page_addr(i))
                    && !s.maps(r, r.page_addr(i)) =>
            {
                // The page is in the mirror but the program's range is gone (munmap, mremap
                // handled or queued): it stays staged for the event handler.
                unlock_unchanged(r, i, to);
                stop = true;
                0
            }
            Err(uffd::Error::NoPage { done_bytes, .. })
                if sys::is_resident(r.mirror_addr(i + done_bytes / PAGE_SIZE)) =>
            {
                // ENOENT with the page in the mirror: the destination is gone (an mremap or
                // munmap whose event is not handled yet). Leave the rest staged.
                let done = done_bytes / PAGE_SIZE;
                unlock_unchanged(r, i + done, to);
                stop = true;
                done
            }
            Err(uffd::Error::NoPage { done_bytes, .. }) => {
                // A hole in the mirror at the page after the moved ones: it was a zero page.
                let at = i + done_bytes / PAGE_SIZE;
                install_zero(s, Some(r), r.page_addr(at), false, true);
                done_bytes / PAGE_SIZE + 1
            }
            Err(uffd::Error::PageExist { done_bytes, .. }) => {
                let at = i + done_bytes / PAGE_SIZE;
                s.wake(r.page_addr(at), PAGE_SIZE);
                done_bytes / PAGE_SIZE + 1
            }
            Err(uffd::Error::Again { done_bytes, .. }) if done_bytes > 0 || again < 4 => {
                again += 1;
                done_bytes / PAGE_SIZE
            }
            Err(uffd::Error::Again { done_bytes, .. })
                if sys::is_resident(r.mirror_addr(i + done_bytes / PAGE_SIZE)) =>
            {
                // The page is there: EAGAIN means an event (REMOVE, UNMAP, REMAP) is queued
                // on the program's userfaultfd. Leave the rest staged; the woken thread
                // faults again once the event is handled.
                let done = done_bytes / PAGE_SIZE;
                unlock_unchanged(r, i + done, to);
                stop = true;
                done
            }
            Err(uffd::Error::Again { done_bytes, .. }) => {
                // EAGAIN with no progress, again and again, and no page in the mirror: this
                // kernel's answer for a hole there (see tests/uffd_ops.rs). The page read as
                // zeros when staged.
                let at = i + done_bytes / PAGE_SIZE;
                install_zero(s, Some(r), r.page_addr(at), false, true);
                done_bytes / PAGE_SIZE + 1
            }
            Err(uffd::Error::Invalid { .. }) | Err(uffd::Error::ProcessGone { .. })
                if r.dead.load(Ordering::Acquire) || !s.maps(r, r.page_addr(i)) =>
            {
                // The program's range is gone (munmap, mremap): the pages stay staged for
                // the event handler, which frees or moves them.
                unlock_unchanged(r, i, to);
                stop = true;
                0
            }
            Err(e) => fatal(&format!("moving a staged page back to {:#x} failed: {e}", r.page_addr(i))),
        };
        let mut ra_hits = 0;
        for k in i..i + done_pages {
            let old = r.ptes.load(k);
            ra_hits += old.is_readahead() as u32;
            // The move maps the page writable, beyond write-protect tracking: it is no
            // longer known clean.
            if let Some(kept) = old.kept_slot() {
                put_slot(s, kept);
            }
            r.ptes.unlock(k, old, Pte::present().with_active(true));
        }
        if ra_hits > 0 {
            r.ra.hit(ra_hits);
            s.counters.swap_ra_hit.fetch_add(ra_hits as u64, Ordering::Relaxed);
        }
        n += done_pages as i64;
        i += done_pages;
        if stop {
            break;
        }
    }
    n
}

/// A page that cannot be read is never returned as data: the faulting thread gets SIGBUS.
fn poison(s: &Shared, r: &RegionInner, addr: usize, slot: u64, fail: &ReadFail) {
    eprintln!(
        "tierswap: page at {addr:#x} (slot {slot}) cannot be read back ({fail}); the accessing thread gets SIGBUS"
    );
    if arm_poison(s, r, addr) {
        s.wake(addr, PAGE_SIZE);
    }
}

/// Puts a poison marker at `addr`. True when the caller should wake the page's waiters
/// (the marker was there already); false when the install woke them or nobody is left.
/// The pte says poisoned either way: if the range is changing under an event (munmap or
/// mremap in flight: ENOENT, EINVAL, EAGAIN), the event clears or moves that pte, or the
/// retried access faults again and lands here once more.
fn arm_poison(s: &Shared, r: &RegionInner, addr: usize) -> bool {
    match s.guarded(r, || s.uffd.poison(addr, PAGE_SIZE, false)) {
        Ok(_) => false,
        Err(uffd::Error::PageExist { .. }) => true,
        Err(uffd::Error::ProcessGone { .. }) => false,
        Err(uffd::Error::NoPage { .. } | uffd::Error::Invalid { .. } | uffd::Error::Again { .. }) => true,
        Err(e) => fatal(&format!("cannot poison unreadable page {addr:#x}: {e}")),
    }
}

/// Unlocks ptes `[from, to)` as they are (work left for a later fault).
fn unlock_unchanged(r: &RegionInner, from: usize, to: usize) {
    for k in from..to {
        let old = r.ptes.load(k);
        r.ptes.unlock(k, old, old);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn readahead_leaves_the_faulting_block_to_large_swap_in() {
        // Order-0 swap-ins: the window starts at the next page.
        assert_eq!(readahead_range(5, 8, 1000, false), (6, 13));
        // Large swap-in: nothing of block 0 (pages 0..16) is read ahead…
        assert_eq!(readahead_range(5, 8, 1000, true), (13, 13));
        // …only what the window reaches past it.
        assert_eq!(readahead_range(5, 32, 1000, true), (16, 37));
        assert_eq!(readahead_range(15, 2, 1000, true), (16, 17));
        assert_eq!(readahead_range(16, 32, 1000, true), (32, 48));
        // The region's end bounds both forms.
        assert_eq!(readahead_range(995, 32, 1000, false), (996, 1000));
        assert_eq!(readahead_range(990, 32, 1000, true), (992, 1000));
        assert_eq!(readahead_range(997, 32, 1000, true), (1000, 1000));
    }
}
