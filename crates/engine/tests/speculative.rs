//! Speculative decoding on the real model returns exactly what plain
//! decoding returns: greedy token for token, and seeded sampling token for
//! token when the drafter sends no probabilities.

use rand::{Rng, SeedableRng, rngs::StdRng};
use specmesh_draft::{DraftContext, Drafter, Feedback};
use specmesh_engine::{
    FusedStep, PrefillChunk, Session, SessionLimits, generate, step_batch, step_batch_fused,
};
use specmesh_model::Model;
use specmesh_sampling::SamplingParams;
use specmesh_tree::{TokenTree, TreeBuilder, TreeLimits};

mod common;
use common::{chat, model, tokenizer};

const PROMPTS: [&str; 4] = [
    "Summarize: The cat sat on the mat because the mat was warm and the sun was out.",
    "Write a Python function that returns the sum of a list of numbers.",
    "Translate to French: Good morning, how are you today?",
    "List three colors.",
];

fn limits(max_new: usize) -> SessionLimits {
    SessionLimits {
        max_new_tokens: max_new,
        eos: tokenizer().eos_token_ids().to_vec(),
    }
}

fn plain(prompt: &[u32], params: &SamplingParams, max_new: usize) -> Vec<u32> {
    let vocab = model().config().vocab_size as u32;
    let mut budget = |_: &Session| TreeLimits::new(1, 0, vocab);
    generate(
        model(),
        prompt,
        params.clone(),
        limits(max_new),
        None,
        &mut budget,
        &mut |_| {},
    )
    .unwrap()
    .tokens
}

/// Proposes trees around a known continuation: the right token at each
/// depth with probability `hit`, wrong siblings and wrong branches around
/// it, so acceptance stops at every possible depth.
struct Noisy {
    truth: Vec<u32>,
    prompt_len: usize,
    hit: f64,
    rng: StdRng,
}

impl Drafter for Noisy {
    fn name(&self) -> &'static str {
        "noisy"
    }

    fn propose(&mut self, ctx: &DraftContext<'_>) -> TokenTree {
        let done = ctx.tokens.len() - self.prompt_len;
        let mut b = TreeBuilder::new(ctx.root(), ctx.limits).unwrap();
        let mut node = 0;
        for d in 0..ctx.limits.max_depth {
            let right = self.truth.get(done + d).copied().unwrap_or(1);
            let wrong = self.rng.random_range(100..40_000);
            let (first, second) = if self.rng.random_bool(self.hit) {
                (right, wrong)
            } else {
                (wrong, right)
            };
            let Ok(a) = b.push(node, first, 0.9) else {
                break;
            };
            if self.rng.random_bool(0.5) {
                let _ = b.push(node, second, 0.5);
            }
            node = a;
        }
        b.build()
    }

    fn observe(&mut self, f: &Feedback<'_>) {
        // The path is root + accepted; committed is accepted + bonus.
        assert_eq!(f.path.len(), f.committed.len());
        assert_eq!(f.top_k.len(), f.path.len());
    }
}

fn speculative(
    prompt: &[u32],
    params: &SamplingParams,
    truth: Vec<u32>,
    max_new: usize,
    seed: u64,
) -> (Vec<u32>, usize) {
    let vocab = model().config().vocab_size as u32;
    let mut drafter = Noisy {
        truth,
        prompt_len: prompt.len(),
        hit: 0.8,
        rng: StdRng::seed_from_u64(seed),
    };
    let mut budget = |_: &Session| TreeLimits::new(12, 6, vocab);
    let g = generate(
        model(),
        prompt,
        params.clone(),
        limits(max_new),
        Some(&mut drafter),
        &mut budget,
        &mut |_| {},
    )
    .unwrap();
    (g.tokens, g.stats.verify_steps)
}

#[test]
fn greedy_speculative_equals_plain_greedy() {
    let greedy = SamplingParams::greedy();
    for (i, text) in PROMPTS.iter().enumerate() {
        let prompt = chat(text);
        let expected = plain(&prompt, &greedy, 40);
        let (got, steps) = speculative(&prompt, &greedy, expected.clone(), 40, i as u64);
        assert_eq!(got, expected, "prompt {i}");
        assert!(
            steps < expected.len(),
            "prompt {i}: {steps} steps for {} tokens",
            expected.len()
        );
    }
}

