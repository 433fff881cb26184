//! The bundle digest.
//!
//! Algorithm (version 1, what a client must reproduce to send a matching digest):
//! 1. Take the bundle as parsed (JSON or YAML; both yield the same data model).
//! 2. Drop `metadata.digest`.
//! 3. Put the lists whose order carries no meaning in a fixed order: `profiles` sorted by
//!    selector (`kind`, then `value`, as byte strings), `declarations` sorted by (`kind`,
//!    `name`, `reference`), each profile's `toolsets` sorted. `command` keeps its order (argv
//!    order is meaning).
//! 4. Write defaults explicitly where a field has one (`input_mode`, default `stdin_text`) and
//!    omit absent optional fields and empty lists, so "left out" and "written as the default"
//!    give the same digest.
//! 5. Encode with RFC 8785 (JCS, see [`super::jcs`]) and hash the bytes with SHA-256.
//! 6. The digest is `sha256:` followed by the 64 lower-case hex digits.
//!
//! The canonical bytes are also what gaffer stores as the bundle's blob, so the blob's own
//! content address equals the hex part of the digest.

use super::jcs;
use super::types::{Bundle, Declaration, InputMode, Profile};

/// Prefix of every bundle digest.
pub const DIGEST_PREFIX: &str = "sha256:";

/// A bundle's canonical encoding and digest.
#[derive(Clone, Debug)]
pub struct Canonical {
    /// RFC 8785 bytes of the normalised bundle.
    pub bytes: Vec<u8>,
    /// `sha256:<hex>` of `bytes`.
    pub digest: String,
    /// Profile selectors in canonical order.
    pub profiles: Vec<super::types::ProfileSelector>,
}

/// The bundle in canonical order, without its stated digest.
pub fn normalize(bundle: &Bundle) -> Bundle {
    let mut b = bundle.clone();
    b.metadata.digest = None;
    b.profiles.sort_by(|x, y| x.selector.cmp(&y.selector));
    for p in &mut b.profiles {
        p.toolsets.sort();
    }
    b.declarations.sort_by(|x, y| decl_key(x).cmp(&decl_key(y)));
    b
}

/// Normalises, encodes and hashes `bundle` (without copying it: the lists are put in order
/// by reference).
pub fn canonicalize(bundle: &Bundle) -> Canonical {
    let mut profiles: Vec<&Profile> = bundle.profiles.iter().collect();
    profiles.sort_by(|x, y| x.selector.cmp(&y.selector));
    let mut decls: Vec<&Declaration> = bundle.declarations.iter().collect();
    decls.sort_by(|x, y| decl_key(x).cmp(&decl_key(y)));
    let bytes = encode_parts(bundle, &profiles, &decls, true);
    let digest = format!("{DIGEST_PREFIX}{}", crate::util::sha256_hex(&bytes));
    Canonical {
        bytes,
        digest,
        profiles: profiles.iter().map(|p| p.selector.clone()).collect(),
    }
}

fn decl_key(d: &Declaration) -> (&str, &str, &str) {
    (d.kind.as_str(), &d.name, &d.reference)
}

/// The JCS bytes of a normalised bundle, via the generic path: serde's JSON value of the
/// bundle run through [`jcs::canonicalize`]. [`encode`] must always equal this.
pub fn encode_generic(bundle: &Bundle) -> Vec<u8> {
    // Serialising our own plain data types to a JSON value cannot fail (no maps with
    // non-string keys, no non-finite floats).
    let value = serde_json::to_value(bundle).unwrap_or(serde_json::Value::Null);
    jcs::canonicalize(&value)
}

/// The JCS bytes of `b` as it stands (lists in their given order, a stated digest kept),
/// written directly from the typed value, which is several times faster than building a JSON
/// tree. Members are written in JCS order; every key is ASCII, so byte order is UTF-16 order.
/// Field presence mirrors the serde attributes of the types.
pub fn encode(b: &Bundle) -> Vec<u8> {
    let profiles: Vec<&Profile> = b.profiles.iter().collect();
    let decls: Vec<&Declaration> = b.declarations.iter().collect();
    encode_parts(b, &profiles, &decls, false)
}

