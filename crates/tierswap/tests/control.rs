//! The control socket end to end: a real pager doing real work, queried over the socket;
//! the socket's modes; another uid refused; stale sockets removed.

mod common;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use common::{fill_page, page_matches, pager, serial, PAGE};
use tierswap::control::{self, ControlOptions, ControlServer};
use tierswap::{FaultMode, Hint, Pager};

// Every test takes `serial()`: a test that forks (a child dropping to another uid) would
// share the pages of another test's region with the child, and UFFDIO_MOVE refuses shared
// pages (EBUSY), so that test's evict_all would leave pages behind.

/// A fresh directory for one test (tests of this binary run in parallel, one pid).
struct TestDir(PathBuf);

impl TestDir {
    fn new(name: &str) -> TestDir {
        let d = std::env::temp_dir().join(format!("tierswap-ctl-test-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        TestDir(d)
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn server(p: &Arc<Pager>, dir: &Path) -> ControlServer {
    let q = p.clone();
    ControlServer::start(
        move || q.stats(),
        ControlOptions { dir: Some(dir.to_path_buf()), cmdline: Some("control-test".into()) },
    )
    .expect("start the control server")
}

/// The socket's answer and the pager's own snapshot, taken back to back with nothing
/// running, must be the same numbers; the pager's snapshot is taken twice around the query
/// to prove the moment was quiescent.
fn socket_equals_pager(p: &Pager, srv: &ControlServer) -> tierswap::Stats {
    let before = p.stats().to_json();
    let reply = control::query_stats(srv.path()).expect("query the control socket");
    let after = p.stats().to_json();
    assert_eq!(before, after, "the pager was not quiescent around the query");
    assert_eq!(reply.v, 1);
    assert_eq!(reply.pid, std::process::id());
    assert_eq!(reply.cmdline, "control-test");
    assert!(reply.started_unix > 1_600_000_000);
    assert_eq!(reply.stats.to_json(), before, "the socket's stats differ from pager.stats()");
    reply.stats
}

#[test]
fn stats_over_the_socket_are_the_pagers() {
    let _serial = serial();
    let dir = TestDir::new("stats");
    let p = Arc::new(pager(64 << 20, "zero,pool", FaultMode::Thread, 2));
    let srv = server(&p, &dir.0);
    assert_eq!(srv.path(), dir.0.join(format!("{}.sock", std::process::id())));

    let n = 512;
    let mut r = p.region(n * PAGE, Hint::Normal).unwrap();
    {
        let mem = r.as_mut_slice();
        for pg in 0..n {
            let b = &mut mem[pg * PAGE..(pg + 1) * PAGE];
            if pg % 4 == 0 {
                b.fill(0);
            } else {
                fill_page(b, pg, 0);
            }
        }
    }
    let evicted = p.evict_all();
    assert_eq!(evicted, n);
    let s = socket_equals_pager(&p, &srv);
    let zero = n / 4;
    assert_eq!(s.swap_slots, n as u64);
    assert_eq!(s.swap_zero_pages, zero as u64);
    assert_eq!(s.counters.swpout_zero, zero as u64);
    assert_eq!(s.counters.zswpout, (n - zero) as u64);
    assert_eq!(s.pool_stored_pages, (n - zero) as u64);
    assert_eq!(s.present_pages, 0);

    // Read every page back and compare every byte.
    let mem = r.as_slice();
    for pg in 0..n {
        let b = &mem[pg * PAGE..(pg + 1) * PAGE];
        if pg % 4 == 0 {
            assert!(b.iter().all(|&x| x == 0), "zero page {pg} came back wrong");
        } else {
            assert!(page_matches(b, pg, 0), "page {pg} came back wrong");
        }
    }
    let s2 = socket_equals_pager(&p, &srv);
    assert_eq!(s2.counters.swpin_zero + s2.counters.zswpin, n as u64, "every page swapped in once");
    // Filling took first-touch faults only; reading back, at most one fault per page.
    assert_eq!(s.counters.faults, s.counters.faults_first_touch);
    let read_faults = s2.counters.faults - s.counters.faults;
    assert!(read_faults >= 1 && read_faults <= n as u64, "{read_faults} faults to read {n} pages");
    let hist: u64 = s2.fault_latency_us.iter().sum();
    assert_eq!(hist, s2.counters.faults, "one latency sample per fault");

    // The rest of protocol v1.
    assert_eq!(control::request(srv.path(), "ping").unwrap(), serde_json::json!({"v": 1, "ok": true}));
    match control::request(srv.path(), "frobnicate") {
        Err(control::Error::Server { message, .. }) => assert!(message.contains("frobnicate"), "{message}"),
        other => panic!("an unknown request must get an error reply, got {other:?}"),
    }
    drop(r);
}

#[test]
fn modes_are_0700_and_0600_whatever_the_umask() {
    let _serial = serial();
    let dir = TestDir::new("modes");
    let p = Arc::new(pager(64 << 20, "zero,pool", FaultMode::Thread, 2));
    // SAFETY: umask has no preconditions; restored below.
    let old = unsafe { libc::umask(0) };
    let srv = server(&p, &dir.0);
    // SAFETY: as above.
    unsafe { libc::umask(old) };
    let dmode = std::fs::metadata(&dir.0).unwrap().permissions().mode() & 0o7777;
    let smode = std::fs::symlink_metadata(srv.path()).unwrap().permissions().mode() & 0o7777;
    assert_eq!(dmode, 0o700, "directory mode {dmode:o}");
    assert_eq!(smode, 0o600, "socket mode {smode:o}");
    drop(srv);

    // A directory that exists with a loose mode is tightened.
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o755)).unwrap();
    let srv = server(&p, &dir.0);
    let dmode = std::fs::metadata(&dir.0).unwrap().permissions().mode() & 0o7777;
    assert_eq!(dmode, 0o700, "directory mode after restart {dmode:o}");

    // A second server of this process on the same path is refused, the first keeps serving.
    let q = p.clone();
    match ControlServer::start(move || q.stats(), ControlOptions { dir: Some(dir.0.clone()), cmdline: None }) {
        Err(control::Error::InUse { .. }) => {}
        Err(e) => panic!("expected InUse, got {e}"),
        Ok(_) => panic!("a second server on a live socket must be refused"),
    }
    assert!(control::request(srv.path(), "ping").is_ok());

    // Dropping the server removes the socket; nobody answers there any more.
    let path = srv.path().to_path_buf();
    drop(srv);
    assert!(!path.exists(), "socket left behind after drop");
    assert!(matches!(control::request(&path, "ping"), Err(control::Error::NotServing { .. })));
}

/// What a forked child saw when it talked to the socket.
#[derive(Debug, PartialEq, Eq)]
enum ChildSaw {
    /// connect() failed with this errno.
    ConnectErr(i32),
    /// Connected; the server closed (EOF or reset) after this many reply bytes.
    Reply(usize),
    /// The child could not set up (setresuid etc.): errno.
    Setup(i32),
}

/// Forks; the child drops to `uid` (unless None), connects to `path`, sends `stats` and
/// counts the reply bytes until the server closes. Only async-signal-safe calls in the child.
fn talk_as(uid: Option<u32>, path: &Path) -> ChildSaw {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain data; zeroed is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    assert!(bytes.len() < addr.sun_path.len());
    for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let mut pipe = [0i32; 2];
    // SAFETY: pipe writes two fds into a live array.
    assert_eq!(unsafe { libc::pipe(pipe.as_mut_ptr()) }, 0);
    // SAFETY: the child only makes async-signal-safe calls and ends with _exit.
    let pid = unsafe { libc::fork() };
    assert!(pid >= 0, "fork failed");
    if pid == 0 {
        // SAFETY: child side; raw syscalls only, every buffer is live on this stack.
        unsafe {
            let report = |kind: i32, val: i32| -> ! {
                let msg = [kind, val];
                libc::write(pipe[1], msg.as_ptr().cast(), 8);
                libc::_exit(0)
            };
            if let Some(uid) = uid {
                if libc::setgroups(0, std::ptr::null()) != 0
                    || libc::setresgid(uid, uid, uid) != 0
                    || libc::setresuid(uid, uid, uid) != 0
                {
                    report(2, *libc::__errno_location());
                }
            }
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                report(2, *libc::__errno_location());
            }
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(fd, (&addr as *const libc::sockaddr_un).cast(), len) != 0 {
                report(0, *libc::__errno_location());
            }
            libc::write(fd, b"stats\n".as_ptr().cast(), 6);
            let mut buf = [0u8; 4096];
            let mut total = 0i32;
            loop {
                let n = libc::read(fd, buf.as_mut_ptr().cast(), buf.len());
                if n <= 0 {
                    break;
                }
                total += n as i32;
            }
            report(1, total);
        }
    }
    // SAFETY: closing our copy of the write end, reading 8 bytes into a live array, reaping our child.
    unsafe {
        libc::close(pipe[1]);
        let mut msg = [0i32; 2];
        let n = libc::read(pipe[0], msg.as_mut_ptr().cast(), 8);
        libc::close(pipe[0]);
        let mut status = 0;
        libc::waitpid(pid, &mut status, 0);
        assert_eq!(n, 8, "the child reported nothing");
        match msg[0] {
            0 => ChildSaw::ConnectErr(msg[1]),
            1 => ChildSaw::Reply(msg[1] as usize),
            _ => ChildSaw::Setup(msg[1]),
        }
    }
}

fn require_root() {
    // SAFETY: geteuid has no preconditions.
    assert_eq!(unsafe { libc::geteuid() }, 0, "this test drops to uid 65534 and needs to start as root");
}

#[test]
fn another_uid_is_refused() {
    let _serial = serial();
    require_root();
    let dir = TestDir::new("refuse");
    let p = Arc::new(pager(64 << 20, "zero,pool", FaultMode::Thread, 2));
    let srv = server(&p, &dir.0);

    // Root (our uid) gets a full reply through the same child code: the test can tell.
    match talk_as(None, srv.path()) {
        ChildSaw::Reply(n) => assert!(n > 100, "root got only {n} bytes"),
        other => panic!("root must be answered, saw {other:?}"),
    }

    // As shipped: the 0700 directory stops uid 65534 at connect().
    assert_eq!(talk_as(Some(65534), srv.path()), ChildSaw::ConnectErr(libc::EACCES));

    // Even with the directory and socket opened to everyone (a careless admin), the
    // SO_PEERCRED check closes the connection before a byte of stats is sent.
    std::fs::set_permissions(&dir.0, std::fs::Permissions::from_mode(0o711)).unwrap();
    std::fs::set_permissions(srv.path(), std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(talk_as(Some(65534), srv.path()), ChildSaw::Reply(0));

    // And the server still answers its own user afterwards.
    assert!(control::query_stats(srv.path()).is_ok());
    drop(srv);
}

#[test]
fn stale_sockets_are_removed() {
    let _serial = serial();
    let dir = TestDir::new("stale");
    std::fs::create_dir_all(&dir.0).unwrap();
    // A pid that certainly existed and is gone: a child we reaped.
    let child = std::process::Command::new("true").spawn().unwrap();
    let dead = child.id();
    let mut child = child;
    child.wait().unwrap();
    assert!(!control::pid_alive(dead));
    // A child that exited but is not reaped yet (a zombie) counts as gone too.
    let mut zombie = std::process::Command::new("true").spawn().unwrap();
    let zpid = zombie.id();
    loop {
        let st = std::fs::read_to_string(format!("/proc/{zpid}/stat")).unwrap();
        if st.rsplit_once(')').unwrap().1.trim_start().starts_with('Z') {
            break;
        }
        std::thread::yield_now();
    }
    assert!(!control::pid_alive(zpid), "a zombie is not alive");
    zombie.wait().unwrap();
    // A socket file left behind by that pid (bound, never unlinked), and one of a live pid.
    let stale = control::socket_path(&dir.0, dead);
    drop(UnixListener::bind(&stale).unwrap());
    let live = control::socket_path(&dir.0, 1);
    drop(UnixListener::bind(&live).unwrap());
    assert!(stale.exists() && live.exists());

    let p = Arc::new(pager(64 << 20, "zero,pool", FaultMode::Thread, 2));
    let srv = server(&p, &dir.0);
    assert!(!stale.exists(), "the dead pid's socket must be removed on start");
    assert!(live.exists(), "a live pid's socket must be kept");
    let listed: Vec<u32> = control::list_sockets(&dir.0).into_iter().map(|(pid, _)| pid).collect();
    let mut want = vec![1, std::process::id()];
    want.sort();
    assert_eq!(listed, want);

    // remove_stale itself: another dead socket appears, it goes, the live ones stay.
    drop(UnixListener::bind(&stale).unwrap());
    assert_eq!(control::remove_stale(&dir.0), vec![dead]);
    assert!(!stale.exists() && live.exists() && srv.path().exists());
    drop(srv);
}
