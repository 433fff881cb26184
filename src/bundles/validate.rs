//! Boundary rules for bundles: what may cross into gaffer's store and into a worker's launch.
//!
//! The rules keep host-specific material out of the pinned configuration: absolute and home
//! paths, sockets, session and cache locations, control characters and oversize text. A
//! declaration carries a typed reference (`env:NAME`, `vault:...`), never a value, so a pasted
//! secret is refused. Every error names the offending field and never repeats a reference's
//! text (it might be a secret pasted by mistake).

use std::collections::BTreeSet;

use super::types::{Bundle, DeclarationKind, Profile};

/// A request field that failed validation.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {message}")]
pub struct FieldError {
    /// Dotted path, e.g. `profiles[0].command[1]`.
    pub field: String,
    pub message: String,
}

impl FieldError {
    pub fn new(field: impl Into<String>, message: impl Into<String>) -> Self {
        FieldError {
            field: field.into(),
            message: message.into(),
        }
    }
}

/// Longest free-text field, in bytes.
pub const MAX_TEXT_BYTES: usize = 2048;
/// Longest bundle id, in bytes.
pub const MAX_ID_BYTES: usize = 128;
/// Longest declaration name, in bytes.
pub const MAX_NAME_BYTES: usize = 64;
/// Largest bundle document accepted by sync, in bytes.
pub const MAX_BUNDLE_BYTES: usize = 8 * 1024 * 1024;
pub const MAX_PROFILES: usize = 4096;
pub const MAX_DECLARATIONS: usize = 4096;
pub const MAX_ARGV: usize = 256;
pub const MAX_TOOLSETS: usize = 64;
/// One day: a longer run should be a different kind of job.
pub const MAX_TIMEOUT_MS: u64 = 24 * 60 * 60 * 1000;

/// Substrings that betray host session, cache, socket or store material (compared in lower
/// case).
const FORBIDDEN_FRAGMENTS: &[&str] = &[
    ".cache",
    ".gaffer",
    ".yoi/sessions",
    ".yoi\\sessions",
    "/sessions/",
    "\\sessions\\",
    "/run/",
    "\\run\\",
    ".sock",
    "/sock",
    "\\sock",
    "socket=",
    "session_path",
    "cache_path",
];

/// Checks a free-text field against the boundary rules.
pub fn check_text(field: &str, value: &str) -> Result<(), FieldError> {
    if value.len() > MAX_TEXT_BYTES {
        return Err(FieldError::new(
            field,
            format!("is {} bytes; the limit is {MAX_TEXT_BYTES}", value.len()),
        ));
    }
    if value.chars().any(char::is_control) {
        return Err(FieldError::new(
            field,
            "must not contain control characters",
        ));
    }
    check_no_host_path(field, value.trim())
}

/// Refuses text that names a host location: absolute, home or drive paths and the fragments
/// of sockets, sessions and caches.
pub fn check_no_host_path(field: &str, value: &str) -> Result<(), FieldError> {
    if value.starts_with('/') || value.starts_with('\\') {
        return Err(FieldError::new(field, "must not be an absolute path"));
    }
    if value.starts_with('~') {
        return Err(FieldError::new(field, "must not be a home-directory path"));
    }
    if value.contains(":\\") || (value.contains(":/") && value.as_bytes().get(1) == Some(&b':')) {
        return Err(FieldError::new(field, "must not be a drive path"));
    }
    let lower = value.to_ascii_lowercase();
    if let Some(frag) = FORBIDDEN_FRAGMENTS.iter().find(|f| lower.contains(*f)) {
        return Err(FieldError::new(
            field,
            format!(
                "must not refer to socket, session, cache or store locations (contains `{frag}`)"
            ),
        ));
    }
    Ok(())
}

/// Checks a required free-text field.
pub fn check_required_text(field: &str, value: &str) -> Result<(), FieldError> {
    if value.trim().is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    check_text(field, value)
}

