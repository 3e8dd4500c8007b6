//! Every fuzz target's properties (`flint_fuzz_checks`), run in an ordinary test build:
//! each seed of `fuzz/corpus/<target>/` and a fixed set of mutants of it (bit flips,
//! byte writes, insertions, deletions, splices with the target's other seeds, a new
//! first byte, which picks the input's shape), plus inputs of random bytes. It is what
//! `./scripts/test` runs on every change in place of a libFuzzer smoke run, which needs
//! an instrumented build of its own (about 30 minutes on 2 cores from nothing); long
//! coverage-guided runs stay with `scripts/fuzz` (BENCHMARKS.md, "Fuzzing").
//!
//! The mutants come from a fixed seed, so a failure here fails every time; the failing
//! input is written under the test's tmp dir and the message gives the cargo-fuzz
//! command that replays it under the target itself.

use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};

/// One target: the corpus it starts from, its check, and how many mutants per seed
/// (fewer where each input compiles a module).
struct Target {
    name: &'static str,
    corpus: &'static str,
    check: fn(&[u8]),
    mutants_per_seed: usize,
    /// The fuzz crate's features the cargo-fuzz target needs (for the replay command).
    features: &'static str,
}

const TARGETS: &[Target] = &[
    Target {
        name: "frame_decoder",
        corpus: "frame_decoder",
        check: flint_fuzz_checks::frame_decoder::check_input,
        mutants_per_seed: 1_000,
        features: "",
    },
    Target {
        name: "job_record",
        corpus: "job_record",
        check: flint_fuzz_checks::job_record::check_input,
        mutants_per_seed: 1_000,
        features: "",
    },
    Target {
        name: "job_spec",
        corpus: "job_spec",
        check: flint_fuzz_checks::job_spec::check_input,
        mutants_per_seed: 2_000,
        features: "driver",
    },
    Target {
        name: "url_policy",
        corpus: "url_policy",
        check: flint_fuzz_checks::url_policy::check_input,
        mutants_per_seed: 1_000,
        features: "fetch-cache",
    },
    Target {
        name: "egress_policy",
        corpus: "egress_policy",
        check: flint_fuzz_checks::egress_policy::check_input,
        mutants_per_seed: 1_000,
        features: "fetch-cache",
    },
    Target {
        name: "module_rules",
        corpus: "module_rules",
        check: flint_fuzz_checks::module_rules::check_input,
        mutants_per_seed: 500,
        features: "",
    },
    // Its seeds are module_rules' (scripts/fuzz gives it the same corpus).
    Target {
        name: "module_rules_vs_engine",
        corpus: "module_rules",
        check: flint_fuzz_checks::module_rules_vs_engine::check_input,
        mutants_per_seed: 40,
        features: "engine",
    },
];

/// Inputs of random bytes per target, beside the mutants.
const RANDOM_INPUTS: usize = 500;

/// splitmix64: a fixed, portable sequence (no crate's version can change it).
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next() as u8).collect()
    }
}

/// One to four edits of `seed`, some borrowing from `others` (the target's other seeds).
fn mutate(rng: &mut Rng, seed: &[u8], others: &[Vec<u8>]) -> Vec<u8> {
    let mut input = seed.to_vec();
    for _ in 0..1 + rng.below(4) {
        let len = input.len();
        match rng.below(8) {
            0 if len > 0 => {
                let at = rng.below(len);
                input[at] ^= 1 << rng.below(8);
            }
            1 if len > 0 => {
                let at = rng.below(len);
                input[at] = rng.next() as u8;
            }
            2 => {
                let at = rng.below(len + 1);
                let n = 1 + rng.below(8);
                let bytes = rng.bytes(n);
                input.splice(at..at, bytes);
            }
            3 if len > 0 => {
                let at = rng.below(len);
                let end = (at + 1 + rng.below(16)).min(len);
                input.drain(at..end);
            }
            4 if len > 0 => {
                let at = rng.below(len);
                let end = (at + 1 + rng.below(32)).min(len);
                let copy = input[at..end].to_vec();
                let to = rng.below(len + 1);
                input.splice(to..to, copy);
            }
            5 if !others.is_empty() => {
                let other = &others[rng.below(others.len())];
                if !other.is_empty() {
                    let from = rng.below(other.len());
                    let end = (from + 1 + rng.below(64)).min(other.len());
                    let to = rng.below(len + 1);
                    input.splice(to..to, other[from..end].iter().copied());
                }
            }
            6 if len > 1 => input.truncate(1 + rng.below(len - 1)),
            _ if len > 0 => input[0] = rng.next() as u8,
            _ => input.push(rng.next() as u8),
        }
    }
    input
}

