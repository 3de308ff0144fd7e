//! What the kill switch reads from an OpenAI-style chat-completions body: the prompt to
//! fingerprint (seed 003, "Extract user message") and the tool calls to compare
//! ("Tool call repetition check"), read from the conversation as [`read`] sees it (the
//! readings themselves are in [`crate::conversation`], the same for every API).
//!
//! The request carries the whole conversation, which grows on every turn, so hashing
//! all of it would make no two requests alike. What repeats in a loop is the newest
//! part: the newest input from the user's side (the tool results of a tool turn), and
//! the tool calls it answers.

use serde_json::Value;

use crate::conversation::{self, Message, PromptSource, Side, ToolCall};
use crate::simhash::fingerprint;
use crate::Error;

pub use crate::conversation::{tool_call_signature, RequestFingerprint};

/// Reads a request body that is already parsed. Anything but a JSON object is
/// refused ([`Error::NotAnObject`]); an object without `messages` has no prompt and no
/// tool calls (the upstream judges the rest).
pub fn request_fingerprint(
    request: &Value,
    source: PromptSource,
) -> Result<RequestFingerprint, Error> {
    conversation::body_fingerprint(request, source, read)
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

/// The conversation of a request: `messages`, each by its role — `user`, `tool` and
/// `function` (legacy) on the user's side, `assistant` the model's (its `tool_calls`
/// and legacy `function_call`), anything else neither. `content` is a string or an
/// array of parts, whose `{"type": "text", "text": …}` parts are its texts (image and
/// audio parts are skipped). Calls without a name are skipped.
pub fn read(request: &Value) -> Vec<Message<'_>> {
    messages(request).iter().map(read_message).collect()
}

fn read_message(message: &Value) -> Message<'_> {
    let content = message.get("content");
    match message.get("role").and_then(Value::as_str) {
        Some("user") => Message {
            texts: content.map(texts).unwrap_or_default(),
            ..Message::new(Side::User)
        },
        Some("tool" | "function") => Message {
            answers_tools: true,
            result_texts: content.map(texts).unwrap_or_default(),
            ..Message::new(Side::User)
        },
        Some("assistant") => Message {
            texts: content.map(texts).unwrap_or_default(),
            tool_calls: tool_calls(message),
            ..Message::new(Side::Assistant)
        },
        _ => Message::new(Side::Other),
    }
}

/// The text of a chat-completions response's first choice, for the response hash.
/// `None` when it has none, e.g. when the model answered only with tool calls.
pub fn response_text(response: &Value) -> Option<String> {
    let message = response.get("choices")?.get(0)?.get("message")?;
    let texts = texts(message.get("content")?);
    (!texts.is_empty()).then(|| texts.join("\n"))
}

fn tool_calls(message: &Value) -> Vec<ToolCall<'_>> {
    let calls = message
        .get("tool_calls")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|call| call.get("function"));
    calls
        .chain(message.get("function_call"))
        .filter_map(|function| {
            Some(ToolCall {
                name: function.get("name")?.as_str()?,
                arguments: function.get("arguments").unwrap_or(&Value::Null),
            })
        })
        .collect()
}

