//! The method table: one typed handler per method, shared by every profile.
//!
//! A handler takes its params as a typed struct; decoding errors become -32602 naming the field
//! path. The same table answers MCP `tools/list` (input schemas come from the param types) and
//! generates `schema/`.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use schemars::{JsonSchema, Schema, generate::SchemaSettings};
use serde::{Serialize, de::DeserializeOwned};
use serde_json::{Value, json};
use tokio_util::sync::CancellationToken;

use crate::json_out::Raw;

use super::message::{RpcError, encode, notification};
use super::outbox::Outbox;

/// Whether a method changes the workspace. Writes are applied in arrival order; reads may run
/// concurrently but only after every earlier write has finished.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    Read,
    Write,
}

/// Who may call a method. Operator methods need a connection that proved the operator key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    Anyone,
    Operator,
}

/// How a connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Profile {
    Lsp,
    Raw,
    Mcp,
}

/// The role a connection authenticated as.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, serde::Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Agent,
    Operator,
}

/// Who is calling.
#[derive(Clone, Debug)]
pub struct ClientInfo {
    /// Stable name of the client (from initialize `clientInfo.name`, else the profile's name).
    pub id: String,
    pub role: Role,
    pub profile: Profile,
}

/// Static description of a method.
#[derive(Clone, Copy, Debug)]
pub struct MethodDef {
    pub name: &'static str,
    pub doc: &'static str,
    pub access: Access,
    pub audience: Audience,
    /// The MCP tool name this method is also offered as (never for operator methods).
    pub mcp_tool: Option<&'static str>,
}

/// Progress reporting for one request: `$/progress` (LSP `workDoneToken`) or MCP
/// `notifications/progress` (`_meta.progressToken`). A no-op when the client gave no token.
#[derive(Clone, Debug, Default)]
pub struct Progress {
    target: Option<(Value, ProgressStyle, Outbox)>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ProgressStyle {
    Lsp,
    Mcp,
}

impl Progress {
    pub fn new(token: Value, style: ProgressStyle, out: Outbox) -> Self {
        Progress {
            target: Some((token, style, out)),
        }
    }

    fn send(&self, lsp_value: Value, mcp_progress: f64, message: Option<&str>) {
        let Some((token, style, out)) = &self.target else {
            return;
        };
        let msg = match style {
            ProgressStyle::Lsp => {
                notification("$/progress", json!({"token": token, "value": lsp_value}))
            }
            ProgressStyle::Mcp => {
                let mut params =
                    json!({"progressToken": token, "progress": mcp_progress, "total": 100});
                if let Some(m) = message {
                    params["message"] = json!(m);
                }
                notification("notifications/progress", params)
            }
        };
        // A closed channel means the client is gone; progress is best effort.
        let _ = out.send(encode(&msg));
    }

    pub fn begin(&self, title: &str) {
        self.send(
            json!({"kind": "begin", "title": title, "cancellable": true}),
            0.0,
            Some(title),
        );
    }

    pub fn report(&self, message: &str, percentage: u32) {
        let p = percentage.min(100);
        self.send(
            json!({"kind": "report", "message": message, "percentage": p}),
            p as f64,
            Some(message),
        );
    }

