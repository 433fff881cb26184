//! Boundary validation of worker requests.
//!
//! Requests are read from raw JSON so that every refusal names the exact field: a field the
//! create contract forbids (a raw path, cwd, socket, credential, session path, a caller-chosen
//! worker id...) gets its own explanation, anything else unknown is refused as unknown, and
//! segments of an unknown kind are refused by position.

use std::path::Path;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};

use super::types::Segment;
use crate::bundles::validate::{check_bundle_id, check_digest, check_relative_path, check_text};
use crate::bundles::{BundleRef, FieldError, ProfileSelector, jcs};

/// Largest total text of one input (all segments), in bytes.
pub const MAX_INPUT_BYTES: usize = 1024 * 1024;
pub const MAX_SEGMENTS: usize = 256;
pub const MAX_PATH_BYTES: usize = 1024;
pub const MAX_KEY_BYTES: usize = 128;

/// Fields the create contract refuses outright, with the reason given to the caller.
const FORBIDDEN_CREATE_FIELDS: &[(&str, &str)] = &[
    (
        "worker_id",
        "worker ids are issued by workers/create, never chosen by the caller",
    ),
    (
        "id",
        "worker ids are issued by workers/create, never chosen by the caller",
    ),
    (
        "cwd",
        "workers run in the workspace root; a working directory is not accepted",
    ),
    (
        "working_directory",
        "workers run in the workspace root; a working directory is not accepted",
    ),
    (
        "working_directory_request",
        "working directories are not materialised by workers/create",
    ),
    (
        "workdir",
        "workers run in the workspace root; a working directory is not accepted",
    ),
    (
        "workspace_root",
        "the workspace root is gaffer's own; it is not accepted from callers",
    ),
    (
        "workspace",
        "the workspace is the one gaffer serves; it is not accepted from callers",
    ),
    (
        "workspace_refs",
        "workspace references are not part of worker creation",
    ),
    (
        "mount_refs",
        "mounts are declared in the config bundle, not passed at creation",
    ),
    (
        "mounts",
        "mounts are declared in the config bundle, not passed at creation",
    ),
    (
        "path",
        "raw paths are not accepted; pass files as file_ref input segments",
    ),
    ("socket", "sockets are not accepted at worker creation"),
    ("socket_path", "sockets are not accepted at worker creation"),
    (
        "credential",
        "credentials are never passed in requests; declare a secret_ref in the bundle",
    ),
    (
        "credentials",
        "credentials are never passed in requests; declare a secret_ref in the bundle",
    ),
    (
        "token",
        "credentials are never passed in requests; declare a secret_ref in the bundle",
    ),
    (
        "api_key",
        "credentials are never passed in requests; declare a secret_ref in the bundle",
    ),
    (
        "password",
        "credentials are never passed in requests; declare a secret_ref in the bundle",
    ),
    (
        "secret",
        "credentials are never passed in requests; declare a secret_ref in the bundle",
    ),
    (
        "secrets",
        "credentials are never passed in requests; declare a secret_ref in the bundle",
    ),
    (
        "env",
        "the environment comes from the bundle's secret_ref declarations only",
    ),
    (
        "environment",
        "the environment comes from the bundle's secret_ref declarations only",
    ),
    (
        "session",
        "session material is not accepted at worker creation",
    ),
    (
        "session_path",
        "session paths are not accepted at worker creation",
    ),
    (
        "session_id",
        "session material is not accepted at worker creation",
    ),
    (
        "cache_path",
        "cache paths are not accepted at worker creation",
    ),
    (
        "command",
        "what a worker runs comes from its bundle profile, not from the request",
    ),
    (
        "argv",
        "what a worker runs comes from its bundle profile, not from the request",
    ),
    (
        "profile_source",
        "profiles come from the synced config bundle only",
    ),
    (
        "intent",
        "intent belongs to the launching host, not to worker creation",
    ),
    (
        "requested_capabilities",
        "capabilities are declared in the config bundle",
    ),
    (
        "acceptance",
        "acceptance is launch policy, not part of worker creation",
    ),
];

