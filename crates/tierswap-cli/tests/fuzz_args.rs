//! Fuzzes the command line's sizes and percentages: random bad values for `--size`,
//! `--budget`, `--pool-max` (bytes or a percentage), `--file-unit`, `--tiers`,
//! `--compressor`, `bench metadata --swapped` and `bench floor --size`. Every run must end
//! with exit code 2 and one line on stderr: never a panic (101), never a hang.
//!
//! Spawning the binary is slow, so this target is bounded by a case count
//! (`TIERSWAP_FUZZ_CLI_CASES`, default 100), not by time. `TIERSWAP_FUZZ_SEED` replays a run.

use std::io::{Read, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseResult, TestError, TestRng, TestRunner};

/// A run longer than this is a hang (a bad argument is refused in milliseconds).
const HANG: Duration = Duration::from_secs(20);
/// Where the bench flags' backstop points: when every random value happens to be valid, the
/// missing swap directory still stops the run before any benchmark starts.
const NO_DIR: &str = "/nonexistent/tierswap-fuzz-args";

/// One invocation.
#[derive(Clone, Debug)]
enum Invocation {
    /// `bench --workload seq64` with some of the sized flags set to random values.
    Bench { flags: Vec<(&'static str, String)> },
    /// `bench metadata --swapped VALUE`, VALUE a size the library refuses.
    Metadata { swapped: String },
    /// `bench floor --size VALUE`, VALUE a size the library refuses.
    Floor { size: String },
}

impl Invocation {
    fn args(&self) -> Vec<String> {
        // `--flag=value` keeps a value starting with '-' a value, not a flag for clap.
        match self {
            Invocation::Bench { flags } => {
                let mut a =
                    vec!["bench".to_string(), "--workload".into(), "seq64".into(), format!("--swap-dir={NO_DIR}")];
                a.extend(flags.iter().map(|(f, v)| format!("{f}={v}")));
                a
            }
            Invocation::Metadata { swapped } => vec!["bench".into(), "metadata".into(), format!("--swapped={swapped}")],
            Invocation::Floor { size } => vec!["bench".into(), "floor".into(), format!("--size={size}")],
        }
    }
}

/// Values a user might type, or mistype: any text (no NUL: an argument cannot hold one),
/// size-like text, percentages, and known troublemakers.
fn value() -> impl Strategy<Value = String> {
    prop_oneof![
        2 => any::<String>().prop_map(|s| s.replace('\0', "0")),
        1 => "\\PC{0,10}",
        3 => "[ \t\n]?[-+]?[0-9]{0,22}(\\.[0-9]{0,6})?[ \n]?[kKmMgGtTpP]?[iI]?[bB]?[ \n]?",
        2 => "[-+]?([0-9]{0,5}(\\.[0-9]{0,4})?|nan|inf|NaN|1e400|1e2)[ \n]?%[%\n]?",
        1 => prop::sample::select(vec![
            "", "%", " %", "1e400", "18446744073709551616", "18446744073709551616.0", "16777216.0T",
            "99999999999999999999T", "0.0000001K", "-1M", "0x10", "١٢٣", "1K\n2", "\n", "\r\n", "64M\n", "zero,disk",
            "zstd:99", "lz4\n", "100.0000001%", "-0%", "0%",
        ])
        .prop_map(String::from),
    ]
}

fn rejected_size() -> impl Strategy<Value = String> {
    value().prop_filter("a size the library accepts would start a measurement", |v| tierswap::parse_size(v).is_err())
}

fn invocation() -> impl Strategy<Value = Invocation> {
    const FLAGS: [&str; 6] = ["--size", "--budget", "--pool-max", "--file-unit", "--tiers", "--compressor"];
    prop_oneof![
        6 => prop::collection::vec(prop::option::weighted(0.4, value()), FLAGS.len()).prop_map(|vals| Invocation::Bench {
            // Each flag at most once: clap refuses a repeat with its own multi-line usage text.
            flags: FLAGS.iter().zip(vals).filter_map(|(f, v)| v.map(|v| (*f, v))).collect(),
        }),
        1 => rejected_size().prop_map(|swapped| Invocation::Metadata { swapped }),
        1 => rejected_size().prop_map(|size| Invocation::Floor { size }),
    ]
}

/// Runs the binary, killing it past [`HANG`]; returns (exit code, stdout, stderr).
fn run(args: &[String]) -> Result<(Option<i32>, Vec<u8>, String), String> {
    let mut child = Command::new(env!("CARGO_BIN_EXE_tierswap"))
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run tierswap: {e}"))?;
    let start = Instant::now();
    let status = loop {
        match child.try_wait().map_err(|e| format!("wait: {e}"))? {
            Some(status) => break status,
            None if start.elapsed() > HANG => {
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("hung for {} s", HANG.as_secs()));
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    };
    let (mut out, mut err) = (Vec::new(), Vec::new());
    child.stdout.take().map(|mut s| s.read_to_end(&mut out));
    child.stderr.take().map(|mut s| s.read_to_end(&mut err));
    Ok((status.code(), out, String::from_utf8_lossy(&err).into_owned()))
}

fn check(inv: Invocation) -> TestCaseResult {
    let args = inv.args();
    let (code, out, err) = run(&args).map_err(TestCaseError::fail)?;
    prop_assert!(code != Some(101), "tierswap panicked on {args:?}:\n{err}");
    prop_assert_eq!(code, Some(2), "exit code for {:?}; stderr:\n{}", args, err);
    prop_assert!(out.is_empty(), "stdout for {args:?}: {}", String::from_utf8_lossy(&out));
    prop_assert!(err.starts_with("tierswap: "), "stderr for {args:?}: {err:?}");
    prop_assert!(
        err.ends_with('\n') && err.matches('\n').count() == 1 && !err.contains('\r'),
        "stderr for {args:?} is not one line: {err:?}"
    );
    Ok(())
}

fn seed() -> u64 {
    match std::env::var("TIERSWAP_FUZZ_SEED") {
        Ok(v) => {
            let v = v.trim();
            v.strip_prefix("0x")
                .map_or_else(|| v.parse(), |h| u64::from_str_radix(h, 16))
                .expect("TIERSWAP_FUZZ_SEED: a seed a run printed")
        }
        Err(_) => std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64),
    }
}

#[test]
fn bad_sizes_and_percentages_exit_2_with_one_line() {
    let cases: u32 = std::env::var("TIERSWAP_FUZZ_CLI_CASES").ok().and_then(|v| v.trim().parse().ok()).unwrap_or(100);
    let base = seed();
    let mut bytes = [0u8; 32];
    for (i, chunk) in bytes.chunks_mut(8).enumerate() {
        chunk.copy_from_slice(&(base ^ (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15)).to_le_bytes());
    }
    let config = Config { cases, failure_persistence: None, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, TestRng::from_seed(RngAlgorithm::ChaCha, &bytes));
    let start = Instant::now();
    match runner.run(&invocation(), check) {
        Ok(()) => {}
        Err(TestError::Fail(why, input)) => panic!(
            "fuzz cli::args failed; replay with TIERSWAP_FUZZ_SEED={base:#x}\nminimal input: {input:#?}\nargs: {:?}\nwhy: {why}",
            input.args()
        ),
        Err(TestError::Abort(why)) => panic!("fuzz cli::args aborted: {why}"),
    }
    // Straight to stderr, past the harness's capture, so CI logs show the count.
    let _ = writeln!(
        std::io::stderr(),
        "fuzz cli::args: {cases} cases in {:.1} s (TIERSWAP_FUZZ_SEED={base:#x})",
        start.elapsed().as_secs_f64()
    );
}

/// Regression (found by the fuzz above): a value with a newline in it made the error message
/// two lines; the binary now escapes control characters in its one-line errors.
#[test]
fn a_newline_in_a_value_stays_one_line() {
    for args in [
        Invocation::Bench { flags: vec![("--size", "1K\n2".into())] },
        Invocation::Bench { flags: vec![("--tiers", "zero,di\nsk".into())] },
        Invocation::Bench { flags: vec![("--pool-max", "1\nx%".into())] },
        Invocation::Metadata { swapped: "\r\n".into() },
    ] {
        let (code, _, err) = run(&args.args()).expect("tierswap runs");
        assert_eq!(code, Some(2), "{args:?}: {err}");
        assert_eq!(err.matches('\n').count(), 1, "{args:?}: {err:?}");
        assert!(err.contains("\\n"), "the newline is shown escaped: {err:?}");
    }
}
