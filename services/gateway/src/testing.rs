//! Test fixtures: a tiny byte-level model header (so tests need no model
//! file), a scripted `Verifier` server on 127.0.0.1:0 standing in for the
//! real verifier, and a TCP proxy whose connections can be cut to simulate
//! losing a verifier pod.

use std::collections::VecDeque;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::quantized::gguf_file::Value;
use specmesh_proto::v1::verifier_server::{Verifier, VerifierServer};
use specmesh_proto::v1::{
    Committed, RunRequest, SessionEvent, Started, StatsRequest, VerifierStats, session_event,
};
use specmesh_tokenizer::Tokenizer;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, mpsc};
use tokio::task::JoinHandle;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status};

/// Ids 0..256 are the bytes, in byte order.
pub const IM_START: u32 = 256;
/// The end-of-turn control token, also the model's EOS.
pub const IM_END: u32 = 257;
/// A merged token that decodes to "he".
pub const HE: u32 = 258;
pub const VOCAB_SIZE: usize = 259;

const TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// GPT-2's byte-to-character map (`bytes_to_unicode`).
fn byte_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let offset = (0..byte).filter(|b| !printable(*b)).count() as u32;
    char::from_u32(256 + offset).unwrap()
}

fn strings(items: impl IntoIterator<Item = String>) -> Value {
    Value::Array(items.into_iter().map(Value::String).collect())
}

/// Metadata of a byte-level vocabulary: 256 bytes, two control tokens, "he".
fn metadata(context_length: u32) -> Vec<(String, Value)> {
    let mut tokens: Vec<String> = (0u8..=255).map(|b| byte_char(b).to_string()).collect();
    let mut types = vec![1i32; 256];
    tokens.extend([
        "<|im_start|>".to_owned(),
        "<|im_end|>".to_owned(),
        "he".to_owned(),
    ]);
    types.extend([3, 3, 1]);
    let mut m = vec![
        (
            "general.architecture".to_owned(),
            Value::String("llama".into()),
        ),
        (
            "tokenizer.ggml.model".to_owned(),
            Value::String("gpt2".into()),
        ),
        (
            "tokenizer.ggml.pre".to_owned(),
            Value::String("smollm".into()),
        ),
        ("tokenizer.ggml.tokens".to_owned(), strings(tokens)),
        (
            "tokenizer.ggml.token_type".to_owned(),
            Value::Array(types.into_iter().map(Value::I32).collect()),
        ),
        (
            "tokenizer.ggml.merges".to_owned(),
            strings(["h e".to_owned()]),
        ),
        (
            "tokenizer.ggml.bos_token_id".to_owned(),
            Value::U32(IM_START),
        ),
        ("tokenizer.ggml.eos_token_id".to_owned(), Value::U32(IM_END)),
        (
            "tokenizer.ggml.add_bos_token".to_owned(),
            Value::Bool(false),
        ),
        (
            "tokenizer.chat_template".to_owned(),
            Value::String(TEMPLATE.into()),
        ),
    ];
    if context_length > 0 {
        m.push((
            "llama.context_length".to_owned(),
            Value::U32(context_length),
        ));
    }
    m
}

/// The test tokenizer.
pub fn tokenizer() -> Tokenizer {
    let content = candle_core::quantized::gguf_file::Content {
        magic: candle_core::quantized::gguf_file::VersionedMagic::GgufV3,
        metadata: metadata(0).into_iter().collect(),
        tensor_infos: Default::default(),
        tensor_data_offset: 0,
    };
    Tokenizer::from_gguf(&content).unwrap()
}

/// Writes a weightless GGUF file with the test vocabulary and the given
/// context length (0: the key is left out).
pub fn write_gguf(dir: &Path, context_length: u32) -> PathBuf {
    let path = dir.join("tiny.gguf");
    let md = metadata(context_length);
    let refs: Vec<(&str, &Value)> = md.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let mut file = std::fs::File::create(&path).unwrap();
    candle_core::quantized::gguf_file::write(&mut file, &refs, &[]).unwrap();
    path
}

/// Token ids of `text` in the byte vocabulary.
pub fn ids(text: &str) -> Vec<u32> {
    text.bytes().map(u32::from).collect()
}

/// `Started`, as a verifier sends it first.
pub fn started() -> Step {
    Step::Send(SessionEvent {
        event: Some(session_event::Event::Started(Started {
            reused_tokens: 0,
            prefill_seconds: 0.01,
            drafting: true,
        })),
    })
}

/// A `Committed` step of `text`'s bytes, `drafted` nodes of which `accepted`.
pub fn committed(step: u64, text: &str, drafted: u32, accepted: u32) -> Step {
    committed_ids(step, ids(text), drafted, accepted, false, false)
}

pub fn committed_ids(
    step: u64,
    tokens: Vec<u32>,
    drafted: u32,
    accepted: u32,
    finished: bool,
    eos: bool,
) -> Step {
    Step::Send(SessionEvent {
        event: Some(session_event::Event::Committed(Committed {
            step,
            tokens,
            drafted,
            accepted,
            finished,
            eos,
            ..Committed::default()
        })),
    })
}

