//! One session's life on the verifier: prefill, then draft → verify →
//! commit steps, each step's tokens streamed to the gateway and its outcome
//! to the drafter, until a stop rule, the caller's cancel, or an error.
//!
//! A tree with no nodes may stand for a run of steps (its `span`): the
//! session verifies the root alone at each without waiting for the drafter
//! or telling it anything, and reports the whole run in one outcome after
//! its last step. The gateway sees every step as usual.

use std::sync::Arc;
use std::sync::atomic::Ordering;

use specmesh_engine::{Finish, Session, SessionLimits};
use specmesh_proto::{tree_from_wire, tree_span, v1};
use specmesh_sampling::SamplingParams;
use specmesh_tree::{TokenTree, TreeLimits, merge};
use tokio::sync::mpsc;
use tonic::Status;
use tracing::Instrument;

use crate::draft_link::DraftLink;
use crate::memory::Reservation;
use crate::report::Report;
use crate::service::Inner;

/// A validated `RunRequest`.
#[derive(Debug, Clone)]
pub struct ValidRun {
    pub session_id: String,
    pub epoch: u64,
    pub tokens: Vec<u32>,
    pub prompt_len: usize,
    pub max_new_tokens: usize,
    pub params: SamplingParams,
    pub draft: Option<DraftPlan>,
    pub cache_key: Option<String>,
}

#[derive(Debug, Clone)]
pub struct DraftPlan {
    pub endpoint: String,
    pub max_draft_tokens: usize,
    pub tenant: String,
}

pub type Events = mpsc::Sender<Result<v1::SessionEvent, Status>>;

/// Counts a value up while it lives (running or decoding sessions).
pub struct Gauge(Arc<std::sync::atomic::AtomicUsize>);

impl Gauge {
    pub fn up(counter: &Arc<std::sync::atomic::AtomicUsize>) -> Gauge {
        counter.fetch_add(1, Ordering::Relaxed);
        Gauge(Arc::clone(counter))
    }
}

