//! `specmesh generate --gateway URL`: a client of the public API.

use std::io::Write;
use std::time::Instant;

use anyhow::Result;
use serde::Serialize;
pub use specmesh_harness::grpc::Connection;
use specmesh_harness::grpc::status;
use specmesh_proto::v1;

/// What the user asked for, as the request to send.
pub struct Ask {
    pub prompt: String,
    pub chat: bool,
    pub max_new_tokens: u32,
    pub sampling: v1::SamplingParams,
    pub speculation: v1::SpeculationMode,
    pub stream: bool,
    pub json: bool,
    /// The predicted output; empty: none.
    pub prediction: String,
}

#[derive(Serialize)]
struct Output {
    text: String,
    token_ids: Vec<u32>,
    finish_reason: String,
    prompt_tokens: u32,
    completion_tokens: u32,
    verify_steps: u32,
    drafted_tokens: u32,
    accepted_tokens: u32,
    mean_accepted_per_step: f64,
    /// Seconds the verifier waited for the drafter's trees.
    tree_wait_seconds: f64,
    /// Steps whose tree the drafter drafted ahead.
    drafted_ahead_steps: u32,
    accepted_prediction_tokens: u32,
    rejected_prediction_tokens: u32,
    seconds: f64,
}

pub fn run(connection: &Connection, ask: Ask) -> Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    rt.block_on(generate(connection, ask))
}

async fn generate(connection: &Connection, ask: Ask) -> Result<()> {
    let mut client = connection.client().await?;
    let input = if ask.chat {
        v1::generate_request::Input::Chat(v1::Chat {
            messages: vec![v1::ChatMessage {
                role: "user".into(),
                content: ask.prompt.clone(),
                ..Default::default()
            }],
            ..Default::default()
        })
    } else {
        v1::generate_request::Input::Prompt(ask.prompt.clone())
    };
    let request = v1::GenerateRequest {
        input: Some(input),
        max_new_tokens: ask.max_new_tokens,
        sampling: Some(ask.sampling),
        speculation: Some(v1::SpeculationParams {
            mode: ask.speculation as i32,
            max_draft_tokens: 0,
        }),
        prediction: ask.prediction.clone(),
        ..Default::default()
    };
    let t0 = Instant::now();
    let (text, ids, finish, usage, spec) = if ask.stream {
        let mut stream = client
            .generate_stream(connection.request(request)?)
            .await
            .map_err(status)?
            .into_inner();
        let (mut text, mut ids) = (String::new(), Vec::new());
        let mut last = v1::GenerateChunk::default();
        let stdout = std::io::stdout();
        while let Some(chunk) = stream.message().await.map_err(status)? {
            if !ask.json {
                let mut out = stdout.lock();
                out.write_all(chunk.text.as_bytes())?;
                out.flush()?;
            }
            text.push_str(&chunk.text);
            ids.extend_from_slice(&chunk.token_ids);
            last = chunk;
        }
        (text, ids, last.finish_reason, last.usage, last.speculation)
    } else {
        let r = client
            .generate(connection.request(request)?)
            .await
            .map_err(status)?
            .into_inner();
        if !ask.json {
            print!("{}", r.text);
        }
        (r.text, r.token_ids, r.finish_reason, r.usage, r.speculation)
    };
    let seconds = t0.elapsed().as_secs_f64();
    let usage = usage.unwrap_or_default();
    let spec = spec.unwrap_or_default();
    let finish = v1::FinishReason::try_from(finish).map_or("unspecified".to_string(), |f| {
        f.as_str_name()
            .trim_start_matches("FINISH_REASON_")
            .to_lowercase()
    });
    if ask.json {
        let out = Output {
            text,
            token_ids: ids,
            finish_reason: finish,
            prompt_tokens: usage.prompt_tokens,
            completion_tokens: usage.completion_tokens,
            verify_steps: spec.verify_steps,
            drafted_tokens: spec.drafted_tokens,
            accepted_tokens: spec.accepted_tokens,
            mean_accepted_per_step: spec.mean_accepted_per_step,
            tree_wait_seconds: spec.tree_wait_seconds,
            drafted_ahead_steps: spec.drafted_ahead_steps,
            accepted_prediction_tokens: usage.accepted_prediction_tokens,
            rejected_prediction_tokens: usage.rejected_prediction_tokens,
            seconds,
        };
        println!("{}", serde_json::to_string(&out)?);
    } else {
        println!();
        eprintln!(
            "[{} prompt tokens, {} generated, finish: {finish}, {} verify steps, {:.2} tokens/step, {}/{} drafted accepted, {:.1} tok/s end to end]",
            usage.prompt_tokens,
            usage.completion_tokens,
            spec.verify_steps,
            spec.mean_accepted_per_step,
            spec.accepted_tokens,
            spec.drafted_tokens,
            usage.completion_tokens as f64 / seconds.max(1e-9),
        );
        if !ask.prediction.is_empty() {
            eprintln!(
                "[prediction: {} tokens used, {} not]",
                usage.accepted_prediction_tokens, usage.rejected_prediction_tokens
            );
        }
    }
    Ok(())
}
