//! A step's JSON read in one pass of our own, into the same borrowed tree serde_json's
//! parser gives ([`Json::read`](super::Json::read)), noting on the way whether
//! `action.tool_input` and `action.result` are already written canonically in the body
//! (compact, keys sorted and unique, strings escaped as the canonical writer escapes them,
//! numbers plain integers): a step sent as `Observatory.JSON` or most SDKs write it is,
//! and then its canonical text is that slice of the body, hashed where it lies instead
//! of written again.
//!
//! It reads only what it is sure of and gives up (`None`) on anything else — a syntax
//! error, invalid UTF-8, a `\u` escape of a surrogate, nesting past 100 levels,
//! serde_json's raw-value token: the caller then reads the text with serde_json, which
//! gives the answer and the error message. A number that is not a plain integer is
//! handed to serde_json's own number parser, so its value is serde_json's. So the
//! documents it accepts and the trees it builds are serde_json's (the property tests
//! in `decision_log::tests` compare the two on generated texts).

use std::borrow::Cow;

use super::borrowed::{Json, Object, RAW_VALUE_TOKEN};
use serde_json::Number;

use crate::stable_json::{next_escape_or_non_ascii, write_number};

/// Containers nested deeper than this are left to serde_json (which refuses past 127).
const MAX_DEPTH: u32 = 100;

/// The canonical text of `action.tool_input` and of `action.result` where the body
/// holds it as it is (`None`: written some other way, or absent), and of the rest of
/// the envelope that the body fingerprint hashes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct CanonicalText<'a> {
    pub tool_input: Option<&'a str>,
    pub result: Option<&'a str>,
    /// Where the whole body, but for the members the fingerprint leaves out, is written
    /// canonically: the body and the spans of those members (with a comma each).
    pub rest: Option<RestText<'a>>,
}

/// Members of the envelope's sections that its body fingerprint leaves out
/// ([`fingerprint_of`](super::fingerprint_of)), as (section, key).
pub const LEFT_OUT: [(&str, &str); 4] = [
    ("meta", "timestamp"),
    ("cognition", "entropy_score"),
    ("action", "tool_input"),
    ("action", "result"),
];

/// Spans of a body cut out at most (one per [`LEFT_OUT`] member: a repeated one makes
/// the body not canonical anyway).
const MAX_CUTS: usize = LEFT_OUT.len();

/// The canonical text of an envelope without its [`LEFT_OUT`] members, as spans of the
/// body: the body with `cuts` (in order, apart) taken out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RestText<'a> {
    body: &'a str,
    cuts: [(usize, usize); MAX_CUTS],
    count: usize,
}

impl<'a> RestText<'a> {
    /// The pieces of the body that are left, in order.
    pub fn pieces(&self) -> impl Iterator<Item = &'a str> + '_ {
        let body = self.body;
        let cuts = &self.cuts[..self.count];
        let starts = std::iter::once(0).chain(cuts.iter().map(|&(_, end)| end));
        let ends = cuts
            .iter()
            .map(|&(start, _)| start)
            .chain(std::iter::once(body.len()));
        starts.zip(ends).map(move |(start, end)| &body[start..end])
    }

    /// Whether the cuts are apart, in order and inside the body, on character
    /// boundaries (as a canonical body's are): then [`pieces`](Self::pieces) cannot
    /// slice out of bounds.
    fn in_order(&self) -> bool {
        let mut end = 0;
        self.cuts[..self.count].iter().all(|&(start, stop)| {
            let fits = end <= start
                && start <= stop
                && self.body.is_char_boundary(start)
                && self.body.is_char_boundary(stop);
            end = stop;
            fits
        })
    }

    /// Bytes in all the pieces.
    pub(crate) fn len(&self) -> usize {
        let cut: usize = self.cuts[..self.count].iter().map(|(s, e)| e - s).sum();
        self.body.len() - cut
    }
}

/// What [`read`] builds of `action.tool_input` and `action.result`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Parts {
    /// Their trees, as serde_json's parser builds them.
    Built,
    /// Where the body holds one's canonical text, [`Json::Canonical`] of that text
    /// instead of its tree (its syntax checked all the same): what the gateway reads
    /// when it only hashes them.
    CanonicalText,
}

/// Where a value sits: the envelope, one of its sections, below them, or inside a part
/// read for its canonical text only (nothing built).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Place {
    Root,
    Meta,
    Cognition,
    Action,
    Other,
    Skimmed,
}