fn corpus_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(name)
}

/// The seeds of a corpus, by file name. An empty or missing corpus is an error: a
/// replay of nothing would pass.
fn seeds(name: &str) -> Vec<(String, Vec<u8>)> {
    let dir = corpus_dir(name);
    let mut seeds: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("reading {}: {e}", dir.display()))
        .map(|entry| {
            let path = entry.expect("a corpus entry").path();
            let bytes = std::fs::read(&path).expect("a seed reads");
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                bytes,
            )
        })
        .collect();
    seeds.sort();
    assert!(!seeds.is_empty(), "{} has no seeds", dir.display());
    seeds
}

/// A failed property: which input, the panic's message, and where the input was saved.
#[derive(Debug)]
struct Failure {
    what: String,
    message: String,
    saved: PathBuf,
}

/// Runs `check` on every seed, its mutants and random inputs; returns what failed and
/// how many inputs ran.
fn replay(
    name: &str,
    seeds: &[(String, Vec<u8>)],
    check: fn(&[u8]),
    mutants_per_seed: usize,
    out: &Path,
) -> (Vec<Failure>, usize) {
    let mut rng = Rng(0x666c_696e_7400 ^ name.len() as u64);
    let bodies: Vec<Vec<u8>> = seeds.iter().map(|(_, b)| b.clone()).collect();
    let mut inputs: Vec<(String, Vec<u8>)> = Vec::new();
    for (file, seed) in seeds {
        inputs.push((format!("seed {file}"), seed.clone()));
        for i in 0..mutants_per_seed {
            inputs.push((
                format!("mutant {i} of {file}"),
                mutate(&mut rng, seed, &bodies),
            ));
        }
    }
    for i in 0..RANDOM_INPUTS {
        let n = rng.below(256);
        inputs.push((format!("random input {i}"), rng.bytes(n)));
    }
    let mut failures = Vec::new();
    for (what, input) in &inputs {
        let Err(panic) = panic::catch_unwind(AssertUnwindSafe(|| check(input))) else {
            continue;
        };
        let message = panic
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| panic.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_else(|| "(a panic without a message)".to_owned());
        std::fs::create_dir_all(out).expect("the failures' dir");
        let saved = out.join(format!("{name}-{}", failures.len()));
        std::fs::write(&saved, input).expect("a failing input saves");
        failures.push(Failure {
            what: what.clone(),
            message,
            saved,
        });
    }
    (failures, inputs.len())
}

#[test]
fn every_fuzz_target_holds_on_its_corpus_and_mutants_of_it() {
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-replay-failures");
    let _ = std::fs::remove_dir_all(&out);
    let mut report = Vec::new();
    for target in TARGETS {
        let seeds = seeds(target.corpus);
        let (failures, ran) = replay(
            target.name,
            &seeds,
            target.check,
            target.mutants_per_seed,
            &out,
        );
        eprintln!("{}: {ran} inputs, {} failed", target.name, failures.len());
        for f in failures {
            report.push(format!(
                "{}: {} failed: {}\n  saved as {}; under libFuzzer: (cd fuzz && \
                 RUSTC_BOOTSTRAP=1 cargo fuzz run --features '{}' {} {})",
                target.name,
                f.what,
                f.message,
                f.saved.display(),
                target.features,
                target.name,
                f.saved.display()
            ));
        }
    }
    assert!(report.is_empty(), "{}", report.join("\n"));
}

