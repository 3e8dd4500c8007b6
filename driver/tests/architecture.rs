//! The driver's layers, kept by a test (as ArchUnit keeps a Java codebase's): every file
//! under `driver/src` may name (`crate::...`) only modules of its own rank or below, the
//! two rank-4 front ends (`http`, `executor_port`) never name each other, and the scheduler
//! stays pure. The ranks are the table at the top of `driver/src/lib.rs`; this test is
//! that table's enforcement, so the two change together.
//!
//! The check reads source text, not the compiler's view: it looks at every `crate::`
//! path outside comments (in `use` lists, grouped or not, and in expressions), so a
//! path that names a higher layer anywhere fails, whether imported or written out.

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
    ("history", 2),
    ("tenants", 2),
    ("watched", 1),
    ("service", 3),
    ("http", 4),
    ("executor_port", 4),
    ("cluster_manager", 4),
    ("credentials", 4),
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
const CLOCK_READS: &[&str] = &["Instant::now", "SystemTime::now", ".elapsed()"];

fn rank_of(module: &str) -> Option<u8> {
    RANKS.iter().find(|(m, _)| *m == module).map(|(_, r)| *r)
}

#[path = "../../tests/source_text/mod.rs"]
mod source_text;
use source_text::{code_of, named_modules};

/// Whether `code` uses crate `name`: a path that starts with it (`name::`,
/// `::name::`, split over lines too), `use name;` / `use name as x;`, or
/// `extern crate name`.
fn uses_crate(code: &str, name: &str) -> bool {
    let ident_char = |c: char| c.is_alphanumeric() || c == '_';
    let ends_with_word = |text: &str, word: &str| {
        text.strip_suffix(word)
            .is_some_and(|t| !t.chars().next_back().is_some_and(ident_char))
    };
    code.match_indices(name).any(|(at, _)| {
        let (before, after) = (&code[..at], &code[at + name.len()..]);
        if before.chars().next_back().is_some_and(ident_char)
            || after.chars().next().is_some_and(ident_char)
        {
            return false;
        }
        let (before, after) = (before.trim_end(), after.trim_start());
        let first_segment = match before.strip_suffix("::") {
            // `a::name::` is some other path's segment; `::name::` (after `use` or
            // anything not a name) is the crate.
            Some(prefix) => {
                let prefix = prefix.trim_end();
                ends_with_word(prefix, "use") || !prefix.chars().next_back().is_some_and(ident_char)
            }
            None => true,
        };
        (after.starts_with("::") && first_segment)
            || (ends_with_word(before, "use")
                && (after.starts_with(';') || after.starts_with("as")))
            || ends_with_word(before, "crate")
                && ends_with_word(before.trim_end_matches("crate").trim_end(), "extern")
    })
}

/// How many `super::` reach the crate root from the file at `relative`: one per folder,
/// plus one unless it is a folder's `mod.rs`.
fn depth_of(relative: &Path) -> usize {
    let folders = relative.components().count() - 1;
    let is_mod = relative.file_name().is_some_and(|n| n == "mod.rs");
    folders + usize::from(!is_mod)
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
    for module in named_modules(&code, depth_of(relative)) {
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
                "{at}: `{first}` names `crate::{module}`: http and executor_port never use each other"
            )),
            Some(theirs) if theirs == rank => found.push(format!(
                "{at}: `{first}` names `crate::{module}` of its own rank {rank}: modules of one \
                 rank stand side by side; move what both need a rank down"
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
    assert_eq!(
        violations(http, "use crate::executor_port::serve;\n").len(),
        1
    );
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

/// The ways a second reader found to slip an upward path past the first checker.
#[test]
fn the_checker_is_not_fooled_by_spelling() {
    let upward = |file: &str, source: &str| {
        let found = violations(Path::new(file), source);
        assert_eq!(found.len(), 1, "{file}: {source:?} gave {found:?}");
    };
    // `super::` up to the crate root, from a top-level file, a folder's mod.rs and a
    // file in a folder; one `super::` short of the root stays inside the folder.
    upward("metrics.rs", "use super::service::Driver;\n");
    upward("store/mod.rs", "use super::service::Driver;\n");
    upward("store/blobs.rs", "use super::super::service::Driver;\n");
    upward(
        "store/blobs.rs",
        "use super ::\n    super::{scheduler::Job, service};\n",
    );
    assert!(violations(Path::new("store/blobs.rs"), "use super::jobs::JobStore;\n").is_empty());
    // Paths split over lines, spaced, or in nested groups.
    upward("store/jobs.rs", "use crate::\n    service::Driver;\n");
    upward("store/jobs.rs", "use crate :: service;\n");
    upward(
        "store/jobs.rs",
        "use crate::{scheduler::{Job, Task}, service::Driver};\n",
    );
    // A `//` or a quote inside a literal hides nothing after it.
    upward(
        "store/jobs.rs",
        "fn f(c: char) { if c == '\"' { let _u = \"http://x\"; }; crate::service::f() }\n",
    );
    upward(
        "store/jobs.rs",
        "const A: &str = r#\"a \" // b\"#; use crate::http::X;\n",
    );
    // Only `#[cfg(test)]` items are skipped, not what follows them.
    upward(
        "store/jobs.rs",
        "#[cfg(test)]\nmod tests;\nuse crate::service::Driver;\n",
    );
    upward(
        "store/jobs.rs",
        "#[cfg(test)]\nmod tests {\n    fn f() { let _ = \"}\"; }\n}\nuse crate::service::Driver;\n",
    );
    // A crate named from the root, renamed, or declared.
    upward("scheduler/mod.rs", "use ::tokio::sync::mpsc;\n");
    upward("scheduler/mod.rs", "use tokio as rt;\n");
    upward("scheduler/mod.rs", "extern crate tokio;\n");
    upward(
        "scheduler/mod.rs",
        "fn f() { let _ = tokio\n    ::spawn; }\n",
    );
    assert!(
        violations(
            Path::new("scheduler/mod.rs"),
            "use flint_protocol::tokio_like;\n"
        )
        .is_empty()
    );
    // The clock, however it is read.
    upward(
        "scheduler/offers.rs",
        "fn f(t: std::time::Instant) -> u64 { t.elapsed().as_secs() }\n",
    );
    // Modules of one rank stand side by side.
    upward("metrics.rs", "use crate::views::job_view;\n");
}