/// A bundle id: 1..=128 bytes of `[A-Za-z0-9-_.:]`, starting with a letter or digit.
pub fn check_bundle_id(field: &str, id: &str) -> Result<(), FieldError> {
    if id.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if id.len() > MAX_ID_BYTES {
        return Err(FieldError::new(
            field,
            format!("must be at most {MAX_ID_BYTES} bytes"),
        ));
    }
    if !id.as_bytes()[0].is_ascii_alphanumeric() {
        return Err(FieldError::new(field, "must start with a letter or digit"));
    }
    if !id
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'))
    {
        return Err(FieldError::new(
            field,
            "may contain only letters, digits and - _ . :",
        ));
    }
    Ok(())
}

/// A declaration's name (a secret's name too): 1..=64 bytes of `[A-Za-z0-9._-]`. It is shown
/// to the operator beside what the declaration grants, so it is a label, never text: free
/// text could pose as other declarations or pad the real ones out of a summary's bound.
pub fn check_name(field: &str, name: &str) -> Result<(), FieldError> {
    let token = name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if name.is_empty() || name.len() > MAX_NAME_BYTES || !token {
        return Err(FieldError::new(
            field,
            format!("must be 1 to {MAX_NAME_BYTES} letters, digits and . _ - (a name, not text)"),
        ));
    }
    Ok(())
}

/// A digest as gaffer writes it: `sha256:` and 64 lower-case hex digits.
pub fn check_digest(field: &str, digest: &str) -> Result<(), FieldError> {
    let ok = digest.strip_prefix("sha256:").is_some_and(|hex| {
        hex.len() == 64 && hex.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
    });
    if ok {
        Ok(())
    } else {
        Err(FieldError::new(
            field,
            "must be `sha256:` followed by 64 lower-case hex digits",
        ))
    }
}

/// Validates everything except the digest match (which needs the canonical encoding).
pub fn validate_bundle(bundle: &Bundle) -> Result<(), FieldError> {
    let m = &bundle.metadata;
    check_bundle_id("metadata.id", &m.id)?;
    if let Some(d) = &m.digest {
        check_digest("metadata.digest", d)?;
    }
    check_required_text("metadata.revision", &m.revision)?;
    check_required_text("metadata.created_at", &m.created_at)?;
    check_required_text("metadata.provenance.source", &m.provenance.source)?;
    if let Some(detail) = &m.provenance.detail {
        check_text("metadata.provenance.detail", detail)?;
    }

    if bundle.profiles.len() > MAX_PROFILES {
        return Err(FieldError::new(
            "profiles",
            format!("at most {MAX_PROFILES} profiles"),
        ));
    }
    let mut selectors = BTreeSet::new();
    for (i, p) in bundle.profiles.iter().enumerate() {
        let at = format!("profiles[{i}]");
        validate_profile(&at, p)?;
        if !selectors.insert(&p.selector) {
            return Err(FieldError::new(
                format!("{at}.selector"),
                format!("profile {} appears more than once", p.selector),
            ));
        }
    }

    if bundle.declarations.len() > MAX_DECLARATIONS {
        return Err(FieldError::new(
            "declarations",
            format!("at most {MAX_DECLARATIONS} declarations"),
        ));
    }
    let mut names = BTreeSet::new();
    for (i, d) in bundle.declarations.iter().enumerate() {
        let at = format!("declarations[{i}]");
        check_name(&format!("{at}.name"), &d.name)?;
        check_reference(&format!("{at}.reference"), d.kind, &d.reference)?;
        if !names.insert((d.kind, d.name.as_str())) {
            return Err(FieldError::new(
                format!("{at}.name"),
                format!(
                    "{} `{}` is declared more than once",
                    d.kind.as_str(),
                    d.name
                ),
            ));
        }
    }
    Ok(())
}

