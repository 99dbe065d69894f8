//! The model drafter on the real model (`$SPECMESH_MODEL`, else the
//! `specmesh model fetch` cache). Skipped, with a notice, when the model is
//! not there.

use std::sync::{Arc, OnceLock};

use specmesh_draft::{DraftContext, Drafter, TokenTree, TreeLimits};
use specmesh_draft_model::{
    DraftModelError, DraftOptions, ModelDrafter, VocabMismatch, check_pieces, check_vocab,
};
use specmesh_model::{Block, LoadOptions, Model};
use specmesh_sampling::SamplingParams;
use specmesh_testing::model_path;
use specmesh_tokenizer::Tokenizer;

struct Fixture {
    model: Arc<Model>,
    tokenizer: Tokenizer,
}

/// The model and its tokenizer, loaded once. A missing model fails the
/// test: CI always has it, and a skipped test proves nothing.
fn fixture() -> Option<&'static Fixture> {
    static FIXTURE: OnceLock<Fixture> = OnceLock::new();
    Some(FIXTURE.get_or_init(|| {
        let path = model_path();
        assert!(
            path.exists(),
            "model not found at {} (set SPECMESH_MODEL or run `cargo run --release -p specmesh-cli -- model fetch`)",
            path.display()
        );
        let model = Model::load(&path, &LoadOptions::default()).expect("loading the test model");
        let tokenizer = Tokenizer::from_gguf_path(&path).expect("loading the tokenizer");
        Fixture {
            model: Arc::new(model),
            tokenizer,
        }
    }))
}

fn prompt(f: &Fixture) -> Vec<u32> {
    f.tokenizer
        .encode_for_model("The history of the printing press begins in the fifteenth century, when")
        .unwrap()
}

fn vocab(f: &Fixture) -> u32 {
    f.model.config().vocab_size as u32
}

fn ctx<'a>(tokens: &'a [u32], prompt_len: usize, limits: TreeLimits) -> DraftContext<'a> {
    DraftContext {
        tokens,
        prompt_len,
        limits,
    }
}

/// The model's own greedy continuation of `tokens`, `n` tokens long, by
/// plain decoding on a fresh sequence.
fn greedy_continuation(model: &Model, tokens: &[u32], n: usize) -> Vec<u32> {
    let mut seq = model.new_sequence();
    let block = Block::chain(tokens.to_vec(), 0).unwrap().last_logits_only();
    let mut logits = model.forward(&mut seq, &block).unwrap();
    seq.commit(&(0..tokens.len()).collect::<Vec<_>>()).unwrap();
    let mut out = Vec::new();
    while out.len() < n {
        let next = logits.argmax(logits.rows() - 1);
        out.push(next);
        let step = Block::chain(vec![next], seq.len()).unwrap();
        logits = model.forward(&mut seq, &step).unwrap();
        seq.commit(&[0]).unwrap();
    }
    out
}

/// Tokens along the first child of each node, root excluded.
fn first_branch(t: &TokenTree) -> Vec<u32> {
    let mut out = Vec::new();
    let mut n = 0;
    while let Some(&c) = t.children(n).first() {
        out.push(t.token(c as usize));
        n = c as usize;
    }
    out
}

/// A greedy drafter on the test model's first `layers` layers.
fn greedy_self_draft(f: &Fixture, layers: usize) -> ModelDrafter {
    let draft = Arc::new(f.model.truncated(layers).unwrap());
    ModelDrafter::new(
        draft,
        SamplingParams::greedy(),
        vocab(f),
        DraftOptions::default(),
    )
    .unwrap()
}

fn check_shape(t: &TokenTree, root: u32, limits: TreeLimits) {
    assert_eq!(t.root_token(), root);
    assert!(
        t.len() <= limits.max_nodes,
        "{} > {}",
        t.len(),
        limits.max_nodes
    );
    assert!(t.max_depth() <= limits.max_depth);
    for i in 1..t.len() {
        let p = t.parent(i).unwrap();
        assert!(t.score(i) <= t.score(p) && t.score(i) > 0.0);
    }
}

