//! The stored form of one parameter: the checkpoint dtypes
//! ([`CheckpointDType`]), a stored tensor ([`TensorSpec`]), and a parameter
//! ([`Param`]: a value tensor plus, when quantised, its `.scale`) with its
//! storage [`Format`] and generator [`Role`].
//!
//! Invariant: [`Param::tensors`] is the single definition of how a logical
//! `[rows, cols]` parameter is stored: FP8 block scales on a
//! `[⌈rows/br⌉, ⌈cols/bc⌉]` grid, FP8 row and FP4 scales `[rows, ⌈cols/32⌉]`,
//! packed FP4 as `⌈cols/2⌉` bytes a row.

use std::fmt;

use safetensors::Dtype;

use crate::contract::MX_BLOCK;
use crate::dtype::DType;
pub use crate::weight_rng::Format;
use crate::weight_rng::{RandomParam, stream_key};

/// The dtypes a V4.1 checkpoint stores.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum CheckpointDType {
    BF16,
    F32,
    F8E4M3,
    F8E8M0,
    /// Packed FP4 e2m1 pairs (even element in the low nibble), stored as I8.
    I8,
}

impl CheckpointDType {
    /// The safetensors dtype string.
    pub fn name(self) -> &'static str {
        match self {
            CheckpointDType::BF16 => "BF16",
            CheckpointDType::F32 => "F32",
            CheckpointDType::F8E4M3 => "F8_E4M3",
            CheckpointDType::F8E8M0 => "F8_E8M0",
            CheckpointDType::I8 => "I8",
        }
    }

    /// Bytes per stored element.
    pub fn size(self) -> usize {
        match self {
            CheckpointDType::F32 => 4,
            CheckpointDType::BF16 => 2,
            CheckpointDType::F8E4M3 | CheckpointDType::F8E8M0 | CheckpointDType::I8 => 1,
        }
    }

    pub fn to_safetensors(self) -> Dtype {
        match self {
            CheckpointDType::BF16 => Dtype::BF16,
            CheckpointDType::F32 => Dtype::F32,
            CheckpointDType::F8E4M3 => Dtype::F8_E4M3,
            CheckpointDType::F8E8M0 => Dtype::F8_E8M0,
            CheckpointDType::I8 => Dtype::I8,
        }
    }

    /// `None` for safetensors dtypes a V4.1 checkpoint never uses.
    pub fn from_safetensors(dtype: Dtype) -> Option<Self> {
        match dtype {
            Dtype::BF16 => Some(CheckpointDType::BF16),
            Dtype::F32 => Some(CheckpointDType::F32),
            Dtype::F8_E4M3 => Some(CheckpointDType::F8E4M3),
            Dtype::F8_E8M0 => Some(CheckpointDType::F8E8M0),
            Dtype::I8 => Some(CheckpointDType::I8),
            _ => None,
        }
    }

    /// The crate dtype the tensor is read as: I8 bytes are packed FP4.
    pub fn tensor_dtype(self) -> DType {
        match self {
            CheckpointDType::BF16 => DType::BF16,
            CheckpointDType::F32 => DType::F32,
            CheckpointDType::F8E4M3 => DType::F8E4M3,
            CheckpointDType::F8E8M0 => DType::E8M0,
            CheckpointDType::I8 => DType::F4E2M1x2,
        }
    }
}

impl fmt::Display for CheckpointDType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One stored tensor as the checkpoint holds it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TensorSpec {
    pub name: String,
    pub dtype: CheckpointDType,
    /// The stored shape (I8 counts bytes: half the logical FP4 width).
    pub shape: Vec<usize>,
}

impl TensorSpec {
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }

    pub fn bytes(&self) -> usize {
        self.numel() * self.dtype.size()
    }
}

/// What a parameter is; it fixes how the generator draws its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// An RMSNorm weight or an Engram `q_weight`/`k_weight`.
    Norm,
    /// The weight of a linear map with `fan_in` inputs.
    Linear {
        fan_in: usize,
    },
    /// Embedding rows: token and Markov embeddings, Engram tables.
    Embedding,
    AttnSink,
    /// `hc_*_fn`, a mix over `fan_in` = m·D stream values.
    HcFn {
        fan_in: usize,
    },
    HcBase,
    HcScale,
    /// `gate.bias` and `gate.bias_vl`.
    GateBias,
}

/// One parameter: a value tensor and, when quantised, its `.scale` tensor.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Param {
    /// The value tensor's name.
    pub name: String,
    /// The logical shape (FP4 counts e2m1 values).
    pub shape: Vec<usize>,
    pub format: Format,
    pub role: Role,
}

impl Param {
    /// `x.weight` → `x.scale` for the quantised formats.
    pub fn scale_name(&self) -> Option<String> {
        match self.format {
            Format::Bf16 | Format::F32 => None,
            Format::Fp8Block(_) | Format::Fp8Row | Format::Fp4 => {
                let base = self.name.strip_suffix(".weight").unwrap_or(&self.name);
                Some(format!("{base}.scale"))
            }
        }
    }

    /// The stored tensors: the values, then the scale when there is one.
    pub fn tensors(&self) -> Vec<TensorSpec> {
        let (rows, cols) = self.matrix();
        let value = |dtype, shape| TensorSpec {
            name: self.name.clone(),
            dtype,
            shape,
        };
        let scale = |shape| TensorSpec {
            name: self.scale_name().unwrap_or_default(),
            dtype: CheckpointDType::F8E8M0,
            shape,
        };
        let mut outer = self.shape.clone();
        outer.pop();
        let with_last = |last: usize| outer.iter().copied().chain([last]).collect::<Vec<_>>();
        match self.format {
            Format::Bf16 => vec![value(CheckpointDType::BF16, self.shape.clone())],
            Format::F32 => vec![value(CheckpointDType::F32, self.shape.clone())],
            Format::Fp8Block([br, bc]) => vec![
                value(CheckpointDType::F8E4M3, self.shape.clone()),
                scale(vec![rows.div_ceil(br.max(1)), cols.div_ceil(bc.max(1))]),
            ],
            Format::Fp8Row => vec![
                value(CheckpointDType::F8E4M3, self.shape.clone()),
                scale(with_last(cols.div_ceil(MX_BLOCK))),
            ],
            Format::Fp4 => vec![
                value(CheckpointDType::I8, with_last(cols.div_ceil(2))),
                scale(with_last(cols.div_ceil(MX_BLOCK))),
            ],
        }
    }

    /// The generator's draw of this parameter for run seed `seed`: its
    /// stream, and the mean and standard deviation its role fixes (the
    /// table of `generate`).
    pub fn random(&self, seed: u64) -> RandomParam {
        let (mean, std) = match self.role {
            Role::Norm | Role::HcScale => (1.0, 0.05),
            Role::Linear { fan_in } => (0.0, 1.0 / (fan_in.max(1) as f64).sqrt()),
            Role::Embedding => (0.0, 1.0),
            Role::AttnSink | Role::HcBase => (0.0, 0.1),
            Role::HcFn { fan_in } => (0.0, 0.5 / (fan_in.max(1) as f64).sqrt()),
            Role::GateBias => (0.0, 0.01),
        };
        let (rows, cols) = self.matrix();
        RandomParam {
            key: stream_key(seed, &self.name),
            mean,
            std,
            rows,
            cols,
            format: self.format,
        }
    }

    /// The shape as rows × last dim.
    pub(crate) fn matrix(&self) -> (usize, usize) {
        let cols = self.shape.last().copied().unwrap_or(1);
        let rows = self.shape.iter().rev().skip(1).product();
        (rows, cols)
    }
}
