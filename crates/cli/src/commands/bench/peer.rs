//! llama.cpp (llama-cpp-python) as a peer on the same machine, driven over
//! a JSON-lines pipe so its runs interleave with ours prompt by prompt.
//!
//! The peer gets the exact prompt token ids the gateway decodes (our chat
//! template and tokenizer), so the two systems see the same input; only the
//! decoder differs.

use std::io::{BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

use super::{Config, Run};
use crate::commands::generate::encode_prompt;
use crate::specbench::Question;

/// The peer's driver script, shipped inside the binary so `specmesh bench`
/// works from any directory.
const SCRIPT: &str = include_str!("../../../../../tools/bench/llama_peer.py");

pub fn default_python() -> PathBuf {
    let home = std::env::var_os("HOME").unwrap_or_default();
    PathBuf::from(home).join(".cache/specmesh/venv-peer/bin/python")
}

pub struct Peer {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    tokenizer: specmesh_tokenizer::Tokenizer,
    // Keeps the script file alive as long as the child runs.
    _script: tempfile::NamedTempFile,
    pub version: String,
}

#[derive(Deserialize)]
struct Ready {
    llama_cpp: String,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Reply {
    Answer(Answer),
    Error { error: String },
}

#[derive(Deserialize)]
struct Answer {
    tokens: Vec<u32>,
    wall_seconds: f64,
    ttft_seconds: f64,
    decode_seconds: f64,
    verify_steps: u32,
}

impl Peer {
    pub fn start(
        python: &Path,
        model: &Path,
        threads: usize,
        tokenizer: specmesh_tokenizer::Tokenizer,
    ) -> Result<Peer> {
        if !python.exists() {
            bail!(
                "no peer interpreter at {}: run tools/bench/setup.sh (builds llama.cpp for this CPU) \
                 or pass --peer-python",
                python.display()
            );
        }
        let mut script = tempfile::Builder::new().suffix(".py").tempfile()?;
        script.write_all(SCRIPT.as_bytes())?;
        let mut child = Command::new(python)
            .arg("-u")
            .arg(script.path())
            .arg("--model")
            .arg(model)
            .arg("--threads")
            .arg(threads.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting the peer with {}", python.display()))?;
        let stdin = child.stdin.take().expect("piped stdin");
        let mut stdout = BufReader::new(child.stdout.take().expect("piped stdout"));
        let mut line = String::new();
        stdout.read_line(&mut line)?;
        let ready: Ready = serde_json::from_str(&line).with_context(|| {
            format!(
                "the peer did not start (is llama_cpp installed for {}? run tools/bench/setup.sh)",
                python.display()
            )
        })?;
        Ok(Peer {
            child,
            stdin,
            stdout,
            tokenizer,
            _script: script,
            version: format!("llama-cpp-python {}", ready.llama_cpp),
        })
    }

    pub fn run(&mut self, q: &Question, config: Config, max_new: u32) -> Result<Run> {
        let mode = match config {
            Config::PeerPlain => "plain",
            Config::PeerLookup => "lookup",
            other => bail!("{} is not a peer configuration", other.name()),
        };
        let prompt = encode_prompt(&self.tokenizer, q.prompt(), true)?;
        let req = serde_json::json!({
            "prompt_tokens": prompt,
            "max_new_tokens": max_new,
            "eos": self.tokenizer.eos_token_ids(),
            "mode": mode,
        });
        writeln!(self.stdin, "{req}")?;
        self.stdin.flush()?;
        let mut line = String::new();
        if self.stdout.read_line(&mut line)? == 0 {
            bail!("the peer exited during {}", q.id());
        }
        let a = match serde_json::from_str(&line).context("reading the peer's answer")? {
            Reply::Answer(a) => a,
            Reply::Error { error } => bail!("the peer failed on {} ({mode}): {error}", q.id()),
        };
        Ok(Run {
            question: q.id(),
            category: q.category.clone(),
            config,
            completion_tokens: a.tokens.len(),
            tokens: a.tokens,
            wall_seconds: a.wall_seconds,
            decode_seconds: a.decode_seconds,
            ttft_seconds: a.ttft_seconds,
            inter_token_seconds: Vec::new(),
            verify_steps: a.verify_steps,
            drafted_tokens: 0,
            accepted_tokens: 0,
        })
    }
}

impl Drop for Peer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
