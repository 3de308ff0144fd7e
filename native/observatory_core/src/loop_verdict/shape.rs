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
//!   where most or all of them (`{"progress": 40}`, then 60) is the answer moving;
//! * `opening`: a hash of its first line inside a value (not an object key) that holds
//!   a letter, without the status: an answer that opens with the same line whether the
//!   call failed or succeeded has something in front of every call.

use super::keys::{hash64, hash64_of_u64, hash64_stirred, stirred};

#[cfg(test)]
pub(crate) mod reference;

/// Bits in a line sketch.
pub const SKETCH_BITS: usize = 1024;
/// Runs of digits of a result put in its number sketch (the first ones).
pub const MAX_NUMBERS: u32 = 64;
/// Lines of a result looked at for its gist and sketch (the first ones).
pub const MAX_LINES: usize = 512;
/// Bytes of a result's opening line (digits masked) its `opening` hashes.
pub const OPENING_BYTES: usize = 128;

const LINE_SEED: u64 = 0x0801_f2e2_8a3c_1d55;
const GIST_SEED: u64 = 0xa409_3822_299f_31d0;
const SKELETON_SEED: u64 = 0x082e_fa98_ec4e_6c89;
const NUMBER_SEED: u64 = 0x4528_21e6_38d0_1377;
const OPENING_SEED: u64 = 0xbe54_66cf_34e9_0c6c;
const LINE_STIRRED: u64 = stirred(LINE_SEED);
const NUMBER_STIRRED: u64 = stirred(NUMBER_SEED);

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
    /// The hash of the first line of a string value that holds a letter (digits
    /// masked, its first [`OPENING_BYTES`] bytes), 0 if none: what an answer opens
    /// with, whatever its status.
    pub opening: u64,
}

/// JSON text `src` with runs of whitespace inside its strings (spaces and the `\n`,
/// `\r`, `\t` escapes) collapsed to one space and trimmed at both ends of each string,
/// appended to `out`. Text outside strings is copied as it is (canonical JSON has no
/// whitespace there).
pub fn collapse_whitespace(src: &[u8], out: &mut Vec<u8>) {
    let mut i = 0;
    while i < src.len() {
        // Outside a string: up to and with its opening quote.
        let Some(quote) = src[i..].iter().position(|&b| b == b'"') else {
            out.extend_from_slice(&src[i..]);
            return;
        };
        out.extend_from_slice(&src[i..=i + quote]);
        i += quote + 1;
        // Inside: words copied, whitespace runs become one space between words.
        let mut pending_space = false;
        let mut at_start = true;
        while i < src.len() && src[i] != b'"' {
            let (end, whitespace) = string_token(src, i);
            if whitespace {
                pending_space = true;
            } else {
                if pending_space && !at_start {
                    out.push(b' ');
                }
                pending_space = false;
                at_start = false;
                out.extend_from_slice(&src[i..end]);
            }
            i = end;
        }
        if i < src.len() {
            out.push(b'"');
            i += 1;
        }
    }
}

/// Where the token at `i` inside a JSON string ends, and whether it is whitespace: an
/// escape (`\n`, `\r`, `\t` are whitespace), a space, or a run of words with single
/// spaces between them (copied as they are: the common case, in one piece). (The
/// shape's reader takes the same tokens itself, its runs ending also before a digit.)
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

/// Where the run of words from `j` ends: at the first quote or backslash, or at a
/// space followed by one of those, by another space or by the end. Eight bytes at a
/// time: a large result is mostly long runs of words, and a byte-by-byte search was
/// most of its cost. (The shape's reader, whose runs also end before a digit, finds
/// them from its stop map.)
fn word_run(src: &[u8], j: usize) -> usize {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: SSE2 is part of every x86-64 target.
    let j = match unsafe { word_run_sse2(src, j) } {
        Ok(end) => return end,
        Err(rest) => rest,
    };
    word_run_words(src, j)
}

