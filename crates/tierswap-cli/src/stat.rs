//! `tierswap stat [PID]`: the counters of running pagers, read from their control sockets
//! (see `tierswap::control`). Without a PID: one line per managed process. With one: a
//! table, JSON or Prometheus text; `--watch` redraws a live view with rates per second.

use std::fmt::Write as _;
use std::io::{IsTerminal, Write as _};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::{Args, ValueEnum};
use tierswap::control::{self, StatsReply};
use tierswap::stats::LATENCY_BUCKETS;
use tierswap::Stats;

const PAGE_BYTES: u64 = 4096;

/// `tierswap stat` arguments.
#[derive(Args)]
pub struct StatArgs {
    /// Process id; without it, list the managed processes.
    pid: Option<u32>,
    /// Redraw every SECS seconds (default 1) with rates per second, until Ctrl-C or the
    /// process exits.
    #[arg(long, value_name = "SECS", num_args = 0..=1, default_missing_value = "1")]
    watch: Option<f64>,
    /// Output format.
    #[arg(long, value_enum, default_value = "table")]
    format: Format,
}

/// How `tierswap stat` prints.
#[derive(Clone, Copy, PartialEq, Eq, ValueEnum)]
enum Format {
    /// A table for people.
    Table,
    /// The pager's reply as JSON.
    Json,
    /// Prometheus text exposition.
    Prometheus,
}

/// Runs `tierswap stat`; errors are printed here as one line, exit code 1.
pub fn run(a: StatArgs) -> ExitCode {
    let res = match (a.pid, a.watch) {
        (None, None) => list(a.format),
        (None, Some(_)) => Err("--watch needs a PID: tierswap stat PID --watch".to_string()),
        (Some(pid), None) => once(pid, a.format),
        (Some(pid), Some(secs)) => watch(pid, secs, a.format),
    };
    match res {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("tierswap: {}", msg.replace('\n', " "));
            ExitCode::from(1)
        }
    }
}

fn dirs_text(dirs: &[PathBuf]) -> String {
    if dirs.is_empty() {
        let tried: Vec<String> = control::default_dirs().iter().map(|d| d.display().to_string()).collect();
        return format!("{} (none exists)", tried.join(", "));
    }
    dirs.iter().map(|d| d.display().to_string()).collect::<Vec<_>>().join(", ")
}

/// The sockets of `pid` in search order (more than one when a program exec'd another as
/// another user: the old image's, under root's directory, is left behind), or a message
/// naming the directories searched.
fn find(pid: u32) -> Result<Vec<PathBuf>, String> {
    let dirs = control::search_dirs();
    let mut found = Vec::new();
    let mut denied = None;
    for d in &dirs {
        let p = control::socket_path(d, pid);
        match p.symlink_metadata() {
            Ok(_) => found.push(p),
            Err(e) if e.kind() == std::io::ErrorKind::PermissionDenied => denied = denied.or(Some(d)),
            Err(_) => {}
        }
    }
    if !found.is_empty() {
        return Ok(found);
    }
    if let Some(d) = denied {
        return Err(format!(
            "pid {pid}: permission denied on {}: the directory and the process belong to another user (run as that user or as root)",
            d.display()
        ));
    }
    let why = if control::pid_alive(pid) { "it is not managed by tierswap" } else { "no such process" };
    Err(format!("no tierswap pager for pid {pid} ({why}): no {pid}.sock in {}", dirs_text(&dirs)))
}

/// The first of `pid`'s sockets that answers; else what the first said.
fn query(pid: u32) -> Result<StatsReply, String> {
    let paths = find(pid)?;
    let mut first = None;
    for path in &paths {
        match control::query_stats(path) {
            Ok(r) => return Ok(r),
            Err(e) => {
                first.get_or_insert((path, e));
            }
        }
    }
    let (path, e) = first.expect("find returns at least one socket");
    Err(match e {
        control::Error::PermissionDenied { .. } | control::Error::Refused { .. } => {
            format!("pid {pid} is another user's process: {e}")
        }
        control::Error::NotServing { .. } if !control::pid_alive(pid) => {
            format!("process {pid} exited (its socket {} is stale)", path.display())
        }
        e => e.to_string(),
    })
}

