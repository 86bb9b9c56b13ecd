//! Bad input returns a typed error that names the offending tensor, shape,
//! value, kernel or device, and never panics.

mod common;

use common::limits::{Counting, bounded, capped};
use deepinfer::device::fatbin;
use deepinfer::kernels::Family;
use deepinfer::{DType, Device, E4M3, Error, Fp4x2, Tensor, ops};
use half::bf16;

/// The size cases run under [`bounded`]'s memory and time limits.
#[global_allocator]
static ALLOC: Counting = Counting;

fn bf16s(shape: &[usize]) -> Tensor {
    Tensor::from_vec(vec![bf16::ONE; shape.iter().product()], shape).unwrap()
}

#[test]
fn wrong_dtype_names_the_tensor() {
    let x = Tensor::from_vec(vec![1.0f32; 64], &[2, 32]).unwrap();
    let e = ops::rms_norm(&x, &bf16s(&[32]), 1e-20).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                tensor: "x",
                got: DType::F32,
                expected: DType::BF16,
                ..
            }
        ),
        "{e}"
    );
    let w = Tensor::from_vec(vec![E4M3(0); 32], &[32]).unwrap();
    let e = ops::rms_norm(&bf16s(&[2, 32]), &w, 1e-20).unwrap_err();
    assert!(e.to_string().contains("`weight` has dtype F8_E4M3"), "{e}");
    let e = ops::act_quant_fp8(&x).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DType {
                op: "act_quant_fp8",
                tensor: "x",
                ..
            }
        ),
        "{e}"
    );
}

#[test]
fn wrong_shape_names_the_tensor_and_shape() {
    let e = ops::rms_norm(&bf16s(&[2, 32]), &bf16s(&[31]), 1e-20).unwrap_err();
    assert!(
        matches!(&e, Error::Shape { tensor: "weight", got, .. } if got == &vec![31]),
        "{e}"
    );
    assert!(e.to_string().contains("[32]"), "{e}");
    let scalar = Tensor::from_vec(vec![bf16::ONE], &[]).unwrap();
    assert!(matches!(
        ops::act_quant_fp8(&scalar),
        Err(Error::Shape { tensor: "x", .. })
    ));
    assert!(matches!(
        ops::rms_norm(&bf16s(&[4, 0]), &bf16s(&[0]), 1e-20),
        Err(Error::Shape { .. })
    ));
}

#[test]
fn rms_norm_act_quant_rejects_widths_the_kernel_cannot_take() {
    let max = ops::RMS_NORM_ACT_QUANT_MAX_DIM;
    for dim in [33, 48, max + 32, 7] {
        let e = ops::rms_norm_act_quant_fp8(&bf16s(&[2, dim]), &bf16s(&[dim]), 1e-20).unwrap_err();
        assert!(
            matches!(&e, Error::Shape { op: "rms_norm_act_quant_fp8", tensor: "x", got, .. } if got == &vec![2, dim]),
            "{e}"
        );
        assert!(e.to_string().contains("multiple of 32"), "{e}");
    }
    let e = ops::rms_norm_act_quant_fp8(&bf16s(&[2, 64]), &bf16s(&[32]), 1e-20).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Shape {
                tensor: "weight",
                ..
            }
        ),
        "{e}"
    );
    let e = ops::rms_norm_act_quant_fp8(&bf16s(&[2, 64]), &bf16s(&[64]), f32::NAN).unwrap_err();
    assert!(matches!(e, Error::Argument { arg: "eps", .. }), "{e}");
    let x = Tensor::from_vec(vec![1.0f32; 64], &[2, 32]).unwrap();
    let e = ops::rms_norm_act_quant_fp8(&x, &bf16s(&[32]), 1e-20).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "x", .. }), "{e}");
    let (x, w) = (bf16s(&[2, 64]), bf16s(&[64]));
    let mut y = Tensor::empty(&Device::Cpu, DType::BF16, &[2, 64]).unwrap();
    let mut q = Tensor::empty(&Device::Cpu, DType::F8E4M3, &[2, 64]).unwrap();
    let mut s = Tensor::empty(&Device::Cpu, DType::E8M0, &[2, 2]).unwrap();
    let mut bad_y = Tensor::empty(&Device::Cpu, DType::F32, &[2, 64]).unwrap();
    let e =
        ops::rms_norm_act_quant_fp8_into(&x, &w, 1e-20, &mut bad_y, &mut q, &mut s).unwrap_err();
    assert!(matches!(e, Error::DType { tensor: "y", .. }), "{e}");
    let mut bad_s = Tensor::empty(&Device::Cpu, DType::E8M0, &[2, 3]).unwrap();
    let e =
        ops::rms_norm_act_quant_fp8_into(&x, &w, 1e-20, &mut y, &mut q, &mut bad_s).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Shape {
                tensor: "scale",
                ..
            }
        ),
        "{e}"
    );
    // The widest V4.1 width is accepted.
    assert!(ops::rms_norm_act_quant_fp8(&bf16s(&[1, max]), &bf16s(&[max]), 1e-20).is_ok());
}

