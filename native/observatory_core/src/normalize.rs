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
    s.iter().take_while(|b| b.is_ascii_digit()).count()
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

    proptest! {
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
        fn any_text_normalizes_without_panicking(text in any::<String>()) {
            let out = normalize_hex_ids(&text);
            prop_assert_eq!(normalize_hex_ids(&out), out);
        }
    }
}
