//! The engine's layers, as lib.rs draws them, held against its imports: every `crate::`
//! path in the engine's source (comments aside) is an edge from the module whose file holds
//! it to the top-level module it names, and an edge must run down a layer, or be one of the
//! few same-layer edges listed here. A new edge against the drawing fails this test with
//! the file and line that makes it.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Each top-level module of the engine and its layer (lib.rs draws them).
const LAYERS: &[(&str, u8)] = &[
    // L0: the base: page math, system calls, userfaultfd calls, counters, fault injection,
    // the trail, the configuration, the fork gate, small sync helpers, the tree's ledger.
    ("page", 0),
    ("sys", 0),
    ("uffd", 0),
    ("stats", 0),
    ("inject", 0),
    ("ioring", 0),
    ("trail", 0),
    ("config", 0),
    ("forkgate", 0),
    ("sync", 0),
    ("tree", 0),
    // L1: storage: the page table, the virtual swap space, the backends.
    ("pagetable", 1),
    ("swap", 1),
    ("backend", 1),
    // L2: policies: pure decisions.
    ("policy", 2),
    // L3: the memory manager's state and the operations every path needs.
    ("mm", 3),
    // L4: the paths: reclaim, writeback, the program's events, faults.
    ("reclaim", 4),
    ("writeback", 4),
    ("events", 4),
    ("fault", 4),
    // L5: the threads and the public face: the pager, the control server, the SIGBUS handler.
    ("pager", 5),
    ("control", 5),
    ("sigbus", 5),
];

/// Edges allowed within a layer (from, to).
const SAME_LAYER: &[(&str, &str)] = &[
    // L0: everything may do page math; the system-call helpers poll userfaultfds; the
    // read hooks read through a thread's ring.
    ("sys", "page"),
    ("sys", "uffd"),
    ("inject", "page"),
    ("inject", "ioring"),
    ("config", "page"),
    // …and the tree's ledger stamps its rows with the system-call helpers' clock.
    ("tree", "sys"),
    // L1: a swap entry says which backend holds the bytes.
    ("swap", "backend"),
    // L4: a fault may reclaim directly (and wait for room) and handles the events it reads;
    // nothing calls the fault path.
    ("fault", "reclaim"),
    ("fault", "events"),
    // L5: the pager registers its signal server with the SIGBUS handler.
    ("pager", "sigbus"),
];

fn src_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// The top-level module a source file belongs to (`None` for lib.rs, the crate root).
fn module_of(path: &Path) -> Option<String> {
    let rel = path.strip_prefix(src_dir()).unwrap();
    let first = rel.components().next().unwrap().as_os_str().to_string_lossy().into_owned();
    let name = first.trim_end_matches(".rs").to_string();
    (name != "lib").then_some(name)
}

/// The `crate::NAME` paths of `text`, by line, outside comments.
fn crate_paths(text: &str) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let code = match line.find("//") {
            Some(i) => &line[..i],
            None => line,
        };
        let mut rest = code;
        while let Some(i) = rest.find("crate::") {
            let after = &rest[i + "crate::".len()..];
            let name: String = after.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() {
                out.push((n + 1, name));
            }
            rest = after;
        }
        // `use crate::{a, b}`: each name.
        if let Some(i) = code.find("crate::{") {
            let inner = &code[i + "crate::{".len()..];
            for part in inner.split([',', '}']) {
                let name: String = part.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.push((n + 1, name));
                }
            }
        }
    }
    out
}

/// Every edge against the table: "file:line: from -> to (why)".
fn violations() -> Vec<String> {
    let layer: BTreeMap<&str, u8> = LAYERS.iter().copied().collect();
    let mut files = Vec::new();
    rust_files(&src_dir(), &mut files);
    files.sort();
    let mut bad = Vec::new();
    for f in &files {
        let Some(from) = module_of(f) else { continue };
        let Some(&from_layer) = layer.get(from.as_str()) else {
            bad.push(format!("{}: module {from} is in no layer: add it to LAYERS", f.display()));
            continue;
        };
        let text = std::fs::read_to_string(f).unwrap();
        for (line, to) in crate_paths(&text) {
            if to == from {
                continue;
            }
            let Some(&to_layer) = layer.get(to.as_str()) else {
                // Re-exports at the crate root (crate::Hint, crate::SwapinPolicy, ...) name
                // items of L0's config.
                if to.chars().next().is_some_and(|c| c.is_ascii_uppercase()) {
                    continue;
                }
                bad.push(format!("{}:{line}: {from} -> {to}: module {to} is in no layer", f.display()));
                continue;
            };
            let ok =
                to_layer < from_layer || (to_layer == from_layer && SAME_LAYER.contains(&(from.as_str(), to.as_str())));
            if !ok {
                bad.push(format!(
                    "{}:{line}: {from} (L{from_layer}) -> {to} (L{to_layer}): {}",
                    f.display(),
                    if to_layer > from_layer { "an edge up the layers" } else { "a same-layer edge not in SAME_LAYER" }
                ));
            }
        }
    }
    bad
}

#[test]
fn every_import_of_the_engine_runs_down_its_layers() {
    let bad = violations();
    assert!(bad.is_empty(), "imports against the layering (lib.rs, tests/layers.rs):\n{}", bad.join("\n"));
}

#[test]
fn the_layer_check_sees_edges_in_every_form() {
    let text = "use crate::mm::Shared;\n\
                use crate::{page, sys::fatal};\n\
                let x = crate::fault::signal::serve(); // crate::reclaim in a comment\n\
                /// crate::events in a doc comment\n";
    let names: Vec<String> = crate_paths(text).into_iter().map(|(_, n)| n).collect();
    assert_eq!(names, ["mm", "page", "sys", "fault"]);
}

#[test]
fn lib_rs_draws_every_module_the_table_has() {
    let lib = std::fs::read_to_string(src_dir().join("lib.rs")).unwrap();
    for (m, l) in LAYERS {
        assert!(lib.contains(&format!("mod {m};")), "lib.rs declares {m}");
        assert!(lib.contains(&format!("L{l}")), "lib.rs draws layer L{l}");
        assert!(lib.contains(&format!("`{m}`")), "lib.rs's layer picture names `{m}`");
    }
}