#[test]
fn self_draft_trees_are_valid_and_fill_the_budget() {
    let Some(f) = fixture() else { return };
    let mut d = greedy_self_draft(f, f.model.n_layers() / 2);
    let mut tokens = prompt(f);
    let p = tokens.len();
    for (round, (nodes, depth)) in [(2, 1), (4, 3), (8, 4), (16, 6), (32, 8), (9, 8)]
        .into_iter()
        .enumerate()
    {
        let limits = TreeLimits::new(nodes, depth, vocab(f));
        let t0 = std::time::Instant::now();
        let t = d.propose(&ctx(&tokens, p, limits));
        eprintln!(
            "budget {nodes}/{depth}: {} nodes, depth {}, {:?}",
            t.len(),
            t.max_depth(),
            t0.elapsed()
        );
        check_shape(&t, *tokens.last().unwrap(), limits);
        assert_eq!(t.len(), nodes, "the budget is spent");
        assert!(
            !t.has_draft_dists(),
            "greedy trees carry no draft distribution"
        );
        // Accept the first branch's first token, then some other token.
        if let Some(&c) = t.children(0).first() {
            tokens.push(t.token(c as usize));
        }
        tokens.push(100 + round as u32);
    }
    // Speculation off and foreign limits: the root alone.
    let t = d.propose(&ctx(&tokens, p, TreeLimits::new(1, 0, vocab(f))));
    assert_eq!(t.len(), 1);
    let t = d.propose(&ctx(&tokens, p, TreeLimits::new(8, 4, vocab(f) + 1)));
    assert_eq!(t.len(), 1);
    assert_eq!(d.stats().errors, 0);
}

/// A cancelled propose stops before its next level and keeps what it grew:
/// the root's children, from the forward that caught the model up, and
/// nothing below them; once reset, the same context grows a whole tree
/// whose first level is the one the cancelled propose drafted.
#[test]
fn a_cancelled_propose_keeps_the_levels_it_grew() {
    let Some(f) = fixture() else { return };
    let mut d = greedy_self_draft(f, 8);
    let tokens = prompt(f);
    let limits = TreeLimits::new(12, 6, vocab(f));
    let cancel = d.cancel_handle();
    cancel.cancel();
    let cut = d.propose(&ctx(&tokens, tokens.len(), limits));
    check_shape(&cut, *tokens.last().unwrap(), limits);
    assert_eq!(
        cut.max_depth(),
        1,
        "a cancelled propose grew past its first level"
    );
    assert!(
        cut.len() > 1,
        "the first level costs no extra forward: it is kept"
    );
    assert_eq!(d.stats().cancelled, 1);
    cancel.reset();
    let whole = d.propose(&ctx(&tokens, tokens.len(), limits));
    check_shape(&whole, *tokens.last().unwrap(), limits);
    assert!(
        whole.max_depth() > 1,
        "reset, the propose still stopped early"
    );
    assert_eq!(whole.token(1), cut.token(1));
    assert_eq!(d.stats().cancelled, 1);
}

