use super::*;
use crate::bundles::{Bundle, SyncOutcome};
use crate::workers::request::parse_create;
use crate::workers::types::Stream;
use serde_json::json;

fn bundle() -> Bundle {
    bundles::parse_value(json!({
        "metadata": {"id": "rt", "revision": "r1", "created_at": "now", "provenance": {"source": "unit"}},
        "profiles": [
            {"selector": {"kind": "named", "value": "sleep"}, "command": ["sh", "-c", "echo up; exec sleep 30"]},
        ]
    }))
    .unwrap()
}

/// A workspace with the test bundle synced (blob + record, as `bundles/sync` does).
async fn workspace() -> (tempfile::TempDir, Arc<Workspace>, bundles::BundleRef) {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path()).unwrap();
    let prepared = bundles::prepare(&bundle()).unwrap();
    ws.put_blob(&prepared.canonical.bytes).unwrap();
    let reference = prepared.reference();
    ws.commit(move |s: &State| match s.bundles.plan_sync(&prepared) {
        Ok(SyncOutcome::New { kind, payload, .. }) => Ok((
            vec![NewRecord::text(kind, crate::store::raw_payload(payload))],
            (),
        )),
        Ok(SyncOutcome::AlreadySynced(_)) => Ok((vec![], ())),
        Err(e) => Err(e),
    })
    .await
    .map_err(|_| "sync failed")
    .unwrap();
    (dir, ws, reference)
}

/// Creates a worker and starts it as its authorized `worker.start` execution would.
async fn create_started(rt: &Arc<WorkerRuntime>, b: &Bundle, req: CreateRequest) -> Worker {
    let profile = b
        .profiles
        .iter()
        .find(|p| p.selector == req.profile)
        .unwrap()
        .clone();
    let w = rt.create(req).await.unwrap();
    assert_eq!(w.status, WorkerStatus::PendingApproval);
    rt.start_worker(start_spec(&w.id, "op_unit", profile, b))
        .await
        .unwrap()
}

/// What an authorized start of `worker_id` under `operation_id` passes.
fn start_spec(
    worker_id: &str,
    operation_id: &str,
    profile: bundles::Profile,
    b: &Bundle,
) -> StartSpec {
    StartSpec {
        worker_id: worker_id.to_string(),
        operation_id: operation_id.into(),
        profile,
        declarations: b.declarations.clone(),
        argument_input: None,
        channel: None,
        env: Vec::new(),
        sandbox: Default::default(),
    }
}

fn request(reference: &bundles::BundleRef) -> CreateRequest {
    parse_create(
        &json!({"profile": {"kind": "named", "value": "sleep"}, "config_bundle": reference}),
        None,
    )
    .unwrap()
}

#[tokio::test]
async fn without_any_backend_create_fails_closed_and_writes_nothing() {
    let (_dir, ws, reference) = workspace().await;
    let rt = WorkerRuntime::with_backends(Arc::clone(&ws), vec![]);
    let seq = ws.seq();
    match rt.create(request(&reference)).await {
        Err(WorkerError::BackendUnavailable { message, .. }) => {
            assert!(message.contains("no execution backend"), "{message}")
        }
        other => panic!("expected backend_unavailable, got {other:?}"),
    }
    assert_eq!(ws.seq(), seq);
    assert_eq!(ws.read(|s| s.workers.workers.len()), 0);
}

#[tokio::test]
async fn shutdown_stops_owned_workers_and_records_why() {
    let (_dir, ws, reference) = workspace().await;
    let rt = WorkerRuntime::new(Arc::clone(&ws));
    let w = create_started(&rt, &bundle(), request(&reference)).await;
    assert_eq!(w.status, WorkerStatus::Running);
    assert_eq!(
        w.owner.as_ref().unwrap().process_id,
        rt.owner_identity().process_id
    );
    assert_eq!(rt.live_count(), 1);
    rt.shutdown(Duration::from_secs(10)).await;
    let after = ws.read(|s| s.workers.get(&w.id).cloned()).unwrap();
    assert_eq!(after.status, WorkerStatus::Stopped);
    assert!(after.reason.unwrap().contains("shutting down"));
    assert_eq!(rt.live_count(), 0);
}

