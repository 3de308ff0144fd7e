//! Canonical JSON and the hashes built on it (seed 002 §5: `stableStringify`,
//! `computeHash`).
//!
//! Both loop-detection layers compare actions by hash, so two values that mean the same
//! thing must give the same bytes: `{"a":1,"b":2}` and `{"b":2,"a":1}` hash equal.
//!
//! The canonical form is compact JSON (no whitespace) where
//!
//! * object members are sorted by key, comparing the keys' UTF-8 bytes, which is
//!   Unicode code point order (JavaScript's default sort compares UTF-16 units instead;
//!   the two differ only when keys mix U+E000..=U+FFFF with supplementary-plane chars);
//! * arrays keep their order: order is meaning there;
//! * strings are escaped exactly as `serde_json` escapes them (`\"`, `\\`, `\b`, `\f`,
//!   `\n`, `\r`, `\t`, other control characters as `\u00xx`; everything else raw);
//! * a number that is an integer is written as an integer, whether it arrived as `1` or
//!   as `1.0`, so both hash equal. This is what the TypeScript original does, where
//!   every number is a double and `JSON.stringify(1.0)` is `"1"`. Precisely: a float
//!   with no fractional part in `-2^63..2^64` is written as that integer (`-0.0`
//!   becomes `0`); any other float is written in `serde_json`'s shortest round-trip
//!   form (`1.5`, `1e+20`, `-2.5e-8`). Integers beyond 64 bits only exist as floats in
//!   `serde_json` (without its `arbitrary_precision` feature, which this crate assumes).
//!   The crate turns on `serde_json`'s `float_roundtrip`, so canonical text parses
//!   back to the very same double: without it a float can come back one ULP off, and
//!   the hash of a re-read value would change.
//!
//! The walk is recursive, into one `String`; it clones nothing. With `serde_json`'s
//! default `BTreeMap` objects already iterate in key order, so sorting costs one
//! `is_sorted` pass; when some crate in the build turns on `preserve_order`, members
//! are sorted through a `Vec` of references per object.
//! Recursion goes as deep as the value nests: `serde_json`'s parser caps that at 128,
//! and code that builds values another way (from BEAM terms) should cap it too.

use serde_json::{Number, Value};
use sha2::{Digest as _, Sha256};

/// A SHA-256 digest.
pub type Digest = [u8; 32];

/// The canonical JSON text of `value` (see the module docs).
pub fn stable_stringify(value: &Value) -> String {
    let mut out = String::with_capacity(256);
    write_value(&mut out, value);
    out
}

/// [`stable_stringify`] into `out`, which is cleared first: a caller that keeps one
/// buffer between values writes into memory it has already.
pub fn stable_stringify_into(out: &mut String, value: &Value) {
    out.clear();
    write_value(out, value);
}

/// [`stable_stringify`] of an object with some members of its sections left out:
/// `skip` lists `(section, key)` pairs, e.g. `("meta", "timestamp")` drops
/// `value.meta.timestamp`. Everything else is written whole.
pub fn stable_stringify_without(value: &Value, skip: &[(&str, &str)]) -> String {
    let Value::Object(map) = value else {
        return stable_stringify(value);
    };
    let mut out = String::with_capacity(256);
    let mut members: Vec<_> = map.iter().collect();
    members.sort_unstable_by(|a, b| a.0.cmp(b.0));
    out.push('{');
    for (i, (key, member)) in members.into_iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(&mut out, key);
        out.push(':');
        let dropped = |name: &String| skip.iter().any(|&(s, k)| s == key && k == name);
        match member {
            Value::Object(section) if skip.iter().any(|&(s, _)| s == key) => {
                write_object(&mut out, section.iter().filter(|&(name, _)| !dropped(name)));
            }
            other => write_value(&mut out, other),
        }
    }
    out.push('}');
    out
}

/// SHA-256 of [`stable_stringify`]: equal for values that differ only in key order.
pub fn stable_hash(value: &Value) -> Digest {
    Sha256::digest(stable_stringify(value).as_bytes()).into()
}

