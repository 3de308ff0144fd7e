//! Edits to a proxied request body that leave every other byte as the agent sent it.
//!
//! The proxy sometimes has to change what goes upstream: a guidance note appended to
//! the newest tool result, where the model reads it ([`append_to_newest_tool_result`]),
//! or `stream_options.include_usage` asked for so that a streamed chat completion
//! reports its tokens ([`ensure_stream_usage`]). Decoding the body and encoding it again
//! would reorder keys, re-escape strings and reformat numbers; here the body is read
//! with [`RawValue`]s, which borrow each value's exact bytes from the body, so the edit
//! is one insertion (or one replacement) at a byte offset and the rest is copied as it
//! is.
//!
//! Each level is read once more than the level above it, so the cost is a few passes
//! over the body, linear in its size. A body these functions cannot read (not JSON,
//! not the expected shape) is left alone: they return `None`.

use std::collections::HashMap;

use serde_json::value::RawValue;

/// Which API's request shape a body has.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Api {
    /// OpenAI Chat Completions: `messages`, results in `role: "tool"` messages.
    ChatCompletions,
    /// Anthropic Messages: `messages`, results in `tool_result` blocks of user messages.
    Messages,
    /// OpenAI Responses: `input` items, results in `function_call_output` items.
    Responses,
}

type Object<'a> = HashMap<String, &'a RawValue>;

/// One change to the body: `remove` bytes at `at` replaced by `insert`.
#[derive(Debug)]
struct Edit {
    at: usize,
    remove: usize,
    insert: String,
}

/// The body with `note` appended to the newest tool result — the one the model reads
/// last — in the API's shape, or `None` when the conversation's tail answers no tool
/// call (there is nothing to append to) or the body is not the API's shape.
///
/// The newest tool result is the last one after the model's last turn: a Chat
/// Completions `role: "tool"` message, the last `tool_result` block of an Anthropic user
/// message, a Responses `function_call_output` item. Its content gets the note the way
/// the API carries text there: appended to a string (after a blank line), or as one
/// more text block of a block list (`{"type": "text"}`; `input_text` for the Responses
/// API); a result with no content gets the note as its content.
pub fn append_to_newest_tool_result(body: &[u8], api: Api, note: &str) -> Option<Vec<u8>> {
    let top: Object<'_> = serde_json::from_slice(body).ok()?;
    let edit = match api {
        Api::ChatCompletions => chat_result(body, &top, note)?,
        Api::Messages => anthropic_result(body, &top, note)?,
        Api::Responses => responses_result(body, &top, note)?,
    };
    Some(apply(body, edit))
}

/// For a streamed Chat Completions request (`"stream": true`) that does not ask for
/// usage, the body asking for it (`"stream_options": {"include_usage": true}`), so that
/// the stream's last chunk reports the tokens; `None` when the body asks for it
/// already, is not streamed, or cannot be read.
pub fn ensure_stream_usage(body: &[u8]) -> Option<Vec<u8>> {
    let top: Object<'_> = serde_json::from_slice(body).ok()?;
    if top.get("stream").map(|v| v.get()) != Some("true") {
        return None;
    }
    let wanted = "{\"include_usage\":true}";
    let edit = match top.get("stream_options") {
        None => insert_member(top_end(body)?, true, "stream_options", wanted),
        Some(options) if options.get() == "null" => replace(body, options, wanted),
        Some(options) => {
            let fields: Object<'_> = serde_json::from_str(options.get()).ok()?;
            match fields.get("include_usage") {
                Some(flag) if flag.get() == "true" => return None,
                Some(flag) => replace(body, flag, "true"),
                None => insert_member(
                    closing(body, options),
                    !fields.is_empty(),
                    "include_usage",
                    "true",
                ),
            }
        }
    };
    Some(apply(body, edit))
}

/// The raw JSON text of each of the body's top-level `names` (`None` for a name the
/// object lacks), or `None` when the body is not a JSON object. Only those fields are
/// decoded later: an answer's `usage` is read without decoding its content.
pub fn top_level_fields<'a>(body: &'a [u8], names: &[&str]) -> Option<Vec<Option<&'a str>>> {
    let top: Object<'a> = serde_json::from_slice(body).ok()?;
    Some(
        names
            .iter()
            .map(|name| top.get(*name).map(|v| v.get()))
            .collect(),
    )
}

