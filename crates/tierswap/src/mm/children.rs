//! The forked children's state: how many child servers run, the hand-over when the
//! parent's pager goes, and the link between a child and its server (mailbox, hello
//! socket, inbox: signal mode's requests, thread mode's grants of inherited memory). The servers
//! themselves, the fork snapshot and the child side of the link are in `events/fork.rs`,
//! which says how it all works.
//!
//! Owns: [`Children`] (a part of `Shared`), the exit hook that hands children over.
//! Calls: `uffd` (the mailbox), `sys` (sockets, eventfds).
//!
//! ```text
//!  mailbox page (a child's copy)        hello (child → pager), with SCM_RIGHTS
//!  +--------+--------+----------+       +--------+--------+------+
//!  | MAGIC  |   id   | claim pid|       | MAGIC  |   id   | pid  |   3 × u64
//!  +--------+--------+----------+       +--------+--------+------+
//! ```

use std::collections::HashMap;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, Weak};

use super::Shared;
use crate::page::PAGE_SIZE;
use crate::sys;
use crate::uffd::{self, RegisterMode, Uffd};
/// Generations of descendants a signal-mode pager serves (a mailbox page each).
pub(crate) const MAILBOX_PAGES: usize = 8;

/// "tswchild" in ASCII: the mailbox and the hello begin with it.
pub(crate) const MAGIC: u64 = u64::from_be_bytes(*b"tswchild");

/// Where a served child's link is.
pub(crate) enum Mail {
    /// No hello yet.
    Waiting,
    /// Its hello came to another child's server: the link (and the pid the hello gave)
    /// waits for its own.
    Queued(OwnedFd, u32),
    /// Its server has it (a later hello for the id is refused).
    Linked,
}

/// The children a pager serves: a part of [`Shared`].
pub(crate) struct Children {
    /// Child servers running; [`hand_over`] waits for none. Guarded by its mutex.
    live: (Mutex<usize>, Condvar),
    /// The parent's pager is going: servers install everything their child still needs,
    /// then stop.
    pub(crate) handing_over: AtomicBool,
    /// Rung (and left ringing) with `handing_over`: every server polls it.
    pub(crate) bell: OwnedFd,
    /// The process the pager runs in: a forked copy of this state does nothing.
    owner_pid: i32,
    /// How a child reaches its server: signal mode's requests for pages, and in a tree
    /// (thread mode) the grants of inherited memory to the child's own pager.
    pub(crate) link: Option<Link>,
}

/// The link between children and the parent's pager.
pub(crate) struct Link {
    /// The mailbox: [`MAILBOX_PAGES`] pages, registered, never touched in this process,
    /// so missing in every descendant too until a fork handler installs an id in its copy:
    /// page `g` names a process `g + 1` forks below the pager's (a child in page 0, a
    /// grandchild in page 1, whose page 0 is its parent's, claimed).
    pub(crate) mailbox: usize,
    /// The mailbox is mapped (until the pager is dropped).
    mailbox_open: AtomicBool,
    /// Children send their hello here; every child inherits it.
    pub(crate) hello_tx: OwnedFd,
    /// The pager's end: child servers read hellos from it.
    pub(crate) hello_rx: OwnedFd,
    /// The next child's id (from 1).
    next_id: AtomicU64,
    /// The children served now, by id, and where their link is. Guarded by its mutex.
    inbox: Mutex<HashMap<u64, Mail>>,
    /// Rung when `inbox` gains a link.
    pub(crate) inbox_bell: OwnedFd,
}

impl Children {
    /// For a pager whose program ranges report to `uffd`; `link`: children can reach
    /// their servers (signal mode, or a pager in a tree).
    pub(crate) fn new(uffd: &Uffd, link: bool) -> std::io::Result<Children> {
        let link = if link { Some(Link::new(uffd)?) } else { None };
        register_exit_hook();
        Ok(Children {
            live: (Mutex::new(0), Condvar::new()),
            handing_over: AtomicBool::new(false),
            bell: sys::eventfd()?,
            // SAFETY: getpid has no preconditions.
            owner_pid: unsafe { libc::getpid() },
            link,
        })
    }
}

/// Hands every child of `s` the pages it still needs and stops serving them; returns once
/// every child server has stopped. For a parent about to exit or drop its pager (see the
/// module comment). Does nothing in a forked copy of the pager.
pub(crate) fn hand_over(s: &Shared) {
    s.fork.children.hand_over(|| s.sync_events());
}

