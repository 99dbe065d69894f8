//! The batching thread with the real SmolLM2-135M: which steps share a
//! forward, how a prefill rides in them, what a failed forward and a caller
//! that left do to the rest.
//!
//! Determinism: a batch forms once as many steps as sessions decode (the
//! `decoding` gauge, held here as the session shell holds it) arrived, or
//! when its window ends. The window here outlasts any answer's wait, so
//! what was sent forms a batch, never timing; where the order in which the
//! thread first sees jobs matters, they are queued before it starts
//! ([`paused`]). Greedy sessions without stop rules commit exactly what
//! plain decoding (`specmesh_engine::plain`) does: every answer is checked
//! token for token. The goodput planner is off (trees verified
//! whole) but in one test: what it grants depends on measured forward
//! times, except in a fresh batcher's first forward, which that test runs.

use std::future::Future;
use std::pin::Pin;
use std::sync::OnceLock;
use std::task::{Context, Poll, Waker};
use std::thread::JoinHandle;

use specmesh_engine::{SessionLimits, plain, step_batch};
use specmesh_model::{LoadOptions, Sequence};
use specmesh_planner::StepModel;
use specmesh_sampling::SamplingParams;
use specmesh_tokenizer::Tokenizer;
use specmesh_tree::Sources;
use specmesh_tree::{TreeBuilder, TreeLimits};

use super::*;
use crate::memory::KvMemory;
use crate::state::Gauge;
use crate::step::root_only;

mod prefill;
mod yielding;

/// A batch window longer than [`WEDGED`]: batches form by the `decoding`
/// gauge, and a test whose batcher waits a window out fails.
const FOREVER: Duration = Duration::from_secs(120);
/// How long an answer may take before the batcher counts as wedged (a
/// guard against hanging, not a speed check).
const WEDGED: Duration = Duration::from_secs(60);
/// Target top-k per path node: log-probabilities compared exactly.
const TOP_K: usize = 4;
const MAX_NEW: usize = 64;
const MAX_DRAFT: usize = 8;

const PROMPTS: [&str; 5] = [
    "The capital of France is",
    "def add(a, b):",
    "Once upon a time, in a small village,",
    "List three colors:",
    "The boiling point of water is",
];

fn model() -> &'static Arc<Model> {
    static M: OnceLock<Arc<Model>> = OnceLock::new();
    M.get_or_init(|| {
        let path = specmesh_testing::model_path();
        Arc::new(Model::load(&path, &LoadOptions::default()).expect("loading the test model"))
    })
}

fn vocab() -> u32 {
    model().config().vocab_size as u32
}

fn prompt(text: &str) -> Vec<u32> {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    let t = T.get_or_init(|| Tokenizer::from_model_path(&specmesh_testing::model_path()).unwrap());
    t.encode_for_model(text).unwrap()
}

/// A prompt of several prefill chunks.
fn long_prompt() -> Vec<u32> {
    let p = prompt(&"The quick brown fox jumps over the lazy dog. ".repeat(8));
    assert!(p.len() > 64, "{} tokens", p.len());
    p
}

/// No stop rule: every step commits all it verified, as plain decoding
/// of the same length does.
fn limits(max_new: usize) -> SessionLimits {
    SessionLimits {
        max_new_tokens: max_new,
        eos: Vec::new(),
    }
}

/// The first `n` tokens plain greedy decoding commits after `prompt`.
fn plain(prompt: &[u32], n: usize) -> Vec<u32> {
    let mut batch = plain::greedy_batch(model(), &[prompt.to_vec()], n, &[]).unwrap();
    batch.pop().expect("one answer per prompt")
}

/// A session as the session shell makes one (`stream::drive_inner`),
/// reusing a kept cache when given one.
fn session(tokens: &[u32], cache: Option<(Sequence, &[u32])>) -> Box<Session> {
    let (params, n) = (SamplingParams::greedy(), tokens.len());
    let s = Session::new(model(), tokens.to_vec(), n, params, limits(MAX_NEW), cache);
    let mut s = Box::new(s.unwrap());
    s.reserve_kv(n + MAX_NEW + MAX_DRAFT + 1);
    s
}

