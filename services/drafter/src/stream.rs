//! One draft stream, from `start` to its end, in its own task (inside the
//! `draft_session` span the service opened).
//!
//! The task reads the verifier's messages in order, drives the
//! [`DraftSession`] and sends the trees it plans: one per applied outcome,
//! and the empty trees it plans ahead. Model-free
//! drafting takes microseconds and runs inline; a propose that may run the
//! draft model moves the session onto a blocking thread and back. With
//! `--draft-ahead`, the session stays on a blocking thread after a model
//! tree is sent, drafting its guess at the next one (`session::ahead`),
//! while the task waits for the outcome; the outcome is applied once the
//! guess is done.
//!
//! How a stream ends decides what happens to the session's output:
//!
//! | end                                           | status sent       | output indexed |
//! |-----------------------------------------------|-------------------|----------------|
//! | verifier closes its side                      | OK                | yes            |
//! | verifier cancels / the connection drops       | (none: gone)      | yes            |
//! | bad message                                   | INVALID_ARGUMENT  | no             |
//! | sources it cannot draft with (no draft model, or another vocabulary) | FAILED_PRECONDITION | no |
//! | no `start` in time                            | DEADLINE_EXCEEDED | —              |
//! | shutdown grace period over                    | UNAVAILABLE       | no             |
//!
//! A session the verifier ended, normally or not, produced real text worth
//! drafting from later; one ended for a protocol violation may hold a
//! corrupted context, and one cut by shutdown dies with the process's index.

use std::sync::Arc;
use std::time::{Duration, Instant};

use specmesh_draft_model::Cancel;
use specmesh_proto::v1;
use specmesh_proto::v1::draft_request::Kind;
use tokio::sync::{OwnedSemaphorePermit, mpsc, watch};
use tonic::{Code, Status, Streaming};

use crate::error::DrafterError;
use crate::learned::Workload;
use crate::session::{Applied, DraftSession, Drafted, Plan, Reported};
use crate::state::State;
use crate::validate::Report;
use crate::validate::StartSpec;

/// How long a failed stream waits to hand its error status to a verifier
/// that is not reading, before giving up.
const ERROR_SEND_TIMEOUT: Duration = Duration::from_secs(5);

/// How the verifier ended a stream that went well.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum End {
    /// It closed its side of the stream.
    Closed,
    /// It cancelled the call or its connection failed.
    Cancelled(Code),
    /// It stopped reading: the response stream was dropped.
    Gone,
}

/// Per-session tallies for the end-of-session log line.
#[derive(Debug, Default)]
struct Tally {
    /// Trees sent, root-only and empty ones included.
    trees: u64,
    /// Drafted nodes sent.
    drafted: u64,
    /// Verify steps reported (a span's outcome reports several).
    steps: u64,
    /// Steps that verified a tree of ours with at least one node.
    speculative_steps: u64,
    /// Speculative steps that accepted their tree's most likely full path
    /// entirely.
    best_path_hits: u64,
    accepted: u64,
    ignored: u64,
    /// Microseconds the verifier waited for our trees.
    tree_wait_us: u64,
}

impl Tally {
    fn add(&mut self, r: &Reported) {
        self.steps += r.steps;
        self.speculative_steps += u64::from(r.speculative);
        self.best_path_hits += u64::from(r.best_path_hit);
        self.accepted += r.accepted as u64;
        self.tree_wait_us += r.tree_wait_us;
    }
}

/// A stream's task; see the module docs.
#[derive(Debug)]
pub struct DraftStream {
    state: Arc<State>,
    inbound: Streaming<v1::DraftRequest>,
    tx: mpsc::Sender<Result<v1::TokenTree, Status>>,
    stop: watch::Receiver<bool>,
    tally: Tally,
    slot: OwnedSemaphorePermit,
    /// The session's workload, once its start arrived.
    workload: Option<Workload>,
}

impl DraftStream {
    pub fn new(
        state: Arc<State>,
        inbound: Streaming<v1::DraftRequest>,
        tx: mpsc::Sender<Result<v1::TokenTree, Status>>,
        slot: OwnedSemaphorePermit,
    ) -> DraftStream {
        DraftStream {
            stop: state.stop.clone(),
            state,
            inbound,
            tx,
            tally: Tally::default(),
            slot,
            workload: None,
        }
    }

