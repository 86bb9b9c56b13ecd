//! The `ascend` build: compiles every `kernels-ascend/<family>/*.cpp` with the
//! CANN AscendC compiler found through `ASCEND_HOME_PATH`. No CANN toolchain
//! or Ascend hardware was available when this was written: the command line
//! follows the CANN documentation and is unverified (kernels-ascend/README.md).
//! Without CANN the build stops with a message; there is no silent fallback.

use crate::fail;
use std::path::{Path, PathBuf};
use std::process::Command;

const COMPILERS: &[&str] = &[
    "compiler/ccec_compiler/bin/bisheng",
    "compiler/ccec_compiler/bin/ccec",
    "tools/bisheng_compiler/bin/bisheng",
];

pub fn build(root: &Path, out: &Path) {
    println!("cargo::rerun-if-env-changed=ASCEND_HOME_PATH");
    println!("cargo::rerun-if-env-changed=DEEPINFER_ASCEND_ARCH");
    let kdir = root.join("kernels-ascend");
    println!("cargo::rerun-if-changed={}", kdir.display());
    let Some(home) = std::env::var_os("ASCEND_HOME_PATH").map(PathBuf::from) else {
        fail(
            "DEEPINFER_ACCELERATOR=ascend needs the CANN toolkit, and ASCEND_HOME_PATH is not set.\n\
Install CANN (Ascend-cann-toolkit) and `source <install>/ascend-toolkit/set_env.sh`, which sets it.",
        )
    };
    let Some(cc) = COMPILERS.iter().map(|c| home.join(c)).find(|p| p.is_file()) else {
        fail(&format!(
            "ASCEND_HOME_PATH={} holds no AscendC compiler (looked for {COMPILERS:?}); is CANN installed completely?",
            home.display()
        ))
    };
    let arch = std::env::var("DEEPINFER_ASCEND_ARCH").unwrap_or_else(|_| "dav-c310".into());
    let dst = out.join("ascend");
    std::fs::create_dir_all(&dst).ok();
    let mut families: Vec<PathBuf> = std::fs::read_dir(&kdir)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", kdir.display())))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    families.sort();
    for fam in families {
        let mut sources: Vec<PathBuf> = std::fs::read_dir(&fam)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "cpp"))
            .collect();
        sources.sort();
        for src in sources {
            let stem = src.file_stem().expect("file").to_string_lossy().into_owned();
            let obj = dst.join(format!("{stem}.o"));
            let status = Command::new(&cc)
                .args(["-c", "-O2", "-std=c++17", "-xcce"])
                .arg(format!("--cce-aicore-arch={arch}"))
                .arg("--cce-aicore-only")
                .arg(format!("-I{}", home.join("compiler/tikcpp/tikcfw").display()))
                .arg(format!("-I{}", home.join("compiler/tikcpp/tikcfw/impl").display()))
                .arg(format!("-I{}", home.join("compiler/tikcpp/tikcfw/interface").display()))
                .arg(format!("-I{}", home.join("include").display()))
                .arg("-o")
                .arg(&obj)
                .arg(&src)
                .status()
                .unwrap_or_else(|e| fail(&format!("cannot run {}: {e}", cc.display())));
            if !status.success() {
                fail(&format!("{} failed on {}", cc.display(), src.display()));
            }
        }
    }
}
