//! The control socket: a running pager answers `tierswap stat` on a unix stream socket.
//!
//! Owns the socket directory, the socket file and one server thread. The thread calls the
//! stats closure it was given and nothing else of the engine: it takes no lock of the fault
//! path beyond what [`crate::Pager::stats`] takes for a snapshot.
//!
//! Where: `$TIERSWAP_CONTROL_DIR/<pid>.sock` when that is set, else the first usable of
//! `$XDG_RUNTIME_DIR/tierswap/`, `/run/tierswap/` (root) and `$TMPDIR/tierswap-<uid>/`.
//! The directory is 0700 and ours; the socket is 0600; and every connection's peer
//! credentials (SO_PEERCRED) are checked: only our uid or root get an answer.
//!
//! Protocol, version 1: the client sends one line, the server one JSON object, then closes.
//! `stats` → `{"v":1,"pid":…,"cmdline":…,"started_unix":…,"stats":{…}}`; `ping` →
//! `{"v":1,"ok":true}`; anything else → `{"v":1,"error":"…"}`.

use std::ffi::CString;
use std::io::{BufRead, BufReader, Read, Write};
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Serialize};

use crate::Stats;

/// The protocol version this module speaks.
pub const PROTOCOL_VERSION: u32 = 1;

/// The environment variable that overrides the socket directory (server and client).
pub const DIR_ENV: &str = "TIERSWAP_CONTROL_DIR";

/// Longest request line the server reads.
const MAX_REQUEST_BYTES: u64 = 256;

/// How long the server waits for a client's request or for it to take the reply.
const CLIENT_TIMEOUT: Duration = Duration::from_secs(2);

/// What went wrong with the control socket.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// The socket directory could not be made or checked.
    #[error("cannot prepare the control socket directory {dir}: {source}; set {DIR_ENV} to a writable directory")]
    Dir {
        /// The directory.
        dir: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The socket directory belongs to another user or is not a plain directory.
    #[error("control socket directory {dir} {why}: refusing to put a socket there; remove it or set {DIR_ENV}")]
    DirUnsafe {
        /// The directory.
        dir: PathBuf,
        /// What is wrong with it.
        why: String,
    },
    /// A live server already answers on this path.
    #[error("control socket {path} is already served by a live pager of this process; drop that ControlServer first")]
    InUse {
        /// The socket path.
        path: PathBuf,
    },
    /// bind, listen, chmod or the thread failed.
    #[error("cannot {what} for control socket {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// No socket at this path, or nothing listening: the process exited or is not managed.
    #[error("no tierswap pager answers at {path}: {source}")]
    NotServing {
        /// The socket path.
        path: PathBuf,
        /// Why.
        source: std::io::Error,
    },
    /// The socket or its directory is another user's.
    #[error("permission denied on {path}: the process belongs to another user (run as that user or as root)")]
    PermissionDenied {
        /// The socket path.
        path: PathBuf,
    },
    /// The server closed the connection without a reply: it refused our credentials.
    #[error(
        "the pager at {path} closed the connection without answering: it refuses our uid (another user's process?)"
    )]
    Refused {
        /// The socket path.
        path: PathBuf,
    },
    /// The reply was not what protocol version 1 says.
    #[error("bad reply from {path}: {what}")]
    Protocol {
        /// The socket path.
        path: PathBuf,
        /// What was wrong.
        what: String,
    },
    /// The server answered with an error.
    #[error("the pager at {path} answered: {message}")]
    Server {
        /// The socket path.
        path: PathBuf,
        /// Its message.
        message: String,
    },
}

/// Result of this module.
pub type Result<T> = std::result::Result<T, Error>;

/// How to start a [`ControlServer`].
#[derive(Clone, Debug, Default)]
pub struct ControlOptions {
    /// Directory of the socket; `None`: `$TIERSWAP_CONTROL_DIR`, else the default search order.
    pub dir: Option<PathBuf>,
    /// The command line reported to clients; `None`: `/proc/self/cmdline`.
    pub cmdline: Option<String>,
}

/// The reply to `stats`.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct StatsReply {
    /// Protocol version.
    pub v: u32,
    /// The process.
    pub pid: u32,
    /// Its command line, arguments joined by spaces.
    pub cmdline: String,
    /// When the server started, seconds since the epoch.
    pub started_unix: u64,
    /// The pager's counters and gauges.
    pub stats: Stats,
}

