//! Bounds of the wire protocol, defined once for the three services.

/// Longest `session_id`, `tenant` and `cache_key`, in bytes, on every hop:
/// they travel in logs, spans and map keys. The gateway refuses a longer
/// one from its callers, so nothing behind it ever sees one.
pub const MAX_ID_BYTES: usize = 128;

/// Most verify steps one tree with no nodes may stand for (`TokenTree.span`).
/// A drafter never needs more: past it, one more message per this many steps
/// costs nothing measurable, and a bound keeps a bad drafter from switching
/// speculation off for the rest of a session in one message.
pub const MAX_TREE_SPAN: u32 = 64;

/// Drafted nodes per tree a drafter builds, at most, whatever the verifier
/// asks: a bigger tree costs the verifier more than any acceptance pays back.
pub const MAX_DRAFT_TOKENS: usize = 255;

/// Tree depth a drafter builds, at most, whatever the verifier asks.
pub const MAX_DEPTH: usize = 64;

/// Most cost-curve points used: the policy reads the curve a dozen times a
/// step, and a measured curve has about ten points.
pub const MAX_CURVE_POINTS: usize = 64;

/// The last step a tree or outcome starting at `step` and standing for
/// `span` steps covers (a span of 0 is read as 1); saturates rather than
/// wrapping on a hostile `step`.
pub fn last_step(step: u64, span: u32) -> u64 {
    step.saturating_add(u64::from(span.max(1)) - 1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_span_ends_where_its_steps_do() {
        assert_eq!(last_step(5, 0), 5);
        assert_eq!(last_step(5, 1), 5);
        assert_eq!(last_step(5, 4), 8);
        assert_eq!(last_step(u64::MAX - 1, 9), u64::MAX);
    }
}