fn once(pid: u32, format: Format) -> Result<(), String> {
    let r = query(pid)?;
    let text = match format {
        Format::Table => table(&r),
        Format::Json => format!("{}\n", serde_json::to_string_pretty(&r).map_err(|e| e.to_string())?),
        Format::Prometheus => prometheus(std::slice::from_ref(&r)),
    };
    print!("{text}");
    Ok(())
}

fn list(format: Format) -> Result<(), String> {
    let dirs = control::search_dirs();
    let mut rows: Vec<(u32, Result<StatsReply, String>)> = Vec::new();
    for d in &dirs {
        for pid in control::remove_stale(d) {
            eprintln!("tierswap: removed the stale socket of pid {pid} (process gone) from {}", d.display());
        }
        for (pid, path) in control::list_sockets(d) {
            let r = control::query_stats(&path).map_err(|e| match e {
                control::Error::PermissionDenied { .. } | control::Error::Refused { .. } => {
                    "another user's process".to_string()
                }
                e => e.to_string(),
            });
            rows.push((pid, r));
        }
    }
    match format {
        Format::Json => {
            let v: Vec<serde_json::Value> = rows
                .iter()
                .map(|(pid, r)| match r {
                    Ok(r) => serde_json::to_value(r).unwrap_or_default(),
                    Err(e) => serde_json::json!({"pid": pid, "error": e}),
                })
                .collect();
            println!("{}", serde_json::to_string_pretty(&v).map_err(|e| e.to_string())?);
        }
        Format::Prometheus => {
            let ok: Vec<StatsReply> = rows.into_iter().filter_map(|(_, r)| r.ok()).collect();
            print!("{}", prometheus(&ok));
        }
        Format::Table => {
            if rows.is_empty() {
                println!("no process managed by tierswap (searched {})", dirs_text(&dirs));
                return Ok(());
            }
            println!("{:>8}  {:>10}  {:>10}  {:>12}  COMMAND", "PID", "BUDGET", "FOOTPRINT", "SWAPPED-OUT");
            for (pid, r) in rows {
                match r {
                    Ok(r) => println!(
                        "{:>8}  {:>10}  {:>10}  {:>12}  {}",
                        pid,
                        human(r.stats.budget),
                        human(r.stats.footprint),
                        format!("{} pg", r.stats.swap_slots),
                        clip(&r.cmdline, 60)
                    ),
                    Err(e) => println!("{:>8}  {:>10}  {:>10}  {:>12}  ({})", pid, "-", "-", "-", e),
                }
            }
        }
    }
    Ok(())
}

fn clip(s: &str, n: usize) -> String {
    if s.chars().count() <= n {
        s.to_string()
    } else {
        let mut t: String = s.chars().take(n - 1).collect();
        t.push('…');
        t
    }
}

