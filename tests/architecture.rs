//! The workspace's shape, kept by a test: no source file grows past [`MAX_LINES`]
//! (a file that long holds more than one responsibility: split it by what it does, not
//! by where line 500 falls), and the binary crate's top-level modules (`src/x.rs` or
//! `src/x/`) never name each other in a circle, so each command can be read, and
//! changed, from the modules it names downward.
//!
//! Like `driver/tests/architecture.rs`, this reads source text, not the compiler's view:
//! every `crate::` path outside comments and string literals counts (in `use` lists,
//! grouped or not, and in expressions), as does `super::` up to the crate root.
//! Test-only files (`tests.rs`, anything under a `tests/` folder) are left out of both
//! checks, and `#[cfg(test)]` items out of the circle check: tests may reach anywhere to
//! set a scene, and a long test file is a list of cases, not a tangle of
//! responsibilities. An inline test module still counts towards its file's lines.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

/// The most lines a non-test source file may have.
const MAX_LINES: usize = 500;

/// Every crate's source folder, from the workspace root.
const SOURCE_DIRS: &[&str] = &[
    "protocol/src",
    "module-rules/src",
    "fetch-cache/src",
    "executor/src",
    "driver/src",
    "fuzz-checks/src",
    "src",
];

/// The binary crate's root: it declares and dispatches to every module, so naming it
/// from one of them (`crate::some_fn` of `main.rs`) is itself a circle.
const ROOT: &str = "main";

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

/// How many `super::` reach the crate root from the file at `relative`: one per folder,
/// plus one unless it is a folder's `mod.rs`.
fn depth_of(relative: &Path) -> usize {
    let folders = relative.components().count() - 1;
    let is_mod = relative.file_name().is_some_and(|n| n == "mod.rs");
    folders + usize::from(!is_mod)
}

/// Whether `relative` (under a `src/`) is test-only.
fn is_test_file(relative: &Path) -> bool {
    relative.file_name().is_some_and(|n| n == "tests.rs")
        || relative.components().any(|c| c.as_os_str() == "tests")
}

/// Every file over [`MAX_LINES`], as a message naming it and its count.
fn too_long(files: &[(PathBuf, String)]) -> Vec<String> {
    files
        .iter()
        .filter(|(path, _)| !is_test_file(path))
        .filter_map(|(path, source)| {
            let lines = source.lines().count();
            (lines > MAX_LINES).then(|| {
                format!(
                    "{}: {lines} lines, over the {MAX_LINES}-line limit",
                    path.display()
                )
            })
        })
        .collect()
}

/// The top-level module a file under `src/` belongs to: `x.rs` and everything under
/// `x/` are `x`; `main.rs` is the crate root.
fn module_of(relative: &Path) -> String {
    let first = relative
        .components()
        .next()
        .and_then(|c| c.as_os_str().to_str())
        .unwrap_or_default();
    first.trim_end_matches(".rs").to_owned()
}

/// The modules the crate root declares (`mod x;`, `pub mod x;`, ...).
fn declared_modules(code: &str) -> BTreeSet<String> {
    code.lines()
        .filter_map(|line| {
            let mut line = line.trim();
            if let Some(rest) = line.strip_prefix("pub") {
                line = match rest.strip_prefix('(') {
                    Some(visibility) => visibility.split_once(')')?.1,
                    None => rest,
                }
                .trim_start();
            }
            let name = line.strip_prefix("mod ")?.strip_suffix(';')?.trim();
            Some(name.to_owned())
        })
        .collect()
}

/// Which top-level module names which, each edge with the first file that made it.
type Graph = BTreeMap<String, BTreeMap<String, PathBuf>>;

