//! The `tierswap` command: `run` (a program under a budget), `stat` (a running pager's
//! counters) and `bench` (the labs).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use tierswap::{parse_size, Compressor, PagerConfig, SwapinPolicy};
use tierswap_bench::variant::{parse_engines, swapin_max_pages};
use tierswap_bench::{lab, make_engine, report, KernelOptions, RunSpec, WorkloadKind};

mod reach;
mod run;
mod stat;
mod user;

/// tierswap: keep a program's memory under a budget with compressed and disk tiers, on
/// userfaultfd. Sizes take K, M, G, T suffixes (powers of 1024).
#[derive(Parser)]
#[command(name = "tierswap", version, about, long_about = None)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

// Parsed once at start-up: the size of the `Bench` variant costs nothing.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand)]
enum Command {
    /// The benchmark lab: workloads against tierswap and the kernel's zswap, zram and disk swap.
    Bench(Bench),
    /// Run a program with its anonymous memory under a budget (LD_PRELOAD shim).
    // The doc comment above would clear RunArgs' long text: give it here.
    #[command(long_about = run::long_about())]
    Run(run::RunArgs),
    /// Live counters of running pagers: a list, or one process's table / JSON / Prometheus.
    Stat(stat::StatArgs),
    /// Internal: a kernel engine's workload child.
    #[command(name = "__bench-child", hide = true)]
    BenchChild {
        /// The run, as JSON.
        arg: String,
    },
}

