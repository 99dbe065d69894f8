//! The whole system as `specmesh up` starts it: separate processes talking
//! real gRPC on loopback, stopped (SIGTERM) when the `Mesh` is dropped.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::{MutexGuard, mpsc};
use std::time::Duration;

use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

use crate::{model_path, specmesh_bin};

/// SmolLM2-135M's cost curve as measured (docs/performance.md); measuring
/// it at every start would add seconds to every test.
/// A verify cost that barely grows with the tree: the policy then drafts
/// with a draft model however its forward compares to the target's.
pub const FLAT_CURVE: &str = "1:1,2:1.01,4:1.02,8:1.04,16:1.08,32:1.16,64:1.32";

const SMOLLM2_COST_CURVE: &str = "1:1,2:1.26,4:1.85,8:2.99,16:5.02,32:9.5,64:18";

/// A service started by `specmesh up`.
#[derive(Debug, Clone)]
pub struct Proc {
    pub name: String,
    pub url: String,
    pub pid: u32,
    /// Its Prometheus `/metrics` URL.
    pub metrics: Option<String>,
}

#[derive(Debug)]
pub struct Mesh {
    child: Child,
    pub gateway: String,
    /// The gateway's Prometheus `/metrics` URL.
    pub gateway_metrics: Option<String>,
    /// The gateway's OpenAI-compatible front, `http://ADDR`, when `up` was
    /// given `--http-listen`.
    pub http: Option<String>,
    pub services: Vec<Proc>,
    /// What `specmesh up` printed before the gateway served (each
    /// service's model and memory line, its address).
    pub startup: Vec<String>,
    /// Held while a mesh with a draft model runs: see [`draft_model_turn`].
    /// Dropped after `Drop::drop` has stopped the processes.
    _turn: Option<MutexGuard<'static, ()>>,
}

/// One mesh with a draft model at a time in a test binary. The harness
/// runs a file's tests on parallel threads; two such meshes then run a
/// verifier and a drafter forward each on two cores, every thread pool is
/// oversubscribed and an 8-layer draft forward that takes milliseconds
/// alone took 180 ms here, past the verifier's draft timeout: the trees
/// arrive too late to be verified and a test of what they do sees none.
/// Model-free meshes draft in microseconds and keep running in parallel.
fn draft_model_turn() -> MutexGuard<'static, ()> {
    static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());
    TURN.lock().unwrap_or_else(|e| e.into_inner())
}

impl Mesh {
    /// One verifier and one drafter.
    pub fn start() -> Mesh {
        Mesh::start_with(1, 1, &[])
    }

    /// `verifiers` verifiers, `drafters` drafters, extra environment for
    /// every service (e.g. `SPECMESH_GATEWAY_MAX_CONCURRENT_REQUESTS`).
    pub fn start_with(verifiers: usize, drafters: usize, env: &[(&str, &str)]) -> Mesh {
        // The cost curve measured on this machine (docs/performance.md); measuring it
        // at every start would add seconds to every test.
        Mesh::start_model(
            &model_path(),
            "1:1,2:1.26,4:1.85,8:2.99,16:5.02,32:9.5,64:18",
            verifiers,
            drafters,
            env,
        )
    }

    /// Like [`Mesh::start_with`] with another model (a path or a catalog
    /// name) and its cost curve (`k:ratio,…`).
    pub fn start_model(
        model: &std::path::Path,
        cost_curve: &str,
        verifiers: usize,
        drafters: usize,
        env: &[(&str, &str)],
    ) -> Mesh {
        let layout = [
            "--verifiers".to_string(),
            verifiers.to_string(),
            "--drafters".to_string(),
            drafters.to_string(),
        ];
        Mesh::start_up(model, cost_curve, &layout, env)
    }

    /// One verifier and one drafter drafting with `draft_model` (a path or
    /// a catalog name) besides its model-free drafters.
    pub fn start_with_draft_model(draft_model: &std::path::Path, env: &[(&str, &str)]) -> Mesh {
        let args = [
            "--draft-model".to_string(),
            draft_model.display().to_string(),
        ];
        Mesh::start_up(&model_path(), SMOLLM2_COST_CURVE, &args, env)
    }

