//! `specmesh bench` and `specmesh bench-serve` end to end: each starts the
//! three services itself and runs on the real model (the interleaved pass
//! and a concurrency sweep; open-loop arrivals over gRPC and over the HTTP
//! front), checks that every output equals plain decoding, and writes its
//! JSON and plot.

use std::ffi::OsStr;

use specmesh_e2e::{model_path, run_with_env};

const QUESTIONS: &str = r#"{"question_id": "t1", "category": "translation", "turns": ["Translate to German: The train leaves at seven in the morning."]}
{"question_id": "s1", "category": "summarization", "turns": ["Summarize in one sentence: The city council voted to extend the bike lanes downtown after a year of record ridership."]}
{"question_id": "c1", "category": "coding", "turns": ["Write a Python function that returns the sum of a list of numbers."]}
"#;

fn env() -> Vec<(&'static str, &'static OsStr)> {
    vec![
        // The cost curve measured here (docs/performance.md); calibrating
        // at every start would only add seconds.
        (
            "SPECMESH_VERIFIER_COST_CURVE",
            OsStr::new("1:1,2:1.26,4:1.85,8:2.99,16:5.02,32:9.5,64:18"),
        ),
        ("SPECMESH_VERIFIER_THREADS", OsStr::new("2")),
        ("SPECMESH_THREADS", OsStr::new("2")),
        ("SPECMESH_LOG", OsStr::new("warn")),
    ]
}