    /// Serves the stream to its end; never fails (errors go to the client).
    pub async fn run(mut self) {
        let result = self.serve().await;
        let DraftStream {
            state,
            tx,
            slot,
            tally,
            workload,
            ..
        } = self;
        // Free the slot before the verifier hears the stream is over, so
        // that it can open the next one at once.
        drop(slot);
        match result {
            Ok((session, end)) => {
                drop(tx);
                if let (Some(learning), Some(w)) = (&state.learning, &workload) {
                    learning.record(w, &session);
                }
                let ahead = session.guess_stats();
                tracing::info!(
                    ?end,
                    trees = tally.trees,
                    drafted = tally.drafted,
                    steps = tally.steps,
                    speculative_steps = tally.speculative_steps,
                    best_path_hits = tally.best_path_hits,
                    accepted = tally.accepted,
                    ignored = tally.ignored,
                    step_overhead = session.step_overhead(),
                    arms = ?session.arm_steps(),
                    draft_forward_ms = session.draft_forward_secs().map(|s| s * 1e3),
                    ahead_drafted = ahead.drafted,
                    ahead_hits = ahead.hits,
                    ahead_hit_rate = ahead.hit_rate(),
                    ahead_ms = ahead.secs * 1e3,
                    ahead_cancelled = ahead.cancelled,
                    ahead_skipped = ahead.skipped,
                    ahead_max_depth = ahead.max_depth,
                    verify_forward_ms = session.live_times().0.map(|s| s * 1e3),
                    link_rtt_ms = session.live_times().1.map(|s| s * 1e3),
                    tree_wait_ms_per_step = tally.tree_wait_us as f64 * 1e-3 / tally.steps.max(1) as f64,
                    "draft session ended"
                );
                index_output(state, session).await;
            }
            Err(error) => {
                state.stats.session_failed();
                tracing::warn!(
                    %error,
                    code = ?error.code(),
                    trees = tally.trees,
                    "draft session failed"
                );
                // The verifier may be gone, or not reading: then there is
                // nobody to tell, and nothing may wait on it for long.
                let status = Status::from(error);
                let _ = tokio::time::timeout(ERROR_SEND_TIMEOUT, tx.send(Err(status))).await;
            }
        }
    }

