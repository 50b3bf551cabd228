//! /proc/vmstat snapshots and deltas, for the kernel's view of each run.

use std::collections::BTreeMap;

/// The counters the lab reports.
pub const KEYS: [&str; 7] = ["pswpin", "pswpout", "zswpin", "zswpout", "zswpwb", "swpin_zero", "swpout_zero"];

/// Reads /proc/vmstat (empty if it cannot be read).
pub fn read_vmstat() -> BTreeMap<String, u64> {
    std::fs::read_to_string("/proc/vmstat").map(|s| parse(&s)).unwrap_or_default()
}

fn parse(text: &str) -> BTreeMap<String, u64> {
    text.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            Some((it.next()?.to_string(), it.next()?.parse().ok()?))
        })
        .collect()
}

/// `after - before` for the reported keys and any `workingset_*` / `swap_ra*` key.
pub fn vmstat_delta(before: &BTreeMap<String, u64>, after: &BTreeMap<String, u64>) -> BTreeMap<String, u64> {
    after
        .iter()
        .filter(|(k, _)| KEYS.contains(&k.as_str()) || k.starts_with("workingset_") || k.starts_with("swap_ra"))
        .map(|(k, v)| (k.clone(), v.saturating_sub(before.get(k).copied().unwrap_or(0))))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas() {
        let a = parse("pswpin 5\nzswpout 10\nnr_free_pages 7\nworkingset_refault_anon 1\n");
        let b = parse("pswpin 9\nzswpout 10\nnr_free_pages 3\nworkingset_refault_anon 4\n");
        let d = vmstat_delta(&a, &b);
        assert_eq!(d["pswpin"], 4);
        assert_eq!(d["zswpout"], 0);
        assert_eq!(d["workingset_refault_anon"], 3);
        assert!(!d.contains_key("nr_free_pages"));
        assert!(read_vmstat().contains_key("pswpin"));
    }
}
