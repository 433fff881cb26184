//! Command output on stdout. A reader that went away (`gaffer call … | head -c1`) is not an
//! error worth a panic: the rest of the output is dropped and the command ends as usual.
//!
//! JSON is printed only through [`json`] and [`json_line`]: the agent chooses much of what
//! gaffer prints (argvs, paths, worker output, journal payloads), and `serde_json` leaves
//! everything past U+001F raw, so a C1 CSI (U+009B), a bidi override or a run of Hangul
//! fillers would reach the terminal and rewrite, reorder or pad away what the operator reads.

use std::io::Write;

use serde::Serialize;

/// Writes one line to stdout; a broken pipe is ignored, other failures are logged.
pub fn line(text: std::fmt::Arguments<'_>) {
    let mut out = std::io::stdout().lock();
    match writeln!(out, "{text}").and_then(|()| out.flush()) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => {}
        Err(e) => tracing::warn!(error = %e, "stdout write failed"),
    }
}

/// `println!` for command output, quiet on a broken pipe.
#[macro_export]
macro_rules! outln {
    ($($t:tt)*) => {
        $crate::cli::output::line(format_args!($($t)*))
    };
}

/// `v` as indented JSON for a terminal: every [`crate::util::hidden`] character is a `\uXXXX`
/// escape, so the text parses to the same value and the terminal obeys none of it.
pub fn json<T: Serialize + ?Sized>(v: &T) -> String {
    for_terminal(serde_json::to_string_pretty(v))
}

/// [`json`] on one line (JSON lines, error objects).
pub fn json_line<T: Serialize + ?Sized>(v: &T) -> String {
    for_terminal(serde_json::to_string(v))
}

/// The encoded text made safe for a terminal. What gaffer prints always encodes (string
/// keys only); were it not to, the output says so instead of being empty.
fn for_terminal(encoded: serde_json::Result<String>) -> String {
    match encoded {
        Ok(text) => escape_hidden(&text),
        Err(e) => {
            serde_json::json!({ "error": format!("cannot encode the output: {e}") }).to_string()
        }
    }
}

/// `text` (valid JSON) with every hidden character outside JSON's layout written as `\uXXXX`
/// (UTF-16 surrogate pairs above U+FFFF). A raw control character in valid JSON can only be
/// layout between tokens (inside a string JSON requires it escaped, and `serde_json` does),
/// and anything else hidden can only be inside a string, where its escape is the same text.
fn escape_hidden(text: &str) -> String {
    let escaped = |c: char| crate::util::hidden(c) && !matches!(c, '\n' | '\r' | '\t');
    if !text.chars().any(escaped) {
        return text.to_string();
    }
    let mut out = String::with_capacity(text.len() + 32);
    for c in text.chars() {
        if escaped(c) {
            for unit in c.encode_utf16(&mut [0; 2]) {
                out.push_str(&format!("\\u{unit:04x}"));
            }
        } else {
            out.push(c);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Value, json};

    const ATTACK: &str = "echo evil > PWNED # \u{9b}30Dmake test\u{9b}K";

    #[test]
    fn hidden_characters_are_escapes_and_the_value_is_unchanged() {
        let v = json!({
            "argv": ["bash", "-c", ATTACK],
            "more": "\u{7f}\u{85}\u{202e}\u{2028}\u{2029}\u{3164}\u{fe0f}\u{e0101}\u{1d173}",
            "kept": "tab\tnewline\n héllo 世界 😀",
            "key\u{9b}": 1,
        });
        for text in [json(&v), json_line(&v)] {
            assert!(
                !text.chars().any(|c| crate::util::hidden(c) && c != '\n'),
                "{text:?}"
            );
            assert!(text.contains("\\u009b30Dmake test\\u009bK"), "{text}");
            assert!(
                text.contains("\\udb40\\udd01"),
                "above U+FFFF: a surrogate pair: {text}"
            );
            assert!(
                text.contains("héllo 世界 😀"),
                "ordinary text stays: {text}"
            );
            let back: Value = serde_json::from_str(&text).unwrap();
            assert_eq!(back, v);
        }
    }

    #[test]
    fn pretty_output_keeps_its_layout_and_clean_text_is_as_serde_json_writes_it() {
        let v = json!({"a": [1, "x"], "b": {"c": null}});
        assert_eq!(json(&v), serde_json::to_string_pretty(&v).unwrap());
        assert_eq!(json_line(&v), v.to_string());
    }

    #[test]
    fn what_does_not_encode_says_so() {
        let m = std::collections::BTreeMap::from([((1, 2), "non-string key")]);
        let v: Value = serde_json::from_str(&json(&m)).unwrap();
        assert!(
            v["error"].as_str().unwrap().contains("cannot encode"),
            "{v}"
        );
    }
}
