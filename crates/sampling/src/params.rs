//! Sampling parameters, validated once at the edge.

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

    /// The processed distribution as (token, probability) pairs, most likely
    /// first (ties by lower id), after temperature, top-k and top-p.
    pub fn distribution(&self, logits: &[f32]) -> Vec<(u32, f64)> {
        let t = self.temperature as f64;
        let mut idx: Vec<u32> = (0..logits.len() as u32).collect();
        let by_logit = |a: &u32, b: &u32| {
            logits[*b as usize]
                .total_cmp(&logits[*a as usize])
                .then(a.cmp(b))
        };
        if self.top_k > 0 && self.top_k < idx.len() {
            idx.select_nth_unstable_by(self.top_k - 1, by_logit);
            idx.truncate(self.top_k);
        }
        idx.sort_by(by_logit);
        let max = idx.first().map_or(0.0, |&i| logits[i as usize] as f64);
        let mut probs: Vec<(u32, f64)> = idx
            .into_iter()
            .map(|i| (i, ((logits[i as usize] as f64 - max) / t).exp()))
            .collect();
        let z: f64 = probs.iter().map(|p| p.1).sum();
        for p in &mut probs {
            p.1 /= z;
        }
        if self.top_p < 1.0 {
            let mut acc = 0.0;
            let keep = probs
                .iter()
                .position(|p| {
                    acc += p.1;
                    acc >= self.top_p as f64
                })
                .map_or(probs.len(), |i| i + 1);
            probs.truncate(keep);
            let z: f64 = probs.iter().map(|p| p.1).sum();
            for p in &mut probs {
                p.1 /= z;
            }
        }
        probs
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
