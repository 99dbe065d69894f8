//! The model handle: shared weights, a kernel thread pool, and the entry
//! points of the forward.

use std::path::Path;
use std::sync::{Arc, Mutex};

use specmesh_kernels::attn::AttnKernel;
use specmesh_kernels::{Isa, ThreadPool};

use crate::block::Block;
use crate::config::LlamaConfig;
use crate::error::{ModelError, Result};
use crate::forward::{self, Parts, Scratch};
use crate::kv::KvDtype;
use crate::load::{LoadOptions, load_weights};
use crate::logits::Logits;
use crate::rope::Rope;
use crate::sequence::Sequence;
use crate::weights::Weights;

/// A loaded Llama-family model, or a layer-truncated view of one.
///
/// Forward calls on one `Model` are serialised (they share the kernel pool
/// and scratch buffers); run several sequences in one call with
/// [`Model::forward_batch`] instead of calling in parallel.
#[derive(Debug)]
pub struct Model {
    pub(crate) weights: Arc<Weights>,
    pub(crate) rope: Arc<Rope>,
    pub(crate) n_layers: usize,
    pub(crate) pool: Arc<ThreadPool>,
    pub(crate) isa: Isa,
    pub(crate) kv_dtype: KvDtype,
    pub(crate) scratch: Mutex<Scratch>,
}

