//! The system settings the kernel engines change — zswap parameters, /dev/zram0, swap files,
//! memory cgroups — recorded before anything changes and put back afterwards: on success,
//! on error, on Ctrl-C, and (through a state file) after a run that was killed outright.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde::{Deserialize, Serialize};

/// Where the record of what we changed lives while we have changed it.
pub const STATE_DIR: &str = "/run/tierswap-bench";
const ZSWAP: &str = "/sys/module/zswap/parameters";
const ZRAM: &str = "/sys/block/zram0";
/// Names of everything we create start with this.
pub const PREFIX: &str = "tierswap-bench-";

/// What we changed and what it was before.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct Record {
    /// The process that made the changes.
    pub pid: u32,
    /// zswap parameters we changed: name → original value.
    pub zswap: BTreeMap<String, String>,
    /// zram0 was configured by us; its original comp_algorithm.
    pub zram_algorithm: Option<String>,
    /// Swap files we created (swapped on or not).
    pub swap_files: Vec<PathBuf>,
    /// Block devices we swapped on.
    pub swap_devices: Vec<PathBuf>,
    /// Cgroup directories we created.
    pub cgroups: Vec<PathBuf>,
}

fn state_file() -> PathBuf {
    Path::new(STATE_DIR).join("state.json")
}

/// Reads a sysfs/procfs value, trimmed.
pub fn read(path: impl AsRef<Path>) -> std::io::Result<String> {
    std::fs::read_to_string(path).map(|s| s.trim().to_string())
}

/// Writes a sysfs/procfs value.
pub fn write(path: impl AsRef<Path>, value: &str) -> Result<(), String> {
    let p = path.as_ref();
    std::fs::write(p, value).map_err(|e| format!("cannot write '{value}' to {}: {e}", p.display()))
}

/// The selected value of a sysfs choice list like `[lzo-rle] lzo lz4`.
pub fn selected(list: &str) -> String {
    list.split_whitespace()
        .find(|w| w.starts_with('['))
        .map(|w| w.trim_matches(|c| c == '[' || c == ']').to_string())
        .unwrap_or_else(|| list.trim().to_string())
}

fn run(cmd: &str, args: &[&str]) -> Result<(), String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("cannot run {cmd}: {e}"))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!("{cmd} {}: {}", args.join(" "), String::from_utf8_lossy(&out.stderr).trim()))
    }
}

/// Active swap areas, from /proc/swaps.
pub fn active_swaps() -> Vec<PathBuf> {
    read("/proc/swaps")
        .unwrap_or_default()
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next().map(PathBuf::from))
        .collect()
}

/// What this process has changed, while it holds the machine's swap settings.
struct Held {
    rec: Record,
    /// The state directory, open: its `flock` says this process holds the settings.
    _lock: std::fs::File,
    /// Live [`System`] handles.
    users: usize,
}

/// The process's record, shared by every kernel engine of a lab (kernel-zswap and
/// kernel-zram each held their own once: each recorded as "original" what the other had
/// set, and whichever restored last could leave zswap on).
static HELD: std::sync::Mutex<Option<Held>> = std::sync::Mutex::new(None);

fn held() -> std::sync::MutexGuard<'static, Option<Held>> {
    HELD.lock().unwrap_or_else(|e| e.into_inner())
}

/// A handle on the machine's swap settings for this process: every change is recorded
/// (original first, in memory and in the state file) and put back by [`System::restore`],
/// and when the last handle drops. One process at a time holds them (an exclusive `flock`
/// on the state directory): two labs side by side each recorded the other's
/// changes as the originals, and the one finishing last left zswap enabled.
pub struct System {
    _handle: (),
}

/// Takes the cross-process lock (an exclusive `flock` on the state directory itself, so no
/// file is left behind), or says who has it.
fn take_lock() -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    std::fs::create_dir_all(STATE_DIR).map_err(|e| format!("cannot create {STATE_DIR}: {e}"))?;
    let dir = std::fs::File::open(STATE_DIR).map_err(|e| format!("cannot open {STATE_DIR}: {e}"))?;
    // SAFETY: flock on a descriptor we opened; the kernel releases it when the process dies.
    if unsafe { libc::flock(dir.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        // The holder's pid is in its record once it has changed anything.
        let owner = std::fs::read_to_string(state_file())
            .ok()
            .and_then(|t| serde_json::from_str::<Record>(&t).ok())
            .map_or_else(|| "unknown".to_string(), |r| r.pid.to_string());
        return Err(format!(
            "another lab (pid {owner}) is changing this machine's swap settings; run one lab with kernel engines at a time"
        ));
    }
    Ok(dir)
}

