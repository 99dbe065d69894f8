//! Callers' identity: API keys mapped to tenants.
//!
//! With `--api-keys FILE` every call must carry `authorization: Bearer KEY`;
//! the key's tenant is the request's tenant (it scopes the drafters' shared
//! index, the kept caches and the quotas), whatever the request says. A
//! request naming another tenant is refused with PERMISSION_DENIED rather
//! than silently moved: the caller learns its key does not act for it.
//!
//! The file holds SHA-256 hashes of the keys, never the keys, so a leaked
//! Secret or a log of it gives no key away:
//!
//! ```text
//! # sha256:HEX  tenant
//! sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08  team-a
//! ```
//!
//! `specmesh api-key new --tenant team-a` makes a key and its line. The file
//! is read again every `--api-keys-reload-ms`: keys are added and revoked
//! without a restart; a file that does not parse keeps the previous keys,
//! with a warning.
//!
//! Without `--api-keys` callers are not authenticated and name their own
//! tenant (local development); the gateway warns at start.

mod keys;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tonic::metadata::MetadataMap;
use tracing::{info, warn};

pub use keys::{KeyFileError, Keys, hash_key};

/// Why a caller was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("this gateway needs an API key: send the metadata `authorization: Bearer KEY`")]
    Missing,
    #[error("the `authorization` metadata must be `Bearer KEY`")]
    Malformed,
    #[error("the API key is not valid (unknown or revoked)")]
    Unknown,
    #[error(
        "this API key acts for tenant `{key_tenant}`, not `{requested}`; leave `tenant` empty or name `{key_tenant}`"
    )]
    OtherTenant {
        key_tenant: String,
        requested: String,
    },
}

/// Who may call, and as which tenant.
#[derive(Debug, Clone)]
pub enum Callers {
    /// Anyone, as the tenant they name.
    Open,
    Keys(Arc<KeyRing>),
}

impl Callers {
    /// From `--api-keys` (and its reload interval). Call inside the
    /// runtime: the file is watched for changes.
    pub fn from_file(path: Option<&Path>, reload: Duration) -> Result<Callers, KeyFileError> {
        let Some(path) = path else {
            warn!(
                "no --api-keys: callers are not authenticated and choose their own tenant (local development only)"
            );
            return Ok(Callers::Open);
        };
        let ring = KeyRing::load(path.to_path_buf())?;
        specmesh_server::reload::every(
            &ring,
            reload,
            "the API key file changed but does not load: keeping the previous keys",
            KeyRing::reload,
        );
        Ok(Callers::Keys(ring))
    }

    /// Who is calling, from the call's metadata: checked before the
    /// request is admitted or even read.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Caller, AuthError> {
        let Callers::Keys(ring) = self else {
            return Ok(Caller(None));
        };
        let key = bearer(metadata)?;
        let tenant = ring.tenant_of(key).ok_or(AuthError::Unknown)?;
        Ok(Caller(Some(tenant)))
    }
}

impl AuthError {
    /// The gRPC code: a key acting for another tenant is denied, any
    /// other failure unauthenticated.
    pub fn code(&self) -> tonic::Code {
        match self {
            AuthError::OtherTenant { .. } => tonic::Code::PermissionDenied,
            _ => tonic::Code::Unauthenticated,
        }
    }
}

/// An authenticated caller: the tenant its key acts for (`None`: no keys
/// configured).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller(Option<String>);

impl Caller {
    /// A caller where no keys are configured: any tenant the request
    /// names.
    pub fn keyless() -> Caller {
        Caller(None)
    }

    /// The tenant the call runs as: the key's, else the one the request
    /// names. `requested` is the request's validated `tenant` (empty: none
    /// named).
    pub fn tenant(&self, requested: &str) -> Result<String, AuthError> {
        match &self.0 {
            None => Ok(requested.to_string()),
            Some(tenant) if requested.is_empty() || requested == tenant => Ok(tenant.clone()),
            Some(tenant) => Err(AuthError::OtherTenant {
                key_tenant: tenant.clone(),
                requested: requested.to_string(),
            }),
        }
    }
}

/// The key in `authorization: Bearer KEY`.
fn bearer(metadata: &MetadataMap) -> Result<&str, AuthError> {
    let value = metadata.get("authorization").ok_or(AuthError::Missing)?;
    let value = value.to_str().map_err(|_| AuthError::Malformed)?;
    let (scheme, key) = value.split_once(' ').ok_or(AuthError::Malformed)?;
    let key = key.trim();
    if !scheme.eq_ignore_ascii_case("bearer") || key.is_empty() {
        return Err(AuthError::Malformed);
    }
    Ok(key)
}