#[derive(Args)]
struct Bench {
    #[command(subcommand)]
    what: Option<BenchWhat>,
    /// Workloads, comma-separated: usama_1g, seq64, seq64_hint, stride64_sparse,
    /// random64_sparse, random64_full, zero, samefill, random, usemem, concurrent, drain,
    /// thrash (3 in-order read passes under the budget), mixed (zero, same-filled,
    /// compressible and incompressible pages in every 64K block); or `stress` alone
    /// (tierswap only: threads, regions, random reads/writes verified against a model, forced
    /// eviction/staging/drain, optional fault injection; see --duration, --ops, --inject).
    #[arg(long, value_delimiter = ',', conflicts_with = "suite")]
    workload: Vec<String>,
    /// A named set of workloads: `seed` (the reference threads' workloads).
    #[arg(long)]
    suite: Option<String>,
    /// Engines, comma-separated: tierswap, kernel-zswap, kernel-zram, kernel-disk, and tierswap
    /// variants tierswap:SETTING[:SETTING…] (--help lists the settings).
    #[arg(long, value_delimiter = ',', default_value = "tierswap", long_help = engine_help())]
    engine: Vec<String>,
    /// Bytes of memory each workload touches.
    #[arg(long, default_value = "1G")]
    size: String,
    /// Memory budget (a memcg limit for the kernel engines). Default 256M; 4M for stress.
    #[arg(long)]
    budget: Option<String>,
    /// Runs per workload and engine (the table shows medians).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Threads of the threaded workloads (usemem, concurrent); 0 = one per CPU.
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Write every run and the summary as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write one PNG per workload (refault time and µs/page per engine) into this directory.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// tierswap's tiers, comma-separated from zero, pool, file, and
    /// remote=redis://HOST:PORT[,HOST:PORT…] (a Redis/Valkey cluster's seeds; pool writeback
    /// goes there, with file below it as the fallback when listed).
    #[arg(long, default_value = "zero,pool,file")]
    tiers: String,
    /// Remote tier: a write is done only once N replicas have it too (WAIT N).
    #[arg(long, default_value_t = 0)]
    remote_replicas: u32,
    /// Remote tier: attempts of a fault to read a page before the thread gets SIGBUS.
    #[arg(long, default_value_t = tierswap::RemoteConfig::default().fault_tries)]
    remote_tries: u32,
    /// Remote tier: timeout of one connect, read, write or WAIT, in milliseconds.
    #[arg(long, default_value_t = tierswap::RemoteConfig::default().timeout_ms)]
    remote_timeout_ms: u64,
    /// tierswap's pool compressor: lz4, zstd, zstd:LEVEL (1-19), zstd-fast or zstd-fast-N (1-7, faster, literals uncompressed).
    #[arg(long, default_value = "zstd-fast")]
    compressor: String,
    /// tierswap's recompression codec: pool writeback first recompresses a cold object with
    /// it and keeps the object in the pool if it shrinks by a quarter (zram's recompress).
    /// zstd, zstd:LEVEL, lz4, or none (the default) to write cold objects back as they are.
    #[arg(long, default_value = "none")]
    recompress: String,
    /// tierswap's pool limit, fixed: bytes (e.g. 64M) or a percentage of the budget (e.g. 25%).
    /// Without it the limit follows the workload, from 5/8 of the budget down to 5% while the
    /// pool's refaults cost more than the file reads it saves.
    #[arg(long)]
    pool_max: Option<String>,
    /// Directory of tierswap's swap file (default $TMPDIR) and the kernel engines' swap files.
    #[arg(long)]
    swap_dir: Option<PathBuf>,
    /// tierswap's fault threads; 0 = one per CPU.
    #[arg(long, default_value_t = 0)]
    fault_threads: usize,
    /// Bytes of one write to tierswap's swap file (a unit of packed records), 64K to 4M.
    #[arg(long, default_value = "64K")]
    file_unit: String,
    /// Cap of tierswap's readahead window for disk-backed pages, in pages; 1 = no readahead.
    #[arg(long, default_value_t = tierswap::policy::readahead::DEFAULT_MAX_PAGES)]
    readahead_max: u32,
    /// tierswap's swap-in policy: locality (large swap-in where faults show it), order0 (one page per fault), always.
    #[arg(long, default_value = "locality")]
    policy: String,
    /// tierswap's largest swap-in: a power of two from 4K to 2M (64K = 16 pages).
    #[arg(long, default_value = "64K")]
    swapin_max: String,
    /// tierswap: no fault-around (do not map a faulting page's staged neighbours in the same call).
    #[arg(long)]
    no_fault_around: bool,
    /// tierswap: no workingset detection (a page refaulted soon after eviction is not activated at once).
    #[arg(long)]
    no_workingset: bool,
    /// tierswap: no clean pages (a page swapped in drops its slot; evicting it unwritten compresses it again).
    #[arg(long)]
    no_keep_clean: bool,
    /// tierswap: do not encrypt the file tier's records (crc32c checksum only).
    #[arg(long)]
    no_encrypt: bool,
    /// tierswap: no direct reclaim: a fault thread whose fault waits for room sleeps until the
    /// reclaim thread has made it, instead of evicting staged blocks itself (direct reclaim is
    /// on by default, thread mode).
    #[arg(long, conflicts_with = "direct_reclaim")]
    no_direct_reclaim: bool,
    /// tierswap: direct reclaim (the default; kept for older command lines).
    #[arg(long, hide = true)]
    direct_reclaim: bool,
    /// tierswap: who serves a fault. thread: a fault thread woken by the userfaultfd (every
    /// access works, a system call's too); signal: the faulting thread itself, in a SIGBUS
    /// handler (no hand-off between CPUs; a system call touching a swapped-out page gets
    /// EFAULT, which the lab's workloads never do).
    #[arg(long, default_value = "thread")]
    fault_mode: String,
    /// zswap's max_pool_percent while kernel-zswap runs.
    #[arg(long)]
    zswap_max_pool_percent: Option<u32>,
    /// stress: how long (e.g. 20s, 10m).
    #[arg(long)]
    duration: Option<String>,
    /// stress: ops, comma-separated: read, write, create, destroy, detached, evict, stage,
    /// drain, dontneed, mremap, munmap; or default, or all.
    #[arg(long)]
    ops: Option<String>,
    /// stress: fault injection spec (KIND:N/D or KIND:DELAY@N/D, comma-separated, seed=N), or
    /// `all` for every kind at a moderate rate, or `recoverable` for every kind that must end in
    /// a correct page (no SIGBUS). Needs a build with `--features fault-injection`.
    #[arg(long)]
    inject: Option<String>,
    /// stress: seed of the workers' choices (and of the injection when --inject names none).
    #[arg(long)]
    seed: Option<u64>,
    /// stress: live managed memory the workers keep, in all.
    #[arg(long)]
    stress_mem: Option<String>,
    /// stress: write every engine log line (stderr) to this file too, with seconds since the start.
    #[arg(long)]
    engine_log: Option<PathBuf>,
    /// stress: no progress by a worker for this long is a hang (exit 3).
    #[arg(long, default_value = "30s")]
    watchdog: String,
    /// No progress bars.
    #[arg(long, global = true)]
    quiet: bool,
}