    pub fn end(&self, message: &str) {
        self.send(
            json!({"kind": "end", "message": message}),
            100.0,
            Some(message),
        );
    }
}

/// Per-call context handed to every handler.
#[derive(Clone, Debug)]
pub struct CallCtx {
    pub client: Arc<ClientInfo>,
    pub cancel: CancellationToken,
    pub progress: Progress,
}

impl CallCtx {
    /// A context for in-process calls (CLI, tests): no progress, never cancelled.
    pub fn local(client: ClientInfo) -> Self {
        CallCtx {
            client: Arc::new(client),
            cancel: CancellationToken::new(),
            progress: Progress::default(),
        }
    }
}

type BoxFuture<T> = Pin<Box<dyn Future<Output = T> + Send>>;
type HandlerFn<S> =
    dyn Fn(Arc<S>, CallCtx, Value) -> BoxFuture<Result<Raw, RpcError>> + Send + Sync;

/// A registered method.
pub struct Method<S> {
    pub def: MethodDef,
    handler: Arc<HandlerFn<S>>,
    /// Decodes params without running the method (for robustness tests and fuzzing).
    decode: fn(Value) -> Result<(), RpcError>,
    params_schema: fn() -> Schema,
    result_schema: fn() -> Schema,
}

impl<S> Method<S> {
    /// Whether `params` decode for this method; runs nothing.
    pub fn check_params(&self, params: Value) -> Result<(), RpcError> {
        (self.decode)(params)
    }
    pub fn params_schema(&self) -> Schema {
        (self.params_schema)()
    }
    pub fn result_schema(&self) -> Schema {
        (self.result_schema)()
    }
}

/// A server-to-client notification, registered for `schema/`.
pub struct NotificationDef {
    pub name: &'static str,
    pub doc: &'static str,
    schema: fn() -> Schema,
}

impl NotificationDef {
    pub fn schema(&self) -> Schema {
        (self.schema)()
    }
}

/// JSON Schema (2020-12) of `T`.
pub fn schema_of<T: JsonSchema>() -> Schema {
    SchemaSettings::draft2020_12()
        .into_generator()
        .into_root_schema_for::<T>()
}

/// Decodes params into `P`, naming the offending field on failure.
pub fn decode_params<P: DeserializeOwned>(mut params: Value) -> Result<P, RpcError> {
    // An empty array where an object belongs is an empty object: encoders that cannot tell
    // them apart (Neovim's Lua) send `[]` for `{}`. Each retry fixes one such spot.
    for _ in 0..MAX_EMPTY_ARRAY_FIXES {
        match serde_path_to_error::deserialize::<_, P>(&params) {
            Ok(p) => return Ok(p),
            Err(err) => match empty_array_at(&mut params, err.path()) {
                Some(slot) => *slot = Value::Object(serde_json::Map::new()),
                None => return Err(params_error(err)),
            },
        }
    }
    serde_path_to_error::deserialize::<_, P>(&params).map_err(params_error)
}

const MAX_EMPTY_ARRAY_FIXES: usize = 64;

/// The value at `path` when it is an empty array.
fn empty_array_at<'a>(
    value: &'a mut Value,
    path: &serde_path_to_error::Path,
) -> Option<&'a mut Value> {
    use serde_path_to_error::Segment;
    let mut node = value;
    for seg in path.iter() {
        node = match seg {
            Segment::Seq { index } => node.get_mut(*index)?,
            Segment::Map { key } => node.get_mut(key.as_str())?,
            Segment::Enum { .. } | Segment::Unknown => return None,
        };
    }
    matches!(node, Value::Array(a) if a.is_empty()).then_some(node)
}

fn params_error(err: serde_path_to_error::Error<serde_json::Error>) -> RpcError {
    {
        let path = err.path().to_string();
        let inner = err.into_inner().to_string();
        // serde reports an unknown or missing field at its parent; name the field itself.
        let field = field_from_message(&inner)
            .map(|f| {
                if path == "." {
                    f
                } else if path == f || path.ends_with(&format!(".{f}")) {
                    path.clone()
                } else {
                    format!("{path}.{f}")
                }
            })
            .unwrap_or_else(|| {
                if path == "." {
                    String::new()
                } else {
                    path.clone()
                }
            });
        let label = if field.is_empty() {
            "params".to_string()
        } else {
            field.clone()
        };
        RpcError::invalid_params(&field, format!("invalid `{label}`: {inner}"))
    }
}

fn field_from_message(msg: &str) -> Option<String> {
    for marker in ["unknown field `", "missing field `"] {
        if let Some(rest) = msg.strip_prefix(marker) {
            return rest.split('`').next().map(str::to_string);
        }
    }
    None
}

/// The method table.
pub struct Router<S> {
    methods: BTreeMap<&'static str, Method<S>>,
    notifications: BTreeMap<&'static str, NotificationDef>,
}

impl<S> Default for Router<S> {
    fn default() -> Self {
        Router {
            methods: BTreeMap::new(),
            notifications: BTreeMap::new(),
        }
    }
}

