//! Just enough of RFC 3986 for the guest's side: splitting an absolute URL into what
//! wasi:http asks for, and resolving a redirect's `Location`. Whether a URL is
//! acceptable is the executor's judgement, made on the URL as sent; nothing here
//! normalises hosts or percent-encoding, so the guest cannot disagree with it.

/// An absolute URL in the parts a request is made of; the fragment is dropped (it is
/// never sent).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Parts<'a> {
    pub scheme: &'a str,
    /// `host[:port]`, with userinfo if the URL has one (for the executor to refuse).
    pub authority: &'a str,
    /// Never empty: `/` when the URL has no path.
    pub path_and_query: &'a str,
}

/// Splits an absolute `scheme://authority/path?query#fragment` URL.
pub(crate) fn split(url: &str) -> Result<Parts<'_>, String> {
    let url = without_fragment(url.trim());
    let (scheme, rest) = scheme(url).ok_or("not an absolute URL (no scheme)")?;
    let rest = rest
        .strip_prefix("//")
        .ok_or("not a URL with a host (no `//` after the scheme)")?;
    let end = rest.find(['/', '?']).unwrap_or(rest.len());
    let (authority, path_and_query) = rest.split_at(end);
    if authority.is_empty() {
        return Err("no host".into());
    }
    let path_and_query = if path_and_query.is_empty() {
        "/"
    } else {
        path_and_query
    };
    Ok(Parts {
        scheme,
        authority,
        path_and_query,
    })
}

/// Resolves `location` (absolute, `//authority...`, `/path`, `?query` or a relative
/// path) against the URL that answered with it, as RFC 3986 section 5.2 does; the
/// result has no fragment.
pub(crate) fn resolve(base: &str, location: &str) -> Result<String, String> {
    let location = without_fragment(location.trim());
    if scheme(location).is_some() {
        return Ok(location.to_owned());
    }
    let base = split(base).map_err(|e| format!("the URL it answered is unusable: {e}"))?;
    if location.starts_with("//") {
        return Ok(format!("{}:{location}", base.scheme));
    }
    let origin = format!("{}://{}", base.scheme, base.authority);
    let (base_path, base_query) = split_query(base.path_and_query);
    let (path, query) = split_query(location);
    let path = if path.is_empty() {
        let query = query.or(base_query);
        return Ok(format!("{origin}{base_path}{}", with_mark(query)));
    } else if path.starts_with('/') {
        remove_dot_segments(path)
    } else {
        // Merge: the base path up to and including its last `/`.
        let dir = &base_path[..base_path.rfind('/').map_or(0, |i| i + 1)];
        remove_dot_segments(&format!("{dir}{path}"))
    };
    Ok(format!("{origin}{path}{}", with_mark(query)))
}

/// The scheme and what follows its `:`, if `url` starts with one.
fn scheme(url: &str) -> Option<(&str, &str)> {
    let (scheme, rest) = url.split_once(':')?;
    let mut chars = scheme.chars();
    let starts_alpha = chars.next().is_some_and(|c| c.is_ascii_alphabetic());
    let valid = chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'));
    (starts_alpha && valid).then_some((scheme, rest))
}

fn without_fragment(url: &str) -> &str {
    url.split_once('#').map_or(url, |(url, _)| url)
}

fn split_query(path_and_query: &str) -> (&str, Option<&str>) {
    match path_and_query.split_once('?') {
        Some((path, query)) => (path, Some(query)),
        None => (path_and_query, None),
    }
}

fn with_mark(query: Option<&str>) -> String {
    query.map(|q| format!("?{q}")).unwrap_or_default()
}

