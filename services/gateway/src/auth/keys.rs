//! The API key file: parsing and lookup. Pure: no I/O, unit-tested.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

/// A key file that cannot be used; the message says where and why.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum KeyFileError {
    #[error("`{}`: cannot read it: {reason}", path.display())]
    Read { path: PathBuf, reason: String },
    #[error("{}line {line}: {reason}", path.as_ref().map(|p| format!("`{}` ", p.display())).unwrap_or_default())]
    Line {
        path: Option<PathBuf>,
        line: usize,
        reason: String,
    },
}

impl KeyFileError {
    /// The error, naming the file it came from.
    pub fn in_file(self, file: &Path) -> KeyFileError {
        match self {
            KeyFileError::Line { line, reason, .. } => KeyFileError::Line {
                path: Some(file.to_path_buf()),
                line,
                reason,
            },
            other => other,
        }
    }
}

/// The keys' hashes and their tenants, and the tenants' own limits.
#[derive(Debug, Clone, Default)]
pub struct Keys {
    by_hash: HashMap<[u8; 32], String>,
    limits: HashMap<String, TenantLimits>,
}

/// A tenant's own limits, from the optional `key=value` fields of its key
/// lines (`concurrent=8 tpm=200000`); an unset one is the gateway's
/// `--tenant-max-concurrent` / `--tenant-tokens-per-minute`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TenantLimits {
    /// Requests running at once.
    pub concurrent: Option<usize>,
    /// Tokens (prompt and generated) per minute.
    pub tokens_per_minute: Option<u64>,
}

/// The fields a key line may carry after its tenant.
const LIMIT_FIELDS: &str = "concurrent, tpm";

impl TenantLimits {
    /// Parses `key=value` fields; refuses unknown ones by name.
    fn parse<'a>(fields: impl Iterator<Item = &'a str>) -> Result<TenantLimits, String> {
        let mut limits = TenantLimits::default();
        for field in fields {
            let Some((key, value)) = field.split_once('=') else {
                return Err(format!(
                    "`{field}` is not a `key=value` limit (known: {LIMIT_FIELDS})"
                ));
            };
            let number = || -> Result<u64, String> {
                match value.parse::<u64>() {
                    Ok(n) if n > 0 => Ok(n),
                    _ => Err(format!(
                        "`{key}` must be a whole number above 0, got `{value}`"
                    )),
                }
            };
            let slot_taken = match key {
                "concurrent" => limits.concurrent.replace(number()? as usize).is_some(),
                "tpm" => limits.tokens_per_minute.replace(number()?).is_some(),
                other => {
                    return Err(format!("unknown field `{other}` (known: {LIMIT_FIELDS})"));
                }
            };
            if slot_taken {
                return Err(format!("`{key}` is given twice"));
            }
        }
        Ok(limits)
    }
}

/// Longest tenant name, as the request's `tenant` field allows.
const MAX_TENANT_BYTES: usize = 128;

/// The line a key file holds for `key`: `sha256:HEX`.
pub fn hash_key(key: &str) -> String {
    format!("sha256:{}", hex(&Sha256::digest(key.as_bytes())))
}

impl Keys {
    /// Parses `sha256:HEX TENANT [concurrent=N] [tpm=N]` lines; `#` starts
    /// a comment, blank lines are skipped. A hash listed twice is an error
    /// (which tenant would it be?); one tenant may have many keys
    /// (rotation), and its limits may be on any of its lines, but the same
    /// wherever given.
    pub fn parse(text: &[u8]) -> Result<Keys, KeyFileError> {
        let text = std::str::from_utf8(text).map_err(|e| KeyFileError::Line {
            path: None,
            line: 1 + text[..e.valid_up_to()]
                .iter()
                .filter(|&&b| b == b'\n')
                .count(),
            reason: "not UTF-8".into(),
        })?;
        let mut by_hash = HashMap::new();
        let mut limits: HashMap<String, (TenantLimits, usize)> = HashMap::new();
        for (i, raw) in text.lines().enumerate() {
            let bad = |reason: String| KeyFileError::Line {
                path: None,
                line: i + 1,
                reason,
            };
            let line = raw.split('#').next().unwrap_or_default().trim();
            if line.is_empty() {
                continue;
            }
            let mut fields = line.split_whitespace();
            let (Some(hash), Some(tenant)) = (fields.next(), fields.next()) else {
                return Err(bad(
                    "expected `sha256:HEX TENANT [concurrent=N] [tpm=N]`".into()
                ));
            };
            let hash = parse_hash(hash).map_err(bad)?;
            check_tenant(tenant).map_err(bad)?;
            let own = TenantLimits::parse(fields).map_err(bad)?;
            if own != TenantLimits::default() {
                match limits.get(tenant) {
                    Some((earlier, line)) if *earlier != own => {
                        return Err(bad(format!(
                            "tenant `{tenant}` has other limits on line {line}; give them once, \
                             or the same on every line"
                        )));
                    }
                    _ => {
                        limits.insert(tenant.to_string(), (own, i + 1));
                    }
                }
            }
            if by_hash.insert(hash, tenant.to_string()).is_some() {
                return Err(bad("this key is listed twice".into()));
            }
        }
        Ok(Keys {
            by_hash,
            limits: limits.into_iter().map(|(t, (l, _))| (t, l)).collect(),
        })
    }

    /// The limits the key file gives `tenant` (unset fields: the gateway's).
    pub fn limits_of(&self, tenant: &str) -> TenantLimits {
        self.limits.get(tenant).copied().unwrap_or_default()
    }