impl Model {
    /// Loads a GGUF file or a Hugging Face checkpoint directory.
    pub fn load(path: &Path, opts: &LoadOptions<'_>) -> Result<Model> {
        let isa = match opts.isa {
            Some(isa) if !isa.supported() => {
                return Err(ModelError::InvalidOption(format!(
                    "kernel ISA `{isa}` is not supported by this CPU (detected: {})",
                    Isa::detect()
                )));
            }
            Some(isa) => isa,
            None => Isa::detect(),
        };
        let threads = match opts.threads {
            Some(0) => return Err(ModelError::InvalidOption("`threads` must be >= 1".into())),
            Some(t) => t,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        if isa == Isa::AmxInt8 {
            // Which matmul calls take AMX tiles is measured once per
            // process; here, so that the first forward does not pay for it.
            specmesh_kernels::tile_plan();
        }
        if matches!(isa, Isa::Avx512Vnni | Isa::AmxInt8) {
            // So is which take the 512-bit kernels over the 256-bit ones.
            specmesh_kernels::width_plan();
        }
        let mut weights = load_weights(path, opts)?;
        weights.head_tokens = opts.head_tokens.map(Arc::from);
        let rope = Rope::new(&weights.config, weights.rope_freq_factors.as_deref());
        Ok(Model {
            n_layers: weights.config.n_layers,
            weights: Arc::new(weights),
            rope: Arc::new(rope),
            pool: Arc::new(ThreadPool::new(threads)),
            isa,
            kv_dtype: opts.kv_dtype,
            scratch: Mutex::new(Scratch::default()),
        })
    }

    /// The model's hyper-parameters (`n_layers` is the full depth; see
    /// [`Model::n_layers`] for the layers this view runs).
    pub fn config(&self) -> &LlamaConfig {
        &self.weights.config
    }

    /// Layers this model (view) runs.
    pub fn n_layers(&self) -> usize {
        self.n_layers
    }

    /// The kernel ISA of the matmuls and attention (`LoadOptions::isa`).
    pub fn isa(&self) -> Isa {
        self.isa
    }

    /// The kernels in words, for startup lines: the ISA, on `Isa::AmxInt8`
    /// which calls take tiles (`amx-int8; Q4_K tiles for 2-16 rows, …`),
    /// and with AVX-512 which take the 512-bit kernels (`512-bit Q4_K 1-8
    /// rows, …`).
    pub fn kernels(&self) -> String {
        match self.isa {
            Isa::AmxInt8 => format!(
                "{}; {}; {}",
                self.isa,
                specmesh_kernels::tile_plan(),
                specmesh_kernels::width_plan()
            ),
            Isa::Avx512Vnni => format!("{}; {}", self.isa, specmesh_kernels::width_plan()),
            isa => isa.to_string(),
        }
    }

    /// The attention kernel this model runs: the one of its [`Model::isa`]
    /// at its head size (portable for `Isa::Scalar`).
    pub fn attention_kernel(&self) -> AttnKernel {
        AttnKernel::select(self.isa, self.weights.config.head_dim)
    }

    pub fn threads(&self) -> usize {
        self.pool.threads()
    }

    /// The tokens the lm_head scores, in logits-column order, when it
    /// scores only some (`LoadOptions::head_tokens`); `None`: all of them,
    /// column i being token i.
    pub fn head_tokens(&self) -> Option<&[u32]> {
        self.weights.head_tokens.as_deref()
    }

    /// Weight bytes one forward streams from memory (the floor of a decode step).
    pub fn streamed_weight_bytes(&self) -> usize {
        self.weights.streamed_bytes(self.n_layers)
    }

    /// Bytes of every weight held in memory (all layers, embeddings, norms).
    pub fn weight_bytes(&self) -> usize {
        self.weights.total_bytes()
    }

    /// A view over the first `n_layers` layers, the final norm and the
    /// lm_head, sharing this model's weights and threads: a cheap
    /// self-draft model.
    pub fn truncated(&self, n_layers: usize) -> Result<Model> {
        if n_layers == 0 || n_layers > self.weights.config.n_layers {
            return Err(ModelError::InvalidOption(format!(
                "a truncated view needs 1..={} layers, got {n_layers}",
                self.weights.config.n_layers
            )));
        }
        Ok(Model {
            weights: Arc::clone(&self.weights),
            rope: Arc::clone(&self.rope),
            n_layers,
            pool: Arc::clone(&self.pool),
            isa: self.isa,
            kv_dtype: self.kv_dtype,
            scratch: Mutex::new(Scratch::default()),
        })
    }

    /// Bytes of KV cache one token takes across all layers (what a server
    /// budgets per token of context).
    pub fn kv_bytes_per_token(&self) -> usize {
        2 * self.n_layers * self.weights.config.kv_dim() * self.kv_dtype.bytes()
    }

    /// What this model's sequences store K and V as.
    pub fn kv_dtype(&self) -> KvDtype {
        self.kv_dtype
    }

    /// The same model (shared weights and threads) whose sequences store
    /// K and V as `dtype`: one process measures both types.
    pub fn with_kv_dtype(&self, dtype: KvDtype) -> Model {
        Model {
            weights: Arc::clone(&self.weights),
            rope: Arc::clone(&self.rope),
            n_layers: self.n_layers,
            pool: Arc::clone(&self.pool),
            isa: self.isa,
            kv_dtype: dtype,
            scratch: Mutex::new(Scratch::default()),
        }
    }

    /// An empty sequence (KV cache) for this model.
    pub fn new_sequence(&self) -> Sequence {
        Sequence::new(&self.weights.config, self.n_layers, self.kv_dtype)
    }

    /// Appends `block` to `seq` (staged) and returns its logits.
    pub fn forward(&self, seq: &mut Sequence, block: &Block) -> Result<Logits> {
        let mut out = self.forward_batch(&mut [(seq, block)])?;
        Ok(out.pop().expect("one result per item"))
    }

    /// Runs several sequences in one forward: each weight block is read once
    /// for all their tokens. Every sequence's block is staged; results are in
    /// input order. Nothing is staged if any item is invalid.
    pub fn forward_batch(&self, items: &mut [(&mut Sequence, &Block)]) -> Result<Vec<Logits>> {
        let mut scratch = self.scratch.lock().unwrap_or_else(|e| e.into_inner());
        let parts = Parts {
            weights: &self.weights,
            rope: &self.rope,
            n_layers: self.n_layers,
            pool: &self.pool,
            isa: self.isa,
            attention: self.attention_kernel(),
        };
        forward::run(&parts, &mut scratch, items)
    }
}