fn validate_profile(at: &str, p: &Profile) -> Result<(), FieldError> {
    check_required_text(&format!("{at}.selector.value"), p.selector.value())?;
    if let Some(label) = &p.label {
        check_text(&format!("{at}.label"), label)?;
    }
    if p.command.len() > MAX_ARGV {
        return Err(FieldError::new(
            format!("{at}.command"),
            format!("at most {MAX_ARGV} elements"),
        ));
    }
    for (j, arg) in p.command.iter().enumerate() {
        let field = format!("{at}.command[{j}]");
        if j == 0 {
            if arg.trim().is_empty() {
                return Err(FieldError::new(field, "the program name must not be empty"));
            }
            check_program(&field, arg)?;
        }
        if arg.len() > MAX_TEXT_BYTES {
            return Err(FieldError::new(
                field,
                format!("the limit is {MAX_TEXT_BYTES} bytes"),
            ));
        }
        // Arguments are passed verbatim, so only NUL (which cannot cross exec) and host
        // locations are refused; tabs or newlines inside an argument are legitimate.
        if arg.contains('\0') {
            return Err(FieldError::new(field, "must not contain NUL"));
        }
        check_no_host_path(&field, arg)?;
    }
    if let Some(t) = p.timeout_ms
        && (t == 0 || t > MAX_TIMEOUT_MS)
    {
        return Err(FieldError::new(
            format!("{at}.timeout_ms"),
            format!("must be between 1 and {MAX_TIMEOUT_MS}"),
        ));
    }
    if p.toolsets.len() > MAX_TOOLSETS {
        return Err(FieldError::new(
            format!("{at}.toolsets"),
            format!("at most {MAX_TOOLSETS}"),
        ));
    }
    let mut seen = BTreeSet::new();
    for (j, t) in p.toolsets.iter().enumerate() {
        let field = format!("{at}.toolsets[{j}]");
        check_required_text(&field, t)?;
        if !seen.insert(t) {
            return Err(FieldError::new(field, "toolset listed more than once"));
        }
    }
    if let Some(model) = &p.model {
        check_required_text(&format!("{at}.model"), model)?;
    }
    Ok(())
}

/// The program is looked up on PATH or, when it contains a slash, relative to the workspace
/// root; it may not climb out of the workspace.
fn check_program(field: &str, program: &str) -> Result<(), FieldError> {
    if program.chars().any(char::is_control) {
        return Err(FieldError::new(
            field,
            "must not contain control characters",
        ));
    }
    check_no_host_path(field, program)?;
    check_relative_path(field, program)
}

/// A workspace-relative path that stays inside the workspace when read lexically.
pub fn check_relative_path(field: &str, path: &str) -> Result<(), FieldError> {
    check_no_host_path(field, path)?;
    let mut depth: i64 = 0;
    for part in path.split(['/', '\\']) {
        match part {
            "" | "." => {}
            ".." => {
                depth -= 1;
                if depth < 0 {
                    return Err(FieldError::new(
                        field,
                        "must not lead outside the workspace",
                    ));
                }
            }
            _ => depth += 1,
        }
    }
    Ok(())
}

/// A declaration reference: a typed token with its kind's prefix.
fn check_reference(field: &str, kind: DeclarationKind, reference: &str) -> Result<(), FieldError> {
    let allowed = kind.prefixes();
    let token_ok = !reference.is_empty()
        && reference.len() <= 256
        && reference.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b':' | b'-' | b'_' | b'.' | b'@' | b'+')
        });
    if !token_ok {
        return Err(FieldError::new(
            field,
            format!(
                "must be a reference token of letters, digits and : - _ . @ + (at most 256 bytes) \
                 starting with one of {}; never the secret or path itself",
                allowed.join(", ")
            ),
        ));
    }
    let lower = reference.to_ascii_lowercase();
    if [
        ".cache",
        ".gaffer",
        ".yoi",
        ".sock",
        "socket",
        "session_path",
        "cache_path",
    ]
    .iter()
    .any(|f| lower.contains(f))
    {
        return Err(FieldError::new(
            field,
            "must not refer to socket, session, cache or store locations",
        ));
    }
    let rest = allowed.iter().find_map(|p| reference.strip_prefix(p));
    match rest {
        Some(rest) if !rest.is_empty() => {}
        _ => {
            return Err(FieldError::new(
                field,
                format!(
                    "a {} reference must start with one of {} followed by a name",
                    kind.as_str(),
                    allowed.join(", ")
                ),
            ));
        }
    }
    if kind == DeclarationKind::SecretRef
        && let Some(name) = reference.strip_prefix("env:")
    {
        let valid = name
            .bytes()
            .next()
            .is_some_and(|b| b.is_ascii_alphabetic() || b == b'_')
            && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
        if !valid {
            return Err(FieldError::new(
                field,
                "an env: reference must name a variable ([A-Za-z_][A-Za-z0-9_]*)",
            ));
        }
    }
    Ok(())
}