    /// One verifier of `model` on `cost_curve` and one drafter drafting with
    /// `draft_model` (both paths or catalog names), which may be of
    /// another vocabulary (it then drafts through text).
    pub fn start_model_with_draft(
        model: &std::path::Path,
        cost_curve: &str,
        draft_model: &std::path::Path,
        env: &[(&str, &str)],
    ) -> Mesh {
        let args = [
            "--draft-model".to_string(),
            draft_model.display().to_string(),
        ];
        Mesh::start_up(model, cost_curve, &args, env)
    }

    /// A self-draft mesh: the drafter drafts with the target's first 8
    /// layers, on a verify cost curve that barely grows with the tree (so
    /// the policy drafts with it however its forward compares to the
    /// target's), with trees verified whole (the goodput planner learns
    /// this machine's step times and may rightly prune every node of a
    /// slow self-draft, and then no tree of it would be tested); `extra`
    /// adds drafter or verifier settings.
    pub fn start_self_draft(extra: &[(&str, &str)]) -> Mesh {
        let mut env = vec![
            ("SPECMESH_DRAFTER_SELF_DRAFT_LAYERS", "8"),
            ("SPECMESH_VERIFIER_COST_CURVE", FLAT_CURVE),
            ("SPECMESH_VERIFIER_GOODPUT_PLANNER", "false"),
            // While other sessions decode, a session's tree has only the
            // batch's wait (1 ms, or a tenth of a forward) to be drafted
            // in, and the drafter drafts no model tree that would miss it:
            // on a loaded machine an 8-layer forward can take longer, and
            // the test would then see no model tree at all. 30 ms leaves
            // room for several levels on any machine; these tests are
            // about what trees do, not when they arrive.
            ("SPECMESH_VERIFIER_BATCH_WINDOW_US", "30000"),
        ];
        env.extend_from_slice(extra);
        Mesh::start_with_draft_model(&model_path(), &env)
    }

    /// The default model with `args` added to `specmesh up`.
    pub fn start_with_args(args: &[&str], env: &[(&str, &str)]) -> Mesh {
        let args: Vec<String> = args.iter().map(|a| a.to_string()).collect();
        Mesh::start_up(&model_path(), SMOLLM2_COST_CURVE, &args, env)
    }

    /// `specmesh up --model MODEL ARGS…`, the verifiers on `cost_curve`.
    fn start_up(
        model: &std::path::Path,
        cost_curve: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Mesh {
        Mesh::start_up_in(None, model, cost_curve, args, env)
    }

    /// [`Mesh::start_up`] in the network namespace `netns` (`ip netns
    /// exec`), when given: the gateway is then reached from inside it.
    pub fn start_up_in(
        netns: Option<&str>,
        model: &std::path::Path,
        cost_curve: &str,
        args: &[String],
        env: &[(&str, &str)],
    ) -> Mesh {
        let turn = args
            .iter()
            .any(|a| a == "--draft-model")
            .then(draft_model_turn);
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(specmesh_bin());
                c
            }
            None => Command::new(specmesh_bin()),
        };
        cmd.args(["up", "--listen", "127.0.0.1:0"])
            .args(args)
            .arg("--model")
            .arg(model)
            .env("SPECMESH_LOG", "warn")
            .env("SPECMESH_VERIFIER_COST_CURVE", cost_curve)
            .env("SPECMESH_VERIFIER_THREADS", "2")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (k, v) in env {
            cmd.env(k, v);
        }
        let mut child = cmd.spawn().expect("starting specmesh up");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    // Keep draining so `up` never blocks on a full pipe.
                    continue;
                }
            }
        });
        let mut services = Vec::new();
        let mut startup = Vec::new();
        let mut http = None;
        let gateway = loop {
            let line = rx
                .recv_timeout(Duration::from_secs(180))
                .unwrap_or_else(|_| {
                    panic!("specmesh up did not come up; services so far: {services:?}")
                });
            startup.push(line.clone());
            if let Some(addr) = line.strip_prefix("specmesh up: gateway listening on ") {
                break format!("http://{}", addr.trim());
            }
            // "specmesh-verifier at http://127.0.0.1:PORT (pid N) metrics URL"
            if let Some((name, rest)) = line.split_once(" at ")
                && let Some((url, rest)) = rest.split_once(" (pid ")
                && let Some((pid, rest)) = rest.split_once(')')
            {
                services.push(Proc {
                    name: name.to_string(),
                    url: url.to_string(),
                    pid: pid.parse().unwrap_or(0),
                    metrics: rest.trim().strip_prefix("metrics ").map(str::to_string),
                });
            }
            // "specmesh-gateway http at http://127.0.0.1:PORT (OpenAI-compatible)"
            if let Some(rest) = line.strip_prefix("specmesh-gateway http at ") {
                http = rest.split_whitespace().next().map(str::to_string);
            }
        };
        let gateway_metrics = services
            .iter()
            .find(|p| p.name == "specmesh-gateway")
            .and_then(|p| p.metrics.clone());
        Mesh {
            child,
            gateway,
            gateway_metrics,
            http,
            services,
            startup,
            _turn: turn,
        }
    }

    pub fn of(&self, name: &str) -> Vec<&Proc> {
        self.services.iter().filter(|p| p.name == name).collect()
    }

    pub async fn client(&self) -> GenerationClient<Channel> {
        GenerationClient::connect(self.gateway.clone())
            .await
            .expect("connecting to the gateway")
    }
}

