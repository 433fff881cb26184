//! Helpers shared by the built-in adapters.

use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde_json::Value;

use super::super::adapter::{AdapterError, Decoded};

/// Decodes `v` into a closed (deny_unknown_fields) type, naming the offending field.
pub fn decode_closed<T: DeserializeOwned>(root: &str, v: &Value) -> Result<T, AdapterError> {
    if !v.is_object() {
        return Err(AdapterError::input(
            Some(root),
            format!("{root} must be a JSON object"),
        ));
    }
    serde_path_to_error::deserialize(v).map_err(|e| {
        let path = e.path().to_string();
        let field = if path == "." {
            root.to_string()
        } else {
            format!("{root}.{path}")
        };
        let msg = e.into_inner().to_string();
        AdapterError::input(Some(&field), msg)
    })
}

/// JSON Schema of a closed input type, for the catalog.
pub fn schema_of<T: JsonSchema>() -> super::super::adapter::SchemaDoc {
    super::super::adapter::SchemaDoc::of::<T>()
}

pub fn to_value<T: serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

pub fn ready<'a, T: Send + 'a>(v: T) -> super::super::adapter::BoxFuture<'a, T> {
    Box::pin(async move { v })
}

/// Decodes target and arguments into the provider's closed types `T` and `A` and re-encodes
/// them canonically: the `decode` step of a provider with typed input.
pub fn decode_typed<T, A>(target: &Value, arguments: &Value) -> Result<Decoded, AdapterError>
where
    T: DeserializeOwned + serde::Serialize,
    A: DeserializeOwned + serde::Serialize,
{
    let t: T = decode_closed("target", target)?;
    let a: A = decode_closed("arguments", arguments)?;
    Ok(Decoded {
        target: to_value(&t),
        arguments: to_value(&a),
    })
}

/// A bundle's secrets and declarations as classification fields (`secrets`: names;
/// `declarations`: `kind:name:reference`). An allow rule covers them only by naming them:
/// secrets always, declarations when one grants something (a mount, a port) beyond secrets.
pub fn declaration_fields(
    secrets: &[String],
    declarations: &[crate::bundles::Declaration],
    fields: &mut std::collections::BTreeMap<String, std::collections::BTreeSet<String>>,
    must_name: &mut std::collections::BTreeSet<String>,
) {
    if !secrets.is_empty() {
        fields.insert("secrets".into(), secrets.iter().cloned().collect());
        must_name.insert("secrets".to_string());
    }
    if declarations.is_empty() {
        return;
    }
    if declarations
        .iter()
        .any(|d| d.kind != crate::bundles::DeclarationKind::SecretRef)
    {
        must_name.insert("declarations".to_string());
    }
    let decls = declarations
        .iter()
        .map(|d| format!("{}:{}:{}", d.kind.as_str(), d.name, d.reference))
        .collect();
    fields.insert("declarations".into(), decls);
}

/// Longest reference or name a summary shows of one declaration, in characters.
const SHOWN_FIELD_CHARS: usize = 64;

/// Declarations as a summary shows them, what they grant first: how many of each kind, then
/// every declaration's kind and reference, then their names (`declarations 2 (secret_ref 1,
/// mount_grant 1): secret_ref env:TOKEN, mount_grant mount:read:HOME; named token, home`).
/// A summary is cut at its bound, so no one field may push the grants out of it: each
/// reference and name shows at most 64 characters, and a list too long to fit still begins
/// with its count of each kind.
pub fn declarations_shown(declarations: &[crate::bundles::Declaration]) -> String {
    if declarations.is_empty() {
        return "declarations none".to_string();
    }
    // Riskiest first, counted by what they grant (a write mount apart from read mounts), so
    // padding with harmless ones cannot push a write mount, a port or a secret past the cut.
    let mut ordered: Vec<&crate::bundles::Declaration> = declarations.iter().collect();
    ordered.sort_by_key(|d| risk_rank(&d.reference));
    let mut counts: Vec<(String, usize)> = Vec::new();
    for d in &ordered {
        let grant = grant_of(&d.reference);
        match counts.iter_mut().find(|(g, _)| *g == grant) {
            Some((_, n)) => *n += 1,
            None => counts.push((grant, 1)),
        }
    }
    let counts: Vec<String> = counts.iter().map(|(g, n)| format!("{g} {n}")).collect();
    let grants: Vec<String> = ordered
        .iter()
        .map(|d| format!("{} {}", d.kind.as_str(), shown_field(&d.reference)))
        .collect();
    let names: Vec<String> = ordered.iter().map(|d| shown_field(&d.name)).collect();
    format!(
        "declarations {} ({}): {}; named {}",
        declarations.len(),
        counts.join(", "),
        grants.join(", "),
        names.join(", ")
    )
}