/// Bytes with a binary unit: 512 B, 1.5 KiB, 12.0 MiB.
fn human(bytes: u64) -> String {
    const UNITS: [&str; 5] = ["KiB", "MiB", "GiB", "TiB", "PiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut v = bytes as f64 / 1024.0;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    format!("{v:.1} {}", UNITS[u])
}

fn pct(part: u64, whole: u64) -> f64 {
    if whole == 0 {
        0.0
    } else {
        part as f64 * 100.0 / whole as f64
    }
}

/// Pages brought in from any tier.
fn swpin_pages(s: &Stats) -> u64 {
    let c = &s.counters;
    c.pswpin + c.zswpin + c.swpin_zero + c.swpin_samefill
}

/// Pages taken out of the application to any tier (pool writeback, which moves a page
/// already out, not counted again).
fn swpout_pages(s: &Stats) -> u64 {
    let c = &s.counters;
    c.zswpout + c.swpout_zero + c.swpout_samefill + c.swpout_clean + c.pswpout.saturating_sub(c.zswpwb)
}

fn bar(part: u64, whole: u64, width: usize) -> String {
    let filled = if whole == 0 { 0 } else { ((part as f64 / whole as f64) * width as f64).round() as usize };
    let filled = filled.min(width);
    let over = if part > whole && whole > 0 { "!" } else { "" };
    format!("[{}{}]{over}", "#".repeat(filled), ".".repeat(width - filled))
}

/// The human table for one process.
fn table(r: &StatsReply) -> String {
    let s = &r.stats;
    let c = &s.counters;
    let mut t = String::new();
    let _ = writeln!(t, "pid {}  {}", r.pid, clip(&r.cmdline, 70));
    let _ = writeln!(
        t,
        "footprint {} of {} {} ({:.1}%)  {}",
        human(s.footprint),
        if s.tree_ledger.is_some() { "its share of the tree's budget," } else { "budget" },
        human(s.budget),
        pct(s.footprint, s.budget),
        bar(s.footprint, s.budget, 30)
    );
    let _ = writeln!(
        t,
        "  present {} pages, staged {} pages, metadata {}, highest footprint {}",
        s.present_pages,
        s.staged_pages,
        human(s.metadata_bytes),
        human(c.footprint_max)
    );
    if let Some(anon) = anonymous_bytes(r.pid) {
        let _ = writeln!(t, "{}", managed_line(s.footprint, anon));
    }
    if let Some(path) = &s.tree_ledger {
        t.push_str(&tree_section(r.pid, std::path::Path::new(path)));
    }
    let _ = writeln!(t, "swap: {} slots in use", s.swap_slots);
    let _ = writeln!(
        t,
        "  {:<12} {:>12} {:>12} {:>12}   {:>10} {:>10}",
        "tier", "pages", "bytes", "ratio", "swpin", "swpout"
    );
    let _ = writeln!(
        t,
        "  {:<12} {:>12} {:>12} {:>12}   {:>10} {:>10}",
        "zero", s.swap_zero_pages, "-", "-", c.swpin_zero, c.swpout_zero
    );
    let _ = writeln!(
        t,
        "  {:<12} {:>12} {:>12} {:>12}   {:>10} {:>10}",
        "same-filled", s.swap_samefill_pages, "-", "-", c.swpin_samefill, c.swpout_samefill
    );
    let pool_ratio = if s.pool_total_size == 0 {
        "-".to_string()
    } else {
        format!("{:.2}", (s.pool_stored_pages * PAGE_BYTES) as f64 / s.pool_total_size as f64)
    };
    let _ = writeln!(
        t,
        "  {:<12} {:>12} {:>12} {:>12}   {:>10} {:>10}",
        "pool",
        s.pool_stored_pages,
        human(s.pool_total_size),
        pool_ratio,
        c.zswpin,
        c.zswpout
    );
    let file_ratio = if s.file_bytes == 0 {
        "-".to_string()
    } else {
        format!("{:.2}", (s.file_pages * PAGE_BYTES) as f64 / s.file_bytes as f64)
    };
    let _ = writeln!(
        t,
        "  {:<12} {:>12} {:>12} {:>12}   {:>10} {:>10}",
        "file",
        s.file_pages,
        human(s.file_bytes),
        file_ratio,
        c.pswpin,
        c.pswpout
    );
    let _ = writeln!(
        t,
        "  pool holds {} compressed in {} of {} allowed; {} written back to file; {} incompressible; {} clean re-evictions",
        human(s.pool_stored_bytes),
        human(s.pool_total_size),
        human(s.pool_limit),
        c.zswpwb,
        c.pool_reject_incompressible,
        c.swpout_clean
    );
    let _ = writeln!(
        t,
        "faults {} (first touch {}, staged {}, swapped {}, write-protect {}); large swap-ins {} ({} pages)",
        c.faults,
        c.faults_first_touch,
        c.faults_staged,
        c.faults_swapped,
        c.faults_wp,
        c.swpin_large,
        c.swpin_large_pages
    );
    let _ = writeln!(
        t,
        "fault latency (µs, bucket upper edge): p50 ≤{}  p90 ≤{}  p99 ≤{}  p99.9 ≤{}",
        s.fault_latency_percentile_us(50.0),
        s.fault_latency_percentile_us(90.0),
        s.fault_latency_percentile_us(99.0),
        s.fault_latency_percentile_us(99.9)
    );
    let errors = c.checksum_errors + c.read_errors + c.writeback_errors;
    if errors > 0 || c.over_budget_events > 0 {
        let _ = writeln!(
            t,
            "problems: checksum errors {}, read errors {}, writeback errors {}, over budget {} times",
            c.checksum_errors, c.read_errors, c.writeback_errors, c.over_budget_events
        );
    }
    t
}

/// The process tree sharing the budget: one line per process with a pager (its footprint,
/// its share, its PSS: pages shared copy-on-write with a parent counted once), and the
/// tree's total against the budget. `me` is marked.
fn tree_section(me: u32, ledger: &std::path::Path) -> String {
    let mut t = String::new();
    let (budget, mut lines) = match tierswap::tree::read(ledger) {
        Ok(x) => x,
        Err(e) => return format!("tree: cannot read its ledger {} ({e})\n", ledger.display()),
    };
    lines.sort_by_key(|l| l.pid);
    let total: u64 = lines.iter().map(|l| l.footprint).sum();
    let _ = writeln!(
        t,
        "tree: {} process{} with a pager, footprint {} of the tree's budget {} ({:.1}%)  {}",
        lines.len(),
        if lines.len() == 1 { "" } else { "es" },
        human(total),
        human(budget),
        pct(total, budget),
        bar(total, budget, 30)
    );
    let _ = writeln!(t, "  {:>8} {:>8} {:>10} {:>10} {:>10}  COMMAND", "PID", "PARENT", "FOOTPRINT", "SHARE", "PSS");
    for l in &lines {
        let cmd = std::fs::read(format!("/proc/{}/cmdline", l.pid))
            .map(|b| String::from_utf8_lossy(&b).replace('\0', " ").trim().to_string())
            .unwrap_or_default();
        let _ = writeln!(
            t,
            "{} {:>8} {:>8} {:>10} {:>10} {:>10}  {}",
            if l.pid == me { "*" } else { " " },
            l.pid,
            l.parent,
            human(l.footprint),
            human(l.target),
            pss_bytes(l.pid).map_or("-".to_string(), human),
            clip(&cmd, 50)
        );
    }
    let shares: u64 = lines.iter().map(|l| l.target).sum();
    if lines.len() > 1 && shares > budget {
        // Each share is room offered to every process at once: one taking it leaves less
        // for the others at their next look, and a late starter has a floor.
        let _ = writeln!(
            t,
            "  SHARE: what each process may grow to before it evicts; the shares overlap (together {}), the tree is held to {}",
            human(shares),
            human(budget)
        );
    }
    t
}

/// The process's proportional set size (`Pss:` of /proc/PID/smaps_rollup).
fn pss_bytes(pid: u32) -> Option<u64> {
    smaps_rollup_bytes(pid, "Pss:")
}

/// The process's resident anonymous memory (`Anonymous:` of /proc/PID/smaps_rollup), which
/// holds the pager's footprint (the program's present and staged pages, the pool, the
/// metadata) and whatever the pager does not manage.
fn anonymous_bytes(pid: u32) -> Option<u64> {
    smaps_rollup_bytes(pid, "Anonymous:")
}

/// One line of /proc/PID/smaps_rollup (`key` with its colon), in bytes.
fn smaps_rollup_bytes(pid: u32, key: &str) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).ok()?;
    let line = text.lines().find(|l| l.starts_with(key))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

