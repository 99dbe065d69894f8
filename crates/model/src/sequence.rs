//! Per-sequence state: the KV cache of one session, with staged (not yet
//! accepted) tokens and O(path) commit / O(1) rollback.
//!
//! Slots `0..len` hold the committed prefix in position order. A forward
//! writes its block's K/V into slots `len..len + n` (staged). `commit(path)`
//! moves the kept tokens' K/V down to `len..len + path.len()` — they are
//! scattered inside the block when the path is a tree branch — and drops the
//! rest; `truncate` just lowers `len`.

use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::kv::{KvDtype, Plane, PlaneRef};

#[derive(Clone, Debug)]
pub(crate) struct Staged {
    positions: Vec<u32>,
    parents: Vec<Option<u32>>,
}

/// The KV cache and committed length of one sequence.
#[derive(Clone, Debug)]
pub struct Sequence {
    kv_dim: usize,
    dtype: KvDtype,
    max_context: usize,
    len: usize,
    /// Slots allocated per layer (grows on demand up to `max_context`).
    capacity: usize,
    k: Vec<Plane>,
    v: Vec<Plane>,
    staged: Option<Staged>,
}

impl Sequence {
    pub(crate) fn new(cfg: &LlamaConfig, n_layers: usize, dtype: KvDtype) -> Sequence {
        Sequence {
            kv_dim: cfg.kv_dim(),
            dtype,
            max_context: cfg.max_context,
            len: 0,
            capacity: 0,
            k: vec![Plane::new(dtype); n_layers],
            v: vec![Plane::new(dtype); n_layers],
            staged: None,
        }
    }

    /// Committed tokens.
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Tokens of the last forward not yet committed or discarded.
    pub fn staged_len(&self) -> usize {
        self.staged.as_ref().map_or(0, |s| s.positions.len())
    }

    /// Layers this cache was created for.
    pub fn n_layers(&self) -> usize {
        self.k.len()
    }

    /// What K and V are stored as.
    pub fn kv_dtype(&self) -> KvDtype {
        self.dtype
    }

    /// Bytes held by the KV cache (what a verifier budgets per session).
    pub fn kv_bytes(&self) -> usize {
        self.capacity * self.bytes_per_token()
    }