#[derive(Subcommand)]
enum BenchWhat {
    /// memcpy and compression speed and ratio of the lab's pages, or a file's, on one core.
    Floor {
        /// Bytes of pages to measure on.
        #[arg(long, default_value = "256M")]
        size: String,
        /// Measure the pages of this file instead (a heap dump, a program's input): up to
        /// --size of them, taken evenly across it, all-zero pages left out.
        #[arg(long, value_name = "FILE")]
        data: Option<PathBuf>,
    },
    /// Put back the swap, zswap, zram and cgroup settings a killed lab left behind.
    Restore,
    /// An unmodified redis-server (Debian's) loaded with reproducible keys, every value read
    /// back and compared, GET throughput (redis-benchmark -t get -P 32 -c 12) and a BGSAVE
    /// whose RDB must load into a fresh server — unconstrained, in a memcg with kernel zswap,
    /// and under `tierswap run`, side by side (root; needs redis-server and redis-tools).
    Redis {
        /// Keys to load.
        #[arg(long, default_value_t = 1_000_000)]
        keys: u64,
        /// Bytes per value.
        #[arg(long, default_value = "1K")]
        value_size: String,
        /// The budget of the constrained setups (memcg limit, tierswap run --budget).
        #[arg(long, default_value = "256M")]
        budget: String,
        /// Setups, comma-separated, run alternately: unconstrained, kernel-zswap, tierswap.
        #[arg(long, default_value = "unconstrained,kernel-zswap,tierswap")]
        setups: String,
        /// Rounds of every setup (the table shows medians).
        #[arg(long, default_value_t = 3)]
        runs: usize,
        /// GET requests redis-benchmark makes per run.
        #[arg(long, default_value_t = 2_000_000)]
        get_requests: u64,
        /// Skip BGSAVE and the RDB check.
        #[arg(long)]
        no_bgsave: bool,
        /// Directory for the kernel setup's swap file and the RDB files (a disk filesystem).
        #[arg(long, default_value = "/var/tmp")]
        dir: PathBuf,
        /// Also write every run as JSON here.
        #[arg(long)]
        json: Option<PathBuf>,
    },
    /// Real programs from Debian — redis-server, memcached, python3 with a dict, python3's
    /// sqlite3 — each loaded with a reproducible dataset and driven by the lab's own client:
    /// a fixed number of requests in a uniform and a Zipfian (θ 0.99, scrambled) key
    /// distribution, every value read back verified, throughput and p50/p99/p99.9 latency,
    /// under `tierswap run`, in a memcg over the kernel's disk swap or zswap, and
    /// unconstrained, engines alternating run by run. Reports the kernel's zswap pool (memcg
    /// v1 does not charge it), the client's headroom, and tierswap's counters per request.
    /// The kernel engines need root; every setting they touch is put back at the end.
    Programs(ProgramsArgs),
    /// Any program run to its end under each engine at one budget, engines alternating round
    /// by round: its wall time (median, and ÷ the kernel's), whether its standard output came
    /// out the same (SHA-256), its swap-ins and peak memory. `tierswap bench command
    /// --budget 512M -- sort -S 1G big.txt`. The kernel engines need root; every setting they
    /// touch is put back at the end.
    Command(CommandArgs),
    /// Bytes of metadata per swapped page, ours and the kernel's.
    Metadata {
        /// Bytes to swap out.
        #[arg(long, default_value = "1G")]
        swapped: String,
    },
}

/// `tierswap bench programs` flags.
#[derive(Args)]
struct ProgramsArgs {
    /// Programs, comma-separated: redis (GET), redis-mixed (90 % GET / 10 % SET), memcached
    /// (90/10 get/set, text protocol), python-dict (a dict of bytes, 90/10 lookups/updates over
    /// a pipe), sqlite (SELECT by primary key through python3's sqlite3, cache_size above the table).
    #[arg(long, default_value = "redis,redis-mixed,memcached,python-dict,sqlite")]
    program: String,
    /// The budget: tierswap run --budget, and the memcg limit of the kernel engines.
    #[arg(long, default_value = "256M")]
    budget: String,
    /// Engines, comma-separated: tierswap, kernel-disk (memcg over a swap file, zswap off),
    /// kernel-zswap (memcg, zswap on with the machine's compressor), kernel-zram, unconstrained,
    /// and tierswap variants tierswap:SETTING[:SETTING…] with any setting of `tierswap bench
    /// --engine` (budget=SIZE becomes `tierswap run --budget`, the rest `tierswap run --set`).
    #[arg(long, default_value = "tierswap,kernel-disk,kernel-zswap")]
    engine: String,
    /// Rounds of every engine per program (the table shows medians; the order reverses every round).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Timed requests per distribution and run (a tenth more go first as a verified warm-up).
    #[arg(long, default_value_t = 20_000)]
    requests: u64,
    /// Bytes of values loaded (1 KiB each; 1000000K is 1,000,000 keys).
    #[arg(long, default_value = "1000000K")]
    dataset: String,
    /// Also rerun tierswap with its budget at the kernel-zswap total (limit + the median of
    /// its pool peaks), so tierswap and the kernel compare at equal memory.
    #[arg(long)]
    equal_memory: bool,
    /// Directory for swap files, tierswap's swap file, the sqlite table and logs (a disk filesystem).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Write every run (phases, tierswap's counters) and the table's rows as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write one PNG per program (throughput and p99 per engine) into this directory.
    #[arg(long)]
    plot: Option<PathBuf>,
}

