//! Flint example task: the lines of a job's files that contain a pattern.
//!
//! Arguments: `[-i] [PATTERN [FILE...]]`. The pattern is the first argument, or, when
//! there is none, the task's input (one line; a trailing newline is dropped), so a job
//! can give each task its own pattern. The files are the job's files named after the
//! pattern, or all of them (`/files/*`) when none is named. `-i` ignores ASCII case.
//!
//! Result: one line per match, `FILE:LINE:TEXT` (lines numbered from 1), files in the
//! order given (sorted when all are searched). No match is an empty result, not a
//! failure. An unknown file is a usage error (exit code 64); an empty pattern too.

use flint_sdk::{Context, Error};
use std::io::{BufRead, BufReader};
use std::process::ExitCode;

fn main() -> ExitCode {
    flint_sdk::run_bytes(grep)
}

fn grep(ctx: &Context, input: Vec<u8>) -> Result<Vec<u8>, Error> {
    let mut args = ctx.args();
    let ignore_case = args.first().is_some_and(|a| a == "-i");
    if ignore_case {
        args = &args[1..];
    }
    let (pattern, files) = match args.split_first() {
        Some((pattern, files)) => (pattern.clone(), files.to_vec()),
        None => {
            let text =
                String::from_utf8(input).map_err(|_| Error::input("the pattern is not UTF-8"))?;
            (text.trim_end_matches(['\r', '\n']).to_owned(), Vec::new())
        }
    };
    if pattern.is_empty() {
        return Err(Error::usage(
            "usage: grep [-i] PATTERN [FILE...] (or the pattern as input)",
        ));
    }
    let files = if files.is_empty() {
        ctx.file_names()?
    } else {
        files
    };
    let needle = if ignore_case {
        pattern.to_ascii_lowercase()
    } else {
        pattern
    };
    let mut out = Vec::new();
    let mut matches = 0;
    for name in &files {
        let reader = BufReader::new(ctx.file(name)?);
        for (number, line) in reader.split(b'\n').enumerate() {
            let line = line.map_err(|e| Error::io(format!("reading {name}: {e}")))?;
            if contains(&line, needle.as_bytes(), ignore_case) {
                matches += 1;
                out.extend_from_slice(format!("{name}:{}:", number + 1).as_bytes());
                out.extend_from_slice(&line);
                out.push(b'\n');
            }
        }
    }
    ctx.log(format_args!(
        "{matches} matching lines in {} files",
        files.len()
    ));
    Ok(out)
}

fn contains(line: &[u8], needle: &[u8], ignore_case: bool) -> bool {
    line.windows(needle.len()).any(|window| {
        if ignore_case {
            window.eq_ignore_ascii_case(needle)
        } else {
            window == needle
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(args: &[&str], input: &str) -> Result<String, Error> {
        let dir = std::env::temp_dir().join(format!(
            "grep-test-{}-{:?}",
            std::process::id(),
            std::thread::current().id()
        ));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("a.txt"), "Alpha\nbeta\nALPHABET\n").unwrap();
        std::fs::write(dir.join("b.txt"), "no\nalpha").unwrap();
        let args = args.iter().map(|a| a.to_string()).collect();
        let ctx = Context::new("j", 0, 1, args).with_files_dir(&dir);
        let out = grep(&ctx, input.as_bytes().to_vec());
        std::fs::remove_dir_all(dir).unwrap();
        out.map(|bytes| String::from_utf8(bytes).unwrap())
    }

    #[test]
    fn searches_all_files_with_the_pattern_from_the_input() {
        assert_eq!(run(&[], "alpha\n").unwrap(), "b.txt:2:alpha\n");
    }

    #[test]
    fn ignores_case_and_searches_the_named_files_only() {
        assert_eq!(
            run(&["-i", "alpha", "a.txt"], "").unwrap(),
            "a.txt:1:Alpha\na.txt:3:ALPHABET\n"
        );
    }

    #[test]
    fn an_unknown_file_or_empty_pattern_is_a_usage_error() {
        let usage = flint_sdk::ErrorKind::Usage;
        assert_eq!(run(&["x", "c.txt"], "").unwrap_err().kind(), usage);
        assert_eq!(run(&[], "\n").unwrap_err().kind(), usage);
    }
}
