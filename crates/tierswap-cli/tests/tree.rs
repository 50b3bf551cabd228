//! One budget for a process tree: `tierswap run` makes a ledger, and the program, its forked
//! children and the programs they exec charge their footprints to it (tierswap::tree). The
//! C program crates/tierswap-preload/tests/c/treework.c forks workers that build memory of
//! their own and checks every byte; these tests watch the ledger and /proc while it runs.

mod common;

use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{compile, tierswap_run, TestDir, TIMEOUT};

const MIB: u64 = 1 << 20;

/// What the sampler saw of a run's tree.
#[derive(Debug, Default)]
struct Seen {
    /// Most processes with a row in the ledger at once.
    members: usize,
    /// Largest sum of the members' footprints, bytes.
    footprint_sum: u64,
    /// Largest summed PSS of the members, bytes (pages shared copy-on-write counted once,
    /// as a memory cgroup charges them; RSS would count a parent's pages in every child).
    pss_sum: u64,
    /// The ledger's budget.
    budget: u64,
    /// Whether the ledger was ever there.
    ledger_seen: bool,
}

fn pss_bytes(pid: u32) -> u64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/smaps_rollup")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("Pss:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .unwrap_or(0)
        * 1024
}

/// The stats every process of a run wrote (`--stats-on-exit PREFIX%p.json` in `dir`).
fn stats_of_each(dir: &TestDir, prefix: &str) -> Vec<serde_json::Value> {
    std::fs::read_dir(dir.path(""))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.file_name().and_then(|n| n.to_str()).is_some_and(|n| n.starts_with(prefix) && n.ends_with(".json"))
        })
        .map(|p| common::stats(&p))
        .collect()
}

/// Runs `cmd` (a `tierswap run`) to its end, sampling its ledger every 5 ms; returns its
/// stdout, whether it succeeded, what was seen, and whether the ledger is gone after.
fn run_watched(mut cmd: Command, dir: &TestDir) -> (String, bool, Seen, bool) {
    let out_path = dir.path("out.txt");
    // The tree's control sockets in a directory of the test's own, to see them all go.
    let control = dir.path("control");
    cmd.env("TIERSWAP_CONTROL_DIR", &control);
    cmd.stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).unwrap())
        .stderr(std::fs::File::create(dir.path("err.txt")).unwrap());
    let mut child = cmd.spawn().expect("spawn tierswap run");
    // run execs the program: its pid is the tree's root, and names the ledger.
    let ledger: PathBuf = tierswap::tree::default_path(child.id());
    let mut seen = Seen::default();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st;
        }
        if t0.elapsed() > TIMEOUT {
            let _ = child.kill();
            panic!("the run hung: {}", std::fs::read_to_string(dir.path("err.txt")).unwrap_or_default());
        }
        if let Ok((budget, lines)) = tierswap::tree::read(&ledger) {
            seen.ledger_seen = true;
            seen.budget = budget;
            seen.members = seen.members.max(lines.len());
            seen.footprint_sum = seen.footprint_sum.max(lines.iter().map(|l| l.footprint).sum());
            seen.pss_sum = seen.pss_sum.max(lines.iter().map(|l| pss_bytes(l.pid)).sum());
        }
        std::thread::sleep(Duration::from_millis(5));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(dir.path("err.txt")).unwrap_or_default();
    eprintln!("{stdout}{stderr}{seen:?}");
    if status.success() {
        // Every process of the tree took its socket away at its end, with exit or with
        // _exit (which runs no atexit handler: the shim's own _exit does it).
        let left: Vec<_> = std::fs::read_dir(&control)
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.file_name()).collect())
            .unwrap_or_default();
        assert!(left.is_empty(), "control sockets left behind: {left:?}");
    }
    (stdout, status.success(), seen, !ledger.exists())
}

