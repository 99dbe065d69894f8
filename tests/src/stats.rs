//! The statistics the sampling tests state their claims with.

/// Chi-square homogeneity statistic of two samples over the same
/// categories, pooling categories with fewer than 10 observations in total
/// (so every expected count is at least 5).
pub fn homogeneity(a: &[u32], b: &[u32]) -> (f64, usize) {
    use std::collections::BTreeMap;
    let mut counts: BTreeMap<u32, (f64, f64)> = BTreeMap::new();
    for &t in a {
        counts.entry(t).or_default().0 += 1.0;
    }
    for &t in b {
        counts.entry(t).or_default().1 += 1.0;
    }
    let mut cells: Vec<(f64, f64)> = Vec::new();
    let mut pooled = (0.0, 0.0);
    for (_, c) in counts {
        if c.0 + c.1 >= 10.0 {
            cells.push(c);
        } else {
            pooled.0 += c.0;
            pooled.1 += c.1;
        }
    }
    if pooled.0 + pooled.1 > 0.0 {
        cells.push(pooled);
    }
    let (na, nb) = (a.len() as f64, b.len() as f64);
    let n = na + nb;
    let mut chi2 = 0.0;
    for (x, y) in &cells {
        let total = x + y;
        for (obs, size) in [(x, na), (y, nb)] {
            let e = total * size / n;
            chi2 += (obs - e).powi(2) / e;
        }
    }
    (chi2, cells.len().saturating_sub(1))
}

/// The 0.999 quantile of chi-square with `df` degrees of freedom
/// (Wilson–Hilferty approximation, within 1% for df >= 3).
pub fn chi2_999(df: usize) -> f64 {
    let k = df.max(1) as f64;
    let z = 3.090_232; // the normal 0.999 quantile
    k * (1.0 - 2.0 / (9.0 * k) + z * (2.0 / (9.0 * k)).sqrt()).powi(3)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_homogeneity_test_detects_a_shifted_distribution() {
        // The statistic must be able to fail: two clearly different samples.
        let a: Vec<u32> = (0..200).map(|i| i % 4).collect();
        let b: Vec<u32> = (0..200)
            .map(|i| if i % 2 == 0 { 0 } else { (i % 4) as u32 })
            .collect();
        let (chi2, df) = homogeneity(&a, &b);
        assert!(chi2 > chi2_999(df), "chi2 {chi2} df {df}");
        let (same, df) = homogeneity(&a, &a);
        assert!(same < 1e-9 && same <= chi2_999(df));
    }
}
