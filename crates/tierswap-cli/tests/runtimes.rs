//! Managed runtimes under `tierswap run`: the JVM (G1, Parallel, Serial; ZGC's shared heap
//! told apart), Node.js (Buffers and V8's heap) and Go built with cgo, each with a program
//! of its own language (tests/runtimes) that fills memory well beyond the budget, verifies
//! every byte it wrote and prints its peak resident memory (VmHWM). The budget holds when
//! that peak stays near the budget plus what the same runtime takes running nothing
//! (measured natively in the same test); unmanaged, it is the whole fill on top.
//!
//! The runtimes come from the machine: `java`/`javac` (OpenJDK 17), `node`, `go` (on PATH
//! or /usr/local/go/bin); scripts/setup.sh installs what is missing.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;

use common::{run_to_end, tierswap_run, TestDir};

const BUDGET: &str = "64M";
const BUDGET_KIB: u64 = 64 << 10;
/// MiB each program fills: three times the budget.
const FILL_MIB: &str = "192";

/// Where a runtime's tool is: on PATH, else at one of `also`.
fn tool(name: &str, also: &[&str]) -> PathBuf {
    let on_path = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).map(|d| d.join(name)).find(|c| c.is_file()))
        .unwrap_or_default();
    on_path
        .or_else(|| also.iter().map(PathBuf::from).find(|c| c.is_file()))
        .unwrap_or_else(|| panic!("{name} is missing: these tests run real runtimes (scripts/setup.sh installs them)"))
}

fn sources() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/runtimes")
}

/// The program's "vmhwm_kib N" line.
fn vmhwm_kib(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("vmhwm_kib "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or_else(|| panic!("no vmhwm_kib line in:\n{stdout}"))
}

/// Runs `prog ARGS` natively (no shim) and returns the peak resident memory it printed:
/// the runtime running (next to) nothing.
fn native_peak(prog: &Path, args: &[&str], ok: &str) -> u64 {
    let mut cmd = Command::new(prog);
    cmd.args(args).env_remove("LD_PRELOAD");
    let ran = run_to_end(cmd);
    assert!(ran.status.success() && ran.stdout.contains(ok), "native run: {}", ran.describe());
    vmhwm_kib(&ran.stdout)
}

/// Under the budget the peak stays within the budget plus the runtime's own (a quarter of
/// the budget on top for reclaim catching up with a fast fill); unmanaged, the fill of 192
/// MiB would add to it in full.
fn assert_within_budget(what: &str, peak_kib: u64, trivial_kib: u64, ran: &common::Ran) {
    let limit = BUDGET_KIB * 5 / 4 + trivial_kib;
    assert!(
        peak_kib <= limit,
        "{what}: peak resident {} MiB over {} MiB (budget {BUDGET} × 1.25 + the runtime alone {} MiB): its heap escaped the budget\n{}",
        peak_kib >> 10,
        limit >> 10,
        trivial_kib >> 10,
        ran.describe()
    );
}

/// A directory named `name` with Fill.java compiled into it, and the `java` to run it.
fn jvm(name: &str) -> (TestDir, PathBuf) {
    let dir = TestDir::new(name);
    let out = Command::new(tool("javac", &[]))
        .arg("-d")
        .arg(&dir.0)
        .arg(sources().join("Fill.java"))
        .output()
        .expect("run javac");
    assert!(out.status.success(), "javac Fill.java:\n{}", String::from_utf8_lossy(&out.stderr));
    (dir, tool("java", &[]))
}

/// The JVM's own peak running Fill with nothing to fill, natively.
fn jvm_alone(dir: &TestDir, java: &Path) -> u64 {
    native_peak(java, &java_args(dir, "-XX:+UseG1GC", &["0"]), "jvm ok 0 MiB")
}

fn java_args<'a>(dir: &'a TestDir, gc: &'a str, rest: &[&'a str]) -> Vec<&'a str> {
    let mut v = vec!["-Xmx1g", gc, "-cp", dir.0.to_str().unwrap(), "Fill"];
    v.extend_from_slice(rest);
    v
}

/// The JVM's heap with G1 (the default), ParallelGC and SerialGC: reserved PROT_NONE,
/// committed with mmap(MAP_FIXED), all of it managed: 192 MiB of byte arrays under 64 MiB.
#[test]
fn jvm_heaps_stay_within_the_budget() {
    let (dir, java) = jvm("jvm");
    let trivial = jvm_alone(&dir, &java);
    for gc in ["-XX:+UseG1GC", "-XX:+UseParallelGC", "-XX:+UseSerialGC"] {
        let ran = run_to_end(tierswap_run(&["--budget", BUDGET], &java, &java_args(&dir, gc, &[FILL_MIB])));
        assert!(ran.status.success() && ran.stdout.contains("jvm ok 192 MiB"), "{gc}: {}", ran.describe());
        assert!(ran.stderr.is_empty(), "{gc}: nothing to say: {}", ran.describe());
        assert_within_budget(gc, vmhwm_kib(&ran.stdout), trivial, &ran);
    }
}

