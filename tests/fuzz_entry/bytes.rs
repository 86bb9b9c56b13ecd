//! Reading a fuzz input as a stream of choices: every read succeeds (an
//! exhausted input reads as zeros), so any byte string is a valid case.

use deepinfer::{DType, E4M3, E8M0, Fp4x2, Tensor};
use half::bf16;

pub struct Bytes<'a> {
    data: &'a [u8],
    at: usize,
}

/// Most elements a fuzzed tensor may hold (a larger shape is still tried
/// through the constructors' checks, but never allocated).
pub const MAX_NUMEL: usize = 1 << 14;

/// Dims: mostly the small and block-shaped sizes the ops expect.
const DIMS: [usize; 24] = [
    1, 2, 4, 8, 16, 32, 64, 3, 0, 5, 128, 6, 24, 136, 528, 288, 12, 96, 256, 7, 20, 10, 48, 2,
];
const HUGE: [usize; 6] = [
    1 << 31,
    1 << 32,
    1 << 33,
    1 << 62,
    usize::MAX,
    usize::MAX / 2,
];

/// Integer arguments (counts, k, offsets, head dims, groups).
const COUNTS: [usize; 20] = [
    0,
    1,
    2,
    3,
    4,
    8,
    16,
    32,
    64,
    5,
    6,
    7,
    12,
    24,
    128,
    256,
    1 << 31,
    1 << 32,
    1 << 62,
    usize::MAX,
];

const FLOATS: [f32; 16] = [
    0.0,
    1.0,
    -1.0,
    0.5,
    2.0,
    1e-6,
    1e-20,
    100.0,
    f32::NAN,
    f32::INFINITY,
    f32::NEG_INFINITY,
    1e30,
    -0.0,
    f32::MIN_POSITIVE,
    10.0,
    f32::MAX,
];

