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
    let counts: Vec<String> = crate::bundles::DeclarationKind::ALL
        .into_iter()
        .filter_map(|k| {
            let n = declarations.iter().filter(|d| d.kind == k).count();
            (n > 0).then(|| format!("{} {n}", k.as_str()))
        })
        .collect();
    let grants: Vec<String> = declarations
        .iter()
        .map(|d| format!("{} {}", d.kind.as_str(), shown_field(&d.reference)))
        .collect();
    let names: Vec<String> = declarations.iter().map(|d| shown_field(&d.name)).collect();
    format!(
        "declarations {} ({}): {}; named {}",
        declarations.len(),
        counts.join(", "),
        grants.join(", "),
        names.join(", ")
    )
}

/// `s` cut to [`SHOWN_FIELD_CHARS`], the cut marked.
fn shown_field(s: &str) -> String {
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
                "declarations 2 (secret_ref 1, mount_grant 1): secret_ref env:TOKEN, \
                 mount_grant mount:write:HOME; named token, {}",
                "n".repeat(64)
            )
        );
        assert_eq!(declarations_shown(&[]), "declarations none");
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
