//! One session's life on the verifier, the I/O shell around the step core
//! ([`crate::step`]): prefill, then for each step ask the drafter, verify
//! in the batcher, stream the tokens to the gateway and the outcome to the
//! drafter, until a stop rule, the caller's cancel, or an error.

use std::sync::Arc;

use specmesh_engine::{Session, SessionLimits};
use specmesh_proto::v1;
use tokio::sync::{OwnedSemaphorePermit, mpsc};
use tonic::Status;
use tracing::Instrument;

use crate::batch_metrics::Phase;
use crate::batcher::Patience;
use crate::draft_link::DraftLink;
use crate::error::VerifierError;
use crate::goodput::SessionPlanning;
use crate::memory::{PrefixKey, Reservation};
use crate::reattach::Reattach;
use crate::state::{Gauge, State};
use crate::step::{Answer, StepGrant, Steps, TreeBounds};
use crate::validate::{DraftPlan, ValidRun};

pub type Events = mpsc::Sender<Result<v1::SessionEvent, Status>>;

/// Runs an admitted session to its end (from the cached KV of its prefix,
/// when `prefix` finds some): holds its slot and KV reservation until
/// then, and publishes its committed KV to the prefix cache unless it
/// failed.
pub async fn drive(
    v: Arc<State>,
    run: ValidRun,
    prefix: Option<PrefixKey>,
    events: Events,
    reservation: Reservation,
    slot: OwnedSemaphorePermit,
) {
    let span = tracing::info_span!(
        "verifier_session",
        session_id = %run.session_id,
        epoch = run.epoch,
        context_tokens = run.tokens.len(),
        max_new_tokens = run.max_new_tokens,
        drafter = run.draft.as_ref().map_or("", |d| d.endpoint.as_str()),
        cached_tokens = tracing::field::Empty,
    );
    async move {
        let (kept, last) = match drive_inner(&v, &run, prefix, &events).await {
            Ok(Ended {
                session,
                prefix,
                last,
            }) => (Some(session).zip(prefix), last),
            Err(VerifierError::CallerGone) => (None, None),
            Err(e) => {
                tracing::warn!(error = %e, "session failed");
                let _ = events.send(Err(e.into())).await;
                (None, None)
            }
        };
        // Free the reservation before publishing, so publishing does not
        // evict cached blocks needlessly.
        drop(reservation);
        let publish = v.memory.prefix_cache() || run.keep_cache;
        if let Some((session, prefix)) = kept.filter(|_| publish) {
            v.memory.publish_all(&prefix, &session);
        }
        // The final step goes out once its KV is published: a client sends
        // a conversation's next turn as soon as this one ends, and that
        // turn must find it (sent before, the next turn could be admitted
        // first and prefill the answer again).
        if let Some(event) = last {
            let _ = send(&events, event).await;
        }
        drop(slot);
    }
    .instrument(span)
    .await;
}

/// A session that ran to its end or lost its caller.
struct Ended {
    session: Box<Session>,
    /// Where its KV is published (`None`: nowhere).
    prefix: Option<PrefixKey>,
    /// The final step's event, still to send (`None` when the caller left).
    last: Option<v1::SessionEvent>,
}

