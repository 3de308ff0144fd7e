//! What the kill switch reads from an OpenAI Responses API body (`POST /v1/responses`):
//! the same three things as from a chat-completions body ([`crate::messages`]), in the
//! Responses API's shape.
//!
//! The conversation is `input`: a string (one user message) or a list of items —
//! messages (`role` user, system, developer or assistant; text in `input_text` /
//! `output_text` parts, or a string), `function_call` items (`name`, JSON-encoded
//! `arguments`, `call_id`) and the `function_call_output` items that answer them,
//! plus items the kill switch does not read (reasoning, built-in tool calls, item
//! references).
//!
//! The newest input from the user side is what repeats in a loop: when the newest
//! turn answers tool calls, its `function_call_output` items (their outputs joined
//! with a newline); else the last user message's text. The current turn's calls are
//! the `function_call` items after the last user message.

use serde_json::Value;

use crate::messages::{tool_call_signature, RequestFingerprint};
use crate::simhash::fingerprint;
use crate::Error;

/// Reads a Responses request body: the fingerprint of its [`newest_user_side_text`],
/// the [`current_tool_signatures`], and `stream`. Anything but a JSON object is
/// refused ([`Error::NotAnObject`]).
pub fn request_fingerprint(request: &Value) -> Result<RequestFingerprint, Error> {
    if !request.is_object() {
        return Err(Error::NotAnObject);
    }
    Ok(RequestFingerprint {
        prompt: newest_user_side_text(request).map(|text| fingerprint(&text)),
        tool_signatures: current_tool_signatures(request),
        stream: request.get("stream").and_then(Value::as_bool) == Some(true),
    })
}

/// The fingerprint of a response's `output_text` parts (of its `message` items);
/// `Ok(None)` when it has none (function calls only). [`Error::NotACompletion`]
/// unless it is an object with an `output` array.
pub fn response_fingerprint(response: &Value) -> Result<Option<u64>, Error> {
    match response.get("output") {
        Some(Value::Array(items)) => Ok(output_text(items).map(|text| fingerprint(&text))),
        _ => Err(Error::NotACompletion),
    }
}

/// The outputs of the trailing `function_call_output` items when the newest turn
/// answers tool calls (reasoning items between them are skipped), joined with a
/// newline; else the text of the last user message. `None` when there is neither.
pub fn newest_user_side_text(request: &Value) -> Option<String> {
    let items = items(request);
    let trailing: Vec<&Value> = items
        .iter()
        .rev()
        .filter(|item| kind(item) != Some("reasoning"))
        .take_while(|item| kind(item) == Some("function_call_output"))
        .collect();
    if trailing.is_empty() {
        return last_user_text(items);
    }
    let outputs: Vec<String> = trailing
        .iter()
        .rev()
        .filter_map(|item| output_text_of(item.get("output")?))
        .collect();
    (!outputs.is_empty()).then(|| outputs.join("\n"))
}

/// Signatures of the `function_call` items of the current turn — those after the
/// last user message — sorted and deduplicated, as [`crate::messages::tool_signatures`]
/// makes them for the equivalent Chat Completions calls.
pub fn current_tool_signatures(request: &Value) -> Vec<u64> {
    let mut signatures: Vec<u64> = items(request)
        .iter()
        .rev()
        .take_while(|item| role(item) != Some("user"))
        .filter(|item| kind(item) == Some("function_call"))
        .filter_map(|item| {
            let name = item.get("name")?.as_str()?;
            Some(tool_call_signature(
                name,
                item.get("arguments").unwrap_or(&Value::Null),
            ))
        })
        .collect();
    signatures.sort_unstable();
    signatures.dedup();
    signatures
}

/// `input` as a list of items: a string is one user message.
fn items(request: &Value) -> &[Value] {
    match request.get("input") {
        Some(Value::Array(items)) => items,
        Some(input @ Value::String(_)) => std::slice::from_ref(input),
        _ => &[],
    }
}

/// An item's `type`; a message may leave it out (an "easy input message").
fn kind(item: &Value) -> Option<&str> {
    match item {
        Value::String(_) => Some("message"),
        _ => item
            .get("type")
            .and_then(Value::as_str)
            .or_else(|| item.get("role").map(|_| "message")),
    }
}

fn role(item: &Value) -> Option<&str> {
    match item {
        // A string `input` is the user's message.
        Value::String(_) => Some("user"),
        _ if kind(item) == Some("message") => item.get("role")?.as_str(),
        _ => None,
    }
}

fn last_user_text(items: &[Value]) -> Option<String> {
    let message = items.iter().rev().find(|item| role(item) == Some("user"))?;
    match message {
        Value::String(text) => non_empty(text),
        _ => content_text(message.get("content")?),
    }
}

/// A message's text: a string, or its text parts joined with a newline.
fn content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(text) => non_empty(text),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|part| {
                    matches!(
                        part.get("type").and_then(Value::as_str),
                        Some("input_text" | "output_text" | "text")
                    )
                })
                .filter_map(|part| part.get("text")?.as_str())
                .filter(|text| !text.is_empty())
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
        _ => None,
    }
}