/// What a declaration's reference grants, without the variable or port it names:
/// `mount:write`, `mount:read`, `network:tcp-connect`, `env` (a secret).
fn grant_of(reference: &str) -> String {
    let mut parts = reference.splitn(3, ':');
    match (parts.next(), parts.next(), parts.next()) {
        (Some(scheme), Some(mode), Some(_)) => shown_field(&format!("{scheme}:{mode}")),
        (Some(scheme), _, _) => shown_field(scheme),
        _ => String::new(),
    }
}

/// How much a reference widens the sandbox: write mounts, then networks, then secrets, then
/// read mounts, then anything else.
fn risk_rank(reference: &str) -> u8 {
    match grant_of(reference).as_str() {
        "mount:write" => 0,
        g if g.starts_with("network:") => 1,
        "env" => 2,
        "mount:read" => 3,
        _ => 4,
    }
}

/// `s` cut to [`SHOWN_FIELD_CHARS`], the cut marked.
pub fn shown_field(s: &str) -> String {
    if s.chars().count() <= SHOWN_FIELD_CHARS {
        return s.to_string();
    }
    let mut cut: String = s.chars().take(SHOWN_FIELD_CHARS - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bundles::{Declaration, DeclarationKind};

    fn decl(kind: DeclarationKind, name: &str, reference: &str) -> Declaration {
        Declaration {
            kind,
            name: name.into(),
            reference: reference.into(),
        }
    }

    #[test]
    fn every_kind_and_reference_comes_before_the_names() {
        let shown = declarations_shown(&[
            decl(DeclarationKind::SecretRef, "token", "env:TOKEN"),
            decl(
                DeclarationKind::MountGrant,
                &"n".repeat(64),
                "mount:write:HOME",
            ),
        ]);
        assert_eq!(
            shown,
            format!(
                "declarations 2 (mount:write 1, env 1): mount_grant mount:write:HOME, \
                 secret_ref env:TOKEN; named {}, token",
                "n".repeat(64)
            )
        );
        assert_eq!(declarations_shown(&[]), "declarations none");
    }

    /// A second reader's padding: six read mounts with long references before a write mount
    /// pushed it past a summary's cut. The riskiest come first, counted by what they grant.
    #[test]
    fn a_write_mount_comes_first_whatever_precedes_it() {
        let mut decls: Vec<Declaration> = (0..6)
            .map(|i| {
                decl(
                    DeclarationKind::MountGrant,
                    &format!("docs{i}"),
                    &format!("mount:read:DOCS_DIR_{i}_{}", "A".repeat(50)),
                )
            })
            .collect();
        decls.push(decl(
            DeclarationKind::MountGrant,
            "home",
            "mount:write:HOME",
        ));
        decls.push(decl(
            DeclarationKind::NetworkPolicy,
            "api",
            "network:tcp-connect:443",
        ));
        let shown = declarations_shown(&decls);
        assert!(
            shown.starts_with(
                "declarations 8 (mount:write 1, network:tcp-connect 1, mount:read 6): \
                 mount_grant mount:write:HOME, network_policy network:tcp-connect:443, "
            ),
            "{shown}"
        );
    }

    #[test]
    fn a_long_field_is_cut_and_marked() {
        let long = format!("mount:write:{}", "H".repeat(300));
        let shown = declarations_shown(&[decl(DeclarationKind::MountGrant, "m", &long)]);
        let cut = format!("{}…", &long[..63]);
        assert!(
            shown.contains(&format!("mount_grant {cut}; named m")),
            "{shown}"
        );
    }
}