/// A running control socket; dropping it stops the thread and removes the socket.
pub struct ControlServer {
    path: PathBuf,
    /// (dev, ino) of the socket we bound, so drop removes only our own file.
    ident: (u64, u64),
    /// Written to wake and stop the thread.
    stop: Arc<OwnedFd>,
    thread: Option<JoinHandle<()>>,
}

impl ControlServer {
    /// Binds `<dir>/<pid>.sock` and starts the thread that answers on it; `stats` is called
    /// once per `stats` request.
    pub fn start<F>(stats: F, opts: ControlOptions) -> Result<ControlServer>
    where
        F: Fn() -> Stats + Send + Sync + 'static,
    {
        let dir = match &opts.dir {
            Some(d) => {
                prepare_dir(d)?;
                d.clone()
            }
            None => pick_dir()?,
        };
        remove_stale(&dir);
        let pid = std::process::id();
        let path = socket_path(&dir, pid);
        if path.symlink_metadata().is_ok() {
            if UnixStream::connect(&path).is_ok() {
                return Err(Error::InUse { path });
            }
            // Our pid, nobody listening: left by an earlier process with this pid.
            let _ = std::fs::remove_file(&path);
        }
        let listener =
            UnixListener::bind(&path).map_err(|source| Error::Io { what: "bind", path: path.clone(), source })?;
        // The directory is 0700 already; the chmod makes the socket 0600 whatever the umask.
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).map_err(|source| Error::Io {
            what: "chmod 0600",
            path: path.clone(),
            source,
        })?;
        let meta = path.symlink_metadata().map_err(|source| Error::Io { what: "stat", path: path.clone(), source })?;
        let ident = (meta.dev(), meta.ino());
        let stop = match crate::sys::eventfd() {
            Ok(fd) => Arc::new(fd),
            Err(source) => {
                let _ = std::fs::remove_file(&path);
                return Err(Error::Io { what: "create the stop eventfd", path, source });
            }
        };
        let cmdline = opts.cmdline.clone();
        let started_unix = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
        let ctx = ServeContext { listener, stop: stop.clone(), path: path.clone(), pid, cmdline, started_unix };
        let thread = std::thread::Builder::new()
            .name("tierswap-control".into())
            .spawn(move || {
                // Like every pager thread: a program's handler of a signal its own threads
                // block for a moment (bash's SIGCHLD) must wait for them, not run here.
                crate::sys::block_signals();
                ctx.serve(stats)
            })
            .map_err(|source| Error::Io { what: "start the server thread", path: path.clone(), source });
        let thread = match thread {
            Ok(t) => t,
            Err(e) => {
                let _ = std::fs::remove_file(&path);
                return Err(e);
            }
        };
        Ok(ControlServer { path, ident, stop, thread: Some(thread) })
    }

    /// Leaves the server running for the rest of the process (its thread is never joined)
    /// and returns the name of its socket, for [`BoundSocket::remove`] at exit, where no
    /// destructor runs.
    pub fn run_until_exit(self) -> BoundSocket {
        // A path from a directory name and a pid: no interior NUL.
        let path = CString::new(self.path.as_os_str().as_bytes()).expect("a socket path without NUL");
        let bound = BoundSocket { path, ident: self.ident, pid: std::process::id() };
        std::mem::forget(self);
        bound
    }

    /// The socket's path.
    pub fn path(&self) -> &Path {
        &self.path
    }
}

/// The socket a server bound, named for taking it away at the process's exit
/// ([`ControlServer::run_until_exit`]).
#[derive(Debug)]
pub struct BoundSocket {
    /// Its path, ready for the system calls of [`BoundSocket::remove`].
    path: CString,
    /// (dev, ino) of the socket bound.
    ident: (u64, u64),
    /// The process that bound it.
    pid: u32,
}

impl BoundSocket {
    /// Removes the socket if it is still the one bound, and this is the process that bound
    /// it (a forked child holds a copy of this name and must leave its parent's socket be).
    /// Allocates nothing and takes no lock: it runs in `_exit`, which a forked child of a
    /// threaded program may call while another thread's lock was copied held.
    pub fn remove(&self) {
        if self.pid != std::process::id() {
            return;
        }
        // SAFETY: `stat` is plain old data, all zeroes a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `path` is a NUL-terminated string that lives as long as `self`; `st` is a
        // writable stat buffer.
        if unsafe { libc::lstat(self.path.as_ptr(), &mut st) } != 0 {
            return;
        }
        if (st.st_dev, st.st_ino) == self.ident {
            // SAFETY: as for lstat; unlink only reads the path.
            unsafe { libc::unlink(self.path.as_ptr()) };
        }
    }
}

