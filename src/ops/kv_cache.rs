//! Cache row writers (`v41-flash.md` §3.1 step 2, §3.4, §3.5, §11): rows to
//! the encoded byte rows of [`kv_format`] — the 528-byte FP8 window row, the
//! 288-byte FP4 compressed row and the FP4 index-key row — optionally after
//! an RMSNorm and a RoPE of the last `rope_dim` values, which is the model's
//! whole window, entry and key path after its projection in one pass. Into a
//! new dense tensor ([`kv_rows`], [`window_rows`], [`compressed_rows`]) or
//! straight into a row pool at given slots ([`kv_rows_into`]); the ratio-2
//! compressor's pooled entries take the same path
//! ([`super::compressor_rows_into`]).
//!
//! Invariant: every stored row is bitwise `kv_format`'s encoding of
//! rope(rms_norm(row)) as the CPU ops compute those
//! ([`cpu_backend::kv_rows`]), on every device; a slot outside the pool
//! writes nothing; rows are independent of each other.
//!
//! [`kv_format`]: crate::kv_format
//! [`cpu_backend::kv_rows`]: crate::cpu_backend::kv_rows

use super::rms_norm::check_norm_args;
use super::rope::check_rope_args;
use super::shape_error;
use crate::contract::{KvRowFormat, RopeParams};
use crate::cpu_backend::kv_rows::{RowRope as CpuRope, kv_rows as cpu_kv_rows, pool_groups};
use crate::device::Device;
use crate::dtype::{DType, Fp4x2};
use crate::error::Result;
use crate::tensor::Tensor;
use half::bf16;

/// The RMSNorm before a row is encoded: BF16 `weight` `[D]` and `eps`.
#[derive(Clone, Copy, Debug)]
pub struct RowNorm<'a> {
    pub weight: &'a Tensor,
    pub eps: f32,
}

/// The RoPE of a row writer: I64 `positions` (one per row), the last
/// `rope_dim` values rotate with the layer's `params` (one head).
#[derive(Clone, Copy, Debug)]
pub struct RowRope<'a> {
    pub positions: &'a Tensor,
    pub rope_dim: usize,
    pub params: &'a RopeParams,
}

/// Where a row writer stores: the encoded row i goes to row `slots[i]` of
/// `pool` (I32 `slots` `[T]`; a slot outside `[0, pool rows)` is not
/// written), and, when `latent` is given (BF16 `[T, D]`), row i after the
/// RMSNorm and before the RoPE (the compressor's latent) to its row i.
#[derive(Debug)]
pub struct RowsOut<'a> {
    pub pool: &'a mut Tensor,
    pub slots: &'a Tensor,
    pub latent: Option<&'a mut Tensor>,
}

/// The dtype and row width of a pool (or dense output) of `format` rows of
/// `dim` values: U8 `[.., row bytes]`, index keys `F4E2M1x2` `[.., 2 · row
/// bytes]` as `ops::index_key_quant` writes them.
pub fn kv_row_layout(format: KvRowFormat, dim: usize) -> (DType, usize) {
    match format {
        KvRowFormat::IndexKey => (DType::F4E2M1x2, 2 * format.row_bytes(dim)),
        KvRowFormat::Window | KvRowFormat::Compressed => (DType::U8, format.row_bytes(dim)),
    }
}

/// BF16 `x` `[T, D]` → the rows of `format` `[T, row width]` (see
/// [`kv_row_layout`]), each after the optional `norm` and `rope`.
pub fn kv_rows(
    x: &Tensor,
    format: KvRowFormat,
    norm: Option<RowNorm<'_>>,
    rope: Option<RowRope<'_>>,
) -> Result<Tensor> {
    const OP: &str = "kv_rows";
    let (t, d) = validate_x(OP, x, format)?;
    let (dtype, width) = kv_row_layout(format, d);
    let mut out = Tensor::empty(&x.device(), dtype, &[t, width])?;
    let rows = RowsIn {
        op: OP,
        input: Input::Bf16(x),
        rows: t,
        dim: d,
        format,
        norm,
        rope,
    };
    rows.validate()?;
    rows.run(Dest::Dense(&mut out), None)?;
    Ok(out)
}

