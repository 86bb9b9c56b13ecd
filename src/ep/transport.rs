//! How the ranks of an expert-parallel group exchange tensors: the
//! [`Transport`] trait (one all-to-all-v collective), the [`Local`]
//! transport of a one-rank group (on any device), and [`SimWorld`], which
//! runs R ranks as R threads of one process over host tensors: the stand-in
//! for a multi-GPU group in tests and on machines with one GPU.
//!
//! Invariant: a collective either completes on every rank or fails on every
//! rank still in it. A rank that leaves (returns, errors or panics) while
//! others wait in a collective aborts the world, and every waiting rank gets
//! a typed error naming it: never a hang.

use crate::error::{Error, Result};
use crate::tensor::Tensor;
use std::sync::{Condvar, Mutex, MutexGuard};

/// The collective the EP dispatch and combine are built on.
pub trait Transport {
    /// This rank, in `0..world()`.
    fn rank(&self) -> usize;
    /// The ranks in the group.
    fn world(&self) -> usize;
    /// Sends `send[d]` to rank d (one tensor per rank, `send.len() ==
    /// world()`) and returns what each rank s sent to this one, `recv[s]`
    /// (shapes and dtypes as sent). Every rank calls it, in the same order
    /// as the other collectives.
    fn all_to_all_v(&self, send: Vec<Tensor>) -> Result<Vec<Tensor>>;
    /// This rank failed on its own (`why`): it takes part in the next
    /// collective as a failure, so every rank in it returns a typed error
    /// instead of waiting for this one.
    fn abort(&self, why: &str);
}

fn wrong_count(op: &'static str, got: usize, world: usize) -> Error {
    Error::Argument {
        op,
        arg: "send",
        value: format!("{got} tensors"),
        why: if got < world {
            "fewer tensors than ranks"
        } else {
            "more tensors than ranks"
        },
    }
}

/// The transport of a one-rank group: what it sends is what it receives,
/// on whatever device the tensors live (no copy).
#[derive(Clone, Copy, Debug, Default)]
pub struct Local;

impl Transport for Local {
    fn rank(&self) -> usize {
        0
    }

    fn world(&self) -> usize {
        1
    }

    fn all_to_all_v(&self, send: Vec<Tensor>) -> Result<Vec<Tensor>> {
        if send.len() != 1 {
            return Err(wrong_count("ep::Local::all_to_all_v", send.len(), 1));
        }
        Ok(send)
    }

    /// No peer waits for a one-rank group.
    fn abort(&self, _why: &str) {}
}

/// The shared state of a simulated world.
struct World {
    size: usize,
    state: Mutex<State>,
    turn: Condvar,
}

struct State {
    /// `mail[dst][src]`: what src sent dst in the current collective.
    mail: Vec<Vec<Option<Tensor>>>,
    /// Ranks arrived at the current barrier.
    arrived: usize,
    /// Barriers completed (a waiting rank leaves when it moves).
    generation: u64,
    /// Why the world stopped, once it has.
    aborted: Option<String>,
}

impl World {
    fn lock(&self) -> Result<MutexGuard<'_, State>> {
        self.state
            .lock()
            .map_err(|_| aborted("a rank panicked holding the world's lock"))
    }

    /// Waits until every rank has arrived; fails when the world aborted or a
    /// rank has left.
    fn barrier<'a>(&'a self, mut st: MutexGuard<'a, State>) -> Result<MutexGuard<'a, State>> {
        check(&st)?;
        st.arrived += 1;
        if st.arrived == self.size {
            st.arrived = 0;
            st.generation += 1;
            self.turn.notify_all();
            return Ok(st);
        }
        let generation = st.generation;
        let st = self
            .turn
            .wait_while(st, |s| s.generation == generation && s.aborted.is_none())
            .map_err(|_| aborted("a rank panicked holding the world's lock"))?;
        if st.generation == generation {
            check(&st)?;
        }
        Ok(st)
    }

    /// Marks `rank` as gone: ranks waiting in a barrier, and any that
    /// arrive later, abort.
    fn leave(&self, rank: usize, why: String) {
        // Once a rank has left, no barrier can complete: the world stops (a
        // rank past its last barrier has already moved on).
        self.stop(format!("rank {rank} left ({why})"));
    }

    /// Stops the world for `why` (the first reason stays) and wakes every
    /// waiting rank.
    fn stop(&self, why: String) {
        // A poisoned lock still holds the state.
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        if st.aborted.is_none() {
            st.aborted = Some(why);
        }
        self.turn.notify_all();
    }
}

fn aborted(why: impl Into<String>) -> Error {
    Error::Collective {
        during: "ep::SimWorld".into(),
        why: why.into(),
    }
}

fn check(st: &State) -> Result<()> {
    match &st.aborted {
        Some(why) => Err(aborted(why.clone())),
        None => Ok(()),
    }
}

/// One rank of a [`SimWorld`].
pub struct SimRank<'w> {
    rank: usize,
    world: &'w World,
}

