//! Two network namespaces joined by a veth pair, as `tools/bench/netns.sh`
//! makes them: the verifier side and the drafter side of a mesh whose
//! drafter is a separate host. Removed when dropped.
//!
//! Needs root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and iproute2; CI runs as
//! root. [`Netns::up`] says why it could not make them, so a test can print
//! that and skip where namespaces cannot exist.

use std::path::PathBuf;
use std::process::Command;

/// The pair of namespaces; see the module docs.
#[derive(Debug)]
pub struct Netns {
    /// The verifier side's namespace.
    pub v: String,
    /// The drafter side's namespace.
    pub d: String,
    /// The drafter side's address on the veth link.
    pub d_addr: String,
    net: String,
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../tools/bench/netns.sh")
}

impl Netns {
    /// Makes a pair named after this process (so parallel test binaries do
    /// not collide), or says why it cannot.
    pub fn up() -> Result<Netns, String> {
        let pid = std::process::id();
        let net = format!("10.251.{}", pid % 250);
        let n = Netns {
            v: format!("smv{pid}"),
            d: format!("smd{pid}"),
            d_addr: format!("{net}.2"),
            net,
        };
        let out = n
            .script("up")
            .output()
            .map_err(|e| format!("running {}: {e}", script().display()))?;
        if !out.status.success() {
            return Err(format!(
                "{} up failed (root and iproute2 are needed): {}",
                script().display(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(n)
    }

    fn script(&self, verb: &str) -> Command {
        let mut c = Command::new("bash");
        c.arg(script())
            .arg(verb)
            .env("SPECMESH_NETNS_V", &self.v)
            .env("SPECMESH_NETNS_D", &self.d)
            .env("SPECMESH_NETNS_NET", &self.net);
        c
    }

    /// `ip netns exec NS PROGRAM`, to run `PROGRAM` on the verifier side.
    pub fn exec_v(&self, program: impl Into<PathBuf>) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.v]).arg(program.into());
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = self.script("down").output();
    }
}
