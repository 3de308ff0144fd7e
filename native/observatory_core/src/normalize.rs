//! Prompt normalization (seed 003, "Prompt Normalization"): the parts of a prompt that
//! change on every turn of a loop — timestamps, ids, counters, layout — are replaced
//! by fixed placeholders, so a looping agent's prompts hash alike.
//!
//! One left-to-right pass over the bytes, no regex. At each position the scanner tries,
//! in this order:
//!
//! 1. an ISO-8601 timestamp → `<TS>`: `YYYY-MM-DD`, optionally followed by
//!    `T` + `hh:mm[:ss[.fff…]]` and an offset (`Z`, `±hh:mm`, `±hhmm`, `±hh`). A bare
//!    date counts too. A space between date and time does not (RFC 3339 allows it):
//!    that way whitespace never decides what is a timestamp, and
//!    `2024-01-15 10:30:00` still normalizes the same every time, to
//!    `<TS> <NUM>:<NUM>:<NUM>`;
//! 2. a UUID → `<ID>`: 8-4-4-4-12 hex digits, any case;
//! 3. with [`normalize_hex_ids`] only: a hex id → `<ID>`;
//! 4. a number → `<NUM>`: ASCII digit runs joined by single `.` or `,` (decimals,
//!    thousands separators, versions), wherever it stands (`gpt4` → `gpt<NUM>`,
//!    `-3.5` → `-<NUM>`, `1,024.50` → `<NUM>`);
//!
//! and folds every run of whitespace (ASCII and Unicode) into one space, trimming both
//! ends. Timestamps and UUIDs come before numbers, or their digits would be eaten first.
//!
//! The shapes are checked, not the values (month 13 is still a timestamp): every
//! decision depends only on which bytes are digits, so two texts that differ only in
//! their digits always normalize to the same string. The output holds no ASCII digit,
//! which makes normalizing twice the same as once.
//!
//! # Per-call ids only: [`normalize_ids_into`]
//!
//! The loop verdict ([`crate::loop_verdict`]) hashes tool inputs and results, where a
//! plain number is often the very thing that changes when an agent makes progress
//! (`"progress": 10` → `80`, `file3.txt`, `range(20)`). Its mode uses the same
//! recognizers but replaces only what is different on every call by nature:
//! timestamps (`<TS>`, also 10- and 13-digit Unix times), UUIDs and hex ids (`<ID>`),
//! and a number written right after a volatile word such as `pid 4242`,
//! `request_id=17` or `"elapsed_ms":1234` (`<V>`). Other numbers and the layout are
//! kept. See [`IdRules`].

/// Normalizes `text` with the spec's rules: timestamps, UUIDs, numbers, whitespace.
pub fn normalize(text: &str) -> String {
    Scanner { hex_ids: false }.run(text)
}

/// Like [`normalize`], and also replaces hex ids with `<ID>`: a whole alphanumeric word
/// (delimited by anything but `[A-Za-z0-9]`, so `call_9f86d081` qualifies) of at least
/// 8 hex characters with at least one digit and one letter, e.g. `9f86d081884c`.
///
/// Per-call ids such as trace or request ids otherwise leave a different
/// `<NUM>f<NUM>d…` pattern in each prompt. The rule needs a letter so that plain
/// numbers stay `<NUM>`, and a digit so that words such as `deadbeef` or `defaced`
/// stay words. Not part of the spec's rules, hence a separate function.
pub fn normalize_hex_ids(text: &str) -> String {
    Scanner { hex_ids: true }.run(text)
}

const TIMESTAMP: &str = "<TS>";
const ID: &str = "<ID>";
const NUM: &str = "<NUM>";
const MIN_HEX_ID: usize = 8;

struct Scanner {
    hex_ids: bool,
}

impl Scanner {
    fn run(&self, text: &str) -> String {
        let bytes = text.as_bytes();
        let mut out = String::with_capacity(text.len());
        // Bytes from `literal` to `i` are copied verbatim; they are flushed in one
        // `push_str` when a token or whitespace interrupts them. Every flush point is
        // an ASCII byte or the first byte of a character, so the slices are valid.
        let mut literal = 0;
        let mut i = 0;
        while i < bytes.len() {
            match CLASS[usize::from(bytes[i])] {
                Class::Plain => i += 1,
                Class::Digit | Class::HexLetter => match self.token_at(bytes, i) {
                    Some((len, placeholder)) => {
                        out.push_str(&text[literal..i]);
                        out.push_str(placeholder);
                        i += len;
                        literal = i;
                    }
                    None => i += 1,
                },
                Class::Space => {
                    // One space between two words is already normal: keep it in the
                    // literal. (The byte before it is never whitespace: a run is
                    // consumed whole.)
                    let lone = bytes[i] == b' '
                        && i > 0
                        && i + 1 < bytes.len()
                        && whitespace_len(text, i + 1) == 0;
                    if lone || whitespace_len(text, i) == 0 {
                        i += 1;
                        continue;
                    }
                    out.push_str(&text[literal..i]);
                    while i < bytes.len() {
                        match whitespace_len(text, i) {
                            0 => break,
                            n => i += n,
                        }
                    }
                    if !out.is_empty() && i < bytes.len() {
                        out.push(' ');
                    }
                    literal = i;
                }
            }
        }
        out.push_str(&text[literal..]);
        out
    }

    /// The token starting at `i`, a digit or a hex letter, tried in the order of the
    /// module docs.
    fn token_at(&self, s: &[u8], i: usize) -> Option<(usize, &'static str)> {
        let rest = &s[i..];
        let digit = rest[0].is_ascii_digit();
        if digit {
            match timestamp_len(rest) {
                0 => {}
                n => return Some((n, TIMESTAMP)),
            }
        }
        if is_uuid(rest) {
            return Some((UUID_LEN, ID));
        }
        let at_word_start = i == 0 || !s[i - 1].is_ascii_alphanumeric();
        if self.hex_ids && at_word_start {
            match hex_id_len(rest) {
                0 => {}
                n => return Some((n, ID)),
            }
        }
        digit.then(|| (number_len(rest), NUM))
    }
}

/// What the scanner looks at a byte for. Most bytes are `Plain` and only move the
/// cursor on.
#[derive(Clone, Copy)]
enum Class {
    Plain,
    Digit,
    HexLetter,
    /// ASCII whitespace, or a lead byte that may start a Unicode whitespace character.
    Space,
}

const CLASS: [Class; 256] = {
    let mut table = [Class::Plain; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = match b as u8 {
            b'0'..=b'9' => Class::Digit,
            b'a'..=b'f' | b'A'..=b'F' => Class::HexLetter,
            b' ' | b'\t' | b'\n' | b'\r' | 0x0B | 0x0C | 0xC2 | 0xE1 | 0xE2 | 0xE3 => Class::Space,
            _ => Class::Plain,
        };
        b += 1;
    }
    table
};

