//! DNS membership against a real DNS server: Debian's `dnsmasq` (installed
//! by `scripts/tools.sh`) serves `verifier.specmesh.test` and
//! `drafter.specmesh.test` on a loopback address from a hosts file the test
//! rewrites (then SIGHUP), as a headless Service's records change when pods
//! come and go. The gateway takes `dns:///NAME:PORT` entries and runs in its
//! own mount namespace whose `/etc/resolv.conf` names that server (what a
//! pod's resolv.conf does for cluster DNS); every member listens on its own
//! loopback address with the same port, as pods do.
//!
//! A verifier added to the records receives sessions; one removed receives
//! no new ones while the stream it runs finishes there, unchanged.

use std::io::Write;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use specmesh_e2e::cluster::{COST_CURVE, verifier_stats};
use specmesh_e2e::mesh::chat_request;
use specmesh_e2e::model_path;
use specmesh_e2e::service::Service;
use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;

const DNS_ADDR: &str = "127.0.71.1";
const VERIFIER_A: &str = "127.0.72.1";
const VERIFIER_B: &str = "127.0.72.2";
const DRAFTER: &str = "127.0.72.3";
const VERIFIER_NAME: &str = "verifier.specmesh.test";
const DRAFTER_NAME: &str = "drafter.specmesh.test";

/// dnsmasq answering from `hosts` on `DNS_ADDR:53`, killed on drop.
struct Dns {
    child: Child,
    hosts: std::path::PathBuf,
    dir: tempfile::TempDir,
}

impl Dns {
    fn start(records: &[(&str, &str)]) -> Dns {
        let dir = tempfile::tempdir().unwrap();
        let hosts = dir.path().join("hosts");
        write_hosts(&hosts, records);
        let child = Command::new("dnsmasq")
            .args([
                "--no-daemon",
                "--conf-file=/dev/null",
                "--no-resolv",
                "--no-hosts",
                "--bind-interfaces",
                "--port=53",
                "--local-ttl=0",
                "--user=root",
            ])
            .arg(format!("--listen-address={DNS_ADDR}"))
            .arg(format!("--addn-hosts={}", hosts.display()))
            .arg(format!("--pid-file={}", dir.path().join("pid").display()))
            .stdout(Stdio::null())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("dnsmasq (Debian's dnsmasq-base; scripts/tools.sh installs it)");
        std::fs::write(
            dir.path().join("resolv.conf"),
            format!("nameserver {DNS_ADDR}\noptions timeout:1\n"),
        )
        .unwrap();
        let dns = Dns { child, hosts, dir };
        // Ready once it answers for a name it serves.
        let until = Instant::now() + Duration::from_secs(10);
        while dns.lookup(records[0].0).is_empty() {
            assert!(Instant::now() < until, "dnsmasq did not start");
            std::thread::sleep(Duration::from_millis(100));
        }
        dns
    }

    /// The records are now `records` (dnsmasq re-reads on SIGHUP).
    fn set(&self, records: &[(&str, &str)]) {
        write_hosts(&self.hosts, records);
        let pid = libc::pid_t::try_from(self.child.id()).unwrap();
        assert_eq!(unsafe { libc::kill(pid, libc::SIGHUP) }, 0);
    }

    /// The addresses `name` has now, asked of this server the way the
    /// gateway asks (a resolv.conf naming it).
    fn lookup(&self, name: &str) -> Vec<String> {
        let out = in_namespace(&self.resolv_conf(), &["getent", "ahostsv4", name])
            .output()
            .unwrap();
        let mut found: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .filter_map(|l| l.split_whitespace().next().map(str::to_owned))
            .collect();
        found.sort();
        found.dedup();
        found
    }

    /// A resolv.conf naming this server, written once at start: rewriting
    /// it while a service in a namespace reads it would show an empty file.
    fn resolv_conf(&self) -> String {
        self.dir.path().join("resolv.conf").display().to_string()
    }
}

