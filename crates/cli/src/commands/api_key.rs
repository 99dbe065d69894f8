//! `specmesh api-key`: makes API keys for the gateway's `--api-keys` file,
//! which holds only their SHA-256 hashes (`sha256:HEX TENANT` lines).

use std::io::Read;

use anyhow::{Context, Result, bail};
use rand::RngCore;
use sha2::{Digest, Sha256};

#[derive(clap::Subcommand)]
pub enum ApiKeyCommand {
    /// Make a key for TENANT: prints the key (give it to the caller; it is
    /// stored nowhere), then the line to add to the gateway's key file.
    New {
        /// The tenant the key acts for.
        #[arg(long)]
        tenant: String,
    },
    /// Print the key file entry (`sha256:HEX`) of a key read from stdin.
    Hash,
}

pub fn run(command: ApiKeyCommand) -> Result<()> {
    match command {
        ApiKeyCommand::New { tenant } => {
            let plain = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
            if tenant.is_empty() || tenant.len() > 128 || !tenant.chars().all(plain) {
                bail!("`--tenant` must be 1 to 128 of A-Z, a-z, 0-9, '.', '_', ':' and '-'");
            }
            let mut bytes = [0u8; 32];
            // ThreadRng: a CSPRNG seeded from the OS.
            rand::rng().fill_bytes(&mut bytes);
            let key = format!("sk-specmesh-{}", hex(&bytes));
            println!("{key}");
            println!("{} {tenant}", hash(&key));
            eprintln!(
                "first line: the key, for the caller (stored nowhere); second: the line for the gateway's --api-keys file"
            );
        }
        ApiKeyCommand::Hash => {
            let mut key = String::new();
            std::io::stdin()
                .read_to_string(&mut key)
                .context("reading the key from stdin")?;
            let key = key.trim();
            if key.is_empty() {
                bail!("no key on stdin");
            }
            println!("{}", hash(key));
        }
    }
    Ok(())
}

/// The gateway's key file format: `sha256:` and the hex digest.
fn hash(key: &str) -> String {
    format!("sha256:{}", hex(&Sha256::digest(key.as_bytes())))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}
