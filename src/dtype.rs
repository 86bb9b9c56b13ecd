//! Element types and their storage. Sub-byte and 8-bit float formats are
//! stored as raw bytes (newtypes over `u8`); [`crate::numerics`] holds the
//! bit-exact conversions. Packed FP4 stores two e2m1 values per byte, the even
//! element in the low nibble, so an FP4 tensor's last dimension must be even.

use half::bf16;
use std::fmt;

/// An FP8 e4m3 ("fn" flavour: no infinities, NaN = 0x7F/0xFF, max 448).
/// Also the storage of E4M3 block scales (the FP4 global-KV format).
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct E4M3(pub u8);

/// An E8M0 scale: 2^(byte − 127), 0xFF is NaN, no zero.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct E8M0(pub u8);

/// Two FP4 e2m1 values in one byte: element 2i in bits 0..4, 2i+1 in bits 4..8.
#[repr(transparent)]
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Fp4x2(pub u8);

/// The dtype tag of a [`crate::Tensor`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    BF16,
    /// FP8 e4m3 values or E4M3 block scales.
    F8E4M3,
    /// E8M0 power-of-two scales.
    E8M0,
    /// Packed FP4 e2m1, two per byte.
    F4E2M1x2,
    I32,
    I64,
    /// Raw bytes: encoded cache rows (`kv_format`) whose layout mixes
    /// values and scales.
    U8,
}

impl DType {
    /// Every dtype, in declaration order (a stable numbering for wire
    /// headers and fuzzers).
    pub const ALL: [DType; 8] = [
        DType::F32,
        DType::BF16,
        DType::F8E4M3,
        DType::E8M0,
        DType::F4E2M1x2,
        DType::I32,
        DType::I64,
        DType::U8,
    ];

    /// Bytes needed for `numel` logical elements (FP4 rounds up to whole bytes).
    pub fn storage_bytes(self, numel: usize) -> usize {
        match self {
            DType::F32 | DType::I32 => numel * 4,
            DType::BF16 => numel * 2,
            DType::F8E4M3 | DType::E8M0 | DType::U8 => numel,
            DType::F4E2M1x2 => numel.div_ceil(2),
            DType::I64 => numel * 8,
        }
    }

    /// The name used in checkpoints (safetensors dtype strings) where one exists.
    pub fn name(self) -> &'static str {
        match self {
            DType::F32 => "F32",
            DType::BF16 => "BF16",
            DType::F8E4M3 => "F8_E4M3",
            DType::E8M0 => "F8_E8M0",
            DType::F4E2M1x2 => "F4_E2M1x2",
            DType::I32 => "I32",
            DType::I64 => "I64",
            DType::U8 => "U8",
        }
    }
}

impl fmt::Display for DType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Host element types a tensor can hold. `Storage` of one element type is a
/// `Vec<Self>`; the byte encoding is little-endian, as on every GPU we target.
pub trait Element: Copy + Send + Sync + 'static + private::Sealed {
    const DTYPE: DType;
    /// Number of logical elements one storage unit holds (2 for packed FP4).
    const PER_UNIT: usize = 1;
    fn wrap(v: Vec<Self>) -> HostStorage;
    fn view(s: &HostStorage) -> Option<&[Self]>;
    fn view_mut(s: &mut HostStorage) -> Option<&mut [Self]>;
    fn put_le(self, out: &mut Vec<u8>);
    /// Decodes one element from its little-endian bytes (a short slice
    /// reads as zero bytes; callers pass exact chunks).
    fn get_le(bytes: &[u8]) -> Self;
    /// The little-endian bytes of `v`: `u8`'s own slice, borrowed; any
    /// other type's encoded in one allocation.
    fn le_bytes(v: &[Self]) -> std::borrow::Cow<'_, [u8]> {
        let mut out = Vec::with_capacity(std::mem::size_of_val(v));
        v.iter().for_each(|x| x.put_le(&mut out));
        std::borrow::Cow::Owned(out)
    }
}

/// Typed host storage; the variant is the dtype.
#[derive(Clone, Debug, PartialEq)]
pub enum HostStorage {
    F32(Vec<f32>),
    BF16(Vec<bf16>),
    F8E4M3(Vec<E4M3>),
    E8M0(Vec<E8M0>),
    F4E2M1x2(Vec<Fp4x2>),
    I32(Vec<i32>),
    I64(Vec<i64>),
    U8(Vec<u8>),
}

