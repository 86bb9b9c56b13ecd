//! GPU benchmark of the Engram ops (`v41-flash.md` §8) at V4.1's widths
//! (24 columns of 256 values, D = 5120), through the shared harness, with
//! torch peers from benches/peers/engram_torch.py:
//! - `engram_rows`: the n-gram hashes (layer 1's multipliers) reduced by 24
//!   primes into table rows, I64 `[T, 4]` → `[T, 24]`;
//! - `engram_lookup`: the 24 random 264-byte rows a token reads (e4m3 values
//!   and E8M0 scales) dequantised to BF16 `[T, 6144]`: the gather the issue
//!   asks to see against copy bandwidth;
//! - `engram_gate_update`: the four streams' gates and the residual update,
//!   streams `[T, 4, 5120]` and kv `[T, 5, 5120]` in, streams out.
//!
//! The table holds the sum of 24 primes after 333,333 rows (≈ 8.0M rows,
//! 2.1 GB): its rows are as random to the caches as the real 384M-row
//! table's (neither fits L2), at a size the bench can fill quickly. T ∈ {1,
//! 64, 256} (decode; also replayed from a CUDA graph) and {4096, 16384}
//! (prefill); each size keeps `Harness::copies` of its inputs (up to 256),
//! and the lookup's rows land at random in the 2.1 GB table.

#[cfg(deepinfer_cuda)]
#[path = "common/gpu_harness.rs"]
mod harness;

#[cfg(deepinfer_cuda)]
mod gpu {
    use super::harness::Harness;
    use deepinfer::ops::{self, DeviceChecks};
    use deepinfer::{Device, Tensor};
    use half::bf16;

    /// V4.1's hidden size, Engram head dim and columns (3 orders × 8 heads).
    const D: usize = 5120;
    const HD: usize = 256;
    const COLS: usize = 24;
    /// Bytes of one table row: 256 e4m3 values and 8 E8M0 scales.
    const ROW_BYTES: usize = HD + HD / 32;
    /// Layer 1's multipliers (`v41-flash.md` §8.2).
    const MULTIPLIERS: [i64; 4] = [
        76_632_096_046_245,
        4_839_876_093_313,
        35_959_672_319_349,
        73_987_337_458_391,
    ];
    /// The compressed vocabulary the ids are drawn from.
    const VOCAB: i64 = 99_092;

    /// The 24 primes after `from`, ascending.
    fn primes_after(from: u64) -> Vec<u64> {
        let is_prime = |n: u64| {
            n > 1
                && (2..)
                    .take_while(|d| d * d <= n)
                    .all(|d| !n.is_multiple_of(d))
        };
        (from + 1..).filter(|&n| is_prime(n)).take(COLS).collect()
    }

    fn upload<T: deepinfer::dtype::Element>(dev: &Device, v: Vec<T>, shape: &[usize]) -> Tensor {
        Tensor::from_vec(v, shape).unwrap().to_device(dev).unwrap()
    }

