//! What a step's canonical JSON says, read loosely: the verdict's fuzzy views of a
//! call and of a result, so that real agents' repeats compare as repeats.
//!
//! Real runs repeat themselves with incidental differences (issue 11):
//!
//! * a command resubmitted with other whitespace (`python  run.py`, `python run.py `);
//! * an error carrying a counter: `bash: line 12: …`, then `line 13`, `line 14`;
//! * stderr and stdout interleaved in another order on every run;
//! * the same edit applied again, the tool echoing a file that grows by the same lines;
//! * a long output that differs in a timing, a speed or a size deep inside.
//!
//! [`collapse_whitespace`] gives the call its whitespace-insensitive form. [`shape`]
//! reads a result's text (each JSON string is a line of its own, and `\n` and `\r`
//! inside it end lines) with every run of digits masked and whitespace collapsed, and
//! gives:
//!
//! * `skeleton`: a hash of that text, in order: two results with the same skeleton
//!   differ at most in their numbers;
//! * `gist`: a hash of the *set* of its lines: order, repeated lines and numbers
//!   do not count;
//! * `lines`: a 1024-bit sketch of the same lines, so that the verdict can tell
//!   whether a result says anything the same call had not already said;
//! * `blank`: no string value holds anything but whitespace (`{"exit_code":1,
//!   "stdout":""}`, `""`): the result says nothing either way;
//! * `numbers`: a sketch of its first [`MAX_NUMBERS`] runs of digits with their
//!   positions, so that two results with the same skeleton can tell how many of their
//!   numbers differ: one of many (a timing, a speed, a size in a long log) is a detail,
//!   where most or all of them (`{"progress": 40}`, then 60) is the answer moving.

use super::keys::hash64;

/// Bits in a line sketch.
pub const SKETCH_BITS: usize = 1024;
/// Runs of digits of a result put in its number sketch (the first ones).
pub const MAX_NUMBERS: u32 = 64;
/// Lines of a result looked at for its gist and sketch (the first ones).
pub const MAX_LINES: usize = 512;

const LINE_SEED: u64 = 0x0801_f2e2_8a3c_1d55;
const GIST_SEED: u64 = 0xa409_3822_299f_31d0;
const SKELETON_SEED: u64 = 0x082e_fa98_ec4e_6c89;
const NUMBER_SEED: u64 = 0x4528_21e6_38d0_1377;

/// A set of line hashes, one bit each (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Default)]
pub struct LineSketch(pub [u64; SKETCH_BITS / 64]);

impl LineSketch {
    /// A sketch of one line.
    pub fn single(line_hash: u64) -> Self {
        let mut sketch = Self::default();
        sketch.insert(line_hash);
        sketch
    }

    fn insert(&mut self, line_hash: u64) {
        let bit = (line_hash % SKETCH_BITS as u64) as usize;
        self.0[bit / 64] |= 1 << (bit % 64);
    }

    /// Lines (bits) in the sketch.
    pub fn len(&self) -> u32 {
        self.0.iter().map(|w| w.count_ones()).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Lines of `self` that `seen` does not hold.
    pub fn new_against(&self, seen: &LineSketch) -> u32 {
        self.0
            .iter()
            .zip(seen.0.iter())
            .map(|(mine, old)| (mine & !old).count_ones())
            .sum()
    }

    pub fn union_with(&mut self, other: &LineSketch) {
        for (mine, theirs) in self.0.iter_mut().zip(other.0.iter()) {
            *mine |= theirs;
        }
    }

    /// The sketch as bytes (little-endian words), as the NIF passes it.
    pub fn to_bytes(&self) -> [u8; SKETCH_BITS / 8] {
        let mut out = [0u8; SKETCH_BITS / 8];
        for (i, word) in self.0.iter().enumerate() {
            out[i * 8..i * 8 + 8].copy_from_slice(&word.to_le_bytes());
        }
        out
    }

    /// The sketch from [`to_bytes`](Self::to_bytes)' form; `None` for another length.
    pub fn from_bytes(bytes: &[u8]) -> Option<Self> {
        if bytes.len() != SKETCH_BITS / 8 {
            return None;
        }
        let mut out = Self::default();
        for (i, word) in out.0.iter_mut().enumerate() {
            *word = u64::from_le_bytes(bytes[i * 8..i * 8 + 8].try_into().ok()?);
        }
        Some(out)
    }
}

impl std::fmt::Debug for LineSketch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LineSketch({} lines)", self.len())
    }
}