/// Byte length of the whitespace character at `i`, or 0. Bytes ≥ 0x80 are decoded only
/// when they can start one of Unicode's whitespace characters (U+0085, U+00A0, U+1680,
/// U+2000–U+205F, U+3000); `i` is then always a character boundary, because the scanner
/// never stops inside a character at one of those lead bytes.
fn whitespace_len(text: &str, i: usize) -> usize {
    match text.as_bytes()[i] {
        b' ' | b'\t' | b'\n' | b'\r' | 0x0B | 0x0C => 1,
        0xC2 | 0xE1 | 0xE2 | 0xE3 => match text[i..].chars().next() {
            Some(c) if c.is_whitespace() => c.len_utf8(),
            _ => 0,
        },
        _ => 0,
    }
}

fn digits_len(s: &[u8]) -> usize {
    let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
    #[cfg(test)]
    tests::count_read(n + 1);
    n
}

/// `s` starts with `shape`, where `d` stands for any ASCII digit.
fn starts_with_shape(s: &[u8], shape: &[u8]) -> bool {
    s.len() >= shape.len()
        && shape.iter().zip(s).all(|(&want, &got)| match want {
            b'd' => got.is_ascii_digit(),
            _ => want == got,
        })
}

/// Digit runs joined by single `.` or `,`: `3.14`, `1,024.50`, `1.024,50`, `192.168.1.1`
/// and `v1.2.3`'s `1.2.3` are one number each, and so is a list written without spaces
/// (`[1,2,3]` → `[<NUM>]`). A trailing separator is not part of it (`3.` → `<NUM>.`).
fn number_len(s: &[u8]) -> usize {
    let mut n = digits_len(s);
    while matches!(s.get(n), Some(b'.' | b',')) {
        match digits_len(&s[n + 1..]) {
            0 => break,
            more => n += 1 + more,
        }
    }
    n
}

/// Length of the ISO-8601 date or date-time at the start of `s`, or 0.
fn timestamp_len(s: &[u8]) -> usize {
    if !starts_with_shape(s, b"dddd-dd-dd") {
        return 0;
    }
    let date = 10;
    let time = &s[date..];
    if !(matches!(time.first(), Some(b'T' | b't')) && starts_with_shape(&time[1..], b"dd:dd")) {
        return date;
    }
    let mut n = date + 6;
    if starts_with_shape(&s[n..], b":dd") {
        n += 3;
        if s.get(n) == Some(&b'.') {
            match digits_len(&s[n + 1..]) {
                0 => {}
                frac => n += 1 + frac,
            }
        }
    }
    n + offset_len(&s[n..])
}

fn offset_len(s: &[u8]) -> usize {
    match s.first() {
        Some(b'Z' | b'z') => 1,
        Some(b'+' | b'-') => {
            let rest = &s[1..];
            if starts_with_shape(rest, b"dd:dd") {
                6
            } else if starts_with_shape(rest, b"dddd") {
                5
            } else if starts_with_shape(rest, b"dd") {
                3
            } else {
                0
            }
        }
        _ => 0,
    }
}

const UUID_LEN: usize = 36;

/// The dashes are checked first: they reject almost every other word at once.
fn is_uuid(s: &[u8]) -> bool {
    s.len() >= UUID_LEN
        && [8, 13, 18, 23].iter().all(|&k| s[k] == b'-')
        && s[..UUID_LEN].iter().enumerate().all(|(k, b)| match k {
            8 | 13 | 18 | 23 => *b == b'-',
            _ => b.is_ascii_hexdigit(),
        })
}

/// Length of the hex id filling the whole alphanumeric word at the start of `s`, or 0.
fn hex_id_len(s: &[u8]) -> usize {
    let word = s.iter().take_while(|b| b.is_ascii_alphanumeric()).count();
    #[cfg(test)]
    tests::count_read(word + 1);
    let word = &s[..word];
    let is_id = word.len() >= MIN_HEX_ID
        && word.iter().all(u8::is_ascii_hexdigit)
        && word.iter().any(u8::is_ascii_digit)
        && word.iter().any(u8::is_ascii_alphabetic);
    if is_id {
        word.len()
    } else {
        0
    }
}

// ---------------------------------------------------------------------------------
// Per-call ids only (the loop verdict's mode)
// ---------------------------------------------------------------------------------

/// Placeholder for a value that is different on every call by nature (`pid 4242`).
pub const VOLATILE: &str = "<V>";

/// Unix times in seconds (10 digits) and milliseconds (13 digits) from 2001 to 2033
/// start with a `1`.
const EPOCH_LENGTHS: [usize; 2] = [10, 13];

/// The words (and JSON keys) whose value is different on every call: process and
/// thread ids, request and trace ids, clocks and durations, retry counters. Matched
/// ignoring ASCII case, `_` and `-` (`requestId`, `request-id` and `REQUEST_ID` are
/// all `request_id`). `id` alone is not in the list: `get_issue(id: 42)` and
/// `get_issue(id: 43)` are different calls.
pub const DEFAULT_VOLATILE_WORDS: &[&str] = &[
    "pid",
    "ppid",
    "tid",
    "process_id",
    "thread_id",
    "request_id",
    "req_id",
    "trace_id",
    "span_id",
    "correlation_id",
    "call_id",
    "tool_call_id",
    "nonce",
    "timestamp",
    "ts",
    "created_at",
    "updated_at",
    "started_at",
    "finished_at",
    "completed_at",
    "elapsed",
    "elapsed_ms",
    "duration",
    "duration_ms",
    "took",
    "took_ms",
    "latency_ms",
    "uptime",
    "attempt",
    "retry",
    "seq",
];

/// A set of volatile words, compared in a canonical form: ASCII letters lowercased,
/// `_` and `-` dropped. Words longer than [`VolatileWords::MAX_LEN`] canonical bytes,
/// or with non-ASCII bytes, never match.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolatileWords {
    /// Canonical words packed into integers (byte `i` at bits `8i..8i+8`), sorted by
    /// length: comparing two is one register compare.
    words: Vec<u128>,
    /// For each canonical length, the range of `words` that have it: a candidate is
    /// compared with the few words of its own length, most with none.
    by_len: [(u8, u8); VolatileWords::MAX_LEN + 1],
    /// Bits of the words' first and last bytes ([`byte_bit`]): a candidate whose ends
    /// match no word is rejected before it is read whole.
    firsts: u64,
    lasts: u64,
}

impl Default for VolatileWords {
    /// The empty set.
    fn default() -> Self {
        Self {
            words: Vec::new(),
            by_len: [(0, 0); VolatileWords::MAX_LEN + 1],
            firsts: 0,
            lasts: 0,
        }
    }
}

impl VolatileWords {
    /// Longest canonical word (`correlation_id` is 13); at most 255 words are kept.
    pub const MAX_LEN: usize = 16;

    pub fn new<S: AsRef<str>>(words: impl IntoIterator<Item = S>) -> Self {
        let mut canonical: Vec<(u8, u128)> = words
            .into_iter()
            .filter_map(|w| canonical_word(w.as_ref().as_bytes()))
            .filter(|&(len, _)| len > 0)
            .collect();
        canonical.sort_unstable();
        canonical.dedup();
        canonical.truncate(usize::from(u8::MAX));
        let mut set = Self::default();
        for (i, &(len, packed)) in canonical.iter().enumerate() {
            let range = &mut set.by_len[usize::from(len)];
            if range.0 == range.1 {
                range.0 = i as u8;
            }
            range.1 = i as u8 + 1;
            set.firsts |= byte_bit(packed as u8);
            set.lasts |= byte_bit((packed >> (8 * (len - 1))) as u8);
            set.words.push(packed);
        }
        set
    }