impl Drop for Gauge {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

pub async fn drive(
    v: Arc<Inner>,
    run: ValidRun,
    events: Events,
    reservation: Reservation,
    running: Gauge,
) {
    let span = tracing::info_span!(
        "verifier_session",
        session_id = %run.session_id,
        epoch = run.epoch,
        context_tokens = run.tokens.len(),
        max_new_tokens = run.max_new_tokens,
        drafter = run.draft.as_ref().map_or("", |d| d.endpoint.as_str()),
    );
    async move {
        let kept = match drive_inner(&v, &run, &events).await {
            Ok(session) => session,
            Err(status) => {
                if !status.message().is_empty() {
                    let _ = events.send(Err(status)).await;
                }
                None
            }
        };
        // Free the reservation before keeping the cache, so keeping it
        // does not evict another kept cache needlessly.
        drop(reservation);
        if let (Some(key), Some(session)) = (run.cache_key, kept) {
            let (seq, tokens) = session.into_cache();
            v.memory.keep(key, seq, tokens);
        }
        drop(running);
    }
    .instrument(span)
    .await;
}

/// Runs the session; returns it (for keeping its cache) unless it failed.
/// An empty status message means the caller is gone: nothing to send.
async fn drive_inner(
    v: &Inner,
    run: &ValidRun,
    events: &Events,
) -> Result<Option<Box<Session>>, Status> {
    let (cached_seq, cached_tokens) = match run.cache_key.as_deref().and_then(|k| v.memory.take(k))
    {
        Some((seq, tokens)) => (Some(seq), tokens),
        None => (None, Vec::new()),
    };
    let limits = SessionLimits {
        max_new_tokens: run.max_new_tokens,
        eos: v.eos.clone(),
    };
    let mut session = Box::new(
        Session::new(
            &v.model,
            run.tokens.clone(),
            run.prompt_len,
            run.params.clone(),
            limits,
            cached_seq.map(|seq| (seq, cached_tokens.as_slice())),
        )
        .map_err(|e| Status::invalid_argument(e.to_string()))?,
    );
    session.reserve_kv(v.kv_tokens(run));

    let max_draft = run
        .draft
        .as_ref()
        .map_or(0, |d| d.max_draft_tokens.min(v.config.max_draft_tokens));
    let open_link = async {
        let plan = run.draft.as_ref().filter(|_| max_draft > 0)?;
        let start = v1::DraftStart {
            session_id: run.session_id.clone(),
            epoch: run.epoch,
            tenant: plan.tenant.clone(),
            tokens: run.tokens.clone(),
            prompt_len: run.prompt_len as u32,
            vocab_size: v.vocab,
            max_draft_tokens: max_draft as u32,
            max_depth: v.config.max_tree_depth as u32,
            cost_curve: v.cost_curve_wire(),
        };
        match DraftLink::open(
            &v.channels,
            &plan.endpoint,
            start,
            v.config.drafter_connect_timeout,
        )
        .await
        {
            Ok(link) => Some(link),
            Err(e) => {
                tracing::warn!(error = %e, "no drafter: decoding without speculation");
                None
            }
        }
    };
    let prefill = v
        .engine
        .prefill(session)
        .instrument(tracing::info_span!("prefill", tokens = run.tokens.len()));
    let (done, mut link) = tokio::join!(prefill, open_link);
    let done = done.map_err(|e| Status::internal(e.to_string()))?;
    session = done.session;
    let (reused, seconds) = done.result.map_err(Status::internal)?;
    let started = v1::SessionEvent {
        event: Some(v1::session_event::Event::Started(v1::Started {
            reused_tokens: reused as u32,
            prefill_seconds: seconds,
            drafting: link.is_some(),
        })),
    };
    events
        .send(Ok(started))
        .await
        .map_err(|_| Status::cancelled(""))?;

    let _decoding = Gauge::up(&v.decoding);
    let mut step_no = 0u64;
    // The outcome owed to the drafter: set while a span's steps run.
    let mut report: Option<Report> = None;
    loop {
        let tree = if report.is_some() {
            // A later step of a span: the drafter drafts nothing here and
            // hears of it when the span is over.
            root_only(v, &session)?
        } else {
            let next = next_tree(v, run, &session, &mut link, step_no, max_draft, events).await?;
            if link.is_some() {
                report = Some(Report::new(step_no, next.through));
            }
            next.tree
        };
        let drafted = tree.draft_len();
        let top_k = if link.is_some() { v.config.top_k } else { 0 };
        let span = tracing::info_span!(
            "verify_step",
            step = step_no,
            drafted,
            accepted = tracing::field::Empty,
            committed = tracing::field::Empty,
            batch_size = tracing::field::Empty,
        );
        let done = v
            .engine
            .step(session, tree, top_k)
            .instrument(span.clone())
            .await
            .map_err(|e| Status::internal(e.to_string()))?;
        session = done.session;
        let step = done.result.map_err(Status::internal)?;
        span.record("accepted", step.accepted);
        span.record("committed", step.committed.len());
        span.record("batch_size", done.batch_size);
        let event = v1::SessionEvent {
            event: Some(v1::session_event::Event::Committed(v1::Committed {
                step: step_no,
                tokens: step.committed.clone(),
                drafted: drafted as u32,
                accepted: step.accepted as u32,
                finished: step.finish.is_some(),
                eos: step.finish == Some(Finish::Eos),
            })),
        };
        events
            .send(Ok(event))
            .await
            .map_err(|_| Status::cancelled(""))?;
        if step.finish.is_some() {
            return Ok(Some(session));
        }
        if let (Some(l), Some(r)) = (link.as_mut(), report.as_mut()) {
            r.add(&step);
            if r.is_complete() {
                let outcome = report
                    .take()
                    .expect("just added to")
                    .into_outcome(done.batch_size);
                if let Err(e) = l.outcome(outcome).await {
                    tracing::warn!(error = %e, "drafter lost: going on without speculation");
                    link = None;
                }
            }
        }
        step_no += 1;
    }
}

/// The root alone: plain decoding.
fn root_only(v: &Inner, session: &Session) -> Result<TokenTree, Status> {
    TokenTree::root_only(session.root(), TreeLimits::new(1, 0, v.vocab))
        .map_err(|e| Status::internal(e.to_string()))
}

/// The tree to verify at a step, and the last step the drafter's answer
/// covers: the step itself, or the last of a span.
struct NextTree {
    tree: TokenTree,
    through: u64,
}

/// The tree to verify at `step`: the drafter's, validated, or the root
/// alone when there is no drafter, it is late, or it sent nonsense.
async fn next_tree(
    v: &Inner,
    run: &ValidRun,
    session: &Session,
    link: &mut Option<DraftLink>,
    step: u64,
    max_draft: usize,
    events: &Events,
) -> Result<NextTree, Status> {
    let alone = |tree| NextTree {
        tree,
        through: step,
    };
    let plain = || root_only(v, session).map(alone);
    let Some(l) = link.as_mut() else {
        return plain();
    };
    let wire = tokio::select! {
        r = l.tree_for(run.epoch, step, v.config.draft_timeout) => r,
        () = events.closed() => return Err(Status::cancelled("")),
    };
    let wire = match wire {
        Ok(Some(w)) => w,
        Ok(None) => {
            tracing::debug!(step, "no tree in time: verifying the root alone");
            return plain();
        }
        Err(e) => {
            tracing::warn!(error = %e, "drafter lost: going on without speculation");
            *link = None;
            return plain();
        }
    };
    let span = match tree_span(&wire) {
        Ok(span) => span,
        Err(e) => {
            tracing::warn!(error = %e, "the drafter sent an invalid tree: dropping the drafter");
            *link = None;
            return plain();
        }
    };
    if wire.nodes.is_empty() {
        // "Nothing drafted", possibly sent ahead of the last outcome: its
        // root is not known to the drafter yet, so it is not checked. A
        // span that started before this step (its tree came late) covers
        // the rest of it.
        let through = wire.step.saturating_add(u64::from(span) - 1).max(step);
        return Ok(NextTree {
            tree: root_only(v, session)?,
            through,
        });
    }
    let room = max_draft.min(session.room(&v.model));
    let limits = TreeLimits::new(room + 1, v.config.max_tree_depth, v.vocab);
    let full = TreeLimits::new(max_draft + 1, v.config.max_tree_depth, v.vocab);
    let tree = match tree_from_wire(&wire, full) {
        Ok(t) if t.root_token() == session.root() => t,
        Ok(t) => {
            tracing::warn!(
                tree_root = t.root_token(),
                root = session.root(),
                "the drafter's tree has the wrong root: dropping the drafter"
            );
            *link = None;
            return plain();
        }
        Err(e) => {
            tracing::warn!(error = %e, "the drafter sent an invalid tree: dropping the drafter");
            *link = None;
            return plain();
        }
    };
    if tree.len() > limits.max_nodes {
        // Near the end of the context: keep the best part that fits.
        let fitted = merge(&[&tree], limits).map_err(|e| Status::internal(e.to_string()))?;
        return Ok(alone(fitted));
    }
    Ok(alone(tree))
}
