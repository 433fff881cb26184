//! `bundles/sync`, `bundles/check`, `bundles/list`.

use std::borrow::Cow;
use std::marker::PhantomData;
use std::sync::Arc;

use schemars::{JsonSchema, Schema, SchemaGenerator};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::Value;

use super::App;
use crate::bundles::{
    self, Availability, BundleError, BundleRef, BundleSummary, FieldError, SyncOutcome,
};
use crate::rpc::{Access, AppCode, Audience, CallCtx, MethodDef, Router, RpcError};
use crate::workspace::{CommitError, NewRecord};

/// Params taken as raw JSON so the domain can name the exact offending field, while the schema
/// (and MCP tool description) shows the typed shape `T`.
pub struct Checked<T> {
    pub value: Value,
    _shape: PhantomData<fn() -> T>,
}

impl<'de, T> Deserialize<'de> for Checked<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Value::deserialize(d).map(|value| Checked {
            value,
            _shape: PhantomData,
        })
    }
}

impl<T: JsonSchema> JsonSchema for Checked<T> {
    fn schema_name() -> Cow<'static, str> {
        T::schema_name()
    }
    fn json_schema(generator: &mut SchemaGenerator) -> Schema {
        T::json_schema(generator)
    }
}

/// A field error as JSON-RPC invalid params, the field path prefixed by where it sits.
pub fn field_error(prefix: &str, e: &FieldError) -> RpcError {
    let field = match (prefix, e.field.as_str()) {
        ("", f) => f.to_string(),
        (p, "bundle") => p.to_string(),
        (p, f) => format!("{p}.{f}"),
    };
    RpcError::invalid_params(&field, format!("`{field}`: {}", e.message))
}

/// Maps a bundle refusal to its stable error.
pub fn bundle_error(prefix: &str, e: &BundleError) -> RpcError {
    match e {
        BundleError::Invalid(f) => field_error(prefix, f),
        BundleError::DigestMismatch {
            id,
            expected,
            actual,
        } => RpcError::app(
            AppCode::Conflict,
            "bundle_digest_mismatch",
            format!("bundle {id} is known with digest {expected}, not {actual}"),
        )
        .with_data("bundle_id", id.as_str())
        .with_data("expected_digest", expected.as_str())
        .with_data("actual_digest", actual.as_str()),
        BundleError::Missing { id } => RpcError::app(
            AppCode::NotFound,
            "bundle_missing",
            format!("bundle {id} has not been synced to this workspace"),
        )
        .with_data("bundle_id", id.as_str()),
    }
}