/// The pager is being dropped (its children handed over): the mailbox goes. Unregistered
/// first: an unmap of registered memory waits for its UNMAP event to be read, and the
/// fault threads that read events are gone.
pub(crate) fn close(s: &Shared) {
    if let Some(l) = &s.fork.children.link {
        if l.mailbox_open.swap(false, Ordering::AcqRel) {
            let _ = s.uffd.unregister(l.mailbox, MAILBOX_PAGES * PAGE_SIZE);
            // SAFETY: the mailbox is the link's own mapping; nothing of this process
            // touches it.
            unsafe {
                let _ = sys::munmap(l.mailbox, MAILBOX_PAGES * PAGE_SIZE);
            }
        }
    }
}

impl Children {
    fn hand_over(&self, sync_events: impl FnOnce()) {
        // SAFETY: getpid has no preconditions.
        if unsafe { libc::getpid() } != self.owner_pid {
            return;
        }
        // A fork that returned has had its message read, maybe not handled: once the
        // events read so far are handled, every child has its server.
        sync_events();
        self.handing_over.store(true, Ordering::Release);
        sys::eventfd_ring(self.bell.as_fd());
        let (m, cv) = &self.live;
        let mut live = m.lock().unwrap_or_else(|e| e.into_inner());
        while *live > 0 {
            live = cv.wait(live).unwrap_or_else(|e| e.into_inner());
        }
    }

    /// Forked children served now.
    pub(crate) fn live(&self) -> usize {
        *self.live.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn server_started(&self) {
        *self.live.0.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    }

    pub(crate) fn server_stopped(&self) {
        let (m, cv) = &self.live;
        let mut live = m.lock().unwrap_or_else(|e| e.into_inner());
        *live -= 1;
        cv.notify_all();
    }
}

impl Link {
    fn new(uffd: &Uffd) -> std::io::Result<Link> {
        let mailbox = sys::mmap_reserve(MAILBOX_PAGES * PAGE_SIZE)?;
        let mode = RegisterMode { missing: true, wp: false, minor: false };
        if let Err(e) = uffd.register(mailbox, MAILBOX_PAGES * PAGE_SIZE, mode) {
            // SAFETY: our fresh, unused mapping.
            unsafe {
                let _ = sys::munmap(mailbox, MAILBOX_PAGES * PAGE_SIZE);
            }
            return Err(std::io::Error::other(format!("cannot register the forked children's mailbox: {e}")));
        }
        let (hello_rx, hello_tx) = sys::seqpacket_pair()?;
        Ok(Link {
            mailbox,
            mailbox_open: AtomicBool::new(true),
            hello_tx,
            hello_rx,
            next_id: AtomicU64::new(1),
            inbox: Mutex::new(HashMap::new()),
            inbox_bell: sys::eventfd()?,
        })
    }
}

/// Pagers of this process, for the exit hook. Guarded by its mutex.
static PAGERS: Mutex<Vec<Weak<Shared>>> = Mutex::new(Vec::new());

/// The process that registered the exit hook: a forked child inherits the hook and the
/// list, and its copy of the parent's pagers serves nobody. A child that starts a pager of
/// its own registers the hook again and starts the list afresh.
static HOOK_PID: AtomicI32 = AtomicI32::new(0);
/// The process whose pagers [`PAGERS`] lists (same reason).
static LIST_PID: AtomicI32 = AtomicI32::new(0);

/// Registers `s` for the hand-over at exit.
pub(crate) fn note_pager(s: &Arc<Shared>) {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    let mut v = PAGERS.lock().unwrap_or_else(|e| e.into_inner());
    if LIST_PID.swap(pid, Ordering::Relaxed) != pid {
        // A fork child's copy of its parent's list: those pagers are not this process's
        // (their memory is a copy; forget the entries without touching it).
        std::mem::forget(std::mem::take(&mut *v));
    }
    v.retain(|w| w.strong_count() > 0);
    v.push(Arc::downgrade(s));
}

fn register_exit_hook() {
    // SAFETY: getpid has no preconditions.
    let pid = unsafe { libc::getpid() };
    if HOOK_PID.swap(pid, Ordering::Relaxed) != pid {
        // SAFETY: atexit registers a plain extern "C" fn with no arguments.
        unsafe {
            libc::atexit(hand_over_at_exit);
        }
    }
}

/// At `exit`: every live pager of this process hands its children their pages.
extern "C" fn hand_over_at_exit() {
    // SAFETY: getpid has no preconditions.
    if unsafe { libc::getpid() } != HOOK_PID.load(Ordering::Relaxed) {
        // A forked child's exit: its copy of the list may even be locked for good.
        return;
    }
    let pagers: Vec<Arc<Shared>> =
        PAGERS.lock().unwrap_or_else(|e| e.into_inner()).iter().filter_map(Weak::upgrade).collect();
    for s in pagers {
        hand_over(&s);
    }
}

impl Link {
    /// A new id for a process `gen` generations below the pager's (0: a child of the
    /// pager's process), waiting in the inbox for its hello; 0 when the mailbox does not
    /// reach that deep (the process is not served: in signal mode its faults on swapped
    /// pages end it with SIGBUS).
    pub(crate) fn new_id(&self, gen: usize) -> u64 {
        if gen >= MAILBOX_PAGES {
            return 0;
        }
        let id = self.next_id.fetch_add(1, Ordering::Relaxed);
        // Waiting before the page is there: the child may read it and send its hello at
        // once, and a hello for an id not waiting is dropped.
        self.inbox.lock().unwrap_or_else(|e| e.into_inner()).insert(id, Mail::Waiting);
        id
    }