/// Writes `b` with its profiles and declarations in the given order. `canonical` drops a
/// stated `metadata.digest` and sorts toolsets, as the digest requires; otherwise the bundle
/// is written as it stands.
fn encode_parts(
    b: &Bundle,
    profiles: &[&Profile],
    decls: &[&Declaration],
    canonical: bool,
) -> Vec<u8> {
    let mut out = Vec::with_capacity(estimate(b));
    let o = &mut out;
    o.push(b'{');
    let mut first = true;
    if !decls.is_empty() {
        key(o, &mut first, "declarations");
        o.push(b'[');
        for (i, d) in decls.iter().enumerate() {
            if i > 0 {
                o.push(b',');
            }
            o.extend_from_slice(b"{\"kind\":");
            jcs::write_string(d.kind.as_str(), o);
            o.extend_from_slice(b",\"name\":");
            jcs::write_string(&d.name, o);
            o.extend_from_slice(b",\"reference\":");
            jcs::write_string(&d.reference, o);
            o.push(b'}');
        }
        o.push(b']');
    }
    key(o, &mut first, "metadata");
    let m = &b.metadata;
    o.extend_from_slice(b"{\"created_at\":");
    jcs::write_string(&m.created_at, o);
    if let Some(d) = m.digest.as_ref().filter(|_| !canonical) {
        o.extend_from_slice(b",\"digest\":");
        jcs::write_string(d, o);
    }
    o.extend_from_slice(b",\"id\":");
    jcs::write_string(&m.id, o);
    o.extend_from_slice(b",\"provenance\":{");
    if let Some(detail) = &m.provenance.detail {
        o.extend_from_slice(b"\"detail\":");
        jcs::write_string(detail, o);
        o.push(b',');
    }
    o.extend_from_slice(b"\"source\":");
    jcs::write_string(&m.provenance.source, o);
    o.extend_from_slice(b"},\"revision\":");
    jcs::write_string(&m.revision, o);
    o.push(b'}');
    if !profiles.is_empty() {
        key(o, &mut first, "profiles");
        o.push(b'[');
        for (i, p) in profiles.iter().enumerate() {
            if i > 0 {
                o.push(b',');
            }
            write_profile(p, canonical, o);
        }
        o.push(b']');
    }
    o.push(b'}');
    out
}

fn key(o: &mut Vec<u8>, first: &mut bool, name: &str) {
    if !*first {
        o.push(b',');
    }
    *first = false;
    jcs::write_string(name, o);
    o.push(b':');
}

fn write_strings<S: AsRef<str>>(items: &[S], o: &mut Vec<u8>) {
    o.push(b'[');
    for (i, s) in items.iter().enumerate() {
        if i > 0 {
            o.push(b',');
        }
        jcs::write_string(s.as_ref(), o);
    }
    o.push(b']');
}

fn write_profile(p: &Profile, sort_toolsets: bool, o: &mut Vec<u8>) {
    let mut first = true;
    o.push(b'{');
    if !p.command.is_empty() {
        key(o, &mut first, "command");
        write_strings(&p.command, o);
    }
    key(o, &mut first, "input_mode");
    jcs::write_string(
        match p.input_mode {
            InputMode::StdinText => "stdin_text",
            InputMode::StdinJsonl => "stdin_jsonl",
            InputMode::Argument => "argument",
        },
        o,
    );
    if let Some(label) = &p.label {
        key(o, &mut first, "label");
        jcs::write_string(label, o);
    }
    if let Some(model) = &p.model {
        key(o, &mut first, "model");
        jcs::write_string(model, o);
    }
    key(o, &mut first, "selector");
    o.extend_from_slice(b"{\"kind\":");
    jcs::write_string(p.selector.kind(), o);
    o.extend_from_slice(b",\"value\":");
    jcs::write_string(p.selector.value(), o);
    o.push(b'}');
    if let Some(t) = p.timeout_ms {
        key(o, &mut first, "timeout_ms");
        jcs::write_u64(t, o);
    }
    if !p.toolsets.is_empty() {
        key(o, &mut first, "toolsets");
        let mut toolsets: Vec<&String> = p.toolsets.iter().collect();
        if sort_toolsets {
            toolsets.sort();
        }
        write_strings(&toolsets, o);
    }
    o.push(b'}');
}

/// A capacity guess that avoids most reallocations.
fn estimate(b: &Bundle) -> usize {
    let texts: usize = b
        .profiles
        .iter()
        .map(|p| {
            p.command.iter().map(|c| c.len() + 3).sum::<usize>()
                + p.label.as_ref().map_or(0, String::len)
                + p.selector.value().len()
                + p.toolsets.iter().map(|t| t.len() + 3).sum::<usize>()
                + 96
        })
        .sum();
    texts + b.declarations.len() * 96 + 256
}

/// The digest of `bundle` (see the module documentation).
pub fn digest(bundle: &Bundle) -> String {
    canonicalize(bundle).digest
}

/// The hex part of a `sha256:<hex>` digest.
pub fn digest_hex(digest: &str) -> &str {
    digest.strip_prefix(DIGEST_PREFIX).unwrap_or(digest)
}
