//! TileLang families. Each program `tilelang/<name>.py` lowers (without a GPU)
//! to `<name>.sm_<arch>.cu` per arch; the committed copies live in
//! `tilelang/generated/`. When the pinned TileLang is importable from the
//! project's virtualenv (or `DEEPINFER_TILELANG_PYTHON`), the build
//! regenerates them into `$OUT_DIR/tilelang/` and compiles those, warning when
//! the committed copies are stale; otherwise it compiles the committed copies.
//! Set `DEEPINFER_TILELANG=0` to always use the committed copies.

use crate::cuda::{FamilySpec, entry_points};
use crate::fail;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

fn python() -> Option<PathBuf> {
    println!("cargo::rerun-if-env-changed=DEEPINFER_TILELANG_PYTHON");
    println!("cargo::rerun-if-env-changed=DEEPINFER_TILELANG");
    if std::env::var("DEEPINFER_TILELANG").as_deref() == Ok("0") {
        return None;
    }
    let py = match std::env::var_os("DEEPINFER_TILELANG_PYTHON") {
        Some(p) => PathBuf::from(p),
        None => std::env::var_os("DEEPINFER_VENV")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                    .join(".cache/deepinfer/venv")
            })
            .join("bin/python"),
    };
    let ok = Command::new(&py)
        .args(["-c", "import tilelang"])
        .output()
        .is_ok_and(|o| o.status.success());
    ok.then_some(py)
}

/// Regenerates into `$OUT_DIR/tilelang` (cached on the programs' content) and
/// returns that folder, or `None` when TileLang is not available.
fn regenerate(root: &Path, out: &Path, programs: &[PathBuf]) -> Option<PathBuf> {
    let py = python()?;
    let dir = out.join("tilelang");
    let mut h = DefaultHasher::new();
    for p in programs {
        std::fs::read(p).unwrap_or_default().hash(&mut h);
    }
    let fp = format!("{:016x}", h.finish());
    let stamp = dir.join(".fingerprint");
    if std::fs::read_to_string(&stamp).ok().as_deref() == Some(&fp) {
        return Some(dir);
    }
    std::fs::create_dir_all(&dir).ok();
    let res = Command::new(&py)
        .arg(root.join("tilelang/generate.py"))
        .arg("--out-dir")
        .arg(&dir)
        .output()
        .unwrap_or_else(|e| fail(&format!("running tilelang/generate.py: {e}")));
    if !res.status.success() {
        fail(&format!(
            "tilelang/generate.py failed (set DEEPINFER_TILELANG=0 to build the committed sources):\n{}",
            String::from_utf8_lossy(&res.stderr)
        ));
    }
    std::fs::write(&stamp, fp).ok();
    Some(dir)
}

pub fn families(root: &Path, out: &Path, archs: &[String]) -> Vec<FamilySpec> {
    let tdir = root.join("tilelang");
    println!("cargo::rerun-if-changed={}", tdir.display());
    let committed = tdir.join("generated");
    let programs: Vec<PathBuf> = std::fs::read_dir(&tdir)
        .map(|rd| {
            let mut v: Vec<PathBuf> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "py"))
                .collect();
            v.sort();
            v
        })
        .unwrap_or_default();
    let source_dir = match regenerate(root, out, &programs) {
        Some(dir) => {
            for entry in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                let p = entry.path();
                if p.extension().is_some_and(|e| e == "cu") {
                    let name = p.file_name().expect("file");
                    if std::fs::read(&p).ok() != std::fs::read(committed.join(name)).ok() {
                        println!(
                            "cargo::warning=tilelang/generated/{} is stale: run `python tilelang/generate.py --out-dir tilelang/generated`",
                            name.to_string_lossy()
                        );
                    }
                }
            }
            dir
        }
        None => committed.clone(),
    };
    // The generated sources include these headers: a change to them must
    // recompile every TileLang family.
    let kernels_include = root.join("kernels-cuda").join("include");
    let mut headers: Vec<PathBuf> = std::fs::read_dir(tdir.join("include/deepinfer_tl"))
        .map(|rd| {
            let mut v: Vec<PathBuf> = rd
                .flatten()
                .map(|e| e.path())
                .filter(|p| p.extension().is_some_and(|e| e == "cuh" || e == "h"))
                .collect();
            v.sort();
            v
        })
        .unwrap_or_default();
    headers.push(kernels_include.join("deepinfer").join("async_copy.cuh"));
    let names: Vec<String> = programs
        .iter()
        .filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().into_owned()))
        .filter(|n| n != "generate")
        .collect();
    names
        .into_iter()
        .map(|name| {
            let sources: Vec<(String, PathBuf)> = archs
                .iter()
                .map(|a| {
                    let f = source_dir.join(format!("{name}.sm_{a}.cu"));
                    if !f.is_file() {
                        fail(&format!(
                            "no generated CUDA for TileLang program `{name}` at sm_{a}: expected {}",
                            f.display()
                        ));
                    }
                    (a.clone(), f)
                })
                .collect();
            let per_arch: Vec<Vec<(String, bool)>> = sources
                .iter()
                .map(|(_, f)| entry_points(&std::fs::read_to_string(f).unwrap_or_default()))
                .collect();
            let first = per_arch.first().cloned().unwrap_or_default();
            // PDL only where every arch's file opens the kernel with it.
            let pdl: Vec<String> = first
                .iter()
                .filter(|(k, _)| {
                    per_arch
                        .iter()
                        .all(|arch| arch.iter().any(|(m, opens)| m == k && *opens))
                })
                .map(|(k, _)| k.clone())
                .collect();
            let kernels = first.into_iter().map(|(k, _)| k).collect();
            FamilySpec {
                name: format!("tilelang_{name}"),
                deps: sources
                    .iter()
                    .map(|(_, f)| f.clone())
                    .chain(headers.iter().cloned())
                    .collect(),
                sources,
                kernels,
                pdl,
                // compat.cuh includes kernels-cuda/include/deepinfer/async_copy.cuh.
                include_dirs: vec![tdir.join("include"), kernels_include.clone()],
            }
        })
        .collect()
}
