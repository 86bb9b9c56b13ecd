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
use super::forward::Capture;
use super::forward::{LayerTrace, Model, PreparedStep, SeqInput, StepAdvance, StepOutput};
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

/// A captured decode step and the signature it was captured for.
struct Captured {
    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
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
    /// The block the capture's temporaries were carved from (the replays
    /// write there), if the step's size was known and fitted.
    #[cfg(deepinfer_cuda)]
    capture_arena: Option<crate::device::CaptureArena>,
    /// Its allocations that found no room in that block.
    #[cfg(deepinfer_cuda)]
    arena_spills: usize,
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
    /// Every waited step's device time (CUDA events around its launch),
    /// summed.
    pub device: std::time::Duration,
    /// The device's idle time between consecutive waited steps (from one
    /// step's end event to the next one's start), summed over `gaps`: the
    /// host work between two launches that no launch covered.
    pub idle: std::time::Duration,
    pub gaps: usize,
    /// The census of the graph captured last (all 0 before any capture,
    /// or when the census failed; kept by `restart_stats`): its kernel
    /// nodes (a decode step's launch count, each a scheduling gap a replay
    /// pays), other nodes, kernel-to-kernel edges and programmatic (PDL)
    /// edges.
    pub graph: crate::device::GraphNodes,
    /// Bytes of that graph's capture arena (0: its temporaries came from
    /// the pool, as allocation and free nodes).
    pub arena_bytes: usize,
    /// Allocations of that capture that found no room in its arena (each
    /// an allocation and a free node), after one capture with a larger
    /// arena when the first spilled.
    pub arena_spills: usize,
}

/// The graph state of a run of decode steps ([`Model::decode_graphed`]):
/// the captured graph, if any, and the previous step's signature. One per
/// state pool.
#[derive(Default)]
pub struct DecodeGraph {
    captured: Option<Captured>,
    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    last: Option<Key>,
    /// The last signature whose capture failed (it runs eagerly).
    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    refused: Option<Key>,
    /// A step launched and not yet waited for (cleared when its
    /// [`LaunchedDecode`] is waited for or dropped).
    in_flight: std::sync::Arc<std::sync::atomic::AtomicBool>,
    /// A step launched and not yet advanced past: the next host half would
    /// claim its positions again.
    unadvanced: bool,
    /// The end of the last waited step's device work.
    last_end: Option<crate::device::Event>,
    /// The most bytes the last eager step held at once: the arena of the
    /// capture that follows it (a capture comes only after an eager step of
    /// its signature).
    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    eager_bytes: u64,
    pub stats: GraphStats,
}

/// The host half of a graphed decode step ([`Model::decode_prepare`]),
/// ready to launch.
pub struct DecodePrep {
    p: PreparedStep,
    model: u64,
    arena: StepInputs,
    /// The arena's signature after the step's uploads: a launch refuses a
    /// pool that prepared another step since.
    signature: Vec<UploadKey>,
}

/// A graphed decode step on the device ([`Model::decode_launch`]), not yet
/// waited for.
pub struct LaunchedDecode {
    /// Clears the graph's in-flight flag when the step is waited for or
    /// dropped.
    _flight: Flight,
    rows: Vec<std::ops::Range<usize>>,
    /// What advances the pool past the step, until it has.
    advance: Option<StepAdvance>,
    verdict: Verdict,
    /// Recorded before and after the launch.
    events: (crate::device::Event, crate::device::Event),
}

/// A graph's in-flight flag, held by its launched step.
struct Flight(std::sync::Arc<std::sync::atomic::AtomicBool>);

impl Drop for Flight {
    fn drop(&mut self) {
        self.0.store(false, std::sync::atomic::Ordering::Release);
    }
}

