//! Reading Rust source as text for the architecture tests (`tests/architecture.rs`, the
//! workspace's line limit and module circles; `driver/tests/architecture.rs`, the
//! driver's layers): comments and literals out, `#[cfg(test)]` items out, the paths a
//! file names (`crate::`, `super::`, `self::` or a name, `use` groups opened), and the
//! top-level modules among them. One copy, which both tests include with `#[path]`
//! (neither is a library a test could depend on).

use std::collections::BTreeSet;

/// A file's code as the checks read it: comments gone, string and char literals
/// emptied (so neither a `//` in a URL nor a `crate::x` in a message counts), and every
/// `#[cfg(test)]` item left out (tests may reach anywhere to set a scene; doc links do
/// not make a dependency).
pub fn code_of(source: &str) -> String {
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

/// Where a path starts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// `crate::`
    Crate,
    /// `super::` this many times.
    Super(usize),
    /// `self::`
    Current,
    /// A name: a child module, a name a glob brought in, or another crate.
    Bare,
}

/// One path the code names, a `use` group opened into one per leaf.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedPath {
    pub start: Start,
    /// The names after the start (`{self}` adds none; a glob's path ends at what it globs).
    pub names: Vec<String>,
    /// `...::*`
    pub glob: bool,
    /// Whether it is (a leaf of) a `use` declaration.
    pub imported: bool,
    /// Whether that declaration is `pub` (of any reach): other modules may name it.
    pub reexported: bool,
    /// The name a `use` gives it (`as x`, else its last name).
    pub alias: Option<String>,
}

/// Every path in `code` (comments and literals already out) that starts with `crate::`,
/// `super::`, `self::` or a name followed by `::`, in order.
pub fn named_paths(code: &str) -> Vec<NamedPath> {
    let mut found = Vec::new();
    let mut k = 0;
    while k < code.len() {
        let rest = &code[k..];
        let boundary = !code[..k]
            .chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_' || c == ':' || c == '$');
        let (name, after_name) = ident(rest);
        if !boundary || name.is_empty() || rest.len() - after_name.len() != name.len() {
            k += rest.chars().next().map_or(1, char::len_utf8);
            continue;
        }
        let Some(start) = path_start(rest) else {
            k += name.len();
            continue;
        };
        let (start, tree_at) = start;
        let (imported, reexported) = use_before(&code[..k]);
        let mut leaves = Vec::new();
        let after = tree(tree_at, Vec::new(), &mut leaves);
        for (names, glob, renamed) in leaves {
            let alias = match (imported, glob) {
                (true, false) => renamed.or_else(|| names.last().cloned()),
                _ => None,
            };
            found.push(NamedPath {
                start,
                names,
                glob,
                imported,
                reexported,
                alias,
            });
        }
        k = code.len() - after.len();
    }
    found
}

/// The start of the path at the beginning of `s` and the text after its `::`, or `None`
/// when no path starts there (`pub(super)`, `super` alone, a name not followed by `::`).
fn path_start(s: &str) -> Option<(Start, &str)> {
    let (name, rest) = ident(s);
    match name {
        "crate" => Some((Start::Crate, double_colon(rest)?)),
        "self" => Some((Start::Current, double_colon(rest)?)),
        "super" => {
            // `super::super::x`: one step up each.
            let mut after = double_colon(rest)?;
            let mut ups = 1;
            loop {
                let (next, more) = ident(after);
                match double_colon(more) {
                    Some(more) if next == "super" => {
                        ups += 1;
                        after = more;
                    }
                    _ => break,
                }
            }
            Some((Start::Super(ups), after))
        }
        "Self" => None,
        _ => double_colon(rest).map(|_| (Start::Bare, s)),
    }
}

/// The text after a `::` at the start of `s`, unless it opens a turbofish (`f::<T>` is
/// not a path into `f`).
fn double_colon(s: &str) -> Option<&str> {
    let rest = s.trim_start().strip_prefix("::")?;
    (!rest.trim_start().starts_with('<')).then_some(rest)
}

/// Whether the code before a path ends with `use` (or `use ::`), so the path is
/// imported, and whether with a `pub` before it (`pub(crate)` and the like too).
fn use_before(before: &str) -> (bool, bool) {
    let word_ends = |s: &str| {
        !s.chars()
            .next_back()
            .is_some_and(|c| c.is_alphanumeric() || c == '_')
    };
    let before = before.trim_end();
    let before = before.strip_suffix("::").unwrap_or(before).trim_end();
    let Some(before) = before.strip_suffix("use").filter(|b| word_ends(b)) else {
        return (false, false);
    };
    let mut before = before.trim_end();
    if let Some(open) = before.strip_suffix(')').and_then(|b| b.rfind('(')) {
        before = before[..open].trim_end();
    }
    let public = before.strip_suffix("pub").is_some_and(word_ends);
    (true, public)
}

/// The leaves of the path or `use` tree at the start of `s`, each as the names to it
/// (after `prefix`), whether it is a glob and its `as` name; returns the text after it.
fn tree<'a>(
    mut s: &'a str,
    mut names: Vec<String>,
    out: &mut Vec<(Vec<String>, bool, Option<String>)>,
) -> &'a str {
    loop {
        s = s.trim_start();
        if let Some(mut group) = s.strip_prefix('{') {
            loop {
                group = group.trim_start();
                if let Some(rest) = group.strip_prefix(',') {
                    group = rest;
                } else if let Some(rest) = group.strip_prefix('}') {
                    return rest;
                } else if group.is_empty() {
                    return group;
                } else {
                    let before = group.len();
                    group = tree(group, names.clone(), out);
                    if group.len() == before {
                        // Not a path (a stray token): step over it.
                        group = &group[group.chars().next().map_or(0, char::len_utf8)..];
                    }
                }
            }
        }
        if let Some(rest) = s.strip_prefix('*') {
            out.push((names, true, None));
            return rest;
        }
        let (name, rest) = ident(s);
        if name.is_empty() {
            if !names.is_empty() {
                out.push((names, false, None));
            }
            return s;
        }
        let after = rest.trim_start();
        if let Some(more) = after.strip_prefix("::")
            && !more.trim_start().starts_with('<')
        {
            names.push(name.to_owned());
            s = more;
            continue;
        }
        let (renamed, rest) = match after.strip_prefix("as") {
            Some(r) if r.starts_with(char::is_whitespace) => {
                let (alias, r) = ident(r);
                (Some(alias.to_owned()), r)
            }
            _ => (None, rest),
        };
        if name != "self" {
            names.push(name.to_owned());
        }
        out.push((names, false, renamed));
        return rest;
    }
}

/// The top-level modules that code in a file at `depth` (how many `super::` reach the
/// crate root from it) names, through `crate::` or enough `super::`, with groups
/// opened.
#[allow(
    dead_code,
    reason = "driver/tests/architecture.rs's layers; tests/architecture.rs resolves whole paths"
)]
pub fn named_modules(code: &str, depth: usize) -> BTreeSet<String> {
    named_paths(code)
        .into_iter()
        .filter(|path| match path.start {
            Start::Crate => true,
            Start::Super(ups) => ups >= depth,
            Start::Current | Start::Bare => false,
        })
        .filter_map(|path| path.names.into_iter().next())
        .collect()
}
