//! What the kill switch reads from an OpenAI-style chat-completions body: the prompt to
//! fingerprint (seed 003, "Extract user message") and the tool calls to compare
//! ("Tool call repetition check").
//!
//! The request carries the whole conversation, which grows on every turn, so hashing
//! all of it would make no two requests alike. What repeats in a loop is the newest
//! part: the last user message, and the tool calls of the assistant's latest turn.

use serde_json::Value;

use crate::normalize::normalize;
use crate::simhash::{fingerprint, hash_bytes};
use crate::stable_json::stable_stringify;
use crate::Error;

/// What the kill switch keeps of one chat-completions request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFingerprint {
    /// [`fingerprint`] of the [`last_user_text`]; `None` when there is none.
    pub prompt: Option<u64>,
    /// [`current_tool_signatures`].
    pub tool_signatures: Vec<u64>,
    /// Whether the client asked for a streamed (server-sent events) answer.
    pub stream: bool,
}

/// Reads a request body that is already parsed. Anything but a JSON object is
/// refused ([`Error::NotAnObject`]); an object without `messages` has no prompt and no
/// tool calls (the upstream judges the rest).
pub fn request_fingerprint(request: &Value) -> Result<RequestFingerprint, Error> {
    if !request.is_object() {
        return Err(Error::NotAnObject);
    }
    Ok(RequestFingerprint {
        prompt: last_user_text(request).map(|text| fingerprint(&text)),
        tool_signatures: current_tool_signatures(request),
        stream: request.get("stream").and_then(Value::as_bool) == Some(true),
    })
}

/// The fingerprint of a chat-completions answer's text ("Response hash capture"):
/// `Ok(None)` when its first choice has no text (tool calls only).
/// [`Error::NotACompletion`] unless it is an object with a `choices` array: an
/// upstream that answers anything else is broken.
pub fn response_fingerprint(response: &Value) -> Result<Option<u64>, Error> {
    if !response.get("choices").is_some_and(Value::is_array) {
        return Err(Error::NotACompletion);
    }
    Ok(response_text(response).map(|text| fingerprint(&text)))
}

/// The text of the last message with role `"user"`. Its `content` is either a string or
/// an array of parts, whose `{"type": "text", "text": …}` parts are joined with a
/// newline (image and audio parts are skipped). `None` when there is no user message
/// or it holds no text, so that image-only prompts do not all look alike.
pub fn last_user_text(request: &Value) -> Option<String> {
    let message = messages(request)
        .iter()
        .rev()
        .find(|m| role(m) == Some("user"))?;
    content_text(message.get("content")?)
}

/// The text of a chat-completions response's first choice, for the response hash.
/// `None` when it has none, e.g. when the model answered only with tool calls.
pub fn response_text(response: &Value) -> Option<String> {
    let message = response.get("choices")?.get(0)?.get("message")?;
    content_text(message.get("content")?)
}

/// Signatures of the tool calls in the agent's current turn: those of the last
/// assistant message, provided no user message follows it. A loop is the same call
/// being made turn after turn; calls from earlier turns stay in the history of every
/// later request and must not count again, and a new user message starts a new turn.
pub fn current_tool_signatures(request: &Value) -> Vec<u64> {
    let messages = messages(request);
    let latest = messages
        .iter()
        .rev()
        .find(|m| matches!(role(m), Some("assistant" | "user")));
    match latest {
        Some(message) if role(message) == Some("assistant") => tool_signatures(message),
        _ => Vec::new(),
    }
}

/// Signatures of every call in one message, from `tool_calls[].function` and the
/// legacy `function_call`, sorted and deduplicated: the window compares them as a set,
/// and the same call made twice in parallel is one call repeated, not two. Calls
/// without a name are skipped.
pub fn tool_signatures(message: &Value) -> Vec<u64> {
    let tool_calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|call| call.get("function"));
    let mut signatures: Vec<u64> = tool_calls
        .chain(message.get("function_call"))
        .filter_map(|function| {
            let name = function.get("name")?.as_str()?;
            let arguments = function.get("arguments").unwrap_or(&Value::Null);
            Some(tool_call_signature(name, arguments))
        })
        .collect();
    signatures.sort_unstable();
    signatures.dedup();
    signatures
}

