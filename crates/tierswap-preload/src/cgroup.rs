//! The budget, shown as the program's memory cgroup limit.
//!
//! Container-aware runtimes read their memory cgroup's limit and size themselves by it.
//! Measured on this project's machine (OpenJDK 17, Node.js 20): in a 256 MiB memcg the JVM
//! picks the Serial collector with an 8 MiB initial and a 126 MiB maximal heap, and V8 a
//! 259 MiB heap limit; seeing the machine's 24 GiB instead, the JVM picks G1 with a 380 MiB
//! initial and a 6 GiB maximal heap, V8 a 4,144 MiB limit. `tierswap run --budget B`
//! promises what a memcg limit of B gives, so the program should see B where it would see
//! a memcg's limit: a read of the limit file of its own memory cgroup (`memory.limit_in_bytes`
//! on cgroup v1, `memory.max` on v2) is answered with the budget, or with the real limit
//! when that is smaller. The JVM under a 288 MiB budget with `-Xmx2g` took 271 s or more
//! with the G1 it picked seeing 24 GiB, 175–220 s with the Serial collector it picks in a
//! memcg (docs/design.md, "The budget as the cgroup's limit").
//!
//! Only that: reads (read-only opens, by absolute path, as the JVM and libuv open them) of
//! those two files, in the directories `/proc/self/cgroup` names for this process under
//! the cgroup mounts `/proc/self/mountinfo` lists, through libc's `open`, `open64`,
//! `openat`, `openat64`, `fopen` and `fopen64` (`interpose.rs`, which hands every other
//! open to the next definition in the search order: a library the program preloads
//! itself, fakeroot's say, still sees its opens). Everything else, usage files included,
//! is the kernel's: a program making the system call itself (Go's runtime) reads the real
//! file. Not shown to a program that runs unmanaged (its pager could not start).
//!
//! The answer is a memfd holding the number and a newline, read from its start. Written
//! here, not taken from a crate: it runs inside the program's `open`, before and beside
//! the pager, and must not allocate (the path is compared and the number formatted on the
//! stack).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

/// The limit file of cgroup v1's memory controller.
const V1_LIMIT: &[u8] = b"memory.limit_in_bytes";
/// The limit file of cgroup v2.
const V2_LIMIT: &[u8] = b"memory.max";