#[test]
fn full_model_drafts_its_own_greedy_continuation() {
    let Some(f) = fixture() else { return };
    let v = vocab(f);
    let mut tree_drafter = ModelDrafter::new(
        Arc::clone(&f.model),
        SamplingParams::greedy(),
        v,
        DraftOptions::default(),
    )
    .unwrap();
    let chain = DraftOptions {
        max_children: 1,
        ..DraftOptions::default()
    };
    let mut chain_drafter =
        ModelDrafter::new(Arc::clone(&f.model), SamplingParams::greedy(), v, chain).unwrap();
    let mut tokens = prompt(f);
    let p = tokens.len();
    let depth = 5;
    for round in 0..9 {
        let reference = greedy_continuation(&f.model, &tokens, depth + 1);

        let limits = TreeLimits::new(12, depth, v);
        let t = tree_drafter.propose(&ctx(&tokens, p, limits));
        check_shape(&t, *tokens.last().unwrap(), limits);
        let branch = first_branch(&t);
        assert!(!branch.is_empty(), "round {round}: nothing drafted");
        assert_eq!(
            branch,
            reference[..branch.len()],
            "round {round}: tree's first branch"
        );

        let limits = TreeLimits::new(depth + 1, depth, v);
        let c = chain_drafter.propose(&ctx(&tokens, p, limits));
        let branch = first_branch(&c);
        assert_eq!(
            c.len(),
            depth + 1,
            "round {round}: a chain fills its budget"
        );
        assert_eq!(branch, reference[..depth], "round {round}: chain");

        // What the target commits next (the drafters only see the result).
        match round % 3 {
            // Everything accepted, plus the bonus token.
            0 => tokens.extend_from_slice(&reference),
            // Two accepted, then a token the draft did not propose.
            1 => {
                tokens.extend_from_slice(&reference[..2]);
                tokens.push((reference[2] + 1) % v);
            }
            // The session rewinds three tokens and continues elsewhere.
            _ => {
                tokens.truncate(tokens.len() - 3);
                tokens.push(1000 + round as u32);
            }
        }
    }
    let s = chain_drafter.stats();
    assert_eq!(s.errors, 0);
    // The accepted stem's K/V is reused: after the prompt, catching up
    // never refeeds more than the rewind of three tokens plus one.
    assert!(
        s.context_tokens < p as u64 + 9 * 5,
        "catch-up fed {} tokens",
        s.context_tokens
    );
}

#[test]
fn sampled_trees_carry_the_distributions_their_children_came_from() {
    let Some(f) = fixture() else { return };
    let v = vocab(f);
    let draft = Arc::new(f.model.truncated(f.model.n_layers() / 2).unwrap());
    let params = SamplingParams::new(0.8, 0.95, 0, 7).unwrap();
    let make = |params: SamplingParams| {
        ModelDrafter::new(Arc::clone(&draft), params, v, DraftOptions::default()).unwrap()
    };
    let (mut a, mut b) = (make(params.clone()), make(params.clone()));
    let mut other = make(SamplingParams::new(0.8, 0.95, 0, 8).unwrap());
    let mut tokens = prompt(f);
    let p = tokens.len();
    let limits = TreeLimits::new(16, 5, v);
    let mut differs = false;
    for _ in 0..4 {
        let t = a.propose(&ctx(&tokens, p, limits));
        check_shape(&t, *tokens.last().unwrap(), limits);
        assert!(t.len() > 1);
        for i in 0..t.len() {
            let kids = t.children(i);
            if kids.is_empty() {
                continue;
            }
            let dist = t.draft_dist(i).expect("every expanded node carries its q");
            let total: f32 = dist.entries().iter().map(|e| e.1).sum();
            assert!((total - 1.0).abs() < 1e-3);
            assert!(dist.entries().len() <= DraftOptions::default().support);
            for &c in kids {
                assert!(dist.prob(t.token(c as usize)) > 0.0);
            }
        }
        assert_eq!(
            b.propose(&ctx(&tokens, p, limits)),
            t,
            "same seed, same tree"
        );
        differs |= other.propose(&ctx(&tokens, p, limits)) != t;
        tokens.extend(first_branch(&t).into_iter().take(2));
        tokens.push(42);
    }
    assert!(differs, "another seed draws other trees");
}