/// Four forked workers each build 48 MiB of their own under a 32 MiB budget for the tree
/// (the parent holds 16 MiB): every worker gets a pager of its own in the ledger, the tree's
/// PSS stays near the budget (it is over 200 MiB unmanaged), every byte comes back right,
/// and the ledger is gone at the end, whether the workers leave with exit or _exit.
#[test]
fn forked_workers_share_the_tree_budget() {
    let dir = TestDir::new("tree-workers");
    let prog = compile(&dir, "treework");
    let budget = 32 * MIB;
    // The same tree with 1 MiB of data: what the processes hold besides their data.
    let (out, ok, small, gone) = run_watched(tierswap_run(&["--budget", "32M"], &prog, &["4", "1", "1", "1"]), &dir);
    assert!(ok && out.contains("treework ok") && gone, "baseline run: {out}");
    for how in ["_exit", "exit"] {
        let (out, ok, seen, gone) =
            run_watched(tierswap_run(&["--budget", "32M"], &prog, &["4", "48", "16", "3", how]), &dir);
        assert!(ok && out.contains("treework ok"), "{how}: {out}");
        assert!(seen.ledger_seen && seen.budget == budget, "{how}: {seen:?}");
        assert_eq!(seen.members, 5, "{how}: the parent and each worker have a pager: {seen:?}");
        // The shares are refreshed every few milliseconds, so the tree may run a little
        // over between looks; unmanaged children alone would hold 4 × 48 MiB.
        assert!(seen.footprint_sum <= budget * 3 / 2, "{how}: footprints summed to {} MiB", seen.footprint_sum >> 20);
        assert!(
            seen.pss_sum <= budget * 3 / 2 + small.pss_sum,
            "{how}: the tree's PSS reached {} MiB (with 1 MiB of data: {} MiB)",
            seen.pss_sum >> 20,
            small.pss_sum >> 20
        );
        assert!(gone, "{how}: the last process out removes the ledger");
    }
}

/// `--per-process`: no ledger; each process keeps a budget of its own (the tree may hold
/// several budgets), and every byte is still right.
#[test]
fn per_process_budgets_make_no_ledger() {
    let dir = TestDir::new("tree-per-process");
    let prog = compile(&dir, "treework");
    let (out, ok, seen, _) =
        run_watched(tierswap_run(&["--budget", "16M", "--per-process"], &prog, &["2", "24", "8", "2"]), &dir);
    assert!(ok && out.contains("treework ok"), "{out}");
    assert!(!seen.ledger_seen, "{seen:?}");
}

