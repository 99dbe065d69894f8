//! A mesh of separately started services on fixed loopback addresses, for
//! tests that kill members and start them again where they were: `specmesh
//! up` picks its own ports and cannot bring a killed member back, and the
//! gateway only knows members by the addresses it was given.

use std::net::TcpListener;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use specmesh_proto::v1;
use specmesh_proto::v1::generation_client::GenerationClient;
use specmesh_proto::v1::verifier_client::VerifierClient;
use tonic::transport::Channel;

use crate::model_path;
use crate::service::Service;

/// SmolLM2-135M's cost curve as measured (docs/performance.md), so no
/// verifier start measures it again.
pub const COST_CURVE: &str = "1:1,2:1.26,4:1.85,8:2.99,16:5.02,32:9.5,64:18";

/// A loopback address nothing listens on now: bound to port 0, then
/// released, so a member can be started (and started again) on it.
pub fn free_addr() -> String {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free loopback port")
        .to_string()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    Verifier,
    Drafter,
}

impl Role {
    pub fn binary(self) -> &'static str {
        match self {
            Role::Verifier => "specmesh-verifier",
            Role::Drafter => "specmesh-drafter",
        }
    }
}

/// One verifier or drafter and where it always listens.
#[derive(Debug)]
struct Member {
    role: Role,
    addr: String,
    args: Vec<String>,
    /// `None` while killed.
    service: Option<Service>,
    /// When it last started listening.
    up_since: Instant,
}

impl Member {
    fn start(&mut self) {
        let service = Service::start_at(self.role.binary(), &self.addr, &self.args, &[]);
        self.service = Some(service);
        self.up_since = Instant::now();
    }
}

/// Verifiers, drafters and a gateway that knows them by address.
#[derive(Debug)]
pub struct Cluster {
    members: Arc<Mutex<Vec<Member>>>,
    verifier_urls: Vec<String>,
    drafter_urls: Vec<String>,
    pub gateway: Service,
    gateway_args: Vec<String>,
}

impl Cluster {
    /// `verifiers` verifiers (`verifier_args` besides the model, one thread
    /// each — the tests run several on two cores — and the cost curve),
    /// `drafters` model-free drafters, and a gateway over them with
    /// `gateway_args` besides its members and model.
    pub fn start(
        verifiers: usize,
        drafters: usize,
        verifier_args: &[&str],
        gateway_args: &[&str],
    ) -> Cluster {
        let model = model_path().display().to_string();
        let drafter_addrs: Vec<String> = (0..drafters).map(|_| free_addr()).collect();
        let drafter_list = drafter_addrs
            .iter()
            .map(|a| format!("http://{a}"))
            .collect::<Vec<_>>()
            .join(",");
        let mut members = Vec::new();
        for _ in 0..verifiers {
            let mut args: Vec<String> = ["--model", &model, "--threads", "1"]
                .iter()
                .map(|s| (*s).to_string())
                .collect();
            args.extend(["--cost-curve".to_string(), COST_CURVE.to_string()]);
            if drafters > 0 {
                args.extend(["--drafters".to_string(), drafter_list.clone()]);
            }
            args.extend(verifier_args.iter().map(|s| (*s).to_string()));
            members.push((Role::Verifier, free_addr(), args));
        }
        for addr in drafter_addrs {
            members.push((Role::Drafter, addr, Vec::new()));
        }
        let mut members: Vec<Member> = members
            .into_iter()
            .map(|(role, addr, args)| Member {
                role,
                addr,
                args,
                service: None,
                up_since: Instant::now(),
            })
            .collect();
        for m in &mut members {
            m.start();
        }
        let urls = |role: Role| -> Vec<String> {
            members
                .iter()
                .filter(|m| m.role == role)
                .map(|m| format!("http://{}", m.addr))
                .collect()
        };
        let (verifier_urls, drafter_urls) = (urls(Role::Verifier), urls(Role::Drafter));
        let mut args = vec![
            "--model".to_string(),
            model,
            "--verifiers".to_string(),
            verifier_urls.join(","),
        ];
        if !drafter_urls.is_empty() {
            args.extend(["--drafters".to_string(), drafter_urls.join(",")]);
        }
        args.extend(gateway_args.iter().map(|s| (*s).to_string()));
        let gateway = Service::start("specmesh-gateway", &args, &[]);
        Cluster {
            members: Arc::new(Mutex::new(members)),
            verifier_urls,
            drafter_urls,
            gateway,
            gateway_args: args,
        }
    }

    /// Kills the gateway and starts a new one with the same flags (on a
    /// new port: [`Cluster::client`] dials it).
    pub fn restart_gateway(&mut self) {
        // SIGKILL: a crash, nothing handed over.
        sigkill(self.gateway.pid());
        let _ = self.gateway.wait_exit(Duration::from_secs(10));
        self.gateway = Service::start("specmesh-gateway", &self.gateway_args, &[]);
    }