    async fn serve(&mut self) -> Result<(DraftSession, End), DrafterError> {
        let spec = self.start().await?;
        let span = tracing::Span::current();
        span.record("session_id", spec.session_id.as_str());
        span.record("epoch", spec.epoch);
        span.record("tenant", spec.tenant.as_str());
        let _open = self.state.stats.open_session();
        if let Some(why) = &spec.curve_fallback {
            tracing::info!(reason = %why, "using the default cost curve");
        }
        // Blocking: the draft model may copy its cached prefix in.
        let state = Arc::clone(&self.state);
        let (drafter, spec) =
            tokio::task::spawn_blocking(move || (state.drafters.for_spec(&spec), spec))
                .await
                .map_err(|e| DrafterError::Internal(format!("starting the session: {e}")))?;
        let drafter = drafter.map_err(|e| DrafterError::Precondition(e.to_string()))?;
        let (queried, cached) = drafter.prefix_lookup().unwrap_or_default();
        self.state.stats.draft_prefix_lookup(queried, cached);
        span.record("draft_cached_tokens", cached);
        tracing::info!(
            tokens = spec.tokens.len(),
            draft_cached_tokens = cached,
            prompt_len = spec.prompt_len,
            vocab = spec.vocab,
            max_draft_tokens = spec.max_draft_tokens,
            max_depth = spec.max_depth,
            model = drafter.has_model(),
            target = spec.target.display_name(),
            sources = ?spec.sources,
            "draft session started"
        );
        let workload = Workload::of(&spec);
        let mut session =
            DraftSession::new(spec, drafter, self.state.max_context, self.state.pipeline)?
                .with_draft_ahead(self.state.draft_ahead);
        if let Some(learning) = &self.state.learning {
            let taught = learning.seed(&workload, &mut session);
            tracing::debug!(
                sessions = taught,
                "started from what earlier sessions learned"
            );
        }
        self.workload = Some(workload);
        let plan = session.plan_first();
        let (mut session, drafted) = draft(session, plan).await?;
        if !self.send(drafted).await? {
            return Ok((session, End::Gone));
        }
        let first_batch = session.first_batch();
        if let Some(empty) = session.plan_ahead(first_batch)
            && !self.send(empty).await?
        {
            return Ok((session, End::Gone));
        }
        let mut held = Held::start(session);
        loop {
            let received = self.recv().await;
            // The outcome (or the stream's end) is here: the guess drafted
            // ahead, if any, is what the verifier waits on now, and a guess
            // the outcome did not bear out is stopped at its next level.
            let holds = match &received {
                Ok(Ok(Some(v1::DraftRequest {
                    kind: Some(Kind::Outcome(o)),
                }))) => Some(o.committed.as_slice()),
                _ => None,
            };
            let mut session = held.join(holds).await?;
            let outcome = match received? {
                Ok(Some(v1::DraftRequest {
                    kind: Some(Kind::Outcome(o)),
                })) => o,
                Ok(Some(v1::DraftRequest {
                    kind: Some(Kind::Start(_)),
                })) => return Err(DrafterError::RepeatedStart),
                Ok(Some(v1::DraftRequest { kind: None })) => {
                    return Err(DrafterError::invalid(
                        "kind",
                        "must be `start` or `outcome`",
                    ));
                }
                Ok(None) => return Ok((session, End::Closed)),
                Err(status) => return Ok((session, End::Cancelled(status.code()))),
            };
            let step = outcome.step;
            let applied = session.apply(Report::from_wire(outcome, session.vocab())?)?;
            session.record_step_time(Instant::now());
            if let Some(r) = applied.reported() {
                self.tally.add(r);
                self.state.stats.accepted(r.accepted);
            }
            let batch = match applied {
                Applied::Ignored => {
                    self.tally.ignored += 1;
                    self.state.stats.stale_outcome();
                    tracing::debug!(step, "ignoring a stale or duplicated outcome");
                    held = Held::Here(session);
                    continue;
                }
                Applied::Within(_) => {
                    held = Held::Here(session);
                    continue;
                }
                Applied::Ahead { batch, .. } => {
                    if let Some(empty) = session.plan_ahead(batch)
                        && !self.send(empty).await?
                    {
                        return Ok((session, End::Gone));
                    }
                    held = Held::Here(session);
                    continue;
                }
                Applied::Next { batch, .. } => batch,
            };
            let plan = session.next_plan(batch);
            let (next, drafted) = draft(session, plan).await?;
            session = next;
            if !self.send(drafted).await? {
                return Ok((session, End::Gone));
            }
            if let Some(empty) = session.plan_ahead(batch)
                && !self.send(empty).await?
            {
                return Ok((session, End::Gone));
            }
            held = Held::start(session);
        }
    }

    /// Waits for the stream's `start` and validates it.
    async fn start(&mut self) -> Result<StartSpec, DrafterError> {
        let timeout = self.state.start_timeout;
        let first = tokio::time::timeout(timeout, self.recv())
            .await
            .map_err(|_| DrafterError::StartTimeout(timeout))??;
        match first {
            Ok(Some(v1::DraftRequest {
                kind: Some(Kind::Start(start)),
            })) => crate::validate::start(start, self.state.max_context),
            Ok(Some(v1::DraftRequest {
                kind: Some(Kind::Outcome(_)),
            })) => Err(DrafterError::ExpectedStart { got: "`outcome`" }),
            Ok(Some(v1::DraftRequest { kind: None })) => Err(DrafterError::ExpectedStart {
                got: "a message without `kind`",
            }),
            Ok(None) | Err(_) => Err(DrafterError::NoStart),
        }
    }

    /// The verifier's next message (`Ok(None)`: it closed its side;
    /// `Err`: it cancelled). Fails only when shutdown cuts the wait.
    async fn recv(&mut self) -> Result<Result<Option<v1::DraftRequest>, Status>, DrafterError> {
        tokio::select! {
            m = self.inbound.message() => Ok(m),
            () = stopped(&mut self.stop) => Err(DrafterError::ShuttingDown),
        }
    }

    /// Sends a tree; `false` when the verifier no longer reads.
    async fn send(&mut self, drafted: Drafted) -> Result<bool, DrafterError> {
        let sent = tokio::select! {
            sent = self.tx.send(Ok(v1::TokenTree::from(&drafted.tree))) => sent.is_ok(),
            () = stopped(&mut self.stop) => return Err(DrafterError::ShuttingDown),
        };
        if sent {
            self.tally.trees += 1;
            self.tally.drafted += drafted.nodes as u64;
            self.state.stats.tree_sent(drafted.nodes, drafted.took);
            if let Some(r) = drafted.retokenized {
                self.state.stats.retokenized(r);
            }
        }
        Ok(sent)
    }
}

