//! Growing a tree node by node under its budgets.

use crate::{DraftDist, TokenTree, TreeError, TreeLimits};

/// Builds a [`TokenTree`], enforcing its limits on every push.
///
/// Pushing a token its parent already has as a child returns that child
/// (keeping the higher score): drafters may propose the same continuation
/// twice, the tree holds it once. Scores are clamped to their parent's, so
/// they never grow along a path.
#[derive(Debug, Clone)]
pub struct TreeBuilder {
    limits: TreeLimits,
    tokens: Vec<u32>,
    parents: Vec<u32>,
    depths: Vec<u32>,
    scores: Vec<f32>,
    dists: Vec<Option<DraftDist>>,
    kids: Vec<Vec<u32>>,
}

impl TreeBuilder {
    pub fn new(root: u32, limits: TreeLimits) -> Result<TreeBuilder, TreeError> {
        if root >= limits.vocab {
            return Err(TreeError::TokenOutOfVocab {
                index: 0,
                token: root,
                vocab: limits.vocab,
            });
        }
        Ok(TreeBuilder {
            limits,
            tokens: vec![root],
            parents: vec![0],
            depths: vec![0],
            scores: vec![1.0],
            dists: vec![None],
            kids: vec![Vec::new()],
        })
    }

    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Never true: the root is always there.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// True when no further node fits the node budget.
    pub fn is_full(&self) -> bool {
        self.tokens.len() >= self.limits.max_nodes
    }

    pub fn limits(&self) -> TreeLimits {
        self.limits
    }

    pub fn token(&self, i: usize) -> u32 {
        self.tokens[i]
    }

    pub fn depth(&self, i: usize) -> usize {
        self.depths[i] as usize
    }

    pub fn score(&self, i: usize) -> f32 {
        self.scores[i]
    }

    /// The existing child of `parent` carrying `token`.
    pub fn child_with(&self, parent: usize, token: u32) -> Option<usize> {
        self.kids
            .get(parent)?
            .iter()
            .map(|&c| c as usize)
            .find(|&c| self.tokens[c] == token)
    }

    /// Adds `token` under `parent` and returns its node index (an existing
    /// sibling with the same token is reused).
    pub fn push(&mut self, parent: usize, token: u32, score: f32) -> Result<usize, TreeError> {
        let index = self.tokens.len();
        if parent >= index {
            return Err(TreeError::BadParent { index, parent });
        }
        if token >= self.limits.vocab {
            return Err(TreeError::TokenOutOfVocab {
                index,
                token,
                vocab: self.limits.vocab,
            });
        }
        if !(0.0..=1.0).contains(&score) {
            return Err(TreeError::BadScore { index, score });
        }
        let score = score.min(self.scores[parent]);
        if let Some(existing) = self.child_with(parent, token) {
            self.scores[existing] = self.scores[existing].max(score);
            return Ok(existing);
        }
        let depth = self.depths[parent] as usize + 1;
        if depth > self.limits.max_depth {
            return Err(TreeError::TooDeep {
                index,
                depth,
                max: self.limits.max_depth,
            });
        }
        if index >= self.limits.max_nodes {
            return Err(TreeError::TooManyNodes {
                nodes: index + 1,
                max: self.limits.max_nodes,
            });
        }
        if let Some(d) = &self.dists[parent]
            && d.prob(token) <= 0.0
        {
            return Err(TreeError::BadDraftDist {
                index: parent,
                reason: format!("child token {token} has no probability in it"),
            });
        }
        self.tokens.push(token);
        self.parents.push(parent as u32);
        self.depths.push(depth as u32);
        self.scores.push(score);
        self.dists.push(None);
        self.kids.push(Vec::new());
        self.kids[parent].push(index as u32);
        Ok(index)
    }

