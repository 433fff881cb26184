//! The in-process operations fixture the operations bench measures and the in-process
//! operations tests run: a provider whose operation does nothing, a workspace whose signed
//! policy allows it, and the runtime on it.

#![allow(dead_code)]

use std::sync::Arc;

use gaffer::operations::adapter::{
    Adapter, AdapterCtx, AdapterError, BoxFuture, Catalog, Decoded, Descriptor, ExecError, Outcome,
    Presentation, Registry, Resolved, Risk,
};
use gaffer::operations::engine::{OperationRuntime, RuntimeConfig, SubmitInput};
use gaffer::operations::policy::Classification;
use gaffer::operations::views::OperationView;
use gaffer::workspace::Workspace;
use serde_json::{Value, json};

/// A provider whose operation does nothing and proves it immediately: the numbers measure
/// gaffer, not a provider.
pub struct Noop {
    desc: Descriptor,
    /// Runs as each plan is resolved, at submission and again before execution: after the
    /// policy was looked up, before the commit that records the decision or the claim (tests
    /// change the policy there).
    on_resolve: Option<Box<dyn Fn() + Send + Sync>>,
}

impl Noop {
    pub fn new(desc: Descriptor) -> Noop {
        Noop {
            desc,
            on_resolve: None,
        }
    }

    pub fn on_resolve(desc: Descriptor, f: impl Fn() + Send + Sync + 'static) -> Noop {
        Noop {
            desc,
            on_resolve: Some(Box::new(f)),
        }
    }
}

impl Adapter for Noop {
    fn descriptor(&self) -> &Descriptor {
        &self.desc
    }
    fn decode<'a>(
        &'a self,
        t: &'a Value,
        a: &'a Value,
    ) -> BoxFuture<'a, Result<Decoded, AdapterError>> {
        Box::pin(async move {
            Ok(Decoded {
                target: t.clone(),
                arguments: a.clone(),
            })
        })
    }
    fn resolve<'a>(
        &'a self,
        _c: &'a AdapterCtx,
        i: Decoded,
    ) -> BoxFuture<'a, Result<Resolved, AdapterError>> {
        if let Some(f) = &self.on_resolve {
            f();
        }
        Box::pin(async move {
            Ok(Resolved {
                target: i.target,
                arguments: i.arguments,
                preconditions: json!({}),
            })
        })
    }
    fn authorize<'a>(
        &'a self,
        _p: &'a Resolved,
    ) -> BoxFuture<'a, Result<Classification, AdapterError>> {
        Box::pin(async {
            Ok(Classification {
                target_kind: "noop".into(),
                ..Default::default()
            })
        })
    }
    fn present<'a>(
        &'a self,
        _p: &'a Resolved,
    ) -> BoxFuture<'a, Result<Presentation, AdapterError>> {
        Box::pin(async {
            Ok(Presentation {
                title: "No-op".into(),
                summary: String::new(),
            })
        })
    }
    fn execute<'a>(
        &'a self,
        _c: &'a AdapterCtx,
        _p: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        proven(Some(json!({"ok": true})))
    }
    fn reconcile<'a>(
        &'a self,
        _c: &'a AdapterCtx,
        _p: &'a Resolved,
    ) -> BoxFuture<'a, Result<Outcome, ExecError>> {
        proven(None)
    }
}

/// An outcome proven at once, with `result`.
fn proven<'a>(result: Option<Value>) -> BoxFuture<'a, Result<Outcome, ExecError>> {
    Box::pin(async move {
        Ok(Outcome {
            proven: true,
            result,
            upstream_status: None,
        })
    })
}

pub fn noop_desc() -> Descriptor {
    Descriptor {
        name: "bench.noop".into(),
        provider: "bench".into(),
        operation_revision: 1,
        summary: "does nothing".into(),
        risk: Risk::Low,
        target_kind: "noop".into(),
        target_schema: json!({"type": "object"}).into(),
        arguments_schema: json!({"type": "object"}).into(),
        request_ttl_seconds: 60,
        approval_ttl_seconds: 600,
        requires_approval: false,
        implemented: true,
    }
}

