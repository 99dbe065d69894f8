//! Deterministic numerics shared by the compute kernels and the pure
//! sampling crates: the exponential of softmax arguments ([`exp_neg`]) and
//! the softmax normaliser over a row of logits ([`softmax_normaliser`]).
//!
//! Both are plain safe Rust with a fixed evaluation order, so every caller
//! (attention's softmax in `specmesh-kernels`, the target's processed
//! distribution in `specmesh-sampling`, the verifier's log-probabilities
//! and the model drafter's candidates) gets the same bits for the same
//! inputs, on every CPU and whatever else is computed around them.

#![forbid(unsafe_code)]

mod log_sum_exp;
pub use log_sum_exp::log_sum_exp;

/// log2(e), and ln 2 split in two for the Cody–Waite reduction of the
/// exponentials ([`exp_neg`] and the fused one of `log_sum_exp`).
const LOG2E: f32 = std::f32::consts::LOG2_E;
const LN2_HI: f32 = 0.693_145_75;
const LN2_LO: f32 = 1.428_606_8e-6;

/// A softmax argument clamped into [-87, 0] (NaN lands on -87: `max`
/// ignores it), so its 2-exponent n is an integer in [-126, 0]. Not
/// `clamp`: it passes NaN through.
#[inline(always)]
#[allow(clippy::manual_clamp)]
fn softmax_arg(x: f32) -> f32 {
    x.max(-87.0).min(0.0)
}

/// 2^n for an integer-valued n in [-126, 0], built from the biased
/// exponent n + 127 ∈ [1, 127]: `n + 127 + SHIFT` is exact and its low
/// mantissa bits are n + 127 (the bits of SHIFT itself are zero there and
/// shift out above bit 31). A float to int conversion would give the same
/// bits, but a saturating `as i32` keeps LLVM from vectorising loops over
/// the exponentials (4 ns → 0.3 ns per element), and this needs no
/// `unsafe` unchecked conversion.
#[inline(always)]
fn pow2(n: f32) -> f32 {
    // 1.5 · 2^23: adding it to an integer-valued float of magnitude below
    // 2^22 leaves that integer in the low mantissa bits.
    const SHIFT: f32 = 12_582_912.0;
    f32::from_bits((n + (127.0 + SHIFT)).to_bits() << 23)
}