#[test]
fn seeded_sampling_is_the_same_with_and_without_speculation() {
    let params = SamplingParams::new(0.8, 0.95, 40, 1234).unwrap();
    for (i, text) in PROMPTS.iter().enumerate().take(2) {
        let prompt = chat(text);
        let expected = plain(&prompt, &params, 32);
        let (got, _) = speculative(&prompt, &params, expected.clone(), 32, 100 + i as u64);
        assert_eq!(got, expected, "prompt {i}");
    }
}

#[test]
fn a_prefill_in_chunks_decodes_exactly_as_one_in_a_piece() {
    let m = model();
    let greedy = SamplingParams::greedy();
    let prompt = chat(PROMPTS[1]);
    let expected = plain(&prompt, &greedy, 24);
    let vocab = m.config().vocab_size as u32;
    for chunk in [1, 5, 16] {
        let mut s = Session::new(
            m,
            prompt.clone(),
            prompt.len(),
            greedy.clone(),
            limits(24),
            None,
        )
        .unwrap();
        let mut chunks = 0;
        while !s.prefill_chunk(m, chunk).unwrap() {
            chunks += 1;
            assert_eq!(s.prefilled(), chunks * chunk, "chunk {chunk}");
        }
        assert_eq!(s.prefilled(), prompt.len() - 1);
        assert!(
            s.prefill_chunk(m, chunk).unwrap(),
            "a done prefill stays done"
        );
        let mut out = Vec::new();
        while s.finish().is_none() {
            let tree = TokenTree::root_only(s.root(), TreeLimits::new(1, 0, vocab)).unwrap();
            out.extend(
                step_batch(m, &mut [(&mut s, &tree)], 0)
                    .unwrap()
                    .remove(0)
                    .committed,
            );
        }
        assert_eq!(out, expected, "prefill in chunks of {chunk}");
    }
}

/// One plain step of `decoding` with a 7-token chunk of `arriving`'s
/// prefill in its forward.
fn ride(m: &Model, decoding: &mut Session, arriving: &mut Session) -> FusedStep {
    let vocab = m.config().vocab_size as u32;
    let tree = TokenTree::root_only(decoding.root(), TreeLimits::new(1, 0, vocab)).unwrap();
    step_batch_fused(
        m,
        &mut [(decoding, &tree)],
        Some(PrefillChunk {
            session: arriving,
            max_tokens: 7,
        }),
        0,
    )
    .unwrap()
}

#[test]
fn a_prefill_riding_in_other_sessions_steps_decodes_as_alone() {
    let m = model();
    let greedy = SamplingParams::greedy();
    let vocab = m.config().vocab_size as u32;
    let (a, b) = (chat(PROMPTS[0]), chat(PROMPTS[1]));
    let (want_a, want_b) = (plain(&a, &greedy, 40), plain(&b, &greedy, 12));
    let mut decoding =
        Session::new(m, a.clone(), a.len(), greedy.clone(), limits(40), None).unwrap();
    decoding.prefill(m).unwrap();
    let mut arriving =
        Session::new(m, b.clone(), b.len(), greedy.clone(), limits(12), None).unwrap();
    let mut out_a: Vec<u32> = Vec::new();
    let mut chunks = 0;
    while arriving.prefill_left() > 0 {
        let left = arriving.prefill_left();
        let fused = ride(m, &mut decoding, &mut arriving);
        assert_eq!(fused.prefilled, left.min(7));
        assert_eq!(arriving.prefill_left(), left - fused.prefilled);
        out_a.extend(&fused.steps[0].committed);
        chunks += 1;
    }
    assert!(chunks > 1, "the prompt took several chunks");
    // A complete prefill adds nothing to a forward.
    let fused = ride(m, &mut decoding, &mut arriving);
    assert_eq!(fused.prefilled, 0);
    out_a.extend(&fused.steps[0].committed);
    let mut out_b: Vec<u32> = Vec::new();
    while arriving.finish().is_none() {
        let mut items = Vec::new();
        let ta = TokenTree::root_only(decoding.root(), TreeLimits::new(1, 0, vocab)).unwrap();
        let tb = TokenTree::root_only(arriving.root(), TreeLimits::new(1, 0, vocab)).unwrap();
        let a_done = decoding.finish().is_some();
        if !a_done {
            items.push((&mut decoding, &ta));
        }
        items.push((&mut arriving, &tb));
        let steps = step_batch(m, &mut items, 0).unwrap();
        if !a_done {
            out_a.extend(&steps[0].committed);
        }
        out_b.extend(&steps.last().unwrap().committed);
    }
    while decoding.finish().is_none() {
        let t = TokenTree::root_only(decoding.root(), TreeLimits::new(1, 0, vocab)).unwrap();
        out_a.extend(&step_batch(m, &mut [(&mut decoding, &t)], 0).unwrap()[0].committed);
    }
    assert_eq!(out_a, want_a, "the decoding session");
    assert_eq!(out_b, want_b, "the session prefilled in its steps");
}

