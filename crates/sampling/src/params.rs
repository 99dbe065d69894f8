//! Sampling parameters, validated once at the edge.

use specmesh_kernels::vec::exp_neg;

/// Rejected sampling parameters; each message names the field and its bound.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("`temperature` must be a finite number >= 0, got {0}")]
    Temperature(f32),
    #[error("`top_p` must be in (0, 1], got {0}")]
    TopP(f32),
}

/// How the next token is chosen. `temperature == 0` is greedy.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplingParams {
    pub temperature: f32,
    pub top_p: f32,
    /// 0 keeps every token.
    pub top_k: usize,
    pub seed: u64,
}

impl SamplingParams {
    pub fn new(
        temperature: f32,
        top_p: f32,
        top_k: usize,
        seed: u64,
    ) -> Result<Self, SamplingError> {
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(SamplingError::Temperature(temperature));
        }
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(SamplingError::TopP(top_p));
        }
        Ok(SamplingParams {
            temperature,
            top_p,
            top_k,
            seed,
        })
    }

    pub fn greedy() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            seed: 0,
        }
    }

    pub fn is_greedy(&self) -> bool {
        self.temperature == 0.0
    }

    /// The processed distribution as (token, probability) pairs after
    /// temperature, top-k and top-p: the most likely first (ties by lower
    /// id) for the first [`SORTED_HEAD`] tokens, then the rest of the
    /// support in an unspecified but deterministic order.
    ///
    /// Sorting a whole 50k vocabulary per sampled token would cost more than
    /// the rest of sampling together; inverse-CDF sampling is exact in any
    /// fixed order, and top-p only needs the order up to its cut (the rest
    /// is sorted only when the cut falls beyond the head).
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        let by_logit = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        if idx.is_empty() {
            return Vec::new();
        }
        if self.top_k > 0 && self.top_k < idx.len() {
            idx.select_nth_unstable_by(self.top_k - 1, by_logit);
            idx.truncate(self.top_k);
        }
        let mut sorted = idx.len().min(SORTED_HEAD);
        if sorted < idx.len() {
            idx.select_nth_unstable_by(sorted - 1, by_logit);
        }
        idx[..sorted].sort_unstable_by(by_logit);
        // NaN logits (a broken model) get probability zero; total_cmp sorts
        // them first, so the maximum is the first number.
        let max = idx
            .iter()
            .map(|&i| logits[i as usize])
            .find(|v| !v.is_nan())
            .unwrap_or(f32::NAN);
        let inv_t = 1.0 / self.temperature;
        let mut probs: Vec<(u32, f64)> = idx
            .iter()
            .map(|&i| {
                let l = logits[i as usize];
                let p = if l.is_nan() {
                    0.0
                } else {
                    exp_neg((l - max) * inv_t) as f64
                };
                (i, p)
            })
            .collect();
        let z: f64 = probs.iter().map(|p| p.1).sum();
        if !(z > 0.0 && z.is_finite()) {
            return Vec::new();
        }
        normalise(&mut probs);
        if self.top_p < 1.0 {
            let mut acc = 0.0;
            let mut cut = None;
            for (i, p) in probs.iter().enumerate() {
                if i == sorted {
                    break;
                }
                acc += p.1;
                if acc >= self.top_p as f64 {
                    cut = Some(i + 1);
                    break;
                }
            }
            let keep = match cut {
                Some(k) => k,
                None => {
                    // The cut lies in the tail: order it too.
                    probs[sorted..]
                        .sort_unstable_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
                    sorted = probs.len();
                    let mut acc = 0.0;
                    probs
                        .iter()
                        .position(|p| {
                            acc += p.1;
                            acc >= self.top_p as f64
                        })
                        .map_or(sorted, |i| i + 1)
                }
            };
            probs.truncate(keep);
            normalise(&mut probs);
        }
        probs
    }
}

/// Tokens of [`SamplingParams::distribution`] in most-likely-first order.
pub const SORTED_HEAD: usize = 512;

fn normalise(probs: &mut [(u32, f64)]) {
    let z: f64 = probs.iter().map(|p| p.1).sum();
    for p in probs {
        p.1 /= z;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn invalid_parameters_name_the_field() {
        assert_eq!(
            SamplingParams::new(-1.0, 1.0, 0, 0)
                .unwrap_err()
                .to_string(),
            "`temperature` must be a finite number >= 0, got -1"
        );
        assert!(SamplingParams::new(f32::NAN, 1.0, 0, 0).is_err());
        assert!(SamplingParams::new(1.0, 0.0, 0, 0).is_err());
        assert!(SamplingParams::new(1.0, 1.5, 0, 0).is_err());
    }

    #[test]
    fn large_vocabularies_keep_every_token_once_and_cut_beyond_the_head() {
        let n = 5000;
        let logits: Vec<f32> = (0..n).map(|i| ((i * 7919) % 1000) as f32 * 0.001).collect();
        let full = SamplingParams::new(1.0, 1.0, 0, 0)
            .unwrap()
            .distribution(&logits);
        assert_eq!(full.len(), n);
        let mut ids: Vec<u32> = full.iter().map(|p| p.0).collect();
        ids.sort();
        ids.dedup();
        assert_eq!(ids.len(), n);
        assert!((full.iter().map(|p| p.1).sum::<f64>() - 1.0).abs() < 1e-9);
        assert!(full[..SORTED_HEAD].windows(2).all(|w| w[0].1 >= w[1].1));
        // Near-flat logits: a 0.9 nucleus needs far more than the head.
        let nucleus = SamplingParams::new(1.0, 0.9, 0, 0)
            .unwrap()
            .distribution(&logits);
        assert!(nucleus.len() > SORTED_HEAD && nucleus.len() < n);
        assert!(nucleus.windows(2).all(|w| w[0].1 >= w[1].1));
        let min_kept = nucleus.last().unwrap().1;
        let max_cut = full
            .iter()
            .filter(|p| !nucleus.iter().any(|q| q.0 == p.0))
            .map(|p| p.1)
            .fold(0.0, f64::max);
        assert!(
            max_cut
                <= min_kept * (1.0 + 1e-9) * nucleus.iter().map(|p| p.1).sum::<f64>() / 0.9 + 1e-12
        );
    }

    #[test]
    fn top_k_and_top_p_cut_the_tail() {
        let logits = [3.0f32, 2.0, 1.0, 0.0];
        let p = SamplingParams::new(1.0, 1.0, 2, 0).unwrap();
        assert_eq!(p.distribution(&logits).len(), 2);
        let p = SamplingParams::new(1.0, 0.5, 0, 0).unwrap();
        let d = p.distribution(&logits);
        assert_eq!(d.len(), 1);
        assert!((d[0].1 - 1.0).abs() < 1e-12);
    }
}
