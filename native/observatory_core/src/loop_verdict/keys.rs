//! A step's call and outcome keys: 64-bit hashes of canonical JSON with per-call ids
//! normalized away, and the outcome's loose views ([`shape`](super::shape)).
//!
//! * **call** = hash of `action.tool_call` and the normalized canonical
//!   `action.tool_input` (missing = `null`), whitespace inside its strings collapsed
//!   (`python  run.py ` is `python run.py`); **tool** = hash of the tool name alone,
//!   and the call's **shape** = the set of the word pairs of that collapsed input (its
//!   first [`SHAPE_BYTES`] bytes), one bit of 64 each ([`call_shape`]): two inputs
//!   whose shapes share most of their bits say most of the same words in the same
//!   order, so the verdict can tell a near-identical call (a flag added, a quote
//!   changed, another `LIMIT`) from a different one;
//! * **outcome** = hash of `action.status` and the normalized canonical `action.result`
//!   (missing or `null` = no result: the status alone); its gist, skeleton, line and
//!   number sketches and blankness come from the same normalized text; **exact** = hash
//!   of the result as given (its first [`EXACT_BYTES`] bytes and its length), what two
//!   different calls' answers are compared by — for a failure, its *reply* instead: the
//!   normalized error's words that are not words of the call's input (`reply`), what
//!   two failures of a growing call are compared by.
//!
//! The canonical text is [`stable_stringify`]'s — the very text the step detector
//! hashes with SHA-256, so the gateway writes it once per step
//! ([`step_hashes`](crate::decision_log::step_hashes)) — run through
//! [`normalize_json_ids_into`] with [`IdRules`] chosen per field:
//!
//! * timestamps → `<TS>` (ISO 8601, and 10- or 13-digit Unix times), UUIDs and hex ids
//!   → `<ID>`;
//! * a number after a volatile word or key (`pid 4242`, `"elapsed_ms":239`), and a
//!   string value of a volatile key that holds a digit (`"request_id":"req-42"`) →
//!   `<V>` (see [`DEFAULT_VOLATILE_WORDS`](crate::normalize::DEFAULT_VOLATILE_WORDS));
//! * **plain numbers are kept**, in inputs (`write_file("file3.txt")` and
//!   `"file4.txt"` are different calls) and in results (a poll answering `10%` then
//!   `80%` is progress). [`IdRules::numbers`] turns that off per field.
//!
//! # Why 64 bits
//!
//! The verdict compares a step with the at most 64 steps its session remembers. With a
//! 64-bit hash, the chance that two different calls of a session collide is about
//! 2⁻⁵⁸ per session; a collision can only make two steps look alike (a false repeat),
//! never hide one. An agent that crafts collisions only flags itself. The step detector
//! keeps SHA-256, where a false repeat pushes a working agent towards a block.
//!
//! The hash is a folded-multiply hash in the style of wyhash (public domain): 16 bytes
//! per 128-bit multiply, many times the speed of SHA-256 or SipHash on a KiB, so the
//! whole verdict stays within its microsecond.

use std::sync::LazyLock;

use serde_json::Value;

use super::shape::{collapse_whitespace, shape, Scratch};
use super::StepKeys;
use crate::normalize::{normalize_json_ids_into, IdRules};
use crate::stable_json::stable_stringify;

#[cfg(test)]
pub(crate) mod reference;

/// Ends the tool or status name in the hashed bytes (never part of UTF-8).
const SEPARATOR: u8 = 0xFF;
/// Stands for a missing result.
const ABSENT: u8 = 0xFE;
const CALL_SEED: u64 = 0x243f_6a88_85a3_08d3;
const OUTCOME_SEED: u64 = 0x1319_8a2e_0370_7344;
const TOOL_SEED: u64 = 0x3707_3440_a409_3822;
const WORD_SEED: u64 = 0xbe54_66cf_34e9_0c6c;
const WORDING_SEED: u64 = 0x9216_d5d9_8979_fb1b;
const EXACT_SEED: u64 = 0x452_821e_638d_0137;
const REPLY_SEED: u64 = 0xc0ac_29b7_c97c_50dd;
/// The word-for-word key reads the first this many bytes of the result (and its length):
/// enough for the short answers where a changed checksum or id is the whole news.
pub const EXACT_BYTES: usize = 256;
/// The call's shape reads the first this many bytes of its collapsed input: a command
/// and its arguments; a long input (a file's new content) is judged by its beginning,
/// so a step's cost stays bounded.
pub const SHAPE_BYTES: usize = 128;
/// A call's wording is read from inputs up to this long; a longer input's wording is
/// its call key (no two different long calls "differ only in numbers").
pub const WORDING_BYTES: usize = 1024;

/// How inputs and results are normalized before hashing (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Normalization {
    pub input: IdRules,
    pub result: IdRules,
}

impl Normalization {
    /// The default rules, built once.
    pub fn shared_default() -> &'static Normalization {
        static DEFAULT: LazyLock<Normalization> = LazyLock::new(Normalization::default);
        &DEFAULT
    }
}

/// `failure`, `error` and `timeout` are failures for rule (c); `success`, `pending`,
/// `skipped` and `cancelled` are not.
pub fn is_failure(status: &str) -> bool {
    matches!(status, "failure" | "error" | "timeout")
}