/// The accepted shapes of an input, for the schema: plain text (one text segment) or
/// `{"segments": [...]}` with text, paste and file_ref segments.
#[derive(Clone, Debug, Serialize, Deserialize, JsonSchema)]
#[serde(untagged)]
pub enum InputShape {
    Text(String),
    Segments { segments: Vec<Segment> },
}

/// A validated `workers/create` request.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CreateRequest {
    pub profile: ProfileSelector,
    pub config_bundle: BundleRef,
    /// Text (one text segment) or `{"segments": [...]}`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(with = "Option<InputShape>")]
    pub initial_input: Option<Vec<Segment>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub display_name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub idempotency_key: Option<String>,
    /// The client asking (set by the method layer, never read from params).
    #[serde(skip)]
    #[schemars(skip)]
    pub created_by: Option<String>,
}

impl CreateRequest {
    /// `sha256:<hex>` over the canonical JSON of everything but the idempotency key: two
    /// requests replayed under one key must agree on this.
    pub fn fingerprint(&self) -> String {
        let value = json!({
            "profile": self.profile,
            "config_bundle": self.config_bundle,
            "initial_input": self.initial_input,
            "display_name": self.display_name,
        });
        format!(
            "sha256:{}",
            crate::util::sha256_hex(&jcs::canonicalize(&value))
        )
    }
}

fn object<'a>(field: &str, v: &'a Value) -> Result<&'a Map<String, Value>, FieldError> {
    v.as_object()
        .ok_or_else(|| FieldError::new(field, "must be an object"))
}

fn string<'a>(field: &str, v: &'a Value) -> Result<&'a str, FieldError> {
    v.as_str()
        .ok_or_else(|| FieldError::new(field, "must be a string"))
}

fn join(prefix: &str, key: &str) -> String {
    if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}.{key}")
    }
}

/// Refuses keys outside `allowed`, explaining forbidden ones.
fn check_keys(prefix: &str, map: &Map<String, Value>, allowed: &[&str]) -> Result<(), FieldError> {
    for key in map.keys() {
        if allowed.contains(&key.as_str()) {
            continue;
        }
        let lower = key.to_ascii_lowercase();
        if let Some((_, why)) = FORBIDDEN_CREATE_FIELDS.iter().find(|(k, _)| *k == lower) {
            return Err(FieldError::new(join(prefix, key), *why));
        }
        return Err(FieldError::new(
            join(prefix, key),
            format!("unknown field; expected one of {}", allowed.join(", ")),
        ));
    }
    Ok(())
}

/// Reads and validates a `workers/create` request. `root` (the workspace root) enables the
/// file checks of `file_ref` segments.
pub fn parse_create(params: &Value, root: Option<&Path>) -> Result<CreateRequest, FieldError> {
    let map = object("params", params)?;
    check_keys(
        "",
        map,
        &[
            "profile",
            "config_bundle",
            "initial_input",
            "display_name",
            "idempotency_key",
        ],
    )?;

    let profile_v = map
        .get("profile")
        .ok_or_else(|| FieldError::new("profile", "is required"))?;
    let profile = parse_selector("profile", profile_v)?;

    let bundle_v = map
        .get("config_bundle")
        .ok_or_else(|| FieldError::new("config_bundle", "is required"))?;
    let config_bundle = parse_bundle_ref("config_bundle", bundle_v)?;

    let initial_input = match map.get("initial_input") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_input("initial_input", v, root)?),
    };

    let display_name = match map.get("display_name") {
        None | Some(Value::Null) => None,
        Some(v) => {
            let s = string("display_name", v)?;
            if s.trim().is_empty() {
                return Err(FieldError::new(
                    "display_name",
                    "must not be empty when given",
                ));
            }
            check_text("display_name", s)?;
            Some(s.to_string())
        }
    };

    let idempotency_key = match map.get("idempotency_key") {
        None | Some(Value::Null) => None,
        Some(v) => Some(parse_key("idempotency_key", v)?),
    };

    Ok(CreateRequest {
        profile,
        config_bundle,
        initial_input,
        display_name,
        idempotency_key,
        created_by: None,
    })
}