/// `tierswap stat PID` of a process in a tree shows the tree: one line per process with a
/// pager, the total against the tree's budget, and the process's own budget as its share.
#[test]
fn stat_shows_the_tree() {
    let dir = TestDir::new("tree-stat");
    let prog = compile(&dir, "treework");
    let mut cmd = tierswap_run(&["--budget", "32M"], &prog, &["2", "24", "8", "40"]);
    cmd.stdin(Stdio::null()).stdout(Stdio::null()).stderr(Stdio::null()).process_group(0);
    let mut child = cmd.spawn().expect("spawn tierswap run");
    let root = child.id();
    let ledger = tierswap::tree::default_path(root);
    let t0 = Instant::now();
    let mut members = Vec::new();
    while t0.elapsed() < TIMEOUT && child.try_wait().unwrap().is_none() {
        members = tierswap::tree::read(&ledger).map(|(_, l)| l).unwrap_or_default();
        if members.len() == 3 {
            break;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    assert_eq!(members.len(), 3, "the parent and two workers never had pagers at once: {members:?}");
    let out = Command::new(common::tierswap_bin()).args(["stat", &root.to_string()]).output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    // SAFETY: kills the process group the run leads (its workers too); not reaped yet.
    unsafe { libc::kill(-(root as i32), libc::SIGKILL) };
    let _ = child.wait();
    eprintln!("{text}");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(text.contains("of its share of the tree's budget"), "{text}");
    assert!(text.contains("with a pager, footprint") && text.contains("of the tree's budget 32.0 MiB"), "{text}");
    for m in &members {
        assert!(
            text.lines().any(|l| l.split_whitespace().any(|w| w == m.pid.to_string())),
            "{} missing: {text}",
            m.pid
        );
    }
    assert!(text.lines().any(|l| l.starts_with('*') && l.contains(&root.to_string())), "{text}");
    // The SHARE column: each offered the room left, they overlap, and stat says so with
    // their sum. Rows: [*] PID PARENT FOOTPRINT UNIT SHARE UNIT PSS UNIT COMMAND.
    let shares: f64 = text
        .lines()
        .map(|l| l.trim_start_matches('*').split_whitespace().collect::<Vec<_>>())
        .filter(|w| w.len() > 6 && members.iter().any(|m| w[0] == m.pid.to_string()))
        .map(|w| common::mib(w[4], w[5]))
        .sum();
    let note = text.lines().find(|l| l.contains("the shares overlap (together "));
    if shares > 32.0 {
        let said = note.unwrap_or_else(|| panic!("shares sum to {shares} MiB, no word of it: {text}"));
        let after = said.split("(together ").nth(1).unwrap().split_whitespace().collect::<Vec<_>>();
        let total = common::mib(after[0], after[1].trim_end_matches(',').trim_end_matches(')'));
        assert!((total - shares).abs() < 0.1 * 3.0, "stat's sum {total} against its rows' {shares}: {text}");
    } else {
        assert!(note.is_none(), "shares sum to {shares} MiB, within the budget: {text}");
    }
    // Killed, nobody left its row: the next run's sweep removes the ledger.
    let t0 = Instant::now();
    while ledger.exists() && t0.elapsed() < Duration::from_secs(10) {
        tierswap::tree::sweep(ledger.parent().unwrap());
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(!ledger.exists(), "the ledger of a killed tree is not swept");
}

/// The parent exits right after forking three workers: they live on under the tree's budget
/// (the parent handed them every page of its memory they still needed as it went), each
/// checks every byte of its own memory and of the parent's as of the fork, and their rows go
/// when they do.
#[test]
fn workers_outlive_their_parent_under_the_tree_budget() {
    let dir = TestDir::new("tree-orphans");
    let prog = compile(&dir, "treework");
    let budget = 32 * MIB;
    let out_path = dir.path("out.txt");
    let mut cmd = tierswap_run(&["--budget", "32M"], &prog, &["3", "48", "16", "3", "orphans"]);
    cmd.stdin(Stdio::null()).stdout(std::fs::File::create(&out_path).unwrap()).stderr(Stdio::null());
    let mut child = cmd.spawn().expect("spawn tierswap run");
    let root = child.id();
    assert!(child.wait().unwrap().success(), "the parent failed");
    let ledger = tierswap::tree::default_path(root);
    let (mut most, mut members, mut seen_after) = (0u64, 0usize, false);
    let t0 = Instant::now();
    loop {
        assert!(t0.elapsed() < TIMEOUT, "the workers hung: {}", std::fs::read_to_string(&out_path).unwrap_or_default());
        let lines = tierswap::tree::read(&ledger).map(|(_, l)| l).unwrap_or_default();
        let done = std::fs::read_to_string(&out_path).unwrap_or_default().lines().count() == 3;
        if lines.is_empty() && done {
            break;
        }
        seen_after |= !lines.is_empty();
        assert!(lines.iter().all(|l| l.pid != root), "the parent's row outlived it: {lines:?}");
        members = members.max(lines.len());
        most = most.max(lines.iter().map(|l| l.footprint).sum());
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = std::fs::read_to_string(&out_path).unwrap();
    eprintln!("{out}members {members}, footprints summed to at most {} MiB", most >> 20);
    assert_eq!(out.lines().filter(|l| *l == "worker ok").count(), 3, "{out}");
    assert!(seen_after && members == 3, "the workers had pagers after their parent left: {members}");
    assert!(most <= budget * 3 / 2, "footprints summed to {} MiB", most >> 20);
    tierswap::tree::sweep(ledger.parent().unwrap());
    assert!(!ledger.exists(), "the ledger of a tree that is gone is swept");
}

/// A child that reads what it inherited while its parent rewrites all of it, as a redis
/// BGSAVE beside a server overwriting keys (treecow.c: 26 MiB under 32 MiB for the tree,
/// so the parent's pages are resident and shared at the fork). Each write of the parent's
/// leaves the old page with the child alone: the child's pager finds them
/// (`adopted_unshared`) and evicts them under its share. Uncounted, as they were, the tree's
/// PSS peaked at 58 MiB (both processes' copies); found and evicted, at 38–42 (the peak
/// comes before the child's pager has looked). Every byte of both processes is checked.
#[test]
fn a_child_takes_what_its_parent_rewrote() {
    let dir = TestDir::new("tree-cow");
    let prog = compile(&dir, "treecow");
    let budget = 32 * MIB;
    let (out, ok, small, _) = run_watched(tierswap_run(&["--budget", "32M"], &prog, &["1", "300"]), &dir);
    assert!(ok && out.contains("treecow ok"), "baseline run: {out}");
    let stats = dir.path("cow.%p.json");
    let flags = ["--budget", "32M", "--stats-on-exit", stats.to_str().unwrap()];
    let (out, ok, seen, gone) = run_watched(tierswap_run(&flags, &prog, &["26", "500"]), &dir);
    assert!(ok && out.contains("treecow ok"), "{out}");
    assert!(gone, "the last process out removes the ledger");
    let mut taken: Vec<u64> =
        stats_of_each(&dir, "cow.").iter().map(|s| common::counter(s, "adopted_unshared")).collect();
    taken.sort_unstable();
    let pages = 26 * MIB / 4096;
    assert!(
        taken.len() == 2 && taken[0] == 0 && taken[1] >= pages / 2 && taken[1] <= pages,
        "the parent takes none, the child at least half of the {pages} pages its parent rewrote: {taken:?}"
    );
    assert!(
        seen.pss_sum <= budget * 14 / 10 + small.pss_sum,
        "the tree's PSS reached {} MiB (with 1 MiB of data: {} MiB)",
        seen.pss_sum >> 20,
        small.pss_sum >> 20
    );
}

/// A child whose own pager has started forks in turn: its child reads the program's memory
/// (served by the program's pager) and the child's (served by the child's), builds its own,
/// and its writes stay its own; under 16 MiB for the tree, so all three are swapped.
#[test]
fn a_childs_own_pager_serves_its_forked_child() {
    let dir = TestDir::new("tree-generations");
    let prog = compile(&dir, "treegen");
    let (out, ok, seen, gone) = run_watched(tierswap_run(&["--budget", "16M"], &prog, &[]), &dir);
    assert!(ok && out.contains("treegen ok"), "{out}");
    assert!(seen.members >= 2, "the child had a pager of its own: {seen:?}");
    assert!(gone);
}

/// Three forked readers each read all of their parent's 48 MiB (most of it swapped out by
/// the parent's pager under a 16 MiB budget for the tree), write every 8th page and read it
/// all again; the first forks a child of its own that reads it all too. The parent's server
/// grants each reader's own pager the pieces it reads (`child_granted_pages`), which take
/// them over (`adopted_pages`) and keep them under their shares: the tree's PSS stays within
/// a few budgets (32–38 MiB here), where readers keeping what they were given held 117–124
/// MiB. Every
/// byte is checked by every process, in signal mode too (where the readers keep asking the
/// parent's pager). Each reader first unmaps a mapping it inherited, so an event of its is
/// queued while the parent's pager handles its fork: its mailbox page must still come. And
/// under 128 MiB, where the readers take over pages they still share with the parent, each
/// page a reader writes becomes its own through a write-protect fault (with the protection
/// never set, as once, every reader counted 0 of them).
#[test]
fn readers_take_over_what_they_inherited() {
    let dir = TestDir::new("tree-readers");
    let prog = compile(&dir, "treeread");
    let budget = 16 * MIB;
    let (out, ok, small, _) = run_watched(tierswap_run(&["--budget", "16M"], &prog, &["3", "1"]), &dir);
    assert!(ok && out.contains("treeread ok"), "baseline run: {out}");
    let stats = dir.path("st.%p.json");
    let flags = ["--budget", "16M", "--stats-on-exit", stats.to_str().unwrap()];
    let (out, ok, seen, gone) = run_watched(tierswap_run(&flags, &prog, &["3", "48"]), &dir);
    assert!(ok && out.contains("treeread ok"), "{out}");
    assert!(gone, "the last process out removes the ledger");
    let (mut granted, mut adopted, mut files) = (0, 0, 0);
    for s in stats_of_each(&dir, "st.") {
        granted += common::counter(&s, "child_granted_pages");
        adopted += common::counter(&s, "adopted_pages");
        files += 1;
    }
    assert!(files >= 4, "the parent and its three readers wrote their stats: {files}");
    assert!(granted > 0 && adopted > 0, "granted {granted} pages, adopted {adopted}");
    // Readers that kept what they were given: 117–124 MiB.
    assert!(
        seen.pss_sum <= budget * 3 + small.pss_sum,
        "the tree's PSS reached {} MiB (with 1 MiB of data: {} MiB)",
        seen.pss_sum >> 20,
        small.pss_sum >> 20
    );
    let (out, ok, _, _) =
        run_watched(tierswap_run(&["--budget", "16M", "--fault-mode", "signal"], &prog, &["3", "48"]), &dir);
    assert!(ok && out.contains("treeread ok"), "signal mode: {out}");
    // Under 128 MiB the parent's 48 MiB stay resident: the readers take over pages they
    // share with it, which count as theirs only once written. Each reader writes every 8th
    // page (1,536 of them), each a write-protect fault of its own pager's.
    let roomy = dir.path("roomy.%p.json");
    let flags = ["--budget", "128M", "--stats-on-exit", roomy.to_str().unwrap()];
    let (out, ok, _, _) = run_watched(tierswap_run(&flags, &prog, &["3", "48"]), &dir);
    assert!(ok && out.contains("treeread ok"), "128M: {out}");
    let mut wp = Vec::new();
    for s in stats_of_each(&dir, "roomy.") {
        if common::counter(&s, "adopted_pages") > 0 || common::counter(&s, "faults_wp") > 0 {
            wp.push(common::counter(&s, "faults_wp"));
        }
    }
    let pages = 48 * MIB / 4096 / 8;
    assert!(wp.len() == 3 && wp.iter().all(|&n| n >= pages), "each reader's write-protect faults: {wp:?}");
}
