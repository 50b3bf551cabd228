//! Fuzzing at scale with proptest: each target runs random cases for a bounded time, not a
//! bounded count, and a failure is reported with the minimal input proptest shrank it to.
//!
//! Time: `TIERSWAP_FUZZ_SECS` is the whole suite's budget in seconds, shared among the targets
//! by weight (see [`TOTAL_WEIGHT`]); unset or 0 means a quick dev run of [`DEV_TOTAL_SECS`].
//! `scripts/test.sh` (CI) sets 64. Seeds: every run draws a fresh base seed and prints it;
//! `TIERSWAP_FUZZ_SEED=0x…` replays a run (the same cases in the same order).
//!
//! Targets, one module each: [`parsers`] (sizes, tiers, compressor, swap-in policy, config
//! validation), [`words`] (pte, swap entry, pool handle), [`pool`] (the pool allocator against
//! a model), [`swap_space`] (the slot allocator against a model). docs/fuzzing.md says more.

use std::fmt::Debug;
use std::io::Write;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngAlgorithm, TestCaseResult, TestError, TestRng, TestRunner};

/// The suite's seconds when `TIERSWAP_FUZZ_SECS` is unset or 0: a dev run stays short.
const DEV_TOTAL_SECS: f64 = 6.0;
/// Sum of the targets' weights; a target of weight `w` gets `w / TOTAL_WEIGHT` of the time.
const TOTAL_WEIGHT: u32 = 12;

fn total_secs() -> f64 {
    match std::env::var("TIERSWAP_FUZZ_SECS") {
        Err(_) => DEV_TOTAL_SECS,
        Ok(v) => match v.trim().parse::<f64>() {
            Ok(0.0) => DEV_TOTAL_SECS,
            Ok(s) if s.is_finite() && s > 0.0 => s,
            _ => panic!("TIERSWAP_FUZZ_SECS={v:?}: give the suite's seconds, e.g. 64 (0 = a short dev run)"),
        },
    }
}

/// The run's base seed, one for all targets: `TIERSWAP_FUZZ_SEED` (hex with 0x, or decimal)
/// or a fresh one.
fn base_seed() -> u64 {
    static SEED: std::sync::OnceLock<u64> = std::sync::OnceLock::new();
    *SEED.get_or_init(|| match std::env::var("TIERSWAP_FUZZ_SEED") {
        Ok(v) => {
            let v = v.trim();
            let parsed = match v.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => v.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("TIERSWAP_FUZZ_SEED={v:?}: give the seed a run printed, e.g. 0x1234abcd"))
        }
        Err(_) => {
            let nanos = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos() as u64)
                .unwrap_or(0);
            nanos ^ ((std::process::id() as u64) << 32)
        }
    })
}

