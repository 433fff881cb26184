//! RFC 8785 JSON Canonicalization Scheme (JCS), written for `serde_json::Value`.
//!
//! Why our own: the bundle digest must be reproducible by any client in any language, and a
//! general JSON serializer gives no guarantee about key order, number spelling or escapes.
//! JCS pins all three:
//! - object members are sorted by their names compared as UTF-16 code units;
//! - numbers are written the way ECMAScript's `Number.prototype.toString` writes an IEEE-754
//!   double (integers beyond 2^53 are therefore rounded, as in any JCS implementation);
//! - strings escape only `"`, `\` and the C0 controls (`\b \t \n \f \r` short forms, the rest
//!   as `\u00xx` lower-case); everything else is emitted as raw UTF-8;
//! - no whitespace anywhere.
//!
//! Because every string is quoted and escaped, no field value can imitate a structural
//! character, which is what makes the encoding injection-proof.

use serde_json::Value;

/// The canonical bytes of `value`.
pub fn canonicalize(value: &Value) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    write_value(value, &mut out);
    out
}

/// Appends the canonical form of `value` to `out`.
pub fn write_value(value: &Value, out: &mut Vec<u8>) {
    match value {
        Value::Null => out.extend_from_slice(b"null"),
        Value::Bool(true) => out.extend_from_slice(b"true"),
        Value::Bool(false) => out.extend_from_slice(b"false"),
        Value::Number(n) => write_number(n, out),
        Value::String(s) => write_string(s, out),
        Value::Array(items) => {
            out.push(b'[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_value(item, out);
            }
            out.push(b']');
        }
        Value::Object(map) => {
            let mut members: Vec<(&String, &Value)> = map.iter().collect();
            members.sort_by(|a, b| a.0.encode_utf16().cmp(b.0.encode_utf16()));
            out.push(b'{');
            for (i, (key, item)) in members.into_iter().enumerate() {
                if i > 0 {
                    out.push(b',');
                }
                write_string(key, out);
                out.push(b':');
                write_value(item, out);
            }
            out.push(b'}');
        }
    }
}

/// Largest integer an IEEE-754 double holds exactly; beyond it JCS goes through the double.
const MAX_EXACT_INT: u64 = 1 << 53;

/// Appends an unsigned integer the way JCS writes it.
pub fn write_u64(u: u64, out: &mut Vec<u8>) {
    if u <= MAX_EXACT_INT {
        out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes());
    } else {
        out.extend_from_slice(format_es6_number(u as f64).as_bytes());
    }
}

fn write_number(n: &serde_json::Number, out: &mut Vec<u8>) {
    if let Some(u) = n.as_u64()
        && u <= MAX_EXACT_INT
    {
        out.extend_from_slice(itoa::Buffer::new().format(u).as_bytes());
        return;
    }
    if let Some(i) = n.as_i64()
        && i.unsigned_abs() <= MAX_EXACT_INT
    {
        out.extend_from_slice(itoa::Buffer::new().format(i).as_bytes());
        return;
    }
    // serde_json never holds NaN or infinities, so every remaining number is a finite double.
    let f = n.as_f64().unwrap_or(0.0);
    out.extend_from_slice(format_es6_number(f).as_bytes());
}

/// ECMAScript `Number.prototype.toString(10)` for a finite double.
pub fn format_es6_number(x: f64) -> String {
    if x == 0.0 || !x.is_finite() {
        // -0 prints as "0"; non-finite values cannot occur in JSON and are mapped to "0" rather
        // than panicking.
        return "0".to_string();
    }
    if x < 0.0 {
        return format!("-{}", format_es6_number(-x));
    }
    // Rust's `{:e}` yields the shortest digit string that round-trips, e.g. "1.2345e6".
    let sci = format!("{x:e}");
    let (mantissa, exp) = sci.split_once('e').unwrap_or((sci.as_str(), "0"));
    let exp: i32 = exp.parse().unwrap_or(0);
    let digits: String = mantissa.chars().filter(|c| *c != '.').collect();
    let k = digits.len() as i32;
    // Value = 0.d1d2..dk × 10^n.
    let n = exp + 1;
    if k <= n && n <= 21 {
        let mut s = digits;
        s.extend(std::iter::repeat_n('0', (n - k) as usize));
        s
    } else if 0 < n && n <= 21 {
        let (int, frac) = digits.split_at(n as usize);
        format!("{int}.{frac}")
    } else if -6 < n && n <= 0 {
        format!("0.{}{}", "0".repeat((-n) as usize), digits)
    } else {
        let e = n - 1;
        let sign = if e < 0 { '-' } else { '+' };
        let (first, rest) = digits.split_at(1);
        if rest.is_empty() {
            format!("{first}e{sign}{}", e.abs())
        } else {
            format!("{first}.{rest}e{sign}{}", e.abs())
        }
    }
}

