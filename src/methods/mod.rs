//! The method table: binds each domain to the router, and the host the session talks to.

pub mod approvals;
pub mod bundles;
pub mod identity;
pub mod initialize;
pub mod operations;
pub mod patterns;
pub mod plans;
pub mod schema;
pub mod status;
pub mod workers;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::Value;

use crate::rpc::session::{Host, Push};
use crate::rpc::{AppCode, CallCtx, ClientInfo, Profile, Role, Router, RpcError};
use crate::workspace::{Audience, Notice, Workspace, WorkspaceError};

/// Settings from the command line.
#[derive(Clone, Debug, Default)]
pub struct AppConfig {
    /// `--workspace`: wins over the LSP root and the current directory.
    pub workspace: Option<PathBuf>,
    /// `--patterns-policy`: a selection policy file instead of `.gaffer/patterns.yaml`.
    pub patterns_policy: Option<PathBuf>,
    /// `GAFFER_CLIENT_TOKEN` as this process was started with: the identity of connections
    /// that present no token of their own.
    pub client_token: Option<String>,
    /// Leaves the external providers unstarted: for operator commands that need none of their
    /// operations (trust, client credentials, revocations).
    pub without_providers: bool,
}

/// Everything a handler can reach: the workspace and the domain runtimes of this process.
pub struct App {
    pub workspace: Arc<Workspace>,
    pub config: AppConfig,
    /// Identity of this gaffer process, for presence and ownership.
    pub instance: Arc<crate::peers::Instance>,
    /// The workers whose OS processes this gaffer process owns.
    pub workers: Arc<crate::workers::WorkerRuntime>,
    /// Operations: submit, approvals, execute-once dispatch (started by `Host::attach`).
    pub operations: Arc<crate::operations::engine::OperationRuntime>,
    /// The plans whose lanes this process runs.
    pub plans: Arc<crate::plans::PlanRuntime>,
}

impl App {
    /// Opens the workspace at `root` and starts this process's domain runtimes.
    pub fn open(root: &Path, config: AppConfig) -> Result<Arc<App>, WorkspaceError> {
        let workspace = Workspace::open(root)?;
        let instance = Arc::new(crate::peers::Instance::register(&workspace.gaffer_dir()));
        {
            // Other processes judge whether our claimed work is orphaned by presence files, so
            // ours exists before anything we write (also when this process creates the store).
            let instance = Arc::clone(&instance);
            workspace.before_write(move || instance.ensure_registered());
        }
        let workers = crate::workers::WorkerRuntime::new(Arc::clone(&workspace));
        workers.start();
        let plans = crate::plans::PlanRuntime::new(
            Arc::clone(&workspace),
            Arc::clone(&workers),
            crate::operations::engine::executor_id(instance.me.pid, instance.me.started_ms),
        );
        let operations = crate::operations::open_runtime(
            Arc::clone(&workspace),
            &instance.me,
            Default::default(),
            Arc::clone(&workers),
            Arc::clone(&plans),
            !config.without_providers,
        )
        .map_err(WorkspaceError::Unavailable)?;
        let app = Arc::new(App {
            workspace,
            config,
            instance,
            workers,
            operations,
            plans,
        });
        app.plans
            .set_server(Arc::new(plans::LaneSessions::new(&app)));
        Ok(app)
    }
}

/// Maps a workspace failure to a reply; the detail goes to the log only.
pub fn store_error(context: &str, e: &WorkspaceError) -> RpcError {
    tracing::error!(error = %e, context, "store failure");
    RpcError::app(
        AppCode::Store,
        "store_unavailable",
        format!("the workspace store failed while {context}; see the server log"),
    )
}

/// Builds the full method table.
pub fn router() -> Router<App> {
    let mut r = Router::new();
    status::register(&mut r);
    patterns::register(&mut r);
    bundles::register(&mut r);
    workers::register(&mut r);
    operations::register(&mut r);
    approvals::register(&mut r);
    plans::register(&mut r);
    r
}

