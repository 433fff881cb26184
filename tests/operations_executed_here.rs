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
    // The only test in this binary: the environment is set before any thread starts.
    let state = tempfile::tempdir().expect("state dir");
    // SAFETY: no other thread exists yet.
    unsafe { std::env::set_var("GAFFER_STATE_DIR", state.path()) };
    let _key = noop::bench_operator_key();
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
            let mut rev = view.revision;
            let end = loop {
                let w = ops
                    .wait(Some("agent"), &view.id, rev, 30)
                    .await
                    .expect("wait");
                if w.state.is_terminal() {
                    break w;
                }
                rev = w.revision;
            };
            assert_eq!(end.state.as_str(), "succeeded");
            assert_eq!(ops.executed_here(&view.id), None, "{}", view.id);
        }
    });
}
