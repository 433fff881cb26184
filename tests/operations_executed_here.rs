//! What a serving process keeps of the executions it ran itself: its plan lanes' outcomes,
//! which their plans take as evidence (`plans_e2e` shows a lane's operation verified from
//! them), and nothing for any other client's operation. A long-lived server runs operations
//! without end; one entry kept for each would grow with every one.
//!
//! The in-process fixture is the operations bench's (a no-op provider under a signed allow
//! rule), so this is the path that bench measures.

#[path = "../benches/common/noop.rs"]
mod noop;

#[test]
fn executions_for_clients_that_are_not_lanes_are_not_kept() {
    let _env = noop::test_environment();
    let dir = noop::workspace_with_allow();
    let rt = gaffer::runtime::builder().build().expect("runtime");
    rt.block_on(async {
        let ws = gaffer::workspace::Workspace::open(dir.path()).expect("open");
        let ops = noop::runtime(&ws);
        for i in 0..3 {
            let (view, created) = ops
                .submit("agent", noop::input(&format!("k{i}")))
                .await
                .expect("submit");
            assert!(created);
            let end = noop::ended(&ops, "agent", view).await;
            assert_eq!(end.state.as_str(), "succeeded");
            assert_eq!(ops.executed_here(&end.id), None, "{}", end.id);
        }
    });
}
