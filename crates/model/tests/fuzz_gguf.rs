//! Fuzzing the GGUF loader with proptest: a tiny but complete llama file,
//! cut anywhere, with header bytes overwritten, or with a length, count,
//! dimension, type or offset field set to an extreme value. Loading must
//! come back as a model or as a `ModelError`, never a panic and never an
//! allocation the file cannot back.
//!
//! `PROPTEST_CASES=20000 cargo test --release -p specmesh-model --test fuzz_gguf`
//! is the longer run.

use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use proptest::prelude::*;
use specmesh_model::{LoadOptions, Model};

const H: usize = 8;
const F: usize = 16;
const V: usize = 4;

fn tensor(dims: &[usize]) -> QTensor {
    let n: usize = dims.iter().product();
    let data: Vec<f32> = (0..n).map(|i| (i % 7) as f32 * 0.01).collect();
    let t = Tensor::from_vec(data, dims, &Device::Cpu).unwrap();
    QTensor::quantize(&t, GgmlDType::F32).unwrap()
}

/// The bytes of a one-layer llama (hidden 8, two heads, vocabulary 4),
/// and where its header ends (the tensor data follows).
fn tiny_llama() -> (Vec<u8>, usize) {
    let md: Vec<(&str, Value)> = vec![
        ("general.architecture", Value::String("llama".into())),
        ("llama.embedding_length", Value::U32(H as u32)),
        ("llama.attention.head_count", Value::U32(2)),
        ("llama.attention.head_count_kv", Value::U32(2)),
        ("llama.feed_forward_length", Value::U32(F as u32)),
        ("llama.block_count", Value::U32(1)),
        ("llama.context_length", Value::U32(64)),
        ("llama.rope.freq_base", Value::F32(10000.0)),
        ("llama.attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ];
    let ts: Vec<(&str, QTensor)> = vec![
        ("token_embd.weight", tensor(&[V, H])),
        ("blk.0.attn_norm.weight", tensor(&[H])),
        ("blk.0.attn_q.weight", tensor(&[H, H])),
        ("blk.0.attn_k.weight", tensor(&[H, H])),
        ("blk.0.attn_v.weight", tensor(&[H, H])),
        ("blk.0.attn_output.weight", tensor(&[H, H])),
        ("blk.0.ffn_norm.weight", tensor(&[H])),
        ("blk.0.ffn_gate.weight", tensor(&[F, H])),
        ("blk.0.ffn_up.weight", tensor(&[F, H])),
        ("blk.0.ffn_down.weight", tensor(&[H, F])),
        ("output_norm.weight", tensor(&[H])),
    ];
    let mut bytes = std::io::Cursor::new(Vec::new());
    let md_refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (*k, v)).collect();
    let ts_refs: Vec<(&str, &QTensor)> = ts.iter().map(|(k, t)| (*k, t)).collect();
    gguf_file::write(&mut bytes, &md_refs, &ts_refs).unwrap();
    let bytes = bytes.into_inner();
    let header = gguf_file::Content::read(&mut std::io::Cursor::new(&bytes))
        .unwrap()
        .tensor_data_offset as usize;
    (bytes, header)
}

fn load(dir: &Path, bytes: &[u8]) -> Result<Model, specmesh_model::ModelError> {
    let path = dir.join("fuzzed.gguf");
    std::fs::write(&path, bytes).unwrap();
    let opts = LoadOptions {
        threads: Some(1),
        ..LoadOptions::default()
    };
    Model::load(&path, &opts)
}

#[test]
fn the_unfuzzed_file_loads_and_runs() {
    let dir = tempfile::tempdir().unwrap();
    let (bytes, header) = tiny_llama();
    assert!(header > 0 && header < bytes.len());
    let model = load(dir.path(), &bytes).expect("the tiny llama loads");
    assert_eq!(model.config().vocab_size, V);
    assert_eq!(model.config().max_context, 64);
}

/// Values that break naive arithmetic on lengths, counts and offsets.
fn extreme() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u32::MAX as u64),
        Just(u32::MAX as u64 + 1),
        Just(i64::MAX as u64),
        Just(u64::MAX),
        Just(u64::MAX - 7),
        Just(1 << 40),
        any::<u64>(),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Cut anywhere: an error, which names truncation once the magic is in.
    #[test]
    fn a_cut_file_is_an_error(cut in 0.0f64..1.0) {
        let dir = tempfile::tempdir().unwrap();
        let (bytes, _) = tiny_llama();
        let len = (bytes.len() as f64 * cut) as usize;
        let err = load(dir.path(), &bytes[..len]).err();
        prop_assert!(err.is_some(), "{} of {} bytes loaded", len, bytes.len());
    }

    /// A few header bytes overwritten with anything.
    #[test]
    fn overwritten_header_bytes_never_panic(
        edits in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8)
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (mut bytes, header) = tiny_llama();
        for (at, b) in edits {
            bytes[at.index(header)] = b;
        }
        let _ = load(dir.path(), &bytes);
    }

    /// One 8-byte (or 4-byte) little-endian field of the header set to an
    /// extreme value: string lengths, array lengths, counts, dimensions,
    /// dtypes and tensor offsets all live in such fields.
    #[test]
    fn extreme_header_fields_never_panic(
        at in any::<prop::sample::Index>(),
        value in extreme(),
        wide in any::<bool>(),
    ) {
        let dir = tempfile::tempdir().unwrap();
        let (mut bytes, header) = tiny_llama();
        let width = if wide { 8 } else { 4 };
        let at = at.index(header - width);
        bytes[at..at + width].copy_from_slice(&value.to_le_bytes()[..width]);
        let _ = load(dir.path(), &bytes);
    }
}