#[test]
fn invalid_eps_is_rejected_with_its_value() {
    for eps in [f32::NAN, -1.0, f32::INFINITY] {
        let e = ops::rms_norm(&bf16s(&[1, 8]), &bf16s(&[8]), eps).unwrap_err();
        assert!(matches!(e, Error::Argument { arg: "eps", .. }), "{e}");
    }
}

#[test]
fn data_length_and_fp4_parity_are_checked() {
    let e = Tensor::from_vec(vec![0.0f32; 5], &[2, 3]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::DataLength {
                expected: 6,
                got: 5,
                ..
            }
        ),
        "{e}"
    );
    let e = Tensor::from_vec(vec![Fp4x2(0); 3], &[2, 3]).unwrap_err();
    assert!(e.to_string().contains("even last dimension"), "{e}");
    let t = Tensor::from_vec(vec![Fp4x2(0x21); 3], &[3, 2]).unwrap();
    assert_eq!(t.storage_bytes(), 3);
    assert!(matches!(t.as_slice::<bf16>(), Err(Error::DType { .. })));
}

#[test]
fn device_strings_are_parsed_or_rejected() {
    assert!(matches!("cpu".parse::<Device>(), Ok(Device::Cpu)));
    assert!(matches!(
        "tpu:0".parse::<Device>(),
        Err(Error::Argument { .. })
    ));
    assert!(matches!(
        "cuda:x".parse::<Device>(),
        Err(Error::Argument { .. })
    ));
    let e = "ascend:0".parse::<Device>().unwrap_err();
    assert!(
        matches!(&e, Error::DeviceUnavailable { device, .. } if device == "ascend:0"),
        "{e}"
    );
}

#[test]
fn asking_for_a_missing_cuda_device_is_an_error() {
    if deepinfer::device::cuda_driver_present() {
        // A GPU machine: an ordinal past the last device must still fail cleanly.
        let e = Device::cuda(4096).unwrap_err();
        assert!(e.to_string().contains("CUDA device(s)"), "{e}");
    } else {
        let e = Device::cuda(0).unwrap_err();
        assert!(
            matches!(&e, Error::DeviceUnavailable { device, why } if device == "cuda:0" && why.contains("libcuda")),
            "{e}"
        );
        assert!("cuda".parse::<Device>().is_err());
    }
}

/// An NCCL world this machine cannot form (no driver, no libnccl, fewer
/// GPUs than ranks, a device named twice) is a typed error before any rank
/// blocks in NCCL's init.
#[cfg(deepinfer_cuda)]
#[test]
fn an_nccl_world_the_machine_cannot_form_is_a_typed_error() {
    let count = deepinfer::device::CudaDevice::count().unwrap_or(0);
    let ordinals: Vec<usize> = (0..=count).collect();
    for ords in [&ordinals[..], &[0, 0][..], &[][..]] {
        let e = deepinfer::ep::nccl_world(ords, |_| Ok(())).unwrap_err();
        assert!(
            matches!(e, Error::DeviceUnavailable { .. }),
            "{ords:?}: {e}"
        );
    }
}

/// A well-formed fatbin with one (fake) sm_90 ELF entry, built by hand.
fn synthetic_fatbin() -> Vec<u8> {
    // A bare 64-bit little-endian ELF header for EM_CUDA with no sections.
    let mut payload = vec![0u8; 64];
    payload[..4].copy_from_slice(b"\x7fELF");
    payload[4] = 2;
    payload[5] = 1;
    payload[18..20].copy_from_slice(&190u16.to_le_bytes());
    payload[40..48].copy_from_slice(&64u64.to_le_bytes());
    payload[58..60].copy_from_slice(&64u16.to_le_bytes());
    let mut entry = Vec::new();
    entry.extend(2u16.to_le_bytes());
    entry.extend(0x0101u16.to_le_bytes());
    entry.extend(64u32.to_le_bytes());
    entry.extend((payload.len() as u64).to_le_bytes());
    entry.extend([0u8; 12]);
    entry.extend(90u32.to_le_bytes());
    entry.resize(64, 0);
    entry.extend(&payload);
    let mut img = Vec::new();
    img.extend(0xBA55_ED50u32.to_le_bytes());
    img.extend(1u16.to_le_bytes());
    img.extend(16u16.to_le_bytes());
    img.extend((entry.len() as u64).to_le_bytes());
    img.extend(entry);
    img
}

