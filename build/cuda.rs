//! The `nvidia` build: locate the pinned nvcc, bind the parameter header,
//! compile each kernel family to one fatbin (one cubin per arch, in parallel,
//! skipped when nothing it depends on changed) and check that every declared
//! entry point is in every cubin.
//!
//! A family is a folder `kernels-cuda/<family>/`; its `.cu` files compile as
//! one translation unit (a generated file that includes them all), so helper
//! names must not collide inside a family. TileLang programs add one family
//! each (see `tilelang.rs`).

use crate::fail;
use crate::registry::BuiltFamily;
use std::collections::hash_map::DefaultHasher;
use std::hash::{Hash, Hasher};
use std::path::{Path, PathBuf};
use std::process::Command;

const PINNED_RELEASE: &str = "release 13.0";
const INSTALL_HINT: &str = "Install the pinned CUDA 13.0 toolchain with `scripts/setup` (it creates \
~/.cache/deepinfer/venv), or by hand: pip install nvidia-cuda-nvcc==13.0.88 \
nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88 nvidia-nvvm==13.0.88 \
nvidia-cuda-cccl==13.0.85, then point NVCC at site-packages/nvidia/cu13/bin/nvcc.";

/// One family to compile: the source to hand nvcc for each arch, the files
/// whose content decides whether to rebuild, and the entry points.
pub struct FamilySpec {
    pub name: String,
    /// (arch, source) pairs, e.g. ("90a", ".../norm.unity.cu").
    pub sources: Vec<(String, PathBuf)>,
    pub deps: Vec<PathBuf>,
    pub kernels: Vec<String>,
    /// The entry points that open with `DI_PDL_ENTRY();`.
    pub pdl: Vec<String>,
    pub include_dirs: Vec<PathBuf>,
}

fn venv_dir() -> PathBuf {
    std::env::var_os("DEEPINFER_VENV")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(std::env::var("HOME").unwrap_or_else(|_| "/root".into()))
                .join(".cache/deepinfer/venv")
        })
}

fn pip_toolchain_root() -> Option<PathBuf> {
    if let Some(r) = std::env::var_os("DEEPINFER_CUDA_ROOT") {
        return Some(PathBuf::from(r));
    }
    let lib = venv_dir().join("lib");
    std::fs::read_dir(&lib).ok()?.flatten().find_map(|e| {
        let p = e.path().join("site-packages/nvidia/cu13");
        p.join("bin/nvcc").is_file().then_some(p)
    })
}