/// Decodes `params` as the params of every method (nothing runs); returns the refusals.
pub fn decode_all_params(params: &Value) -> Vec<RpcError> {
    router()
        .methods()
        .filter_map(|m| m.check_params(params.clone()).err())
        .collect()
}

/// Runs one method in process, as the CLI does: the same handlers, no transport.
pub async fn call_local(
    app: Arc<App>,
    role: Role,
    method: &str,
    params: Value,
) -> Result<Value, RpcError> {
    // A one-shot command is whoever its environment's credential says (else anonymous); the
    // operator role is given only by commands that hold the private key.
    let id = match role {
        Role::Operator => "operator".to_string(),
        Role::Agent => app.identify(&Value::Null, Profile::Raw)?,
    };
    let ctx = CallCtx::local(ClientInfo {
        id,
        role,
        profile: Profile::Raw,
    });
    let raw = router().call(app, ctx, method, params).await?;
    serde_json::from_str(raw.get()).map_err(|_| RpcError::internal("decoding a local result"))
}

/// The host the session talks to: opens the workspace when the client says which one.
pub struct Server {
    pub config: AppConfig,
}

impl Server {
    /// `--workspace`, else the LSP root (`rootUri`, first `workspaceFolders` entry, `rootPath`),
    /// else the current directory.
    pub fn choose_root(&self, init: Option<&Value>) -> Result<PathBuf, RpcError> {
        if let Some(ws) = &self.config.workspace {
            return Ok(ws.clone());
        }
        if let Some(init) = init {
            let from_folders = init
                .get("workspaceFolders")
                .and_then(Value::as_array)
                .and_then(|a| a.first())
                .and_then(|f| f.get("uri"))
                .and_then(Value::as_str);
            let uri = init.get("rootUri").and_then(Value::as_str).or(from_folders);
            if let Some(uri) = uri {
                return file_uri_to_path(uri).ok_or_else(|| {
                    RpcError::invalid_params("rootUri", format!("{uri:?} is not a file:// URI"))
                });
            }
            if let Some(p) = init.get("rootPath").and_then(Value::as_str) {
                return Ok(PathBuf::from(p));
            }
        }
        std::env::current_dir().map_err(|e| {
            tracing::error!(error = %e, "no current directory");
            RpcError::internal("finding the current directory")
        })
    }
}

/// `file:///a%20b` → `/a b`. Only local file URIs are accepted.
pub fn file_uri_to_path(uri: &str) -> Option<PathBuf> {
    let rest = uri.strip_prefix("file://")?;
    let rest = rest.strip_prefix("localhost").unwrap_or(rest);
    if !rest.starts_with('/') {
        return None;
    }
    let bytes = rest.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    Some(PathBuf::from(String::from_utf8(out).ok()?))
}

/// The root an `initialize` chose (or the process's directory) is no directory.
fn not_a_directory(root: &Path) -> RpcError {
    RpcError::invalid_params(
        "rootUri",
        format!("workspace {} is not a directory", root.display()),
    )
}

impl Host for Server {
    type State = App;
    type Notice = Notice;

    fn attach(&self, init: Option<&Value>) -> Result<Arc<App>, RpcError> {
        let root = self.choose_root(init)?;
        let app = App::open(&root, self.config.clone()).map_err(|e| match e {
            WorkspaceError::NotADirectory { .. } => not_a_directory(&root),
            other => store_error("opening the workspace", &other),
        })?;
        // A serving process recovers interrupted operations and executes approved ones, and
        // records plans whose process went away stopped.
        crate::operations::start_runtime(&app.operations);
        let plans = Arc::clone(&app.plans);
        tokio::spawn(async move { plans.restore().await });
        Ok(app)
    }

    fn identify(&self, state: &App, init: &Value, profile: Profile) -> Result<String, RpcError> {
        state.identify(init, profile)
    }