/// e^x for x ≤ 0 (softmax arguments), to ~2 ulp: Cody–Waite reduction to
/// r ∈ [−ln2/2, ln2/2] and a degree-6 Taylor polynomial. Branch-free, so a
/// loop over it vectorizes, unlike libm's `expf`; deterministic, so softmax
/// stays batch-invariant. Arguments below −87 return ~1e-38 instead of
/// underflowing to subnormals, and so does NaN.
#[inline(always)]
pub fn exp_neg(x: f32) -> f32 {
    let x = softmax_arg(x);
    let n = (x * LOG2E + 0.5).floor();
    let r = x - n * LN2_HI - n * LN2_LO;
    let p = 1.0
        + r * (1.0
            + r * (0.5
                + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
    pow2(n) * p
}

/// Independent f64 partial sums of [`softmax_normaliser`]: four AVX2
/// registers, so the loop vectorises without a serial chain of adds (as
/// fast, measured, as sixteen f32 lanes, and no partial sum in f32).
const LANES: usize = 16;

/// The softmax normaliser `Σ exp((v − max) / temperature)` over `values`,
/// accumulated in f64.
///
/// `max` is the largest value (the shift that keeps every term ≤ 1) and
/// `temperature` divides the shifted logits as a multiplication by
/// `1 / temperature`, computed in f32 (1.0 for the plain softmax, where
/// `(v − max) · 1` is exactly `v − max`). Each term is [`exp_neg`] (2 ulp)
/// widened to f64 and added into one of sixteen f64 lanes (value i into
/// lane i mod 16); the lanes are then added in order, and the values
/// after the last whole group of sixteen last, one by one. The order is
/// fixed, so the result is a pure function of the arguments, and no
/// partial sum is ever rounded to f32: a caller dividing the same
/// `exp_neg` terms by it gets probabilities that sum to 1 to f64
/// rounding.
///
/// NaN values need no branch: `exp_neg` maps them to ~1e-38, which next to
/// the maximum's own term of 1 is below f64 rounding. Callers handle a
/// non-finite `max` themselves.
pub fn softmax_normaliser(values: &[f32], max: f32, temperature: f32) -> f64 {
    let inv_t = 1.0 / temperature;
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    let mut acc = [0.0f64; LANES];
    for c in chunks {
        // All sixteen exponentials first, then the widening adds: written
        // as one fused loop LLVM vectorises it about half as well.
        let mut e = [0.0f32; LANES];
        for l in 0..LANES {
            e[l] = exp_neg((c[l] - max) * inv_t);
        }
        for l in 0..LANES {
            acc[l] += e[l] as f64;
        }
    }
    let mut total = 0.0f64;
    for a in acc {
        total += a;
    }
    for &v in tail {
        total += exp_neg((v - max) * inv_t) as f64;
    }
    total
}

/// Values per block of [`argmax`]'s passes: lane-wise, so they vectorise.
const BLOCK: usize = 16;

/// The index of the largest value, the lowest index on ties; NaN values
/// never win. This is the sequential rule "start at 0, move to each later
/// value greater than the current best" (so a NaN first value, which
/// nothing is greater than, gives 0) in two vectorisable passes: the
/// maximum, lane-wise, then the first block holding it. The sequential loop
/// took 1.6 ns per value (76 µs per 49k-token row, 241 µs per 152k-token
/// one: a verifier pays it for every row it samples greedily).
pub fn argmax(values: &[f32]) -> usize {
    let Some(&first) = values.first() else {
        return 0;
    };
    if first.is_nan() {
        return 0;
    }
    // Lane-wise maxima; `v > m` is false for NaN, which so never enters.
    let mut lanes = [first; BLOCK];
    let blocks = values.chunks_exact(BLOCK);
    let mut max = blocks
        .remainder()
        .iter()
        .fold(first, |m, &v| if v > m { v } else { m });
    for b in blocks {
        for l in 0..BLOCK {
            lanes[l] = if b[l] > lanes[l] { b[l] } else { lanes[l] };
        }
    }
    for &m in &lanes {
        max = if m > max { m } else { max };
    }
    // The first value equal to the maximum (−0 equals +0, as the
    // sequential comparison treats them).
    for (i, b) in values.chunks(BLOCK).enumerate() {
        if b.iter().fold(false, |any, &v| any | (v == max)) {
            let at = b.iter().position(|&v| v == max).expect("found above");
            return i * BLOCK + at;
        }
    }
    0
}

/// Whether any of `values` is greater than `floor` (false for NaN): one
/// vectorisable test per block, for scans that keep a running best.
#[inline]
pub fn any_above(values: &[f32], floor: f32) -> bool {
    values.iter().fold(false, |any, &v| any | (v > floor))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The previous formulation, with a float-to-int conversion for 2^n.
    fn exp_neg_by_conversion(x: f32) -> f32 {
        const LOG2E: f32 = std::f32::consts::LOG2_E;
        const LN2_HI: f32 = 0.693_145_75;
        const LN2_LO: f32 = 1.428_606_8e-6;
        #[allow(clippy::manual_clamp)]
        let x = x.max(-87.0).min(0.0);
        let n = (x * LOG2E + 0.5).floor();
        let r = x - n * LN2_HI - n * LN2_LO;
        let p = 1.0
            + r * (1.0
                + r * (0.5
                    + r * (1.0 / 6.0 + r * (1.0 / 24.0 + r * (1.0 / 120.0 + r * (1.0 / 720.0))))));
        f32::from_bits(((n as i32 + 127) as u32) << 23) * p
    }

    /// The sequential rule [`argmax`] must match.
    fn argmax_sequential(values: &[f32]) -> usize {
        let mut best = 0;
        for (i, &v) in values.iter().enumerate() {
            if v > values[best] {
                best = i;
            }
        }
        best
    }

    #[test]
    fn argmax_is_the_sequential_rule() {
        let mut x = 0x9e37_79b9u32;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x
        };
        let special = [f32::NAN, f32::INFINITY, f32::NEG_INFINITY, 0.0, -0.0, 3.0];
        for len in [0usize, 1, 2, 15, 16, 17, 33, 100, 49_157] {
            for trial in 0..40 {
                // Few distinct values, so ties are common.
                let mut v: Vec<f32> = (0..len).map(|_| (next() % 7) as f32 - 3.0).collect();
                for _ in 0..trial % 5 {
                    if len > 0 {
                        let at = next() as usize % len;
                        v[at] = special[next() as usize % special.len()];
                    }
                }
                if trial % 7 == 0 && len > 0 {
                    v[0] = f32::NAN;
                }
                assert_eq!(argmax(&v), argmax_sequential(&v), "{v:?}");
            }
        }
        assert_eq!(argmax(&[-0.0, 0.0, -1.0]), 0);
        assert_eq!(argmax(&[-1.0, 0.0, -0.0]), 1);
        assert_eq!(argmax(&[f32::NAN; 20]), 0);
        assert_eq!(argmax(&[1.0, f32::NAN, 2.0]), 2);
    }

    #[test]
    fn any_above_ignores_nan() {
        assert!(!any_above(&[f32::NAN, 1.0], 1.0));
        assert!(any_above(&[f32::NAN, 1.5], 1.0));
        assert!(!any_above(&[], f32::NEG_INFINITY));
    }

    #[test]
    fn exp_neg_is_accurate() {
        for i in 0..2000 {
            let x = -(i as f32) * 0.043;
            let (got, want) = (exp_neg(x), (x as f64).exp());
            assert!(
                ((got as f64 - want) / want).abs() < 1e-6,
                "exp({x}) = {got}, want {want}"
            );
        }
    }

    #[test]
    fn exp_neg_builds_the_bits_of_the_integer_conversion() {
        // Every float in [-88, 0] at a stride, both ends, the clamps and NaN.
        let mut xs: Vec<f32> = (0..=2_000_000)
            .map(|i| -(i as f32) * 88.0 / 2_000_000.0)
            .collect();
        xs.extend([
            0.0,
            -0.0,
            1.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            -87.0,
            f32::from_bits((-87.0f32).to_bits() + 1),
            f32::from_bits((-87.0f32).to_bits() - 1),
            -f32::MIN_POSITIVE,
            -1e-30,
            -0.346_573_6,
            -0.346_573_63,
        ]);
        for x in xs {
            assert_eq!(
                exp_neg(x).to_bits(),
                exp_neg_by_conversion(x).to_bits(),
                "x = {x}"
            );
        }
    }

    #[test]
    fn nan_and_huge_arguments_give_the_floor() {
        let floor = exp_neg(-87.0);
        assert!(floor > 0.0 && floor < 1e-37);
        assert_eq!(exp_neg(f32::NAN), floor);
        assert_eq!(exp_neg(f32::NEG_INFINITY), floor);
        assert_eq!(exp_neg(-1e30), floor);
        assert_eq!(exp_neg(5.0), 1.0);
    }

    #[test]
    fn the_normaliser_is_the_softmax_denominator() {
        for n in [0usize, 1, 15, 16, 17, 1000, 1024, 1040, 5000, 50_000] {
            let values: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 0.013).collect();
            let max = values.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            for t in [1.0f32, 0.7, 1.3, 0.05] {
                let got = softmax_normaliser(&values, max, t);
                let want: f64 = values
                    .iter()
                    .map(|&v| ((v as f64 - max as f64) / t as f64).exp())
                    .sum();
                // exp_neg's 2 ulp, nothing from the f64 sums.
                assert!(
                    (got - want).abs() <= want * 3e-7,
                    "n={n} t={t}: {got} vs {want}"
                );
                // Exactly the f64 sum of the same terms, to f64 rounding.
                let inv_t = 1.0 / t;
                let terms: f64 = values
                    .iter()
                    .map(|&v| exp_neg((v - max) * inv_t) as f64)
                    .sum();
                assert!((got - terms).abs() <= terms * 1e-13, "n={n} t={t}");
            }
        }
        assert_eq!(softmax_normaliser(&[], 0.0, 1.0), 0.0);
    }

    #[test]
    fn nan_adds_next_to_nothing() {
        let clean = [1.0f32, 2.0, 3.0];
        let with_nan = [1.0f32, f32::NAN, 2.0, 3.0];
        let (a, b) = (
            softmax_normaliser(&clean, 3.0, 1.0),
            softmax_normaliser(&with_nan, 3.0, 1.0),
        );
        assert!((a - b).abs() < 1e-30);
    }
}
