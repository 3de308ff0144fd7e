//! What the kill switch reads from an Anthropic Messages body (`POST /v1/messages`):
//! the same three things as from a chat-completions body ([`crate::messages`]), in
//! Anthropic's shape.
//!
//! Content is a string or an array of blocks. The assistant's tool calls are its
//! `tool_use` blocks (`name`, `input`); their results come back in the next user
//! message as `tool_result` blocks. A user message holding only tool results is the
//! agent answering the tools — OpenAI's `role: "tool"` messages — not a new prompt:
//! it neither is the "last user text" nor ends the assistant's turn.

use serde_json::Value;

use crate::messages::{tool_call_signature, RequestFingerprint};
use crate::simhash::fingerprint;
use crate::Error;

/// Reads a Messages request body: the fingerprint of its [`last_user_text`], the
/// [`current_tool_signatures`], and `stream`.
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

/// The fingerprint of a message's text blocks; `Ok(None)` when it has none (only
/// `tool_use` blocks). [`Error::NotACompletion`] unless it has a `content` array.
pub fn response_fingerprint(response: &Value) -> Result<Option<u64>, Error> {
    match response.get("content") {
        Some(Value::Array(blocks)) => Ok(blocks_text(blocks).map(|text| fingerprint(&text))),
        _ => Err(Error::NotACompletion),
    }
}

/// The text of the last user message that has any (tool-result-only messages are
/// skipped), text blocks joined with a newline.
pub fn last_user_text(request: &Value) -> Option<String> {
    messages(request)
        .iter()
        .rev()
        .filter(|m| role(m) == Some("user"))
        .find_map(|m| content_text(m.get("content")?))
}

/// Signatures of the `tool_use` blocks of the latest assistant message, provided no
/// user message with text follows it; sorted and deduplicated.
pub fn current_tool_signatures(request: &Value) -> Vec<u64> {
    let latest = messages(request).iter().rev().find(|m| match role(m) {
        Some("assistant") => true,
        Some("user") => m.get("content").and_then(content_text).is_some(),
        _ => false,
    });
    match latest {
        Some(message) if role(message) == Some("assistant") => tool_signatures(message),
        _ => Vec::new(),
    }
}

/// Signatures of one message's `tool_use` blocks (name + canonical input, the same
/// signature as the equivalent OpenAI call).
pub fn tool_signatures(message: &Value) -> Vec<u64> {
    let blocks = message
        .get("content")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let mut signatures: Vec<u64> = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("tool_use"))
        .filter_map(|b| {
            let name = b.get("name")?.as_str()?;
            Some(tool_call_signature(
                name,
                b.get("input").unwrap_or(&Value::Null),
            ))
        })
        .collect();
    signatures.sort_unstable();
    signatures.dedup();
    signatures
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
        Value::String(text) if !text.is_empty() => Some(text.clone()),
        Value::Array(blocks) => blocks_text(blocks),
        _ => None,
    }
}

fn blocks_text(blocks: &[Value]) -> Option<String> {
    let texts: Vec<&str> = blocks
        .iter()
        .filter(|b| b.get("type").and_then(Value::as_str) == Some("text"))
        .filter_map(|b| b.get("text")?.as_str())
        .collect();
    (!texts.is_empty()).then(|| texts.join("\n"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn tool_use(name: &str, input: Value) -> Value {
        json!({"type": "tool_use", "id": "toolu_1", "name": name, "input": input})
    }

    #[test]
    fn last_user_text_skips_tool_results() {
        let request = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "deploy build 42"}]},
            {"role": "assistant", "content": [tool_use("deploy", json!({"build": 42}))]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "timeout"}]},
        ]});
        assert_eq!(last_user_text(&request).as_deref(), Some("deploy build 42"));
        assert_eq!(
            last_user_text(&json!({"messages": [{"role": "user", "content": "plain"}]})).as_deref(),
            Some("plain")
        );
        assert_eq!(last_user_text(&json!({})), None);
    }

    #[test]
    fn tool_results_do_not_end_the_turn_but_a_new_prompt_does() {
        let call = tool_use("deploy", json!({"build": 42}));
        let answered = json!({"messages": [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [{"type": "text", "text": "Deploying."}, call.clone()]},
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "content": "timeout"}]},
        ]});
        assert_eq!(
            current_tool_signatures(&answered),
            vec![tool_call_signature("deploy", &json!({"build": 42}))]
        );
        let new_prompt = json!({"messages": [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": "something else"},
        ]});
        assert!(current_tool_signatures(&new_prompt).is_empty());
    }

    #[test]
    fn the_same_call_has_the_same_signature_in_both_apis() {
        let openai = crate::messages::tool_signatures(&json!({"tool_calls": [
            {"type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a\", \"n\": 1}"}}
        ]}));
        let anthropic =
            tool_signatures(&json!({"content": [tool_use("read", json!({"n": 2, "path": "a"}))]}));
        assert_eq!(openai, anthropic);
    }

    #[test]
    fn request_fingerprint_reads_prompt_calls_and_stream() {
        let body = json!({"model": "m", "stream": true, "max_tokens": 10,
            "messages": [{"role": "user", "content": "Retry order #123"}]});
        let f = request_fingerprint(&body).unwrap();
        assert_eq!(f.prompt, Some(fingerprint("Retry order #9")));
        assert!(f.tool_signatures.is_empty());
        assert!(f.stream);
        assert_eq!(request_fingerprint(&json!([])), Err(Error::NotAnObject));
    }

    #[test]
    fn response_fingerprint_hashes_the_text_blocks() {
        let message = json!({"type": "message", "role": "assistant", "content": [
            {"type": "text", "text": "Deployment 42 failed"},
            tool_use("deploy", json!({})),
        ]});
        assert_eq!(
            response_fingerprint(&message),
            Ok(Some(fingerprint("Deployment 7 failed")))
        );
        let tools_only = json!({"content": [tool_use("deploy", json!({}))]});
        assert_eq!(response_fingerprint(&tools_only), Ok(None));
        for broken in [json!({}), json!({"content": "x"}), json!("<html>")] {
            assert_eq!(response_fingerprint(&broken), Err(Error::NotACompletion));
        }
    }
}