/// The numbers of a result, each hashed with its position (see the module docs).
#[derive(Clone, Copy, PartialEq, Eq, Default, Debug)]
pub struct NumberSketch {
    pub bits: [u64; 4],
    /// Runs of digits in the sketch (at most [`MAX_NUMBERS`]).
    pub count: u32,
}

impl NumberSketch {
    fn insert(&mut self, position: u32, number_hash: u64) {
        let bit = (number_hash ^ u64::from(position).wrapping_mul(0x9e37_79b9_7f4a_7c15)) % 256;
        self.bits[(bit / 64) as usize] |= 1 << (bit % 64);
        self.count += 1;
    }

    /// About how many numbers differ from `other`'s at the same positions: a changed
    /// number clears one bit and sets another.
    pub fn changed_against(&self, other: &NumberSketch) -> u32 {
        let flipped: u32 = self
            .bits
            .iter()
            .zip(other.bits.iter())
            .map(|(a, b)| (a ^ b).count_ones())
            .sum();
        flipped.div_ceil(2) + self.count.abs_diff(other.count)
    }

    /// Whether, compared with `other`, at most a third of the numbers changed: a
    /// detail, not the answer.
    pub fn mostly_same_as(&self, other: &NumberSketch) -> bool {
        self.changed_against(other) * 3 <= self.count.max(other.count)
    }
}

/// A result's fuzzy views (see the module docs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Shape {
    pub skeleton: u64,
    pub gist: u64,
    pub lines: LineSketch,
    pub numbers: NumberSketch,
    pub blank: bool,
}

/// JSON text `src` with runs of whitespace inside its strings (spaces and the `\n`,
/// `\r`, `\t` escapes) collapsed to one space and trimmed at both ends of each string,
/// appended to `out`. Text outside strings is copied as it is (canonical JSON has no
/// whitespace there).
pub fn collapse_whitespace(src: &[u8], out: &mut Vec<u8>) {
    let mut in_string = false;
    let mut pending_space = false;
    let mut at_string_start = false;
    let mut i = 0;
    while i < src.len() {
        let b = src[i];
        if !in_string {
            out.push(b);
            if b == b'"' {
                in_string = true;
                at_string_start = true;
                pending_space = false;
            }
            i += 1;
            continue;
        }
        let (token, whitespace) = string_token(src, i);
        if b == b'"' {
            out.push(b'"');
            in_string = false;
        } else if whitespace {
            pending_space = true;
        } else {
            if pending_space && !at_string_start {
                out.push(b' ');
            }
            pending_space = false;
            at_string_start = false;
            out.extend_from_slice(&src[i..i + token]);
        }
        i += token;
    }
}

/// The length of the token at `i` inside a JSON string (an escape is one token) and
/// whether it is whitespace.
fn string_token(src: &[u8], i: usize) -> (usize, bool) {
    match src[i] {
        b'\\' if i + 1 < src.len() => match src[i + 1] {
            b'n' | b'r' | b't' => (2, true),
            b'u' => (6.min(src.len() - i), false),
            _ => (2, false),
        },
        b' ' => (1, true),
        _ => (1, false),
    }
}

/// Reads normalized canonical JSON text (see the module docs). `scratch` holds the
/// line hashes; it is cleared first.
pub fn shape(status: &str, text: &[u8], scratch: &mut Vec<u64>) -> Shape {
    let mut reader = Reader {
        skeleton: Hasher::new(SKELETON_SEED),
        line: Hasher::new(LINE_SEED),
        line_len: 0,
        pending_space: false,
        number: None,
        numbers: NumberSketch::default(),
        hashes: scratch,
    };
    reader.hashes.clear();
    reader.skeleton.write(status.as_bytes());
    reader.skeleton.write(&[0xFF]);
    let blank = reader.read(text);
    reader.end_line();
    let skeleton = reader.skeleton.finish();
    let hashes = reader.hashes;
    hashes.sort_unstable();
    hashes.dedup();
    let mut lines = LineSketch::default();
    let mut gist = Hasher::new(GIST_SEED);
    gist.write(status.as_bytes());
    gist.write(&[0xFF]);
    for h in hashes.iter() {
        lines.insert(*h);
        gist.write(&h.to_le_bytes());
    }
    Shape {
        skeleton,
        gist: gist.finish(),
        lines,
        numbers: reader.numbers,
        blank,
    }
}