impl System {
    /// Takes the machine's swap settings for this process (after undoing what a killed
    /// earlier run left behind), or joins the handles this process holds already. Fails
    /// while another live process holds them.
    pub fn acquire() -> Result<System, String> {
        let mut g = held();
        match g.as_mut() {
            Some(h) => h.users += 1,
            None => {
                let lock = take_lock()?;
                restore_leftovers();
                *g =
                    Some(Held { rec: Record { pid: std::process::id(), ..Default::default() }, _lock: lock, users: 1 });
            }
        }
        Ok(System { _handle: () })
    }

    /// Runs `f` on the record, then saves it if `f` says it changed.
    fn with<T>(&self, f: impl FnOnce(&mut Record) -> (T, bool)) -> T {
        let mut g = held();
        let h = g.as_mut().expect("a System handle keeps the record");
        let (out, changed) = f(&mut h.rec);
        if changed {
            save(&h.rec);
        }
        out
    }

    /// Sets a zswap parameter, remembering the original first.
    pub fn set_zswap(&mut self, name: &str, value: &str) -> Result<(), String> {
        let path = Path::new(ZSWAP).join(name);
        self.with(|rec| {
            if rec.zswap.contains_key(name) {
                return (Ok(()), false);
            }
            match read(&path) {
                Ok(orig) => {
                    rec.zswap.insert(name.to_string(), orig);
                    (Ok(()), true)
                }
                Err(e) => (Err(format!("cannot read {}: {e}", path.display())), false),
            }
        })?;
        write(&path, value)
    }

    /// Creates a swap file of `size_bytes` in `dir` and swaps on it.
    pub fn swapon_file(&mut self, dir: &Path, size_bytes: u64) -> Result<PathBuf, String> {
        let path = dir.join(format!("{PREFIX}{}.swap", std::process::id()));
        self.with(|rec| {
            rec.swap_files.push(path.clone());
            ((), true)
        });
        let _ = std::fs::remove_file(&path);
        {
            use std::os::fd::AsRawFd;
            use std::os::unix::fs::OpenOptionsExt;
            let f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
                .map_err(|e| format!("cannot create swap file {}: {e}", path.display()))?;
            // SAFETY: fallocate on our own new file; swap files must have no holes.
            let r = unsafe { libc::fallocate(f.as_raw_fd(), 0, 0, size_bytes as libc::off_t) };
            if r != 0 {
                return Err(format!(
                    "cannot allocate {} MiB for swap file {}: {}",
                    size_bytes >> 20,
                    path.display(),
                    std::io::Error::last_os_error()
                ));
            }
        }
        run("mkswap", &[path.to_str().unwrap_or_default()])?;
        run("swapon", &[path.to_str().unwrap_or_default()])?;
        Ok(path)
    }

    /// Configures /dev/zram0 (lz4, `size_bytes`) and swaps on it.
    pub fn swapon_zram(&mut self, size_bytes: u64) -> Result<(), String> {
        if !Path::new(ZRAM).exists() {
            let _ = run("modprobe", &["zram"]);
        }
        if !Path::new(ZRAM).exists() {
            return Err("no /dev/zram0 (modprobe zram failed)".into());
        }
        self.with(|rec| {
            if rec.zram_algorithm.is_some() {
                return (Ok(()), false);
            }
            if read(Path::new(ZRAM).join("disksize")).unwrap_or_default() != "0" {
                return (Err("/dev/zram0 is in use by someone else (disksize is not 0)".to_string()), false);
            }
            rec.zram_algorithm = Some(selected(&read(Path::new(ZRAM).join("comp_algorithm")).unwrap_or_default()));
            let dev = PathBuf::from("/dev/zram0");
            if !rec.swap_devices.contains(&dev) {
                rec.swap_devices.push(dev);
            }
            (Ok(()), true)
        })?;
        write(Path::new(ZRAM).join("reset"), "1")?;
        write(Path::new(ZRAM).join("comp_algorithm"), "lz4")?;
        write(Path::new(ZRAM).join("disksize"), &size_bytes.to_string())?;
        run("mkswap", &["/dev/zram0"])?;
        run("swapon", &["/dev/zram0"])
    }

    /// Swaps off and removes every swap area we made (between runs and at the end).
    pub fn swapoff_all(&mut self) {
        self.with(|rec| (remove_swap_areas(rec), false))
    }