/// Runs the session; returns it (for keeping its cache) unless it failed.
/// A caller that goes away (a stop string met, a cancelled call) ends the
/// session as it stands: its KV holds what was committed, which the next
/// turn of a conversation reuses.
async fn drive_inner(
    v: &State,
    run: &ValidRun,
    prefix: Option<PrefixKey>,
    events: &Events,
) -> Result<Ended, VerifierError> {
    let limits = SessionLimits {
        max_new_tokens: run.max_new_tokens,
        eos: if run.ignore_eos {
            Vec::new()
        } else {
            v.eos.clone()
        },
    };
    let mut session = Box::new(
        Session::new(
            &v.model,
            run.tokens.clone(),
            run.prompt_len,
            run.params.clone(),
            limits,
            None,
        )
        .map_err(|e| VerifierError::invalid("tokens", e.to_string()))?,
    );
    session.reserve_kv(v.kv_tokens(run));
    let mut constraint: Option<Box<dyn specmesh_verify::Constraint>> = None;
    if let Some(grammar) = &run.grammar {
        let mut c = grammar.start();
        c.resume(&run.tokens[run.prompt_len..])
            .map_err(|e| VerifierError::invalid("tokens", e.to_string()))?;
        constraint = Some(Box::new(c));
    }
    if run.min_new_tokens > 0 && !run.ignore_eos {
        constraint = Some(Box::new(specmesh_verify::MinTokens::new(
            run.min_new_tokens,
            v.eos.clone(),
            v.vocab as usize,
            constraint,
        )));
    }
    if let Some(c) = constraint {
        session.constrain(c);
    }
    if let Some(top) = run.logprobs {
        session.with_logprobs(top);
    }

    let bounds = TreeBounds {
        vocab: v.vocab,
        max_draft: run.draft.as_ref().map_or(0, |d| d.max_draft_tokens),
        max_depth: v.config.max_tree_depth,
        recycle_top_k: v.config.recycle_top_k,
    };
    let prefill = v
        .batcher
        .prefill(session, prefix)
        .instrument(tracing::info_span!("prefill", tokens = run.tokens.len()));
    let (done, mut link) = tokio::join!(prefill, open_link(v, run));
    let done = done?;
    session = done.session;
    let prefix = done.prefix;
    let gone = |session| {
        Ok(Ended {
            session,
            prefix: prefix.clone(),
            last: None,
        })
    };
    let (reused, seconds) = done.result?;
    tracing::Span::current().record("cached_tokens", reused);
    let started = v1::SessionEvent {
        event: Some(v1::session_event::Event::Started(v1::Started {
            reused_tokens: reused as u32,
            prefill_seconds: seconds,
            drafting: link.is_some(),
        })),
    };
    if send(events, started).await.is_err() {
        return gone(session);
    }

    let _decoding = Gauge::up(&v.decoding);
    let mut steps = Steps::new(run.epoch, bounds, link.is_some());
    let mut planning = Box::new(SessionPlanning::new(
        run.draft.as_ref().map(|d| d.sources).unwrap_or_default(),
        bounds.max_draft,
    ));
    let phases = &v.batcher.counters().metrics;
    // Without a drafter (never reached, or lost) the session decodes plain
    // and re-attaches to one at a step boundary.
    let mut reattach = run.draft.as_ref().map(Reattach::new);
    loop {
        if link.is_none()
            && let Some(r) = reattach.as_mut()
        {
            link = reattached(v, run, r, &session, &mut steps).await;
        }
        let asked = std::time::Instant::now();
        let answer = match link.as_mut().filter(|_| steps.wants_tree()) {
            Some(l) => {
                // The batch waits for this tree only while it pays: see
                // `batcher::yielding`.
                let patience = if v.config.goodput_planner && planning.node_budget() == 0 {
                    Patience::Others
                } else {
                    Patience::Deadline
                };
                let mut wait = v.batcher.yielding_wait(patience);
                Some(tokio::select! {
                    biased;
                    a = l.tree_for(steps.epoch(), steps.step(), v.config.draft_timeout, steps.tree_limits(), &v.batcher.counters().drafting) => a,
                    () = wait.called() => {
                        phases.trees_yielded.with_label_values(&[patience.label()]).inc();
                        Answer::Late
                    }
                    () = events.closed() => return gone(session),
                })
            }
            None => None,
        };
        if answer.is_some() {
            steps.waited(asked.elapsed());
            phases.phase(Phase::TreeWait, asked.elapsed().as_secs_f64());
        }
        let validating = std::time::Instant::now();
        let planned = steps.plan(answer, session.root(), session.room(&v.model))?;
        phases.phase(Phase::Validate, validating.elapsed().as_secs_f64());
        if let Some(why) = &planned.dropped {
            tracing::warn!(reason = %why, "dropping the drafter: going on without speculation");
        }
        if !steps.drafting() {
            link = None;
        }
        let offered = planned.tree.draft_len();
        planning.drafted(planned.drafted_by, planned.drafting);
        let span = tracing::info_span!(
            "verify_step",
            step = steps.step(),
            offered,
            drafted = tracing::field::Empty,
            accepted = tracing::field::Empty,
            committed = tracing::field::Empty,
            batch_size = tracing::field::Empty,
        );
        let done = v
            .batcher
            .step(session, planned.tree, planned.top_k, planning)
            .instrument(span.clone())
            .await?;
        session = done.session;
        planning = done.planning;
        let step = done.result?;
        span.record("drafted", step.drafted);
        span.record("accepted", step.accepted);
        span.record("committed", step.committed.len());
        span.record("batch_size", done.batch_size);
        let grant = StepGrant {
            offered,
            granted: done.granted,
            node_budget: done.node_budget,
            forward_us: done.forward_us,
            // While others decode the batch goes on after its wait; alone,
            // the session's own step waits up to the draft timeout.
            tree_deadline_us: if done.batch_size > 1 {
                done.batch_wait_us
            } else {
                u32::try_from(v.config.draft_timeout.as_micros()).unwrap_or(u32::MAX)
            },
        };
        let verified = steps.verified(&step, grant, done.batch_size);
        let reporting = std::time::Instant::now();
        // The drafter first: its next tree is on this session's critical
        // path, the gateway's stream is not.
        if let (Some(l), Some(outcome)) = (link.as_mut(), verified.outcome)
            && let Err(e) = l.outcome(outcome.into()).await
        {
            tracing::warn!(error = %e, "drafter lost: going on without speculation");
            steps.drafter_lost();
            link = None;
        }
        let event = v1::SessionEvent {
            event: Some(v1::session_event::Event::Committed(
                verified.committed.into(),
            )),
        };
        if verified.finished {
            return Ok(Ended {
                session,
                prefix: prefix.clone(),
                last: Some(event),
            });
        }
        if send(events, event).await.is_err() {
            return gone(session);
        }
        phases.phase(Phase::Report, reporting.elapsed().as_secs_f64());
    }
}

