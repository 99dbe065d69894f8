//! A struct's `Debug` text as a JSON object, so `--log-format json` logs a
//! struct (the effective config above all) as fields a collector indexes
//! (`config.max_batch`), not as one opaque string.
//!
//! Only the shape `Name { field: value, .. }` is read as an object; its
//! values become JSON where they plainly are JSON (numbers, booleans,
//! `None` as null, `Some(x)` as `x`, quoted strings, lists, nested
//! structs) and stay their `Debug` text otherwise (addresses, durations,
//! enum variants). Anything else, and any text this reader does not
//! follow, stays the `Debug` string it was: a log line never fails.
//! Deriving `serde::Serialize` instead would mean a derive, and a choice
//! of format for `Duration` and friends, on every type of every config in
//! five crates, for one log line.

use serde_json::{Map, Value};

/// `debug` as a JSON object when it is a struct's `Debug`, else as the
/// string it is.
pub fn value(debug: &str) -> Value {
    match object(debug.trim()) {
        Some(fields) => Value::Object(fields),
        None => Value::String(debug.to_string()),
    }
}

/// `Name { a: x, b: y }` (or `Name { a: x, .. }`) as `{"a": x, "b": y}`.
fn object(text: &str) -> Option<Map<String, Value>> {
    let (name, rest) = text.split_once(" {")?;
    if name.is_empty()
        || !name
            .chars()
            .all(|c| c.is_alphanumeric() || c == '_' || c == ':')
    {
        return None;
    }
    let body = rest.strip_suffix('}')?.trim();
    let mut fields = Map::new();
    for part in split_top(body)? {
        let part = part.trim();
        if part.is_empty() || part == ".." {
            continue;
        }
        let (key, val) = part.split_once(": ")?;
        if key.is_empty() || !key.chars().all(|c| c.is_alphanumeric() || c == '_') {
            return None;
        }
        fields.insert(key.to_string(), element(val.trim()));
    }
    Some(fields)
}

/// One field's value: JSON where it plainly is, its text otherwise.
fn element(text: &str) -> Value {
    match text {
        "None" => return Value::Null,
        "true" => return Value::Bool(true),
        "false" => return Value::Bool(false),
        _ => {}
    }
    if let Some(inner) = text.strip_prefix("Some(").and_then(|t| t.strip_suffix(')'))
        && split_top(inner).is_some_and(|parts| parts.len() == 1)
    {
        return element(inner.trim());
    }
    if let Ok(n) = text.parse::<i64>() {
        return Value::from(n);
    }
    if let Ok(n) = text.parse::<u64>() {
        return Value::from(n);
    }
    if let Some(n) = text
        .parse::<f64>()
        .ok()
        .filter(|n| n.is_finite())
        .and_then(serde_json::Number::from_f64)
    {
        return Value::Number(n);
    }
    if let Some(s) = string(text) {
        return Value::String(s);
    }
    if let Some(list) = text.strip_prefix('[').and_then(|t| t.strip_suffix(']'))
        && let Some(parts) = split_top(list)
    {
        let items = parts.iter().map(|p| p.trim()).filter(|p| !p.is_empty());
        return Value::Array(items.map(element).collect());
    }
    if let Some(fields) = object(text) {
        return Value::Object(fields);
    }
    Value::String(text.to_string())
}

/// A `Debug`-quoted string, unescaped; `None` unless `text` is exactly one.
fn string(text: &str) -> Option<String> {
    let inner = text.strip_prefix('"')?.strip_suffix('"')?;
    let mut out = String::with_capacity(inner.len());
    let mut chars = inner.chars();
    while let Some(c) = chars.next() {
        match c {
            '"' => return None,
            '\\' => out.push(match chars.next()? {
                'n' => '\n',
                't' => '\t',
                'r' => '\r',
                '0' => '\0',
                'u' => {
                    let hex: String = chars.by_ref().skip(1).take_while(|&c| c != '}').collect();
                    char::from_u32(u32::from_str_radix(&hex, 16).ok()?)?
                }
                other => other,
            }),
            c => out.push(c),
        }
    }
    Some(out)
}