impl HostStorage {
    pub fn dtype(&self) -> DType {
        match self {
            HostStorage::F32(_) => DType::F32,
            HostStorage::BF16(_) => DType::BF16,
            HostStorage::F8E4M3(_) => DType::F8E4M3,
            HostStorage::E8M0(_) => DType::E8M0,
            HostStorage::F4E2M1x2(_) => DType::F4E2M1x2,
            HostStorage::I32(_) => DType::I32,
            HostStorage::I64(_) => DType::I64,
            HostStorage::U8(_) => DType::U8,
        }
    }

    /// Number of storage units (bytes for the 8-bit and packed types).
    pub fn units(&self) -> usize {
        match self {
            HostStorage::F32(v) => v.len(),
            HostStorage::BF16(v) => v.len(),
            HostStorage::F8E4M3(v) => v.len(),
            HostStorage::E8M0(v) => v.len(),
            HostStorage::F4E2M1x2(v) => v.len(),
            HostStorage::I32(v) => v.len(),
            HostStorage::I64(v) => v.len(),
            HostStorage::U8(v) => v.len(),
        }
    }

    /// Copies `len` storage bytes of `src` (same variant) from byte `s0` to
    /// byte `d0` of `self`. Byte offsets are whole elements (callers copy
    /// whole rows). A range past either storage, or two variants, is
    /// refused (`false`) and nothing is copied.
    #[must_use]
    pub fn copy_bytes_from(&mut self, d0: usize, src: &HostStorage, s0: usize, len: usize) -> bool {
        fn cp<T: Copy>(d: &mut [T], s: &[T], d0: usize, s0: usize, len: usize) -> bool {
            let w = std::mem::size_of::<T>();
            let range = |at: usize| Some(at / w..at.checked_add(len)? / w);
            match (
                range(d0).and_then(|r| d.get_mut(r)),
                range(s0).and_then(|r| s.get(r)),
            ) {
                (Some(d), Some(s)) if d.len() == s.len() => {
                    d.copy_from_slice(s);
                    true
                }
                _ => false,
            }
        }
        match (self, src) {
            (HostStorage::F32(d), HostStorage::F32(s)) => cp(d, s, d0, s0, len),
            (HostStorage::BF16(d), HostStorage::BF16(s)) => cp(d, s, d0, s0, len),
            (HostStorage::F8E4M3(d), HostStorage::F8E4M3(s)) => cp(d, s, d0, s0, len),
            (HostStorage::E8M0(d), HostStorage::E8M0(s)) => cp(d, s, d0, s0, len),
            (HostStorage::F4E2M1x2(d), HostStorage::F4E2M1x2(s)) => cp(d, s, d0, s0, len),
            (HostStorage::I32(d), HostStorage::I32(s)) => cp(d, s, d0, s0, len),
            (HostStorage::I64(d), HostStorage::I64(s)) => cp(d, s, d0, s0, len),
            (HostStorage::U8(d), HostStorage::U8(s)) => cp(d, s, d0, s0, len),
            _ => false,
        }
    }

    /// Typed storage of `bytes` storage bytes, each byte `byte`. The memory
    /// is reserved with `try_reserve_exact`: an allocation the host refuses
    /// is `None`, never an abort.
    pub fn try_filled(dtype: DType, bytes: usize, byte: u8) -> Option<HostStorage> {
        fn fill<T: Element>(bytes: usize, byte: u8) -> Option<Vec<T>> {
            let n = bytes / std::mem::size_of::<T>();
            let mut v = Vec::new();
            v.try_reserve_exact(n).ok()?;
            v.resize(n, T::get_le(&[byte; 8]));
            Some(v)
        }
        Some(match dtype {
            DType::F32 => HostStorage::F32(fill(bytes, byte)?),
            DType::BF16 => HostStorage::BF16(fill(bytes, byte)?),
            DType::F8E4M3 => HostStorage::F8E4M3(fill(bytes, byte)?),
            DType::E8M0 => HostStorage::E8M0(fill(bytes, byte)?),
            DType::F4E2M1x2 => HostStorage::F4E2M1x2(fill(bytes, byte)?),
            DType::I32 => HostStorage::I32(fill(bytes, byte)?),
            DType::I64 => HostStorage::I64(fill(bytes, byte)?),
            DType::U8 => HostStorage::U8(fill(bytes, byte)?),
        })
    }