/// A session whose prefill is not under test.
fn prefilled(prompt: &[u32]) -> Box<Session> {
    let mut s = session(prompt, None);
    s.prefill(model()).unwrap();
    s
}

/// The root alone, as a session without a drafter verifies it.
fn plain_tree(s: &Session) -> TokenTree {
    root_only(s.root(), vocab()).unwrap()
}

fn plain_job(s: Box<Session>) -> (Box<Session>, TokenTree) {
    let t = plain_tree(&s);
    (s, t)
}

/// `right` as a chain under `root`, each node after a wrong sibling (so a
/// path's tree indices are not its depths): greedy accepts the chain.
fn chain_tree(root: u32, right: &[u32]) -> TokenTree {
    let v = vocab();
    let mut b =
        TreeBuilder::new(root, TreeLimits::new(2 * right.len() + 1, right.len(), v)).unwrap();
    let mut node = 0;
    for &t in right {
        b.push(node, (t + 1) % v, 0.01).unwrap();
        node = b.push(node, t, 0.9).unwrap();
    }
    b.build()
}

/// As `server::build` makes it, from a fixed prior (the server measures
/// its own): with the planner off it only predicts.
fn goodput(enabled: bool, max_forward_tokens: usize) -> Goodput {
    let curve = [(1, 1.0), (2, 1.2), (4, 1.5), (16, 3.7), (64, 13.6)];
    let prior = StepModel::from_curve(0.01, &curve).unwrap();
    Goodput::new(enabled, max_forward_tokens, prior)
}

fn config(max_batch: usize, window: Duration, prefill_chunk: usize) -> BatcherConfig {
    BatcherConfig {
        max_batch,
        window,
        prefill_chunk,
    }
}

/// KV memory with its prefix cache on (sessions without a prefix key
/// neither find nor publish anything).
fn memory() -> KvMemory {
    KvMemory::new(1 << 30, model().kv_bytes_per_token() as u64, true)
}

/// A batcher on `memory`.
fn batcher_on(config: BatcherConfig, memory: &KvMemory) -> Batcher {
    Batcher::start(
        Arc::clone(model()),
        config,
        goodput(false, 512),
        memory.clone(),
    )
}

/// A batcher with the planner off, as `Batcher::start` makes it.
fn batcher(config: BatcherConfig) -> Batcher {
    Batcher::start(Arc::clone(model()), config, goodput(false, 512), memory())
}

/// [`batcher`] with its thread not started yet (`Batcher::start` less the
/// spawn): every job sent before the returned start is queued when the
/// thread first looks.
fn paused(config: BatcherConfig) -> (Batcher, impl FnOnce() -> JoinHandle<()>) {
    paused_on(config, memory())
}

/// [`paused`] on `memory`.
fn paused_on(
    config: BatcherConfig,
    memory: KvMemory,
) -> (Batcher, impl FnOnce() -> JoinHandle<()>) {
    let (tx, rx) = mpsc::channel();
    let counters = Arc::new(Counters {
        window: config.window,
        ..Counters::default()
    });
    let c = Arc::clone(&counters);
    let start = move || {
        std::thread::spawn(move || run(model(), config, goodput(false, 512), &memory, &rx, &c))
    };
    (Batcher { tx, counters }, start)
}

/// The thread must end, without having panicked, once its last handle is
/// gone.
fn stop(batcher: Batcher, thread: JoinHandle<()>) {
    drop(batcher);
    thread.join().expect("the batching thread panicked");
}

/// Sends a batcher call's job (a call sends it on its first poll) without
/// waiting for the answer.
fn send<F: Future + ?Sized>(call: &mut Pin<Box<F>>) {
    assert!(ready(call).is_none(), "answered before the batcher ran it");
}

/// The answer of a call if it is there, without waiting for it.
fn ready<F: Future + ?Sized>(call: &mut Pin<Box<F>>) -> Option<F::Output> {
    match call.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(answer) => Some(answer),
        Poll::Pending => None,
    }
}

async fn answer<T>(call: impl Future<Output = Result<T, VerifierError>>) -> T {
    match tokio::time::timeout(WEDGED, call).await {
        Ok(Ok(done)) => done,
        Ok(Err(e)) => panic!("the batcher: {e}"),
        Err(_) => panic!("no answer in {WEDGED:?}: the batcher is wedged"),
    }
}