/// "managed 812 MiB of 830 MiB anonymous": how much of the resident anonymous memory is
/// under the pager. The rest (thread stacks, memory mapped before the pager started, shared
/// mappings such as ZGC's heap, MAP_FIXED mappings outside managed memory) is outside the
/// budget.
fn managed_line(footprint: u64, anonymous: u64) -> String {
    // The footprint counts a partly filled pool page whole; never show more than all.
    let managed = footprint.min(anonymous);
    format!(
        "managed {} of {} anonymous ({:.0}%); not managed {}",
        human(managed),
        human(anonymous),
        pct(managed, anonymous),
        human(anonymous - managed)
    )
}

/// Rates between two snapshots `dt` apart.
fn rates(prev: &Stats, now: &Stats, dt: f64) -> String {
    let per = |a: u64, b: u64| b.saturating_sub(a) as f64 / dt.max(1e-6);
    let pin = per(swpin_pages(prev), swpin_pages(now));
    let pout = per(swpout_pages(prev), swpout_pages(now));
    let mb = |pages: f64| pages * PAGE_BYTES as f64 / 1e6;
    format!(
        "rates: faults/s {:.0}  swpin/s {:.0} ({:.1} MB/s)  swpout/s {:.0} ({:.1} MB/s)  file writes/s {:.0}\n",
        per(prev.counters.faults, now.counters.faults),
        pin,
        mb(pin),
        pout,
        mb(pout),
        per(prev.counters.file_writes, now.counters.file_writes)
    )
}