/// [`kv_rows`] stored straight into a row pool at `out.slots` (and the
/// latent into `out.latent`).
pub fn kv_rows_into(
    x: &Tensor,
    format: KvRowFormat,
    norm: Option<RowNorm<'_>>,
    rope: Option<RowRope<'_>>,
    out: RowsOut<'_>,
) -> Result<()> {
    const OP: &str = "kv_rows_into";
    let (t, d) = validate_x(OP, x, format)?;
    RowsIn {
        op: OP,
        input: Input::Bf16(x),
        rows: t,
        dim: d,
        format,
        norm,
        rope,
    }
    .run_into(out)
}

/// BF16 `x` `[T, D]` (D a multiple of 32) → U8 `[T, D + D/32]`: e4m3 values
/// then one E8M0 scale per 32 (the window ring's row, 528 bytes at D 512).
pub fn window_rows(x: &Tensor) -> Result<Tensor> {
    kv_rows(x, KvRowFormat::Window, None, None)
}

/// BF16 `x` `[T, D]` (D a multiple of 16) → U8 `[T, D/2 + D/16]`: packed
/// e2m1 then one E4M3 scale per 16 (the compressed-KV row, 288 bytes).
pub fn compressed_rows(x: &Tensor) -> Result<Tensor> {
    kv_rows(x, KvRowFormat::Compressed, None, None)
}

/// BF16 `x` must be `[T, D]`, D a positive multiple of the format's group.
fn validate_x(op: &'static str, x: &Tensor, format: KvRowFormat) -> Result<(usize, usize)> {
    x.expect_dtype(op, "x", DType::BF16)?;
    match *x.shape() {
        [t, d] if d > 0 && d.is_multiple_of(format.group()) && d <= i32::MAX as usize => Ok((t, d)),
        _ => Err(shape_error(
            op,
            "x",
            x,
            format!("[T, D] with D a positive multiple of {}", format.group()),
        )),
    }
}

/// What a row writer reads (validated by its op).
pub(super) enum Input<'a> {
    Bf16(&'a Tensor),
    /// F32 kv and score rows, the pending pair, and I32 groups `[rows, 2]`
    /// (consecutive pairs when `None`).
    Pool2 {
        kv: &'a Tensor,
        score: &'a Tensor,
        pending: Option<(&'a Tensor, &'a Tensor)>,
        groups: Option<&'a Tensor>,
    },
}

/// Where the encoded rows go.
pub(super) enum Dest<'a> {
    /// Row i of a `[rows, width]` tensor.
    Dense(&'a mut Tensor),
    /// Row `slots[i]` of a pool.
    Pool(&'a mut Tensor, &'a Tensor),
    /// Nowhere (only the latent is wanted).
    None,
}

/// One row-writer call: `rows` input rows of `dim` values.
pub(super) struct RowsIn<'a> {
    pub op: &'static str,
    pub input: Input<'a>,
    pub rows: usize,
    pub dim: usize,
    pub format: KvRowFormat,
    pub norm: Option<RowNorm<'a>>,
    pub rope: Option<RowRope<'a>>,
}

impl<'a> RowsIn<'a> {
    /// Checks the norm and RoPE arguments against the call's rows and dim.
    pub(super) fn validate(&self) -> Result<()> {
        if let Some(n) = self.norm {
            check_norm_args(self.op, n.weight, self.dim, n.eps)?;
        }
        if let Some(r) = self.rope {
            r.positions.expect_dtype(self.op, "positions", DType::I64)?;
            if r.positions.shape() != [self.rows] {
                return Err(shape_error(
                    self.op,
                    "positions",
                    r.positions,
                    format!("[{}] (one position per row)", self.rows),
                ));
            }
            check_rope_args(self.op, r.rope_dim, self.dim, r.params)?;
        }
        Ok(())
    }

