//! What a tree may be drafted from, as the request asked: the one piece
//! of drafting vocabulary the wire, the verifier and the drafter share.
//! It lives with the tree, below them all, so the wire contracts need not
//! depend on the speculation core that interprets it.

/// What a session may draft with, as the request asked.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Sources {
    /// The drafter's policy chooses per step among what it has.
    #[default]
    Auto,
    /// Suffix decoding, prompt lookup and token recycling only.
    ModelFree,
    /// The draft model only.
    DraftModel,
    /// The draft model and the model-free drafters, merged into one tree.
    Combined,
}

impl Sources {
    /// Whether these sources need a draft model.
    pub fn needs_model(self) -> bool {
        matches!(self, Sources::DraftModel | Sources::Combined)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_model_sources_need_a_model() {
        assert!(Sources::Combined.needs_model() && Sources::DraftModel.needs_model());
        assert!(!Sources::Auto.needs_model() && !Sources::ModelFree.needs_model());
    }
}