struct Reader<'a> {
    skeleton: Hasher,
    line: Hasher,
    line_len: usize,
    pending_space: bool,
    /// The run of digits being read.
    number: Option<Hasher>,
    numbers: NumberSketch,
    hashes: &'a mut Vec<u64>,
}

impl Reader<'_> {
    /// Feeds the text; returns whether no string value holds anything but whitespace.
    fn read(&mut self, text: &[u8]) -> bool {
        let mut blank = true;
        // Whether the next string is an object key: after `{` or `,` in an object.
        let mut objects: Vec<bool> = Vec::new();
        let mut expect_key = false;
        let mut in_string = false;
        let mut is_key = false;
        let mut i = 0;
        while i < text.len() {
            let b = text[i];
            if !in_string {
                match b {
                    b'"' => {
                        // A string is a line of its own (its quotes are not content).
                        in_string = true;
                        is_key = expect_key;
                        self.end_line();
                        i += 1;
                        continue;
                    }
                    b'{' => {
                        objects.push(true);
                        expect_key = true;
                    }
                    b'[' => {
                        objects.push(false);
                        expect_key = false;
                    }
                    b'}' | b']' => {
                        objects.pop();
                        expect_key = false;
                    }
                    b',' => expect_key = objects.last() == Some(&true),
                    b':' => expect_key = false,
                    _ => {}
                }
                self.byte(b);
                i += 1;
                continue;
            }
            let (token, whitespace) = string_token(text, i);
            if b == b'"' {
                in_string = false;
                self.end_line();
            } else if token == 2 && matches!(text[i + 1], b'n' | b'r') {
                self.end_line();
            } else if whitespace {
                self.end_number();
                self.pending_space = true;
            } else {
                if !is_key {
                    blank = false;
                }
                for &c in &text[i..i + token] {
                    self.byte(c);
                }
            }
            i += token;
        }
        blank
    }

    /// One byte of content: digits masked, whitespace collapsed.
    fn byte(&mut self, b: u8) {
        if b.is_ascii_digit() {
            match &mut self.number {
                Some(number) => number.write(&[b]),
                None => {
                    let mut number = Hasher::new(NUMBER_SEED);
                    number.write(&[b]);
                    self.number = Some(number);
                    self.emit(b'#');
                }
            }
            return;
        }
        self.end_number();
        self.emit(b);
    }

    fn end_number(&mut self) {
        if let Some(number) = self.number.take() {
            if self.numbers.count < MAX_NUMBERS {
                self.numbers.insert(self.numbers.count, number.finish());
            }
        }
    }

    fn emit(&mut self, b: u8) {
        if self.pending_space && self.line_len > 0 {
            self.line.write(b" ");
            self.skeleton.write(b" ");
        }
        self.pending_space = false;
        self.line.write(&[b]);
        self.skeleton.write(&[b]);
        self.line_len += 1;
    }

    fn end_line(&mut self) {
        self.end_number();
        if self.line_len > 0 && self.hashes.len() < MAX_LINES {
            self.hashes.push(self.line.finish());
        }
        self.line = Hasher::new(LINE_SEED);
        self.line_len = 0;
        // A line break separates like whitespace in the skeleton.
        self.pending_space = true;
    }
}

/// Streams bytes into [`hash64`] through a small buffer: exact for short input (the
/// common line), chained for long input.
struct Hasher {
    seed: u64,
    buf: [u8; 64],
    len: usize,
}

impl Hasher {
    fn new(seed: u64) -> Self {
        Self {
            seed,
            buf: [0; 64],
            len: 0,
        }
    }

    fn write(&mut self, mut bytes: &[u8]) {
        while !bytes.is_empty() {
            if self.len == self.buf.len() {
                self.seed = hash64(&self.buf, self.seed);
                self.len = 0;
            }
            let n = bytes.len().min(self.buf.len() - self.len);
            self.buf[self.len..self.len + n].copy_from_slice(&bytes[..n]);
            self.len += n;
            bytes = &bytes[n..];
        }
    }