fn parse_selector(field: &str, v: &Value) -> Result<ProfileSelector, FieldError> {
    let map = object(field, v)?;
    check_keys(field, map, &["kind", "value"])?;
    let kind = string(
        &join(field, "kind"),
        map.get("kind").unwrap_or(&Value::Null),
    )?;
    let value = string(
        &join(field, "value"),
        map.get("value").unwrap_or(&Value::Null),
    )?;
    if value.trim().is_empty() {
        return Err(FieldError::new(join(field, "value"), "must not be empty"));
    }
    check_text(&join(field, "value"), value)?;
    match kind {
        "builtin" => Ok(ProfileSelector::Builtin(value.to_string())),
        "named" => Ok(ProfileSelector::Named(value.to_string())),
        _ => Err(FieldError::new(
            join(field, "kind"),
            "must be `builtin` or `named`",
        )),
    }
}

/// A bundle reference `{id, digest}` as returned by `bundles/sync`.
pub fn parse_bundle_ref(field: &str, v: &Value) -> Result<BundleRef, FieldError> {
    let map = object(field, v)?;
    check_keys(field, map, &["id", "digest"])?;
    let id = string(&join(field, "id"), map.get("id").unwrap_or(&Value::Null))?;
    check_bundle_id(&join(field, "id"), id)?;
    let digest = string(
        &join(field, "digest"),
        map.get("digest").unwrap_or(&Value::Null),
    )?;
    check_digest(&join(field, "digest"), digest)?;
    Ok(BundleRef {
        id: id.to_string(),
        digest: digest.to_string(),
    })
}

fn parse_key(field: &str, v: &Value) -> Result<String, FieldError> {
    let s = string(field, v)?;
    let ok = !s.is_empty()
        && s.len() <= MAX_KEY_BYTES
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b':'));
    if !ok {
        return Err(FieldError::new(
            field,
            format!("must be 1..={MAX_KEY_BYTES} bytes of letters, digits and - _ . :"),
        ));
    }
    Ok(s.to_string())
}

/// An input: a string (one text segment) or `{"segments": [...]}`.
pub fn parse_input(
    field: &str,
    v: &Value,
    root: Option<&Path>,
) -> Result<Vec<Segment>, FieldError> {
    let segments = match v {
        Value::String(s) => vec![Segment::Text { content: s.clone() }],
        Value::Object(map) => {
            check_keys(field, map, &["segments"])?;
            let field = join(field, "segments");
            let list = map
                .get("segments")
                .ok_or_else(|| FieldError::new(&field, "is required"))?
                .as_array()
                .ok_or_else(|| FieldError::new(&field, "must be an array"))?;
            if list.is_empty() {
                return Err(FieldError::new(&field, "must hold at least one segment"));
            }
            if list.len() > MAX_SEGMENTS {
                return Err(FieldError::new(
                    &field,
                    format!("at most {MAX_SEGMENTS} segments"),
                ));
            }
            list.iter()
                .enumerate()
                .map(|(i, s)| parse_segment(&format!("{field}[{i}]"), s, root))
                .collect::<Result<Vec<_>, _>>()?
        }
        _ => {
            return Err(FieldError::new(
                field,
                "must be a string or an object with `segments`",
            ));
        }
    };
    let total: usize = segments.iter().map(|s| s.flatten().len()).sum();
    if total > MAX_INPUT_BYTES {
        return Err(FieldError::new(
            field,
            format!("is {total} bytes; the limit is {MAX_INPUT_BYTES}"),
        ));
    }
    Ok(segments)
}

