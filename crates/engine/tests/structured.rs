//! Decoding under a grammar on the real model: every output follows it,
//! and speculation changes nothing: greedy and seeded sampling give the
//! same tokens and the same log-probabilities with drafted trees as with
//! the root alone, while what the grammar forces is accepted as grafted
//! nodes.

use std::sync::OnceLock;

use rand::{Rng, SeedableRng, rngs::StdRng};
use specmesh_engine::{Session, SessionLimits, Step, step_batch};
use specmesh_grammar::{GrammarLimits, Grammars, Structured};
use specmesh_sampling::SamplingParams;
use specmesh_tree::{TokenTree, TreeBuilder, TreeLimits};

mod common;
use common::{chat, model, tokenizer};

fn grammars() -> &'static Grammars {
    static G: OnceLock<Grammars> = OnceLock::new();
    G.get_or_init(|| {
        let n = model().config().vocab_size;
        Grammars::new(tokenizer(), n, GrammarLimits::default()).unwrap()
    })
}

const TRIP: &str = r#"{"type": "object", "properties": {"city": {"type": "string", "maxLength": 20}, "days": {"type": "integer", "minimum": 1, "maximum": 30}, "mode": {"enum": ["train", "plane", "car"]}}, "required": ["city", "days", "mode"], "additionalProperties": false}"#;

struct Run {
    tokens: Vec<u32>,
    logprobs: Vec<(u32, f32)>,
    forced: usize,
    accepted: usize,
    steps: usize,
    eos: bool,
}

/// Decodes under `spec`; `truth` (when given) is drafted around as
/// trees that are right at each depth with probability 0.7, with wrong
/// siblings.
fn run(
    prompt: &[u32],
    spec: &Structured,
    params: &SamplingParams,
    truth: Option<&[u32]>,
    seed: u64,
) -> Run {
    let m = model();
    let vocab = m.config().vocab_size as u32;
    let limits = SessionLimits {
        max_new_tokens: 60,
        eos: tokenizer().eos_token_ids().to_vec(),
    };
    let mut s = Session::new(
        m,
        prompt.to_vec(),
        prompt.len(),
        params.clone(),
        limits,
        None,
    )
    .unwrap();
    s.prefill(m).unwrap();
    s.constrain(Box::new(grammars().compile(spec).unwrap().start()));
    s.with_logprobs(3);
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Run {
        tokens: Vec::new(),
        logprobs: Vec::new(),
        forced: 0,
        accepted: 0,
        steps: 0,
        eos: false,
    };
    loop {
        let tree = match truth {
            None => TokenTree::root_only(s.root(), TreeLimits::new(1, 0, vocab)).unwrap(),
            Some(truth) => {
                let done = out.tokens.len();
                let mut b = TreeBuilder::new(s.root(), TreeLimits::new(10, 5, vocab)).unwrap();
                let mut node = 0;
                for d in 0..5 {
                    let right = truth.get(done + d).copied().unwrap_or(1);
                    let wrong = rng.random_range(100..40_000);
                    let right_first = rng.random_bool(0.7);
                    let (a, b2) = if right_first {
                        (right, wrong)
                    } else {
                        (wrong, right)
                    };
                    let Ok(n) = b.push(node, a, 0.9) else { break };
                    let _ = b.push(node, b2, 0.4);
                    node = n;
                }
                b.build()
            }
        };
        let step: Step = step_batch(m, &mut [(&mut s, &tree)], 0)
            .unwrap()
            .pop()
            .unwrap();
        out.steps += 1;
        out.forced += step.forced;
        out.accepted += step.accepted;
        assert_eq!(step.logprobs.len(), step.committed.len());
        out.logprobs
            .extend(step.logprobs.iter().map(|l| (l.token, l.logprob)));
        out.tokens.extend_from_slice(&step.committed);
        if let Some(f) = step.finish {
            out.eos = f == specmesh_engine::Finish::Eos;
            return out;
        }
    }
}

