//! Secret values gaffer injects into the processes it starts, and the scrubber that keeps them
//! out of everything written or sent: the exact value and its common encodings (base64 at every
//! byte alignment, standard and URL-safe; hex either case; URL-encoded) become `[secret:NAME]`.

use crate::bundles::{Declaration, DeclarationKind};
use crate::util::{base64url, hex};

/// Values shorter than this are not scrubbed inside encodings (too many false hits); the exact
/// value still is.
const MIN_ENCODED: usize = 6;

/// One injected secret: its declaration name, the variable it is passed as, and its value.
#[derive(Clone)]
pub struct Secret {
    pub name: String,
    pub env: String,
    pub value: String,
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} as {})", self.name, self.env)
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("secret `{name}` is not an env: reference, the only kind gaffer can provide")]
    UnsupportedReference { name: String },
    #[error("secret `{name}` refers to environment variable {env}, which is not set for gaffer")]
    Unset { name: String, env: String },
}

/// What the bundle's secret declarations hand over, sorted (what a plan and a rule name): the
/// environment variable each reads (its reference, were it not `env:`), never the label the
/// bundle gives it, which the agent chooses: a secret labelled as an allowed one must not
/// bring another variable with it.
pub fn names(decls: &[Declaration]) -> Vec<String> {
    let mut v: Vec<String> = decls
        .iter()
        .filter(|d| d.kind == DeclarationKind::SecretRef)
        .map(|d| d.env_var().unwrap_or(&d.reference).to_string())
        .collect();
    v.sort();
    v.dedup();
    v
}

/// Reads each declared `env:NAME` secret from gaffer's own environment.
pub fn resolve(decls: &[Declaration]) -> Result<Vec<Secret>, SecretError> {
    let mut out = Vec::new();
    for d in decls
        .iter()
        .filter(|d| d.kind == DeclarationKind::SecretRef)
    {
        let Some(env) = d.env_var() else {
            return Err(SecretError::UnsupportedReference {
                name: d.name.clone(),
            });
        };
        let value = std::env::var(env).map_err(|_| SecretError::Unset {
            name: d.name.clone(),
            env: env.to_string(),
        })?;
        out.push(Secret {
            name: d.name.clone(),
            env: env.to_string(),
            value,
        });
    }
    Ok(out)
}

/// Replaces secret values (and their encodings) in text. Patterns are tried longest first.
#[derive(Clone, Default)]
pub struct Scrubber {
    patterns: Vec<(String, String)>,
}

impl std::fmt::Debug for Scrubber {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Scrubber({} patterns)", self.patterns.len())
    }
}

impl Scrubber {
    pub fn new(secrets: &[Secret]) -> Scrubber {
        let mut patterns = Vec::new();
        for s in secrets.iter().filter(|s| !s.value.is_empty()) {
            let mark = format!("[secret:{}]", s.name);
            for p in encodings(s.value.as_bytes()) {
                patterns.push((p, mark.clone()));
            }
            patterns.push((s.value.clone(), mark));
        }
        patterns.sort_by(|a, b| b.0.len().cmp(&a.0.len()).then(a.0.cmp(&b.0)));
        patterns.dedup_by(|a, b| a.0 == b.0);
        Scrubber { patterns }
    }

    pub fn is_empty(&self) -> bool {
        self.patterns.is_empty()
    }

    /// Scrubs a whole text: each pattern as it is, then as a wrapping encoder (`base64`,
    /// `xxd -p`, `fold`) splits it over lines, wherever the breaks fall.
    pub fn scrub(&self, text: &str) -> String {
        let mut out = text.to_string();
        for (p, mark) in &self.patterns {
            if out.contains(p.as_str()) {
                out = out.replace(p.as_str(), mark);
            }
        }
        if !out.bytes().any(is_wrap) {
            return out;
        }
        // Folded once, and again only after a replacement changed the text.
        let mut folded = Folded::of(&out);
        for (p, mark) in self.wrappable() {
            if folded.text.contains(p.as_str()) {
                out = replace_wrapped(&out, &folded, p, mark);
                folded = Folded::of(&out);
            }
        }
        out
    }

    /// Patterns a wrapping encoder may split: those without line breaks of their own, and long
    /// enough that joining two lines makes one only by design (a value of a few characters
    /// would be found across any line break).
    fn wrappable(&self) -> impl Iterator<Item = &(String, String)> {
        self.patterns
            .iter()
            .filter(|(p, _)| p.len() >= MIN_ENCODED && !p.bytes().any(is_wrap))
    }

