//! One test body for every device: the in-place writes that refill a
//! decode step's static inputs (`Tensor::write_from`) and the step arena
//! that makes them (`model::inputs::StepInputs`, `Batch::new`).
//! Values are fresh random; each check reads the tensor back and compares
//! it with the data written, and a failed write must leave the tensor as it
//! was.

use deepinfer::model::batch::{Batch, Entry};
use deepinfer::model::inputs::StepInputs;
use deepinfer::{DType, Device, Error, Fp4x2, Tensor};
use half::bf16;
use rand::Rng;
use rand::rngs::StdRng;

/// `write_from` overwrites every element where the tensor lives (I64, I32,
/// F32, BF16 and U8, odd lengths), keeps its shape, and refuses another dtype or
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

        // Bytes are written from the caller's slice as they are.
        let mut u = Tensor::empty(dev, DType::U8, &[n]).unwrap();
        let v: Vec<u8> = (0..n).map(|_| rng.random()).collect();
        u.write_from(&v).unwrap();
        assert_eq!(u.to_vec::<u8>().unwrap(), v, "U8 [{n}]");
    }
}

/// `write_rows_from` overwrites exactly the rows it is given (I32 and F32,
/// first, middle and last rows, one row and several), leaves every other
/// row as it was, and refuses a partial row, rows past the end, another
/// dtype and packed FP4 with a typed error that changes nothing.
pub fn write_rows_from_overwrites_only_its_rows(dev: &Device, rng: &mut StdRng) {
    for (rows, width) in [(1usize, 1usize), (5, 3), (64, 17)] {
        let mut want: Vec<i32> = (0..rows * width).map(|_| rng.random()).collect();
        let mut t = Tensor::from_vec(want.clone(), &[rows, width])
            .unwrap()
            .to_device(dev)
            .unwrap();
        for (row, n) in [
            (0, 1),
            (rows - 1, 1),
            (rows / 2, rows - rows / 2),
            (0, rows),
        ] {
            let v: Vec<i32> = (0..n * width).map(|_| rng.random()).collect();
            t.write_rows_from(row, &v).unwrap();
            want[row * width..(row + n) * width].copy_from_slice(&v);
            assert_eq!(
                t.to_vec::<i32>().unwrap(),
                want,
                "I32 [{rows}, {width}] rows {row} + {n}"
            );
        }
        let refused = |e: Error| {
            assert!(
                matches!(
                    e,
                    Error::Shape {
                        op: "Tensor::write_rows_from",
                        ..
                    } | Error::DType {
                        op: "Tensor::write_rows_from",
                        ..
                    }
                ),
                "{e}"
            )
        };
        refused(t.write_rows_from(0, &vec![7i32; width + 1]).unwrap_err());
        refused(t.write_rows_from(rows, &vec![7i32; width]).unwrap_err());
        refused(
            t.write_rows_from(usize::MAX, &vec![7i32; width])
                .unwrap_err(),
        );
        refused(t.write_rows_from(0, &vec![7f32; width]).unwrap_err());
        assert_eq!(t.to_vec::<i32>().unwrap(), want, "after refused writes");

        let mut f = Tensor::full_f32(dev, &[rows, width], f32::NAN).unwrap();
        let v: Vec<f32> = (0..width)
            .map(|_| rng.random_range(-1e30f32..1e30))
            .collect();
        f.write_rows_from(rows - 1, &v).unwrap();
        let got = f.to_vec::<f32>().unwrap();
        assert!(got[..(rows - 1) * width].iter().all(|x| x.is_nan()));
        assert_eq!(
            got[(rows - 1) * width..]
                .iter()
                .map(|x| x.to_bits())
                .collect::<Vec<_>>(),
            v.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "F32 last row"
        );
    }
    // Packed FP4 `[4, 8]`: a row is 8 values in 4 bytes; refused whole.
    let mut p = Tensor::zeros(dev, DType::F4E2M1x2, &[4, 8]).unwrap();
    let e = p.write_rows_from(0, &[Fp4x2(0x77); 8]).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Shape {
                op: "Tensor::write_rows_from",
                ..
            }
        ),
        "{e}"
    );
    assert!(p.to_le_bytes().unwrap().iter().all(|&b| b == 0));
}