    fn finish(&self) -> u64 {
        hash64(&self.buf[..self.len], self.seed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stable_json::stable_stringify;
    use serde_json::{json, Value};

    fn shaped(status: &str, value: Value) -> Shape {
        shape(status, stable_stringify(&value).as_bytes(), &mut Vec::new())
    }

    fn collapsed(value: Value) -> String {
        let mut out = Vec::new();
        collapse_whitespace(stable_stringify(&value).as_bytes(), &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn whitespace_in_strings_collapses_and_trims() {
        assert_eq!(
            collapsed(json!({"command": "  python   run.py\n\t--fast  "})),
            r#"{"command":"python run.py --fast"}"#
        );
        assert_eq!(
            collapsed(json!({"command": "python run.py --fast"})),
            collapsed(json!({"command": "python run.py\n--fast "}))
        );
        // Escaped quotes and backslashes are content, not string ends.
        assert_eq!(
            collapsed(json!({"a": "say \"hi  there\" \\  now"})),
            r#"{"a":"say \"hi there\" \\ now"}"#
        );
        assert_eq!(collapsed(json!(["", "  "])), r#"["",""]"#);
    }

    #[test]
    fn counters_in_lines_do_not_change_the_skeleton() {
        let a = shaped(
            "failure",
            json!("bash: line 12: DISCUSSION: command not found\n"),
        );
        let b = shaped(
            "failure",
            json!("bash: line 13: DISCUSSION: command not found\n"),
        );
        assert_eq!(a.skeleton, b.skeleton);
        assert_eq!(a.gist, b.gist);
        assert_ne!(
            a.skeleton,
            shaped(
                "success",
                json!("bash: line 13: DISCUSSION: command not found\n")
            )
            .skeleton,
            "the status is part of it"
        );
    }

    #[test]
    fn the_gist_ignores_line_order_and_repeated_lines() {
        let a = shaped("failure", json!("tar: cannot open\n/system/a\n/system/b\n"));
        let b = shaped("failure", json!("/system/a\ntar: cannot open\n/system/b\n"));
        let c = shaped(
            "failure",
            json!("/system/a\n/system/b\n/system/b\ntar: cannot open"),
        );
        assert_eq!(a.gist, b.gist);
        assert_eq!(a.gist, c.gist);
        assert_ne!(a.skeleton, b.skeleton);
        assert_eq!(a.lines, c.lines);
        assert_eq!(a.lines.len(), 3);
    }

    #[test]
    fn new_lines_are_counted_against_a_sketch() {
        let old = shaped("success", json!("a\nb\nc"));
        let grown = shaped("success", json!("a\nb\nb\nc\nc"));
        let moved = shaped("success", json!("a\nb\nc\nd"));
        assert_eq!(grown.lines.new_against(&old.lines), 0);
        assert_eq!(moved.lines.new_against(&old.lines), 1);
        let mut union = old.lines;
        union.union_with(&moved.lines);
        assert_eq!(union.len(), 4);
        assert_eq!(LineSketch::from_bytes(&union.to_bytes()), Some(union));
        assert_eq!(LineSketch::from_bytes(&[0; 3]), None);
    }

    #[test]
    fn blank_results_say_nothing() {
        assert!(
            shaped(
                "failure",
                json!({"exit_code": 1, "stdout": "", "stderr": " \n"})
            )
            .blank
        );
        assert!(shaped("success", json!("")).blank);
        assert!(shaped("success", json!({"slept": 5})).blank);
        assert!(!shaped("failure", json!({"error": "no matches"})).blank);
        assert!(!shaped("success", json!(["x"])).blank);
    }

    #[test]
    fn numbers_changed_few_or_most() {
        let poll = |p: u32| shaped("success", json!({"state": "running", "progress": p}));
        assert_eq!(poll(40).skeleton, poll(60).skeleton);
        assert_eq!(poll(40).numbers.count, 1);
        assert!(!poll(60).numbers.mostly_same_as(&poll(40).numbers));
        assert!(poll(40).numbers.mostly_same_as(&poll(40).numbers));
        let curl = |speed: u32| {
            shaped(
                "success",
                json!(format!(
                    "  % Total  % Received\n100  1256  100  1256    0     0  {speed}      0 --:--:-- {speed}\n"
                )),
            )
        };
        assert_eq!(curl(40740).skeleton, curl(46577).skeleton);
        assert_eq!(curl(40740).numbers.count, 9);
        assert!(curl(46577).numbers.mostly_same_as(&curl(40740).numbers));
    }

    #[test]
    fn lines_past_the_limit_are_not_read() {
        let text = format!("{}late\n", "same\n".repeat(MAX_LINES));
        assert_eq!(shaped("success", json!(text)).lines.len(), 1);
    }
}
