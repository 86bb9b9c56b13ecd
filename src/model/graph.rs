//! Decode steps as CUDA graphs (issue 11, `docs/graph-decode.md`):
//! [`Model::decode_graphed`] runs the host half of a decode step as
//! [`Model::step`] does (claims, plans, uploads through the pool's step
//! arena), then replays a captured graph of the device half instead of
//! launching its ~1,500 kernels one by one.
//!
//! A step's signature is the model, the pool's arena, the split-K
//! scratch's generation (`ops::gemm_scratch_generation`), and the step's uploads
//! and fixed host values in order
//! ([`StepInputs::signature`](super::inputs::StepInputs::signature): dtype,
//! shape and device address of each upload, and values such as a top-k
//! width). A step whose signature is the captured graph's replays it. A
//! step whose signature is the previous step's (which ran eagerly, so every
//! cache and scratch buffer its launches need exists: nothing is allocated
//! outside the graph while capturing) is captured and launched. Any other
//! step runs eagerly, as does a step whose capture failed (nothing ran: a
//! capture only records) and the later steps of that signature. So a run of
//! decode steps of one shape costs one eager step and one capture, then
//! replays.
//!
//! Invariant: a graph is replayed only for the signature it was captured
//! with. Every host value the device half reads is an upload or a fixed
//! value of the signature, and every launch shape follows from them, so a
//! replay runs the step's own work. The graph's output and range-check
//! slots are allocated outside the capture and held with it; everything the
//! device half allocates inside the capture is freed inside it.

#[cfg(deepinfer_cuda)]
use super::forward::{Capture, LayerTrace};
use super::forward::{Model, SeqInput, StepOutput};
use super::inputs::{StepInputs, UploadKey};
use super::pool::StatePool;
use crate::model::error::Result;

/// What a step's device half depends on beyond its uploads' values.
#[derive(Clone, Debug, PartialEq)]
struct Key {
    /// `Model::id`.
    model: u64,
    arena: StepInputs,
    signature: Vec<UploadKey>,
    /// The split-K scratch's generation (`ops::gemm_scratch_generation`): the GEMM
    /// launches a graph captured read the scratch at its address then, which
    /// a later eager step may have freed for a larger buffer.
    scratch: u64,
}

impl PartialEq for StepInputs {
    fn eq(&self, other: &StepInputs) -> bool {
        self.same_as(other)
    }
}

/// A captured decode step and the signature it was captured for.
struct Captured {
    key: Key,
    #[cfg(deepinfer_cuda)]
    graph: crate::device::Graph,
    /// F32 `[B, vocab]`: the logits each launch writes.
    #[cfg(deepinfer_cuda)]
    logits: crate::tensor::Tensor,
    #[cfg(deepinfer_cuda)]
    checks: crate::ops::DeviceChecks,
    /// The range checks the capture recorded (each launch makes them).
    #[cfg(deepinfer_cuda)]
    recorded: Vec<(&'static str, &'static str)>,
}

/// How the steps of a [`DecodeGraph`] ran.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct GraphStats {
    /// The host halves' time (`Model::prepare_step`: claims, plans,
    /// uploads), summed over the steps.
    pub host: std::time::Duration,
    /// The replayed graphs' device time (CUDA events around each launch),
    /// summed over the replays.
    pub replay_device: std::time::Duration,
    /// Steps launched eagerly (a signature not seen on the step before, or
    /// one whose capture failed).
    pub eager: usize,
    /// Captures that failed (the step then ran eagerly, counted here only):
    /// a device half with a host copy, such as the indexer's per-entry
    /// passes of a batch whose padded keys pass `BATCHED_KEY_BYTES`.
    pub refused: usize,
    /// Steps captured, then launched.
    pub captured: usize,
    /// Steps replayed from the graph.
    pub replayed: usize,
}

/// The graph state of a run of decode steps ([`Model::decode_graphed`]):
/// the captured graph, if any, and the previous step's signature. One per
/// state pool.
#[derive(Default)]
pub struct DecodeGraph {
    captured: Option<Captured>,
    last: Option<Key>,
    /// The last signature whose capture failed (it runs eagerly).
    refused: Option<Key>,
    pub stats: GraphStats,
}

impl std::fmt::Debug for DecodeGraph {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DecodeGraph")
            .field("captured", &self.captured.is_some())
            .field("stats", &self.stats)
            .finish()
    }
}

impl DecodeGraph {
    pub fn new() -> DecodeGraph {
        DecodeGraph::default()
    }
}