impl Drop for ControlServer {
    fn drop(&mut self) {
        crate::sys::eventfd_ring(self.stop.as_fd());
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
        if let Ok(m) = self.path.symlink_metadata() {
            if (m.dev(), m.ino()) == self.ident {
                let _ = std::fs::remove_file(&self.path);
            }
        }
    }
}

/// What the server thread owns.
struct ServeContext {
    listener: UnixListener,
    stop: Arc<OwnedFd>,
    path: PathBuf,
    pid: u32,
    /// A fixed command line; `None`: read at each request (a server renames its processes:
    /// PostgreSQL's backends, nginx's workers).
    cmdline: Option<String>,
    started_unix: u64,
}

impl ServeContext {
    fn serve<F: Fn() -> Stats>(self, stats: F) {
        let our_uid = euid();
        loop {
            let mut fds = [
                libc::pollfd { fd: self.listener.as_raw_fd(), events: libc::POLLIN, revents: 0 },
                libc::pollfd { fd: self.stop.as_raw_fd(), events: libc::POLLIN, revents: 0 },
            ];
            // SAFETY: fds is a live array of two pollfds.
            let n = unsafe { libc::poll(fds.as_mut_ptr(), 2, -1) };
            if n < 0 {
                if std::io::Error::last_os_error().kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                eprintln!(
                    "tierswap: control socket {}: poll failed ({}); no more stat answers",
                    self.path.display(),
                    std::io::Error::last_os_error()
                );
                return;
            }
            if fds[1].revents != 0 {
                return;
            }
            if fds[0].revents == 0 {
                continue;
            }
            let conn = match self.listener.accept() {
                Ok((conn, _)) => conn,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
                Err(_) => {
                    // Out of fds or memory: the pending connection stays readable, so a
                    // short pause keeps this from spinning until it can be taken.
                    std::thread::sleep(Duration::from_millis(100));
                    continue;
                }
            };
            match peer_cred(&conn) {
                Ok(cred) if cred.uid == our_uid || cred.uid == 0 => self.answer(conn, &stats),
                Ok(cred) => eprintln!(
                    "tierswap: control socket {}: refused pid {} uid {}: only {} may read this process's counters",
                    self.path.display(),
                    cred.pid,
                    cred.uid,
                    if our_uid == 0 { "root".to_string() } else { format!("uid {our_uid} or root") }
                ),
                Err(e) => eprintln!(
                    "tierswap: control socket {}: refused a connection whose credentials cannot be read: {e}",
                    self.path.display()
                ),
            }
        }
    }

    /// Reads one request line, writes one reply, closes. A slow client is dropped after
    /// [`CLIENT_TIMEOUT`] so it cannot hold the thread.
    fn answer<F: Fn() -> Stats>(&self, conn: UnixStream, stats: &F) {
        let _ = conn.set_read_timeout(Some(CLIENT_TIMEOUT));
        let _ = conn.set_write_timeout(Some(CLIENT_TIMEOUT));
        let mut line = String::new();
        let Ok(read) = conn.try_clone() else { return };
        if BufReader::new(read.take(MAX_REQUEST_BYTES)).read_line(&mut line).is_err() {
            return;
        }
        let reply = match line.trim() {
            "stats" => match std::panic::catch_unwind(std::panic::AssertUnwindSafe(stats)) {
                Ok(s) => serde_json::to_value(StatsReply {
                    v: PROTOCOL_VERSION,
                    pid: self.pid,
                    cmdline: self.cmdline.clone().unwrap_or_else(own_cmdline),
                    started_unix: self.started_unix,
                    stats: s,
                })
                .unwrap_or_else(|e| error_reply(&format!("cannot encode the stats: {e}"))),
                Err(_) => error_reply("the stats snapshot panicked"),
            },
            "ping" => serde_json::json!({"v": PROTOCOL_VERSION, "ok": true}),
            other => {
                let shown: String = other.chars().take(40).flat_map(char::escape_default).collect();
                error_reply(&format!("unknown request '{shown}': send 'stats' or 'ping'"))
            }
        };
        let mut conn = conn;
        let mut text = reply.to_string();
        text.push('\n');
        let _ = conn.write_all(text.as_bytes());
    }
}

fn error_reply(msg: &str) -> serde_json::Value {
    serde_json::json!({"v": PROTOCOL_VERSION, "error": msg})
}

/// A connected peer's credentials.
#[derive(Clone, Copy, Debug)]
struct PeerCred {
    pid: i32,
    uid: u32,
}

