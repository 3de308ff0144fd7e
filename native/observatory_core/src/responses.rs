//! What the kill switch reads from an OpenAI Responses API body (`POST /v1/responses`):
//! the conversation as [`read`] sees it — the readings themselves are
//! [`crate::conversation`]'s, the same for every API — and the answer's text.
//!
//! The conversation is `input`: a string (one user message) or a list of items —
//! messages (`role` user, system, developer or assistant; text in `input_text` /
//! `output_text` parts, or a string), `function_call` items (`name`, JSON-encoded
//! `arguments`) and the `function_call_output` items that answer them, plus items the
//! kill switch does not read (reasoning, built-in tool calls, item references).
//!
//! Items map onto the conversation's messages: a user message is on the user's side;
//! a `function_call_output` is a tool result on the user's side; an assistant message
//! and the `function_call` items after it are one turn of the model's (consecutive
//! items of the model's side make one turn, as an assistant message with `tool_calls`
//! is one in Chat Completions); system and developer messages and unread items are
//! neither. So the newest input from the user's side is the `function_call_output`
//! items of the newest turn when it answers tool calls, else the last user text, and
//! the calls compared are the `function_call` items those outputs answer.

use serde_json::Value;

use crate::conversation::{self, Message, PromptSource, Side, ToolCall};
use crate::simhash::fingerprint;
use crate::Error;

pub use crate::conversation::RequestFingerprint;

/// Reads a Responses request body. Anything but a JSON object is refused
/// ([`Error::NotAnObject`]); an object without `input` has no prompt and no calls.
pub fn request_fingerprint(
    request: &Value,
    source: PromptSource,
) -> Result<RequestFingerprint, Error> {
    conversation::body_fingerprint(request, source, read)
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

/// The conversation of a request: its `input` items as [`Message`]s, consecutive
/// items of the model's side (an assistant message, `function_call` items) merged into
/// one turn.
pub fn read(request: &Value) -> Vec<Message<'_>> {
    let items: &[Value] = match request.get("input") {
        Some(Value::Array(items)) => items,
        Some(input @ Value::String(_)) => std::slice::from_ref(input),
        _ => &[],
    };
    let mut messages: Vec<Message<'_>> = Vec::with_capacity(items.len());
    for item in items {
        let message = read_item(item);
        match messages.last_mut() {
            Some(turn) if turn.side == Side::Assistant && message.side == Side::Assistant => {
                turn.texts.extend(message.texts);
                turn.tool_calls.extend(message.tool_calls);
            }
            _ => messages.push(message),
        }
    }
    messages
}

fn read_item(item: &Value) -> Message<'_> {
    if let Value::String(text) = item {
        // A string `input` is the user's message.
        return Message {
            texts: vec![text.as_str()],
            ..Message::new(Side::User)
        };
    }
    let kind = item.get("type").and_then(Value::as_str);
    let role = item.get("role").and_then(Value::as_str);
    match (kind, role) {
        (Some("function_call"), _) => Message {
            tool_calls: item
                .get("name")
                .and_then(Value::as_str)
                .map(|name| ToolCall {
                    name,
                    arguments: item.get("arguments").unwrap_or(&Value::Null),
                })
                .into_iter()
                .collect(),
            ..Message::new(Side::Assistant)
        },
        (Some("function_call_output"), _) => Message {
            answers_tools: true,
            result_texts: item.get("output").map(texts).unwrap_or_default(),
            ..Message::new(Side::User)
        },
        (None | Some("message"), Some("user")) => Message {
            texts: item.get("content").map(texts).unwrap_or_default(),
            ..Message::new(Side::User)
        },
        (None | Some("message"), Some("assistant")) => Message {
            texts: item.get("content").map(texts).unwrap_or_default(),
            ..Message::new(Side::Assistant)
        },
        _ => Message::new(Side::Other),
    }
}

/// A message's (or an output's) texts: a string, or its text parts.
fn texts(content: &Value) -> Vec<&str> {
    match content {
        Value::String(text) => vec![text.as_str()],
        Value::Array(parts) => parts
            .iter()
            .filter(|part| {
                matches!(
                    part.get("type").and_then(Value::as_str),
                    Some("input_text" | "output_text" | "text")
                )
            })
            .filter_map(|part| part.get("text")?.as_str())
            .collect(),
        _ => Vec::new(),
    }
}

