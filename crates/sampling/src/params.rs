//! Sampling parameters, validated once at the edge.

use specmesh_numeric::{exp_neg, softmax_normaliser};

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
        self.distribution_in(logits, None)
    }

    /// [`Self::distribution`] over the tokens `allowed` lets through (all
    /// of them with `None`): the target's distribution under a grammar,
    /// masked and renormalised before temperature, top-k and top-p, as
    /// every grammar engine's logits processor does. A token the mask
    /// forbids is not in the support at all (not merely improbable), so
    /// nothing, rounding included, can draw it.
    pub fn distribution_in(&self, logits: &[f32], allowed: Option<Allowed<'_>>) -> Vec<(u32, f64)> {
        let by_logit = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        let mut idx: Vec<u32> = match allowed {
            None => (0..logits.len() as u32).collect(),
            Some(a) => (0..logits.len() as u32).filter(|&t| a.allows(t)).collect(),
        };
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
        if max.is_nan() {
            return Vec::new();
        }
        // Each kept token's exp_neg term over the shared softmax normaliser
        // of the kept logits (the whole row without a top-k cut), which
        // sums the very same terms in f64: the probabilities sum to 1 to
        // f64 rounding, and the verifier and drafter use the same numbers.
        let inv_t = 1.0 / self.temperature;
        let z = if idx.len() == logits.len() {
            softmax_normaliser(logits, max, self.temperature)
        } else {
            let kept: Vec<f32> = idx.iter().map(|&i| logits[i as usize]).collect();
            softmax_normaliser(&kept, max, self.temperature)
        };
        if !(z > 0.0 && z.is_finite()) {
            return Vec::new();
        }
        let mut probs: Vec<(u32, f64)> = idx
            .iter()
            .map(|&i| {
                let l = logits[i as usize];
                let p = if l.is_nan() {
                    0.0
                } else {
                    exp_neg((l - max) * inv_t) as f64 / z
                };
                (i, p)
            })
            .collect();
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

/// The tokens a constraint (a grammar) allows at one position: bit `t % 32`
/// of word `t / 32` is set when token `t` may come next (llguidance's and
/// the GPU bitmask kernels' layout). Tokens past the last word are not
/// allowed.
#[derive(Clone, Copy, Debug)]
pub struct Allowed<'a> {
    words: &'a [u32],
}

impl<'a> Allowed<'a> {
    pub fn new(words: &'a [u32]) -> Allowed<'a> {
        Allowed { words }
    }

    pub fn allows(&self, token: u32) -> bool {
        self.words
            .get(token as usize / 32)
            .is_some_and(|w| w >> (token % 32) & 1 == 1)
    }

    /// How many tokens are allowed.
    pub fn count(&self) -> usize {
        self.words.iter().map(|w| w.count_ones() as usize).sum()
    }

    /// The one token allowed, when exactly one is.
    pub fn single(&self) -> Option<u32> {
        let mut found = None;
        for (i, &w) in self.words.iter().enumerate() {
            if w == 0 {
                continue;
            }
            if found.is_some() || w.count_ones() != 1 {
                return None;
            }
            found = Some(i as u32 * 32 + w.trailing_zeros());
        }
        found
    }

    pub fn words(&self) -> &'a [u32] {
        self.words
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
    fn probabilities_are_exp_neg_over_the_shared_normaliser() {
        // The most likely token's term is exp_neg(0) = 1, so its probability
        // is exactly 1 / z with z the normaliser the verifier and the
        // drafter compute for the same row; with a top-k cut, z runs over
        // the kept logits only.
        let logits: Vec<f32> = (0..3000)
            .map(|i| ((i * 7919) % 1000) as f32 * 0.004)
            .collect();
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        for (t, k) in [(1.0f32, 0usize), (0.7, 0), (1.3, 50)] {
            let d = SamplingParams::new(t, 1.0, k, 0)
                .unwrap()
                .distribution(&logits);
            let z = if k == 0 {
                softmax_normaliser(&logits, max, t)
            } else {
                let kept: Vec<f32> = d.iter().map(|p| logits[p.0 as usize]).collect();
                softmax_normaliser(&kept, max, t)
            };
            assert_eq!(d[0].1.to_bits(), (1.0 / z).to_bits(), "t={t} k={k}");
            assert!((d.iter().map(|p| p.1).sum::<f64>() - 1.0).abs() < 1e-12);
        }
        let nan = [f32::NAN, f32::NAN];
        assert!(
            SamplingParams::new(1.0, 1.0, 0, 0)
                .unwrap()
                .distribution(&nan)
                .is_empty()
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