/// `tierswap bench command` flags.
#[derive(Args)]
struct CommandArgs {
    /// The budget: tierswap run --budget, and the memcg limit of the kernel engines.
    #[arg(long, default_value = "256M")]
    budget: String,
    /// Engines, comma-separated, as `tierswap bench programs --engine`: tierswap, kernel-disk,
    /// kernel-zswap, kernel-zram, unconstrained, tierswap:SETTING[:SETTING…].
    #[arg(long, default_value = "tierswap,kernel-disk")]
    engine: String,
    /// Rounds of every engine (the table shows medians; the order reverses every round).
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Seconds a run may take before it is killed and counted as failed.
    #[arg(long, default_value_t = 3600)]
    timeout: u64,
    /// Directory for swap files, tierswap's swap file and logs (a disk filesystem).
    #[arg(long, default_value = "/var/tmp")]
    dir: PathBuf,
    /// Write every run (wall time, output digest, counters, peak) as JSON to this file.
    #[arg(long)]
    json: Option<PathBuf>,
    /// The program and its arguments (after --); its standard input is empty.
    #[arg(trailing_var_arg = true, allow_hyphen_values = true, value_name = "PROG ARGS", required = true)]
    command: Vec<std::ffi::OsString>,
}

fn bench_command(a: &CommandArgs, progress: bool) -> Result<ExitCode, UserError> {
    use tierswap_bench::command;
    if a.runs == 0 || a.timeout == 0 {
        return Err(UserError("--runs and --timeout must be more than 0".into()));
    }
    let exe = std::env::current_exe().map_err(|e| UserError(format!("cannot find this program: {e}")))?;
    let spec = command::CommandSpec {
        argv: a.command.clone(),
        engines: tierswap_bench::programs::launch::parse_engines(&a.engine)
            .map_err(|e| UserError(format!("--engine: {e}")))?,
        budget_bytes: size("--budget", &a.budget)?,
        runs: a.runs,
        dir: a.dir.clone(),
        tierswap_bin: exe,
        timeout: std::time::Duration::from_secs(a.timeout),
    };
    lab::install_interrupt_handler();
    let runs = command::run(&spec, &mut |line| {
        if progress {
            eprintln!("{line}");
        }
    })?;
    print!("{}", command::table(&spec, &runs));
    if let Some(path) = &a.json {
        let text = serde_json::to_string_pretty(&runs)?;
        std::fs::write(path, text).map_err(|e| UserError(format!("cannot write {}: {e}", path.display())))?;
    }
    Ok(if command::any_bad(&runs) { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

fn bench_programs(a: &ProgramsArgs, progress: bool) -> Result<ExitCode, UserError> {
    use tierswap_bench::programs;
    let dataset = size("--dataset", &a.dataset)?;
    let value_bytes = programs::keys::VALUE_BYTES;
    let keys = dataset / value_bytes as u64;
    if keys == 0 {
        return Err(UserError(format!("--dataset {}: give at least 1K (one value)", a.dataset)));
    }
    if a.runs == 0 || a.requests == 0 {
        return Err(UserError("--runs and --requests must be more than 0".into()));
    }
    let exe = std::env::current_exe().map_err(|e| UserError(format!("cannot find this program: {e}")))?;
    let spec = programs::ProgramsSpec {
        programs: programs::Program::parse_list(&a.program).map_err(|e| UserError(format!("--program: {e}")))?,
        engines: programs::launch::parse_engines(&a.engine).map_err(|e| UserError(format!("--engine: {e}")))?,
        budget_bytes: size("--budget", &a.budget)?,
        runs: a.runs,
        requests: a.requests,
        keys,
        value_bytes,
        equal_memory: a.equal_memory,
        dir: a.dir.clone(),
        tierswap_bin: exe,
        progress,
    };
    if spec.budget_bytes < 4 << 20 {
        return Err(UserError(format!("--budget {}: give at least 4M", a.budget)));
    }
    lab::install_interrupt_handler();
    let machine = tierswap_bench::machine::Machine::detect();
    let out = programs::run(&spec)?;
    let summaries = programs::report::summarize(&out.runs);
    print!("{}", programs::report::table(&machine, &spec, &out, &summaries));
    if let Some(path) = &a.json {
        let doc = programs::report::document(&machine, &spec, &out, &summaries);
        let text = serde_json::to_string_pretty(&doc)?;
        std::fs::write(path, text).map_err(|e| UserError(format!("cannot write {}: {e}", path.display())))?;
    }
    if let Some(dir) = &a.plot {
        let files = programs::plot::write_plots(dir, &programs::report::header(&spec), &summaries)?;
        eprintln!("tierswap: wrote {} plots to {}", files.len(), dir.display());
    }
    if out.interrupted {
        eprintln!("tierswap: interrupted; the table shows the runs that completed");
        return Ok(ExitCode::from(130));
    }
    Ok(if programs::any_bad(&out) { ExitCode::FAILURE } else { ExitCode::SUCCESS })
}

/// A user error: one line, exit code 2.
struct UserError(String);

impl<E: std::fmt::Display> From<E> for UserError {
    fn from(e: E) -> Self {
        UserError(e.to_string())
    }
}

fn size(what: &str, s: &str) -> Result<u64, UserError> {
    parse_size(s).map_err(|e| UserError(format!("{what}: {e}")))
}

/// `bench --engine`'s long help: the engines and every setting a variant takes.
fn engine_help() -> String {
    format!(
        "Engines, comma-separated: tierswap, kernel-zswap, kernel-zram, kernel-disk, and tierswap \
variants tierswap:SETTING[:SETTING…] that change settings for that engine alone, e.g. --engine \
tierswap,tierswap:policy=order0,kernel-zswap: runs alternate engine by engine; the column ts÷ is \
plain tierswap's refault ÷ the variant's. A variant's tiers= takes local tiers only (it drops the \
remote of --tiers, to compare the two). Settings: {}.",
        tierswap::config::SETTINGS
    )
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        // --help and --version print and exit 0.
        Err(e) if !e.use_stderr() => e.exit(),
        Err(e) => {
            // One line like every other error here: clap's first line, not its usage block.
            let text = e.render().to_string();
            let first = text.lines().next().unwrap_or("bad arguments");
            eprintln!("tierswap: {} (see --help)", one_line(first.trim_start_matches("error: ")));
            return ExitCode::from(2);
        }
    };
    let res = match cli.command {
        Command::Bench(b) => bench(b),
        Command::Run(r) => return run::run(r),
        Command::Stat(a) => Ok(stat::run(a)),
        Command::BenchChild { arg } => Ok(ExitCode::from(tierswap_bench::kernel::child_main(&arg) as u8)),
    };
    match res {
        Ok(code) => code,
        Err(UserError(msg)) => {
            eprintln!("tierswap: {}", one_line(&msg));
            ExitCode::from(2)
        }
    }
}

/// The message on one line: control characters (a newline in a user's value) shown escaped.
fn one_line(msg: &str) -> String {
    msg.chars().map(|c| if c.is_control() { c.escape_default().to_string() } else { c.to_string() }).collect()
}

fn bench(b: Bench) -> Result<ExitCode, UserError> {
    let progress = !b.quiet;
    match &b.what {
        Some(BenchWhat::Floor { size: s, data }) => {
            let bytes = size("--size", s)? as usize;
            let (src, what) = match data {
                None => {
                    (tierswap_bench::floor::counter_pages(bytes), "counter-filled pages (the lab's data)".to_string())
                }
                Some(path) => {
                    let cannot =
                        |e: std::io::Error| UserError(format!("--data {}: cannot read it: {e}", path.display()));
                    let file = std::fs::File::open(path).map_err(cannot)?;
                    let src = tierswap_bench::floor::file_pages(&file, bytes).map_err(cannot)?.ok_or_else(|| {
                        UserError(format!(
                            "--data {}: no page of it has a non-zero byte (or it is under 4 KiB)",
                            path.display()
                        ))
                    })?;
                    (src, format!("the pages of {}", path.display()))
                }
            };
            let rows = tierswap_bench::floor::measure(&src);
            print!("{}", tierswap_bench::floor::table(&rows, src.len(), &what));
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchWhat::Redis { keys, value_size, budget, setups, runs, get_requests, no_bgsave, dir, json }) => {
            let value_bytes = size("--value-size", value_size)? as usize;
            if value_bytes == 0 || *keys == 0 || *runs == 0 {
                return Err(UserError("--keys, --value-size and --runs must be more than 0".into()));
            }
            let exe = std::env::current_exe().map_err(|e| UserError(format!("cannot find this program: {e}")))?;
            let spec = tierswap_bench::redis::RedisSpec {
                keys: *keys,
                value_bytes,
                budget_bytes: size("--budget", budget)?,
                setups: tierswap_bench::redis::Setup::parse_list(setups)?,
                runs: *runs,
                get_requests: *get_requests,
                tierswap_bin: exe,
                work_dir: dir.clone(),
                bgsave: !no_bgsave,
            };
            lab::install_interrupt_handler();
            let all = tierswap_bench::redis::run(&spec, progress)?;
            print!("{}", tierswap_bench::redis::table(&spec, &all));
            if let Some(path) = json {
                let text = serde_json::to_string_pretty(&all)?;
                std::fs::write(path, text).map_err(|e| UserError(format!("cannot write {}: {e}", path.display())))?;
            }
            let bad = all.iter().any(|r| r.error.is_some() || r.mismatches > 0 || r.bgsave_ok == Some(false));
            return Ok(if bad { ExitCode::FAILURE } else { ExitCode::SUCCESS });
        }
        Some(BenchWhat::Programs(a)) => return bench_programs(a, progress),
        Some(BenchWhat::Command(a)) => return bench_command(a, progress),
        Some(BenchWhat::Metadata { swapped }) => {
            let bytes = size("--swapped", swapped)?;
            if bytes == 0 {
                return Err(UserError("--swapped must be more than 0 bytes".into()));
            }
            let r = tierswap_bench::metadata::measure(bytes, progress)?;
            print!("{}", r.text());
            return Ok(ExitCode::SUCCESS);
        }
        Some(BenchWhat::Restore) => {
            let done = tierswap_bench::kernel::system::restore_leftovers();
            if done.is_empty() {
                println!("nothing to restore");
            }
            for line in done {
                println!("{line}");
            }
            return Ok(ExitCode::SUCCESS);
        }
        None => {}
    }
    let stress = b.workload.iter().any(|w| w.trim() == "stress");
    if stress && (b.workload.len() > 1 || b.suite.is_some()) {
        return Err(UserError("--workload stress runs alone".into()));
    }
    if !stress {
        for (given, flag) in [
            (b.duration.is_some(), "--duration"),
            (b.ops.is_some(), "--ops"),
            (b.inject.is_some(), "--inject"),
            (b.seed.is_some(), "--seed"),
            (b.stress_mem.is_some(), "--stress-mem"),
            (b.engine_log.is_some(), "--engine-log"),
        ] {
            if given {
                return Err(UserError(format!("{flag} is for --workload stress")));
            }
        }
    }
    let workloads: Vec<WorkloadKind> = match (&b.suite, b.workload.is_empty()) {
        _ if stress => Vec::new(),
        (Some(s), _) if s == "seed" => WorkloadKind::SEED_SUITE.to_vec(),
        (Some(s), _) => return Err(UserError(format!("unknown suite '{s}': the suite is 'seed'"))),
        (None, true) => {
            return Err(UserError("no workload: give --workload W[,W…] or --suite seed (see --help)".into()))
        }
        (None, false) => b.workload.iter().map(|w| w.parse::<WorkloadKind>()).collect::<Result<_, _>>()?,
    };
    let engines = parse_engines(&b.engine)?;
    let size_bytes = size("--size", &b.size)?;
    let budget_bytes = size("--budget", b.budget.as_deref().unwrap_or(if stress { "4M" } else { "256M" }))?;
    if size_bytes < 1 << 20 {
        return Err(UserError(format!("--size {} is too small: give at least 1M", b.size)));
    }
    if b.runs == 0 {
        return Err(UserError("--runs must be at least 1".into()));
    }
    let (tiers, remote) = tierswap::parse_tiers(&b.tiers)?;
    let remote = remote.map(|r| tierswap::RemoteConfig {
        replicas: b.remote_replicas,
        fault_tries: b.remote_tries,
        timeout_ms: b.remote_timeout_ms,
        ..r
    });
    if remote.is_none() && b.remote_replicas > 0 {
        return Err(UserError("--remote-replicas needs a remote tier: add remote=redis://HOST:PORT to --tiers".into()));
    }
    let compressor: Compressor = b.compressor.parse()?;
    let recompress =
        tierswap::config::parse_recompress(&b.recompress).map_err(|e| UserError(format!("--recompress: {e}")))?;
    let swapin_policy: SwapinPolicy = b.policy.parse().map_err(|e| UserError(format!("--policy: {e}")))?;
    let fault_mode: tierswap::FaultMode = b.fault_mode.parse().map_err(|e| UserError(format!("--fault-mode: {e}")))?;
    let swapin_max_bytes = size("--swapin-max", &b.swapin_max)?;
    let swapin_max_pages = swapin_max_pages(swapin_max_bytes).map_err(|e| UserError(format!("--swapin-max {e}")))?;
    let pool_max_bytes = match &b.pool_max {
        None if stress => Some(1 << 20),
        None => None,
        Some(p) if p.ends_with('%') => {
            let pct: f64 = p[..p.len() - 1]
                .trim()
                .parse()
                .map_err(|_| UserError(format!("--pool-max '{p}': give bytes like 64M or a percentage like 25%")))?;
            if !(0.0..=100.0).contains(&pct) {
                return Err(UserError(format!("--pool-max '{p}': a percentage is between 0% and 100%")));
            }
            Some((budget_bytes as f64 * pct / 100.0) as u64)
        }
        Some(p) => Some(size("--pool-max", p)?),
    };
    // Every field is set today; the default stays for fields the engine adds later.
    #[allow(clippy::needless_update)]
    let pager = PagerConfig {
        budget_bytes,
        tiers,
        compressor,
        recompress,
        pool_max_bytes,
        swap_dir: b.swap_dir.clone(),
        fault_threads: b.fault_threads,
        readahead_max_pages: b.readahead_max.max(1),
        file_unit_bytes: size("--file-unit", &b.file_unit)? as usize,
        swapin_policy,
        swapin_max_pages,
        fault_around: !b.no_fault_around,
        workingset: !b.no_workingset,
        keep_clean: !b.no_keep_clean,
        encrypt: !b.no_encrypt,
        direct_reclaim: !b.no_direct_reclaim,
        remote,
        fault_mode,
        ..PagerConfig::default()
    };
    pager.validate()?;
    if stress {
        return run_stress(&b, &engines, pager);
    }
    for e in &engines {
        e.pager(&pager).validate().map_err(|err| UserError(format!("engine '{}': {err}", e.label())))?;
    }
    if let Some(dir) = &b.swap_dir {
        if !dir.is_dir() {
            return Err(UserError(format!("--swap-dir {}: not a directory", dir.display())));
        }
    }
    let kernel = KernelOptions { swap_dir: b.swap_dir.clone(), zswap_max_pool_percent: b.zswap_max_pool_percent };
    let mut boxes: Vec<_> = engines.iter().map(|e| make_engine(e, progress, &kernel)).collect();
    let plan = lab::Plan {
        workloads,
        runs: b.runs,
        template: RunSpec {
            workload: WorkloadKind::Seq64,
            size_bytes,
            budget_bytes,
            threads: b.threads,
            run: 0,
            pager: pager.clone(),
        },
    };
    lab::install_interrupt_handler();
    let machine = tierswap_bench::machine::Machine::detect();
    let out = lab::run(&plan, &mut boxes, &mut |line| eprintln!("{line}"));
    if out.results.is_empty() {
        let why = out.skipped.iter().chain(&out.failures).cloned().collect::<Vec<_>>().join("; ");
        return Err(UserError(format!("no run completed: {why}")));
    }
    let summaries = report::summarize(&out.results);
    let off: Vec<&str> = [
        (b.no_fault_around, "fault-around"),
        (b.no_workingset, "workingset"),
        (b.no_keep_clean, "keep-clean"),
        (b.no_encrypt, "encrypt"),
    ]
    .into_iter()
    .filter_map(|(no, name)| no.then_some(name))
    .collect();
    let header = format!(
        "size {} MiB, budget {} MiB, tierswap tiers {}, compressor {}, recompress {}, pool {}, swap-in {} up to {} KiB, faults served by {}{}",
        size_bytes >> 20,
        budget_bytes >> 20,
        b.tiers,
        b.compressor,
        b.recompress,
        if pager.pool_adapts() {
            format!("{}-{} MiB (follows the workload)", pager.pool_limit_floor() >> 20, pager.pool_limit_top() >> 20)
        } else {
            format!("max {} MiB", pager.pool_max_bytes() >> 20)
        },
        b.policy.trim().to_ascii_lowercase(),
        swapin_max_pages * 4,
        if fault_mode == tierswap::FaultMode::Signal { "the faulting thread" } else { "fault threads" },
        if off.is_empty() { String::new() } else { format!(", off: {}", off.join(" ")) }
    );
    print!("{}", report::table(&machine, &header, &summaries));
    if let Some(path) = &b.json {
        let doc = report::Document {
            machine: &machine,
            config: serde_json::json!({
                "size_bytes": size_bytes, "budget_bytes": budget_bytes, "runs": b.runs,
                "engines": engines.iter().map(|e| e.label()).collect::<Vec<_>>(), "tiers": b.tiers, "compressor": b.compressor, "recompress": b.recompress,
                "pool_max_bytes": pager.pool_max_bytes(), "pool_limit_top": pager.pool_limit_top(), "threads": b.threads,
                "swapin_policy": pager.swapin_policy, "swapin_max_pages": pager.swapin_max_pages,
                "fault_around": pager.fault_around, "workingset": pager.workingset,
                "keep_clean": pager.keep_clean, "encrypt": pager.encrypt, "fault_mode": pager.fault_mode,
            }),
            runs: &out.results,
            summary: &summaries,
            problems: out.skipped.iter().chain(&out.retried).chain(&out.failures).cloned().collect(),
        };
        let text = serde_json::to_string_pretty(&doc)?;
        std::fs::write(path, text).map_err(|e| UserError(format!("cannot write {}: {e}", path.display())))?;
    }
    if let Some(dir) = &b.plot {
        let files = tierswap_bench::plot::write_plots(dir, &header, &summaries)?;
        eprintln!("tierswap: wrote {} plots to {}", files.len(), dir.display());
    }
    let mismatches: u64 = out.results.iter().map(|r| r.mismatches).sum();
    if mismatches > 0 {
        eprintln!("tierswap: {mismatches} pages came back wrong");
        return Ok(ExitCode::from(1));
    }
    if out.interrupted {
        eprintln!("tierswap: interrupted; the table shows the runs that completed");
        return Ok(ExitCode::from(130));
    }
    if !out.failures.is_empty() {
        return Ok(ExitCode::from(1));
    }
    Ok(ExitCode::SUCCESS)
}

/// `tierswap bench --workload stress`: exit 0 passed, 1 a mismatch or something unaccounted
/// for, 3 a hang (the watchdog exits from inside the run).
fn run_stress(b: &Bench, engines: &[tierswap_bench::EngineSpec], pager: PagerConfig) -> Result<ExitCode, UserError> {
    use tierswap_bench::stress;
    let pager = match engines {
        [e] if e.kind == tierswap_bench::EngineKind::Tierswap => e.pager(&pager),
        _ => {
            return Err(UserError(
                "--workload stress runs on one tierswap engine: leave out --engine, or name one tierswap variant (e.g. --engine tierswap:no-batch-release)".into(),
            ))
        }
    };
    pager.validate().map_err(|err| UserError(format!("engine '{}': {err}", engines[0].label())))?;
    let duration = stress::parse_duration(b.duration.as_deref().unwrap_or("60s"))?;
    let watchdog = stress::parse_duration(&b.watchdog).map_err(|e| UserError(format!("--watchdog: {e}")))?;
    let ops = stress::parse_ops(b.ops.as_deref().unwrap_or("default"))?;
    let seed = b.seed.unwrap_or(1);
    let inject = match b.inject.as_deref() {
        None => None,
        Some(text) => {
            if !tierswap::inject::ENABLED {
                return Err(stress::StressError::NotBuilt.into());
            }
            let text = match text.trim() {
                "all" => stress::INJECT_ALL,
                "recoverable" => stress::INJECT_RECOVERABLE,
                _ => text,
            };
            let mut spec: tierswap::inject::Spec =
                text.parse().map_err(|e: tierswap::inject::InjectError| UserError(format!("--inject: {e}")))?;
            if !text.contains("seed=") {
                spec.seed = seed;
            }
            Some(spec)
        }
    };
    let threads = if b.threads == 0 { 4 } else { b.threads };
    let mem_bytes = size("--stress-mem", b.stress_mem.as_deref().unwrap_or("64M"))?;
    if mem_bytes < 1 << 20 {
        return Err(UserError("--stress-mem must be at least 1M".into()));
    }
    let spec = stress::StressSpec {
        engine: engines[0].label().to_string(),
        threads,
        duration,
        ops,
        inject,
        seed,
        pager,
        mem_bytes,
        watchdog,
        progress: !b.quiet,
        json: b.json.clone(),
        engine_log: b.engine_log.clone(),
    };
    let report = stress::run(&spec)?;
    let text = stress::finish(&report, spec.json.as_ref())?;
    print!("{text}");
    Ok(ExitCode::from(report.exit_code()))
}