/// The module graph of a binary crate's files (paths relative to its `src/`). An edge
/// `a -> b` is a file of `a` naming `crate::b` (or `super::` up to the root, then `b`);
/// naming anything of the root that is not a module is an edge to the root, and the
/// root has an edge to every module it declares.
fn module_graph(files: &[(PathBuf, String)]) -> Graph {
    let modules: BTreeSet<String> = files
        .iter()
        .map(|(path, _)| module_of(path))
        .filter(|m| m != ROOT)
        .collect();
    let mut graph = Graph::new();
    for (path, source) in files {
        if is_test_file(path) {
            continue;
        }
        let from = module_of(path);
        let code = code_of(source);
        let mut named = named_modules(&code, depth_of(path));
        if from == ROOT {
            named.extend(declared_modules(&code));
        }
        for name in named {
            let to = match modules.contains(&name) {
                true => name,
                false => ROOT.to_owned(),
            };
            if to != from {
                graph
                    .entry(from.clone())
                    .or_default()
                    .entry(to)
                    .or_insert_with(|| path.clone());
            }
        }
    }
    graph
}

/// A circle in `graph` as the modules along it, the first repeated at the end; `None`
/// when the graph is acyclic.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        node: &str,
        graph: &Graph,
        done: &mut BTreeSet<String>,
        path: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        if let Some(at) = path.iter().position(|n| n == node) {
            let mut cycle = path[at..].to_vec();
            cycle.push(node.to_owned());
            return Some(cycle);
        }
        if done.contains(node) {
            return None;
        }
        path.push(node.to_owned());
        for next in graph.get(node).into_iter().flat_map(|edges| edges.keys()) {
            if let Some(cycle) = visit(next, graph, done, path) {
                return Some(cycle);
            }
        }
        path.pop();
        done.insert(node.to_owned());
        None
    }
    let mut done = BTreeSet::new();
    graph
        .keys()
        .find_map(|node| visit(node, graph, &mut done, &mut Vec::new()))
}

/// The failure message for a circle: the modules along it, then which file makes each
/// step.
fn describe_cycle(graph: &Graph, cycle: &[String]) -> String {
    let mut text = format!(
        "the binary crate's modules name each other in a circle: {}",
        cycle.join(" -> ")
    );
    for step in cycle.windows(2) {
        let file = graph[&step[0]][&step[1]].display();
        let named = match step[1] == ROOT {
            true => "an item of the crate root".to_owned(),
            false => format!("crate::{}", step[1]),
        };
        text.push_str(&format!(
            "\n  {} -> {}: {file} names {named}",
            step[0], step[1]
        ));
    }
    text
}

/// Every `.rs` file under `dir`, with paths relative to `dir`, in a stable order.
fn read_sources(dir: &Path) -> Vec<(PathBuf, String)> {
    fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
        for entry in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk(&path, out);
            } else if path.extension().is_some_and(|e| e == "rs") {
                out.push(path);
            }
        }
    }
    let mut paths = Vec::new();
    walk(dir, &mut paths);
    paths.sort();
    paths
        .into_iter()
        .map(|path| {
            let source = std::fs::read_to_string(&path).unwrap();
            (path.strip_prefix(dir).unwrap().to_owned(), source)
        })
        .collect()
}

fn workspace() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

#[test]
fn no_source_file_is_over_the_line_limit() {
    let mut found = Vec::new();
    for dir in SOURCE_DIRS {
        let files: Vec<_> = read_sources(&workspace().join(dir))
            .into_iter()
            .map(|(path, source)| (Path::new(dir).join(path), source))
            .collect();
        assert!(!files.is_empty(), "no sources under {dir}");
        found.extend(too_long(&files));
    }
    assert!(
        found.is_empty(),
        "files over {MAX_LINES} lines (split each by responsibility into submodules):\n{}",
        found.join("\n")
    );
}

#[test]
fn the_binary_crates_modules_name_each_other_in_no_circle() {
    let files = read_sources(&workspace().join("src"));
    let graph = module_graph(&files);
    assert!(
        graph.contains_key(ROOT) && graph.len() > 5,
        "read too little of src/: {graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("{}", describe_cycle(&graph, &cycle));
    }
}

fn fake(files: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
    files
        .iter()
        .map(|(path, source)| (PathBuf::from(path), (*source).to_owned()))
        .collect()
}

fn cycle_in(files: &[(&str, &str)]) -> Option<Vec<String>> {
    find_cycle(&module_graph(&fake(files)))
}

