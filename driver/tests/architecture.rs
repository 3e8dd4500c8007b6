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
    ("history", 2),
    ("service", 3),
    ("http", 4),
    ("cluster", 4),
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

/// A file's code as the checks read it: comments gone, string and char literals
/// emptied (so neither a `//` in a URL nor a `crate::x` in a message counts), and every
/// `#[cfg(test)]` item left out (tests may reach anywhere to set a scene; doc links do
/// not make a dependency).
fn code_of(source: &str) -> String {
    without_test_items(&strip_comments_and_literals(source))
}

fn strip_comments_and_literals(source: &str) -> String {
    let chars: Vec<char> = source.chars().collect();
    let mut out = String::with_capacity(source.len());
    let mut i = 0;
    while i < chars.len() {
        let c = chars[i];
        let next = chars.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < chars.len() && chars[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < chars.len() {
                if chars[i] == '/' && chars.get(i + 1) == Some(&'*') {
                    depth += 1;
                    i += 2;
                } else if chars[i] == '*' && chars.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    if chars[i] == '\n' {
                        out.push('\n');
                    }
                    i += 1;
                }
            }
        } else if c == 'r'
            && matches!(next, Some('"') | Some('#'))
            && !chars[..i]
                .last()
                .is_some_and(|p| p.is_alphanumeric() || *p == '_')
        {
            // A raw string: r"..." or r#"..."#, closed by a quote and as many #.
            let mut j = i + 1;
            let mut hashes = 0;
            while chars.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if chars.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            loop {
                match chars.get(j) {
                    None => break,
                    Some('"') if (1..=hashes).all(|k| chars.get(j + k) == Some(&'#')) => {
                        j += 1 + hashes;
                        break;
                    }
                    _ => j += 1,
                }
            }
            out.push_str("\"\"");
            i = j;
        } else if c == '"' {
            i += 1;
            while i < chars.len() && chars[i] != '"' {
                i += if chars[i] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            i += 1;
        } else if c == '\'' {
            // A char literal ('x', '\n', '\u{..}') or a lifetime ('a).
            if next == Some('\\') {
                let mut j = i + 2;
                while j < chars.len() && chars[j] != '\'' {
                    j += 1;
                }
                out.push_str("' '");
                i = j + 1;
            } else if chars.get(i + 2) == Some(&'\'') {
                out.push_str("' '");
                i += 3;
            } else {
                out.push(c);
                i += 1;
            }
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

/// `code` without its `#[cfg(test)]` items: the attribute, then the item up to its `;`
/// or its balanced `{ ... }` (literals are already empty, so braces balance).
fn without_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let item = &rest[at + "#[cfg(test)]".len()..];
        let end = match (item.find(';'), item.find('{')) {
            (Some(semi), Some(open)) if semi < open => semi + 1,
            (_, Some(open)) => {
                let mut depth = 0;
                let mut end = item.len();
                for (k, ch) in item[open..].char_indices() {
                    match ch {
                        '{' => depth += 1,
                        '}' => {
                            depth -= 1;
                            if depth == 0 {
                                end = open + k + 1;
                                break;
                            }
                        }
                        _ => {}
                    }
                }
                end
            }
            (Some(semi), None) => semi + 1,
            (None, None) => item.len(),
        };
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// The identifier at the start of `s`, after any whitespace (a path may be split over
/// lines: `crate::\n    service`).
fn ident(s: &str) -> (&str, &str) {
    let s = s.trim_start();
    let end = s
        .find(|c: char| !(c.is_alphanumeric() || c == '_'))
        .unwrap_or(s.len());
    (&s[..end], &s[end..])
}

/// The first names of every path in a `{ ... }` group (nested groups opened), after
/// the opening brace.
fn group_heads(group: &str, out: &mut BTreeSet<String>) {
    let mut depth = 0;
    let mut at_item_start = true;
    let mut k = 0;
    let bytes = group.as_bytes();
    while k < group.len() {
        match bytes[k] {
            b'{' => {
                depth += 1;
                at_item_start = depth == 0;
            }
            b'}' if depth == 0 => return,
            b'}' => depth -= 1,
            b',' if depth == 0 => at_item_start = true,
            c if at_item_start && depth == 0 && !c.is_ascii_whitespace() => {
                let (name, _) = ident(&group[k..]);
                if !name.is_empty() && name != "self" {
                    out.insert(name.to_owned());
                }
                at_item_start = false;
            }
            _ => {}
        }
        k += 1;
    }
}

/// The top-level modules that code in a file at `depth` (how many `super::` reach the
/// crate root from it) names, through `crate::` or enough `super::`, with groups
/// opened.
fn named_modules(code: &str, depth: usize) -> BTreeSet<String> {
    let mut named = BTreeSet::new();
    let mut k = 0;
    while k < code.len() {
        let rest = &code[k..];
        let boundary = !code[..k]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$');
        if boundary && rest.starts_with("crate") {
            let after = rest["crate".len()..].trim_start();
            if let Some(path) = after.strip_prefix("::") {
                head_of(path.trim_start(), &mut named);
            }
            k += "crate".len();
            continue;
        }
        if boundary && rest.starts_with("super") {
            // `super::super::x`: at the crate root once as many as the file is deep.
            let mut after = rest;
            let mut ups = 0;
            while let Some(more) = after.strip_prefix("super") {
                let Some(more) = more.trim_start().strip_prefix("::") else {
                    break;
                };
                ups += 1;
                after = more.trim_start();
            }
            if ups == 0 {
                // `pub(super)`, or `super` alone: no path to follow.
                k += "super".len();
                continue;
            }
            if ups >= depth {
                head_of(after, &mut named);
            }
            k += rest.len() - after.len();
            continue;
        }
        k += rest.chars().next().map_or(1, char::len_utf8);
    }
    named
}

/// The top-level module a path after the crate root starts with, or every one a group
/// there names.
fn head_of(path: &str, named: &mut BTreeSet<String>) {
    if let Some(group) = path.strip_prefix('{') {
        group_heads(group, named);
    } else {
        let (name, _) = ident(path);
        if !name.is_empty() {
            named.insert(name.to_owned());
        }
    }
}

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
                "{at}: `{first}` names `crate::{module}`: http and cluster never use each other"
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
