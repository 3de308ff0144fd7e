//! A conversation as the kill switch reads it, whatever the API's shape.
//!
//! Each API (Chat Completions in [`crate::messages`], Anthropic Messages in
//! [`crate::anthropic_messages`], the OpenAI Responses API in [`crate::responses`])
//! turns its request body into a list of [`Message`]s that borrow from the body; the
//! readings the kill switch needs — the newest input from the user's side, the tool
//! calls it answers, their signatures — are defined once, here, on that list
//! ([`body_fingerprint`] reads a body with an API's reader). Another API only needs a
//! reader of its own.
//!
//! A tool-calling agent re-sends the whole conversation on every turn. What is new in
//! a request is its tail: the block of user-side messages after the model's last turn
//! (a prompt, or the results of the tools the model called), and the tool calls those
//! results answer. That is what a loop repeats, and what the kill switch compares.

use serde_json::{Map, Value};

use crate::simhash::{fingerprint, hash_bytes};
use crate::stable_json::stable_stringify;
use crate::Error;

/// Which side of the conversation a message is on.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Side {
    /// The user and the tools' results (OpenAI `user`, `tool`, `function` messages;
    /// Anthropic `user` messages, which carry `tool_result` blocks).
    User,
    /// The model (`assistant`).
    Assistant,
    /// Anything else (`system`, `developer`): neither a prompt nor a turn boundary.
    #[default]
    Other,
}

/// One tool call: its name and its arguments (a JSON-encoded string in the OpenAI
/// shapes, an object in Anthropic's).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct ToolCall<'a> {
    pub name: &'a str,
    pub arguments: &'a Value,
}

/// One message, reduced to what the kill switch reads.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Message<'a> {
    pub side: Side,
    /// Its own text parts (not those of tool results), in order.
    pub texts: Vec<&'a str>,
    /// Whether it carries tool results (an OpenAI `tool` message; `tool_result` blocks).
    pub answers_tools: bool,
    /// The text parts of its tool results, in order (a result may have none: an image).
    pub result_texts: Vec<&'a str>,
    /// The tool calls the model made in it.
    pub tool_calls: Vec<ToolCall<'a>>,
}

impl<'a> Message<'a> {
    pub fn new(side: Side) -> Self {
        Self {
            side,
            ..Self::default()
        }
    }
}

/// What a request's "last user message" is (seed 003, "Extract user message").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PromptSource {
    /// The newest input from the user's side: for a turn that answers tool calls, the
    /// tool results; otherwise the last user text. The default: in a tool loop the last
    /// message with role `user` is the original task, the same on every turn, so reading
    /// only it makes every request of a healthy agent a "similar prompt".
    #[default]
    NewestInput,
    /// The seed's letter: the text of the last message with role `user`, tool-result-only
    /// messages skipped.
    LastUserMessage,
}

/// What the kill switch keeps of one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFingerprint {
    /// [`fingerprint`] of the [`prompt_text`]; `None` when there is none.
    pub prompt: Option<u64>,
    /// [`current_tool_signatures`].
    pub tool_signatures: Vec<u64>,
    /// Whether the client asked for a streamed (server-sent events) answer.
    pub stream: bool,
}

