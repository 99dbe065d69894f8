//! OpenAI's tools: `tools`, `tool_choice` and `parallel_tool_calls` as the
//! gRPC API's `Chat` fields, the history's `tool_calls` and `tool`
//! messages, and calls back as `message.tool_calls` or streamed deltas.

use serde_json::{Value, json};
use specmesh_proto::v1;

use super::BadRequest;

/// `tools`: `[{"type": "function", "function": {"name", "description"?,
/// "parameters"?, "strict"?}}]`. The names and schemas are checked by the
/// gateway (against the model too); here only the shape.
pub fn tools(value: Option<&Value>) -> Result<Vec<v1::Tool>, BadRequest> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let Some(list) = value.as_array() else {
        return Err(BadRequest::new("tools", "`tools` must be an array"));
    };
    list.iter()
        .enumerate()
        .map(|(i, t)| {
            let param = format!("tools[{i}]");
            if t.get("type").and_then(Value::as_str) != Some("function") {
                return Err(BadRequest::new(
                    &format!("{param}.type"),
                    format!("`{param}.type` must be \"function\""),
                ));
            }
            let f = t
                .get("function")
                .and_then(Value::as_object)
                .ok_or_else(|| {
                    BadRequest::new(
                        &format!("{param}.function"),
                        format!("`{param}.function` must be an object"),
                    )
                })?;
            let name = f.get("name").and_then(Value::as_str).ok_or_else(|| {
                BadRequest::new(
                    &format!("{param}.function.name"),
                    format!("`{param}.function.name` must be a string"),
                )
            })?;
            let description = match f.get("description") {
                None | Some(Value::Null) => String::new(),
                Some(Value::String(d)) => d.clone(),
                Some(_) => {
                    return Err(BadRequest::new(
                        &format!("{param}.function.description"),
                        format!("`{param}.function.description` must be a string"),
                    ));
                }
            };
            // Re-serialised in the caller's key order (`preserve_order`).
            let parameters = match f.get("parameters") {
                None | Some(Value::Null) => String::new(),
                Some(p) => p.to_string(),
            };
            Ok(v1::Tool {
                name: name.to_owned(),
                description,
                parameters,
            })
        })
        .collect()
}

/// `tool_choice`: `"none"`, `"auto"`, `"required"` or `{"type":
/// "function", "function": {"name"}}`.
pub fn tool_choice(value: Option<&Value>) -> Result<Option<v1::ToolChoice>, BadRequest> {
    use v1::tool_choice::Choice;
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let mode = |m: v1::ToolChoiceMode| Choice::Mode(m as i32);
    let choice = match value {
        Value::String(s) if s == "auto" => mode(v1::ToolChoiceMode::Auto),
        Value::String(s) if s == "none" => mode(v1::ToolChoiceMode::None),
        Value::String(s) if s == "required" => mode(v1::ToolChoiceMode::Required),
        Value::Object(o) => {
            match o
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
            {
                Some(name) if o.get("type").and_then(Value::as_str) == Some("function") => {
                    Choice::Function(name.to_owned())
                }
                _ => return Err(bad_choice(value)),
            }
        }
        _ => return Err(bad_choice(value)),
    };
    Ok(Some(v1::ToolChoice {
        choice: Some(choice),
    }))
}

fn bad_choice(value: &Value) -> BadRequest {
    BadRequest::new(
        "tool_choice",
        format!(
            "`tool_choice` must be \"none\", \"auto\", \"required\" or {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}, got {value}"
        ),
    )
}

/// `parallel_tool_calls`: a boolean, default true.
pub fn parallel(value: Option<&Value>) -> Result<Option<bool>, BadRequest> {
    match value.filter(|v| !v.is_null()) {
        None => Ok(None),
        Some(Value::Bool(b)) => Ok(Some(*b)),
        Some(v) => Err(BadRequest::new(
            "parallel_tool_calls",
            format!("`parallel_tool_calls` must be a boolean, got {v}"),
        )),
    }
}

