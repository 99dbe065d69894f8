//! Tenants with API keys made by `specmesh api-key new`, and a mesh whose
//! gateway authenticates them: shared by the authentication and quota
//! tests.

use std::path::Path;

use specmesh_proto::v1;

use crate::cluster::COST_CURVE;
use crate::service::Service;
use crate::{model_path, run, stdout_ok};

/// A tenant's key and its line in the gateway's key file.
#[derive(Debug, Clone)]
pub struct TenantKey {
    pub key: String,
    pub line: String,
}

/// `specmesh api-key new --tenant TENANT`.
pub fn new_key(tenant: &str) -> TenantKey {
    let out = stdout_ok(&run(["api-key", "new", "--tenant", tenant]));
    let mut lines = out.lines();
    let key = lines.next().expect("the key").to_string();
    let line = lines.next().expect("the file line").to_string();
    TenantKey { key, line }
}

/// `message` sent with `authorization: Bearer KEY` (none: no metadata).
pub fn with_key<T>(message: T, key: Option<&str>) -> tonic::Request<T> {
    let mut request = tonic::Request::new(message);
    if let Some(key) = key {
        request
            .metadata_mut()
            .insert("authorization", format!("Bearer {key}").parse().unwrap());
    }
    request
}

/// A chat request naming `tenant` (empty: none).
pub fn chat_as(text: &str, max_new_tokens: u32, tenant: &str) -> v1::GenerateRequest {
    let mut r = crate::mesh::chat_request(text, max_new_tokens);
    r.tenant = tenant.to_string();
    r
}

/// A verifier, optionally a drafter, and a gateway reading the key file
/// `keys` (written by the caller) with `gateway_args` added.
#[derive(Debug)]
pub struct KeyedMesh {
    pub verifier: Service,
    pub drafter: Option<Service>,
    pub gateway: Service,
}

impl KeyedMesh {
    pub fn start(keys: &Path, with_drafter: bool, gateway_args: &[&str]) -> KeyedMesh {
        let model = model_path().display().to_string();
        let drafter = with_drafter.then(|| {
            Service::start(
                "specmesh-drafter",
                &["--metrics-listen", "127.0.0.1:0"],
                &[],
            )
        });
        let mut verifier_args = vec![
            "--model",
            &model,
            "--threads",
            "1",
            "--cost-curve",
            COST_CURVE,
        ];
        if let Some(d) = &drafter {
            verifier_args.extend(["--drafters", &d.url]);
        }
        let verifier = Service::start("specmesh-verifier", &verifier_args, &[]);
        let mut args: Vec<String> = [
            "--model",
            &model,
            "--verifiers",
            &verifier.url,
            "--api-keys",
        ]
        .map(String::from)
        .to_vec();
        args.push(keys.display().to_string());
        if let Some(d) = &drafter {
            args.extend(["--drafters".to_string(), d.url.clone()]);
        }
        args.extend(gateway_args.iter().map(|a| (*a).to_string()));
        let gateway = Service::start("specmesh-gateway", &args, &[]);
        KeyedMesh {
            verifier,
            drafter,
            gateway,
        }
    }
}
