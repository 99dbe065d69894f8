//! llama.cpp as a peer on the same machine: its own `llama-server`, built
//! natively by `tools/bench/setup.sh`, one server process per peer
//! configuration (plain decoding, its model-free speculation types, its
//! draft-model speculation with the settings swept), driven over HTTP so
//! its runs interleave with ours prompt by prompt.
//!
//! The peer gets the exact prompt token ids the gateway decodes (our chat
//! template and tokenizer, sent as a token array to `/completion`), the same
//! threads and greedy decoding; only the decoder differs. Its numbers come
//! from the server's own `timings` (decode time, drafted and accepted
//! tokens), not from our clock.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::{Config, Run};
use crate::generation::encode_prompt;
use crate::llama_cpp::build_info;
use crate::specbench::Question;

/// What a peer server runs.
#[derive(Clone, Debug, PartialEq)]
pub enum PeerKind {
    Plain,
    /// A model-free `--spec-type` (`ngram-simple`, `ngram-mod`, …).
    ModelFree(String),
    /// `--spec-type draft-simple` with a draft model and its settings.
    Draft {
        model: PathBuf,
        n_max: u32,
        p_min: Option<f32>,
        n_min: Option<u32>,
    },
}

impl PeerKind {
    /// A `--peer-spec` entry: a model-free type, or
    /// `draft:N_MAX[:P_MIN[:N_MIN]]` (needs `draft_model`).
    pub fn parse(spec: &str, draft_model: Option<&Path>) -> Result<PeerKind> {
        let Some(rest) = spec.strip_prefix("draft:") else {
            if spec.is_empty() || spec.starts_with("draft") || spec.contains(':') {
                bail!(
                    "--peer-spec `{spec}`: use a model-free type (ngram-simple, …) or draft:N_MAX[:P_MIN[:N_MIN]]"
                );
            }
            return Ok(PeerKind::ModelFree(spec.to_owned()));
        };
        let Some(model) = draft_model else {
            bail!(
                "--peer-spec `{spec}` needs --draft-model (the draft model llama.cpp drafts with)"
            );
        };
        let mut parts = rest.split(':');
        let bad = || anyhow::anyhow!("--peer-spec `{spec}`: expected draft:N_MAX[:P_MIN[:N_MIN]]");
        let n_max = parts.next().and_then(|n| n.parse().ok()).ok_or_else(bad)?;
        let p_min = parts
            .next()
            .map(|p| p.parse().map_err(|_| bad()))
            .transpose()?;
        let n_min = parts
            .next()
            .map(|n| n.parse().map_err(|_| bad()))
            .transpose()?;
        if parts.next().is_some() {
            return Err(bad());
        }
        Ok(PeerKind::Draft {
            model: model.to_path_buf(),
            n_max,
            p_min,
            n_min,
        })
    }

    /// The name in tables: `llama.cpp ngram-simple`, `llama.cpp draft n3 p0.6`.
    pub fn name(&self) -> String {
        match self {
            PeerKind::Plain => "llama.cpp".into(),
            PeerKind::ModelFree(t) => format!("llama.cpp {t}"),
            PeerKind::Draft {
                n_max,
                p_min,
                n_min,
                ..
            } => {
                let mut s = format!("llama.cpp draft n{n_max}");
                if let Some(p) = p_min {
                    s += &format!(" p{p}");
                }
                if let Some(n) = n_min {
                    s += &format!(" min{n}");
                }
                s
            }
        }
    }

    fn args(&self, threads: usize) -> Vec<String> {
        match self {
            PeerKind::Plain => vec![],
            PeerKind::ModelFree(t) => vec!["--spec-type".into(), t.clone()],
            PeerKind::Draft {
                model,
                n_max,
                p_min,
                n_min,
            } => {
                let mut a = vec![
                    "--spec-type".into(),
                    "draft-simple".into(),
                    "-md".into(),
                    model.display().to_string(),
                    "-td".into(),
                    threads.to_string(),
                    "-tbd".into(),
                    threads.to_string(),
                    "--spec-draft-n-max".into(),
                    n_max.to_string(),
                ];
                if let Some(p) = p_min {
                    a.extend(["--spec-draft-p-min".into(), p.to_string()]);
                }
                if let Some(n) = n_min {
                    a.extend(["--spec-draft-n-min".into(), n.to_string()]);
                }
                a
            }
        }
    }
}