    /// Keeps the staged tokens `kept` — a root-to-node path of the last
    /// block, in order — as the next committed tokens and drops the others.
    /// An empty `kept` discards the whole block.
    pub fn commit(&mut self, kept: &[usize]) -> Result<()> {
        let staged = self
            .staged
            .as_ref()
            .ok_or_else(|| ModelError::InvalidCommit("no staged block to commit".into()))?;
        let n = staged.positions.len();
        for (j, &i) in kept.iter().enumerate() {
            if i >= n {
                return Err(ModelError::InvalidCommit(format!(
                    "index {i} is out of range: the block has {n} tokens"
                )));
            }
            let expected_parent = j.checked_sub(1).map(|p| kept[p] as u32);
            if staged.parents[i] != expected_parent {
                return Err(ModelError::InvalidCommit(format!(
                    "kept tokens must form a root-to-node path: token {i} has parent {:?}, expected {:?}",
                    staged.parents[i], expected_parent
                )));
            }
            if staged.positions[i] as usize != self.len + j {
                return Err(ModelError::InvalidCommit(format!(
                    "token {i} was computed at position {} but would be committed at {}",
                    staged.positions[i],
                    self.len + j
                )));
            }
        }
        let d = self.kv_dim;
        for (j, &i) in kept.iter().enumerate() {
            if i == j {
                continue;
            }
            let (src, dst) = ((self.len + i) * d, (self.len + j) * d);
            for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
                layer.copy_within(src..src + d, dst);
            }
        }
        self.len += kept.len();
        self.staged = None;
        Ok(())
    }

    /// Drops the staged block.
    pub fn discard(&mut self) {
        self.staged = None;
    }

    /// Rolls the committed prefix back to `len` tokens (no-op if longer) and
    /// drops any staged block.
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
        self.staged = None;
    }

    /// Bytes one token's K and V take over all layers: the size of what
    /// [`Sequence::export`] returns per token.
    pub fn bytes_per_token(&self) -> usize {
        2 * self.k.len() * self.kv_dim * self.dtype.bytes()
    }

    /// The committed K and V of tokens `start..start + n`, every layer's K
    /// then V, as stored (f16 or f32 in native byte order: what
    /// [`Sequence::import`] of a sequence of the same model and
    /// [`KvDtype`] takes), for a prefix cache.
    pub fn export(&self, start: usize, n: usize) -> Result<Vec<u8>> {
        if start + n > self.len {
            return Err(ModelError::InvalidCommit(format!(
                "cannot export tokens {start}..{}: {} are committed",
                start + n,
                self.len
            )));
        }
        let d = self.kv_dim;
        let mut out = Vec::with_capacity(n * self.bytes_per_token());
        for (k, v) in self.k.iter().zip(&self.v) {
            k.export(start * d..(start + n) * d, &mut out);
            v.export(start * d..(start + n) * d, &mut out);
        }
        Ok(out)
    }

    /// Appends exported KV (of the tokens right after the committed
    /// prefix, from another sequence of the same model) as committed: the
    /// logits that follow are bit-identical to computing it here.
    pub fn import(&mut self, data: &[u8]) -> Result<()> {
        let per = self.bytes_per_token();
        if per == 0 || !data.len().is_multiple_of(per) {
            return Err(ModelError::InvalidCommit(format!(
                "imported KV holds {} bytes, not a whole number of tokens of {per} ({} KV)",
                data.len(),
                self.dtype
            )));
        }
        let n = data.len() / per;
        if n == 0 {
            return Ok(());
        }
        self.reserve(n)?;
        let (d, at) = (self.kv_dim, self.len * self.kv_dim);
        let mut chunks = data.chunks_exact(n * d * self.dtype.bytes());
        for (k, v) in self.k.iter_mut().zip(self.v.iter_mut()) {
            let (ks, vs) = (chunks.next(), chunks.next());
            k.import(at, ks.expect("whole tokens"));
            v.import(at, vs.expect("whole tokens"));
        }
        self.len += n;
        Ok(())
    }

    /// Allocates room for `total` tokens at once (capped at the model's
    /// context), so a server that budgets KV memory per session holds
    /// exactly what it reserved and never reallocates mid-generation.
    pub fn reserve_total(&mut self, total: usize) {
        let cap = total.min(self.max_context);
        if cap > self.capacity {
            for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
                layer.resize(cap * self.kv_dim);
            }
            self.capacity = cap;
        }
    }

    /// Makes room for `n` staged tokens after the committed prefix.
    pub(crate) fn reserve(&mut self, n: usize) -> Result<()> {
        if let Some(s) = &self.staged {
            return Err(ModelError::Uncommitted {
                staged: s.positions.len(),
            });
        }
        let need = self.len + n;
        if need > self.max_context {
            return Err(ModelError::ContextOverflow {
                len: self.len,
                new: n,
                max: self.max_context,
            });
        }
        if need > self.capacity {
            let cap = need.max(self.capacity * 2).max(64).min(self.max_context);
            for layer in self.k.iter_mut().chain(self.v.iter_mut()) {
                layer.resize(cap * self.kv_dim);
            }
            self.capacity = cap;
        }
        Ok(())
    }

    pub(crate) fn stage(&mut self, positions: &[u32], parents: Vec<Option<u32>>) {
        self.staged = Some(Staged {
            positions: positions.to_vec(),
            parents,
        });
    }

    /// K and V of `layer`, slot-major (`slot × kv_dim`).
    pub(crate) fn layer(&self, layer: usize) -> (PlaneRef<'_>, PlaneRef<'_>) {
        (self.k[layer].view(), self.v[layer].view())
    }

    /// Stores the K and V rows of staged token `i` (slot `len + i`) of
    /// `layer`, rounded to the cache's type.
    pub(crate) fn write_staged(&mut self, layer: usize, i: usize, k: &[f32], v: &[f32]) {
        let at = (self.len + i) * self.kv_dim;
        self.k[layer].write(at, k);
        self.v[layer].write(at, v);
    }
}