fn watch(pid: u32, secs: f64, format: Format) -> Result<(), String> {
    if !(secs.is_finite() && secs > 0.0) {
        return Err(format!("--watch {secs}: give a number of seconds above 0"));
    }
    let period = Duration::from_secs_f64(secs.max(0.05));
    tierswap_bench::lab::install_interrupt_handler();
    let tty = std::io::stdout().is_terminal() && format == Format::Table;
    let mut out = std::io::stdout();
    if tty {
        let _ = write!(out, "\x1b[?25l");
    }
    let mut prev: Option<(Instant, Stats)> = None;
    let res = loop {
        let r = match query(pid) {
            Ok(r) => r,
            Err(e) if prev.is_some() => {
                let gone = !control::pid_alive(pid);
                break if gone { Ok(Some(format!("process {pid} exited"))) } else { Err(e) };
            }
            Err(e) => break Err(e),
        };
        let now = Instant::now();
        let frame = match format {
            Format::Table => {
                let mut f = table(&r);
                match &prev {
                    Some((t0, s0)) => f.push_str(&rates(s0, &r.stats, now.duration_since(*t0).as_secs_f64())),
                    None => f.push_str("rates: (after the next refresh)\n"),
                }
                f
            }
            Format::Json => format!("{}\n", serde_json::to_string(&r).map_err(|e| e.to_string())?),
            Format::Prometheus => prometheus(std::slice::from_ref(&r)),
        };
        if tty {
            let _ = write!(out, "\x1b[H\x1b[J{frame}");
        } else {
            let _ = writeln!(out, "{frame}");
        }
        let _ = out.flush();
        prev = Some((now, r.stats));
        let deadline = Instant::now() + period;
        while Instant::now() < deadline && !tierswap_bench::lab::interrupted() {
            std::thread::sleep(Duration::from_millis(50).min(period));
        }
        if tierswap_bench::lab::interrupted() {
            break Ok(None);
        }
    };
    if tty {
        let _ = write!(out, "\x1b[?25h");
        let _ = out.flush();
    }
    match res {
        Ok(Some(msg)) => {
            println!("{msg}");
            Ok(())
        }
        Ok(None) => Ok(()),
        Err(e) => Err(e),
    }
}