impl Place {
    /// Whether the member `key` of an object here is one the fingerprint leaves out.
    fn left_out(self, key: &str) -> bool {
        let section = match self {
            Place::Meta => "meta",
            Place::Cognition => "cognition",
            Place::Action => "action",
            _ => return false,
        };
        LEFT_OUT.iter().any(|&(s, k)| s == section && k == key)
    }
}

/// Reads `bytes` as one JSON document, or `None` when serde_json must decide.
pub fn read(bytes: &[u8], parts: Parts) -> Option<(Json<'_>, CanonicalText<'_>)> {
    let mut reader = Reader {
        bytes,
        at: 0,
        canonical: CanonicalText::default(),
        parts,
        plain: true,
        cuts: [(0, 0); MAX_CUTS],
        cut_count: 0,
        unkept: false,
    };
    reader.whitespace();
    let mut json = Json::Null;
    reader.value(0, Place::Root, &mut json)?;
    reader.whitespace();
    if reader.at != bytes.len() {
        return None;
    }
    let mut canonical = reader.canonical;
    if reader.plain && reader.cut_count <= MAX_CUTS && matches!(json, Json::Object(_)) {
        let rest = RestText {
            // The whole body has been read.
            body: reader.str(0, bytes.len()),
            cuts: reader.cuts,
            count: reader.cut_count,
        };
        canonical.rest = rest.in_order().then_some(rest);
    }
    Some((json, canonical))
}

/// The first quote, backslash or control character at or after `from`, every
/// non-ASCII byte before it checked as UTF-8 on the way (`None`: it is not, or the
/// text ends first). ASCII bytes are never part of a longer UTF-8 sequence, so each
/// run of non-ASCII bytes is checked on its own: the body is not read once more, up
/// front, to check all of it.
#[inline]
fn next_escape_checked(bytes: &[u8], from: usize) -> Option<usize> {
    let mut i = from;
    loop {
        i = next_escape_or_non_ascii(bytes, i)?;
        if bytes[i].is_ascii() {
            return Some(i);
        }
        let end = bytes[i..]
            .iter()
            .position(u8::is_ascii)
            .map_or(bytes.len(), |n| i + n);
        std::str::from_utf8(&bytes[i..end]).ok()?;
        i = end;
    }
}

struct Reader<'a> {
    /// The body. Only strings hold bytes past ASCII, checked as UTF-8 as they are read
    /// ([`next_escape_checked`]); anywhere else such a byte ends the reading. So the
    /// text read so far is UTF-8 ([`Reader::str`]).
    bytes: &'a [u8],
    at: usize,
    canonical: CanonicalText<'a>,
    parts: Parts,
    /// Cleared by anything read that is not written canonically: whitespace between
    /// tokens, keys out of order, other escapes, other numbers. (A flag, not a second
    /// value returned with each: that costs more than the reading.) The values of the
    /// [`LEFT_OUT`] members do not count for the envelope's.
    plain: bool,
    /// The [`LEFT_OUT`] members' spans, each with the comma that joins it to another
    /// member; `cut_count` past [`MAX_CUTS`] means too many to say.
    cuts: [(usize, usize); MAX_CUTS],
    cut_count: usize,
    /// Inside a left-out member that is not a part (`timestamp`, `entropy_score`): its
    /// text is neither kept nor hashed, so a float's is not checked.
    unkept: bool,
}

impl<'a> Reader<'a> {
    /// Skips JSON whitespace (not canonical between tokens).
    #[inline]
    fn whitespace(&mut self) {
        let start = self.at;
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.bytes.get(self.at) {
            self.at += 1;
        }
        self.plain &= self.at == start;
    }