    /// The default list, [`DEFAULT_VOLATILE_WORDS`].
    pub fn defaults() -> Self {
        Self::new(DEFAULT_VOLATILE_WORDS)
    }

    pub fn is_empty(&self) -> bool {
        self.words.is_empty()
    }

    /// Whether `word` is in the set (see the type's docs for the comparison). Called
    /// for every number a text holds, so it packs the word in registers, one pass.
    #[inline]
    pub fn contains(&self, word: &[u8]) -> bool {
        if self.words.is_empty() || word.len() > 2 * Self::MAX_LEN {
            return false;
        }
        let kept = |b: &&u8| **b != b'_' && **b != b'-';
        let (Some(&first), Some(&last)) = (word.iter().find(kept), word.iter().rev().find(kept))
        else {
            return false;
        };
        self.firsts & byte_bit(first.to_ascii_lowercase()) != 0
            && self.lasts & byte_bit(last.to_ascii_lowercase()) != 0
            && self.contains_canonical(word)
    }

    fn contains_canonical(&self, word: &[u8]) -> bool {
        match canonical_word(word) {
            Some((len, packed)) => {
                let (start, end) = self.by_len[usize::from(len)];
                self.words[usize::from(start)..usize::from(end)].contains(&packed)
            }
            None => false,
        }
    }
}

/// A bit per byte, folded to 64 (a shared bit only costs a full compare).
fn byte_bit(b: u8) -> u64 {
    1 << (b & 63)
}

/// Lowercase ASCII without `_` and `-`, packed; `None` when too long or not ASCII.
fn canonical_word(word: &[u8]) -> Option<(u8, u128)> {
    let mut buf = [0u8; VolatileWords::MAX_LEN];
    let mut len = 0;
    for &b in word {
        match b {
            b'_' | b'-' => {}
            b if b.is_ascii() && len < VolatileWords::MAX_LEN => {
                buf[len] = b.to_ascii_lowercase();
                len += 1;
            }
            _ => return None,
        }
    }
    Some((len as u8, u128::from_le_bytes(buf)))
}

/// What [`normalize_ids_into`] replaces. Timestamps and UUIDs always go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdRules {
    /// Hex ids (as [`normalize_hex_ids`]: a whole word of ≥ 8 hex characters with a
    /// digit and a letter) → `<ID>`.
    pub hex_ids: bool,
    /// A 10- or 13-digit integer starting with `1` (Unix seconds or milliseconds,
    /// 2001–2033) → `<TS>`.
    pub epoch_timestamps: bool,
    /// Every other number → `<NUM>`, as the kill switch does. Off for the loop
    /// verdict: it would make `progress 10%` and `progress 80%` the same result.
    pub numbers: bool,
    /// A number right after one of these words (`pid 4242`, `pid=4242`,
    /// `"elapsed_ms":1234`, up to three of ` :=#"'` between them) → `<V>`. The loop
    /// verdict also replaces the whole value of a JSON member with such a key.
    pub volatile: VolatileWords,
}

impl Default for IdRules {
    /// Hex ids, Unix times and the default volatile words; plain numbers kept.
    fn default() -> Self {
        Self {
            hex_ids: true,
            epoch_timestamps: true,
            numbers: false,
            volatile: VolatileWords::defaults(),
        }
    }
}

/// Appends `text` to `out` with its per-call ids replaced by placeholders (see
/// [`IdRules`] and the module docs). Whitespace is kept as it is.
///
/// Tokens start only at the start of a word (after a byte that is not an ASCII letter
/// or digit), unlike [`normalize`], which also finds them inside words: inside a word
/// a number is part of a name (`file3`, `gpt4`).
///
/// This runs on every tool input and result, so it is built for text with few
/// digits: every token holds a digit, so the scan jumps from digit to digit, eight
/// bytes at a time, and looks only at the words that hold one. The one shape that
/// can hold a digit outside its first word is a UUID (`abcdefab-cdef-4bcd-…`); it is
/// found from the group that holds the digit. A UUID with no digit at all (one in
/// about 10¹³) stays as it is.
pub fn normalize_ids_into(text: &str, rules: &IdRules, out: &mut Vec<u8>) {
    scan_ids(text.as_bytes(), rules, false, out)
}

/// [`normalize_ids_into`] for compact JSON text (as
/// [`stable_stringify`](crate::stable_json::stable_stringify) writes it), with two
/// more rules:
///
/// * the letter of an escape (`\n`, `\t`, `\u`…) ends a word, so a log line after
///   `\n` still starts with its timestamp;
/// * a string value of a member whose key is a volatile word, when it holds a digit
///   within its first 48 bytes, becomes `"<V>"` as a whole (`"request_id":"req-42"`);
///   a number value of such a key already does (`"pid":4242`, a number after a
///   volatile word).
pub fn normalize_json_ids_into(json: &str, rules: &IdRules, out: &mut Vec<u8>) {
    scan_ids(json.as_bytes(), rules, true, out)
}

fn scan_ids(s: &[u8], rules: &IdRules, json: bool, out: &mut Vec<u8>) {
    // Bytes before `literal` are in `out`; no token starts before `floor` (the end of
    // the last word or token looked at).
    let mut literal = 0;
    let mut floor = 0;
    let mut numbers = NumberChain::default();
    while let Some(digit) = next_digit(s, floor) {
        let mut start = digit;
        while start > floor
            && WORD_CLASS[usize::from(s[start - 1])] != 0
            && !(json && escape_letter(s, start - 1))
        {
            start -= 1;
        }
        let token = match uuid_before(s, start, floor) {
            Some(uuid) => Some((uuid, UUID_LEN, ID)),
            None => match json
                .then(|| volatile_string(s, start, floor, rules))
                .flatten()
            {
                Some((at, len)) => Some((at, len, VOLATILE)),
                None => {
                    let (word, end) = scan_word(s, start);
                    let class = WORD_CLASS[usize::from(s[start])];
                    match id_token_at(s, start, class, word, rules, &mut numbers) {
                        Some((len, placeholder)) => Some((start, len, placeholder)),
                        None => {
                            floor = end;
                            None
                        }
                    }
                }
            },
        };
        if let Some((at, len, placeholder)) = token {
            out.extend_from_slice(&s[literal..at]);
            out.extend_from_slice(placeholder.as_bytes());
            literal = at + len;
            floor = literal;
        }
    }
    out.extend_from_slice(&s[literal..]);
}