/// SHA-256 over several byte strings, each preceded by its length as a little-endian
/// `u64`. The prefixes make the encoding unambiguous, so `("ab", "c")` and `("a", "bc")`
/// differ, which plain concatenation would not. Fields are fed to the hasher one by
/// one: nothing is concatenated in memory.
pub fn hash_parts(parts: &[&[u8]]) -> Digest {
    let mut hasher = Sha256::new();
    update_parts(&mut hasher, parts);
    hasher.finalize().into()
}

/// [`hash_parts`] with its first part given as `pieces` of `first_len` bytes in all:
/// the digest of their concatenation, without writing it out.
pub fn hash_parts_in_pieces<'p>(
    first_len: usize,
    pieces: impl Iterator<Item = &'p [u8]>,
    parts: &[&[u8]],
) -> Digest {
    let mut hasher = Sha256::new();
    hasher.update((first_len as u64).to_le_bytes());
    for piece in pieces {
        hasher.update(piece);
    }
    update_parts(&mut hasher, parts);
    hasher.finalize().into()
}

/// Feeds each part preceded by its length (see [`hash_parts`]).
fn update_parts(hasher: &mut Sha256, parts: &[&[u8]]) {
    for part in parts {
        hasher.update((part.len() as u64).to_le_bytes());
        hasher.update(part);
    }
}

/// Lowercase hexadecimal, two characters per byte: how digests appear in logs and events.
pub fn to_hex(bytes: &[u8]) -> String {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut out = String::with_capacity(bytes.len() * 2);
    for &byte in bytes {
        out.push(DIGITS[usize::from(byte >> 4)] as char);
        out.push(DIGITS[usize::from(byte & 0xf)] as char);
    }
    out
}

fn write_value(out: &mut String, value: &Value) {
    match value {
        Value::Null => out.push_str("null"),
        Value::Bool(true) => out.push_str("true"),
        Value::Bool(false) => out.push_str("false"),
        Value::Number(n) => write_number(out, n),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item);
            }
            out.push(']');
        }
        Value::Object(map) => write_object(out, map.iter()),
    }
}

/// Writes the members sorted by key. Keys within one object are unique, so an unstable
/// sort is still deterministic.
fn write_object<'a, I>(out: &mut String, members: I)
where
    I: Iterator<Item = (&'a String, &'a Value)> + Clone,
{
    out.push('{');
    if members.clone().map(|(key, _)| key).is_sorted() {
        write_members(out, members);
    } else {
        let mut sorted: Vec<_> = members.collect();
        sorted.sort_unstable_by(|a, b| a.0.cmp(b.0));
        write_members(out, sorted.into_iter());
    }
    out.push('}');
}

fn write_members<'a>(out: &mut String, members: impl Iterator<Item = (&'a String, &'a Value)>) {
    for (i, (key, value)) in members.enumerate() {
        if i > 0 {
            out.push(',');
        }
        write_string(out, key);
        out.push(':');
        write_value(out, value);
    }
}

/// Writes `n` canonically into any text sink (a `String`, or the reader's small buffer
/// when it checks a number's text).
pub(crate) fn write_number<W: std::fmt::Write>(out: &mut W, n: &Number) {
    const MIN_I64: f64 = -9_223_372_036_854_775_808.0; // -2^63
    const END_U64: f64 = 18_446_744_073_709_551_616.0; // 2^64
    match (n.as_u64(), n.as_i64(), n.as_f64()) {
        (Some(u), _, _) => write_integer(out, false, u),
        (_, Some(i), _) => write_integer(out, i < 0, i.unsigned_abs()),
        // Integral and in range, so the casts are exact; -0.0 takes the first branch.
        (_, _, Some(f)) if f.fract() == 0.0 && (MIN_I64..END_U64).contains(&f) => {
            if f >= 0.0 {
                write_integer(out, false, f as u64)
            } else {
                write_integer(out, true, (f as i64).unsigned_abs())
            }
        }
        _ => {
            // Into a `String`, `write!` cannot fail (a sink that can, says so itself).
            let _ = write!(out, "{n}");
        }
    }
}

/// Decimal digits without going through `fmt`, which costs more than the digits.
fn write_integer<W: std::fmt::Write>(out: &mut W, negative: bool, mut magnitude: u64) {
    let mut digits = [0u8; 20];
    let mut start = digits.len();
    loop {
        start -= 1;
        digits[start] = b'0' + (magnitude % 10) as u8;
        magnitude /= 10;
        if magnitude == 0 {
            break;
        }
    }
    if negative {
        let _ = out.write_char('-');
    }
    for &d in &digits[start..] {
        let _ = out.write_char(char::from(d));
    }
}

