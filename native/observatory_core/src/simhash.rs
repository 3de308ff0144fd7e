//! 64-bit SimHash (seed 003, "SimHash Algorithm"): texts that share most of their
//! features get fingerprints a few bits apart, unrelated texts about 32 bits apart.
//!
//! Features are the words of the text and the pairs of adjacent words (2-shingles),
//! each with weight 1. Words alone would let two unrelated prompts look alike through
//! the common words they share ("the", "please", `<NUM>`); the pairs are what differs
//! between them, and they double the number of features, which evens out the vote on
//! each bit. A word is a run of ASCII letters, digits, `_` or non-ASCII bytes, so JSON
//! and code split into their names and values, and `<NUM>` counts as the word `NUM`.
//! Scripts written without spaces (Chinese, Japanese) give few long words: such texts
//! match when equal after normalization, but a small edit moves them far.
//!
//! Each feature is hashed with FNV-1a 64 followed by the murmur3 finalizer — fixed
//! constants, so a fingerprint is the same across runs, machines and releases (a
//! golden value below pins it). FNV-1a alone mixes its low bits poorly, and SimHash
//! needs every bit of a feature hash to be a fair coin.

use crate::normalize::normalize;

/// The fingerprint the kill switch compares: [`simhash`] of the [`normalize`]d text.
pub fn fingerprint(text: &str) -> u64 {
    simhash(&normalize(text))
}

/// Number of differing bits.
pub fn hamming(a: u64, b: u64) -> u32 {
    (a ^ b).count_ones()
}

/// SimHash of `text` as given (no normalization). The empty text, and any text with no
/// word, hashes to 0.
pub fn simhash(text: &str) -> u64 {
    let mut votes = BitVotes::new();
    let mut previous: Option<u64> = None;
    for word in text.as_bytes().split(|&b| !is_word_byte(b)) {
        if word.is_empty() {
            continue;
        }
        let word = fnv1a(word);
        votes.add(mix(word));
        if let Some(previous) = previous {
            votes.add(mix(previous.rotate_left(32) ^ word ^ PAIR_SEED));
        }
        previous = Some(word);
    }
    votes.majority()
}

/// The stable 64-bit hash used for every feature, also for tool-call signatures.
pub fn hash_bytes(bytes: &[u8]) -> u64 {
    mix(fnv1a(bytes))
}

/// Keeps a word pair's hash apart from the hash of any single word.
const PAIR_SEED: u64 = 0x9E37_79B9_7F4A_7C15;

fn is_word_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_' || b >= 0x80
}

fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
    })
}

/// murmur3's `fmix64`: every input bit flips each output bit with probability ~1/2.
fn mix(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^ (h >> 33)
}

/// Per-bit counts of ones over all features, kept bit-sliced: `planes[j]` holds bit
/// `j` of 64 small counters, one per hash bit, so adding a feature to all 64 counters
/// is one ripple-carry over eight words. After 255 features (the most eight bits can
/// count) the small counters are emptied into `ones`.
struct BitVotes {
    planes: [u64; 8],
    in_planes: u32,
    ones: [u64; 64],
    features: u64,
}

impl BitVotes {
    fn new() -> Self {
        Self {
            planes: [0; 8],
            in_planes: 0,
            ones: [0; 64],
            features: 0,
        }
    }

    fn add(&mut self, feature: u64) {
        let mut carry = feature;
        for plane in &mut self.planes {
            let next = *plane & carry;
            *plane ^= carry;
            carry = next;
        }
        self.in_planes += 1;
        self.features += 1;
        if self.in_planes == 255 {
            self.flush();
        }
    }

    fn flush(&mut self) {
        for (j, plane) in self.planes.iter_mut().enumerate() {
            for (bit, ones) in self.ones.iter_mut().enumerate() {
                *ones += (*plane >> bit & 1) << j;
            }
            *plane = 0;
        }
        self.in_planes = 0;
    }

