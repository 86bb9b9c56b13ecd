//! Decode steps as CUDA graphs (issue 11, `docs/graph-decode.md`):
//! [`Model::decode_graphed`] runs the host half of a decode step as
//! [`Model::step`] does (claims, plans, uploads through the pool's step
//! arena), then replays a captured graph of the device half instead of
//! launching its ~1,500 kernels one by one.
//!
//! Invariant: a graph is replayed only for the pool's arena it was captured
//! with and only when the step's uploads have the signature of the capture
//! ([`StepInputs::signature`](super::inputs::StepInputs::signature): the
//! same tensors at the same device addresses, of the same shapes, in the
//! same order, and the same fixed host values, such as a top-k width).
//! Every host value the device half reads is such an upload or a fixed
//! value, and every launch shape follows from them, so a replay runs the
//! step's own work; any other step is captured anew. The graph's output
//! and range-check slots are allocated outside the capture and held with
//! it; everything the device half allocates inside the capture is freed
//! inside it.

#[cfg(deepinfer_cuda)]
use super::forward::{Capture, LayerTrace};
use super::forward::{Model, SeqInput, StepOutput};
use super::inputs::{StepInputs, UploadKey};
use super::pool::StatePool;
use crate::model::error::Result;

/// A captured decode step and what it was captured for. Held by the
/// caller between steps ([`Model::decode_graphed`]).
pub struct DecodeGraph {
    #[cfg(deepinfer_cuda)]
    graph: crate::device::Graph,
    /// The arena of the pool it was captured with.
    arena: StepInputs,
    signature: Vec<UploadKey>,
    /// F32 `[B, vocab]`: the logits each launch writes.
    #[cfg(deepinfer_cuda)]
    logits: crate::tensor::Tensor,
    #[cfg(deepinfer_cuda)]
    checks: crate::ops::DeviceChecks,
    /// The range checks the capture recorded (each launch makes them).
    #[cfg(deepinfer_cuda)]
    recorded: Vec<(&'static str, &'static str)>,
    /// Steps replayed with this graph (the capture's own first launch
    /// included).
    pub launches: usize,
}

impl std::fmt::Debug for DecodeGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeGraph")
            .field("uploads", &self.signature.len())
            .field("launches", &self.launches)
            .finish()
    }
}

impl Model {
    /// One decode step (one new token for each sequence of `inputs`, none
    /// with an open rollback checkpoint) on a CUDA device, its device half
    /// replayed from `graph` when `graph` was captured for this pool and
    /// this step's upload signature, else captured into `graph` first (the
    /// graph of another signature is dropped). The logits are those
    /// [`Model::step`] gives for the same step; nothing else is captured
    /// (`features` is `None`, `layers` empty traces, no timing).
    pub fn decode_graphed(
        &self,
        pool: &mut StatePool,
        inputs: &[SeqInput],
        graph: &mut Option<DecodeGraph>,
    ) -> Result<StepOutput> {
        let device = self.device();
        let crate::device::Device::Cuda(cuda) = &device else {
            return Err(crate::Error::Unsupported {
                op: "Model::decode_graphed",
                device: device.to_string(),
                why: "a CUDA graph needs a CUDA device",
            }
            .into());
        };
        if let Some(i) = inputs.iter().find(|i| i.tokens.len() != 1) {
            return Err(invalid(
                "inputs",
                format!("{} tokens for sequence {}", i.tokens.len(), i.seq),
                "a graphed decode step takes one token per sequence (prefill with Model::step)",
            ));
        }
        for i in inputs {
            if pool.has_checkpoint(i.seq)? {
                return Err(invalid(
                    "inputs",
                    format!("sequence {}", i.seq),
                    "a sequence with an open rollback checkpoint records its rows on the host each step (decode it with Model::step)",
                ));
            }
        }
        let p = self.prepare_step(pool, inputs, &[])?;
        let signature = pool.inputs().signature();
        let current = graph
            .as_ref()
            .is_some_and(|g| g.arena.same_as(pool.inputs()) && g.signature == signature);
        #[cfg(deepinfer_cuda)]
        {
            let g = match graph {
                Some(g) if current => g,
                _ => {
                    // The old graph's memory goes before the new one's.
                    *graph = None;
                    graph.insert(self.capture_decode(cuda, &p, pool, signature)?)
                }
            };
            g.graph.launch()?;
            g.launches += 1;
            g.checks.verdict_replayed(&g.recorded)?;
            self.finish_step(pool, &p)?;
            Ok(StepOutput {
                // A copy: the next launch overwrites the graph's logits.
                logits: g.logits.clone(),
                features: None,
                rows: p.rows(),
                layers: vec![LayerTrace::default(); self.plans.len()],
                families: Vec::new(),
                parts: Vec::new(),
            })
        }
        #[cfg(not(deepinfer_cuda))]
        {
            let _ = (cuda, p, signature, current, graph);
            Err(crate::ops::kernels_not_built("Model::decode_graphed", &device).into())
        }
    }

    /// Captures the device half of the prepared step `p` into a new graph
    /// (not launched).
    #[cfg(deepinfer_cuda)]
    fn capture_decode(
        &self,
        cuda: &crate::device::CudaDevice,
        p: &super::forward::PreparedStep,
        pool: &mut StatePool,
        signature: Vec<UploadKey>,
    ) -> Result<DecodeGraph> {
        use crate::dtype::DType;
        use crate::tensor::Tensor;
        let rows = p.rows_total();
        let mut logits = Tensor::empty(&self.device(), DType::F32, &[rows, self.cfg.vocab_size])?;
        let mut checks = crate::ops::DeviceChecks::held(cuda)?;
        let mut failed = None;
        let arena = pool.inputs().clone();
        // SAFETY: the capture records this thread's work on the device's
        // stream, which only this thread uses while it runs (the model and
        // pool are borrowed here). Everything the graph reads or writes
        // outlives its launches: the weights (borrowed from `self`, which the
        // caller keeps with the graph: a replay happens only through
        // `self.decode_graphed`), the pool's device tensors and the arena's
        // slots (the graph holds the arena, and a replay needs the same pool
        // and an unchanged signature), and `logits` and the check slots,
        // which the graph holds.
        let made = unsafe {
            cuda.capture(|| {
                checks.rearm()?;
                let mut marks = super::marks::Marks::off();
                match self.run_step(p, pool, Capture::default(), &mut marks, &mut checks) {
                    Ok(ran) => logits.copy_rows_from(0, &ran.logits, 0, rows),
                    Err(e) => {
                        failed = Some(e);
                        Err(crate::Error::Unsupported {
                            op: "Model::decode_graphed",
                            device: cuda.to_string(),
                            why: "the step failed while it was captured",
                        })
                    }
                }
            })
        };
        if let Some(e) = failed {
            return Err(e);
        }
        let graph = made?;
        let recorded = checks.recorded();
        Ok(DecodeGraph {
            graph,
            arena,
            signature,
            logits,
            checks,
            recorded,
            launches: 0,
        })
    }
}

fn invalid(arg: &'static str, value: String, why: &'static str) -> crate::model::error::Error {
    crate::Error::Argument {
        op: "Model::decode_graphed",
        arg,
        value,
        why,
    }
    .into()
}
