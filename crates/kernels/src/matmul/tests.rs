use super::*;
use half::f16;
use rand::{Rng, SeedableRng, rngs::StdRng};

fn f16_bytes(v: f32) -> [u8; 2] {
    f16::from_f32(v).to_bits().to_le_bytes()
}

/// Random GGML rows of `format`: random values, bits and scales, with d
/// (and m, dmin) in the range real weights have.
fn random_rows(format: QFormat, rows: usize, cols: usize, rng: &mut StdRng) -> Vec<u8> {
    let mut data = vec![0u8; rows * format.row_bytes(cols)];
    for blk in data.chunks_exact_mut(format.block_bytes()) {
        rng.fill(blk);
        match format {
            QFormat::Q4_K => {
                blk[..2].copy_from_slice(&f16_bytes(rng.random_range(0.0001..0.002)));
                blk[2..4].copy_from_slice(&f16_bytes(rng.random_range(0.0001..0.004)));
            }
            QFormat::Q6_K => {
                blk[208..].copy_from_slice(&f16_bytes(rng.random_range(0.0001..0.001)))
            }
            _ => blk[..2].copy_from_slice(&f16_bytes(rng.random_range(0.001..0.05))),
        }
        if format == QFormat::Q4_1 {
            blk[2..4].copy_from_slice(&f16_bytes(rng.random_range(-0.2..0.0)));
        }
    }
    data
}

fn random_quant(format: QFormat, rows: usize, cols: usize, rng: &mut StdRng) -> QMatrix {
    let data = random_rows(format, rows, cols, rng);
    QMatrix::new(rows, cols, Weights::Quant { format, data }).unwrap()
}

/// A row length every format takes (K-quants need whole super-blocks).
fn cols_for(format: QFormat, small: usize) -> usize {
    small.next_multiple_of(format.block_len())
}

fn random_acts(k: usize, cols: usize, rng: &mut StdRng) -> Vec<f32> {
    (0..k * cols).map(|_| rng.random_range(-2.0..2.0)).collect()
}

/// Exact dot products of the dequantized weights with the f32 activations,
/// and for each the bound on the error that int8 activations may add
/// (|x − x̂| ≤ d/2 per element, d = block max / 127).
fn reference(w: &QMatrix, x: &[f32]) -> Vec<(f64, f64)> {
    let (n, c) = (w.rows(), w.cols());
    let ablock = match w.format() {
        Some(f) if f.super_block_activations() => 256,
        _ => 32,
    };
    let mut row = vec![0.0; c];
    let mut out = vec![(0.0, 0.0); x.len() / c * n];
    for j in 0..n {
        w.dequantize_row(j, &mut row);
        for (r, xr) in x.chunks(c).enumerate() {
            let exact = row.iter().zip(xr).map(|(a, b)| *a as f64 * *b as f64).sum();
            let bound = row
                .chunks(ablock)
                .zip(xr.chunks(ablock))
                .map(|(wb, xb)| {
                    let d = xb.iter().fold(0.0f32, |m, v| m.max(v.abs())) as f64 / 127.0;
                    wb.iter().map(|v| v.abs() as f64).sum::<f64>() * d / 2.0
                })
                .sum();
            out[r * n + j] = (exact, bound);
        }
    }
    out
}

const FORMATS: [QFormat; 6] = [
    QFormat::Q4_0,
    QFormat::Q4_1,
    QFormat::Q5_0,
    QFormat::Q8_0,
    QFormat::Q4_K,
    QFormat::Q6_K,
];

/// The ISAs this CPU runs; each one it lacks is reported on stderr
/// (`--nocapture` shows it), so a test that loops over ISAs never passes
/// for one it did not run.
fn supported_isas() -> Vec<Isa> {
    Isa::ALL
        .into_iter()
        .filter(|isa| {
            let ok = isa.supported();
            if !ok {
                eprintln!("skipped: this CPU lacks {isa}");
            }
            ok
        })
        .collect()
}

/// Formats whose kernels are bit-identical on every ISA.
const ISA_EXACT: [QFormat; 4] = [QFormat::Q4_0, QFormat::Q5_0, QFormat::Q4_K, QFormat::Q6_K];

#[test]
fn every_isa_and_format_matches_the_dequantized_reference() {
    let isas = supported_isas();
    let mut rng = StdRng::seed_from_u64(7);
    let pool = ThreadPool::new(2);
    let mut scratch = QuantizedRows::default();
    for format in FORMATS {
        let cols = cols_for(format, 96);
        let w = random_quant(format, 37, cols, &mut rng);
        let x = random_acts(5, cols, &mut rng);
        let want = reference(&w, &x);
        for &isa in &isas {
            let mut out = vec![0.0; 5 * 37];
            w.forward(&x, &mut scratch, &mut out, isa, &pool);
            for (o, (exact, bound)) in out.iter().zip(&want) {
                let err = (*o as f64 - exact).abs();
                assert!(
                    err <= bound * 1.001 + 1e-4,
                    "{format:?} {isa}: {o} vs {exact} (bound {bound})"
                );
            }
        }
    }
}