/// [`word_run`] sixteen bytes at a time; `Err` is where the bytes left (fewer than
/// 17) begin. Whether the byte after each stops a run is the same test on the load
/// one byte further on.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn word_run_sse2(src: &[u8], mut i: usize) -> Result<usize, usize> {
    use std::arch::x86_64::{
        __m128i, _mm_cmpeq_epi8, _mm_loadu_si128, _mm_movemask_epi8, _mm_or_si128, _mm_set1_epi8,
    };
    let (quote, backslash, space) = (
        _mm_set1_epi8(b'"' as i8),
        _mm_set1_epi8(b'\\' as i8),
        _mm_set1_epi8(b' ' as i8),
    );
    // A quote or a backslash.
    let hard = |v: __m128i| _mm_or_si128(_mm_cmpeq_epi8(v, quote), _mm_cmpeq_epi8(v, backslash));
    while i + 17 <= src.len() {
        // SAFETY: src[i..i + 17] is in the slice; loadu reads unaligned memory.
        let (here, next) = unsafe {
            (
                _mm_loadu_si128(src.as_ptr().add(i).cast()),
                _mm_loadu_si128(src.as_ptr().add(i + 1).cast()),
            )
        };
        let hard_here = _mm_movemask_epi8(hard(here)) as u32;
        let space_here = _mm_movemask_epi8(_mm_cmpeq_epi8(here, space)) as u32;
        let stops_next =
            _mm_movemask_epi8(_mm_or_si128(hard(next), _mm_cmpeq_epi8(next, space))) as u32;
        let found = hard_here | (space_here & stops_next);
        if found != 0 {
            return Ok(i + found.trailing_zeros() as usize);
        }
        i += 16;
    }
    Err(i)
}

/// [`word_run`] eight bytes at a time (its tail, and the whole on other targets).
fn word_run_words(src: &[u8], j: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    const LOW7: u64 = 0x7f7f_7f7f_7f7f_7f7f;
    // Exact per-byte tests, the high bit of each byte set where it holds (no borrow
    // crosses bytes, so a flag is never a false one).
    let below = |x: u64, n: u64| !(((x & LOW7) + ONES * (0x80 - n)) | x) & HIGH;
    let equal = |word: u64, b: u8| below(word ^ (ONES * u64::from(b)), 1);
    let hard = |word: u64| equal(word, b'"') | equal(word, b'\\');
    // Each eight bytes: where a hard stop is, and where a space is; a space ends the
    // run when the byte after it (the next eight's first, for the last) is either.
    let flags = |at: usize| {
        let word = u64::from_le_bytes(src[at..at + 8].try_into().expect("8 bytes"));
        (hard(word), equal(word, b' '))
    };
    let mut i = j;
    if i + 16 <= src.len() {
        let (mut hard_here, mut space_here) = flags(i);
        while i + 16 <= src.len() {
            let (hard_next, space_next) = flags(i + 8);
            let stops_after = ((hard_here | space_here) >> 8) | ((hard_next | space_next) << 56);
            let found = hard_here | (space_here & stops_after);
            if found != 0 {
                return i + (found.trailing_zeros() / 8) as usize;
            }
            (hard_here, space_here) = (hard_next, space_next);
            i += 8;
        }
    }
    word_run_bytewise(src, i, false)
}

/// [`word_run`] a byte at a time; with `digits`, a run also ends before a digit (as
/// the stop map's runs do).
fn word_run_bytewise(src: &[u8], mut j: usize, digits: bool) -> usize {
    let stop = |b: u8| matches!(b, b'"' | b' ' | b'\\') || (digits && b.is_ascii_digit());
    loop {
        while j < src.len() && !stop(src[j]) {
            j += 1;
        }
        // One space between two words stays inside the run.
        if j + 1 < src.len() && src[j] == b' ' && !stop(src[j + 1]) {
            j += 2;
            continue;
        }
        return j;
    }
}

/// Where [`word_run_bytewise`] (with digits) would stop, for every byte of a text at once: bit
/// `k % 64` of word `k / 64` is set when byte `k` is a quote, a backslash or a digit,
/// or a space followed by one of those, by a space or by the end. Built in one pass,
/// thirty-two bytes a load on a long text where the processor has AVX2 (sixteen
/// otherwise); a run's end is then the next set bit. Reading a 4 KiB result searched
/// each of its lines' bytes twice (every byte loaded for itself and for the one before
/// it), sixteen at a time, and paid the search's setup once a line.
fn stop_map(src: &[u8], stops: &mut Vec<u64>) {
    #[cfg(target_arch = "x86_64")]
    if src.len() >= AVX2_BYTES && std::is_x86_feature_detected!("avx2") {
        // SAFETY: the processor has AVX2.
        return unsafe { stop_map_avx2(src, stops) };
    }
    stop_map_with(src, stops, chunk_flags);
}