    /// Length of the longest suffix of `text` that could be the start of a pattern, line
    /// breaks inside it included: a stream holds that much back until more output (or its
    /// end) shows what it is.
    pub fn partial_tail(&self, text: &str) -> usize {
        // As the text is (a pattern may hold line breaks: a PEM key), and with single line
        // breaks taken out (an encoder's wrapping): the longer hold wins.
        let raw = longest_prefix_suffix(self.patterns.iter(), text);
        let folded = Folded::of(text);
        let flat = longest_prefix_suffix(self.wrappable(), &folded.text);
        if flat == 0 {
            return raw;
        }
        raw.max(text.len() - folded.at[folded.text.len() - flat])
    }
}

/// Length of the longest suffix of `text` that is a proper prefix of one of `patterns`.
fn longest_prefix_suffix<'a>(
    patterns: impl Iterator<Item = &'a (String, String)>,
    text: &str,
) -> usize {
    let mut best = 0;
    for (p, _) in patterns {
        let max = p.len().saturating_sub(1).min(text.len());
        for n in (best + 1..=max).rev() {
            let start = text.len() - n;
            if text.is_char_boundary(start) && p.starts_with(&text[start..]) {
                best = n;
                break;
            }
        }
    }
    best
}

/// A line break an encoder wraps its output with.
fn is_wrap(b: u8) -> bool {
    b == b'\n' || b == b'\r'
}

/// A text without its single line breaks (`\n`, `\r\n`, `\r`: how encoders wrap), and where
/// each of its bytes was. Blank lines stay: no encoder puts one inside a value, so nothing is
/// joined across them and a stream never holds back a run of them.
struct Folded {
    text: String,
    at: Vec<usize>,
}

impl Folded {
    fn of(text: &str) -> Folded {
        let bytes = text.as_bytes();
        let mut flat = Vec::with_capacity(text.len());
        let mut at = Vec::with_capacity(text.len());
        let mut i = 0;
        while i < bytes.len() {
            let brk = match (bytes[i], bytes.get(i + 1)) {
                (b'\r', Some(b'\n')) => 2,
                (b'\n' | b'\r', _) => 1,
                _ => 0,
            };
            let single = brk > 0
                && (i == 0 || !is_wrap(bytes[i - 1]))
                && bytes.get(i + brk).is_none_or(|b| !is_wrap(*b));
            if single {
                i += brk;
                continue;
            }
            let n = brk.max(1);
            flat.extend_from_slice(&bytes[i..i + n]);
            at.extend(i..i + n);
            i += n;
        }
        // Only ASCII bytes were taken out, so the rest is still UTF-8.
        let text = String::from_utf8(flat).unwrap_or_default();
        Folded { text, at }
    }
}

/// Replaces every occurrence of `pattern` that line breaks split; the breaks stay after the
/// mark, so the text keeps its lines.
fn replace_wrapped(text: &str, folded: &Folded, pattern: &str, mark: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut copied = 0;
    for (start, _) in folded.text.match_indices(pattern) {
        let (from, to) = (folded.at[start], folded.at[start + pattern.len() - 1] + 1);
        out.push_str(&text[copied..from]);
        out.push_str(mark);
        out.extend(text[from..to].chars().filter(|c| matches!(c, '\n' | '\r')));
        copied = to;
    }
    if copied == 0 {
        return text.to_string();
    }
    out.push_str(&text[copied..]);
    out
}

/// A stream of text through a scrubber: output cut anywhere never lets a secret through.
#[derive(Debug, Default)]
pub struct ScrubStream {
    carry: String,
}

impl ScrubStream {
    /// Scrubs what can be decided now; keeps a possible secret prefix for the next call.
    pub fn push(&mut self, scrubber: &Scrubber, text: &str) -> String {
        if scrubber.is_empty() {
            return text.to_string();
        }
        self.carry.push_str(text);
        let scrubbed = scrubber.scrub(&self.carry);
        let keep = scrubber.partial_tail(&scrubbed);
        let cut = scrubbed.len() - keep;
        self.carry = scrubbed[cut..].to_string();
        scrubbed[..cut].to_string()
    }

    /// The held-back rest, scrubbed.
    pub fn finish(&mut self, scrubber: &Scrubber) -> String {
        scrubber.scrub(&std::mem::take(&mut self.carry))
    }
}