/// The escapes of `serde_json`: every byte that needs one is ASCII, so the runs between
/// them are whole UTF-8 sequences and can be copied as `str` slices.
pub(crate) fn write_string(out: &mut String, s: &str) {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.push('"');
    let mut run_start = 0;
    while let Some(i) = next_escape(bytes, run_start) {
        out.push_str(&s[run_start..i]);
        run_start = i + 1;
        out.push_str(match bytes[i] {
            b'"' => "\\\"",
            b'\\' => "\\\\",
            b'\n' => "\\n",
            b'\r' => "\\r",
            b'\t' => "\\t",
            0x08 => "\\b",
            0x0c => "\\f",
            byte => {
                out.push_str("\\u00");
                out.push(DIGITS[usize::from(byte >> 4)] as char);
                out.push(DIGITS[usize::from(byte & 0xf)] as char);
                continue;
            }
        });
    }
    out.push_str(&s[run_start..]);
    out.push('"');
}

/// The index of the first byte at or after `from` that needs an escape (below 0x20, `"`
/// or `\\`). Eight bytes at a time: most text has long runs without one, and a
/// byte-by-byte search was the biggest cost of canonical JSON for large results.
pub(crate) fn next_escape(bytes: &[u8], from: usize) -> Option<usize> {
    next_escape_or::<false>(bytes, from)
}

/// [`next_escape`], or the first non-ASCII byte if that comes first: a reader that
/// checks UTF-8 only where it is not ASCII finds both in one scan.
#[inline]
pub(crate) fn next_escape_or_non_ascii(bytes: &[u8], from: usize) -> Option<usize> {
    next_escape_or::<true>(bytes, from)
}

/// [`next_escape`], also stopping at a byte of 0x80 or more with `NON_ASCII`.
#[inline]
fn next_escape_or<const NON_ASCII: bool>(bytes: &[u8], from: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of every x86-64 target.
    let from = match unsafe { next_escape_sse2::<NON_ASCII>(bytes, from) } {
        Ok(found) => return Some(found),
        Err(rest) => rest,
    };
    next_escape_words::<NON_ASCII>(bytes, from)
}

/// [`next_escape`] sixteen bytes at a time: a large result's string is scanned twice
/// a step, once read and once hashed. `Err` is where the bytes left (fewer than 16)
/// begin.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn next_escape_sse2<const NON_ASCII: bool>(bytes: &[u8], mut i: usize) -> Result<usize, usize> {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8,
    };
    let (quote, backslash, control) = (
        _mm_set1_epi8(b'"' as i8),
        _mm_set1_epi8(b'\\' as i8),
        _mm_set1_epi8(0x1f),
    );
    while i + 16 <= bytes.len() {
        // SAFETY: bytes[i..i + 16] is in the slice; loadu reads unaligned memory.
        let v = unsafe { _mm_loadu_si128(bytes.as_ptr().add(i).cast()) };
        // Below 0x20 (unsigned): min(v, 0x1f) is v.
        let found = _mm_or_si128(
            _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash)),
            _mm_cmpeq_epi8(_mm_min_epu8(v, control), v),
        );
        let mut mask = _mm_movemask_epi8(found) as u32;
        if NON_ASCII {
            // The bytes' own high bits: 0x80 and above.
            mask |= _mm_movemask_epi8(v) as u32;
        }
        if mask != 0 {
            return Ok(i + mask.trailing_zeros() as usize);
        }
        i += 16;
    }
    Err(i)
}