fn planning() -> Box<SessionPlanning> {
    Box::new(SessionPlanning::new(Sources::Auto, MAX_DRAFT))
}

/// A step call of the batcher, sent or not yet.
type Call<'a> = Pin<Box<dyn Future<Output = Result<StepDone, VerifierError>> + 'a>>;

/// Each session's step, all sent before any is awaited, as concurrent
/// sessions send them.
fn send_steps(b: &Batcher, jobs: Vec<(Box<Session>, TokenTree)>) -> Vec<Call<'_>> {
    let call = |(s, t)| Box::pin(b.step(s, t, TOP_K, planning())) as Call<'_>;
    let mut calls: Vec<_> = jobs.into_iter().map(call).collect();
    calls.iter_mut().for_each(send);
    calls
}

async fn answers(calls: Vec<Call<'_>>) -> Vec<StepDone> {
    let mut out = Vec::new();
    for call in calls {
        out.push(answer(call).await);
    }
    out
}

/// A prefill call of the batcher, sent.
type Prefill<'a> = Pin<Box<dyn Future<Output = Result<PrefillDone, VerifierError>> + 'a>>;

fn send_prefill<'a>(b: &'a Batcher, prompt: &[u32]) -> Prefill<'a> {
    let mut call: Prefill<'a> = Box::pin(b.prefill(session(prompt, None), None));
    send(&mut call);
    call
}

/// Plain steps of `sessions` sent together; each session back with its
/// step and the answer's batch size.
async fn plain_steps(
    b: &Batcher,
    sessions: impl IntoIterator<Item = Box<Session>>,
) -> Vec<(Box<Session>, Step, usize)> {
    let jobs = sessions.into_iter().map(plain_job).collect();
    let done = answers(send_steps(b, jobs)).await;
    done.into_iter().map(ok).collect()
}

/// `n` plain steps of `s`, each sent once the last is answered, each in
/// a forward of its own; the session back with what they committed.
async fn decode(b: &Batcher, mut s: Box<Session>, n: usize) -> (Box<Session>, Vec<u32>) {
    let mut out = Vec::new();
    for k in 0..n {
        let (next, step, size) = plain_steps(b, [s]).await.pop().unwrap();
        assert_eq!(size, 1, "the batch size of step {k}");
        out.extend(step.committed);
        s = next;
    }
    (s, out)
}

fn ok(done: StepDone) -> (Box<Session>, Step, usize) {
    match done.result {
        Ok(step) => (done.session, step, done.batch_size),
        Err(e) => panic!("step failed: {e}"),
    }
}

/// `result` is the model's refusal, its message naming `what`.
fn failed_with<T>(result: &Result<T, VerifierError>, what: &str) {
    match result {
        Err(VerifierError::Model(m)) => assert!(m.contains(what), "{m}"),
        Err(e) => panic!("{e}"),
        Ok(_) => panic!("no error about {what}"),
    }
}

/// Batched forwards and the steps they verified.
fn counts(c: &Counters) -> (u64, u64) {
    let load = |n: &AtomicU64| n.load(Ordering::Relaxed);
    (load(&c.batches), load(&c.steps))
}

/// Context tokens prefilled, and of those the ones fused into steps.
fn prefill_tokens(c: &Counters) -> (u64, u64) {
    let m = &c.metrics;
    (m.prefill_tokens.get(), m.prefill_fused_tokens.get())
}

#[test]
fn a_batch_waits_the_window_or_a_tenth_of_the_last_forward() {
    let ms = Duration::from_millis;
    assert_eq!(batch_wait(ms(1), 0.002), ms(1));
    assert_eq!(batch_wait(ms(1), 0.05).as_micros(), 5_000);
    assert_eq!(batch_wait(ms(1), -3.0), ms(1));
    assert_eq!(batch_wait(Duration::ZERO, 0.0), Duration::ZERO);
}

