//! The kernel registry that `build.rs` generates: one [`Family`] per folder of
//! `kernels-cuda/` (and per TileLang program), holding its embedded fatbin and
//! the names of its entry points, plus one [`KernelRef`] constant per entry
//! point under `kernels::<family>::<NAME>`. Naming a kernel the build did not
//! produce is therefore a compile error. In a CPU build the registry is empty.

/// One compiled kernel family: a fatbin for every configured arch.
#[derive(Debug)]
pub struct Family {
    pub name: &'static str,
    /// The fatbin, embedded with `include_bytes!`.
    pub image: &'static [u8],
    /// Every `extern "C" __global__` entry point of the family's sources.
    pub kernels: &'static [&'static str],
    /// The entry points whose body opens with `DI_PDL_ENTRY();`
    /// (`kernels-cuda/include/deepinfer/pdl.cuh`), found by the build.
    pub pdl: &'static [&'static str],
    /// SM targets the image was built for, e.g. `["90a", "100a"]`.
    pub archs: &'static [&'static str],
    /// [`crate::device::fatbin::checksum`] of `image`, computed by the build.
    pub checksum: u64,
}

/// A kernel entry point: its family and its symbol name.
#[derive(Clone, Copy, Debug)]
pub struct KernelRef {
    pub family: &'static Family,
    pub name: &'static str,
    /// The kernel opens with `DI_PDL_ENTRY();`, so it may be launched as a
    /// programmatic dependent of the kernel before it on the stream.
    pub pdl: bool,
}

impl Family {
    /// Looks a kernel up by name at run time (the typed constants are the
    /// normal path; this serves tools and tests).
    pub fn kernel(&'static self, name: &str) -> crate::Result<KernelRef> {
        self.kernels
            .iter()
            .find(|k| **k == name)
            .map(|k| KernelRef {
                family: self,
                name: k,
                pdl: self.pdl.contains(k),
            })
            .ok_or_else(|| crate::Error::KernelNotFound {
                family: self.name.into(),
                kernel: name.into(),
            })
    }
}

include!(concat!(env!("OUT_DIR"), "/kernel_registry.rs"));

/// The family called `name`, if this build produced it.
pub fn family(name: &str) -> crate::Result<&'static Family> {
    FAMILIES
        .iter()
        .copied()
        .find(|f| f.name == name)
        .ok_or_else(|| crate::Error::DeviceUnavailable {
            device: "cuda".into(),
            why: format!(
                "kernel family `{name}` is not in this build (built for DEEPINFER_ACCELERATOR={})",
                ACCELERATOR
            ),
        })
}