/// Help of the gauges, by field name of [`Stats`].
fn gauge_help(name: &str) -> &'static str {
    match name {
        "budget" => "Memory budget of the pager (in a process tree: its share of the tree's budget), bytes.",
        "tree_budget" => "Budget of the process tree the pager shares (0: none), bytes.",
        "footprint" => "What counts against the budget now (present + staged pages, pool, metadata), bytes.",
        "present_pages" => "Pages mapped in regions.",
        "staged_pages" => "Pages on the inactive list (staged).",
        "swap_slots" => "Slots in use in the virtual swap space, all backends.",
        "swap_zero_pages" => "Slots holding zero pages.",
        "swap_samefill_pages" => "Slots holding same-filled pages.",
        "pool_stored_bytes" => "Compressed bytes the pool holds.",
        "pool_total_size" => "Bytes the pool occupies (spans), counted against the budget.",
        "pool_limit" => "The pool limit in force (it follows the workload unless --pool-max fixed it), bytes.",
        "pool_stored_pages" => "Pages in the compressed pool.",
        "file_pages" => "Pages in the file tier.",
        "file_blocks" => "4 KiB blocks the file tier occupies.",
        "file_bytes" => "Live bytes in the file tier.",
        "metadata_bytes" => "Engine metadata, bytes.",
        "footprint_max" => "Highest footprint seen, bytes.",
        _ => "tierswap gauge.",
    }
}

/// Prometheus text exposition of one or more processes: counters as `counter`, gauges as
/// `gauge`, the fault latency as a histogram in seconds (cumulative `le` buckets; no
/// `_sum`, which the pager does not record).
pub fn prometheus(replies: &[StatsReply]) -> String {
    let mut t = String::new();
    let Some(first) = replies.first() else { return t };
    // Counters, in the order stats.rs declares them; footprint_max is a high-water gauge.
    for (i, (name, _)) in first.stats.counters.pairs().into_iter().enumerate() {
        let kind = if name == "footprint_max" { "gauge" } else { "counter" };
        let help = if kind == "gauge" {
            gauge_help(name).to_string()
        } else {
            format!("tierswap event counter {name} (names as in /proc/vmstat).")
        };
        let _ = writeln!(t, "# HELP tierswap_{name} {help}");
        let _ = writeln!(t, "# TYPE tierswap_{name} {kind}");
        for r in replies {
            let v = r.stats.counters.pairs().get(i).map(|p| p.1).unwrap_or(0);
            let _ = writeln!(t, "tierswap_{name}{{pid=\"{}\"}} {v}", r.pid);
        }
    }
    // Gauges: every top-level number of Stats.
    let json0 = first.stats.to_json();
    let names: Vec<String> = json0
        .as_object()
        .map(|o| o.iter().filter(|(_, v)| v.is_u64()).map(|(k, _)| k.clone()).collect())
        .unwrap_or_default();
    let jsons: Vec<serde_json::Value> = replies.iter().map(|r| r.stats.to_json()).collect();
    for name in &names {
        let _ = writeln!(t, "# HELP tierswap_{name} {}", gauge_help(name));
        let _ = writeln!(t, "# TYPE tierswap_{name} gauge");
        for (r, j) in replies.iter().zip(&jsons) {
            let _ = writeln!(t, "tierswap_{name}{{pid=\"{}\"}} {}", r.pid, j[name.as_str()].as_u64().unwrap_or(0));
        }
    }
    // Bucket i holds faults of [2^i, 2^(i+1)) µs, the last one everything above.
    let name = "tierswap_fault_latency_seconds";
    let _ = writeln!(t, "# HELP {name} Time to serve a page fault (power-of-two buckets; no _sum recorded).");
    let _ = writeln!(t, "# TYPE {name} histogram");
    for r in replies {
        let h = &r.stats.fault_latency_us;
        let mut cum = 0u64;
        for i in 0..LATENCY_BUCKETS - 1 {
            cum += h.get(i).copied().unwrap_or(0);
            let le = (1u64 << (i + 1)) as f64 / 1e6;
            let _ = writeln!(t, "{name}_bucket{{pid=\"{}\",le=\"{le}\"}} {cum}", r.pid);
        }
        let total: u64 = h.iter().sum();
        let _ = writeln!(t, "{name}_bucket{{pid=\"{}\",le=\"+Inf\"}} {total}", r.pid);
        let _ = writeln!(t, "{name}_count{{pid=\"{}\"}} {total}", r.pid);
    }
    t
}
