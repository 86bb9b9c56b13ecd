//! Project tasks.
//!
//! `cargo xtask gpu-bundle`: builds the test and bench binaries with
//! `DEEPINFER_ACCELERATOR=nvidia` and gathers the GPU ones (tests/cuda_*.rs,
//! errors.rs, the benches/*_gpu.rs benches with their torch peers in
//! benches/peers/, and the `deepinfer` binary), the torch scripts and
//! `scripts/gpu-bundle-run.sh` (as `run.sh`), `benches/tools/kernel_times.py`
//! (as `tools/`) into `gpu-bundle/` (git-ignored),
//! ready to carry to the GPU machine. There, `bash gpu-bundle/run.sh` runs
//! every test, the compute-sanitizer passes and the benches, writes logs and
//! the benchmark JSON under `$OUT`, and prints a one-line summary last.
//! With DEEPINFER_ONLY set (as for run.sh), only those families' CUDA tests
//! and benches are gathered.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

/// The executables a cargo build produced, as (tag, path), and the OUT_DIR
/// of deepinfer's build script (where the kernel cubins are).
fn cargo_executables(root: &Path, args: &[&str]) -> (Vec<(String, PathBuf)>, Option<PathBuf>) {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(root)
        .env("DEEPINFER_ACCELERATOR", "nvidia")
        .args(args)
        .args([
            "--no-run",
            "--package",
            "deepinfer",
            "--message-format=json-render-diagnostics",
        ])
        .stderr(Stdio::inherit())
        .output()
        .expect("running cargo");
    if !out.status.success() {
        eprintln!("cargo {args:?} failed");
        std::process::exit(1);
    }
    let messages: Vec<serde_json::Value> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .collect();
    let out_dir = messages
        .iter()
        .filter(|v| v["reason"] == "build-script-executed")
        .filter(|v| {
            v["package_id"]
                .as_str()
                .is_some_and(|p| p.contains("deepinfer"))
        })
        .find_map(|v| v["out_dir"].as_str().map(PathBuf::from));
    let exes = messages
        .iter()
        .filter_map(|v| {
            let exe = v["executable"].as_str()?;
            let kind = v["target"]["kind"][0].as_str()?;
            let name = v["target"]["name"].as_str()?;
            // A test/bench harness has profile.test; the plain `deepinfer` binary
            // (built for the integration tests) does not.
            let tag = match (kind, v["profile"]["test"].as_bool()) {
                ("bin", Some(false)) => "bin".to_string(),
                ("lib", _) => "lib".to_string(),
                _ => name.to_string(),
            };
            Some((tag, PathBuf::from(exe)))
        })
        .collect();
    (exes, out_dir)
}

fn copy(from: &Path, to: &Path) {
    std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
    std::fs::copy(from, to)
        .unwrap_or_else(|e| panic!("copy {} -> {}: {e}", from.display(), to.display()));
}

/// Whether a family (a test name without `cuda_`, or a bench name without
/// `_gpu`) is in DEEPINFER_ONLY (space-separated prefixes; unset = all), the
/// same selection run.sh applies. It keeps the carried bundle under the
/// device tool's 64 MiB when only some families changed.
fn selected(family: &str) -> bool {
    match std::env::var("DEEPINFER_ONLY") {
        Ok(only) if !only.trim().is_empty() => {
            only.split_whitespace().any(|w| family.starts_with(w))
        }
        _ => true,
    }
}

fn gpu_bundle(root: &Path) {
    let dir = root.join("gpu-bundle");
    let _ = std::fs::remove_dir_all(&dir);
    for (sub, args) in [
        ("tests", &["test"][..]),
        ("benches", &["bench", "--benches"][..]),
    ] {
        let (exes, out_dir) = cargo_executables(root, args);
        // The sm_90a cubins, so run.sh can list each kernel's tensor-core
        // instructions with the GPU machine's cuobjdump.
        if let Some(cuda) = out_dir.map(|d| d.join("cuda")) {
            for entry in std::fs::read_dir(&cuda).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.to_string_lossy().ends_with(".sm_90a.cubin") {
                    copy(&path, &dir.join("cubins").join(entry.file_name()));
                }
            }
        }
        for (name, exe) in exes {
            let sub = match (sub, name.as_str()) {
                (_, "bin") => "bin",
                ("benches", n) if !n.ends_with("_gpu") => continue,
                ("benches", n) if !selected(n.trim_end_matches("_gpu")) => continue,
                ("tests", n) if n.starts_with("cuda_") && !selected(&n["cuda_".len()..]) => {
                    continue;
                }
                // The GPU machine runs the CUDA tests (tests/cuda_*.rs) and the
                // image/registry checks of errors.rs; the others are CPU-only
                // and read repository files or the dev machine's virtualenv.
                ("tests", n) if !(n.starts_with("cuda_") || n == "errors") => continue,
                _ => sub,
            };
            let name = if sub == "bin" {
                "deepinfer".to_string()
            } else {
                name
            };
            let dst = dir.join(sub).join(&name);
            copy(&exe, &dst);
            // Debug info only inflates the carry; symbols stay for backtraces.
            let _ = Command::new("strip")
                .arg("--strip-debug")
                .arg(&dst)
                .status();
        }
    }
    copy(&root.join("scripts/gpu-bundle-run.sh"), &dir.join("run.sh"));
    for entry in std::fs::read_dir(root.join("benches/peers")).expect("benches/peers exists") {
        let path = entry.expect("readable dir entry").path();
        copy(
            &path,
            &dir.join("peers").join(path.file_name().expect("a file")),
        );
    }
    copy(
        &root.join("tests/torch/check_slice.py"),
        &dir.join("torch/check_slice.py"),
    );
    copy(
        &root.join("benches/tools/kernel_times.py"),
        &dir.join("tools/kernel_times.py"),
    );
    let commit = Command::new("git")
        .current_dir(root)
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    std::fs::write(dir.join("COMMIT"), commit).expect("write COMMIT");
    println!("gpu bundle ready in {}", dir.display());
}

fn main() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf();
    match std::env::args().nth(1).as_deref() {
        Some("gpu-bundle") => gpu_bundle(&root),
        _ => {
            eprintln!("usage: cargo xtask gpu-bundle");
            std::process::exit(2);
        }
    }
}
