//! SHA-256 of model files: `specmesh model fetch` checks every download
//! against the catalog's, and each service's `--model-sha256` checks the
//! file it is about to load, so a pod that mounts models from a volume or
//! an image it did not fetch itself still refuses a wrong or changed file.

use std::fmt;
use std::io::Read;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use sha2::{Digest, Sha256 as Hasher};

/// A SHA-256 digest, written as 64 hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct Sha256([u8; 32]);

impl fmt::Display for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.iter().try_for_each(|b| write!(f, "{b:02x}"))
    }
}

impl fmt::Debug for Sha256 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Sha256({self})")
    }
}

/// Text that is not a SHA-256 digest.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("`{0}` is not a SHA-256 digest: expected 64 hex digits (as `sha256sum` prints them)")]
pub struct NotADigest(pub String);

impl FromStr for Sha256 {
    type Err = NotADigest;

    /// 64 hex digits, either case, optionally prefixed `sha256:`.
    fn from_str(s: &str) -> Result<Sha256, NotADigest> {
        let hex = s.trim();
        let hex = hex.strip_prefix("sha256:").unwrap_or(hex);
        let bad = || NotADigest(s.to_string());
        if hex.len() != 64 || !hex.is_ascii() {
            return Err(bad());
        }
        let mut out = [0u8; 32];
        for (i, byte) in out.iter_mut().enumerate() {
            *byte = u8::from_str_radix(&hex[2 * i..2 * i + 2], 16).map_err(|_| bad())?;
        }
        Ok(Sha256(out))
    }
}

/// Why a model file was refused.
#[derive(Debug, thiserror::Error)]
pub enum DigestError {
    #[error("cannot read {}: {source}", path.display())]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{} is a directory: a SHA-256 checks one model file (a GGUF); leave the digest unset for a \
         Hugging Face directory",
        path.display()
    )]
    Directory { path: PathBuf },
    #[error(
        "{} has SHA-256 {actual}, not the {expected} it must have: the file is not the model \
         expected (a wrong or changed volume or image?); fix the file or the digest",
        path.display()
    )]
    Mismatch {
        path: PathBuf,
        expected: Sha256,
        actual: Sha256,
    },
}

/// The SHA-256 of everything `reader` yields.
pub fn of_reader(mut reader: impl Read) -> std::io::Result<Sha256> {
    let mut hasher = Hasher::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        match reader.read(&mut buf) {
            Ok(0) => return Ok(Sha256(hasher.finalize().into())),
            Ok(n) => hasher.update(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
}

/// The SHA-256 of the file at `path`.
pub fn of_file(path: &Path) -> Result<Sha256, DigestError> {
    let read = |source| DigestError::Read {
        path: path.to_path_buf(),
        source,
    };
    if path.is_dir() {
        return Err(DigestError::Directory {
            path: path.to_path_buf(),
        });
    }
    of_reader(std::fs::File::open(path).map_err(read)?).map_err(read)
}

/// Checks that the file at `path` has the digest `expected`.
pub fn check_file(path: &Path, expected: &Sha256) -> Result<(), DigestError> {
    let actual = of_file(path)?;
    if actual == *expected {
        Ok(())
    } else {
        Err(DigestError::Mismatch {
            path: path.to_path_buf(),
            expected: *expected,
            actual,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMPTY: &str = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

    #[test]
    fn parses_and_prints_hex() {
        let d: Sha256 = EMPTY.parse().unwrap();
        assert_eq!(d.to_string(), EMPTY);
        let upper: Sha256 = EMPTY.to_uppercase().parse().unwrap();
        assert_eq!(upper, d);
        let prefixed: Sha256 = format!("sha256:{EMPTY}").parse().unwrap();
        assert_eq!(prefixed, d);
        for bad in [
            "",
            "abc",
            &EMPTY[1..],
            &format!("{EMPTY}0"),
            &EMPTY.replace('e', "g"),
            "é".repeat(32).as_str(),
        ] {
            let e = bad.parse::<Sha256>().unwrap_err();
            assert!(e.to_string().contains("64 hex digits"), "{e}");
        }
    }

    #[test]
    fn checks_a_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("m.gguf");
        std::fs::write(&path, b"").unwrap();
        check_file(&path, &EMPTY.parse().unwrap()).unwrap();
        std::fs::write(&path, b"abc").unwrap();
        let e = check_file(&path, &EMPTY.parse().unwrap()).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("m.gguf") && msg.contains(EMPTY), "{msg}");
        assert!(
            msg.contains("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"),
            "{msg}"
        );
        assert!(matches!(
            check_file(dir.path(), &EMPTY.parse().unwrap()),
            Err(DigestError::Directory { .. })
        ));
        assert!(matches!(
            check_file(&dir.path().join("absent"), &EMPTY.parse().unwrap()),
            Err(DigestError::Read { .. })
        ));
    }
}