/// Texts shorter than this are flagged sixteen bytes a load: the wider loads pay only
/// over a long text.
const AVX2_BYTES: usize = 256;

/// [`stop_map`] thirty-two bytes a load.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn stop_map_avx2(src: &[u8], stops: &mut Vec<u64>) {
    stop_map_with(src, stops, |chunk| chunk_flags_avx2(chunk));
}

/// [`stop_map`] with a way to flag 64 bytes (the last ones padded): where they hold a
/// quote, a backslash or a digit, and where a space, one bit a byte.
#[inline(always)]
fn stop_map_with(src: &[u8], stops: &mut Vec<u64>, flags: impl Fn(&[u8]) -> (u64, u64)) {
    let words = src.len().div_ceil(64);
    stops.clear();
    stops.resize(words, 0);
    // The previous 64 bytes' stops and spaces: whether its last space stops a run
    // waits for this chunk's first byte.
    let (mut h, mut s) = (0u64, 0u64);
    for w in 0..words {
        let (hard, spaces) = match src.get(64 * w..64 * w + 64) {
            Some(chunk) => flags(chunk),
            None => {
                let mut tail = [0u8; 64];
                tail[..src.len() - 64 * w].copy_from_slice(&src[64 * w..]);
                flags(&tail)
            }
        };
        if w > 0 {
            stops[w - 1] = h | (s & ((h | s) >> 1 | ((hard | spaces) & 1) << 63));
        }
        (h, s) = (hard, spaces);
    }
    if words > 0 {
        // The end stops a space before it, as a stop byte would.
        let end = match src.len() % 64 {
            0 => 1 << 63,
            n => 1 << (n - 1),
        };
        stops[words - 1] = h | (s & ((h | s) >> 1 | end));
    }
}

/// Where the first 64 bytes of `chunk` hold a quote, a backslash or a digit, and where
/// a space, one bit a byte.
fn chunk_flags(chunk: &[u8]) -> (u64, u64) {
    #[cfg(target_arch = "x86_64")]
    {
        // SAFETY: SSE2 is part of every x86-64 target.
        unsafe { chunk_flags_sse2(chunk) }
    }
    #[cfg(not(target_arch = "x86_64"))]
    chunk_flags_bytewise(chunk)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "sse2")]
fn chunk_flags_sse2(chunk: &[u8]) -> (u64, u64) {
    use std::arch::x86_64::{
        _mm_cmpeq_epi8, _mm_loadu_si128, _mm_min_epu8, _mm_movemask_epi8, _mm_or_si128,
        _mm_set1_epi8, _mm_sub_epi8,
    };
    assert!(chunk.len() >= 64);
    let (mut hard, mut spaces) = (0u64, 0u64);
    for k in 0..4 {
        // SAFETY: chunk[16k..16k + 16] is in the slice; loadu reads unaligned memory.
        let v = unsafe { _mm_loadu_si128(chunk.as_ptr().add(16 * k).cast()) };
        // A digit: v - `0` at most 9, unsigned.
        let d = _mm_sub_epi8(v, _mm_set1_epi8(b'0' as i8));
        let found = _mm_or_si128(
            _mm_or_si128(
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8)),
                _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8)),
            ),
            _mm_cmpeq_epi8(_mm_min_epu8(d, _mm_set1_epi8(9)), d),
        );
        let space = _mm_cmpeq_epi8(v, _mm_set1_epi8(b' ' as i8));
        hard |= u64::from(_mm_movemask_epi8(found) as u16) << (16 * k);
        spaces |= u64::from(_mm_movemask_epi8(space) as u16) << (16 * k);
    }
    (hard, spaces)
}