#[test]
fn a_rows_result_is_bit_identical_whatever_the_batch_and_threads() {
    let isas = supported_isas();
    let mut rng = StdRng::seed_from_u64(11);
    let mut scratch = QuantizedRows::default();
    let pools = [ThreadPool::new(1), ThreadPool::new(2), ThreadPool::new(3)];
    for format in FORMATS {
        let cols = cols_for(format, 64);
        let w = random_quant(format, 29, cols, &mut rng);
        let x = random_acts(19, cols, &mut rng);
        for &isa in &isas {
            let mut alone = vec![0.0; 29];
            let singles: Vec<Vec<f32>> = x
                .chunks(cols)
                .map(|xr| {
                    w.forward(xr, &mut scratch, &mut alone, isa, &pools[0]);
                    alone.clone()
                })
                .collect();
            for k in [1usize, 2, 3, 4, 5, 7, 8, 16, 19] {
                for pool in &pools {
                    let mut out = vec![0.0; k * 29];
                    w.forward(&x[..k * cols], &mut scratch, &mut out, isa, pool);
                    for r in 0..k {
                        let got: Vec<u32> = out[r * 29..(r + 1) * 29]
                            .iter()
                            .map(|v| v.to_bits())
                            .collect();
                        let want: Vec<u32> = singles[r].iter().map(|v| v.to_bits()).collect();
                        assert_eq!(
                            got,
                            want,
                            "{format:?} {isa} k={k} row {r} threads={}",
                            pool.threads()
                        );
                    }
                }
            }
        }
    }
}

#[test]
fn repacking_is_lossless() {
    // Every packed row dequantizes to exactly what GGML's layout gives.
    let mut rng = StdRng::seed_from_u64(31);
    for format in FORMATS {
        let (rows, cols) = (13, cols_for(format, 96) * 2);
        let data = random_rows(format, rows, cols, &mut rng);
        let w = QMatrix::new(
            rows,
            cols,
            Weights::Quant {
                format,
                data: data.clone(),
            },
        )
        .unwrap();
        let (mut got, mut want) = (vec![0.0; cols], vec![0.0; cols]);
        let rb = format.row_bytes(cols);
        for r in 0..rows {
            w.dequantize_row(r, &mut got);
            format.dequantize_row(&data[r * rb..(r + 1) * rb], &mut want);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{format:?} row {r}"
            );
        }
        // Bytes read per forward: the packed copy is as large as GGML's
        // (Q4_K's 6-bit scales and mins widened to bytes: +2.8%).
        let grew = w.nbytes() as f64 / (rows.next_multiple_of(8) * rb) as f64;
        assert!(grew <= 1.03, "{format:?} grew {grew}");
    }
}

#[test]
fn k_quant_and_q5_0_results_are_identical_on_every_isa() {
    let isas = supported_isas();
    let mut rng = StdRng::seed_from_u64(37);
    let pool = ThreadPool::new(2);
    let mut s = QuantizedRows::default();
    // Activation rows with split partial sums in the two-group kernels (1,
    // 2: `packed_kquant_512::SPLIT_ROWS`) and without, a full 8 and a
    // remainder after it.
    for (format, k) in ISA_EXACT
        .into_iter()
        .flat_map(|f| [1, 2, 3, 4, 5, 7, 8, 13].map(|k| (f, k)))
    {
        let cols = cols_for(format, 64) * 3;
        let w = random_quant(format, 21, cols, &mut rng);
        let x = random_acts(k, cols, &mut rng);
        let mut want = vec![0.0; k * 21];
        w.forward(&x, &mut s, &mut want, Isa::Scalar, &pool);
        for &isa in &isas {
            let mut got = vec![0.0; k * 21];
            w.forward(&x, &mut s, &mut got, isa, &pool);
            assert_eq!(
                got.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                want.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{format:?} {isa} k={k}"
            );
        }
    }
}

