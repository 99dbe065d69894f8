//! No import cycles between files: in every library of the workspace
//! (`crates/*/src`, `services/*/src`, `tests/src`), the graph whose nodes
//! are source files and whose edges are the `crate::…`, `super::…` and
//! `self::…` paths a file names (in `use` or inline) has no cycle. A file
//! may use its parent's items and its children's, but not both ways round:
//! one of the two has to be lower.
//!
//! Edges into the crate root follow its re-exports (`pub use a::B` in
//! `lib.rs` makes `crate::B` an edge to `a.rs`); the root's own
//! declarations are not edges, since every module hangs from it.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// A library's files by module path (`[]` is the root).
type Modules = BTreeMap<Vec<String>, PathBuf>;

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The library source trees: every `src/lib.rs`.
fn libraries() -> Vec<PathBuf> {
    let root = workspace();
    let mut out = vec![root.join("tests/src")];
    for group in ["crates", "services"] {
        let mut dirs: Vec<PathBuf> = std::fs::read_dir(root.join(group))
            .unwrap()
            .map(|e| e.unwrap().path().join("src"))
            .filter(|src| src.join("lib.rs").exists())
            .collect();
        dirs.sort();
        out.extend(dirs);
    }
    out
}

fn modules(src: &Path) -> Modules {
    let mut out = Modules::new();
    let mut stack = vec![src.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for e in std::fs::read_dir(&dir).unwrap() {
            let path = e.unwrap().path();
            if path.is_dir() {
                stack.push(path);
                continue;
            }
            if path.extension().is_none_or(|x| x != "rs") {
                continue;
            }
            let rel = path.strip_prefix(src).unwrap();
            let mut parts: Vec<String> = rel
                .iter()
                .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
                .collect();
            match parts.last().map(String::as_str) {
                Some("lib") if parts.len() == 1 => parts.clear(),
                Some("main") if parts.len() == 1 => continue,
                Some("mod") => {
                    parts.pop();
                }
                _ => {}
            }
            out.insert(parts, path);
        }
    }
    out
}

/// The source without comments, string and char literals (their text
/// could look like paths).
fn code_of(text: &str) -> String {
    let b = text.as_bytes();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            while i < b.len() && b[i] != b'\n' {
                i += 1;
            }
        } else if b[i..].starts_with(b"/*") {
            let mut depth = 0;
            while i < b.len() {
                if b[i..].starts_with(b"/*") {
                    depth += 1;
                    i += 2;
                } else if b[i..].starts_with(b"*/") {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
        } else if b[i] == b'r' && (b[i..].starts_with(b"r\"") || b[i..].starts_with(b"r#")) {
            let hashes = b[i + 1..].iter().take_while(|&&c| c == b'#').count();
            if b.get(i + 1 + hashes) != Some(&b'"') {
                out.push('r');
                i += 1;
                continue;
            }
            let close: Vec<u8> = std::iter::once(b'"')
                .chain(std::iter::repeat_n(b'#', hashes))
                .collect();
            i += 2 + hashes;
            while i < b.len() && !b[i..].starts_with(&close) {
                i += 1;
            }
            i += close.len();
            out.push_str("\"\"");
        } else if b[i] == b'"' {
            i += 1;
            while i < b.len() && b[i] != b'"' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("\"\"");
        } else if b[i] == b'\'' && is_char_literal(&b[i..]) {
            i += 1;
            while i < b.len() && b[i] != b'\'' {
                i += if b[i] == b'\\' { 2 } else { 1 };
            }
            i += 1;
            out.push_str("' '");
        } else {
            out.push(b[i] as char);
            i += 1;
        }
    }
    out
}

/// `'x'`, `'\n'`, `'\u{..}'` rather than a lifetime `'a`.
fn is_char_literal(b: &[u8]) -> bool {
    match b.get(1) {
        Some(b'\\') => true,
        Some(_) => {
            let n = b[1..].iter().take(5).position(|&c| c == b'\'');
            n.is_some_and(|n| {
                n > 0 && std::str::from_utf8(&b[1..1 + n]).is_ok_and(|s| s.chars().count() == 1)
            })
        }
        None => false,
    }
}

fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// Every path the code names from `crate`, `super` or `self`, as the
/// segments after it, with how many inline `mod x { … }` blocks it sits in
/// (`super` inside one is the file's own module).
fn paths(code: &str) -> Vec<(String, usize, Vec<String>)> {
    let b = code.as_bytes();
    let mut out = Vec::new();
    let mut inline: Vec<usize> = Vec::new(); // brace depths of inline mods
    let mut depth = 0usize;
    let mut use_stack: Vec<Vec<String>> = Vec::new();
    let mut i = 0;
    let word_at = |i: usize| -> Option<&str> {
        if i > 0 && is_ident(b[i - 1]) {
            return None;
        }
        let end = i + b[i..].iter().take_while(|&&c| is_ident(c)).count();
        (end > i).then(|| &code[i..end])
    };
    while i < b.len() {
        match b[i] {
            b'{' => {
                depth += 1;
                i += 1;
                continue;
            }
            b'}' => {
                if inline.last() == Some(&depth) {
                    inline.pop();
                }
                depth = depth.saturating_sub(1);
                i += 1;
                continue;
            }
            _ => {}
        }
        let Some(w) = word_at(i) else {
            i += 1;
            continue;
        };
        if w == "mod" {
            // `mod name {` opens an inline module.
            let rest = &code[i + 3..];
            let name_len = rest
                .trim_start()
                .bytes()
                .take_while(|&c| is_ident(c))
                .count();
            let after = rest.trim_start()[name_len..].trim_start();
            if name_len > 0 && after.starts_with('{') {
                inline.push(depth + 1);
            }
            i += 3;
            continue;
        }
        if w == "use" {
            let end = i + code[i..].find(';').unwrap_or(code.len() - i);
            for path in expand_use(&code[i + 3..end]) {
                if let Some((head, rest)) = path.split_first()
                    && matches!(head.as_str(), "crate" | "super" | "self")
                {
                    let mut head = head.clone();
                    let mut rest = rest.to_vec();
                    while head == "super" && rest.first().is_some_and(|s| s == "super") {
                        rest.remove(0);
                        head.push_str("::super");
                    }
                    out.push((head, inline.len(), rest));
                }
            }
            use_stack.clear();
            i = end;
            continue;
        }
        if matches!(w, "crate" | "super" | "self") && code[i + w.len()..].starts_with("::") {
            let mut segs = Vec::new();
            let mut head = w.to_string();
            let mut j = i + w.len();
            while code[j..].starts_with("::") {
                j += 2;
                let n = b[j..].iter().take_while(|&&c| is_ident(c)).count();
                if n == 0 {
                    break;
                }
                let s = &code[j..j + n];
                if s == "super" && segs.is_empty() && head.starts_with("super") {
                    head.push_str("::super");
                } else {
                    segs.push(s.to_string());
                }
                j += n;
            }
            out.push((head, inline.len(), segs));
            i = j;
            continue;
        }
        i += w.len();
    }
    out
}

/// `a::{b, c::{d, e}}` → `a::b`, `a::c::d`, `a::c::e`.
fn expand_use(tree: &str) -> Vec<Vec<String>> {
    fn go(s: &str, prefix: &[String], out: &mut Vec<Vec<String>>) {
        let s = s.trim().trim_start_matches("pub").trim();
        if let Some(open) = s.find('{') {
            let head: Vec<String> = s[..open]
                .split("::")
                .map(str::trim)
                .filter(|p| !p.is_empty())
                .map(String::from)
                .collect();
            let mut base = prefix.to_vec();
            base.extend(head);
            let inner = &s[open + 1..s.rfind('}').unwrap_or(s.len())];
            let mut level = 0;
            let mut start = 0;
            for (k, c) in inner.char_indices() {
                match c {
                    '{' => level += 1,
                    '}' => level -= 1,
                    ',' if level == 0 => {
                        go(&inner[start..k], &base, out);
                        start = k + 1;
                    }
                    _ => {}
                }
            }
            go(&inner[start..], &base, out);
        } else {
            let item = s.split(" as ").next().unwrap_or("").trim();
            if item.is_empty() {
                return;
            }
            let mut p = prefix.to_vec();
            p.extend(item.split("::").map(|x| x.trim().to_string()));
            out.push(p);
        }
    }
    let mut out = Vec::new();
    let tree = tree.trim();
    let tree = tree.strip_prefix("pub(crate)").unwrap_or(tree).trim();
    go(tree, &[], &mut out);
    out
}

/// The file a path names: the deepest module along it.
fn resolve(modules: &Modules, abs: &[String]) -> Vec<String> {
    (0..=abs.len())
        .rev()
        .map(|n| abs[..n].to_vec())
        .find(|m| modules.contains_key(m))
        .unwrap_or_default()
}

/// The root's re-exports: item name → the module path it comes from.
fn root_exports(modules: &Modules) -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(&modules[&Vec::new()]).unwrap();
    let code = code_of(&text);
    let mut out = BTreeMap::new();
    for stmt in code.split(';') {
        let Some(at) = stmt.find("pub use ") else {
            continue;
        };
        for path in expand_use(&stmt[at + 8..]) {
            let mut path = path;
            if path.first().is_some_and(|p| p == "crate" || p == "self") {
                path.remove(0);
            }
            if let Some(name) = path.last().cloned() {
                let m = resolve(modules, &path[..path.len() - 1]);
                if !m.is_empty() {
                    out.insert(name, m);
                }
            }
        }
    }
    out
}