#[test]
fn a_batch_commits_what_each_session_commits_alone() {
    let m = model();
    let greedy = SamplingParams::greedy();
    let prompts: Vec<Vec<u32>> = PROMPTS.iter().map(|t| chat(t)).collect();
    let vocab = m.config().vocab_size as u32;
    let mut sessions: Vec<Session> = prompts
        .iter()
        .map(|p| {
            let mut s =
                Session::new(m, p.clone(), p.len(), greedy.clone(), limits(16), None).unwrap();
            s.prefill(m).unwrap();
            s
        })
        .collect();
    let mut rng = StdRng::seed_from_u64(9);
    for _ in 0..4 {
        let trees: Vec<TokenTree> = sessions
            .iter()
            .map(|s| {
                let mut b = TreeBuilder::new(s.root(), TreeLimits::new(6, 3, vocab)).unwrap();
                for _ in 0..5 {
                    let parent = rng.random_range(0..b.len());
                    let _ = b.push(parent, rng.random_range(100..2000), 0.5);
                }
                b.build()
            })
            .collect();
        let mut alone: Vec<Vec<u32>> = Vec::new();
        for (s, t) in sessions.iter().zip(&trees) {
            let mut copy = Session::new(
                m,
                s.tokens().to_vec(),
                s.prompt_len(),
                greedy.clone(),
                limits(16),
                None,
            )
            .unwrap();
            copy.prefill(m).unwrap();
            alone.push(
                step_batch(m, &mut [(&mut copy, t)], 0)
                    .unwrap()
                    .remove(0)
                    .committed,
            );
        }
        let mut items: Vec<(&mut Session, &TokenTree)> =
            sessions.iter_mut().zip(trees.iter()).collect();
        let batched: Vec<Vec<u32>> = step_batch(m, &mut items, 0)
            .unwrap()
            .into_iter()
            .map(|s| s.committed)
            .collect();
        assert_eq!(batched, alone);
    }
}

#[test]
fn a_tree_for_another_root_is_refused_and_nothing_changes() {
    let m = model();
    let prompt = chat(PROMPTS[3]);
    let mut s = Session::new(
        m,
        prompt.clone(),
        prompt.len(),
        SamplingParams::greedy(),
        limits(8),
        None,
    )
    .unwrap();
    s.prefill(m).unwrap();
    let vocab = m.config().vocab_size as u32;
    let wrong = TokenTree::root_only(s.root() + 1, TreeLimits::new(4, 2, vocab)).unwrap();
    let err = step_batch(m, &mut [(&mut s, &wrong)], 0).unwrap_err();
    assert!(err.to_string().contains("root is token"), "{err}");
    assert_eq!(s.tokens(), prompt.as_slice());
    let right = TokenTree::root_only(s.root(), TreeLimits::new(4, 2, vocab)).unwrap();
    let step = step_batch(m, &mut [(&mut s, &right)], 0).unwrap().remove(0);
    assert_eq!(step.committed, plain(&prompt, &SamplingParams::greedy(), 1));
}