impl Drop for Mesh {
    fn drop(&mut self) {
        // SAFETY: kill(2) on our own child's pid.
        unsafe {
            libc::kill(self.child.id() as i32, libc::SIGTERM);
        }
        for _ in 0..200 {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A request for `text` as one chat message.
pub fn chat_request(text: &str, max_new_tokens: u32) -> v1::GenerateRequest {
    v1::GenerateRequest {
        input: Some(v1::generate_request::Input::Chat(v1::Chat {
            messages: vec![v1::ChatMessage {
                role: "user".into(),
                content: text.into(),
                ..Default::default()
            }],
            ..Default::default()
        })),
        max_new_tokens,
        ..Default::default()
    }
}

/// The same request with speculation off.
/// The chat request `text` through the gateway, with speculation and
/// without: the two answers a greedy test compares.
pub async fn spec_and_off(
    client: &mut GenerationClient<Channel>,
    text: &str,
    max_new_tokens: u32,
) -> (v1::GenerateResponse, v1::GenerateResponse) {
    let spec = client
        .generate(chat_request(text, max_new_tokens))
        .await
        .expect("generating with speculation")
        .into_inner();
    let off = client
        .generate(without_speculation(chat_request(text, max_new_tokens)))
        .await
        .expect("generating without speculation")
        .into_inner();
    (spec, off)
}

/// Sends every request at once, each on its own connection, and returns
/// the responses in the requests' order (panics on an error status).
pub async fn generate_all(
    gateway: &str,
    requests: Vec<v1::GenerateRequest>,
) -> Vec<v1::GenerateResponse> {
    let tasks: Vec<_> = requests
        .into_iter()
        .map(|r| {
            let gateway = gateway.to_string();
            tokio::spawn(async move {
                let mut c = GenerationClient::connect(gateway).await.unwrap();
                c.generate(r).await.unwrap().into_inner()
            })
        })
        .collect();
    let mut out = Vec::with_capacity(tasks.len());
    for t in tasks {
        out.push(t.await.unwrap());
    }
    out
}

/// The sampling tests' request: a prompt whose first words vary a lot,
/// `tokens` new tokens sampled at `temperature` / `top_p` with `seed`.
pub fn sampled_request(
    temperature: f32,
    top_p: f32,
    seed: u64,
    tokens: u32,
) -> v1::GenerateRequest {
    v1::GenerateRequest {
        sampling: Some(v1::SamplingParams {
            temperature,
            top_p,
            top_k: 0,
            seed,
        }),
        ..chat_request(
            "Write one word that comes to your mind, then a short sentence with it.",
            tokens,
        )
    }
}

/// The same request with speculation in `mode`.
pub fn with_mode(mut r: v1::GenerateRequest, mode: v1::SpeculationMode) -> v1::GenerateRequest {
    r.speculation = Some(v1::SpeculationParams {
        mode: mode as i32,
        max_draft_tokens: 0,
    });
    r
}

pub fn without_speculation(mut r: v1::GenerateRequest) -> v1::GenerateRequest {
    r.speculation = Some(v1::SpeculationParams {
        mode: v1::SpeculationMode::Off as i32,
        max_draft_tokens: 0,
    });
    r
}

/// Prompts of mixed kinds: the first `per_category` questions of every
/// Spec-Bench category in the shared benchmark file beside the checkout, or
/// a built-in mixed set of 26 when that file is not there.
pub fn bench_prompts(per_category: usize) -> Vec<(String, String)> {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../shared/bench/spec_bench_dev.jsonl");
    let Ok(text) = std::fs::read_to_string(&path) else {
        eprintln!("{} not found: using the built-in prompts", path.display());
        return BUILT_IN
            .iter()
            .map(|(c, p)| ((*c).to_string(), (*p).to_string()))
            .collect();
    };
    let mut seen: std::collections::HashMap<String, usize> = Default::default();
    let mut out = Vec::new();
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let q: serde_json::Value = serde_json::from_str(line).expect("a Spec-Bench line");
        let cat = q["category"].as_str().unwrap_or_default().to_string();
        let n = seen.entry(cat.clone()).or_default();
        *n += 1;
        if *n <= per_category {
            out.push((cat, q["turns"][0].as_str().unwrap_or_default().to_string()));
        }
    }
    out
}

const BUILT_IN: [(&str, &str); 26] = [
    (
        "translation",
        "Translate to German: The train leaves at seven in the morning.",
    ),
    (
        "translation",
        "Translate to French: I would like a cup of coffee, please.",
    ),
    (
        "translation",
        "Translate to Spanish: Where is the nearest library?",
    ),
    (
        "summarization",
        "Summarize: The city council voted to extend the bike lanes downtown after a year of record ridership, citing fewer accidents and less traffic.",
    ),
    (
        "summarization",
        "Summarize in one sentence: Photosynthesis lets plants turn sunlight, water and carbon dioxide into sugar and oxygen.",
    ),
    (
        "summarization",
        "Summarize: The meeting covered the budget, the new hires, and the office move planned for spring.",
    ),
    ("qa", "What is the capital of Japan?"),
    ("qa", "Why is the sky blue?"),
    ("qa", "How many legs does a spider have?"),
    (
        "math_reasoning",
        "A shop sells pens at 3 dollars each. How much do 7 pens cost? Explain.",
    ),
    (
        "math_reasoning",
        "If a train travels 60 km in one hour, how far does it go in 2.5 hours?",
    ),
    ("math_reasoning", "What is 15 percent of 80?"),
    (
        "rag",
        "Context: The Nile is about 6650 km long and flows north into the Mediterranean. Question: Into which sea does the Nile flow?",
    ),
    (
        "rag",
        "Context: Ada Lovelace wrote the first published algorithm for Babbage's Analytical Engine. Question: What did Ada Lovelace write?",
    ),
    (
        "rag",
        "Context: Mount Everest is 8849 metres high. Question: How high is Mount Everest?",
    ),
    ("writing", "Write a two-line poem about rain."),
    ("writing", "Write a short thank-you note to a teacher."),
    ("roleplay", "Pretend you are a pirate and greet me."),
    (
        "reasoning",
        "If all cats are animals and Tom is a cat, is Tom an animal?",
    ),
    ("math", "Solve for x: 2x + 6 = 14."),
    ("coding", "Write a Python function that reverses a string."),
    (
        "coding",
        "Write a SQL query that counts the rows of a table named users.",
    ),
    (
        "extraction",
        "Extract the names from: Alice met Bob and Carol at the station.",
    ),
    (
        "stem",
        "What is the boiling point of water at sea level in Celsius?",
    ),
    ("humanities", "Who wrote Romeo and Juliet?"),
    ("humanities", "Name three ancient civilizations."),
];
