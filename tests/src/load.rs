//! Load for the chaos tests: a fixed set of streamed requests, run all at
//! once in rounds against a [`Cluster`] while a [`Chaos`] thread kills its
//! members, each output compared with the same request's fault-free one.

use std::time::{Duration, Instant};

use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use tonic::transport::Channel;

use crate::chaos::{Chaos, Kill, Plan};
use crate::cluster::{Cluster, Role};
use crate::mesh::chat_request;

/// One request of the load, named for messages.
#[derive(Debug, Clone)]
pub struct Job {
    pub name: String,
    pub request: v1::GenerateRequest,
}

/// Greedy prompts of varied lengths, from a few words to a paragraph, so
/// prefills and completions of many sizes share the verifiers' batches.
const GREEDY: [&str; 12] = [
    "What is the capital of Japan?",
    "Explain how a bicycle works, step by step.",
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "List five fruits and one fact about each.",
    "Summarize: The city council voted to extend the bike lanes downtown after a year of \
     record ridership, citing fewer accidents, less traffic and more customers for the \
     shops along the new lanes. Opponents worried about parking, but the council promised \
     two new garages at the edge of the center.",
    "Write a Python function that checks whether a string is a palindrome, and explain it.",
    "Why is the sky blue?",
    "Translate to French: I would like a cup of coffee and a croissant, please.",
    "Context: The Nile is about 6650 km long and flows north through eleven countries into \
     the Mediterranean Sea. Its two main tributaries, the White Nile and the Blue Nile, meet \
     at Khartoum. Question: Where do the two main tributaries of the Nile meet, and into \
     which sea does the river flow?",
    "Give three tips for learning a new language.",
    "A shop sells pens at 3 dollars each. How much do 7 pens cost? Explain your reasoning.",
    "Describe the water cycle to a ten-year-old.",
];

/// Prompts for the seeded sampled requests.
const SAMPLED: [&str; 4] = [
    "Write one word that comes to your mind, then a short sentence with it.",
    "Invent a name for a new planet and describe it in two sentences.",
    "Tell me a very short joke.",
    "Describe your ideal weekend.",
];

/// The load: the 12 greedy prompts (48 to 96 new tokens) and 4 sampled
/// ones (temperature 0.8, top-p 0.95, each its own seed), all streamed.
pub fn jobs() -> Vec<Job> {
    let lengths = [48, 64, 80, 96];
    let mut jobs: Vec<Job> = GREEDY
        .iter()
        .enumerate()
        .map(|(i, p)| Job {
            name: format!("greedy-{i}"),
            request: chat_request(p, lengths[i % lengths.len()]),
        })
        .collect();
    jobs.extend(SAMPLED.iter().enumerate().map(|(i, p)| Job {
        name: format!("sampled-{i}"),
        request: v1::GenerateRequest {
            sampling: Some(v1::SamplingParams {
                temperature: 0.8,
                top_p: 0.95,
                top_k: 0,
                seed: 1000 + i as u64,
            }),
            ..chat_request(p, lengths[(i + 1) % lengths.len()])
        },
    }));
    jobs
}

/// A completed stream, and when its parts arrived.
#[derive(Debug, Clone)]
pub struct Streamed {
    pub tokens: Vec<u32>,
    pub started: Instant,
    /// When each chunk that carried tokens arrived.
    pub arrivals: Vec<Instant>,
    pub done: Instant,
}

impl Streamed {
    pub fn latency(&self) -> Duration {
        self.done - self.started
    }
}

/// Streams `request` to its end. Err (saying why) when the call fails, a
/// chunk's `token_offset` shows a gap or a repeat, or the stream ends
/// without a finish reason.
pub async fn stream(
    client: &mut GenerationClient<Channel>,
    request: v1::GenerateRequest,
) -> Result<Streamed, String> {
    let started = Instant::now();
    let mut chunks = client
        .generate_stream(request)
        .await
        .map_err(|e| format!("refused: {:?}: {}", e.code(), e.message()))?
        .into_inner();
    let (mut tokens, mut arrivals, mut finished) = (Vec::new(), Vec::new(), false);
    loop {
        match chunks.message().await {
            Ok(Some(chunk)) => {
                if chunk.token_offset as usize != tokens.len() {
                    return Err(format!(
                        "a chunk at offset {} after {} tokens: a gap or a repeat",
                        chunk.token_offset,
                        tokens.len()
                    ));
                }
                if finished {
                    return Err("a chunk after the last one".into());
                }
                if !chunk.token_ids.is_empty() {
                    arrivals.push(Instant::now());
                }
                tokens.extend(chunk.token_ids);
                finished = chunk.finish_reason != v1::FinishReason::Unspecified as i32;
            }
            Ok(None) if finished => break,
            Ok(None) => {
                return Err(format!(
                    "ended without a finish reason after {} tokens",
                    tokens.len()
                ));
            }
            Err(e) => {
                return Err(format!(
                    "failed after {} tokens: {:?}: {}",
                    tokens.len(),
                    e.code(),
                    e.message()
                ));
            }
        }
    }
    Ok(Streamed {
        tokens,
        started,
        arrivals,
        done: Instant::now(),
    })
}

