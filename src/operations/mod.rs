//! Operations: side effects an agent asks for, gated by workspace policy and human approval,
//! executed at most once through a provider adapter and reconciled when the outcome is unknown.
//!
//! - [`canonical`]: strict JSON parsing, RFC 8785 text, token-exact comparison.
//! - [`lifecycle`]: the eight states, allowed transitions, stable error codes.
//! - [`policy`]: `.gaffer/policy.yaml` rules and the decision order.
//! - [`plan`]: the immutable, digest-identified plan an approval is bound to.
//! - [`decision`]: what an operator signs when deciding.
//! - [`grant`]: how much one approval may grant, from the trusted policy and the plan text.
//! - [`detail`], [`diff`]: what `approvals/get` shows beyond the view (canonical plan, file
//!   diff, command, narrowings, time left).
//! - [`authorize`]: the one authorization check every execution passes at its claim.
//! - [`adapter`]: the provider contract and the catalog-checked registry.
//! - [`adapters`]: built-in providers (workspace files, commands) and external ones.
//! - [`state`]: the journal fold of operations and approvals; `compact`: how a snapshot
//!   stores the operations.
//! - [`trust`]: operator-signed trust records for `policy.yaml` and `providers.yaml`.

pub mod adapter;
pub mod adapters;
pub mod authorize;
pub mod canonical;
mod compact;
pub mod decision;
pub mod detail;
pub mod diff;
pub mod engine;
pub mod grant;
pub mod index;
#[cfg(test)]
mod index_tests;
pub mod lifecycle;
pub mod plan;
pub mod policy;
pub mod seal;
pub mod state;
pub mod trust;
pub mod views;

pub use state::OperationState;

use std::sync::Arc;

/// Builds this process's operation runtime on `ws`: built-in providers plus every external
/// provider declared in `.gaffer/providers.yaml`, checked against their catalogs. External
/// providers start only when the operator has trusted that exact file (`gaffer trust`): the
/// agent can write workspace files, and must not get to name executables gaffer runs.
/// `start_providers` false leaves them all out (an operator command that needs none of their
/// operations: a provider that hangs or fails must never keep the operator from acting).
pub fn open_runtime(
    ws: Arc<crate::workspace::Workspace>,
    me: &crate::peers::Peer,
    config: engine::RuntimeConfig,
    workers: Arc<crate::workers::WorkerRuntime>,
    plans: Arc<crate::plans::PlanRuntime>,
    start_providers: bool,
) -> Result<Arc<engine::OperationRuntime>, String> {
    let mut catalogs = vec![
        adapters::workspace::catalog(),
        adapters::command::catalog(),
        adapters::worker::catalog(),
        adapters::plan::catalog(),
    ];
    let mut all = adapters::workspace::adapters();
    all.extend(adapters::command::adapters());
    all.extend(adapters::worker::adapters(workers));
    let lanes = Arc::clone(plans.lanes());
    all.extend(adapters::plan::adapters(plans));
    let gaffer_dir = ws.gaffer_dir();
    let key = crate::operator::current_public();
    let providers = trust::check(&ws, adapters::external::PROVIDERS_FILE, key.as_ref())
        .map_err(|e| e.to_string())?;
    let mut failed = Vec::new();
    // The last trusted content is what runs, whatever the file on disk says now.
    match (providers.enforced(), providers.status) {
        (Some(_), _) if !start_providers => {}
        (Some(bytes), _) => {
            let file = gaffer_dir.join(adapters::external::PROVIDERS_FILE);
            let sandbox = trust::effective_policy(&ws, key.as_ref()).sandbox;
            let taken = catalogs
                .iter()
                .flat_map(|c| c.descriptors.iter().map(|d| d.name.clone()))
                .collect();
            let loaded = adapters::external::load(bytes, &file, ws.root(), sandbox, &taken);
            catalogs.extend(loaded.catalogs);
            all.extend(loaded.adapters);
            failed = loaded.failed;
        }
        (None, status)
            if providers.disk.is_some()
                || matches!(
                    status,
                    trust::TrustStatus::ContentMissing | trust::TrustStatus::RolledBack
                ) =>
        {
            tracing::warn!(
                ?status,
                "providers.yaml is not trusted by the operator; no external provider is started \
                 (run `gaffer trust` to review and trust it, then restart gaffer)"
            );
        }
        (None, _) => {}
    }
    let registry = adapter::Registry::new(&catalogs, all).map_err(|e| e.to_string())?;
    let rt = engine::OperationRuntime::new(
        ws,
        registry,
        config,
        engine::executor_id(me.pid, me.started_ms),
    );
    rt.set_providers_trust(providers.status, failed);
    rt.set_lanes(lanes);
    Ok(rt)
}

/// Starts recovery and the background loop (needs a tokio runtime).
pub fn start_runtime(rt: &Arc<engine::OperationRuntime>) {
    let peers_dir = rt.workspace().gaffer_dir().join("peers");
    rt.start(move || live_executors(&peers_dir));
}

/// Executor ids of gaffer processes on the workspace that are still running.
pub fn live_executors(peers_dir: &std::path::Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(peers_dir) else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| {
            crate::util::read_regular_file(&e.path(), Some(crate::peers::PRESENCE_LIMIT)).ok()
        })
        .filter_map(|b| serde_json::from_slice::<crate::peers::Peer>(&b).ok())
        .filter(|p| crate::peers::alive(p.pid))
        .map(|p| engine::executor_id(p.pid, p.started_ms))
        .collect()
}