#[test]
fn fatbin_validation_rejects_empty_truncated_and_corrupt_images() {
    let good = synthetic_fatbin();
    let entries = fatbin::validate(&good).unwrap();
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].arch, 90);
    assert!(fatbin::validate(&[]).unwrap_err().contains("shorter"));
    assert!(
        fatbin::validate(&good[..good.len() - 1])
            .unwrap_err()
            .contains("truncated")
    );
    let mut bad_magic = good.clone();
    bad_magic[0] ^= 0xFF;
    assert!(fatbin::validate(&bad_magic).unwrap_err().contains("magic"));
    let mut not_elf = good.clone();
    let at = 16 + 64;
    not_elf[at] = 0;
    assert!(
        fatbin::validate(&not_elf)
            .unwrap_err()
            .contains("not an ELF")
    );
    let mut wrong_machine = good.clone();
    wrong_machine[at + 18] = 62;
    assert!(
        fatbin::validate(&wrong_machine)
            .unwrap_err()
            .contains("EM_CUDA"),
        "x86-64 ELF accepted"
    );
    let mut bad_sections = good.clone();
    bad_sections[at + 60] = 9;
    assert!(
        fatbin::validate(&bad_sections)
            .unwrap_err()
            .contains("section header table")
    );
    let mut overrun = good.clone();
    overrun[16 + 8] = 0xFF;
    assert!(
        fatbin::validate(&overrun)
            .unwrap_err()
            .contains("runs past")
    );
}

#[test]
fn embedded_families_are_well_formed() {
    for f in deepinfer::kernels::FAMILIES {
        let entries = fatbin::validate(f.image).unwrap_or_else(|e| panic!("{}: {e}", f.name));
        assert_eq!(entries.len(), f.archs.len(), "family {}", f.name);
        assert!(!f.kernels.is_empty());
        // Every kernel opens with DI_PDL_ENTRY() (kernels-cuda/README.md),
        // so every launch may be a programmatic dependent; the build found
        // the entry in each (run by the nvidia build's GPU-free tests).
        assert_eq!(
            f.pdl, f.kernels,
            "family {}: kernels without DI_PDL_ENTRY()",
            f.name
        );
        for k in f.kernels {
            assert!(f.kernel(k).unwrap().pdl, "{}::{k}", f.name);
        }
    }
    assert_eq!(
        deepinfer::kernels::FAMILIES.is_empty(),
        deepinfer::ACCELERATOR != "nvidia"
    );
}

static TEST_FAMILY: Family = Family {
    name: "test",
    image: &[],
    kernels: &["present"],
    pdl: &[],
    archs: &[],
    checksum: 0,
};

#[test]
fn embedded_images_match_their_build_checksums() {
    for f in deepinfer::kernels::FAMILIES {
        assert_eq!(fatbin::checksum(f.image), f.checksum, "family {}", f.name);
    }
    assert_ne!(fatbin::checksum(b"a"), fatbin::checksum(b"b"));
}

#[test]
fn a_kernel_missing_from_its_family_is_named() {
    assert_eq!(TEST_FAMILY.kernel("present").unwrap().name, "present");
    assert!(!TEST_FAMILY.kernel("present").unwrap().pdl);
    let e = TEST_FAMILY.kernel("absent").unwrap_err();
    assert!(
        matches!(&e, Error::KernelNotFound { family, kernel } if family == "test" && kernel == "absent"),
        "{e}"
    );
    assert!(deepinfer::kernels::family("no_such_family").is_err());
}

#[test]
fn absurd_tensor_sizes_are_errors_not_wrapped_sizes() {
    let limit = std::time::Duration::from_secs(2);
    bounded("absurd tensor sizes", 1 << 20, limit, absurd_tensor_sizes);
}

fn absurd_tensor_sizes() {
    let huge = 1usize << 33;
    let e = Tensor::from_vec(Vec::<f32>::new(), &[huge, huge]).unwrap_err();
    assert!(e.to_string().contains("bytes of F32"), "{e}");
    let e = Tensor::empty(&Device::Cpu, DType::F32, &[1 << 62]).unwrap_err();
    assert!(e.to_string().contains("bytes of F32"), "{e}");
    assert!(Tensor::filled_bytes(DType::BF16, &[usize::MAX, 2], 0).is_err());
    assert!(Tensor::zeros(&Device::Cpu, DType::I64, &[1 << 61]).is_err());
    let t = Tensor::from_vec(vec![0u8; 4], &[4]).unwrap();
    assert!(
        t.clone().reshape(&[huge, huge, 4]).is_err(),
        "a wrapping product is no 4 elements"
    );
    assert!(t.reshape(&[2, 2]).is_ok());
    // Zero-sized dimensions stay legal.
    assert_eq!(
        Tensor::from_vec(Vec::<f32>::new(), &[0, huge])
            .unwrap()
            .numel(),
        0
    );
}