/// The keys of one step from its values (see the module docs). The gateway uses
/// [`keys_from_canonical`] on the text it already wrote for the step detector.
pub fn step_keys(
    tool: &str,
    status: &str,
    input: Option<&Value>,
    result: Option<&Value>,
    rules: &Normalization,
) -> StepKeys {
    let input = stable_stringify(input.unwrap_or(&Value::Null));
    let result = result.filter(|r| !r.is_null()).map(stable_stringify);
    keys_from_canonical(tool, status, &input, result.as_deref(), rules)
}

/// The keys of one step from the canonical JSON text of its input and result
/// (`None`: no result).
pub fn keys_from_canonical(
    tool: &str,
    status: &str,
    input: &str,
    result: Option<&str>,
    rules: &Normalization,
) -> StepKeys {
    BUFFER.with_borrow_mut(|(buf, text, lines, replies)| {
        buf.clear();
        buf.extend_from_slice(tool.as_bytes());
        buf.push(SEPARATOR);
        text.clear();
        normalize_json_ids_into(input, &rules.input, text);
        collapse_whitespace(text, buf);
        let call = hash64(buf, CALL_SEED);
        let input = tool.len() + 1..buf.len();
        let shape_of_call = call_shape(&buf[input.clone()]);
        let wording = wording(&buf[input.clone()], call);
        let failure = is_failure(status);

        // The outcome's bytes follow the input's: a failure's reply reads both.
        buf.extend_from_slice(status.as_bytes());
        buf.push(SEPARATOR);
        // The normalized result is written where it is hashed, not copied there.
        let result_start = buf.len();
        let result_shape = match result {
            Some(result) => {
                normalize_json_ids_into(result, &rules.result, buf);
                Some(shape(status, &buf[result_start..], lines))
            }
            None => {
                buf.push(ABSENT);
                None
            }
        };
        let outcome = hash64(&buf[input.end..], OUTCOME_SEED);
        let exact = match result {
            None => outcome,
            Some(_) if failure => replies.get_or_insert(call, outcome, || {
                reply(status, &buf[result_start..], &WordSet::of(&buf[input]))
            }),
            Some(r) => hash64(
                &r.as_bytes()[..r.len().min(EXACT_BYTES)],
                EXACT_SEED ^ r.len() as u64,
            ),
        };
        for kept in [&mut *buf, &mut *text] {
            if kept.capacity() > MAX_KEPT_BUFFER {
                *kept = Vec::new();
            }
        }
        if lines.capacity() > MAX_KEPT_BUFFER {
            *lines = Scratch::default();
        }
        StepKeys {
            call,
            tool: hash64(tool.as_bytes(), TOOL_SEED),
            shape: shape_of_call,
            wording,
            outcome,
            exact,
            // Without a result, the status is all there is: every view is the outcome.
            gist: result_shape.map_or(outcome, |s| s.gist),
            skeleton: result_shape.map_or(outcome, |s| s.skeleton),
            lines: result_shape.map(|s| s.lines).unwrap_or_default(),
            has_result: result.is_some(),
            failure,
            blank: result_shape.is_none_or(|s| s.blank),
            numbers: result_shape.map(|s| s.numbers).unwrap_or_default(),
            opening: result_shape.map_or(0, |s| s.opening),
        }
    })
}