impl Transport for SimRank<'_> {
    fn rank(&self) -> usize {
        self.rank
    }

    fn abort(&self, why: &str) {
        self.world.stop(format!("rank {} failed: {why}", self.rank));
    }

    fn world(&self) -> usize {
        self.world.size
    }

    fn all_to_all_v(&self, send: Vec<Tensor>) -> Result<Vec<Tensor>> {
        let w = self.world;
        if send.len() != w.size {
            return Err(wrong_count("ep::SimRank::all_to_all_v", send.len(), w.size));
        }
        if let Some(t) = send
            .iter()
            .find(|t| !matches!(t.device(), crate::device::Device::Cpu))
        {
            return Err(Error::DeviceMismatch {
                op: "ep::SimRank::all_to_all_v",
                tensor: "send",
                got: t.device().to_string(),
                expected: "cpu (a simulated world moves host tensors)".into(),
            });
        }
        let mut st = w.lock()?;
        check(&st)?;
        for (dst, t) in send.into_iter().enumerate() {
            if let Some(slot) = st.mail.get_mut(dst).and_then(|m| m.get_mut(self.rank)) {
                *slot = Some(t);
            }
        }
        // Everyone has posted; take this rank's mail, then wait until every
        // rank has taken its own before the next collective may post.
        let mut st = w.barrier(st)?;
        let mine: Option<Vec<Tensor>> = st
            .mail
            .get_mut(self.rank)
            .map(|m| m.iter_mut().filter_map(Option::take).collect());
        let _st = w.barrier(st)?;
        match mine {
            Some(v) if v.len() == w.size => Ok(v),
            _ => Err(aborted("a rank's mail was incomplete")),
        }
    }
}

/// R ranks as R threads over host tensors.
pub struct SimWorld;

impl SimWorld {
    /// Runs `f` on every rank of a world of `size` (1 ≤ size ≤ 1024), each
    /// on its own thread, and returns the ranks' results in rank order. The
    /// first error (or a panic, as an error) of any rank is returned after
    /// every rank has finished; the others fail their next collective.
    pub fn run<T, F>(size: usize, f: F) -> Result<Vec<T>>
    where
        T: Send,
        F: Fn(&SimRank<'_>) -> Result<T> + Sync,
    {
        if !(1..=1024).contains(&size) {
            return Err(Error::Argument {
                op: "ep::SimWorld::run",
                arg: "size",
                value: size.to_string(),
                why: "a simulated world has 1 to 1024 ranks",
            });
        }
        let world = World {
            size,
            state: Mutex::new(State {
                mail: (0..size).map(|_| vec![None; size]).collect(),
                arrived: 0,
                generation: 0,
                aborted: None,
            }),
            turn: Condvar::new(),
        };
        let results: Vec<Result<T>> = std::thread::scope(|s| {
            let mut handles = Vec::with_capacity(size);
            for rank in 0..size {
                let (world, f) = (&world, &f);
                let spawned = std::thread::Builder::new()
                    .name(format!("ep-rank-{rank}"))
                    .spawn_scoped(s, move || {
                        let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                            f(&SimRank { rank, world })
                        }));
                        let r = r.unwrap_or_else(|payload| {
                            let what = payload
                                .downcast_ref::<&str>()
                                .map(|s| s.to_string())
                                .or_else(|| payload.downcast_ref::<String>().cloned())
                                .unwrap_or_default();
                            Err(aborted(format!("rank {rank} panicked: {what}")))
                        });
                        let why = match &r {
                            Ok(_) => "it returned".to_string(),
                            Err(e) => format!("error: {e}"),
                        };
                        world.leave(rank, why);
                        r
                    });
                match spawned {
                    Ok(h) => handles.push(Ok(h)),
                    Err(e) => {
                        // The ranks already started fail at their next barrier.
                        let why = format!("rank {rank} could not start: {e}");
                        world.stop(why.clone());
                        handles.push(Err(Error::Argument {
                            op: "ep::SimWorld::run",
                            arg: "size",
                            value: size.to_string(),
                            why: "the system refused a rank's thread",
                        }));
                        break;
                    }
                }
            }
            handles
                .into_iter()
                .map(|h| match h {
                    Ok(h) => h
                        .join()
                        .unwrap_or_else(|_| Err(aborted("a rank's thread panicked"))),
                    Err(e) => Err(e),
                })
                .collect()
        });
        // The root cause first: a rank's own error before the aborts it
        // caused in the others.
        let mut out = Vec::with_capacity(size);
        let mut first_abort = None;
        let mut first_error = None;
        for r in results {
            match r {
                Ok(v) => out.push(v),
                Err(e) => {
                    let is_abort =
                        matches!(&e, Error::Collective { during, .. } if during == "ep::SimWorld");
                    let slot = if is_abort {
                        &mut first_abort
                    } else {
                        &mut first_error
                    };
                    slot.get_or_insert(e);
                }
            }
        }
        match first_error.or(first_abort) {
            Some(e) => Err(e),
            None => Ok(out),
        }
    }
}