impl<'a> Bytes<'a> {
    pub fn new(data: &'a [u8]) -> Bytes<'a> {
        Bytes { data, at: 0 }
    }

    pub fn u8(&mut self) -> u8 {
        let b = self.data.get(self.at).copied().unwrap_or(0);
        self.at += 1;
        b
    }

    pub fn u32(&mut self) -> u32 {
        u32::from_le_bytes([self.u8(), self.u8(), self.u8(), self.u8()])
    }

    pub fn u64(&mut self) -> u64 {
        u64::from(self.u32()) | (u64::from(self.u32()) << 32)
    }

    pub fn bool(&mut self) -> bool {
        self.u8() & 1 == 1
    }

    pub fn pick<T: Copy>(&mut self, options: &[T]) -> T {
        options[usize::from(self.u8()) % options.len()]
    }

    /// A count argument: a table entry, or (1 in 16) raw bits.
    pub fn count(&mut self) -> usize {
        let b = self.u8();
        if b >= 240 {
            self.u64() as usize
        } else {
            COUNTS[usize::from(b) % COUNTS.len()]
        }
    }

    /// A float argument: a table entry, or (1 in 16) raw bits.
    pub fn float(&mut self) -> f32 {
        let b = self.u8();
        if b >= 240 {
            f32::from_bits(self.u32())
        } else {
            FLOATS[usize::from(b) % FLOATS.len()]
        }
    }

    pub fn dtype(&mut self, hint: DType) -> DType {
        let b = self.u8();
        if b < 224 {
            hint
        } else {
            DType::ALL[usize::from(b) % DType::ALL.len()]
        }
    }

    fn dim(&mut self) -> usize {
        let b = self.u8();
        if b >= 248 {
            HUGE[usize::from(b) % HUGE.len()]
        } else {
            DIMS[usize::from(b) % DIMS.len()]
        }
    }

    /// A shape of rank `rank` (or, 1 in 8, another rank 0..=4).
    pub fn shape(&mut self, rank: usize) -> Vec<usize> {
        let b = self.u8();
        let rank = if b >= 224 { usize::from(b) % 5 } else { rank };
        (0..rank).map(|_| self.dim()).collect()
    }

    /// A host tensor of a fuzzed dtype (mostly `hint`) and shape (mostly of
    /// rank `rank`) with fuzzed values, or `None` when the shape holds more
    /// than [`MAX_NUMEL`] elements (such a shape is offered to the
    /// constructors, which must refuse it or allocate nothing).
    pub fn tensor(&mut self, hint: DType, rank: usize) -> Option<Tensor> {
        let dtype = self.dtype(hint);
        let shape = self.shape(rank);
        self.tensor_of(dtype, &shape)
    }

    pub fn tensor_of(&mut self, dtype: DType, shape: &[usize]) -> Option<Tensor> {
        let numel = shape.iter().try_fold(1usize, |n, &d| n.checked_mul(d));
        match numel {
            Some(n) if n <= MAX_NUMEL => {}
            _ => {
                // The wrap-around cases: a shape whose size overflows, or
                // is merely huge, must not become a tensor of 0 bytes.
                let empty = Tensor::from_vec(Vec::<u8>::new(), shape);
                assert!(
                    empty.is_err() || numel == Some(0),
                    "from_vec(vec![], {shape:?}) accepted"
                );
                if numel.is_none() {
                    assert!(
                        Tensor::filled_bytes(dtype, shape, 0).is_err(),
                        "filled_bytes({dtype}, {shape:?}) accepted an overflowing shape"
                    );
                }
                return None;
            }
        }
        let n = numel.unwrap_or(0);
        let result = match dtype {
            DType::F32 => Tensor::from_vec((0..n).map(|_| self.value_f32()).collect(), shape),
            DType::BF16 => Tensor::from_vec(
                (0..n).map(|_| bf16::from_f32(self.value_f32())).collect(),
                shape,
            ),
            DType::F8E4M3 => Tensor::from_vec((0..n).map(|_| E4M3(self.raw())).collect(), shape),
            DType::E8M0 => Tensor::from_vec((0..n).map(|_| E8M0(self.scale())).collect(), shape),
            DType::F4E2M1x2 => {
                Tensor::from_vec((0..n / 2).map(|_| Fp4x2(self.raw())).collect(), shape)
            }
            DType::I32 => Tensor::from_vec((0..n).map(|_| self.index() as i32).collect(), shape),
            DType::I64 => Tensor::from_vec((0..n).map(|_| self.index()).collect(), shape),
            DType::U8 => Tensor::from_vec((0..n).map(|_| self.raw()).collect(), shape),
        };
        result.ok()
    }

    /// An element byte: the input's next byte, or a fixed pattern once the
    /// input is spent.
    fn raw(&mut self) -> u8 {
        let at = self.at;
        match self.data.get(at) {
            Some(&b) => {
                self.at += 1;
                b
            }
            None => {
                self.at += 1;
                (at.wrapping_mul(37) % 251) as u8
            }
        }
    }

    /// E8M0 scales near 2^0 mostly.
    fn scale(&mut self) -> u8 {
        let b = self.raw();
        if b >= 240 { b } else { 120 + b % 16 }
    }

    fn value_f32(&mut self) -> f32 {
        let b = self.raw();
        if b >= 250 {
            FLOATS[usize::from(b) % FLOATS.len()]
        } else {
            (f32::from(b) - 125.0) / 32.0
        }
    }

    /// Index-like values: mostly small (−2..62), sometimes extreme.
    fn index(&mut self) -> i64 {
        let b = self.raw();
        match b {
            0..=239 => i64::from(b % 64) - 2,
            240 => i64::MAX,
            241 => i64::MIN,
            242 => i64::from(i32::MAX),
            243 => i64::from(i32::MIN),
            244 => 1 << 31,
            245 => -1,
            _ => i64::from(b) * 1000,
        }
    }
}
