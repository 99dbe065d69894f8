//! Chat-template rendering with the Jinja environment Hugging Face uses in
//! `apply_chat_template`: `trim_blocks` and `lstrip_blocks` on, loop controls,
//! `raise_exception`, `strftime_now`, a Python-compatible `tojson`, and
//! Python string methods (`.strip()`, `.startswith()`, ...) via pycompat.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind};
use minijinja::{Environment, Error, ErrorKind, Value};

use crate::{ChatMessage, TokenizerError};

/// Render `template` for `messages` with HF's variables.
pub(crate) fn render(
    template: &str,
    messages: &[ChatMessage],
    tools: &[serde_json::Value],
    add_generation_prompt: bool,
    bos_token: Option<&str>,
    eos_token: Option<&str>,
) -> Result<String, TokenizerError> {
    let env = environment();
    let template = env
        .template_from_str(template)
        .map_err(|e| TokenizerError::Template(describe(&e)))?;
    let mut ctx: BTreeMap<&str, Value> = BTreeMap::new();
    ctx.insert("messages", Value::from_serialize(messages));
    if !tools.is_empty() {
        ctx.insert("tools", Value::from_serialize(tools));
    }
    ctx.insert("add_generation_prompt", Value::from(add_generation_prompt));
    // Absent tokens stay undefined (render as "") rather than "none".
    if let Some(bos) = bos_token {
        ctx.insert("bos_token", Value::from(bos));
    }
    if let Some(eos) = eos_token {
        ctx.insert("eos_token", Value::from(eos));
    }
    template
        .render(ctx)
        .map_err(|e| TokenizerError::Template(describe(&e)))
}

/// Whether `template` reads a top-level `tools` variable.
pub(crate) fn declares_tools(template: &str) -> bool {
    environment()
        .template_from_str(template)
        .is_ok_and(|t| t.undeclared_variables(false).contains("tools"))
}

/// HF's Jinja environment.
fn environment() -> Environment<'static> {
    let mut env = Environment::new();
    env.set_trim_blocks(true);
    env.set_lstrip_blocks(true);
    env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
    env.add_function("raise_exception", raise_exception);
    env.add_function("strftime_now", strftime_now);
    env.add_filter("tojson", tojson);
    env
}

/// minijinja's message plus the chain of causes, on one line.
fn describe(err: &Error) -> String {
    let mut text = err.to_string();
    let mut source = std::error::Error::source(err);
    while let Some(cause) = source {
        let _ = write!(text, ": {cause}");
        source = cause.source();
    }
    text
}

fn raise_exception(message: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised an exception: {message}"),
    ))
}

/// Python's `json.dumps(value, ensure_ascii=False, indent=indent, sort_keys=..)`,
/// which is what HF's `tojson` filter calls. Differs from minijinja's built-in
/// (`", "`/`": "` separators, no HTML escaping).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    let opts = JsonOpts {
        indent,
        sort_keys: sort_keys.unwrap_or(false),
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    let mut out = String::new();
    write_json(&mut out, value, &opts, 0)?;
    Ok(Value::from_safe_string(out))
}

struct JsonOpts {
    indent: Option<usize>,
    sort_keys: bool,
    ensure_ascii: bool,
}

fn write_json(out: &mut String, value: &Value, opts: &JsonOpts, depth: usize) -> Result<(), Error> {
    match value.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if value.is_true() { "true" } else { "false" }),
        ValueKind::Number => {
            if let Some(i) = value.as_i64().filter(|_| value.is_integer()) {
                let _ = write!(out, "{i}");
            } else {
                let f = f64::try_from(value.clone()).unwrap_or(f64::NAN);
                out.push_str(&python_float(f));
            }
        }
        ValueKind::String | ValueKind::Plain => write_json_str(out, &value.to_string(), opts),
        ValueKind::Map => {
            let mut keys: Vec<Value> = value.try_iter()?.collect();
            if opts.sort_keys {
                keys.sort();
            }
            let items = keys
                .into_iter()
                .map(|k| {
                    let v = value.get_item(&k)?;
                    Ok((k, v))
                })
                .collect::<Result<Vec<_>, Error>>()?;
            write_container(
                out,
                ('{', '}'),
                items,
                opts,
                depth,
                |out, (k, v), opts, depth| {
                    write_json_str(out, &k.to_string(), opts);
                    out.push_str(": ");
                    write_json(out, &v, opts, depth)
                },
            )?;
        }
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = value.try_iter()?.collect();
            write_container(
                out,
                ('[', ']'),
                items,
                opts,
                depth,
                |out, v, opts, depth| write_json(out, &v, opts, depth),
            )?;
        }
        ValueKind::Bytes | ValueKind::Invalid => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson cannot serialize a value of kind {}", value.kind()),
            ));
        }
        _ => write_json_str(out, &value.to_string(), opts),
    }
    Ok(())
}