/// base64 (both alphabets, at the three alignments a value can have inside a longer encoded
/// text, plus the padded standalone form), hex in both cases, and percent-encoding.
fn encodings(v: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    if v.len() >= MIN_ENCODED {
        for lead in 0..3usize {
            let mut padded = vec![0u8; lead];
            padded.extend_from_slice(v);
            let enc = base64url(&padded);
            // Characters fixed by the value alone: skip those mixed with the lead bytes, and
            // stop before the last, partial group.
            let start = (lead * 8).div_ceil(6);
            let end = (padded.len() / 3) * 4;
            if end > start {
                let core = &enc[start..end];
                out.push(core.to_string());
                out.push(standard(core));
            }
        }
        let whole = base64url(v);
        let pad = "=".repeat((4 - whole.len() % 4) % 4);
        out.push(whole.clone());
        let padded = format!("{}{pad}", standard(&whole));
        // `base64` wraps its output at 76 columns: each line of a long value is a pattern too.
        if padded.len() > BASE64_LINE {
            for line in padded.as_bytes().chunks(BASE64_LINE) {
                if line.len() >= MIN_ENCODED {
                    out.push(String::from_utf8_lossy(line).into_owned());
                }
            }
        }
        out.push(padded);
        let h = hex(v);
        out.push(h.to_uppercase());
        out.push(h);
    }
    // Upper- and lowercase escapes, and the common encoders that leave `!'()*` (JavaScript's
    // encodeURIComponent) or `/` (Python's quote) as they are.
    for (lower, keep) in [
        (false, &b"-._~"[..]),
        (true, &b"-._~"[..]),
        (false, &b"-._~!'()*"[..]),
        (false, &b"-._~/"[..]),
    ] {
        let url = percent(v, lower, keep);
        if url.as_bytes() != v && !out.contains(&url) {
            out.push(url);
        }
    }
    out
}

/// Line length of `base64`'s wrapped output.
const BASE64_LINE: usize = 76;

fn standard(b64url: &str) -> String {
    b64url.replace('-', "+").replace('_', "/")
}

