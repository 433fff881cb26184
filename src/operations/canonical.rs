//! JSON text handling that serde_json's `Value` cannot do on its own:
//! a strict parser that keeps every number token exactly as written, RFC 8785 (JCS)
//! canonical output for plan digests, and an "exact" form (canonical key order and string
//! escaping, original number tokens) used to compare idempotent replays.
//!
//! The canonical writer itself (string escaping, ES6 numbers) is shared: [`crate::jcs`].

use std::collections::BTreeMap;

/// Nesting deeper than this is refused so hostile input cannot exhaust the stack.
const MAX_DEPTH: usize = 128;

/// A parsed JSON value that remembers number tokens verbatim.
#[derive(Debug, Clone, PartialEq)]
pub enum Exact {
    Null,
    Bool(bool),
    /// The number exactly as it appeared in the input (`1` and `1.0` differ).
    Number(String),
    String(String),
    Array(Vec<Exact>),
    /// Keys are kept in a `BTreeMap`; output order is decided by the serializer.
    Object(BTreeMap<String, Exact>),
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum JsonError {
    #[error("invalid JSON at byte {offset}: {what}")]
    Syntax { offset: usize, what: &'static str },
    #[error("duplicate object key {key:?}")]
    DuplicateKey { key: String },
    #[error("JSON nesting deeper than {MAX_DEPTH}")]
    TooDeep,
    #[error("number {token} cannot be represented as an IEEE 754 double")]
    NumberOutOfRange { token: String },
    #[error("expected a JSON object")]
    NotAnObject,
}

impl Exact {
    /// Parses exactly one JSON value; trailing non-whitespace is an error.
    pub fn parse(text: &str) -> Result<Exact, JsonError> {
        let mut p = Parser {
            bytes: text.as_bytes(),
            text,
            pos: 0,
        };
        p.skip_ws();
        let value = p.value(0)?;
        p.skip_ws();
        if p.pos != p.bytes.len() {
            return Err(p.err("trailing data after the value"));
        }
        Ok(value)
    }

    /// Parses text that must hold a JSON object.
    pub fn parse_object(text: &str) -> Result<Exact, JsonError> {
        let v = Exact::parse(text)?;
        if matches!(v, Exact::Object(_)) {
            Ok(v)
        } else {
            Err(JsonError::NotAnObject)
        }
    }

    /// Converts a `serde_json::Value` (whose numbers are already normalised).
    pub fn from_value(v: &serde_json::Value) -> Exact {
        match v {
            serde_json::Value::Null => Exact::Null,
            serde_json::Value::Bool(b) => Exact::Bool(*b),
            serde_json::Value::Number(n) => Exact::Number(n.to_string()),
            serde_json::Value::String(s) => Exact::String(s.clone()),
            serde_json::Value::Array(a) => Exact::Array(a.iter().map(Exact::from_value).collect()),
            serde_json::Value::Object(o) => Exact::Object(
                o.iter()
                    .map(|(k, v)| (k.clone(), Exact::from_value(v)))
                    .collect(),
            ),
        }
    }

    /// Compact text with keys sorted by UTF-16 code units and number tokens untouched.
    /// Two inputs have the same exact form iff they are equal ignoring whitespace and key
    /// order, with numbers compared token by token.
    pub fn exact_text(&self) -> String {
        let mut out = Vec::new();
        write_value(self, &mut out, NumberStyle::Verbatim).expect("verbatim never fails");
        utf8(out)
    }

    /// RFC 8785 canonical text.
    pub fn jcs_text(&self) -> Result<String, JsonError> {
        let mut out = Vec::new();
        write_value(self, &mut out, NumberStyle::Jcs)?;
        Ok(utf8(out))
    }
}

/// The exact form of an object whose members are given already in JCS key order (checked in
/// debug builds), written without building the object: the same bytes as
/// [`Exact::exact_text`] of the map of them.
pub fn exact_object_of_sorted(members: &[(&str, Member<'_>)]) -> String {
    debug_assert!(
        members
            .windows(2)
            .all(|w| w[0].0.encode_utf16().cmp(w[1].0.encode_utf16()).is_lt())
    );
    let mut out = Vec::with_capacity(members.len() * 32);
    out.push(b'{');
    for (i, (key, value)) in members.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        crate::jcs::write_string(key, &mut out);
        out.push(b':');
        match value {
            Member::Str(s) => crate::jcs::write_string(s, &mut out),
            Member::Exact(v) => {
                write_value(v, &mut out, NumberStyle::Verbatim).expect("verbatim never fails")
            }
        }
    }
    out.push(b'}');
    utf8(out)
}

/// A member's value for [`exact_object_of_sorted`].
pub enum Member<'a> {
    Str(&'a str),
    Exact(&'a Exact),
}

/// The writer's bytes as text: it copies the strings' UTF-8 and adds ASCII, so they are always
/// valid (checked once here, never per string).
fn utf8(bytes: Vec<u8>) -> String {
    String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned())
}

/// RFC 8785 canonical text of a `serde_json::Value`.
pub fn jcs(v: &serde_json::Value) -> String {
    String::from_utf8_lossy(&crate::jcs::canonicalize(v)).into_owned()
}

/// Exact form of a raw JSON text that must be an object.
pub fn exact_object_text(raw: &str) -> Result<String, JsonError> {
    Ok(Exact::parse_object(raw)?.exact_text())
}

#[derive(Clone, Copy)]
enum NumberStyle {
    Verbatim,
    Jcs,
}

fn write_value(v: &Exact, out: &mut Vec<u8>, style: NumberStyle) -> Result<(), JsonError> {
    match v {
        Exact::Null => out.extend_from_slice(b"null"),
        Exact::Bool(true) => out.extend_from_slice(b"true"),
        Exact::Bool(false) => out.extend_from_slice(b"false"),
        Exact::Number(tok) => match style {
            NumberStyle::Verbatim => out.extend_from_slice(tok.as_bytes()),
            NumberStyle::Jcs => out.extend_from_slice(es6_number(tok)?.as_bytes()),
        },
        Exact::String(s) => crate::jcs::write_string(s, out),
        Exact::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out, style)?;
            }
            out.push(b']');
        }
        Exact::Object(map) => {
            out.push(b'{');
            if map.keys().all(|k| utf8_order_is_utf16_order(k)) {
                // The map's own (UTF-8 byte) order is already the JCS order.
                for (i, (k, item)) in map.iter().enumerate() {
                    write_member(i, k, item, out, style)?;
                }
            } else {
                let mut keys: Vec<&String> = map.keys().collect();
                keys.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
                for (i, k) in keys.into_iter().enumerate() {
                    write_member(i, k, &map[k], out, style)?;
                }
            }
            out.push(b'}');
        }
    }
    Ok(())
}