fn write_container<T>(
    out: &mut String,
    (open, close): (char, char),
    items: Vec<T>,
    opts: &JsonOpts,
    depth: usize,
    mut write_item: impl FnMut(&mut String, T, &JsonOpts, usize) -> Result<(), Error>,
) -> Result<(), Error> {
    out.push(open);
    if items.is_empty() {
        out.push(close);
        return Ok(());
    }
    let count = items.len();
    for (i, item) in items.into_iter().enumerate() {
        if let Some(width) = opts.indent {
            out.push('\n');
            out.push_str(&" ".repeat(width * (depth + 1)));
        }
        write_item(out, item, opts, depth + 1)?;
        if i + 1 < count {
            // Python uses "," before a newline when indenting, ", " otherwise.
            out.push_str(if opts.indent.is_some() { "," } else { ", " });
        }
    }
    if let Some(width) = opts.indent {
        out.push('\n');
        out.push_str(&" ".repeat(width * depth));
    }
    out.push(close);
    Ok(())
}

fn write_json_str(out: &mut String, s: &str, opts: &JsonOpts) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (opts.ensure_ascii && !c.is_ascii()) => {
                let mut units = [0u16; 2];
                for unit in c.encode_utf16(&mut units) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Python's float repr for the common cases (`1.0`, `0.5`, `1e-05`, `NaN`).
fn python_float(f: f64) -> String {
    if f.is_nan() {
        "NaN".to_owned()
    } else if f.is_infinite() {
        if f > 0.0 { "Infinity" } else { "-Infinity" }.to_owned()
    } else if f == f.trunc() && f.abs() < 1e16 {
        format!("{f:.1}")
    } else {
        format!("{f}")
    }
}

/// HF's `strftime_now(format)`: the current UTC time formatted with the
/// common strftime directives (unknown directives are kept literally).
fn strftime_now(format: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    strftime(&format, secs)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
    "Monday",
    "Tuesday",
    "Wednesday",
];

pub(crate) fn strftime(format: &str, unix_secs: u64) -> String {
    let days = unix_secs / 86_400;
    let rem = unix_secs % 86_400;
    let (hour, minute, second) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Howard Hinnant's days-to-civil algorithm.
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    let month_name = MONTHS[(month - 1) as usize];
    let weekday = WEEKDAYS[(days % 7) as usize];

    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('B') => write!(out, "{month_name}"),
            Some('b') => write!(out, "{}", &month_name[..3]),
            Some('A') => write!(out, "{weekday}"),
            Some('a') => write!(out, "{}", &weekday[..3]),
            Some('%') => write!(out, "%"),
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strftime_formats_known_instants() {
        assert_eq!(strftime("%d %b %Y", 0), "01 Jan 1970");
        // 2023-11-14 22:13:20 UTC, a Tuesday.
        assert_eq!(
            strftime("%A %a %B %m/%d/%y %H:%M:%S %I%p %e %% %Q", 1_700_000_000),
            "Tuesday Tue November 11/14/23 22:13:20 10PM 14 % %Q"
        );
        assert_eq!(strftime("%Y-%m-%d", 951_782_400), "2000-02-29");
    }

    /// The tool parts of Qwen2.5's template.
    const TOOLS_TEMPLATE: &str = "{% if tools %}<tools>{% for tool in tools %}\n{{ tool | tojson }}{% endfor %}\n</tools>\n{% endif %}{% for message in messages %}{% if message.role == 'assistant' and message.tool_calls %}{% for tool_call in message.tool_calls %}{% if tool_call.function is defined %}{% set tool_call = tool_call.function %}{% endif %}<tool_call>\n{\"name\": \"{{ tool_call.name }}\", \"arguments\": {{ tool_call.arguments | tojson }}}\n</tool_call>{% endfor %}{% elif message.role == 'tool' %}<tool_response>{{ message.content }}</tool_response>{% else %}{{ message.content }}{% endif %}\n{% endfor %}";

    #[test]
    fn tools_and_calls_render_as_hugging_face_does() {
        assert!(declares_tools(TOOLS_TEMPLATE));
        assert!(!declares_tools(
            "{% for message in messages %}{{ message.content }}{% endfor %}"
        ));
        let tools = [
            serde_json::json!({"type": "function", "function": {"name": "f", "parameters": {"type": "object", "b": 1, "a": 2}}}),
        ];
        let mut call = ChatMessage::new("assistant", "");
        call.tool_calls = vec![crate::ToolCall::function(
            "call_1",
            "f",
            serde_json::json!({"z": 1, "a": "x"}),
        )];
        let mut result = ChatMessage::new("tool", "42");
        result.tool_call_id = Some("call_1".into());
        let out = render(
            TOOLS_TEMPLATE,
            &[ChatMessage::new("user", "hi"), call, result],
            &tools,
            false,
            None,
            None,
        )
        .unwrap();
        assert_eq!(
            out,
            // (`trim_blocks` eats the newline after each block tag.)
            "<tools>{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\", \"b\": 1, \"a\": 2}}}</tools>\nhi<tool_call>\n{\"name\": \"f\", \"arguments\": {\"z\": 1, \"a\": \"x\"}}\n</tool_call><tool_response>42</tool_response>"
        );
        // Without tools, `tools` stays undefined.
        let out = render(
            TOOLS_TEMPLATE,
            &[ChatMessage::new("user", "hi")],
            &[],
            false,
            None,
            None,
        )
        .unwrap();
        assert_eq!(out, "hi");
    }

    #[test]
    fn python_float_repr() {
        assert_eq!(python_float(1.0), "1.0");
        assert_eq!(python_float(0.5), "0.5");
        assert_eq!(python_float(-3.0), "-3.0");
    }
}
