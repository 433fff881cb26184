//! A deny rule the operator adds to `policy.yaml` holds for every decision and every claim
//! committed after the edit, even one whose policy was looked up before it: the commit that
//! records a decision or a claim checks the policy file and the operator key again, and one
//! made on files that have changed since is made again.
//!
//! The edit lands where a real one can: after the policy was looked up, while the adapter
//! resolves the plan, before the commit.

#[path = "../benches/common/noop.rs"]
mod noop;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use gaffer::operations::engine::OperationRuntime;
use gaffer::workspace::Workspace;

/// Appends a deny rule for the no-op operation to the policy, once, after it is armed.
struct DenyOnce {
    policy: PathBuf,
    armed: AtomicBool,
    done: AtomicBool,
}

impl DenyOnce {
    fn edit(&self) {
        if self.armed.load(Ordering::SeqCst) && !self.done.swap(true, Ordering::SeqCst) {
            let mut text = std::fs::read_to_string(&self.policy).expect("policy");
            text.push_str("  - id: stop\n    effect: deny\n    operations: [\"bench.*\"]\n");
            std::fs::write(&self.policy, text).expect("edit the policy");
        }
    }
}

fn runtime_denying_once(ws: &Arc<Workspace>) -> (Arc<OperationRuntime>, Arc<DenyOnce>) {
    let deny = Arc::new(DenyOnce {
        policy: ws.gaffer_dir().join("policy.yaml"),
        armed: AtomicBool::new(false),
        done: AtomicBool::new(false),
    });
    let edit = Arc::clone(&deny);
    let noop = noop::Noop::on_resolve(noop::noop_desc(), move || edit.edit());
    (noop::runtime_unstarted(ws, noop), deny)
}

/// Submits and waits for the operation to end; returns its final state.
async fn run(ops: &OperationRuntime, key: &str) -> String {
    let (view, _) = ops.submit("agent", noop::input(key)).await.expect("submit");
    let end = noop::ended(ops, "agent", view).await;
    end.state.as_str().to_string()
}

/// A submission whose policy was looked up before the edit is decided again at its commit.
async fn a_decision_made_before_the_edit_is_made_again() {
    let dir = noop::workspace_with_allow();
    let ws = Workspace::open(dir.path()).expect("open");
    let (ops, deny) = runtime_denying_once(&ws);
    gaffer::operations::start_runtime(&ops);
    // Before the edit the signed allow rule runs it, and the policy is looked up.
    assert_eq!(run(&ops, "before").await, "succeeded");
    deny.armed.store(true, Ordering::SeqCst);
    assert_eq!(run(&ops, "during").await, "denied");
    assert!(deny.done.load(Ordering::SeqCst));
    assert_eq!(run(&ops, "after").await, "denied");
}

/// An approved operation left to a later drive: the drive looks the policy up, the edit lands
/// while it resolves the plan again, and its claim is refused at the commit and made again.
async fn a_claim_made_before_the_edit_is_made_again() {
    let dir = noop::workspace_with_allow();
    let ws = Workspace::open(dir.path()).expect("open");
    let (ops, deny) = runtime_denying_once(&ws);
    // Not started: the submit records it approved and leaves the claim to a drive.
    let (view, _) = ops
        .submit("agent", noop::input("left"))
        .await
        .expect("submit");
    assert_eq!(view.state.as_str(), "approved");
    deny.armed.store(true, Ordering::SeqCst);
    gaffer::operations::start_runtime(&ops);
    let end = noop::ended(&ops, "agent", view.clone()).await.state;
    assert!(deny.done.load(Ordering::SeqCst));
    assert_eq!(end.as_str(), "failed");
    let op = ops.get(Some("agent"), &view.id).expect("get");
    let error = op.error.expect("the refusal says why");
    assert!(error.message.contains("stop"), "{error:?}");
}

#[test]
fn a_deny_rule_added_before_a_decision_or_claim_is_committed_is_honored() {
    let _env = noop::test_environment();
    let rt = gaffer::runtime::builder().build().expect("runtime");
    rt.block_on(async {
        a_decision_made_before_the_edit_is_made_again().await;
        a_claim_made_before_the_edit_is_made_again().await;
    });
}