/// A drafter re-attached at this step boundary, if a link opened since
/// the last one and took the session's start (see [`crate::reattach`]).
async fn reattached(
    v: &State,
    run: &ValidRun,
    reattach: &mut Reattach,
    session: &Session,
    steps: &mut Steps,
) -> Option<DraftLink> {
    let (endpoint, mut link) = reattach
        .poll(&v.channels, v.config.drafter_connect_timeout)
        .await?;
    let plan = run.draft.as_ref()?;
    let start = draft_start(v, run, plan, session.tokens(), steps.step());
    if let Err(e) = link.start(start).await {
        tracing::debug!(error = %e, endpoint, "re-attaching: the stream closed");
        reattach.failed();
        return None;
    }
    tracing::info!(
        endpoint,
        step = steps.step(),
        "drafter re-attached: speculating again"
    );
    reattach.attached();
    steps.reattached();
    Some(link)
}

/// Opens the run's draft stream, if it drafts; a drafter that cannot be
/// reached only turns speculation off (until a re-attach).
async fn open_link(v: &State, run: &ValidRun) -> Option<DraftLink> {
    let plan = run.draft.as_ref()?;
    let start = draft_start(v, run, plan, &run.tokens, 0);
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
}

/// The start of a draft stream over `tokens` (prompt, then what is
/// committed), its first tree for `first_step`.
fn draft_start(
    v: &State,
    run: &ValidRun,
    plan: &DraftPlan,
    tokens: &[u32],
    first_step: u64,
) -> v1::DraftStart {
    v1::DraftStart {
        session_id: run.session_id.clone(),
        epoch: run.epoch,
        tenant: plan.tenant.clone(),
        tokens: tokens.to_vec(),
        prompt_len: run.prompt_len as u32,
        vocab_size: v.vocab,
        max_draft_tokens: plan.max_draft_tokens as u32,
        max_depth: v.config.max_tree_depth as u32,
        cost_curve: v.cost_curve_wire(),
        sampling: Some(v1::SamplingParams::from(&run.params)),
        sources: v1::DraftSources::from(plan.sources) as i32,
        target_model: v.target.name.clone(),
        target_vocab_fingerprint: v.target.vocab_fingerprint,
        target_step_seconds: v.target.step_seconds,
        // At its first step the session is not decoding yet: count it in.
        batch_size: (v.decoding.load(std::sync::atomic::Ordering::Relaxed)
            + usize::from(first_step == 0)) as u32,
        first_step,
        prediction: plan.prediction.clone(),
        max_new_tokens: u32::try_from(run.max_new_tokens).unwrap_or(u32::MAX),
        cache_salt: run.cache_salt.clone(),
    }
}

/// Sends an event to the gateway; a closed stream means it is gone.
async fn send(events: &Events, event: v1::SessionEvent) -> Result<(), VerifierError> {
    events
        .send(Ok(event))
        .await
        .map_err(|_| VerifierError::CallerGone)
}