impl Drop for Dns {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn write_hosts(path: &std::path::Path, records: &[(&str, &str)]) {
    let mut f = std::fs::File::create(path).unwrap();
    for (name, addr) in records {
        writeln!(f, "{addr} {name}").unwrap();
    }
}

/// `command` in a new mount namespace whose /etc/resolv.conf is `resolv`.
fn in_namespace(resolv: &str, command: &[&str]) -> Command {
    let wrapper = namespace_wrapper(resolv);
    let mut cmd = Command::new(&wrapper[0]);
    cmd.args(&wrapper[1..]).args(command);
    cmd
}

/// An `unshare` command line that binds `resolv` over /etc/resolv.conf,
/// then execs the rest of the command line.
fn namespace_wrapper(resolv: &str) -> Vec<String> {
    [
        "unshare",
        "--mount",
        "--",
        "sh",
        "-c",
        "mount --bind \"$0\" /etc/resolv.conf && exec \"$@\"",
        resolv,
    ]
    .iter()
    .map(|s| (*s).to_string())
    .collect()
}

/// `curl URL`'s body.
fn get(url: &str) -> String {
    let out = Command::new("curl")
        .args(["-sf", "--max-time", "5", url])
        .output()
        .unwrap();
    assert!(out.status.success(), "GET {url}");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `specmesh_gateway_members{role=ROLE,state=STATE}` in `text`.
fn members(text: &str, role: &str, state: &str) -> Option<u64> {
    text.lines()
        .filter(|l| l.starts_with("specmesh_gateway_members{"))
        .find(|l| {
            l.contains(&format!("role=\"{role}\"")) && l.contains(&format!("state=\"{state}\""))
        })
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
}

/// The gateway's `specmesh_migrations_total` in `text`.
fn migrations(text: &str) -> u64 {
    text.lines()
        .find(|l| l.starts_with("specmesh_migrations_total"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no specmesh_migrations_total in\n{text}"))
}

/// Waits until the gateway's metrics show `up` verifiers, all up.
fn wait_for_verifiers(metrics: &str, up: u64) {
    let until = Instant::now() + Duration::from_secs(30);
    loop {
        let text = get(metrics);
        if members(&text, "verifier", "up") == Some(up)
            && members(&text, "verifier", "down") == Some(0)
        {
            return;
        }
        assert!(
            Instant::now() < until,
            "the gateway never saw {up} verifiers:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// A verifier at `addr` that knows its drafters by the DNS name `drafters`
/// names, resolved through `dns` as the gateway resolves it.
fn verifier(addr: &str, dns: &Dns, drafters: &str) -> Service {
    let model = model_path().display().to_string();
    let args = [
        "--model",
        &model,
        "--threads",
        "1",
        "--cost-curve",
        COST_CURVE,
        "--drafters",
        drafters,
        "--resolve-interval-ms",
        "200",
    ];
    let wrapper = namespace_wrapper(&dns.resolv_conf());
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    Service::start_wrapped(&wrapper, "specmesh-verifier", addr, &args, &[])
}

/// A session of its own, its KV salted apart: no session finds another's
/// cached prompt, so placement follows the session (rendezvous over the
/// members), not the prefix every session shares.
fn session_request(id: &str) -> v1::GenerateRequest {
    let mut r = chat_request("Name three prime numbers.", 12);
    r.session_id = id.to_owned();
    r.cache_salt = id.to_owned();
    r
}

/// Context tokens the verifier at `url` has looked up in its prefix cache:
/// one prompt's worth per session it ran.
async fn queried(url: &str) -> u64 {
    verifier_stats(url)
        .await
        .expect("verifier stats")
        .prefix_cache_queries
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn verifiers_join_and_leave_through_dns() {
    let drafter = Service::start_at(
        "specmesh-drafter",
        &format!("{DRAFTER}:0"),
        &[] as &[&str],
        &[],
    );
    let drafter_port = drafter.url.rsplit(':').next().unwrap().to_owned();
    let drafters = format!("dns:///{DRAFTER_NAME}:{drafter_port}");
    let dns = Dns::start(&[(VERIFIER_NAME, VERIFIER_A), (DRAFTER_NAME, DRAFTER)]);
    assert_eq!(dns.lookup(VERIFIER_NAME), [VERIFIER_A]);
    let a = verifier(&format!("{VERIFIER_A}:0"), &dns, &drafters);
    let port = a.url.rsplit(':').next().unwrap().to_owned();

    let metrics_addr = specmesh_e2e::cluster::free_addr();
    let metrics = format!("http://{metrics_addr}/metrics");
    let model = model_path().display().to_string();
    let gateway_args = [
        "--model".to_string(),
        model,
        "--verifiers".into(),
        format!("dns:///{VERIFIER_NAME}:{port}"),
        "--drafters".into(),
        drafters.clone(),
        "--resolve-interval-ms".into(),
        "200".into(),
        "--metrics-listen".into(),
        metrics_addr,
    ];
    let wrapper = namespace_wrapper(&dns.resolv_conf());
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    let gateway = Service::start_wrapped(
        &wrapper,
        "specmesh-gateway",
        "127.0.0.1:0",
        &gateway_args,
        &[],
    );
    let mut client = GenerationClient::connect(gateway.url.clone())
        .await
        .unwrap();
    wait_for_verifiers(&metrics, 1);

    // One verifier: every session is on it; the drafter came through DNS.
    let reference = client
        .generate(session_request("s-0"))
        .await
        .unwrap()
        .into_inner();
    assert!(!reference.text.is_empty());
    // Every session asks the same prompt: sessions run = tokens queried /
    // this.
    let per = queried(&a.url).await;
    assert!(per > 0);
    let cached = |url: String| async move { queried(&url).await / per };
    let spec = reference.speculation.unwrap();
    assert!(
        spec.drafted_tokens > 0,
        "drafted through the resolved drafter: {spec:?}"
    );
    let text = get(&metrics);
    assert_eq!(members(&text, "drafter", "up"), Some(1), "{text}");
    for i in 1..4 {
        let r = client
            .generate(session_request(&format!("s-{i}")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.text, reference.text);
    }
    assert_eq!(cached(a.url.clone()).await, 4);

    // A second verifier joins the records: new sessions reach it.
    let b = verifier(&format!("{VERIFIER_B}:{port}"), &dns, &drafters);
    dns.set(&[
        (VERIFIER_NAME, VERIFIER_A),
        (VERIFIER_NAME, VERIFIER_B),
        (DRAFTER_NAME, DRAFTER),
    ]);
    wait_for_verifiers(&metrics, 2);
    for i in 4..20 {
        let r = client
            .generate(session_request(&format!("s-{i}")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.text, reference.text, "same answer on either verifier");
    }
    let (on_a, on_b) = (cached(a.url.clone()).await, cached(b.url.clone()).await);
    assert_eq!(on_a + on_b, 20);
    assert!(on_b > 0, "the new verifier took none of 16 new sessions");
    eprintln!("after the join: {on_a} sessions on the first verifier, {on_b} on the new one");

    // A long stream runs on one of them; that one leaves the records.
    let long = chat_request("Write a short story about a lighthouse keeper.", 256);
    let expected = client.generate(long.clone()).await.unwrap().into_inner();
    let mut stream = client.generate_stream(long).await.unwrap().into_inner();
    let first = stream.message().await.unwrap().expect("a first chunk");
    let mut streamed = first.text.clone();
    let mut offset = first.token_offset + first.token_ids.len() as u32;
    let running_on_a = verifier_stats(&a.url).await.unwrap().active_sessions > 0;
    let (leaving, staying, staying_addr) = if running_on_a {
        (&a, &b, VERIFIER_B)
    } else {
        (&b, &a, VERIFIER_A)
    };
    assert_eq!(
        verifier_stats(&leaving.url).await.unwrap().active_sessions,
        1
    );
    let migrated_before = migrations(&get(&metrics));
    dns.set(&[(VERIFIER_NAME, staying_addr), (DRAFTER_NAME, DRAFTER)]);
    wait_for_verifiers(&metrics, 1);
    assert_eq!(
        verifier_stats(&leaving.url).await.unwrap().active_sessions,
        1,
        "the stream still runs on the verifier that left"
    );
    let (leaving_before, staying_before) = (
        cached(leaving.url.clone()).await,
        cached(staying.url.clone()).await,
    );
    for i in 20..32 {
        let r = client
            .generate(session_request(&format!("s-{i}")))
            .await
            .unwrap()
            .into_inner();
        assert_eq!(r.text, reference.text);
    }
    assert_eq!(
        cached(leaving.url.clone()).await,
        leaving_before,
        "no new session on the removed verifier"
    );
    assert_eq!(cached(staying.url.clone()).await, staying_before + 12);

    // The stream it ran finishes there, unchanged.
    let mut last = None;
    while let Some(chunk) = stream.message().await.unwrap() {
        assert_eq!(chunk.token_offset, offset, "offsets continue");
        offset += chunk.token_ids.len() as u32;
        streamed.push_str(&chunk.text);
        last = Some(chunk);
    }
    assert_eq!(streamed, expected.text);
    assert_eq!(last.unwrap().finish_reason, expected.finish_reason);
    assert_eq!(
        verifier_stats(&leaving.url).await.unwrap().active_sessions,
        0
    );
    assert_eq!(
        migrations(&get(&metrics)),
        migrated_before,
        "the stream stayed on the verifier that left"
    );
    drop(gateway);
}
