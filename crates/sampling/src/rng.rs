//! A counter-based uniform generator: SplitMix64's finaliser (Steele et al.,
//! "Fast splittable pseudorandom number generators", OOPSLA 2014) applied to
//! the key (seed, position). Statistically strong for this use and free of
//! state, so any position can be drawn in any order.

#[inline]
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A uniform number in [0, 1) determined by `(seed, position)` alone.
pub fn uniform(seed: u64, position: u64) -> f64 {
    let k = mix(seed.wrapping_add(0x9e37_79b9_7f4a_7c15));
    let z = mix(k ^ mix(position.wrapping_mul(0x9e37_79b9_7f4a_7c15).wrapping_add(1)));
    // 53 random mantissa bits.
    (z >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uniforms_are_in_range_and_roughly_uniform() {
        let n = 100_000;
        let mut buckets = [0usize; 10];
        for i in 0..n {
            let u = uniform(42, i);
            assert!((0.0..1.0).contains(&u));
            buckets[(u * 10.0) as usize] += 1;
        }
        // Chi-square with 9 degrees of freedom; 27.88 is the 0.999 quantile.
        let e = n as f64 / 10.0;
        let chi2: f64 = buckets.iter().map(|&b| (b as f64 - e).powi(2) / e).sum();
        assert!(chi2 < 27.88, "chi2 = {chi2}");
    }
}
