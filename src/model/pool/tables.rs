//! The KV sources' block tables kept on the device (issue 11): per source,
//! one I32 tensor `[rows, width]` of its compressed entries' pages and, for
//! a source owning index keys, one of its keys' pages, a row per sequence
//! slot. Column c of a slot's row holds the physical page of logical page c,
//! −1 where the sequence holds none (past its pages, or below a table's
//! first page). A host mirror of every tensor says what the device holds.
//!
//! A step's host half then uploads no table: [`StatePool::sync_tables`]
//! rewrites only the rows whose pages changed since they were last written
//! (a decode step: a row when a sequence starts a page), and the device half
//! gathers the step's rows by slot ([`StatePool::step_pages`]). Before, the
//! host rebuilt and uploaded every table of every step, which took 44 ms of
//! a 98 ms decode step at batch 256 and 128K context (`docs/wide-ep.md`).
//!
//! Invariants, after `sync_tables(seqs)`:
//! - every table's width is the most pages (logical end) any live sequence
//!   holds in it (at least 1), and its rows cover every live slot: a change
//!   of either reallocates the tensor and writes it whole;
//! - the device row of each slot of `seqs` equals its mirror row, which is
//!   that sequence's table as above; rows of other slots may be stale and
//!   are never read (a step gathers only its own sequences' slots).

use super::{BlockTable, SeqId, StatePool};
use crate::device::Device;
use crate::dtype::DType;
use crate::error::Error as OpError;
use crate::model::error::Result;
use crate::tensor::Tensor;

/// Which table of a source.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum TableKind {
    /// The compressed entries' pages.
    Entries,
    /// The index keys' pages.
    Keys,
}

/// One device table and its host mirror.
pub(super) struct Mirror {
    host: Vec<i32>,
    device: Tensor,
    rows: usize,
    width: usize,
}

/// Rows rewritten one at a time up to this many; more are one whole write.
const ROW_WRITES: usize = 8;

impl Mirror {
    fn new(device: &Device) -> Result<Mirror> {
        Ok(Mirror {
            host: vec![-1],
            device: Tensor::from_vec(vec![-1i32], &[1, 1])?.to_device(device)?,
            rows: 1,
            width: 1,
        })
    }

    /// The device table, I32 `[rows, width]`.
    pub(super) fn tensor(&self) -> &Tensor {
        &self.device
    }

    /// Slot `slot`'s row of `t` (logical page c in column c, −1 for none)
    /// into `row` (the mirror's width, which covers `t`).
    fn fill(row: &mut [i32], t: &BlockTable) -> Result<()> {
        row.fill(-1);
        for (i, &p) in t.pages.iter().enumerate() {
            // The pool keeps every page number below 2^31 (`phys_i32`).
            let page = super::phys_i32(p as usize)?;
            if let Some(c) = row.get_mut(t.first + i) {
                *c = page;
            }
        }
        Ok(())
    }

    /// [`Mirror::write`], and on an error a mirror that no longer claims
    /// any row (0 rows): the next sync reallocates and writes it whole, so a
    /// failed device write never leaves a row the mirror calls current.
    fn sync(
        &mut self,
        device: &Device,
        rows: usize,
        width: usize,
        step: &[(usize, &BlockTable)],
    ) -> Result<()> {
        let r = self.write(device, rows, width, step);
        if r.is_err() {
            self.rows = 0;
        }
        r
    }

    /// Makes the device rows of `step` (slot, table) equal their tables,
    /// with `rows` × `width` the shape every live table needs.
    fn write(
        &mut self,
        device: &Device,
        rows: usize,
        width: usize,
        step: &[(usize, &BlockTable)],
    ) -> Result<()> {
        let fresh = (rows, width) != (self.rows, self.width);
        if fresh {
            let n = rows.checked_mul(width).ok_or(OpError::Argument {
                op: "StatePool::sync_tables",
                arg: "pages",
                value: format!("{rows} slots × {width} pages"),
                why: "a block table larger than memory can index",
            })?;
            // Rows of slots outside the step are written by the step that
            // reads them; until then they hold no page.
            let mut host = crate::device::host_alloc(
                "StatePool::sync_tables (the block tables' host mirror)",
                n.saturating_mul(4),
                || {
                    let mut v = Vec::new();
                    v.try_reserve_exact(n).ok()?;
                    Some(v)
                },
            )?;
            host.resize(n, -1);
            // Written whole below, once the step's rows are in the mirror.
            *self = Mirror {
                host,
                device: Tensor::empty(device, DType::I32, &[rows, width])?,
                rows,
                width,
            };
        }
        let mut row = vec![-1i32; width];
        let mut changed = Vec::new();
        for &(slot, t) in step {
            Mirror::fill(&mut row, t)?;
            let old = self
                .host
                .get_mut(slot * width..(slot + 1) * width)
                .ok_or_else(|| slot_error(slot, rows))?;
            if *old != *row {
                old.copy_from_slice(&row);
                changed.push(slot);
            }
        }
        if fresh || changed.len() > ROW_WRITES {
            self.device.write_from(&self.host)?;
        } else {
            for slot in changed {
                let r = self
                    .host
                    .get(slot * width..(slot + 1) * width)
                    .ok_or_else(|| slot_error(slot, rows))?;
                self.device.write_rows_from(slot, r)?;
            }
        }
        Ok(())
    }
}