fn find_nvcc() -> PathBuf {
    for var in [
        "NVCC",
        "CUDA_HOME",
        "DEEPINFER_CUDA_ROOT",
        "DEEPINFER_VENV",
        "PATH",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    if let Some(p) = std::env::var_os("NVCC") {
        return PathBuf::from(p);
    }
    if let Some(h) = std::env::var_os("CUDA_HOME") {
        let p = PathBuf::from(h).join("bin/nvcc");
        if p.is_file() {
            return p;
        }
    }
    if let Some(p) = std::env::var_os("PATH").and_then(|path| {
        std::env::split_paths(&path)
            .map(|d| d.join("nvcc"))
            .find(|p| p.is_file())
    }) {
        return p;
    }
    if let Some(root) = pip_toolchain_root() {
        return root.join("bin/nvcc");
    }
    fail(&format!(
        "DEEPINFER_ACCELERATOR=nvidia needs nvcc and none was found (looked at $NVCC, \
$CUDA_HOME/bin, PATH, $DEEPINFER_CUDA_ROOT and {}).\n{INSTALL_HINT}",
        venv_dir().display()
    ))
}

fn check_nvcc(nvcc: &Path) -> String {
    let out = Command::new(nvcc)
        .arg("--version")
        .output()
        .unwrap_or_else(|e| {
            fail(&format!(
                "cannot run {}: {e}\n{INSTALL_HINT}",
                nvcc.display()
            ))
        });
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    if !out.status.success() || !text.contains(PINNED_RELEASE) {
        let found = text
            .lines()
            .find(|l| l.contains("release"))
            .unwrap_or("no version line");
        fail(&format!(
            "{} is not the pinned CUDA 13.0 nvcc ({found}). The GPU machine's driver is \
CUDA 13.0 and refuses newer PTX.\n{INSTALL_HINT}",
            nvcc.display()
        ));
    }
    text
}

fn archs() -> Vec<String> {
    println!("cargo::rerun-if-env-changed=DEEPINFER_CUDA_ARCHS");
    let raw = std::env::var("DEEPINFER_CUDA_ARCHS").unwrap_or_else(|_| "90a,100a".into());
    let archs: Vec<String> = raw
        .split(',')
        .map(|a| a.trim().trim_start_matches("sm_").to_string())
        .filter(|a| !a.is_empty())
        .collect();
    if archs.is_empty()
        || archs
            .iter()
            .any(|a| !a.chars().next().is_some_and(|c| c.is_ascii_digit()))
    {
        fail(&format!(
            "DEEPINFER_CUDA_ARCHS={raw:?}: expected a list such as 90a,100a"
        ));
    }
    archs
}

/// Entry points of a CUDA source: every `extern "C"` function marked
/// `__global__` (with `__launch_bounds__(...)` and similar skipped), in
/// source order, each name once, with whether its definition's first
/// statement is `DI_PDL_ENTRY();` or `DI_PDL_PREFETCH_ENTRY(..);`
/// (`kernels-cuda/include/deepinfer/pdl.cuh`:
/// the kernels the launcher may put on the stream as programmatic
/// dependents).
pub fn entry_points(src: &str) -> Vec<(String, bool)> {
    let mut found: Vec<(String, bool)> = Vec::new();
    for (at, _) in src.match_indices("extern \"C\"") {
        let rest = &src[at + 10..];
        let Some(paren) = find_call_paren(rest) else {
            continue;
        };
        let head = &rest[..paren];
        if !head.contains("__global__") {
            continue;
        }
        let name = head
            .split(|c: char| !(c.is_alphanumeric() || c == '_'))
            .rfind(|t| !t.is_empty());
        let pdl = body_after_params(&rest[paren..])
            .map(str::trim_start)
            .is_some_and(|b| {
                b.starts_with("DI_PDL_ENTRY();") || b.starts_with("DI_PDL_PREFETCH_ENTRY(")
            });
        // A name seen before (a forward declaration, then the definition)
        // is one entry point, PDL where its definition opens with the entry.
        match name.map(|n| (n, found.iter_mut().find(|(m, _)| m == n))) {
            Some((_, Some(seen))) => seen.1 |= pdl,
            Some((n, None)) => found.push((n.to_string(), pdl)),
            None => {}
        }
    }
    found
}

/// What follows the `{` that opens a function body, given the text from its
/// parameter list's `(`; `None` for a declaration or an unbalanced list.
fn body_after_params(s: &str) -> Option<&str> {
    let mut depth = 0usize;
    for (i, c) in s.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth.checked_sub(1)?;
                if depth == 0 {
                    let tail = &s[i + 1..];
                    let open = tail.find(['{', ';'])?;
                    return tail[open..].strip_prefix('{');
                }
            }
            _ => {}
        }
    }
    None
}

/// Index of the parameter list's '(' after skipping `__launch_bounds__(...)`.
fn find_call_paren(s: &str) -> Option<usize> {
    let bytes = s.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'(' {
            let before = s[..i].trim_end();
            if before.ends_with("__launch_bounds__") || before.ends_with("__maxnreg__") {
                let mut depth = 0;
                while i < bytes.len() {
                    match bytes[i] {
                        b'(' => depth += 1,
                        b')' => {
                            depth -= 1;
                            if depth == 0 {
                                break;
                            }
                        }
                        _ => {}
                    }
                    i += 1;
                }
            } else {
                return Some(i);
            }
        } else if bytes[i] == b';' || bytes[i] == b'{' {
            return None;
        }
        i += 1;
    }
    None
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", path.display())))
}