#[test]
fn the_line_limit_counts_every_line_and_spares_only_test_files() {
    let lines = |n: usize| "x\n".repeat(n);
    let (at_limit, over) = (lines(MAX_LINES), lines(MAX_LINES + 1));
    assert!(too_long(&fake(&[("src/a.rs", &at_limit)])).is_empty());
    let found = too_long(&fake(&[("src/a.rs", &over), ("src/b/c.rs", &over)]));
    assert_eq!(
        found,
        [
            "src/a.rs: 501 lines, over the 500-line limit",
            "src/b/c.rs: 501 lines, over the 500-line limit"
        ]
    );
    // Blank lines, comments and an inline tests block count like code.
    let padded = format!(
        "fn f() {{}}\n{}#[cfg(test)]\nmod tests {{}}\n",
        "\n// c\n".repeat(250)
    );
    assert_eq!(too_long(&fake(&[("src/a.rs", &padded)])).len(), 1);
    assert!(
        too_long(&fake(&[
            ("src/a/tests.rs", &over),
            ("src/a/tests/cases.rs", &over)
        ]))
        .is_empty()
    );
}

#[test]
fn the_cycle_finder_finds_a_circle_in_each_form_of_path() {
    let root = (
        "main.rs",
        "mod a;\npub mod b;\npub(crate) mod c;\nfn main() { a::run() }\n",
    );
    // A clean graph: the root above a, a above b and c, b above c.
    let clean = [
        root,
        ("a.rs", "use crate::{b, c::X};\n"),
        ("b/mod.rs", "use crate::c::Y;\nmod inner;\n"),
        (
            "b/inner.rs",
            "use super::super::c::Z;\nuse super::sibling;\n",
        ),
        ("c.rs", "pub struct X;\n"),
    ];
    assert_eq!(cycle_in(&clean), None);
    assert_eq!(
        declared_modules(root.1),
        BTreeSet::from(["a", "b", "c"].map(String::from))
    );
    let cycle = |files: &[(&str, &str)]| cycle_in(files).unwrap_or_else(|| panic!("{files:?}"));
    // Back up through a grouped `use`, a path in an expression, a nested file's `super::`.
    for (file, source) in [
        ("c.rs", "use crate::{x::Y, a};\n"),
        ("c.rs", "fn f() { crate::a::run(); }\n"),
        ("c.rs", "fn f() {\n    crate::\n        a::run();\n}\n"),
    ] {
        let mut files = clean.to_vec();
        files[4] = (file, source);
        let found = cycle(&files);
        assert_eq!(found.first(), found.last());
        assert!(
            found.contains(&"a".to_owned()) && found.contains(&"c".to_owned()),
            "{found:?}"
        );
    }
    let mut files = clean.to_vec();
    files[3] = ("b/inner.rs", "use super::super::a::X;\n");
    assert_eq!(cycle(&files), ["a", "b", "a"]);
    // Naming an item of the crate root is a circle through it.
    let mut files = clean.to_vec();
    files[4] = ("c.rs", "fn f() { crate::shutdown(); }\n");
    let found = cycle(&files);
    assert!(found.contains(&ROOT.to_owned()), "{found:?}");
    let graph = module_graph(&fake(&files));
    let text = describe_cycle(&graph, &found);
    assert!(
        text.contains("c -> main: c.rs names an item of the crate root"),
        "{text}"
    );
}

#[test]
fn the_cycle_finder_ignores_comments_strings_and_tests() {
    let files = [
        ("main.rs", "mod a;\nmod b;\n"),
        ("a.rs", "use crate::b;\n"),
        (
            "b.rs",
            "//! see [`crate::a`]\n/* crate::a */\nfn f() -> &'static str { \"crate::a\" } // crate::a\n\
             const R: &str = r#\"crate::a\"#;\n#[cfg(test)]\nmod tests {\n    use crate::a;\n}\n",
        ),
        ("b/tests.rs", "use crate::a;\n"),
        ("a/tests/cases.rs", "use crate::b;\n"),
    ];
    assert_eq!(cycle_in(&files), None);
    assert!(cycle_in(&[files[0], files[1], ("b.rs", "use crate::a;\n")]).is_some());
}