/// [`chunk_flags`] thirty-two bytes a load, inlined into [`stop_map_avx2`]'s loop.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
fn chunk_flags_avx2(chunk: &[u8]) -> (u64, u64) {
    use std::arch::x86_64::{
        _mm256_cmpeq_epi8, _mm256_loadu_si256, _mm256_min_epu8, _mm256_movemask_epi8,
        _mm256_or_si256, _mm256_set1_epi8, _mm256_sub_epi8,
    };
    assert!(chunk.len() >= 64);
    let (mut hard, mut spaces) = (0u64, 0u64);
    for k in 0..2 {
        // SAFETY: chunk[32k..32k + 32] is in the slice; loadu reads unaligned memory.
        let v = unsafe { _mm256_loadu_si256(chunk.as_ptr().add(32 * k).cast()) };
        let d = _mm256_sub_epi8(v, _mm256_set1_epi8(b'0' as i8));
        let found = _mm256_or_si256(
            _mm256_or_si256(
                _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'"' as i8)),
                _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b'\\' as i8)),
            ),
            _mm256_cmpeq_epi8(_mm256_min_epu8(d, _mm256_set1_epi8(9)), d),
        );
        let space = _mm256_cmpeq_epi8(v, _mm256_set1_epi8(b' ' as i8));
        // The masks kept opaque: the compiler would otherwise take their bits apart
        // and put them back together a byte at a time, many times slower.
        let mask = |v| std::hint::black_box(u64::from(_mm256_movemask_epi8(v) as u32));
        hard |= mask(found) << (32 * k);
        spaces |= mask(space) << (32 * k);
    }
    (hard, spaces)
}

/// [`chunk_flags`] a byte at a time (other targets, and the tests' reference).
#[cfg_attr(target_arch = "x86_64", allow(dead_code))]
fn chunk_flags_bytewise(chunk: &[u8]) -> (u64, u64) {
    chunk[..64]
        .iter()
        .enumerate()
        .fold((0, 0), |(hard, space), (k, &b)| {
            let is_hard = matches!(b, b'"' | b'\\') || b.is_ascii_digit();
            (
                hard | u64::from(is_hard) << k,
                space | u64::from(b == b' ') << k,
            )
        })
}

/// The first stop at or after `j` in a [`stop_map`] of a text `len` bytes long, or
/// `len`: where [`word_run`] from `j` ends.
#[inline]
fn next_stop(stops: &[u64], j: usize, len: usize) -> usize {
    let mut word = j / 64;
    let Some(&first) = stops.get(word) else {
        return len;
    };
    let mut bits = first & (u64::MAX << (j % 64));
    while bits == 0 {
        word += 1;
        match stops.get(word) {
            Some(&next) => bits = next,
            None => return len,
        }
    }
    word * 64 + bits.trailing_zeros() as usize
}

/// Buffers [`shape`] reuses from step to step.
#[derive(Debug, Default)]
pub struct Scratch {
    masked: Vec<u8>,
    /// The text's [`stop_map`].
    stops: Vec<u64>,
    lines: Vec<u64>,
    /// The reader's open containers, `true` for an object: kept, so a step allocates
    /// nothing.
    objects: Vec<bool>,
}

impl Scratch {
    /// Bytes held, for giving back a buffer that grew for a huge step.
    pub fn capacity(&self) -> usize {
        self.masked.capacity()
            + (self.lines.capacity() + self.stops.capacity()) * 8
            + self.objects.capacity()
    }
}

/// Reads normalized canonical JSON text (see the module docs).
pub fn shape(status: &str, text: &[u8], scratch: &mut Scratch) -> Shape {
    stop_map(text, &mut scratch.stops);
    scratch.masked.clear();
    scratch.lines.clear();
    scratch.objects.clear();
    let mut reader = Reader {
        masked: &mut scratch.masked,
        lines: &mut scratch.lines,
        line_start: 0,
        pending_space: false,
        numbers: NumberSketch::default(),
        in_value: false,
        opening: 0,
    };
    let blank = reader.read(text, &scratch.stops, &mut scratch.objects);
    reader.end_line();
    let numbers = reader.numbers;
    let opening = reader.opening;
    let skeleton = hash64(&scratch.masked, hash64(status.as_bytes(), SKELETON_SEED));
    let hashes = &mut scratch.lines;
    // Each line's hash, now that the text is written (see `Reader::lines`).
    let mut start = 0;
    for h in hashes.iter_mut() {
        let end = *h as usize;
        *h = hash64_stirred(&scratch.masked[start..end], LINE_STIRRED);
        start = end + 1;
    }
    sort_few(hashes);
    hashes.dedup();
    let mut lines = LineSketch::default();
    let mut gist = hash64(status.as_bytes(), GIST_SEED);
    for &h in hashes.iter() {
        lines.insert(h);
        gist = hash64_of_u64(h, gist);
    }
    Shape {
        skeleton,
        gist,
        lines,
        numbers,
        blank,
        opening,
    }
}

