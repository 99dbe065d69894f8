//! The immutable tree and its read-only views.

/// Budgets a tree must respect. `max_nodes` counts the root.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TreeLimits {
    pub max_nodes: usize,
    pub max_depth: usize,
    pub vocab: u32,
}

impl TreeLimits {
    pub fn new(max_nodes: usize, max_depth: usize, vocab: u32) -> TreeLimits {
        TreeLimits {
            max_nodes: max_nodes.max(1),
            max_depth,
            vocab,
        }
    }
}

/// The draft model's distribution at a node, from which that node's children
/// were drawn **without replacement**, in child order. Only trees whose
/// children really were sampled this way may carry one: lossless recursive
/// rejection sampling relies on it.
#[derive(Clone, Debug, PartialEq)]
pub struct DraftDist {
    /// (token, probability), probabilities summing to 1.
    entries: Vec<(u32, f32)>,
}

impl DraftDist {
    /// Validates and normalises a sparse distribution.
    pub fn new(mut entries: Vec<(u32, f32)>, vocab: u32) -> Result<DraftDist, String> {
        if entries.is_empty() {
            return Err("it is empty".into());
        }
        let mut sum = 0.0f64;
        for &(t, p) in &entries {
            if t >= vocab {
                return Err(format!("token {t} is outside the vocabulary of {vocab}"));
            }
            if !p.is_finite() || p < 0.0 {
                return Err(format!("token {t} has probability {p}"));
            }
            sum += p as f64;
        }
        if (sum - 1.0).abs() > 1e-3 {
            return Err(format!("probabilities sum to {sum}, not 1"));
        }
        let mut seen: Vec<u32> = entries.iter().map(|e| e.0).collect();
        seen.sort_unstable();
        if let Some(w) = seen.windows(2).find(|w| w[0] == w[1]) {
            return Err(format!("token {} appears twice", w[0]));
        }
        for e in &mut entries {
            e.1 = (e.1 as f64 / sum) as f32;
        }
        Ok(DraftDist { entries })
    }

    pub fn entries(&self) -> &[(u32, f32)] {
        &self.entries
    }

    /// q(token), 0 outside the support.
    pub fn prob(&self, token: u32) -> f32 {
        self.entries
            .iter()
            .find(|e| e.0 == token)
            .map_or(0.0, |e| e.1)
    }
}

/// A token tree, valid by construction (see the crate docs).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenTree {
    pub(crate) tokens: Vec<u32>,
    /// `parents[0]` is 0 and meaningless: the root has no parent.
    pub(crate) parents: Vec<u32>,
    pub(crate) depths: Vec<u32>,
    pub(crate) scores: Vec<f32>,
    pub(crate) dists: Vec<Option<DraftDist>>,
    /// Children of node i are `children[child_start[i]..child_start[i + 1]]`,
    /// in the order they were added.
    pub(crate) child_start: Vec<u32>,
    pub(crate) children: Vec<u32>,
    pub(crate) limits: TreeLimits,
}

impl TokenTree {
    /// Number of nodes, root included (never 0).
    pub fn len(&self) -> usize {
        self.tokens.len()
    }

    /// Always false: a tree has its root. Present for clippy's sake.
    pub fn is_empty(&self) -> bool {
        false
    }

    /// Drafted nodes (all but the root).
    pub fn draft_len(&self) -> usize {
        self.tokens.len() - 1
    }

    pub fn root_token(&self) -> u32 {
        self.tokens[0]
    }

    pub fn limits(&self) -> TreeLimits {
        self.limits
    }

    pub fn tokens(&self) -> &[u32] {
        &self.tokens
    }

    pub fn token(&self, i: usize) -> u32 {
        self.tokens[i]
    }

    pub fn parent(&self, i: usize) -> Option<usize> {
        (i > 0).then(|| self.parents[i] as usize)
    }

    /// Parents as the model runtime takes them (`None` for the root).
    pub fn parent_list(&self) -> Vec<Option<usize>> {
        (0..self.len()).map(|i| self.parent(i)).collect()
    }

    /// Depth below the root (root = 0): the node's position offset.
    pub fn depth(&self, i: usize) -> usize {
        self.depths[i] as usize
    }

    pub fn max_depth(&self) -> usize {
        self.depths.iter().copied().max().unwrap_or(0) as usize
    }

    /// The drafter's estimate that the target accepts the path to `i`.
    pub fn score(&self, i: usize) -> f32 {
        self.scores[i]
    }

    pub fn children(&self, i: usize) -> &[u32] {
        &self.children[self.child_start[i] as usize..self.child_start[i + 1] as usize]
    }

    /// The child of `i` carrying `token`, if any.
    pub fn child_with(&self, i: usize, token: u32) -> Option<usize> {
        self.children(i)
            .iter()
            .map(|&c| c as usize)
            .find(|&c| self.tokens[c] == token)
    }

    /// The distribution `i`'s children were sampled from, if the drafter
    /// sent one.
    pub fn draft_dist(&self, i: usize) -> Option<&DraftDist> {
        self.dists[i].as_ref()
    }

    pub fn has_draft_dists(&self) -> bool {
        self.dists.iter().any(Option::is_some)
    }

    /// Node indices from the root to `i`, both included.
    pub fn path_to(&self, i: usize) -> Vec<usize> {
        let mut path = Vec::with_capacity(self.depth(i) + 1);
        let mut n = i;
        path.push(n);
        while let Some(p) = self.parent(n) {
            path.push(p);
            n = p;
        }
        path.reverse();
        path
    }

    /// Tokens from the root to `i`, both included.
    pub fn path_tokens(&self, i: usize) -> Vec<u32> {
        self.path_to(i)
            .into_iter()
            .map(|n| self.tokens[n])
            .collect()
    }

    /// Whether `a` is `b` or one of its ancestors.
    pub fn is_ancestor(&self, a: usize, b: usize) -> bool {
        let mut n = b;
        loop {
            if n == a {
                return true;
            }
            if n < a {
                return false;
            }
            match self.parent(n) {
                Some(p) => n = p,
                None => return false,
            }
        }
    }

    /// Row-major `len × len` attention mask: `mask[i * len + j]` is true when
    /// node i attends to node j (j is i or one of its ancestors).
    pub fn attention_mask(&self) -> Vec<bool> {
        let n = self.len();
        let mut mask = vec![false; n * n];
        for i in 0..n {
            let mut j = i;
            mask[i * n + j] = true;
            while let Some(p) = self.parent(j) {
                mask[i * n + p] = true;
                j = p;
            }
        }
        mask
    }

    /// Leaves, in node order.
    pub fn leaves(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.len()).filter(|&i| self.children(i).is_empty())
    }
}
