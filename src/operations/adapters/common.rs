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

/// Declarations as a summary shows them: `kind name=reference`, separated by `; `.
pub fn declarations_shown(declarations: &[crate::bundles::Declaration]) -> String {
    declarations
        .iter()
        .map(|d| format!("{} {}={}", d.kind.as_str(), d.name, d.reference))
        .collect::<Vec<_>>()
        .join("; ")
}
