//! Checks every reply and notification an e2e test receives against `schema/`, so the schema
//! and the wire cannot drift apart.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use serde_json::Value;

/// What a request was, to know which schema its reply follows.
#[derive(Clone, Debug)]
pub enum Sent {
    /// A gaffer method called directly.
    Method(String),
    /// An MCP `tools/call` of the tool for this gaffer method.
    Tool(String),
    Initialize,
    /// Protocol methods with no gaffer schema (ping, shutdown, tools/list, ...).
    Other,
}

pub struct Schemas {
    dir: PathBuf,
    index: Value,
    compiled: std::sync::Mutex<HashMap<String, Arc<jsonschema::Validator>>>,
}

pub fn schemas() -> &'static Schemas {
    static S: OnceLock<Schemas> = OnceLock::new();
    S.get_or_init(|| {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("schema");
        let index = read(&dir.join("index.json"));
        Schemas {
            dir,
            index,
            compiled: Default::default(),
        }
    })
}

fn read(path: &Path) -> Value {
    let text = std::fs::read_to_string(path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

impl Schemas {
    fn entry(&self, list: &str, name: &str) -> Option<&Value> {
        self.index[list]
            .as_array()?
            .iter()
            .find(|m| m["name"] == name)
    }

    /// The gaffer method offered as MCP tool `tool`.
    pub fn method_of_tool(&self, tool: &str) -> Option<String> {
        self.index["methods"]
            .as_array()?
            .iter()
            .find(|m| m["mcp_tool"] == tool)
            .and_then(|m| m["name"].as_str())
            .map(str::to_string)
    }

    fn validator(&self, rel: &str) -> Arc<jsonschema::Validator> {
        let mut compiled = self.compiled.lock().unwrap_or_else(|p| p.into_inner());
        Arc::clone(compiled.entry(rel.to_string()).or_insert_with(|| {
            let schema = read(&self.dir.join(rel));
            Arc::new(
                jsonschema::validator_for(&schema)
                    .unwrap_or_else(|e| panic!("schema/{rel} is not a valid schema: {e}")),
            )
        }))
    }

    fn check(&self, rel: &str, what: &str, instance: &Value) {
        let v = self.validator(rel);
        let errors: Vec<String> = v
            .iter_errors(instance)
            .map(|e| format!("{} at {}", e, e.instance_path()))
            .collect();
        assert!(
            errors.is_empty(),
            "{what} does not match schema/{rel}: {errors:?}\n{instance}"
        );
    }

    /// Panics when `msg` (a reply to `sent`, or a notification) breaks its schema.
    pub fn check_message(&self, msg: &Value, sent: Option<&Sent>) {
        if let Some(method) = msg.get("method").and_then(Value::as_str) {
            if msg.get("id").is_none() {
                self.check_notification(method, msg.get("params").unwrap_or(&Value::Null));
            }
            return;
        }
        if let Some(err) = msg.get("error") {
            check_error(err);
            return;
        }
        let Some(result) = msg.get("result") else {
            panic!("a reply with neither result nor error: {msg}");
        };
        match sent {
            Some(Sent::Method(m)) => {
                if let Some(e) = self.entry("methods", m) {
                    let rel = e["result"].as_str().expect("index result path");
                    self.check(rel, &format!("result of {m}"), result);
                }
            }
            Some(Sent::Tool(m)) => self.check_tool_result(m, result),
            Some(Sent::Initialize) if result.get("protocolVersion").is_none() => {
                self.check("initialize/result.json", "initialize result", result);
            }
            _ => {}
        }
    }

    fn check_notification(&self, method: &str, params: &Value) {
        if let Some(e) = self.entry("notifications", method) {
            let rel = e["params"].as_str().expect("index params path");
            self.check(rel, &format!("notification {method}"), params);
        } else {
            assert!(
                matches!(method, "$/progress" | "notifications/progress"),
                "notification {method} is not described in schema/"
            );
        }
    }

    /// A tool result's `structuredContent` is the method's result (or `{"result": …}`).
    fn check_tool_result(&self, method: &str, result: &Value) {
        assert!(
            result["content"].is_array(),
            "tool result without content: {result}"
        );
        if result["isError"] == true {
            check_error(&result["structuredContent"]["error"]);
            return;
        }
        let Some(e) = self.entry("methods", method) else {
            return;
        };
        let rel = e["result"].as_str().expect("index result path");
        let schema = read(&self.dir.join(rel));
        let structured = &result["structuredContent"];
        let value = if schema["type"] == "object" {
            structured
        } else {
            &structured["result"]
        };
        self.check(rel, &format!("structuredContent of {method}"), value);
    }
}

/// A JSON-RPC error object: integer code, message, optional data object with a string `code`.
fn check_error(err: &Value) {
    assert!(err["code"].is_i64(), "error without an integer code: {err}");
    assert!(err["message"].is_string(), "error without a message: {err}");
    if let Some(data) = err.get("data") {
        assert!(data.is_object(), "error data is not an object: {err}");
        if let Some(code) = data.get("code") {
            assert!(code.is_string(), "data.code is not a string: {err}");
        }
    }
}
