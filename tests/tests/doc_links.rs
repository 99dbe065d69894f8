//! Every relative link in the repository's Markdown leads somewhere: the
//! file (or folder) exists and, for `file#anchor` and `#anchor`, the file
//! has a heading of that anchor (GitHub's slugs). Links to the web are not
//! fetched: CI has no network for it, and they are not ours to keep.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .canonicalize()
        .unwrap()
}

/// Every `.md` file of the repository, build outputs and VCS data left out.
fn markdown_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_string_lossy();
        if path.is_dir() {
            if !matches!(&*name, "target" | ".git" | "node_modules") && !name.starts_with('.') {
                markdown_files(&path, out);
            }
        } else if name.ends_with(".md") {
            out.push(path);
        }
    }
}

/// The text outside fenced code blocks and inline code spans.
fn prose(text: &str) -> String {
    let mut out = String::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
            continue;
        }
        if fenced {
            continue;
        }
        // Inline code: drop what is between backticks.
        for (i, part) in line.split('`').enumerate() {
            if i % 2 == 0 {
                out.push_str(part);
            }
        }
        out.push('\n');
    }
    out
}

/// GitHub's anchor of a heading: lowercase, spaces to `-`, punctuation
/// other than `-` and `_` dropped.
fn slug(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter_map(|c| match c {
            ' ' => Some('-'),
            c if c.is_alphanumeric() || c == '-' || c == '_' => Some(c),
            _ => None,
        })
        .collect()
}

/// The anchors of `file`'s headings (a repeated heading's later anchors
/// get `-1`, `-2`, as on GitHub).
fn anchors(file: &Path) -> BTreeSet<String> {
    let text = std::fs::read_to_string(file).unwrap();
    let mut out = BTreeSet::new();
    let mut fenced = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if fenced {
            continue;
        }
        if let Some(heading) = line.strip_prefix('#') {
            let heading = heading.trim_start_matches('#');
            // Inline code and links keep their text in the anchor.
            let text: String = heading.replace('`', "");
            let base = slug(&text);
            let mut anchor = base.clone();
            let mut n = 0;
            while !out.insert(anchor.clone()) {
                n += 1;
                anchor = format!("{base}-{n}");
            }
        }
    }
    out
}

/// The targets of `[text](target)` links in `text`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = text;
    while let Some(i) = rest.find("](") {
        rest = &rest[i + 2..];
        let Some(end) = rest.find(')') else { break };
        let target = rest[..end].split_whitespace().next().unwrap_or("");
        out.push(target.trim_matches(|c| c == '<' || c == '>').to_string());
        rest = &rest[end..];
    }
    out
}

#[test]
fn every_relative_link_in_the_markdown_resolves() {
    let root = workspace();
    let mut files = Vec::new();
    markdown_files(&root, &mut files);
    files.sort();
    assert!(
        files.len() > 10,
        "found only {} Markdown files",
        files.len()
    );
    let mut broken = Vec::new();
    let mut checked = 0;
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        for target in links(&prose(&text)) {
            if target.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                continue;
            }
            checked += 1;
            let (path, anchor) = match target.split_once('#') {
                Some((p, a)) => (p, Some(a)),
                None => (target.as_str(), None),
            };
            let resolved = if path.is_empty() {
                file.clone()
            } else if let Some(abs) = path.strip_prefix('/') {
                root.join(abs)
            } else {
                file.parent().unwrap().join(path)
            };
            let shown = file.strip_prefix(&root).unwrap().display();
            if !resolved.exists() {
                broken.push(format!("{shown}: `{target}`: no such file"));
                continue;
            }
            if let Some(anchor) = anchor.filter(|_| resolved.is_file())
                && resolved.extension().is_some_and(|e| e == "md")
                && !anchors(&resolved).contains(anchor)
            {
                broken.push(format!("{shown}: `{target}`: no heading with that anchor"));
            }
        }
    }
    assert!(checked > 50, "checked only {checked} links");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn the_readme_stays_a_guide_of_at_most_300_lines() {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let lines = readme.lines().count();
    assert!(
        lines <= 300,
        "README.md has {lines} lines: move detail into docs/ and link it"
    );
}

#[test]
fn anchors_follow_githubs_slugs() {
    assert_eq!(slug("Quick start"), "quick-start");
    assert_eq!(
        slug("The drafter's compute, priced (v2)"),
        "the-drafters-compute-priced-v2"
    );
    assert_eq!(slug("`--log-format json`"), "--log-format-json");
    assert_eq!(
        links("see [a](docs/a.md#x) and [b](b.md \"title\") [c](https://x.y)"),
        ["docs/a.md#x", "b.md", "https://x.y"]
    );
}