/// A stable hash of a call's name and [`normalize`]d arguments. `arguments` is usually
/// a JSON-encoded string: when it parses, its canonical form (keys sorted, no
/// whitespace; see [`stable_stringify`]) is hashed, so key order and layout do not
/// matter; when it does not, the raw string is. Normalizing means a call retried with
/// a new timestamp, request id or counter has the same signature — which also makes
/// `fetch_page(page=1)` and `fetch_page(page=2)` the same call.
pub fn tool_call_signature(name: &str, arguments: &Value) -> u64 {
    let arguments = match arguments {
        Value::Null => String::new(),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(parsed) => stable_stringify(&parsed),
            Err(_) => text.clone(),
        },
        other => stable_stringify(other),
    };
    let arguments = normalize(&arguments);
    // 0xFF never occurs in UTF-8, so it separates the name from the arguments
    // unambiguously.
    let mut bytes = Vec::with_capacity(name.len() + 1 + arguments.len());
    bytes.extend_from_slice(name.as_bytes());
    bytes.push(0xFF);
    bytes.extend_from_slice(arguments.as_bytes());
    hash_bytes(&bytes)
}

fn messages(request: &Value) -> &[Value] {
    request
        .get("messages")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn role(message: &Value) -> Option<&str> {
    message.get("role")?.as_str()
}

fn content_text(content: &Value) -> Option<String> {
    match content {
        Value::String(text) => Some(text.clone()),
        Value::Array(parts) => {
            let texts: Vec<&str> = parts
                .iter()
                .filter(|part| part.get("type").and_then(Value::as_str) == Some("text"))
                .filter_map(|part| part.get("text")?.as_str())
                .collect();
            (!texts.is_empty()).then(|| texts.join("\n"))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, arguments: &str) -> Value {
        json!({"type": "function", "id": "call_1", "function": {"name": name, "arguments": arguments}})
    }

    #[test]
    fn extract_user_message() {
        let request = json!({"model": "gpt-4o", "messages": [
            {"role": "system", "content": "You are helpful."},
            {"role": "user", "content": "first question"},
            {"role": "assistant", "content": "first answer"},
            {"role": "user", "content": "second question"},
            {"role": "assistant", "content": "second answer"},
        ]});
        assert_eq!(last_user_text(&request).as_deref(), Some("second question"));
    }

    #[test]
    fn user_content_parts_are_joined() {
        let request = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "look at this"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "text", "text": "and describe it"},
        ]}]});
        assert_eq!(
            last_user_text(&request).as_deref(),
            Some("look at this\nand describe it")
        );
    }

    #[test]
    fn no_user_text_is_none() {
        assert_eq!(last_user_text(&json!({})), None);
        assert_eq!(last_user_text(&json!({"messages": "nope"})), None);
        assert_eq!(
            last_user_text(&json!({"messages": [{"role": "system", "content": "x"}]})),
            None
        );
        let image_only = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        ]}]});
        assert_eq!(last_user_text(&image_only), None);
    }

    #[test]
    fn response_text_reads_the_first_choice() {
        let response =
            json!({"choices": [{"index": 0, "message": {"role": "assistant", "content": "hi"}}]});
        assert_eq!(response_text(&response).as_deref(), Some("hi"));
        let tool_only = json!({"choices": [{"message": {"role": "assistant", "content": null, "tool_calls": [call("ls", "{}")]}}]});
        assert_eq!(response_text(&tool_only), None);
    }

    #[test]
    fn request_fingerprint_reads_prompt_calls_and_stream() {
        let history = |first: &str| {
            json!({"model": "m", "stream": false, "messages": [
                {"role": "user", "content": first},
                {"role": "assistant", "content": "ok"},
                {"role": "user", "content": "Retry order #123 at 2024-01-15T10:30:00Z"},
                {"role": "assistant", "tool_calls": [call("retry", r#"{"order": 123}"#)]},
            ]})
        };
        let a = request_fingerprint(&history("first question")).unwrap();
        let b = request_fingerprint(&history("a different start")).unwrap();
        assert_eq!(
            a, b,
            "only the last user message and the current turn count"
        );
        assert_eq!(
            a.prompt,
            Some(fingerprint("Retry order #9 at 2025-02-01T00:00:00Z"))
        );
        assert_eq!(a.tool_signatures.len(), 1);
        assert!(!a.stream);
        let streamed = request_fingerprint(&json!({"stream": true})).unwrap();
        assert_eq!(
            streamed,
            RequestFingerprint {
                prompt: None,
                tool_signatures: vec![],
                stream: true
            }
        );
        for not_an_object in [json!([]), json!("x"), json!(1), Value::Null] {
            assert_eq!(request_fingerprint(&not_an_object), Err(Error::NotAnObject));
        }
    }

    #[test]
    fn response_fingerprint_hashes_the_answer_text() {
        let answer = |content: Value| json!({"choices": [{"message": {"content": content}}]});
        assert_eq!(
            response_fingerprint(&answer(json!("Deployment 42 failed"))),
            Ok(Some(fingerprint("Deployment 7 failed")))
        );
        assert_eq!(response_fingerprint(&answer(Value::Null)), Ok(None));
        assert_eq!(response_fingerprint(&json!({"choices": []})), Ok(None));
        for broken in [
            json!({}),
            json!({"choices": {}}),
            json!([]),
            json!("<html>"),
        ] {
            assert_eq!(response_fingerprint(&broken), Err(Error::NotACompletion));
        }
    }

    #[test]
    fn signatures_ignore_key_order_layout_and_numbers() {
        let a = tool_signatures(&json!({"tool_calls": [call(
            "read_file",
            r#"{"path": "logs/run-41.txt", "lines": {"from": 1, "to": 200}}"#
        )]}));
        let b = tool_signatures(&json!({"tool_calls": [call(
            "read_file",
            "{\"lines\":{\"to\":400,\"from\":201},\n  \"path\":\"logs/run-42.txt\"}"
        )]}));
        assert_eq!(a.len(), 1);
        assert_eq!(a, b);
    }

    #[test]
    fn signatures_tell_names_and_arguments_apart() {
        let sig = |name, args| tool_call_signature(name, &Value::from(args));
        assert_ne!(
            sig("read_file", r#"{"path":"a"}"#),
            sig("write_file", r#"{"path":"a"}"#)
        );
        assert_ne!(
            sig("read_file", r#"{"path":"a"}"#),
            sig("read_file", r#"{"path":"b"}"#)
        );
        assert_ne!(sig("ab", "c"), sig("a", "bc"));
        assert_eq!(
            sig("run", "not json  at all"),
            sig("run", "not json at all")
        );
        assert_eq!(
            tool_call_signature("f", &json!({"b": 1, "a": 2})),
            sig("f", r#"{"a":2,"b":1}"#),
            "arguments given as an object are canonicalized too"
        );
        assert_eq!(tool_call_signature("f", &Value::Null), sig("f", ""));
    }

    #[test]
    fn signatures_are_sorted_deduplicated_and_include_legacy_calls() {
        let message = json!({
            "role": "assistant",
            "tool_calls": [call("b", "{}"), call("a", "{}"), call("b", "{ }"), {"function": {"arguments": "{}"}}],
            "function_call": {"name": "c", "arguments": "{}"},
        });
        let signatures = tool_signatures(&message);
        let mut expected: Vec<u64> = ["a", "b", "c"]
            .iter()
            .map(|name| tool_call_signature(name, &Value::from("{}")))
            .collect();
        expected.sort_unstable();
        assert_eq!(signatures, expected);
    }

    #[test]
    fn current_tool_signatures_come_from_the_latest_assistant_turn() {
        let turn = |messages: Value| current_tool_signatures(&json!({"messages": messages}));
        let first = call("search", r#"{"q":"rust"}"#);
        let second = call("open", r#"{"url":"https://example.com"}"#);
        let in_turn = turn(json!([
            {"role": "user", "content": "find it"},
            {"role": "assistant", "tool_calls": [first]},
            {"role": "tool", "tool_call_id": "call_1", "content": "results"},
            {"role": "assistant", "tool_calls": [second.clone()]},
            {"role": "tool", "tool_call_id": "call_1", "content": "page"},
        ]));
        assert_eq!(
            in_turn,
            tool_signatures(&json!({"tool_calls": [second.clone()]}))
        );
        let new_turn = turn(json!([
            {"role": "assistant", "tool_calls": [second]},
            {"role": "tool", "tool_call_id": "call_1", "content": "page"},
            {"role": "user", "content": "thanks, now something else"},
        ]));
        assert!(new_turn.is_empty());
        assert!(turn(json!([])).is_empty());
    }
}