/// G1 with a churn of short-lived arrays over a live set for a few seconds: every array is
/// checked before it dies, the live set at the end.
#[test]
fn jvm_churn_keeps_its_bytes_within_the_budget() {
    let (dir, java) = jvm("jvm-churn");
    let trivial = jvm_alone(&dir, &java);
    let ran =
        run_to_end(tierswap_run(&["--budget", BUDGET], &java, &java_args(&dir, "-XX:+UseG1GC", &["96", "churn", "4"])));
    assert!(ran.status.success() && ran.stdout.contains("jvm ok 96 MiB"), "{}", ran.describe());
    let churned: u64 = ran
        .stdout
        .split_once("MiB, ")
        .and_then(|(_, r)| r.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no churn count: {}", ran.stdout));
    assert!(churned > 1000, "the churn ran: {churned} short-lived arrays");
    assert_within_budget("G1 churn", vmhwm_kib(&ran.stdout), trivial, &ran);
}

/// A JVM whose heap is managed starts processes (ProcessBuilder: posix_spawn of the JDK's
/// jspawnhelper, which gets a pager of its own through LD_PRELOAD and then dups its pipes
/// onto fds 0-3, where that pager's descriptors must not be): every process's output right.
#[test]
fn jvm_starts_processes() {
    let (dir, java) = jvm("jvm-spawn");
    let ran = run_to_end(tierswap_run(
        &["--budget", BUDGET],
        &java,
        &java_args(&dir, "-XX:+UseG1GC", &["96", "spawn", "20"]),
    ));
    assert!(
        ran.status.success() && ran.stdout.contains("jvm ok 96 MiB, 0 short-lived arrays, 20 processes"),
        "{}",
        ran.describe()
    );
    assert!(ran.stderr.is_empty(), "nothing to say: {}", ran.describe());
}

/// ZGC maps its heap as shared memory (memfd), which the shim cannot manage: the program
/// runs, and at exit one line says how much was out of reach; --strict makes that exit 2.
#[test]
fn jvm_zgc_is_told_apart_at_exit() {
    let (dir, java) = jvm("jvm-zgc");
    let args = java_args(&dir, "-XX:+UseZGC", &[FILL_MIB]);
    let ran = run_to_end(tierswap_run(&["--budget", BUDGET], &java, &args));
    assert!(ran.status.success() && ran.stdout.contains("jvm ok 192 MiB"), "{}", ran.describe());
    let lines: Vec<&str> = ran.stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line: {}", ran.describe());
    assert!(
        lines[0].starts_with("tierswap: java (pid ")
            && lines[0].contains("resident that tierswap could not manage")
            && lines[0].contains("MiB shared memory"),
        "{}",
        ran.describe()
    );
    let ran = run_to_end(tierswap_run(&["--budget", BUDGET, "--strict"], &java, &args));
    assert_eq!(ran.status.code(), Some(2), "{}", ran.describe());
    assert!(ran.stdout.contains("jvm ok 192 MiB"), "the program ran to its end, output flushed: {}", ran.describe());
    assert!(ran.stderr.trim_end().ends_with("(--strict: exit status 2)"), "{}", ran.describe());
}

/// Node.js: Buffers (malloc'd) and V8's heap (256 KiB pages, reserved PROT_NONE and
/// committed with mprotect), both managed.
#[test]
fn node_heap_and_buffers_stay_within_the_budget() {
    let node = tool("node", &[]);
    let js = sources().join("fill.js");
    let trivial = native_peak(&node, &[js.to_str().unwrap(), "0"], "node ok 0 MiB");
    let ran = run_to_end(tierswap_run(&["--budget", BUDGET], &node, &[js.to_str().unwrap(), FILL_MIB]));
    assert!(ran.status.success() && ran.stdout.contains("node ok 192 MiB"), "{}", ran.describe());
    assert!(ran.stderr.is_empty(), "nothing to say: {}", ran.describe());
    assert_within_budget("node", vmhwm_kib(&ran.stdout), trivial, &ran);
}

/// Builds tests/runtimes/NAME/main.go into `dir` (cgo on or off), offline, with the build
/// cache in the target directory.
fn go_build(dir: &TestDir, name: &str, cgo: bool) -> PathBuf {
    let go = tool("go", &["/usr/local/go/bin/go", "/usr/lib/go/bin/go"]);
    let out = dir.path(name);
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("go-build");
    let o = Command::new(go)
        .args(["build", "-o"])
        .arg(&out)
        .arg(sources().join(name).join("main.go"))
        .env("CGO_ENABLED", if cgo { "1" } else { "0" })
        .env("GOCACHE", &cache)
        .env("GOPATH", cache.join("gopath"))
        .env("GOTOOLCHAIN", "local")
        .env("GOPROXY", "off")
        .env("GOFLAGS", "")
        .env("GO111MODULE", "on")
        .current_dir(&dir.0)
        .output()
        .expect("run go build");
    assert!(o.status.success(), "go build {name}:\n{}", String::from_utf8_lossy(&o.stderr));
    out
}

/// A Go program built with cgo maps its heap through libc: reserved PROT_NONE at hinted
/// addresses, committed with mmap(MAP_FIXED); managed.
#[test]
fn go_with_cgo_stays_within_the_budget() {
    let dir = TestDir::new("go-cgo");
    let prog = go_build(&dir, "cgo", true);
    let trivial = native_peak(&prog, &["0"], "go ok 0 MiB");
    let ran = run_to_end(tierswap_run(&["--budget", BUDGET], &prog, &[FILL_MIB]));
    assert!(ran.status.success() && ran.stdout.contains("go ok 192 MiB"), "{}", ran.describe());
    assert!(ran.stderr.is_empty(), "nothing to say: {}", ran.describe());
    assert_within_budget("go (cgo)", vmhwm_kib(&ran.stdout), trivial, &ran);
}

/// A static Go binary (CGO_ENABLED=0): the one line before it starts, it runs unmanaged;
/// --strict exits 2 and does not start it.
#[test]
fn go_static_is_named_before_it_starts() {
    let dir = TestDir::new("go-static");
    let prog = go_build(&dir, "static", false);
    let ran = run_to_end(tierswap_run(&["--budget", BUDGET], &prog, &[]));
    assert!(ran.status.success() && ran.stdout.contains("go static ok"), "{}", ran.describe());
    assert_eq!(
        ran.stderr.trim_end(),
        format!(
            "tierswap run: {} is statically linked: LD_PRELOAD cannot reach its memory; nothing will be managed",
            prog.display()
        ),
        "{}",
        ran.describe()
    );
    let ran = run_to_end(tierswap_run(&["--budget", BUDGET, "--strict"], &prog, &[]));
    assert_eq!(ran.status.code(), Some(2), "{}", ran.describe());
    assert!(ran.stdout.is_empty(), "not started: {}", ran.describe());
    assert!(ran.stderr.trim_end().ends_with("(--strict: not started)"), "{}", ran.describe());
}

/// A flag's value in `java -XX:+PrintFlagsFinal` output.
fn jvm_flag<'a>(flags: &'a str, name: &str) -> &'a str {
    flags
        .lines()
        .find_map(|l| {
            let mut w = l.split_whitespace();
            let (_, n, _, v) = (w.next()?, w.next()?, w.next()?, w.next()?);
            (n == name).then_some(v)
        })
        .unwrap_or_else(|| panic!("no {name} in:\n{flags}"))
}