/// End to end: over many proposes on one context, the root's first child
/// follows the attached q (the draws change with the propose counter).
#[test]
fn sampled_children_follow_the_attached_distribution() {
    let Some(f) = fixture() else { return };
    let v = vocab(f);
    let draft = Arc::new(f.model.truncated(2).unwrap());
    let params = SamplingParams::new(1.0, 1.0, 0, 3).unwrap();
    let mut d = ModelDrafter::new(draft, params, v, DraftOptions::default()).unwrap();
    let tokens = prompt(f);
    let limits = TreeLimits::new(2, 1, v);
    let n = 600;
    let mut q = Vec::new();
    let mut counts = std::collections::HashMap::<u32, usize>::new();
    for _ in 0..n {
        let t = d.propose(&ctx(&tokens, tokens.len(), limits));
        let dist = t.draft_dist(0).expect("q at the root").entries().to_vec();
        if q.is_empty() {
            q = dist;
        } else {
            assert_eq!(q, dist, "the same context gives the same q");
        }
        *counts.entry(t.token(1)).or_default() += 1;
    }
    for &(token, p) in q.iter().take(3) {
        let got = counts.get(&token).copied().unwrap_or(0) as f64 / n as f64;
        let sd = (p as f64 * (1.0 - p as f64) / n as f64).sqrt();
        assert!(
            (got - p as f64).abs() < 5.0 * sd + 1e-9,
            "token {token}: drawn {got}, q = {p}"
        );
    }
}

#[test]
fn a_drafter_seeded_with_cached_kv_drafts_as_one_that_prefilled() {
    let Some(f) = fixture() else { return };
    let tokens = prompt(f);
    let limits = TreeLimits::new(24, 4, vocab(f));
    let full = |seed: &mut ModelDrafter| seed.propose(&ctx(&tokens, tokens.len(), limits));
    let greedy = || {
        ModelDrafter::new(
            f.model.clone(),
            SamplingParams::greedy(),
            vocab(f),
            DraftOptions::default(),
        )
        .unwrap()
    };
    let mut prefilled = greedy();
    let expected = full(&mut prefilled);
    // The prefix a cache would hold: whole blocks of the context before
    // the root.
    let held = (tokens.len() - 1) / 4 * 4;
    assert!(held >= 4, "the prompt is long enough to share a block");
    let kv = prefilled.export_kv(0, held).unwrap();
    let mut seeded = greedy();
    let err = seeded.import_kv(&tokens[..held], &kv[..kv.len() - 1]);
    assert!(err.is_err(), "KV of the wrong size is refused");
    assert_eq!(seeded.cached_len(), 0, "and nothing is taken");
    seeded.import_kv(&tokens[..held], &kv).unwrap();
    assert_eq!(seeded.cached_tokens(), &tokens[..held]);
    let got = full(&mut seeded);
    assert_eq!(got, expected, "the same tree as after a whole prefill");
    assert_eq!(
        seeded.stats().context_tokens as usize,
        tokens.len() - held,
        "only the rest of the context was fed"
    );
}

#[test]
fn vocab_check_accepts_the_same_tokenizer_and_names_a_difference() {
    let Some(f) = fixture() else { return };
    let again = Tokenizer::from_gguf_path(&model_path()).unwrap();
    assert_eq!(check_vocab(&f.tokenizer, &again), Ok(()));

    let pieces: Vec<Option<String>> = (0..f.tokenizer.vocab_size() as u32)
        .map(|id| f.tokenizer.token_piece(id))
        .collect();
    let target: Vec<Option<&str>> = pieces.iter().map(|p| p.as_deref()).collect();
    let mut draft = target.clone();
    assert_eq!(check_pieces(&target, &draft), Ok(()));
    draft[1234] = Some("Ġsomething");
    let e = check_pieces(&target, &draft).unwrap_err();
    assert!(matches!(e, VocabMismatch::Piece { id: 1234, .. }), "{e}");
    assert!(e.to_string().contains("Ġsomething"), "{e}");
    draft.pop();
    assert!(matches!(
        check_pieces(&target, &draft),
        Err(VocabMismatch::Size { .. })
    ));
}

#[test]
fn a_draft_model_with_another_vocabulary_is_refused() {
    let Some(f) = fixture() else { return };
    let e = ModelDrafter::new(
        Arc::clone(&f.model),
        SamplingParams::greedy(),
        vocab(f) + 64,
        DraftOptions::default(),
    )
    .unwrap_err();
    assert!(matches!(e, DraftModelError::VocabSize { .. }));
    assert!(e.to_string().contains("same family"), "{e}");
    let bad = DraftOptions {
        max_children: 8,
        support: 4,
    };
    assert!(
        ModelDrafter::new(
            Arc::clone(&f.model),
            SamplingParams::greedy(),
            vocab(f),
            bad
        )
        .is_err()
    );
}