    fn identify_early(&self, init: &Value) -> Result<Option<String>, RpcError> {
        let root = self.choose_root(Some(init))?;
        if !root.is_dir() {
            return Err(not_a_directory(&root));
        }
        Ok(identity::presented_token(init, &self.config)?
            .is_none()
            .then(|| crate::clients::ANONYMOUS.to_string()))
    }

    fn login_challenge(&self, state: &App, connection_id: &str) -> Result<String, RpcError> {
        state.login_challenge(connection_id)
    }

    fn login_verify(&self, state: &App, challenge: &str, signature: &str) -> Result<(), RpcError> {
        state.login_verify(challenge, signature)
    }

    fn subscribe(&self, state: &App) -> crate::fanout::Subscription<Notice> {
        state.workspace.subscribe()
    }

    fn visible(&self, state: &App, client: Option<&str>, notice: &Notice) -> bool {
        notice_visible(state, client, notice)
    }

    fn operator_visible(&self, state: &App, notice: &Notice) -> bool {
        operator_notice_visible(state, notice)
    }

    fn push(n: Notice) -> Push {
        Push {
            method: n.method.into_owned(),
            params: n.params.to_value(),
            operators_only: n.audience == Audience::Operators,
        }
    }

    fn server_info(&self) -> (&'static str, &'static str) {
        ("gaffer", env!("CARGO_PKG_VERSION"))
    }

    async fn detach(&self, app: Arc<App>) {
        // Workers this process owns are stopped (and recorded so) rather than orphaned.
        app.workers
            .shutdown(std::time::Duration::from_secs(3))
            .await;
        app.instance.deregister();
    }

    fn instructions(&self) -> &'static str {
        "gaffer plans worker lanes for a task, pins config bundles, runs workers, and gates \
         side-effecting operations behind policy and human approval. To plan: \
         select_worker_pattern. To run a worker: sync_bundle, then create_worker with the \
         returned reference, read_worker_transcript for its output, stop_worker when done. To \
         cause a side effect: operation_catalog, then submit_operation; it may wait for a human \
         operator, so call wait_operation (it waits for the next change) until the state is \
         terminal rather than resubmitting."
    }
}

/// Whether an agent connection established as `client` (`None`: anonymous) receives `n`:
/// exactly what its requests would show it. Another client's operation, worker or plan is
/// as absent from its notifications as from `get` and `list`.
pub(crate) fn notice_visible(app: &App, client: Option<&str>, n: &Notice) -> bool {
    let me = client.unwrap_or(crate::clients::ANONYMOUS);
    match &*n.method {
        "operations/changed" => n.params.str_field("client_id") == Some(me),
        "workers/changed" | "workers/output" => n.params.str_field("worker_id").is_some_and(|id| {
            app.workspace.read(|s| {
                s.workers
                    .get(id)
                    .is_some_and(|w| workers::seen_by(me, s, w))
            })
        }),
        "plans/changed" => n.params.str_field("plan_id").is_some_and(|id| {
            app.workspace
                .read(|s| s.plans.get(id).is_some_and(|p| plans::seen_by(me, p)))
        }),
        // `approvals/requested` is the operators' (and so is anything not scoped here yet).
        _ => false,
    }
}

/// Whether an operator connection receives `n`: every notice, except that a request no gaffer
/// here accepted is not announced, as it is not listed (its client name and words are whatever
/// the agent wrote; see [`crate::operations::seal`]).
pub(crate) fn operator_notice_visible(app: &App, n: &Notice) -> bool {
    n.method != crate::operations::state::NOTICE_REQUESTED
        || n.params
            .str_field("operation_id")
            .is_some_and(|id| app.operations.operation_sealed_here(id))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_uris_decode() {
        assert_eq!(
            file_uri_to_path("file:///tmp/a%20b"),
            Some(PathBuf::from("/tmp/a b"))
        );
        assert_eq!(
            file_uri_to_path("file://localhost/x"),
            Some(PathBuf::from("/x"))
        );
        assert_eq!(file_uri_to_path("http://x/y"), None);
        assert_eq!(file_uri_to_path("file://server/share"), None);
    }
}