/// How a launched step's results and range checks are read.
enum Verdict {
    /// Launched op by op: its logits and its own checks.
    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    Eager {
        logits: crate::tensor::Tensor,
        checks: Box<crate::ops::DeviceChecks>,
    },
    /// Replayed (or captured and launched): a copy of the graph's logits and
    /// the checks the capture recorded, read from the graph's slots;
    /// `timed` when a replay (its device time goes to the statistics).
    #[cfg_attr(not(deepinfer_cuda), allow(dead_code))]
    Replayed {
        logits: crate::tensor::Tensor,
        recorded: Vec<(&'static str, &'static str)>,
        timed: bool,
    },
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

    /// Clears the statistics, and forgets the last step's end (the next
    /// waited step starts a new run of gaps).
    pub fn restart_stats(&mut self) {
        // The census describes the graph held, not the steps counted.
        self.stats = GraphStats {
            graph: self.stats.graph,
            arena_bytes: self.stats.arena_bytes,
            arena_spills: self.stats.arena_spills,
            ..GraphStats::default()
        };
        self.restart_gaps();
    }

    /// Forgets the last step's end: the time until the next waited step
    /// (other work of the caller's, such as a prefill) is not an idle gap.
    pub fn restart_gaps(&mut self) {
        self.last_end = None;
    }
}