/// The JVM and Node.js read the budget as their memory cgroup's limit and size themselves
/// by it, as they do in a memcg of that limit: under 256M the JVM takes the Serial
/// collector and a maximal heap under the budget (measured: 126 MiB), V8 a heap limit
/// near it (259 MiB); with --real-cgroup-limit they see the machine's memory (this
/// project's machine: G1, 6 GiB, 4,144 MiB).
#[test]
fn runtimes_size_their_heaps_by_the_budget() {
    let budget: u64 = 256 << 20;
    let java = tool("java", &[]);
    let flags = |extra: &[&str]| {
        let mut f = vec!["--budget", "256M"];
        f.extend_from_slice(extra);
        let ran = run_to_end(tierswap_run(&f, &java, &["-XX:+PrintFlagsFinal", "-version"]));
        assert!(ran.status.success(), "{}", ran.describe());
        ran.stdout
    };
    let seen = flags(&[]);
    assert_eq!(jvm_flag(&seen, "UseSerialGC"), "true", "the collector a 256 MiB memcg gets");
    let max_heap: u64 = jvm_flag(&seen, "MaxHeapSize").parse().unwrap();
    assert!(max_heap <= budget, "MaxHeapSize {max_heap} within the budget");
    let machine = flags(&["--real-cgroup-limit"]);
    let max_heap: u64 = jvm_flag(&machine, "MaxHeapSize").parse().unwrap();
    assert!(max_heap > budget, "MaxHeapSize {max_heap}: a quarter of the machine's memory");

    let node = tool("node", &[]);
    let limit = |extra: &[&str]| -> u64 {
        let mut f = vec!["--budget", "256M"];
        f.extend_from_slice(extra);
        let js = "console.log(require('v8').getHeapStatistics().heap_size_limit)";
        let ran = run_to_end(tierswap_run(&f, &node, &["-e", js]));
        assert!(ran.status.success(), "{}", ran.describe());
        ran.stdout.trim().parse().unwrap_or_else(|_| panic!("a number: {}", ran.describe()))
    };
    let (seen, machine) = (limit(&[]), limit(&["--real-cgroup-limit"]));
    assert!(seen <= 2 * budget, "V8's heap limit {seen} near the budget");
    assert!(machine > 4 * budget, "V8's heap limit {machine} from the machine's memory");
}