/// The harness itself can fail: a property that breaks on some inputs is caught, with
/// its input saved as it was.
#[test]
fn a_broken_property_is_reported_with_its_input() {
    fn broken(data: &[u8]) {
        assert!(!data.contains(&0xa5), "0xa5 is not allowed");
    }
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("fuzz-replay-self-test");
    let _ = std::fs::remove_dir_all(&out);
    let seeds = vec![("clean".to_owned(), vec![0u8; 8])];
    let (failures, ran) = replay("broken", &seeds, broken, 200, &out);
    assert_eq!(ran, 1 + 200 + RANDOM_INPUTS);
    assert!(
        !failures.is_empty(),
        "mutants and random bytes never hit 0xa5"
    );
    for f in &failures {
        assert!(f.message.contains("0xa5 is not allowed"), "{f:?}");
        let saved = std::fs::read(&f.saved).expect("the input was saved");
        assert!(saved.contains(&0xa5), "{f:?}: saved {saved:?}");
    }
    // The clean seed itself passed: only what holds 0xa5 failed.
    assert!(failures.iter().all(|f| f.what != "seed clean"));
}

#[test]
fn mutants_are_the_same_every_run() {
    let seed = b"\x00{\"tasks\":[]}".to_vec();
    let run = || {
        let mut rng = Rng(7);
        (0..50)
            .map(|_| mutate(&mut rng, &seed, std::slice::from_ref(&seed)))
            .collect::<Vec<_>>()
    };
    let first = run();
    assert_eq!(first, run());
    assert!(
        first.iter().filter(|m| **m != seed).count() > 40,
        "mutants that change nothing"
    );
}

/// The cargo-fuzz crate is its own workspace and no test build compiles it, so the
/// wiring is checked as text: every target of `fuzz/fuzz_targets/` is one call to its
/// check, is replayed here, has its `[[bin]]` and is in `scripts/fuzz all`.
#[test]
fn every_cargo_fuzz_target_calls_its_check_and_is_replayed_here() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut names: Vec<String> = std::fs::read_dir(root.join("fuzz/fuzz_targets"))
        .expect("fuzz/fuzz_targets")
        .map(|e| {
            let path = e.expect("an entry").path();
            path.file_stem().unwrap().to_string_lossy().into_owned()
        })
        .collect();
    names.sort();
    let mut replayed: Vec<String> = TARGETS.iter().map(|t| t.name.to_owned()).collect();
    replayed.sort();
    assert_eq!(names, replayed, "fuzz/fuzz_targets vs this file's TARGETS");
    let manifest = std::fs::read_to_string(root.join("fuzz/Cargo.toml")).expect("fuzz/Cargo.toml");
    let script = std::fs::read_to_string(root.join("scripts/fuzz")).expect("scripts/fuzz");
    let all = script
        .lines()
        .find_map(|l| l.strip_prefix("all=("))
        .and_then(|l| l.strip_suffix(')'))
        .expect("scripts/fuzz's all=(...) line");
    for name in &names {
        let file = root.join("fuzz/fuzz_targets").join(format!("{name}.rs"));
        let source = std::fs::read_to_string(&file).expect("a target reads");
        let call =
            format!("fuzz_target!(|data: &[u8]| flint_fuzz_checks::{name}::check_input(data));");
        assert!(source.contains(&call), "{}: not `{call}`", file.display());
        let bin = format!("name = \"{name}\"\npath = \"fuzz_targets/{name}.rs\"");
        assert!(
            manifest.contains(&bin),
            "fuzz/Cargo.toml has no [[bin]] {name}"
        );
        assert!(
            all.split_whitespace().any(|n| n == name),
            "scripts/fuzz all=() lacks {name}"
        );
    }
}
