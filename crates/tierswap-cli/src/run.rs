//! `tierswap run`: runs an unmodified program with its anonymous memory under a budget.
//!
//! Checks the flags, finds `libtierswap_preload.so`, puts it in `LD_PRELOAD` with the
//! settings in `TIERSWAP_*` variables (the shim reads them in its constructor; `--set`'s
//! engine settings, checked here with the engine's parser, in `TIERSWAP_SETTINGS`) and execs
//! the program: the process *is* the program, so its exit status and signals reach the
//! caller unchanged.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use clap::Args;
use tierswap::config::Setting;
use tierswap::{parse_size, PagerConfig, Tiers};

/// The variables the shim reads, all set (or removed) by `run` so a stale one in the
/// caller's environment cannot change the run.
const OWNED_VARS: [&str; 15] = [
    "TIERSWAP_BUDGET",
    "TIERSWAP_COMPRESSOR",
    "TIERSWAP_TIERS",
    "TIERSWAP_POOL_MAX",
    "TIERSWAP_SWAP_DIR",
    "TIERSWAP_MIN_SIZE",
    "TIERSWAP_MALLOC",
    "TIERSWAP_STRICT",
    "TIERSWAP_STATS_ON_EXIT",
    "TIERSWAP_FAULT_THREADS",
    "TIERSWAP_PIN",
    "TIERSWAP_FAULT_MODE",
    "TIERSWAP_SETTINGS",
    "TIERSWAP_TREE",
    "TIERSWAP_CGROUP_LIMIT",
];

/// Most fault threads `--fault-threads` takes: more only cost memory and wake-ups.
const MAX_FAULT_THREADS: usize = 256;

/// The shim's file name.
const PRELOAD_NAME: &str = "libtierswap_preload.so";

const LONG_ABOUT: &str = "\
Runs PROG with its anonymous memory under a budget: cold pages go to a compressed pool \
in memory and a disk file (unlinked, 0600, encrypted) and come back on the next touch.

Managed: anonymous private mmaps of at least --min-size, read-write or PROT_NONE (a \
runtime's reservation: the JVM's heap, Go's arenas, V8's pages; what it commits in it \
with mmap MAP_FIXED or mprotect is managed at once, what it uncommits is given back); \
smaller read-write ones asked for without an address, in thread mode, a page at a time \
from managed 1 GiB zones (Ruby's heap pages; munmap gives them back to the zone, mremap \
stays in it or copies out); and malloc, calloc, \
realloc, posix_memalign, aligned_alloc, memalign, valloc (--malloc all: every size, from \
the shim's own heap on managed memory; --malloc large: only sizes of at least --min-size; \
--malloc off: none). munmap, mremap and madvise otherwise pass through and the pager follows them \
(MADV_FREE on managed memory becomes MADV_DONTNEED).

Not managed: file mappings, shared memory (MAP_SHARED, shm, memfd), thread stacks, \
MAP_FIXED mappings outside managed memory, executable mappings, memory the program maps \
before the shim starts, memory of programs \
that do not use the dynamic libc (static binaries), setuid programs (the loader ignores \
LD_PRELOAD for them), and the brk heap glibc grows itself when --malloc is off.

Fault mode (--fault-mode): thread, the default, serves a fault on a swapped-out page in \
one of the pager's fault threads while the faulting thread sleeps; every access works, a \
system call's too. signal serves it in the faulting thread itself, in a SIGBUS handler: \
faster (no hand-off between CPUs), but a read(2)/write(2) (or any system call) whose buffer \
is swapped out, or malloc'd and not touched yet, fails with EFAULT (what glibc allocates \
for itself, a stdio stream's buffer, a directory stream's, stays unmanaged in signal mode \
so these work). A SIGBUS handler the program installs (sigaction, signal) is kept behind \
the pager's, which passes it every SIGBUS that is not a fault on managed memory.

