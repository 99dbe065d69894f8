//! A toy target and drafters for the end-to-end tests: the target's logits
//! are a hash of the whole context, so every position has its own
//! distribution and plain decoding can be replayed exactly.

use std::cell::OnceCell;

use rand::Rng;
use specmesh_sampling::SamplingParams;
use specmesh_tree::{TokenTree, TreeBuilder, TreeError, TreeLimits};
use specmesh_verify::{LogitRows, Verification, verify};

/// SplitMix64's finaliser.
fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// A language model over `vocab` tokens whose logits, uniform in
/// `[0, scale)`, are a hash of `salt` and the context.
#[derive(Clone, Copy, Debug)]
pub struct Toy {
    pub vocab: u32,
    pub salt: u64,
    pub scale: f32,
}

impl Toy {
    pub fn logits(&self, context: &[u32]) -> Vec<f32> {
        let mut h = mix(self.salt);
        for &t in context {
            h = mix(h ^ (t as u64 + 1));
        }
        (0..self.vocab as u64)
            .map(|t| {
                let z = mix(h ^ (t + 1).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                (z >> 40) as f32 / (1u64 << 24) as f32 * self.scale
            })
            .collect()
    }

    /// Its distribution under `params` as (token, prob), the draft
    /// distribution format.
    pub fn dist(&self, context: &[u32], params: &SamplingParams) -> Vec<(u32, f32)> {
        params
            .distribution(&self.logits(context))
            .into_iter()
            .map(|(t, p)| (t, p as f32))
            .collect()
    }
}

/// The target's rows for a tree, computed when first read, so tests can
/// rely on the verifier reading only what it needs.
pub struct ToyRows<'a> {
    model: &'a Toy,
    context: &'a [u32],
    tree: &'a TokenTree,
    cells: Vec<OnceCell<Vec<f32>>>,
}

impl<'a> ToyRows<'a> {
    /// `context` ends with the tree's root token.
    pub fn new(model: &'a Toy, context: &'a [u32], tree: &'a TokenTree) -> Self {
        ToyRows {
            model,
            context,
            tree,
            cells: vec![OnceCell::new(); tree.len()],
        }
    }
}

impl LogitRows for ToyRows<'_> {
    fn num_rows(&self) -> usize {
        self.cells.len()
    }

    fn row(&self, node: usize) -> &[f32] {
        self.cells[node].get_or_init(|| {
            let path = self.tree.path_tokens(node);
            let mut c = Vec::with_capacity(self.context.len() + path.len());
            c.extend_from_slice(self.context);
            c.extend_from_slice(&path[1..]);
            self.model.logits(&c)
        })
    }
}

/// `n` tokens of plain decoding after `prompt`.
pub fn plain(model: &Toy, prompt: &[u32], n: usize, params: &SamplingParams) -> Vec<u32> {
    let mut context = prompt.to_vec();
    for i in 0..n {
        let t = specmesh_sampling::sample(&model.logits(&context), params, i as u64);
        context.push(t);
    }
    context.split_off(prompt.len())
}

/// `n` tokens of speculative decoding after `prompt`: `draft(context,
/// position)` proposes a tree rooted at the context's last token, for output
/// position `position` onwards. `seen` gets every verification.
pub fn speculative(
    model: &Toy,
    prompt: &[u32],
    n: usize,
    params: &SamplingParams,
    mut draft: impl FnMut(&[u32], u64) -> TokenTree,
    mut seen: impl FnMut(&TokenTree, &Verification),
) -> Vec<u32> {
    let mut context = prompt.to_vec();
    let mut out = Vec::with_capacity(n + 8);
    while out.len() < n {
        let position = out.len() as u64;
        let tree = draft(&context, position);
        let v = {
            let rows = ToyRows::new(model, &context, &tree);
            verify(&tree, &rows, params, position, 0).expect("the toy rows fit the tree")
        };
        seen(&tree, &v);
        for t in v.committed() {
            context.push(t);
            out.push(t);
        }
    }
    out.truncate(n);
    out
}

/// Grows a tree from `(parent, token)` proposals, tracking each node's
/// context so proposals can consult the models; duplicates collapse in the
/// builder.
pub struct Grower {
    pub builder: TreeBuilder,
    /// Context of node `i`: the committed context then the path to `i`.
    pub contexts: Vec<Vec<u32>>,
}

impl Grower {
    pub fn new(context: &[u32], limits: TreeLimits) -> Result<Grower, TreeError> {
        let root = *context.last().expect("a context has a root token");
        Ok(Grower {
            builder: TreeBuilder::new(root, limits)?,
            contexts: vec![context.to_vec()],
        })
    }

