//! The wordcount graph's input: text of words drawn from a fixed vocabulary by a seeded
//! generator (the same bytes every run), with how often each word was drawn, and its cut
//! into slices at whitespace so that no word is split between two map tasks.

use std::collections::{BTreeMap, HashSet};
use std::ops::Range;

/// Distinct words of the vocabulary.
const VOCABULARY: usize = 5_000;
const SEED: u64 = 0x0066_6c69_6e74;
/// Words per line.
const LINE: usize = 12;

/// Generated text and every word's count in it.
pub struct Text {
    pub bytes: Vec<u8>,
    pub counts: BTreeMap<String, u64>,
}

/// splitmix64.
struct Random(u64);

impl Random {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in [0, 1).
    fn unit(&mut self) -> f64 {
        (self.next() >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// [`VOCABULARY`] distinct lowercase words of 2 to 10 letters.
fn vocabulary(random: &mut Random) -> Vec<String> {
    let mut seen = HashSet::new();
    let mut words = Vec::with_capacity(VOCABULARY);
    while words.len() < VOCABULARY {
        let r = random.next();
        let mut letters = r >> 8;
        let word: String = (0..2 + r % 9)
            .map(|_| {
                let letter = char::from(b'a' + (letters % 26) as u8);
                letters /= 26;
                letter
            })
            .collect();
        if seen.insert(word.clone()) {
            words.push(word);
        }
    }
    words
}

/// At least `bytes` bytes of text (it ends after the word that reaches them): words
/// separated by spaces, [`LINE`] to a line, word `i` of the vocabulary drawn with a
/// probability falling about as 1 / i (the rank of `N^u` for uniform `u`), as word
/// frequencies in natural text do.
pub fn generate(bytes: usize) -> Text {
    let mut random = Random(SEED);
    let words = vocabulary(&mut random);
    let mut drawn = vec![0u64; words.len()];
    let mut text = Vec::with_capacity(bytes + 16);
    let n = words.len() as f64;
    let mut on_line = 0;
    while text.len() < bytes {
        let i = (n.powf(random.unit()) as usize).clamp(1, words.len()) - 1;
        text.extend_from_slice(words[i].as_bytes());
        drawn[i] += 1;
        on_line += 1;
        text.push(match on_line % LINE {
            0 => b'\n',
            _ => b' ',
        });
    }
    let counts = (words.into_iter().zip(drawn))
        .filter(|(_, count)| *count > 0)
        .collect();
    Text {
        bytes: text,
        counts,
    }
}

/// `text` cut into `n` slices of about equal length, each (but the last) ending just
/// after a whitespace byte.
pub fn slices(text: &[u8], n: u32) -> Vec<Range<usize>> {
    let mut start = 0;
    (1..=u64::from(n))
        .map(|k| {
            let mut end = ((text.len() as u64 * k / u64::from(n)) as usize).max(start);
            while end < text.len() && !text[end].is_ascii_whitespace() {
                end += 1;
            }
            end = match k == u64::from(n) {
                true => text.len(),
                false => (end + 1).min(text.len()),
            };
            let slice = start..end;
            start = end;
            slice
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_text_is_the_same_every_time_and_its_counts_are_its_words() {
        let text = generate(200_000);
        assert!(text.bytes.len() >= 200_000 && text.bytes.len() < 200_016);
        assert_eq!(generate(200_000).bytes, text.bytes);
        let mut counted = BTreeMap::new();
        for word in std::str::from_utf8(&text.bytes).unwrap().split_whitespace() {
            *counted.entry(word.to_owned()).or_insert(0u64) += 1;
        }
        assert_eq!(counted, text.counts);
        // Skewed: the most frequent word is far above the median one.
        let mut counts: Vec<u64> = text.counts.values().copied().collect();
        counts.sort_unstable();
        assert!(
            counts[counts.len() - 1] > 20 * counts[counts.len() / 2],
            "{counts:?}"
        );
    }

    #[test]
    fn slices_cover_the_text_and_cut_no_word() {
        let text = generate(10_000).bytes;
        for n in [1, 2, 16, 100] {
            let slices = slices(&text, n);
            assert_eq!(slices.len(), n as usize);
            assert_eq!(
                (slices[0].start, slices[n as usize - 1].end),
                (0, text.len())
            );
            for pair in slices.windows(2) {
                assert_eq!(pair[0].end, pair[1].start);
                assert!(text[pair[0].end - 1].is_ascii_whitespace(), "{pair:?}");
            }
        }
        // More slices than words: the last ones are empty, none out of bounds.
        let short = slices(b"a b", 5);
        assert_eq!(short, [0..2, 2..3, 3..3, 3..3, 3..3]);
    }
}