The budget covers the process tree, as a memory cgroup's limit does: PROG, its forked \
children and the programs they exec share it, each process with a pager charging its \
footprint to a ledger on tmpfs (/dev/shm/tierswap-tree.PID). While the tree is under the \
budget each process may grow by an equal part of the room left (looked at again every few \
milliseconds); over it, each gives back in proportion to its size. A forked child (thread mode) and an exec'd program start a pager of their own at \
their first need (a managed-size mapping or allocation, or 4 MiB allocated), so a child \
that only execs costs nothing; what the parent managed before the fork stays served by \
the parent's pager (pages a child reads or writes of it are the child's, resident, not \
counted). In signal mode a forked child manages nothing new. --per-process gives every \
process a budget of its own instead. `tierswap stat PID` shows the tree.

The program sees the budget as its memory cgroup's limit: reading memory.limit_in_bytes \
(cgroup v1) or memory.max (v2) of its own cgroup gives the budget, or the real limit when \
that is smaller, as under a memcg of that limit. Runtimes that size themselves by it do so \
for the budget: under --budget 256M the JVM picks the Serial collector and a 126 MiB \
maximal heap (seeing the machine, G1 and a quarter of its memory), Node.js a 259 MiB heap \
limit. Reads by absolute path through libc's open and fopen only (a raw system call reads \
the real file); --real-cgroup-limit turns it off.