    /// Validates `out` and runs into it.
    pub(super) fn run_into(self, out: RowsOut<'_>) -> Result<()> {
        self.validate()?;
        let (dtype, width) = kv_row_layout(self.format, self.dim);
        match *out.pool.shape() {
            [_, w] if w == width && out.pool.dtype() == dtype => {}
            _ => {
                return Err(shape_error(
                    self.op,
                    "pool",
                    out.pool,
                    format!("{dtype:?} [N, {width}] (rows of the format)"),
                ));
            }
        }
        out.slots
            .expect_output(self.op, "slots", DType::I32, &[self.rows])?;
        if let Some(l) = &out.latent {
            l.expect_output(self.op, "latent", DType::BF16, &[self.rows, self.dim])?;
        }
        self.run(Dest::Pool(out.pool, out.slots), out.latent)
    }

    /// Every tensor of the call with its name (for the device check).
    fn tensors<'t>(
        &'t self,
        dest: &'t Dest<'_>,
        latent: &'t Option<&mut Tensor>,
    ) -> Vec<(&'static str, &'t Tensor)> {
        let mut v = Vec::new();
        match &self.input {
            Input::Bf16(x) => v.push(("x", *x)),
            Input::Pool2 {
                kv,
                score,
                pending,
                groups,
            } => {
                v.extend([("kv", *kv), ("score", *score)]);
                if let Some((k, s)) = pending {
                    v.extend([("pending_kv", *k), ("pending_score", *s)]);
                }
                if let Some(g) = groups {
                    v.push(("groups", *g));
                }
            }
        }
        if let Some(n) = self.norm {
            v.push(("weight", n.weight));
        }
        if let Some(r) = self.rope {
            v.push(("positions", r.positions));
        }
        match dest {
            Dest::Dense(o) => v.push(("out", &**o)),
            Dest::Pool(p, s) => v.extend([("pool", &**p), ("slots", *s)]),
            Dest::None => {}
        }
        if let Some(l) = latent {
            v.push(("latent", &**l));
        }
        v
    }

    /// Runs a validated call on the inputs' device.
    pub(super) fn run(self, dest: Dest<'_>, latent: Option<&mut Tensor>) -> Result<()> {
        let device = super::common_device(self.op, &self.tensors(&dest, &latent))?;
        match device {
            Device::Cpu => self.run_cpu(dest, latent),
            #[cfg(deepinfer_cuda)]
            Device::Cuda(dev) => self.run_cuda(&dev, dest, latent),
            #[cfg(not(deepinfer_cuda))]
            d @ Device::Cuda(_) => Err(super::kernels_not_built(self.op, &d)),
        }
    }

    fn run_cpu(self, dest: Dest<'_>, latent: Option<&mut Tensor>) -> Result<()> {
        let dim = self.dim;
        // The input rows that exist (a pool2 group with a member out of range
        // does not) and their values.
        let (live, values): (Vec<usize>, Vec<bf16>) = match self.input {
            Input::Bf16(x) => ((0..self.rows).collect(), x.as_slice::<bf16>()?.to_vec()),
            Input::Pool2 {
                kv,
                score,
                pending,
                groups,
            } => {
                let groups: Vec<[i32; 2]> = match groups {
                    Some(g) => g
                        .as_slice::<i32>()?
                        .chunks_exact(2)
                        .map(|p| [p[0], p[1]])
                        .collect(),
                    None => (0..super::i32_sat(self.rows))
                        .map(|j| [2 * j, 2 * j + 1])
                        .collect(),
                };
                let pending = match pending {
                    Some((k, s)) => Some((k.as_slice::<f32>()?, s.as_slice::<f32>()?)),
                    None => None,
                };
                let pooled = pool_groups(
                    (kv.as_slice::<f32>()?, score.as_slice::<f32>()?),
                    pending,
                    &groups,
                    dim,
                );
                let mut live = Vec::new();
                let mut values = Vec::new();
                for (i, p) in pooled.into_iter().enumerate() {
                    if let Some(p) = p {
                        live.push(i);
                        values.extend(p);
                    }
                }
                (live, values)
            }
        };
        let positions: Option<Vec<i64>> = match self.rope {
            Some(r) => {
                let all = r.positions.as_slice::<i64>()?;
                Some(live.iter().map(|&i| all[i]).collect())
            }
            None => None,
        };
        let weight = match self.norm {
            Some(n) => Some((n.weight.as_slice::<bf16>()?, n.eps)),
            None => None,
        };
        let rope = self.rope.zip(positions.as_deref()).map(|(r, p)| CpuRope {
            positions: p,
            rope_dim: r.rope_dim,
            params: r.params,
        });
        let (lat, encoded) = cpu_kv_rows(&values, dim, weight, rope, self.format);
        if let Some(l) = latent {
            let l = l.as_mut_slice::<bf16>()?;
            for (k, &i) in live.iter().enumerate() {
                l[i * dim..(i + 1) * dim].copy_from_slice(&lat[k * dim..(k + 1) * dim]);
            }
        }
        let rb = self.format.row_bytes(dim);
        let (pool, slots): (&mut Tensor, Option<Vec<i32>>) = match dest {
            Dest::Dense(o) => (o, None),
            Dest::Pool(p, s) => (p, Some(s.as_slice::<i32>()?.to_vec())),
            Dest::None => return Ok(()),
        };
        let n = pool.rows();
        let put = |bytes: &mut dyn FnMut(usize, &[u8])| {
            for (k, &i) in live.iter().enumerate() {
                let row = match &slots {
                    Some(s) => usize::try_from(s[i]).ok().filter(|&r| r < n),
                    None => Some(i),
                };
                if let Some(r) = row {
                    bytes(r, &encoded[k * rb..(k + 1) * rb]);
                }
            }
        };
        match pool.dtype() {
            DType::F4E2M1x2 => {
                let dst = pool.as_mut_slice::<Fp4x2>()?;
                put(&mut |r, src| {
                    for (d, &b) in dst[r * rb..(r + 1) * rb].iter_mut().zip(src) {
                        *d = Fp4x2(b);
                    }
                });
            }
            _ => {
                let dst = pool.as_mut_slice::<u8>()?;
                put(&mut |r, src| dst[r * rb..(r + 1) * rb].copy_from_slice(src));
            }
        }
        Ok(())
    }

    #[cfg(deepinfer_cuda)]
    fn run_cuda(
        self,
        dev: &crate::device::CudaDevice,
        dest: Dest<'_>,
        latent: Option<&mut Tensor>,
    ) -> Result<()> {
        use crate::cuda_backend::kv_rows::{KvInput, KvRowsCall, kv_rows};
        let input = match self.input {
            Input::Bf16(x) => KvInput::Bf16(x),
            Input::Pool2 {
                kv,
                score,
                pending,
                groups,
            } => KvInput::Pool2 {
                kv,
                score,
                pending,
                groups,
            },
        };
        let out = match dest {
            Dest::Dense(o) => Some((o, None)),
            Dest::Pool(p, s) => Some((p, Some(s))),
            Dest::None => None,
        };
        kv_rows(
            dev,
            self.op,
            KvRowsCall {
                input,
                rows: self.rows,
                dim: self.dim,
                format: self.format,
                norm: self.norm.map(|n| (n.weight, n.eps)),
                rope: self.rope.map(|r| {
                    (
                        r.positions,
                        crate::cpu_backend::rope_freqs(r.params, r.rope_dim),
                    )
                }),
                latent,
                out,
            },
        )
    }
}
