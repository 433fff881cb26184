//! `gaffer/status`: who and where this server is, and how far its store has got. With
//! `after_seq` it waits (up to `timeout_ms`) until the store has passed that sequence number,
//! which lets a client wait for another process's write without polling.

use std::sync::Arc;
use std::time::Duration;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::App;
use crate::peers::Peer;
use crate::rpc::{Access, Audience, CallCtx, MethodDef, Profile, Role, Router, RpcError};
use crate::store::ChainStatus;

#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusParams {
    /// Wait until the store's sequence number is greater than this.
    #[serde(default)]
    pub after_seq: Option<u64>,
    /// How long to wait for `after_seq`, in milliseconds (default 10000, at most 30000).
    #[serde(default)]
    pub timeout_ms: Option<u64>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct StatusResult {
    pub version: String,
    pub workspace: String,
    /// The store's random id, declared by its first journal record; null until the first
    /// write creates the store. Operator signatures bind to it.
    pub workspace_id: Option<String>,
    pub store: StoreStatus,
    pub profile: Profile,
    pub client: String,
    pub role: Role,
    pub pid: u32,
    /// Other gaffer processes currently serving this workspace.
    pub peers: Vec<Peer>,
    /// `policy.yaml` and `providers.yaml`: trusted, drifted (the trusted content holds), or not.
    pub trust: Vec<crate::operations::trust::FileTrust>,
    /// With `after_seq`: true when `timeout_ms` passed before the store got past it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub timed_out: Option<bool>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct StoreStatus {
    pub dir: String,
    /// Whether `.gaffer/` exists yet (it is made on the first write).
    pub exists: bool,
    /// The last record folded into this process's state.
    pub seq: u64,
    /// The journal's hash chain as this process has read it: its head (what an operator
    /// signature covers) and the first broken link, if any.
    pub chain: ChainStatus,
    /// The store against what this machine anchored of it, outside the workspace: `intact`
    /// (or `empty`), `rolled_back` (cut or rewritten since: nothing executes) or
    /// `unavailable` (no anchor can be kept: nothing executes).
    pub standing: crate::anchor::Standing,
}

pub fn register(r: &mut Router<App>) {
    r.add(
        MethodDef {
            name: "gaffer/status",
            doc: "Check the server: version, workspace, store sequence number (`store.seq`), your client name and role, and other gaffer processes on this workspace. With `after_seq` it waits (up to `timeout_ms`) until the store has passed that sequence number, e.g. for another process's write; then `timed_out` says whether it gave up first. Call it first to see that gaffer serves the workspace you expect.",
            access: Access::Read,
            audience: Audience::Anyone,
            mcp_tool: Some("gaffer_status"),
        },
        status,
    );
}

async fn status(app: Arc<App>, ctx: CallCtx, p: StatusParams) -> Result<StatusResult, RpcError> {
    let mut timed_out = None;
    if let Some(after) = p.after_seq {
        let timeout = Duration::from_millis(p.timeout_ms.unwrap_or(10_000).min(30_000));
        let deadline = tokio::time::Instant::now() + timeout;
        let mut events = app.workspace.subscribe();
        ctx.progress
            .begin(&format!("waiting for store sequence {after}"));
        while app.workspace.seq() <= after && tokio::time::Instant::now() < deadline {
            // Wake on any change; the short sleep bound also catches records folded by reads.
            let _ = tokio::time::timeout_at(
                deadline.min(tokio::time::Instant::now() + Duration::from_millis(50)),
                events.recv(),
            )
            .await;
        }
        ctx.progress.end("done");
        timed_out = Some(app.workspace.seq() <= after);
    }
    let ws = &app.workspace;
    let dir = ws.gaffer_dir();
    Ok(StatusResult {
        version: env!("CARGO_PKG_VERSION").to_string(),
        workspace: ws.root().display().to_string(),
        workspace_id: ws.workspace_id(),
        store: StoreStatus {
            exists: dir.is_dir(),
            dir: dir.display().to_string(),
            seq: ws.seq(),
            chain: ws.chain_status(),
            standing: ws.standing(),
        },
        profile: ctx.client.profile,
        client: ctx.client.id.clone(),
        role: ctx.client.role,
        pid: app.instance.me.pid,
        peers: app.instance.peers(),
        trust: crate::operations::trust::report(ws, crate::operator::current_public().as_ref()),
        timed_out,
    })
}