/// `text` split at the commas outside brackets and quotes; `None` when its
/// brackets or quotes do not balance.
fn split_top(text: &str) -> Option<Vec<&str>> {
    let mut parts = Vec::new();
    let (mut depth, mut start, mut quoted, mut escaped) = (0usize, 0, false, false);
    for (i, c) in text.char_indices() {
        if quoted {
            match (escaped, c) {
                (true, _) => escaped = false,
                (false, '\\') => escaped = true,
                (false, '"') => quoted = false,
                _ => {}
            }
            continue;
        }
        match c {
            '"' => quoted = true,
            '(' | '[' | '{' => depth += 1,
            ')' | ']' | '}' => depth = depth.checked_sub(1)?,
            ',' if depth == 0 => {
                parts.push(&text[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    (depth == 0 && !quoted).then(|| {
        parts.push(&text[start..]);
        parts
    })
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;
    use std::path::PathBuf;
    use std::time::Duration;

    use serde_json::json;

    use super::*;

    #[derive(Debug)]
    #[allow(dead_code)]
    enum Mode {
        Fast,
        Slow(u32),
    }

    #[derive(Debug)]
    #[allow(dead_code)]
    struct Tls {
        cert: Option<PathBuf>,
        allow_san: Vec<String>,
    }

    #[derive(Debug)]
    #[allow(dead_code)]
    struct Config {
        listen: SocketAddr,
        v6: SocketAddr,
        metrics: Option<SocketAddr>,
        tls: Tls,
        grace: Duration,
        model: PathBuf,
        name: String,
        ratio: f64,
        batch: usize,
        offset: i32,
        on: bool,
        mode: Mode,
        slow: Mode,
        curve: Option<Vec<(usize, f64)>>,
        sha: Option<[u8; 2]>,
    }

    #[test]
    fn a_config_becomes_an_object_of_its_fields() {
        let config = Config {
            listen: "127.0.0.1:50051".parse().unwrap(),
            v6: "[::1]:9".parse().unwrap(),
            metrics: None,
            tls: Tls {
                cert: Some("/etc/tls/tls.crt".into()),
                allow_san: vec!["a, b".into(), "c\"d".into()],
            },
            grace: Duration::from_millis(1500),
            model: "smollm2-135m".into(),
            name: "x {y}".into(),
            ratio: 0.25,
            batch: 8,
            offset: -3,
            on: true,
            mode: Mode::Fast,
            slow: Mode::Slow(2),
            curve: Some(vec![(1, 1.0), (2, 1.5)]),
            sha: Some([1, 2]),
        };
        assert_eq!(
            value(&format!("{config:?}")),
            json!({
                "listen": "127.0.0.1:50051",
                "v6": "[::1]:9",
                "metrics": null,
                "tls": {"cert": "/etc/tls/tls.crt", "allow_san": ["a, b", "c\"d"]},
                "grace": "1.5s",
                "model": "smollm2-135m",
                "name": "x {y}",
                "ratio": 0.25,
                "batch": 8,
                "offset": -3,
                "on": true,
                "mode": "Fast",
                "slow": "Slow(2)",
                "curve": ["(1, 1.0)", "(2, 1.5)"],
                "sha": [1, 2],
            })
        );
    }

    #[test]
    fn what_is_not_a_struct_stays_its_debug_text() {
        for text in [
            "\"a string\"",
            "Some(3)",
            "[1, 2]",
            "Status { code: Internal",
            "Name { not a field }",
            "x {",
        ] {
            assert_eq!(value(text), Value::String(text.into()), "{text}");
        }
        assert_eq!(value("Unit {  }"), json!({}));
        assert_eq!(
            value("Started { service: \"v\", .. }"),
            json!({"service": "v"})
        );
    }
}