/// RFC 3986 section 5.2.4 over an absolute path: `.` and `..` segments go, a `..`
/// never climbs above the root.
fn remove_dot_segments(path: &str) -> String {
    let mut segments: Vec<&str> = Vec::new();
    let mut pieces = path.split('/').skip(1).peekable();
    while let Some(piece) = pieces.next() {
        let last = pieces.peek().is_none();
        match piece {
            "." | ".." => {
                if piece == ".." {
                    segments.pop();
                }
                // `/a/b/..` is the directory `/a/`, so a trailing dot keeps its slash.
                if last {
                    segments.push("");
                }
            }
            _ => segments.push(piece),
        }
    }
    format!("/{}", segments.join("/"))
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "http://a.example:8080/b/c/d;p?q#frag";

    #[test]
    fn splits_absolute_urls() {
        assert_eq!(
            split("https://api.example.com:8443/v1/items?x=1#top"),
            Ok(Parts {
                scheme: "https",
                authority: "api.example.com:8443",
                path_and_query: "/v1/items?x=1",
            })
        );
        assert_eq!(split("http://h").unwrap().path_and_query, "/");
        assert_eq!(split("http://h?q").unwrap().path_and_query, "?q");
        assert_eq!(split("http://u:p@h/").unwrap().authority, "u:p@h");
        assert_eq!(split("http://[::1]:80/x").unwrap().authority, "[::1]:80");
    }

    #[test]
    fn refuses_what_is_not_an_absolute_url_with_a_host() {
        for url in [
            "",
            "/path",
            "example.com/x",
            "mailto:a@b",
            "http:///x",
            "1http://h/",
        ] {
            assert!(split(url).is_err(), "{url:?}");
        }
    }

    #[test]
    fn absolute_locations_replace_the_url() {
        assert_eq!(
            resolve(BASE, "https://other.example/x?y#z"),
            Ok("https://other.example/x?y".into())
        );
        // Taken as given: refusing another scheme is the executor's business.
        assert_eq!(resolve(BASE, "ftp://f/x"), Ok("ftp://f/x".into()));
        assert_eq!(resolve(BASE, "  http://t/  "), Ok("http://t/".into()));
    }

    #[test]
    fn absolute_path_locations_keep_the_origin() {
        assert_eq!(resolve(BASE, "/g"), Ok("http://a.example:8080/g".into()));
        assert_eq!(
            resolve(BASE, "/g?y"),
            Ok("http://a.example:8080/g?y".into())
        );
        assert_eq!(
            resolve(BASE, "/x/../g/./h"),
            Ok("http://a.example:8080/g/h".into())
        );
        assert_eq!(
            resolve(BASE, "/../../g"),
            Ok("http://a.example:8080/g".into())
        );
        assert_eq!(resolve(BASE, "//other:1/g"), Ok("http://other:1/g".into()));
    }

    #[test]
    fn relative_locations_follow_rfc_3986_examples() {
        // RFC 3986 section 5.4.1, on the base `http://a/b/c/d;p?q`.
        let base = "http://a/b/c/d;p?q";
        for (location, expected) in [
            ("g", "http://a/b/c/g"),
            ("./g", "http://a/b/c/g"),
            ("g/", "http://a/b/c/g/"),
            ("?y", "http://a/b/c/d;p?y"),
            ("g?y", "http://a/b/c/g?y"),
            ("#s", "http://a/b/c/d;p?q"),
            ("", "http://a/b/c/d;p?q"),
            (".", "http://a/b/c/"),
            ("./", "http://a/b/c/"),
            ("..", "http://a/b/"),
            ("../", "http://a/b/"),
            ("../g", "http://a/b/g"),
            ("../..", "http://a/"),
            ("../../g", "http://a/g"),
            ("../../../g", "http://a/g"),
            ("g;x=1/../y", "http://a/b/c/y"),
        ] {
            assert_eq!(resolve(base, location), Ok(expected.into()), "{location:?}");
        }
    }

    #[test]
    fn a_base_without_a_path_resolves_from_the_root() {
        assert_eq!(resolve("http://h", "g"), Ok("http://h/g".into()));
        assert_eq!(resolve("http://h?q", "/g"), Ok("http://h/g".into()));
    }

    #[test]
    fn an_unusable_base_is_an_error() {
        assert!(resolve("not a url", "/g").is_err());
    }
}