/// Chat Completions: the last `role: "tool"` message after the last assistant message.
fn chat_result(body: &[u8], top: &Object<'_>, note: &str) -> Option<Edit> {
    let messages: Vec<&RawValue> = serde_json::from_str(top.get("messages")?.get()).ok()?;
    for raw in messages.iter().rev() {
        let Ok(message) = serde_json::from_str::<Object<'_>>(raw.get()) else {
            continue;
        };
        match string_field(&message, "role").as_deref() {
            Some("assistant") => return None,
            Some("tool") => return content_edit(body, raw, &message, "content", note, "text"),
            _ => {}
        }
    }
    None
}

/// Anthropic Messages: the last `tool_result` block of the user messages after the
/// last assistant message.
fn anthropic_result(body: &[u8], top: &Object<'_>, note: &str) -> Option<Edit> {
    let messages: Vec<&RawValue> = serde_json::from_str(top.get("messages")?.get()).ok()?;
    for raw in messages.iter().rev() {
        let Ok(message) = serde_json::from_str::<Object<'_>>(raw.get()) else {
            continue;
        };
        match string_field(&message, "role").as_deref() {
            Some("assistant") => return None,
            Some("user") => {
                let Some(content) = message.get("content") else {
                    continue;
                };
                let Ok(blocks) = serde_json::from_str::<Vec<&RawValue>>(content.get()) else {
                    continue;
                };
                for block_raw in blocks.iter().rev() {
                    let Ok(block) = serde_json::from_str::<Object<'_>>(block_raw.get()) else {
                        continue;
                    };
                    if string_field(&block, "type").as_deref() == Some("tool_result") {
                        return content_edit(body, block_raw, &block, "content", note, "text");
                    }
                }
            }
            _ => {}
        }
    }
    None
}

/// Responses: the last `function_call_output` item after the model's last turn (an
/// assistant message or a `function_call` item; the outputs follow their calls).
fn responses_result(body: &[u8], top: &Object<'_>, note: &str) -> Option<Edit> {
    let items: Vec<&RawValue> = serde_json::from_str(top.get("input")?.get()).ok()?;
    for raw in items.iter().rev() {
        let Ok(item) = serde_json::from_str::<Object<'_>>(raw.get()) else {
            continue;
        };
        let kind = string_field(&item, "type");
        let role = string_field(&item, "role");
        if kind.as_deref() == Some("function_call") || role.as_deref() == Some("assistant") {
            return None;
        }
        if kind.as_deref() == Some("function_call_output") {
            return content_edit(body, raw, &item, "output", note, "input_text");
        }
    }
    None
}

/// The edit that appends `note` to the `field` of `holder` (a string, a list of text
/// blocks of type `block_type`, null or absent).
fn content_edit(
    body: &[u8],
    holder_raw: &RawValue,
    holder: &Object<'_>,
    field: &str,
    note: &str,
    block_type: &str,
) -> Option<Edit> {
    let quoted = serde_json::to_string(note).ok()?;
    match holder.get(field) {
        None => Some(insert_member(
            closing(body, holder_raw),
            !holder.is_empty(),
            field,
            &quoted,
        )),
        Some(value) => match value.get().as_bytes().first() {
            Some(b'n') => Some(replace(body, value, &quoted)),
            Some(b'"') => {
                // Inside the string, before its closing quote; after a blank line
                // unless the string is empty.
                let escaped = &quoted[1..quoted.len() - 1];
                let separator = if value.get() == "\"\"" { "" } else { "\\n\\n" };
                Some(Edit {
                    at: closing(body, value),
                    remove: 0,
                    insert: format!("{separator}{escaped}"),
                })
            }
            Some(b'[') => {
                let blocks: Vec<&RawValue> = serde_json::from_str(value.get()).ok()?;
                let comma = if blocks.is_empty() { "" } else { "," };
                Some(Edit {
                    at: closing(body, value),
                    remove: 0,
                    insert: format!("{comma}{{\"type\":\"{block_type}\",\"text\":{quoted}}}"),
                })
            }
            _ => None,
        },
    }
}

fn string_field(object: &Object<'_>, name: &str) -> Option<String> {
    object
        .get(name)
        .and_then(|v| serde_json::from_str::<String>(v.get()).ok())
}