#[tokio::test]
async fn output_is_journalled_in_order_and_coalesced() {
    let dir = tempfile::tempdir().unwrap();
    let ws = Workspace::open(dir.path()).unwrap();
    let b = bundles::parse_value(json!({
        "metadata": {"id": "chatty", "revision": "r1", "created_at": "now", "provenance": {"source": "unit"}},
        "profiles": [{"selector": {"kind": "named", "value": "count"},
                      "command": ["sh", "-c", "i=0; while [ $i -lt 3000 ]; do echo line $i; i=$((i+1)); done"]}]
    }))
    .unwrap();
    let prepared = bundles::prepare(&b).unwrap();
    let bundle = b.clone();
    ws.put_blob(&prepared.canonical.bytes).unwrap();
    let reference = prepared.reference();
    ws.commit(move |s: &State| match s.bundles.plan_sync(&prepared) {
        Ok(SyncOutcome::New { kind, payload, .. }) => Ok((
            vec![NewRecord::text(kind, crate::store::raw_payload(payload))],
            (),
        )),
        _ => Err(()),
    })
    .await
    .map_err(|_| "sync failed")
    .unwrap();
    let rt = WorkerRuntime::new(Arc::clone(&ws));
    let req = parse_create(
        &json!({"profile": {"kind": "named", "value": "count"}, "config_bundle": reference}),
        None,
    )
    .unwrap();
    let w = create_started(&rt, &bundle, req).await;
    let done = rt.wait_final(&w.id, Duration::from_secs(30)).await.unwrap();
    assert_eq!(done.status, WorkerStatus::Stopped, "{done:?}");
    let (entries, _) = ws.read(|s| s.workers.transcript(&w.id, 0, 100_000));
    let text: String = entries
        .iter()
        .filter(|e| e.stream == Stream::Stdout)
        .map(|e| e.text.as_str())
        .collect();
    let expected: String = (0..3000).map(|i| format!("line {i}\n")).collect();
    assert_eq!(text, expected);
    let outputs = entries
        .iter()
        .filter(|e| e.stream == Stream::Stdout)
        .count();
    assert!(outputs < 3000, "output was batched into {outputs} records");
}

/// Commits operation records as the engine would write them.
async fn commit_ops(ws: &Workspace, records: Vec<(&'static str, serde_json::Value)>) {
    let records: Vec<NewRecord> = records
        .into_iter()
        .map(|(kind, v)| NewRecord::text(kind, crate::store::raw_payload(v)))
        .collect();
    ws.commit(move |_: &State| Ok::<_, WorkerError>((records, ())))
        .await
        .map_err(|_| "commit failed")
        .unwrap();
}

#[tokio::test]
async fn a_pending_worker_under_a_succeeded_launch_waits_for_its_living_creator() {
    // A plan's launch succeeds before its later lanes start; the periodic restore must not
    // retire a lane worker waiting under it. A start operation that ended otherwise must.
    use crate::operations::lifecycle::OpState as S;
    use crate::operations::state::tests::{created, op, tr};
    use crate::operations::state::{KIND_CREATED, KIND_TRANSITIONED};
    let (_dir, ws, reference) = workspace().await;
    commit_ops(
        &ws,
        vec![
            (
                KIND_CREATED,
                created(op("op_launch", S::Approved, None), None),
            ),
            (
                KIND_TRANSITIONED,
                tr("op_launch", S::Approved, S::Executing, 2, None),
            ),
            (
                KIND_TRANSITIONED,
                tr("op_launch", S::Executing, S::Succeeded, 3, None),
            ),
            (
                KIND_CREATED,
                created(op("op_denied", S::Denied, None), None),
            ),
        ],
    )
    .await;
    let state_of = |id: &str| ws.read(|s| s.operations.get(id).map(|o| o.state));
    assert_eq!(state_of("op_launch"), Some(S::Succeeded));
    assert_eq!(state_of("op_denied"), Some(S::Denied));
    let rt = WorkerRuntime::new(Arc::clone(&ws));
    let lane = rt.create(request(&reference)).await.unwrap();
    rt.link_operation(&lane.id, "op_launch").await.unwrap();
    let refused = rt.create(request(&reference)).await.unwrap();
    rt.link_operation(&refused.id, "op_denied").await.unwrap();
    rt.restore().await;
    let status = |id: &str| ws.read(|s| s.workers.get(id).cloned()).unwrap();
    assert_eq!(status(&lane.id).status, WorkerStatus::PendingApproval);
    let gone = status(&refused.id);
    assert_eq!(gone.status, WorkerStatus::Stopped);
    assert!(
        gone.reason
            .as_deref()
            .unwrap_or("")
            .contains("ended without starting it"),
        "{gone:?}"
    );
    let b = bundle();
    let started = rt
        .start_worker(start_spec(&lane.id, "op_launch", b.profiles[0].clone(), &b))
        .await
        .unwrap();
    assert_eq!(started.status, WorkerStatus::Running);
    rt.shutdown(Duration::from_secs(10)).await;
}
