//! The circle check: a crate's modules, the paths each file names resolved from the
//! crate root, and for every parent module the graph of which of its modules names
//! which. A binary's root (`main.rs`) only dispatches, so a module naming an item of it
//! is in a circle with it; any other module's own file (a `mod.rs`, a library's
//! `lib.rs`) is the whole its modules are parts of, and they may use its items.
//!
//! Every path outside comments and string literals counts (`crate::`, `super::`,
//! `self::`, in `use` lists, grouped or not, and in expressions), as does a name a glob
//! (`use super::*`) brought in; a name a module re-exports (`pub use b::X` in a `mod.rs`)
//! counts as what it re-exports, so a circle cannot hide behind a re-export.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::is_test_file;
use super::source_text::{NamedPath, Start, code_of, named_paths};

/// A binary crate's root: it declares and dispatches to every module, so naming it
/// from one of them (`crate::some_fn` of `main.rs`) is itself a circle.
pub const ROOT: &str = "main";

/// A module's path from its crate's root: `[]` for the root, `["bench", "scale"]` for
/// `bench/scale.rs` (or `bench/scale/mod.rs`).
type ModPath = Vec<String>;

fn module_path(relative: &Path) -> ModPath {
    let mut names: ModPath = relative
        .components()
        .map(|c| c.as_os_str().to_string_lossy().into_owned())
        .collect();
    let file = names.pop().unwrap_or_default();
    match file.trim_end_matches(".rs") {
        "mod" => {}
        "main" | "lib" if names.is_empty() => {}
        name => names.push(name.to_owned()),
    }
    names
}