#[test]
fn a_broken_context_gets_the_root_alone() {
    let Some(f) = fixture() else { return };
    let v = vocab(f);
    let mut d = ModelDrafter::new(
        Arc::clone(&f.model),
        SamplingParams::greedy(),
        v,
        DraftOptions::default(),
    )
    .unwrap();
    let limits = TreeLimits::new(8, 4, v);
    let bad_root = [1, 2, v + 5];
    let t = d.propose(&ctx(&bad_root, 2, limits));
    assert_eq!((t.len(), t.root_token()), (1, v + 5));
    let t = d.propose(&ctx(&[], 0, limits));
    assert_eq!(t.len(), 1);
    // Longer than the model's context: refused by the forward, not drafted.
    let long = vec![100u32; f.model.config().max_context + 1];
    let t = d.propose(&ctx(&long, long.len(), limits));
    assert_eq!(t.len(), 1);
    assert_eq!(d.stats().errors, 1);
    let tokens = prompt(f);
    assert_eq!(d.propose(&ctx(&tokens, tokens.len(), limits)).len(), 8);
}

/// Steady-state propose latency at context ~512 (run with `--ignored
/// --nocapture`; numbers depend on the machine and its load).
#[test]
#[ignore]
fn propose_timing() {
    let Some(f) = fixture() else { return };
    let v = vocab(f);
    let mut tokens = Vec::new();
    while tokens.len() < 500 {
        tokens.extend(prompt(f));
    }
    let p = tokens.len();
    let median = |mut xs: Vec<f64>| {
        xs.sort_by(f64::total_cmp);
        xs[xs.len() / 2]
    };
    for layers in [f.model.n_layers() / 4, f.model.n_layers() / 2] {
        let draft = Arc::new(f.model.truncated(layers).unwrap());
        // One-token decode step of the draft model, for scale.
        let mut seq = draft.new_sequence();
        draft
            .forward(
                &mut seq,
                &Block::chain(tokens.clone(), 0).unwrap().last_logits_only(),
            )
            .unwrap();
        seq.commit(&(0..p).collect::<Vec<_>>()).unwrap();
        let mut steps = Vec::new();
        for i in 0..20 {
            let block = Block::chain(vec![100 + i], seq.len()).unwrap();
            let t0 = std::time::Instant::now();
            draft.forward(&mut seq, &block).unwrap();
            seq.commit(&[0]).unwrap();
            steps.push(t0.elapsed().as_secs_f64() * 1e6);
        }
        eprintln!("{layers} layers: one-token forward {:.0} µs", median(steps));
        for (nodes, depth) in [(2, 1), (5, 4), (8, 4), (16, 6)] {
            let mut d = ModelDrafter::new(
                Arc::clone(&draft),
                SamplingParams::greedy(),
                v,
                DraftOptions::default(),
            )
            .unwrap();
            let mut ctx_tokens = tokens.clone();
            let limits = TreeLimits::new(nodes, depth, v);
            d.propose(&ctx(&ctx_tokens, p, limits));
            let mut times = Vec::new();
            for round in 0..15u32 {
                let t0 = std::time::Instant::now();
                let t = d.propose(&ctx(&ctx_tokens, p, limits));
                times.push(t0.elapsed().as_secs_f64() * 1e6);
                ctx_tokens.extend(first_branch(&t).into_iter().take(2));
                ctx_tokens.push(200 + round);
            }
            let s = d.stats();
            eprintln!(
                "  budget {nodes}/{depth}: propose {:.0} µs (forwards/propose {:.1}, tree tokens/propose {:.1})",
                median(times),
                s.forwards as f64 / s.proposes as f64,
                s.tree_tokens as f64 / s.proposes as f64
            );
        }
    }
}
