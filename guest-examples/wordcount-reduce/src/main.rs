//! Flint example task: the reduce side of wordcount. Sums word counts.
//!
//! Input: any number of JSON objects mapping words to counts, as wordcount's map tasks
//! write them (`{"a":2,"b":1}`), one after another (separated by whitespace or not) or
//! as one JSON array of them; an empty input sums to `{}`.
//!
//! Result: one JSON object with every word's total, keys in sorted order, in the same
//! shape as a map task's result, so reduces can be chained. With `--top N` only the N
//! most frequent words are kept (ties broken by word). Input that is not word counts is
//! an input error (exit code 65); a count past `u64` as well.

use flint_sdk::{Context, Error};
use serde_json::Value;
use std::collections::BTreeMap;
use std::process::ExitCode;

type Counts = BTreeMap<String, u64>;

fn main() -> ExitCode {
    flint_sdk::run_bytes(|ctx: &Context, input: Vec<u8>| {
        let top = top_arg(ctx.args())?;
        let mut totals = Counts::new();
        let mut parts = 0;
        for value in serde_json::Deserializer::from_slice(&input).into_iter::<Value>() {
            let value = value.map_err(|e| Error::input(format!("not JSON: {e}")))?;
            match value {
                Value::Array(items) => {
                    for item in items {
                        add(&mut totals, item)?;
                        parts += 1;
                    }
                }
                other => {
                    add(&mut totals, other)?;
                    parts += 1;
                }
            }
        }
        ctx.log(format_args!(
            "summed {parts} counts into {} words",
            totals.len()
        ));
        if let Some(n) = top {
            totals = keep_top(totals, n);
        }
        Ok(serde_json::to_vec(&totals)?)
    })
}

fn top_arg(args: &[String]) -> Result<Option<usize>, Error> {
    match args {
        [] => Ok(None),
        [flag, n] if flag == "--top" => n
            .parse()
            .map(Some)
            .map_err(|_| Error::usage(format!("--top {n}: not a count"))),
        _ => Err(Error::usage("usage: wordcount-reduce [--top N]")),
    }
}

fn add(totals: &mut Counts, value: Value) -> Result<(), Error> {
    let Value::Object(counts) = value else {
        return Err(Error::input(format!("expected word counts, found {value}")));
    };
    for (word, count) in counts {
        let count = count.as_u64().ok_or_else(|| {
            Error::input(format!("the count of `{word}` is {count}, not a count"))
        })?;
        let total = totals.entry(word).or_insert(0);
        *total = total
            .checked_add(count)
            .ok_or_else(|| Error::input("a total does not fit in 64 bits"))?;
    }
    Ok(())
}

fn keep_top(totals: Counts, n: usize) -> Counts {
    let mut by_count: Vec<(String, u64)> = totals.into_iter().collect();
    by_count.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    by_count.truncate(n);
    by_count.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sum(inputs: &[&str]) -> Result<Counts, Error> {
        let mut totals = Counts::new();
        for input in inputs {
            add(&mut totals, serde_json::from_str(input).unwrap())?;
        }
        Ok(totals)
    }

    #[test]
    fn sums_counts_across_parts() {
        let totals = sum(&[r#"{"a":2,"b":1}"#, r#"{"b":3,"c":1}"#]).unwrap();
        assert_eq!(
            serde_json::to_string(&totals).unwrap(),
            r#"{"a":2,"b":4,"c":1}"#
        );
    }

    #[test]
    fn rejects_what_is_not_word_counts() {
        for bad in [r#"[1]"#, r#"{"a":-1}"#, r#"{"a":"x"}"#, r#"{"a":1.5}"#] {
            assert_eq!(
                sum(&[bad]).unwrap_err().kind(),
                flint_sdk::ErrorKind::Input,
                "{bad}"
            );
        }
        let max = format!(r#"{{"a":{}}}"#, u64::MAX);
        assert!(sum(&[&max, r#"{"a":1}"#]).is_err());
    }

    #[test]
    fn top_keeps_the_most_frequent_with_ties_by_word() {
        let totals = sum(&[r#"{"a":1,"b":3,"c":3,"d":2}"#]).unwrap();
        let top: Vec<_> = keep_top(totals, 3).into_keys().collect();
        assert_eq!(top, ["b", "c", "d"]);
    }
}