    /// Bit `i` is set when more than half of the features have it set.
    fn majority(mut self) -> u64 {
        self.flush();
        self.ones
            .iter()
            .enumerate()
            .filter(|(_, &ones)| 2 * ones > self.features)
            .fold(0, |acc, (i, _)| acc | 1 << i)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Prompts a looping agent sends, each with variants that differ only in numbers,
    /// timestamps and ids.
    const LOOPING: [[&str; 3]; 5] = [
        [
            "Check the status of order #12345 placed on 2024-01-15T10:30:00Z and tell me whether it has shipped.",
            "Check the status of order #98765 placed on 2024-03-02T08:05:59.123+02:00 and tell me whether it has shipped.",
            "Check the status of order #7 placed on 2025-12-31T23:59:59Z and tell me whether it has shipped.",
        ],
        [
            "The tool returned {\"items\": 25, \"page\": 1, \"request_id\": \"550e8400-e29b-41d4-a716-446655440000\"}. Fetch the next page.",
            "The tool returned {\"items\": 25, \"page\": 2, \"request_id\": \"6fa459ea-ee8a-3ca4-894e-db77e160355e\"}. Fetch the next page.",
            "The tool returned {\"items\": 3, \"page\": 117, \"request_id\": \"16FD2706-8BAF-433B-82EB-8C7FADA847DA\"}. Fetch the next page.",
        ],
        [
            "Attempt 3 of 5 failed with HTTP 503 at 2024-06-01T12:00:00Z. Retry the deployment of build 4821 to cluster eu-west-1.",
            "Attempt 4 of 5 failed with HTTP 502 at 2024-06-01T12:00:30Z. Retry the deployment of build 4822 to cluster eu-west-2.",
            "Attempt 11 of 50 failed with HTTP 500 at 2024-06-01T12:07:45.5Z. Retry the deployment of build 90210 to cluster eu-west-3.",
        ],
        [
            "Balance is 1,024.50 USD. Transfer 100.00 to account 4455 and report the new balance.",
            "Balance is 924.50 USD. Transfer 100.00 to account 4455 and report the new balance.",
            "Balance is 3.14 USD. Transfer 0.99 to account 1 and report the new balance.",
        ],
        [
            "ls",
            "ls",
            "ls",
        ],
    ];

    /// Unrelated prompts of very different lengths.
    const DIFFERENT: [&str; 12] = [
        "What's the weather in Paris today?",
        "Translate 'good morning' into Japanese.",
        "ls",
        "Summarize this article about renewable energy in three bullet points for a busy executive.",
        "Write a Python function that parses a CSV file and returns the rows as a list of dictionaries keyed by the header.",
        "Check the status of order #12345 placed on 2024-01-15T10:30:00Z and tell me whether it has shipped.",
        "You are a careful code reviewer. Read the diff below and list every bug you find, with the line number and a one-sentence explanation. Do not comment on style. If you find nothing, answer 'LGTM'.",
        "Draft a polite email to the landlord explaining that the kitchen sink has been leaking since Monday and asking when a plumber can come by.",
        "Explain the difference between a mutex and a read-write lock, and when each one is the better choice in a web server that mostly serves cached pages.",
        "The tool returned {\"items\": 25, \"page\": 1}. Fetch the next page.",
        "Plan a three-day hiking trip in the Dolomites for two beginners in late September, including huts to sleep in, daily distances, elevation gain and what to pack. Keep the budget under 600 euros and avoid via ferratas.",
        "SELECT name, email FROM users WHERE created_at > '2024-01-01' ORDER BY created_at DESC LIMIT 50; -- why is this query slow on a table with 40 million rows and an index on email only?",
    ];

    #[test]
    fn similar_texts_produce_similar_hashes() {
        for variants in LOOPING {
            let first = fingerprint(variants[0]);
            for other in &variants[1..] {
                let distance = hamming(first, fingerprint(other));
                assert!(
                    distance < 3,
                    "{distance} bits between {:?} and {other:?}",
                    variants[0]
                );
                assert_eq!(distance, 0, "identical after normalization");
            }
        }
    }

    #[test]
    fn a_long_prompt_with_other_numbers_and_times_hashes_alike() {
        let prompt = |seed: u64| {
            (0..80)
                .map(|k| {
                    format!(
                        "[2024-05-{:02}T{:02}:{:02}:07.{}Z] worker {} processed batch {} in {}.{} s\n",
                        1 + (seed + k) % 28,
                        (seed * 7 + k) % 24,
                        (seed * 13 + k) % 60,
                        seed * 31 + k,
                        seed % 9,
                        seed * 1000 + k,
                        k % 5,
                        seed % 100,
                    )
                })
                .collect::<String>()
                + "Find the slowest worker in the log above."
        };
        assert!(prompt(1).len() > 4_000);
        assert_eq!(
            hamming(fingerprint(&prompt(1)), fingerprint(&prompt(987))),
            0
        );
    }

    #[test]
    fn different_texts_produce_different_hashes() {
        let mut closest = u32::MAX;
        for (i, a) in DIFFERENT.iter().enumerate() {
            for b in &DIFFERENT[i + 1..] {
                let distance = hamming(fingerprint(a), fingerprint(b));
                assert!(distance > 5, "{distance} bits between {a:?} and {b:?}");
                closest = closest.min(distance);
            }
        }
        // Far from the edge, not just over it.
        assert!(closest >= 12, "closest pair is {closest} bits apart");
    }

    #[test]
    fn fingerprints_are_stable_across_runs_and_platforms() {
        assert_eq!(fnv1a(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(fingerprint(""), 0);
        assert_eq!(fingerprint(DIFFERENT[0]), GOLDEN);
    }

    const GOLDEN: u64 = 0x5b5b_302c_bd79_10ea;

    #[test]
    fn majority_vote_survives_many_features() {
        // More than 255 features exercises the flush of the bit planes; a text of one
        // word repeated votes unanimously for that word's hash.
        let word = "loop";
        let text = vec![word; 1_000].join(" ");
        let pair = mix(fnv1a(b"loop").rotate_left(32) ^ fnv1a(b"loop") ^ PAIR_SEED);
        let unigram = hash_bytes(word.as_bytes());
        // 1000 unigram votes against 999 pair votes: the unigram wins every bit they disagree on.
        assert_ne!(unigram, pair);
        assert_eq!(simhash(&text), unigram);
        assert_eq!(simhash(word), unigram);
    }

    fn words() -> impl Strategy<Value = Vec<String>> {
        prop::collection::vec("[a-zA-Z0-9.,:#-]{1,10}", 0..30)
    }

    proptest! {
        #[test]
        fn hamming_is_symmetric(a in any::<u64>(), b in any::<u64>()) {
            prop_assert_eq!(hamming(a, b), hamming(b, a));
        }

        #[test]
        fn hamming_to_itself_is_zero(a in any::<u64>()) {
            prop_assert_eq!(hamming(a, a), 0);
        }

        #[test]
        fn texts_differing_only_in_digits_have_equal_fingerprints(
            words in words(),
            digit in 0u8..10,
        ) {
            let text = words.join(" ");
            let other: String = text
                .chars()
                .map(|c| if c.is_ascii_digit() { char::from(b'0' + digit) } else { c })
                .collect();
            prop_assert_eq!(fingerprint(&text), fingerprint(&other));
        }

        #[test]
        fn whitespace_variants_have_equal_fingerprints(
            words in words(),
            gaps in prop::collection::vec("[ \t\r\n\u{a0}]{1,4}", 31),
            lead in "[ \t\n]{0,3}",
        ) {
            let plain = words.join(" ");
            let spaced = words
                .iter()
                .zip(&gaps)
                .fold(lead, |acc, (w, gap)| acc + w + gap);
            prop_assert_eq!(fingerprint(&plain), fingerprint(&spaced));
        }
    }
}
