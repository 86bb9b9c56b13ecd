//! The data path is one line: engine → model → ops → {cpu, cuda}_backend →
//! contract / tensor / device. This test reads the sources and fails on any
//! import that runs the other way or skips the op API: the model names no
//! backend, the ops name no model, and nothing below the ops names them.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            sources(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// Lines of the Rust files under `rel` (a file or a folder) that mention
/// any of `forbidden` outside comments.
fn offending(rel: &str, forbidden: &[&str]) -> Vec<String> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let path = root.join(rel);
    let mut files = Vec::new();
    if path.is_dir() {
        sources(&path, &mut files);
    } else {
        files.push(path);
    }
    let mut bad = Vec::new();
    for f in files {
        let text = std::fs::read_to_string(&f).unwrap();
        for (i, line) in text.lines().enumerate() {
            let code = line.split("//").next().unwrap_or("");
            if forbidden.iter().any(|w| code.contains(w)) {
                bad.push(format!("{}:{}: {}", f.display(), i + 1, line.trim()));
            }
        }
    }
    bad
}

#[test]
fn the_model_reaches_the_backends_only_through_the_ops() {
    let bad = offending("model", &["cpu_backend", "cuda_backend"]);
    assert!(
        bad.is_empty(),
        "the model calls a backend directly:\n{}",
        bad.join("\n")
    );
}

#[test]
fn nothing_below_the_ops_imports_them_or_the_model() {
    for rel in [
        "cpu_backend",
        "cuda_backend",
        "contract.rs",
        "tensor.rs",
        "device",
        "dtype.rs",
        "numerics.rs",
        "kv_format.rs",
        "numpy_rng.rs",
        "weight_rng.rs",
        "parallel.rs",
        "error.rs",
    ] {
        let bad = offending(
            rel,
            &["crate::ops", "super::ops", "crate::model", "crate::engine"],
        );
        assert!(
            bad.is_empty(),
            "{rel} imports from above it:\n{}",
            bad.join("\n")
        );
    }
    let bad = offending("ops", &["crate::model"]);
    assert!(
        bad.is_empty(),
        "the ops import the model:\n{}",
        bad.join("\n")
    );
}

/// The lints of issue 15 item 3 (no panic reachable from the public API).
const NO_PANIC_LINTS: [&str; 5] = [
    "clippy::unwrap_used",
    "clippy::expect_used",
    "clippy::panic",
    "clippy::indexing_slicing",
    "clippy::cast_possible_truncation",
];

/// Issue 15 item 3: the library and the CLI deny the no-panic lints, and
/// every place that lifts one is a documented exception. A module that
/// lifts one (`#![allow(..)]`) is named in ARCHITECTURE.md's "No panic from
/// the public API" section, which states its invariant; an item that lifts
/// one (`#[allow(..)]`) says why: a `reason = ".."`, or a comment on its
/// line or the line above.
#[test]
fn every_lifted_no_panic_lint_is_a_documented_exception() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for crate_root in ["src/lib.rs", "src/bin/deepinfer/main.rs"] {
        let text = std::fs::read_to_string(root.join(crate_root)).unwrap();
        let deny = text.find("deny(").expect(crate_root);
        let lints = &text[deny..deny + text[deny..].find(')').unwrap()];
        for lint in NO_PANIC_LINTS {
            assert!(lints.contains(lint), "{crate_root} does not deny {lint}");
        }
    }
    let arch = std::fs::read_to_string(root.join("ARCHITECTURE.md")).unwrap();
    let section = arch
        .split("## No panic from the public API")
        .nth(1)
        .and_then(|s| s.split("\n## ").next())
        .expect("ARCHITECTURE.md's no-panic section");
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut bad = Vec::new();
    for f in files {
        let rel = f.strip_prefix(root.join("src")).unwrap();
        let rel = rel.to_str().unwrap();
        let text = std::fs::read_to_string(&f).unwrap();
        let lines: Vec<&str> = text.lines().collect();
        for (i, line) in lines.iter().enumerate() {
            let code = line.split("//").next().unwrap_or("").trim();
            let module = code.starts_with("#![allow(");
            if !module && !code.starts_with("#[allow(") {
                continue;
            }
            // The attribute, over as many lines as it takes.
            let attr: String = lines[i..]
                .iter()
                .take_while(|l| !l.contains(")]"))
                .chain(lines[i..].iter().find(|l| l.contains(")]")))
                .copied()
                .collect();
            if !NO_PANIC_LINTS.iter().any(|l| attr.contains(l)) {
                continue;
            }
            let documented = if module {
                // `dir/mod.rs` may be named as its folder.
                let folder = rel.strip_suffix("/mod.rs").map(|d| format!("`{d}`"));
                section.contains(&format!("`{rel}`"))
                    || folder.is_some_and(|d| section.contains(&d))
            } else {
                attr.contains("reason = \"")
                    || line.contains("//")
                    || i > 0 && lines[i - 1].trim_start().starts_with("//")
            };
            if !documented {
                bad.push(format!("src/{rel}:{}: {}", i + 1, line.trim()));
            }
        }
    }
    assert!(
        bad.is_empty(),
        "undocumented exceptions to the no-panic lints:\n{}",
        bad.join("\n")
    );
}
