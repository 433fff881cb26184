//! JSON-RPC 2.0 messages: ids, incoming classification, replies and errors.

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::outbox::Message;

/// A request id: JSON-RPC allows numbers and strings (we refuse fractional numbers and null).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Id {
    Int(i64),
    Str(String),
}

impl Id {
    fn from_value(v: &Value) -> Option<Id> {
        match v {
            Value::Number(n) => n.as_i64().map(Id::Int),
            Value::String(s) => Some(Id::Str(s.clone())),
            _ => None,
        }
    }
}

impl std::fmt::Display for Id {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Id::Int(n) => write!(f, "{n}"),
            Id::Str(s) => write!(f, "{s:?}"),
        }
    }
}

/// Standard JSON-RPC error codes, plus LSP's request-cancelled.
pub mod codes {
    pub const PARSE_ERROR: i64 = -32700;
    pub const INVALID_REQUEST: i64 = -32600;
    pub const METHOD_NOT_FOUND: i64 = -32601;
    pub const INVALID_PARAMS: i64 = -32602;
    pub const INTERNAL_ERROR: i64 = -32603;
    pub const SERVER_NOT_INITIALIZED: i64 = -32002;
    pub const REQUEST_CANCELLED: i64 = -32800;
}

/// Application error classes. Each has a stable number; the precise reason travels as the
/// machine string `data.code` (e.g. `idempotency_conflict`), which clients should match on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AppCode {
    NotFound,
    Conflict,
    Forbidden,
    Unavailable,
    Failed,
    Store,
}

impl AppCode {
    pub fn number(self) -> i64 {
        match self {
            AppCode::NotFound => -32001,
            AppCode::Conflict => -32010,
            AppCode::Forbidden => -32003,
            AppCode::Unavailable => -32004,
            AppCode::Failed => -32005,
            AppCode::Store => -32006,
        }
    }
}

/// An error reply. `message` is for humans; `data.code` is the stable machine reason.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, thiserror::Error)]
#[error("{message} ({code})")]
pub struct RpcError {
    pub code: i64,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<Value>,
}

impl RpcError {
    pub fn new(code: i64, machine: &str, message: impl Into<String>) -> Self {
        RpcError {
            code,
            message: message.into(),
            data: Some(json!({ "code": machine })),
        }
    }
    pub fn parse_error(message: impl Into<String>) -> Self {
        Self::new(codes::PARSE_ERROR, "parse_error", message)
    }
    pub fn invalid_request(message: impl Into<String>) -> Self {
        Self::new(codes::INVALID_REQUEST, "invalid_request", message)
    }
    pub fn method_not_found(method: &str) -> Self {
        Self::new(
            codes::METHOD_NOT_FOUND,
            "method_not_found",
            format!("unknown method `{method}`"),
        )
        .with_data("method", method)
    }
    /// Bad params: `field` is the offending field's path (e.g. `scopes[2]`), or "" for the whole.
    pub fn invalid_params(field: &str, message: impl Into<String>) -> Self {
        Self::new(codes::INVALID_PARAMS, "invalid_params", message).with_data("field", field)
    }
    pub fn cancelled() -> Self {
        Self::new(codes::REQUEST_CANCELLED, "cancelled", "request cancelled")
    }
    /// An internal failure. The detail goes to the log, never to the peer.
    pub fn internal(context: &str) -> Self {
        Self::new(
            codes::INTERNAL_ERROR,
            "internal_error",
            format!("internal error while {context}; see the server log"),
        )
    }
    pub fn app(code: AppCode, machine: &str, message: impl Into<String>) -> Self {
        Self::new(code.number(), machine, message)
    }
    /// The stable machine reason (`data.code`).
    pub fn machine_code(&self) -> Option<&str> {
        self.data.as_ref()?.get("code")?.as_str()
    }
    /// The field an invalid-params error names.
    pub fn field(&self) -> Option<&str> {
        self.data.as_ref()?.get("field")?.as_str()
    }
    pub fn with_data(mut self, key: &str, value: impl Into<Value>) -> Self {
        let mut map = match self.data.take() {
            Some(Value::Object(m)) => m,
            _ => Map::new(),
        };
        map.insert(key.to_string(), value.into());
        self.data = Some(Value::Object(map));
        self
    }
}