impl<S: Send + Sync + 'static> Router<S> {
    pub fn new() -> Self {
        Self::default()
    }

    /// Registers a typed handler. Panics on a duplicate name: that is a programming error
    /// caught by every test that builds the router.
    pub fn add<P, R, F, Fut>(&mut self, def: MethodDef, handler: F)
    where
        P: DeserializeOwned + JsonSchema + Send + 'static,
        R: Serialize + JsonSchema + 'static,
        F: Fn(Arc<S>, CallCtx, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, RpcError>> + Send + 'static,
    {
        self.add_finishing(def, handler, |result: R| {
            serde_json::to_string(&result)
                .map(Raw::from_serde_json)
                .map_err(|e| {
                    tracing::error!(error = %e, "result did not serialize");
                    RpcError::internal("encoding the result")
                })
        });
    }

    /// Registers a typed handler whose result is already encoded JSON (`R` gives its schema):
    /// the text goes into the reply as it is, neither encoded again nor copied.
    pub fn add_encoded<P, R, F, Fut>(&mut self, def: MethodDef, handler: F)
    where
        P: DeserializeOwned + JsonSchema + Send + 'static,
        R: Into<Raw> + JsonSchema + 'static,
        F: Fn(Arc<S>, CallCtx, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, RpcError>> + Send + 'static,
    {
        self.add_finishing(def, handler, |result: R| Ok(result.into()));
    }

    /// Registers `handler`, its result turned into JSON text by `finish`.
    fn add_finishing<P, R, F, Fut>(
        &mut self,
        def: MethodDef,
        handler: F,
        finish: fn(R) -> Result<Raw, RpcError>,
    ) where
        P: DeserializeOwned + JsonSchema + Send + 'static,
        R: JsonSchema + 'static,
        F: Fn(Arc<S>, CallCtx, P) -> Fut + Send + Sync + 'static,
        Fut: Future<Output = Result<R, RpcError>> + Send + 'static,
    {
        assert!(
            !(def.audience == Audience::Operator && def.mcp_tool.is_some()),
            "operator method {} must not be an MCP tool",
            def.name
        );
        let handler = Arc::new(handler);
        let erased: Arc<HandlerFn<S>> = Arc::new(move |state, ctx, params| {
            let handler = Arc::clone(&handler);
            Box::pin(async move {
                let typed: P = decode_params(params)?;
                finish(handler(state, ctx, typed).await?)
            })
        });
        let previous = self.methods.insert(
            def.name,
            Method {
                def,
                handler: erased,
                decode: |v| decode_params::<P>(v).map(drop),
                params_schema: schema_of::<P>,
                result_schema: schema_of::<R>,
            },
        );
        assert!(previous.is_none(), "method {} registered twice", def.name);
    }

    /// Registers the params schema of a notification gaffer sends.
    pub fn notification<P: JsonSchema>(&mut self, name: &'static str, doc: &'static str) {
        self.notifications.insert(
            name,
            NotificationDef {
                name,
                doc,
                schema: schema_of::<P>,
            },
        );
    }

    pub fn get(&self, name: &str) -> Option<&Method<S>> {
        self.methods.get(name)
    }

    pub fn methods(&self) -> impl Iterator<Item = &Method<S>> {
        self.methods.values()
    }

    pub fn notifications(&self) -> impl Iterator<Item = &NotificationDef> {
        self.notifications.values()
    }

    pub fn by_tool(&self, tool: &str) -> Option<&Method<S>> {
        self.methods
            .values()
            .find(|m| m.def.mcp_tool == Some(tool) && m.def.audience == Audience::Anyone)
    }

    /// Runs a method: checks the caller may use it, then calls the handler.
    pub async fn call(
        &self,
        state: Arc<S>,
        ctx: CallCtx,
        method: &str,
        params: Value,
    ) -> Result<Raw, RpcError> {
        let m = self
            .methods
            .get(method)
            .ok_or_else(|| RpcError::method_not_found(method))?;
        check_audience(&m.def, &ctx.client)?;
        (m.handler)(state, ctx, params).await
    }
}

/// Refuses operator methods to connections that are not verified operators (and always on MCP).
pub fn check_audience(def: &MethodDef, client: &ClientInfo) -> Result<(), RpcError> {
    if def.audience == Audience::Operator
        && (client.role != Role::Operator || client.profile == Profile::Mcp)
    {
        return Err(RpcError::app(
            super::message::AppCode::Forbidden,
            "operator_required",
            format!("`{}` needs an operator connection", def.name),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Deserialize, JsonSchema)]
    #[serde(deny_unknown_fields)]
    struct Params {
        name: String,
        #[serde(default)]
        items: Vec<u32>,
    }

    fn router() -> Router<()> {
        let mut r = Router::new();
        r.add(
            MethodDef {
                name: "t/echo",
                doc: "echo",
                access: Access::Read,
                audience: Audience::Anyone,
                mcp_tool: Some("echo"),
            },
            |_s: Arc<()>, _c, p: Params| async move { Ok(json!({"name": p.name, "n": p.items.len()})) },
        );
        r.add(
            MethodDef {
                name: "t/admin",
                doc: "operator only",
                access: Access::Write,
                audience: Audience::Operator,
                mcp_tool: None,
            },
            |_s: Arc<()>, _c, _p: Value| async move { Ok(json!(true)) },
        );
        r
    }

    fn agent(profile: Profile) -> CallCtx {
        CallCtx::local(ClientInfo {
            id: "t".into(),
            role: Role::Agent,
            profile,
        })
    }

    #[tokio::test]
    async fn typed_params_errors_name_the_field() {
        let r = router();
        let ok = r
            .call(
                Arc::new(()),
                agent(Profile::Raw),
                "t/echo",
                json!({"name": "a", "items": [1, 2]}),
            )
            .await
            .expect("valid params");
        let ok: Value = serde_json::from_str(ok.get()).expect("result is JSON");
        assert_eq!(ok, json!({"name": "a", "n": 2}));
        let e = r
            .call(
                Arc::new(()),
                agent(Profile::Raw),
                "t/echo",
                json!({"name": "a", "items": [1, "x"]}),
            )
            .await
            .expect_err("bad item");
        assert_eq!(e.field(), Some("items[1]"));
        let e = r
            .call(Arc::new(()), agent(Profile::Raw), "t/echo", json!({}))
            .await
            .expect_err("missing");
        assert_eq!(e.field(), Some("name"));
        let e = r
            .call(
                Arc::new(()),
                agent(Profile::Raw),
                "t/echo",
                json!({"name": "a", "bogus": 1}),
            )
            .await
            .expect_err("unknown");
        assert_eq!(e.field(), Some("bogus"));
    }

    #[test]
    fn nested_empty_arrays_are_empty_objects() {
        #[derive(Debug, Deserialize, PartialEq, Default)]
        #[serde(deny_unknown_fields)]
        struct Inner {
            #[serde(default)]
            n: Option<u32>,
        }
        #[derive(Debug, Deserialize, PartialEq)]
        #[serde(deny_unknown_fields)]
        struct Outer {
            inner: Inner,
            #[serde(default)]
            list: Vec<Inner>,
            #[serde(default)]
            tags: Vec<String>,
        }
        let p: Outer = decode_params(json!({"inner": [], "list": [[], {"n": 1}], "tags": []}))
            .expect("[] stands for {}");
        assert_eq!(p.inner, Inner::default());
        assert_eq!(p.list, vec![Inner::default(), Inner { n: Some(1) }]);
        assert!(p.tags.is_empty());
        // Other mistakes still name their field.
        let e = decode_params::<Outer>(json!({"inner": [], "tags": [[]]})).expect_err("bad tag");
        assert_eq!(e.field(), Some("tags[0]"));
    }

    #[tokio::test]
    async fn operator_methods_need_an_operator_and_never_mcp() {
        let r = router();
        let e = r
            .call(Arc::new(()), agent(Profile::Lsp), "t/admin", json!({}))
            .await
            .expect_err("agent refused");
        assert_eq!(e.machine_code(), Some("operator_required"));
        let mut op = ClientInfo {
            id: "o".into(),
            role: Role::Operator,
            profile: Profile::Mcp,
        };
        let e = r
            .call(
                Arc::new(()),
                CallCtx::local(op.clone()),
                "t/admin",
                json!({}),
            )
            .await
            .expect_err("mcp refused");
        assert_eq!(e.machine_code(), Some("operator_required"));
        op.profile = Profile::Lsp;
        assert!(
            r.call(Arc::new(()), CallCtx::local(op), "t/admin", json!({}))
                .await
                .is_ok()
        );
        assert!(r.by_tool("echo").is_some());
    }
}