fn splitmix64(x: &mut u64) -> u64 {
    *x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    let mut z = *x;
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Each target gets its own stream from the base seed, so targets stay reproducible alone.
fn target_rng(base: u64, name: &str) -> TestRng {
    let mut x = name.bytes().fold(base ^ 0xcbf2_9ce4_8422_2325, |h, b| (h ^ b as u64).wrapping_mul(0x100_0000_01b3));
    let mut seed = [0u8; 32];
    for chunk in seed.chunks_mut(8) {
        chunk.copy_from_slice(&splitmix64(&mut x).to_le_bytes());
    }
    TestRng::from_seed(RngAlgorithm::ChaCha, &seed)
}

/// Runs `test` on cases of `strategy` until the target's share of the time is spent (at least
/// one case), then prints how many ran. A failing case is shrunk and reported with its minimal
/// input and the seed that replays it.
fn fuzz<S: Strategy>(name: &str, weight: u32, strategy: S, test: impl Fn(S::Value) -> TestCaseResult) {
    let budget = Duration::from_secs_f64(total_secs() * weight as f64 / TOTAL_WEIGHT as f64);
    let base = base_seed();
    // Shrinking gets its own bound so that a failure in CI still ends in minutes.
    let config = Config { failure_persistence: None, max_shrink_time: 120_000, ..Config::default() };
    let mut runner = TestRunner::new_with_rng(config, target_rng(base, name));
    let start = Instant::now();
    let mut cases = 0u64;
    while cases == 0 || start.elapsed() < budget {
        let tree =
            strategy.new_tree(&mut runner).unwrap_or_else(|why| panic!("fuzz {name}: cannot generate a case: {why}"));
        match runner.run_one(tree, &test) {
            Ok(_) => cases += 1,
            Err(TestError::Fail(why, input)) => panic!(
                "fuzz {name}: case {} failed; replay with TIERSWAP_FUZZ_SEED={base:#x}\nminimal input: {input:#?}\nwhy: {why}",
                cases + 1
            ),
            Err(TestError::Abort(why)) => panic!("fuzz {name}: aborted after {cases} cases: {why}"),
        }
    }
    // Straight to stderr, past the test harness's capture, so CI logs show the counts.
    let _ = writeln!(
        std::io::stderr(),
        "fuzz {name}: {cases} cases in {:.1} s (TIERSWAP_FUZZ_SEED={base:#x})",
        start.elapsed().as_secs_f64()
    );
}

/// Values near the edges where bugs live (0, 1, powers of two and their neighbours, MAX) and
/// uniform ones.
fn edgy_u64() -> impl Strategy<Value = u64> {
    prop_oneof![
        3 => any::<u64>(),
        2 => (0u32..64, -2i64..=2).prop_map(|(s, d)| (1u64 << s).wrapping_add(d as u64)),
        1 => prop::sample::select(vec![0, 1, u64::MAX, u64::MAX - 1, i64::MAX as u64]),
        1 => (any::<u32>(), 0u32..=40).prop_map(|(x, s)| (x as u64) << s),
    ]
}

/// Size, tier, compressor and policy parsers never panic, accept exactly what they document,
/// and give back what was formatted; `PagerConfig::validate` agrees with its documentation.
mod parsers {
    use super::*;
    use tierswap::config::{ConfigError, MIN_BUDGET_BYTES};
    use tierswap::{parse_size, Compressor, Hint, PagerConfig, SwapinPolicy, Tiers};

    /// A size text and what the documented grammar says of it.
    #[derive(Clone, Debug)]
    enum SizeCase {
        /// Any text: checked against the reference reading.
        Text(String),
        /// A byte count formatted in its largest exact unit (and as plain bytes) parses back.
        RoundTrip { bytes: u64, upper: bool, b_suffix: usize },
        /// A byte count below 2^53 formatted as a decimal in a unit (`0.0009765625K`) parses back.
        Decimal { bytes: u64, unit: usize },
    }

    const UNITS: [(char, u32); 5] = [(' ', 0), ('K', 10), ('M', 20), ('G', 30), ('T', 40)];
    const B_SUFFIXES: [&str; 4] = ["", "B", "iB", "b"];

    /// Texts that bit parsers elsewhere: exponents, huge numbers, the u64 boundary in every
    /// unit, non-ASCII digits and letters, combining marks after a unit.
    const NASTY: &[&str] = &[
        "1e400",
        "1e3",
        "0.0000001K",
        "18446744073709551615",
        "18446744073709551616",
        "18446744073709551616.0",
        "18446744073709551615.0",
        "16777216.0T",
        "16777215.99999999T",
        "17179869184G",
        "17179869183.9999G",
        "0.5",
        ".5K",
        "5.M",
        ".",
        "..",
        "1..2",
        "1.2.3",
        "NaN",
        "inf",
        "infinity",
        "-0",
        "+1",
        "0x10",
        "1_000",
        "١٢٣",
        "１２",
        "1\u{212a}",
        "\u{212a}",
        "1K\u{301}",
        "1é",
        "ǅ",
        "iB",
        "B",
        "K",
        "kib",
        "1 K iB",
        "1\u{a0}K",
        "\u{200b}1K",
        "99999999999999999999999999999999999999999999999999T",
        "0.00000000000000000000000000000000000000000000000001T",
    ];

    fn size_text() -> impl Strategy<Value = String> {
        let ws = || prop::sample::select(vec!["", "", "", " ", "\t", "\n", "\u{a0}", "\u{3000}", "\u{200b}"]);
        let number = (
            prop::sample::select(vec!["", "", "", "", "", "-", "+"]),
            prop_oneof![4 => "[0-9]{0,21}", 1 => "[0-9]{19,60}"],
            prop::option::of("[0-9]{0,24}"),
        );
        let unit = (
            prop::sample::select(vec!["", "", " "]),
            prop::sample::select(vec!["", "k", "K", "m", "M", "g", "G", "t", "T", "p", "e", "x", "kk"]),
            prop::sample::select(vec!["", "", "b", "B", "ib", "iB", "IB", "i", "bb"]),
        );
        (ws(), number, unit, ws()).prop_map(|(lead, (sign, int, frac), (gap, unit, b), tail)| {
            let frac = frac.map(|f| format!(".{f}")).unwrap_or_default();
            format!("{lead}{sign}{int}{frac}{gap}{unit}{b}{tail}")
        })
    }

    /// Decimals just around 2^64 bytes in each unit: where a float's rounding meets u64::MAX.
    fn boundary_text() -> impl Strategy<Value = String> {
        (1usize..5, -3i64..=3, prop::sample::select(vec!["0", "", "5", "0000001", "9999999999"]), any::<bool>())
            .prop_map(|(unit, delta, frac, lower)| {
                let (letter, shift) = UNITS[unit];
                let whole = ((1u128 << (64 - shift)) as i128 + delta as i128) as u128;
                let letter = if lower { letter.to_ascii_lowercase() } else { letter };
                format!("{whole}.{frac}{letter}")
            })
    }

    fn size_case() -> impl Strategy<Value = SizeCase> {
        prop_oneof![
            4 => size_text().prop_map(SizeCase::Text),
            2 => any::<String>().prop_map(SizeCase::Text),
            1 => "\\PC{0,12}".prop_map(SizeCase::Text),
            1 => prop::sample::select(NASTY).prop_map(|s| SizeCase::Text(s.to_string())),
            1 => boundary_text().prop_map(SizeCase::Text),
            2 => (edgy_u64(), any::<bool>(), 0..B_SUFFIXES.len())
                .prop_map(|(bytes, upper, b_suffix)| SizeCase::RoundTrip { bytes, upper, b_suffix }),
            2 => (edgy_u64(), 1..UNITS.len()).prop_map(|(b, unit)| SizeCase::Decimal { bytes: b & ((1 << 53) - 1), unit }),
        ]
    }

    /// What the documented grammar says of a size text.
    #[derive(Debug)]
    enum Want {
        /// Not a size: an error.
        Reject,
        /// Fits no u64: an error.
        TooBig,
        /// An integer size: exactly these bytes.
        Exact(u64),
        /// A decimal size: `scaled / scale` bytes (the fraction cut at 18 digits), give or take
        /// the float rounding the parser documents.
        Near { scaled: u128, scale: u128 },
    }

    /// The reference reading of a size, written from `parse_size`'s documentation: surrounding
    /// whitespace, digits with at most one '.', then an optional K/M/G/T, then an optional B or
    /// iB, case-insensitive. Values are computed exactly, in integers.
    fn reference(s: &str) -> Want {
        let mut t: Vec<char> = s.trim().chars().collect();
        let low = |t: &Vec<char>| t.last().map(|c| c.to_ascii_lowercase());
        if low(&t) == Some('b') {
            t.pop();
            if low(&t) == Some('i') {
                t.pop();
            }
        }
        let shift = match low(&t) {
            Some('k') => 10,
            Some('m') => 20,
            Some('g') => 30,
            Some('t') => 40,
            _ => 0,
        };
        if shift > 0 {
            t.pop();
        }
        let text: String = t.into_iter().collect();
        let num = text.trim();
        let (int, frac) = match num.split_once('.') {
            Some((i, f)) => (i, Some(f)),
            None => (num, None),
        };
        let all_digits = int.chars().chain(frac.unwrap_or("").chars()).all(|c| c.is_ascii_digit());
        if !all_digits || int.len() + frac.map_or(0, str::len) == 0 {
            return Want::Reject;
        }
        let int = int.trim_start_matches('0');
        let Some(frac) = frac else {
            return match int.parse::<u128>().ok().and_then(|v| v.checked_mul(1 << shift)) {
                _ if int.is_empty() => Want::Exact(0),
                Some(v) if v <= u64::MAX as u128 => Want::Exact(v as u64),
                _ => Want::TooBig,
            };
        };
        if int.len() > 20 {
            return Want::TooBig;
        }
        let frac = &frac[..frac.len().min(18)];
        let scale = 10u128.pow(frac.len() as u32);
        let whole: u128 = if int.is_empty() { 0 } else { int.parse().expect("20 digits fit u128") };
        let part: u128 = if frac.is_empty() { 0 } else { frac.parse().expect("18 digits fit u128") };
        // < 10^38: fits. Shifted, it either overflows u128 (then it is far above 2^64 bytes) or fits.
        let n = whole * scale + part;
        match n.checked_mul(1 << shift) {
            Some(scaled) if scaled < (1u128 << 64) * scale => Want::Near { scaled, scale },
            _ => Want::TooBig,
        }
    }

    fn unit_text(unit: usize, upper: bool, b_suffix: usize) -> String {
        let letter = UNITS[unit].0;
        let letter = if unit == 0 {
            String::new()
        } else if upper {
            letter.to_string()
        } else {
            letter.to_ascii_lowercase().to_string()
        };
        format!("{letter}{}", B_SUFFIXES[b_suffix])
    }

    fn check_size(case: SizeCase) -> TestCaseResult {
        match case {
            SizeCase::Text(s) => {
                let got = parse_size(&s);
                match reference(&s) {
                    Want::Reject | Want::TooBig => prop_assert!(got.is_err(), "{s:?} gave {got:?}"),
                    Want::Exact(v) => prop_assert_eq!(&got, &Ok(v), "{:?}", s),
                    Want::Near { scaled, scale } => {
                        // One byte of rounding, the float's 2^-52, and the cut fraction.
                        let tol = 2 * scale + (scaled >> 51);
                        match got {
                            Ok(v) => {
                                let diff = (v as u128 * scale).abs_diff(scaled);
                                prop_assert!(diff <= tol, "{s:?} gave {v}, want {scaled}/{scale}");
                            }
                            Err(ref e) => prop_assert!(
                                scaled + tol >= ((1u128 << 64) - 4096) * scale,
                                "{s:?} fits a u64 ({scaled}/{scale}) but was rejected: {e}"
                            ),
                        }
                    }
                }
                if let Err(e) = &got {
                    prop_assert!(e.to_string().contains("cannot parse size"));
                }
                // Case-insensitive and deaf to surrounding whitespace.
                let ok = got.as_ref().ok().copied();
                prop_assert_eq!(parse_size(&s.to_ascii_uppercase()).ok(), ok, "upper-cased {:?}", s);
                prop_assert_eq!(parse_size(&format!(" \t{s}\u{a0}")).ok(), ok, "padded {:?}", s);
            }
            SizeCase::RoundTrip { bytes, upper, b_suffix } => {
                let plain = format!("{bytes}{}", if b_suffix == 1 { "B" } else { "" });
                prop_assert_eq!(parse_size(&plain), Ok(bytes), "{}", plain);
                let unit = (1..UNITS.len()).rev().find(|&u| bytes != 0 && bytes.trailing_zeros() >= UNITS[u].1);
                if let Some(u) = unit {
                    let text = format!("{}{}", bytes >> UNITS[u].1, unit_text(u, upper, b_suffix));
                    prop_assert_eq!(parse_size(&text), Ok(bytes), "{}", text);
                }
                // One unit up overflows exactly when the product does.
                for (u, &(_, shift)) in UNITS.iter().enumerate().skip(1) {
                    let text = format!("{bytes}{}", unit_text(u, upper, b_suffix));
                    match bytes.checked_mul(1 << shift) {
                        Some(v) => prop_assert_eq!(parse_size(&text), Ok(v), "{}", text),
                        None => prop_assert!(parse_size(&text).is_err(), "{text} overflows u64"),
                    }
                }
            }
            SizeCase::Decimal { bytes, unit } => {
                // Exact in f64 (bytes < 2^53, a power-of-two divisor), and Display is the
                // shortest text that reads back to the same f64, never an exponent.
                let (letter, shift) = UNITS[unit];
                let text = format!("{}{letter}", bytes as f64 / (1u64 << shift) as f64);
                prop_assert_eq!(parse_size(&text), Ok(bytes), "{}", text);
            }
        }
        Ok(())
    }

    #[test]
    fn sizes() {
        fuzz("parsers::sizes", 1, size_case(), check_size);
    }

    /// Regression (found by `sizes`): a decimal that is exactly 2^64 bytes used to parse as
    /// u64::MAX, since `2^64 as f64 > u64::MAX as f64` is false (both are 2^64).
    #[test]
    fn size_of_exactly_2_pow_64_is_rejected() {
        for s in ["18446744073709551616.0", "16777216.0T", "17179869184.0G", "16777216.0TiB", "16777216.T"] {
            let got = parse_size(s);
            assert!(got.is_err(), "{s} is 2^64 bytes, one more than u64 holds: got {got:?}");
        }
        assert_eq!(parse_size("16777215.5T"), Ok((16777215u64 << 40) + (1 << 39)));
        assert_eq!(parse_size("18446744073709549568.0"), Ok(18446744073709549568));
    }

    /// Formats tiers as a user would write them: any order, stray spaces, repeats, empty items.
    fn tiers_text(t: Tiers, order: &[usize], pad: &[bool], repeat: bool) -> String {
        let names = [(t.zero, "zero"), (t.pool, "pool"), (t.file, "file")];
        let mut items: Vec<String> = Vec::new();
        for (k, &i) in order.iter().enumerate() {
            let (on, name) = names[i % 3];
            if on {
                items.push(if pad[k % pad.len()] { format!(" {name}\t") } else { name.to_string() });
                if repeat {
                    items.push(String::new());
                    items.push(name.to_string());
                }
            }
        }
        items.join(",")
    }

    fn compressor_text(c: Compressor, dash: bool, upper: bool, pad: bool) -> String {
        let s = match c {
            Compressor::Lz4 => "lz4".to_string(),
            Compressor::Zstd { level } => format!("zstd{}{level}", if dash { '-' } else { ':' }),
        };
        let s = if upper { s.to_ascii_uppercase() } else { s };
        if pad {
            format!("  {s}\n")
        } else {
            s
        }
    }

    /// Texts for the word parsers: arbitrary, and near-misses of every accepted word.
    fn word_text() -> impl Strategy<Value = String> {
        let words = prop::sample::select(vec![
            "zero",
            "pool",
            "file",
            "disk",
            "Pool",
            "",
            " ",
            "lz4",
            "LZ4",
            "zstd",
            "zstd:",
            "zstd:0",
            "zstd:1",
            "zstd:19",
            "zstd:20",
            "zstd-3",
            "zstd:+7",
            "zstd:007",
            "zstd:-1",
            "zstd:99999999999",
            "zstd:３",
            "zstd:3.0",
            "locality",
            "default",
            "order0",
            "always",
            "ORDER0",
            "order 0",
            "\u{130}",
            "ſ",
        ]);
        prop_oneof![
            2 => any::<String>(),
            1 => "\\PC{0,16}",
            3 => (prop::collection::vec(words, 0..5), prop::sample::select(vec![",", ", ", ",,", ";", ""]))
                .prop_map(|(w, sep)| w.join(sep)),
        ]
    }

    #[derive(Clone, Debug)]
    enum WordCase {
        /// Any text through every word parser.
        Text(String),
        /// Formatted tiers parse back.
        Tiers { bits: u8, order: Vec<usize>, pad: Vec<bool>, repeat: bool },
        /// A formatted compressor parses back (levels outside 1..=19 are refused).
        Compressor { level: i32, lz4: bool, dash: bool, upper: bool, pad: bool },
        /// A formatted policy parses back.
        Policy { which: usize, upper: bool, pad: bool },
    }

    fn word_case() -> impl Strategy<Value = WordCase> {
        prop_oneof![
            4 => word_text().prop_map(WordCase::Text),
            1 => (0u8..8, prop::collection::vec(0usize..3, 0..6), prop::collection::vec(any::<bool>(), 1..4), any::<bool>())
                .prop_map(|(bits, order, pad, repeat)| WordCase::Tiers { bits, order, pad, repeat }),
            1 => (prop_oneof![3 => 1i32..=19, 1 => any::<i32>()], any::<bool>(), any::<bool>(), any::<bool>(), any::<bool>())
                .prop_map(|(level, lz4, dash, upper, pad)| WordCase::Compressor { level, lz4, dash, upper, pad }),
            1 => (0usize..3, any::<bool>(), any::<bool>()).prop_map(|(which, upper, pad)| WordCase::Policy { which, upper, pad }),
        ]
    }

    fn check_words(case: WordCase) -> TestCaseResult {
        match case {
            WordCase::Text(s) => {
                // Ok values are always usable ones; errors name the offending text.
                match s.parse::<Tiers>() {
                    Ok(t) => {
                        prop_assert!(t.pool || t.file, "{s:?} gave tiers without storage: {t:?}");
                        let words: Vec<&str> = s.split(',').map(str::trim).filter(|w| !w.is_empty()).collect();
                        prop_assert_eq!(t.zero, words.contains(&"zero"));
                        prop_assert_eq!(t.pool, words.contains(&"pool"));
                        prop_assert_eq!(t.file, words.contains(&"file"));
                        prop_assert!(words.iter().all(|w| ["zero", "pool", "file"].contains(w)));
                    }
                    Err(e) => prop_assert!(matches!(e, ConfigError::Tier(_) | ConfigError::NoStorageTier(_)), "{e:?}"),
                }
                let c = s.parse::<Compressor>();
                if let Ok(Compressor::Zstd { level }) = c {
                    prop_assert!((1..=19).contains(&level), "{s:?} gave zstd level {level}");
                }
                let p = s.parse::<SwapinPolicy>();
                // Both are deaf to ASCII case and surrounding whitespace.
                let up = s.to_ascii_uppercase();
                prop_assert_eq!(up.parse::<Compressor>().ok(), c.as_ref().ok().copied(), "upper-cased {:?}", s);
                prop_assert_eq!(up.parse::<SwapinPolicy>().ok(), p.as_ref().ok().copied(), "upper-cased {:?}", s);
                let padded = format!("\u{3000} {s}\t");
                prop_assert_eq!(padded.parse::<Compressor>().ok(), c.as_ref().ok().copied(), "padded {:?}", s);
                prop_assert_eq!(padded.parse::<SwapinPolicy>().ok(), p.as_ref().ok().copied(), "padded {:?}", s);
                for e in [c.err(), p.err()].into_iter().flatten() {
                    prop_assert!(!e.to_string().is_empty());
                }
            }
            WordCase::Tiers { bits, order, pad, repeat } => {
                let t = Tiers { zero: bits & 1 != 0, pool: bits & 2 != 0, file: bits & 4 != 0 };
                // Every tier that is on appears at least once.
                let mut order = order;
                order.extend([0, 1, 2]);
                let text = tiers_text(t, &order, &pad, repeat);
                if t.pool || t.file {
                    prop_assert_eq!(text.parse::<Tiers>(), Ok(t), "{:?}", text);
                } else {
                    prop_assert_eq!(text.parse::<Tiers>(), Err(ConfigError::NoStorageTier(text.clone())));
                }
                let json = serde_json::to_string(&t).expect("tiers serialize");
                prop_assert_eq!(serde_json::from_str::<Tiers>(&json).ok(), Some(t));
            }
            WordCase::Compressor { level, lz4, dash, upper, pad } => {
                let c = if lz4 { Compressor::Lz4 } else { Compressor::Zstd { level } };
                let text = compressor_text(c, dash, upper, pad);
                if lz4 || (1..=19).contains(&level) {
                    prop_assert_eq!(text.parse::<Compressor>(), Ok(c), "{:?}", text);
                } else {
                    prop_assert!(text.parse::<Compressor>().is_err(), "{text:?} has no zstd level 1..=19");
                }
                let json = serde_json::to_string(&c).expect("compressor serializes");
                prop_assert_eq!(serde_json::from_str::<Compressor>(&json).ok(), Some(c));
            }
            WordCase::Policy { which, upper, pad } => {
                let (p, name) = [
                    (SwapinPolicy::Locality, "locality"),
                    (SwapinPolicy::Order0, "order0"),
                    (SwapinPolicy::Always, "always"),
                ][which];
                let name = if upper { name.to_ascii_uppercase() } else { name.to_string() };
                let text = if pad { format!("\t{name} ") } else { name };
                prop_assert_eq!(text.parse::<SwapinPolicy>(), Ok(p), "{:?}", text);
                let json = serde_json::to_string(&p).expect("policy serializes");
                prop_assert_eq!(serde_json::from_str::<SwapinPolicy>(&json).ok(), Some(p));
                let hint = [Hint::Normal, Hint::Sequential, Hint::Random][which];
                let json = serde_json::to_string(&hint).expect("hint serializes");
                prop_assert_eq!(serde_json::from_str::<Hint>(&json).ok(), Some(hint));
            }
        }
        Ok(())
    }

    #[test]
    fn words() {
        fuzz("parsers::words", 1, word_case(), check_words);
    }

    #[derive(Clone, Debug)]
    struct ConfigCase {
        budget_bytes: u64,
        tier_bits: u8,
        file_unit_bytes: usize,
        swapin_max_pages: u32,
        pool_max_bytes: Option<u64>,
        background_nice: i32,
    }

    fn config_case() -> impl Strategy<Value = ConfigCase> {
        (
            prop_oneof![edgy_u64(), (MIN_BUDGET_BYTES - 2)..(MIN_BUDGET_BYTES + 2)],
            0u8..8,
            edgy_u64().prop_map(|u| u as usize),
            prop_oneof![edgy_u64().prop_map(|m| m as u32), 0u32..=1025],
            prop::option::of(edgy_u64()),
            prop_oneof![3 => Just(0i32), 1 => -25i32..=25, 1 => any::<i32>()],
        )
            .prop_map(
                |(budget_bytes, tier_bits, file_unit_bytes, swapin_max_pages, pool_max_bytes, background_nice)| {
                    ConfigCase {
                        budget_bytes,
                        tier_bits,
                        file_unit_bytes,
                        swapin_max_pages,
                        pool_max_bytes,
                        background_nice,
                    }
                },
            )
    }

    fn check_config(case: ConfigCase) -> TestCaseResult {
        let tiers =
            Tiers { zero: case.tier_bits & 1 != 0, pool: case.tier_bits & 2 != 0, file: case.tier_bits & 4 != 0 };
        let c = PagerConfig {
            budget_bytes: case.budget_bytes,
            tiers,
            file_unit_bytes: case.file_unit_bytes,
            swapin_max_pages: case.swapin_max_pages,
            pool_max_bytes: case.pool_max_bytes,
            background_nice: case.background_nice,
            ..PagerConfig::default()
        };
        // The documented limits, one by one.
        let budget_ok = case.budget_bytes >= MIN_BUDGET_BYTES;
        let tiers_ok = tiers.pool || tiers.file;
        let u = case.file_unit_bytes;
        let unit_ok = u.is_power_of_two() && (64 << 10..=4 << 20).contains(&u);
        let m = case.swapin_max_pages;
        let swapin_ok = m.is_power_of_two() && m <= 512;
        let nice_ok = (0..=19).contains(&case.background_nice);
        match c.validate() {
            Ok(()) => prop_assert!(budget_ok && tiers_ok && unit_ok && swapin_ok && nice_ok, "accepted {c:?}"),
            Err(e) => {
                prop_assert!(!e.to_string().is_empty());
                match e {
                    ConfigError::BudgetTooSmall { budget_bytes } => {
                        prop_assert!(!budget_ok && budget_bytes == case.budget_bytes)
                    }
                    ConfigError::NoStorageTier(_) => prop_assert!(!tiers_ok),
                    ConfigError::FileUnit(got) => prop_assert!(!unit_ok && got == u),
                    ConfigError::SwapinMax(bytes) => prop_assert!(!swapin_ok && bytes == m as u64 * 4096),
                    ConfigError::BackgroundNice(n) => prop_assert!(!nice_ok && n == case.background_nice),
                    other => prop_assert!(false, "validate gave {other:?}"),
                }
            }
        }
        let pool = c.pool_max_bytes();
        prop_assert!(pool <= c.budget_bytes);
        match case.pool_max_bytes {
            Some(p) => prop_assert_eq!(pool, p.min(c.budget_bytes)),
            None if !tiers.file => prop_assert_eq!(pool, c.budget_bytes),
            None => prop_assert_eq!(pool, c.budget_bytes / 2),
        }
        Ok(())
    }

    #[test]
    fn validate() {
        fuzz("parsers::validate", 1, config_case(), check_config);
    }
}

/// The packed words: every raw u64 decodes without a panic to fields that match its bits, and
/// encode → decode is the identity on every valid input.
mod words {
    use super::*;
    use tierswap::backend::pool::{PoolHandle, POOL_HANDLE_BITS};
    use tierswap::backend::Backend;
    use tierswap::pagetable::{Pte, PteState};
    use tierswap::swap::entry::{decode_pattern, encode_pattern, ADDR_BITS, LOCATION_BITS, MAX_COUNT};
    use tierswap::swap::{SwapEntry, Tag};

    const STATES: [PteState; 4] = [PteState::None, PteState::Present, PteState::Staged, PteState::Swapped];
    const TAGS: [Tag; 7] = [Tag::Free, Tag::Reserved, Tag::Zero, Tag::SameFilled, Tag::Pool, Tag::File, Tag::Remote];
    const PAYLOAD_MASK: u64 = (1 << 60) - 1;

    fn check_pte((raw, state, payload, active): (u64, usize, u64, bool)) -> TestCaseResult {
        // Any word.
        let p = Pte::from_raw(raw);
        prop_assert_eq!(p.raw(), raw);
        prop_assert_eq!(p.locked(), raw >> 63 == 1);
        prop_assert_eq!(p.state(), STATES[(raw >> 61) as usize & 3]);
        prop_assert_eq!(p.active(), raw >> 60 & 1 == 1);
        prop_assert_eq!(p.payload(), raw & PAYLOAD_MASK);
        let live = matches!(p.state(), PteState::Present | PteState::Staged);
        // Present / staged payload: | kept slot + 1 (58) | mark (2) |.
        prop_assert_eq!(p.was_active(), live && p.payload() & 3 == 2);
        prop_assert_eq!(p.is_readahead(), p.state() == PteState::Staged && p.payload() & 3 == 1);
        let kept = p.payload() >> 2;
        prop_assert_eq!(p.kept_slot(), (live && kept != 0).then(|| kept - 1));
        for a in [false, true] {
            prop_assert_eq!(p.with_active(a).raw(), (raw & !(1 << 60)) | (a as u64) << 60);
        }
        let staged = p.staged_keeping_hotness();
        prop_assert_eq!(staged.state(), PteState::Staged);
        prop_assert_eq!(staged.payload() & 3, if p.was_active() { 2 } else { 0 });
        if live {
            // Staging keeps the kept slot (the helper is only used on present ptes).
            prop_assert_eq!(staged.kept_slot(), p.kept_slot());
        }
        prop_assert!(!staged.locked() && !staged.active());
        let text = format!("{p:?}");
        prop_assert!(text.starts_with("Pte(") && text.contains(&format!("{:?}", p.state())), "{}", text);
        // Encode → decode.
        let s = STATES[state];
        let q = Pte::new(s, payload);
        prop_assert_eq!((q.state(), q.payload()), (s, payload & PAYLOAD_MASK));
        prop_assert!(!q.locked() && !q.active());
        prop_assert_eq!(Pte::from_raw(q.raw()), q);
        let q = q.with_active(active);
        prop_assert_eq!((q.state(), q.payload(), q.active()), (s, payload & PAYLOAD_MASK, active));
        let slot = payload & ((1 << Pte::SLOT_BITS) - 1);
        let stamp = ((payload & PAYLOAD_MASK) >> Pte::SLOT_BITS) as u32;
        let sw = Pte::swapped_at(slot, stamp);
        prop_assert_eq!((sw.state(), sw.slot(), sw.evict_stamp()), (PteState::Swapped, slot, stamp));
        prop_assert_eq!(Pte::NONE.raw(), 0);
        prop_assert_eq!(Pte::from_raw(0).state(), PteState::None);
        prop_assert!(Pte::staged_readahead().is_readahead() && !Pte::staged().is_readahead());
        prop_assert_eq!(Pte::present().state(), PteState::Present);
        Ok(())
    }

    #[test]
    fn pte() {
        fuzz("words::pte", 1, (edgy_u64(), 0usize..4, edgy_u64(), any::<bool>()), check_pte);
    }

    #[derive(Clone, Debug)]
    struct EntryCase {
        raw: u64,
        tag: usize,
        count: u32,
        location: u64,
        referenced: bool,
        addr: u64,
        len: usize,
        pattern: u64,
    }

    fn entry_case() -> impl Strategy<Value = EntryCase> {
        (
            edgy_u64(),
            0usize..7,
            prop_oneof![0u32..=MAX_COUNT, any::<u32>()],
            edgy_u64(),
            any::<bool>(),
            prop_oneof![0u64..(1 << ADDR_BITS), Just((1 << ADDR_BITS) - 1)],
            prop_oneof![1usize..=4096, Just(1), Just(4096)],
            prop_oneof![
                any::<u64>(),
                any::<u8>().prop_map(|b| u64::from_ne_bytes([b; 8])),
                any::<u32>().prop_map(|w| w as u64 | (w as u64) << 32),
                (-(1i64 << 49)..(1i64 << 49)).prop_map(|v| v as u64),
            ],
        )
            .prop_map(|(raw, tag, count, location, referenced, addr, len, pattern)| EntryCase {
                raw,
                tag,
                count,
                location,
                referenced,
                addr,
                len,
                pattern,
            })
    }

    fn check_entry(c: EntryCase) -> TestCaseResult {
        const LOC_MASK: u64 = (1 << LOCATION_BITS) - 1;
        // Any word.
        let e = SwapEntry::from_raw(c.raw);
        prop_assert_eq!(e.raw(), c.raw);
        prop_assert_eq!(e.locked(), c.raw >> 63 == 1);
        prop_assert_eq!(e.referenced(), c.raw >> 62 & 1 == 1);
        let tag_bits = (c.raw >> 59 & 7) as usize;
        prop_assert_eq!(e.tag(), TAGS[tag_bits.min(6)]);
        prop_assert_eq!(e.tag().index(), tag_bits.min(6));
        prop_assert_eq!(e.count() as u64, c.raw >> 51 & 0xff);
        prop_assert_eq!(e.location(), c.raw & LOC_MASK);
        let (addr, len) = e.addr_len();
        prop_assert!((1..=4096).contains(&len));
        prop_assert_eq!(len as u64 - 1, e.location() & 0xfff);
        let addr_field = (e.location() >> 12) & ((1 << ADDR_BITS) - 1);
        match e.tag() {
            Tag::File => prop_assert_eq!(addr, addr_field * 16),
            _ => prop_assert_eq!(addr, addr_field),
        }
        // The codec bit (location bit 50) counts for Pool, File and Remote only.
        let codec_bit = e.location() >> 50 == 1;
        prop_assert_eq!(e.recompressed(), codec_bit && matches!(e.tag(), Tag::Pool | Tag::File | Tag::Remote));
        prop_assert_eq!(e.with_recompressed(codec_bit).raw(), e.raw());
        prop_assert_eq!(e.with_recompressed(!codec_bit).addr_len(), e.addr_len());
        // Every decoded pattern is one the encoder takes, and it reads back the same.
        let p = e.pattern();
        prop_assert_eq!(p, decode_pattern(e.location()));
        let loc = encode_pattern(p);
        prop_assert!(loc.is_some(), "decoded pattern {p:#x} does not encode");
        prop_assert_eq!(decode_pattern(loc.unwrap_or(0)), p);
        prop_assert_eq!(e.tag().backend().is_none(), matches!(e.tag(), Tag::Free | Tag::Reserved));
        prop_assert_eq!(
            e.tag().in_memory(),
            matches!(e.tag().backend(), Some(Backend::Zero | Backend::SameFilled | Backend::Pool))
        );
        // Setters change their field only.
        let r = e.with_referenced(c.referenced);
        prop_assert_eq!(r.raw(), (c.raw & !(1 << 62)) | (c.referenced as u64) << 62);
        let n = e.with_count(c.count);
        prop_assert_eq!(n.raw(), (c.raw & !(0xff << 51)) | ((c.count & MAX_COUNT) as u64) << 51);
        let t = TAGS[c.tag];
        let moved = e.with_place(t, c.location);
        prop_assert_eq!(
            moved.raw(),
            (c.raw & (0b11 << 62 | 0xff << 51)) | (c.tag as u64) << 59 | (c.location & LOC_MASK)
        );
        let text = format!("{e:?}");
        prop_assert!(text.starts_with("SwapEntry(") && text.ends_with(')'), "{}", text);
        // Encode → decode.
        let n = SwapEntry::new(t, c.count, c.location);
        prop_assert_eq!((n.tag(), n.count(), n.location()), (t, c.count & MAX_COUNT, c.location & LOC_MASK));
        prop_assert!(!n.locked() && !n.referenced());
        prop_assert_eq!(SwapEntry::from_raw(n.raw()), n);
        let pool = SwapEntry::pool(c.addr, c.len);
        prop_assert_eq!((pool.tag(), pool.count(), pool.addr_len()), (Tag::Pool, 1, (c.addr, c.len)));
        let file = SwapEntry::file(c.addr * 16, c.len);
        prop_assert_eq!((file.tag(), file.count(), file.addr_len()), (Tag::File, 1, (c.addr * 16, c.len)));
        match SwapEntry::same_filled(c.pattern) {
            Some(s) => {
                prop_assert_eq!((s.tag(), s.count(), s.pattern()), (Tag::SameFilled, 1, c.pattern));
                prop_assert_eq!(s.location(), encode_pattern(c.pattern).unwrap_or(u64::MAX));
            }
            None => prop_assert!(encode_pattern(c.pattern).is_none()),
        }
        let b = c.pattern as u8;
        prop_assert!(SwapEntry::same_filled(u64::from_ne_bytes([b; 8])).is_some(), "byte pattern {b:#x} must fit");
        prop_assert_eq!((SwapEntry::zero().tag(), SwapEntry::zero().location()), (Tag::Zero, 0));
        prop_assert_eq!((SwapEntry::FREE.raw(), SwapEntry::FREE.tag()), (0, Tag::Free));
        Ok(())
    }

    #[test]
    fn swap_entry() {
        fuzz("words::swap_entry", 1, entry_case(), check_entry);
    }

    fn check_handle((raw, span, obj, len): (u64, u32, u16, usize)) -> TestCaseResult {
        // Any word: a handle iff it fits 38 bits, and then its fields are its bits.
        match PoolHandle::from_raw(raw) {
            Some(h) => {
                prop_assert!(raw >> POOL_HANDLE_BITS == 0);
                prop_assert_eq!(h.raw(), raw);
                prop_assert_eq!((h.span() as u64, h.obj() as u64), (raw >> 10, raw & 1023));
                prop_assert_eq!(PoolHandle::new(h.span(), h.obj()), h);
            }
            None => prop_assert!(raw >> POOL_HANDLE_BITS != 0),
        }
        // Encode → decode, and a handle always fits a pool swap entry.
        let h = PoolHandle::new(span, obj);
        prop_assert_eq!((h.span(), h.obj()), (span, obj));
        prop_assert!(h.raw() >> POOL_HANDLE_BITS == 0);
        prop_assert_eq!(PoolHandle::from_raw(h.raw()), Some(h));
        prop_assert_eq!(SwapEntry::pool(h.raw(), len).addr_len(), (h.raw(), len));
        Ok(())
    }

    #[test]
    fn pool_handle() {
        let span = prop_oneof![0u32..(1 << 28), Just((1 << 28) - 1), Just(0)];
        fuzz("words::pool_handle", 1, (edgy_u64(), span, 0u16..1024, 1usize..=4096), check_handle);
    }
}

/// The pool allocator against a model: random stores, frees and read-backs; every read
/// returns exactly the stored bytes, the accounting matches, no two live objects overlap, and
/// freeing everything gives every span back.
mod pool {
    use super::*;
    use std::collections::BTreeMap;
    use tierswap::backend::pool::{Pool, PoolError, PoolHandle, POOL_HANDLE_BITS};

    /// Spans are reserved at 32 KiB strides (8 pages).
    const SPAN_STRIDE: usize = 8 * 4096;

    #[derive(Clone, Debug)]
    enum Op {
        /// Store an object of `len` bytes, content from `seed` and its serial number.
        Store { len: usize, seed: u64 },
        /// Store with a length outside 1..=4096: refused, nothing changes.
        BadStore { len: usize },
        /// Read back and free the `pick`-th live object.
        Free { pick: usize },
        /// Read back every live object.
        Check,
    }

    fn len() -> impl Strategy<Value = usize> {
        prop_oneof![
            4 => 1usize..=4096,
            3 => 1usize..=256,
            2 => (1usize..=256).prop_map(|c| c * 16),
            1 => (0usize..=255).prop_map(|c| c * 16 + 1),
            1 => 3800usize..=4096,
        ]
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            8 => (len(), any::<u64>()).prop_map(|(len, seed)| Op::Store { len, seed }),
            1 => prop_oneof![Just(0usize), 4097usize..10_000].prop_map(|len| Op::BadStore { len }),
            5 => any::<usize>().prop_map(|pick| Op::Free { pick }),
            1 => Just(Op::Check),
        ]
    }

    /// Arena sizes: a few spans (fills up: the Full path) to plenty.
    fn arena() -> impl Strategy<Value = usize> {
        prop_oneof![
            1 => (1usize..=6).prop_map(|n| n * SPAN_STRIDE),
            1 => 1usize..=(4 * SPAN_STRIDE),
            3 => Just(16 << 20),
        ]
    }

    /// Bytes unique to one object: its serial number first, then a stream from the seed.
    fn content(serial: u64, seed: u64, len: usize) -> Vec<u8> {
        let mut x = seed ^ serial.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        let mut out: Vec<u8> = (0..len).map(|_| splitmix64(&mut x) as u8).collect();
        let tag = serial.to_le_bytes();
        let n = len.min(8);
        out[..n].copy_from_slice(&tag[..n]);
        out
    }

    struct Model {
        live: BTreeMap<u64, (PoolHandle, Vec<u8>)>,
        serial: u64,
        metadata_bytes: u64,
    }

    fn class_bytes(len: usize) -> usize {
        len.div_ceil(16) * 16
    }

    /// Accounting against the model, after every operation.
    fn check_accounting(pool: &Pool, m: &mut Model, arena_bytes: usize) -> TestCaseResult {
        prop_assert_eq!(pool.stored_objects(), m.live.len() as u64);
        let stored: u64 = m.live.values().map(|(_, d)| d.len() as u64).sum();
        prop_assert_eq!(pool.stored_bytes(), stored);
        let mut per_class: BTreeMap<usize, u64> = BTreeMap::new();
        for (_, d) in m.live.values() {
            *per_class.entry(class_bytes(d.len())).or_default() += 1;
        }
        let stats = pool.class_stats();
        let mut span_bytes = 0u64;
        for s in &stats {
            prop_assert_eq!(s.objects, per_class.get(&s.class_bytes).copied().unwrap_or(0), "class {}", s.class_bytes);
            prop_assert!((1..=8).contains(&s.span_pages));
            // An empty span is released at once: every span in use holds an object.
            prop_assert!(
                s.spans >= 1 && s.objects >= s.spans,
                "class {}: {} spans, {} objects",
                s.class_bytes,
                s.spans,
                s.objects
            );
            let bytes = s.spans * (s.span_pages * 4096) as u64;
            prop_assert_eq!(s.unused_bytes, bytes - s.objects * s.class_bytes as u64);
            span_bytes += bytes;
        }
        prop_assert_eq!(stats.len(), per_class.len(), "classes in use");
        prop_assert_eq!(pool.total_bytes(), span_bytes);
        prop_assert!(pool.total_bytes() <= arena_bytes as u64);
        let meta = pool.metadata_bytes();
        prop_assert!(meta >= m.metadata_bytes, "metadata shrank: {} → {}", m.metadata_bytes, meta);
        m.metadata_bytes = meta;
        Ok(())
    }

    fn check_object(pool: &Pool, h: PoolHandle, data: &[u8]) -> TestCaseResult {
        // A buffer larger than the object: the bytes past it stay untouched.
        let mut out = vec![0xa5u8; data.len() + 3];
        pool.read(h, data.len(), &mut out);
        prop_assert!(out[..data.len()] == *data, "object {h:?} of {} bytes came back changed", data.len());
        prop_assert!(out[data.len()..].iter().all(|&b| b == 0xa5), "read wrote past the object");
        // SAFETY: `h` is a live object of `data.len()` bytes; it is freed only after this use.
        let bytes = unsafe { pool.object(h, data.len()) };
        prop_assert!(bytes == data);
        Ok(())
    }

    fn run((arena_bytes, ops): (usize, Vec<Op>)) -> TestCaseResult {
        let pool = Pool::new(arena_bytes).map_err(|e| TestCaseError::fail(format!("Pool::new({arena_bytes}): {e}")))?;
        let spans = arena_bytes.div_ceil(SPAN_STRIDE).max(1);
        let mut m = Model { live: BTreeMap::new(), serial: 0, metadata_bytes: 0 };
        for op in ops {
            match op {
                Op::Store { len, seed } => {
                    m.serial += 1;
                    let data = content(m.serial, seed, len);
                    match pool.store(&data) {
                        Ok(h) => {
                            prop_assert!(h.raw() >> POOL_HANDLE_BITS == 0);
                            prop_assert!(m.live.values().all(|(x, _)| *x != h), "handle {h:?} handed out twice");
                            m.live.insert(m.serial, (h, data));
                        }
                        Err(PoolError::Full { arena_bytes: got }) => {
                            prop_assert_eq!(got, spans * SPAN_STRIDE);
                            let in_use: u64 = pool.class_stats().iter().map(|s| s.spans).sum();
                            prop_assert_eq!(in_use, spans as u64, "Full with spans left");
                        }
                        Err(e) => prop_assert!(false, "store of {len} bytes: {e}"),
                    }
                }
                Op::BadStore { len } => {
                    let r = pool.store(&vec![7u8; len]);
                    prop_assert!(matches!(r, Err(PoolError::BadLength(l)) if l == len), "{r:?}");
                }
                Op::Free { pick } => {
                    if m.live.is_empty() {
                        continue;
                    }
                    let key = *m.live.keys().nth(pick % m.live.len()).expect("non-empty");
                    let (h, data) = m.live.remove(&key).expect("picked");
                    check_object(&pool, h, &data)?;
                    pool.free(h, data.len());
                }
                Op::Check => {
                    for (h, data) in m.live.values() {
                        check_object(&pool, *h, data)?;
                    }
                }
            }
            check_accounting(&pool, &mut m, spans * SPAN_STRIDE)?;
        }
        // Every object intact (an overlap would have overwritten one), then free them all.
        for (h, data) in m.live.values() {
            check_object(&pool, *h, data)?;
        }
        for (_, (h, data)) in std::mem::take(&mut m.live) {
            pool.free(h, data.len());
        }
        check_accounting(&pool, &mut m, spans * SPAN_STRIDE)?;
        prop_assert_eq!(pool.total_bytes(), 0, "spans left after freeing everything");
        prop_assert!(pool.class_stats().is_empty());
        // Released spans are reused.
        let data = content(u64::MAX, 1, 4096);
        let h = pool.store(&data).map_err(|e| TestCaseError::fail(format!("store after freeing all: {e}")))?;
        check_object(&pool, h, &data)?;
        pool.free(h, data.len());
        prop_assert_eq!(pool.total_bytes(), 0);
        Ok(())
    }

    #[test]
    fn model() {
        fuzz("pool::model", 3, (arena(), prop::collection::vec(op(), 1..300)), run);
    }
}