/// `bundles/sync` params: the bundle as a JSON object, or as JSON/YAML text.
#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct SyncParams {
    /// The bundle document.
    #[serde(default)]
    pub bundle: Option<bundles::Bundle>,
    /// The bundle as JSON or YAML text (use instead of `bundle`).
    #[serde(default)]
    pub text: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct SyncResult {
    #[serde(flatten)]
    pub availability: Availability,
    /// False when the same id and digest were already synced (nothing was written).
    pub created: bool,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckParams {
    pub id: String,
    pub digest: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListResult {
    pub bundles: Vec<BundleSummary>,
}

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListParams {}

pub fn register(r: &mut Router<App>) {
    r.add(
        MethodDef {
            name: "bundles/sync",
            doc: "Pin a config bundle (metadata plus worker profiles: command, input mode, declarations) so workers can be started from it. gaffer validates it, computes its sha256 digest over RFC 8785 canonical JSON and stores it. Returns `reference` = `{id, digest}`: pass it as `config_bundle` to `create_worker`. Syncing the same bundle again is a no-op; the same id with other content is refused (bundle_digest_mismatch): use a new id or revision.",
            access: Access::Write,
            audience: Audience::Anyone,
            mcp_tool: Some("sync_bundle"),
        },
        sync,
    );
    r.add(
        MethodDef {
            name: "bundles/check",
            doc: "Availability of a synced bundle by id and digest (bundle_missing / bundle_digest_mismatch otherwise).",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: None,
        },
        check,
    );
    r.add(
        MethodDef {
            name: "bundles/list",
            doc: "Summaries of every bundle synced to this workspace.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: None,
        },
        list,
    );
}

async fn sync(
    app: Arc<App>,
    _ctx: CallCtx,
    p: Checked<SyncParams>,
) -> Result<SyncResult, RpcError> {
    let Value::Object(map) = p.value else {
        return Err(RpcError::invalid_params(
            "",
            "params must be an object with `bundle` or `text`",
        ));
    };
    if let Some(k) = map.keys().find(|k| *k != "bundle" && *k != "text") {
        return Err(RpcError::invalid_params(
            k,
            format!("unknown field `{k}`; expected `bundle` or `text`"),
        ));
    }
    let (prefix, parsed) = match (map.get("bundle"), map.get("text")) {
        (Some(b), None) => ("bundle", bundles::parse_value(b.clone())),
        (None, Some(Value::String(t))) => ("text", bundles::parse_text(t)),
        (None, Some(_)) => return Err(RpcError::invalid_params("text", "`text` must be a string")),
        _ => {
            return Err(RpcError::invalid_params(
                "bundle",
                "give exactly one of `bundle` or `text`",
            ));
        }
    };
    let bundle = parsed.map_err(|e| field_error(prefix, &e))?;
    let prepared = bundles::prepare(&bundle).map_err(|e| bundle_error(prefix, &e))?;

    // Settle the common idempotent case without touching the store.
    let known = app.workspace.read(|s| s.bundles.plan_sync(&prepared));
    match known {
        Ok(SyncOutcome::AlreadySynced(availability)) => {
            return Ok(SyncResult {
                availability,
                created: false,
            });
        }
        Err(e) => return Err(bundle_error(prefix, &e)),
        Ok(SyncOutcome::New { .. }) => {}
    }
    // The blob goes first: a record never points at a missing body.
    let blob = app
        .workspace
        .put_blob(&prepared.canonical.bytes)
        .map_err(|e| super::store_error("storing the bundle", &e))?;
    debug_assert_eq!(blob, bundles::digest::digest_hex(&prepared.summary.digest));
    let result = app
        .workspace
        .commit(move |s| match s.bundles.plan_sync(&prepared)? {
            SyncOutcome::AlreadySynced(availability) => Ok((
                vec![],
                SyncResult {
                    availability,
                    created: false,
                },
            )),
            SyncOutcome::New {
                kind,
                payload,
                availability,
            } => Ok((
                vec![NewRecord::text(
                    kind,
                    serde_json::value::to_raw_value(&payload)
                        .unwrap_or_else(|_| serde_json::value::RawValue::NULL.to_owned()),
                )],
                SyncResult {
                    availability,
                    created: true,
                },
            )),
        })
        .await;
    match result {
        Ok(r) => Ok(r),
        Err(CommitError::Rejected(e)) => Err(bundle_error(prefix, &e)),
        Err(CommitError::Store(e)) => Err(super::store_error("recording the bundle", &e)),
    }
}

async fn check(
    app: Arc<App>,
    _ctx: CallCtx,
    p: Checked<CheckParams>,
) -> Result<Availability, RpcError> {
    let reference: BundleRef = crate::workers::request::parse_bundle_ref("", &p.value)
        .map_err(|e| field_error("", &strip_dot(e)))?;
    app.workspace
        .read(|s| s.bundles.check(&reference).map(|b| b.availability()))
        .map_err(|e| bundle_error("", &e))
}

/// `parse_bundle_ref` with an empty prefix yields `.id`; make it `id`.
fn strip_dot(mut e: FieldError) -> FieldError {
    if let Some(f) = e.field.strip_prefix('.') {
        e.field = f.to_string();
    }
    e
}

async fn list(app: Arc<App>, _ctx: CallCtx, _p: ListParams) -> Result<ListResult, RpcError> {
    Ok(ListResult {
        bundles: app.workspace.read(|s| s.bundles.list()),
    })
}
