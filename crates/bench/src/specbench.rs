//! Spec-Bench question files: one JSON object per line with `question_id`,
//! `category` and `turns` (the first turn is the prompt we use).

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

#[derive(Clone, Debug, Deserialize)]
pub struct Question {
    pub question_id: serde_json::Value,
    pub category: String,
    pub turns: Vec<String>,
}

impl Question {
    pub fn id(&self) -> String {
        match &self.question_id {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        }
    }

    pub fn prompt(&self) -> &str {
        self.turns.first().map_or("", String::as_str)
    }

    /// The prompt's first fenced code block, fences included: what an edit
    /// request's answer mostly repeats.
    pub fn code_block(&self) -> Option<&str> {
        let p = self.prompt();
        let start = p.find("```")?;
        let body = start + 3 + p[start + 3..].find('\n')?;
        let end = body + p[body..].find("```")? + 3;
        Some(&p[start..end])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_code_block_is_the_first_fenced_one() {
        let q = Question {
            question_id: serde_json::json!("q"),
            category: "code-edit".into(),
            turns: vec![
                "Edit this.\n\n```python\ndef f():\n    return 1\n```\nThanks ```x```".into(),
            ],
        };
        assert_eq!(
            q.code_block(),
            Some("```python\ndef f():\n    return 1\n```")
        );
        let none = Question {
            turns: vec!["no code".into()],
            ..q
        };
        assert_eq!(none.code_block(), None);
    }
}

/// Where the project's shared benchmark questions live when run from a
/// checkout: `../shared/bench/spec_bench_dev.jsonl` beside the repository.
pub fn default_path() -> PathBuf {
    let beside_checkout =
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/bench/spec_bench_dev.jsonl");
    if beside_checkout.exists() {
        return beside_checkout;
    }
    PathBuf::from("../shared/bench/spec_bench_dev.jsonl")
}

/// `../shared/bench/code_dev.jsonl` beside the checkout, as
/// [`default_path`] finds the Spec-Bench file.
pub fn default_code_path() -> PathBuf {
    default_path().with_file_name("code_dev.jsonl")
}

/// Which questions to run.
#[derive(clap::Args, Debug, Clone)]
pub struct Selection {
    /// A Spec-Bench JSONL file (question_id, category, turns).
    #[arg(long, default_value_os_t = default_path())]
    pub questions: PathBuf,
    /// Only these categories (comma-separated; default: all).
    #[arg(long, value_delimiter = ',')]
    pub categories: Vec<String>,
    /// At most this many questions per category, in file order (0: all).
    #[arg(long, default_value_t = 4)]
    pub per_category: usize,
    /// At most this many per MT-bench category (writing, roleplay, ...;
    /// default: --per-category).
    #[arg(long)]
    pub mt_bench_per_category: Option<usize>,
}

/// Spec-Bench's MT-bench categories (the small ones, 5 questions each here).
pub const MT_BENCH: [&str; 8] = [
    "writing",
    "roleplay",
    "reasoning",
    "math",
    "coding",
    "extraction",
    "stem",
    "humanities",
];

impl Selection {
    pub fn load(&self) -> Result<Vec<Question>> {
        let all = read(&self.questions, "--questions")?;
        let mut taken: std::collections::HashMap<String, usize> = Default::default();
        let picked: Vec<Question> = all
            .into_iter()
            .filter(|q| self.categories.is_empty() || self.categories.contains(&q.category))
            .filter(|q| {
                let n = taken.entry(q.category.clone()).or_default();
                *n += 1;
                let cap = if MT_BENCH.contains(&q.category.as_str()) {
                    self.mt_bench_per_category.unwrap_or(self.per_category)
                } else {
                    self.per_category
                };
                cap == 0 || *n <= cap
            })
            .collect();
        if picked.is_empty() {
            bail!(
                "no question of {} matches the selection (categories {:?})",
                self.questions.display(),
                self.categories
            );
        }
        Ok(picked)
    }
}

/// Every question of the Spec-Bench JSONL file `path`, which `flag`
/// names, in file order.
pub fn read(path: &Path, flag: &str) -> Result<Vec<Question>> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "reading the questions file {} (pass {flag} PATH)",
            path.display()
        )
    })?;
    let mut all = Vec::new();
    for (n, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let q: Question = serde_json::from_str(line)
            .with_context(|| format!("{}:{}: not a Spec-Bench question", path.display(), n + 1))?;
        if q.prompt().is_empty() {
            bail!("{}:{}: the question has no turns", path.display(), n + 1);
        }
        all.push(q);
    }
    Ok(all)
}