impl Model {
    /// One decode step (one new token for each sequence of `inputs`, none
    /// with an open rollback checkpoint) on a CUDA device, its device half
    /// replayed from `graph`, captured into it, or launched eagerly, as the
    /// module doc says: [`Model::decode_prepare`], [`Model::decode_launch`]
    /// and [`Model::decode_wait`] in a row (the pool advances once the
    /// step's checks passed). The logits are those [`Model::step`] gives for
    /// the same step; nothing else is captured (`features` is `None`,
    /// `layers` empty traces, no timing).
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
        let prep = self.decode_prepare(pool, inputs, graph)?;
        let launched = self.decode_launch(pool, prep, graph)?;
        self.decode_wait(pool, launched, graph)
    }

    /// The host half of a graphed decode step ([`Model::decode_graphed`]):
    /// checks the inputs (one token a sequence, no open checkpoint) and
    /// makes every claim, plan and upload. Nothing is launched, so it may
    /// run while the previous step is still on the device once that step
    /// has advanced the pool ([`Model::decode_advance`]): the uploads are
    /// stream-ordered after its launches.
    pub fn decode_prepare(
        &self,
        pool: &mut StatePool,
        inputs: &[SeqInput],
        graph: &mut DecodeGraph,
    ) -> Result<DecodePrep> {
        let device = self.device();
        if !matches!(device, crate::device::Device::Cuda(_)) {
            return Err(crate::Error::Unsupported {
                op: "Model::decode_graphed",
                device: device.to_string(),
                why: "a CUDA graph needs a CUDA device",
            }
            .into());
        }
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
        if graph.unadvanced {
            return Err(invalid(
                "graph",
                "a launched step not advanced past".into(),
                "advance the pool past the launched step (Model::decode_advance or decode_wait) before preparing the next",
            ));
        }
        let _launching = self.launching();
        let start = std::time::Instant::now();
        let p = self.prepare_step(pool, inputs, &[])?;
        graph.stats.host += start.elapsed();
        Ok(DecodePrep {
            p,
            model: self.id,
            arena: pool.inputs().clone(),
            signature: pool.inputs().signature(),
        })
    }

    /// Sets the token of each sequence of the prepared step `prep`, which
    /// was prepared with placeholders (the engine prepares step N+1 while
    /// step N runs, then samples step N's tokens): the ids and Engram
    /// inputs are rewritten in place, so the step launches as if prepared
    /// with `tokens` (one per sequence, in the order of its inputs). A
    /// token outside the vocabulary is a typed error.
    pub fn decode_set_tokens(
        &self,
        pool: &StatePool,
        prep: &mut DecodePrep,
        tokens: &[u32],
    ) -> Result<()> {
        self.check_prep(pool, prep)?;
        self.set_step_tokens(pool, &mut prep.p, tokens)
    }

    /// That `prep` was prepared by this model on `pool`.
    fn check_prep(&self, pool: &StatePool, prep: &DecodePrep) -> Result<()> {
        if prep.model != self.id || !prep.arena.same_as(pool.inputs()) {
            return Err(invalid(
                "prep",
                "another model or pool".into(),
                "a prepared step is used on the model and pool that prepared it",
            ));
        }
        Ok(())
    }

    /// Launches the device half of the prepared step `prep` on the model's
    /// stream (replayed, captured then launched, or eagerly) and returns
    /// without waiting for it. The step's inputs go back to the pool's
    /// arena: the next step's host half refills them in stream order, after
    /// this step's launches. One launched step per graph at a time (wait
    /// for it first), and `prep` must be the pool's latest prepared step.
    pub fn decode_launch(
        &self,
        pool: &mut StatePool,
        prep: DecodePrep,
        graph: &mut DecodeGraph,
    ) -> Result<LaunchedDecode> {
        if graph.in_flight.load(std::sync::atomic::Ordering::Acquire) {
            return Err(invalid(
                "graph",
                "a launched step".into(),
                "wait for the graph's launched step (Model::decode_wait) before launching another",
            ));
        }
        self.check_prep(pool, &prep)?;
        if prep.signature != pool.inputs().signature() {
            return Err(invalid(
                "prep",
                "a step prepared before the pool's latest".into(),
                "the pool prepared another step since: prepare this one again",
            ));
        }
        #[cfg(deepinfer_cuda)]
        {
            let launched = self.launch_cuda(pool, prep.p, prep.signature, graph)?;
            graph.unadvanced = true;
            Ok(launched)
        }
        #[cfg(not(deepinfer_cuda))]
        {
            let _ = (pool, prep.p, prep.signature);
            Err(crate::ops::kernels_not_built("Model::decode_launch", &self.device()).into())
        }
    }

    /// [`Model::decode_launch`] on a CUDA build.
    #[cfg(deepinfer_cuda)]
    /// `signature`: the arena's signature after `p`'s uploads (checked by
    /// the caller to be the pool's current one).
    fn launch_cuda(
        &self,
        pool: &mut StatePool,
        p: PreparedStep,
        signature: Vec<UploadKey>,
        graph: &mut DecodeGraph,
    ) -> Result<LaunchedDecode> {
        let device = self.device();
        let crate::device::Device::Cuda(cuda) = &device else {
            return Err(crate::Error::Unsupported {
                op: "Model::decode_launch",
                device: device.to_string(),
                why: "a CUDA graph needs a CUDA device",
            }
            .into());
        };
        let key = Key {
            model: self.id,
            arena: pool.inputs().clone(),
            signature,
            scratch: crate::ops::gemm_scratch_generation(),
        };
        let seen = graph.last.replace(key.clone()).is_some_and(|k| k == key);
        let current = graph.captured.as_ref().is_some_and(|c| c.key == key);
        let refused = graph.refused.as_ref().is_some_and(|k| *k == key);
        let eager = !current && (!seen || refused);
        if !eager && !current {
            // The old graph's memory goes before the new one's.
            graph.captured = None;
            // No other thread's launches may join the capture: its steps
            // wait while this one is recorded.
            let capturing = self
                .launches
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner);
            let made = self.capture_decode(cuda, &p, pool, key.clone(), graph.eager_bytes);
            drop(capturing);
            match made {
                Ok(c) => {
                    graph.stats.captured += 1;
                    // A statistic only: a failed census leaves the fields at
                    // 0 and the graph in use.
                    let nodes = c.graph.nodes().unwrap_or_else(|e| {
                        tracing::warn!(error = %e, "graph node census failed");
                        crate::device::GraphNodes::default()
                    });
                    graph.stats.graph = nodes;
                    graph.stats.arena_bytes = c.capture_arena.as_ref().map_or(0, |a| a.bytes());
                    graph.stats.arena_spills = c.arena_spills;
                    graph.captured = Some(c);
                }
                Err(e) => {
                    // Nothing ran: a capture only records. The step runs
                    // eagerly (an error of the step itself comes back from
                    // there), and so do the later steps of this signature.
                    tracing::debug!(error = %e, "decode step not capturable; eager");
                    graph.refused = Some(key.clone());
                    graph.stats.refused += 1;
                }
            }
        }
        let _launching = self.launching();
        let stream = cuda.stream();
        let (start, end) = (cuda.event()?, cuda.event()?);
        start.record(&stream)?;
        let verdict = match &graph.captured {
            Some(c) if !eager && c.key == key => {
                if current {
                    graph.stats.replayed += 1;
                }
                c.graph.launch()?;
                // A copy: the next launch overwrites the graph's logits.
                Verdict::Replayed {
                    logits: c.logits.clone(),
                    recorded: c.recorded.clone(),
                    timed: current,
                }
            }
            _ => {
                if eager {
                    graph.stats.eager += 1;
                }
                let mut checks = crate::ops::DeviceChecks::new();
                let mut marks = super::marks::Marks::off();
                let (ran, peak) = cuda.track_peak(|| {
                    self.run_step(&p, pool, Capture::default(), &mut marks, &mut checks)
                });
                let ran = ran?;
                graph.eager_bytes = peak;
                Verdict::Eager {
                    logits: ran.logits,
                    checks: Box::new(checks),
                }
            }
        };
        end.record(&stream)?;
        graph
            .in_flight
            .store(true, std::sync::atomic::Ordering::Release);
        Ok(LaunchedDecode {
            _flight: Flight(std::sync::Arc::clone(&graph.in_flight)),
            rows: p.rows(),
            advance: Some(p.advance_list()),
            verdict,
            events: (start, end),
        })
        // `p` drops here: its inputs go back to the arena.
    }

    /// Advances the pool past the launched step `l` (host bookkeeping: the
    /// sequences' positions and Engram history), before its checks are
    /// read, so that the next step's host half ([`Model::decode_prepare`])
    /// can run while `l` is on the device. Should `l`'s checks then fail,
    /// [`Model::decode_wait`] reports it and its sequences stay advanced
    /// past a step whose results are invalid: free them. A second call does
    /// nothing.
    pub fn decode_advance(
        &self,
        pool: &mut StatePool,
        l: &mut LaunchedDecode,
        graph: &mut DecodeGraph,
    ) -> Result<()> {
        if let Some(a) = &l.advance {
            a.apply(pool)?;
            l.advance = None;
        }
        graph.unadvanced = false;
        Ok(())
    }

    /// Waits for the launched step `l`, reads its range checks, advances
    /// the pool past it (unless [`Model::decode_advance`] did already) and
    /// returns its logits. Also adds the step's device time and the
    /// device's idle time since the graph's previous step to the
    /// statistics.
    pub fn decode_wait(
        &self,
        pool: &mut StatePool,
        l: LaunchedDecode,
        graph: &mut DecodeGraph,
    ) -> Result<StepOutput> {
        // Past this wait the pool is either advanced or, should the checks
        // fail, keeps the positions it had (as a failed `Model::step`).
        graph.unadvanced = false;
        let LaunchedDecode {
            _flight,
            rows,
            advance,
            verdict,
            events: (start, end),
        } = l;
        let logits = match verdict {
            Verdict::Eager { logits, mut checks } => {
                checks.verdict()?;
                logits
            }
            Verdict::Replayed {
                logits,
                recorded,
                timed,
            } => {
                #[cfg(deepinfer_cuda)]
                {
                    let c = graph.captured.as_mut().ok_or_else(|| {
                        invalid(
                            "graph",
                            "no captured graph".into(),
                            "the graph that launched the step is gone",
                        )
                    })?;
                    c.checks.verdict_replayed(&recorded)?;
                }
                #[cfg(not(deepinfer_cuda))]
                let _ = recorded;
                if timed {
                    // The verdict waited for the launch.
                    graph.stats.replay_device += span(&start, &end)?;
                }
                logits
            }
        };
        if let Some(a) = advance {
            a.apply(pool)?;
        }
        // Both events are complete: the step's device time, and the gap
        // since the previous step's end.
        graph.stats.device += span(&start, &end)?;
        if let Some(prev) = &graph.last_end {
            graph.stats.idle += span(prev, &start)?;
            graph.stats.gaps += 1;
        }
        graph.last_end = Some(end);
        Ok(StepOutput {
            logits,
            features: None,
            rows,
            layers: vec![LayerTrace::default(); self.plans.len()],
            families: Vec::new(),
            parts: Vec::new(),
        })
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
        eager_bytes: u64,
    ) -> Result<Captured> {
        use crate::dtype::DType;
        use crate::tensor::Tensor;
        let rows = p.rows_total();
        let mut logits = Tensor::empty(&self.device(), DType::F32, &[rows, self.cfg.vocab_size])?;
        let mut checks = crate::ops::DeviceChecks::held(cuda)?;
        let mut failed = None;
        // The temporaries of the captured step are carved from one block
        // (freed ranges reused, best fit), so the graph holds no allocation
        // or free node between its kernels. Its size: the same signature's
        // eager step's peak (a capture allocates the same buffers in the
        // same order) and a quarter and 1 MiB more for fragmentation; an
        // allocation that still does not fit comes from the pool, and then
        // the step is captured once more in a block larger by twice the
        // bytes that spilled (the same allocations in the same order).
        // Without a block (more than half the free memory, or a failed
        // allocation) the pool serves everything, as before arenas.
        let block = |want: usize| {
            Some(want)
                .filter(|&want| cuda.memory_info().is_ok_and(|(free, _)| want <= free / 2))
                .and_then(|want| cuda.capture_arena(want).ok())
        };
        let mut arena = usize::try_from(eager_bytes)
            .ok()
            .filter(|&b| b > 0)
            .map(|b| b.saturating_add(b / 4).saturating_add(1 << 20))
            .and_then(block);
        // SAFETY: the capture records this thread's work on the device's
        // stream, which no other step of this model uses while it runs (the
        // caller holds `Model::launches` for writing; every entry point
        // that launches the model's work holds it for reading), and the pool
        // is borrowed exclusively here. Everything the graph reads or writes
        // outlives its launches: the weights (a replay needs this model's
        // id, and a model's weights live as long as it), the pool's device
        // tensors and the arena's slots (the key holds the arena, and a
        // replay needs the same arena and an unchanged signature: the same
        // slot tensors), and `logits`, the check slots and the capture
        // arena, which the graph holds.
        let mut capture = || unsafe {
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
        let (mut arena_spills, mut retried) = (0, false);
        let made = loop {
            let Some(a) = arena.clone() else {
                break capture();
            };
            match cuda.with_arena(&a, &mut capture)? {
                // A carved buffer outlived the capture: each replay would
                // rewrite its bytes. Refused, so the signature runs eagerly.
                (_, r) if !r.clean => {
                    break Err(crate::Error::Unsupported {
                        op: "Model::decode_graphed",
                        device: cuda.to_string(),
                        why: "a buffer carved during the capture outlived it",
                    });
                }
                (Ok(g), r) if r.spills > 0 && !retried => {
                    retried = true;
                    match block(a.bytes().saturating_add(r.spilled_bytes.saturating_mul(2))) {
                        Some(b) => {
                            // Never launched: a capture only records.
                            drop(g);
                            arena = Some(b);
                        }
                        None => {
                            arena_spills = r.spills;
                            break Ok(g);
                        }
                    }
                }
                (made, r) => {
                    arena_spills = r.spills;
                    break made;
                }
            }
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
            capture_arena: arena,
            arena_spills,
        })
    }
}

/// The time from event `a` to event `b` (both complete), at least 0.
fn span(a: &crate::device::Event, b: &crate::device::Event) -> Result<std::time::Duration> {
    Ok(std::time::Duration::from_secs_f64(
        f64::from(a.elapsed_ms(b)?.max(0.0)) * 1e-3,
    ))
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