/// Escape class of each byte: 0 = copied as is, `u` = `\u00xx`, anything else = the letter
/// after the backslash.
static ESCAPES: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 0x20 {
        t[i] = b'u';
        i += 1;
    }
    t[0x08] = b'b';
    t[0x09] = b't';
    t[0x0a] = b'n';
    t[0x0c] = b'f';
    t[0x0d] = b'r';
    t[b'"' as usize] = b'"';
    t[b'\\' as usize] = b'\\';
    t
};

/// Appends `s` as a canonical JSON string.
pub fn write_string(s: &str, out: &mut Vec<u8>) {
    const HEX: &[u8; 16] = b"0123456789abcdef";
    let bytes = s.as_bytes();
    out.reserve(bytes.len() + 2);
    out.push(b'"');
    let mut start = 0;
    loop {
        let i = next_escape(bytes, start);
        out.extend_from_slice(&bytes[start..i]);
        let Some(&b) = bytes.get(i) else { break };
        let e = ESCAPES[b as usize];
        if e == b'u' {
            out.extend_from_slice(&[
                b'\\',
                b'u',
                b'0',
                b'0',
                HEX[(b >> 4) as usize],
                HEX[(b & 0x0f) as usize],
            ]);
        } else {
            out.extend_from_slice(&[b'\\', e]);
        }
        start = i + 1;
    }
    out.push(b'"');
}

/// Index of the first byte at or after `i` that needs escaping (`bytes.len()` if none). Scans
/// eight bytes at a time: a word is looked at byte by byte only when it may hold a control
/// character, a quote or a backslash.
#[inline]
fn next_escape(bytes: &[u8], mut i: usize) -> usize {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    // Sets the high bit of each byte that is zero (and possibly of bytes above one); never
    // misses a zero byte.
    let zero_bytes = |x: u64| x.wrapping_sub(ONES) & !x & HIGH;
    while let Some(chunk) = bytes.get(i..i + 8) {
        let mut word = [0u8; 8];
        word.copy_from_slice(chunk);
        let w = u64::from_le_bytes(word);
        // Bytes below 0x20: subtracting 0x20 borrows into the high bit (for ASCII bytes).
        let control = w.wrapping_sub(ONES * 0x20) & !w & HIGH;
        let quote = zero_bytes(w ^ (ONES * u64::from(b'"')));
        let backslash = zero_bytes(w ^ (ONES * u64::from(b'\\')));
        if control | quote | backslash != 0
            && let Some(j) = chunk.iter().position(|&b| ESCAPES[b as usize] != 0)
        {
            return i + j;
        }
        i += 8;
    }
    while let Some(&b) = bytes.get(i) {
        if ESCAPES[b as usize] != 0 {
            return i;
        }
        i += 1;
    }
    bytes.len()
}

#[cfg(test)]
#[allow(clippy::excessive_precision)] // the RFC's vectors are spelled with their full digits
mod tests {
    use super::*;
    use proptest::prelude::*;
    use serde_json::json;

    fn canon(v: &Value) -> String {
        String::from_utf8(canonicalize(v)).unwrap()
    }

    #[test]
    fn numbers_follow_ecmascript_spelling() {
        // Vectors from RFC 8785 appendix B and the ECMAScript number-to-string rules.
        let cases: &[(f64, &str)] = &[
            (0.0, "0"),
            (-0.0, "0"),
            (1.0, "1"),
            (-1.5, "-1.5"),
            (4.50, "4.5"),
            (2e-3, "0.002"),
            (0.000001, "0.000001"),
            (1e-7, "1e-7"),
            (1e21, "1e+21"),
            (1e20, "100000000000000000000"),
            (1e30, "1e+30"),
            (123456789012345680000.0, "123456789012345680000"),
            (333333333.33333329, "333333333.3333333"),
            (0.000000000000000000000000001, "1e-27"),
            (9007199254740992.0, "9007199254740992"),
            (5e-324, "5e-324"),
            (1.7976931348623157e308, "1.7976931348623157e+308"),
            (1.2345e-10, "1.2345e-10"),
        ];
        for (x, want) in cases {
            assert_eq!(format_es6_number(*x), *want, "formatting {x:e}");
        }
    }

