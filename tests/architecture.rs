//! The workspace's shape, kept by a test: no source file grows past [`MAX_LINES`]
//! (a file that long holds more than one responsibility: split it by what it does, not
//! by where line 500 falls), and no modules anywhere name each other in a circle
//! ([`circles`]: in every crate, at every level, so that each module can be read, and
//! changed, from the modules it names downward). And the package's tests stay two
//! binaries: this one, and every end-to-end scenario as a module of `tests/e2e/main.rs`
//! (each test binary is one more link of every dependency it uses), with no file there
//! left undeclared (it would never be compiled, so its tests never run).
//!
//! Like `driver/tests/architecture.rs`, this reads source text, not the compiler's view.
//! Test-only files (`tests.rs`, anything under a `tests/` folder) are left out of both
//! checks, and `#[cfg(test)]` items out of the circle check: tests may reach anywhere to
//! set a scene, and a long test file is a list of cases, not a tangle of
//! responsibilities. An inline test module still counts towards its file's lines.

use std::collections::BTreeSet;
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

#[path = "architecture/circles.rs"]
mod circles;
mod source_text;
use source_text::code_of;

use circles::{Crate, ROOT, declared_modules, describe_cycle, find_cycle};

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
    let graph = Crate::read(&files)
        .graphs()
        .remove(&Vec::new())
        .unwrap_or_default();
    assert!(
        graph.contains_key(ROOT) && graph.len() > 5,
        "read too little of src/: {graph:?}"
    );
    if let Some(cycle) = find_cycle(&graph) {
        panic!("{}", describe_cycle(&[], &graph, &cycle));
    }
}

#[test]
fn no_modules_anywhere_name_each_other_in_a_circle() {
    let mut found = Vec::new();
    let mut levels = 0;
    for dir in SOURCE_DIRS {
        let graphs = Crate::read(&read_sources(&workspace().join(dir))).graphs();
        levels += graphs.len();
        for (parent, graph) in graphs {
            if let Some(cycle) = find_cycle(&graph) {
                found.push(format!(
                    "{dir}: {}",
                    describe_cycle(&parent, &graph, &cycle)
                ));
            }
        }
    }
    assert!(
        levels >= 10,
        "read too few modules whose modules name each other: {levels}"
    );
    assert!(
        found.is_empty(),
        "move what both sides of each circle need to a module both may name:\n{}",
        found.join("\n")
    );
}

fn fake(files: &[(&str, &str)]) -> Vec<(PathBuf, String)> {
    files
        .iter()
        .map(|(path, source)| (PathBuf::from(path), (*source).to_owned()))
        .collect()
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

fn cycle_in(files: &[(&str, &str)]) -> Option<Vec<String>> {
    Crate::read(&fake(files))
        .graphs()
        .values()
        .find_map(find_cycle)
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
    let graph = Crate::read(&fake(&files))
        .graphs()
        .remove(&Vec::new())
        .unwrap();
    let text = describe_cycle(&[], &graph, &found);
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

/// The test binaries cargo makes of `tests/`: a `.rs` file directly in it, or a folder
/// with a `main.rs`; given as `architecture.rs` and `e2e/`.
const TEST_BINARIES: &[&str] = &["architecture.rs", "e2e/"];

/// The test binaries cargo would make of the folder `tests`, named as in [`TEST_BINARIES`],
/// sorted.
fn test_binaries(tests: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(tests)
        .unwrap_or_else(|e| panic!("{}: {e}", tests.display()))
        .map(|entry| entry.unwrap().path())
        .filter_map(|path| {
            let name = path.file_name()?.to_str()?.to_owned();
            match path.is_dir() {
                true => path.join("main.rs").is_file().then(|| format!("{name}/")),
                false => name.ends_with(".rs").then_some(name),
            }
        })
        .collect();
    found.sort();
    found
}

/// The module files under `dir` that the module file `root` (and, below it, each module
/// it declares) does not declare: `x.rs` or `x/mod.rs` beside a root that has no `mod x;`.
fn undeclared_modules(dir: &Path, root: &Path) -> Vec<PathBuf> {
    let source =
        std::fs::read_to_string(root).unwrap_or_else(|e| panic!("{}: {e}", root.display()));
    let declared = declared_modules(&code_of(&source));
    let mut found = Vec::new();
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|entry| entry.unwrap().path())
        .collect();
    entries.sort();
    for path in entries {
        let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let (module, file, below) = match path.is_dir() {
            true => (name, path.join("mod.rs"), path.clone()),
            false => match name.strip_suffix(".rs") {
                Some(module) => (module, path.clone(), dir.join(module)),
                None => continue,
            },
        };
        if !file.is_file() || file == root {
            continue;
        }
        if !declared.contains(module) {
            found.push(file);
        } else if below.is_dir() {
            found.extend(undeclared_modules(&below, &file));
        }
    }
    found
}

#[test]
fn the_end_to_end_tests_are_one_binary_that_declares_every_file_under_it() {
    let tests = workspace().join("tests");
    assert_eq!(
        test_binaries(&tests),
        TEST_BINARIES,
        "a test binary beside tests/e2e/ is one more link of its dependencies: make the \
         scenario a module of tests/e2e/main.rs (its helpers in tests/e2e/common/)"
    );
    let e2e = tests.join("e2e");
    let undeclared = undeclared_modules(&e2e, &e2e.join("main.rs"));
    assert!(
        undeclared.is_empty(),
        "files under tests/e2e/ that no module declares, so their tests never run: {undeclared:?}"
    );
}

#[test]
fn an_undeclared_module_file_is_found_at_any_depth() {
    let dir = tempfile::tempdir().unwrap();
    let write = |path: &str, text: &str| {
        let path = dir.path().join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, text).unwrap();
    };
    write("main.rs", "mod a;\nmod common;\n// mod c;\n");
    write("a.rs", "#[test]\nfn t() {}\n");
    write("common/mod.rs", "pub mod x;\n");
    write("common/x.rs", "");
    write("common/y.rs", "");
    write("c.rs", "");
    write("wat/probe.wat", "(module)");
    let found = undeclared_modules(dir.path(), &dir.path().join("main.rs"));
    assert_eq!(
        found,
        [dir.path().join("c.rs"), dir.path().join("common/y.rs")]
    );
    write("common/y.rs.orig", "");
    write("main.rs", "mod a;\nmod c;\npub(crate) mod common;\n");
    write("common/mod.rs", "pub mod x;\npub mod y;\n");
    assert!(undeclared_modules(dir.path(), &dir.path().join("main.rs")).is_empty());
    assert_eq!(test_binaries(dir.path()), ["a.rs", "c.rs", "main.rs"]);
}