/// The step arena (`model::inputs`): a second step of the same shapes
/// reuses every slot's storage (same tensors, new values; `Batch::new`'s
/// positions and owners included), a slot whose shape or dtype changes gets
/// a new tensor, a slot still lent is not shared, and the values are always
/// the uploaded ones.
pub fn step_inputs_reuse_their_slots(dev: &Device, rng: &mut StdRng) {
    let inputs = StepInputs::new();
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
        let tables: Vec<i32> = (0..b * 3).map(|_| rng.random_range(-1..1 << 20)).collect();
        (entries, positions, tables)
    };
    for b in [1usize, 5, 64] {
        // On the CPU the storage itself is visible: a reused slot keeps its
        // host buffer (on a GPU, its device address).
        let mut buffers = Vec::new();
        for round in 0..3 {
            let (entries, positions, tables) = step(rng, b);
            inputs.begin();
            let batch = Batch::new(entries, positions.clone(), &inputs, dev).unwrap();
            let t = inputs.upload(tables.clone(), &[b, 3], dev).unwrap();
            assert_eq!(batch.positions.to_vec::<i64>().unwrap(), positions, "B {b}");
            assert_eq!(
                batch.owners.to_vec::<i32>().unwrap(),
                (0..b as i32).collect::<Vec<_>>(),
                "B {b}"
            );
            assert_eq!(t.to_vec::<i32>().unwrap(), tables, "B {b}");
            // From the second round on, all three reuse their slot.
            let stats = inputs.stats();
            assert_eq!(stats.uploads, 3, "B {b} round {round}");
            if round > 0 {
                assert_eq!(stats.reused, 3, "B {b} round {round}");
            }
            if matches!(dev, Device::Cpu) {
                buffers.push((
                    batch.positions.as_slice::<i64>().unwrap().as_ptr() as usize,
                    t.as_slice::<i32>().unwrap().as_ptr() as usize,
                ));
            }
        }
        // Rounds 1 and 2 reuse round 0's tensors.
        assert!(
            buffers.windows(2).all(|w| w[0] == w[1]),
            "B {b}: a reused slot moved to another buffer: {buffers:?}"
        );
        // Another row count: the slots are replaced, not reused.
        inputs.begin();
        let (entries, positions, _) = step(rng, b + 1);
        let batch = Batch::new(entries, positions.clone(), &inputs, dev).unwrap();
        assert_eq!(inputs.stats().reused, 0, "B {b} + 1");
        assert_eq!(batch.positions.to_vec::<i64>().unwrap(), positions);
    }
    // A slot still lent when its upload comes again gets a fresh tensor,
    // and both keep their own values.
    inputs.begin();
    let a = inputs.upload(vec![1i32, 2, 3], &[3], dev).unwrap();
    drop(a);
    inputs.begin();
    let kept = inputs.upload(vec![4i32, 5, 6], &[3], dev).unwrap();
    inputs.begin();
    let fresh = inputs.upload(vec![7i32, 8, 9], &[3], dev).unwrap();
    assert_eq!(inputs.stats().reused, 0, "a lent slot is not shared");
    assert_eq!(kept.to_vec::<i32>().unwrap(), [4, 5, 6]);
    assert_eq!(fresh.to_vec::<i32>().unwrap(), [7, 8, 9]);
    // A wrong element count is a typed shape error.
    let before = inputs.stats();
    let e = inputs.upload(vec![1i32, 2], &[3], dev).unwrap_err();
    assert!(
        matches!(
            e,
            Error::Shape {
                op: "StepInputs::upload",
                tensor: "values",
                ..
            }
        ),
        "{e}"
    );
    assert_eq!(inputs.stats(), before, "a refused upload takes no slot");
}

/// Byte uploads filled in place (`StepInputs::upload_bytes_with`, the host
/// Engram rows): every byte is the fill's; a second step of the same shape
/// reuses the slot (on the CPU the same host buffer, on a GPU the same
/// device address); a failing fill returns its error, and the slot still
/// serves the next step; a fill of the wrong shape's step gets a new tensor.
pub fn byte_uploads_fill_in_place(dev: &Device, rng: &mut StdRng) {
    let inputs = StepInputs::new();
    for (rows, width) in [(1usize, 1usize), (7, 33), (300, 264)] {
        let mut seen = Vec::new();
        for round in 0..3 {
            let want: Vec<u8> = (0..rows * width).map(|_| rng.random()).collect();
            inputs.begin();
            let t = inputs
                .upload_bytes_with(&[rows, width], dev, |out| {
                    assert_eq!(out.len(), want.len(), "the fill sees every byte");
                    out.copy_from_slice(&want);
                    Ok(())
                })
                .unwrap();
            assert_eq!(t.shape(), &[rows, width]);
            assert_eq!(
                t.to_vec::<u8>().unwrap(),
                want,
                "[{rows}, {width}] round {round}"
            );
            let stats = inputs.stats();
            assert_eq!((stats.uploads, stats.reused), (1, usize::from(round > 0)));
            seen.push(match dev {
                Device::Cpu => Some(t.as_slice::<u8>().unwrap().as_ptr() as u64),
                _ => t.address(),
            });
        }
        assert!(
            seen.windows(2).all(|w| w[0] == w[1]),
            "[{rows}, {width}]: a reused slot moved: {seen:?}"
        );
        // A failing fill: its error, and the slot serves the next step.
        inputs.begin();
        let e = inputs
            .upload_bytes_with(&[rows, width], dev, |_| {
                Err(Error::Argument {
                    op: "test",
                    arg: "fill",
                    value: "1".into(),
                    why: "a failing fill",
                })
            })
            .unwrap_err();
        assert!(matches!(e, Error::Argument { op: "test", .. }), "{e}");
        inputs.begin();
        let want: Vec<u8> = (0..rows * width).map(|_| rng.random()).collect();
        let t = inputs
            .upload_bytes_with(&[rows, width], dev, |out| {
                out.copy_from_slice(&want);
                Ok(())
            })
            .unwrap();
        assert_eq!(
            inputs.stats().reused,
            1,
            "the slot survived the failed fill"
        );
        assert_eq!(t.to_vec::<u8>().unwrap(), want);
        drop(t);
        // Another shape: a new tensor.
        inputs.begin();
        let want: Vec<u8> = (0..(rows + 1) * width).map(|_| rng.random()).collect();
        let t = inputs
            .upload_bytes_with(&[rows + 1, width], dev, |out| {
                out.copy_from_slice(&want);
                Ok(())
            })
            .unwrap();
        assert_eq!(inputs.stats().reused, 0);
        assert_eq!(t.to_vec::<u8>().unwrap(), want);
    }
}