fn peer_cred(conn: &UnixStream) -> std::io::Result<PeerCred> {
    let mut cred = libc::ucred { pid: 0, uid: 0, gid: 0 };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred and len are live and len is cred's size, as SO_PEERCRED expects.
    let rc = unsafe {
        libc::getsockopt(
            conn.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(PeerCred { pid: cred.pid, uid: cred.uid })
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

fn own_cmdline() -> String {
    std::fs::read("/proc/self/cmdline")
        .map(|b| {
            b.split(|&c| c == 0).filter(|a| !a.is_empty()).map(String::from_utf8_lossy).collect::<Vec<_>>().join(" ")
        })
        .unwrap_or_default()
}

/// `<dir>/<pid>.sock`.
pub fn socket_path(dir: &Path, pid: u32) -> PathBuf {
    dir.join(format!("{pid}.sock"))
}

/// The directories a server may use, in the order it tries them: `$TIERSWAP_CONTROL_DIR`
/// alone when set, else `$XDG_RUNTIME_DIR/tierswap`, `/run/tierswap` (root only),
/// `$TMPDIR/tierswap-<uid>`.
pub fn default_dirs() -> Vec<PathBuf> {
    if let Some(d) = std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()) {
        return vec![PathBuf::from(d)];
    }
    let mut dirs = Vec::new();
    if let Some(x) = std::env::var_os("XDG_RUNTIME_DIR").filter(|d| !d.is_empty()) {
        dirs.push(Path::new(&x).join("tierswap"));
    }
    if euid() == 0 {
        dirs.push(PathBuf::from("/run/tierswap"));
    }
    dirs.push(std::env::temp_dir().join(format!("tierswap-{}", euid())));
    dirs
}

/// The directories a client searches: [`default_dirs`], and for root (unless
/// `$TIERSWAP_CONTROL_DIR` is set) every user's `/run/user/*/tierswap` and
/// `$TMPDIR/tierswap-*` too. Only directories that exist.
pub fn search_dirs() -> Vec<PathBuf> {
    let mut dirs = default_dirs();
    if std::env::var_os(DIR_ENV).filter(|d| !d.is_empty()).is_none() && euid() == 0 {
        if let Ok(rd) = std::fs::read_dir("/run/user") {
            dirs.extend(rd.flatten().map(|e| e.path().join("tierswap")));
        }
        if let Ok(rd) = std::fs::read_dir(std::env::temp_dir()) {
            dirs.extend(
                rd.flatten()
                    .filter(|e| e.file_name().to_str().is_some_and(|n| n.starts_with("tierswap-")))
                    .map(|e| e.path()),
            );
        }
    }
    let mut seen = Vec::new();
    for d in dirs {
        if d.is_dir() && !seen.contains(&d) {
            seen.push(d);
        }
    }
    seen
}

fn pick_dir() -> Result<PathBuf> {
    let mut last = None;
    for d in default_dirs() {
        match prepare_dir(&d) {
            Ok(()) => return Ok(d),
            Err(e) => last = Some(e),
        }
    }
    Err(last.unwrap_or_else(|| Error::DirUnsafe { dir: PathBuf::new(), why: "is not set".into() }))
}

/// Creates `dir` 0700 if missing; checks it is a real directory of ours and makes it 0700.
fn prepare_dir(dir: &Path) -> Result<()> {
    if let Some(parent) = dir.parent() {
        if !parent.as_os_str().is_empty() && !parent.is_dir() {
            return Err(Error::Dir {
                dir: dir.to_path_buf(),
                source: std::io::Error::new(std::io::ErrorKind::NotFound, "its parent does not exist"),
            });
        }
    }
    match std::fs::DirBuilder::new().mode(0o700).create(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(source) => return Err(Error::Dir { dir: dir.to_path_buf(), source }),
    }
    let meta = dir.symlink_metadata().map_err(|source| Error::Dir { dir: dir.to_path_buf(), source })?;
    if !meta.file_type().is_dir() {
        return Err(Error::DirUnsafe { dir: dir.to_path_buf(), why: "is not a directory (a symlink?)".into() });
    }
    if meta.uid() != euid() {
        return Err(Error::DirUnsafe {
            dir: dir.to_path_buf(),
            why: format!("belongs to uid {}, not to us (uid {})", meta.uid(), euid()),
        });
    }
    if meta.mode() & 0o7777 != 0o700 {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
            .map_err(|source| Error::Dir { dir: dir.to_path_buf(), source })?;
    }
    Ok(())
}

/// Whether process `pid` exists (ours or another user's) and has not exited: a zombie,
/// exited but not yet reaped, counts as gone.
pub fn pid_alive(pid: u32) -> bool {
    let Ok(p) = libc::pid_t::try_from(pid) else { return false };
    if p <= 0 {
        return false;
    }
    // SAFETY: signal 0 only checks that the process exists; nothing is sent.
    let rc = unsafe { libc::kill(p, 0) };
    if rc != 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ESRCH) {
        return false;
    }
    // /proc/<pid>/stat: "pid (comm) S …"; comm may hold spaces and parentheses, the state
    // follows the last ')'.
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(st) => !matches!(st.rfind(')').and_then(|i| st[i + 1..].trim_start().chars().next()), Some('Z' | 'X')),
        Err(_) => true,
    }
}