#[test]
fn short_cache_rows_decode_to_fewer_values_without_reading_past_them() {
    use deepinfer::kv_format::{decode_compressed_row, decode_index_key_row, decode_window_row};
    for len in [0, 1, 7, 100] {
        let row = vec![0x11u8; len];
        assert!(decode_window_row(&row, 512).len() <= len);
        assert!(decode_compressed_row(&row, 512).len() <= 2 * len);
        assert!(decode_index_key_row(&row, 128).len() <= 2 * len);
    }
}

#[test]
fn tensors_from_bytes_check_the_length_and_round_trip() {
    let bytes: Vec<u8> = (0u8..12).collect();
    let t = Tensor::from_le_bytes(&Device::Cpu, DType::BF16, &[2, 3], &bytes).unwrap();
    assert_eq!(t.to_le_bytes().unwrap(), bytes);
    assert_eq!(
        t.to_vec::<bf16>().unwrap()[1],
        bf16::from_bits(u16::from_le_bytes([2, 3]))
    );
    for (dtype, shape) in [(DType::BF16, &[2usize, 2][..]), (DType::F32, &[4][..])] {
        let e = Tensor::from_le_bytes(&Device::Cpu, dtype, shape, &bytes).unwrap_err();
        assert!(e.to_string().contains("12 bytes"), "{e}");
    }
    // Packed FP4: two values per byte.
    let t = Tensor::from_le_bytes(&Device::Cpu, DType::F4E2M1x2, &[3, 8], &bytes).unwrap();
    assert_eq!(t.numel(), 24);
}

/// Issue 15: decoding little-endian bytes into host storage reserves
/// fallibly. Under a 1 MiB cap on this thread, 8 MiB of f32 bytes are
/// refused by the allocator and come back as `None` from
/// `HostStorage::try_from_le_bytes` and as `Error::OutOfMemory` naming
/// `Tensor::from_le_bytes` and the bytes (an infallible decode aborts the
/// binary here); within the cap both succeed.
#[test]
fn decoding_bytes_larger_than_the_host_allows_is_out_of_memory() {
    use deepinfer::dtype::HostStorage;
    let bytes = vec![0u8; 8 << 20];
    for dtype in [DType::F32, DType::BF16, DType::U8, DType::I64] {
        let (r, refused) = capped("try_from_le_bytes", 1 << 20, || {
            HostStorage::try_from_le_bytes(dtype, &bytes).is_none()
        });
        assert!(r && refused, "{dtype}: decoded {r} refused {refused}");
    }
    let (r, refused) = capped("Tensor::from_le_bytes", 1 << 20, || {
        Tensor::from_le_bytes(&Device::Cpu, DType::F32, &[2 << 20], &bytes)
    });
    assert!(refused);
    match r {
        Err(Error::OutOfMemory { what, bytes: b, .. }) => {
            assert_eq!((what, b), ("Tensor::from_le_bytes", 8 << 20));
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
    let (t, _) = bounded(
        "from_le_bytes within the cap",
        16 << 20,
        std::time::Duration::from_secs(5),
        || Tensor::from_le_bytes(&Device::Cpu, DType::F32, &[2 << 20], &bytes).unwrap(),
    );
    assert_eq!(t.shape(), &[2 << 20]);
}

/// A memory-mapped 1 TiB file (sparse: nothing is stored) decoded onto the
/// CPU is refused against the host's available memory before anything is
/// allocated or read (no host here has 1 TiB available).
#[test]
fn decoding_a_mapping_larger_than_memory_is_refused_before_reading() {
    let dir = common::TempDir::new("huge-mapping");
    let path = dir.path().join("huge.bin");
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    file.set_len(1 << 40).unwrap();
    // SAFETY (test): a private file nobody else writes while it is mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.unwrap();
    let (r, _) = bounded(
        "1 TiB mapping",
        1 << 20,
        std::time::Duration::from_secs(2),
        || Tensor::from_le_bytes(&Device::Cpu, DType::F32, &[1 << 38], &map),
    );
    match r {
        Err(Error::OutOfMemory {
            what,
            bytes,
            available,
            ..
        }) => {
            assert_eq!((what, bytes), ("Tensor::from_le_bytes", 1 << 40));
            assert!(available > 0 && available < 1 << 40, "{available}");
        }
        other => panic!("expected OutOfMemory, got {other:?}"),
    }
}