/// Sorts `hashes`: by insertion when there are few (a short result's dozen lines, where
/// the library sort's setup costs more than the sort), by `sort_unstable` otherwise.
/// Either gives the same order.
fn sort_few(hashes: &mut [u64]) {
    if hashes.len() > 24 {
        hashes.sort_unstable();
        return;
    }
    for i in 1..hashes.len() {
        let h = hashes[i];
        let mut j = i;
        while j > 0 && hashes[j - 1] > h {
            hashes[j] = hashes[j - 1];
            j -= 1;
        }
        hashes[j] = h;
    }
}

/// Writes the masked text (digit runs as `#`, whitespace collapsed, a `\n` between
/// lines) and where each line ends.
struct Reader<'a> {
    masked: &'a mut Vec<u8>,
    /// Where each of the first [`MAX_LINES`] lines ends in `masked` (the next begins
    /// after its `\n`), for [`shape`] to hash them in one loop once the text is
    /// written: ~0.1 µs less on a 4 KiB result of 43 lines than a hash at each line's
    /// end, reading the bytes just copied.
    lines: &'a mut Vec<u64>,
    line_start: usize,
    pending_space: bool,
    numbers: NumberSketch,
    /// Inside a string that is not an object key.
    in_value: bool,
    /// The first line read inside a value that holds a letter, hashed; 0 until then.
    opening: u64,
}

