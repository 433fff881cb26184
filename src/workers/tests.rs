use super::plan::{check_create, check_input};
use super::request::{parse_create, parse_input_request};
use super::state::{TRANSCRIPT_MAX_ENTRIES, records};
use super::*;
use crate::bundles::{self, BundleRef, BundleState, InputMode, ProfileSelector, SyncOutcome};
use proptest::prelude::*;
use serde_json::{Value, json};

const DIGEST: &str = "sha256:875b0088bffaed17b244cc52a75c22798dabce6f9302984c17d2d588fc91a826";

fn create_params() -> Value {
    json!({
        "profile": {"kind": "builtin", "value": "builtin:coder"},
        "config_bundle": {"id": "bundle-1", "digest": DIGEST},
        "initial_input": {"segments": [{"kind": "text", "content": "hello"}]},
        "display_name": "coder one",
        "idempotency_key": "k-1"
    })
}

fn field_of(v: Value) -> String {
    parse_create(&v, None).unwrap_err().field
}

#[test]
fn a_valid_create_parses() {
    let r = parse_create(&create_params(), None).unwrap();
    assert_eq!(r.profile, ProfileSelector::Builtin("builtin:coder".into()));
    assert_eq!(
        r.initial_input.unwrap(),
        vec![Segment::Text {
            content: "hello".into()
        }]
    );
    let mut p = create_params();
    p["initial_input"] = json!("plain text");
    assert_eq!(
        parse_create(&p, None).unwrap().initial_input.unwrap(),
        vec![Segment::Text {
            content: "plain text".into()
        }]
    );
}

#[test]
fn every_forbidden_field_is_refused_by_name() {
    for f in [
        "worker_id",
        "cwd",
        "working_directory",
        "workspace_root",
        "path",
        "socket",
        "socket_path",
        "credentials",
        "token",
        "api_key",
        "password",
        "env",
        "session_path",
        "session_id",
        "cache_path",
        "command",
        "workspace_refs",
        "mount_refs",
        "requested_capabilities",
        "intent",
        "profile_source",
        "surprise",
    ] {
        let mut p = create_params();
        p[f] = json!("x");
        let err = parse_create(&p, None).unwrap_err();
        assert_eq!(err.field, f);
        if f == "surprise" {
            assert!(err.message.contains("unknown field"));
        } else {
            assert!(
                !err.message.contains("unknown field"),
                "{f}: {}",
                err.message
            );
        }
    }
    // Nested objects are closed too.
    let mut p = create_params();
    p["config_bundle"]["path"] = json!("/x");
    assert_eq!(field_of(p), "config_bundle.path");
    let mut p = create_params();
    p["profile"]["cwd"] = json!("/x");
    assert_eq!(field_of(p), "profile.cwd");
}

#[test]
fn bad_values_name_their_field() {
    let cases: Vec<(&str, Value)> = vec![
        ("profile.kind", json!({"kind": "default", "value": "x"})),
        ("profile.value", json!({"kind": "named", "value": ""})),
    ];
    for (field, profile) in cases {
        let mut p = create_params();
        p["profile"] = profile;
        assert_eq!(field_of(p), field);
    }
    let mut p = create_params();
    p["config_bundle"]["digest"] = json!("abc");
    assert_eq!(field_of(p), "config_bundle.digest");
    let mut p = create_params();
    p["display_name"] = json!("/home/me/sock");
    assert_eq!(field_of(p), "display_name");
    let mut p = create_params();
    p["idempotency_key"] = json!("has space");
    assert_eq!(field_of(p), "idempotency_key");
    let mut p = create_params();
    p["initial_input"]["segments"][0] = json!({"kind": "knowledge_ref", "id": "x"});
    assert_eq!(field_of(p), "initial_input.segments[0].kind");
    let mut p = create_params();
    p["initial_input"]["segments"][0] = json!({"kind": "file_ref", "path": "../../etc/passwd"});
    assert_eq!(field_of(p), "initial_input.segments[0].path");
    let mut p = create_params();
    p["initial_input"]["segments"][0] = json!({"kind": "file_ref", "path": "/etc/passwd"});
    assert_eq!(field_of(p), "initial_input.segments[0].path");
    let mut p = create_params();
    p["initial_input"]["segments"][0] = json!({"kind": "text", "content": "x", "cwd": "/"});
    assert_eq!(field_of(p), "initial_input.segments[0].cwd");
    let mut p = create_params();
    p["initial_input"] = json!({"segments": []});
    assert_eq!(field_of(p), "initial_input.segments");
    let mut p = create_params();
    p["initial_input"] = json!("x".repeat(request::MAX_INPUT_BYTES + 1));
    assert_eq!(field_of(p), "initial_input");
}