    pub fn push(&mut self, parent: usize, token: u32) -> Result<usize, TreeError> {
        let i = self.builder.push(parent, token, 1.0)?;
        if i == self.contexts.len() {
            let parent = &self.contexts[parent];
            let mut c = Vec::with_capacity(parent.len() + 1);
            c.extend_from_slice(parent);
            c.push(token);
            self.contexts.push(c);
        }
        Ok(i)
    }
}

/// Draws up to `m` distinct tokens from `q` without replacement, in draw
/// order.
pub fn without_replacement(q: &[(u32, f32)], m: usize, rng: &mut impl Rng) -> Vec<u32> {
    let mut rest: Vec<(u32, f64)> = q.iter().map(|&(t, p)| (t, p as f64)).collect();
    rest.retain(|e| e.1 > 0.0);
    let mut out = Vec::with_capacity(m);
    while out.len() < m && !rest.is_empty() {
        let total: f64 = rest.iter().map(|e| e.1).sum();
        let mut u = rng.random::<f64>() * total;
        let mut j = rest.len() - 1;
        for (i, e) in rest.iter().enumerate() {
            if u < e.1 {
                j = i;
                break;
            }
            u -= e.1;
        }
        out.push(rest.remove(j).0);
    }
    out
}

/// Draws `n` tokens from `q` with replacement (duplicates included).
pub fn with_replacement(q: &[(u32, f32)], n: usize, rng: &mut impl Rng) -> Vec<u32> {
    (0..n).map(|_| without_replacement(q, 1, rng)[0]).collect()
}

/// Exact probability of every sequence of `len` tokens after `prompt`
/// under `params`, indexed by the sequence read as base-`vocab` digits
/// (first token most significant).
pub fn sequence_probs(
    model: &Toy,
    prompt: &[u32],
    len: usize,
    params: &SamplingParams,
) -> Vec<f64> {
    let cells = (model.vocab as usize).pow(len as u32);
    let mut probs = vec![0.0; cells];
    let mut stack = vec![(prompt.to_vec(), 1.0f64, 0usize)];
    while let Some((context, prob, index)) = stack.pop() {
        if context.len() == prompt.len() + len {
            probs[index] = prob;
            continue;
        }
        for (t, p) in params.distribution(&model.logits(&context)) {
            let mut c = context.clone();
            c.push(t);
            stack.push((c, prob * p, index * model.vocab as usize + t as usize));
        }
    }
    probs
}

/// Index of a sequence in [`sequence_probs`]' order.
pub fn sequence_index(tokens: &[u32], vocab: u32) -> usize {
    tokens
        .iter()
        .fold(0, |acc, &t| acc * vocab as usize + t as usize)
}

/// Upper `z`-quantile of chi-square with `df` degrees of freedom by the
/// Wilson–Hilferty approximation (within about 1% for df ≥ 10).
pub fn chi2_quantile(df: usize, z: f64) -> f64 {
    let d = df as f64;
    let a = 2.0 / (9.0 * d);
    d * (1.0 - a + z * a.sqrt()).powi(3)
}

/// The standard normal's upper 1e-4 quantile: tests thresholded with it
/// fail by chance about once in 10,000 runs (each test is deterministic
/// with its fixed seeds, so this is the chance that the chosen seeds are
/// unlucky).
pub const Z_1E4: f64 = 3.719;

/// Pearson's chi-square of `counts` against `probs` (same indexing). The
/// least likely cells are pooled until the pool expects at least 5, as the
/// chi-square approximation needs; a cell of probability 0 must have count
/// 0. Returns (statistic, degrees of freedom).
pub fn chi_square(counts: &[u64], probs: &[f64]) -> (f64, usize) {
    let n = counts.iter().sum::<u64>() as f64;
    let mut cells = Vec::with_capacity(counts.len());
    for (i, (&c, &p)) in counts.iter().zip(probs).enumerate() {
        if p == 0.0 {
            assert_eq!(c, 0, "sequence {i} has probability 0 but came up {c} times");
        } else {
            cells.push((c as f64, p * n));
        }
    }
    cells.sort_by(|a, b| a.1.total_cmp(&b.1));
    let (mut obs, mut exp) = (0.0, 0.0);
    let mut stat = 0.0;
    let mut bins = 0usize;
    for (c, e) in cells {
        if exp < 5.0 || e < 5.0 {
            obs += c;
            exp += e;
            continue;
        }
        stat += (c - e).powi(2) / e;
        bins += 1;
    }
    if exp > 0.0 {
        stat += (obs - exp).powi(2) / exp;
        bins += 1;
    }
    (stat, bins.saturating_sub(1))
}
