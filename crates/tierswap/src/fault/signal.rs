//! Signal mode's side of the fault path: a fault served in the faulting thread, from its
//! SIGBUS handler (sigbus.rs), with one of the server's fault buffers.
//!
//! Owns: [`SignalServer`] (the pager and its fault buffers, as the handler finds them).
//! Calls: the fault path (`handle_fault`, `handle_wp_fault`), the fork gate.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};

use super::{handle_fault, handle_wp_fault, Scratch};
use crate::mm::{Lookup, Shared};
use crate::page::PAGE_SIZE;
use crate::pagetable::PteState;
use crate::uffd;

/// A signal-mode pager as its SIGBUS handler serves it.
pub(crate) struct SignalServer {
    /// The pager.
    pub(crate) shared: Arc<Shared>,
    /// The buffers of faults served in the faulting threads, one per fault in progress at
    /// once (a thread finding all taken yields and tries again). Each under its mutex.
    scratch: Vec<Mutex<Scratch>>,
}

impl SignalServer {
    /// The server of `shared`, with `shared.signal_buffers` fault buffers.
    pub(crate) fn new(shared: Arc<Shared>) -> std::io::Result<SignalServer> {
        let c = &shared.config;
        let mut scratch = Vec::with_capacity(shared.signal_buffers);
        for _ in 0..shared.signal_buffers {
            let mut b = Scratch::new(c.file_unit_bytes, c.swapin_max_pages)?;
            b.in_thread = true;
            scratch.push(Mutex::new(b));
        }
        Ok(SignalServer { shared, scratch })
    }

    /// A free fault buffer.
    fn scratch(&self) -> MutexGuard<'_, Scratch> {
        loop {
            for m in &self.scratch {
                match m.try_lock() {
                    Ok(g) => return g,
                    Err(std::sync::TryLockError::Poisoned(p)) => return p.into_inner(),
                    Err(std::sync::TryLockError::WouldBlock) => {}
                }
            }
            std::thread::yield_now();
        }
    }
}

/// Serves a fault of a signal-mode pager in the faulting thread ([`crate::sigbus`]):
/// `access` is (write, protection) from the CPU when known. Returns whether the address is
/// this pager's (the signal then needs nothing more: the access is retried). `pass` 0 looks
/// in the region map; 1 first waits out the events being handled (a region an mremap just
/// moved); 2 tries a zero page, which succeeds only on a range registered on this pager's
/// userfaultfd (memory an mremap grew, which stays unmanaged as in thread mode).
pub(crate) fn serve_in_thread(server: &SignalServer, addr: usize, access: Option<(bool, bool)>, pass: u32) -> bool {
    let s = &*server.shared;
    let page_addr = addr & !(PAGE_SIZE - 1);
    // A fork holds the gate, or its snapshot is not taken yet: install nothing, let the
    // access fault again (forkgate.rs). Only for the moment a fork takes. The forking
    // thread itself (in a fork handler: malloc is free) is served, after any snapshot.
    let busy = crate::forkgate::enter_unless_closed();
    let forker = busy.is_none() && crate::forkgate::is_forker();
    if busy.is_none() && !forker {
        return true;
    }
    if forker {
        while s.fork.hold.load(Ordering::SeqCst) > 0 {
            s.fork.forker_waiting.store(true, Ordering::SeqCst);
            std::thread::yield_now();
        }
    } else if s.fork.hold.load(Ordering::SeqCst) > 0 {
        return true;
    }
    if pass == 1 && !forker {
        // (The forking thread skips it: a reader holds the event lock until the fork ends.)
        s.sync_events();
    }
    let found = s.lookup(page_addr);
    if let Lookup::Region(r, idx) = &found {
        let idx = *idx;
        if r.ptes.load(idx).is_poisoned() {
            // A page that could not be read back carries a poison marker, and touching it
            // raises SIGBUS too: with BUS_MCEERR_AR where the kernel has
            // CONFIG_MEMORY_FAILURE, but with BUS_ADRERR, like a userfaultfd fault, where it
            // has not (this VM's kernel). With the marker in place that SIGBUS is the
            // program's: pass it on, in every pass (serving it, or mapping a zero page over
            // it in the last, retried the access forever). A marker missing (it never took)
            // is armed now and the access retried.
            let old = r.ptes.lock(idx);
            if old.state() == PteState::Present && old.is_poisoned() {
                let there = matches!(
                    s.guarded(r, || s.uffd.poison(page_addr, PAGE_SIZE, false)),
                    Err(uffd::Error::PageExist { .. })
                );
                r.ptes.unlock(idx, old, old);
                return !there;
            }
            r.ptes.unlock(idx, old, old);
        }
    }
    if pass == 2 {
        return match s.uffd.zeropage(page_addr, PAGE_SIZE, true) {
            Ok(_) => {
                s.counters.faults_unmanaged.fetch_add(1, Ordering::Relaxed);
                true
            }
            // Ours, and present already or changing: the retry sorts it out.
            Err(uffd::Error::PageExist { .. } | uffd::Error::Again { .. }) => true,
            Err(_) => false,
        };
    }
    let Lookup::Region(r, idx) = found else { return false };
    let (write, protection) = access.unwrap_or_else(|| {
        // No error code: a present page in our table means a write-protect fault.
        let pte = r.ptes.load(idx);
        (true, pte.state() == PteState::Present && !pte.is_poisoned())
    });
    drop(r);
    s.counters.faults_in_thread.fetch_add(1, Ordering::Relaxed);
    if protection {
        handle_wp_fault(s, addr);
    } else {
        let mut scratch = server.scratch();
        handle_fault(s, addr, write, &mut scratch);
    }
    true
}