#[tokio::test]
async fn concurrent_sessions_are_verified_in_one_forward() {
    let b = batcher(config(8, FOREVER, 0));
    let prompts: Vec<Vec<u32>> = PROMPTS[..3].iter().map(|t| prompt(t)).collect();
    let truth: Vec<Vec<u32>> = prompts.iter().map(|p| plain(p, 16)).collect();
    let mut sessions: Vec<Box<Session>> = prompts.iter().map(|p| prefilled(p)).collect();
    let _decoding: Vec<Gauge> = (0..3).map(|_| Gauge::up(&b.counters().decoding)).collect();
    let mut out = vec![Vec::new(); 3];
    for round in 1..=3u64 {
        // Session 0 speculates the next three right tokens; the others
        // verify their roots alone.
        let mut jobs: Vec<_> = sessions.drain(..).map(plain_job).collect();
        jobs[0].1 = chain_tree(jobs[0].0.root(), &truth[0][out[0].len()..][..3]);
        for (i, done) in answers(send_steps(&b, jobs)).await.into_iter().enumerate() {
            assert_eq!(done.batch_size, 3, "round {round}: one forward");
            assert!(done.granted.is_none() && done.node_budget.is_none());
            assert!(done.batch_wait_us as u128 >= FOREVER.as_micros());
            let (s, step, _) = ok(done);
            assert_eq!(step.accepted, if i == 0 { 3 } else { 0 });
            out[i].extend_from_slice(&step.committed);
            sessions.push(s);
        }
        assert_eq!(counts(b.counters()), (round, 3 * round));
    }
    for (i, o) in out.iter().enumerate() {
        assert_eq!(o[..], truth[i][..o.len()], "session {i}");
    }
}

#[tokio::test]
async fn max_batch_caps_a_batch() {
    let (b, start) = paused(config(2, FOREVER, 0));
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|t| prompt(t)).collect();
    let _decoding: Vec<Gauge> = (0..5).map(|_| Gauge::up(&b.counters.decoding)).collect();
    // All five queued before the thread looks: batches of 2, 2 and 1, in
    // the order the steps came.
    let jobs = prompts.iter().map(|p| plain_job(prefilled(p))).collect();
    let calls = send_steps(&b, jobs);
    let thread = start();
    let done: Vec<_> = answers(calls).await.into_iter().map(ok).collect();
    let sizes: Vec<usize> = done.iter().map(|d| d.2).collect();
    assert_eq!(sizes, [2, 2, 2, 2, 1]);
    assert_eq!(counts(&b.counters), (3, 5));
    for ((_, step, _), p) in done.iter().zip(&prompts) {
        assert_eq!(step.committed, plain(p, 1));
    }
    stop(b, thread);
}

#[tokio::test]
async fn a_step_that_arrives_later_runs_in_a_later_batch() {
    // A short window: the batch with one of two decoding sessions missing
    // goes on without it.
    let b = batcher(config(8, Duration::from_millis(1), 0));
    let (pa, pb) = (prompt(PROMPTS[0]), prompt(PROMPTS[1]));
    let c = b.counters();
    let _decoding = [Gauge::up(&c.decoding), Gauge::up(&c.decoding)];
    let (_, out_a) = decode(&b, prefilled(&pa), 1).await;
    assert_eq!(counts(c), (1, 1));
    // B's step is sent only once A's is answered: a forward of its own.
    let (_, out_b) = decode(&b, prefilled(&pb), 1).await;
    assert_eq!(counts(c), (2, 2));
    assert_eq!((out_a, out_b), (plain(&pa, 1), plain(&pb, 1)));
}