/// The position of the last `"` in `s`: eight bytes per step from the end (SWAR).
fn last_quote(s: &[u8]) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const QUOTES: u64 = 0x2222_2222_2222_2222;
    let mut end = s.len();
    while end >= 8 {
        let x = u64::from_le_bytes(s[end - 8..end].try_into().expect("8 bytes")) ^ QUOTES;
        // High bit of a byte set when it was a quote (the lowest such byte is exact;
        // above it a borrow can mark a 0x01 byte too, so the candidate is checked).
        let zero = x.wrapping_sub(ONES) & !x & HIGH;
        if zero != 0 {
            let mut k = end - 8 + (63 - zero.leading_zeros() as usize) / 8;
            while s[k] != b'"' {
                k -= 1;
            }
            return Some(k);
        }
        end -= 8;
    }
    s[..end].iter().rposition(|&b| b == b'"')
}

/// Whether the byte at `k` is the letter of a JSON escape: preceded by an odd number
/// of backslashes.
fn escape_letter(s: &[u8], k: usize) -> bool {
    let backslashes = s[..k].iter().rev().take_while(|&&b| b == b'\\').count();
    #[cfg(test)]
    tests::count_read(backslashes + 1);
    backslashes % 2 == 1
}

/// Longest distance from a string value's opening quote to the digit that makes the
/// scan look for its key.
const VOLATILE_VALUE_REACH: usize = 48;

/// The string value around the word at `start` when its key is volatile: the range
/// between its quotes, as `(first byte, length)`.
fn volatile_string(
    s: &[u8],
    start: usize,
    floor: usize,
    rules: &IdRules,
) -> Option<(usize, usize)> {
    if rules.volatile.is_empty() {
        return None;
    }
    let reach = start.saturating_sub(VOLATILE_VALUE_REACH).max(floor);
    // The nearest unescaped quote before the word opens the string it is in.
    let mut open = start;
    loop {
        open = reach + last_quote(&s[reach..open])?;
        if !escape_letter(s, open) {
            break;
        }
    }
    // `"key":"value…`: the opening quote follows `":`.
    if open < 2 || s[open - 1] != b':' || s[open - 2] != b'"' {
        return None;
    }
    let key_end = open - 2;
    let key_reach = key_end.saturating_sub(2 * VolatileWords::MAX_LEN);
    let key_start = key_end
        - s[key_reach..key_end]
            .iter()
            .rev()
            .position(|&b| b == b'"')?;
    if !rules.volatile.contains(&s[key_start..key_end]) {
        return None;
    }
    let mut close = start;
    loop {
        let to_quote = s[close..].iter().position(|&b| b == b'"');
        #[cfg(test)]
        tests::count_read(to_quote.map_or(s.len() - close, |n| n + 1));
        close += to_quote?;
        if !escape_letter(s, close) {
            break;
        }
        close += 1;
    }
    Some((open + 1, close - open - 1))
}

/// The first ASCII digit at or after `i`. Sixty-four bytes a load where the processor
/// has AVX-512BW and sixteen where SSE2 is (every x86-64): a large result is mostly
/// long runs without a digit, and this scan reads all of it.
fn next_digit(s: &[u8], i: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    let i = if s.len() >= i + 64 && std::is_x86_feature_detected!("avx512bw") {
        // SAFETY: the processor has AVX-512BW.
        match unsafe { next_digit_avx512(s, i) } {
            Ok(found) => return Some(found),
            Err(rest) => rest,
        }
    } else {
        i
    };
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of every x86-64 target.
    let i = match unsafe { next_digit_sse2(s, i) } {
        Ok(found) => return Some(found),
        Err(rest) => rest,
    };
    next_digit_words(s, i)
}

/// [`next_digit`] sixty-four bytes a load; `Err` is where the bytes left (fewer than
/// 64) begin.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512bw")]
fn next_digit_avx512(s: &[u8], mut i: usize) -> Result<usize, usize> {
    use std::arch::x86_64::{
        _mm512_cmple_epu8_mask, _mm512_loadu_si512, _mm512_set1_epi8, _mm512_sub_epi8,
    };
    let (zero, nine) = (_mm512_set1_epi8(b'0' as i8), _mm512_set1_epi8(9));
    while i + 64 <= s.len() {
        // SAFETY: s[i..i + 64] is in the slice; loadu reads unaligned memory.
        let v = unsafe { _mm512_loadu_si512(s.as_ptr().add(i).cast()) };
        let mask = _mm512_cmple_epu8_mask(_mm512_sub_epi8(v, zero), nine);
        if mask != 0 {
            return Ok(i + mask.trailing_zeros() as usize);
        }
        i += 64;
    }
    Err(i)
}

/// [`next_digit`] sixteen bytes at a time; `Err` is where the bytes left (fewer than
/// 16) begin.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn next_digit_sse2(s: &[u8], mut i: usize) -> Result<usize, usize> {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8, _mm_sub_epi8,
    };
    let (zero, nine) = (_mm_set1_epi8(b'0' as i8), _mm_set1_epi8(9));
    // A digit is a byte whose difference from `0` is at most 9 (unsigned).
    let digits = |v| {
        let d = _mm_sub_epi8(v, zero);
        _mm_cmpeq_epi8(_mm_min_epu8(d, nine), d)
    };
    // Sixty-four bytes a step while they last, one test and branch for four loads (a
    // 4 KiB result is mostly long runs without a digit); the sixteen bytes that hold
    // the digit are found again below.
    while i + 64 <= s.len() {
        // SAFETY: s[i..i + 64] is in the slice; loadu reads unaligned memory.
        let [a, b, c, d] = [0, 16, 32, 48]
            .map(|k| digits(unsafe { _mm_loadu_si128(s.as_ptr().add(i + k).cast()) }));
        let any = _mm_or_si128(_mm_or_si128(a, b), _mm_or_si128(c, d));
        if _mm_movemask_epi8(any) != 0 {
            break;
        }
        i += 64;
    }
    while i + 16 <= s.len() {
        // SAFETY: s[i..i + 16] is in the slice; loadu reads unaligned memory.
        let v = unsafe { _mm_loadu_si128(s.as_ptr().add(i).cast()) };
        let mask = _mm_movemask_epi8(digits(v)) as u32;
        if mask != 0 {
            return Ok(i + mask.trailing_zeros() as usize);
        }
        i += 16;
    }
    Err(i)
}