fn parse_segment(field: &str, v: &Value, root: Option<&Path>) -> Result<Segment, FieldError> {
    let map = object(field, v)?;
    let kind_field = join(field, "kind");
    let kind = string(&kind_field, map.get("kind").unwrap_or(&Value::Null))?;
    let text_of = |key: &str| -> Result<String, FieldError> {
        let f = join(field, key);
        let s = string(&f, map.get(key).unwrap_or(&Value::Null))?;
        if s.contains('\0') {
            return Err(FieldError::new(f, "must not contain NUL"));
        }
        Ok(s.to_string())
    };
    let counter = |key: &str| -> Result<Option<u32>, FieldError> {
        match map.get(key) {
            None | Some(Value::Null) => Ok(None),
            Some(v) => v
                .as_u64()
                .and_then(|n| u32::try_from(n).ok())
                .map(Some)
                .ok_or_else(|| {
                    FieldError::new(join(field, key), "must be a non-negative 32-bit integer")
                }),
        }
    };
    match kind {
        "text" => {
            check_keys(field, map, &["kind", "content"])?;
            Ok(Segment::Text {
                content: text_of("content")?,
            })
        }
        "paste" => {
            check_keys(field, map, &["kind", "content", "id", "chars", "lines"])?;
            Ok(Segment::Paste {
                content: text_of("content")?,
                id: counter("id")?,
                chars: counter("chars")?,
                lines: counter("lines")?,
            })
        }
        "file_ref" => {
            check_keys(field, map, &["kind", "path"])?;
            let path = text_of("path")?;
            check_file_ref(&join(field, "path"), &path, root)?;
            Ok(Segment::FileRef { path })
        }
        _ => Err(FieldError::new(
            kind_field,
            "unknown segment kind; expected text, paste or file_ref",
        )),
    }
}

/// A workspace-relative path that names an existing file inside the workspace (also after
/// following symlinks) and not gaffer's own store.
fn check_file_ref(field: &str, path: &str, root: Option<&Path>) -> Result<(), FieldError> {
    if path.is_empty() {
        return Err(FieldError::new(field, "must not be empty"));
    }
    if path.len() > MAX_PATH_BYTES {
        return Err(FieldError::new(
            field,
            format!("at most {MAX_PATH_BYTES} bytes"),
        ));
    }
    if path.chars().any(char::is_control) {
        return Err(FieldError::new(
            field,
            "must not contain control characters",
        ));
    }
    check_relative_path(field, path)?;
    let Some(root) = root else { return Ok(()) };
    let root = root
        .canonicalize()
        .map_err(|_| FieldError::new(field, "the workspace root cannot be resolved"))?;
    let full = root
        .join(path)
        .canonicalize()
        .map_err(|_| FieldError::new(field, "no such file in the workspace"))?;
    if !full.starts_with(&root) {
        return Err(FieldError::new(
            field,
            "must not lead outside the workspace",
        ));
    }
    if full.starts_with(root.join(".gaffer")) {
        return Err(FieldError::new(field, "must not refer to gaffer's store"));
    }
    Ok(())
}

/// A validated `workers/input` request.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct InputRequest {
    pub worker_id: String,
    pub input: Vec<Segment>,
}

/// Reads `{worker_id, input}`.
pub fn parse_input_request(
    params: &Value,
    root: Option<&Path>,
) -> Result<InputRequest, FieldError> {
    let map = object("params", params)?;
    check_keys("", map, &["worker_id", "input"])?;
    let worker_id = parse_worker_id("worker_id", map.get("worker_id").unwrap_or(&Value::Null))?;
    let input = parse_input(
        "input",
        map.get("input")
            .ok_or_else(|| FieldError::new("input", "is required"))?,
        root,
    )?;
    Ok(InputRequest { worker_id, input })
}

/// A worker id: a hyphenated UUIDv7.
pub fn parse_worker_id(field: &str, v: &Value) -> Result<String, FieldError> {
    let s = string(field, v)?;
    match uuid::Uuid::try_parse(s) {
        Ok(u) if u.get_version_num() == 7 => Ok(u.hyphenated().to_string()),
        _ => Err(FieldError::new(field, "must be a UUIDv7 worker id")),
    }
}
