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