/// An assistant message's `tool_calls`, their arguments kept as the JSON
/// text OpenAI sends (the gateway parses them for the template).
pub fn history_calls(value: Option<&Value>, index: usize) -> Result<Vec<v1::ToolCall>, BadRequest> {
    let Some(value) = value.filter(|v| !v.is_null()) else {
        return Ok(Vec::new());
    };
    let param = format!("messages[{index}].tool_calls");
    let Some(list) = value.as_array() else {
        return Err(BadRequest::new(
            &param,
            format!("`{param}` must be an array"),
        ));
    };
    list.iter()
        .enumerate()
        .map(|(i, c)| {
            let f = c.get("function");
            let name = f.and_then(|f| f.get("name")).and_then(Value::as_str);
            let arguments = match f.and_then(|f| f.get("arguments")) {
                None | Some(Value::Null) => Some(String::new()),
                Some(Value::String(a)) => Some(a.clone()),
                // Some clients send the object itself.
                Some(o @ Value::Object(_)) => Some(o.to_string()),
                Some(_) => None,
            };
            match (name, arguments) {
                (Some(name), Some(arguments)) => Ok(v1::ToolCall {
                    id: c
                        .get("id")
                        .and_then(Value::as_str)
                        .unwrap_or_default()
                        .to_owned(),
                    name: name.to_owned(),
                    arguments,
                }),
                _ => Err(BadRequest::new(
                    &format!("{param}[{i}].function"),
                    format!(
                        "`{param}[{i}].function` must hold a string `name` and JSON `arguments`"
                    ),
                )),
            }
        })
        .collect()
}

/// Calls as a message's `tool_calls`.
pub fn message_calls(calls: &[v1::ToolCall]) -> Value {
    calls
        .iter()
        .map(|c| {
            json!({"id": c.id, "type": "function",
                   "function": {"name": c.name, "arguments": c.arguments}})
        })
        .collect()
}

/// Calls as stream deltas, numbered from `first` (calls sent before):
/// each opens with its id and name, then its arguments, as OpenAI streams
/// them (the SDKs join the deltas of one index).
pub fn call_deltas(calls: &[v1::ToolCall], first: usize) -> Vec<Value> {
    calls
        .iter()
        .enumerate()
        .flat_map(|(i, c)| {
            let index = first + i;
            [
                json!({"tool_calls": [{"index": index, "id": c.id, "type": "function",
                                       "function": {"name": c.name, "arguments": ""}}]}),
                json!({"tool_calls": [{"index": index,
                                       "function": {"arguments": c.arguments}}]}),
            ]
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tools_and_choices_convert() {
        let t = json!([{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "b": 1, "a": 2}}}]);
        let tools = tools(Some(&t)).unwrap();
        assert_eq!(tools[0].name, "f");
        // The caller's key order is kept.
        assert_eq!(tools[0].parameters, r#"{"type":"object","b":1,"a":2}"#);
        assert!(super::tools(Some(&json!([{"type": "retrieval"}]))).is_err());

        use v1::tool_choice::Choice;
        let named = tool_choice(Some(
            &json!({"type": "function", "function": {"name": "f"}}),
        ))
        .unwrap()
        .unwrap();
        assert_eq!(named.choice, Some(Choice::Function("f".into())));
        let required = tool_choice(Some(&json!("required"))).unwrap().unwrap();
        assert_eq!(
            required.choice,
            Some(Choice::Mode(v1::ToolChoiceMode::Required as i32))
        );
        let err = tool_choice(Some(&json!("always"))).unwrap_err();
        assert_eq!(err.param.as_deref(), Some("tool_choice"));
    }

    #[test]
    fn history_arguments_stay_text_and_bad_ones_are_named() {
        let calls = json!([{"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]);
        let c = history_calls(Some(&calls), 2).unwrap();
        assert_eq!(c[0].arguments, "{\"a\": 1}");
        assert_eq!(c[0].id, "call_1");
        let err = history_calls(Some(&json!([{"function": {"arguments": 3}}])), 2).unwrap_err();
        assert_eq!(
            err.param.as_deref(),
            Some("messages[2].tool_calls[0].function")
        );
    }

    #[test]
    fn a_streamed_call_opens_with_its_name_then_its_arguments() {
        let call = v1::ToolCall {
            id: "call_x".into(),
            name: "f".into(),
            arguments: "{}".into(),
        };
        let d = call_deltas(&[call], 1);
        assert_eq!(d.len(), 2);
        assert_eq!(d[0]["tool_calls"][0]["index"], 1);
        assert_eq!(d[0]["tool_calls"][0]["function"]["name"], "f");
        assert_eq!(d[1]["tool_calls"][0]["function"]["arguments"], "{}");
    }
}