    /// Little-endian bytes of the storage, as a device copy expects them
    /// (U8 storage borrowed, other types encoded once).
    pub fn le_bytes(&self) -> std::borrow::Cow<'_, [u8]> {
        match self {
            HostStorage::F32(v) => Element::le_bytes(v),
            HostStorage::BF16(v) => Element::le_bytes(v),
            HostStorage::F8E4M3(v) => Element::le_bytes(v),
            HostStorage::E8M0(v) => Element::le_bytes(v),
            HostStorage::F4E2M1x2(v) => Element::le_bytes(v),
            HostStorage::I32(v) => Element::le_bytes(v),
            HostStorage::I64(v) => Element::le_bytes(v),
            HostStorage::U8(v) => Element::le_bytes(v),
        }
    }

    /// Rebuilds typed storage of `dtype` from little-endian bytes, reserved
    /// fallibly in one allocation: `None` when the host cannot hold it,
    /// never an abort (the bytes may be a memory-mapped file far larger than
    /// memory).
    pub fn try_from_le_bytes(dtype: DType, bytes: &[u8]) -> Option<HostStorage> {
        fn dec<T: Element>(b: &[u8]) -> Option<Vec<T>> {
            let size = std::mem::size_of::<T>();
            let mut v = Vec::new();
            v.try_reserve_exact(b.len() / size).ok()?;
            v.extend(b.chunks_exact(size).map(T::get_le));
            Some(v)
        }
        Some(match dtype {
            DType::F32 => HostStorage::F32(dec(bytes)?),
            DType::BF16 => HostStorage::BF16(dec(bytes)?),
            DType::F8E4M3 => HostStorage::F8E4M3(dec(bytes)?),
            DType::E8M0 => HostStorage::E8M0(dec(bytes)?),
            DType::F4E2M1x2 => HostStorage::F4E2M1x2(dec(bytes)?),
            DType::I32 => HostStorage::I32(dec(bytes)?),
            DType::I64 => HostStorage::I64(dec(bytes)?),
            DType::U8 => HostStorage::U8(dec(bytes)?),
        })
    }
}

mod private {
    pub trait Sealed {}
}

macro_rules! element {
    ($t:ty, $variant:ident, $per:expr, $n:expr, |$x:ident| $enc:expr, |$b:ident| $dec:expr) => {
        element!($t, $variant, $per, $n, |$x| $enc, |$b| $dec, {});
    };
    ($t:ty, $variant:ident, $per:expr, $n:expr, |$x:ident| $enc:expr, |$b:ident| $dec:expr, { $($extra:item)* }) => {
        impl private::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$variant;
            const PER_UNIT: usize = $per;
            fn wrap(v: Vec<Self>) -> HostStorage {
                HostStorage::$variant(v)
            }
            fn view(s: &HostStorage) -> Option<&[Self]> {
                match s {
                    HostStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn view_mut(s: &mut HostStorage) -> Option<&mut [Self]> {
                match s {
                    HostStorage::$variant(v) => Some(v),
                    _ => None,
                }
            }
            fn put_le(self, out: &mut Vec<u8>) {
                let $x = self;
                out.extend_from_slice(&$enc);
            }
            fn get_le(bytes: &[u8]) -> Self {
                let $b: [u8; $n] = bytes
                    .get(..$n)
                    .and_then(|b| b.try_into().ok())
                    .unwrap_or([0; $n]);
                $dec
            }
            $($extra)*
        }
    };
}

element!(f32, F32, 1, 4, |x| x.to_le_bytes(), |b| f32::from_le_bytes(
    b
));
element!(bf16, BF16, 1, 2, |x| x.to_bits().to_le_bytes(), |b| {
    bf16::from_bits(u16::from_le_bytes(b))
});
element!(E4M3, F8E4M3, 1, 1, |x| [x.0], |b| E4M3(b[0]));
element!(E8M0, E8M0, 1, 1, |x| [x.0], |b| E8M0(b[0]));
element!(Fp4x2, F4E2M1x2, 2, 1, |x| [x.0], |b| Fp4x2(b[0]));
element!(i32, I32, 1, 4, |x| x.to_le_bytes(), |b| i32::from_le_bytes(
    b
));
element!(i64, I64, 1, 8, |x| x.to_le_bytes(), |b| i64::from_le_bytes(
    b
));
element!(u8, U8, 1, 1, |x| [x], |b| b[0], {
    fn le_bytes(v: &[u8]) -> std::borrow::Cow<'_, [u8]> {
        std::borrow::Cow::Borrowed(v)
    }
});
