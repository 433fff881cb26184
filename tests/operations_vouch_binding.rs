//! A serving process vouches for what it accepted from a checked connection: that client and
//! that plan, never just an operation id. The agent (who writes the store with its real framing
//! and chain) waits until an accepted operation was canceled before it was claimed and gaffer
//! pruned it, then creates another operation under the same id and client with a plan of its
//! own; the client's allow rule must not run it.
//!
//! In process, on the operations bench's fixture: the runtime accepts the submission before it
//! is started, which leaves it accepted and unclaimed as a claim that lost its race does.

#[path = "../benches/common/noop.rs"]
mod noop;

use gaffer::operations::state::KIND_CREATED;
use gaffer::workspace::NewRecord;
use serde_json::{Value, json};

const POLICY: &str = "rules:\n  - id: ci-only\n    effect: allow\n    clients: [ci-agent]\n    operations: [\"bench.*\"]\n";

/// The plan text of `plan` with its target replaced, canonical, and its digest.
fn swapped(plan: &str, target: Value) -> (String, String) {
    let mut v: Value = serde_json::from_str(plan).expect("plan json");
    v["target"] = target;
    let text = gaffer::operations::canonical::jcs(&v);
    let digest = gaffer::util::sha256_hex(text.as_bytes());
    (text, digest)
}

#[test]
fn an_operation_re_created_under_an_accepted_id_is_not_vouched_for() {
    let _env = noop::test_environment();
    let dir = noop::workspace_with_policy(POLICY);
    let rt = gaffer::runtime::builder().build().expect("runtime");
    rt.block_on(async {
        let ws = gaffer::workspace::Workspace::open(dir.path()).expect("open");
        let ops = noop::runtime_unstarted(&ws, noop::Noop::new(noop::noop_desc()));
        // ci-agent's submission, accepted from its checked connection and not yet claimed.
        let (view, created) = ops
            .submit("ci-agent", noop::input("ci-1"))
            .await
            .expect("submit");
        assert!(created);
        assert_eq!(view.state.as_str(), "approved");
        let id = view.id.clone();
        let op = ws
            .read(|s| s.operations.get(&id).cloned())
            .expect("the operation");

        // ci-agent cancels it (gaffer keeps an operation the agent ended itself from its
        // prunes); once gaffer's retention pruned it (a prune the agent writes is skipped),
        // the agent creates its own plan under the same id and client.
        let mut forged = serde_json::to_value(&op).expect("op json");
        let (text, digest) = swapped(op.plan.as_deref().expect("plan"), json!({"n": 2}));
        forged["target"] = json!({"n": 2});
        forged["plan"] = json!(text);
        forged["plan_digest"] = json!(digest);
        forged["idempotency_key"] = json!("forged-1");
        let append = |records: Vec<(&'static str, Value)>| {
            ws.commit(move |_| {
                let recs = records
                    .into_iter()
                    .map(|(k, p)| NewRecord::new(k, p))
                    .collect::<Result<Vec<_>, _>>()
                    .map_err(|e| e.to_string())?;
                Ok::<_, String>((recs, ()))
            })
        };
        ops.cancel(Some("ci-agent"), &id)
            .await
            .expect("ci-agent's cancel");
        std::thread::sleep(std::time::Duration::from_millis(2));
        let retention = gaffer::operations::engine::OperationRuntime::new(
            std::sync::Arc::clone(&ws),
            noop::registry(noop::Noop::new(noop::noop_desc())),
            gaffer::operations::engine::RuntimeConfig { retention_ms: 0 },
            "bench:1".into(),
        );
        retention.prune().await;
        assert!(
            ws.read(|s| s.operations.get(&id).is_none()),
            "gaffer pruned it"
        );
        append(vec![(
            KIND_CREATED,
            json!({"operation": forged, "approval": null}),
        )])
        .await
        .expect("the agent's re-creation");
        let now_there = ws
            .read(|s| s.operations.get(&id).cloned())
            .expect("the re-created operation");
        assert_eq!(now_there.plan_digest.as_deref(), Some(digest.as_str()));
        assert_eq!(now_there.state.as_str(), "approved");

        // The serving process starts driving: the operation under that id is not what it
        // accepted, so ci-agent's rule does not apply to it.
        gaffer::operations::start_runtime(&ops);
        let end = noop::ended(
            &ops,
            "ci-agent",
            ops.get(Some("ci-agent"), &id).expect("get"),
        )
        .await;
        assert_eq!(end.state.as_str(), "failed", "{end:?}");
        let error = serde_json::to_string(&end.error).expect("error json");
        assert!(error.contains("approval_invalid"), "{error}");
    });
}