/// The budget shown (bytes; 0: nothing shown, every open passes through).
static SHOWN: AtomicU64 = AtomicU64::new(0);
/// The limit files of this process's memory cgroup: (directory, file name).
static FILES: OnceLock<Vec<(Vec<u8>, &'static [u8])>> = OnceLock::new();

/// Shows `budget` as the limit of this process's memory cgroup from now on. Called once,
/// from the shim's constructor (single-threaded); a forked child keeps what its parent
/// found (the same cgroup), an exec'd program finds it again.
pub(crate) fn show(budget: u64) {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let files = limit_files(&read("/proc/self/cgroup"), &read("/proc/self/mountinfo"));
    if files.is_empty() || FILES.set(files).is_err() {
        return;
    }
    SHOWN.store(budget, Ordering::Release);
}

/// The limit files of the memory cgroup `cgroup` (the text of /proc/self/cgroup) names,
/// under the mounts of `mountinfo` (/proc/self/mountinfo's text).
pub(crate) fn limit_files(cgroup: &str, mountinfo: &str) -> Vec<(Vec<u8>, &'static [u8])> {
    // (hierarchy: cgroup v1's memory controller or v2's unified one, path)
    let mut paths: Vec<(bool, &str)> = Vec::new();
    for line in cgroup.lines() {
        let mut f = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (f.next(), f.next(), f.next()) else { continue };
        if controllers.split(',').any(|c| c == "memory") {
            paths.push((true, path));
        } else if id == "0" && controllers.is_empty() {
            paths.push((false, path));
        }
    }
    let mut files = Vec::new();
    for line in mountinfo.lines() {
        let Some((before, after)) = line.split_once(" - ") else { continue };
        let mount: Vec<&str> = before.split(' ').collect();
        let sup: Vec<&str> = after.split(' ').collect();
        let (Some(&root), Some(&point), Some(&fstype)) = (mount.get(3), mount.get(4), sup.first()) else { continue };
        // Escaped characters (\040 for a space) in a cgroup mount: not one runtimes read.
        if root.contains('\\') || point.contains('\\') {
            continue;
        }
        let v1 = match fstype {
            "cgroup" if sup.get(2).is_some_and(|o| o.split(',').any(|o| o == "memory")) => true,
            "cgroup2" => false,
            _ => continue,
        };
        for &(_, path) in paths.iter().filter(|(p1, _)| *p1 == v1) {
            let rest = if root == "/" { Some(path) } else { path.strip_prefix(root) };
            let Some(rest) = rest.filter(|r| r.is_empty() || r.starts_with('/')) else { continue };
            let dir = format!("{}{}", point.trim_end_matches('/'), rest);
            files.push((dir.into_bytes(), if v1 { V1_LIMIT } else { V2_LIMIT }));
        }
    }
    files
}

/// The path's components: repeated slashes and `.` count as nothing.
fn components(p: &[u8]) -> impl Iterator<Item = &[u8]> {
    p.split(|&b| b == b'/').filter(|c| !c.is_empty() && *c != b".")
}

/// Whether absolute `path` is one of this process's memory cgroup limit files.
fn is_limit_file(path: &[u8]) -> bool {
    if path.first() != Some(&b'/') {
        return false;
    }
    let Some(files) = FILES.get() else { return false };
    files.iter().any(|(dir, file)| components(path).eq(components(dir).chain(std::iter::once(*file))))
}

/// The number a limit file holds: bytes, or None for "max" (v2: no limit) and anything
/// unreadable.
pub(crate) fn parse_limit(text: &[u8]) -> Option<u64> {
    std::str::from_utf8(text).ok()?.trim().parse().ok()
}

/// What the program reads: the budget, or the real limit (`real`, the file's text) when
/// smaller.
pub(crate) fn shown_limit(budget: u64, real: Option<&[u8]>) -> u64 {
    real.and_then(parse_limit).map_or(budget, |r| r.min(budget))
}

/// `n` and a newline, in decimal, into `out`; the bytes written.
pub(crate) fn format_limit(n: u64, out: &mut [u8; 24]) -> usize {
    let mut digits = [0u8; 20];
    let mut k = 0;
    let mut v = n;
    loop {
        digits[k] = b'0' + (v % 10) as u8;
        k += 1;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    for i in 0..k {
        out[i] = digits[k - 1 - i];
    }
    out[k] = b'\n';
    k + 1
}

/// For a read-only open of `path` (a C string): a descriptor on the shown limit when the
/// path is this process's memory cgroup limit file, None to let the open pass through.
/// `cloexec` as the program asked (O_CLOEXEC, fopen's "e").
///
/// # Safety
/// `path` is a valid C string.
pub(crate) unsafe fn open_limit(path: *const libc::c_char, cloexec: bool) -> Option<libc::c_int> {
    let budget = SHOWN.load(Ordering::Acquire);
    if path.is_null() || budget == 0 {
        return None;
    }
    // SAFETY: the caller's C string (the program's open argument).
    let p = unsafe { std::ffi::CStr::from_ptr(path) }.to_bytes();
    if !is_limit_file(p) {
        return None;
    }
    let mut real = [0u8; 32];
    // SAFETY: raw openat/read/close on the program's own path, into our stack buffer.
    let real_len = unsafe {
        let fd = libc::syscall(libc::SYS_openat, libc::AT_FDCWD, path, libc::O_RDONLY | libc::O_CLOEXEC, 0) as i32;
        if fd < 0 {
            None
        } else {
            let n = libc::read(fd, real.as_mut_ptr().cast(), real.len());
            crate::raw::__close(fd);
            usize::try_from(n).ok()
        }
    };
    let shown = shown_limit(budget, real_len.map(|n| &real[..n]));
    let mut text = [0u8; 24];
    let len = format_limit(shown, &mut text);
    let flags = if cloexec { libc::MFD_CLOEXEC } else { 0 };
    // SAFETY: a fresh memfd of our own; written, then rewound for the program to read.
    unsafe {
        let fd = libc::memfd_create(c"tierswap-cgroup-limit".as_ptr(), flags);
        if fd < 0 {
            return None;
        }
        if libc::write(fd, text.as_ptr().cast(), len) != len as isize || libc::lseek(fd, 0, libc::SEEK_SET) != 0 {
            crate::raw::__close(fd);
            return None;
        }
        Some(fd)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
25 1 252:1 / / rw,relatime - ext4 /dev/vda rw
31 25 0:26 / /sys/fs/cgroup rw,nosuid - tmpfs tmpfs ro,mode=755
35 31 0:30 / /sys/fs/cgroup/memory rw,nosuid,nodev,noexec,relatime shared:12 - cgroup cgroup rw,memory
36 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,relatime - cgroup cgroup rw,cpu,cpuacct
37 31 0:32 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
";

    #[test]
    fn the_memory_controllers_directory_is_found_on_v1_and_v2() {
        let cgroup = "4:memory:/process_api/abc\n1:cpu,cpuacct:/\n0::/user.slice\n";
        let files = limit_files(cgroup, MOUNTINFO);
        let got: Vec<(String, &str)> = files
            .iter()
            .map(|(d, f)| (String::from_utf8(d.clone()).unwrap(), std::str::from_utf8(f).unwrap()))
            .collect();
        assert_eq!(
            got,
            vec![
                ("/sys/fs/cgroup/memory/process_api/abc".to_string(), "memory.limit_in_bytes"),
                ("/sys/fs/cgroup/unified/user.slice".to_string(), "memory.max"),
            ]
        );
        // A v2-only machine in its root cgroup: the mount itself.
        let v2 = limit_files("0::/\n", "30 1 0:27 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw,nsdelegate\n");
        assert_eq!(v2, vec![(b"/sys/fs/cgroup/".to_vec(), V2_LIMIT)]);
        // A mount whose root is the cgroup itself (a container's view).
        let inner = limit_files(
            "9:memory:/docker/x\n",
            "40 1 0:30 /docker/x /sys/fs/cgroup/memory ro - cgroup cgroup rw,memory\n",
        );
        assert_eq!(inner, vec![(b"/sys/fs/cgroup/memory".to_vec(), V1_LIMIT)]);
        // No memory controller anywhere: nothing.
        assert!(limit_files("1:cpu:/\n", MOUNTINFO).is_empty());
    }

    #[test]
    fn paths_match_whatever_their_slashes() {
        let dir = b"/sys/fs/cgroup/memory/a/b".to_vec();
        let want = |p: &[u8]| components(p).eq(components(&dir).chain(std::iter::once(V1_LIMIT)));
        assert!(want(b"/sys/fs/cgroup/memory/a/b/memory.limit_in_bytes"));
        assert!(want(b"/sys/fs/cgroup/memory//a/b/./memory.limit_in_bytes"));
        assert!(!want(b"/sys/fs/cgroup/memory/a/memory.limit_in_bytes"), "the parent's file");
        assert!(!want(b"/sys/fs/cgroup/memory/a/b/c/memory.limit_in_bytes"), "a child cgroup's");
        assert!(!want(b"/sys/fs/cgroup/memory/a/b/memory.soft_limit_in_bytes"));
    }

    #[test]
    fn the_smaller_of_the_budget_and_the_real_limit_is_shown() {
        let budget = 256 << 20;
        assert_eq!(shown_limit(budget, Some(b"9223372036854771712\n")), budget);
        assert_eq!(shown_limit(budget, Some(b"max\n")), budget);
        assert_eq!(shown_limit(budget, Some(b"67108864\n")), 64 << 20);
        assert_eq!(shown_limit(budget, None), budget);
        let mut out = [0u8; 24];
        for n in [0u64, 7, 10, 268_435_456, u64::MAX] {
            let len = format_limit(n, &mut out);
            assert_eq!(&out[..len], format!("{n}\n").as_bytes());
            assert_eq!(parse_limit(&out[..len]), Some(n), "round trip");
        }
    }
}