#[test]
fn file_refs_are_checked_against_the_workspace() {
    let ws = tempfile::tempdir().unwrap();
    std::fs::write(ws.path().join("notes.md"), "hi").unwrap();
    std::fs::create_dir(ws.path().join(".gaffer")).unwrap();
    std::fs::write(ws.path().join(".gaffer/secret"), "x").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("o.txt"), "x").unwrap();
    std::os::unix::fs::symlink(outside.path().join("o.txt"), ws.path().join("link.txt")).unwrap();
    let req = |path: &str| json!({"worker_id": new_worker_id(), "input": {"segments": [{"kind": "file_ref", "path": path}]}});
    assert!(parse_input_request(&req("notes.md"), Some(ws.path())).is_ok());
    assert!(
        parse_input_request(&req("./sub/../notes.md"), Some(ws.path())).is_err(),
        "sub does not exist"
    );
    for bad in ["missing.md", "link.txt", ".gaffer/secret"] {
        let err = parse_input_request(&req(bad), Some(ws.path())).unwrap_err();
        assert_eq!(err.field, "input.segments[0].path", "{bad}");
    }
}

#[test]
fn worker_ids_must_be_uuid_v7() {
    let bad = json!({"worker_id": "3f1e4a9c-1b2d-4c3e-8f00-000000000000", "input": "x"});
    assert_eq!(
        parse_input_request(&bad, None).unwrap_err().field,
        "worker_id"
    );
    let id = new_worker_id();
    assert_eq!(
        parse_input_request(&json!({"worker_id": id, "input": "x"}), None)
            .unwrap()
            .worker_id,
        id
    );
}

#[test]
fn fingerprint_ignores_the_key_but_not_the_content() {
    let a = parse_create(&create_params(), None).unwrap();
    let mut p = create_params();
    p["idempotency_key"] = json!("other");
    assert_eq!(
        parse_create(&p, None).unwrap().fingerprint(),
        a.fingerprint()
    );
    p["display_name"] = json!("another");
    assert_ne!(
        parse_create(&p, None).unwrap().fingerprint(),
        a.fingerprint()
    );
}

fn synced_bundles() -> BundleState {
    let b = bundles::parse_value(json!({
        "metadata": {"id": "bundle-1", "revision": "r1", "created_at": "2026-01-01T00:00:00Z",
                     "provenance": {"source": "test"}},
        "profiles": [{"selector": {"kind": "builtin", "value": "builtin:coder"},
                      "command": ["sh", "tests/scripts/echo.sh"]}],
        "declarations": [{"kind": "secret_ref", "name": "token", "reference": "env:DEMO_TOKEN"}]
    }))
    .unwrap();
    let p = bundles::prepare(&b).unwrap();
    assert_eq!(p.summary.digest, DIGEST);
    let mut s = BundleState::default();
    if let SyncOutcome::New { kind, payload, .. } = s.plan_sync(&p).unwrap() {
        s.apply_record(kind, 1, 1, &payload);
    }
    s
}

fn worker_for(req: &CreateRequest, id: &str) -> Worker {
    Worker {
        id: id.to_string(),
        profile: req.profile.clone(),
        config_bundle: req.config_bundle.clone(),
        display_name: req.display_name.clone(),
        status: WorkerStatus::Running,
        run_state: RunState::Idle,
        input_capable: true,
        input_mode: InputMode::StdinText,
        backend: "process".into(),
        owner: None,
        operation_id: None,
        reason: None,
        diagnostic: None,
        exit: None,
        stop_requested: false,
        stop_reason: None,
        created_by: None,
        idempotency_key: req.idempotency_key.clone(),
        request_fingerprint: req.fingerprint(),
        created_seq: 0,
        created_ms: 0,
        updated_ms: 0,
        last_seq: 0,
        input_count: 0,
        output_bytes: 0,
    }
}