fn files_with_ext(dir: &Path, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", dir.display())))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == ext))
        .collect();
    v.sort();
    v
}

/// The families of `kernels-cuda/` (every folder but `include/`).
fn cuda_families(root: &Path, out: &Path, archs: &[String]) -> Vec<FamilySpec> {
    let kdir = root.join("kernels-cuda");
    println!("cargo::rerun-if-changed={}", kdir.display());
    let include = kdir.join("include");
    let headers = files_with_ext(&include.join("deepinfer"), "h")
        .into_iter()
        .chain(files_with_ext(&include.join("deepinfer"), "cuh"))
        .collect::<Vec<_>>();
    let mut dirs: Vec<PathBuf> = std::fs::read_dir(&kdir)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", kdir.display())))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir() && p.file_name().is_some_and(|n| n != "include"))
        .collect();
    dirs.sort();
    std::fs::create_dir_all(out.join("cuda")).ok();
    dirs.into_iter()
        .filter_map(|dir| {
            let name = dir.file_name()?.to_string_lossy().into_owned();
            let sources = files_with_ext(&dir, "cu");
            if sources.is_empty() {
                return None;
            }
            let mut unity =
                String::from("// Generated by build.rs: one translation unit per family.\n");
            let (mut kernels, mut pdl) = (Vec::new(), Vec::new());
            for s in &sources {
                unity.push_str(&format!("#include \"{}\"\n", s.display()));
                for (name, opens_pdl) in entry_points(&read(s)) {
                    if opens_pdl {
                        pdl.push(name.clone());
                    }
                    kernels.push(name);
                }
            }
            let unity_path = out.join("cuda").join(format!("{name}.unity.cu"));
            if std::fs::read_to_string(&unity_path).ok().as_deref() != Some(&unity) {
                std::fs::write(&unity_path, &unity).unwrap_or_else(|e| fail(&format!("{e}")));
            }
            Some(FamilySpec {
                name,
                sources: archs
                    .iter()
                    .map(|a| (a.clone(), unity_path.clone()))
                    .collect(),
                deps: sources.iter().chain(&headers).cloned().collect(),
                kernels,
                pdl,
                include_dirs: vec![include.clone()],
            })
        })
        .collect()
}

fn nvcc_flags(arch: &str) -> Vec<String> {
    vec![
        "-cubin".into(),
        format!("-gencode=arch=compute_{arch},code=sm_{arch}"),
        "-O3".into(),
        "-std=c++17".into(),
        "-lineinfo".into(),
        "--expt-relaxed-constexpr".into(),
    ]
}

fn fingerprint(spec: &FamilySpec, nvcc_version: &str) -> String {
    let mut h = DefaultHasher::new();
    nvcc_version.hash(&mut h);
    for (arch, src) in &spec.sources {
        nvcc_flags(arch).hash(&mut h);
        read(src).hash(&mut h);
    }
    for d in &spec.deps {
        d.hash(&mut h);
        std::fs::read(d).unwrap_or_default().hash(&mut h);
    }
    spec.include_dirs.hash(&mut h);
    format!("{:016x}", h.finish())
}