/// A `function_call_output`'s output: a string, or a list of content parts.
fn output_text_of(output: &Value) -> Option<String> {
    content_text(output)
}

fn output_text(items: &[Value]) -> Option<String> {
    let texts: Vec<String> = items
        .iter()
        .filter(|item| kind(item) == Some("message"))
        .filter_map(|item| content_text(item.get("content")?))
        .collect();
    (!texts.is_empty()).then(|| texts.join("\n"))
}

fn non_empty(text: &str) -> Option<String> {
    (!text.is_empty()).then(|| text.to_owned())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, arguments: &str, id: &str) -> Value {
        json!({"type": "function_call", "call_id": id, "name": name, "arguments": arguments})
    }

    fn output(id: &str, output: Value) -> Value {
        json!({"type": "function_call_output", "call_id": id, "output": output})
    }

    #[test]
    fn a_string_input_is_the_user_message() {
        let request = json!({"model": "m", "input": "Retry order #123", "stream": true});
        let f = request_fingerprint(&request).unwrap();
        assert_eq!(f.prompt, Some(fingerprint("Retry order #9")));
        assert!(f.tool_signatures.is_empty());
        assert!(f.stream);
    }

    #[test]
    fn the_last_user_text_when_the_turn_answers_no_tool() {
        let request = json!({"input": [
            {"role": "user", "content": "first task"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "done"}]},
            {"role": "user", "content": [{"type": "input_text", "text": "second"}, {"type": "input_image", "image_url": "x"}, {"type": "input_text", "text": "task"}]},
        ]});
        assert_eq!(
            newest_user_side_text(&request).as_deref(),
            Some("second\ntask")
        );
        assert!(current_tool_signatures(&request).is_empty());
    }

    #[test]
    fn a_turn_that_answers_tool_calls_reads_its_outputs() {
        let request = json!({"input": [
            {"role": "user", "content": "fix the build"},
            call("read_file", r#"{"path": "a.log"}"#, "c1"),
            output("c1", json!("no such file")),
            {"type": "reasoning", "id": "rs_1", "summary": []},
            call("read_file", r#"{"path": "b.log"}"#, "c2"),
            call("grep", r#"{"q": "x"}"#, "c3"),
            output("c2", json!("error: 12")),
            {"type": "reasoning", "id": "rs_2", "summary": []},
            output("c3", json!([{"type": "input_text", "text": "3 hits"}])),
        ]});
        assert_eq!(
            newest_user_side_text(&request).as_deref(),
            Some("error: 12\n3 hits")
        );
        let mut expected = vec![
            tool_call_signature("read_file", &json!(r#"{"path": "a.log"}"#)),
            tool_call_signature("read_file", &json!(r#"{"path": "b.log"}"#)),
            tool_call_signature("grep", &json!(r#"{"q": "x"}"#)),
        ];
        expected.sort_unstable();
        assert_eq!(
            current_tool_signatures(&request),
            expected,
            "every call since the last user message"
        );
    }

    #[test]
    fn a_new_user_message_ends_the_turn() {
        let request = json!({"input": [
            call("deploy", "{}", "c1"),
            output("c1", json!("timeout")),
            {"role": "user", "content": "try something else"},
        ]});
        assert!(current_tool_signatures(&request).is_empty());
        assert_eq!(
            newest_user_side_text(&request).as_deref(),
            Some("try something else")
        );
    }

    #[test]
    fn the_same_call_has_the_same_signature_as_in_chat_completions() {
        let chat = crate::messages::tool_signatures(&json!({"tool_calls": [
            {"type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a\"}"}}
        ]}));
        let responses = current_tool_signatures(&json!({"input": [
            {"role": "user", "content": "go"},
            call("read", "{\"path\": \"a\"}", "c1"),
            call("read", "{\"path\":\"a\"}", "c2"),
        ]}));
        assert_eq!(chat, responses);
    }

    #[test]
    fn no_input_has_no_prompt_and_non_objects_are_refused() {
        let f = request_fingerprint(&json!({"model": "m"})).unwrap();
        assert_eq!(
            (f.prompt, f.tool_signatures.len(), f.stream),
            (None, 0, false)
        );
        assert_eq!(
            newest_user_side_text(&json!({"input": [{"role": "user", "content": ""}]})),
            None
        );
        for not_an_object in [json!([]), json!("x"), json!(1), Value::Null] {
            assert_eq!(request_fingerprint(&not_an_object), Err(Error::NotAnObject));
        }
    }

    #[test]
    fn response_fingerprint_hashes_the_output_text() {
        let response = json!({"id": "resp_1", "object": "response", "output": [
            {"type": "reasoning", "id": "rs_1", "summary": []},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Deployment 42 failed", "annotations": []}]},
            call("deploy", "{}", "c1"),
        ]});
        assert_eq!(
            response_fingerprint(&response),
            Ok(Some(fingerprint("Deployment 7 failed")))
        );
        let calls_only = json!({"output": [call("deploy", "{}", "c1")]});
        assert_eq!(response_fingerprint(&calls_only), Ok(None));
        for broken in [json!({}), json!({"output": "x"}), json!("<html>")] {
            assert_eq!(response_fingerprint(&broken), Err(Error::NotACompletion));
        }
    }
}