/// The swap space's slot allocator against a model: random allocations in lanes, placements
/// and frees; no slot is handed out twice, the counts match, clusters are freed when empty.
mod swap_space {
    use super::*;
    use std::collections::BTreeMap;
    use tierswap::swap::entry::ADDR_BITS;
    use tierswap::swap::{ClusterState, SwapEntry, SwapSpace, Tag, SLOTS_PER_CLUSTER};

    const PER: u64 = SLOTS_PER_CLUSTER as u64;
    const TAGS: [Tag; 7] = [Tag::Free, Tag::Reserved, Tag::Zero, Tag::SameFilled, Tag::Pool, Tag::File, Tag::Remote];

    #[derive(Clone, Debug)]
    enum Op {
        /// Allocate `n` slots in lane `lane`.
        Alloc { lane: usize, n: usize },
        /// Move the `pick`-th live slot to a backend (`kind`), with fields from `a`, `b`.
        Place { pick: usize, kind: u8, a: u64, b: u64 },
        /// Free the `pick`-th live slot.
        Free { pick: usize },
        /// Free the live slots of the `pick`-th live slot's cluster, keeping one in `keep`
        /// (0: none), to empty clusters often.
        FreeCluster { pick: usize, keep: usize },
        /// Ask for the coldest clusters, then put them back.
        Coldest { max: usize },
        /// Ask whether a range from the `pick`-th live slot is in memory.
        InMemory { pick: usize, n: usize },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0usize..4, prop_oneof![3 => 0usize..=16, 2 => 0usize..=600, 1 => Just(SLOTS_PER_CLUSTER)])
                .prop_map(|(lane, n)| Op::Alloc { lane, n }),
            5 => (any::<usize>(), 0u8..6, any::<u64>(), any::<u64>()).prop_map(|(pick, kind, a, b)| Op::Place { pick, kind, a, b }),
            4 => any::<usize>().prop_map(|pick| Op::Free { pick }),
            2 => (any::<usize>(), prop_oneof![Just(0usize), 1usize..8]).prop_map(|(pick, keep)| Op::FreeCluster { pick, keep }),
            1 => (0usize..8).prop_map(|max| Op::Coldest { max }),
            1 => (any::<usize>(), 1usize..=80).prop_map(|(pick, n)| Op::InMemory { pick, n }),
        ]
    }

    #[derive(Clone, Debug)]
    struct Case {
        max_slots: u64,
        lanes: usize,
        ops: Vec<Op>,
    }

    fn case() -> impl Strategy<Value = Case> {
        (1u64..=6, 0u64..PER, 1usize..=3, prop::collection::vec(op(), 1..120)).prop_map(
            |(clusters, short, lanes, ops)| Case {
                // Not always a whole number of clusters: the space rounds up.
                max_slots: (clusters * PER).saturating_sub(short).max(1),
                lanes,
                ops,
            },
        )
    }

    fn entry(kind: u8, a: u64, b: u64) -> SwapEntry {
        let len = (b % 4096) as usize + 1;
        let e = match kind {
            0 => SwapEntry::zero(),
            1 => SwapEntry::same_filled(a).unwrap_or_else(|| SwapEntry::same_filled(a & 0xffff).expect("small fits")),
            2 => SwapEntry::pool(a % (1 << ADDR_BITS), len).with_recompressed(b & 2 == 2),
            3 => SwapEntry::file((a % (1 << ADDR_BITS)) * 16, len).with_recompressed(b & 2 == 2),
            4 => SwapEntry::new(Tag::Remote, 1, a),
            _ => SwapEntry::new(Tag::Reserved, 1, 0),
        };
        e.with_count((b >> 32) as u32 % 256).with_referenced(a & 1 == 1)
    }

    fn nth(live: &BTreeMap<u64, SwapEntry>, pick: usize) -> Option<u64> {
        (!live.is_empty()).then(|| *live.keys().nth(pick % live.len()).expect("non-empty"))
    }

    fn free(s: &SwapSpace, live: &mut BTreeMap<u64, SwapEntry>, slot: u64) -> TestCaseResult {
        let want = live.remove(&slot).expect("a live slot");
        let old = s.lock(slot);
        prop_assert_eq!(old, want, "slot {} before free", slot);
        s.unlock(slot, old, SwapEntry::FREE);
        Ok(())
    }

    /// Everything the space says, against the model.
    fn check(s: &SwapSpace, live: &BTreeMap<u64, SwapEntry>, lanes: usize) -> TestCaseResult {
        for t in TAGS {
            let want = live.values().filter(|e| e.tag() == t).count() as u64;
            prop_assert_eq!(s.count(t), want, "count of {:?}", t);
        }
        prop_assert_eq!(s.slots_in_use(), live.len() as u64);
        let ever = s.clusters_ever_used();
        prop_assert!(live.keys().all(|&slot| slot < ever as u64 * PER), "a live slot beyond the clusters handed out");
        let mut in_use = 0;
        let mut current = 0;
        for cid in 0..ever {
            let h = s.header(cid);
            let state = h.state();
            let slots = SwapSpace::cluster_slots(cid);
            let n_live = live.range(slots.clone()).count();
            in_use += (state != ClusterState::Free) as u64;
            current += (state == ClusterState::Current) as usize;
            prop_assert_eq!(h.used.load(std::sync::atomic::Ordering::Relaxed) as usize, n_live, "cluster {} used", cid);
            if n_live > 0 {
                prop_assert!(state != ClusterState::Free, "cluster {cid} has {n_live} live slots but is Free");
            } else {
                prop_assert!(
                    matches!(state, ClusterState::Free | ClusterState::Current),
                    "cluster {cid} is empty and not current but {state:?}: not freed"
                );
            }
            if state == ClusterState::Full {
                prop_assert_eq!(n_live, SLOTS_PER_CLUSTER, "cluster {} Full", cid);
            }
            for slot in slots {
                let want = live.get(&slot).copied().unwrap_or(SwapEntry::FREE);
                prop_assert_eq!(s.load(slot), want, "slot {}", slot);
                prop_assert_eq!(s.range_in_memory(slot, 1), want.tag().in_memory(), "slot {} in memory", slot);
            }
        }
        prop_assert!(current <= lanes, "{current} current clusters for {lanes} lanes");
        prop_assert_eq!(s.clusters_in_use(), in_use);
        prop_assert_eq!(s.table_bytes(), in_use * 4096);
        Ok(())
    }

    fn run(c: Case) -> TestCaseResult {
        let s =
            SwapSpace::new(c.max_slots, c.lanes).map_err(|e| TestCaseError::fail(format!("SwapSpace::new: {e}")))?;
        let max_clusters = c.max_slots.div_ceil(PER) as u32;
        prop_assert_eq!(s.max_slots(), max_clusters as u64 * PER);
        let mut live: BTreeMap<u64, SwapEntry> = BTreeMap::new();
        for op in c.ops {
            match op {
                Op::Alloc { lane, n } => {
                    let mut out = vec![u64::MAX];
                    let r = s.alloc(lane, n, &mut out);
                    prop_assert_eq!(out[0], u64::MAX, "alloc appends");
                    let got = match r {
                        Ok(got) => got,
                        Err(_) => 0,
                    };
                    prop_assert!(r.is_ok() || n > 0, "alloc of 0 slots failed");
                    prop_assert_eq!(out.len(), 1 + got);
                    prop_assert!(got <= n);
                    for &slot in &out[1..] {
                        prop_assert!(slot < s.max_slots(), "slot {slot} beyond the space");
                        prop_assert!(!live.contains_key(&slot), "slot {slot} handed out twice");
                        prop_assert_eq!(s.load(slot), SwapEntry::new(Tag::Reserved, 1, 0));
                        live.insert(slot, SwapEntry::new(Tag::Reserved, 1, 0));
                    }
                    if got < n {
                        // Short only when the space is exhausted for this lane: every cluster
                        // is full or another lane's current.
                        let mut others = 0;
                        for cid in 0..max_clusters {
                            let full = live.range(SwapSpace::cluster_slots(cid)).count() == SLOTS_PER_CLUSTER;
                            let cur = s.header(cid).state() == ClusterState::Current;
                            others += cur as usize;
                            prop_assert!(full || cur, "alloc gave {got} of {n} while cluster {cid} has room");
                        }
                        prop_assert!(others < c.lanes, "this lane still has a current cluster");
                    }
                }
                Op::Place { pick, kind, a, b } => {
                    let Some(slot) = nth(&live, pick) else { continue };
                    let old = s.lock(slot);
                    prop_assert_eq!(old, live[&slot]);
                    prop_assert!(s.load(slot).locked() && s.try_lock(slot).is_none(), "slot {slot} not locked");
                    let new = entry(kind, a, b);
                    s.unlock(slot, old, new);
                    live.insert(slot, new);
                }
                Op::Free { pick } => {
                    let Some(slot) = nth(&live, pick) else { continue };
                    free(&s, &mut live, slot)?;
                }
                Op::FreeCluster { pick, keep } => {
                    let Some(slot) = nth(&live, pick) else { continue };
                    let slots: Vec<u64> =
                        live.range(SwapSpace::cluster_slots((slot / PER) as u32)).map(|(&k, _)| k).collect();
                    for (i, slot) in slots.into_iter().enumerate() {
                        if keep == 0 || i % keep != 0 {
                            free(&s, &mut live, slot)?;
                        }
                    }
                }
                Op::Coldest { max } => {
                    let cold = s.take_coldest(max);
                    prop_assert!(cold.len() <= max);
                    for (i, &cid) in cold.iter().enumerate() {
                        prop_assert!(!cold[..i].contains(&cid), "cluster {cid} twice in {cold:?}");
                        prop_assert!(
                            s.header(cid).state() != ClusterState::Free,
                            "free cluster {cid} offered for writeback"
                        );
                    }
                    for cid in cold {
                        s.requeue_cold(cid);
                    }
                }
                Op::InMemory { pick, n } => {
                    let Some(slot) = nth(&live, pick) else { continue };
                    let off = (slot % PER) as usize;
                    let want = off + n <= SLOTS_PER_CLUSTER
                        && (slot..slot + n as u64).all(|x| live.get(&x).is_some_and(|e| e.tag().in_memory()));
                    prop_assert_eq!(s.range_in_memory(slot, n), want, "range {}+{}", slot, n);
                }
            }
            check(&s, &live, c.lanes)?;
        }
        // Free everything: only current clusters may stay.
        for slot in live.keys().copied().collect::<Vec<_>>() {
            free(&s, &mut live, slot)?;
        }
        check(&s, &live, c.lanes)?;
        prop_assert_eq!(s.slots_in_use(), 0);
        prop_assert!(s.clusters_in_use() <= c.lanes as u64);
        Ok(())
    }

    #[test]
    fn model() {
        fuzz("swap_space::model", 3, case(), run);
    }
}
