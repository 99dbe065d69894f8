//! One pass: every conversation sent to one target, `concurrency` of them
//! at a time, each turn with the whole history before it (the system
//! prompt, every earlier user turn and the target's own answers), as an
//! OpenAI client resends it. A conversation's next turn leaves when its
//! last answer has arrived, so concurrent conversations interleave their
//! turns as users do.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Instant;

use serde::Serialize;

use super::build::{Conversation, SYSTEM_PROMPT};
use crate::client::{Ask, Client, Message, Mode};
use crate::llama_cpp::server::{Server, Slots};
use crate::llama_cpp::spec::PeerSpec;

/// Which of our APIs a target sends over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Api {
    /// The gRPC API without a `session_id`: nothing ties the turns.
    Grpc,
    /// The gRPC API with a `session_id` per conversation (`end_session` on
    /// its last turn): the verifier keeps the KV cache between turns.
    GrpcSession,
    /// The OpenAI-compatible HTTP front, which has no session id.
    Http,
}

impl Api {
    pub fn name(self) -> &'static str {
        match self {
            Api::Grpc => "gRPC",
            Api::GrpcSession => "gRPC + session_id",
            Api::Http => "OpenAI HTTP",
        }
    }
}

/// Where a pass sends its conversations.
#[derive(Clone)]
pub enum Target {
    /// Our gateway, over one of its APIs.
    Ours { client: Client, api: Api },
    /// llama.cpp's `llama-server`, started afresh for each pass: its
    /// prompt cache (in its slots and in host memory) would otherwise
    /// serve a pass the conversations an earlier pass sent.
    LlamaServer(Arc<PeerLaunch>),
}

/// How to start the peer for a pass: a slot per conversation in flight,
/// each with the context [`Plan::peer_context`].
#[derive(Debug)]
pub struct PeerLaunch {
    pub bin_dir: PathBuf,
    pub model: PathBuf,
    pub threads: usize,
    pub spec: PeerSpec,
}

impl Target {
    /// As the tables print it.
    pub fn name(&self) -> String {
        match self {
            Target::Ours { api, .. } => api.name().to_owned(),
            Target::LlamaServer(l) => l.spec.name(),
        }
    }

    pub fn is_peer(&self) -> bool {
        matches!(self, Target::LlamaServer(_))
    }

    fn api(&self) -> Option<Api> {
        match self {
            Target::Ours { api, .. } => Some(*api),
            Target::LlamaServer(_) => None,
        }
    }
}

/// What a pass does besides its target.
#[derive(Debug, Clone)]
pub struct Plan {
    pub concurrency: usize,
    pub repeat: usize,
    pub max_new: u32,
    pub mode: Mode,
    /// The conversations are spread over this many tenants (conversation
    /// `i` is tenant `i mod tenants`'s).
    pub tenants: usize,
    /// Names this pass's tenants and sessions apart from every other
    /// pass's, so no pass finds another's drafts or caches.
    pub tag: String,
    /// The context of each of llama-server's slots: the longest
    /// conversation, its answers included.
    pub peer_context: usize,
}

/// One answered turn.
#[derive(Debug, Clone, Serialize)]
pub struct TurnRecord {
    pub conversation: usize,
    /// 0-based.
    pub turn: usize,
    pub prompt_tokens: Option<usize>,
    pub cached_tokens: Option<usize>,
    pub ttft_seconds: f64,
    pub e2el_seconds: f64,
    pub output_tokens: usize,
    pub text: String,
}

/// One target's pass over every conversation.
#[derive(Debug, Serialize)]
pub struct Pass {
    pub target: String,
    pub peer: bool,
    pub concurrency: usize,
    pub repeat: usize,
    /// Seconds from the first request to the last answer.
    pub duration_seconds: f64,
    pub turns: Vec<TurnRecord>,
    /// Conversations that failed, with why; their later turns were not sent.
    pub failures: Vec<String>,
}