#[test]
fn create_checks_bundle_identity_containment_and_idempotency() {
    let bundles = synced_bundles();
    let mut workers = WorkerState::default();
    let req = parse_create(&create_params(), None).unwrap();
    let fp = req.fingerprint();
    assert!(matches!(
        check_create(&workers, &bundles, &req, &fp),
        Ok(CreateCheck::Fresh)
    ));

    let mut other = req.clone();
    other.config_bundle = BundleRef {
        id: "bundle-2".into(),
        digest: DIGEST.into(),
    };
    assert!(matches!(
        check_create(&workers, &bundles, &other, &fp),
        Err(WorkerError::Bundle(bundles::BundleError::Missing { .. }))
    ));
    other.config_bundle = BundleRef {
        id: "bundle-1".into(),
        digest: format!("sha256:{}", "1".repeat(64)),
    };
    assert!(matches!(
        check_create(&workers, &bundles, &other, &fp),
        Err(WorkerError::Bundle(
            bundles::BundleError::DigestMismatch { .. }
        ))
    ));
    let mut other = req.clone();
    other.profile = ProfileSelector::Named("not-in-bundle".into());
    assert!(matches!(
        check_create(&workers, &bundles, &other, &fp),
        Err(WorkerError::ProfileNotInBundle { .. })
    ));

    let id = new_worker_id();
    let (kind, payload) = records::created(&worker_for(&req, &id), req.initial_input.as_deref());
    let notices = workers.apply_record(kind, 5, 100, &payload);
    assert_eq!(notices[0].0, "workers/changed");
    match check_create(&workers, &bundles, &req, &fp) {
        Ok(CreateCheck::Replay(w)) => assert_eq!(w.id, id),
        other => panic!("expected replay, got {other:?}"),
    }
    let mut changed = req.clone();
    changed.display_name = Some("different".into());
    let fp2 = changed.fingerprint();
    assert!(matches!(
        check_create(&workers, &bundles, &changed, &fp2),
        Err(WorkerError::IdempotencyConflict { .. })
    ));
    // Keys are each creator's own: another client using this key is neither refused nor told
    // of this worker; it gets a fresh worker of its own.
    let mut theirs = req.clone();
    theirs.created_by = Some("someone-else".into());
    assert!(matches!(
        check_create(&workers, &bundles, &theirs, &fp),
        Ok(CreateCheck::Fresh)
    ));
}

/// A worker's output trims its transcript's front but never its initial input: a replay of
/// its create still matches after any amount of output.
#[test]
fn the_initial_input_outlives_transcript_trimming_and_replays_still_match() {
    let bundles = synced_bundles();
    let req = parse_create(&create_params(), None).unwrap();
    let fp = req.fingerprint();
    let mut s = WorkerState::default();
    let id = new_worker_id();
    let (kind, payload) = records::created(&worker_for(&req, &id), req.initial_input.as_deref());
    s.apply_record(kind, 1, 1, &payload);
    let last = TRANSCRIPT_MAX_ENTRIES as u64 + 50;
    for seq in 2..=last {
        let (k, p) = records::output(&id, Stream::Stdout, "x");
        s.apply_record(k, seq, seq, &p);
    }
    let (page, _) = s.transcript(&id, 0, 2);
    assert_eq!(page[0].seq, 1, "the initial input stays first");
    assert!(page[1].seq > 2, "older output was trimmed");
    assert!(s.transcript(&id, 0, usize::MAX).0.len() <= TRANSCRIPT_MAX_ENTRIES);
    assert!(matches!(
        check_create(&s, &bundles, &req, &fp),
        Ok(CreateCheck::Replay(_))
    ));
}

#[test]
fn created_record_carries_the_initial_input_in_the_transcript() {
    let req = parse_create(&create_params(), None).unwrap();
    let mut s = WorkerState::default();
    let id = new_worker_id();
    let (kind, payload) = records::created(&worker_for(&req, &id), req.initial_input.as_deref());
    s.apply_record(kind, 9, 100, &payload);
    let (entries, more) = s.transcript(&id, 0, 10);
    assert!(!more);
    assert_eq!(entries.len(), 1);
    assert_eq!(entries[0].seq, 9);
    assert_eq!(entries[0].stream, Stream::Input);
    assert_eq!(entries[0].text, "hello");
    assert_eq!(s.get(&id).unwrap().created_seq, 9);
    assert_eq!(s.inputs_after(&id, 0).len(), 1);
    assert!(s.inputs_after(&id, 9).is_empty());
}