fn write_member(
    i: usize,
    key: &str,
    item: &Exact,
    out: &mut Vec<u8>,
    style: NumberStyle,
) -> Result<(), JsonError> {
    if i > 0 {
        out.push(b',');
    }
    crate::jcs::write_string(key, out);
    out.push(b':');
    write_value(item, out, style)
}

/// JCS orders keys by UTF-16 code units, which differs from UTF-8 byte order only between
/// characters in U+E000..U+FFFF (lead byte 0xEE or 0xEF) and those above U+FFFF (lead byte
/// 0xF0..0xF4): among keys without such bytes the two orders agree.
fn utf8_order_is_utf16_order(key: &str) -> bool {
    key.bytes().all(|b| b < 0xEE)
}

/// Formats a JSON number token the way ECMAScript's `Number.prototype.toString` does,
/// which is what RFC 8785 prescribes.
fn es6_number(tok: &str) -> Result<String, JsonError> {
    let f: f64 = tok.parse().map_err(|_| JsonError::NumberOutOfRange {
        token: tok.to_string(),
    })?;
    if !f.is_finite() {
        return Err(JsonError::NumberOutOfRange {
            token: tok.to_string(),
        });
    }
    Ok(crate::jcs::format_es6_number(f))
}

struct Parser<'a> {
    bytes: &'a [u8],
    text: &'a str,
    pos: usize,
}