/// Sends every conversation to `target` per `plan` and waits for all.
/// Fails only when the peer cannot be started.
pub async fn pass(
    target: &Target,
    conversations: &Arc<Vec<Conversation>>,
    plan: &Plan,
) -> anyhow::Result<Pass> {
    // The peer's server lives as long as the pass.
    let (client, _server) = match target {
        Target::Ours { client, .. } => (client.clone(), None),
        Target::LlamaServer(launch) => {
            let l = launch.as_ref();
            let slots = Slots {
                parallel: plan.concurrency,
                context: plan.peer_context,
            };
            // Spawned here, on one of the runtime's threads, which live
            // as long as the run: a blocking-pool thread exits when idle,
            // and the server would be signalled then (it closed every
            // connection mid-answer). Only the wait goes there.
            let mut server = Server::spawn(&l.bin_dir, &l.model, l.threads, &l.spec, slots)?;
            let server =
                tokio::task::spawn_blocking(move || server.ready().map(|()| server)).await??;
            (Client::llama_server(&server.url).await?, Some(server))
        }
    };
    let next = Arc::new(AtomicUsize::new(0));
    let start = Instant::now();
    let workers: Vec<_> = (0..plan.concurrency.max(1))
        .map(|_| {
            let (target, client, conversations, next, plan) = (
                target.clone(),
                client.clone(),
                conversations.clone(),
                next.clone(),
                plan.clone(),
            );
            tokio::spawn(async move {
                let (mut turns, mut failures) = (Vec::new(), Vec::new());
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    let Some(c) = conversations.get(i) else { break };
                    if let Err(e) = converse(&target, &client, c, &plan, &mut turns).await {
                        failures.push(format!("conversation {}: {e:#}", c.id));
                    }
                }
                (turns, failures)
            })
        })
        .collect();
    let (mut turns, mut failures) = (Vec::new(), Vec::new());
    for w in workers {
        match w.await {
            Ok((t, f)) => {
                turns.extend(t);
                failures.extend(f);
            }
            Err(e) => failures.push(format!("a conversation task failed: {e}")),
        }
    }
    let duration_seconds = start.elapsed().as_secs_f64();
    turns.sort_by_key(|t: &TurnRecord| (t.conversation, t.turn));
    Ok(Pass {
        target: target.name(),
        peer: target.is_peer(),
        concurrency: plan.concurrency,
        repeat: plan.repeat,
        duration_seconds,
        turns,
        failures,
    })
}

/// One conversation, turn by turn, its answers fed back into its history.
async fn converse(
    target: &Target,
    client: &Client,
    c: &Conversation,
    plan: &Plan,
    out: &mut Vec<TurnRecord>,
) -> anyhow::Result<()> {
    let tenant = format!("{}-t{}", plan.tag, c.id % plan.tenants.max(1));
    let session = format!("{}-c{}", plan.tag, c.id);
    let mut history = vec![Message::new("system", SYSTEM_PROMPT)];
    for (turn, user) in c.user_turns.iter().enumerate() {
        history.push(Message::new("user", user.clone()));
        let last = turn + 1 == c.user_turns.len();
        let ask = Ask {
            messages: &history,
            mode: plan.mode,
            max_new: plan.max_new,
            tenant: if target.is_peer() { "" } else { &tenant },
            session: (target.api() == Some(Api::GrpcSession)).then_some((session.as_str(), last)),
        };
        let done = client
            .chat(&ask)
            .await
            .map_err(|e| e.context(format!("turn {}", turn + 1)))?;
        history.push(Message::new("assistant", done.text.clone()));
        out.push(TurnRecord {
            conversation: c.id,
            turn,
            prompt_tokens: done.prompt_tokens,
            cached_tokens: done.cached_tokens,
            ttft_seconds: done.ttft,
            e2el_seconds: done.e2el,
            output_tokens: done.output_tokens,
            text: done.text,
        });
    }
    Ok(())
}