/// [`next_escape`] eight bytes at a time (its tail, and the whole on other targets).
fn next_escape_words<const NON_ASCII: bool>(bytes: &[u8], from: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // A byte's high bit set where it is zero / below 0x20 (ASCII only: `!word` drops
    // bytes >= 0x80). A borrow can also flag bytes above a flagged one, never below:
    // the lowest flag is always a true one, and it is the one taken.
    let zero = |word: u64| word.wrapping_sub(ONES) & !word & HIGH;
    let flags = |word: u64| {
        (word.wrapping_sub(ONES * 0x20) & !word & HIGH)
            | zero(word ^ (ONES * u64::from(b'"')))
            | zero(word ^ (ONES * u64::from(b'\\')))
    };
    let mut i = from;
    while i + 8 <= bytes.len() {
        let word = u64::from_le_bytes(bytes[i..i + 8].try_into().expect("8 bytes"));
        let found = flags(word) | if NON_ASCII { word & HIGH } else { 0 };
        if found != 0 {
            return Some(i + (found.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    bytes[i..]
        .iter()
        .position(|&b| b < 0x20 || b == b'"' || b == b'\\' || (NON_ASCII && b >= 0x80))
        .map(|offset| i + offset)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::{json, Map};

    fn parse(text: &str) -> Value {
        serde_json::from_str(text).unwrap()
    }

    #[test]
    fn key_order_does_not_matter() {
        let a = parse(r#"{"a":1,"b":2}"#);
        let b = parse(r#"{"b":2,"a":1}"#);
        assert_eq!(stable_stringify(&a), r#"{"a":1,"b":2}"#);
        assert_eq!(stable_stringify(&a), stable_stringify(&b));
        assert_eq!(stable_hash(&a), stable_hash(&b));
    }

    #[test]
    fn nested_objects_and_arrays_of_objects_are_sorted_at_every_level() {
        let a = parse(r#"{"z":{"y":[{"b":1,"a":2},{"d":{"f":0,"e":1}}],"x":null},"a":true}"#);
        let b = parse(r#"{"a":true,"z":{"x":null,"y":[{"a":2,"b":1},{"d":{"e":1,"f":0}}]}}"#);
        assert_eq!(
            stable_stringify(&a),
            r#"{"a":true,"z":{"x":null,"y":[{"a":2,"b":1},{"d":{"e":1,"f":0}}]}}"#
        );
        assert_eq!(stable_hash(&a), stable_hash(&b));
    }

    #[test]
    fn unsorted_members_are_sorted_by_code_point() {
        // Map iteration is already sorted unless `preserve_order` is on somewhere in the
        // build, so drive the sorting branch directly.
        let (z, a, e, upper) = (
            "z".to_string(),
            "a".to_string(),
            "é".to_string(),
            "Z".to_string(),
        );
        let one = json!(1);
        let members = [(&z, &one), (&e, &one), (&a, &one), (&upper, &one)];
        let mut out = String::new();
        write_object(&mut out, members.iter().copied());
        assert_eq!(out, r#"{"Z":1,"a":1,"z":1,"é":1}"#);
    }

    #[test]
    fn arrays_keep_their_order() {
        assert_ne!(stable_hash(&json!([1, 2])), stable_hash(&json!([2, 1])));
        assert_eq!(stable_stringify(&json!([3, 1, 2])), "[3,1,2]");
    }

    #[test]
    fn scalars_and_empty_containers() {
        let value = json!({"n": null, "t": true, "f": false, "s": "", "a": [], "o": {}});
        assert_eq!(
            stable_stringify(&value),
            r#"{"a":[],"f":false,"n":null,"o":{},"s":"","t":true}"#
        );
    }

    #[test]
    fn strings_escape_like_serde_json() {
        let s = "q\" b\\ \u{8}\u{c}\n\r\t \u{0}\u{1f}\u{7f} é 日本 😀 </script>";
        let value = Value::String(s.to_string());
        assert_eq!(
            stable_stringify(&value),
            "\"q\\\" b\\\\ \\b\\f\\n\\r\\t \\u0000\\u001f\u{7f} é 日本 😀 </script>\""
        );
        assert_eq!(
            stable_stringify(&value),
            serde_json::to_string(&value).unwrap()
        );
    }

    #[test]
    fn keys_are_escaped_too() {
        let value = json!({"a\"b": 1, "\n": 2});
        assert_eq!(stable_stringify(&value), r#"{"\n":2,"a\"b":1}"#);
    }

    #[test]
    fn integral_floats_are_written_as_integers() {
        assert_eq!(stable_stringify(&parse("1.0")), "1");
        assert_eq!(stable_hash(&parse("1.0")), stable_hash(&parse("1")));
        assert_eq!(stable_stringify(&parse("-0.0")), "0");
        assert_eq!(stable_stringify(&parse("-3.0")), "-3");
        assert_eq!(stable_stringify(&parse("1e3")), "1000");
        // The ends of the range: -2^63 and the largest double below 2^64.
        let two_63 = 2f64.powi(63);
        let two_64 = 2f64.powi(64);
        assert_eq!(stable_stringify(&json!(-two_63)), i64::MIN.to_string());
        assert_eq!(
            stable_stringify(&json!(two_64.next_down())),
            "18446744073709549568"
        );
        // Just outside it, the float form.
        assert_eq!(stable_stringify(&json!(two_64)), "1.8446744073709552e+19");
        assert_eq!(
            stable_stringify(&json!((-two_63).next_down())),
            "-9.223372036854778e+18"
        );
    }

    #[test]
    fn other_numbers_keep_serde_json_form() {
        assert_eq!(stable_stringify(&json!(u64::MAX)), "18446744073709551615");
        assert_eq!(stable_stringify(&json!(i64::MIN)), "-9223372036854775808");
        assert_eq!(stable_stringify(&json!(1.5)), "1.5");
        assert_eq!(stable_stringify(&json!(-0.1)), "-0.1");
        assert_eq!(stable_stringify(&json!(1e20)), "1e+20");
        assert_eq!(stable_stringify(&json!(-2.5e-8)), "-2.5e-8");
        assert_ne!(stable_hash(&json!(1.5)), stable_hash(&json!(1)));
        // Beyond 64 bits an integer literal is a float already.
        assert_eq!(stable_stringify(&parse("100000000000000000000")), "1e+20");
    }

    #[test]
    fn hash_is_sha256_of_the_canonical_text() {
        assert_eq!(
            to_hex(&stable_hash(&json!({}))),
            // printf '{}' | sha256sum
            "44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a"
        );
    }

    #[test]
    fn hash_parts_length_prefixes_separate_fields() {
        assert_ne!(hash_parts(&[b"ab", b"c"]), hash_parts(&[b"a", b"bc"]));
        assert_ne!(hash_parts(&[]), hash_parts(&[b""]));
        assert_ne!(hash_parts(&[b"", b"a"]), hash_parts(&[b"a", b""]));
        assert_eq!(hash_parts(&[b"x", b"y"]), hash_parts(&[b"x", b"y"]));
    }

    #[test]
    fn a_first_part_hashed_in_pieces_is_the_part_hashed_whole() {
        let pieces: [&[u8]; 3] = [b"{\"a\":", b"", b"1}"];
        let whole = hash_parts(&[b"{\"a\":1}", b"x", b""]);
        assert_eq!(
            hash_parts_in_pieces(7, pieces.into_iter(), &[b"x", b""]),
            whole
        );
        assert_ne!(
            hash_parts_in_pieces(6, pieces.into_iter(), &[b"x", b""]),
            whole
        );
    }

    #[test]
    fn hex_is_lowercase_two_digits_per_byte() {
        assert_eq!(to_hex(&[0x00, 0x0f, 0xa0, 0xff]), "000fa0ff");
        assert_eq!(to_hex(&[]), "");
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            any::<u64>().prop_map(Value::from),
            any::<f64>().prop_filter_map("finite", |f| Number::from_f64(f).map(Value::Number)),
            (-1000i32..1000).prop_map(|i| Value::from(f64::from(i))),
            any::<String>().prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 64, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::vec((any::<String>(), inner), 0..6)
                    .prop_map(|members| Value::Object(members.into_iter().collect())),
            ]
        })
    }

    /// Equality with numbers compared by value, since `1.0` comes back as `1`.
    fn same(a: &Value, b: &Value) -> bool {
        match (a, b) {
            (Value::Number(x), Value::Number(y)) => match (x.as_i64(), y.as_i64()) {
                (Some(i), Some(j)) => i == j,
                _ => match (x.as_u64(), y.as_u64()) {
                    (Some(i), Some(j)) => i == j,
                    _ => x.as_f64() == y.as_f64(),
                },
            },
            (Value::Array(x), Value::Array(y)) => {
                x.len() == y.len() && x.iter().zip(y).all(|(a, b)| same(a, b))
            }
            (Value::Object(x), Value::Object(y)) => {
                x.len() == y.len() && x.iter().all(|(k, v)| y.get(k).is_some_and(|w| same(v, w)))
            }
            _ => a == b,
        }
    }

    /// Rebuilds every object with members in reverse key order.
    fn reversed(value: &Value) -> Value {
        match value {
            Value::Array(items) => Value::Array(items.iter().map(reversed).collect()),
            Value::Object(map) => {
                let mut members: Vec<_> = map.iter().collect();
                members.sort_by(|a, b| b.0.cmp(a.0));
                let map: Map<String, Value> = members
                    .into_iter()
                    .map(|(k, v)| (k.clone(), reversed(v)))
                    .collect();
                Value::Object(map)
            }
            other => other.clone(),
        }
    }

    proptest! {
        #[test]
        fn output_parses_back_to_an_equal_value(value in arb_json()) {
            let text = stable_stringify(&value);
            let back: Value = serde_json::from_str(&text).unwrap();
            prop_assert!(same(&value, &back), "{value} -> {text} -> {back}");
            // Canonical text is a fixed point.
            prop_assert_eq!(stable_stringify(&back), text);
        }

        #[test]
        fn member_order_never_changes_the_hash(value in arb_json()) {
            prop_assert_eq!(stable_hash(&reversed(&value)), stable_hash(&value));
        }

        #[test]
        fn shuffled_members_give_the_same_text(
            members in prop::collection::btree_map(any::<String>(), arb_json(), 0..8)
                .prop_map(|m| m.into_iter().collect::<Vec<_>>())
                .prop_shuffle()
        ) {
            let mut shuffled = String::new();
            write_object(&mut shuffled, members.iter().map(|(k, v)| (k, v)));
            let map: Map<String, Value> = members.into_iter().collect();
            prop_assert_eq!(shuffled, stable_stringify(&Value::Object(map)));
        }

        #[test]
        fn strings_match_serde_json_exactly(s in any::<String>()) {
            let value = Value::String(s);
            prop_assert_eq!(stable_stringify(&value), serde_json::to_string(&value).unwrap());
        }

        #[test]
        fn escape_dense_strings_match_serde_json(
            chars in prop::collection::vec(
                prop::sample::select(vec!['a', ' ', '"', '\\', '\n', '\u{1}', '\u{1f}', '\u{20}', '\u{7f}', 'é', '日', '😀']),
                0..80,
            )
        ) {
            // Every escape at every offset of the eight-byte words next_escape reads.
            let value = Value::String(chars.into_iter().collect());
            prop_assert_eq!(stable_stringify(&value), serde_json::to_string(&value).unwrap());
        }

        /// The vector scan finds the first byte to escape where a byte scan does, from
        /// any start, on bytes dense with the ones it looks for and their neighbours.
        #[test]
        fn next_escape_finds_what_a_byte_scan_finds(
            bytes in prop::collection::vec(
                prop_oneof![
                    6 => prop::sample::select(b"a \"\\\n\x1f\x20\x00\x7f\x80\xff\x9f\xa2\xdc!#".to_vec()),
                    1 => any::<u8>(),
                ],
                0..100,
            ),
            from in 0usize..101,
        ) {
            let from = from.min(bytes.len());
            let expected = bytes[from..]
                .iter()
                .position(|&b| b < 0x20 || b == b'"' || b == b'\\')
                .map(|p| from + p);
            prop_assert_eq!(next_escape(&bytes, from), expected);
            let expected = bytes[from..]
                .iter()
                .position(|&b| b < 0x20 || b == b'"' || b == b'\\' || b >= 0x80)
                .map(|p| from + p);
            prop_assert_eq!(next_escape_or_non_ascii(&bytes, from), expected);
        }

        #[test]
        fn integers_match_serde_json(i in any::<i64>(), u in any::<u64>()) {
            for value in [Value::from(i), Value::from(u)] {
                prop_assert_eq!(stable_stringify(&value), serde_json::to_string(&value).unwrap());
            }
        }

        #[test]
        fn non_integral_floats_match_serde_json(f in any::<f64>()) {
            prop_assume!(f.is_finite() && f.fract() != 0.0);
            let value = Value::from(f);
            prop_assert_eq!(stable_stringify(&value), serde_json::to_string(&value).unwrap());
        }
    }
}