/// The modules the crate root declares (`mod x;`, `pub mod x;`, ...).
pub fn declared_modules(code: &str) -> BTreeSet<String> {
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

/// Which module names which among the modules of one parent, each edge with the first
/// file that made it.
pub type Graph = BTreeMap<String, BTreeMap<String, PathBuf>>;

/// A crate's sources as the circle check reads them.
pub struct Crate {
    /// Each non-test file: its path, its module and the paths it names.
    files: Vec<(PathBuf, ModPath, Vec<NamedPath>)>,
    modules: BTreeSet<ModPath>,
    /// What each module's `pub use` declarations bring in, by the name each gives it.
    imports: BTreeMap<(ModPath, String), ModPath>,
    /// The modules each module globs (`use x::*`).
    globs: BTreeMap<ModPath, Vec<ModPath>>,
    /// The root is a binary's `main.rs`, or the `lib.rs` of a package whose binaries
    /// only call it: these are the modules it dispatches to.
    dispatches_to: Option<BTreeSet<String>>,
}

impl Crate {
    /// The crate of `files` (paths relative to its `src/`; `bin/`, other binaries'
    /// roots, is left out).
    pub fn read(files: &[(PathBuf, String)]) -> Crate {
        let files: Vec<_> = files
            .iter()
            .filter(|(path, _)| !path.starts_with("bin"))
            .collect();
        let binary = files.iter().any(|(path, _)| path.as_os_str() == "main.rs");
        let mut krate = Crate {
            files: Vec::new(),
            modules: files.iter().map(|(path, _)| module_path(path)).collect(),
            imports: BTreeMap::new(),
            globs: BTreeMap::new(),
            dispatches_to: None,
        };
        for (path, source) in files.iter().filter(|(path, _)| !is_test_file(path)) {
            let code = code_of(source);
            if binary && (path.as_os_str() == "main.rs" || path.as_os_str() == "lib.rs") {
                let dispatches_to = krate.dispatches_to.get_or_insert_default();
                dispatches_to.extend(declared_modules(&code));
            }
            krate
                .files
                .push((path.clone(), module_path(path), named_paths(&code)));
        }
        // Globs first: a bare name may be one a glob brought in.
        let mut globs = BTreeMap::<ModPath, Vec<ModPath>>::new();
        let mut imports = BTreeMap::new();
        for (_, from, paths) in &krate.files {
            for path in paths.iter().filter(|p| p.imported) {
                let Some(to) = krate.absolute(from, path) else {
                    continue;
                };
                match &path.alias {
                    _ if path.glob => globs.entry(from.clone()).or_default().push(to),
                    Some(alias) if alias != "_" && path.reexported => {
                        imports.insert((from.clone(), alias.clone()), to);
                    }
                    _ => {}
                }
            }
        }
        krate.globs = globs;
        krate.imports = imports;
        krate
    }

    /// `path`, named in module `from`, from the crate root; `None` when it is another
    /// crate's (or a name of the language's).
    fn absolute(&self, from: &[String], path: &NamedPath) -> Option<ModPath> {
        let joined = |base: &[String]| [base, &path.names[..]].concat();
        match path.start {
            Start::Crate => Some(path.names.clone()),
            Start::Current => Some(joined(from)),
            Start::Super(ups) => Some(joined(from.get(..from.len().checked_sub(ups)?)?)),
            Start::Bare => {
                let first = path.names.first()?;
                let child = |base: &[String]| {
                    let mut module = base.to_vec();
                    module.push(first.clone());
                    self.modules.contains(&module)
                };
                if child(from) {
                    return Some(joined(from));
                }
                let globbed = self.globs.get(from)?.iter().find(|g| child(g))?;
                Some(joined(globbed))
            }
        }
    }

    /// `path` with each name a module imports replaced by what it imports, so that
    /// `super::X` of a `pub use b::X` names `b`.
    fn canonical(&self, mut path: ModPath) -> ModPath {
        // An import of an import, and so on: no crate here goes this deep.
        for _ in 0..16 {
            let Some(module) = (0..path.len())
                .rev()
                .find(|&n| self.modules.contains(&path[..n]))
            else {
                break;
            };
            let key = (path[..module].to_vec(), path[module].clone());
            match self.imports.get(&key) {
                Some(target) if *target != path[..=module] => {
                    path = [&target[..], &path[module + 1..]].concat();
                }
                _ => break,
            }
        }
        path
    }

    /// The graph of each parent's modules, by the parent's path. An edge `a -> b` is a
    /// file of `a` (or under it) naming `b` or anything under it; naming an item of a
    /// binary's root is an edge to [`ROOT`], which has one to every module it declares.
    pub fn graphs(&self) -> BTreeMap<ModPath, Graph> {
        let mut graphs = BTreeMap::<ModPath, Graph>::new();
        let mut edge = |parent: &[String], from: &str, to: &str, file: &Path| {
            graphs
                .entry(parent.to_vec())
                .or_default()
                .entry(from.to_owned())
                .or_default()
                .entry(to.to_owned())
                .or_insert_with(|| file.to_owned());
        };
        if let (Some(modules), Some((root_file, _, _))) = (
            &self.dispatches_to,
            self.files.iter().find(|(_, m, _)| m.is_empty()),
        ) {
            for module in modules {
                edge(&[], ROOT, module, root_file);
            }
        }
        for (file, from, paths) in &self.files {
            for path in paths {
                let Some(to) = self.absolute(from, path) else {
                    continue;
                };
                let to = self.canonical(to);
                let shared = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
                // Inside its own module, or naming one it is part of.
                if shared == from.len() || shared == to.len() {
                    continue;
                }
                let parent = &from[..shared];
                if self.modules.contains(&to[..=shared]) {
                    edge(parent, &from[shared], &to[shared], file);
                } else if parent.is_empty() && self.dispatches_to.is_some() {
                    edge(parent, &from[shared], ROOT, file);
                }
            }
        }
        graphs
    }
}

/// A circle in `graph` as the modules along it, the first repeated at the end; `None`
/// when the graph is acyclic.
pub fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
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

/// The failure message for a circle among the modules of `parent`: the modules along
/// it, then which file makes each step.
pub fn describe_cycle(parent: &[String], graph: &Graph, cycle: &[String]) -> String {
    let module = |name: &str| {
        ["crate"]
            .into_iter()
            .chain(parent.iter().map(String::as_str))
            .chain([name])
            .collect::<Vec<_>>()
            .join("::")
    };
    let mut text = format!(
        "the modules of {} name each other in a circle: {}",
        module("").trim_end_matches("::"),
        cycle.join(" -> ")
    );
    for step in cycle.windows(2) {
        let file = graph[&step[0]][&step[1]].display();
        let named = match step[1] == ROOT {
            true => "an item of the crate root".to_owned(),
            false => module(&step[1]),
        };
        text.push_str(&format!(
            "\n  {} -> {}: {file} names {named}",
            step[0], step[1]
        ));
    }
    text
}

#[cfg(test)]
mod tests {
    use super::super::{cycle_in, fake};
    use super::*;

    /// `bench/scale.rs` and `bench/tenants.rs` named each other; the top-level check never
    /// looked below `bench`.
    #[test]
    fn the_cycle_finder_finds_a_circle_between_the_modules_of_any_parent() {
        let clean = [
            ("main.rs", "mod bench;\nfn main() { bench::run() }\n"),
            (
                "bench/mod.rs",
                "mod args;\nmod scale;\nmod tenants;\npub use args::Args;\nconst NOOP: u8 = 0;\n\
                 pub fn run() { scale::run(); tenants::run() }\n",
            ),
            ("bench/args.rs", "pub struct Args;\n"),
            // An item of the parent's own file, and one it re-exports from a sibling.
            (
                "bench/scale.rs",
                "use super::{Args, NOOP};\npub fn run() {}\n",
            ),
            ("bench/tenants.rs", "use super::scale::spawn;\n"),
        ];
        assert_eq!(cycle_in(&clean), None);
        let graphs = Crate::read(&fake(&clean)).graphs();
        assert!(graphs[&vec!["bench".to_owned()]]["scale"].contains_key("args"));
        // Back from scale to tenants: by `super::`, `crate::`, a renamed import, a glob, a
        // re-export of the parent's, and from a module below scale.
        let (scale_mod, inner) = ("bench/scale/mod.rs", "bench/scale/inner.rs");
        for extra in [
            [
                ("bench/scale.rs", "fn f() { super::tenants::run() }\n"),
                ("", ""),
            ],
            [("bench/scale.rs", "use crate::bench::tenants;\n"), ("", "")],
            [
                ("bench/scale.rs", "use super::tenants as other;\n"),
                ("", ""),
            ],
            [
                (
                    "bench/scale.rs",
                    "use super::*;\nfn f() { tenants::run() }\n",
                ),
                ("", ""),
            ],
            [
                ("bench/scale.rs", "use super::report;\n"),
                (
                    "bench/mod.rs",
                    "mod scale;\nmod tenants;\npub use tenants::report;\n",
                ),
            ],
            [
                (scale_mod, "mod inner;\n"),
                (inner, "use super::super::tenants::X;\n"),
            ],
        ] {
            let mut files: Vec<_> = clean
                .iter()
                .filter(|(path, _)| !extra.iter().any(|(e, _)| e == path))
                .filter(|(path, _)| !(extra[0].0 == scale_mod && *path == "bench/scale.rs"))
                .copied()
                .collect();
            files.extend(extra.into_iter().filter(|(path, _)| !path.is_empty()));
            let graphs = Crate::read(&fake(&files)).graphs();
            let bench = vec!["bench".to_owned()];
            let found = find_cycle(&graphs[&bench]).unwrap_or_else(|| panic!("{files:?}"));
            assert_eq!(found, ["scale", "tenants", "scale"], "{files:?}");
            let text = describe_cycle(&bench, &graphs[&bench], &found);
            assert!(
                text.contains("the modules of crate::bench name each other")
                    && text
                        .contains("tenants -> scale: bench/tenants.rs names crate::bench::scale"),
                "{text}"
            );
        }
    }

    #[test]
    fn a_library_root_is_the_whole_its_modules_are_parts_of() {
        let lib = (
            "lib.rs",
            "mod a;\nmod b;\npub struct Cache;\nfn f() { a::g(); b::h(); }\n",
        );
        let files = [
            lib,
            ("a.rs", "use crate::Cache;\npub fn g() {}\n"),
            ("b.rs", "use crate::{Cache, a::g};\n"),
        ];
        assert_eq!(cycle_in(&files), None);
        // A binary's root only dispatches: naming its items is a circle through it.
        let main = [("main.rs", lib.1), files[1], files[2]];
        assert_eq!(
            cycle_in(&main),
            Some(vec!["a".into(), ROOT.into(), "a".into()])
        );
        // A name the root re-exports is the module's it comes from.
        let reexported = [
            ("lib.rs", "mod a;\nmod b;\npub use b::H;\n"),
            ("a.rs", "use crate::H;\n"),
            ("b.rs", "use crate::a::g;\n"),
        ];
        assert_eq!(
            cycle_in(&reexported),
            Some(vec!["a".into(), "b".into(), "a".into()])
        );
    }

    #[test]
    fn a_name_that_is_no_module_of_the_crate_is_another_crates() {
        let files = [
            ("lib.rs", "mod a;\nmod b;\n"),
            ("a.rs", "use crate::b::X;\n"),
            // `a` here is a crate of that name (or nothing): `b` has no module `a`, and no
            // glob brought one in.
            (
                "b.rs",
                "use a::Y;\nfn f() { a::g(); std::mem::take(&mut 1); }\n",
            ),
            // A module's own modules, by `self::` or by name, are inside it.
            ("b/c.rs", "use self::d::Z;\nfn f() { d::g() }\nmod d;\n"),
        ];
        assert_eq!(cycle_in(&files), None);
    }
}