#[test]
fn extreme_values_do_not_overflow_the_i16_sums() {
    // Every weight and activation at its largest magnitude: the i16 lane
    // sums of the maddubs kernels are at their bounds. 16 rows: two groups,
    // so the two-group kernels run too.
    let pool = ThreadPool::new(1);
    let mut s = QuantizedRows::default();
    for format in ISA_EXACT {
        let cols = format.block_len() * 2;
        let mut data = vec![0xffu8; 16 * format.row_bytes(cols)];
        for blk in data.chunks_exact_mut(format.block_bytes()) {
            match format {
                QFormat::Q4_K => {
                    blk[..2].copy_from_slice(&f16_bytes(0.001));
                    blk[2..4].copy_from_slice(&f16_bytes(0.0));
                }
                QFormat::Q6_K => {
                    blk[192..208].fill(127);
                    blk[208..].copy_from_slice(&f16_bytes(0.001));
                }
                _ => blk[..2].copy_from_slice(&f16_bytes(0.01)),
            }
        }
        let w = QMatrix::new(16, cols, Weights::Quant { format, data }).unwrap();
        for sign in [1.0f32, -1.0] {
            let x = vec![sign; cols];
            let want = reference(&w, &x);
            let mut got = vec![0.0; 16];
            w.forward(&x, &mut s, &mut got, Isa::detect(), &pool);
            let mut scalar = vec![0.0; 16];
            w.forward(&x, &mut s, &mut scalar, Isa::Scalar, &pool);
            assert_eq!(got, scalar, "{format:?}");
            for (o, (exact, _)) in got.iter().zip(&want) {
                let rel = (*o as f64 - exact).abs() / exact.abs().max(1e-6);
                assert!(rel < 1e-3, "{format:?} sign {sign}: {o} vs {exact}");
            }
        }
    }
}

#[test]
fn f32_weights_are_batch_invariant_too() {
    let mut rng = StdRng::seed_from_u64(3);
    let data: Vec<f32> = (0..13 * 40).map(|_| rng.random_range(-1.0..1.0)).collect();
    let w = QMatrix::new(13, 40, Weights::F32(data)).unwrap();
    let x = random_acts(6, 40, &mut rng);
    let pool = ThreadPool::new(2);
    let mut s = QuantizedRows::default();
    let mut all = vec![0.0; 6 * 13];
    w.forward(&x, &mut s, &mut all, Isa::detect(), &pool);
    let mut one = vec![0.0; 13];
    w.forward(&x[40..80], &mut s, &mut one, Isa::detect(), &pool);
    assert_eq!(&all[13..26], &one[..]);
}

#[test]
fn stacking_concatenates_output_features() {
    let mut rng = StdRng::seed_from_u64(5);
    let a = random_quant(QFormat::Q4_1, 8, 64, &mut rng);
    let b = random_quant(QFormat::Q4_1, 4, 64, &mut rng);
    let ab = QMatrix::stack(&[&a, &b]).unwrap();
    assert_eq!(ab.rows(), 12);
    let x = random_acts(2, 64, &mut rng);
    let pool = ThreadPool::new(1);
    let mut s = QuantizedRows::default();
    let (mut oa, mut ob, mut oab) = (vec![0.0; 16], vec![0.0; 8], vec![0.0; 24]);
    a.forward(&x, &mut s, &mut oa, Isa::detect(), &pool);
    b.forward(&x, &mut s, &mut ob, Isa::detect(), &pool);
    ab.forward(&x, &mut s, &mut oab, Isa::detect(), &pool);
    assert_eq!(&oab[..8], &oa[..8]);
    assert_eq!(&oab[8..12], &ob[..4]);
    let c = random_quant(QFormat::Q8_0, 4, 64, &mut rng);
    assert!(QMatrix::stack(&[&a, &c]).is_none());
}

#[test]
fn wrong_sizes_are_rejected() {
    let bad = QMatrix::new(
        2,
        64,
        Weights::Quant {
            format: QFormat::Q4_1,
            data: vec![0; 10],
        },
    );
    assert!(matches!(bad, Err(WeightLayoutError::Size { .. })));
    let unaligned = QMatrix::new(
        2,
        33,
        Weights::Quant {
            format: QFormat::Q8_0,
            data: vec![],
        },
    );
    assert!(matches!(
        unaligned,
        Err(WeightLayoutError::Unaligned { .. })
    ));
}

