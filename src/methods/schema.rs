//! `schema/`: the JSON Schema of every method's params and result and of every notification,
//! generated from the Rust types. `gaffer schema` writes it; a test fails when it is stale.

use std::collections::BTreeMap;
use std::path::Path;

use serde_json::{Value, json};

use super::initialize::{InitializeOptions, LspInitializeResult, mcp_revisions};
use crate::rpc::router::schema_of;
use crate::rpc::{Access, Audience};

/// File name for a method or notification (`patterns/select` → `patterns.select`).
fn stem(name: &str) -> String {
    name.replace('/', ".").replace('$', "_")
}

fn pretty(v: &Value) -> String {
    let mut s = serde_json::to_string_pretty(v).unwrap_or_default();
    s.push('\n');
    s
}

/// Every schema file, by path relative to `schema/`, with its exact contents.
pub fn generate() -> BTreeMap<String, String> {
    let router = super::router();
    let mut files = BTreeMap::new();
    let mut methods = Vec::new();
    for m in router.methods() {
        let s = stem(m.def.name);
        files.insert(
            format!("methods/{s}.params.json"),
            pretty(&m.params_schema().to_value()),
        );
        files.insert(
            format!("methods/{s}.result.json"),
            pretty(&m.result_schema().to_value()),
        );
        methods.push(json!({
            "name": m.def.name,
            "doc": m.def.doc,
            "access": match m.def.access { Access::Read => "read", Access::Write => "write" },
            "audience": match m.def.audience { Audience::Anyone => "anyone", Audience::Operator => "operator" },
            "mcp_tool": m.def.mcp_tool,
            "params": format!("methods/{s}.params.json"),
            "result": format!("methods/{s}.result.json"),
        }));
    }
    session_methods(&mut files, &mut methods);
    signed_payloads(&mut files);
    let mut notifications = Vec::new();
    for n in router.notifications() {
        let s = stem(n.name);
        files.insert(
            format!("notifications/{s}.json"),
            pretty(&n.schema().to_value()),
        );
        notifications.push(json!({
            "name": n.name,
            "doc": n.doc,
            "params": format!("notifications/{s}.json"),
        }));
    }
    files.insert(
        "initialize/options.json".to_string(),
        pretty(&schema_of::<InitializeOptions>().to_value()),
    );
    files.insert(
        "initialize/result.json".to_string(),
        pretty(&schema_of::<LspInitializeResult>().to_value()),
    );
    files.insert(
        "index.json".to_string(),
        pretty(&json!({
            "generated_by": "gaffer schema",
            "jsonrpc": "2.0",
            "initialize": {
                "doc": "LSP and raw clients: `initialize` params may carry `initializationOptions` (see `options`); the result is `result`. Raw (NDJSON) clients may skip the handshake. Params `[]` are taken as `{}` (clients that cannot tell them apart).",
                "options": "initialize/options.json",
                "result": "initialize/result.json",
                "roles": ["agent", "operator"],
            },
            "mcp": mcp_revisions(),
            "methods": methods,
            "notifications": notifications,
        })),
    );
    files
}

/// Methods the session answers itself (not in the router): operator login.
fn session_methods(files: &mut BTreeMap<String, String>, methods: &mut Vec<Value>) {
    use super::identity::{ChallengeResult, LoginParams, LoginResult};
    let empty = json!({"$schema": "https://json-schema.org/draft/2020-12/schema", "type": "object", "additionalProperties": false});
    let entries = [
        (
            "operator/challenge",
            "A fresh operator-login challenge for this connection (LSP and raw profiles; never MCP).",
            empty,
            schema_of::<ChallengeResult>().to_value(),
        ),
        (
            "operator/login",
            "Prove the operator key: the signature of this connection's last challenge. The private key never crosses the wire.",
            schema_of::<LoginParams>().to_value(),
            schema_of::<LoginResult>().to_value(),
        ),
    ];
    for (name, doc, params, result) in entries {
        let s = stem(name);
        files.insert(format!("methods/{s}.params.json"), pretty(&params));
        files.insert(format!("methods/{s}.result.json"), pretty(&result));
        methods.push(json!({
            "name": name, "doc": doc, "access": "read", "audience": "anyone", "mcp_tool": null,
            "params": format!("methods/{s}.params.json"),
            "result": format!("methods/{s}.result.json"),
        }));
    }
}

/// What the operator signs, for editors that build or check payloads themselves.
fn signed_payloads(files: &mut BTreeMap<String, String>) {
    use crate::operations::decision::{DecisionPayload, RevokePayload};
    let entries = [
        ("decision", schema_of::<DecisionPayload>().to_value()),
        ("revoke", schema_of::<RevokePayload>().to_value()),
        (
            "trust",
            schema_of::<crate::operations::trust::TrustPayload>().to_value(),
        ),
        (
            "client",
            schema_of::<crate::clients::CredentialPayload>().to_value(),
        ),
        (
            "client-revoke",
            schema_of::<crate::clients::ClientRevokePayload>().to_value(),
        ),
    ];
    for (name, schema) in entries {
        files.insert(format!("payloads/{name}.json"), pretty(&schema));
    }
}

/// Writes the schema tree under `dir`, removing stale `.json` files.
pub fn write(dir: &Path) -> std::io::Result<usize> {
    let files = generate();
    for sub in ["methods", "notifications", "payloads", "initialize"] {
        let d = dir.join(sub);
        if d.is_dir() {
            for e in std::fs::read_dir(&d)?.flatten() {
                let rel = format!("{sub}/{}", e.file_name().to_string_lossy());
                if !files.contains_key(&rel) {
                    std::fs::remove_file(e.path())?;
                }
            }
        }
    }
    for (rel, body) in &files {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)?;
        }
        std::fs::write(path, body)?;
    }
    Ok(files.len())
}

/// Paths whose checked-in contents differ from what the types generate.
pub fn stale(dir: &Path) -> Vec<String> {
    let files = generate();
    let mut out: Vec<String> = files
        .iter()
        .filter(|(rel, body)| {
            std::fs::read_to_string(dir.join(rel)).ok().as_deref() != Some(body.as_str())
        })
        .map(|(rel, _)| rel.clone())
        .collect();
    for sub in ["methods", "notifications", "payloads", "initialize"] {
        if let Ok(entries) = std::fs::read_dir(dir.join(sub)) {
            for e in entries.flatten() {
                let rel = format!("{sub}/{}", e.file_name().to_string_lossy());
                if !files.contains_key(&rel) {
                    out.push(rel);
                }
            }
        }
    }
    out
}
