//! Code-generating build script, driven by `DEEPINFER_ACCELERATOR`:
//!
//! - unset or `cpu`: the CPU backend alone; an empty kernel registry. Needs no
//!   CUDA, Python, torch or libclang.
//! - `nvidia`: compiles every kernel family of `kernels-cuda/` and every
//!   TileLang program's generated CUDA into one fatbin per family, binds
//!   `kernels-cuda/include/deepinfer/params.h` with bindgen, and writes the
//!   kernel registry (`src/kernels.rs` includes it).
//! - `ascend`: compiles `kernels-ascend/` with the CANN toolchain.
//!
//! Any failure stops the build with a message saying what to install or fix.

#[path = "build/ascend.rs"]
mod ascend;
#[path = "build/cuda.rs"]
mod cuda;
#[path = "build/registry.rs"]
mod registry;
#[path = "build/tilelang.rs"]
mod tilelang;

use std::path::PathBuf;

/// Stops the build with `msg` (shown by cargo as an error).
pub fn fail(msg: &str) -> ! {
    for line in msg.lines() {
        println!("cargo::error={line}");
    }
    std::process::exit(1);
}

fn main() {
    println!("cargo::rustc-check-cfg=cfg(deepinfer_cuda)");
    println!("cargo::rustc-check-cfg=cfg(deepinfer_ascend)");
    println!("cargo::rerun-if-env-changed=DEEPINFER_ACCELERATOR");
    println!("cargo::rerun-if-changed=build");
    let out = PathBuf::from(std::env::var("OUT_DIR").expect("cargo sets OUT_DIR"));
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let accel = std::env::var("DEEPINFER_ACCELERATOR").unwrap_or_default();
    match accel.as_str() {
        "" | "cpu" => registry::write(&out, "cpu", &[]),
        "nvidia" => {
            let families = cuda::build(&root, &out);
            registry::write(&out, "nvidia", &families);
            println!("cargo::rustc-cfg=deepinfer_cuda");
        }
        "ascend" => {
            ascend::build(&root, &out);
            registry::write(&out, "ascend", &[]);
            println!("cargo::rustc-cfg=deepinfer_ascend");
        }
        other => fail(&format!(
            "DEEPINFER_ACCELERATOR={other:?} is not supported: use cpu (or leave it unset), nvidia or ascend"
        )),
    }
}