fn messages(request: &Value) -> &[Value] {
    request
        .get("messages")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

fn texts(content: &Value) -> Vec<&str> {
    match content {
        Value::String(text) => vec![text.as_str()],
        Value::Array(parts) => parts
            .iter()
            .filter(|part| part.get("type").and_then(Value::as_str) == Some("text"))
            .filter_map(|part| part.get("text")?.as_str())
            .collect(),
        _ => Vec::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::{current_tool_signatures, last_user_text, newest_user_input};
    use serde_json::json;

    const NEWEST: PromptSource = PromptSource::NewestInput;

    fn call(name: &str, arguments: &str) -> Value {
        json!({"type": "function", "id": "call_1", "function": {"name": name, "arguments": arguments}})
    }

    fn prompt(request: &Value) -> Option<String> {
        newest_user_input(&read(request))
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
        assert_eq!(prompt(&request).as_deref(), Some("second question"));
        assert_eq!(
            last_user_text(&read(&request)).as_deref(),
            Some("second question")
        );
    }

    #[test]
    fn a_tool_turns_prompt_is_its_tool_results() {
        let request = json!({"messages": [
            {"role": "system", "content": "You are a coding agent."},
            {"role": "user", "content": "Fix the build."},
            {"role": "assistant", "content": null, "tool_calls": [call("grep", r#"{"pattern":"def handler_8"}"#), call("ls", "{}")]},
            {"role": "tool", "tool_call_id": "call_1", "content": "src/h.py:8: def handler_8():"},
            {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "h.py"}]},
        ]});
        assert_eq!(
            prompt(&request).as_deref(),
            Some("src/h.py:8: def handler_8():\nh.py")
        );
        assert_eq!(
            last_user_text(&read(&request)).as_deref(),
            Some("Fix the build."),
            "the seed's letter: the task, on every turn"
        );
        let legacy = json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "function_call": {"name": "ls", "arguments": "{}"}},
            {"role": "function", "name": "ls", "content": "a b"},
        ]});
        assert_eq!(prompt(&legacy).as_deref(), Some("a b"));
        assert_eq!(current_tool_signatures(&read(&legacy)).len(), 1);
    }

    #[test]
    fn user_content_parts_are_joined() {
        let request = json!({"messages": [{"role": "user", "content": [
            {"type": "text", "text": "look at this"},
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
            {"type": "text", "text": "and describe it"},
        ]}]});
        assert_eq!(
            prompt(&request).as_deref(),
            Some("look at this\nand describe it")
        );
    }

    #[test]
    fn no_user_text_is_none() {
        assert_eq!(prompt(&json!({})), None);
        assert_eq!(prompt(&json!({"messages": "nope"})), None);
        assert_eq!(
            prompt(&json!({"messages": [{"role": "system", "content": "x"}]})),
            None
        );
        let image_only = json!({"messages": [{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": "https://example.com/a.png"}},
        ]}]});
        assert_eq!(prompt(&image_only), None);
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
                {"role": "tool", "tool_call_id": "call_1", "content": "order #123 failed at 2024-01-15T10:30:01Z"},
            ]})
        };
        let a = request_fingerprint(&history("first question"), NEWEST).unwrap();
        let b = request_fingerprint(&history("a different start"), NEWEST).unwrap();
        assert_eq!(a, b, "only the newest input and the current turn count");
        assert_eq!(
            a.prompt,
            Some(fingerprint("order #9 failed at 2025-02-01T00:00:00Z"))
        );
        assert_eq!(
            a.tool_signatures,
            vec![tool_call_signature("retry", &json!({"order": 123}))]
        );
        assert!(!a.stream);
        let letter = request_fingerprint(&history("x"), PromptSource::LastUserMessage).unwrap();
        assert_eq!(
            letter.prompt,
            Some(fingerprint("Retry order #9 at 2025-02-01T00:00:00Z"))
        );
        let streamed = request_fingerprint(&json!({"stream": true}), NEWEST).unwrap();
        assert_eq!(
            streamed,
            RequestFingerprint {
                prompt: None,
                tool_signatures: vec![],
                stream: true
            }
        );
        for not_an_object in [json!([]), json!("x"), json!(1), Value::Null] {
            assert_eq!(
                request_fingerprint(&not_an_object, NEWEST),
                Err(Error::NotAnObject)
            );
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
    fn signatures_ignore_key_order_and_layout_but_not_numbers() {
        let signatures = |args: &str| {
            current_tool_signatures(&read(&json!({"messages": [
                {"role": "assistant", "tool_calls": [call("read_file", args)]},
            ]})))
        };
        let a = signatures(r#"{"path": "logs/run-41.txt", "lines": {"from": 1, "to": 200}}"#);
        let b = signatures("{\"lines\":{\"to\":200,\"from\":1},\n  \"path\":\"logs/run-41.txt\"}");
        let c = signatures(r#"{"path": "logs/run-42.txt", "lines": {"from": 1, "to": 200}}"#);
        assert_eq!(a.len(), 1);
        assert_eq!(a, b);
        assert_ne!(a, c, "another file is another call");
    }

    #[test]
    fn signatures_are_sorted_deduplicated_and_include_legacy_calls() {
        let request = json!({"messages": [{
            "role": "assistant",
            "tool_calls": [call("b", "{}"), call("a", "{}"), call("b", "{ }"), {"function": {"arguments": "{}"}}],
            "function_call": {"name": "c", "arguments": "{}"},
        }]});
        let mut expected: Vec<u64> = ["a", "b", "c"]
            .iter()
            .map(|name| tool_call_signature(name, &Value::from("{}")))
            .collect();
        expected.sort_unstable();
        assert_eq!(current_tool_signatures(&read(&request)), expected);
    }

    #[test]
    fn current_tool_signatures_come_from_the_latest_assistant_turn() {
        let turn = |messages: Value| current_tool_signatures(&read(&json!({"messages": messages})));
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
            vec![tool_call_signature(
                "open",
                &json!(r#"{"url":"https://example.com"}"#)
            )]
        );
        let new_turn = turn(json!([
            {"role": "assistant", "tool_calls": [second]},
            {"role": "tool", "tool_call_id": "call_1", "content": "page"},
            {"role": "user", "content": "thanks, now something else"},
        ]));
        assert!(new_turn.is_empty(), "the user spoke after the results");
        assert!(turn(json!([])).is_empty());
    }
}