impl Reader<'_> {
    /// Feeds the text; returns whether no string value holds anything but whitespace.
    fn read(&mut self, text: &[u8], stops: &[u64], objects: &mut Vec<bool>) -> bool {
        let mut blank = true;
        // Whether the next string is an object key: after `{` or `,` in an object.
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
                    // A string is a line of its own (its quotes are not content).
                    self.end_line();
                    let is_key = expect_key;
                    self.in_value = !is_key;
                    i += 1;
                    // The tokens of `string_token`, taken here, told apart by their
                    // first byte: a step's result is mostly lines of a few tokens each.
                    while let Some(&b) = text.get(i) {
                        let end = match b {
                            b'"' => break,
                            b'0'..=b'9' => {
                                blank &= is_key;
                                i = self.number(text, i);
                                continue;
                            }
                            b' ' => {
                                // All of a run of spaces (a code line's indent) at once.
                                self.pending_space = true;
                                i += 1;
                                while text.get(i) == Some(&b' ') {
                                    i += 1;
                                }
                                continue;
                            }
                            b'\\' => match text.get(i + 1) {
                                Some(b'n' | b'r') => {
                                    i = self.lines_of_text(text, i, stops, &mut blank, is_key);
                                    continue;
                                }
                                Some(b't') => {
                                    self.pending_space = true;
                                    i += 2;
                                    continue;
                                }
                                Some(b'u') => (i + 6).min(text.len()),
                                Some(_) => i + 2,
                                // A backslash that ends the text, alone.
                                None => i + 1,
                            },
                            // A run of words, to the text's next stop.
                            _ => {
                                let end = next_stop(stops, i + 1, text.len());
                                // A two-byte run whose second byte is `n` or `r` (`an`,
                                // `or` between stops) ends the line as `\n` does: how
                                // the keys were first defined, kept.
                                if end == i + 2 && matches!(text[i + 1], b'n' | b'r') {
                                    self.end_line();
                                    i = end;
                                    continue;
                                }
                                end
                            }
                        };
                        blank &= is_key;
                        self.content(&text[i..end]);
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

    /// From a `\\n` or `\\r` at `i`, inside a string: the lines of plain text that follow
    /// (an indent, then one run of words up to the next line break) read in one loop,
    /// without telling their tokens apart one by one. Returns where a token that is not
    /// of such a line begins, for the string's loop to go on from. An indent at a
    /// line's start needs no pending space: nothing is written before it on its line.
    #[inline]
    fn lines_of_text(
        &mut self,
        text: &[u8],
        mut i: usize,
        stops: &[u64],
        blank: &mut bool,
        is_key: bool,
    ) -> usize {
        // The line before the first break may be empty; each after it holds a run.
        self.end_line();
        loop {
            // text[i..i + 2] is `\\n` or `\\r`.
            i += 2;
            while text.get(i) == Some(&b' ') {
                i += 1;
            }
            let Some(&b) = text.get(i) else {
                return i;
            };
            if matches!(b, b'"' | b'\\') || b.is_ascii_digit() {
                return i;
            }
            let end = next_stop(stops, i + 1, text.len());
            if end == i + 2 && matches!(text[i + 1], b'n' | b'r') {
                // The two-byte run the string's loop reads as a line break.
                return i;
            }
            *blank &= is_key;
            self.masked.extend_from_slice(&text[i..end]);
            i = end;
            if text.get(i) != Some(&b'\\') || !matches!(text.get(i + 1), Some(b'n' | b'r')) {
                return i;
            }
            if self.opening == 0 {
                self.end_line();
            } else {
                // `end_line` of a line that holds a run, its opening already known.
                self.close_line();
            }
        }
    }

    /// The run of digits at `i`: `#` in the text, its value in the number sketch.
    /// Returns where it ends.
    fn number(&mut self, text: &[u8], i: usize) -> usize {
        let end = text[i..]
            .iter()
            .position(|b| !b.is_ascii_digit())
            .map_or(text.len(), |p| i + p);
        if self.numbers.count < MAX_NUMBERS {
            let position = self.numbers.count;
            self.numbers
                .insert(position, hash64_stirred(&text[i..end], NUMBER_STIRRED));
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
                // Its first bytes: an error line is short, and a long one-line result
                // costs no second pass over all of it.
                let line = &self.masked[self.line_start..];
                let line = &line[..line.len().min(OPENING_BYTES)];
                if line.iter().any(u8::is_ascii_alphabetic) {
                    self.opening = hash64(line, OPENING_SEED) | 1;
                }
            }
            self.close_line();
        }
        self.pending_space = false;
    }

    /// Ends the line being written, which holds something: its end recorded (up to
    /// [`MAX_LINES`]) and a line break written.
    #[inline]
    fn close_line(&mut self) {
        if self.lines.len() < MAX_LINES {
            self.lines.push(self.masked.len() as u64);
        }
        self.masked.push(b'\n');
        self.line_start = self.masked.len();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stable_json::stable_stringify;
    use proptest::prelude::*;
    use serde_json::{json, Value};

    proptest! {
        /// The eight-at-a-time run ends where the byte-by-byte one does, on any bytes
        /// (non-ASCII, quotes, backslashes, digits and single and double spaces dense
        /// among them), from any start.
        #[test]
        fn word_run_ends_where_a_byte_scan_ends(
            bytes in prop::collection::vec(
                prop_oneof![
                    6 => prop::sample::select(b"ab _\"\\09/:8\xff\x80\x2f\x3a\x1f\x7f\xb0\xa0 ".to_vec()),
                    1 => any::<u8>(),
                ],
                0..200,
            ),
            from in 0usize..201,
        ) {
            let from = from.min(bytes.len());
            prop_assert_eq!(word_run(&bytes, from), word_run_bytewise(&bytes, from, false));
        }

        /// A run ends at the stop map's next stop where the byte-by-byte run ends, on
        /// any bytes, from any start; the map's flags are the bytewise ones.
        #[test]
        fn the_stop_map_ends_runs_where_a_byte_scan_ends(
            bytes in prop::collection::vec(
                prop_oneof![
                    6 => prop::sample::select(b"ab _\"\\09/:8\xff\x80\x2f\x3a\x1f\x7f\xb0\xa0 ".to_vec()),
                    1 => any::<u8>(),
                ],
                0..300,
            ),
        ) {
            let mut stops = Vec::new();
            stop_map(&bytes, &mut stops);
            prop_assert_eq!(stops.len(), bytes.len().div_ceil(64));
            for from in 0..=bytes.len() {
                prop_assert_eq!(
                    next_stop(&stops, from, bytes.len()),
                    word_run_bytewise(&bytes, from, true),
                    "from {}", from
                );
            }
            // Each way of flagging bytes gives the same map, whichever this processor
            // takes.
            for way in [chunk_flags_bytewise, chunk_flags] {
                let mut other = Vec::new();
                stop_map_with(&bytes, &mut other, way);
                prop_assert_eq!(&other, &stops);
            }
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx2") {
                let mut other = Vec::new();
                // SAFETY: the processor has AVX2.
                unsafe { stop_map_avx2(&bytes, &mut other) };
                prop_assert_eq!(&other, &stops);
            }
        }

        /// Lines of text, as a code file or a log read back is, give the first reader's
        /// views: lines of one run after an indent (the loop that reads them at once)
        /// mixed with every other kind of line (empty, letterless before the first
        /// with a letter, numbered, two-letter runs read as breaks, escapes, a closing
        /// quote after an indent), in a string value or an object key.
        #[test]
        fn lines_of_text_read_as_the_first_reader_read_them(
            lines in prop::collection::vec(
                prop_oneof![
                    4 => (0usize..6, prop::sample::select(vec![
                        "def handle_call(x), do: y", "word", "---", "#", "an", "or", "a b",
                        "é ok", "x  y", "{:ok, 1}", "end", "-- --", ".",
                    ])).prop_map(|(indent, run)| format!("{}{run}", " ".repeat(indent))),
                    1 => prop::sample::select(vec![
                        "", " ", "   ", "12", "line 4", "\t x", "a\"b", "\\n", "  7 up",
                    ]).prop_map(String::from),
                ],
                0..40,
            ),
            breaks in prop::sample::select(vec!["\n", "\r", "\r\n", "\n\n"]),
            status in prop::sample::select(vec!["success", "failure"]),
            as_key in any::<bool>(),
        ) {
            let content = lines.join(breaks);
            let value = if as_key {
                json!({ content.clone(): 1, "z": content })
            } else {
                json!({"content": content, "lines": lines.len()})
            };
            let text = stable_stringify(&value);
            prop_assert_eq!(
                shape(status, text.as_bytes(), &mut Scratch::default()),
                reference::shape(status, text.as_bytes()),
                "{}", text
            );
        }

        /// The gist hashes the sorted lines in order: the short-list sort must give the
        /// library sort's order, on both sides of its switch-over and with repeats.
        #[test]
        fn sort_few_orders_as_the_library_sort(
            mut hashes in prop::collection::vec(
                prop_oneof![prop::sample::select(vec![0u64, 1, 7, u64::MAX, 1 << 63]), any::<u64>()],
                0..60,
            ),
        ) {
            let mut expected = hashes.clone();
            expected.sort_unstable();
            sort_few(&mut hashes);
            prop_assert_eq!(hashes, expected);
        }
    }

    fn shaped(status: &str, value: Value) -> Shape {
        shape(
            status,
            stable_stringify(&value).as_bytes(),
            &mut Scratch::default(),
        )
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
    fn the_opening_is_the_first_line_of_a_value_holding_a_letter_whatever_the_status() {
        let fenced = |status, rest: &str| {
            shaped(
                status,
                json!(format!("bash: line 3: BASH: command not found\n{rest}")),
            )
            .opening
        };
        let a = fenced("failure", "bash: line 3: FooBar.html: command not found");
        assert_ne!(a, 0);
        assert_eq!(a, fenced("success", "Python script 2"));
        // Digits masked: the line counter moves.
        assert_eq!(
            a,
            shaped("failure", json!("bash: line 4: BASH: command not found\n")).opening
        );
        // Object keys and lines without a letter are skipped.
        assert_eq!(
            a,
            shaped(
                "failure",
                json!({"exit_code": 1, "stdout": "--- 12 ---\nbash: line 3: BASH: command not found"})
            )
            .opening
        );
        assert_ne!(a, shaped("failure", json!("ls: cannot access 'x'")).opening);
        assert_eq!(shaped("success", json!({"ok": true})).opening, 0);
        assert_eq!(shaped("success", json!("")).opening, 0);
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
