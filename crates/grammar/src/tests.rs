use std::time::{Duration, Instant};

use specmesh_sampling::Allowed;
use specmesh_tokenizer::Tokenizer;
use specmesh_verify::Constraint;

use super::*;

fn grammars() -> Grammars {
    let tok = Tokenizer::from_model_path(&specmesh_testing::model_path()).unwrap();
    let n = tok.vocab_size();
    Grammars::new(&tok, n, GrammarLimits::default()).unwrap()
}

fn tokenizer() -> Tokenizer {
    Tokenizer::from_model_path(&specmesh_testing::model_path()).unwrap()
}

const CITY: &str = r#"{"type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}, "required": ["city", "days"], "additionalProperties": false}"#;

/// The trip schema's constraint after `text`.
fn city_after(g: &Grammars, tok: &Tokenizer, text: &str) -> TokenConstraint {
    let mut c = g
        .compile(&Structured::JsonSchema(CITY.into()))
        .unwrap()
        .start();
    for t in tok.encode(text, false).unwrap() {
        c.advance(t).unwrap();
    }
    c
}

#[test]
fn a_schema_allows_its_json_and_forces_its_punctuation() {
    let g = grammars();
    let tok = tokenizer();
    let grammar = g.compile(&Structured::JsonSchema(CITY.into())).unwrap();
    let mut c = grammar.start();
    // Key order and separators are the schema's and json.dumps's.
    let forced = c.forced().unwrap();
    let text = tok.decode(&forced, false).unwrap();
    assert!(
        r#"{"city": ""#.starts_with(&text) && !text.is_empty(),
        "forced {text:?}"
    );
    let out = tok
        .encode(r#"{"city": "Paris", "days": 3}"#, false)
        .unwrap();
    for &t in &out {
        let words = c.allowed().unwrap().to_vec();
        assert!(Allowed::new(&words).allows(t), "{:?}", tok.token_piece(t));
        assert!(c.allows(t).unwrap());
        c.advance(t).unwrap();
    }
    assert!(c.is_accepting());
    // Complete: only the end of sequence is allowed.
    let words = c.allowed().unwrap().to_vec();
    let allowed = Allowed::new(&words);
    for &eos in tok.eos_token_ids() {
        assert!(allowed.allows(eos));
    }
    assert_eq!(allowed.count(), tok.eos_token_ids().len());
}

#[test]
fn special_tokens_never_enter_a_string_and_a_wrong_key_is_refused() {
    let g = grammars();
    let tok = tokenizer();
    let mut c = city_after(&g, &tok, r#"{"city": "Pa"#);
    let words = c.allowed().unwrap().to_vec();
    let allowed = Allowed::new(&words);
    for id in 0..tok.vocab_size() as u32 {
        if tok.is_special(id) {
            assert!(!allowed.allows(id), "{:?} allowed", tok.token_piece(id));
        }
    }
    let mut fresh = g
        .compile(&Structured::JsonSchema(CITY.into()))
        .unwrap()
        .start();
    let wrong = tok.encode(r#"{"town"#, false).unwrap();
    let ok = wrong.iter().take_while(|&&t| {
        let allowed = fresh.allows(t).unwrap();
        if allowed {
            fresh.advance(t).unwrap();
        }
        allowed
    });
    assert!(ok.count() < wrong.len());
}

#[test]
fn resuming_follows_the_committed_output_and_refuses_what_left_the_grammar() {
    let g = grammars();
    let tok = tokenizer();
    let grammar = g
        .compile(&Structured::Regex("(yes|no), because [a-z ]+\\.".into()))
        .unwrap();
    let mut c = grammar.start();
    c.resume(&tok.encode("yes, because", false).unwrap())
        .unwrap();
    assert!(!c.is_accepting());
    let mut bad = grammar.start();
    let err = bad
        .resume(&tok.encode("maybe", false).unwrap())
        .unwrap_err();
    assert!(err.0.contains("leaves the grammar"), "{err}");
}

#[test]
fn compiled_grammars_are_reused() {
    let g = grammars();
    let spec = Structured::JsonSchema(CITY.into());
    g.compile(&spec).unwrap();
    let t0 = Instant::now();
    g.compile(&spec).unwrap();
    g.compile(&Structured::JsonObject).unwrap();
    assert_eq!(g.cache.len(), 2);
    assert!(t0.elapsed() < Duration::from_secs(5));
}

#[test]
fn bad_and_hostile_grammars_are_refused_with_what_to_fix() {
    let g = grammars();
    let refused = |spec: Structured| {
        let t0 = Instant::now();
        let Err(e) = g.compile(&spec) else {
            panic!("{:.80} compiled", spec.text());
        };
        // Limits, not luck: every refusal comes quickly.
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "{e} took {:?}",
            t0.elapsed()
        );
        e.to_string()
    };
    let e = refused(Structured::JsonSchema("{\"type\": ".into()));
    assert!(e.starts_with("the JSON schema is not JSON"), "{e}");
    let e = refused(Structured::JsonSchema(r#"{"type": "strnig"}"#.into()));
    assert!(
        e.contains("cannot be compiled") && e.contains("strnig"),
        "{e}"
    );
    let e = refused(Structured::JsonSchema(
        r#"{"type": "integer", "minimum": 5, "maximum": 1}"#.into(),
    ));
    assert!(e.contains("cannot be compiled"), "{e}");
    let e = refused(Structured::JsonSchema(format!(
        "{{\"enum\": [{}]}}",
        vec!["\"x\""; 40_000].join(",")
    )));
    assert!(e.contains("at most 131072"), "{e}");
    // Deep nesting: refused before it reaches the engine's stack.
    let deep = (0..200).fold(String::from("{\"type\": \"string\"}"), |inner, _| {
        format!("{{\"type\": \"array\", \"items\": {inner}}}")
    });
    let e = refused(Structured::JsonSchema(deep));
    assert!(e.contains("recursion limit"), "{e}");
    let e = refused(Structured::Lark("start: /a/ stop=\"x\"".into()));
    assert!(e.contains("cannot") || e.contains("speculation"), "{e}");
    let e = refused(Structured::Lark("start: foo".into()));
    assert!(e.contains("Lark grammar cannot be compiled"), "{e}");
    let e = refused(Structured::Regex("  ".into()));
    assert_eq!(e, "the regular expression is empty");
}

#[test]
fn a_lexer_that_could_explode_never_stalls_a_step() {
    // 2^41 states for an automaton built ahead; the engine builds its
    // lexer lazily, bounded per step by its fuel and its state limit.
    let g = grammars();
    let tok = tokenizer();
    let mut c = g
        .compile(&Structured::Regex("(a|b)*a(a|b){40}".into()))
        .unwrap()
        .start();
    let ab = tok
        .encode("abbabaabbbabaabbabbbaababbaabababbbabbbaaabab", false)
        .unwrap();
    let t0 = Instant::now();
    for t in ab.iter().cycle().take(2000) {
        let t1 = Instant::now();
        let step = c.allowed().map(|_| ()).and_then(|_| c.advance(*t));
        assert!(
            t1.elapsed() < Duration::from_secs(1),
            "a step took {:?}",
            t1.elapsed()
        );
        if step.is_err() {
            break;
        }
    }
    assert!(t0.elapsed() < Duration::from_secs(60));
}

#[test]
fn a_mask_over_the_vocabulary_is_cheap() {
    let g = grammars();
    let tok = tokenizer();
    let mut c = city_after(&g, &tok, r#"{"city": "#);
    let t0 = Instant::now();
    for _ in 0..20 {
        c.allowed().unwrap();
    }
    let per = t0.elapsed() / 20;
    eprintln!("mask inside a JSON string: {per:?}");
}
