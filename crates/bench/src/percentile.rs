//! The percentile every benchmark reports: nearest rank on the sorted
//! values, the value at index `round((n - 1) · p)`. No interpolation, so a
//! reported p99 is a latency that some request had.

/// The `p`-quantile (`p` in [0, 1]) of `v`; 0 for no values.
pub fn percentile(mut v: Vec<f64>, p: f64) -> f64 {
    debug_assert!((0.0..=1.0).contains(&p), "p = {p}");
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(f64::total_cmp);
    v[((v.len() - 1) as f64 * p).round() as usize]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_are_nearest_rank_without_interpolation() {
        let v: Vec<f64> = (1..=10).rev().map(f64::from).collect();
        assert_eq!(percentile(v.clone(), 0.0), 1.0);
        // Index round(9 · 0.5) = round(4.5) = 5 (away from zero): the 6th value.
        assert_eq!(percentile(v.clone(), 0.5), 6.0);
        assert_eq!(percentile(v.clone(), 0.9), 9.0);
        assert_eq!(percentile(v.clone(), 0.99), 10.0);
        assert_eq!(percentile(v, 1.0), 10.0);
        assert_eq!(percentile(vec![3.0], 0.99), 3.0);
        assert_eq!(percentile(Vec::new(), 0.5), 0.0);
    }
}
