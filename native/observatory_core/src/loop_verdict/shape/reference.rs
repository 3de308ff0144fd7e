//! [`shape`](super::shape) as it was before a result's runs of words were found from
//! one stop map: the oracle the tests hold the fast version to, key for key. Runs found
//! a byte at a time, the first `hash64`, no buffers kept.

use super::{
    LineSketch, NumberSketch, Shape, GIST_SEED, LINE_SEED, MAX_LINES, MAX_NUMBERS, NUMBER_SEED,
    OPENING_BYTES, OPENING_SEED, SKELETON_SEED,
};
use crate::loop_verdict::keys::reference::hash64;

/// The views of normalized canonical JSON text, as the first version read them.
pub fn shape(status: &str, text: &[u8]) -> Shape {
    let mut masked = Vec::new();
    let mut lines = Vec::new();
    let mut reader = Reader {
        masked: &mut masked,
        lines: &mut lines,
        line_start: 0,
        pending_space: false,
        numbers: NumberSketch::default(),
        in_value: false,
        opening: 0,
    };
    let blank = reader.read(text);
    reader.end_line();
    let numbers = reader.numbers;
    let opening = reader.opening;
    let skeleton = hash64(&masked, hash64(status.as_bytes(), SKELETON_SEED));
    lines.sort_unstable();
    lines.dedup();
    let mut sketch = LineSketch::default();
    let mut gist = hash64(status.as_bytes(), GIST_SEED);
    for &h in &lines {
        sketch.insert(h);
        gist = hash64(&h.to_le_bytes(), gist);
    }
    Shape {
        skeleton,
        gist,
        lines: sketch,
        numbers,
        blank,
        opening,
    }
}

/// The token at `i` inside a JSON string: where it ends, and whether it is whitespace.
fn string_token(src: &[u8], i: usize) -> (usize, bool) {
    match src[i] {
        b'\\' if i + 1 < src.len() => match src[i + 1] {
            b'n' | b'r' | b't' => (i + 2, true),
            b'u' => ((i + 6).min(src.len()), false),
            _ => (i + 2, false),
        },
        b' ' => (i + 1, true),
        _ => (word_run(src, i + 1), false),
    }
}

/// Where the run of words from `j` ends, a byte at a time: at a quote, backslash or
/// digit, or at a space followed by one of those, by a space or by the end.
fn word_run(src: &[u8], mut j: usize) -> usize {
    let stop = |b: u8| matches!(b, b'"' | b' ' | b'\\') || b.is_ascii_digit();
    loop {
        while j < src.len() && !stop(src[j]) {
            j += 1;
        }
        if j + 1 < src.len() && src[j] == b' ' && !stop(src[j + 1]) {
            j += 2;
            continue;
        }
        return j;
    }
}

struct Reader<'a> {
    masked: &'a mut Vec<u8>,
    lines: &'a mut Vec<u64>,
    line_start: usize,
    pending_space: bool,
    numbers: NumberSketch,
    in_value: bool,
    opening: u64,
}

impl Reader<'_> {
    fn read(&mut self, text: &[u8]) -> bool {
        let mut objects = Vec::new();
        let mut blank = true;
        let mut expect_key = false;
        let mut i = 0;
        while i < text.len() {
            let b = text[i];
            if b.is_ascii_digit() {
                i = self.number(text, i);
                continue;
            }
            match b {
                b'"' => {
                    self.end_line();
                    let is_key = expect_key;
                    self.in_value = !is_key;
                    i += 1;
                    while i < text.len() && text[i] != b'"' {
                        if text[i].is_ascii_digit() {
                            blank &= is_key;
                            i = self.number(text, i);
                            continue;
                        }
                        let (end, whitespace) = string_token(text, i);
                        if end == i + 2 && matches!(text[i + 1], b'n' | b'r') {
                            self.end_line();
                        } else if whitespace {
                            self.pending_space = true;
                        } else {
                            blank &= is_key;
                            self.content(&text[i..end]);
                        }
                        i = end;
                    }
                    self.end_line();
                    self.in_value = false;
                }
                b'{' => {
                    objects.push(true);
                    expect_key = true;
                    self.content(&[b]);
                }
                b'[' => {
                    objects.push(false);
                    expect_key = false;
                    self.content(&[b]);
                }
                b'}' | b']' => {
                    objects.pop();
                    expect_key = false;
                    self.content(&[b]);
                }
                b',' => {
                    expect_key = objects.last() == Some(&true);
                    self.content(&[b]);
                }
                b':' => {
                    expect_key = false;
                    self.content(&[b]);
                }
                _ => self.content(&[b]),
            }
            i += 1;
        }
        blank
    }

    fn number(&mut self, text: &[u8], i: usize) -> usize {
        let end = text[i..]
            .iter()
            .position(|b| !b.is_ascii_digit())
            .map_or(text.len(), |p| i + p);
        if self.numbers.count < MAX_NUMBERS {
            let position = self.numbers.count;
            self.numbers
                .insert(position, hash64(&text[i..end], NUMBER_SEED));
        }
        self.content(b"#");
        end
    }

    fn content(&mut self, bytes: &[u8]) {
        if self.pending_space && self.masked.len() > self.line_start {
            self.masked.push(b' ');
        }
        self.pending_space = false;
        self.masked.extend_from_slice(bytes);
    }

    fn end_line(&mut self) {
        if self.masked.len() > self.line_start {
            if self.opening == 0 && self.in_value {
                let line = &self.masked[self.line_start..];
                let line = &line[..line.len().min(OPENING_BYTES)];
                if line.iter().any(u8::is_ascii_alphabetic) {
                    self.opening = hash64(line, OPENING_SEED) | 1;
                }
            }
            if self.lines.len() < MAX_LINES {
                self.lines
                    .push(hash64(&self.masked[self.line_start..], LINE_SEED));
            }
            self.masked.push(b'\n');
            self.line_start = self.masked.len();
        }
        self.pending_space = false;
    }
}
