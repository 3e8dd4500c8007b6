//! Reading Rust source as text for the architecture tests (`tests/architecture.rs`, the
//! workspace's line limit and module circles; `driver/tests/architecture.rs`, the
//! driver's layers): comments and literals out, `#[cfg(test)]` items out, and the
//! top-level modules a file names through `crate::` and `super::` paths. One copy, which
//! both tests include with `#[path]` (neither is a library a test could depend on).

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
pub fn named_modules(code: &str, depth: usize) -> BTreeSet<String> {
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