#[test]
fn status_machine_keeps_final_states() {
    let req = parse_create(&create_params(), None).unwrap();
    let mut s = WorkerState::default();
    let id = new_worker_id();
    let (kind, payload) = records::created(&worker_for(&req, &id), None);
    s.apply_record(kind, 1, 1, &payload);
    assert!(check_input(&s, &id).is_ok());

    let (k, p) = records::output(&id, Stream::Stdout, "out");
    let n = s.apply_record(k, 2, 2, &p);
    assert_eq!(n[0].0, "workers/output");
    assert_eq!(n[0].1["seq"], 2);

    let (k, p) = records::status(&StatusChange::ended(
        &id,
        WorkerStatus::Stopped,
        "exited with status 0",
    ));
    s.apply_record(k, 3, 3, &p);
    let w = s.get(&id).unwrap();
    assert_eq!(w.status, WorkerStatus::Stopped);
    assert!(!w.input_capable);
    assert!(matches!(
        check_input(&s, &id),
        Err(WorkerError::NotInputCapable { .. })
    ));

    // A later, conflicting final status (another process racing) does not rewrite it.
    let (k, p) = records::status(&StatusChange::ended(&id, WorkerStatus::Failed, "late"));
    assert!(s.apply_record(k, 4, 4, &p).is_empty());
    let mut revive = StatusChange::ended(&id, WorkerStatus::Running, "x");
    revive.input_capable = true;
    let (k, p) = records::status(&revive);
    s.apply_record(k, 5, 5, &p);
    let w = s.get(&id).unwrap();
    assert_eq!(w.status, WorkerStatus::Stopped);
    assert_eq!(w.reason.as_deref(), Some("exited with status 0"));

    let (entries, _) = s.transcript(&id, 0, 100);
    assert_eq!(
        entries.iter().map(|e| e.stream).collect::<Vec<_>>(),
        vec![Stream::Stdout, Stream::System]
    );
    assert!(matches!(
        check_input(&s, "nope"),
        Err(WorkerError::NotFound { .. })
    ));
}

#[test]
fn transcript_pages_by_seq() {
    let req = parse_create(&create_params(), None).unwrap();
    let mut s = WorkerState::default();
    let id = new_worker_id();
    let (kind, payload) = records::created(&worker_for(&req, &id), None);
    s.apply_record(kind, 1, 1, &payload);
    for seq in 2..12 {
        let (k, p) = records::output(&id, Stream::Stdout, &format!("{seq}"));
        s.apply_record(k, seq, seq, &p);
    }
    let (page, more) = s.transcript(&id, 0, 4);
    assert_eq!(
        page.iter().map(|e| e.seq).collect::<Vec<_>>(),
        vec![2, 3, 4, 5]
    );
    assert!(more);
    let (page, more) = s.transcript(&id, 9, 4);
    assert_eq!(page.iter().map(|e| e.seq).collect::<Vec<_>>(), vec![10, 11]);
    assert!(!more);
}

#[test]
fn undecodable_records_are_skipped() {
    let mut s = WorkerState::default();
    assert!(
        s.apply_record("worker.created", 1, 1, &json!({"worker": 5}))
            .is_empty()
    );
    assert!(
        s.apply_record("worker.output", 2, 2, &json!({"worker_id": "x"}))
            .is_empty()
    );
    assert!(s.workers.is_empty());
}

proptest! {
    // Whatever order two processes' status records land in, a worker ends in the first final
    // status recorded and never returns to running.
    #[test]
    fn final_status_is_the_first_one_recorded(order in prop::collection::vec(0u8..3, 1..8)) {
        let req = parse_create(&create_params(), None).unwrap();
        let mut s = WorkerState::default();
        let id = new_worker_id();
        let (kind, payload) = records::created(&worker_for(&req, &id), None);
        s.apply_record(kind, 1, 1, &payload);
        let mut first_final = None;
        for (i, o) in order.iter().enumerate() {
            let status = [WorkerStatus::Running, WorkerStatus::Stopped, WorkerStatus::Failed][*o as usize];
            let mut c = StatusChange::ended(&id, status, format!("r{i}"));
            c.input_capable = status == WorkerStatus::Running;
            let (k, p) = records::status(&c);
            s.apply_record(k, 2 + i as u64, 2, &p);
            if status.is_final() && first_final.is_none() {
                first_final = Some(status);
            }
        }
        let w = s.get(&id).unwrap();
        match first_final {
            Some(f) => { prop_assert_eq!(w.status, f); prop_assert!(!w.input_capable); }
            None => prop_assert_eq!(w.status, WorkerStatus::Running),
        }
    }
}
