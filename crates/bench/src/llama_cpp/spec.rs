//! llama.cpp's speculative configurations, as `--peer-spec` names them: one
//! value is one `llama-server`, with llama.cpp's own `--spec-type` list
//! (comma-separated types mix in one server, as llama.cpp's flag does:
//! `ngram-simple,draft-simple`), and the draft-model types' settings after
//! a colon (`draft-simple:N_MAX[:P_MIN[:N_MIN]]`).

use std::path::{Path, PathBuf};

use anyhow::{Result, bail};

/// The speculation types of llama.cpp build 11434 (`--spec-type`).
const TYPES: [&str; 10] = [
    "draft-simple",
    "draft-eagle3",
    "draft-mtp",
    "draft-dflash",
    "draft-dspark",
    "ngram-simple",
    "ngram-map-k",
    "ngram-map-k4v",
    "ngram-mod",
    "ngram-cache",
];

/// `--spec-draft-n-max`, `-p-min`, `-n-min` of the draft-model types
/// (`None`: llama.cpp's default).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DraftSettings {
    pub n_max: Option<u32>,
    pub p_min: Option<f32>,
    pub n_min: Option<u32>,
}

/// What one peer server runs.
#[derive(Clone, Debug, PartialEq)]
pub struct PeerSpec {
    /// llama.cpp's `--spec-type` list, in the order given; empty: plain
    /// decoding.
    pub types: Vec<&'static str>,
    /// The draft model, when a type needs one.
    pub draft_model: Option<PathBuf>,
    pub draft: DraftSettings,
}

impl PeerSpec {
    /// Plain decoding, no speculation.
    pub fn plain() -> PeerSpec {
        PeerSpec {
            types: Vec::new(),
            draft_model: None,
            draft: DraftSettings::default(),
        }
    }

    /// A `--peer-spec` value: llama.cpp `--spec-type`s separated by commas,
    /// `draft-simple` (or `draft`, the older name) optionally with
    /// `:N_MAX[:P_MIN[:N_MIN]]`, or `none` (plain decoding). A draft-model
    /// type needs `draft_model`.
    pub fn parse(spec: &str, draft_model: Option<&Path>) -> Result<PeerSpec> {
        if spec.trim() == "none" {
            return Ok(PeerSpec::plain());
        }
        let usage = "use llama.cpp's --spec-type names separated by commas (ngram-simple, ngram-mod, \
             draft-simple, …), draft-simple optionally as draft-simple:N_MAX[:P_MIN[:N_MIN]]";
        let mut out = PeerSpec::plain();
        for item in spec.split(',').map(str::trim) {
            let (name, settings) = match item.split_once(':') {
                Some((n, s)) => (n, Some(s)),
                None => (item, None),
            };
            let name = if name == "draft" {
                "draft-simple"
            } else {
                name
            };
            let Some(&known) = TYPES.iter().find(|&&t| t == name) else {
                bail!(
                    "--peer-spec `{spec}`: `{item}` is not a llama.cpp speculation type; {usage}"
                );
            };
            if out.types.contains(&known) {
                bail!("--peer-spec `{spec}`: `{known}` is listed twice");
            }
            if let Some(settings) = settings {
                if known != "draft-simple" {
                    bail!("--peer-spec `{spec}`: only draft-simple takes settings; {usage}");
                }
                out.draft = draft_settings(settings)
                    .ok_or_else(|| anyhow::anyhow!("--peer-spec `{spec}`: {usage}"))?;
            }
            out.types.push(known);
        }
        if out.types.iter().any(|t| t.starts_with("draft-")) {
            let Some(model) = draft_model else {
                bail!(
                    "--peer-spec `{spec}` needs a draft model (--peer-draft-model or --draft-model)"
                );
            };
            out.draft_model = Some(model.to_path_buf());
        }
        Ok(out)
    }

    /// The name in tables: `llama.cpp`, `llama.cpp ngram-mod`,
    /// `llama.cpp ngram-simple,draft-simple n16 p0.9`.
    pub fn name(&self) -> String {
        if self.types.is_empty() {
            return "llama.cpp".into();
        }
        let mut s = format!("llama.cpp {}", self.types.join(","));
        let d = &self.draft;
        if let Some(n) = d.n_max {
            s += &format!(" n{n}");
        }
        if let Some(p) = d.p_min {
            s += &format!(" p{p}");
        }
        if let Some(n) = d.n_min {
            s += &format!(" min{n}");
        }
        s
    }

    /// `llama-server`'s flags for it; the draft model computes on `threads`.
    pub fn args(&self, threads: usize) -> Vec<String> {
        if self.types.is_empty() {
            return Vec::new();
        }
        let mut a = vec!["--spec-type".into(), self.types.join(",")];
        if let Some(model) = &self.draft_model {
            a.extend([
                "-md".into(),
                model.display().to_string(),
                "-td".into(),
                threads.to_string(),
                "-tbd".into(),
                threads.to_string(),
            ]);
        }
        let d = &self.draft;
        if let Some(n) = d.n_max {
            a.extend(["--spec-draft-n-max".into(), n.to_string()]);
        }
        if let Some(p) = d.p_min {
            a.extend(["--spec-draft-p-min".into(), p.to_string()]);
        }
        if let Some(n) = d.n_min {
            a.extend(["--spec-draft-n-min".into(), n.to_string()]);
        }
        a
    }
}

