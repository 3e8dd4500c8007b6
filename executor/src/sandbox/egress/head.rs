//! The head of a guest's request as `http_send` takes it: UTF-8 JSON
//! `{"method":"GET","url":"http://..","headers":[["name","value"],..],"timeout_ms":1000}`.
//! Read through `serde_json::Value` rather than a derived type: only protocol types
//! derive serde, and this one's rules (unknown fields refused, each error naming the
//! field) read as well by hand.

use serde_json::Value;

/// Largest head taken: a head is a method, a URL and a few headers, and the JSON parser
/// must not be handed the whole of a guest's memory.
pub(super) const MAX_HEAD_BYTES: usize = 64 << 10;

#[derive(Debug, PartialEq, Eq)]
pub(super) struct Head {
    pub method: String,
    pub url: String,
    pub headers: Vec<(String, String)>,
    pub timeout_ms: Option<u64>,
}

/// The head, or why it is not one (the guest's `http_error` message).
pub(super) fn parse(bytes: &[u8]) -> Result<Head, String> {
    if bytes.len() > MAX_HEAD_BYTES {
        return Err(format!(
            "the request head is {} bytes, over the {MAX_HEAD_BYTES}-byte limit",
            bytes.len()
        ));
    }
    let value: Value =
        serde_json::from_slice(bytes).map_err(|e| format!("the request head is not JSON: {e}"))?;
    let Value::Object(fields) = value else {
        return Err("the request head is not a JSON object".into());
    };
    let (mut method, mut url, mut headers, mut timeout_ms) = (None, None, Vec::new(), None);
    for (key, value) in fields {
        match key.as_str() {
            "method" => method = Some(string(value, "method")?),
            "url" => url = Some(string(value, "url")?),
            "headers" => headers = pairs(value)?,
            "timeout_ms" => {
                let ms = value.as_u64();
                timeout_ms = Some(ms.ok_or("the request head's timeout_ms is not a whole number")?);
            }
            // A misspelt field would otherwise be a silent default (no timeout, say).
            other => return Err(format!("the request head has an unknown field {other:?}")),
        }
    }
    Ok(Head {
        method: method.ok_or("the request head has no method")?,
        url: url.ok_or("the request head has no url")?,
        headers,
        timeout_ms,
    })
}

fn string(value: Value, field: &str) -> Result<String, String> {
    match value {
        Value::String(s) => Ok(s),
        _ => Err(format!("the request head's {field} is not a string")),
    }
}

fn pairs(value: Value) -> Result<Vec<(String, String)>, String> {
    let not_pairs = || "the request head's headers are not [[name, value], ..] strings".to_owned();
    let Value::Array(items) = value else {
        return Err(not_pairs());
    };
    (items.into_iter())
        .map(|item| match item {
            Value::Array(pair) => match <[Value; 2]>::try_from(pair) {
                Ok([Value::String(name), Value::String(value)]) => Ok((name, value)),
                _ => Err(not_pairs()),
            },
            _ => Err(not_pairs()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_whole_head_is_read_and_optional_fields_may_be_left_out() {
        let head = parse(
            br#"{"method":"POST","url":"http://a/","headers":[["x-a","1"],["x-a","2"]],"timeout_ms":5}"#,
        )
        .unwrap();
        assert_eq!(head.method, "POST");
        assert_eq!(head.url, "http://a/");
        assert_eq!(
            head.headers,
            [("x-a".into(), "1".into()), ("x-a".into(), "2".into())]
        );
        assert_eq!(head.timeout_ms, Some(5));
        let bare = parse(br#"{"method":"GET","url":"http://a/"}"#).unwrap();
        assert_eq!((bare.headers.len(), bare.timeout_ms), (0, None));
    }

    #[test]
    fn a_bad_head_is_refused_naming_what_is_wrong() {
        for (head, names) in [
            (&b"GET http://a/"[..], "not JSON"),
            (b"[1]", "not a JSON object"),
            (br#"{"url":"http://a/"}"#, "no method"),
            (br#"{"method":"GET"}"#, "no url"),
            (
                br#"{"method":1,"url":"http://a/"}"#,
                "method is not a string",
            ),
            (
                br#"{"method":"GET","url":"http://a/","headers":[["a"]]}"#,
                "headers",
            ),
            (
                br#"{"method":"GET","url":"http://a/","headers":{"a":"b"}}"#,
                "headers",
            ),
            (
                br#"{"method":"GET","url":"http://a/","timeout_ms":-1}"#,
                "timeout_ms",
            ),
            (
                br#"{"method":"GET","url":"http://a/","timeout":1}"#,
                "unknown field \"timeout\"",
            ),
        ] {
            let why = parse(head).unwrap_err();
            assert!(why.contains(names), "{why:?} should name {names:?}");
        }
        let huge = vec![b' '; MAX_HEAD_BYTES + 1];
        assert!(parse(&huge).unwrap_err().contains("65536-byte limit"));
    }
}
