//! What the kill switch reads from an Anthropic Messages body (`POST /v1/messages`):
//! the same things as from a chat-completions body ([`crate::messages`]), in
//! Anthropic's shape, read by the same rules ([`crate::conversation`]).
//!
//! Content is a string or an array of blocks. The assistant's tool calls are its
//! `tool_use` blocks (`name`, `input`); their results come back in the next user
//! message as `tool_result` blocks — OpenAI's `role: "tool"` messages. A user message
//! with tool results answers the tools: its results are the turn's newest input (text
//! blocks beside them, such as reminders a harness appends, are not a new prompt).

use serde_json::Value;

use crate::conversation::{self, Message, PromptSource, RequestFingerprint, Side, ToolCall};
use crate::simhash::fingerprint;
use crate::Error;

/// Reads a Messages request body: the fingerprint of its prompt (as `source` says),
/// the signatures of the calls its newest input answers, and `stream`.
pub fn request_fingerprint(
    request: &Value,
    source: PromptSource,
) -> Result<RequestFingerprint, Error> {
    conversation::body_fingerprint(request, source, read)
}

/// The fingerprint of a message's text blocks; `Ok(None)` when it has none (only
/// `tool_use` blocks). [`Error::NotACompletion`] unless it has a `content` array.
pub fn response_fingerprint(response: &Value) -> Result<Option<u64>, Error> {
    match response.get("content") {
        Some(Value::Array(blocks)) => Ok(blocks_text(blocks).map(|text| fingerprint(&text))),
        _ => Err(Error::NotACompletion),
    }
}

/// The conversation of a request: `messages` by role (`user`, `assistant`; the
/// top-level `system` is not a message). A user message's text blocks are its texts,
/// its `tool_result` blocks' text (a string, or their text blocks) its results; an
/// assistant message's `tool_use` blocks its calls.
pub fn read(request: &Value) -> Vec<Message<'_>> {
    messages(request).iter().map(read_message).collect()
}

fn read_message(message: &Value) -> Message<'_> {
    let content = message.get("content").unwrap_or(&Value::Null);
    match message.get("role").and_then(Value::as_str) {
        Some("user") => {
            let results: Vec<&Value> = blocks(content, "tool_result").collect();
            Message {
                texts: texts(content),
                answers_tools: !results.is_empty(),
                result_texts: results
                    .into_iter()
                    .flat_map(|b| texts(b.get("content").unwrap_or(&Value::Null)))
                    .collect(),
                ..Message::new(Side::User)
            }
        }
        Some("assistant") => Message {
            texts: texts(content),
            tool_calls: blocks(content, "tool_use")
                .filter_map(|b| {
                    Some(ToolCall {
                        name: b.get("name")?.as_str()?,
                        arguments: b.get("input").unwrap_or(&Value::Null),
                    })
                })
                .collect(),
            ..Message::new(Side::Assistant)
        },
        _ => Message::new(Side::Other),
    }
}

fn messages(request: &Value) -> &[Value] {
    request
        .get("messages")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The blocks of `content` of one `type`.
fn blocks<'a>(content: &'a Value, kind: &'a str) -> impl Iterator<Item = &'a Value> + 'a {
    content
        .as_array()
        .into_iter()
        .flatten()
        .filter(move |b| b.get("type").and_then(Value::as_str) == Some(kind))
}

/// A string's text, or the text of its `text` blocks.
fn texts(content: &Value) -> Vec<&str> {
    match content {
        Value::String(text) => vec![text.as_str()],
        _ => blocks(content, "text")
            .filter_map(|b| b.get("text")?.as_str())
            .collect(),
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
    use crate::conversation::{
        current_tool_signatures, last_user_text, newest_user_input, tool_call_signature,
    };
    use serde_json::json;

    const NEWEST: PromptSource = PromptSource::NewestInput;

    fn tool_use(name: &str, input: Value) -> Value {
        json!({"type": "tool_use", "id": "toolu_1", "name": name, "input": input})
    }

    #[test]
    fn a_tool_turns_prompt_is_its_tool_results() {
        let request = json!({"messages": [
            {"role": "user", "content": [{"type": "text", "text": "deploy build 42"}]},
            {"role": "assistant", "content": [tool_use("deploy", json!({"build": 42}))]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "toolu_1", "content": "timeout"},
                {"type": "tool_result", "tool_use_id": "toolu_2", "is_error": true,
                 "content": [{"type": "text", "text": "disk full"}, {"type": "image", "source": {}}]},
                {"type": "text", "text": "(a reminder the harness appends)"},
            ]},
        ]});
        let conversation = read(&request);
        assert_eq!(
            newest_user_input(&conversation).as_deref(),
            Some("timeout\ndisk full")
        );
        assert_eq!(
            last_user_text(&conversation).as_deref(),
            Some("(a reminder the harness appends)")
        );
        assert_eq!(
            last_user_text(&read(
                &json!({"messages": [{"role": "user", "content": "plain"}]})
            ))
            .as_deref(),
            Some("plain")
        );
        assert_eq!(newest_user_input(&read(&json!({}))), None);
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
            current_tool_signatures(&read(&answered)),
            vec![tool_call_signature("deploy", &json!({"build": 42}))]
        );
        let new_prompt = json!({"messages": [
            {"role": "assistant", "content": [call]},
            {"role": "user", "content": "something else"},
        ]});
        assert!(current_tool_signatures(&read(&new_prompt)).is_empty());
    }

    #[test]
    fn the_same_call_has_the_same_signature_in_both_apis() {
        let openai = current_tool_signatures(&crate::messages::read(&json!({"messages": [
            {"role": "assistant", "tool_calls": [
                {"type": "function", "function": {"name": "read", "arguments": "{\"path\": \"a\", \"n\": 1}"}}
            ]}
        ]})));
        let anthropic = current_tool_signatures(&read(&json!({"messages": [
            {"role": "assistant", "content": [tool_use("read", json!({"n": 1, "path": "a"}))]}
        ]})));
        assert_eq!(openai.len(), 1);
        assert_eq!(openai, anthropic);
    }

    #[test]
    fn request_fingerprint_reads_prompt_calls_and_stream() {
        let body = json!({"model": "m", "stream": true, "max_tokens": 10,
            "messages": [{"role": "user", "content": "Retry order #123"}]});
        let f = request_fingerprint(&body, NEWEST).unwrap();
        assert_eq!(f.prompt, Some(fingerprint("Retry order #9")));
        assert!(f.tool_signatures.is_empty());
        assert!(f.stream);
        assert_eq!(
            request_fingerprint(&json!([]), NEWEST),
            Err(Error::NotAnObject)
        );
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