/// The session, or the blocking task drafting ahead with it (see
/// `session::ahead`).
#[derive(Debug)]
// The session moves between this task and a blocking one every step;
// boxing it would allocate per step to save a memcpy of ~1.6 KB.
#[allow(clippy::large_enum_variant)]
enum Held {
    Here(DraftSession),
    /// The guess's task, what stops it, and the tokens it assumes
    /// committed before the target's own.
    Ahead(
        tokio::task::JoinHandle<DraftSession>,
        Option<Cancel>,
        Vec<u32>,
    ),
}

impl Held {
    /// Starts drafting ahead when the session wants to.
    fn start(mut session: DraftSession) -> Held {
        if !session.wants_ahead() {
            session.note_no_time_to_guess();
            return Held::Here(session);
        }
        let cancel = session.ahead_cancel();
        let assumes = session.guess_assumes().unwrap_or_default();
        let span = tracing::debug_span!("propose_ahead");
        Held::Ahead(
            tokio::task::spawn_blocking(move || {
                let mut session = session;
                span.in_scope(|| session.draft_ahead());
                session
            }),
            cancel,
            assumes,
        )
    }

    /// The session, once its guess (if any) is drafted. The outcome it
    /// guessed at has come, committing `committed` (`None`: no outcome
    /// came, but the stream's end): a guess whose assumed path it does not
    /// bear out can no longer hold and stops at its next level; one it
    /// does is the next tree, and finishes (its depth was sized to fit,
    /// `session::deadline`).
    async fn join(self, committed: Option<&[u32]>) -> Result<DraftSession, DrafterError> {
        match self {
            Held::Here(s) => Ok(s),
            Held::Ahead(task, cancel, assumes) => {
                let holds = committed
                    .is_some_and(|c| c.len() == assumes.len() + 1 && c.starts_with(&assumes));
                if let Some(c) = cancel.as_ref().filter(|_| !holds) {
                    c.cancel();
                }
                let session = task
                    .await
                    .map_err(|e| DrafterError::Internal(format!("draft-ahead worker: {e}")));
                // Trees drafted on an outcome grow whole.
                if let Some(c) = &cancel {
                    c.reset();
                }
                session
            }
        }
    }
}

/// Resolves once the shutdown grace period is over (or the server that
/// owns the flag is gone).
async fn stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|&stop| stop).await;
}

/// Plans' trees are drafted in a `propose` span; a propose that may run the
/// draft model moves the session to a blocking thread and back.
async fn draft(
    mut session: DraftSession,
    plan: Plan,
) -> Result<(DraftSession, Drafted), DrafterError> {
    let span = tracing::debug_span!(
        "propose",
        step = plan.step,
        max_nodes = plan.budget.max_nodes,
        max_depth = plan.budget.max_depth,
        nodes = tracing::field::Empty,
        micros = tracing::field::Empty,
    );
    let (session, drafted) = if session.blocks(&plan) {
        let inner = span.clone();
        tokio::task::spawn_blocking(move || {
            let drafted = inner.in_scope(|| session.draft(plan));
            (session, drafted)
        })
        .await
        .map_err(|e| DrafterError::Internal(format!("draft worker: {e}")))?
    } else {
        let drafted = span.in_scope(|| session.draft(plan));
        (session, drafted)
    };
    let drafted = drafted?;
    span.record("nodes", drafted.nodes);
    span.record("micros", drafted.took.as_micros() as u64);
    Ok((session, drafted))
}

/// Adds an ended session's output to its tenant's global index, off the
/// async workers.
async fn index_output(state: Arc<State>, session: DraftSession) {
    let indexed = tokio::task::spawn_blocking(move || {
        let done = state
            .drafters
            .index_output(session.tenant(), session.output());
        if done {
            state.stats.output_indexed();
        }
        done
    })
    .await;
    match indexed {
        Ok(true) => tracing::debug!("output added to the global index"),
        Ok(false) => {}
        Err(error) => tracing::error!(%error, "indexing the output failed"),
    }
}