fn check_trip(tokens: &[u32]) -> serde_json::Value {
    let text = tokenizer().decode(tokens, true).unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?} is not JSON: {e}"));
    let keys: Vec<&str> = v.as_object().unwrap().keys().map(String::as_str).collect();
    assert_eq!(keys, ["city", "days", "mode"], "{text}");
    assert!(v["city"].as_str().unwrap().chars().count() <= 20, "{text}");
    let days = v["days"].as_i64().unwrap();
    assert!((1..=30).contains(&days), "{text}");
    assert!(
        ["train", "plane", "car"].contains(&v["mode"].as_str().unwrap()),
        "{text}"
    );
    v
}

const ASKS: [&str; 3] = [
    "Plan a trip: where, how many days, and how to travel? Answer in JSON.",
    "I want to visit Rome for a week by train. Give the plan as JSON.",
    "Describe a weekend getaway as JSON.",
];

#[test]
fn greedy_under_a_schema_is_valid_and_the_same_with_speculation() {
    let spec = Structured::JsonSchema(TRIP.into());
    let greedy = SamplingParams::greedy();
    for (i, ask) in ASKS.iter().enumerate() {
        let p = chat(ask);
        let plain = run(&p, &spec, &greedy, None, 0);
        assert!(plain.eos, "ask {i}: the object was closed and ended");
        check_trip(&plain.tokens);
        // The root alone still gets what the grammar forces: keys and
        // punctuation come several to a step.
        assert!(plain.forced > 5, "ask {i}: {} forced", plain.forced);
        assert!(plain.steps < plain.tokens.len());
        let spec_run = run(&p, &spec, &greedy, Some(&plain.tokens), 10 + i as u64);
        assert_eq!(spec_run.tokens, plain.tokens, "ask {i}");
        assert_eq!(spec_run.logprobs, plain.logprobs, "ask {i}");
        assert!(spec_run.accepted > 0, "ask {i}");
        assert!(spec_run.steps < plain.steps, "ask {i}");
    }
}

#[test]
fn seeded_sampling_under_a_grammar_is_the_same_with_speculation() {
    let params = SamplingParams::new(0.9, 0.95, 50, 77).unwrap();
    for (i, spec) in [
        Structured::JsonSchema(TRIP.into()),
        Structured::JsonObject,
        Structured::Regex("(yes|no)\\. [A-Z][a-z ,]{5,60}\\.".into()),
    ]
    .iter()
    .enumerate()
    {
        let p = chat(ASKS[i % ASKS.len()]);
        let plain = run(&p, spec, &params, None, 0);
        let spec_run = run(&p, spec, &params, Some(&plain.tokens), 30 + i as u64);
        assert_eq!(spec_run.tokens, plain.tokens, "grammar {i}");
        if i == 0 && plain.eos {
            check_trip(&plain.tokens);
        }
        if i == 1 && plain.eos {
            let text = tokenizer().decode(&plain.tokens, true).unwrap();
            let v: serde_json::Value = serde_json::from_str(&text).unwrap();
            assert!(v.is_object(), "{text}");
        }
    }
}

#[test]
fn forced_logprobs_are_certain_and_others_are_normalised_over_the_mask() {
    let spec = Structured::JsonSchema(TRIP.into());
    let p = chat(ASKS[0]);
    let plain = run(&p, &spec, &SamplingParams::greedy(), None, 0);
    // `{"city": "` is forced: one token allowed at each, log-probability 0.
    let first = tokenizer().decode(&plain.tokens[..1], true).unwrap();
    assert_eq!(first, "{\"", "{first:?}");
    assert_eq!(plain.logprobs[0].1, 0.0);
    assert!(plain.logprobs.iter().all(|l| l.1 <= 0.0 && l.1.is_finite()));
    assert!(plain.logprobs.iter().any(|l| l.1 < 0.0));
}
