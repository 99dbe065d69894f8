//! One benchmark request through the gateway's streaming API, timed from
//! the client's side.

use anyhow::Result;
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

use super::{Config, Run};
use crate::specbench::Question;
use specmesh_harness::grpc;

/// Streams one greedy chat generation; `tenant` scopes the drafter's
/// cross-session index, so separate passes never draft from each other.
pub async fn request(
    client: &mut GenerationClient<Channel>,
    q: &Question,
    config: Config,
    max_new: u32,
    tenant: &str,
) -> Result<Run> {
    let mode = match config {
        Config::Off => v1::SpeculationMode::Off,
        Config::ModelFree => v1::SpeculationMode::ModelFree,
        Config::DraftModel => v1::SpeculationMode::DraftModel,
        Config::Combined => v1::SpeculationMode::Combined,
        _ => v1::SpeculationMode::Unspecified,
    };
    let mut req = grpc::chat_request([("user", q.prompt())], max_new, mode, tenant);
    if config == Config::Prediction {
        req.prediction = q.code_block().unwrap_or_default().to_owned();
    }
    let s = grpc::stream(client, tonic::Request::new(req)).await?;
    // A chunk's tokens arrived together: they share its gap.
    let mut gaps = Vec::new();
    for pair in s.chunks.windows(2) {
        let (prev, (now, n)) = (pair[0].0, pair[1]);
        let per = (now - prev).as_secs_f64() / n as f64;
        gaps.extend(std::iter::repeat_n(per, n));
    }
    let first = s.chunks.first().map_or(s.sent, |c| c.0);
    let last = s.chunks.last().map_or(s.sent, |c| c.0);
    let spec = s.speculation;
    Ok(Run {
        question: q.id(),
        category: q.category.clone(),
        config,
        completion_tokens: s.tokens.len(),
        tokens: s.tokens,
        wall_seconds: (s.ended - s.sent).as_secs_f64(),
        decode_seconds: (last - first).as_secs_f64(),
        ttft_seconds: (first - s.sent).as_secs_f64(),
        inter_token_seconds: gaps,
        verify_steps: spec.verify_steps,
        drafted_tokens: spec.drafted_tokens,
        accepted_tokens: spec.accepted_tokens,
        tree_wait_seconds: spec.tree_wait_seconds,
        drafted_ahead_steps: spec.drafted_ahead_steps,
    })
}