impl Parser<'_> {
    fn err(&self, what: &'static str) -> JsonError {
        JsonError::Syntax {
            offset: self.pos,
            what,
        }
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
    }

    fn value(&mut self, depth: usize) -> Result<Exact, JsonError> {
        if depth > MAX_DEPTH {
            return Err(JsonError::TooDeep);
        }
        match self.bytes.get(self.pos) {
            None => Err(self.err("unexpected end of input")),
            Some(b'{') => self.object(depth),
            Some(b'[') => self.array(depth),
            Some(b'"') => Ok(Exact::String(self.string()?)),
            Some(b't') => self.literal("true", Exact::Bool(true)),
            Some(b'f') => self.literal("false", Exact::Bool(false)),
            Some(b'n') => self.literal("null", Exact::Null),
            Some(b'-' | b'0'..=b'9') => self.number(),
            Some(_) => Err(self.err("unexpected character")),
        }
    }

    fn literal(&mut self, word: &'static str, v: Exact) -> Result<Exact, JsonError> {
        if self.bytes[self.pos..].starts_with(word.as_bytes()) {
            self.pos += word.len();
            Ok(v)
        } else {
            Err(self.err("invalid literal"))
        }
    }

    fn digits(&mut self) -> usize {
        let start = self.pos;
        while let Some(b'0'..=b'9') = self.bytes.get(self.pos) {
            self.pos += 1;
        }
        self.pos - start
    }

    fn number(&mut self) -> Result<Exact, JsonError> {
        let start = self.pos;
        if self.bytes.get(self.pos) == Some(&b'-') {
            self.pos += 1;
        }
        match self.bytes.get(self.pos) {
            Some(b'0') => self.pos += 1,
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("invalid number")),
        }
        if self.bytes.get(self.pos) == Some(&b'.') {
            self.pos += 1;
            if self.digits() == 0 {
                return Err(self.err("invalid number fraction"));
            }
        }
        if let Some(b'e' | b'E') = self.bytes.get(self.pos) {
            self.pos += 1;
            if let Some(b'+' | b'-') = self.bytes.get(self.pos) {
                self.pos += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("invalid number exponent"));
            }
        }
        Ok(Exact::Number(self.text[start..self.pos].to_string()))
    }

    fn hex4(&mut self) -> Result<u32, JsonError> {
        let Some(chunk) = self.text.get(self.pos..self.pos + 4) else {
            return Err(self.err("truncated \\u escape"));
        };
        let v = u32::from_str_radix(chunk, 16).map_err(|_| self.err("invalid \\u escape"))?;
        self.pos += 4;
        Ok(v)
    }

    fn string(&mut self) -> Result<String, JsonError> {
        self.pos += 1; // opening quote
        let mut out = String::new();
        loop {
            let start = self.pos;
            while let Some(&b) = self.bytes.get(self.pos) {
                if b == b'"' || b == b'\\' || b < 0x20 {
                    break;
                }
                self.pos += 1;
            }
            out.push_str(&self.text[start..self.pos]);
            match self.bytes.get(self.pos) {
                None => return Err(self.err("unterminated string")),
                Some(b'"') => {
                    self.pos += 1;
                    return Ok(out);
                }
                Some(b'\\') => {
                    self.pos += 1;
                    let esc = self.bytes.get(self.pos).copied();
                    self.pos += 1;
                    match esc {
                        Some(b'"') => out.push('"'),
                        Some(b'\\') => out.push('\\'),
                        Some(b'/') => out.push('/'),
                        Some(b'b') => out.push('\u{8}'),
                        Some(b'f') => out.push('\u{c}'),
                        Some(b'n') => out.push('\n'),
                        Some(b'r') => out.push('\r'),
                        Some(b't') => out.push('\t'),
                        Some(b'u') => {
                            let hi = self.hex4()?;
                            let cp = if (0xD800..0xDC00).contains(&hi) {
                                if !self.bytes[self.pos..].starts_with(b"\\u") {
                                    return Err(self.err("lone surrogate"));
                                }
                                self.pos += 2;
                                let lo = self.hex4()?;
                                if !(0xDC00..0xE000).contains(&lo) {
                                    return Err(self.err("invalid surrogate pair"));
                                }
                                0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                            } else if (0xDC00..0xE000).contains(&hi) {
                                return Err(self.err("lone surrogate"));
                            } else {
                                hi
                            };
                            out.push(
                                char::from_u32(cp).ok_or_else(|| self.err("invalid code point"))?,
                            );
                        }
                        _ => return Err(self.err("invalid escape")),
                    }
                }
                Some(_) => return Err(self.err("control character in string")),
            }
        }
    }

    fn array(&mut self, depth: usize) -> Result<Exact, JsonError> {
        self.pos += 1;
        let mut items = Vec::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b']') {
            self.pos += 1;
            return Ok(Exact::Array(items));
        }
        loop {
            self.skip_ws();
            items.push(self.value(depth + 1)?);
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b']') => {
                    self.pos += 1;
                    return Ok(Exact::Array(items));
                }
                _ => return Err(self.err("expected , or ] in array")),
            }
        }
    }

    fn object(&mut self, depth: usize) -> Result<Exact, JsonError> {
        self.pos += 1;
        let mut map = BTreeMap::new();
        self.skip_ws();
        if self.bytes.get(self.pos) == Some(&b'}') {
            self.pos += 1;
            return Ok(Exact::Object(map));
        }
        loop {
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b'"') {
                return Err(self.err("expected a string key"));
            }
            let key = self.string()?;
            self.skip_ws();
            if self.bytes.get(self.pos) != Some(&b':') {
                return Err(self.err("expected : after key"));
            }
            self.pos += 1;
            self.skip_ws();
            let v = self.value(depth + 1)?;
            if map.contains_key(&key) {
                return Err(JsonError::DuplicateKey { key });
            }
            map.insert(key, v);
            self.skip_ws();
            match self.bytes.get(self.pos) {
                Some(b',') => self.pos += 1,
                Some(b'}') => {
                    self.pos += 1;
                    return Ok(Exact::Object(map));
                }
                _ => return Err(self.err("expected , or } in object")),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jcs_of(text: &str) -> String {
        Exact::parse(text).unwrap().jcs_text().unwrap()
    }

    #[test]
    fn exact_form_ignores_whitespace_and_key_order_but_not_number_tokens() {
        let a = Exact::parse(r#"{ "b": 1, "a": [1.0, "x"] }"#).unwrap();
        let b = Exact::parse(r#"{"a":[1.0,"x"],"b":1}"#).unwrap();
        let c = Exact::parse(r#"{"a":[1,"x"],"b":1}"#).unwrap();
        assert_eq!(a.exact_text(), b.exact_text());
        assert_ne!(a.exact_text(), c.exact_text());
        assert_eq!(a.exact_text(), r#"{"a":[1.0,"x"],"b":1}"#);
    }

    #[test]
    fn large_integers_keep_every_digit() {
        let a = Exact::parse("12345678901234567890123").unwrap();
        let b = Exact::parse("12345678901234567890124").unwrap();
        assert_ne!(a.exact_text(), b.exact_text());
    }

    #[test]
    fn strict_parser_rejects_trailing_data_duplicates_and_non_objects() {
        assert!(matches!(
            Exact::parse(r#"{"a":1} x"#),
            Err(JsonError::Syntax { .. })
        ));
        assert_eq!(
            Exact::parse(r#"{"a":1,"a":2}"#),
            Err(JsonError::DuplicateKey { key: "a".into() })
        );
        assert_eq!(Exact::parse_object("[1]"), Err(JsonError::NotAnObject));
        assert!(Exact::parse("01").is_err());
        assert!(Exact::parse("1.").is_err());
        assert!(Exact::parse(r#""\ud800""#).is_err());
        let deep = "[".repeat(200) + &"]".repeat(200);
        assert_eq!(Exact::parse(&deep), Err(JsonError::TooDeep));
    }

    #[test]
    fn jcs_numbers_follow_ecmascript() {
        // Vectors from RFC 8785 appendix B and ES6 Number.prototype.toString.
        assert_eq!(jcs_of("0"), "0");
        assert_eq!(jcs_of("-0"), "0");
        assert_eq!(jcs_of("1.0"), "1");
        assert_eq!(jcs_of("1e2"), "100");
        assert_eq!(jcs_of("1E21"), "1e+21");
        assert_eq!(jcs_of("1e20"), "100000000000000000000");
        assert_eq!(jcs_of("0.000001"), "0.000001");
        assert_eq!(jcs_of("1e-7"), "1e-7");
        assert_eq!(jcs_of("333333333.33333329"), "333333333.3333333");
        assert_eq!(jcs_of("-5e-324"), "-5e-324");
        assert_eq!(jcs_of("1.7976931348623157e308"), "1.7976931348623157e+308");
        assert_eq!(jcs_of("9007199254740992"), "9007199254740992");
        assert_eq!(jcs_of("295147905179352830000"), "295147905179352830000");
        assert_eq!(jcs_of("4.5"), "4.5");
        assert_eq!(jcs_of("0.002"), "0.002");
        assert_eq!(jcs_of("123e-20"), "1.23e-18");
        assert!(Exact::parse("1e400").unwrap().jcs_text().is_err());
    }

    #[test]
    fn jcs_sorts_keys_by_utf16_and_escapes_minimally() {
        assert_eq!(
            jcs_of(r#"{"b":"\u000f\n\"/","a":{"d":true,"c":null}}"#),
            r#"{"a":{"c":null,"d":true},"b":"\u000f\n\"/"}"#
        );
        // U+1F600 (surrogates D83D..) sorts before U+FB33 in UTF-16 order.
        let t = jcs_of("{\"\u{fb33}\":1,\"\u{1f600}\":2}");
        assert_eq!(t, "{\"\u{1f600}\":2,\"\u{fb33}\":1}");
    }

    /// Written member by member or built as a map, an object has the same exact form.
    #[test]
    fn sorted_members_write_the_objects_exact_form() {
        let target = Exact::parse(r#"{"p": "a\u0001\"\u00e9", "n": 1.50}"#).unwrap();
        let args =
            Exact::parse(r#"{"z": [true, null, {"\ufb33": 1, "\ud83d\ude00": 2}]}"#).unwrap();
        let built = Exact::Object(BTreeMap::from([
            ("operation".to_string(), Exact::String("file.write".into())),
            ("reason".to_string(), Exact::String("tab\t \"q\" ✓".into())),
            ("target".to_string(), target.clone()),
            ("arguments".to_string(), args.clone()),
        ]))
        .exact_text();
        let written = exact_object_of_sorted(&[
            ("arguments", Member::Exact(&args)),
            ("operation", Member::Str("file.write")),
            ("reason", Member::Str("tab\t \"q\" ✓")),
            ("target", Member::Exact(&target)),
        ]);
        assert_eq!(written, built);
    }

    #[test]
    fn value_and_text_paths_agree() {
        let v = serde_json::json!({"z": [1, 2.5, "s"], "a": {"k": false}});
        assert_eq!(jcs(&v), r#"{"a":{"k":false},"z":[1,2.5,"s"]}"#);
    }

    proptest::proptest! {
        /// Members come out in UTF-16 code-unit order of their keys, whichever characters the
        /// keys hold (ASCII, below and above U+E000, above U+FFFF): the map's byte order is
        /// taken as it is only where the two orders agree.
        #[test]
        fn members_follow_utf16_key_order(keys in proptest::collection::btree_set(
            "[a-c\u{e9}\u{d7ff}\u{e000}\u{fb33}\u{ffff}\u{10000}\u{1f600}]{0,3}", 0..6)) {
            let map: BTreeMap<String, Exact> = keys
                .iter()
                .enumerate()
                .map(|(i, k)| (k.clone(), Exact::Number(i.to_string())))
                .collect();
            let mut want: Vec<&String> = keys.iter().collect();
            want.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
            let want = want
                .iter()
                .map(|k| format!("{}:{}", serde_json::to_string(k).unwrap(), keys.iter().position(|x| x == *k).unwrap()))
                .collect::<Vec<_>>()
                .join(",");
            let got = Exact::Object(map).exact_text();
            proptest::prop_assert_eq!(got, format!("{{{want}}}"));
        }

        #[test]
        fn exact_text_reparses_to_itself(s in "[a-z0-9 ]{0,12}", n in -1_000_000i64..1_000_000, f in -1e6f64..1e6) {
            let v = serde_json::json!({"s": s, "n": n, "f": f, "arr": [n, {"x": s}]});
            let text = serde_json::to_string(&v).unwrap();
            let once = Exact::parse(&text).unwrap();
            let again = Exact::parse(&once.exact_text()).unwrap();
            proptest::prop_assert_eq!(once.exact_text(), again.exact_text());
            let j = once.jcs_text().unwrap();
            // JCS may rewrite number tokens (0.0 -> 0) but never their value.
            let back: serde_json::Value = serde_json::from_str(&j).unwrap();
            // (serde_json's own float parser is not exact in the last bit, so read the token.)
            let Exact::Object(m) = Exact::parse(&j).unwrap() else { panic!("object") };
            let Some(Exact::Number(ftok)) = m.get("f") else { panic!("number") };
            proptest::prop_assert_eq!(ftok.parse::<f64>().unwrap(), f);
            proptest::prop_assert_eq!(&back["arr"], &v["arr"]);
            proptest::prop_assert_eq!(&back["s"], &v["s"]);
        }
    }
}