fn edges(modules: &Modules) -> BTreeMap<Vec<String>, BTreeSet<Vec<String>>> {
    let exports = root_exports(modules);
    let mut graph: BTreeMap<Vec<String>, BTreeSet<Vec<String>>> = BTreeMap::new();
    for (module, path) in modules {
        if module.is_empty() {
            continue;
        }
        let text = std::fs::read_to_string(path).unwrap();
        for (head, inline, rest) in paths(&code_of(&text)) {
            let base: Vec<String> = if head == "crate" {
                Vec::new()
            } else {
                let ups = head.matches("super").count();
                let ups = ups.saturating_sub(inline);
                let mut m = module.clone();
                for _ in 0..ups {
                    m.pop();
                }
                m
            };
            let mut abs = base;
            abs.extend(rest);
            let mut target = resolve(modules, &abs);
            if target.is_empty() {
                match abs.first().and_then(|n| exports.get(n)) {
                    Some(m) => target = m.clone(),
                    None => continue,
                }
            }
            if &target != module {
                graph.entry(module.clone()).or_default().insert(target);
            }
        }
    }
    graph
}

/// A cycle, if any, as the files along it.
fn find_cycle(graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>) -> Option<Vec<Vec<String>>> {
    #[derive(Clone, Copy, PartialEq)]
    enum Mark {
        Open,
        Done,
    }
    fn visit(
        n: &Vec<String>,
        graph: &BTreeMap<Vec<String>, BTreeSet<Vec<String>>>,
        marks: &mut BTreeMap<Vec<String>, Mark>,
        stack: &mut Vec<Vec<String>>,
    ) -> Option<Vec<Vec<String>>> {
        match marks.get(n) {
            Some(Mark::Done) => return None,
            Some(Mark::Open) => {
                let at = stack.iter().position(|s| s == n).unwrap();
                let mut cycle = stack[at..].to_vec();
                cycle.push(n.clone());
                return Some(cycle);
            }
            None => {}
        }
        marks.insert(n.clone(), Mark::Open);
        stack.push(n.clone());
        for m in graph.get(n).into_iter().flatten() {
            if let Some(c) = visit(m, graph, marks, stack) {
                return Some(c);
            }
        }
        stack.pop();
        marks.insert(n.clone(), Mark::Done);
        None
    }
    let mut marks = BTreeMap::new();
    for n in graph.keys() {
        if let Some(c) = visit(n, graph, &mut marks, &mut Vec::new()) {
            return Some(c);
        }
    }
    None
}

#[test]
fn no_file_imports_a_file_that_imports_it_back() {
    let root = workspace().canonicalize().unwrap();
    let mut cycles = Vec::new();
    for src in libraries() {
        let modules = modules(&src);
        let graph = edges(&modules);
        if let Some(cycle) = find_cycle(&graph) {
            let files: Vec<String> = cycle
                .iter()
                .map(|m| {
                    let p = modules[m].canonicalize().unwrap();
                    p.strip_prefix(&root).unwrap().display().to_string()
                })
                .collect();
            cycles.push(files.join(" -> "));
        }
    }
    assert!(
        cycles.is_empty(),
        "import cycles between files (one per library shown):\n{}",
        cycles.join("\n")
    );
}

#[test]
fn the_checker_sees_uses_inline_paths_and_re_exports() {
    let code = code_of(
        "use crate::{a::B, c::{d, e as f}};\n// use crate::nope;\nfn x() { super::g::h(); let s = \"crate::no\"; }\nmod tests { use super::*; }",
    );
    let got = paths(&code);
    assert!(
        got.contains(&("crate".into(), 0, vec!["a".into(), "B".into()])),
        "{got:?}"
    );
    assert!(
        got.contains(&("crate".into(), 0, vec!["c".into(), "e".into()])),
        "{got:?}"
    );
    assert!(
        got.contains(&("super".into(), 0, vec!["g".into(), "h".into()])),
        "{got:?}"
    );
    assert!(
        got.contains(&("super".into(), 1, vec!["*".into()])),
        "{got:?}"
    );
    assert!(
        !got.iter()
            .any(|p| p.2.contains(&"nope".to_string()) || p.2.contains(&"no".to_string()))
    );
    let mut graph = BTreeMap::new();
    let (a, b) = (vec!["a".to_string()], vec!["b".to_string()]);
    graph.insert(a.clone(), BTreeSet::from([b.clone()]));
    graph.insert(b.clone(), BTreeSet::from([a.clone()]));
    assert_eq!(find_cycle(&graph).unwrap().len(), 3);
    graph.remove(&b);
    assert_eq!(find_cycle(&graph), None);
}
