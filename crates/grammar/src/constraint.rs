//! One output's grammar state, as verification's [`Constraint`].

use llguidance::Matcher;
use specmesh_verify::{Constraint, ConstraintError};

/// A grammar following one output: at the next token's position.
pub struct TokenConstraint {
    matcher: Matcher,
    mask: Vec<u32>,
    /// Tokens advanced past.
    advanced: usize,
    /// End-of-sequence tokens advanced past after the grammar had already
    /// ended (the engine takes none then: they are the last advances).
    after_end: usize,
    /// The vocabulary's end-of-sequence tokens.
    eos: Vec<u32>,
    /// Microseconds spent computing masks, since the last read.
    mask_us: u64,
}

impl std::fmt::Debug for TokenConstraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TokenConstraint")
            .field("advanced", &self.advanced)
            .finish_non_exhaustive()
    }
}

fn failed(e: impl std::fmt::Display) -> ConstraintError {
    ConstraintError(e.to_string())
}

impl TokenConstraint {
    pub(crate) fn new(matcher: Matcher) -> TokenConstraint {
        let eos = matcher
            .tok_env()
            .map(|env| env.tok_trie().eos_tokens().to_vec())
            .unwrap_or_default();
        TokenConstraint {
            eos,
            matcher,
            mask: Vec::new(),
            advanced: 0,
            after_end: 0,
            mask_us: 0,
        }
    }

    /// Moves past output already committed (a session resumed elsewhere):
    /// refused if the grammar does not allow it.
    pub fn resume(&mut self, output: &[u32]) -> Result<(), ConstraintError> {
        let n = self.matcher.try_consume_tokens(output).map_err(failed)?;
        // After the grammar's end only end-of-sequence tokens follow (an
        // output with `ignore_eos` keeps them).
        let rest = &output[n..];
        if self.matcher.is_stopped() && rest.iter().all(|t| self.is_eos(*t)) {
            self.after_end += rest.len();
        } else if !rest.is_empty() {
            return Err(ConstraintError(format!(
                "the output so far leaves the grammar at token {n}"
            )));
        }
        self.advanced += output.len();
        Ok(())
    }

    fn is_eos(&self, token: u32) -> bool {
        self.eos.contains(&token)
    }

    /// Whether the output so far is complete under the grammar.
    pub fn is_accepting(&mut self) -> bool {
        self.matcher.is_accepting().unwrap_or(false)
    }

    /// Microseconds spent on masks since the last call.
    pub fn take_mask_us(&mut self) -> u64 {
        std::mem::take(&mut self.mask_us)
    }
}

impl Constraint for TokenConstraint {
    fn allowed(&mut self) -> Result<&[u32], ConstraintError> {
        let t0 = std::time::Instant::now();
        let mask = self.matcher.compute_mask_or_eos().map_err(failed)?;
        self.mask.clear();
        self.mask.extend_from_slice(mask.as_slice());
        self.mask_us += t0.elapsed().as_micros() as u64;
        Ok(&self.mask)
    }

    fn allows(&mut self, token: u32) -> Result<bool, ConstraintError> {
        if self.matcher.is_stopped() {
            return Ok(self.is_eos(token));
        }
        Ok(self.matcher.validate_tokens(&[token]).map_err(failed)? == 1)
    }

    fn advance(&mut self, token: u32) -> Result<(), ConstraintError> {
        if self.matcher.is_stopped() && self.is_eos(token) {
            // The grammar has ended; the end of sequence it allows is no
            // token to it.
            self.after_end += 1;
        } else {
            self.matcher.consume_token(token).map_err(failed)?;
        }
        self.advanced += 1;
        Ok(())
    }

    fn rollback(&mut self, n: usize) -> Result<(), ConstraintError> {
        let phantom = n.min(self.after_end);
        self.after_end -= phantom;
        self.matcher.rollback(n - phantom).map_err(failed)?;
        self.advanced -= n.min(self.advanced);
        Ok(())
    }

    fn forced(&mut self) -> Result<Vec<u32>, ConstraintError> {
        if self.matcher.is_stopped() {
            return Ok(Vec::new());
        }
        Ok(self.matcher.compute_ff_tokens())
    }
}