/// Runs `cmd`, stopping the build with its output when it fails.
pub fn run(cmd: &mut Command, what: &str) {
    let out = cmd
        .output()
        .unwrap_or_else(|e| fail(&format!("{what}: cannot start: {e}")));
    if !out.status.success() {
        fail(&format!(
            "{what} failed:\n{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ));
    }
}

/// Compiles one family to `$OUT_DIR/cuda/<name>.fatbin` unless its
/// fingerprint is unchanged, then checks every entry point is in every cubin.
fn compile(spec: &FamilySpec, nvcc: &Path, nvcc_version: &str, out: &Path) -> BuiltFamily {
    let dir = out.join("cuda");
    let fatbin = dir.join(format!("{}.fatbin", spec.name));
    let stamp = dir.join(format!("{}.fingerprint", spec.name));
    let fp = fingerprint(spec, nvcc_version);
    let fresh = fatbin.is_file() && std::fs::read_to_string(&stamp).ok().as_deref() == Some(&fp);
    let archs: Vec<String> = spec.sources.iter().map(|(a, _)| a.clone()).collect();
    if !fresh {
        let fatbinary = nvcc.with_file_name("fatbinary");
        let mut pack = Command::new(&fatbinary);
        pack.arg(format!("--create={}", fatbin.display()))
            .arg("-64");
        for (arch, src) in &spec.sources {
            let cubin = dir.join(format!("{}.sm_{arch}.cubin", spec.name));
            let mut cmd = Command::new(nvcc);
            cmd.args(nvcc_flags(arch));
            for inc in &spec.include_dirs {
                cmd.arg(format!("-I{}", inc.display()));
            }
            cmd.arg("-o").arg(&cubin).arg(src);
            run(&mut cmd, &format!("nvcc (family {}, sm_{arch})", spec.name));
            let bytes = std::fs::read(&cubin).unwrap_or_default();
            for k in &spec.kernels {
                let needle = format!(".text.{k}\0");
                if !bytes.windows(needle.len()).any(|w| w == needle.as_bytes()) {
                    fail(&format!(
                        "kernel `{k}` of family `{}` is declared in its sources but missing from the sm_{arch} cubin",
                        spec.name
                    ));
                }
            }
            pack.arg(format!(
                "--image3=kind=elf,sm={arch},file={}",
                cubin.display()
            ));
        }
        run(&mut pack, &format!("fatbinary (family {})", spec.name));
        std::fs::write(&stamp, &fp).ok();
    }
    if spec.kernels.is_empty() {
        fail(&format!(
            "family `{}` declares no extern \"C\" __global__ entry point",
            spec.name
        ));
    }
    BuiltFamily {
        name: spec.name.clone(),
        fatbin,
        kernels: spec.kernels.clone(),
        pdl: spec.pdl.clone(),
        archs,
    }
}

fn bind_params(root: &Path, out: &Path) {
    let header = root.join("kernels-cuda/include/deepinfer/params.h");
    let bindings = bindgen::Builder::default()
        .header(header.display().to_string())
        .allowlist_type("di_.*")
        .allowlist_var("DI_.*")
        .layout_tests(true)
        .derive_debug(true)
        .derive_copy(true)
        .generate()
        .unwrap_or_else(|e| {
            fail(&format!(
                "bindgen failed on {}: {e}\nbindgen needs libclang: `apt-get install libclang-dev` \
(scripts/setup does it) or set LIBCLANG_PATH.",
                header.display()
            ))
        });
    bindings
        .write_to_file(out.join("params.rs"))
        .unwrap_or_else(|e| fail(&format!("writing params.rs: {e}")));
}

/// Builds every family; returns them in a stable order.
pub fn build(root: &Path, out: &Path) -> Vec<BuiltFamily> {
    let nvcc = find_nvcc();
    let version = check_nvcc(&nvcc);
    let archs = archs();
    bind_params(root, out);
    let mut specs = cuda_families(root, out, &archs);
    specs.extend(crate::tilelang::families(root, out, &archs));
    let mut names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
    names.sort();
    if names.windows(2).any(|w| w[0] == w[1]) {
        fail(&format!("two kernel families share a name: {names:?}"));
    }
    let jobs = std::env::var("NUM_JOBS")
        .ok()
        .and_then(|j| j.parse::<usize>().ok())
        .unwrap_or(2)
        .max(1);
    let mut built = Vec::with_capacity(specs.len());
    for chunk in specs.chunks(jobs) {
        std::thread::scope(|s| {
            let handles: Vec<_> = chunk
                .iter()
                .map(|spec| s.spawn(|| compile(spec, &nvcc, &version, out)))
                .collect();
            built.extend(
                handles
                    .into_iter()
                    .map(|h| h.join().expect("compile thread")),
            );
        });
    }
    built
}