/// Every job at once, each its own stream; results in the jobs' order.
pub async fn round(gateway: &str, jobs: &[Job]) -> Vec<Result<Streamed, String>> {
    let channel = Channel::from_shared(gateway.to_string())
        .expect("a gateway URL")
        .connect()
        .await
        .expect("connecting to the gateway");
    let handles: Vec<_> = jobs
        .iter()
        .map(|job| {
            let mut client = GenerationClient::new(channel.clone());
            let request = job.request.clone();
            tokio::spawn(async move { stream(&mut client, request).await })
        })
        .collect();
    let mut out = Vec::new();
    for h in handles {
        out.push(
            h.await
                .unwrap_or_else(|e| Err(format!("the task failed: {e}"))),
        );
    }
    out
}

/// A member's time down: (role, killed, back). A kill still in progress
/// is down until now.
type Outage = (Role, Instant, Instant);

/// What the rounds under chaos came to.
#[derive(Debug, Default)]
pub struct Tally {
    pub rounds: usize,
    pub requests: usize,
    /// Requests that failed or broke their stream: `job: why`.
    pub lost: Vec<String>,
    /// Requests whose tokens differ from the fault-free run's.
    pub changed: Vec<String>,
    /// Every completed request: (job, latency in seconds, whether a member
    /// was down while it ran).
    pub latencies: Vec<(usize, f64, bool)>,
    /// Per kill with streams in flight: how long until every one of them
    /// delivered tokens again (seconds), by the victim's role.
    pub stall_verifier: Vec<f64>,
    pub stall_drafter: Vec<f64>,
}

impl Tally {
    /// Counts one round: `results[i]` is `jobs[i]`'s, `reference[i]` its
    /// fault-free run.
    pub fn record(
        &mut self,
        jobs: &[Job],
        reference: &[Streamed],
        results: &[Result<Streamed, String>],
        outages: &[Outage],
    ) {
        self.rounds += 1;
        for (j, ((job, want), got)) in jobs.iter().zip(reference).zip(results).enumerate() {
            self.requests += 1;
            let got = match got {
                Ok(s) => s,
                Err(why) => {
                    self.lost
                        .push(format!("round {}, {}: {why}", self.rounds, job.name));
                    continue;
                }
            };
            if got.tokens != want.tokens {
                let same = got
                    .tokens
                    .iter()
                    .zip(&want.tokens)
                    .take_while(|(a, b)| a == b)
                    .count();
                self.changed.push(format!(
                    "round {}, {}: {} tokens, the fault-free run {}, first difference at {same}",
                    self.rounds,
                    job.name,
                    got.tokens.len(),
                    want.tokens.len()
                ));
            }
            // In flight from a kill until 4 s after the victim was back:
            // until the gateway's health watch (back-off up to 4 s) sees
            // a restarted verifier, the other one serves everything.
            let faulted = outages.iter().any(|&(_, down, back)| {
                down < got.done && back + Duration::from_secs(4) > got.started
            });
            self.latencies
                .push((j, got.latency().as_secs_f64(), faulted));
        }
        // The stall a kill caused: from the kill to the first tokens after
        // it, for every stream in flight then; the slowest one is the
        // kill's (a stream the victim served waits for the gateway to
        // notice and re-place it, the others only for their next step).
        for &(role, down, _) in outages {
            let stall = results
                .iter()
                .flatten()
                .filter(|s| s.started < down && s.done > down)
                .map(|s| {
                    let next = s.arrivals.iter().find(|&&t| t > down).unwrap_or(&s.done);
                    (*next - down).as_secs_f64()
                })
                .fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))));
            if let Some(stall) = stall {
                match role {
                    Role::Verifier => self.stall_verifier.push(stall),
                    Role::Drafter => self.stall_drafter.push(stall),
                }
            }
        }
    }

    /// The latency a fault added to each request in flight while a member
    /// was down: its latency minus the median latency of the same job in
    /// the requests that saw no fault (the fault-free run's among them).
    /// Not the fault-free run's alone: later rounds are faster, as the
    /// drafters' indexes and acceptance statistics learn the repeated
    /// outputs. Also returns the same difference for the requests that saw
    /// no fault (centred on 0; their spread is the measure's noise).
    pub fn added_latency(&self, reference: &[Streamed]) -> (Vec<f64>, Vec<f64>) {
        let baseline: Vec<f64> = (0..reference.len())
            .map(|j| {
                let mut clean: Vec<f64> = self
                    .latencies
                    .iter()
                    .filter(|&&(job, _, faulted)| job == j && !faulted)
                    .map(|&(_, l, _)| l)
                    .collect();
                clean.push(reference[j].latency().as_secs_f64());
                percentile(&clean, 0.5)
            })
            .collect();
        let (mut faulted, mut clean) = (Vec::new(), Vec::new());
        for &(j, latency, f) in &self.latencies {
            let added = latency - baseline[j];
            if f {
                faulted.push(added)
            } else {
                clean.push(added)
            }
        }
        (faulted, clean)
    }

    /// One line for the log.
    pub fn summary(
        &self,
        reference: &[Streamed],
        kills: &[Kill],
        seed: u64,
        wall: Duration,
    ) -> String {
        let (faulted, clean) = self.added_latency(reference);
        let verifiers = kills.iter().filter(|k| k.role == Role::Verifier).count();
        let p = |xs: &[f64]| {
            format!(
                "p50 {:.2} s, p99 {:.2} s (n {})",
                percentile(xs, 0.50),
                percentile(xs, 0.99),
                xs.len()
            )
        };
        [
            format!(
                "chaos summary: seed {seed}, {:.0} s, {} rounds, {} requests",
                wall.as_secs_f64(),
                self.rounds,
                self.requests
            ),
            format!(
                "{} kills ({verifiers} verifier, {} drafter)",
                kills.len(),
                kills.len() - verifiers
            ),
            format!("lost {}, changed {}", self.lost.len(), self.changed.len()),
            format!(
                "added latency of requests in flight during a kill {} \
                 (the same measure for the others: p1 {:.2} s, p99 {:.2} s)",
                p(&faulted),
                percentile(&clean, 0.01),
                percentile(&clean, 0.99)
            ),
            format!("stall after a verifier kill {}", p(&self.stall_verifier)),
            format!("after a drafter kill {}", p(&self.stall_drafter)),
        ]
        .join("; ")
    }
}