fn output_text(items: &[Value]) -> Option<String> {
    let texts: Vec<&str> = items
        .iter()
        .filter(|item| item.get("type").and_then(Value::as_str) == Some("message"))
        .filter_map(|item| item.get("content"))
        .flat_map(texts)
        .filter(|text| !text.is_empty())
        .collect();
    (!texts.is_empty()).then(|| texts.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{
        current_tool_signatures, last_user_text, newest_user_input, tool_call_signature,
    };
    use serde_json::json;

    const NEWEST: PromptSource = PromptSource::NewestInput;

    fn call(name: &str, arguments: &str, id: &str) -> Value {
        json!({"type": "function_call", "call_id": id, "name": name, "arguments": arguments})
    }

    fn output(id: &str, output: Value) -> Value {
        json!({"type": "function_call_output", "call_id": id, "output": output})
    }

    fn prompt(request: &Value) -> Option<String> {
        newest_user_input(&read(request))
    }

    #[test]
    fn a_string_input_is_the_user_message() {
        let request = json!({"model": "m", "input": "Retry order #123", "stream": true});
        let f = request_fingerprint(&request, NEWEST).unwrap();
        assert_eq!(f.prompt, Some(fingerprint("Retry order #123")));
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
        assert_eq!(prompt(&request).as_deref(), Some("second\ntask"));
        assert!(current_tool_signatures(&read(&request)).is_empty());
    }

    #[test]
    fn a_turn_that_answers_tool_calls_reads_its_outputs_and_the_calls_they_answer() {
        let request = json!({"input": [
            {"role": "developer", "content": "You fix builds."},
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
        assert_eq!(prompt(&request).as_deref(), Some("error: 12\n3 hits"));
        let mut expected = vec![
            tool_call_signature("read_file", &json!(r#"{"path": "b.log"}"#)),
            tool_call_signature("grep", &json!(r#"{"q": "x"}"#)),
        ];
        expected.sort_unstable();
        assert_eq!(
            current_tool_signatures(&read(&request)),
            expected,
            "the calls the newest outputs answer, not an earlier turn's"
        );
        // The seed's letter reads the task instead.
        assert_eq!(
            last_user_text(&read(&request)).as_deref(),
            Some("fix the build")
        );
    }

    #[test]
    fn an_assistant_message_and_its_calls_are_one_turn() {
        let request = json!({"input": [
            {"role": "user", "content": "go"},
            {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Reading it."}]},
            call("read_file", r#"{"path": "a"}"#, "c1"),
            output("c1", json!("contents")),
        ]});
        let messages = read(&request);
        assert_eq!(messages.len(), 3);
        assert_eq!(messages[1].texts, vec!["Reading it."]);
        assert_eq!(messages[1].tool_calls.len(), 1);
        assert_eq!(current_tool_signatures(&messages).len(), 1);
    }

    #[test]
    fn a_new_user_message_ends_the_turn() {
        let request = json!({"input": [
            call("deploy", "{}", "c1"),
            output("c1", json!("timeout")),
            {"role": "user", "content": "try something else"},
        ]});
        assert!(current_tool_signatures(&read(&request)).is_empty());
        assert_eq!(prompt(&request).as_deref(), Some("try something else"));
    }

    #[test]
    fn the_same_call_has_the_same_signature_as_in_chat_completions() {
        let chat = crate::messages::request_fingerprint(
            &json!({"messages": [
                {"role": "user", "content": "go"},
                {"role": "assistant", "tool_calls": [
                    {"type": "function", "id": "c1", "function": {"name": "read", "arguments": "{\"path\": \"a\"}"}}
                ]},
                {"role": "tool", "tool_call_id": "c1", "content": "x"},
            ]}),
            NEWEST,
        )
        .unwrap();
        let responses = request_fingerprint(
            &json!({"input": [
                {"role": "user", "content": "go"},
                call("read", "{\"path\":\"a\"}", "c1"),
                output("c1", json!("x")),
            ]}),
            NEWEST,
        )
        .unwrap();
        assert_eq!(chat, responses);
    }

    #[test]
    fn no_input_has_no_prompt_and_non_objects_are_refused() {
        let f = request_fingerprint(&json!({"model": "m"}), NEWEST).unwrap();
        assert_eq!(
            (f.prompt, f.tool_signatures.len(), f.stream),
            (None, 0, false)
        );
        assert_eq!(
            prompt(&json!({"input": [{"role": "user", "content": ""}]})),
            None
        );
        for not_an_object in [json!([]), json!("x"), json!(1), Value::Null] {
            assert_eq!(
                request_fingerprint(&not_an_object, NEWEST),
                Err(Error::NotAnObject)
            );
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
            Ok(Some(fingerprint("Deployment 42 failed")))
        );
        let calls_only = json!({"output": [call("deploy", "{}", "c1")]});
        assert_eq!(response_fingerprint(&calls_only), Ok(None));
        for broken in [json!({}), json!({"output": "x"}), json!("<html>")] {
            assert_eq!(response_fingerprint(&broken), Err(Error::NotACompletion));
        }
    }
}
