//! The driver's layers, kept by a test (as ArchUnit keeps a Java codebase's): every file
//! under `driver/src` may name (`crate::...`) only modules of its own rank or below, the
//! two rank-4 front ends (`http`, `cluster`) never name each other, and the scheduler
//! stays pure. The ranks are the table at the top of `driver/src/lib.rs`; this test is
//! that table's enforcement, so the two change together.
//!
//! The check reads source text, not the compiler's view: it looks at every `crate::`
//! path outside comments (in `use` lists, grouped or not, and in expressions), so a
//! path that names a higher layer anywhere fails, whether imported or written out.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Top-level modules of the driver and their ranks (lower may never name higher).
const RANKS: &[(&str, u8)] = &[
    ("scheduler", 0),
    ("store", 1),
    ("config", 2),
    ("views", 2),
    ("admission", 2),
    ("events", 2),
    ("metrics", 2),
    ("executor_logs", 2),
    ("service", 3),
    ("http", 4),
    ("cluster", 4),
    ("server", 5),
];

/// Crates a rank may not use at all: the scheduler is a pure state machine (no runtime,
/// no web framework, no database, no network); below the front ends nothing speaks HTTP.
const FORBIDDEN_CRATES: &[(u8, &[&str])] = &[
    (
        0,
        &[
            "tokio",
            "axum",
            "hyper",
            "redb",
            "object_store",
            "reqwest",
            "utoipa",
        ],
    ),
    (1, &["axum", "hyper", "utoipa"]),
    (2, &["axum", "hyper", "utoipa"]),
    (3, &["axum", "hyper", "utoipa"]),
];

/// Clock reads the scheduler may not make: the service hands it the time.
const CLOCK_READS: &[&str] = &["Instant::now", "SystemTime::now"];