#[test]
fn bench_sweeps_concurrency_checks_identity_and_writes_json_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let questions = dir.path().join("q.jsonl");
    std::fs::write(&questions, QUESTIONS).unwrap();
    let (json, svg, md) = (
        dir.path().join("b.json"),
        dir.path().join("b.svg"),
        dir.path().join("b.md"),
    );
    let out = run_with_env(
        [
            OsStr::new("bench"),
            OsStr::new("--up"),
            OsStr::new("--model"),
            model_path().as_os_str(),
            OsStr::new("--questions"),
            questions.as_os_str(),
            OsStr::new("--max-new-tokens"),
            OsStr::new("24"),
            OsStr::new("--concurrency"),
            OsStr::new("1,3"),
            OsStr::new("--json"),
            json.as_os_str(),
            OsStr::new("--plot"),
            svg.as_os_str(),
            OsStr::new("--markdown"),
            md.as_os_str(),
        ],
        &env(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed:\n{stderr}\n{stdout}");
    for cat in ["translation", "summarization", "coding", "overall"] {
        assert!(stdout.contains(cat), "no {cat} row in the table:\n{stdout}");
    }
    assert!(
        stdout.contains("aggregate tok/s"),
        "no concurrency table:\n{stdout}"
    );

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["mismatches"].as_array().unwrap().len(), 0);
    let runs = report["runs"].as_array().unwrap();
    assert_eq!(runs.len(), 3 * 2, "off and auto for each of 3 prompts");
    for r in runs {
        let n = r["completion_tokens"].as_u64().unwrap();
        assert!((1..=24).contains(&n), "{r}");
        assert!(r["wall_seconds"].as_f64().unwrap() > 0.0);
    }
    // At concurrency 3 all three prompts run together, off then auto, and
    // each must equal its one-at-a-time greedy output token for token.
    let waves = report["waves"].as_array().unwrap();
    assert_eq!(waves.len(), 2);
    for w in waves {
        assert_eq!(w["concurrency"], 3);
        assert_eq!(w["runs"].as_array().unwrap().len(), 3);
        for r in w["runs"].as_array().unwrap() {
            let alone = runs
                .iter()
                .find(|a| a["question"] == r["question"] && a["config"] == "off")
                .unwrap();
            assert_eq!(r["tokens"], alone["tokens"], "{}", r["question"]);
        }
    }
    let levels = report["summary"]["levels"].as_array().unwrap();
    let level_keys: Vec<(u64, &str)> = levels
        .iter()
        .map(|l| {
            (
                l["concurrency"].as_u64().unwrap(),
                l["config"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        level_keys,
        [(1, "off"), (1, "auto"), (3, "off"), (3, "auto")]
    );
    for l in levels {
        assert!(l["aggregate_tok_s"].as_f64().unwrap() > 0.0, "{l}");
    }

    let md = std::fs::read_to_string(&md).unwrap();
    for header in [
        "| category | prompts |",
        "| configuration |",
        "| concurrency |",
    ] {
        assert!(
            md.contains(header),
            "no {header:?} table in the Markdown:\n{md}"
        );
    }

    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg"), "not an SVG");
    for text in [
        "Speedup over plain decoding",
        "against concurrency",
        "translation",
    ] {
        assert!(svg.contains(text), "the plot has no {text:?}");
    }
}

#[test]
fn bench_refuses_bad_options_with_a_message_that_says_what_to_do() {
    let out = run_with_env(
        [
            OsStr::new("bench"),
            OsStr::new("--up"),
            OsStr::new("--model"),
            model_path().as_os_str(),
            OsStr::new("--peer"),
            OsStr::new("--peer-bin"),
            OsStr::new("/nonexistent/dir"),
        ],
        &env(),
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tools/bench/setup.sh"), "{stderr}");

    let out = run_with_env(["bench", "--up", "--concurrency", "1,0"], &env());
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--concurrency 0"), "{stderr}");

    // `bench` runs the conversations through the same command.
    let out = run_with_env(["bench", "--conversations", "1"], &env());
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("pass --up"), "{stderr}");

    // The conversations' peer, before any service starts.
    let out = run_with_env(
        [
            "bench-serve",
            "--up",
            "--conversations",
            "1",
            "--peer",
            "--peer-bin",
            "/nonexistent/dir",
        ],
        &env(),
    );
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("tools/bench/setup.sh"), "{stderr}");
    for (flags, says) in [
        (&["--turns", "6"][..], "--turns 6"),
        (
            &["--conversation-concurrency", "0"],
            "--conversation-concurrency 0",
        ),
        (&["--peer-spec", "ngram-simple"], "--peer"),
    ] {
        let mut args = vec!["bench-serve", "--up", "--conversations", "1"];
        args.extend(flags);
        let out = run_with_env(args, &env());
        assert!(!out.status.success(), "{flags:?}");
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(stderr.contains(says), "{flags:?}: {stderr}");
    }
}

#[test]
fn bench_serve_runs_open_loop_over_both_transports_and_writes_json_and_plot() {
    let dir = tempfile::tempdir().unwrap();
    let questions = dir.path().join("q.jsonl");
    std::fs::write(&questions, QUESTIONS).unwrap();
    for transport in ["grpc", "http"] {
        let (json, svg) = (
            dir.path().join(format!("{transport}.json")),
            dir.path().join(format!("{transport}.svg")),
        );
        let out = run_with_env(
            [
                OsStr::new("bench-serve"),
                OsStr::new("--up"),
                OsStr::new("--transport"),
                OsStr::new(transport),
                OsStr::new("--model"),
                model_path().as_os_str(),
                OsStr::new("--questions"),
                questions.as_os_str(),
                OsStr::new("--request-rate"),
                OsStr::new("4,inf"),
                OsStr::new("--num-prompts"),
                OsStr::new("3"),
                OsStr::new("--max-new-tokens"),
                OsStr::new("16"),
                OsStr::new("--json"),
                json.as_os_str(),
                OsStr::new("--plot"),
                svg.as_os_str(),
            ],
            &env(),
        );
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "bench-serve over {transport} failed:\n{stderr}\n{stdout}"
        );
        assert!(stdout.contains("auto/off"), "no ratio row:\n{stdout}");

        let report: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
        assert_eq!(report["transport"], transport);
        assert_eq!(report["mismatches"], 0);
        let results = report["results"].as_array().unwrap();
        let keys: Vec<(String, &str)> = results
            .iter()
            .map(|r| (r["request_rate"].to_string(), r["mode"].as_str().unwrap()))
            .collect();
        assert_eq!(
            keys,
            [
                ("4.0".into(), "off"),
                ("4.0".into(), "auto"),
                ("\"inf\"".into(), "off"),
                ("\"inf\"".into(), "auto")
            ],
            "off then auto at each rate"
        );
        for r in results {
            assert_eq!(r["completed"], 3, "{r}");
            assert_eq!(r["failed"], 0, "{r}");
            assert_eq!(r["mismatches"], 0, "{r}");
            for positive in ["request_throughput", "output_throughput", "duration"] {
                assert!(r[positive].as_f64().unwrap() > 0.0, "{positive}: {r}");
            }
            let tokens = r["total_output_tokens"].as_u64().unwrap();
            assert!((3..=3 * 16).contains(&tokens), "{r}");
            for metric in ["ttft", "tpot", "itl", "e2el"] {
                let p50 = r[format!("median_{metric}_ms")].as_f64().unwrap();
                let p99 = r[format!("p99_{metric}_ms")].as_f64().unwrap();
                assert!(p50 >= 0.0 && p99 >= p50, "{metric}: {r}");
            }
            assert!(r["p99_e2el_ms"].as_f64().unwrap() > 0.0, "{r}");
            // The gateway reports each request's verify steps over gRPC
            // only: tokens per step are at least one, and so is the wait.
            if transport == "grpc" {
                assert!(r["tokens_per_step"].as_f64().unwrap() >= 1.0, "{r}");
                assert!(r["tree_wait_ms_per_step"].as_f64().unwrap() >= 0.0, "{r}");
            } else {
                assert!(r["tokens_per_step"].is_null(), "{r}");
            }
        }
        // Each rate's repetition ratio, as the passes' records give it.
        for pair in results.chunks(2) {
            let ratio = pair[1]["output_throughput"].as_f64().unwrap()
                / pair[0]["output_throughput"].as_f64().unwrap();
            let line =
                format!("auto/off output tok/s by repetition: {ratio:.2}x (median {ratio:.2}x)");
            assert!(stdout.contains(&line), "no {line:?} in:\n{stdout}");
        }

        let svg = std::fs::read_to_string(&svg).unwrap();
        assert!(svg.starts_with("<svg"), "not an SVG");
        for text in ["against request rate", "inf", "speculation auto"] {
            assert!(svg.contains(text), "the plot has no {text:?}");
        }
    }
}

/// Short material for the conversations: a test needs their shape (the
/// history resent each turn), not the dev sets' long documents.
const CONVERSATION_SPEC: &str = r#"{"question_id": "r1", "category": "rag", "turns": ["The Danube flows through ten countries and four capitals: Vienna, Bratislava, Budapest and Belgrade.\nWhich capitals does the Danube flow through?"]}
{"question_id": "r2", "category": "rag", "turns": ["Mount Kilimanjaro in Tanzania is the highest mountain in Africa, at 5,895 metres.\nHow high is Kilimanjaro?"]}
{"question_id": "s1", "category": "summarization", "turns": ["The library will extend its opening hours on weekends from March, after a survey showed that most visitors work during the week."]}
{"question_id": "w1", "category": "writing", "turns": ["Write a haiku.", "Now make your answer shorter."]}
{"question_id": "w2", "category": "writing", "turns": ["Write a limerick.", "Explain your previous answer in one sentence."]}
"#;

const CONVERSATION_CODE: &str = r#"{"question_id": "e1", "category": "code-edit", "turns": ["Rename the function to total.\n\n```python\ndef s(xs):\n    return sum(xs)\n```"]}
"#;

#[test]
fn bench_serve_runs_conversations_over_every_api_and_checks_their_answers() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, code, json) = (
        dir.path().join("spec.jsonl"),
        dir.path().join("code.jsonl"),
        dir.path().join("conv.json"),
    );
    std::fs::write(&spec, CONVERSATION_SPEC).unwrap();
    std::fs::write(&code, CONVERSATION_CODE).unwrap();
    let out = run_with_env(
        [
            OsStr::new("bench-serve"),
            OsStr::new("--up"),
            OsStr::new("--model"),
            model_path().as_os_str(),
            OsStr::new("--conversations"),
            OsStr::new("2"),
            OsStr::new("--turns"),
            OsStr::new("2"),
            OsStr::new("--conversation-concurrency"),
            OsStr::new("2"),
            OsStr::new("--tenants"),
            OsStr::new("2"),
            OsStr::new("--conversation-questions"),
            spec.as_os_str(),
            OsStr::new("--conversation-code"),
            code.as_os_str(),
            OsStr::new("--max-new-tokens"),
            OsStr::new("12"),
            OsStr::new("--json"),
            json.as_os_str(),
        ],
        &env(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench-serve --conversations failed:\n{stderr}\n{stdout}"
    );
    assert!(
        stdout.contains("TTFT turns 2+ p50 ms"),
        "no table:\n{stdout}"
    );

    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["mismatches"].as_array().unwrap().len(), 0);
    let rows = report["rows"].as_array().unwrap();
    let targets: Vec<&str> = rows.iter().map(|r| r["target"].as_str().unwrap()).collect();
    assert_eq!(targets, ["gRPC", "gRPC + session_id", "OpenAI HTTP"]);
    for r in rows {
        assert_eq!(r["concurrency"], 2, "{r}");
        assert_eq!(r["conversations"], 2, "{r}");
        assert_eq!(r["turns"], 4, "every turn answered: {r}");
        assert_eq!(r["failed_conversations"], 0, "{r}");
        assert!(r["total_seconds"].as_f64().unwrap() > 0.0, "{r}");
    }
    for p in report["passes"].as_array().unwrap() {
        let turns = p["turns"].as_array().unwrap();
        for c in 0..2 {
            let of: Vec<&serde_json::Value> =
                turns.iter().filter(|t| t["conversation"] == c).collect();
            assert_eq!(of.len(), 2);
            // The whole history is resent: the second prompt holds the
            // first, its answer and the follow-up.
            let prompt = |t: &serde_json::Value| t["prompt_tokens"].as_u64().unwrap();
            let cached = |t: &serde_json::Value| t["cached_tokens"].as_u64().unwrap();
            assert!(prompt(of[1]) > prompt(of[0]));
            // A first turn may find the system prompt the other
            // conversation of its pass (its tenant) computed, no more.
            assert!(cached(of[0]) < prompt(of[0]), "{}", of[0]);
            // Every API, the OpenAI front without a session included,
            // reuses the first turn's prompt (whole blocks of 16 tokens),
            // never the follow-up.
            assert!(cached(of[1]) + 16 >= prompt(of[0]), "{}", of[1]);
            assert!(cached(of[1]) < prompt(of[1]), "{}", of[1]);
        }
    }
}

