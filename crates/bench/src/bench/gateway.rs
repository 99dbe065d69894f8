//! One benchmark request through the gateway's streaming API, timed from
//! the client's side.

use std::time::Instant;

use anyhow::Result;
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

use super::{Config, Run};
use crate::specbench::Question;

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
    let req = v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Chat(v1::Chat {
            messages: vec![v1::ChatMessage {
                role: "user".into(),
                content: q.prompt().into(),
            }],
        })),
        max_new_tokens: max_new,
        speculation: Some(v1::SpeculationParams {
            mode: mode as i32,
            max_draft_tokens: 0,
        }),
        tenant: tenant.into(),
        prediction: match config {
            Config::Prediction => q.code_block().unwrap_or_default().to_owned(),
            _ => String::new(),
        },
        ..Default::default()
    };
    let status = |s: tonic::Status| anyhow::anyhow!("{:?}: {}", s.code(), s.message());
    let t0 = Instant::now();
    let mut stream = client
        .generate_stream(req)
        .await
        .map_err(status)?
        .into_inner();
    let (mut tokens, mut gaps) = (Vec::new(), Vec::new());
    let (mut first, mut last) = (None, t0);
    let mut spec = v1::SpeculationStats::default();
    while let Some(chunk) = stream.message().await.map_err(status)? {
        let now = Instant::now();
        if !chunk.token_ids.is_empty() {
            if first.is_none() {
                first = Some(now);
            } else {
                // A chunk's tokens arrived together: they share its gap.
                let per = (now - last).as_secs_f64() / chunk.token_ids.len() as f64;
                gaps.extend(std::iter::repeat_n(per, chunk.token_ids.len()));
            }
            last = now;
            tokens.extend_from_slice(&chunk.token_ids);
        }
        if let Some(s) = chunk.speculation {
            spec = s;
        }
    }
    let wall = t0.elapsed().as_secs_f64();
    let first = first.unwrap_or(last);
    Ok(Run {
        question: q.id(),
        category: q.category.clone(),
        config,
        completion_tokens: tokens.len(),
        tokens,
        wall_seconds: wall,
        decode_seconds: (last - first).as_secs_f64(),
        ttft_seconds: (first - t0).as_secs_f64(),
        inter_token_seconds: gaps,
        verify_steps: spec.verify_steps,
        drafted_tokens: spec.drafted_tokens,
        accepted_tokens: spec.accepted_tokens,
        tree_wait_seconds: spec.tree_wait_seconds,
        drafted_ahead_steps: spec.drafted_ahead_steps,
    })
}