/// What one decoded frame turned out to be.
#[derive(Debug)]
pub enum Incoming {
    Request {
        id: Id,
        method: String,
        params: Value,
    },
    Notification {
        method: String,
        params: Value,
    },
    /// A reply to something we sent; gaffer sends no requests, so these are ignored.
    Response,
    /// Not a valid message; `id` is echoed when it could be read.
    Invalid {
        id: Option<Id>,
        error: RpcError,
    },
}

/// Classifies one JSON value (an element of a batch or a whole frame).
pub fn classify(value: Value) -> Incoming {
    let Value::Object(mut obj) = value else {
        return Incoming::Invalid {
            id: None,
            error: RpcError::invalid_request("a message must be a JSON object"),
        };
    };
    let id_value = obj.remove("id");
    let id = match &id_value {
        None => None,
        Some(v) => match Id::from_value(v) {
            Some(id) => Some(id),
            None => {
                return Incoming::Invalid {
                    id: None,
                    error: RpcError::invalid_request(
                        "`id` must be a string or an integer".to_string(),
                    ),
                };
            }
        },
    };
    if obj.get("jsonrpc").and_then(Value::as_str) != Some("2.0") {
        return Incoming::Invalid {
            id,
            error: RpcError::invalid_request("`jsonrpc` must be \"2.0\""),
        };
    }
    let method = match obj.remove("method") {
        Some(Value::String(m)) => m,
        Some(_) => {
            return Incoming::Invalid {
                id,
                error: RpcError::invalid_request("`method` must be a string"),
            };
        }
        None => {
            if obj.contains_key("result") || obj.contains_key("error") {
                return Incoming::Response;
            }
            return Incoming::Invalid {
                id,
                error: RpcError::invalid_request("missing `method`"),
            };
        }
    };
    let params = match obj.remove("params") {
        None | Some(Value::Null) => Value::Object(Map::new()),
        Some(p @ Value::Object(_)) => p,
        // Some clients (Neovim's Lua encoder) cannot tell `{}` from `[]`: no params.
        Some(Value::Array(a)) if a.is_empty() => Value::Object(Map::new()),
        Some(Value::Array(_)) => {
            let error =
                RpcError::invalid_params("params", "params must be given by name (an object)");
            return match id {
                Some(id) => Incoming::Invalid {
                    id: Some(id),
                    error,
                },
                None => Incoming::Notification {
                    method,
                    params: Value::Null,
                },
            };
        }
        Some(_) => {
            return Incoming::Invalid {
                id,
                error: RpcError::invalid_request("`params` must be an object"),
            };
        }
    };
    match id {
        Some(id) => Incoming::Request { id, method, params },
        None => Incoming::Notification { method, params },
    }
}

/// The top-level `id` of a JSON object that did not parse (too deep, or cut), found by a scan
/// that tracks only strings and nesting, so it works however deep the rest goes.
pub fn recover_id(body: &[u8]) -> Option<Id> {
    let first = body.iter().position(|b| !b.is_ascii_whitespace())?;
    if body[first] != b'{' {
        return None;
    }
    let (mut depth, mut expect_key, mut i) = (0usize, false, first);
    while i < body.len() {
        match body[i] {
            b'"' => {
                let end = string_end(body, i)?;
                if depth == 1 && expect_key && &body[i..=end] == b"\"id\"" {
                    let colon = skip_ws(body, end + 1);
                    if body.get(colon) != Some(&b':') {
                        return None;
                    }
                    let v = skip_ws(body, colon + 1);
                    let stop = match body.get(v) {
                        Some(b'"') => string_end(body, v)? + 1,
                        _ => (v..body.len())
                            .find(|&j| {
                                matches!(body[j], b',' | b'}' | b' ' | b'\n' | b'\r' | b'\t')
                            })
                            .unwrap_or(body.len()),
                    };
                    let value: Value = serde_json::from_slice(&body[v..stop]).ok()?;
                    return Id::from_value(&value);
                }
                expect_key = false;
                i = end;
            }
            b'{' => {
                depth += 1;
                expect_key = depth == 1;
            }
            b'[' => depth += 1,
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' => expect_key = depth == 1,
            _ => {}
        }
        i += 1;
    }
    None
}