/// Reads a conversation: the fingerprint of its prompt (as `source` says) and the
/// signatures of the calls its newest input answers.
pub fn request_fingerprint(
    messages: &[Message<'_>],
    stream: bool,
    source: PromptSource,
) -> RequestFingerprint {
    RequestFingerprint {
        prompt: prompt_text(messages, source).map(|text| fingerprint(&text)),
        tool_signatures: current_tool_signatures(messages),
        stream,
    }
}

/// Reads a request body with an API's `read`er: anything but a JSON object is refused
/// ([`Error::NotAnObject`]); otherwise [`request_fingerprint`] of its conversation, with
/// `stream` its `"stream": true`.
pub fn body_fingerprint<'a>(
    request: &'a Value,
    source: PromptSource,
    read: impl FnOnce(&'a Value) -> Vec<Message<'a>>,
) -> Result<RequestFingerprint, Error> {
    if !request.is_object() {
        return Err(Error::NotAnObject);
    }
    let stream = request.get("stream").and_then(Value::as_bool) == Some(true);
    Ok(request_fingerprint(&read(request), stream, source))
}

/// The text that stands for the request's prompt; `None` when there is none (no user
/// message, or one with no text — an image — so that such prompts do not all look
/// alike).
pub fn prompt_text(messages: &[Message<'_>], source: PromptSource) -> Option<String> {
    match source {
        PromptSource::NewestInput => newest_user_input(messages),
        PromptSource::LastUserMessage => last_user_text(messages),
    }
}

/// The newest input from the user's side, in the last block of user-side messages
/// (the messages after the model's last turn; before it, when the conversation ends
/// with a prefilled assistant message): when the block answers tool calls, the texts of
/// its tool results joined with a newline; else the texts of its last user message with
/// text. A block answers tool calls when it holds tool results and no user message with
/// text of its own comes after them (text beside the results, in the same message, does
/// not make a new prompt).
pub fn newest_user_input(messages: &[Message<'_>]) -> Option<String> {
    let block = user_block(messages)?;
    match block_input(block) {
        BlockInput::ToolResults(from) => {
            let texts: Vec<&str> = block[from..]
                .iter()
                .flat_map(|m| m.result_texts.iter().copied())
                .collect();
            join(&texts)
        }
        BlockInput::Prompt(Some(at)) => join(&block[at].texts),
        BlockInput::Prompt(None) => None,
    }
}

/// What a block of user-side messages says.
enum BlockInput {
    /// It answers tool calls: the results from this message on.
    ToolResults(usize),
    /// It is a prompt: the message with its text, if any.
    Prompt(Option<usize>),
}

fn block_input(block: &[Message<'_>]) -> BlockInput {
    let prompt = block
        .iter()
        .rposition(|m| !m.answers_tools && join(&m.texts).is_some());
    match block.iter().rposition(|m| m.answers_tools) {
        Some(results) if prompt.is_none_or(|p| p < results) => {
            BlockInput::ToolResults(prompt.map_or(0, |p| p + 1))
        }
        _ => BlockInput::Prompt(prompt),
    }
}

/// The texts of the last user-side message that has any, joined with a newline (tool
/// results are not texts: a message of tool results only is skipped).
pub fn last_user_text(messages: &[Message<'_>]) -> Option<String> {
    messages
        .iter()
        .rev()
        .filter(|m| m.side == Side::User)
        .find_map(|m| join(&m.texts))
}

/// The calls of the model's latest turn, provided the conversation's newest input
/// answers them (or nothing follows them). A loop is the same call made turn after
/// turn; calls of earlier turns stay in every later request's history and must not
/// count again, and a new user prompt starts a new turn.
pub fn current_tool_calls<'m, 'a>(messages: &'m [Message<'a>]) -> Vec<&'m ToolCall<'a>> {
    let end = match last_non_other(messages) {
        Some(i) if messages[i].side == Side::User => {
            let block = user_block_at(messages, i);
            if !matches!(block_input(block), BlockInput::ToolResults(_)) {
                return Vec::new();
            }
            i + 1 - block.len()
        }
        Some(i) => i + 1,
        None => return Vec::new(),
    };
    let turn = trailing_run(&messages[..end], Side::Assistant);
    turn.iter().flat_map(|m| m.tool_calls.iter()).collect()
}

/// Signatures of the [`current_tool_calls`], sorted and deduplicated: the window
/// compares them as a set, and the same call made twice in parallel is one call.
pub fn current_tool_signatures(messages: &[Message<'_>]) -> Vec<u64> {
    let mut signatures: Vec<u64> = current_tool_calls(messages)
        .into_iter()
        .map(|call| tool_call_signature(call.name, call.arguments))
        .collect();
    signatures.sort_unstable();
    signatures.dedup();
    signatures
}

/// A stable hash of a call: its name and its arguments in canonical form. Calls are
/// the same when they are identical (seed 003, "identical tool call signatures"):
/// key order and layout do not matter, nor do runs of whitespace inside strings
/// (`ls  -la` is `ls -la`), but every other character does — `handler_8` is not
/// `handler_2`, and one record's UUID is not another's. `arguments` given as a
/// JSON-encoded string is parsed first; a string that does not parse is compared as
/// the text it is.
pub fn tool_call_signature(name: &str, arguments: &Value) -> u64 {
    let canonical = match arguments {
        Value::Null => String::new(),
        Value::String(text) => match serde_json::from_str::<Value>(text) {
            Ok(parsed) => stable_stringify(&collapse_strings(&parsed)),
            Err(_) => collapse_whitespace(text),
        },
        other => stable_stringify(&collapse_strings(other)),
    };
    // 0xFF never occurs in UTF-8, so it separates the name from the arguments
    // unambiguously.
    let mut bytes = Vec::with_capacity(name.len() + 1 + canonical.len());
    bytes.extend_from_slice(name.as_bytes());
    bytes.push(0xFF);
    bytes.extend_from_slice(canonical.as_bytes());
    hash_bytes(&bytes)
}

/// Every string in `value` (keys too) with its runs of whitespace made one space and
/// its ends trimmed.
fn collapse_strings(value: &Value) -> Value {
    match value {
        Value::String(text) => Value::String(collapse_whitespace(text)),
        Value::Array(items) => Value::Array(items.iter().map(collapse_strings).collect()),
        Value::Object(map) => Value::Object(
            map.iter()
                .map(|(k, v)| (collapse_whitespace(k), collapse_strings(v)))
                .collect::<Map<String, Value>>(),
        ),
        other => other.clone(),
    }
}

fn collapse_whitespace(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

fn join(texts: &[&str]) -> Option<String> {
    let texts: Vec<&str> = texts.iter().copied().filter(|t| !t.is_empty()).collect();
    (!texts.is_empty()).then(|| texts.join("\n"))
}

fn last_non_other(messages: &[Message<'_>]) -> Option<usize> {
    messages.iter().rposition(|m| m.side != Side::Other)
}

/// The block of user-side messages the prompt comes from: the trailing one, or the one
/// before a trailing (prefilled) assistant turn.
fn user_block<'m, 'a>(messages: &'m [Message<'a>]) -> Option<&'m [Message<'a>]> {
    let last = last_non_other(messages)?;
    let end = if messages[last].side == Side::User {
        last
    } else {
        let turn = trailing_run(&messages[..=last], Side::Assistant);
        last_non_other(&messages[..last + 1 - turn.len()])?
    };
    (messages[end].side == Side::User).then(|| user_block_at(messages, end))
}

/// The run of user-side messages (and `Other`s among them) ending at `end`, a user-side
/// message.
fn user_block_at<'m, 'a>(messages: &'m [Message<'a>], end: usize) -> &'m [Message<'a>] {
    trailing_run(&messages[..=end], Side::User)
}

/// The longest tail of `messages` whose messages are on `side` or `Other`, trimmed of
/// leading `Other`s.
fn trailing_run<'m, 'a>(messages: &'m [Message<'a>], side: Side) -> &'m [Message<'a>] {
    let start = messages
        .iter()
        .rposition(|m| m.side != side && m.side != Side::Other)
        .map_or(0, |i| i + 1);
    let run = &messages[start..];
    let first = run.iter().position(|m| m.side == side).unwrap_or(run.len());
    &run[first..]
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn user(text: &'static str) -> Message<'static> {
        Message {
            texts: vec![text],
            ..Message::new(Side::User)
        }
    }

    fn results(texts: &[&'static str]) -> Message<'static> {
        Message {
            answers_tools: true,
            result_texts: texts.to_vec(),
            ..Message::new(Side::User)
        }
    }

    fn assistant(text: Option<&'static str>, calls: Vec<ToolCall<'static>>) -> Message<'static> {
        Message {
            texts: text.into_iter().collect(),
            tool_calls: calls,
            ..Message::new(Side::Assistant)
        }
    }

    fn call(name: &'static str, arguments: &'static Value) -> ToolCall<'static> {
        ToolCall { name, arguments }
    }

    fn leak(value: Value) -> &'static Value {
        Box::leak(Box::new(value))
    }

    #[test]
    fn newest_input_of_a_tool_turn_is_its_results() {
        let args = leak(json!({"path": "a.py"}));
        let conversation = [
            Message::new(Side::Other),
            user("Fix the build."),
            assistant(None, vec![call("read_file", args)]),
            results(&["def a(): pass"]),
        ];
        assert_eq!(
            newest_user_input(&conversation).as_deref(),
            Some("def a(): pass")
        );
        assert_eq!(
            last_user_text(&conversation).as_deref(),
            Some("Fix the build."),
            "the seed's letter reads the task on every turn"
        );
    }

    #[test]
    fn parallel_results_are_joined_in_order_and_a_textless_result_is_no_prompt() {
        let conversation = [
            user("go"),
            assistant(None, vec![]),
            results(&["first"]),
            results(&["", "second"]),
        ];
        assert_eq!(
            newest_user_input(&conversation).as_deref(),
            Some("first\nsecond")
        );
        let image_only = [user("go"), assistant(None, vec![]), results(&[])];
        assert_eq!(newest_user_input(&image_only), None);
    }

    #[test]
    fn a_user_text_after_the_results_is_a_new_prompt_but_text_beside_them_is_not() {
        let args = leak(json!({}));
        let after = [
            user("go"),
            assistant(None, vec![call("ls", args)]),
            results(&["a b"]),
            user("now something else"),
        ];
        assert_eq!(
            newest_user_input(&after).as_deref(),
            Some("now something else")
        );
        assert!(current_tool_calls(&after).is_empty());
        let beside = [
            user("go"),
            assistant(None, vec![call("ls", args)]),
            Message {
                texts: vec!["(a reminder the harness adds)"],
                ..results(&["a b"])
            },
        ];
        assert_eq!(newest_user_input(&beside).as_deref(), Some("a b"));
        assert_eq!(current_tool_calls(&beside).len(), 1);
    }

    #[test]
    fn results_after_a_user_note_are_the_input_and_those_before_it_are_not() {
        let args = leak(json!({}));
        // A user note between two results of one turn: the results after it are the
        // newest input; those before it were followed by a prompt.
        let conversation = [
            user("go"),
            assistant(None, vec![call("ls", args), call("cat", args)]),
            results(&["old"]),
            user("a note"),
            results(&["new"]),
        ];
        assert_eq!(newest_user_input(&conversation).as_deref(), Some("new"));
        assert_eq!(current_tool_calls(&conversation).len(), 2);
    }

    #[test]
    fn newest_input_without_tools_is_the_last_user_text() {
        let conversation = [
            user("first question"),
            assistant(Some("first answer"), vec![]),
            user("second question"),
            user(""),
        ];
        assert_eq!(
            newest_user_input(&conversation).as_deref(),
            Some("second question")
        );
        let prefilled = [user("write JSON"), assistant(Some("{"), vec![])];
        assert_eq!(newest_user_input(&prefilled).as_deref(), Some("write JSON"));
        assert_eq!(newest_user_input(&[]), None);
        assert_eq!(newest_user_input(&[Message::new(Side::Other)]), None);
        assert_eq!(newest_user_input(&[assistant(Some("hi"), vec![])]), None);
    }

    #[test]
    fn current_calls_are_those_the_newest_input_answers() {
        let a = leak(json!({"q": "a"}));
        let b = leak(json!({"q": "b"}));
        let answered = [
            user("go"),
            assistant(None, vec![call("search", a)]),
            results(&["x"]),
            assistant(Some("and"), vec![call("search", b)]),
            Message::new(Side::Other),
            assistant(None, vec![call("open", a)]),
            results(&["y"]),
        ];
        let names: Vec<&str> = current_tool_calls(&answered)
            .iter()
            .map(|c| c.name)
            .collect();
        assert_eq!(
            names,
            vec!["search", "open"],
            "consecutive assistant items are one turn"
        );
        let new_prompt = [
            assistant(None, vec![call("search", a)]),
            results(&["x"]),
            assistant(None, vec![call("search", b)]),
            user("thanks, something else"),
        ];
        assert!(current_tool_calls(&new_prompt).is_empty());
        let unanswered = [user("go"), assistant(None, vec![call("search", a)])];
        assert_eq!(current_tool_calls(&unanswered).len(), 1);
        assert!(current_tool_calls(&[]).is_empty());
    }

    #[test]
    fn signatures_compare_identical_calls() {
        let sig = |name, args: Value| tool_call_signature(name, &args);
        assert_eq!(
            sig(
                "grep",
                json!(r#"{"pattern": "def handler_8", "path": "src"}"#)
            ),
            sig("grep", json!({"path": "src", "pattern": "def   handler_8"})),
            "key order, layout and runs of whitespace do not matter"
        );
        assert_ne!(
            sig("grep", json!({"pattern": "def handler_8"})),
            sig("grep", json!({"pattern": "def handler_2"})),
            "numbers do"
        );
        assert_ne!(
            sig("get", json!({"id": "550e8400-e29b-41d4-a716-446655440000"})),
            sig("get", json!({"id": "6ba7b810-9dad-11d1-80b4-00c04fd430c8"})),
            "ids and timestamps do"
        );
        assert_ne!(
            sig("read", json!({"path": "a"})),
            sig("write", json!({"path": "a"}))
        );
        assert_ne!(sig("ab", json!("c")), sig("a", json!("bc")));
        assert_eq!(
            sig("run", json!("not json  at all")),
            sig("run", json!("not json at all"))
        );
        assert_eq!(sig("f", Value::Null), sig("f", json!("")));
    }

    #[test]
    fn a_request_fingerprint_follows_the_prompt_source() {
        let args = leak(json!({"path": "a.py"}));
        let conversation = [
            user("Fix the build."),
            assistant(None, vec![call("read_file", args)]),
            results(&["def a(): pass"]),
        ];
        let newest = request_fingerprint(&conversation, true, PromptSource::NewestInput);
        assert_eq!(newest.prompt, Some(fingerprint("def a(): pass")));
        assert_eq!(
            newest.tool_signatures,
            vec![tool_call_signature("read_file", args)]
        );
        assert!(newest.stream);
        let letter = request_fingerprint(&conversation, false, PromptSource::LastUserMessage);
        assert_eq!(letter.prompt, Some(fingerprint("Fix the build.")));
        assert_eq!(letter.tool_signatures, newest.tool_signatures);
    }
}