    /// The tenant `key` acts for, if it is listed.
    pub fn tenant_of(&self, key: &str) -> Option<&str> {
        let hash: [u8; 32] = Sha256::digest(key.as_bytes()).into();
        self.by_hash.get(&hash).map(String::as_str)
    }

    pub fn len(&self) -> usize {
        self.by_hash.len()
    }

    pub fn is_empty(&self) -> bool {
        self.by_hash.is_empty()
    }

    /// How many tenants the keys act for.
    pub fn tenants(&self) -> usize {
        self.by_hash.values().collect::<HashSet<_>>().len()
    }
}

fn parse_hash(field: &str) -> Result<[u8; 32], String> {
    let Some(hex) = field.strip_prefix("sha256:") else {
        return Err(format!(
            "`{field}` is not `sha256:HEX` (the file holds hashes of keys; `specmesh api-key hash` makes one)"
        ));
    };
    if !hex.is_ascii() || hex.len() != 64 {
        return Err(format!(
            "a SHA-256 hash has 64 hex digits, got {}",
            hex.len()
        ));
    }
    let mut out = [0u8; 32];
    for (i, byte) in out.iter_mut().enumerate() {
        *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16)
            .map_err(|_| format!("`{hex}` is not hexadecimal"))?;
    }
    Ok(out)
}

fn check_tenant(tenant: &str) -> Result<(), String> {
    if tenant.len() > MAX_TENANT_BYTES {
        return Err(format!(
            "a tenant has at most {MAX_TENANT_BYTES} bytes, got {}",
            tenant.len()
        ));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | ':' | '-');
    if let Some(c) = tenant.chars().find(|&c| !allowed(c)) {
        return Err(format!(
            "tenant `{tenant}` may only hold A-Z, a-z, 0-9, '.', '_', ':' and '-', got {c:?}"
        ));
    }
    Ok(())
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_map_hashes_to_tenants() {
        let text = format!(
            "# keys\n\n{}  team-a   # rotated in May\n{} team-a\n{} team-b\n",
            hash_key("k1"),
            hash_key("k2"),
            hash_key("k3")
        );
        let keys = Keys::parse(text.as_bytes()).unwrap();
        assert_eq!((keys.len(), keys.tenants()), (3, 2));
        assert_eq!(keys.tenant_of("k1"), Some("team-a"));
        assert_eq!(keys.tenant_of("k3"), Some("team-b"));
        assert_eq!(keys.tenant_of("k4"), None);
        assert_eq!(
            hash_key("test"),
            "sha256:9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"
        );
    }

    #[test]
    fn bad_lines_are_named() {
        let err = |text: &str| Keys::parse(text.as_bytes()).unwrap_err().to_string();
        assert_eq!(
            err("\nplainkey team-a\n"),
            "line 2: `plainkey` is not `sha256:HEX` (the file holds hashes of keys; `specmesh api-key hash` makes one)"
        );
        assert_eq!(
            err("sha256:abc team"),
            "line 1: a SHA-256 hash has 64 hex digits, got 3"
        );
        assert!(
            err(&format!("{} team a", hash_key("k"))).contains("`a` is not a `key=value` limit")
        );
        assert!(err(&hash_key("k")).contains("expected `sha256:HEX TENANT"));
        assert!(err(&format!("{} té", hash_key("k"))).contains("may only hold"));
        assert!(
            err(&format!("{0} a\n{0} b", hash_key("k")))
                .contains("line 2: this key is listed twice")
        );
        let named = Keys::parse(b"x y").unwrap_err().in_file(Path::new("/keys"));
        assert!(named.to_string().starts_with("`/keys` line 1:"), "{named}");
    }

    #[test]
    fn lines_may_give_their_tenants_limits() {
        let text = format!(
            "{} team-a concurrent=8 tpm=200000\n{} team-a\n{} team-b tpm=5000\n{} team-c\n",
            hash_key("k1"),
            hash_key("k2"),
            hash_key("k3"),
            hash_key("k4")
        );
        let keys = Keys::parse(text.as_bytes()).unwrap();
        assert_eq!(
            keys.limits_of("team-a"),
            TenantLimits {
                concurrent: Some(8),
                tokens_per_minute: Some(200_000)
            }
        );
        assert_eq!(keys.limits_of("team-b").tokens_per_minute, Some(5000));
        assert_eq!(keys.limits_of("team-b").concurrent, None);
        assert_eq!(keys.limits_of("team-c"), TenantLimits::default());
        assert_eq!(keys.tenant_of("k2"), Some("team-a"));
    }

    #[test]
    fn bad_limits_are_named() {
        let err = |fields: &str| {
            Keys::parse(format!("{} t {fields}", hash_key("k")).as_bytes())
                .unwrap_err()
                .to_string()
        };
        assert_eq!(
            err("rpm=5"),
            "line 1: unknown field `rpm` (known: concurrent, tpm)"
        );
        assert!(err("tpm=0").contains("`tpm` must be a whole number above 0"));
        assert!(err("tpm=-1").contains("above 0"));
        assert!(err("concurrent=2 concurrent=3").contains("`concurrent` is given twice"));
        let conflict = Keys::parse(
            format!("{} t tpm=5\n{} t tpm=6\n", hash_key("a"), hash_key("b")).as_bytes(),
        )
        .unwrap_err()
        .to_string();
        assert!(
            conflict.contains("line 2: tenant `t` has other limits on line 1"),
            "{conflict}"
        );
    }
}