    /// A table of `rows` rows: even e4m3 codes (never NaN's 0x7F/0xFF) and
    /// scales 2^-8 .. 2^7, from a fixed hash of the offset.
    fn table(dev: &Device, rows: usize) -> Tensor {
        let bytes: Vec<u8> = (0..rows * ROW_BYTES)
            .map(|i| {
                let h = (i as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 56;
                if i % ROW_BYTES < HD {
                    (h as u8) & 0xFE // never 0x7F / 0xFF (NaN)
                } else {
                    119 + (h as u8 & 15) // E8M0: 2^-8 .. 2^7
                }
            })
            .collect();
        upload(dev, bytes, &[rows, ROW_BYTES])
    }

    pub fn main() {
        let Some(mut h) = Harness::open("engram_gpu") else {
            return;
        };
        let dev = h.dev.clone();
        let primes = primes_after(333_333);
        let rows_total: u64 = primes.iter().sum();
        let table = table(&dev, rows_total as usize);
        let up_bf16 = |n: usize, salt: usize, shape: &[usize]| -> Tensor {
            let v: Vec<bf16> = (0..n)
                .map(|i| bf16::from_f32(((i * 7919 + salt) % 2001) as f32 / 500.0 - 2.0))
                .collect();
            upload(&dev, v, shape)
        };
        let (q_w, k_w) = (up_bf16(4 * D, 17, &[4, D]), up_bf16(4 * D, 29, &[4, D]));
        for t in [1usize, 64, 256, 4096, 16384] {
            let copies = Harness::copies(t * (2 * 9 * D + COLS * ROW_BYTES));
            let ids: Vec<Tensor> = (0..copies)
                .map(|c| {
                    let v: Vec<i64> = (0..4 * t)
                        .map(|i| ((i * 104_729 + c * 7919) as i64 * 31) % VOCAB)
                        .collect();
                    upload(&dev, v, &[t, 4])
                })
                .collect();
            let rows: Vec<Tensor> = ids
                .iter()
                .map(|i| ops::engram_rows(i, &MULTIPLIERS, &primes).unwrap())
                .collect();

            let mut call = |i: usize| {
                ops::engram_rows(&ids[i % copies], &MULTIPLIERS, &primes).unwrap();
            };
            let us = h.time_us(&mut call);
            h.record(
                "engram_rows",
                "engram_rows",
                t,
                COLS,
                us,
                8 * 4 * t + 8 * COLS * t,
                "8*4*rows (ids) + 8*24*rows (table rows)",
            );
            if t <= 256 {
                h.record_graph_twin(&mut call);
            }

            // The deferred form, as the model runs it: no sync a call (the
            // checks are read when their 256 slots fill, and at the end).
            let mut checks = DeviceChecks::new();
            let us = h.time_us(|i| {
                ops::engram_lookup_deferred(&table, &rows[i % copies], HD, &mut checks).unwrap();
            });
            checks.verdict().unwrap();
            h.record(
                "engram_lookup",
                "engram_lookup",
                t,
                COLS * HD,
                us,
                t * (COLS * ROW_BYTES + 8 * COLS + 2 * COLS * HD),
                "rows*(24*264 (table rows) + 8*24 (row numbers) + 2*24*256 (BF16 out))",
            );
            if t <= 256 {
                // A graph's checks live in slots made before the capture.
                let mut held = DeviceChecks::held(&h.cuda).unwrap();
                h.record_graph_twin(|i| {
                    ops::engram_lookup_deferred(&table, &rows[i % copies], HD, &mut held).unwrap();
                });
                let recorded = held.recorded();
                held.verdict_replayed(&recorded).unwrap();
            }

            let streams: Vec<Tensor> = (0..copies)
                .map(|c| up_bf16(t * 4 * D, c * 1013, &[t, 4, D]))
                .collect();
            let kv: Vec<Tensor> = (0..copies)
                .map(|c| up_bf16(t * 5 * D, c * 2027 + 5, &[t, 5, D]))
                .collect();
            let mut call = |i: usize| {
                ops::engram_gate_update(&streams[i % copies], &kv[i % copies], &q_w, &k_w, 1e-20)
                    .unwrap();
            };
            let us = h.time_us(&mut call);
            h.record(
                "engram_gate_update",
                "engram_gate_update",
                t,
                D,
                us,
                2 * t * 4 * D + 2 * t * 5 * D + 2 * 2 * 4 * D + 2 * t * 4 * D,
                "2*4*rows*dim (streams) + 2*5*rows*dim (kv) + 2*2*4*dim (q, k weights) + 2*4*rows*dim (out)",
            );
            if t <= 256 {
                h.record_graph_twin(&mut call);
            }
        }
        h.finish();
    }
}

fn main() {
    #[cfg(deepinfer_cuda)]
    gpu::main();
    #[cfg(not(deepinfer_cuda))]
    eprintln!("engram_gpu: built without DEEPINFER_ACCELERATOR=nvidia; nothing to measure");
}