#[test]
fn vnni_paths_give_identical_bits_for_packed_formats() {
    // 256-bit and 512-bit VNNI kernels run the same per-lane operations.
    let lacking: Vec<String> = [Isa::AvxVnni, Isa::Avx512Vnni]
        .into_iter()
        .filter(|isa| !isa.supported())
        .map(|isa| isa.to_string())
        .collect();
    if !lacking.is_empty() {
        eprintln!("skipped: this CPU lacks {}", lacking.join(" and "));
        return;
    }
    let mut rng = StdRng::seed_from_u64(17);
    let pool = ThreadPool::new(2);
    let mut s = QuantizedRows::default();
    for format in [QFormat::Q4_1, QFormat::Q8_0] {
        let w = random_quant(format, 40, 64, &mut rng);
        let x = random_acts(6, 64, &mut rng);
        let (mut a, mut b) = (vec![0.0; 6 * 40], vec![0.0; 6 * 40]);
        w.forward(&x, &mut s, &mut a, Isa::AvxVnni, &pool);
        w.forward(&x, &mut s, &mut b, Isa::Avx512Vnni, &pool);
        assert_eq!(
            a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
            b.iter().map(|v| v.to_bits()).collect::<Vec<_>>()
        );
    }
}

#[test]
fn amx_tiles_give_the_bits_of_the_vnni_kernels() {
    // Exact integer block sums and the same float epilogue: any row count,
    // an odd number of groups (the last one goes to VNNI) and a block count
    // that is not a multiple of the tile chunk; tiles for every call here,
    // whatever the measured plan chose.
    if !Isa::AmxInt8.supported() {
        eprintln!("skipped: this CPU lacks {}", Isa::AmxInt8);
        return;
    }
    let mut rng = StdRng::seed_from_u64(23);
    let pool = ThreadPool::new(2);
    let mut s = QuantizedRows::default();
    for format in [QFormat::Q4_1, QFormat::Q8_0, QFormat::Q4_K, QFormat::Q6_K] {
        let cols = cols_for(format, 576);
        let w = random_quant(format, 45, cols, &mut rng);
        let x = random_acts(40, cols, &mut rng);
        for k in [1usize, 2, 3, 8, 15, 16, 17, 33, 40] {
            let (mut a, mut b) = (vec![0.0; k * 45], vec![0.0; k * 45]);
            let x = &x[..k * cols];
            w.forward(x, &mut s, &mut a, Isa::Avx512Vnni, &pool);
            let tiles = TileCalls::hardware(format, crate::tile_plan::RowSet::from(1));
            w.forward_tiled(x, &mut s, &mut b, Isa::AmxInt8, tiles, &pool);
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{format:?} k={k}"
            );
        }
    }
}

#[test]
#[cfg(target_arch = "x86_64")]
fn tile_kernels_on_emulated_tiles_give_the_bits_of_the_vnni_kernels() {
    // The tile kernels' layouts (weight tiles, activation rows, sums) and
    // the matmul's split of rows between tiles and VNNI, run here on
    // `tiles::Emulated` on any AVX-512 VNNI machine: an odd number of
    // groups (the last one goes to VNNI), more groups per thread than one
    // block, calls of 1 to 16 rows, more rows than one tile call takes, and
    // some row counts left to VNNI.
    use crate::packed::amx::emulated::*;
    use crate::packed::amx::kquant::emulated::*;
    use crate::tile_plan::RowSet;
    if !Isa::Avx512Vnni.supported() {
        eprintln!("skipped: this CPU lacks {}", Isa::Avx512Vnni);
        return;
    }
    let mut rng = StdRng::seed_from_u64(29);
    let pool = ThreadPool::new(2);
    let mut s = QuantizedRows::default();
    let kernels: [(QFormat, crate::tiles::AmxPairsFn); 4] = [
        (QFormat::Q4_1, q4_1_pairs_emulated),
        (QFormat::Q8_0, q8_0_pairs_emulated),
        (QFormat::Q4_K, q4_k_pairs_emulated),
        (QFormat::Q6_K, q6_k_pairs_emulated),
    ];
    for (format, kernel) in kernels {
        // 38 groups: 19 per thread, a block of 8 pairs, then 1 pair and
        // an odd last group.
        let (rows, cols) = (301, cols_for(format, 576));
        let w = random_quant(format, rows, cols, &mut rng);
        let x = random_acts(40, cols, &mut rng);
        for (k, from) in [
            (1, 1),
            (2, 1),
            (5, 1),
            (8, 1),
            (13, 1),
            (16, 1),
            (40, 1),
            (35, 4),
        ] {
            let x = &x[..k * cols];
            let (mut a, mut b) = (vec![0.0; k * rows], vec![f32::NAN; k * rows]);
            w.forward(x, &mut s, &mut a, Isa::Avx512Vnni, &pool);
            let tiles = TileCalls {
                rows: RowSet::from(from),
                kernel: Some(kernel),
            };
            w.forward_tiled(x, &mut s, &mut b, Isa::Avx512Vnni, tiles, &pool);
            assert_eq!(
                a.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                b.iter().map(|v| v.to_bits()).collect::<Vec<_>>(),
                "{format:?} k={k}"
            );
        }
    }
}
