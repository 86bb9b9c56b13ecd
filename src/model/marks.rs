//! Op-family timing of a step (`Capture::timing`): the forward marks the end
//! of each op family (embedding, Engram, mHC, attention, MoE, head) as it
//! issues it — a CUDA event recorded on the device's stream, or the host
//! clock on the CPU — and the time between consecutive marks is charged to
//! the family of the later one.
//!
//! Invariant: a [`Marks`] that is off records nothing and costs nothing; on
//! a GPU the marks only record events on the stream the ops run on (no
//! synchronisation until [`Marks::totals`], which waits for the last one).

use crate::device::{Device, Event, Stream};
use crate::model::error::Result;
use std::time::Instant;

/// One mark: the moment a family's work ended.
enum Mark {
    Cuda(Event),
    Host(Instant),
}

/// The marks of one step, in issue order.
pub(crate) struct Marks {
    device: Option<Device>,
    stream: Option<Stream>,
    marks: Vec<(&'static str, Mark)>,
}

impl Marks {
    /// Marks on `device` when `on`; the first mark ("start") is taken now.
    pub(crate) fn new(device: &Device, on: bool) -> Result<Marks> {
        let mut m = Marks {
            device: on.then(|| device.clone()),
            stream: match device {
                Device::Cuda(d) if on => Some(d.stream()),
                _ => None,
            },
            marks: Vec::new(),
        };
        m.mark("start")?;
        Ok(m)
    }

    /// Ends the work of `family` issued since the previous mark.
    pub(crate) fn mark(&mut self, family: &'static str) -> Result<()> {
        let mark = match (&self.device, &self.stream) {
            (None, _) => return Ok(()),
            (Some(Device::Cuda(d)), Some(stream)) => {
                let event = d.event()?;
                event.record(stream)?;
                Mark::Cuda(event)
            }
            (Some(_), _) => Mark::Host(Instant::now()),
        };
        self.marks.push((family, mark));
        Ok(())
    }

    /// Milliseconds per family, summed over the step, in the order the
    /// families first ended (empty when off). Waits for the device.
    pub(crate) fn totals(&self) -> Result<Vec<(&'static str, f64)>> {
        let mut totals: Vec<(&'static str, f64)> = Vec::new();
        for pair in self.marks.windows(2) {
            let [(_, a), (family, b)] = pair else {
                continue;
            };
            let ms = match (a, b) {
                (Mark::Cuda(a), Mark::Cuda(b)) => f64::from(a.elapsed_ms(b)?),
                (Mark::Host(a), Mark::Host(b)) => b.duration_since(*a).as_secs_f64() * 1e3,
                _ => 0.0,
            };
            match totals.iter_mut().find(|(f, _)| f == family) {
                Some((_, sum)) => *sum += ms,
                None => totals.push((family, ms)),
            }
        }
        Ok(totals)
    }
}