/// Nearest-rank percentile; NaN for no samples.
pub fn percentile(xs: &[f64], p: f64) -> f64 {
    if xs.is_empty() {
        return f64::NAN;
    }
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    let rank = ((p * v.len() as f64).ceil() as usize).clamp(1, v.len());
    v[rank - 1]
}

/// When to stop the chaos: after `kills` kills and `duration`, whichever is
/// later; every round started runs to its end.
#[derive(Debug, Clone)]
pub struct Until {
    pub kills: usize,
    pub duration: Duration,
}

/// The fault-free run of every job, then rounds of all of them at once
/// while a chaos thread kills members by `plan`, until `until`. Returns the
/// tally and every kill; the chaos thread has stopped and every member is
/// up when it returns.
pub async fn under_chaos(cluster: &Cluster, plan: Plan, until: &Until) -> (Tally, Vec<Kill>) {
    let started = Instant::now();
    let jobs = jobs();
    // The fault-free outputs, twice: the first round also warms the
    // drafters' cross-session indexes (the same prompts come back every
    // round), so the second one's latencies, under the same load (all jobs
    // at once), are what the rounds under chaos are compared with. The two
    // must agree: without faults nothing may change either.
    let mut fault_free = Vec::new();
    for pass in 0..2 {
        let t0 = Instant::now();
        let outputs: Vec<Streamed> = round(&cluster.gateway.url, &jobs)
            .await
            .into_iter()
            .zip(&jobs)
            .map(|(r, job)| r.unwrap_or_else(|why| panic!("fault-free {}: {why}", job.name)))
            .collect();
        eprintln!(
            "chaos: fault-free round {} in {:.1} s",
            pass + 1,
            t0.elapsed().as_secs_f64()
        );
        fault_free.push(outputs);
    }
    let reference = fault_free.pop().unwrap();
    for ((job, a), b) in jobs.iter().zip(&fault_free[0]).zip(&reference) {
        assert_eq!(
            a.tokens, b.tokens,
            "{}: two fault-free runs differ",
            job.name
        );
    }
    let seed = plan.seed;
    let chaos = Chaos::start(cluster.handle(), plan);
    let chaos_started = Instant::now();
    let mut tally = Tally::default();
    loop {
        let results = round(&cluster.gateway.url, &jobs).await;
        let mut outages: Vec<Outage> = chaos.log().iter().map(|k| (k.role, k.at, k.back)).collect();
        if let Some((role, _, at)) = chaos.in_progress() {
            outages.push((role, at, Instant::now()));
        }
        tally.record(&jobs, &reference, &results, &outages);
        eprintln!(
            "chaos: round {} done, {} kills so far, lost {}, changed {}",
            tally.rounds,
            chaos.kills(),
            tally.lost.len(),
            tally.changed.len()
        );
        if chaos.kills() >= until.kills && chaos_started.elapsed() >= until.duration {
            break;
        }
    }
    let kills = chaos.stop();
    eprintln!(
        "{}",
        tally.summary(&reference, &kills, seed, started.elapsed())
    );
    (tally, kills)
}
