//! `min_tokens`: no end of sequence before the output has so many tokens,
//! as a [`Constraint`] (over the output's grammar when it has one), so
//! that speculation keeps it exactly as it keeps a grammar: a drafted EOS
//! too early is cut, and the target's distribution there is its own
//! without EOS, renormalised.

use crate::constraint::{Constraint, ConstraintError};

/// Forbids `eos` tokens at the first `min` output positions from where it
/// starts, on top of `inner`.
#[derive(Debug)]
pub struct MinTokens {
    /// Advances past since the start (rollback's counter).
    at: usize,
    min_from_start: usize,
    eos: Vec<u32>,
    /// Row width, for the mask when there is no inner constraint.
    vocab: usize,
    inner: Option<Box<dyn Constraint>>,
    mask: Vec<u32>,
}

impl MinTokens {
    /// `min` more output tokens before any of `eos`; rows are `vocab` wide.
    pub fn new(
        min: usize,
        eos: Vec<u32>,
        vocab: usize,
        inner: Option<Box<dyn Constraint>>,
    ) -> MinTokens {
        MinTokens {
            at: 0,
            min_from_start: min,
            eos,
            vocab,
            inner,
            mask: Vec::new(),
        }
    }

    fn early(&self) -> bool {
        self.at < self.min_from_start
    }
}

impl Constraint for MinTokens {
    fn allowed(&mut self) -> Result<&[u32], ConstraintError> {
        let early = self.early();
        match self.inner.as_deref_mut() {
            Some(c) => {
                let words = c.allowed()?;
                self.mask.clear();
                self.mask.extend_from_slice(words);
            }
            None => {
                self.mask.clear();
                self.mask.resize(self.vocab.div_ceil(32), u32::MAX);
                if !self.vocab.is_multiple_of(32)
                    && let Some(last) = self.mask.last_mut()
                {
                    *last = (1u32 << (self.vocab % 32)) - 1;
                }
            }
        }
        if early {
            let before = self.mask.iter().any(|&w| w != 0);
            for &t in &self.eos {
                if let Some(w) = self.mask.get_mut(t as usize / 32) {
                    *w &= !(1 << (t % 32));
                }
            }
            // A grammar that allows nothing but the end: the end it is
            // (`min_tokens` cannot make a complete grammar go on).
            if before && self.mask.iter().all(|&w| w == 0) {
                for &t in &self.eos {
                    if let Some(w) = self.mask.get_mut(t as usize / 32) {
                        *w |= 1 << (t % 32);
                    }
                }
            }
        }
        Ok(&self.mask)
    }

    fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        if self.early() && self.eos.contains(&token) {
            return Ok(false);
        }
        match self.inner.as_deref_mut() {
            Some(c) => c.allows(token),
            None => Ok((token as usize) < self.vocab),
        }
    }

    fn advance(&mut self, token: u32) -> Result<(), ConstraintError> {
        if let Some(c) = self.inner.as_deref_mut() {
            c.advance(token)?;
        }
        self.at += 1;
        Ok(())
    }

    fn rollback(&mut self, n: usize) -> Result<(), ConstraintError> {
        if let Some(c) = self.inner.as_deref_mut() {
            c.rollback(n)?;
        }
        self.at = self.at.saturating_sub(n);
        Ok(())
    }

    fn forced(&mut self) -> Result<Vec<u32>, ConstraintError> {
        match self.inner.as_deref_mut() {
            Some(c) => c.forced(),
            None => Ok(Vec::new()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Extras, verify_with};
    use specmesh_sampling::SamplingParams;
    use specmesh_tree::{TokenTree, TreeLimits};

    #[test]
    fn eos_waits_for_the_minimum_then_comes() {
        let mut c = MinTokens::new(2, vec![3], 5, None);
        let row = vec![0.0f32, 1.0, 0.5, 9.0, 0.0];
        let mut out = Vec::new();
        for _ in 0..3 {
            let root = TokenTree::root_only(0, TreeLimits::new(1, 0, 5)).unwrap();
            let extras = Extras {
                constraint: Some(&mut c),
                logprobs: None,
                rejections: &[],
            };
            let v = verify_with(
                &root,
                &vec![row.clone()],
                &SamplingParams::greedy(),
                0,
                0,
                extras,
            )
            .unwrap();
            out.push(v.bonus);
        }
        assert_eq!(out, [1, 1, 3]);
        c.rollback(2).unwrap();
        assert!(!c.allows(3).unwrap());
        assert_eq!(c.allowed().unwrap(), [0b10111]);
    }
}
