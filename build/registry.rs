//! Writes `$OUT_DIR/kernel_registry.rs`: one `Family` static per compiled
//! family and one `KernelRef` constant per entry point, so that Rust code
//! naming a kernel the build did not produce fails to compile.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// A compiled family, as the registry describes it.
pub struct BuiltFamily {
    pub name: String,
    pub fatbin: PathBuf,
    pub kernels: Vec<String>,
    /// The kernels that open with `DI_PDL_ENTRY();`.
    pub pdl: Vec<String>,
    pub archs: Vec<String>,
}

/// FNV-1a 64 over the image; must equal `src/device/fatbin.rs::checksum`.
fn checksum(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    })
}

fn rust_ident(name: &str) -> String {
    name.to_ascii_uppercase()
}

pub fn write(out: &Path, accelerator: &str, families: &[BuiltFamily]) {
    let mut s = String::new();
    writeln!(s, "/// The accelerator this build targets.").unwrap();
    writeln!(s, "pub const ACCELERATOR: &str = {accelerator:?};").unwrap();
    writeln!(s, "/// Every kernel family in this build.").unwrap();
    let list: Vec<String> = families
        .iter()
        .map(|f| format!("&{}", rust_ident(&f.name)))
        .collect();
    writeln!(
        s,
        "pub static FAMILIES: &[&Family] = &[{}];",
        list.join(", ")
    )
    .unwrap();
    for f in families {
        let id = rust_ident(&f.name);
        writeln!(s, "/// Kernel family `{}`.", f.name).unwrap();
        writeln!(
            s,
            "pub static {id}: Family = Family {{ name: {:?}, image: include_bytes!({:?}), kernels: &{:?}, pdl: &{:?}, archs: &{:?}, checksum: {:#018x} }};",
            f.name,
            f.fatbin.display().to_string(),
            f.kernels,
            f.pdl,
            f.archs,
            checksum(&std::fs::read(&f.fatbin).unwrap_or_else(|e| crate::fail(&format!("reading {}: {e}", f.fatbin.display()))))
        )
        .unwrap();
        writeln!(s, "/// Entry points of family `{}`.", f.name).unwrap();
        writeln!(s, "pub mod {} {{", f.name).unwrap();
        for k in &f.kernels {
            writeln!(
                s,
                "    #[allow(missing_docs)]\n    pub const {}: super::KernelRef = super::KernelRef {{ family: &super::{id}, name: {k:?}, pdl: {} }};",
                rust_ident(k),
                f.pdl.contains(k)
            )
            .unwrap();
        }
        writeln!(s, "}}").unwrap();
    }
    let path = out.join("kernel_registry.rs");
    if std::fs::read_to_string(&path).ok().as_deref() != Some(s.as_str()) {
        std::fs::write(&path, s)
            .unwrap_or_else(|e| crate::fail(&format!("writing {}: {e}", path.display())));
    }
}