pub fn runtime(ws: &Arc<Workspace>) -> Arc<OperationRuntime> {
    runtime_with(ws, Noop::new(noop_desc()))
}

/// [`runtime`] with this no-op provider.
pub fn runtime_with(ws: &Arc<Workspace>, noop: Noop) -> Arc<OperationRuntime> {
    let rt = runtime_unstarted(ws, noop);
    gaffer::operations::start_runtime(&rt);
    rt
}

/// The runtime before it is started: it records what it is asked to and executes nothing
/// until started (as a one-shot CLI process).
pub fn runtime_unstarted(ws: &Arc<Workspace>, noop: Noop) -> Arc<OperationRuntime> {
    OperationRuntime::new(
        Arc::clone(ws),
        registry(noop),
        RuntimeConfig::default(),
        "bench:0".into(),
    )
}

/// The registry holding the no-op provider alone.
pub fn registry(noop: Noop) -> Registry {
    Registry::new(
        &[Catalog {
            provider: "bench".into(),
            descriptors: vec![noop_desc()],
        }],
        vec![Arc::new(noop)],
    )
    .expect("registry")
}

pub fn input(key: &str) -> SubmitInput {
    SubmitInput {
        operation: "bench.noop".into(),
        target: serde_json::value::to_raw_value(&json!({"n": 1})).expect("raw"),
        arguments: serde_json::value::to_raw_value(&json!({})).expect("raw"),
        reason: "bench".into(),
        idempotency_key: key.into(),
    }
}

pub fn workspace_with_allow() -> tempfile::TempDir {
    workspace_with_policy("rules:\n  - id: all\n    effect: allow\n    operations: [\"bench.*\"]\n")
}

/// A workspace whose policy, `policy`, the operator signed.
pub fn workspace_with_policy(policy: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("tempdir");
    std::fs::create_dir_all(dir.path().join(".gaffer")).expect("mkdir");
    std::fs::write(dir.path().join(".gaffer/policy.yaml"), policy).expect("policy");
    // Allow rules count only when the operator signed the policy (`gaffer trust`), here the
    // exact text written above.
    let pin = format!(
        "policy.yaml={}",
        gaffer::util::sha256_hex(policy.as_bytes())
    );
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--workspace")
        .arg(dir.path())
        .args(["trust", "--expect", &pin])
        .output()
        .expect("gaffer trust");
    assert!(out.status.success(), "gaffer trust failed");
    dir
}

/// A throwaway operator key for the whole bench process (set before any thread starts).
pub fn bench_operator_key() -> tempfile::TempDir {
    let cfg = tempfile::tempdir().expect("tempdir");
    let key = cfg.path().join("operator.key");
    gaffer::operator::OperatorSigner::init(&key, &key.with_extension("pub"), None).expect("key");
    // SAFETY: called first thing in main, before the runtime or any other thread exists.
    unsafe { std::env::set_var("GAFFER_OPERATOR_KEY_FILE", &key) };
    cfg
}

/// Waits until operation `id` (last seen at `view`) has ended, and returns it as it ended.
pub async fn ended(ops: &OperationRuntime, client: &str, view: OperationView) -> OperationView {
    let mut view = view;
    while !view.state.is_terminal() {
        view = ops
            .wait(Some(client), &view.id, view.revision, 30)
            .await
            .expect("wait");
    }
    view
}

/// For a test binary's one test: a state directory (the anchor) and an operator key of its
/// own, set in the environment before any thread starts. Keep both until the test ends.
pub fn test_environment() -> (tempfile::TempDir, tempfile::TempDir) {
    let state = tempfile::tempdir().expect("state dir");
    // SAFETY: called first in the binary's only test, before any other thread exists.
    unsafe { std::env::set_var("GAFFER_STATE_DIR", state.path()) };
    (state, bench_operator_key())
}