impl Model {
    /// One decode step (one new token for each sequence of `inputs`, none
    /// with an open rollback checkpoint) on a CUDA device, its device half
    /// replayed from `graph`, captured into it, or launched eagerly, as the
    /// module doc says. The logits are those [`Model::step`] gives for the
    /// same step; nothing else is captured (`features` is `None`, `layers`
    /// empty traces, no timing).
    ///
    /// A graph replays the weights at the addresses it captured: after
    /// replacing a weight tensor of the model, start from a new
    /// [`DecodeGraph`].
    pub fn decode_graphed(
        &self,
        pool: &mut StatePool,
        inputs: &[SeqInput],
        graph: &mut DecodeGraph,
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
        let launching = self.launching();
        let start = std::time::Instant::now();
        let p = self.prepare_step(pool, inputs, &[])?;
        graph.stats.host += start.elapsed();
        let key = Key {
            model: self.id,
            arena: pool.inputs().clone(),
            signature: pool.inputs().signature(),
            scratch: crate::ops::gemm_scratch_generation(),
        };
        let seen = graph.last.replace(key.clone()).is_some_and(|k| k == key);
        let current = graph.captured.as_ref().is_some_and(|c| c.key == key);
        let refused = graph.refused.as_ref().is_some_and(|k| *k == key);
        if !current && (!seen || refused) {
            graph.stats.eager += 1;
            return self.run_prepared(pool, &p, super::forward::Capture::default());
        }
        #[cfg(deepinfer_cuda)]
        {
            let c = match &mut graph.captured {
                Some(c) if current => {
                    graph.stats.replayed += 1;
                    c
                }
                slot => {
                    // The old graph's memory goes before the new one's.
                    *slot = None;
                    // No other thread's launches may join the capture: its
                    // steps wait while this one is recorded.
                    drop(launching);
                    let capturing = self
                        .launches
                        .write()
                        .unwrap_or_else(std::sync::PoisonError::into_inner);
                    let made = self.capture_decode(cuda, &p, pool, key.clone());
                    drop(capturing);
                    match made {
                        Ok(c) => {
                            graph.stats.captured += 1;
                            slot.insert(c)
                        }
                        Err(e) => {
                            // Nothing ran: a capture only records. The step
                            // runs eagerly (an error of the step itself
                            // comes back from there), and so do the later
                            // steps of this signature.
                            tracing::debug!(error = %e, "decode step not capturable; eager");
                            graph.refused = Some(key);
                            graph.stats.refused += 1;
                            return self.run_prepared(pool, &p, super::forward::Capture::default());
                        }
                    }
                }
            };
            let stream = cuda.stream();
            let (a, b) = (cuda.event()?, cuda.event()?);
            a.record(&stream)?;
            c.graph.launch()?;
            b.record(&stream)?;
            c.checks.verdict_replayed(&c.recorded)?;
            if current {
                // The verdict waited for the launch.
                let ms = a.elapsed_ms(&b)?;
                graph.stats.replay_device +=
                    std::time::Duration::from_secs_f64(f64::from(ms) * 1e-3);
            }
            self.finish_step(pool, &p)?;
            Ok(StepOutput {
                // A copy: the next launch overwrites the graph's logits.
                logits: c.logits.clone(),
                features: None,
                rows: p.rows(),
                layers: vec![LayerTrace::default(); self.plans.len()],
                families: Vec::new(),
                parts: Vec::new(),
            })
        }
        #[cfg(not(deepinfer_cuda))]
        {
            let _ = (cuda, launching);
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
        key: Key,
    ) -> Result<Captured> {
        use crate::dtype::DType;
        use crate::tensor::Tensor;
        let rows = p.rows_total();
        let mut logits = Tensor::empty(&self.device(), DType::F32, &[rows, self.cfg.vocab_size])?;
        let mut checks = crate::ops::DeviceChecks::held(cuda)?;
        let mut failed = None;
        // SAFETY: the capture records this thread's work on the device's
        // stream, which no other step of this model uses while it runs (the
        // caller holds `Model::launches` for writing; every entry point
        // that launches the model's work holds it for reading), and the pool
        // is borrowed exclusively here. Everything the graph reads or writes
        // outlives its launches: the weights (a replay needs this model's
        // id, and a model's weights live as long as it), the pool's device
        // tensors and the arena's slots (the key holds the arena, and a
        // replay needs the same arena and an unchanged signature: the same
        // slot tensors), and `logits` and the check slots, which the graph
        // holds.
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
        Ok(Captured {
            key,
            graph,
            logits,
            checks,
            recorded,
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