/// The key file, as last read.
#[derive(Debug)]
pub struct KeyRing {
    path: PathBuf,
    current: RwLock<(Vec<u8>, Keys)>,
}

impl KeyRing {
    fn load(path: PathBuf) -> Result<Arc<KeyRing>, KeyFileError> {
        let bytes = read(&path)?;
        let keys = Keys::parse(&bytes).map_err(|e| e.in_file(&path))?;
        info!(path = %path.display(), keys = keys.len(), tenants = keys.tenants(), "API keys loaded");
        Ok(Arc::new(KeyRing {
            path,
            current: RwLock::new((bytes, keys)),
        }))
    }

    fn tenant_of(&self, key: &str) -> Option<String> {
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        current.1.tenant_of(key).map(str::to_string)
    }

    /// Reads the file again; `Ok(true)` when it changed and loaded.
    fn reload(&self) -> Result<bool, KeyFileError> {
        let bytes = read(&self.path)?;
        if self.current.read().unwrap_or_else(|e| e.into_inner()).0 == bytes {
            return Ok(false);
        }
        let keys = Keys::parse(&bytes).map_err(|e| e.in_file(&self.path))?;
        info!(
            keys = keys.len(),
            tenants = keys.tenants(),
            "API keys reloaded"
        );
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (bytes, keys);
        Ok(true)
    }
}

fn read(path: &Path) -> Result<Vec<u8>, KeyFileError> {
    std::fs::read(path).map_err(|e| KeyFileError::Read {
        path: path.to_path_buf(),
        reason: e.to_string(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_auth(value: &str) -> MetadataMap {
        let mut m = MetadataMap::new();
        m.insert("authorization", value.parse().unwrap());
        m
    }

    #[test]
    fn keys_name_the_tenant_and_the_request_cannot_change_it() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(
            &path,
            format!(
                "{} team-a\n{} team-b\n",
                hash_key("key-a"),
                hash_key("key-b")
            ),
        )
        .unwrap();
        let callers = Callers::Keys(KeyRing::load(path.clone()).unwrap());
        let tenant = |metadata: &MetadataMap, requested: &str| {
            callers.authenticate(metadata)?.tenant(requested)
        };
        let a = with_auth("Bearer key-a");
        assert_eq!(tenant(&a, ""), Ok("team-a".into()));
        assert_eq!(tenant(&a, "team-a"), Ok("team-a".into()));
        assert_eq!(
            tenant(&a, "team-b"),
            Err(AuthError::OtherTenant {
                key_tenant: "team-a".into(),
                requested: "team-b".into()
            })
        );
        assert_eq!(
            tenant(&with_auth("bearer  key-b "), ""),
            Ok("team-b".into())
        );
        assert_eq!(tenant(&MetadataMap::new(), ""), Err(AuthError::Missing));
        assert_eq!(
            tenant(&with_auth("Basic a2V5"), ""),
            Err(AuthError::Malformed)
        );
        assert_eq!(
            tenant(&with_auth("Bearer nope"), ""),
            Err(AuthError::Unknown)
        );

        // Revoking key-a and adding key-c takes effect on reload; a broken
        // file keeps what was loaded.
        let Callers::Keys(ring) = &callers else {
            unreachable!()
        };
        std::fs::write(
            &path,
            format!(
                "{} team-b\n{} team-c\n",
                hash_key("key-b"),
                hash_key("key-c")
            ),
        )
        .unwrap();
        assert_eq!(ring.reload(), Ok(true));
        assert_eq!(tenant(&a, ""), Err(AuthError::Unknown));
        assert_eq!(tenant(&with_auth("Bearer key-c"), ""), Ok("team-c".into()));
        std::fs::write(&path, "sha256:zz team-d\n").unwrap();
        assert!(ring.reload().is_err());
        assert_eq!(tenant(&with_auth("Bearer key-c"), ""), Ok("team-c".into()));
    }

    #[test]
    fn without_keys_the_request_names_its_tenant() {
        let caller = Callers::Open.authenticate(&MetadataMap::new()).unwrap();
        assert_eq!(caller.tenant("t"), Ok("t".into()));
    }
}
