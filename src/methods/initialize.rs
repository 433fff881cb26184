//! What `initialize` takes and answers, described for `schema/` (the session builds the replies;
//! e2e tests check them against these schemas).

use schemars::JsonSchema;
use serde::Serialize;
use serde_json::Value;

use crate::rpc::Role;

/// Options a client may pass in LSP `initialize` params as `initializationOptions` (raw clients
/// may put them at the top level of the params). Unknown options are ignored.
#[derive(Debug, Serialize, JsonSchema)]
pub struct InitializeOptions {
    /// The role this connection asks for. `agent` (the default) may call every method whose
    /// audience is `anyone`. `operator` may also call the operator methods (approvals); the
    /// connection must prove the operator credential, else `initialize` fails with
    /// `data.code` naming why. MCP connections are always agents.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub role: Option<Role>,
}

/// The `initialize` result on the LSP and raw profiles.
#[derive(Debug, Serialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LspInitializeResult {
    pub capabilities: LspCapabilities,
    pub server_info: ServerInfo,
    /// The role the connection was given.
    #[serde(rename = "role")]
    pub role: Role,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct LspCapabilities {
    pub experimental: Experimental,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Experimental {
    pub gaffer: GafferCapabilities,
}

/// What this connection may use: operator methods are listed only to operators.
#[derive(Debug, Serialize, JsonSchema)]
pub struct GafferCapabilities {
    pub methods: Vec<String>,
    pub notifications: Vec<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ServerInfo {
    pub name: String,
    pub version: String,
}

/// The MCP revisions served, for `schema/index.json`.
pub fn mcp_revisions() -> Value {
    use crate::rpc::session::{MCP_HANDSHAKE_VERSIONS, MCP_STATELESS_VERSION};
    serde_json::json!({
        "handshake": {
            "versions": MCP_HANDSHAKE_VERSIONS,
            "doc": "`initialize` with `protocolVersion` (echoed when supported, else the newest), then `notifications/initialized`; `tools/list`, `tools/call`, `ping`, `notifications/cancelled` (the cancelled request gets no reply), `notifications/progress`.",
        },
        "stateless": {
            "version": MCP_STATELESS_VERSION,
            "doc": "No handshake: every request carries `_meta` with `io.modelcontextprotocol/protocolVersion`; `server/discover` lists the versions. Results carry `resultType`; `server/discover` and `tools/list` also `ttlMs` and `cacheScope`.",
        },
        "tools": "Each tool's `outputSchema` describes its `structuredContent`: the method's result (one that is not an object is sent as `{\"result\": …}`), or, with `isError: true`, `{\"error\": …}` for a domain error the agent can correct.",
    })
}
