//! Prometheus metrics through a real Prometheus: `specmesh up` starts every
//! service with a metrics port and prints each `/metrics` URL; Debian's
//! `prometheus` (started here, `scripts/tools.sh` installs it) scrapes
//! them during a run of generations, and its HTTP API must report the same
//! speculation totals as the responses; `promtool check metrics` must find
//! every service's exposition clean.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use specmesh_e2e::mesh::{Mesh, chat_request, with_mode};
use specmesh_proto::v1;

/// `curl -s URL`: the body, or `None` when the request failed.
fn get(url: &str) -> Option<String> {
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "5", url])
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
}

/// `host:port` of an `http://host:port/metrics` URL.
fn target(url: &str) -> &str {
    url.trim_start_matches("http://")
        .trim_end_matches("/metrics")
}

/// A Prometheus scraping `targets` every second, killed on drop.
struct Prometheus {
    child: Child,
    url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    fn start(targets: &[&str]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let list = targets
            .iter()
            .map(|t| format!("'{t}'"))
            .collect::<Vec<_>>()
            .join(", ");
        std::fs::write(
            &config,
            format!(
                "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: specmesh\n    \
                 static_configs:\n      - targets: [{list}]\n"
            ),
        )
        .unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let child = Command::new("prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("starting prometheus (scripts/tools.sh installs it)");
        Prometheus {
            child,
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    /// The value of the instant query `q`, if it has exactly one sample.
    fn query(&self, q: &str) -> Option<f64> {
        let url = format!(
            "{}/api/v1/query?query={}",
            self.url,
            q.bytes()
                .map(|b| match b {
                    b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' | b'.' | b'-' => {
                        (b as char).to_string()
                    }
                    _ => format!("%{b:02X}"),
                })
                .collect::<String>()
        );
        let body: serde_json::Value = serde_json::from_str(&get(&url)?).ok()?;
        let result = body["data"]["result"].as_array()?;
        match result.as_slice() {
            [one] => one["value"][1].as_str()?.parse().ok(),
            _ => None,
        }
    }

    /// Polls `q` until it equals `want` (Prometheus's first scrape comes a
    /// few seconds after it starts); returns the last value seen.
    fn wait_for(&self, q: &str, want: f64) -> Option<f64> {
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < Duration::from_secs(40) {
            last = self.query(q);
            if last == Some(want) {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        last
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// `promtool check metrics` of `exposition`: its complaints, if any.
fn promtool_problems(exposition: &str) -> Option<String> {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("running promtool (scripts/tools.sh installs it)");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(exposition.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (!out.status.success() || !said.trim().is_empty()).then_some(said)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prometheus_sees_what_the_responses_report() {
    let mesh = Mesh::start();
    let gateway_metrics = mesh
        .gateway_metrics
        .clone()
        .expect("the gateway's metrics URL");
    let mut urls = Vec::new();
    for p in &mesh.services {
        urls.push(
            p.metrics
                .clone()
                .unwrap_or_else(|| panic!("no metrics URL for {p:?}")),
        );
    }
    assert_eq!(urls.len(), 3, "{urls:?}");
    assert!(urls.contains(&gateway_metrics), "{urls:?}");
    let targets: Vec<&str> = urls.iter().map(|u| target(u)).collect();
    let prometheus = Prometheus::start(&targets);

    // Generations that draft (repetitive text, model-free drafting).
    let mut client = mesh.client().await;
    let (mut accepted, mut drafted, mut generated) = (0u64, 0u64, 0u64);
    const REQUESTS: u64 = 4;
    for i in 0..REQUESTS {
        let text = format!(
            "Repeat this line {} times: the quick brown fox jumps over the lazy dog.",
            i + 3
        );
        let r = with_mode(chat_request(&text, 48), v1::SpeculationMode::ModelFree);
        let out = client.generate(r).await.unwrap().into_inner();
        let spec = out.speculation.unwrap_or_default();
        accepted += u64::from(spec.accepted_tokens);
        drafted += u64::from(spec.drafted_tokens);
        generated += u64::from(out.usage.unwrap_or_default().completion_tokens);
    }
    assert!(
        accepted > 0,
        "nothing was accepted: the test needs speculation"
    );
    // A refused request is counted by its code.
    let mut bad = chat_request("x", 8);
    bad.sampling = Some(v1::SamplingParams {
        top_p: 2.0,
        ..Default::default()
    });
    assert!(client.generate(bad).await.is_err());

    let checks = [
        (
            "sum(specmesh_spec_decode_num_accepted_tokens_total)",
            accepted as f64,
        ),
        (
            "sum(specmesh_spec_decode_num_draft_tokens_total)",
            drafted as f64,
        ),
        ("sum(specmesh_generation_tokens_total)", generated as f64),
        ("sum(specmesh_requests_total{code=\"OK\"})", REQUESTS as f64),
        (
            "sum(specmesh_requests_total{code=\"INVALID_ARGUMENT\"})",
            1.0,
        ),
        (
            "sum(specmesh_spec_decode_num_accepted_tokens_per_pos_total)",
            accepted as f64,
        ),
        ("count(up == 1)", 3.0),
    ];
    for (q, want) in checks {
        assert_eq!(prometheus.wait_for(q, want), Some(want), "{q}");
    }
    // Every service labels its metrics with its model, and the verifier's
    // and drafter's own metrics are there.
    for q in [
        "sum(specmesh_kv_cache_capacity_bytes)",
        "sum(specmesh_verify_batch_size_count)",
        "sum(specmesh_drafter_trees_total)",
        "sum(specmesh_time_to_first_token_seconds_count)",
    ] {
        let v = prometheus.query(q).unwrap_or(0.0);
        assert!(v > 0.0, "{q} = {v}");
    }
    assert!(
        prometheus
            .query("count(specmesh_kv_cache_bytes{model_name!=\"\"})")
            .is_some_and(|n| n == 1.0)
    );

    for url in &urls {
        let exposition = get(url).unwrap_or_else(|| panic!("GET {url}"));
        // The gateway mirrors its speculation counters under vLLM's own
        // names, colons and all, for benchmark clients that read them;
        // they must equal ours, and the rest must lint clean.
        let value = |name: &str| -> Option<f64> {
            exposition
                .lines()
                .find(|l| l.starts_with(name) && !l.starts_with('#'))
                .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        };
        for counter in [
            "spec_decode_num_drafts_total",
            "spec_decode_num_draft_tokens_total",
            "spec_decode_num_accepted_tokens_total",
        ] {
            let ours = value(&format!("specmesh_{counter}"));
            assert_eq!(value(&format!("vllm:{counter}")), ours, "{url}: {counter}");
        }
        let ours: String = exposition
            .lines()
            .filter(|l| !l.contains("vllm:"))
            .map(|l| format!("{l}\n"))
            .collect();
        if let Some(problems) = promtool_problems(&ours) {
            panic!("promtool check metrics of {url}:\n{problems}");
        }
    }
}