/// The default configurations `--peer` runs besides plain decoding: the
/// model-free `ngram-simple` and `ngram-mod`, and with a draft model
/// `draft-simple` and its mix with `ngram-simple`.
pub fn defaults(draft_model: Option<&Path>) -> Vec<PeerSpec> {
    let mut specs = vec!["ngram-simple", "ngram-mod"];
    if draft_model.is_some() {
        specs.extend(["draft-simple", "ngram-simple,draft-simple"]);
    }
    specs
        .into_iter()
        .map(|s| PeerSpec::parse(s, draft_model).expect("the defaults parse"))
        .collect()
}

/// `N_MAX[:P_MIN[:N_MIN]]`.
fn draft_settings(s: &str) -> Option<DraftSettings> {
    let mut parts = s.split(':');
    let n_max = Some(parts.next()?.parse().ok()?);
    let p_min = parts.next().map(|p| p.parse::<f32>()).transpose().ok()?;
    let n_min = parts.next().map(|n| n.parse::<u32>()).transpose().ok()?;
    if parts.next().is_some() || p_min.is_some_and(|p| !(0.0..=1.0).contains(&p)) {
        return None;
    }
    Some(DraftSettings {
        n_max,
        p_min,
        n_min,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn none_is_plain_decoding() {
        assert_eq!(PeerSpec::parse("none", None).unwrap(), PeerSpec::plain());
        assert!(PeerSpec::plain().args(2).is_empty());
        assert_eq!(PeerSpec::plain().name(), "llama.cpp");
    }

    #[test]
    fn model_free_types_and_their_mixes_parse_in_order() {
        let s = PeerSpec::parse("ngram-mod", None).unwrap();
        assert_eq!(s.types, ["ngram-mod"]);
        assert_eq!(s.args(2), ["--spec-type", "ngram-mod"]);
        assert_eq!(s.name(), "llama.cpp ngram-mod");
        let mix = PeerSpec::parse("ngram-simple, ngram-map-k4v", None).unwrap();
        assert_eq!(mix.types, ["ngram-simple", "ngram-map-k4v"]);
        assert_eq!(mix.args(2), ["--spec-type", "ngram-simple,ngram-map-k4v"]);
    }

    #[test]
    fn draft_types_need_a_draft_model_and_take_settings() {
        let e = PeerSpec::parse("ngram-simple,draft-simple", None).unwrap_err();
        assert!(e.to_string().contains("draft model"), "{e}");
        let model = Path::new("/m/draft.gguf");
        let s = PeerSpec::parse("ngram-simple,draft-simple:16:0.9", Some(model)).unwrap();
        assert_eq!(s.types, ["ngram-simple", "draft-simple"]);
        assert_eq!(s.name(), "llama.cpp ngram-simple,draft-simple n16 p0.9");
        let args = s.args(2).join(" ");
        assert!(args.starts_with("--spec-type ngram-simple,draft-simple -md /m/draft.gguf"));
        assert!(
            args.contains("--spec-draft-n-max 16 --spec-draft-p-min 0.9"),
            "{args}"
        );
        // The older name still works.
        let old = PeerSpec::parse("draft:8:0.6:2", Some(model)).unwrap();
        assert_eq!(old.types, ["draft-simple"]);
        assert_eq!(old.draft.n_min, Some(2));
        assert!(
            PeerSpec::parse("ngram-mod", Some(model))
                .unwrap()
                .draft_model
                .is_none()
        );
    }

    #[test]
    fn bad_specs_are_refused_saying_what_to_fix() {
        for bad in [
            "",
            "ngram",
            "ngram-mod:4",
            "draft-simple:x",
            "draft-simple:4:1.5",
            "draft-simple:1:0.5:2:3",
            "ngram-mod,ngram-mod",
        ] {
            let e = PeerSpec::parse(bad, Some(Path::new("d.gguf"))).unwrap_err();
            assert!(e.to_string().contains("--peer-spec"), "{bad}: {e}");
        }
    }

    #[test]
    fn the_defaults_add_the_draft_model_and_the_mix_when_there_is_one() {
        let names = |d| defaults(d).iter().map(PeerSpec::name).collect::<Vec<_>>();
        assert_eq!(
            names(None),
            ["llama.cpp ngram-simple", "llama.cpp ngram-mod"]
        );
        assert_eq!(
            names(Some(Path::new("d.gguf"))),
            [
                "llama.cpp ngram-simple",
                "llama.cpp ngram-mod",
                "llama.cpp draft-simple",
                "llama.cpp ngram-simple,draft-simple",
            ]
        );
    }
}