fn rank_of(module: &str) -> Option<u8> {
    RANKS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

/// A file's source with comments and its `#[cfg(test)] mod tests` block cut off: tests
/// may reach anywhere to set a scene, and doc links do not make a dependency.
fn code_of(source: &str) -> String {
    let end = source
        .find("#[cfg(test)]\nmod tests")
        .unwrap_or(source.len());
    source[..end]
        .lines()
        .map(|line| match line.find("//") {
            // `//` inside a string ("http://...") is not a comment.
            Some(at) if line[..at].matches('"').count() % 2 == 0 => &line[..at],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The top-level modules a piece of code names through `crate::`, with `crate::{a, b}`
/// groups opened.
fn named_modules(code: &str) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let mut rest = code;
    while let Some(at) = rest.find("crate::") {
        // `flint_crate::x` or `some_crate::` are other paths, not this crate's.
        let before = rest[..at].chars().next_back();
        rest = &rest[at + "crate::".len()..];
        if before.is_some_and(|c| c.is_alphanumeric() || c == '_') {
            continue;
        }
        if let Some(group) = rest.strip_prefix('{') {
            let close = group.find('}').unwrap_or(group.len());
            for item in group[..close].split(',') {
                let name: String = item
                    .trim()
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if !name.is_empty() && name != "self" {
                    named.insert(name);
                }
            }
        } else {
            let name: String = rest
                .chars()
                .take_while(|c| c.is_alphanumeric() || *c == '_')
                .collect();
            if !name.is_empty() {
                named.insert(name);
            }
        }
    }
    named
}

/// Whether `code` uses crate `name` (`name::` as a path start, or `use name`).
fn uses_crate(code: &str, name: &str) -> bool {
    let needle = format!("{name}::");
    code.match_indices(&needle).any(|(at, _)| {
        !code[..at]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':')
    })
}

/// Every broken rule in one file, given its path under `src/` and its source.
fn violations(relative: &Path, source: &str) -> Vec<String> {
    let mut found = Vec::new();
    let first = relative
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .map(|c| c.trim_end_matches(".rs").to_owned())
        .unwrap_or_default();
    if first == "lib" {
        return found;
    }
    let at = relative.display();
    let Some(rank) = rank_of(&first) else {
        found.push(format!(
            "{at}: module `{first}` has no rank: add it to the table in lib.rs and to RANKS here"
        ));
        return found;
    };
    let code = code_of(source);
    for module in named_modules(&code) {
        if module == first {
            continue;
        }
        match rank_of(&module) {
            None => found.push(format!("{at}: names `crate::{module}`, which has no rank")),
            Some(theirs) if theirs > rank => found.push(format!(
                "{at}: rank {rank} (`{first}`) names `crate::{module}` of rank {theirs}: \
                 a layer may only use the layers below it"
            )),
            Some(theirs) if theirs == rank && rank == 4 => found.push(format!(
                "{at}: `{first}` names `crate::{module}`: http and cluster never use each other"
            )),
            Some(_) => {}
        }
    }
    for (forbidden_rank, crates) in FORBIDDEN_CRATES {
        if *forbidden_rank != rank {
            continue;
        }
        for name in *crates {
            if uses_crate(&code, name) {
                found.push(format!("{at}: rank {rank} (`{first}`) uses `{name}`"));
            }
        }
    }
    if rank == 0 {
        for read in CLOCK_READS {
            if code.contains(read) {
                found.push(format!(
                    "{at}: the scheduler reads the clock (`{read}`): take the time as an argument"
                ));
            }
        }
    }
    found
}

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn every_driver_file_names_only_the_layers_below_it() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    sources(&src, &mut files);
    files.sort();
    assert!(files.len() > 20, "found only {files:?}");
    let mut found = Vec::new();
    for file in &files {
        // Test-only files (`foo/tests.rs`, `foo/tests/*.rs`) set scenes from anywhere,
        // like a tests block.
        let relative = file.strip_prefix(&src).unwrap();
        if relative.file_name().is_some_and(|n| n == "tests.rs")
            || relative.components().any(|c| c.as_os_str() == "tests")
        {
            continue;
        }
        let source = std::fs::read_to_string(file).unwrap();
        found.extend(violations(relative, &source));
    }
    assert!(
        found.is_empty(),
        "the driver's layering is broken:\n{}",
        found.join("\n")
    );
}

#[test]
fn the_table_here_is_the_table_in_lib_rs() {
    let lib =
        std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src/lib.rs")).unwrap();
    for (module, rank) in RANKS {
        let row = lib
            .lines()
            .find(|l| l.starts_with("//! |") && l.contains(&format!("`{module}")))
            .unwrap_or_else(|| panic!("lib.rs's table has no row for `{module}`"));
        assert!(
            row.starts_with(&format!("//! | {rank} |")),
            "lib.rs gives `{module}` another rank than {rank}: {row}"
        );
    }
}

#[test]
fn the_checker_catches_an_upward_import_in_each_form() {
    let store = Path::new("store/jobs.rs");
    for source in [
        "use crate::service::Driver;\n",
        "use crate::{scheduler::Job, http::ApiError};\n",
        "fn f() { let _ = crate::server::run; }\n",
    ] {
        assert_eq!(violations(store, source).len(), 1, "{source}");
    }
    let http = Path::new("http/jobs.rs");
    assert_eq!(violations(http, "use crate::cluster::serve;\n").len(), 1);
    assert!(
        violations(
            http,
            "use crate::service::Driver;\nuse crate::scheduler::Job;\n"
        )
        .is_empty()
    );
    // Comments, doc links and test blocks do not count.
    assert!(
        violations(
            store,
            "//! see [`crate::service::Driver`]\nfn f() {} // crate::http\n#[cfg(test)]\nmod tests {\n    use crate::service::Driver;\n}\n"
        )
        .is_empty()
    );
    // Another crate's path is not this crate's.
    assert!(violations(store, "use flint_crate::http;\n").is_empty());
    let scheduler = Path::new("scheduler/mod.rs");
    assert_eq!(
        violations(scheduler, "fn f() { let _ = std::time::Instant::now(); }\n").len(),
        1
    );
    assert_eq!(violations(scheduler, "use tokio::sync::mpsc;\n").len(), 1);
    assert_eq!(violations(Path::new("nowhere.rs"), "").len(), 1);
}
