//! Flint example task: counts the words of its input.
//!
//! Input: text on stdin. Bytes that are not valid UTF-8 are replaced by U+FFFD, which
//! separates words like any other non-alphanumeric character.
//!
//! Result: a JSON object mapping each word to its count, keys in sorted (byte) order and
//! no trailing newline, e.g. `{"a":2,"b":1}`; empty input gives `{}`.
//!
//! A word is a maximal run of alphanumeric characters (`char::is_alphanumeric`, so
//! Unicode letters and digits count) after the text is lowercased; everything else,
//! apostrophes and hyphens included, separates words.

use std::collections::BTreeMap;
use std::process::ExitCode;

fn main() -> ExitCode {
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("wordcount: {err}");
            ExitCode::FAILURE
        }
    }
}

fn run() -> Result<(), Box<dyn std::error::Error>> {
    let input = flint_sdk::read_input()?;
    let text = String::from_utf8_lossy(&input).to_lowercase();
    let counts = count_words(&text);
    eprintln!(
        "wordcount: {} bytes, {} distinct words",
        input.len(),
        counts.len()
    );
    flint_sdk::write_result(&serde_json::to_vec(&counts)?)?;
    Ok(())
}

/// Counts the words of already-lowercased `text`.
fn count_words(text: &str) -> BTreeMap<&str, u64> {
    let mut counts = BTreeMap::new();
    for word in text
        .split(|c: char| !c.is_alphanumeric())
        .filter(|word| !word.is_empty())
    {
        *counts.entry(word).or_insert(0) += 1;
    }
    counts
}

#[cfg(test)]
mod tests {
    use super::*;

    fn json(text: &str) -> String {
        serde_json::to_string(&count_words(&text.to_lowercase())).unwrap()
    }

    #[test]
    fn empty_input_is_an_empty_object() {
        assert_eq!(json(""), "{}");
        assert_eq!(json(" \n\t.,;"), "{}");
    }

    #[test]
    fn counts_are_case_insensitive_and_sorted() {
        assert_eq!(json("b A a"), r#"{"a":2,"b":1}"#);
    }

    #[test]
    fn apostrophes_and_punctuation_split_words() {
        assert_eq!(
            json("Don't stop--it's fine."),
            r#"{"don":1,"fine":1,"it":1,"s":1,"stop":1,"t":1}"#
        );
    }

    #[test]
    fn unicode_letters_and_digits_are_word_characters() {
        assert_eq!(
            json("Ünïcode café 42 ÜNÏCODE"),
            r#"{"42":1,"café":1,"ünïcode":2}"#
        );
    }

    #[test]
    fn replacement_characters_separate_words() {
        let text = String::from_utf8_lossy(b"ab\xffcd");
        assert_eq!(json(&text), r#"{"ab":1,"cd":1}"#);
    }
}