/// Index of the quote closing the string that opens at `start`.
fn string_end(body: &[u8], start: usize) -> Option<usize> {
    let mut j = start + 1;
    while j < body.len() {
        match body[j] {
            b'\\' => j += 2,
            b'"' => return Some(j),
            _ => j += 1,
        }
    }
    None
}

fn skip_ws(body: &[u8], from: usize) -> usize {
    (from..body.len())
        .find(|&j| !body[j].is_ascii_whitespace())
        .unwrap_or(body.len())
}

/// A success reply body.
pub fn reply_ok(id: &Id, result: Value) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "result": result })
}

/// A success reply whose result is already encoded JSON (spliced in, never re-parsed).
pub fn reply_ok_raw(id: &Id, result: &str) -> String {
    let head = reply_head(id);
    // Sized once: `format!` cannot know the result's length and would grow (and copy) a
    // multi-megabyte result several times.
    let mut out = String::with_capacity(head.len() + result.len() + 1);
    out.push_str(&head);
    out.push_str(result);
    out.push('}');
    out
}

/// A success reply around its already-encoded result, which is handed over as it is: the
/// writer puts the pieces together as it frames them (no copy into a reply string of its own).
pub fn reply_ok_spliced(id: &Id, result: String) -> Message {
    Message::Spliced {
        head: reply_head(id),
        body: result,
        tail: "}",
    }
}

/// A success reply's text up to its result.
fn reply_head(id: &Id) -> String {
    let id = serde_json::to_string(id).unwrap_or_else(|_| "null".into());
    let mut head = String::with_capacity(REPLY_HEAD.len() + id.len() + REPLY_RESULT.len());
    head.push_str(REPLY_HEAD);
    head.push_str(&id);
    head.push_str(REPLY_RESULT);
    head
}

/// A success reply whose result `write` appends straight into the reply's buffer (no result
/// string of its own to copy in). `write` appends UTF-8 only; should it not, the reply is an
/// internal error rather than a corrupt frame.
pub fn reply_ok_writing(id: &Id, size_hint: usize, write: impl FnOnce(&mut Vec<u8>)) -> String {
    let head = reply_head(id);
    let mut out = Vec::with_capacity(head.len() + size_hint + 1);
    out.extend_from_slice(head.as_bytes());
    write(&mut out);
    out.push(b'}');
    String::from_utf8(out).unwrap_or_else(|_| {
        encode(&reply_err(
            Some(id),
            &RpcError::internal("encoding the reply"),
        ))
    })
}

/// A success reply's text around its id and result (the bytes serde_json writes for them).
const REPLY_HEAD: &str = "{\"jsonrpc\":\"2.0\",\"id\":";
const REPLY_RESULT: &str = ",\"result\":";

/// Encodes a message for the wire (a `Value` always encodes; keys are strings).
pub fn encode(v: &Value) -> String {
    serde_json::to_string(v).unwrap_or_else(|_| {
        "{\"jsonrpc\":\"2.0\",\"id\":null,\"error\":{\"code\":-32603,\"message\":\"unencodable reply\"}}".into()
    })
}

/// An error reply body (`id` null when it could not be read).
pub fn reply_err(id: Option<&Id>, error: &RpcError) -> Value {
    json!({ "jsonrpc": "2.0", "id": id, "error": error })
}