    /// Records the draft distribution `node`'s children were sampled from
    /// (without replacement, in child order).
    pub fn set_draft_dist(
        &mut self,
        node: usize,
        entries: Vec<(u32, f32)>,
    ) -> Result<(), TreeError> {
        if node >= self.tokens.len() {
            return Err(TreeError::BadDraftDist {
                index: node,
                reason: format!("the tree has only {} nodes", self.tokens.len()),
            });
        }
        let dist = DraftDist::new(entries, self.limits.vocab).map_err(|reason| {
            TreeError::BadDraftDist {
                index: node,
                reason,
            }
        })?;
        if let Some(&c) = self.kids[node]
            .iter()
            .find(|&&c| dist.prob(self.tokens[c as usize]) <= 0.0)
        {
            return Err(TreeError::BadDraftDist {
                index: node,
                reason: format!(
                    "child token {} has no probability in it",
                    self.tokens[c as usize]
                ),
            });
        }
        self.dists[node] = Some(dist);
        Ok(())
    }

    pub fn build(self) -> TokenTree {
        let n = self.tokens.len();
        let mut child_start = Vec::with_capacity(n + 1);
        let mut children = Vec::with_capacity(n.saturating_sub(1));
        for k in &self.kids {
            child_start.push(children.len() as u32);
            children.extend_from_slice(k);
        }
        child_start.push(children.len() as u32);
        TokenTree {
            tokens: self.tokens,
            parents: self.parents,
            depths: self.depths,
            scores: self.scores,
            dists: self.dists,
            child_start,
            children,
            limits: self.limits,
        }
    }
}

/// The trees made whole in one call: through a builder, so they are
/// checked like every other.
impl TokenTree {
    /// A tree of the root alone: plain decoding.
    pub fn root_only(root: u32, limits: TreeLimits) -> Result<TokenTree, TreeError> {
        TreeBuilder::new(root, limits).map(TreeBuilder::build)
    }

    /// A root-only tree as faithful to `root` and `limits` as they allow,
    /// for a drafter whose context breaks its contract (empty, or a root
    /// outside the vocabulary): it answers with this rather than a panic,
    /// and the verifier refuses it like any other malformed tree. Token 0
    /// when there is no root; a vocabulary just wide enough for the root
    /// when the limits' is not.
    pub fn placeholder(root: Option<u32>, limits: TreeLimits) -> TokenTree {
        let root = root.unwrap_or(0);
        TokenTree::root_only(root, limits)
            .or_else(|_| {
                let vocab = root.saturating_add(1);
                TokenTree::root_only(root, TreeLimits { vocab, ..limits })
            })
            .or_else(|_| TokenTree::root_only(0, TreeLimits::new(1, 0, 1)))
            .expect("token 0 always fits a vocabulary of one")
    }

    /// Builds a tree from wire data: `nodes[j]` is node `j + 1` as
    /// (parent, token, score), and `dists` gives the draft distributions of
    /// some nodes as (node, entries). Everything is checked; nothing is
    /// trusted. Duplicate siblings are refused rather than merged, since a
    /// sender that repeats itself is broken.
    pub fn from_untrusted(
        root: u32,
        nodes: impl IntoIterator<Item = (u32, u32, f32)>,
        dists: impl IntoIterator<Item = (u32, Vec<(u32, f32)>)>,
        limits: TreeLimits,
    ) -> Result<TokenTree, TreeError> {
        let mut b = TreeBuilder::new(root, limits)?;
        for (j, (parent, token, score)) in nodes.into_iter().enumerate() {
            let index = j + 1;
            if parent as usize >= index {
                return Err(TreeError::BadParent {
                    index,
                    parent: parent as usize,
                });
            }
            if let Some(sibling) = b.child_with(parent as usize, token) {
                return Err(TreeError::DuplicateSibling {
                    index,
                    sibling,
                    token,
                });
            }
            b.push(parent as usize, token, score)?;
        }
        for (node, entries) in dists {
            b.set_draft_dist(node as usize, entries)?;
        }
        Ok(b.build())
    }
}
