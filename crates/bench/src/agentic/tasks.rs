//! The tasks: documents from the Spec-Bench dev set, the extraction
//! schema, the tool catalogue and the tools' canned results. Pure and
//! deterministic: every target gets the same requests.

use serde_json::{Value, json};

use crate::specbench::Question;

/// The Spec-Bench categories whose first turn is a document or a question
/// about one.
const SOURCES: [&str; 4] = ["summarization", "rag", "qa", "extraction"];

/// Longest document text a task carries, in characters.
const MAX_DOCUMENT: usize = 800;

/// The documents the tasks are built from, `n` of them, cycling.
pub fn documents(questions: &[Question], n: usize) -> Vec<String> {
    let pool: Vec<&str> = questions
        .iter()
        .filter(|q| SOURCES.contains(&q.category.as_str()))
        .filter_map(|q| q.turns.first().map(String::as_str))
        .collect();
    (0..n)
        .filter_map(|i| pool.get(i % pool.len().max(1)))
        .map(|t| t.chars().take(MAX_DOCUMENT).collect())
        .collect()
}

/// The extraction schema: what an information-extraction agent asks for.
pub fn extraction_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "title": {"type": "string"},
            "topics": {"type": "array", "items": {"type": "string"}, "maxItems": 3},
            "entities": {
                "type": "array",
                "items": {
                    "type": "object",
                    "properties": {
                        "name": {"type": "string"},
                        "kind": {"type": "string", "enum": ["person", "organization", "place", "product", "other"]}
                    },
                    "required": ["name", "kind"],
                    "additionalProperties": false
                },
                "maxItems": 4
            },
            "sentiment": {"type": "string", "enum": ["positive", "neutral", "negative"]},
            "summary": {"type": "string"}
        },
        "required": ["title", "topics", "entities", "sentiment", "summary"],
        "additionalProperties": false
    })
}

/// The extraction request's body (OpenAI's fields; the target adds its own).
pub fn extraction_body(document: &str, max_tokens: u32) -> Value {
    json!({
        "messages": [
            {"role": "system", "content": "You extract structured data from text. Answer with JSON only."},
            {"role": "user", "content": format!(
                "Extract the title, up to three topics, up to four named entities, the sentiment and a one-sentence summary of this text.\n\n{document}"
            )},
        ],
        "response_format": {"type": "json_schema", "json_schema": {
            "name": "extraction", "strict": true, "schema": extraction_schema(),
        }},
        "max_tokens": max_tokens,
    })
}

/// Whether `text` is an extraction that follows [`extraction_schema`].
pub fn valid_extraction(text: &str) -> bool {
    let Ok(Value::Object(v)) = serde_json::from_str::<Value>(text) else {
        return false;
    };
    let strings = |x: &Value| {
        x.as_array()
            .is_some_and(|a| a.len() <= 3 && a.iter().all(Value::is_string))
    };
    let entity = |e: &Value| {
        e["name"].is_string()
            && ["person", "organization", "place", "product", "other"]
                .contains(&e["kind"].as_str().unwrap_or(""))
    };
    v.len() == 5
        && v["title"].is_string()
        && strings(&v["topics"])
        && v["entities"]
            .as_array()
            .is_some_and(|a| a.len() <= 4 && a.iter().all(entity))
        && ["positive", "neutral", "negative"].contains(&v["sentiment"].as_str().unwrap_or(""))
        && v["summary"].is_string()
}

fn function(name: &str, description: &str, parameters: Value) -> Value {
    json!({"type": "function", "function": {
        "name": name, "description": description, "parameters": parameters,
    }})
}

fn object(properties: Value, required: &[&str]) -> Value {
    json!({"type": "object", "properties": properties, "required": required})
}