/// A notification body.
pub fn notification(method: &str, params: Value) -> Value {
    json!({ "jsonrpc": "2.0", "method": method, "params": params })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_raw_reply_is_the_envelope_serde_would_write_around_the_result() {
        let result =
            serde_json::value::RawValue::from_string(r#"{"a":[1,"x\"y"]}"#.into()).expect("raw");
        for id in [Id::Int(-3), Id::Str("q\"1".into())] {
            let text = reply_ok_raw(&id, result.get());
            let parsed: Value = serde_json::from_str(&text).expect("a reply is JSON");
            assert_eq!(
                parsed,
                json!({"jsonrpc": "2.0", "id": id, "result": {"a": [1, "x\"y"]}})
            );
            assert_eq!(text.len(), text.capacity(), "sized once");
            let written =
                reply_ok_writing(&id, 0, |out| out.extend_from_slice(result.get().as_bytes()));
            assert_eq!(written, text, "written in place: the same bytes");
            let spliced = reply_ok_spliced(&id, result.get().to_owned());
            assert_eq!(spliced.len(), text.len());
            assert_eq!(spliced.into_string(), text, "spliced: the same bytes");
            let bad = reply_ok_writing(&id, 0, |out| out.extend_from_slice(&[b'"', 0xff, b'"']));
            let parsed: Value = serde_json::from_str(&bad).expect("still a JSON reply");
            assert_eq!(parsed["error"]["code"], codes::INTERNAL_ERROR, "{bad}");
        }
    }

    #[test]
    fn classifies_requests_notifications_and_junk() {
        let r = classify(json!({"jsonrpc":"2.0","id":7,"method":"m","params":{"a":1}}));
        assert!(matches!(r, Incoming::Request { id: Id::Int(7), ref method, .. } if method == "m"));
        let n = classify(json!({"jsonrpc":"2.0","method":"n"}));
        assert!(matches!(n, Incoming::Notification { .. }));
        let bad = classify(json!({"jsonrpc":"1.0","id":"x","method":"m"}));
        assert!(matches!(bad, Incoming::Invalid { id: Some(Id::Str(ref s)), .. } if s == "x"));
        let pos = classify(json!({"jsonrpc":"2.0","id":1,"method":"m","params":[1]}));
        match pos {
            Incoming::Invalid { error, .. } => assert_eq!(error.code, codes::INVALID_PARAMS),
            other => panic!("expected invalid, got {other:?}"),
        }
        assert!(matches!(
            classify(json!(3)),
            Incoming::Invalid { id: None, .. }
        ));
        assert!(matches!(
            classify(json!({"jsonrpc":"2.0","id":1,"result":{}})),
            Incoming::Response
        ));
        assert!(matches!(
            classify(json!({"jsonrpc":"2.0","id":1.5,"method":"m"})),
            Incoming::Invalid { id: None, .. }
        ));
    }

    #[test]
    fn the_id_of_an_unreadable_object_is_recovered() {
        let deep = format!(
            r#"{{"jsonrpc":"2.0","params":{{"a":"}}\"id","x":{}{}}},"id": 7,"method":"m"}}"#,
            "[".repeat(5000),
            "]".repeat(5000)
        );
        assert!(serde_json::from_str::<Value>(&deep).is_err());
        assert_eq!(recover_id(deep.as_bytes()), Some(Id::Int(7)));
        assert_eq!(
            recover_id(br#"{"method":"m","id":"abc","params":[[[["#),
            Some(Id::Str("abc".into()))
        );
        assert_eq!(recover_id(br#"{"params":{"id":1}}"#), None);
        assert_eq!(recover_id(br#"[{"id":1}]"#), None);
    }

    #[test]
    fn errors_carry_machine_code_and_field() {
        let e = RpcError::invalid_params("scopes[1]", "expected a string");
        assert_eq!(e.machine_code(), Some("invalid_params"));
        assert_eq!(e.field(), Some("scopes[1]"));
        let v = reply_err(Some(&Id::Int(1)), &e);
        assert_eq!(v["error"]["data"]["field"], "scopes[1]");
    }
}
