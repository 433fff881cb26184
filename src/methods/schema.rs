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

/// Writes the schema tree under `dir`, removing stale `.json` files.
pub fn write(dir: &Path) -> std::io::Result<usize> {
    let files = generate();
    for sub in ["methods", "notifications", "initialize"] {
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
    for sub in ["methods", "notifications", "initialize"] {
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