    /// Records a cgroup we created.
    pub fn note_cgroup(&mut self, dir: &Path) {
        self.with(|rec| {
            rec.cgroups.push(dir.to_path_buf());
            ((), true)
        })
    }

    /// Puts everything back. Idempotent; the handles keep the settings for this process.
    pub fn restore(&mut self) {
        self.with(|rec| {
            restore_record(rec);
            *rec = Record { pid: rec.pid, ..Default::default() };
            let _ = std::fs::remove_file(state_file());
            ((), false)
        })
    }
}

impl Drop for System {
    fn drop(&mut self) {
        let mut g = held();
        let Some(h) = g.as_mut() else { return };
        h.users -= 1;
        if h.users == 0 {
            // The last handle: put everything back and let the settings go (closing the
            // directory releases the lock).
            restore_record(&h.rec);
            let _ = std::fs::remove_file(state_file());
            *g = None;
        }
    }
}

fn save(rec: &Record) {
    let _ = std::fs::create_dir_all(STATE_DIR);
    if let Ok(text) = serde_json::to_string_pretty(rec) {
        let tmp = state_file().with_extension("tmp");
        if std::fs::write(&tmp, text).is_ok() {
            let _ = std::fs::rename(tmp, state_file());
        }
    }
}

/// Makes `cmd`'s process enter memory cgroup `dir` between fork and exec, before it maps
/// anything: it writes its pid (`0`, itself) to the cgroup's `cgroup.procs`.
pub fn exec_in_cgroup(cmd: &mut std::process::Command, dir: &Path) -> Result<(), String> {
    use std::os::unix::process::CommandExt;
    let procs = std::ffi::CString::new(dir.join("cgroup.procs").to_string_lossy().as_bytes())
        .map_err(|e| format!("cgroup path {}: {e}", dir.display()))?;
    // SAFETY: between fork and exec only async-signal-safe calls (open, write, close) on
    // memory prepared before the fork.
    unsafe {
        cmd.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let r = libc::write(fd, b"0".as_ptr().cast(), 1);
            libc::close(fd);
            if r != 1 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    Ok(())
}

/// Removes a cgroup directory: its tasks go to the parent first.
pub fn remove_cgroup(dir: &Path) {
    if !dir.exists() {
        return;
    }
    let parent_procs = dir.parent().map(|p| p.join("cgroup.procs"));
    for _ in 0..50 {
        if let (Ok(procs), Some(pp)) = (read(dir.join("cgroup.procs")), &parent_procs) {
            for pid in procs.lines() {
                let _ = std::fs::write(pp, pid);
            }
        }
        if std::fs::remove_dir(dir).is_ok() || !dir.exists() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
}

/// Swaps off the swap areas `rec` made, removes its swap files and resets zram if it used it.
fn remove_swap_areas(rec: &Record) {
    let active = active_swaps();
    for p in rec.swap_files.iter().chain(&rec.swap_devices) {
        if active.contains(p) {
            let _ = run("swapoff", &[p.to_str().unwrap_or_default()]);
        }
    }
    for f in &rec.swap_files {
        let _ = std::fs::remove_file(f);
    }
    if rec.zram_algorithm.is_some() {
        let _ = write(Path::new(ZRAM).join("reset"), "1");
    }
}

fn restore_record(rec: &Record) {
    remove_swap_areas(rec);
    if let Some(alg) = &rec.zram_algorithm {
        let _ = write(Path::new(ZRAM).join("comp_algorithm"), alg);
    }
    for (name, value) in &rec.zswap {
        let _ = write(Path::new(ZSWAP).join(name), value);
    }
    for c in &rec.cgroups {
        remove_cgroup(c);
    }
}

fn pid_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Undoes what an earlier lab left behind if it was killed before it could (SIGKILL, power
/// loss of the session…): the state file's record, plus any swap area or cgroup named like
/// ours whose owner is gone. Returns one line per thing put back.
pub fn restore_leftovers() -> Vec<String> {
    let mut done = Vec::new();
    if let Ok(text) = std::fs::read_to_string(state_file()) {
        if let Ok(rec) = serde_json::from_str::<Record>(&text) {
            if rec.pid == std::process::id() || !pid_alive(rec.pid) {
                restore_record(&rec);
                done.push(format!("restored what lab process {} left: {:?}", rec.pid, rec));
                let _ = std::fs::remove_file(state_file());
            }
        }
    }
    for p in active_swaps() {
        let name = p.file_name().and_then(|n| n.to_str()).unwrap_or_default().to_string();
        if let Some(pid) =
            name.strip_prefix(PREFIX).and_then(|r| r.strip_suffix(".swap")).and_then(|r| r.parse::<u32>().ok())
        {
            if !pid_alive(pid) || pid == std::process::id() {
                let _ = run("swapoff", &[p.to_str().unwrap_or_default()]);
                let _ = std::fs::remove_file(&p);
                done.push(format!("swapped off {}", p.display()));
            }
        }
    }
    for root in ["/sys/fs/cgroup/memory", "/sys/fs/cgroup"] {
        if let Ok(rd) = std::fs::read_dir(root) {
            for e in rd.flatten() {
                let name = e.file_name().to_string_lossy().to_string();
                if let Some(rest) = name.strip_prefix(PREFIX) {
                    let pid = rest.split('-').next().and_then(|p| p.parse::<u32>().ok());
                    if pid.is_some_and(|p| !pid_alive(p) || p == std::process::id()) {
                        remove_cgroup(&e.path());
                        done.push(format!("removed cgroup {}", e.path().display()));
                    }
                }
            }
        }
    }
    done
}

/// The memory controller's root and its limit, usage and peak file names: cgroup v1 at
/// /sys/fs/cgroup/memory (this machine), else v2 with the memory controller on.
pub fn memcg() -> Option<(PathBuf, &'static str, &'static str, &'static str)> {
    let v1 = PathBuf::from("/sys/fs/cgroup/memory");
    if v1.join("memory.limit_in_bytes").exists() {
        return Some((v1, "memory.limit_in_bytes", "memory.usage_in_bytes", "memory.max_usage_in_bytes"));
    }
    let v2 = PathBuf::from("/sys/fs/cgroup");
    if read(v2.join("cgroup.controllers")).unwrap_or_default().split_whitespace().any(|c| c == "memory") {
        return Some((v2, "memory.max", "memory.current", "memory.peak"));
    }
    None
}

/// How many times the kernel OOM-killed a process of memcg `cg` (v1 `memory.oom_control`,
/// v2 `memory.events`: their `oom_kill` line); 0 when unreadable.
pub fn memcg_oom_kills(cg: &Path) -> u64 {
    read(cg.join("memory.oom_control"))
        .or_else(|_| read(cg.join("memory.events")))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill ").and_then(|v| v.trim().parse::<u64>().ok()))
        .unwrap_or(0)
}

/// The kernel's swap-in counters for the program in memcg `cg`, named as tierswap's own so
/// the programs lab sets them side by side: `faults`, the memcg's major faults (`pgmajfault`
/// of its memory.stat: a fault that read a page back from swap, zswap or zram); `pswpin`
/// and `zswpin`, pages read in from the swap device and from zswap, from /proc/vmstat
/// (machine-wide: the lab runs one program at a time). A counter that cannot be read is
/// left out.
pub fn kernel_swapin_counters(cg: &Path) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    let field = |text: &str, name: &str| {
        text.lines().find_map(|l| {
            let (k, v) = l.split_once(' ')?;
            (k == name).then(|| v.trim().parse::<u64>().ok()).flatten()
        })
    };
    let stat = read(cg.join("memory.stat")).unwrap_or_default();
    if let Some(v) = field(&stat, "pgmajfault") {
        out.insert("faults".to_string(), v);
    }
    let vmstat = read("/proc/vmstat").unwrap_or_default();
    for name in ["pswpin", "zswpin"] {
        if let Some(v) = field(&vmstat, name) {
            out.insert(name.to_string(), v);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_choice_lists() {
        assert_eq!(selected("[lzo-rle] lzo lz4"), "lzo-rle");
        assert_eq!(selected("lzo [lz4] zstd"), "lz4");
        assert_eq!(selected("lzo"), "lzo");
    }

    #[test]
    fn kernel_counters_read_a_memcg_and_vmstat() {
        let dir = std::env::temp_dir().join(format!("tierswap-kcounters-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("memory.stat"), "cache 0\npgmajfault 1234\ntotal_pgmajfault 99999\n").unwrap();
        let c = kernel_swapin_counters(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(c.get("faults"), Some(&1234), "the memcg's own line, not the hierarchy's total");
        let vmstat = std::fs::read_to_string("/proc/vmstat").unwrap();
        let has = |n: &str| vmstat.lines().any(|l| l.split(' ').next() == Some(n));
        assert_eq!(c.contains_key("pswpin"), has("pswpin"));
        assert_eq!(c.contains_key("zswpin"), has("zswpin"));
    }
}
