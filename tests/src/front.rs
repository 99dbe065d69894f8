//! A drafter, a verifier and a gateway serving the OpenAI front, as the
//! HTTP tests start them.

use std::process::Command;

use crate::cluster::{COST_CURVE, free_addr};
use crate::deploy::python;
use crate::model_path;
use crate::service::Service;

/// A drafter, a verifier and a gateway serving the OpenAI front.
#[derive(Debug)]
pub struct Front {
    pub model_id: String,
    /// The HTTP front's address.
    pub http: String,
    pub gateway: Service,
    pub verifier: Service,
    _drafter: Service,
}

impl Front {
    /// The three services, `gateway_args` added to the gateway's flags.
    pub fn start(gateway_args: &[&str]) -> Front {
        Front::start_model(&model_path(), gateway_args)
    }

    /// [`Front::start`] on `model` (a path or a catalog name).
    pub fn start_model(model: &std::path::Path, gateway_args: &[&str]) -> Front {
        let model_arg = model.display().to_string();
        let drafter = Service::start("specmesh-drafter", &[] as &[&str], &[]);
        let verifier = Service::start(
            "specmesh-verifier",
            &[
                "--model",
                &model_arg,
                "--threads",
                "1",
                "--cost-curve",
                COST_CURVE,
                "--drafters",
                &drafter.url,
            ],
            &[],
        );
        let http = free_addr();
        let mut args = vec![
            "--model",
            &model_arg,
            "--verifiers",
            &verifier.url,
            "--drafters",
            &drafter.url,
            "--http-listen",
            &http,
        ];
        args.extend_from_slice(gateway_args);
        let gateway = Service::start("specmesh-gateway", &args, &[]);
        Front {
            model_id: model.file_name().unwrap().to_string_lossy().into_owned(),
            http,
            gateway,
            verifier,
            _drafter: drafter,
        }
    }
}

impl Front {
    /// Runs `tests/python/SCRIPT BASE_URL MODEL` (a client of the official
    /// `openai` package) and returns the JSON it prints, printed too.
    pub fn run_client(&self, script: &str) -> serde_json::Value {
        let script = format!("{}/python/{script}", env!("CARGO_MANIFEST_DIR"));
        let out = Command::new(python())
            .args([&script, &format!("http://{}", self.http), &self.model_id])
            .output()
            .expect("running the openai client (scripts/python-env.sh installs it)");
        assert!(
            out.status.success(),
            "the openai client failed:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let seen: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        println!("{}", serde_json::to_string_pretty(&seen).unwrap());
        seen
    }
}
