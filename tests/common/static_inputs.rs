//! One test body for every device: the in-place writes that refill a
//! decode step's static inputs (`Tensor::write_from`, `Batch::refill`).
//! Values are fresh random; each check reads the tensor back and compares
//! it with the data written, and a failed write must leave the tensor as it
//! was.

use deepinfer::model::batch::{Batch, Entry};
use deepinfer::{DType, Device, Error, Tensor};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

/// `write_from` overwrites every element where the tensor lives (I64, I32,
/// F32 and BF16, odd lengths), keeps its shape, and refuses another dtype or
/// another element count with a typed error that changes nothing.
pub fn write_from_overwrites_in_place(dev: &Device, rng: &mut StdRng) {
    for n in [1usize, 7, 64, 1000] {
        let first: Vec<i64> = (0..n).map(|_| rng.random()).collect();
        let mut t = Tensor::from_vec(first.clone(), &[n])
            .unwrap()
            .to_device(dev)
            .unwrap();
        let next: Vec<i64> = (0..n).map(|_| rng.random()).collect();
        t.write_from(&next).unwrap();
        assert_eq!(t.to_vec::<i64>().unwrap(), next, "I64 [{n}]");
        assert_eq!(t.shape(), &[n]);

        let e = t.write_from(&next[..n - 1]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Shape {
                    op: "Tensor::write_from",
                    tensor: "data",
                    ..
                }
            ),
            "{e}"
        );
        let e = t.write_from(&vec![1i32; n]).unwrap_err();
        assert!(
            matches!(
                e,
                Error::DType {
                    op: "Tensor::write_from",
                    got: DType::I64,
                    expected: DType::I32,
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            t.to_vec::<i64>().unwrap(),
            next,
            "I64 [{n}] after refused writes"
        );

        let rows = n.div_ceil(3);
        let mut m = Tensor::zeros(dev, DType::I32, &[rows, 3]).unwrap();
        let v: Vec<i32> = (0..rows * 3).map(|_| rng.random()).collect();
        m.write_from(&v).unwrap();
        assert_eq!(m.to_vec::<i32>().unwrap(), v, "I32 [{rows}, 3]");

        // Floats compared bit for bit: as bytes, against the same values
        // as a host tensor.
        let same_bytes = |t: &Tensor, want: Tensor, what: &str| {
            assert_eq!(
                t.to_le_bytes().unwrap(),
                want.to_le_bytes().unwrap(),
                "{what} [{n}]"
            );
        };
        let mut f = Tensor::full_f32(dev, &[n], f32::NAN).unwrap();
        let v: Vec<f32> = (0..n).map(|_| rng.random_range(-1e30f32..1e30)).collect();
        f.write_from(&v).unwrap();
        same_bytes(&f, Tensor::from_vec(v, &[n]).unwrap(), "F32");

        let mut b = Tensor::empty(dev, DType::BF16, &[n]).unwrap();
        let v: Vec<bf16> = (0..n).map(|_| bf16::from_bits(rng.random())).collect();
        b.write_from(&v).unwrap();
        same_bytes(&b, Tensor::from_vec(v, &[n]).unwrap(), "BF16");
    }
}

/// `Batch::refill` writes a step of the same row count into the batch's
/// tensors (positions and owners as `Batch::new` would make them for that
/// step), and refuses another row count without touching them.
pub fn batch_refill_matches_a_new_batch(dev: &Device, rng: &mut StdRng) {
    let step = |rng: &mut StdRng, b: usize| {
        let entries: Vec<Entry> = (0..b)
            .map(|i| Entry {
                seq: rng.random_range(0..1000),
                start: rng.random_range(0..1 << 20),
                len: 1,
                replay: 0,
                row: i,
            })
            .collect();
        let positions: Vec<i64> = entries.iter().map(|e| e.start as i64).collect();
        (entries, positions)
    };
    for b in [1usize, 5, 64] {
        let (e0, p0) = step(rng, b);
        let mut batch = Batch::new(e0, p0, dev).unwrap();
        let (e1, p1) = step(rng, b);
        let want = Batch::new(e1.clone(), p1.clone(), dev).unwrap();
        batch.refill(e1, &p1).unwrap();
        assert_eq!(
            batch.positions.to_vec::<i64>().unwrap(),
            p1,
            "B {b} positions"
        );
        assert_eq!(
            batch.owners.to_vec::<i32>().unwrap(),
            want.owners.to_vec::<i32>().unwrap(),
            "B {b} owners"
        );
        assert_eq!(batch.entries.len(), b);

        let (e2, p2) = step(rng, b + 1);
        let e = batch.refill(e2, &p2).unwrap_err();
        assert!(
            matches!(
                e,
                Error::Argument {
                    op: "Batch::refill",
                    arg: "positions",
                    ..
                }
            ),
            "{e}"
        );
        assert_eq!(
            batch.positions.to_vec::<i64>().unwrap(),
            p1,
            "B {b} after a refused refill"
        );
    }
}