/// The pid a socket file name stands for: `<pid>.sock`.
pub fn pid_of_socket(path: &Path) -> Option<u32> {
    path.file_name()?.to_str()?.strip_suffix(".sock")?.parse().ok()
}

/// The sockets in `dir` as `(pid, path)`, sorted by pid.
pub fn list_sockets(dir: &Path) -> Vec<(u32, PathBuf)> {
    let mut out: Vec<(u32, PathBuf)> = std::fs::read_dir(dir)
        .map(|rd| rd.flatten().filter_map(|e| pid_of_socket(&e.path()).map(|pid| (pid, e.path()))).collect())
        .unwrap_or_default();
    out.sort();
    out
}

/// Removes the sockets in `dir` whose process is gone; returns their pids.
pub fn remove_stale(dir: &Path) -> Vec<u32> {
    let mut gone = Vec::new();
    for (pid, path) in list_sockets(dir) {
        if !pid_alive(pid) && std::fs::remove_file(&path).is_ok() {
            gone.push(pid);
        }
    }
    gone
}

/// Sends `request` to the server at `path` and returns its JSON reply.
pub fn request(path: &Path, request: &str) -> Result<serde_json::Value> {
    let mut conn = UnixStream::connect(path).map_err(|source| match source.kind() {
        std::io::ErrorKind::PermissionDenied => Error::PermissionDenied { path: path.to_path_buf() },
        _ => Error::NotServing { path: path.to_path_buf(), source },
    })?;
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let _ = conn.set_write_timeout(Some(Duration::from_secs(10)));
    let io = |source: std::io::Error| Error::NotServing { path: path.to_path_buf(), source };
    // The server may already have closed a refused connection: a broken pipe here is that.
    if let Err(e) = conn.write_all(format!("{request}\n").as_bytes()) {
        if e.kind() == std::io::ErrorKind::BrokenPipe || e.kind() == std::io::ErrorKind::ConnectionReset {
            return Err(Error::Refused { path: path.to_path_buf() });
        }
        return Err(io(e));
    }
    let mut text = String::new();
    match conn.read_to_string(&mut text) {
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {
            return Err(Error::Refused { path: path.to_path_buf() })
        }
        Err(e) => return Err(io(e)),
    }
    if text.is_empty() {
        return Err(Error::Refused { path: path.to_path_buf() });
    }
    let v: serde_json::Value = serde_json::from_str(text.trim())
        .map_err(|e| Error::Protocol { path: path.to_path_buf(), what: format!("not JSON ({e})") })?;
    if v["v"].as_u64() != Some(PROTOCOL_VERSION as u64) {
        return Err(Error::Protocol {
            path: path.to_path_buf(),
            what: format!("protocol version {} (we speak {PROTOCOL_VERSION})", v["v"]),
        });
    }
    if let Some(msg) = v["error"].as_str() {
        return Err(Error::Server { path: path.to_path_buf(), message: msg.to_string() });
    }
    Ok(v)
}

/// Asks the server at `path` for its counters.
pub fn query_stats(path: &Path) -> Result<StatsReply> {
    let v = request(path, "stats")?;
    serde_json::from_value(v)
        .map_err(|e| Error::Protocol { path: path.to_path_buf(), what: format!("not a stats reply ({e})") })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn socket_names() {
        assert_eq!(pid_of_socket(Path::new("/x/123.sock")), Some(123));
        assert_eq!(pid_of_socket(Path::new("/x/123.sock.tmp")), None);
        assert_eq!(pid_of_socket(Path::new("/x/abc.sock")), None);
        assert_eq!(socket_path(Path::new("/d"), 7), PathBuf::from("/d/7.sock"));
    }

    #[test]
    fn liveness() {
        assert!(pid_alive(std::process::id()));
        assert!(!pid_alive(0));
        assert!(!pid_alive(u32::MAX));
    }
}