fn slot_error(slot: usize, rows: usize) -> OpError {
    OpError::Argument {
        op: "StatePool::sync_tables",
        arg: "slot",
        value: format!("{slot} of {rows} rows"),
        why: "a sequence slot outside the block table",
    }
}

/// The device tables of every source: `entries[i]`, and `keys[i]` for a
/// source owning index keys.
pub(super) struct DeviceTables {
    entries: Vec<Mirror>,
    keys: Vec<Option<Mirror>>,
}

impl DeviceTables {
    pub(super) fn new(device: &Device, keys: &[bool]) -> Result<DeviceTables> {
        Ok(DeviceTables {
            entries: keys
                .iter()
                .map(|_| Mirror::new(device))
                .collect::<Result<_>>()?,
            keys: keys
                .iter()
                .map(|&k| k.then(|| Mirror::new(device)).transpose())
                .collect::<Result<_>>()?,
        })
    }
}

impl StatePool {
    /// Brings the device tables of every source up to date for a step over
    /// `seqs` (see the module doc), and records each table in the step's
    /// signature (`inputs`): its device half reads them in place.
    pub(crate) fn sync_tables(&mut self, seqs: &[SeqId]) -> Result<()> {
        let device = self.device();
        let rows = self
            .seqs
            .values()
            .map(|s| s.slot + 1)
            .max()
            .unwrap_or(1)
            .next_power_of_two()
            .min(self.cfg.max_seqs.max(1));
        for src in 0..self.sources.len() {
            for kind in [TableKind::Entries, TableKind::Keys] {
                fn table(s: &super::Sequence, kind: TableKind, src: usize) -> Option<&BlockTable> {
                    match kind {
                        TableKind::Entries => s.entries.get(src),
                        TableKind::Keys => s.keys.get(src),
                    }
                }
                let width = self
                    .seqs
                    .values()
                    .filter_map(|s| table(s, kind, src).map(BlockTable::end))
                    .max()
                    .unwrap_or(0)
                    .max(1);
                let step = seqs
                    .iter()
                    .map(|&seq| {
                        let s = self.seqs.get(&seq).ok_or_else(|| super::unknown(seq))?;
                        let t = table(s, kind, src).ok_or_else(|| missing_table(src))?;
                        Ok((s.slot, t))
                    })
                    .collect::<Result<Vec<_>>>()?;
                let mirror = match kind {
                    TableKind::Entries => self.tables.entries.get_mut(src),
                    TableKind::Keys => match self.tables.keys.get_mut(src) {
                        Some(Some(m)) => Some(m),
                        Some(None) => continue,
                        None => None,
                    },
                };
                let mirror = mirror.ok_or_else(|| missing_table(src))?;
                mirror.sync(&device, rows, width, &step)?;
                // The device half reads the table in place, like an upload.
                self.inputs.note(mirror.tensor());
            }
        }
        Ok(())
    }

    /// The device table `kind` of `layer`'s source.
    fn mirror(&self, layer: usize, kind: TableKind) -> Result<&Mirror> {
        let src = self.source(layer)?;
        let m = match kind {
            TableKind::Entries => self.tables.entries.get(src),
            TableKind::Keys => self.tables.keys.get(src).and_then(Option::as_ref),
        };
        Ok(m.ok_or(OpError::Argument {
            op: "StatePool::step_pages",
            arg: "layer",
            value: layer.to_string(),
            why: "the layer's source holds no such table (index keys of a source without keys)",
        })?)
    }

    /// Pages per row of the device table `kind` of `layer`'s source (after
    /// [`StatePool::sync_tables`]).
    pub(crate) fn table_width(&self, layer: usize, kind: TableKind) -> Result<usize> {
        Ok(self.mirror(layer, kind)?.width)
    }

    /// The device table `kind` of `layer`'s source, I32 `[slots, width]`.
    pub(super) fn table(&self, layer: usize, kind: TableKind) -> Result<&Tensor> {
        Ok(self.mirror(layer, kind)?.tensor())
    }

    /// Each sequence's slot, as the I32 row list a step gathers its tables
    /// by.
    pub(crate) fn slots_of(&self, seqs: &[SeqId]) -> Result<Vec<i32>> {
        seqs.iter()
            .map(|&seq| super::phys_i32(self.get(seq)?.slot))
            .collect()
    }
}

fn missing_table(src: usize) -> OpError {
    OpError::Argument {
        op: "StatePool::sync_tables",
        arg: "source",
        value: src.to_string(),
        why: "a sequence without the source's tables",
    }
}