/// Where `value` starts in `body` (it borrows from it).
fn offset(body: &[u8], value: &RawValue) -> usize {
    value.get().as_ptr() as usize - body.as_ptr() as usize
}

/// The offset of `value`'s last byte: the closing quote, bracket or brace.
fn closing(body: &[u8], value: &RawValue) -> usize {
    offset(body, value) + value.get().len() - 1
}

/// The offset of the top-level object's closing brace.
fn top_end(body: &[u8]) -> Option<usize> {
    let end = body.iter().rposition(|b| !b.is_ascii_whitespace())?;
    (body[end] == b'}').then_some(end)
}

fn replace(body: &[u8], value: &RawValue, with: &str) -> Edit {
    Edit {
        at: offset(body, value),
        remove: value.get().len(),
        insert: with.to_owned(),
    }
}

/// `"name": value` inserted before an object's closing brace at `at`.
fn insert_member(at: usize, after_others: bool, name: &str, value: &str) -> Edit {
    let comma = if after_others { "," } else { "" };
    let name = serde_json::to_string(name).unwrap_or_default();
    Edit {
        at,
        remove: 0,
        insert: format!("{comma}{name}:{value}"),
    }
}

fn apply(body: &[u8], edit: Edit) -> Vec<u8> {
    let mut out = Vec::with_capacity(body.len() + edit.insert.len());
    out.extend_from_slice(&body[..edit.at]);
    out.extend_from_slice(edit.insert.as_bytes());
    out.extend_from_slice(&body[edit.at + edit.remove..]);
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{json, Value};

    const NOTE: &str = "Loop warning: \"read_file\" 3 times.";

    fn appended(body: &str, api: Api) -> Option<String> {
        append_to_newest_tool_result(body.as_bytes(), api, NOTE)
            .map(|b| String::from_utf8(b).unwrap())
    }

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn chat_string_result_gets_the_note_after_a_blank_line_and_nothing_else_changes() {
        let body = r#"{"model":"m",  "messages":[{"role":"user","content":"fix it"},{"role":"assistant","tool_calls":[{"id":"c1","type":"function","function":{"name":"run","arguments":"{}"}}]},{"role":"tool","tool_call_id":"c1","content":"error: \u00e9 no"}], "z": 1.50}"#;
        let out = appended(body, Api::ChatCompletions).unwrap();
        let expected = body.replace(
            r#""error: \u00e9 no""#,
            r#""error: \u00e9 no\n\nLoop warning: \"read_file\" 3 times.""#,
        );
        assert_eq!(out, expected);
        assert_eq!(
            parse(&out)["messages"][2]["content"],
            json!(format!("error: é no\n\n{NOTE}"))
        );
    }

    #[test]
    fn chat_block_list_gets_a_text_block_and_the_newest_of_several_results_is_chosen() {
        let body = json!({"messages": [
            {"role": "assistant", "tool_calls": []},
            {"role": "tool", "tool_call_id": "a", "content": "first"},
            {"role": "tool", "tool_call_id": "b", "content": [{"type": "text", "text": "second"}]},
            {"role": "user", "content": "<reminder>keep going</reminder>"}
        ]})
        .to_string();
        let out = parse(&appended(&body, Api::ChatCompletions).unwrap());
        assert_eq!(out["messages"][1]["content"], json!("first"));
        assert_eq!(
            out["messages"][2]["content"],
            json!([{"type": "text", "text": "second"}, {"type": "text", "text": NOTE}])
        );
        assert_eq!(
            out["messages"][3]["content"],
            json!("<reminder>keep going</reminder>")
        );
    }

    #[test]
    fn chat_without_a_result_after_the_last_assistant_turn_is_left_alone() {
        let prompt = json!({"messages": [
            {"role": "tool", "tool_call_id": "a", "content": "old"},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "thanks"}
        ]})
        .to_string();
        assert_eq!(appended(&prompt, Api::ChatCompletions), None);
        assert_eq!(appended("{\"messages\":[]}", Api::ChatCompletions), None);
        assert_eq!(appended("not json", Api::ChatCompletions), None);
        assert_eq!(appended("{\"messages\":3}", Api::ChatCompletions), None);
    }

    #[test]
    fn empty_null_and_missing_contents_get_the_note_as_content() {
        let empty = r#"{"messages":[{"role":"tool","tool_call_id":"a","content":""}]}"#;
        assert_eq!(
            parse(&appended(empty, Api::ChatCompletions).unwrap())["messages"][0]["content"],
            json!(NOTE)
        );
        let null = r#"{"messages":[{"role":"tool","tool_call_id":"a","content":null}]}"#;
        assert_eq!(
            parse(&appended(null, Api::ChatCompletions).unwrap())["messages"][0]["content"],
            json!(NOTE)
        );
        let missing = r#"{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t"}]}]}"#;
        assert_eq!(
            parse(&appended(missing, Api::Messages).unwrap())["messages"][0]["content"][0]
                ["content"],
            json!(NOTE)
        );
        let empty_list = r#"{"messages":[{"role":"tool","tool_call_id":"a","content":[ ]}]}"#;
        assert_eq!(
            parse(&appended(empty_list, Api::ChatCompletions).unwrap())["messages"][0]["content"],
            json!([{"type": "text", "text": NOTE}])
        );
    }

    #[test]
    fn anthropic_last_tool_result_block_string_or_blocks() {
        let body = json!({"model": "claude", "max_tokens": 9, "messages": [
            {"role": "user", "content": "fix it"},
            {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "run", "input": {}},
                                               {"type": "tool_use", "id": "t2", "name": "run", "input": {}}]},
            {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": "t1", "content": "one"},
                {"type": "tool_result", "tool_use_id": "t2", "is_error": true,
                 "content": [{"type": "text", "text": "two"}]},
                {"type": "text", "text": "reminder"}
            ]}
        ]})
        .to_string();
        let out = parse(&appended(&body, Api::Messages).unwrap());
        let blocks = &out["messages"][2]["content"];
        assert_eq!(blocks[0]["content"], json!("one"));
        assert_eq!(
            blocks[1]["content"],
            json!([{"type": "text", "text": "two"}, {"type": "text", "text": NOTE}])
        );
        assert_eq!(blocks[2], json!({"type": "text", "text": "reminder"}));

        let string = r#"{"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"t","content":"out"}]}]}"#;
        assert_eq!(
            parse(&appended(string, Api::Messages).unwrap())["messages"][0]["content"][0]
                ["content"],
            json!(format!("out\n\n{NOTE}"))
        );
        let text_only = r#"{"messages":[{"role":"user","content":"hello"}]}"#;
        assert_eq!(appended(text_only, Api::Messages), None);
    }

    #[test]
    fn anthropic_without_a_result_after_the_last_assistant_turn_is_left_alone() {
        // The result the model has answered already is not the newest one.
        let answered = json!({"messages": [
            {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "old"}]},
            {"role": "assistant", "content": "Done."},
            {"role": "user", "content": "thanks"}
        ]})
        .to_string();
        assert_eq!(appended(&answered, Api::Messages), None);
    }

    #[test]
    fn responses_function_call_output_string_or_parts() {
        let body = json!({"model": "gpt", "input": [
            {"role": "user", "content": "fix it"},
            {"type": "function_call", "call_id": "c1", "name": "run", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "no such file"}
        ]})
        .to_string();
        let out = parse(&appended(&body, Api::Responses).unwrap());
        assert_eq!(
            out["input"][2]["output"],
            json!(format!("no such file\n\n{NOTE}"))
        );

        let parts = json!({"input": [
            {"type": "function_call_output", "call_id": "c1",
             "output": [{"type": "input_text", "text": "a"}]}
        ]})
        .to_string();
        let out = parse(&appended(&parts, Api::Responses).unwrap());
        assert_eq!(
            out["input"][0]["output"],
            json!([{"type": "input_text", "text": "a"}, {"type": "input_text", "text": NOTE}])
        );
        let answered = json!({"input": [
            {"type": "function_call_output", "call_id": "c1", "output": "x"},
            {"type": "function_call", "call_id": "c2", "name": "run", "arguments": "{}"}
        ]})
        .to_string();
        assert_eq!(appended(&answered, Api::Responses), None);
        assert_eq!(appended(r#"{"input":"just text"}"#, Api::Responses), None);
    }

    #[test]
    fn stream_usage_is_asked_for_once_in_every_shape() {
        let ask = |body: &str| {
            ensure_stream_usage(body.as_bytes()).map(|b| String::from_utf8(b).unwrap())
        };
        assert_eq!(
            ask(r#"{"model":"m","stream":true} "#).unwrap(),
            r#"{"model":"m","stream":true,"stream_options":{"include_usage":true}} "#
        );
        assert_eq!(
            ask(r#"{"stream":true,"stream_options":{}}"#).unwrap(),
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#
        );
        assert_eq!(
            ask(r#"{"stream":true,"stream_options":{"a":1}}"#).unwrap(),
            r#"{"stream":true,"stream_options":{"a":1,"include_usage":true}}"#
        );
        assert_eq!(
            ask(r#"{"stream":true,"stream_options":{"include_usage": false}}"#).unwrap(),
            r#"{"stream":true,"stream_options":{"include_usage": true}}"#
        );
        assert_eq!(
            ask(r#"{"stream":true,"stream_options":null}"#).unwrap(),
            r#"{"stream":true,"stream_options":{"include_usage":true}}"#
        );
        assert_eq!(
            ask(r#"{"stream":true,"stream_options":{"include_usage":true}}"#),
            None
        );
        assert_eq!(ask(r#"{"stream":false}"#), None);
        assert_eq!(ask(r#"{"model":"m"}"#), None);
        assert_eq!(ask("[1]"), None);
    }

    use proptest::prelude::*;

    // A Chat Completions conversation: a task, then turns of one call and its result,
    // any strings (escapes, quotes, non-ASCII), written with random spacing; the last
    // result a string or a list of text parts.
    fn arb_body() -> impl Strategy<Value = (String, Vec<String>, bool)> {
        (
            prop::collection::vec(any::<String>(), 1..6),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(results, blocks, spaced)| {
                let sep = if spaced { ", " } else { "," };
                let mut messages = vec![json!({"role": "user", "content": "task"}).to_string()];
                let last = results.len() - 1;
                for (k, result) in results.iter().enumerate() {
                    messages.push(
                        json!({"role": "assistant", "tool_calls": [{"id": format!("c{k}"),
                            "type": "function", "function": {"name": "f", "arguments": "{}"}}]})
                        .to_string(),
                    );
                    let content = if k == last && blocks {
                        json!([{"type": "text", "text": result}])
                    } else {
                        json!(result)
                    };
                    messages.push(
                        json!({"role": "tool", "tool_call_id": format!("c{k}"), "content": content})
                            .to_string(),
                    );
                }
                let body = format!(
                    "{{\"model\":\"m\"{sep}\"messages\": [{}] }}",
                    messages.join(sep)
                );
                (body, results, blocks)
            })
    }

    proptest! {
        #[test]
        fn the_note_reaches_the_newest_result_and_nothing_else_changes(
            (body, results, blocks) in arb_body(),
            note in any::<String>()
        ) {
            let out = append_to_newest_tool_result(body.as_bytes(), Api::ChatCompletions, &note).unwrap();
            let before: Value = serde_json::from_str(&body).unwrap();
            let mut after: Value = serde_json::from_slice(&out).unwrap();
            let last = after["messages"].as_array().unwrap().len() - 1;
            let newest = results.last().unwrap();
            let expected = if blocks {
                json!([{"type": "text", "text": newest}, {"type": "text", "text": note}])
            } else if newest.is_empty() {
                json!(note)
            } else {
                json!(format!("{newest}\n\n{note}"))
            };
            prop_assert_eq!(&after["messages"][last]["content"], &expected);
            // Put the newest result back: the rest is the body the agent sent.
            after["messages"][last]["content"] = before["messages"][last]["content"].clone();
            prop_assert_eq!(&after, &before);
            // One insertion: the body's bytes are a prefix and a suffix of the output.
            let cut = (0..body.len()).find(|&i| out[i] != body.as_bytes()[i]).unwrap_or(body.len());
            prop_assert!(out.ends_with(&body.as_bytes()[cut..]));
        }
    }

    #[test]
    fn top_level_fields_are_raw_text() {
        let body = br#"{"model":"gpt-4o","choices":[{"x":1}],"usage":{"prompt_tokens":3}}"#;
        assert_eq!(
            top_level_fields(body, &["model", "usage", "absent"]).unwrap(),
            vec![Some("\"gpt-4o\""), Some("{\"prompt_tokens\":3}"), None]
        );
        assert_eq!(top_level_fields(b"[]", &["model"]), None);
    }
}
