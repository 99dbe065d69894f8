//! The GGUF `tokenizer.ggml.pre` table: which regex splits run before BPE for
//! each pre-tokenizer name, mirroring llama.cpp's `llama-vocab.cpp`.
//!
//! llama.cpp keeps some GPT-2 style regexes without the trailing `|\s+`
//! alternative because its hand-written GPT-2 splitter implements that branch
//! anyway; here they are written out in full so that `fancy-regex` (which
//! runs them literally) splits identically.

/// The GPT-2 split regex, with the `\s+` fallback llama.cpp's custom splitter applies.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// Llama 3's regex (llama.cpp spells the case-insensitive contractions out).
const LLAMA3: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

/// Qwen 2's regex: Llama 3's with single digits.
const QWEN2: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const GPT4O: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const TEKKEN: &str = r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+";

const DEEPSEEK3_WORDS: &str = r##"[!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"##;

const BLOOM: &str = r" ?[^(\s|.,!?…。，、।۔،)]+";

/// How a BPE vocabulary splits text before merging.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct PreTokenizerSpec {
    /// Regexes applied in sequence; every match and every gap becomes a piece.
    pub regexes: Vec<&'static str>,
    /// Look a whole pre-token up in the vocabulary before running merges (Llama 3).
    pub ignore_merges: bool,
    /// llama.cpp's default for `add_bos_token` when the metadata leaves it out.
    pub default_add_bos: bool,
    /// Set when the name was not recognised and GPT-2 splitting was used instead.
    pub warning: Option<String>,
}

impl PreTokenizerSpec {
    fn new(regexes: Vec<&'static str>) -> Self {
        Self {
            regexes,
            ignore_merges: false,
            default_add_bos: false,
            warning: None,
        }
    }

    fn llama3_like(regexes: Vec<&'static str>) -> Self {
        Self {
            ignore_merges: true,
            default_add_bos: true,
            ..Self::new(regexes)
        }
    }
}

/// Resolve a `tokenizer.ggml.pre` value (`None` when the key is absent).
pub(crate) fn lookup(pre: Option<&str>) -> PreTokenizerSpec {
    let Some(name) = pre else {
        let mut spec = default_spec();
        spec.warning = Some(
            "gguf metadata key `tokenizer.ggml.pre` is missing: using llama.cpp's default \
             pre-tokenizer; tokenization may not match the original model"
                .to_owned(),
        );
        return spec;
    };
    match name {
        "" | "default" => default_spec(),
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "falcon-h1" | "pixtral" | "midm-2.0"
        | "lfm2" | "jina-v5-nano" => PreTokenizerSpec::llama3_like(vec![LLAMA3]),
        "dbrx" | "smaug-bpe" | "chatglm-bpe" | "glm4" => PreTokenizerSpec::new(vec![LLAMA3]),
        "tekken" => PreTokenizerSpec::llama3_like(vec![TEKKEN]),
        "qwen2" | "deepseek-r1-qwen" | "kormo" | "f2llmv2" | "megrez" | "stablelm2" | "hunyuan"
        | "solar-open" => PreTokenizerSpec::new(vec![QWEN2]),
        "starcoder" | "refact" | "command-r" | "smollm" | "codeshell" | "exaone" | "minerva-7b"
        | "mellum2" => PreTokenizerSpec::new(vec![r"\p{N}", GPT2]),
        "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" | "trillion" | "granite-docling"
        | "jina-es" | "jina-de" | "gigachat" | "jina-v2-es" | "jina-v2-de" | "a.x-4.0"
        | "mellum" | "modern-bert" | "exaone4" | "jina-v1-en" | "jina-v2-code" | "roberta-bpe" => {
            PreTokenizerSpec::new(vec![GPT2])
        }
        "falcon" => PreTokenizerSpec::new(vec![r"[\p{P}\$\+<=>\^~\|`]+", GPT2, "[0-9][0-9][0-9]"]),
        "deepseek-coder" => PreTokenizerSpec::new(vec![
            r"[\r\n]",
            r"\s?\p{L}+",
            r"\s?\p{P}+",
            "[一-龥ࠀ-一가-퟿]+",
            r"\p{N}",
        ]),
        "deepseek-v3" | "hunyuan-dense" | "joyai-llm" => {
            PreTokenizerSpec::new(vec![r"\p{N}{1,3}", "[一-龥぀-ゟ゠-ヿ]+", DEEPSEEK3_WORDS])
        }
        "gpt-4o" | "llama4" | "kanana2" | "minimax-m2" => PreTokenizerSpec::new(vec![GPT4O]),
        "poro-chat" | "bloom" | "gpt3-finnish" => PreTokenizerSpec::new(vec![BLOOM]),
        "viking" => PreTokenizerSpec::new(vec![BLOOM, r"\p{N}"]),
        other => {
            let mut spec = PreTokenizerSpec::new(vec![GPT2]);
            spec.warning = Some(format!(
                "gguf metadata key `tokenizer.ggml.pre` has unknown value `{other}`: falling back \
                 to gpt-2 splitting; tokenization may not match the original model"
            ));
            spec
        }
    }
}

/// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_DEFAULT` regex list.
fn default_spec() -> PreTokenizerSpec {
    PreTokenizerSpec::new(vec![
        r"[\p{P}\$\+<=>\^~\|]+",
        GPT2,
        r"\p{N}+",
        "[0-9][0-9][0-9]",
    ])
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokenizers::SplitDelimiterBehavior;
    use tokenizers::pre_tokenizers::split::{Split, SplitPattern};

    #[test]
    fn smollm_splits_digits_then_gpt2() {
        let spec = lookup(Some("smollm"));
        assert_eq!(spec.regexes, vec![r"\p{N}", GPT2]);
        assert!(!spec.ignore_merges);
        assert!(spec.warning.is_none());
    }

    #[test]
    fn unknown_name_falls_back_with_a_warning() {
        let spec = lookup(Some("brand-new"));
        assert_eq!(spec.regexes, vec![GPT2]);
        assert!(spec.warning.unwrap().contains("`brand-new`"));
    }

    #[test]
    fn every_regex_compiles() {
        let names = [
            None,
            Some("llama3"),
            Some("dbrx"),
            Some("tekken"),
            Some("qwen2"),
            Some("smollm"),
            Some("gpt-2"),
            Some("falcon"),
            Some("deepseek-coder"),
            Some("deepseek-v3"),
            Some("gpt-4o"),
            Some("bloom"),
            Some("viking"),
        ];
        for name in names {
            for re in lookup(name).regexes {
                let pattern = SplitPattern::Regex(re.to_owned());
                let split = Split::new(pattern, SplitDelimiterBehavior::Isolated, false);
                assert!(split.is_ok(), "{name:?}: {re}");
            }
        }
    }
}