/// A support agent's tool catalogue.
pub fn catalogue() -> Value {
    json!([
        function(
            "search_docs",
            "Search the knowledge base.",
            object(
                json!({"query": {"type": "string"}, "top_k": {"type": "integer", "minimum": 1, "maximum": 5}}),
                &["query"]
            )
        ),
        function(
            "create_ticket",
            "Open a support ticket.",
            object(
                json!({"title": {"type": "string"},
                   "priority": {"type": "string", "enum": ["low", "medium", "high"]},
                   "description": {"type": "string"}}),
                &["title", "priority", "description"]
            )
        ),
        function(
            "send_email",
            "Email a customer.",
            object(
                json!({"to": {"type": "string"}, "subject": {"type": "string"}, "body": {"type": "string"}}),
                &["to", "subject", "body"]
            )
        ),
        function(
            "lookup_order",
            "Find an order by its id.",
            object(json!({"order_id": {"type": "string"}}), &["order_id"])
        ),
        function(
            "get_weather",
            "Current weather in a city.",
            object(
                json!({"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}),
                &["city", "unit"]
            )
        ),
        function(
            "calculator",
            "Evaluate an arithmetic expression.",
            object(json!({"expression": {"type": "string"}}), &["expression"])
        ),
    ])
}

/// The agent's opening messages for `document`.
pub fn agent_messages(document: &str) -> Value {
    json!([
        {"role": "system", "content": "You are a support agent. Use the tools to act; when you are done, answer the customer briefly."},
        {"role": "user", "content": format!(
            "A customer wrote:\n\n{document}\n\nFirst search the knowledge base for what they need, then open a ticket about it, then tell them what you did in two sentences."
        )},
    ])
}

/// Whether a call names a catalogue tool with JSON-object arguments holding
/// its required keys.
pub fn valid_call(name: &str, arguments: &str) -> bool {
    let Ok(Value::Object(args)) = serde_json::from_str::<Value>(arguments) else {
        return false;
    };
    let tools = catalogue();
    tools.as_array().into_iter().flatten().any(|t| {
        let f = &t["function"];
        f["name"] == name
            && f["parameters"]["required"].as_array().is_some_and(|r| {
                r.iter()
                    .all(|k| k.as_str().is_some_and(|k| args.contains_key(k)))
            })
    })
}

/// The canned result of a call, as the tool message's content.
pub fn tool_result(name: &str, task: usize, document: &str) -> String {
    let result = match name {
        "search_docs" => json!({"results": [{
            "title": format!("KB-{task}"),
            "snippet": document.chars().take(300).collect::<String>(),
        }]}),
        "create_ticket" => json!({"ticket_id": format!("T-{}", 1000 + task), "status": "open"}),
        "send_email" => json!({"sent": true}),
        "lookup_order" => json!({"status": "shipped", "eta_days": 2}),
        "get_weather" => json!({"temperature": 18, "sky": "cloudy"}),
        "calculator" => json!({"result": 42}),
        _ => json!({"error": "unknown tool"}),
    };
    result.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extractions_are_checked_against_the_schema() {
        let ok = r#"{"title": "T", "topics": ["a"], "entities": [{"name": "Ada", "kind": "person"}], "sentiment": "neutral", "summary": "S."}"#;
        assert!(valid_extraction(ok));
        assert!(!valid_extraction(&ok.replace("neutral", "meh")));
        assert!(!valid_extraction(r#"{"title": "T"}"#));
        assert!(!valid_extraction("not json"));
    }

    #[test]
    fn calls_need_a_catalogue_tool_and_its_required_keys() {
        assert!(valid_call("search_docs", r#"{"query": "refund"}"#));
        assert!(!valid_call("search_docs", r#"{"top_k": 2}"#));
        assert!(!valid_call("launch", r#"{}"#));
        assert!(!valid_call("calculator", "[1]"));
    }

    #[test]
    fn documents_cycle_through_the_sources() {
        let q = |category: &str, text: &str| Question {
            question_id: json!(1),
            category: category.into(),
            turns: vec![text.into()],
        };
        let questions = [q("math", "x"), q("rag", "doc one"), q("qa", "doc two")];
        assert_eq!(documents(&questions, 3), ["doc one", "doc two", "doc one"]);
    }
}