    /// `bytes[start..end]`, text the reader has read, as a `str`.
    #[inline]
    fn str(&self, start: usize, end: usize) -> &'a str {
        let read = &self.bytes[start..end];
        debug_assert!(std::str::from_utf8(read).is_ok(), "read text is UTF-8");
        // SAFETY: the reader asks only for text it has read, and every byte of that is
        // ASCII or part of a string's non-ASCII run that `next_escape_checked` checked
        // as UTF-8 (see `Reader::bytes`); a slice of UTF-8 between ASCII bytes or at its
        // ends is UTF-8.
        unsafe { std::str::from_utf8_unchecked(read) }
    }

    #[inline]
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.at).copied()
    }

    /// The value at `at`, written into `slot` (clearing `plain` if its text is not its
    /// canonical text). Written where it is kept — an object's member, an array's item
    /// — not returned and moved there: a value returned is stored in pieces and read
    /// back whole at once, which stalls the store buffer, and that was most of the
    /// cost of building a step's tree.
    fn value(&mut self, depth: u32, place: Place, slot: &mut Json<'a>) -> Option<()> {
        *slot = match self.peek()? {
            b'{' => return self.object(depth + 1, place, slot),
            b'[' => return self.array(depth + 1, place, slot),
            b'"' => Json::String(self.string(place != Place::Skimmed)?),
            b't' => self.literal("true", Json::Bool(true))?,
            b'f' => self.literal("false", Json::Bool(false))?,
            b'n' => self.literal("null", Json::Null)?,
            b'-' | b'0'..=b'9' => self.number()?,
            _ => return None,
        };
        Some(())
    }

    fn literal(&mut self, word: &str, json: Json<'a>) -> Option<Json<'a>> {
        let end = self.at + word.len();
        (self.bytes.get(self.at..end)? == word.as_bytes()).then(|| {
            self.at = end;
            json
        })
    }

    fn object(&mut self, depth: u32, place: Place, slot: &mut Json<'a>) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        let build = place != Place::Skimmed;
        self.at += 1;
        self.whitespace();
        // An envelope's objects have a handful of members: room for them at once.
        let mut members: Vec<(Cow<'a, str>, Json<'a>)> =
            Vec::with_capacity(if build { 8 } else { 0 });
        if self.peek()? == b'}' {
            self.at += 1;
            *slot = Json::Object(Object::from_members(members));
            return Some(());
        }
        // The previous key, when members are not kept.
        let mut last_key: Option<Cow<'a, str>> = None;
        // Whether a member the fingerprint keeps came before (in a section).
        let mut kept_before = false;
        loop {
            if self.peek()? != b'"' {
                return None;
            }
            let key_start = self.at;
            let key = self.string(true)?;
            // Sorted, each key once: the canonical order.
            let last = if build {
                members.last().map(|(k, _)| k)
            } else {
                last_key.as_ref()
            };
            let in_order = match last {
                None if key == RAW_VALUE_TOKEN => return None,
                None => true,
                Some(last) => before(last.as_bytes(), key.as_bytes()),
            };
            self.plain &= in_order;
            self.whitespace();
            if self.peek()? != b':' {
                return None;
            }
            self.at += 1;
            self.whitespace();
            let child = match place {
                Place::Root if key == "action" => {
                    // The last `action` is the one the tree keeps.
                    self.canonical = CanonicalText::default();
                    Place::Action
                }
                Place::Root if key == "meta" => Place::Meta,
                Place::Root if key == "cognition" => Place::Cognition,
                Place::Skimmed => Place::Skimmed,
                _ => Place::Other,
            };
            let left_out = place.left_out(&key);
            let plain_before = self.plain;
            let part = place == Place::Action && matches!(&*key, "tool_input" | "result");
            let tool_input = part && key == "tool_input";
            self.unkept = left_out && !part;
            // The member's value is read into its place in the object.
            let mut unbuilt = Json::Null;
            let value = if build {
                members.push((key, Json::Null));
                let last = members.len() - 1;
                &mut members[last].1
            } else {
                last_key = Some(key);
                &mut unbuilt
            };
            if part {
                let text = self.part(depth, value)?;
                if tool_input {
                    self.canonical.tool_input = text;
                } else {
                    self.canonical.result = text;
                }
            } else {
                self.value(depth, child, value)?;
            }
            // A left-out member's value is cut from the rest's text: how it is written
            // does not count. The comma before it goes with it, or if no kept member
            // came before, the comma after it.
            let cut_start = if left_out {
                self.plain = plain_before;
                self.unkept = false;
                if kept_before {
                    key_start - 1
                } else {
                    key_start
                }
            } else {
                kept_before = true;
                0
            };
            let mut cut_end = self.at;
            self.whitespace();
            let end = match self.peek()? {
                b',' => {
                    self.at += 1;
                    if !kept_before {
                        cut_end = self.at;
                    }
                    self.whitespace();
                    false
                }
                b'}' => {
                    self.at += 1;
                    true
                }
                _ => return None,
            };
            if left_out {
                if let Some(cut) = self.cuts.get_mut(self.cut_count) {
                    *cut = (cut_start, cut_end);
                }
                self.cut_count += 1;
            }
            if end {
                *slot = Json::Object(Object::from_members(members));
                return Some(());
            }
        }
    }

    /// `action.tool_input` or `action.result`, and its canonical text if the body
    /// holds it. With [`Parts::CanonicalText`], an object, array or string whose text is
    /// canonical is read without building it, else (or with [`Parts::Built`]) it is
    /// built.
    fn part(&mut self, depth: u32, slot: &mut Json<'a>) -> Option<Option<&'a str>> {
        let (start, plain) = (self.at, self.plain);
        self.plain = true;
        let skim = self.parts == Parts::CanonicalText && matches!(self.peek()?, b'{' | b'[' | b'"');
        let place = if skim { Place::Skimmed } else { Place::Other };
        self.value(depth, place, slot)?;
        let text = self.plain.then(|| self.str(start, self.at));
        match text {
            Some(text) if skim => *slot = Json::Canonical(text),
            None if skim => {
                // Not canonical: its text will be written from its tree.
                self.at = start;
                self.value(depth, Place::Other, slot)?;
            }
            _ => {}
        }
        self.plain &= plain;
        Some(text)
    }

    fn array(&mut self, depth: u32, place: Place, slot: &mut Json<'a>) -> Option<()> {
        if depth > MAX_DEPTH {
            return None;
        }
        let build = place != Place::Skimmed;
        let child = if build { Place::Other } else { Place::Skimmed };
        self.at += 1;
        self.whitespace();
        let mut items = Vec::with_capacity(if build { 4 } else { 0 });
        if self.peek()? == b']' {
            self.at += 1;
            *slot = Json::Array(items);
            return Some(());
        }
        let mut unbuilt = Json::Null;
        loop {
            let item = if build {
                items.push(Json::Null);
                let last = items.len() - 1;
                &mut items[last]
            } else {
                &mut unbuilt
            };
            self.value(depth, child, item)?;
            self.whitespace();
            match self.peek()? {
                b',' => {
                    self.at += 1;
                    self.whitespace();
                }
                b']' => {
                    self.at += 1;
                    *slot = Json::Array(items);
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// The string whose opening quote is at `at`: borrowed when it has no escapes;
    /// canonical when every escape is one `stable_json::write_string` writes for the
    /// same character (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`).
    /// Without `build`, an escaped string is checked but not decoded (an empty one
    /// stands for it).
    fn string(&mut self, build: bool) -> Option<Cow<'a, str>> {
        let bytes = self.bytes;
        let start = self.at + 1;
        // Where a string only checked is read byte-wise from (all before it checked).
        let from = match skim_string(bytes, start, build) {
            Ok(end) => {
                self.at = end + 1;
                // Not built: an empty string stands for it, as below.
                return Some(Cow::Borrowed(""));
            }
            Err(from) => from,
        };
        // The first quote, backslash or control character.
        let mut i = next_escape_checked(bytes, from)?;
        if bytes[i] == b'"' {
            self.at = i + 1;
            return Some(Cow::Borrowed(self.str(start, i)));
        }
        let mut out = String::with_capacity(if build { i - start + 64 } else { 0 });
        let mut canonical = true;
        let mut run = from;
        loop {
            if build {
                out.push_str(self.str(run, i));
            }
            match bytes[i] {
                b'"' => {
                    self.at = i + 1;
                    self.plain &= canonical;
                    return Some(Cow::Owned(out));
                }
                b'\\' => {
                    let (c, len) = match *bytes.get(i + 1)? {
                        b'"' => ('"', 2),
                        b'\\' => ('\\', 2),
                        b'b' => ('\u{8}', 2),
                        b'f' => ('\u{c}', 2),
                        b'n' => ('\n', 2),
                        b'r' => ('\r', 2),
                        b't' => ('\t', 2),
                        b'/' => {
                            canonical = false;
                            ('/', 2)
                        }
                        b'u' => {
                            canonical = false;
                            // A surrogate (a pair or a lone one) is serde_json's to read.
                            (char::from_u32(hex4(bytes.get(i + 2..i + 6)?)?)?, 6)
                        }
                        _ => return None,
                    };
                    if build {
                        out.push(c);
                    }
                    run = i + len;
                    i = next_escape_checked(bytes, run)?;
                }
                // A control character: not allowed in a JSON string.
                _ => return None,
            }
        }
    }

    /// A number: a plain integer that fits 64 bits read here, any other handed to
    /// serde_json's own number parser (the same value it gives in a document); only the
    /// plain non-negative integer is written canonically as it stands.
    fn number(&mut self) -> Option<Json<'a>> {
        let bytes = self.bytes;
        let start = self.at;
        let digits_from = |mut i: usize| {
            while bytes.get(i).is_some_and(u8::is_ascii_digit) {
                i += 1;
            }
            i
        };
        let negative = bytes[start] == b'-';
        let int_start = start + usize::from(negative);
        let mut i = digits_from(int_start);
        let digits = i - int_start;
        if digits == 0 || (bytes[int_start] == b'0' && digits > 1) {
            return None;
        }
        let mut plain = !negative;
        if bytes.get(i) == Some(&b'.') {
            plain = false;
            let end = digits_from(i + 1);
            if end == i + 1 {
                return None;
            }
            i = end;
        }
        if let Some(b'e' | b'E') = bytes.get(i) {
            plain = false;
            i += 1;
            if let Some(b'+' | b'-') = bytes.get(i) {
                i += 1;
            }
            let end = digits_from(i);
            if end == i {
                return None;
            }
            i = end;
        }
        self.at = i;
        if plain {
            let n = bytes[start..i].iter().try_fold(0u64, |n, &d| {
                n.checked_mul(10)?.checked_add(u64::from(d - b'0'))
            });
            if let Some(n) = n {
                return Some(Json::Number(n.into()));
            }
        }
        let text = self.str(start, i);
        let number: Number = serde_json::from_str(text).ok()?;
        if self.unkept {
            self.plain = false;
        } else if self.plain {
            self.plain = written_as_it_stands(text, &number);
        }
        Some(Json::Number(number))
    }
}

/// Whether the canonical writer writes `number`, read from `text`, as `text` (`0.5`,
/// `-3`; not `1.0`, `1e2` or `0.50`).
pub(super) fn written_as_it_stands(text: &str, number: &Number) -> bool {
    if short_decimal(text.as_bytes()) {
        return true;
    }
    let mut written = NumberText::default();
    write_number(&mut written, number);
    written.as_bytes() == Some(text.as_bytes())
}

/// A decimal the writer writes as it stands, told without writing it (a float's
/// shortest form costs more than the rest of its reading): an optional `-`, `0` or up
/// to six digits without a leading zero, a point, one to eight digits not ending in
/// `0`, and at most two zeros after the point when the integer part is `0`. Its value
/// is between 0.001 and 10^6, in plain notation, and its at most 14 significant
/// digits are the shortest that read back as the same float (two decimals of at most
/// 15 digits never read as one float), so they are what the writer writes.
/// `written_as_it_stands` tests check it against the writer.
pub(super) fn short_decimal(text: &[u8]) -> bool {
    let unsigned = text.strip_prefix(b"-").unwrap_or(text);
    let Some(point) = unsigned.iter().position(|&b| b == b'.') else {
        return false;
    };
    let (int, fraction) = (&unsigned[..point], &unsigned[point + 1..]);
    let digits = |d: &[u8]| d.iter().all(u8::is_ascii_digit);
    let zero = int == b"0";
    (1..=6).contains(&int.len())
        && (1..=8).contains(&fraction.len())
        && digits(int)
        && digits(fraction)
        && (zero || int[0] != b'0')
        && fraction.last() != Some(&b'0')
        && (!zero || fraction.iter().take_while(|&&d| d == b'0').count() <= 2)
}

/// A number's text written on the stack; `None` past its room (no number the writer
/// writes needs it: 20 digits and a sign, or a float's shortest form).
#[derive(Default)]
struct NumberText {
    bytes: [u8; 32],
    len: usize,
    overflowed: bool,
}

impl NumberText {
    fn as_bytes(&self) -> Option<&[u8]> {
        (!self.overflowed).then(|| &self.bytes[..self.len])
    }
}

impl std::fmt::Write for NumberText {
    fn write_str(&mut self, s: &str) -> std::fmt::Result {
        let end = self.len + s.len();
        let Some(room) = self.bytes.get_mut(self.len..end) else {
            self.overflowed = true;
            return Err(std::fmt::Error);
        };
        room.copy_from_slice(s.as_bytes());
        self.len = end;
        Ok(())
    }
}

/// Whether key `a` sorts before key `b` (by bytes, as `str`'s order): a loop, where
/// a short key's comparison through `memcmp` costs more than the compare.
fn before(a: &[u8], b: &[u8]) -> bool {
    for (x, y) in a.iter().zip(b) {
        if x != y {
            return x < y;
        }
    }
    a.len() < b.len()
}

/// Four hex digits (either case), as serde_json reads them; a surrogate is `None`.
fn hex4(digits: &[u8]) -> Option<u32> {
    let code = digits.iter().try_fold(0u32, |code, &d| {
        Some(code * 16 + char::from(d).to_digit(16)?)
    })?;
    (!(0xD800..0xE000).contains(&code)).then_some(code)
}

/// [`skim_string_avx512`] where the processor has AVX-512BW and the string is not to be
/// built; else `Err(start)`: all of it is read byte-wise.
#[inline]
fn skim_string(bytes: &[u8], start: usize, build: bool) -> Result<usize, usize> {
    #[cfg(target_arch = "x86_64")]
    if !build && bytes.len() >= start + 64 && std::is_x86_feature_detected!("avx512bw") {
        // SAFETY: the processor has AVX-512BW.
        return unsafe { skim_string_avx512(bytes, start) };
    }
    let _ = (bytes, build);
    Err(start)
}

/// The end of a string skimmed (checked, not built) from `start` (after its opening
/// quote), sixty-four bytes a load with every escape in them handled at once, where
/// the processor has AVX-512BW: `Ok` is its closing quote, when every escape before it
/// is one the canonical writer writes (`\"`, `\\`, `\b`, `\f`, `\n`, `\r`, `\t`) and
/// every byte ASCII and not a control character; `Err` is where a byte-wise reading
/// must go on (at a byte that is not that, the backslash of an escape that is not, or
/// the last bytes, fewer than 64), all before it checked so. A 4 KiB result is one
/// string of ~40 lines: searched from escape to escape, each `\n` cost a search's end
/// and restart.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512bw")]
fn skim_string_avx512(bytes: &[u8], start: usize) -> Result<usize, usize> {
    use std::arch::x86_64::{
        _mm512_cmpeq_epi8_mask, _mm512_cmplt_epu8_mask, _mm512_loadu_si512, _mm512_movepi8_mask,
        _mm512_set1_epi8,
    };
    let byte = |b: u8| _mm512_set1_epi8(b as i8);
    let mut i = start;
    // Whether the byte at `i` is escaped (the last block ended with an odd run of
    // backslashes).
    let mut carry = 0u64;
    while i + 64 <= bytes.len() {
        // SAFETY: bytes[i..i + 64] is in the slice; loadu reads unaligned memory.
        let v = unsafe { _mm512_loadu_si512(bytes.as_ptr().add(i).cast()) };
        let backslashes = _mm512_cmpeq_epi8_mask(v, byte(b'\\'));
        let (escaped, carry_out) = escaped_bytes(backslashes, carry);
        let quotes = _mm512_cmpeq_epi8_mask(v, byte(b'"'));
        let letters = quotes
            | backslashes
            | _mm512_cmpeq_epi8_mask(v, byte(b'n'))
            | _mm512_cmpeq_epi8_mask(v, byte(b't'))
            | _mm512_cmpeq_epi8_mask(v, byte(b'r'))
            | _mm512_cmpeq_epi8_mask(v, byte(b'b'))
            | _mm512_cmpeq_epi8_mask(v, byte(b'f'));
        let stop = (quotes & !escaped)
            | (escaped & !letters)
            | _mm512_cmplt_epu8_mask(v, byte(0x20))
            | _mm512_movepi8_mask(v);
        if stop != 0 {
            let at = stop.trailing_zeros() as usize;
            return match () {
                _ if quotes & !escaped & (1 << at) != 0 => Ok(i + at),
                // An escaped byte: its backslash is the one before it.
                _ if escaped & (1 << at) != 0 => Err(i + at - 1),
                _ => Err(i + at),
            };
        }
        carry = carry_out;
        i += 64;
    }
    Err(i - carry as usize)
}

/// Of 64 bytes, those escaped: after an odd run of backslashes (`backslashes` one bit
/// a byte; `carry` set when the first is escaped by the bytes before), and the first if
/// `carry` (a backslash escaped inside a run is not flagged: it is a valid escape's
/// letter). With whether the next 64 bytes' first is escaped. (simdjson's odd-backslash-sequence arithmetic: no
/// loop over the backslashes.)
#[inline(always)]
#[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
fn escaped_bytes(backslashes: u64, carry: u64) -> (u64, u64) {
    const EVEN: u64 = 0x5555_5555_5555_5555;
    // A backslash escaped by the bytes before is a plain one.
    let bs = backslashes & !carry;
    let starts = bs & !(bs << 1);
    // Adding a run's first bit carries past its last: the bit after the run is set.
    let after_even_starts = bs.wrapping_add(starts & EVEN) & !bs;
    let (after_odd_starts, overflow) = bs.overflowing_add(starts & !EVEN);
    // An odd run: it starts on an even bit and the bit after it is odd, or the other way.
    let escaped = (after_even_starts & !EVEN) | (after_odd_starts & !bs & EVEN) | carry;
    // A run from an odd bit to the last is odd: the next block's first byte is escaped.
    (escaped, u64::from(overflow))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rest<'a>(body: &'a str, cuts: &[(usize, usize)]) -> RestText<'a> {
        let mut rest = RestText {
            body,
            cuts: [(0, 0); MAX_CUTS],
            count: cuts.len(),
        };
        rest.cuts[..cuts.len()].copy_from_slice(cuts);
        rest
    }

    /// The guard that keeps `pieces` from slicing out of bounds in the NIF: a canonical
    /// body's cuts always pass it, so only cuts made by hand can show it refuses.
    #[test]
    fn cuts_out_of_order_outside_the_body_or_inside_a_character_are_refused() {
        let body = "{\"a\":1,\"é\":2}";
        assert!(rest(body, &[]).in_order());
        assert!(rest(body, &[(1, 7), (7, 7)]).in_order());
        assert!(rest(body, &[(0, body.len())]).in_order());
        for cuts in [
            &[(7, 9), (1, 7)][..],
            &[(1, 8), (7, 9)],
            &[(5, 3)],
            &[(1, body.len() + 1)],
            &[(9, 10)],
        ] {
            assert!(!rest(body, cuts).in_order(), "{cuts:?}");
        }
    }

    /// Escaped bytes found a byte at a time: each after an odd run of backslashes.
    fn escaped_bytewise(bytes: &[u8]) -> Vec<bool> {
        let mut escaped = vec![false; bytes.len()];
        let mut k = 0;
        while k < bytes.len() {
            if bytes[k] == b'\\' && k + 1 < bytes.len() {
                escaped[k + 1] = true;
                k += 2;
            } else {
                k += 1;
            }
        }
        escaped
    }

    /// The string at `start` read a byte at a time as `Reader::string` reads one it does
    /// not build: its closing quote when all before it is ASCII, no control character,
    /// and every escape one the canonical writer writes; else `None`.
    fn skimmed_bytewise(bytes: &[u8], start: usize) -> Option<usize> {
        let mut k = start;
        loop {
            match *bytes.get(k)? {
                b'"' => return Some(k),
                b'\\' => match *bytes.get(k + 1)? {
                    b'"' | b'\\' | b'b' | b'f' | b'n' | b'r' | b't' => k += 2,
                    _ => return None,
                },
                b if !(0x20..0x80).contains(&b) => return None,
                _ => k += 1,
            }
        }
    }

    use proptest::prelude::*;

    /// Bytes dense in backslashes, quotes and escape letters, with some a reading must
    /// stop at (control, non-ASCII, `/`, `u`).
    fn string_bytes(len: usize) -> impl Strategy<Value = Vec<u8>> {
        prop::collection::vec(
            prop_oneof![
                // Sparse or dense: runs of plain bytes, so blocks pass whole too.
                60 => prop::sample::select(b"ax ".to_vec()),
                8 => prop::sample::select(b"\\\\\\\\\\\"nrtbfa x".to_vec()),
                1 => prop::sample::select(b"/u\x01\x1f\x7f\xc3\xa9".to_vec()),
                1 => any::<u8>(),
            ],
            0..len,
        )
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2000))]

        /// The block-wise escapes are the byte-wise ones, across 64-byte blocks.
        #[test]
        fn escaped_bytes_are_those_after_an_odd_run_of_backslashes(
            bytes in string_bytes(300),
        ) {
            let expected = escaped_bytewise(&bytes);
            let mut carry = 0;
            for (b, block) in bytes.chunks(64).enumerate() {
                let backslashes = block
                    .iter()
                    .enumerate()
                    .fold(0u64, |m, (k, &c)| m | u64::from(c == b'\\') << k);
                let (escaped, out) = escaped_bytes(backslashes, carry);
                // A backslash escaped inside a run is not flagged (it needs no check):
                // only the byte after a run, and a block's first.
                for k in (0..block.len()).filter(|&k| k == 0 || block[k] != b'\\') {
                    prop_assert_eq!(escaped >> k & 1 == 1, expected[64 * b + k], "byte {}", 64 * b + k);
                }
                carry = out;
            }
        }

        /// The skim ends where a byte-wise reading ends, or hands it a place to go on
        /// from that it reaches with all before checked.
        #[test]
        fn a_skim_ends_where_a_bytewise_reading_does(
            bytes in string_bytes(400),
            start in 0usize..80,
        ) {
            assert_skim_is_bytewise(&bytes, start)?;
        }

        /// The same where a run of backslashes ends a block of 64, or one or two
        /// bytes before: its escape goes on into the next block.
        #[test]
        fn a_skim_reads_escapes_across_its_blocks(
            blocks in 1usize..3,
            before in 0usize..3,
            run in 1usize..5,
            tail in string_bytes(100),
        ) {
            let mut bytes = vec![b'a'; 64 * blocks - before - run];
            bytes.extend(std::iter::repeat_n(b'\\', run));
            bytes.extend(tail);
            assert_skim_is_bytewise(&bytes, 0)?;
        }

        /// A string of plain ASCII and the escapes the canonical writer writes is
        /// skimmed to its closing quote, leaving nothing to read byte-wise, when that
        /// quote lies in a whole block of 64; a string to be built is not skimmed.
        #[test]
        fn a_canonical_string_is_skimmed_to_its_closing_quote(
            pieces in prop::collection::vec(
                prop_oneof![
                    8 => prop::sample::select(b"az AZ09 {}[]:,./'".to_vec()).prop_map(|c| vec![c]),
                    1 => prop::sample::select(
                        vec![&b"\\n"[..], b"\\t", b"\\r", b"\\b", b"\\f", b"\\\"", b"\\\\"],
                    ).prop_map(<[u8]>::to_vec),
                ],
                0..300,
            ),
        ) {
            let mut bytes = vec![b'"'];
            bytes.extend(pieces.concat());
            let quote = bytes.len();
            bytes.push(b'"');
            bytes.extend([b' '; 64]);
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx512bw") {
                prop_assert_eq!(skim_string(&bytes, 1, false), Ok(quote));
            }
            prop_assert_eq!(skim_string(&bytes, 1, true), Err(1));
        }
    }

    /// A skim from `start` ends where a byte-wise reading ends, or hands it a place to
    /// go on from that it reaches with all before checked (where the processor has
    /// AVX-512BW; elsewhere there is no skim).
    #[cfg_attr(not(target_arch = "x86_64"), allow(unused_variables))]
    fn assert_skim_is_bytewise(bytes: &[u8], start: usize) -> Result<(), TestCaseError> {
        #[cfg(target_arch = "x86_64")]
        if std::is_x86_feature_detected!("avx512bw") && start <= bytes.len() {
            // SAFETY: the processor has AVX-512BW.
            let skim = unsafe { skim_string_avx512(bytes, start) };
            let expected = skimmed_bytewise(bytes, start);
            match skim {
                Ok(end) => prop_assert_eq!(Some(end), expected),
                Err(from) => {
                    prop_assert!(from >= start && from <= bytes.len());
                    // Not the letter of an escape: a reading from here reads as one from
                    // the start.
                    let escaped = escaped_bytewise(&bytes[start..]);
                    prop_assert!(!escaped.get(from - start).copied().unwrap_or(false));
                    if let Some(end) = expected {
                        prop_assert!(from <= end);
                    }
                    prop_assert_eq!(skimmed_bytewise(bytes, from), expected);
                }
            }
        }
        Ok(())
    }
}