Programs the shim cannot reach: LD_PRELOAD is read by the dynamic loader only, so a \
statically linked program (a Go binary built without cgo, say), a setuid or setgid program \
(to another user or group), one with file capabilities, and a 32-bit or foreign-architecture \
one run with nothing managed. run looks at PROG (and at the interpreter of a #! script) \
before it starts it and says so in one line on stderr.

Exit status: PROG's own (run execs it, signals included). 2 when run cannot start it: a bad \
flag, a missing program (shells say 127; tierswap says 2 so every failure of its own is 2), \
or, with --strict, a program the shim cannot reach or a pager that cannot start (no \
userfaultfd permission, old kernel). Without --strict such a program runs unmanaged after \
one warning on stderr.

The shim is libtierswap_preload.so beside the tierswap binary, or the file named by \
TIERSWAP_PRELOAD.";

/// `run --help`'s text: [`LONG_ABOUT`] and what `--set` takes.
pub fn long_about() -> String {
    format!(
        "{LONG_ABOUT}

Engine settings (--set): the settings a lab variant takes (tierswap bench --engine \
tierswap:SETTING…), comma- or colon-separated, e.g. --set no-follow,swapin-max=16K; --set may \
be given more than once. run checks them before it starts PROG and the pager applies them \
after the flags, in order: a setting that repeats a flag (budget=, pool-max=, tiers=, \
compressor=, threads=, [no-]pin, fault=) wins over it, and of two the last wins. Settings: \
{}.",
        tierswap::config::SETTINGS
    )
}

/// `tierswap run` flags (`--help`'s long text: [`long_about`]).
#[derive(Args)]
pub struct RunArgs {
    /// Memory budget: managed pages present + staged + the pool + metadata stay under it.
    #[arg(long, default_value = "256M")]
    budget: String,
    /// Tiers, comma-separated from zero, pool, file.
    #[arg(long, default_value = "zero,pool,file")]
    tiers: String,
    /// The pool's limit before writeback to the file, fixed: bytes (64M) or a percentage of the
    /// budget (25%). Without it the limit follows the workload, from 5/8 of the budget down to
    /// 5% while the pool's refaults (pages its room would have kept resident) cost more than
    /// the file reads it saves.
    #[arg(long)]
    pool_max: Option<String>,
    /// The pool's compressor: zstd-fast (the default: dense, so more of the program stays
    /// in memory), zstd-fast-N (1-7, faster, lower ratio), zstd, zstd:LEVEL (1-19), or lz4
    /// (the fastest, ratio ~2).
    #[arg(long, default_value = "zstd-fast")]
    compressor: String,
    /// Directory of the swap file (default $TMPDIR or /tmp).
    #[arg(long)]
    swap_dir: Option<PathBuf>,
    /// Smallest mmap that gets a managed mapping of its own; smaller read-write ones come from
    /// managed zones in thread mode (and, with --malloc large, the smallest malloc managed).
    #[arg(long, default_value = "256K")]
    min_size: String,
    /// Which mallocs are managed: all, large (at least --min-size) or off.
    #[arg(long, default_value = "all")]
    malloc: String,
    /// Fault threads serving the program's faults (0: one per CPU the program may run on).
    #[arg(long, default_value_t = 0, value_name = "N")]
    fault_threads: usize,
    /// Who serves a fault: thread (a pager thread; every access works) or signal (the
    /// faulting thread, in a SIGBUS handler: faster, but a system call whose buffer is swapped
    /// out or not touched yet fails with EFAULT, and a program's own SIGBUS handler must chain
    /// to the previous one).
    #[arg(long, default_value = "thread", value_name = "MODE")]
    fault_mode: String,
    /// Leave the fault threads unpinned. By default each is pinned to one of the CPUs the
    /// program may run on at start, so that a fault is served on the CPU that took it; a
    /// program that moves its threads to other CPUs later may want them free.
    #[arg(long)]
    no_pin: bool,
    /// Engine settings, comma- or colon-separated, e.g. no-follow,swapin-max=16K: the
    /// settings of a lab variant (tierswap:SETTING…), applied after the other flags
    /// (a setting wins over the flag it repeats; --help lists them).
    #[arg(long, value_name = "SETTINGS")]
    set: Vec<String>,
    /// Exit 2 instead of running unmanaged when the shim cannot reach PROG (statically
    /// linked, setuid/setgid, file capabilities, another architecture) or the pager cannot
    /// start.
    #[arg(long)]
    strict: bool,
    /// Write the pager's counters as JSON to this file when the program exits (%p: its pid).
    /// Written from libc's exit: a program that ends with a raw exit_group (Go's runtime
    /// does) or is killed by a signal writes nothing; `tierswap stat PID --format json` reads
    /// the counters while it runs.
    #[arg(long)]
    stats_on_exit: Option<PathBuf>,
    /// One line on stderr when each pager starts and when its program exits.
    #[arg(long)]
    log: bool,
    /// Give every process of the tree (forked children, exec'd programs) a budget of its
    /// own instead of one budget for the whole tree.
    #[arg(long)]
    per_process: bool,
    /// Let the program read its memory cgroup's real limit. By default a read of its own
    /// cgroup's memory.limit_in_bytes or memory.max gives the budget (when smaller), so
    /// runtimes that size their heaps by the limit (the JVM, Node.js) size them for the budget.
    #[arg(long)]
    real_cgroup_limit: bool,
    /// Run the program as this user (and group: the user's own by default), keeping only
    /// CAP_SYS_PTRACE, as an ambient capability: a process not run by root needs it for the
    /// pager to follow its forks. Start run as root; for services that refuse root
    /// (PostgreSQL).
    #[arg(long, value_name = "USER[:GROUP]")]
    user: Option<String>,
    /// The program and its arguments (after --).
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROG ARGS")]
    command: Vec<OsString>,
}

/// Runs `tierswap run`: returns only on failure (exit 2 and one line on stderr).
pub fn run(a: RunArgs) -> ExitCode {
    match prepare(&a) {
        Ok((mut cmd, budget, user)) => {
            // Said once, before the program starts: a program the shim cannot reach.
            if let Some(why) = a.command.first().and_then(|p| crate::reach::unreachable_reason(p)) {
                if a.strict {
                    return fail(&format!("{why} (--strict: not started)"));
                }
                eprintln!("tierswap run: {}", why.replace(|c: char| c.is_control(), "?"));
            }
            let tree = if a.per_process { None } else { tree_ledger(budget) };
            if let Some(path) = &tree {
                cmd.env("TIERSWAP_TREE", path);
            }
            if let Some(user) = &user {
                // Every process of the tree maps the ledger read-write.
                if let Some(path) = &tree {
                    if let Err(e) = std::os::unix::fs::chown(path, Some(user.uid.as_raw()), Some(user.gid.as_raw())) {
                        eprintln!(
                            "tierswap run: cannot give the tree's ledger {} to the user ({e}); every process of the tree gets a budget of its own",
                            path.display()
                        );
                    }
                }
                if let Err(msg) = crate::user::switch(user) {
                    if let Some(path) = &tree {
                        let _ = std::fs::remove_file(path);
                    }
                    return fail(&msg);
                }
            }
            let err = cmd.exec();
            if let Some(path) = &tree {
                let _ = std::fs::remove_file(path);
            }
            let prog = a.command.first().map(|p| p.to_string_lossy().into_owned()).unwrap_or_default();
            fail(&format!("cannot run '{prog}': {}", os_message(&err)))
        }
        Err(msg) => fail(&msg),
    }
}

/// The ledger of the tree about to start (this process becomes its root at exec), after
/// removing those of trees that are gone; None, after one line, when it cannot be made
/// (every process then keeps a budget of its own).
fn tree_ledger(budget: u64) -> Option<PathBuf> {
    let path = tierswap::tree::default_path(std::process::id());
    if let Some(dir) = path.parent() {
        tierswap::tree::sweep(dir);
    }
    match tierswap::tree::create(&path, budget) {
        Ok(()) => Some(path),
        Err(e) => {
            eprintln!(
                "tierswap run: cannot make the tree's ledger {} ({e}); every process of the tree gets a budget of its own",
                path.display()
            );
            None
        }
    }
}

fn fail(msg: &str) -> ExitCode {
    let line: String =
        msg.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect();
    eprintln!("tierswap run: {line}");
    ExitCode::from(2)
}

/// "No such file or directory", without std's " (os error 2)".
fn os_message(e: &std::io::Error) -> String {
    let s = e.to_string();
    match s.find(" (os error") {
        Some(i) => s[..i].to_string(),
        None => s,
    }
}

/// Checks every flag and builds the command to exec; with the budget the pager will have
/// (`--set budget=` over `--budget`).
fn prepare(a: &RunArgs) -> Result<(std::process::Command, u64, Option<crate::user::Target>), String> {
    let size = |flag: &str, v: &str| parse_size(v).map_err(|e| format!("{flag} '{v}': {e}"));
    let budget_bytes = size("--budget", &a.budget)?;
    let tiers: Tiers = a.tiers.parse().map_err(|e| format!("--tiers '{}': {e}", a.tiers))?;
    let pool_max_bytes =
        match &a.pool_max {
            None => None,
            Some(p) if p.trim_end().ends_with('%') => {
                let t = p.trim();
                let pct: f64 =
                    t[..t.len() - 1].trim().parse().ok().filter(|v: &f64| (0.0..=100.0).contains(v)).ok_or_else(
                        || format!("--pool-max '{p}': give bytes like 64M or a percentage from 0% to 100%"),
                    )?;
                Some((budget_bytes as f64 * pct / 100.0) as u64)
            }
            Some(p) => Some(size("--pool-max", p)?),
        };
    let min_size = size("--min-size", &a.min_size)?;
    if min_size < 4096 {
        return Err(format!("--min-size '{}': give at least 4K (one page)", a.min_size));
    }
    let malloc = a.malloc.trim().to_ascii_lowercase();
    if !matches!(malloc.as_str(), "all" | "large" | "off") {
        return Err(format!("--malloc '{}': use all, large or off", a.malloc));
    }
    if let Some(dir) = &a.swap_dir {
        if !dir.is_dir() {
            return Err(format!("--swap-dir '{}': not a directory", dir.display()));
        }
    }
    if a.fault_threads > MAX_FAULT_THREADS {
        return Err(format!("--fault-threads {}: give 0 (one per CPU) to {MAX_FAULT_THREADS}", a.fault_threads));
    }
    let fault_mode: tierswap::FaultMode = a.fault_mode.parse().map_err(|e| format!("--fault-mode: {e}"))?;
    let compressor: tierswap::Compressor =
        a.compressor.parse().map_err(|e| format!("--compressor '{}': {e}", a.compressor))?;
    let cfg = PagerConfig {
        budget_bytes,
        tiers,
        compressor,
        pool_max_bytes,
        swap_dir: a.swap_dir.clone(),
        fault_threads: a.fault_threads,
        fault_pin: !a.no_pin,
        fault_mode,
        ..PagerConfig::default()
    };
    cfg.validate().map_err(|e| format!("--budget '{}': {e}", a.budget).replace(": budget ", ": "))?;
    let settings = a.set.iter().map(|s| s.trim()).collect::<Vec<_>>().join(",");
    let mut with_settings = cfg.clone();
    if !a.set.is_empty() {
        for s in Setting::parse_list(&settings).map_err(|e| format!("--set '{settings}': {e}"))? {
            s.apply(&mut with_settings);
        }
        with_settings.validate().map_err(|e| format!("--set '{settings}': {e}"))?;
    }
    let Some((prog, args)) = a.command.split_first() else {
        return Err("no program: give one after --, e.g. tierswap run --budget 512M -- python3 app.py".into());
    };
    // trailing_var_arg takes an unknown flag for the program: say what it is.
    if prog.to_string_lossy().starts_with('-') {
        return Err(format!(
            "unknown flag '{}': flags go before --, the program after it (see tierswap run --help)",
            prog.to_string_lossy()
        ));
    }
    let user = a.user.as_deref().map(crate::user::parse).transpose()?;
    let so = find_preload()?;
    let mut preload = OsString::from(so.as_os_str());
    if let Some(old) = std::env::var_os("LD_PRELOAD").filter(|o| !o.is_empty()) {
        preload.push(":");
        preload.push(old);
    }
    let mut cmd = std::process::Command::new(prog);
    cmd.args(args);
    for v in OWNED_VARS {
        cmd.env_remove(v);
    }
    cmd.env("LD_PRELOAD", preload)
        .env("TIERSWAP_BUDGET", budget_bytes.to_string())
        .env("TIERSWAP_COMPRESSOR", a.compressor.trim())
        .env("TIERSWAP_TIERS", a.tiers.trim())
        .env("TIERSWAP_MIN_SIZE", min_size.to_string())
        .env("TIERSWAP_MALLOC", malloc)
        .env("TIERSWAP_STRICT", if a.strict { "1" } else { "0" })
        .env("TIERSWAP_FAULT_THREADS", a.fault_threads.to_string())
        .env("TIERSWAP_PIN", if a.no_pin { "0" } else { "1" })
        .env("TIERSWAP_CGROUP_LIMIT", if a.real_cgroup_limit { "0" } else { "1" })
        .env(
            "TIERSWAP_FAULT_MODE",
            match fault_mode {
                tierswap::FaultMode::Thread => "thread",
                tierswap::FaultMode::Signal => "signal",
            },
        );
    if let Some(p) = pool_max_bytes {
        cmd.env("TIERSWAP_POOL_MAX", p.to_string());
    }
    if !a.set.is_empty() {
        cmd.env("TIERSWAP_SETTINGS", &settings);
    }
    if let Some(d) = &a.swap_dir {
        cmd.env("TIERSWAP_SWAP_DIR", d);
    }
    if let Some(s) = &a.stats_on_exit {
        cmd.env("TIERSWAP_STATS_ON_EXIT", s);
    }
    if a.log {
        cmd.env("TIERSWAP_LOG", "1");
    }
    if let Some(t) = &user {
        cmd.envs(crate::user::environment(t));
    }
    Ok((cmd, with_settings.budget_bytes, user))
}

/// The shim: `TIERSWAP_PRELOAD`, else beside this binary.
fn find_preload() -> Result<PathBuf, String> {
    if let Some(p) = std::env::var_os("TIERSWAP_PRELOAD").filter(|p| !p.is_empty()) {
        let p = PathBuf::from(p);
        if !p.is_file() {
            return Err(format!("TIERSWAP_PRELOAD '{}': no such file", p.display()));
        }
        // The loader resolves a relative LD_PRELOAD against the program's working directory.
        return std::path::absolute(&p).map_err(|e| format!("TIERSWAP_PRELOAD '{}': {e}", p.display()));
    }
    let exe = std::env::current_exe().map_err(|e| {
        format!("cannot find the tierswap binary to look for {PRELOAD_NAME} beside it: {e}; set TIERSWAP_PRELOAD")
    })?;
    let so = exe.parent().unwrap_or(Path::new("/")).join(PRELOAD_NAME);
    if !so.is_file() {
        return Err(format!(
            "cannot find {} (build it: cargo build --release -p tierswap-preload), or set TIERSWAP_PRELOAD to its path",
            so.display()
        ));
    }
    Ok(so)
}