/// One `llama-server` process.
pub struct Peer {
    child: Child,
    url: String,
    agent: ureq::Agent,
    tokenizer: specmesh_tokenizer::Tokenizer,
    pub version: String,
}

#[derive(Deserialize)]
struct Completion {
    tokens: Vec<u32>,
    timings: Timings,
}

#[derive(Deserialize)]
struct Timings {
    prompt_ms: f64,
    predicted_n: u32,
    predicted_ms: f64,
    #[serde(default)]
    draft_n: u32,
    #[serde(default)]
    draft_n_accepted: u32,
}

fn free_port() -> Result<u16> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?.port())
}

impl Peer {
    /// Starts `llama-server` on a free loopback port and waits until its
    /// model is loaded.
    pub fn start(
        bin_dir: &Path,
        model: &Path,
        threads: usize,
        tokenizer: specmesh_tokenizer::Tokenizer,
        kind: PeerKind,
    ) -> Result<Peer> {
        let bin = bin_dir.join("llama-server");
        if !bin.exists() {
            bail!(
                "no {}: run tools/bench/setup.sh (builds llama.cpp for this CPU) or pass --peer-bin",
                bin.display()
            );
        }
        let port = free_port()?;
        let mut cmd = Command::new(&bin);
        cmd.arg("-m")
            .arg(model)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args(["-t", &threads.to_string(), "-tb", &threads.to_string()])
            // One slot with the whole context: the bench sends one request
            // at a time, and n slots would split the KV cache n ways.
            .args(["-np", "1", "-c", "4096", "--no-webui"])
            .args(kind.args(threads))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null());
        let child = cmd
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let url = format!("http://127.0.0.1:{port}");
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .timeout_global(Some(Duration::from_secs(600)))
            .build()
            .into();
        let mut peer = Peer {
            child,
            url,
            agent,
            tokenizer,
            version: format!(
                "llama.cpp llama-server ({})",
                build_info(bin_dir).unwrap_or_else(|| "unknown build".into())
            ),
        };
        peer.wait_ready(Duration::from_secs(300))?;
        Ok(peer)
    }

    fn wait_ready(&mut self, timeout: Duration) -> Result<()> {
        let start = Instant::now();
        while start.elapsed() < timeout {
            if let Some(status) = self.child.try_wait()? {
                bail!("llama-server exited ({status}) before it was ready");
            }
            let health = self.agent.get(format!("{}/health", self.url)).call();
            if matches!(health, Ok(r) if r.status() == 200) {
                return Ok(());
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        bail!("llama-server was not ready within {timeout:?}")
    }

    pub fn run(&mut self, q: &Question, config: Config, max_new: u32) -> Result<Run> {
        let prompt = encode_prompt(&self.tokenizer, q.prompt(), true)?;
        let body = serde_json::json!({
            "prompt": prompt,
            "n_predict": max_new,
            "temperature": 0.0,
            "top_k": 1,
            "seed": 0,
            "cache_prompt": false,
            "return_tokens": true,
        });
        let t = Instant::now();
        let reply: Completion = self
            .agent
            .post(format!("{}/completion", self.url))
            .send_json(&body)
            .with_context(|| format!("llama-server on {} ({})", q.id(), config.name()))?
            .body_mut()
            .read_json()
            .context("reading llama-server's answer")?;
        let wall = t.elapsed().as_secs_f64();
        let tm = &reply.timings;
        // Each target forward after the prompt yields its accepted drafts
        // plus one token of its own.
        let steps = tm.predicted_n.saturating_sub(tm.draft_n_accepted);
        Ok(Run {
            question: q.id(),
            category: q.category.clone(),
            config,
            completion_tokens: reply.tokens.len(),
            tokens: reply.tokens,
            wall_seconds: wall,
            decode_seconds: tm.predicted_ms / 1e3,
            ttft_seconds: tm.prompt_ms / 1e3,
            inter_token_seconds: Vec::new(),
            verify_steps: steps,
            drafted_tokens: tm.draft_n,
            accepted_tokens: tm.draft_n_accepted,
            tree_wait_seconds: 0.0,
            drafted_ahead_steps: 0,
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