#[test]
fn a_cached_prefix_is_reused_and_gives_the_same_output() {
    let m = model();
    let greedy = SamplingParams::greedy();
    let first = chat(PROMPTS[0]);
    let mut s = Session::new(
        m,
        first.clone(),
        first.len(),
        greedy.clone(),
        limits(12),
        None,
    )
    .unwrap();
    s.prefill(m).unwrap();
    let tree = TokenTree::root_only(
        s.root(),
        TreeLimits::new(1, 0, m.config().vocab_size as u32),
    )
    .unwrap();
    while s.finish().is_none() {
        let t = tree_for(&s, &tree);
        step_batch(m, &mut [(&mut s, &t)], 0).unwrap();
    }
    let (cache, cached_tokens) = s.into_cache();
    // A second turn: the first turn's context plus a new user message.
    let mut second = cached_tokens.clone();
    second.extend(chat("And now in one word?"));
    let mut reused = Session::new(
        m,
        second.clone(),
        second.len(),
        greedy.clone(),
        limits(12),
        Some((cache, &cached_tokens)),
    )
    .unwrap();
    let (n, _) = reused.prefill(m).unwrap();
    assert_eq!(n, cached_tokens.len());
    let expected = plain(&second, &greedy, 12);
    let mut got = Vec::new();
    while reused.finish().is_none() {
        got.extend(
            {
                let t = tree_for(&reused, &tree);
                step_batch(m, &mut [(&mut reused, &t)], 0)
            }
            .unwrap()
            .remove(0)
            .committed,
        );
    }
    assert_eq!(got, expected);
}

fn tree_for(s: &Session, template: &TokenTree) -> TokenTree {
    TokenTree::root_only(s.root(), template.limits()).unwrap()
}

/// Decodes `s` (prefilled) plainly to its end.
fn decode_rest(m: &Model, s: &mut Session) -> Vec<u32> {
    let vocab = m.config().vocab_size as u32;
    let mut out = Vec::new();
    while s.finish().is_none() {
        let tree = TokenTree::root_only(s.root(), TreeLimits::new(1, 0, vocab)).unwrap();
        out.extend(
            step_batch(m, &mut [(&mut *s, &tree)], 0)
                .unwrap()
                .remove(0)
                .committed,
        );
    }
    out
}

#[test]
fn a_prefix_imported_from_another_session_decodes_as_prefilled() {
    // The prefix cache's premise: KV one session computed (prefill and
    // decode, a turn of a conversation) and another imports gives the same
    // tokens, greedy and seeded, as prefilling it.
    let m = model();
    for params in [
        SamplingParams::greedy(),
        SamplingParams::new(0.8, 0.95, 40, 77).unwrap(),
    ] {
        let first = chat(PROMPTS[1]);
        let mut a = Session::new(
            m,
            first.clone(),
            first.len(),
            params.clone(),
            limits(20),
            None,
        )
        .unwrap();
        a.prefill(m).unwrap();
        decode_rest(m, &mut a);
        // The next turn: the first turn, its answer and a follow-up.
        let mut next = a.tokens().to_vec();
        next.extend(chat(PROMPTS[3]));
        let expected = plain(&next, &params, 16);
        let cached = a.prefilled() / 16 * 16;
        assert!(cached >= 32, "a prefix of whole blocks: {cached}");
        for take in [16, cached] {
            let mut b = Session::new(
                m,
                next.clone(),
                next.len(),
                params.clone(),
                limits(16),
                None,
            )
            .unwrap();
            for start in (0..take).step_by(16) {
                assert_eq!(b.import_kv(&a.export_kv(start, 16).unwrap()).unwrap(), 16);
            }
            assert_eq!(b.prefilled(), take);
            let (reused, _) = b.prefill(m).unwrap();
            assert_eq!(reused, take);
            assert_eq!(decode_rest(m, &mut b), expected, "{take} tokens imported");
        }
        // Never past the prefill, never a partial token.
        let mut c =
            Session::new(m, first[..3].to_vec(), 3, params.clone(), limits(1), None).unwrap();
        assert!(c.import_kv(&a.export_kv(0, 3).unwrap()).is_err());
        assert!(c.import_kv(&[0u8; 5]).is_err());
    }
}
