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
//! without a restart. A file that stops loading (unreadable, a line that
//! does not parse) fails closed: every key is refused, with an error in the
//! log and `specmesh_gateway_api_key_file_loaded` at 0, until the file loads
//! again — a half-written revocation must not leave the revoked key valid.
//! `--api-keys-keep-on-error` keeps the last keys instead, with a warning.
//!
//! Without `--api-keys` callers are not authenticated and name their own
//! tenant (local development); the gateway warns at start.

mod keys;

use std::path::{Path, PathBuf};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tonic::metadata::MetadataMap;
use tracing::{error, info, warn};

pub use keys::{KeyFileError, Keys, TenantLimits, hash_key};

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
        "the gateway's API key file does not load: every key is refused until its operator fixes it"
    )]
    KeyFileBroken,
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
    pub fn from_file(
        path: Option<&Path>,
        reload: Duration,
        keep_on_error: bool,
    ) -> Result<Callers, KeyFileError> {
        let Some(path) = path else {
            warn!(
                "no --api-keys: callers are not authenticated and choose their own tenant (local development only)"
            );
            return Ok(Callers::Open);
        };
        let ring = KeyRing::load(path.to_path_buf(), keep_on_error)?;
        specmesh_server::reload::every(
            &ring,
            reload,
            "the API key file changed but does not load: keeping the previous keys (--api-keys-keep-on-error)",
            KeyRing::reload,
        );
        Ok(Callers::Keys(ring))
    }

    /// Who is calling, from the call's metadata: checked before the
    /// request is admitted or even read.
    pub fn authenticate(&self, metadata: &MetadataMap) -> Result<Caller, AuthError> {
        let Callers::Keys(ring) = self else {
            return Ok(Caller::keyless());
        };
        let key = bearer(metadata)?;
        let (tenant, limits) = ring.tenant_of(key)?;
        Ok(Caller {
            tenant: Some(tenant),
            limits,
        })
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
/// configured) and the limits the key file gives that tenant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Caller {
    tenant: Option<String>,
    limits: TenantLimits,
}

impl Caller {
    /// A caller where no keys are configured: any tenant the request
    /// names, with the gateway's limits.
    pub fn keyless() -> Caller {
        Caller {
            tenant: None,
            limits: TenantLimits::default(),
        }
    }

    /// Its tenant's own limits (unset: the gateway's).
    pub fn limits(&self) -> TenantLimits {
        self.limits
    }

    /// The tenant the call runs as: the key's, else the one the request
    /// names. `requested` is the request's validated `tenant` (empty: none
    /// named).
    pub fn tenant(&self, requested: &str) -> Result<String, AuthError> {
        match &self.tenant {
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
    keep_on_error: bool,
    /// 1 while the file as last read loaded, 0 while every key is refused
    /// for it (`specmesh_gateway_api_key_file_loaded`).
    loaded: prometheus::IntGauge,
}

impl KeyRing {
    fn load(path: PathBuf, keep_on_error: bool) -> Result<Arc<KeyRing>, KeyFileError> {
        let bytes = read(&path)?;
        let keys = Keys::parse(&bytes).map_err(|e| e.in_file(&path))?;
        info!(path = %path.display(), keys = keys.len(), tenants = keys.tenants(), "API keys loaded");
        let loaded = prometheus::IntGauge::new(
            "specmesh_gateway_api_key_file_loaded",
            "1 while the API key file as last read loaded; 0 while every key is refused because it does not",
        )
        .expect("a valid metric");
        loaded.set(1);
        Ok(Arc::new(KeyRing {
            path,
            current: RwLock::new((bytes, keys)),
            keep_on_error,
            loaded,
        }))
    }

    /// The tenant `key` acts for, and its limits.
    fn tenant_of(&self, key: &str) -> Result<(String, TenantLimits), AuthError> {
        if self.loaded.get() == 0 {
            return Err(AuthError::KeyFileBroken);
        }
        let current = self.current.read().unwrap_or_else(|e| e.into_inner());
        let keys = &current.1;
        let tenant = keys.tenant_of(key).ok_or(AuthError::Unknown)?;
        Ok((tenant.to_string(), keys.limits_of(tenant)))
    }

    /// The gauge of whether the file loaded, for `/metrics`.
    pub fn loaded_gauge(&self) -> prometheus::IntGauge {
        self.loaded.clone()
    }

    /// Reads the file again; `Ok(true)` when it changed. A file that does
    /// not load refuses every key (see the module docs), or, with
    /// `--api-keys-keep-on-error`, is an `Err` and the keys stay.
    fn reload(&self) -> Result<bool, KeyFileError> {
        let loaded = read(&self.path).and_then(|bytes| {
            if self.loaded.get() == 1
                && self.current.read().unwrap_or_else(|e| e.into_inner()).0 == bytes
            {
                return Ok(None);
            }
            let keys = Keys::parse(&bytes).map_err(|e| e.in_file(&self.path))?;
            Ok(Some((bytes, keys)))
        });
        let (bytes, keys) = match loaded {
            Ok(None) => return Ok(false),
            Ok(Some(new)) => new,
            Err(e) if self.keep_on_error => return Err(e),
            Err(e) => {
                if self.loaded.get() == 1 {
                    error!(
                        error = %e,
                        "the API key file does not load: refusing every key until it does"
                    );
                }
                self.loaded.set(0);
                return Ok(true);
            }
        };
        info!(
            keys = keys.len(),
            tenants = keys.tenants(),
            "API keys reloaded"
        );
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = (bytes, keys);
        self.loaded.set(1);
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
        let callers = Callers::Keys(KeyRing::load(path.clone(), false).unwrap());
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
        // file refuses every key until it loads again.
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
        assert_eq!(ring.reload(), Ok(true));
        assert_eq!(ring.loaded_gauge().get(), 0);
        assert_eq!(
            tenant(&with_auth("Bearer key-c"), ""),
            Err(AuthError::KeyFileBroken)
        );
        std::fs::remove_file(&path).unwrap();
        assert_eq!(ring.reload(), Ok(true));
        assert_eq!(
            tenant(&with_auth("Bearer key-b"), ""),
            Err(AuthError::KeyFileBroken)
        );
        std::fs::write(&path, format!("{} team-b\n", hash_key("key-b"))).unwrap();
        assert_eq!(ring.reload(), Ok(true));
        assert_eq!(ring.loaded_gauge().get(), 1);
        assert_eq!(tenant(&with_auth("Bearer key-b"), ""), Ok("team-b".into()));
    }

    #[test]
    fn keep_on_error_keeps_the_last_keys_of_a_broken_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("keys");
        std::fs::write(&path, format!("{} team-a\n", hash_key("key-a"))).unwrap();
        let ring = KeyRing::load(path.clone(), true).unwrap();
        std::fs::write(&path, "sha256:zz team-d\n").unwrap();
        assert!(ring.reload().is_err());
        assert_eq!(ring.loaded_gauge().get(), 1);
        assert_eq!(ring.tenant_of("key-a").map(|(t, _)| t), Ok("team-a".into()));
    }

    #[test]
    fn without_keys_the_request_names_its_tenant() {
        let caller = Callers::Open.authenticate(&MetadataMap::new()).unwrap();
        assert_eq!(caller.tenant("t"), Ok("t".into()));
    }
}