/// The shape of a call's collapsed input: the set of its word pairs (words are runs of
/// letters, digits, `_` and non-ASCII bytes; the first word pairs with nothing) in its
/// first [`SHAPE_BYTES`] bytes, one bit of 64 per pair. Two calls whose shapes share
/// most of their bits say most of the same words in the same order: a flag added, a
/// quote changed, another `LIMIT`, one more pipeline stage. Pairs rather than single
/// words, so that a target named in several places (`page-1.html`, `Page 1`) moves
/// several bits. A bit set costs a few cycles a word where a SimHash would cost a vote
/// per bit.
pub fn call_shape(input: &[u8]) -> u64 {
    // One pass over the bytes, no slicing or copying: a word's bytes gather eight to a
    // register, each eight mixed in with a multiply.
    let mut shape = 0;
    let mut previous = 0;
    let (mut hash, mut chunk, mut filled, mut in_word) = (WORD_SEED, 0u64, 0, false);
    let mut end_word = |hash: u64, chunk: u64| {
        let word = mix_word(hash, chunk).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        let pair = (previous ^ word.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
        previous = word;
        shape |= 1 << (pair >> 58);
    };
    for &byte in &input[..input.len().min(SHAPE_BYTES)] {
        if WORD_BYTE[usize::from(byte)] {
            chunk |= u64::from(byte) << (8 * filled);
            filled += 1;
            if filled == 8 {
                hash = mix_word(hash, chunk);
                (chunk, filled) = (0, 0);
            }
            in_word = true;
        } else if in_word {
            end_word(hash, chunk);
            (hash, chunk, filled, in_word) = (WORD_SEED, 0, 0, false);
        }
    }
    if in_word {
        end_word(hash, chunk);
    }
    shape
}

/// A call's *wording*: the hash of its collapsed input with every ASCII digit zeroed,
/// and of its length. Two different calls with the same wording differ only in their
/// digits — another order, `file3.txt` then `file4.txt`, the next page: a new target,
/// not the same call again. An input longer than [`WORDING_BYTES`] has `call` as its
/// wording. Eight bytes a step (the byte-wise zeroing vectorizes).
pub fn wording(input: &[u8], call: u64) -> u64 {
    if input.len() > WORDING_BYTES {
        return call;
    }
    let zero_digits = |bytes: &[u8]| {
        let mut word = [0u8; 8];
        for (out, &b) in word.iter_mut().zip(bytes) {
            *out = if b.is_ascii_digit() { 0 } else { b };
        }
        u64::from_le_bytes(word)
    };
    let mut chunks = input.chunks_exact(8);
    let mut hash = WORDING_SEED ^ input.len() as u64;
    for chunk in &mut chunks {
        hash = mix_word(hash, zero_digits(chunk));
    }
    mix_word(hash, zero_digits(chunks.remainder()))
}

/// Eight bytes of a word into its hash.
fn mix_word(hash: u64, chunk: u64) -> u64 {
    let h = (hash ^ chunk).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    h ^ h >> 29
}

/// The bytes of words: ASCII letters, digits, `_` and non-ASCII bytes.
const WORD_BYTE: [bool; 256] = {
    let mut table = [false; 256];
    let mut b = 0;
    while b < 256 {
        let c = b as u8;
        table[b] = c.is_ascii_alphanumeric() || c == b'_' || c >= 0x80;
        b += 1;
    }
    table
};

/// A buffer per thread (per scheduler, in the NIF) for the normalized text, so a step
/// allocates nothing; one that grew past this for a huge step is given back.
const MAX_KEPT_BUFFER: usize = 64 * 1024;

thread_local! {
    /// The hashed bytes, the normalized text, the result's shape buffers, the latest
    /// failures' replies.
    static BUFFER: std::cell::RefCell<(Vec<u8>, Vec<u8>, Scratch, RecentReplies)> =
        std::cell::RefCell::new(Default::default());
}

/// The replies of a thread's latest failures, by their call and outcome keys (16
/// slots, the newest of each kept). A reply is a function of the call's collapsed
/// input and the outcome's status and normalized result, which those two 64-bit keys
/// hash: a looping agent's same failing step, sent again, costs no second reading of
/// its words.
#[derive(Default)]
struct RecentReplies([Option<(u64, u64, u64)>; 16]);

impl RecentReplies {
    fn get_or_insert(&mut self, call: u64, outcome: u64, reply: impl FnOnce() -> u64) -> u64 {
        let slot = &mut self.0[((call ^ outcome) >> 60) as usize];
        match *slot {
            Some((c, o, known)) if c == call && o == outcome => known,
            _ => {
                let new = reply();
                *slot = Some((call, outcome, new));
                new
            }
        }
    }
}

/// The words of a failed call's input its reply may echo are read from its first this
/// many bytes.
pub const ECHO_INPUT_BYTES: usize = 512;
/// A failure's reply is read from the first this many bytes of its normalized result.
pub const REPLY_BYTES: usize = 1024;

/// Calls `each` with the hash of every word of `text` (as [`call_shape`]'s words: runs
/// of letters, digits, `_` and non-ASCII bytes, hashed eight bytes at a time). A
/// backslash and the byte after it end a word: in canonical JSON, `\n` is a line
/// break, not the letter `n`. A word is found first, then hashed from whole 8-byte
/// loads: a failed step runs this over its input and its result.
fn each_word(text: &[u8], mut each: impl FnMut(u64)) {
    let mut i = 0;
    while i < text.len() {
        let byte = text[i];
        if byte == b'\\' {
            i += 2;
        } else if !WORD_BYTE[usize::from(byte)] {
            i += 1;
        } else {
            let start = i;
            i += 1;
            while i < text.len() && WORD_BYTE[usize::from(text[i])] {
                i += 1;
            }
            each(word_hash(text, start, i));
        }
    }
}

/// The hash of the word `text[start..end]`: [`mix_word`] over its bytes eight at a
/// time, little-endian, the last (partial or empty) eight zero-padded.
#[inline]
fn word_hash(text: &[u8], start: usize, end: usize) -> u64 {
    let mut hash = WORD_SEED;
    let mut at = start;
    while at + 8 <= end {
        hash = mix_word(hash, r8(text, at));
        at += 8;
    }
    let rest = end - at;
    let tail = if rest == 0 {
        0
    } else if at + 8 <= text.len() {
        // The word's bytes and the ones after it in one load, those after masked off.
        r8(text, at) & (u64::MAX >> (8 * (8 - rest)))
    } else {
        text[at..end]
            .iter()
            .enumerate()
            .fold(0, |c, (k, &b)| c | u64::from(b) << (8 * k))
    };
    mix_word(hash, tail)
}

/// The words of a call's input (its first [`ECHO_INPUT_BYTES`] bytes), as a Bloom
/// filter of 2,048 bits, two a word: no allocation, no sort. At the at most ~100 words
/// of 512 bytes, about one word in a hundred that the input does not hold reads as held
/// (an error word dropped from the reply alike from every reply of that call).
#[derive(Default)]
struct WordSet([u64; 32]);

impl WordSet {
    fn of(input: &[u8]) -> Self {
        let mut set = Self::default();
        each_word(&input[..input.len().min(ECHO_INPUT_BYTES)], |w| {
            for bit in Self::bits(w) {
                set.0[bit / 64] |= 1 << (bit % 64);
            }
        });
        set
    }

    fn bits(word: u64) -> [usize; 2] {
        let h = word.wrapping_mul(0x9e37_79b9_7f4a_7c15);
        [(h >> 53) as usize, ((h >> 32) & 2047) as usize]
    }

    fn contains(&self, word: u64) -> bool {
        Self::bits(word)
            .iter()
            .all(|&bit| self.0[bit / 64] >> (bit % 64) & 1 == 1)
    }
}

/// A failure's *reply*: the status and the words of its normalized result (ids and
/// hex ids already `<ID>`, its first [`REPLY_BYTES`] bytes) that are not words of the
/// call's own input ([`WordSet`]), in order. An error that echoes the command it
/// rejects (`cat: notes.txt: No such file`, a quoting error quoting the grown
/// pipeline) is the same reply whatever the command; a number the input does not hold
/// is kept, so "3 tests failed", then "2 tests failed", are different replies.
fn reply(status: &str, result: &[u8], input: &WordSet) -> u64 {
    let mut reply = hash64(status.as_bytes(), REPLY_SEED);
    each_word(&result[..result.len().min(REPLY_BYTES)], |w| {
        if !input.contains(w) {
            reply = mix(reply ^ w, S1);
        }
    });
    reply
}

/// The normalized canonical text of `value`, as hashed (for tests and debugging).
pub fn normalized_text(value: &Value, rules: &IdRules) -> String {
    let mut out = Vec::new();
    normalize_json_ids_into(&stable_stringify(value), rules, &mut out);
    String::from_utf8(out).expect("placeholders replace whole ASCII tokens")
}

const S0: u64 = 0x2d35_8dcc_aa6c_78a5;
const S1: u64 = 0x8bb8_4b93_962e_acc9;
const S2: u64 = 0x4b33_a62e_d433_d4a3;
const S3: u64 = 0x4d5a_2da5_1de1_aa47;

/// The 128-bit product of `a` and `b`, folded to 64 bits.
const fn mix(a: u64, b: u64) -> u64 {
    let r = a as u128 * b as u128;
    (r as u64) ^ ((r >> 64) as u64)
}

fn r8(p: &[u8], i: usize) -> u64 {
    u64::from_le_bytes(p[i..i + 8].try_into().expect("8 bytes"))
}

fn r4(p: &[u8], i: usize) -> u64 {
    u64::from(u32::from_le_bytes(p[i..i + 4].try_into().expect("4 bytes")))
}

/// A 64-bit hash of `data` (wyhash's structure: three lanes of 16 bytes per round
/// over long inputs, the first and last bytes for short ones). Fixed constants: the
/// same bytes and seed give the same hash on every machine and run (a golden value in
/// the tests pins it).
pub fn hash64(data: &[u8], seed: u64) -> u64 {
    hash64_stirred(data, stirred(seed))
}

/// The seed as [`hash64`] first stirs it: for a constant seed, a constant, so that a
/// hash run per line or per number need not stir it again each time.
pub const fn stirred(seed: u64) -> u64 {
    seed ^ mix(seed ^ S0, S1)
}

/// [`hash64`] with its seed already [`stirred`].
pub fn hash64_stirred(data: &[u8], mut seed: u64) -> u64 {
    let len = data.len();
    let (a, b) = if len <= 16 {
        if len >= 4 {
            let q = (len >> 3) << 2;
            (
                (r4(data, 0) << 32) | r4(data, q),
                (r4(data, len - 4) << 32) | r4(data, len - 4 - q),
            )
        } else if len > 0 {
            let wide = (u64::from(data[0]) << 16)
                | (u64::from(data[len >> 1]) << 8)
                | u64::from(data[len - 1]);
            (wide, 0)
        } else {
            (0, 0)
        }
    } else {
        let mut p = data;
        if p.len() > 48 {
            let (mut s1, mut s2) = (seed, seed);
            while p.len() > 48 {
                seed = mix(r8(p, 0) ^ S1, r8(p, 8) ^ seed);
                s1 = mix(r8(p, 16) ^ S2, r8(p, 24) ^ s1);
                s2 = mix(r8(p, 32) ^ S3, r8(p, 40) ^ s2);
                p = &p[48..];
            }
            seed ^= s1 ^ s2;
        }
        while p.len() > 16 {
            seed = mix(r8(p, 0) ^ S1, r8(p, 8) ^ seed);
            p = &p[16..];
        }
        (r8(data, len - 16), r8(data, len - 8))
    };
    let r = u128::from(a ^ S1) * u128::from(b ^ seed);
    mix((r as u64) ^ S0 ^ len as u64, ((r >> 64) as u64) ^ S1)
}

/// [`hash64`] of `word`'s eight little-endian bytes, with no branch on a length: the
/// gist chains one a line.
#[inline]
pub fn hash64_of_u64(word: u64, seed: u64) -> u64 {
    // hash64's 4-to-16-byte case at 8: its first read is the word's halves swapped,
    // its second the word.
    let r = u128::from(word.rotate_left(32) ^ S1) * u128::from(word ^ stirred(seed));
    mix((r as u64) ^ S0 ^ 8, ((r >> 64) as u64) ^ S1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::normalize::VolatileWords;
    use proptest::prelude::*;
    use serde_json::json;

    fn keys(tool: &str, input: Value, status: &str, result: Option<Value>) -> StepKeys {
        step_keys(
            tool,
            status,
            Some(&input),
            result.as_ref(),
            Normalization::shared_default(),
        )
    }

    fn text(value: Value, rules: &IdRules) -> String {
        normalized_text(&value, rules)
    }

    #[test]
    fn key_order_does_not_matter() {
        let a = keys(
            "t",
            json!({"a": 1, "b": [1, 2]}),
            "success",
            Some(json!({"x": 1, "y": 2})),
        );
        let b = keys(
            "t",
            json!({"b": [1, 2], "a": 1.0}),
            "success",
            Some(json!({"y": 2, "x": 1})),
        );
        assert_eq!(a, b);
    }

    #[test]
    fn tool_input_status_and_result_all_count() {
        let base = keys(
            "read_file",
            json!({"path": "a"}),
            "success",
            Some(json!("x")),
        );
        assert_ne!(
            base.call,
            keys(
                "write_file",
                json!({"path": "a"}),
                "success",
                Some(json!("x"))
            )
            .call
        );
        assert_ne!(
            base.call,
            keys(
                "read_file",
                json!({"path": "b"}),
                "success",
                Some(json!("x"))
            )
            .call
        );
        assert_ne!(
            base.outcome,
            keys(
                "read_file",
                json!({"path": "a"}),
                "failure",
                Some(json!("x"))
            )
            .outcome
        );
        assert_ne!(
            base.outcome,
            keys(
                "read_file",
                json!({"path": "a"}),
                "success",
                Some(json!("y"))
            )
            .outcome
        );
        // The outcome does not depend on the call: rule (c) needs that.
        assert_eq!(
            base.outcome,
            keys("grep", json!(["-r", "x"]), "success", Some(json!("x"))).outcome
        );
    }

    /// A failed pipeline and its quoting error, which echoes the pipeline's tail.
    fn quoting_error(pipeline: &str, echoed: &str) -> StepKeys {
        keys(
            "find",
            json!({"command": pipeline}),
            "failure",
            Some(json!(format!(
                "{echoed}: -c: line 1: unexpected EOF while looking for matching `''\n\
                 {echoed}: -c: line 2: syntax error: unexpected end of file\n"
            ))),
        )
    }

    #[test]
    fn a_failure_s_reply_drops_the_words_it_echoes_of_its_call() {
        let a = quoting_error(
            "find . -name '*.txt' | awk '{print $1\"\\t\"$2}' | sed 's/a/b/'",
            "$2}' | sed 's/a/b/'",
        );
        let b = quoting_error(
            "find . -name '*.txt' | awk '{print $1\"\\t\"$2}' | sed 's/a/b/' | sort -r",
            "$2}' | sed 's/a/b/' | sort -r",
        );
        assert_ne!(a.outcome, b.outcome, "the answers differ");
        assert_eq!(a.exact, b.exact, "the replies do not");
        // Another error is another reply.
        let c = keys(
            "find",
            json!({"command": "find . -name '*.txt' | sort -r"}),
            "failure",
            Some(json!("find: unknown predicate `-r'")),
        );
        assert_ne!(a.exact, c.exact);
    }

    #[test]
    fn a_failure_s_reply_keeps_a_number_its_call_does_not_hold() {
        // An edit-test cycle whose failure count moves is progress.
        let run = |n: u32| {
            keys(
                "bash",
                json!({"command": "pytest tests/"}),
                "failure",
                Some(json!(format!("{n} failed, 12 passed in 0.8s"))),
            )
        };
        assert_ne!(run(3).exact, run(2).exact);
        assert_eq!(run(3).exact, run(3).exact);
        // A checksum or an id in the error is masked: `<ID>` in the reply.
        let hashed = |h: &str| {
            keys(
                "bash",
                json!({"command": "md5sum f | sh"}),
                "failure",
                Some(json!(format!("sh: line 1: {h}: command not found"))),
            )
        };
        assert_eq!(
            hashed("0d1e201ac67b5a979c52f42eb8dd3702").exact,
            hashed("3a2e45dcead29bb7dbd132e72fab5e35").exact
        );
    }

    #[test]
    fn a_remembered_reply_is_the_one_computed_afresh() {
        // Failures interleaved and re-sent on one thread: each step's keys (its reply
        // among them) are those a fresh thread, with no reply remembered, computes.
        let steps: Vec<(String, String)> = (0..40)
            .map(|k| {
                (
                    format!("cat notes{}.txt | grep -c x{}", k % 5, k % 3),
                    format!("cat: notes{}.txt: No such file ({} tries)", k % 5, k % 2),
                )
            })
            .collect();
        let step = |(command, error): &(String, String)| {
            keys(
                "bash",
                json!({"command": command}),
                "failure",
                Some(json!(error)),
            )
        };
        let here: Vec<StepKeys> = steps.iter().map(step).collect();
        for (k, s) in steps.iter().enumerate() {
            let s = s.clone();
            let fresh = std::thread::spawn(move || step(&s)).join().unwrap();
            assert_eq!(here[k], fresh, "step {k}");
        }
        // The same error from another call is the same reply; a number changed in it
        // is another reply.
        assert_ne!(here[0].call, here[10].call);
        assert_eq!(here[0].exact, here[10].exact);
        assert_ne!(here[0].exact, here[15].exact);
    }

    #[test]
    fn a_success_keeps_its_word_for_word_key() {
        // Only failures are compared by their reply: a success's answer word for word.
        let echo = |text: &str| {
            keys(
                "bash",
                json!({"command": format!("echo {text}")}),
                "success",
                Some(json!(text)),
            )
        };
        assert_ne!(echo("one").exact, echo("two").exact);
        // A failure without a result has only its status.
        let bare = keys("bash", json!({"command": "false"}), "failure", None);
        assert_eq!(bare.exact, bare.outcome);
    }

    #[test]
    fn a_call_s_wording_leaves_out_its_digits_and_nothing_else() {
        let wording = |text: &str| wording(text.as_bytes(), hash64(text.as_bytes(), 1));
        let order = |n: u32| format!("{{\"query\":\"return window order {n}\"}}");
        assert_eq!(wording(&order(4127)), wording(&order(4130)));
        assert_eq!(wording("cat file3.txt"), wording("cat file4.txt"));
        // A digit more or less, a word, a quote or a slash changed: other wording.
        assert_ne!(wording("page 9"), wording("page 10"));
        assert_ne!(wording("x1"), wording("x"));
        assert_ne!(wording("cat file3.txt"), wording("cat fileA.txt"));
        assert_ne!(
            wording("rsync --exclude='a/*'"),
            wording("rsync --exclude=a/*")
        );
        assert_ne!(wording("ls /tmp/"), wording("ls /tmp"));
        // Past WORDING_BYTES the wording is the call: two long calls never differ "only
        // in numbers", whatever comes after the bytes read.
        let long = |n: u32| format!("{n} {}", "word ".repeat(WORDING_BYTES / 5 + 1));
        assert_ne!(wording(&long(1)), wording(&long(2)));
        // Through the step's keys: the same on ids normalized away.
        let keys = |n: u32| {
            step_keys(
                "search",
                "success",
                Some(&json!({"query": format!("return window order {n}")})),
                None,
                Normalization::shared_default(),
            )
        };
        assert_ne!(keys(4127).call, keys(4130).call);
        assert_eq!(keys(4127).wording, keys(4130).wording);
    }

    #[test]
    fn plain_numbers_are_kept_in_inputs_and_results() {
        let poll = |p: u32| {
            keys(
                "job_status",
                json!({"job": "build-7"}),
                "success",
                Some(json!({"progress": p})),
            )
        };
        assert_ne!(
            poll(10).outcome,
            poll(80).outcome,
            "a moving poll is progress"
        );
        let write = |n: u32| {
            keys(
                "write_file",
                json!({"path": format!("out/file{n}.txt")}),
                "success",
                Some(json!("ok")),
            )
        };
        assert_ne!(
            write(1).call,
            write(2).call,
            "different files are different calls"
        );
    }

    #[test]
    fn per_call_ids_are_normalized_away() {
        let run = |pid: u32, at: &str, ms: u64, uuid: &str| {
            keys(
                "run_tests",
                json!({"cmd": "mix test", "request_id": uuid}),
                "failure",
                Some(json!({
                    "exit_code": 1,
                    "pid": pid,
                    "stderr": format!("[{at}] worker pid {pid} crashed: port 4000 in use (trace 9f86d0{pid}c7d65)"),
                    "elapsed_ms": ms,
                    "finished": 1_739_870_000_000u64 + ms,
                })),
            )
        };
        let a = run(
            4242,
            "2026-02-22T10:30:01Z",
            312,
            "550e8400-e29b-41d4-a716-446655440000",
        );
        let b = run(
            5151,
            "2026-02-22T10:31:17Z",
            298,
            "6ba7b810-9dad-11d1-80b4-00c04fd430c8",
        );
        // Every key: a failure's word-for-word key is its reply, read from the
        // normalized text, ids masked (a success's keeps them:
        // `a_success_keeps_its_word_for_word_key`).
        assert_eq!(a, b);
        assert!(a.failure && a.has_result);
    }

    #[test]
    fn canonical_normalized_text() {
        let rules = IdRules::default();
        assert_eq!(
            text(
                json!({"b": [1, 2.5, -3], "a": {"pid": 7, "path": "f3 at 2026-02-22T10:30:01Z"}, "c": null}),
                &rules
            ),
            r#"{"a":{"path":"f3 at <TS>","pid":<V>},"b":[1,2.5,-3],"c":null}"#
        );
        assert_eq!(text(json!(1739870000123u64), &rules), "<TS>");
        assert_eq!(
            text(json!({"log": "ok\n2026-02-22T10:30:01Z done"}), &rules),
            r#"{"log":"ok\n<TS> done"}"#
        );
        let every_number = IdRules {
            numbers: true,
            ..IdRules::default()
        };
        assert_eq!(
            text(json!({"n": 4, "s": "4 files"}), &every_number),
            r#"{"n":<NUM>,"s":"<NUM> files"}"#
        );
        let no_words = IdRules {
            volatile: VolatileWords::new(Vec::<&str>::new()),
            ..IdRules::default()
        };
        assert_eq!(text(json!({"pid": 7}), &no_words), r#"{"pid":7}"#);
    }

    #[test]
    fn missing_and_null_results_are_no_result() {
        let none = step_keys("t", "failure", None, None, Normalization::shared_default());
        let null = step_keys(
            "t",
            "failure",
            Some(&Value::Null),
            Some(&Value::Null),
            Normalization::shared_default(),
        );
        assert_eq!(none, null);
        assert!(!none.has_result && none.failure);
        let empty = keys("t", Value::Null, "failure", Some(json!("")));
        assert!(empty.has_result);
        assert_ne!(none.outcome, empty.outcome);
    }

    #[test]
    fn failure_statuses() {
        for s in ["failure", "error", "timeout"] {
            assert!(is_failure(s));
        }
        for s in ["success", "pending", "skipped", "cancelled"] {
            assert!(!is_failure(s));
        }
    }

    #[test]
    fn the_one_pass_shape_is_the_set_of_word_pairs() {
        // Words split out, then hashed eight bytes at a time: what call_shape does in
        // one pass.
        let reference = |input: &[u8]| {
            let mut previous = 0u64;
            input[..input.len().min(SHAPE_BYTES)]
                .split(|&b| !WORD_BYTE[usize::from(b)])
                .filter(|w| !w.is_empty())
                .fold(0u64, |shape, word| {
                    let chunk = |bytes: &[u8]| {
                        bytes
                            .iter()
                            .enumerate()
                            .fold(0u64, |c, (k, &b)| c | u64::from(b) << (8 * k))
                    };
                    let full = word.len() / 8 * 8;
                    let hash = word[..full]
                        .chunks(8)
                        .fold(WORD_SEED, |h, c| mix_word(h, chunk(c)));
                    let word =
                        mix_word(hash, chunk(&word[full..])).wrapping_mul(0xbf58_476d_1ce4_e5b9);
                    let pair =
                        (previous ^ word.rotate_left(17)).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    previous = word;
                    shape | 1 << (pair >> 58)
                })
        };
        let inputs = [
            "",
            "ls",
            "{\"command\":\"ls -la /tmp\"}",
            "abcdefgh abcdefghi abcdefghijklmnop_ä x",
            "--- ... ///",
            &"word ".repeat(40),
            "SELECT code FROM template WHERE description = 'Book' LIMIT 10",
        ];
        for input in inputs {
            assert_eq!(
                call_shape(input.as_bytes()),
                reference(input.as_bytes()),
                "{input}"
            );
        }
        assert!(WORD_BYTE[usize::from(b'_')] && WORD_BYTE[0xC3] && WORD_BYTE[usize::from(b'Z')]);
        assert!(!WORD_BYTE[usize::from(b'-')] && !WORD_BYTE[usize::from(b' ')]);
    }

    #[test]
    fn call_shapes_are_word_pair_sets_of_the_input_beginning() {
        let shape = |text: &str| call_shape(text.as_bytes());
        // Punctuation is not a word; repeated pairs count once.
        assert_eq!(shape("ls -la /tmp"), shape("ls la tmp"));
        assert_eq!(shape("ls la ls la"), shape("ls la ls"));
        assert_eq!(shape(""), 0);
        assert_eq!(shape("{\"\":[]}"), 0);
        // Word order counts.
        assert_ne!(shape("ls -la /tmp"), shape("/tmp la ls"));
        // One word more at the end sets at most one bit more.
        let limit = shape("SELECT code FROM template WHERE name = 'Book'");
        let more = shape("SELECT code FROM template WHERE name = 'Book' LIMIT");
        assert_eq!(limit & more, limit);
        assert!((more ^ limit).count_ones() <= 1);
        // A target named in three places moves several bits.
        let page = |k: u32| {
            shape(&format!(
                "site/page-{k}.html <h1>Page {k}</h1> Section {k} of"
            ))
        };
        assert!((page(1) ^ page(2)).count_ones() >= 6);
        // Only the first SHAPE_BYTES bytes are read.
        let head = "x".repeat(SHAPE_BYTES);
        assert_eq!(shape(&(head.clone() + " tail")), shape(&head));
        // Sixteen different words set several bits.
        let words: String = (0..16).map(|k| format!("word{k} ")).collect();
        assert!(shape(&words).count_ones() >= 10);
    }

    #[test]
    fn hash_golden_values() {
        // Pinned: a change here changes every session's keys.
        let golden = [hash64(b"", 0), hash64(b"abc", 0), hash64(&[7u8; 100], 1)];
        assert_eq!(
            golden,
            [
                0x9322_8a4d_e0ee_c5a2,
                0x989b_4a20_9c10_11c9,
                0x49c6_63fa_3748_1859
            ]
        );
    }

    /// `each_word` as it was written first, one byte at a time: the reference the
    /// word-at-a-time version must match hash for hash (a changed hash changes replies).
    fn each_word_bytewise(text: &[u8]) -> Vec<u64> {
        let mut words = Vec::new();
        let (mut hash, mut chunk, mut filled) = (WORD_SEED, 0u64, 0);
        let (mut in_word, mut escaped) = (false, false);
        for &byte in text {
            let word_byte = !escaped && WORD_BYTE[usize::from(byte)];
            escaped = !escaped && byte == b'\\';
            if word_byte {
                chunk |= u64::from(byte) << (8 * filled);
                filled += 1;
                if filled == 8 {
                    hash = mix_word(hash, chunk);
                    (chunk, filled) = (0, 0);
                }
                in_word = true;
            } else if in_word {
                words.push(mix_word(hash, chunk));
                (hash, chunk, filled, in_word) = (WORD_SEED, 0, 0, false);
            }
        }
        if in_word {
            words.push(mix_word(hash, chunk));
        }
        words
    }

    fn words_of(text: &[u8]) -> Vec<u64> {
        let mut words = Vec::new();
        each_word(text, |w| words.push(w));
        words
    }

    #[test]
    fn words_are_hashed_as_the_bytewise_reference_does() {
        let texts: [&[u8]; 9] = [
            b"",
            b"a",
            b"abcdefgh",
            b"abcdefghi x abcdefghijklmnop",
            br#"{"log":"ok\nnext\\n \"q\" \u00e9t\u00e9"}"#,
            b"trailing\\",
            b"\\",
            r"\u00e9 ünïcödé_words 12 3.5".as_bytes(),
            b"{\"command\":\"grep -rn 'TODO' lib/ | head -20\"}",
        ];
        for text in texts {
            assert_eq!(words_of(text), each_word_bytewise(text), "{text:?}");
        }
    }

    proptest! {
        /// Whatever words of its call an error echoes, and wherever, its reply is the
        /// error's own words.
        #[test]
        fn a_reply_ignores_the_words_echoed_from_the_call(
            input in prop::collection::vec("[a-m]{1,6}", 1..12),
            error in prop::collection::vec("[n-z]{1,6}", 1..8),
            echo in prop::collection::vec((0usize..12, any::<bool>()), 0..16),
        ) {
            let command = input.join(" ");
            let mut echoed = Vec::new();
            for (i, word) in error.iter().enumerate() {
                echoed.push(word.clone());
                for &(pick, here) in &echo {
                    if here && pick % error.len() == i {
                        echoed.push(input[pick % input.len()].clone());
                    }
                }
            }
            let reply = |result: String| {
                keys("sh", json!({"command": command}), "failure", Some(json!(result))).exact
            };
            prop_assert_eq!(reply(echoed.join(": ")), reply(error.join(" ")));
        }

        #[test]
        fn words_hash_as_the_bytewise_reference(
            text in prop::collection::vec(prop::sample::select(b"ab_\\n \"{}:0\xc3\xa9-".to_vec()), 0..120),
        ) {
            prop_assert_eq!(words_of(&text), each_word_bytewise(&text));
        }

        #[test]
        fn a_word_hashes_as_its_eight_bytes(word in any::<u64>(), seed in any::<u64>()) {
            prop_assert_eq!(hash64_of_u64(word, seed), hash64(&word.to_le_bytes(), seed));
        }

        #[test]
        fn different_bytes_hash_differently(a in prop::collection::vec(any::<u8>(), 0..200), b in prop::collection::vec(any::<u8>(), 0..200)) {
            prop_assume!(a != b);
            prop_assert_ne!(hash64(&a, 0), hash64(&b, 0));
        }

        #[test]
        fn one_flipped_bit_moves_about_half_the_bits(data in prop::collection::vec(any::<u8>(), 1..300), bit in 0usize..2400) {
            let bit = bit % (data.len() * 8);
            let mut other = data.clone();
            other[bit / 8] ^= 1 << (bit % 8);
            let distance = (hash64(&data, 0) ^ hash64(&other, 0)).count_ones();
            prop_assert!((8..=56).contains(&distance), "{distance}");
        }
    }
}
#[cfg(test)]
mod empty_answers {
    use super::*;
    use crate::loop_verdict::{Config, Level, VerdictState};
    use serde_json::json;

    fn levels(commands: &[&str]) -> Vec<Level> {
        let mut state = VerdictState::new();
        commands
            .iter()
            .map(|c| {
                let keys = step_keys(
                    "bash",
                    "success",
                    Some(&json!({ "command": c })),
                    Some(&json!("")),
                    Normalization::shared_default(),
                );
                state.observe(keys, None, &Config::default()).level
            })
            .collect()
    }

    /// Setting up a tree one command at a time: the same command on another target, each
    /// answer empty. Similar calls (two thirds of their word pairs shared) but not
    /// nearly identical, and an empty answer says nothing: no loop. (A rule that called
    /// six similar calls answered with nothing a loop was measured and dropped for
    /// this.)
    #[test]
    fn e_the_near_miss_the_same_command_on_other_targets_each_answer_empty_is_no_loop() {
        let made = levels(&[
            "mkdir -p /srv/app/logs",
            "mkdir -p /srv/app/cache",
            "mkdir -p /srv/app/tmp",
            "mkdir -p /srv/app/data",
            "mkdir -p /srv/app/run",
            "mkdir -p /srv/app/conf",
            "mkdir -p /srv/app/bin",
        ]);
        assert!(made.iter().all(|&l| l == Level::Progress), "{made:?}");
        let copied = levels(&[
            "cp config/app.yaml /srv/app/conf/",
            "cp config/db.yaml /srv/app/conf/",
            "cp config/cache.yaml /srv/app/conf/",
            "cp config/queue.yaml /srv/app/conf/",
            "cp config/auth.yaml /srv/app/conf/",
            "cp config/log.yaml /srv/app/conf/",
        ]);
        assert!(copied.iter().all(|&l| l == Level::Progress), "{copied:?}");
        // One search on six directories, each answering nothing: the same command on
        // other targets.
        let swept = levels(&[
            "grep -rn \"retry_budget\" config/",
            "grep -rn \"retry_budget\" lib/",
            "grep -rn \"retry_budget\" priv/",
            "grep -rn \"retry_budget\" scripts/",
            "grep -rn \"retry_budget\" deploy/",
            "grep -rn \"retry_budget\" test/",
        ]);
        assert!(swept.iter().all(|&l| l < Level::Loop), "{swept:?}");
    }

    /// One search that finds nothing, reworked: a stage appended, a flag added, each
    /// answer empty. No two in a row are nearly identical, but each keeps every word
    /// pair of the bare search: six in a row are a loop.
    #[test]
    fn e_one_command_reworked_six_times_each_answer_empty_is_a_loop() {
        let reworked = levels(&[
            "grep -rn \"retry_budget\" config/",
            "grep -rn \"retry_budget\" config/ | grep -v '#'",
            "grep -rn \"retry_budget\" config/ | awk -F: '{print $1}'",
            "grep -rn \"retry_budget\" config/ | sort -u",
            "grep -rn \"retry_budget\" config/ --include='*.yaml'",
            "grep -rn \"retry_budget\" config/ | cut -d: -f1",
        ]);
        assert!(
            reworked[..5].iter().all(|&l| l < Level::Loop),
            "{reworked:?}"
        );
        assert_eq!(reworked[5], Level::Loop, "{reworked:?}");
    }
}