    /// Installs `id` in mailbox page `gen` of the process whose userfaultfd is
    /// `child_uffd`. False while an event of that process's is queued (the kernel answers
    /// EAGAIN until it is read: the caller tries again after reading its events). A page
    /// that cannot be installed at all is said once, and the id is forgotten.
    pub(crate) fn install_mailbox(&self, child_uffd: &Uffd, gen: usize, id: u64) -> bool {
        let mut page = [0u8; PAGE_SIZE];
        page[..8].copy_from_slice(&MAGIC.to_ne_bytes());
        page[8..16].copy_from_slice(&id.to_ne_bytes());
        match child_uffd.copy(self.mailbox + gen * PAGE_SIZE, &page, false, false) {
            Ok(_) | Err(uffd::Error::PageExist { .. }) => true,
            Err(uffd::Error::Again { .. }) => false,
            // The process is gone: nothing to say.
            Err(uffd::Error::ProcessGone { .. }) => {
                self.forget(id);
                true
            }
            Err(e) => {
                eprintln!(
                    "tierswap: cannot tell a forked child who it is ({e}); in signal mode its swapped pages give it SIGBUS, in thread mode what it inherited stays its parent's to serve"
                );
                self.forget(id);
                true
            }
        }
    }

    /// Whether `addr` is in mailbox page `gen`.
    pub(crate) fn is_mailbox_page(&self, addr: usize, gen: usize) -> bool {
        let page = self.mailbox + gen * PAGE_SIZE;
        (page..page + PAGE_SIZE).contains(&addr)
    }
}

impl Link {
    /// Reads the hellos queued into the inbox: a hello for an id nobody serves, or whose
    /// server has its link already (a grandchild's, with its parent's id), is dropped,
    /// which the sender reads as "not served".
    pub(crate) fn receive_hellos(&self) {
        let mut buf = [0u8; 24];
        loop {
            match sys::recv_msg(self.hello_rx.as_raw_fd(), &mut buf, true) {
                Ok((24, Some(fd))) => {
                    let word = |k: usize| u64::from_ne_bytes(buf[k * 8..k * 8 + 8].try_into().unwrap_or([0; 8]));
                    let (magic, id, pid) = (word(0), word(1), word(2) as u32);
                    if magic != MAGIC || id == 0 {
                        continue;
                    }
                    let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
                    if let Some(place @ Mail::Waiting) = inbox.get_mut(&id) {
                        *place = Mail::Queued(fd, pid);
                        sys::eventfd_ring(self.inbox_bell.as_fd());
                    }
                }
                Ok((0, None)) | Err(_) => break,
                Ok(_) => {}
            }
        }
    }

    /// The link of child `id` and the pid its hello gave, if its hello has come and nobody
    /// took it yet.
    pub(crate) fn take_link(&self, id: u64) -> Option<(OwnedFd, u32)> {
        let mut inbox = self.inbox.lock().unwrap_or_else(|e| e.into_inner());
        let mut link = None;
        if let Some(place @ Mail::Queued(..)) = inbox.get_mut(&id) {
            if let Mail::Queued(fd, pid) = std::mem::replace(place, Mail::Linked) {
                link = Some((fd, pid));
            }
        }
        if !inbox.values().any(|m| matches!(m, Mail::Queued(..))) {
            sys::eventfd_drain(self.inbox_bell.as_fd());
        }
        link
    }

    /// Child `id` is served no more.
    pub(crate) fn forget(&self, id: u64) {
        self.inbox.lock().unwrap_or_else(|e| e.into_inner()).remove(&id);
    }
}