/// One thing a scripted verifier does in a `Run` call.
#[derive(Debug, Clone)]
pub enum Step {
    Send(SessionEvent),
    /// Ends the stream with this status.
    Fail(Status),
    /// Waits before the next step.
    Sleep(Duration),
    /// Waits until the caller cancels the call.
    Hang,
}

/// What a scripted verifier saw.
#[derive(Debug, Clone, Default)]
pub struct VerifierLog {
    pub requests: Arc<Mutex<Vec<RunRequest>>>,
    pub cancellations: Arc<Mutex<usize>>,
    pub cancelled: Arc<Notify>,
}

impl VerifierLog {
    pub fn requests(&self) -> Vec<RunRequest> {
        self.requests.lock().unwrap().clone()
    }

    pub fn cancellations(&self) -> usize {
        *self.cancellations.lock().unwrap()
    }

    fn note_cancelled(&self) {
        *self.cancellations.lock().unwrap() += 1;
        self.cancelled.notify_waiters();
        self.cancelled.notify_one();
    }

    /// Waits (up to 5 s) until some call was cancelled.
    pub async fn wait_cancelled(&self) {
        let wait = async {
            loop {
                let notified = self.cancelled.notified();
                if self.cancellations() > 0 {
                    return;
                }
                notified.await;
            }
        };
        tokio::time::timeout(Duration::from_secs(5), wait)
            .await
            .expect("the verifier call was never cancelled");
    }
}

/// A `Verifier` that plays one script per `Run` call, in order.
#[derive(Debug)]
pub struct ScriptedVerifier {
    scripts: Mutex<VecDeque<Vec<Step>>>,
    log: VerifierLog,
}

#[tonic::async_trait]
impl Verifier for ScriptedVerifier {
    type RunStream = ReceiverStream<Result<SessionEvent, Status>>;

    async fn run(&self, request: Request<RunRequest>) -> Result<Response<Self::RunStream>, Status> {
        self.log.requests.lock().unwrap().push(request.into_inner());
        let Some(script) = self.scripts.lock().unwrap().pop_front() else {
            return Err(Status::unavailable("scripted verifier: no script left"));
        };
        // A one-slot channel, so a cancelled call is noticed at the next send.
        let (tx, rx) = mpsc::channel(1);
        let log = self.log.clone();
        tokio::spawn(async move {
            for step in script {
                match step {
                    Step::Send(event) => {
                        if tx.send(Ok(event)).await.is_err() {
                            log.note_cancelled();
                            return;
                        }
                    }
                    Step::Fail(status) => {
                        let _ = tx.send(Err(status)).await;
                        return;
                    }
                    Step::Sleep(d) => tokio::time::sleep(d).await,
                    Step::Hang => {
                        tx.closed().await;
                        log.note_cancelled();
                        return;
                    }
                }
            }
        });
        Ok(Response::new(ReceiverStream::new(rx)))
    }

    async fn stats(&self, _: Request<StatsRequest>) -> Result<Response<VerifierStats>, Status> {
        Err(Status::unimplemented("scripted verifier"))
    }
}

/// A scripted verifier serving on 127.0.0.1:0; stops when dropped.
#[derive(Debug)]
pub struct ScriptedServer {
    pub endpoint: String,
    pub addr: SocketAddr,
    pub log: VerifierLog,
    task: JoinHandle<()>,
}

impl Drop for ScriptedServer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a scripted verifier that plays `scripts[i]` on its i-th call.
pub async fn spawn_verifier(scripts: Vec<Vec<Step>>) -> ScriptedServer {
    let log = VerifierLog::default();
    let service = ScriptedVerifier {
        scripts: Mutex::new(scripts.into()),
        log: log.clone(),
    };
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let task = tokio::spawn(async move {
        let _ = tonic::transport::Server::builder()
            .add_service(VerifierServer::new(service))
            .serve_with_incoming(tonic::transport::server::TcpIncoming::from(listener))
            .await;
    });
    ScriptedServer {
        endpoint: format!("http://{addr}"),
        addr,
        log,
        task,
    }
}

/// A TCP proxy in front of `upstream` whose connections [`Proxy::cut`]
/// drops at once, as when a pod dies.
#[derive(Debug)]
pub struct Proxy {
    pub endpoint: String,
    conns: Arc<Mutex<Vec<JoinHandle<()>>>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    pub async fn start(upstream: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let endpoint = format!("http://{}", listener.local_addr().unwrap());
        let conns: Arc<Mutex<Vec<JoinHandle<()>>>> = Arc::default();
        let held = conns.clone();
        let accept = tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                let conn = tokio::spawn(async move {
                    if let Ok(mut outbound) = TcpStream::connect(upstream).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
                held.lock().unwrap().push(conn);
            }
        });
        Proxy {
            endpoint,
            conns,
            accept,
        }
    }

    /// Drops every connection and refuses new ones.
    pub fn cut(&self) {
        self.accept.abort();
        for conn in self.conns.lock().unwrap().drain(..) {
            conn.abort();
        }
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.cut();
    }
}
