//! The `ascend` build: compiles every `kernels-ascend/<family>/*.cpp` with the
//! CANN BiSheng (AscendC) compiler found through `ASCEND_HOME_PATH` and links
//! each family into one device ELF, `$OUT_DIR/ascend/<family>.o`. No CANN or
//! Ascend hardware was available when this was written: the probe order and
//! flags follow the CANN / asc-devkit build files as documented in
//! kernels-ascend/README.md, and are unverified. Without CANN the build stops
//! with a message; there is no silent fallback.

use crate::cuda::run;
use crate::fail;
use std::path::{Path, PathBuf};
use std::process::Command;

const INCLUDE_DIRS: &[&str] = &[
    "asc",
    "asc/include",
    "asc/include/adv_api",
    "asc/include/basic_api",
    "asc/include/aicpu_api",
    "asc/include/c_api",
    "asc/include/basic_api/reg_compute",
    "asc/include/simt_api",
    "asc/include/utils",
    "asc/impl/adv_api",
    "asc/impl/basic_api",
    "asc/impl/c_api",
    "asc/impl/basic_api/reg_compute",
    "asc/impl/simt_api",
    "asc/impl/utils",
    "tikcpp/tikcfw",
    "tikcpp/tikcfw/interface",
    "tikcpp/tikcfw/impl",
];

/// (devkit root, compiler) of the first install layout that exists.
fn find_compiler(home: &Path) -> Option<(PathBuf, PathBuf)> {
    let host = if cfg!(target_arch = "aarch64") {
        "aarch64"
    } else {
        "x86_64"
    };
    let roots = [
        home.join(format!("{host}-linux")),
        home.join("tools"),
        home.join("compiler"),
        home.join("ascendc_devkit"),
    ];
    roots.into_iter().find_map(|root| {
        ["bisheng", "ccec"]
            .iter()
            .map(|c| root.join("ccec_compiler/bin").join(c))
            .find(|p| p.is_file())
            .map(|cc| (root, cc))
    })
}

fn arch_flags() -> Vec<String> {
    let arch = std::env::var("DEEPINFER_ASCEND_ARCH").unwrap_or_else(|_| "dav-3510".into());
    let mut flags: Vec<String> = match arch.as_str() {
        "dav-3510" => [
            "--cce-aicore-arch=dav-c310-vec",
            "-D__DAV_C310__",
            "--cce-mask-opt",
            "-mllvm",
            "-cce-aicore-jump-expand=true",
        ]
        .map(String::from)
        .to_vec(),
        "dav-2201" => vec!["--cce-aicore-arch=dav-c220-vec".into()],
        a if a.starts_with("dav-c") => vec![format!("--cce-aicore-arch={a}")],
        a => fail(&format!(
            "DEEPINFER_ASCEND_ARCH={a:?}: expected dav-3510 (Ascend 950), dav-2201 (A2/A3) or a raw dav-c… target"
        )),
    };
    if std::env::var("DEEPINFER_ASCEND_FP8_NATIVE").as_deref() == Ok("1") {
        flags.push("-DDEEPINFER_ASCEND_FP8_NATIVE=1".into());
    }
    flags
}

pub fn build(root: &Path, out: &Path) {
    for var in [
        "ASCEND_HOME_PATH",
        "DEEPINFER_ASCEND_ARCH",
        "DEEPINFER_ASCEND_FP8_NATIVE",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    let kdir = root.join("kernels-ascend");
    println!("cargo::rerun-if-changed={}", kdir.display());
    let home = match std::env::var_os("ASCEND_HOME_PATH").map(PathBuf::from) {
        Some(h) if h.is_dir() => h,
        _ => fail(
            "DEEPINFER_ACCELERATOR=ascend needs the CANN toolkit, and ASCEND_HOME_PATH is not set \
to a directory.\nInstall CANN (Ascend-cann-toolkit) and `source <install>/ascend-toolkit/set_env.sh`, which sets it.",
        ),
    };
    let Some((devkit, cc)) = find_compiler(&home) else {
        fail(&format!(
            "ASCEND_HOME_PATH={} holds no BiSheng compiler (ccec_compiler/bin/bisheng under \
<host>-linux, tools, compiler or ascendc_devkit); is CANN installed completely?",
            home.display()
        ))
    };
    let includes: Vec<PathBuf> = INCLUDE_DIRS
        .iter()
        .map(|d| devkit.join(d))
        .chain([home.join("include"), kdir.join("include")])
        .filter(|p| p.is_dir())
        .collect();
    if !includes
        .iter()
        .any(|d| d.join("kernel_operator.h").is_file())
    {
        fail(&format!(
            "no kernel_operator.h under {}: the AscendC headers are missing",
            devkit.display()
        ));
    }
    let linker = cc.with_file_name("ld.lld");
    let flags = arch_flags();
    let mut families: Vec<PathBuf> = std::fs::read_dir(&kdir)
        .unwrap_or_else(|e| fail(&format!("reading {}: {e}", kdir.display())))
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.is_dir())
        .collect();
    families.sort();
    for fam in families {
        let name = fam.file_name().expect("dir").to_string_lossy().into_owned();
        let mut sources: Vec<PathBuf> = std::fs::read_dir(&fam)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "cpp"))
            .collect();
        if sources.is_empty() {
            continue;
        }
        sources.sort();
        let dst = out.join("ascend").join(&name);
        std::fs::create_dir_all(&dst).ok();
        let mut objects = Vec::new();
        for src in sources {
            let obj = dst.join(format!(
                "{}.o",
                src.file_stem().expect("file").to_string_lossy()
            ));
            let mut cmd = Command::new(&cc);
            cmd.args([
                "-c",
                "-O3",
                "-std=c++17",
                "--cce-aicore-lang",
                "--cce-aicore-only",
                "--cce-auto-sync",
            ])
            .args(&flags)
            .args([
                "-mllvm",
                "-cce-aicore-stack-size=0x8000",
                "-mllvm",
                "-cce-aicore-function-stack-size=0x8000",
            ])
            .args([
                "-mllvm",
                "-cce-aicore-record-overflow=true",
                "-mllvm",
                "-cce-aicore-addr-transform",
            ])
            .args([
                "-mllvm",
                "-cce-aicore-dcci-insert-for-scalar=false",
                "-DTILING_KEY_VAR=0",
            ]);
            for inc in &includes {
                cmd.arg(format!("-I{}", inc.display()));
            }
            cmd.arg(&src).arg("-o").arg(&obj);
            run(&mut cmd, &format!("{} on {}", cc.display(), src.display()));
            objects.push(obj);
        }
        let mut link = Command::new(&linker);
        link.args(["-m", "aicorelinux", "-Ttext=0", "-static"])
            .args(&objects)
            .arg("-o")
            .arg(out.join("ascend").join(format!("{name}.o")));
        run(&mut link, &format!("ld.lld (family {name})"));
    }
}