#[tokio::test]
async fn a_bad_tree_in_a_fused_forward_fails_its_step_alone() {
    let (b, start) = paused(config(8, FOREVER, 16));
    let c = Arc::clone(&b.counters);
    let (p1, p2) = (prompt(PROMPTS[0]), prompt(PROMPTS[1]));
    let pp = long_prompt()[..25].to_vec();
    let (t1, t2) = (plain(&p1, 2), plain(&p2, 1));
    let _decoding = [Gauge::up(&c.decoding), Gauge::up(&c.decoding)];
    let prefill = send_prefill(&b, &pp);
    let (s1, s2) = (prefilled(&p1), prefilled(&p2));
    // The tree's root is not the session's last token: the engine refuses
    // the whole fused forward.
    let bad = root_only(s2.root() + 1, vocab()).unwrap();
    let calls = send_steps(&b, vec![plain_job(s1), (s2, bad)]);
    let thread = start();
    let mut done = answers(calls).await;
    let (two, (s1, step1, size1)) = (done.pop().unwrap(), ok(done.pop().unwrap()));
    // Retried without the chunk, then one by one: only the bad step fails,
    // its session as it was.
    assert_eq!((step1.committed, size1), (t1[..1].to_vec(), 1));
    failed_with(&two.result, "root");
    let s2 = two.session;
    assert_eq!((two.batch_size, two.forward_us), (1, 0));
    assert_eq!((s2.tokens(), s2.prefilled()), (&p2[..], p2.len() - 1));
    assert_eq!(counts(&c), (1, 1), "one good forward, of one step");
    // Then the chunk ran alone, and the rest rides with the next steps.
    let stepped = plain_steps(&b, vec![s1, s2]).await;
    assert_eq!((stepped[0].2, stepped[1].2), (2, 2));
    assert_eq!(stepped[0].1.committed, t1[1..]);
    assert_eq!(stepped[1].1.committed, t2);
    let done = answer(prefill).await;
    assert_eq!(done.result.unwrap().0, 0);
    assert_eq!(prefill_tokens(&c), (24, 8));
    // Its KV is right: its step commits what plain decoding does.
    let _third = Gauge::up(&c.decoding);
    let mut sessions: Vec<_> = stepped.into_iter().map(|(s, ..)| s).collect();
    sessions.push(done.session);
    let stepped = plain_steps(&b, sessions).await;
    assert_eq!(stepped[2].1.committed, plain(&pp, 1));
    stop(b, thread);
}

#[tokio::test]
async fn a_caller_that_drops_its_step_wedges_nothing() {
    let (b, start) = paused(config(8, FOREVER, 0));
    let c = Arc::clone(&b.counters);
    let (pa, pb) = (prompt(PROMPTS[0]), prompt(PROMPTS[1]));
    let gauge_a = Gauge::up(&c.decoding);
    let _gauge_b = Gauge::up(&c.decoding);
    // A's session ends with its step queued: the shell drops the call, and
    // its decoding gauge with it.
    drop(send_steps(&b, vec![plain_job(prefilled(&pa))]));
    drop(gauge_a);
    let calls = send_steps(&b, vec![plain_job(prefilled(&pb))]);
    let thread = start();
    let (s, step, _) = ok(answers(calls).await.pop().unwrap());
    // B decodes alone now.
    let (_, out) = decode(&b, s, 2).await;
    assert_eq!([step.committed, out].concat(), plain(&pb, 3));
    assert_eq!(c.decoding.load(Ordering::Relaxed), 1, "moved by no batcher");
    // A's queued step is still verified (into the void) today; skipping it
    // would be right too. Either way each step that ran counts once.
    let (batches, steps) = counts(&c);
    assert!(
        batches == 3 && (3..=4).contains(&steps),
        "{batches}, {steps}"
    );
    stop(b, thread);
}

#[tokio::test]
async fn a_tree_the_planner_pruned_reports_its_path_in_the_drafters_indices() {
    // A forward of at most 4 tokens holds the root and 3 of the tree's 6
    // drafted nodes: pruned, whatever the planner has learned.
    let b = Batcher::start(
        Arc::clone(model()),
        config(8, FOREVER, 0),
        goodput(true, 4),
        memory(),
    );
    let pd = prompt(PROMPTS[2]);
    let truth = plain(&pd, 4);
    let s = prefilled(&pd);
    let sent = chain_tree(s.root(), &truth[..3]);
    let _decoding = Gauge::up(&b.counters().decoding);
    let done = answer(b.step(s, sent.clone(), TOP_K, planning())).await;
    assert!(done.node_budget.is_some(), "the planner's forecast");
    let granted = done.granted.clone().expect("the tree was pruned");
    let (_, step, _) = ok(done);
    assert_eq!(granted.len(), step.drafted);
    assert!((1..=3).contains(&step.accepted), "granted {granted:?}");
    assert_eq!(step.committed, truth[..step.accepted + 1]);
    let path = &step.verification.path;
    assert_eq!(path.len(), step.accepted + 1);
    for (&node, &token) in path[1..].iter().zip(&step.verification.accepted) {
        assert!(granted.contains(&(node as u32)), "{node} in {granted:?}");
        assert_eq!(sent.token(node), token, "node {node} of the tree as sent");
    }
}
