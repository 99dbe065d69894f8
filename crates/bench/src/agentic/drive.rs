//! One task on one target: its requests, their timings and what came back.

use anyhow::{Context, Result, bail};
use serde::Serialize;
use serde_json::{Value, json};

use super::tasks;
use crate::client::{Client, Mode};

/// Where tasks go: ours with a speculation mode, or a peer.
pub struct Target {
    pub name: String,
    pub peer: bool,
    client: Client,
    mode: Mode,
}

impl Target {
    pub fn ours(name: &str, client: Client, mode: Mode) -> Target {
        Target {
            name: name.to_owned(),
            peer: false,
            client,
            mode,
        }
    }

    pub fn peer(name: &str, client: Client) -> Target {
        Target {
            name: name.to_owned(),
            peer: true,
            client,
            mode: Mode::Off,
        }
    }

    /// One chat completion: the response and its seconds. Ours carry a
    /// `cache_salt` per target, so that each prefills its own prompts, as
    /// a peer (a process of its own) does: whoever went first would
    /// otherwise have prefilled the other's.
    async fn complete(&self, mut body: Value) -> Result<(Value, f64)> {
        if !self.peer {
            body["cache_salt"] = json!(self.name.replace(' ', "-"));
        }
        self.client.complete(body, self.mode).await
    }
}

/// Counts over requests: one task's, or a target's whole run.
#[derive(Debug, Default, Serialize)]
pub struct Outcome {
    pub requests: usize,
    pub tokens: u64,
    pub seconds: f64,
    pub forced: u64,
    /// Constrained answers that finished, and those of them that follow
    /// their schema.
    pub checked: usize,
    pub valid: usize,
}

impl Outcome {
    /// Records one response.
    fn record(&mut self, response: &Value, seconds: f64) {
        self.requests += 1;
        self.seconds += seconds;
        self.tokens += response["usage"]["completion_tokens"].as_u64().unwrap_or(0);
        self.forced += response["specmesh"]["forced_tokens"].as_u64().unwrap_or(0);
    }

    pub fn add(&mut self, o: &Outcome) {
        self.requests += o.requests;
        self.tokens += o.tokens;
        self.seconds += o.seconds;
        self.forced += o.forced;
        self.checked += o.checked;
        self.valid += o.valid;
    }

    pub fn tokens_per_second(&self) -> f64 {
        if self.seconds > 0.0 {
            self.tokens as f64 / self.seconds
        } else {
            0.0
        }
    }
}

/// A target's totals.
#[derive(Debug, Serialize)]
pub struct TargetStats {
    pub name: String,
    pub peer: bool,
    #[serde(flatten)]
    pub totals: Outcome,
    pub failures: Vec<String>,
}

impl TargetStats {
    pub fn new(name: &str, peer: bool) -> TargetStats {
        TargetStats {
            name: name.to_owned(),
            peer,
            totals: Outcome::default(),
            failures: Vec::new(),
        }
    }
}

fn choice(response: &Value) -> &Value {
    &response["choices"][0]
}

/// The extraction task: one request under the schema.
pub async fn extraction(target: &Target, document: &str, max_new: u32) -> Result<Outcome> {
    let (response, seconds) = target
        .complete(tasks::extraction_body(document, max_new))
        .await?;
    let mut o = Outcome::default();
    o.record(&response, seconds);
    if choice(&response)["finish_reason"] == "stop" {
        o.checked = 1;
        let text = choice(&response)["message"]["content"]
            .as_str()
            .unwrap_or("");
        o.valid = usize::from(tasks::valid_extraction(text));
    }
    Ok(o)
}

/// The agent task: two forced calls, each with its result fed back, then
/// the answer.
pub async fn agent(target: &Target, task: usize, document: &str, max_new: u32) -> Result<Outcome> {
    let mut messages = tasks::agent_messages(document);
    let mut o = Outcome::default();
    for turn in 0..3 {
        let forced = turn < 2;
        let body = json!({
            "messages": messages,
            "tools": tasks::catalogue(),
            "tool_choice": if forced { "required" } else { "auto" },
            "parallel_tool_calls": false,
            "max_tokens": max_new,
        });
        let (response, seconds) = target.complete(body).await?;
        o.record(&response, seconds);
        let message = &choice(&response)["message"];
        let calls = message["tool_calls"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        if forced {
            if calls.is_empty() {
                // Cut by the token budget mid-call: nothing to check.
                if choice(&response)["finish_reason"] == "length" {
                    break;
                }
                bail!("turn {turn} asked for a call and got none: {message}");
            }
            o.checked += 1;
            o.valid += usize::from(calls.iter().all(|c| {
                tasks::valid_call(
                    c["function"]["name"].as_str().unwrap_or(""),
                    c["function"]["arguments"].as_str().unwrap_or(""),
                )
            }));
        }
        if calls.is_empty() {
            break;
        }
        let history = messages.as_array_mut().context("messages")?;
        history
            .push(json!({"role": "assistant", "content": message["content"], "tool_calls": calls}));
        for c in &calls {
            let name = c["function"]["name"].as_str().unwrap_or("");
            history.push(json!({
                "role": "tool", "tool_call_id": c["id"],
                "content": tasks::tool_result(name, task, document),
            }));
        }
    }
    Ok(o)
}