#[test]
fn bench_serve_runs_agent_tasks_with_speculation_on_and_off() {
    let dir = tempfile::tempdir().unwrap();
    let (spec, json) = (
        dir.path().join("spec.jsonl"),
        dir.path().join("agentic.json"),
    );
    std::fs::write(&spec, CONVERSATION_SPEC).unwrap();
    let out = run_with_env(
        [
            OsStr::new("bench-serve"),
            OsStr::new("--up"),
            OsStr::new("--model"),
            model_path().as_os_str(),
            OsStr::new("--agentic"),
            OsStr::new("2"),
            OsStr::new("--agentic-workload"),
            OsStr::new("json"),
            OsStr::new("--agentic-questions"),
            spec.as_os_str(),
            OsStr::new("--max-new-tokens"),
            OsStr::new("48"),
            OsStr::new("--json"),
            json.as_os_str(),
        ],
        &env(),
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench-serve --agentic failed:\n{stderr}\n{stdout}"
    );
    assert!(
        stdout.contains("specmesh auto / off"),
        "no ratio:\n{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let targets = report["targets"].as_array().unwrap();
    let names: Vec<&str> = targets
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["specmesh auto", "specmesh off"]);
    for t in targets {
        assert_eq!(t["requests"], 2, "{t}");
        // The schema's keys and punctuation are forced either way.
        assert!(t["forced"].as_u64().unwrap() > 0, "{t}");
        assert_eq!(t["valid"], t["checked"], "{t}");
    }

    // Two workloads at once are refused.
    let out = run_with_env(
        [
            "bench-serve",
            "--up",
            "--agentic",
            "1",
            "--conversations",
            "1",
        ],
        &env(),
    );
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("two workloads"));
}