/// [`next_digit`] eight bytes per step (SWAR), then byte by byte for the tail (its
/// tail, and the whole on other targets).
fn next_digit_words(s: &[u8], mut i: usize) -> Option<usize> {
    const LOW: u64 = 0x7F7F_7F7F_7F7F_7F7F;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const FROM_0: u64 = 0x5050_5050_5050_5050; // 0x80 - b'0'
    const PAST_9: u64 = 0x4646_4646_4646_4646; // 0x7F - b'9'
    while let Some(chunk) = s.get(i..i + 8) {
        let x = u64::from_le_bytes(chunk.try_into().expect("8 bytes"));
        let y = x & LOW;
        // High bit of a byte set when 0x30 <= byte <= 0x39 (and it is ASCII).
        let digits = (y + FROM_0) & !(y + PAST_9) & !x & HIGH;
        if digits != 0 {
            return Some(i + (digits.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    s.get(i..)?
        .iter()
        .position(u8::is_ascii_digit)
        .map(|k| i + k)
}

/// A UUID that starts one to four groups before the word at `start` (whose digit the
/// scan found), at a word start not before `floor`.
fn uuid_before(s: &[u8], start: usize, floor: usize) -> Option<usize> {
    if start == 0 || s[start - 1] != b'-' {
        return None;
    }
    [9, 14, 19, 24].into_iter().find_map(|back| {
        let p = start.checked_sub(back).filter(|&p| p >= floor)?;
        let at_word_start = p == floor || WORD_CLASS[usize::from(s[p - 1])] == 0;
        (at_word_start && is_uuid(&s[p..])).then_some(p)
    })
}

/// The word starting at `start` (one pass) and its end.
fn scan_word(s: &[u8], start: usize) -> (Word, usize) {
    let class = WORD_CLASS[usize::from(s[start])];
    let mut end = start + 1;
    let mut all = class;
    let mut any = class;
    while let Some(&b) = s.get(end) {
        let c = WORD_CLASS[usize::from(b)];
        if c == 0 {
            break;
        }
        all &= c;
        any |= c;
        end += 1;
    }
    #[cfg(test)]
    tests::count_read(end - start);
    let word = Word {
        len: end - start,
        all_hex: all & HEX != 0,
        has_digit: any & DIGIT != 0,
        all_digits: all & DIGIT != 0,
    };
    (word, end)
}

/// Bits of [`WORD_CLASS`]: every ASCII letter or digit has `WORD`.
const WORD: u8 = 1;
const DIGIT: u8 = 2;
const HEX: u8 = 4;

const WORD_CLASS: [u8; 256] = {
    let mut table = [0u8; 256];
    let mut b = 0;
    while b < 256 {
        table[b] = match b as u8 {
            b'0'..=b'9' => WORD | DIGIT | HEX,
            b'a'..=b'f' | b'A'..=b'F' => WORD | HEX,
            b'g'..=b'z' | b'G'..=b'Z' => WORD,
            _ => 0,
        };
        b += 1;
    }
    table
};

/// The word at a word start, as one scan saw it.
#[derive(Clone, Copy)]
struct Word {
    len: usize,
    all_hex: bool,
    has_digit: bool,
    all_digits: bool,
}

/// [`normalize_ids_into`] into a new string.
pub fn normalize_ids(text: &str, rules: &IdRules) -> String {
    let mut out = Vec::with_capacity(text.len());
    normalize_ids_into(text, rules, &mut out);
    // Placeholders replace whole ASCII tokens, so the bytes stay UTF-8.
    String::from_utf8(out).expect("only ASCII tokens are replaced")
}

/// The token at word start `i` (whose first byte has class `class`), if any. Each
/// shape is tried only when the word can start it: a timestamp's word is 4 digits
/// (`2026` before `-`), a UUID's 8 hex characters before `-`.
fn id_token_at(
    s: &[u8],
    i: usize,
    class: u8,
    word: Word,
    rules: &IdRules,
    numbers: &mut NumberChain,
) -> Option<(usize, &'static str)> {
    if class & HEX == 0 {
        return None;
    }
    let rest = &s[i..];
    let digit = class & DIGIT != 0;
    if digit && word.len == 4 && word.all_digits {
        match timestamp_len(rest) {
            0 => {}
            n => return Some((n, TIMESTAMP)),
        }
    }
    if word.len == 8 && word.all_hex && is_uuid(rest) {
        return Some((UUID_LEN, ID));
    }
    if rules.hex_ids && word.len >= MIN_HEX_ID && word.all_hex && word.has_digit && !word.all_digits
    {
        return Some((word.len, ID));
    }
    if !digit {
        return None;
    }
    let len = numbers.len_at(s, i);
    if rules.epoch_timestamps && is_epoch(&rest[..len]) {
        Some((len, TIMESTAMP))
    } else if volatile_before(s, i, &rules.volatile) {
        Some((len, VOLATILE))
    } else if rules.numbers {
        Some((len, NUM))
    } else {
        None
    }
}

/// The number [`number_len`] measured last, so that a chain of digit runs is read once
/// and not once per run: in `1,1,1,…` (CSV, a JSON array of numbers) each run starts a
/// word, and the number from each one reaches to the end of the chain, so measuring
/// every one of them anew would cost time quadratic in the chain's length. From any
/// digit inside a chain the number ends where the chain ends.
#[derive(Default)]
struct NumberChain {
    start: usize,
    end: usize,
}

impl NumberChain {
    /// [`number_len`] of `s[i..]`, where `s[i]` is a digit.
    fn len_at(&mut self, s: &[u8], i: usize) -> usize {
        if !(self.start..self.end).contains(&i) {
            self.start = i;
            self.end = i + number_len(&s[i..]);
        }
        self.end - i
    }
}

/// A 10- or 13-digit integer starting with `1`.
fn is_epoch(number: &[u8]) -> bool {
    EPOCH_LENGTHS.contains(&number.len())
        && number[0] == b'1'
        && number.iter().all(u8::is_ascii_digit)
}

/// Whether the word before position `i` (across up to three of ` :=#"'`) is volatile.
fn volatile_before(s: &[u8], i: usize, words: &VolatileWords) -> bool {
    // Most numbers follow a byte that can be neither a separator nor part of a word.
    if words.is_empty()
        || i == 0
        || !matches!(
            s[i - 1],
            b' ' | b':' | b'=' | b'#' | b'"' | b'\'' | b'_' | b'-'
        )
    {
        return false;
    }
    let mut end = i;
    while end > 0 && i - end < 3 && matches!(s[end - 1], b' ' | b':' | b'=' | b'#' | b'"' | b'\'') {
        end -= 1;
    }
    let mut start = end;
    while start > 0
        && end - start <= 2 * VolatileWords::MAX_LEN
        && (s[start - 1].is_ascii_alphanumeric() || matches!(s[start - 1], b'_' | b'-'))
    {
        start -= 1;
    }
    // The end of a dotted name or a path is not a word: `boot.ts 120`, `/tmp/pid 3`.
    let whole = start == 0 || !matches!(s[start - 1], b'.' | b'/' | b'\\');
    start < end && whole && words.contains(&s[start..end])
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn normalize_numbers() {
        assert_eq!(normalize("order #12345"), "order #<NUM>");
        assert_eq!(
            normalize("pi is 3.14, e is 2.718"),
            "pi is <NUM>, e is <NUM>"
        );
        assert_eq!(normalize("v1.2.3 of gpt4"), "v<NUM> of gpt<NUM>");
        assert_eq!(normalize("costs -5 or 7."), "costs -<NUM> or <NUM>.");
        assert_eq!(normalize("$1,024.50 vs 1.024,50"), "$<NUM> vs <NUM>");
        assert_eq!(normalize("[1,2, 3]"), "[<NUM>, <NUM>]");
    }

    #[test]
    fn normalize_timestamps() {
        assert_eq!(normalize("at 2024-01-15T10:30:00Z ok"), "at <TS> ok");
        assert_eq!(normalize("2024-01-15T10:30:00.123456+02:00"), "<TS>");
        assert_eq!(normalize("2024-01-15T10:30:00-0500."), "<TS>.");
        assert_eq!(normalize("2024-01-15t10:30z"), "<TS>");
        assert_eq!(normalize("due 2024-01-15."), "due <TS>.");
        assert_eq!(normalize("(2024-01-15T10:30:00Z)"), "(<TS>)");
        assert_eq!(
            normalize("2024-01-15 10:30:00"),
            "<TS> <NUM>:<NUM>:<NUM>",
            "a space is not a date-time separator"
        );
        assert_eq!(normalize("2024-1-15"), "<NUM>-<NUM>-<NUM>");
    }

    #[test]
    fn normalize_uuids() {
        assert_eq!(
            normalize("id 550e8400-e29b-41d4-a716-446655440000 done"),
            "id <ID> done"
        );
        assert_eq!(normalize("550E8400-E29B-41D4-A716-446655440000"), "<ID>");
        assert_eq!(
            normalize("run=abcdefab-cdef-abcd-efab-cdefabcdefab/x"),
            "run=<ID>/x"
        );
        assert_eq!(
            normalize("550e8400-e29b-41d4-a716-44665544000"),
            "<NUM>e<NUM>-e<NUM>b-<NUM>d<NUM>-a<NUM>-<NUM>",
            "one hex digit short is not a UUID"
        );
    }

    #[test]
    fn normalize_whitespace() {
        assert_eq!(normalize("  a   b\t\tc\r\n\r\nd\n"), "a b c d");
        assert_eq!(normalize("a\u{a0}\u{3000}b\u{2028}c"), "a b c");
        assert_eq!(normalize(" \t\r\n "), "");
        assert_eq!(normalize("héllo  wörld — ok"), "héllo wörld — ok");
    }

    #[test]
    fn timestamps_and_uuids_win_over_numbers() {
        assert_eq!(
            normalize("job 42 at 2024-01-15T10:30:00Z for 550e8400-e29b-41d4-a716-446655440000"),
            "job <NUM> at <TS> for <ID>"
        );
    }

    #[test]
    fn hex_ids_are_optional() {
        let text = "trace 9f86d081884c7d65 for call_a1b2c3d4e5, deadbeef, 12345678, x9f86d081";
        assert_eq!(
            normalize_hex_ids(text),
            "trace <ID> for call_<ID>, deadbeef, <NUM>, x<NUM>f<NUM>d<NUM>"
        );
        assert_eq!(
            normalize(text),
            "trace <NUM>f<NUM>d<NUM>c<NUM>d<NUM> for call_a<NUM>b<NUM>c<NUM>d<NUM>e<NUM>, \
             deadbeef, <NUM>, x<NUM>f<NUM>d<NUM>"
        );
    }

    fn ids(text: &str) -> String {
        normalize_ids(text, &IdRules::default())
    }

    #[test]
    fn ids_mode_keeps_plain_numbers_and_layout() {
        assert_eq!(ids("progress 10%  done"), "progress 10%  done");
        assert_eq!(ids("progress 80%"), "progress 80%");
        assert_eq!(
            ids("wrote /tmp/file3.txt (1,024 bytes)"),
            "wrote /tmp/file3.txt (1,024 bytes)"
        );
        assert_eq!(ids("gpt4 v1.2.3"), "gpt4 v1.2.3");
    }

    #[test]
    fn ids_mode_replaces_timestamps_uuids_and_hex_ids() {
        assert_eq!(
            ids("at 2026-02-22T10:30:01Z job 550e8400-e29b-41d4-a716-446655440000"),
            "at <TS> job <ID>"
        );
        assert_eq!(ids("trace 9f86d081884c7d65 ok"), "trace <ID> ok");
        assert_eq!(ids("call_a1b2c3d4e5 done"), "call_<ID> done");
        assert_eq!(
            ids("deadbeef stays, so does cafe"),
            "deadbeef stays, so does cafe"
        );
    }

    #[test]
    fn ids_mode_keeps_long_words_that_are_not_hex() {
        // Eight characters and a digit make no hex id when a letter is past `f`.
        assert_eq!(
            ids("version12 of build2024x, step9abc"),
            "version12 of build2024x, step9abc"
        );
        assert_eq!(ids("abcdef1234 of build2024x"), "<ID> of build2024x");
    }

    #[test]
    fn ids_mode_replaces_unix_times() {
        assert_eq!(ids("ts 1739870000 and 1739870000123"), "ts <TS> and <TS>");
        assert_eq!(
            ids("size 2739870000 and 173987000"),
            "size 2739870000 and 173987000"
        );
    }

    #[test]
    fn ids_mode_replaces_numbers_after_volatile_words() {
        assert_eq!(ids("Started (pid 4242)"), "Started (pid <V>)");
        assert_eq!(ids("PID=4242 port 8080"), "PID=<V> port 8080");
        assert_eq!(ids(r#"{"pid":4242,"code":1}"#), r#"{"pid":<V>,"code":1}"#);
        assert_eq!(
            ids("requestId: 17, took 340ms"),
            "requestId: <V>, took <V>ms"
        );
        assert_eq!(ids("attempt #3 failed"), "attempt #<V> failed");
        assert_eq!(
            ids("id 42"),
            "id 42",
            "a bare id is an argument, not a per-call id"
        );
        assert_eq!(
            ids("boot.ts 120 and /run/pid 3"),
            "boot.ts 120 and /run/pid 3",
            "names, not words"
        );
    }

    #[test]
    fn ids_mode_can_replace_every_number() {
        let rules = IdRules {
            numbers: true,
            ..IdRules::default()
        };
        assert_eq!(
            normalize_ids("progress 10% of 3.5", &rules),
            "progress <NUM>% of <NUM>"
        );
        assert_eq!(
            normalize_ids("file3", &rules),
            "file3",
            "inside a word it is a name"
        );
    }

    #[test]
    fn volatile_words_ignore_case_underscores_and_dashes() {
        let words = VolatileWords::new(["request_id", "PID"]);
        for w in [
            "request_id",
            "requestId",
            "REQUEST-ID",
            "requestid",
            "pid",
            "Pid",
        ] {
            assert!(words.contains(w.as_bytes()), "{w}");
        }
        for w in ["request", "id", "pids", "", "pïd"] {
            assert!(!words.contains(w.as_bytes()), "{w}");
        }
        assert!(VolatileWords::new(Vec::<String>::new()).is_empty());
        assert!(!VolatileWords::defaults().contains(b"id"));
    }

    /// The per-call-id mode written the plain way: every word start, left to right.
    /// The fast scanner must agree with it (it differs only on digit-free UUIDs).
    fn ids_reference(text: &str, rules: &IdRules) -> String {
        let s = text.as_bytes();
        let mut out = Vec::new();
        let (mut literal, mut i) = (0, 0);
        while i < s.len() {
            if WORD_CLASS[usize::from(s[i])] == 0 {
                i += 1;
                continue;
            }
            let (word, end) = scan_word(s, i);
            // A fresh chain each time: the plain way measures every number anew.
            let mut numbers = NumberChain::default();
            match id_token_at(
                s,
                i,
                WORD_CLASS[usize::from(s[i])],
                word,
                rules,
                &mut numbers,
            ) {
                Some((len, placeholder)) => {
                    out.extend_from_slice(&s[literal..i]);
                    out.extend_from_slice(placeholder.as_bytes());
                    i += len;
                    literal = i;
                }
                None => i = end,
            }
        }
        out.extend_from_slice(&s[literal..]);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn ids_mode_finds_a_uuid_from_a_later_group() {
        assert_eq!(
            ids("run abcdefab-cdef-4bcd-efab-cdefabcdefab ok"),
            "run <ID> ok"
        );
        assert_eq!(ids("abcdefab-cdef-abcd-efab-cdefabcdefa9"), "<ID>");
        assert_eq!(ids("x-abcdefab-cdef-4bcd-efab-cdefabcdefab"), "x-<ID>");
        assert_eq!(
            ids("xabcdefab-cdef-4bcd-efab-cdefabcdefab"),
            "xabcdefab-cdef-4bcd-efab-cdefabcdefab"
        );
    }

    fn json_ids(text: &str) -> String {
        let mut out = Vec::new();
        normalize_json_ids_into(text, &IdRules::default(), &mut out);
        String::from_utf8(out).unwrap()
    }

    #[test]
    fn json_mode_ends_words_at_escapes() {
        assert_eq!(
            json_ids(
                r#""boot ok\n2026-02-22T10:30:01Z worker 550e8400-e29b-41d4-a716-446655440000\tdeadbeef12""#
            ),
            r#""boot ok\n<TS> worker <ID>\t<ID>""#
        );
        // An escaped backslash before a letter is not an escape of that letter.
        assert_eq!(json_ids(r#""C:\\n2026-02-22""#), r#""C:\\n2026-02-22""#);
        assert_eq!(json_ids(r#""C:\\\n2026-02-22""#), r#""C:\\\n<TS>""#);
    }

    #[test]
    fn json_mode_finds_keys_spelled_long() {
        // A key is looked for up to 32 bytes back: separators make a volatile word longer
        // than itself, and it is still that word.
        assert_eq!(
            json_ids(r#"{"correlation___id___":"req-42"}"#),
            r#"{"correlation___id___":"<V>"}"#
        );
        let too_far = format!(r#"{{"{}pid":"req-42"}}"#, "_".repeat(40));
        assert_eq!(json_ids(&too_far), too_far);
    }

    #[test]
    fn json_mode_replaces_volatile_values() {
        assert_eq!(
            json_ids(r#"{"pid":4242,"port":3000}"#),
            r#"{"pid":<V>,"port":3000}"#
        );
        assert_eq!(
            json_ids(r#"{"a":"x","request_id":"req-42","took":"340 ms","path":"f3"}"#),
            r#"{"a":"x","request_id":"<V>","took":"<V>","path":"f3"}"#
        );
        assert_eq!(json_ids(r#"{"nonce":"k\"7\""}"#), r#"{"nonce":"<V>"}"#);
        // A digit far into the value, or a key that is not volatile: kept.
        let far = format!(r#"{{"trace_id":"{}7"}}"#, "x ".repeat(30));
        assert_eq!(json_ids(&far), far);
        assert_eq!(json_ids(r#"{"id":"req-42"}"#), r#"{"id":"req-42"}"#);
        assert_eq!(json_ids(r#"["pid","42"]"#), r#"["pid","42"]"#);
    }

    /// Text made of the characters the scanner cares about, so the properties below
    /// exercise timestamps, UUIDs, ids and whitespace and not just plain words.
    fn tricky_text() -> impl Strategy<Value = String> {
        let fragment = prop_oneof![
            "[0-9a-fA-FtTzZ:.,+_x -]{1,12}",
            Just("2024-01-15T10:30:00.5+02:00".to_owned()),
            Just("550e8400-e29b-41d4-a716-446655440000".to_owned()),
            "[ \t\r\n\u{a0}\u{3000}]{1,3}",
            "[a-zé—<>]{1,6}",
        ];
        prop::collection::vec(fragment, 0..12).prop_map(|parts| parts.concat())
    }

    fn replace_digits(text: &str, seed: &[u8]) -> String {
        text.chars()
            .enumerate()
            .map(|(k, c)| match c {
                '0'..='9' => char::from(b'0' + seed[k % seed.len()] % 10),
                _ => c,
            })
            .collect()
    }

    /// The first digit at or after `from`, found a byte at a time: the digit scans' oracle.
    fn next_digit_bytewise(bytes: &[u8], from: usize) -> Option<usize> {
        bytes
            .get(from..)
            .and_then(|rest| rest.iter().position(u8::is_ascii_digit))
            .map(|p| from + p)
    }

    proptest! {
        /// The sixteen-at-a-time digit scan finds the first digit where a byte scan
        /// does, from any start, on bytes dense with digits and their neighbours
        /// (`/` and `:`, and the same values with the high bit set).
        #[test]
        fn next_digit_finds_what_a_byte_scan_finds(
            bytes in prop::collection::vec(
                prop_oneof![
                    6 => prop::sample::select(b"a /:09\x2f\x3a\xb0\xb9\xaf\xba\x80\xff\x00 ".to_vec()),
                    1 => any::<u8>(),
                ],
                0..100,
            ),
            from in 0usize..101,
        ) {
            prop_assert_eq!(next_digit(&bytes, from), next_digit_bytewise(&bytes, from));
        }

        /// The same where digits are rare, as in a long result: runs of several
        /// sixty-four-byte blocks without one, a digit in any block and at any place
        /// in it (or none), the neighbours of digits all around.
        #[test]
        fn next_digit_finds_a_rare_digit_where_a_byte_scan_does(
            mut bytes in prop::collection::vec(
                prop::sample::select(b"a /:\x2f\x3a\xb0\xb9\xaf\xba\x80\xff\x00 ".to_vec()),
                0..400,
            ),
            digits in prop::collection::vec((0usize..400, b'0'..=b'9'), 0..3),
            from in 0usize..401,
        ) {
            for (at, digit) in digits {
                if let Some(b) = bytes.get_mut(at) {
                    *b = digit;
                }
            }
            prop_assert_eq!(next_digit(&bytes, from), next_digit_bytewise(&bytes, from));
        }

        #[test]
        fn normalization_is_idempotent(text in tricky_text()) {
            let once = normalize(&text);
            prop_assert_eq!(normalize(&once), once.clone());
            let once = normalize_hex_ids(&text);
            prop_assert_eq!(normalize_hex_ids(&once), once);
        }

        #[test]
        fn texts_differing_only_in_digits_normalize_alike(
            text in tricky_text(),
            seed in prop::collection::vec(any::<u8>(), 1..8),
        ) {
            let other = replace_digits(&text, &seed);
            prop_assert_eq!(normalize(&text), normalize(&other));
            prop_assert_eq!(normalize_hex_ids(&text), normalize_hex_ids(&other));
        }

        #[test]
        fn output_has_no_digits_and_no_loose_whitespace(text in tricky_text()) {
            let out = normalize(&text);
            prop_assert!(!out.bytes().any(|b| b.is_ascii_digit()));
            prop_assert!(!out.starts_with(' ') && !out.ends_with(' '));
            prop_assert!(!out.contains("  "));
            prop_assert!(!out.chars().any(|c| c.is_whitespace() && c != ' '));
        }

        #[test]
        fn ids_mode_agrees_with_the_plain_scan(text in tricky_text(), numbers in any::<bool>()) {
            let rules = IdRules { numbers, ..IdRules::default() };
            prop_assert_eq!(normalize_ids(&text, &rules), ids_reference(&text, &rules));
        }

        #[test]
        fn ids_mode_agrees_with_the_plain_scan_on_any_text(text in any::<String>()) {
            let rules = IdRules::default();
            prop_assert_eq!(normalize_ids(&text, &rules), ids_reference(&text, &rules));
        }

        #[test]
        fn json_mode_handles_any_json_text(value in "[ -~]{0,80}") {
            let text = serde_json::to_string(&serde_json::json!({"request_id": value.clone(), "v": [value]})).unwrap();
            let mut out = Vec::new();
            normalize_json_ids_into(&text, &IdRules::default(), &mut out);
            let once = String::from_utf8(out).unwrap();
            let mut again = Vec::new();
            normalize_json_ids_into(&once, &IdRules::default(), &mut again);
            prop_assert_eq!(String::from_utf8(again).unwrap(), once);
        }

        #[test]
        fn last_quote_is_rposition(bytes in prop::collection::vec(prop_oneof![Just(b'"'), Just(b'#'), Just(b'\x01'), Just(b'a'), any::<u8>()], 0..40)) {
            prop_assert_eq!(last_quote(&bytes), bytes.iter().rposition(|&b| b == b'"'));
        }

        #[test]
        fn ids_mode_is_idempotent_and_keeps_utf8(text in tricky_text()) {
            let once = ids(&text);
            prop_assert_eq!(ids(&once), once);
        }

        #[test]
        fn ids_mode_handles_any_text(text in any::<String>()) {
            let once = ids(&text);
            prop_assert_eq!(ids(&once), once);
        }

        #[test]
        fn any_text_normalizes_without_panicking(text in any::<String>()) {
            let out = normalize_hex_ids(&text);
            prop_assert_eq!(normalize_hex_ids(&out), out);
        }
    }

    // -----------------------------------------------------------------------------
    // Linear work on any input (finding 1 of the second hardening round: a CSV result
    // cost time quadratic in its length)
    // -----------------------------------------------------------------------------

    thread_local! {
        static READ: std::cell::Cell<usize> = const { std::cell::Cell::new(0) };
    }

    /// Counts bytes read by a helper that can read an unbounded stretch of the input
    /// (digit runs, words, backslash runs, a string to its end). Checks of a fixed
    /// size (a UUID, a timestamp's fields, a key within reach) are not counted.
    pub(super) fn count_read(n: usize) {
        READ.with(|r| r.set(r.get() + n));
    }

    fn reads_of(run: impl FnOnce()) -> usize {
        READ.with(|r| r.set(0));
        run();
        READ.with(std::cell::Cell::get)
    }

    /// At most this many counted reads per input byte.
    const READS_PER_BYTE: usize = 6;

    const ADVERSARIAL_UNITS: &[&str] = &[
        "1,",
        "1.",
        "12,345.6,",
        "1739870000,",
        "1739870000123.",
        "1-",
        "2024-01-",
        "2024-01-15,",
        "2024-01-15T10:30:00.",
        "a1b2c3d4-",
        "a1b2-",
        "a1",
        "a1b2c3d4e5 ",
        "pid 1 ",
        "pid=1,",
        "\\\\",
        "\\\"",
        "\"1\",",
        "\"pid\":\"1 ",
        "\\n1",
        "  ",
        "\n1\n",
        "\u{3000}\u{a0}",
        "550e8400-e29b-41d4-a716-44665544000",
    ];

    /// The shapes that once cost quadratic time (`1,1,1,…`, `1.2.3.…`, a chain of Unix
    /// times), and the worst case of each recognizer: chains of separators, dates and
    /// UUID groups that almost match, hex words, volatile words, backslash and quote
    /// runs, whitespace runs. A few units, repeated up to `max_times`, then some
    /// tricky text.
    fn adversarial_text(max_times: usize) -> impl Strategy<Value = String> {
        let unit = prop_oneof![
            prop::sample::select(ADVERSARIAL_UNITS).prop_map(str::to_owned),
            "[0-9a-fA-F,.:T -]{1,6}",
        ];
        (
            prop::collection::vec(unit, 1..4),
            1..max_times,
            tricky_text(),
        )
            .prop_map(|(units, times, tail)| {
                let mut text = units.concat().repeat(times);
                text.push_str(&tail);
                text
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        #[test]
        fn finding_1_every_mode_reads_each_byte_a_bounded_number_of_times(
            text in adversarial_text(4000),
            numbers in any::<bool>(),
        ) {
            let rules = IdRules { numbers, ..IdRules::default() };
            let json = serde_json::to_string(&text).unwrap();
            let bound = READS_PER_BYTE * json.len() + 64;
            let reads = [
                ("normalize", reads_of(|| { normalize(&text); })),
                ("normalize_hex_ids", reads_of(|| { normalize_hex_ids(&text); })),
                ("normalize_ids", reads_of(|| { normalize_ids(&text, &rules); })),
                ("json ids", reads_of(|| normalize_json_ids_into(&json, &rules, &mut Vec::new()))),
                ("json ids on raw text", reads_of(|| normalize_json_ids_into(&text, &rules, &mut Vec::new()))),
            ];
            for (mode, read) in reads {
                prop_assert!(read <= bound, "{mode}: {read} reads for {} bytes", text.len());
            }
        }

        #[test]
        fn finding_1_ids_mode_agrees_with_the_plain_scan_on_adversarial_shapes(
            text in adversarial_text(200),
            numbers in any::<bool>(),
        ) {
            let rules = IdRules { numbers, ..IdRules::default() };
            prop_assert_eq!(normalize_ids(&text, &rules), ids_reference(&text, &rules));
        }

        #[test]
        fn finding_1_adversarial_shapes_normalize_idempotently(text in adversarial_text(400)) {
            // (The per-call-id mode is not idempotent on every chain of numbers:
            // `1739870000,1739870000` gives `1739870000,<TS>`, then `<TS>,<TS>`.)
            let once = normalize_hex_ids(&text);
            prop_assert_eq!(normalize_hex_ids(&once), once);
            let once = normalize(&text);
            prop_assert_eq!(normalize(&once), once);
        }
    }

    #[test]
    fn finding_1_a_number_chain_is_measured_once_and_each_run_still_judged() {
        // Each run of a chain starts a word of its own and is judged from there, with
        // the number reaching to the chain's end: the last run can be a Unix time.
        assert_eq!(ids("1,2,1739870000"), "1,2,<TS>");
        assert_eq!(ids("1,1739870000,2"), "1,1739870000,2");
        assert_eq!(ids("pid=1,2"), "pid=<V>");
        let csv = "1,".repeat(10_000);
        let reads = reads_of(|| {
            normalize_ids(&csv, &IdRules::default());
        });
        assert!(reads <= READS_PER_BYTE * csv.len(), "{reads} reads");
    }
}
