//! Every attention kernel this machine can run, for values and place
//! independence; the ones it cannot, said so.

use super::*;

/// The ISAs this CPU runs; each one it lacks is reported on stderr.
fn isas() -> Vec<Isa> {
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

/// Every kernel this build and CPU can run, by name: the dispatching
/// functions pick one per ISA, and the others must stay correct for
/// the CPUs that get them. Each one that cannot run here is reported.
fn kernels() -> Vec<AttnKernel> {
    AttnKernel::ALL
        .into_iter()
        .filter(|kernel| {
            let ok = kernel.supported();
            if !ok {
                let lacks = match kernel {
                    AttnKernel::Avx512 => "this CPU lacks avx512f",
                    _ => "this build lacks avx2 and fma",
                };
                eprintln!("skipped: {lacks} (attention kernel {kernel})");
            }
            ok
        })
        .collect()
}

#[test]
fn scores_and_sums_match_the_naive_loops() {
    for isa in isas() {
        for d in [64usize, 128, 24] {
            let stride = d * 3;
            let k: Vec<f32> = (0..stride * 10)
                .map(|i| ((i * 7919) % 101) as f32 / 50.0 - 1.0)
                .collect();
            let q: Vec<f32> = (0..d).map(|i| (i % 9) as f32 / 4.0 - 1.0).collect();
            let slots = [0usize, 3, 9, 4, 7, 1];
            let mut s = vec![0.0; slots.len()];
            qk_scores(
                AttnKernel::select(isa, d),
                &q,
                &k,
                stride,
                &slots,
                0.5,
                &mut s,
            );
            for (i, &slot) in slots.iter().enumerate() {
                let want: f32 = q
                    .iter()
                    .zip(&k[slot * stride..])
                    .map(|(a, b)| a * b)
                    .sum::<f32>()
                    * 0.5;
                assert!((s[i] - want).abs() < 1e-4, "{isa} d={d}");
            }
            let p = [0.1f32, 0.2, 0.3, 0.4, 0.5, 0.6];
            let mut out = vec![9.0; d];
            pv_sum(AttnKernel::select(isa, d), &p, &k, stride, &slots, &mut out);
            for j in 0..d {
                let want: f32 = slots
                    .iter()
                    .zip(&p)
                    .map(|(&sl, w)| w * k[sl * stride + j])
                    .sum();
                assert!((out[j] - want).abs() < 1e-5, "{isa} d={d}");
            }
        }
    }
}

#[test]
fn a_score_does_not_depend_on_its_neighbours_or_place() {
    // The same key at every position of a group of four, among other
    // keys or padding, gives the same bits: a staged tree token and the
    // same token committed later score alike.
    for isa in isas() {
        for d in [64usize, 128] {
            let k: Vec<f32> = (0..d * 9)
                .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
                .collect();
            let q: Vec<f32> = (0..d).map(|i| ((i * 31) % 17) as f32 / 7.0 - 1.1).collect();
            let mut alone = [0.0];
            qk_scores(
                AttnKernel::select(isa, d),
                &q,
                &k,
                d,
                &[5],
                0.125,
                &mut alone,
            );
            for len in 1..=8 {
                for at in 0..len {
                    let slots: Vec<usize> = (0..len)
                        .map(|i| if i == at { 5 } else { (i * 3 + 1) % 9 })
                        .collect();
                    let mut s = vec![0.0; len];
                    qk_scores(AttnKernel::select(isa, d), &q, &k, d, &slots, 0.125, &mut s);
                    assert_eq!(
                        s[at].to_bits(),
                        alone[0].to_bits(),
                        "{isa} d={d} len={len} at={at}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_value_sum_in_pieces_equals_the_sum_whole() {
    for isa in isas() {
        for d in [64usize, 128, 24] {
            let v: Vec<f32> = (0..d * 40)
                .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
                .collect();
            let slots: Vec<usize> = (0..37).map(|i| (i * 11) % 40).collect();
            let p: Vec<f32> = (0..37).map(|i| (i as f32 * 0.37).sin().abs()).collect();
            let mut whole = vec![0.0; d];
            pv_sum(AttnKernel::select(isa, d), &p, &v, d, &slots, &mut whole);
            let mut pieces = vec![0.0; d];
            for (s, w) in slots.chunks(8).zip(p.chunks(8)) {
                pv_accumulate(AttnKernel::select(isa, d), w, &v, d, s, &mut pieces);
            }
            assert_eq!(
                whole.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                pieces.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{isa} d={d}"
            );
        }
    }
}

#[test]
fn every_implementation_is_right_and_place_independent() {
    for kernel in kernels() {
        let name = kernel.to_string();
        for d in [64usize, 128] {
            let stride = d * 3;
            let k: Vec<f32> = (0..stride * 12)
                .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
                .collect();
            let q: Vec<f32> = (0..d).map(|i| ((i * 31) % 17) as f32 / 7.0 - 1.1).collect();
            let slots: Vec<usize> = (0..11).map(|i| (i * 5 + 2) % 12).collect();
            let mut s = vec![0.0; slots.len()];
            qk_scores(kernel, &q, &k, stride, &slots, 0.25, &mut s);
            let mut alone = [0.0];
            for (i, &slot) in slots.iter().enumerate() {
                let row = &k[slot * stride..slot * stride + d];
                let want: f64 = q.iter().zip(row).map(|(a, b)| *a as f64 * *b as f64).sum();
                assert!((s[i] as f64 - want * 0.25).abs() < 1e-3, "{name} d={d}");
                qk_scores(kernel, &q, &k, stride, &[slot], 0.25, &mut alone);
                assert_eq!(alone[0].to_bits(), s[i].to_bits(), "{name} d={d} slot {i}");
            }
            let p: Vec<f32> = (0..slots.len()).map(|i| 0.05 * (i + 1) as f32).collect();
            let mut out = vec![0.0; d];
            pv_accumulate(kernel, &p, &k, stride, &slots, &mut out);
            let mut pieces = vec![0.0; d];
            pv_accumulate(kernel, &p[..5], &k, stride, &slots[..5], &mut pieces);
            pv_accumulate(kernel, &p[5..], &k, stride, &slots[5..], &mut pieces);
            assert_eq!(out, pieces, "{name} d={d}");
            for j in 0..d {
                let want: f64 = slots
                    .iter()
                    .zip(&p)
                    .map(|(&sl, w)| *w as f64 * k[sl * stride + j] as f64)
                    .sum();
                assert!((out[j] as f64 - want).abs() < 1e-4, "{name} d={d}");
            }
            // One fused multiply-add per slot and lane on every kernel.
            let mut portable = vec![0.0; d];
            pv_accumulate(AttnKernel::Portable, &p, &k, stride, &slots, &mut portable);
            assert_eq!(
                out.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                portable.iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
                "{name} d={d}: value sums as the portable kernel's"
            );
        }
    }
}

#[test]
fn attention_follows_the_isa() {
    // Scalar is portable at every head size; every ISA maps to a kernel
    // this machine runs (an unsupported ISA falls back rather than
    // reaching instructions the CPU lacks), and odd head sizes are
    // portable everywhere.
    for d in [24usize, 64, 128] {
        assert_eq!(AttnKernel::select(Isa::Scalar, d), AttnKernel::Portable);
        for isa in Isa::ALL {
            let kernel = AttnKernel::select(isa, d);
            assert!(kernel.supported(), "{isa} d={d}: {kernel}");
            if d == 24 {
                assert_eq!(kernel, AttnKernel::Portable, "{isa} d={d}");
            }
        }
    }
    #[cfg(all(
        target_arch = "x86_64",
        target_feature = "avx2",
        target_feature = "fma"
    ))]
    {
        assert_eq!(AttnKernel::select(Isa::Avx2, 64), AttnKernel::Avx2);
        assert_eq!(AttnKernel::select(Isa::AvxVnni, 128), AttnKernel::Avx2);
    }
    let avx512 = AttnKernel::Avx512.supported();
    if !avx512 {
        eprintln!("skipped: this CPU lacks avx512f (attention for avx512-vnni, amx-int8)");
    }
    for isa in [Isa::Avx512Vnni, Isa::AmxInt8] {
        if avx512 {
            assert_eq!(AttnKernel::select(isa, 64), AttnKernel::Avx512, "{isa}");
        }
    }
    // Scalar really is the portable loop: its scores are those of the
    // portable dot product, which the SIMD kernels do not reproduce.
    let d = 64;
    let k: Vec<f32> = (0..d * 4)
        .map(|i| ((i * 7919) % 997) as f32 / 300.0 - 1.6)
        .collect();
    let q: Vec<f32> = (0..d).map(|i| ((i * 31) % 17) as f32 / 7.0 - 1.1).collect();
    let mut s = vec![0.0; 4];
    qk_scores(
        AttnKernel::select(Isa::Scalar, d),
        &q,
        &k,
        d,
        &[0, 1, 2, 3],
        1.0,
        &mut s,
    );
    for (i, s) in s.iter().enumerate() {
        let want = crate::vec::dot_portable(&q, &k[i * d..(i + 1) * d]);
        assert_eq!(s.to_bits(), want.to_bits(), "slot {i}");
    }
}
