//! Op timing of a step (`Capture::timing`): the forward marks the end of
//! each op part (`embed`, `mhc`, `attention.query`, `attention.kv`,
//! `attention.index`, `attention.lists`, `attention.mqa`, `attention.out`,
//! `moe.route`, `moe.experts`, `moe.shared`, `moe.combine`, `engram`,
//! `head`) as it issues it. Each mark is a CUDA event recorded on the
//! device's stream (the host clock on the CPU) and the host clock at the
//! moment the host issued it, and the time between consecutive marks is
//! charged to the later one's part: on the device clock what the GPU spent
//! (or idled waiting for the host), on the host clock what issuing took.
//! A family is a part's name up to its first dot.
//!
//! Invariant: a [`Marks`] that is off records nothing and costs nothing; on
//! a GPU the marks only record events on the stream the ops run on (no
//! synchronisation until [`Marks::parts`], which waits for the last one).

use crate::device::{Device, Event, Stream};
use crate::model::error::Result;
use std::time::Instant;

/// One mark: the moment a part's work ended on the device (an event) or
/// the host (no event), and when the host issued it.
struct Mark {
    event: Option<Event>,
    host: Instant,
}

/// The marks of one step, in issue order.
pub(crate) struct Marks {
    device: Option<Device>,
    stream: Option<Stream>,
    marks: Vec<(&'static str, Mark)>,
}

/// Milliseconds of one part: on the device's clock and on the host's.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PartTime {
    pub device_ms: f64,
    pub host_ms: f64,
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

    /// Marks that record nothing.
    pub(crate) fn off() -> Marks {
        Marks {
            device: None,
            stream: None,
            marks: Vec::new(),
        }
    }

    /// Ends the work of `part` issued since the previous mark.
    pub(crate) fn mark(&mut self, part: &'static str) -> Result<()> {
        let event = match (&self.device, &self.stream) {
            (None, _) => return Ok(()),
            (Some(Device::Cuda(d)), Some(stream)) => {
                let event = d.event()?;
                event.record(stream)?;
                Some(event)
            }
            (Some(_), _) => None,
        };
        self.marks.push((
            part,
            Mark {
                event,
                host: Instant::now(),
            },
        ));
        Ok(())
    }

    /// Per part, summed over the step, in the order the parts first ended
    /// (empty when off). Waits for the device.
    pub(crate) fn parts(&self) -> Result<Vec<(&'static str, PartTime)>> {
        let mut parts: Vec<(&'static str, PartTime)> = Vec::new();
        for pair in self.marks.windows(2) {
            let [(_, a), (part, b)] = pair else {
                continue;
            };
            let host_ms = b.host.duration_since(a.host).as_secs_f64() * 1e3;
            let device_ms = match (&a.event, &b.event) {
                (Some(a), Some(b)) => f64::from(a.elapsed_ms(b)?),
                _ => host_ms,
            };
            match parts.iter_mut().find(|(p, _)| p == part) {
                Some((_, t)) => {
                    t.device_ms += device_ms;
                    t.host_ms += host_ms;
                }
                None => parts.push((part, PartTime { device_ms, host_ms })),
            }
        }
        Ok(parts)
    }

    /// Device milliseconds per family (a part's name up to its first dot),
    /// in the order the families first ended (empty when off).
    pub(crate) fn totals(parts: &[(&'static str, PartTime)]) -> Vec<(&'static str, f64)> {
        let mut totals: Vec<(&'static str, f64)> = Vec::new();
        for (part, t) in parts {
            let family = part.split('.').next().unwrap_or(part);
            match totals.iter_mut().find(|(f, _)| *f == family) {
                Some((_, sum)) => *sum += t.device_ms,
                None => totals.push((family, t.device_ms)),
            }
        }
        totals
    }
}