fn percent(v: &[u8], lower: bool, keep: &[u8]) -> String {
    let mut s = String::new();
    for &b in v {
        if b.is_ascii_alphanumeric() || keep.contains(&b) {
            s.push(b as char);
        } else if lower {
            s.push_str(&format!("%{b:02x}"));
        } else {
            s.push_str(&format!("%{b:02X}"));
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    fn scrubber(v: &str) -> Scrubber {
        Scrubber::new(&[Secret {
            name: "tok".into(),
            env: "T".into(),
            value: v.into(),
        }])
    }

    fn b64(s: &[u8]) -> String {
        let w = base64url(s);
        format!("{}{}", standard(&w), "=".repeat((4 - w.len() % 4) % 4))
    }

    #[test]
    fn value_and_encodings_are_replaced() {
        let v = "s3cr3t-value/with+chars";
        let s = scrubber(v);
        for text in [
            v.to_string(),
            b64(v.as_bytes()),
            b64(format!("{v}\n").as_bytes()),
            b64(format!("x{v}").as_bytes()),
            b64(format!("xy{v}yz").as_bytes()),
            hex(v.as_bytes()),
            hex(v.as_bytes()).to_uppercase(),
            percent(v.as_bytes(), false, b"-._~"),
            percent(v.as_bytes(), true, b"-._~"),
            percent(v.as_bytes(), false, b"-._~/"),
        ] {
            let out = s.scrub(&format!("before {text} after"));
            assert!(out.contains("[secret:tok]"), "{text} -> {out}");
            assert!(!out.contains(v), "{out}");
            assert!(!out.contains(&hex(v.as_bytes())), "{out}");
        }
    }

    #[test]
    fn base64_wrapped_at_76_columns_leaves_no_line_of_a_long_value() {
        let v = "a-long-secret-value-of-more-than-fifty-seven-bytes-0123456789-abcdefghij";
        let s = scrubber(v);
        let enc = b64(v.as_bytes());
        let wrapped: Vec<&str> = enc
            .as_bytes()
            .chunks(76)
            .map(|c| std::str::from_utf8(c).unwrap())
            .collect();
        let out = s.scrub(&wrapped.join("\n"));
        for line in out.lines() {
            assert!(!enc.contains(line) || line.len() < 8, "{out}");
        }
    }

    #[test]
    fn a_stream_cut_anywhere_never_leaks() {
        let v = "abcdef0123456789";
        let s = scrubber(v);
        let text = format!("x {v} y {} z", hex(v.as_bytes()));
        for cut in 0..text.len() {
            let mut st = ScrubStream::default();
            let mut out = st.push(&s, &text[..cut]);
            out.push_str(&st.push(&s, &text[cut..]));
            out.push_str(&st.finish(&s));
            assert_eq!(out, "x [secret:tok] y [secret:tok] z", "cut at {cut}");
        }
    }

    /// What `xxd -p` (hex in 60 columns), `base64` (76) and `fold -w 20` print for a secret
    /// inside longer text, at every line width and offset: no line keeps a piece of it that a
    /// reader could join back, whole text or streamed line by line.
    #[test]
    fn encodings_wrapped_over_lines_anywhere_are_replaced() {
        let v = "Bearer-9f8e7d6c5b4a3f2e1d0c-a-secret-long-enough-to-span-lines-ZYXW";
        let s = scrubber(v);
        let wrap = |enc: &str, width: usize| {
            enc.as_bytes()
                .chunks(width)
                .map(|c| std::str::from_utf8(c).unwrap())
                .collect::<Vec<_>>()
                .join("\n")
                + "\n"
        };
        for lead in ["", "x", "Authorization: "] {
            let raw = format!("{lead}{v}");
            for width in [7, 20, 60, 64, 76] {
                for text in [
                    wrap(&hex(raw.as_bytes()), width),
                    wrap(&b64(raw.as_bytes()), width),
                    wrap(&raw, width),
                ] {
                    let whole = s.scrub(&text);
                    let mut st = ScrubStream::default();
                    let mut streamed: String =
                        text.split_inclusive('\n').map(|l| st.push(&s, l)).collect();
                    streamed.push_str(&st.finish(&s));
                    for out in [whole, streamed] {
                        assert!(out.contains("[secret:tok]"), "{width} {text} -> {out}");
                        assert_eq!(out.lines().count(), text.lines().count(), "{out}");
                        let joined: String = out.lines().collect();
                        for piece in [v, &hex(v.as_bytes())[..24], &b64(v.as_bytes())[8..32]] {
                            assert!(!joined.contains(piece), "{width}: {piece} in {out}");
                        }
                    }
                }
            }
        }
    }

    /// A secret of several lines (a PEM key) streamed a line at a time, or cut anywhere, is
    /// held back until it is whole (a second reader found the wrap-aware hold-back let it out).
    #[test]
    fn a_multi_line_secret_streamed_in_pieces_never_leaks() {
        let v = "-----BEGIN KEY-----\nMIIBVwIBADANBgkqhkiG9w0BAQEFAASCAUEwggE9\n-----END KEY-----";
        let s = scrubber(v);
        let text = format!("key:\n{v}\ndone\n");
        let lines: String = {
            let mut st = ScrubStream::default();
            let mut out: String = text.split_inclusive('\n').map(|l| st.push(&s, l)).collect();
            out.push_str(&st.finish(&s));
            out
        };
        assert_eq!(lines, "key:\n[secret:tok]\ndone\n");
        for cut in 0..text.len() {
            let mut st = ScrubStream::default();
            let mut out = st.push(&s, &text[..cut]);
            out.push_str(&st.push(&s, &text[cut..]));
            out.push_str(&st.finish(&s));
            assert_eq!(out, "key:\n[secret:tok]\ndone\n", "cut at {cut}");
        }
    }

    /// What could start a secret followed by blank lines is released, not held back (and
    /// rescanned) for ever; a short value is never found across a line break.
    #[test]
    fn blank_lines_end_a_hold_and_short_values_are_not_joined_across_lines() {
        let s = scrubber("abcdef0123456789");
        let mut st = ScrubStream::default();
        assert_eq!(st.push(&s, "abc"), "");
        let released = st.push(&s, "\n\n");
        assert_eq!(released, "abc\n\n");
        let short = scrubber("yes");
        assert_eq!(short.scrub("say y\nes"), "say y\nes");
        assert_eq!(short.scrub("say yes"), "say [secret:tok]");
    }

    #[test]
    fn plain_output_is_not_held_back() {
        let s = scrubber("zzzzzzzz");
        let mut st = ScrubStream::default();
        assert_eq!(st.push(&s, "hello\n"), "hello\n");
        assert_eq!(st.push(&s, "ab zz"), "ab ");
        assert_eq!(st.finish(&s), "zz");
    }
}