    pub fn verifier_urls(&self) -> &[String] {
        &self.verifier_urls
    }

    pub fn drafter_urls(&self) -> &[String] {
        &self.drafter_urls
    }

    pub async fn client(&self) -> GenerationClient<Channel> {
        GenerationClient::connect(self.gateway.url.clone())
            .await
            .expect("connecting to the gateway")
    }

    /// `kill -9` of the `index`th member of `role` (dropping a [`Service`]
    /// SIGKILLs it and reaps it): no drain, no goodbye, as a lost pod.
    /// Returns its pid.
    pub fn kill(&self, role: Role, index: usize) -> u32 {
        self.handle().kill(role, index)
    }

    /// Starts a killed member again at its address; returns when it listens.
    pub fn restart(&self, role: Role, index: usize) {
        self.handle().restart(role, index);
    }

    /// What a chaos thread needs: the members, shared.
    pub fn handle(&self) -> Members {
        Members(Arc::clone(&self.members))
    }

    /// Each verifier's `Stats`, `None` for one that does not answer.
    pub async fn verifier_stats(&self) -> Vec<Option<v1::VerifierStats>> {
        let mut out = Vec::new();
        for url in &self.verifier_urls {
            out.push(verifier_stats(url).await);
        }
        out
    }

    /// Each verifier's `Stats` once none runs a session (for at most 5 s):
    /// a verifier ends a session, frees its reservation and keeps its
    /// cache just after sending the last step, so a response that has
    /// arrived does not mean it is done.
    pub async fn idle_stats(&self) -> Vec<Option<v1::VerifierStats>> {
        let start = Instant::now();
        loop {
            let stats = self.verifier_stats().await;
            let idle = stats.iter().flatten().all(|s| s.active_sessions == 0);
            if idle || start.elapsed() > Duration::from_secs(5) {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Polls every verifier until none runs a session or holds a KV
    /// reservation, for at most `within`; returns the last stats either
    /// way (the caller asserts). What stays is the prefix cache.
    pub async fn settled_stats(&self, within: Duration) -> Vec<Option<v1::VerifierStats>> {
        let start = Instant::now();
        loop {
            let stats = self.verifier_stats().await;
            let settled = stats.iter().all(|s| {
                s.as_ref()
                    .is_some_and(|s| s.active_sessions == 0 && s.reserved_bytes == 0)
            });
            if settled || start.elapsed() > within {
                return stats;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// `Verifier.Stats` of the verifier at `url`, `None` when it does not answer.
pub async fn verifier_stats(url: &str) -> Option<v1::VerifierStats> {
    let mut client = VerifierClient::connect(url.to_string()).await.ok()?;
    client
        .stats(v1::StatsRequest {})
        .await
        .ok()
        .map(tonic::Response::into_inner)
}

/// The cluster's members, shared with a thread that kills and restarts
/// them.
#[derive(Debug, Clone)]
pub struct Members(Arc<Mutex<Vec<Member>>>);

impl Members {
    fn lock(&self) -> MutexGuard<'_, Vec<Member>> {
        self.0.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn position(members: &[Member], role: Role, index: usize) -> usize {
        members
            .iter()
            .enumerate()
            .filter(|(_, m)| m.role == role)
            .nth(index)
            .map(|(i, _)| i)
            .unwrap_or_else(|| panic!("no {role:?} #{index}"))
    }

    /// How many members of `role` there are.
    pub fn count(&self, role: Role) -> usize {
        self.lock().iter().filter(|m| m.role == role).count()
    }

    /// How long the `index`th member of `role` has been listening; `None`
    /// while it is down.
    pub fn up_for(&self, role: Role, index: usize) -> Option<Duration> {
        let members = self.lock();
        let m = &members[Self::position(&members, role, index)];
        m.service.as_ref().map(|_| m.up_since.elapsed())
    }

    /// See [`Cluster::kill`].
    pub fn kill(&self, role: Role, index: usize) -> u32 {
        let service = {
            let mut members = self.lock();
            let at = Self::position(&members, role, index);
            members[at]
                .service
                .take()
                .unwrap_or_else(|| panic!("{role:?} #{index} is already down"))
        };
        let pid = service.pid();
        drop(service);
        pid
    }

    /// See [`Cluster::restart`].
    pub fn restart(&self, role: Role, index: usize) {
        let mut members = self.lock();
        let at = Self::position(&members, role, index);
        assert!(
            members[at].service.is_none(),
            "{role:?} #{index} is already up"
        );
        members[at].start();
    }
}

/// SIGKILL to `pid`.
fn sigkill(pid: u32) {
    let _ = std::process::Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .status();
}