    #[test]
    fn rfc8785_sample_object_canonicalizes_exactly() {
        // The sample of RFC 8785 section 3.2.2 (numbers, literals and string escapes).
        // The numbers are built from Rust literals: serde_json's default parser is not
        // correctly rounded for every decimal (e.g. 333333333.33333329).
        let mut v: Value = serde_json::from_str(
            r#"{"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
                "literals":[null,true,false]}"#,
        )
        .unwrap();
        v["numbers"] = json!([
            333333333.33333329_f64,
            1e30,
            4.50,
            2e-3,
            0.000000000000000000000000001
        ]);
        assert_eq!(
            canon(&v),
            "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\"string\":\"€$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}"
        );
    }

    #[test]
    fn keys_sort_by_utf16_code_units() {
        // U+1F600 (surrogate pair D83D..) sorts before U+FB33 in UTF-16 but after it in UTF-8.
        let v = json!({"\u{fb33}": 1, "\u{1f600}": 2, "a": 3, "B": 4});
        assert_eq!(
            canon(&v),
            "{\"B\":4,\"a\":3,\"\u{1f600}\":2,\"\u{fb33}\":1}"
        );
    }

    #[test]
    fn large_integers_go_through_the_double() {
        let v: Value =
            serde_json::from_str("[9007199254740993, -5, 18446744073709551615]").unwrap();
        assert_eq!(canon(&v), "[9007199254740992,-5,18446744073709552000]");
    }

    fn arb_json() -> impl Strategy<Value = Value> {
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i32>().prop_map(|i| json!(i)),
            "[\\x00-\\x7f\u{80}-\u{10ffff}\"\\\\,:{}\\[\\]]{0,12}".prop_map(Value::String),
        ];
        leaf.prop_recursive(4, 48, 6, |inner| {
            prop_oneof![
                prop::collection::vec(inner.clone(), 0..6).prop_map(Value::Array),
                prop::collection::btree_map("[a-z\"\\\\,:\u{0}-\u{1f}]{0,6}", inner, 0..6)
                    .prop_map(|m| Value::Object(m.into_iter().collect())),
            ]
        })
    }

    proptest! {
        // Parsing the canonical bytes gives back the same value: the encoding is injective, so
        // two different values can never share canonical bytes (and hence a digest).
        #[test]
        fn canonical_form_round_trips(v in arb_json()) {
            let bytes = canonicalize(&v);
            let back: Value = serde_json::from_slice(&bytes).unwrap();
            prop_assert_eq!(back, v);
        }

        // Canonicalizing twice is stable.
        #[test]
        fn canonicalization_is_idempotent(v in arb_json()) {
            let once = canonicalize(&v);
            let reparsed: Value = serde_json::from_slice(&once).unwrap();
            prop_assert_eq!(canonicalize(&reparsed), once);
        }

        // The word-at-a-time scan escapes exactly what a plain byte loop would.
        #[test]
        fn strings_escape_like_the_obvious_byte_loop(v in "[\x00-\x7f\u{80}-\u{10ffff}]{0,40}") {
            let mut fast = Vec::new();
            write_string(&v, &mut fast);
            let mut slow = vec![b'"'];
            for &b in v.as_bytes() {
                match b {
                    b'"' => slow.extend_from_slice(b"\\\""),
                    b'\\' => slow.extend_from_slice(b"\\\\"),
                    0x08 => slow.extend_from_slice(b"\\b"),
                    0x09 => slow.extend_from_slice(b"\\t"),
                    0x0a => slow.extend_from_slice(b"\\n"),
                    0x0c => slow.extend_from_slice(b"\\f"),
                    0x0d => slow.extend_from_slice(b"\\r"),
                    0x00..=0x1f => slow.extend_from_slice(format!("\\u{:04x}", b).as_bytes()),
                    _ => slow.push(b),
                }
            }
            slow.push(b'"');
            prop_assert_eq!(String::from_utf8(fast).unwrap(), String::from_utf8(slow).unwrap());
        }

        #[test]
        fn doubles_round_trip_through_es6_spelling(x in any::<f64>().prop_filter("finite", |x| x.is_finite())) {
            let s = format_es6_number(x);
            let back: f64 = s.parse().unwrap();
            prop_assert!(back == x || (x == 0.0 && back == 0.0));
        }
    }
}
