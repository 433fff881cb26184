//! The gate against a hostile agent, played end to end on the real binary. The agent can write
//! every file of the workspace, `.gaffer/` included: it appends records through the store's
//! own writer (valid framing, checksums and chain), signs with keys of its own, and calls
//! itself whatever it likes. Each attack is refused with its reason in the audit log, and
//! nothing runs. (Trust replay, copying, `--expect` and deny-rule removal are in
//! `operations_e2e`.)

mod common;

use std::time::Duration;

use common::gate::*;
use common::{BIN, Server, Wire};
use gaffer::operations::plan::Plan;
use gaffer::operations::policy::Classification;
use serde_json::{Value, json};

/// A file.write plan as the agent would write it: any target, any classification it likes.
/// A forged `operation.created` for a write of `path` whose record claims `claimed_path`; its
/// plan asks the operator for `asks` (mode, seconds, uses) when given, else a rule allowed it.
fn forged_write(
    id: &str,
    client: &str,
    path: &str,
    claimed_path: &str,
    content: &str,
    asks: Option<(gaffer::operations::policy::GrantMode, u64, u32)>,
) -> Value {
    let now = gaffer::util::now_ms();
    let (plan, _) = forged_write_plan(
        id,
        client,
        path,
        content,
        ForgedWrite {
            claimed_path,
            summary: "harmless".into(),
            rule: "docs",
            asks,
        },
    );
    let text = plan.canonical();
    json!({
        "operation": {
            "id": id, "client_id": client, "idempotency_key": id, "operation": "file.write",
            "provider": "workspace", "submitted": "x", "reason": "looks routine",
            "target": {"path": claimed_path}, "arguments": {"content": "harmless"},
            "state": "approved", "revision": 1, "approval_id": null,
            "created_at_ms": now, "updated_at_ms": now, "terminal_at_ms": null,
            "presentation": {"title": format!("Write {claimed_path}"), "summary": "harmless"},
            "plan_digest": Plan::digest_of(&text), "plan": text,
            "result": null, "upstream_status": null, "error": null
        },
        "approval": null
    })
}

fn operation(root: &std::path::Path, id: &str) -> Value {
    let (code, out, err) =
        common::run_cli(root, &["store", "log", "--kind", "operation.transitioned"]);
    assert_eq!(code, 0, "{err}");
    let last = out
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .rfind(|v| v["payload"]["id"] == id);
    last.unwrap_or(Value::Null)
}

fn wait_terminal_record(root: &std::path::Path, id: &str) -> Value {
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    loop {
        let v = operation(root, id);
        if matches!(v["payload"]["to"].as_str(), Some("failed" | "succeeded")) {
            return v;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "{id} never settled: {v}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn finding_1_forged_approved_records_are_re_derived_and_refused() {
    let env = Env::new(Some(ALLOW_DOCS));
    let outside = env._cfg.path().join("outside");
    std::fs::create_dir_all(&outside).unwrap();
    let mut server = env.agent("agent-1"); // a serving process that executes approved work
    server.call("gaffer/status", json!({}));
    let cases = [
        // (id, real target, what the record and classification claim)
        ("op_forged_escape", "../outside/x", "docs/x.md"),
        ("op_forged_store", ".gaffer/policy.yaml", "docs/p.md"),
        ("op_forged_class", "src/evil.rs", "docs/evil.md"),
    ];
    let recs = cases
        .iter()
        .map(|(id, path, claimed)| {
            (
                "operation.created",
                forged_write(id, "agent-1", path, claimed, "pwned", None),
            )
        })
        .collect();
    append_as_agent(env.root(), recs);
    for (id, path, _) in cases {
        let t = wait_terminal_record(env.root(), id);
        assert_eq!(t["payload"]["to"], "failed", "{path}: {t}");
        let why = t["payload"]["error"]["message"]
            .as_str()
            .unwrap_or_default();
        assert!(!why.is_empty(), "the audit log says why: {t}");
        if path != "src/evil.rs" {
            // The path is re-normalised and confined at execution: the plan is unfit.
            assert_eq!(
                t["payload"]["error"]["code"], "invalid_stored_operation",
                "{t}"
            );
        }
    }
    assert!(
        !outside.join("x").exists(),
        "nothing lands outside the workspace"
    );
    assert!(!env.root().join("src/evil.rs").exists());
    let policy = std::fs::read_to_string(env.root().join(".gaffer/policy.yaml")).unwrap();
    assert_ne!(policy, "pwned");
    // The classification came from the plan text, not the record: src/ has no allow rule.
    let class = operation(env.root(), "op_forged_class");
    assert_eq!(
        class["payload"]["error"]["code"], "approval_invalid",
        "{class}"
    );

    // Control: a forged record for a path the trusted policy allows still gets no authority
    // from the policy, because no process accepted the submission from its client.
    append_as_agent(
        env.root(),
        vec![(
            "operation.created",
            forged_write(
                "op_forged_docs",
                "agent-1",
                "docs/ok.md",
                "docs/ok.md",
                "x",
                None,
            ),
        )],
    );
    let t = wait_terminal_record(env.root(), "op_forged_docs");
    assert_eq!(t["payload"]["to"], "failed", "{t}");
    assert!(!env.root().join("docs/ok.md").exists());
    // The same request through gaffer runs.
    let p = ok(&submit(
        &mut server,
        "file.write",
        json!({"path": "docs/ok.md"}),
        json!({"content": "x"}),
        "real",
    ))
    .clone();
    assert_eq!(
        wait_state(
            &mut server,
            p["id"].as_str().unwrap(),
            &["succeeded", "failed"]
        )["state"],
        "succeeded"
    );
}

#[test]
fn finding_2_the_operator_sees_and_signs_the_plan_text_not_the_record() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut op = env.operator();
    // A pending request whose record says docs/ but whose plan text writes src/.
    let mut created = forged_write(
        "op_swap",
        "agent-1",
        "src/evil.rs",
        "docs/readme.md",
        "pwned",
        Some((gaffer::operations::policy::GrantMode::Execution, 300, 1)),
    );
    created["operation"]["state"] = json!("pending");
    created["operation"]["approval_id"] = json!("ap_swap");
    let now = gaffer::util::now_ms();
    // It asks for what the trusted policy grants src/** (one execution): a request asking
    // for more is refused before anything is prepared (tests/approval_scope.rs).
    created["approval"] = json!({
        "id": "ap_swap", "operation_id": "op_swap", "client_id": "agent-1", "operation": "file.write",
        "plan_digest": created["operation"]["plan_digest"], "mode": "execution",
        "classification": {"target_kind": "file", "fields": {"path": ["docs/readme.md"]}, "attrs": {}},
        "status": "pending", "revision": 1, "created_at_ms": now, "pending_expires_at_ms": now + 600_000,
        "requested_duration_seconds": 300, "requested_max_uses": 1, "decision": null,
        "uses": {}, "decision_keys": {}
    });
    append_as_agent(env.root(), vec![("operation.created", created)]);
    // The operator's process learns of it by tailing the journal (and, as no gaffer here
    // accepted it, does not announce it: `requests_sealed`).
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let view = loop {
        let r = op.request("approvals/get", json!({"id": "ap_swap"}));
        match r.get("result") {
            Some(v) => break v.clone(),
            None if std::time::Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50))
            }
            None => panic!("the forged request is never folded: {r}"),
        }
    };
    assert_eq!(
        view["target"]["path"], "src/evil.rs",
        "rendered from the plan text: {view}"
    );
    assert_eq!(view["title"], "Write src/evil.rs", "{view}");
    // No gaffer here accepted it: it is marked so and cannot be approved at all.
    assert_eq!(view["requester_verified"], false, "{view}");
    let refused = op.request(
        "approvals/prepare",
        json!({"id": "ap_swap", "decision": "approve", "expected_revision": 1,
               "expected_plan_digest": view["plan_digest"]}),
    );
    assert_eq!(err_code(&refused), "request_unverified", "{refused}");
    // What the operator signs (here, denying it) binds the plan digest and the
    // classification of the plan text.
    let prep = op.call(
        "approvals/prepare",
        json!({"id": "ap_swap", "decision": "deny", "expected_revision": 1}),
    );
    let payload: Value = serde_json::from_str(prep["payload"].as_str().unwrap()).unwrap();
    let real = Classification {
        target_kind: "file".into(),
        fields: [("path".to_string(), ["src/evil.rs".to_string()].into())].into(),
        attrs: Default::default(),
        must_name: Default::default(),
        argv: None,
    };
    assert_eq!(
        payload["classification_digest"],
        gaffer::operations::decision::classification_digest(&real)
    );
    assert_eq!(payload["plan_digest"], view["plan_digest"]);
    for field in [
        "client",
        "operation",
        "mode",
        "max_uses",
        "revision",
        "head",
        "workspace_id",
    ] {
        assert!(
            payload.get(field).is_some(),
            "the signature covers {field}: {payload}"
        );
    }
}

#[test]
fn finding_2_a_forged_window_grant_covers_nothing() {
    // A rule that grants 25-use windows over win/**, so the forged grant is within what the
    // policy grants and routes a submission (a wider one would not even route it).
    let policy = format!(
        "{ALLOW_DOCS}  - id: win\n    effect: request\n    operations: [\"file.write\"]\n    targets: [{{kind: file, fields: {{path: [\"win/**\"]}}}}]\n    grant_policy: {{mode: window, default_minutes: 10, max_minutes: 60, request_ttl_minutes: 10, default_max_uses: 25, max_uses: 25}}\n"
    );
    let env = Env::new(Some(&policy));
    let mut a = env.agent("agent-1");
    let ws_id = workspace_id(env.root());
    // The agent forges an active window grant for win/** signed with its own key.
    let forger = agent_signer(&env);
    let now = gaffer::util::now_ms();
    let class = Classification {
        target_kind: "file".into(),
        fields: [("path".to_string(), ["win/a.rs".to_string()].into())].into(),
        attrs: Default::default(),
        must_name: Default::default(),
        argv: None,
    };
    let payload = gaffer::operations::decision::DecisionPayload {
        domain: "gaffer/decision/v1".into(),
        workspace_id: ws_id,
        approval_id: "ap_window".into(),
        operation_id: "op_seed".into(),
        client: "agent-1".into(),
        operation: "file.write".into(),
        plan_digest: "0".repeat(64),
        classification_digest: gaffer::operations::decision::classification_digest(&class),
        mode: gaffer::operations::policy::GrantMode::Window,
        decision: gaffer::operations::state::DecisionKind::Approve,
        revision: 2,
        decided_at_ms: now,
        expires_at_ms: Some(now + 600_000),
        max_uses: 25,
        narrowed_duration_seconds: None,
        narrowed_max_uses: None,
        reason: None,
        head: gaffer::operator::Head {
            seq: 1,
            hash: String::new(),
        },
    };
    let mut seed = forged_write(
        "op_seed",
        "agent-1",
        "win/seed.rs",
        "win/seed.rs",
        "x",
        None,
    );
    seed["operation"]["state"] = json!("pending");
    seed["operation"]["approval_id"] = json!("ap_window");
    // The request's copy of the digest is the operation's (a request that differs is never
    // folded), so the forged grant routes and the claim is what refuses it.
    let seed_digest = seed["operation"]["plan_digest"].clone();
    seed["approval"] = json!({
        "id": "ap_window", "operation_id": "op_seed", "client_id": "agent-1", "operation": "file.write",
        "plan_digest": seed_digest, "mode": "window", "classification": class,
        "status": "pending", "revision": 1, "created_at_ms": now, "pending_expires_at_ms": now + 600_000,
        "requested_duration_seconds": 600, "requested_max_uses": 25, "decision": null,
        "uses": {}, "decision_keys": {}
    });
    let decided = json!({
        "approval_id": "ap_window",
        "operator_signature": gaffer::operator::OperatorSignature::sign(&forger, &payload),
        "idempotency_key": "forged", "command_digest": "x"
    });
    let before = a.call("gaffer/status", json!({}))["store"]["seq"].clone();
    append_as_agent(
        env.root(),
        vec![("operation.created", seed), ("approval.decided", decided)],
    );
    let seen = a.call(
        "gaffer/status",
        json!({"after_seq": before, "timeout_ms": 10000}),
    );
    assert_eq!(
        seen["timed_out"], false,
        "the serving process folded the forgery: {seen}"
    );
    // A real submission for win/a.rs now rides the "grant" at submit; the claim checks the
    // signature and refuses it.
    let p = ok(&submit(
        &mut a,
        "file.write",
        json!({"path": "win/a.rs"}),
        json!({"content": "x"}),
        "ride",
    ))
    .clone();
    assert_eq!(
        p["approval_id"], "ap_window",
        "the forged grant routed the submission: {p}"
    );
    let v = wait_state(&mut a, p["id"].as_str().unwrap(), &["failed", "succeeded"]);
    assert_eq!(v["state"], "failed", "{v}");
    assert_eq!(v["error"]["code"], "approval_invalid", "{v}");
    assert!(!env.root().join("win/a.rs").exists());
}

#[test]
fn finding_6_a_self_declared_client_name_is_no_identity() {
    let policy = format!(
        "{ALLOW_DOCS}  - id: editor\n    effect: allow\n    clients: [vscode]\n    operations: [\"file.write\"]\n"
    );
    let env = Env::new(Some(&policy));
    // The editor, authenticated as vscode, has an operation waiting.
    let mut editor = env.agent("vscode");
    let mine = ok(&submit(
        &mut editor,
        "kv.set",
        json!({"key": "e"}),
        json!({"value": 1}),
        "ed",
    ))
    .clone();
    assert_eq!(mine["state"], "pending");
    // The agent calls itself vscode, and even passes a token it altered.
    let mut spoof = env.start(&[]);
    let init = spoof.call("initialize", json!({"clientInfo": {"name": "vscode"}}));
    assert_eq!(init["client"], "anonymous", "{init}");
    let p = ok(&submit(
        &mut spoof,
        "file.write",
        json!({"path": "src/spoof.rs"}),
        json!({"content": "x"}),
        "sp",
    ))
    .clone();
    assert_eq!(p["client_id"], "anonymous");
    assert_eq!(
        p["state"], "denied",
        "rules naming vscode do not match: {p}"
    );
    let r = spoof.request("operations/get", json!({"id": mine["id"]}));
    assert_eq!(r["error"]["data"]["code"], "not_found", "{r}");
    let r = spoof.request("operations/cancel", json!({"id": mine["id"]}));
    assert_eq!(r["error"]["data"]["code"], "not_found", "{r}");
    let token = env.token("vscode");
    let (payload, sig) = token.split_once('.').unwrap();
    let mut bytes = gaffer::util::base64url_decode(payload).unwrap();
    let last = bytes.len() - 3;
    bytes[last] ^= 1;
    let altered = format!("{}.{sig}", gaffer::util::base64url(&bytes));
    let mut bad = env.start(&[]);
    let r = bad.request(
        "initialize",
        json!({"initializationOptions": {"clientToken": altered}}),
    );
    assert_eq!(
        r["error"]["data"]["code"], "client_credential_invalid",
        "{r}"
    );
    // A token handed to the process (as a host would) is the identity of its connections.
    let mut hosted = env.start(&[("GAFFER_CLIENT_TOKEN", token.as_str())]);
    assert_eq!(hosted.call("initialize", json!({}))["client"], "vscode");
    // Revoked: refused from then on.
    let (code, out, err) = env.cli(&["client", "revoke", "vscode"]);
    assert_eq!(code, 0, "{out}{err}");
    let mut again = env.start(&[("GAFFER_CLIENT_TOKEN", token.as_str())]);
    let r = again.request("initialize", json!({}));
    assert_eq!(
        r["error"]["data"]["code"], "client_credential_invalid",
        "{r}"
    );
    let listed: Value = serde_json::from_str(&env.cli(&["client", "list"]).1).unwrap();
    assert_eq!(listed["clients"][0]["revoked"], true, "{listed}");
}

#[test]
fn finding_7_a_serving_process_with_only_the_public_key_verifies_approvals() {
    let env = Env::new(Some(ALLOW_DOCS));
    let public = env.key_file.with_extension("pub").display().to_string();
    let missing = env
        ._cfg
        .path()
        .join("no-such-dir/operator.key")
        .display()
        .to_string();
    let token = env.token("agent-1");
    let mut agent = Server::start_env(
        env.root(),
        Wire::Ndjson,
        &[],
        &[
            ("GAFFER_OPERATOR_KEY_FILE", missing.as_str()),
            ("GAFFER_OPERATOR_PUBLIC_KEY_FILE", public.as_str()),
            ("GAFFER_CLIENT_TOKEN", token.as_str()),
        ],
    );
    agent.call("initialize", json!({}));
    let p = ok(&submit(
        &mut agent,
        "file.write",
        json!({"path": "src/ok.rs"}),
        json!({"content": "ok"}),
        "pub",
    ))
    .clone();
    assert_eq!(p["state"], "pending");
    // The operator approves from their own process, which holds the private key.
    let (code, out, err) = env.approve_reviewed(p["id"].as_str().unwrap(), &[]);
    assert_eq!(code, 0, "{out}{err}");
    let v = wait_state(
        &mut agent,
        p["id"].as_str().unwrap(),
        &["succeeded", "failed"],
    );
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(
        std::fs::read_to_string(env.root().join("src/ok.rs")).unwrap(),
        "ok"
    );
    // Nothing the serving process could read signs: it never needed the private key.
    assert!(!std::path::Path::new(&missing).exists());
    let _ = BIN;
}

#[test]
fn a_broken_hash_chain_accepts_no_signed_approval() {
    let env = Env::new(Some(ALLOW_DOCS));
    let p = {
        let mut a = env.agent("agent-1");
        ok(&submit(
            &mut a,
            "kv.set",
            json!({"key": "c"}),
            json!({"value": 1}),
            "chain",
        ))
        .clone()
    };
    assert_eq!(p["state"], "pending");
    // The agent edits an earlier record (the credential issued to it), re-framed with a valid
    // checksum: the record after it no longer chains.
    let seg = env.root().join(".gaffer/journal/000001.log");
    let mut bytes = std::fs::read(&seg).unwrap();
    let (at, len) = common::frames(&bytes)
        .into_iter()
        .find(|(at, len)| {
            String::from_utf8_lossy(&bytes[at + 8..at + len]).contains("\"client.issued\"")
        })
        .expect("the client.issued record");
    let mut body = bytes[at + 8..at + len].to_vec();
    let pos = body.windows(3).position(|w| w == b"cl_").unwrap() + 3;
    body[pos] = if body[pos] == b'A' { b'B' } else { b'A' };
    bytes.splice(at..at + len, common::forge_frame(&body));
    std::fs::write(&seg, bytes).unwrap();
    // A fresh serving process reads the whole journal and sees the break.
    let mut a = env.agent("agent-1");
    let st = a.call("gaffer/status", json!({}));
    assert!(!st["store"]["chain"]["broken_at"].is_null(), "{st}");
    // The edited record lies before the head this machine anchored: the store stands rolled
    // back, no trust signature counts (so the providers file starts nothing) and no approval
    // can make the plan run.
    assert_eq!(st["store"]["standing"]["state"], "rolled_back", "{st}");
    let (code, out, err) = env.approve_reviewed(p["id"].as_str().unwrap(), &[]);
    if code == 0 {
        let v = wait_state(&mut a, p["id"].as_str().unwrap(), &["succeeded", "failed"]);
        assert_eq!(v["state"], "failed", "{v}");
    } else {
        assert!(format!("{out}{err}").contains("cannot run"), "{out}{err}");
    }
    assert_eq!(lines(&env.root().join("kv-exec.log")), 0);
}

/// The agent replaces the trust-gated files gaffer reads on every submission with a FIFO
/// (which a plain read would wait on forever, on the thread that answers everyone) and a
/// link to a device: each submission gets an answer naming the file, nothing is executed
/// under them, and the server goes on answering.
#[test]
fn special_files_planted_at_the_policy_paths_never_stop_the_server() {
    let env = Env::new(Some(ALLOW_DOCS));
    let mut agent = env.agent("agent");
    let r = submit(
        &mut agent,
        "file.write",
        json!({"path": "docs/a.md"}),
        json!({"content": "a"}),
        "a",
    );
    assert_eq!(
        wait_state(&mut agent, ok(&r)["id"].as_str().unwrap(), &["succeeded"])["state"],
        "succeeded"
    );
    let gaffer_dir = env.root().join(".gaffer");
    let policy = gaffer_dir.join("policy.yaml");
    std::fs::remove_file(&policy).unwrap();
    let fifo = std::ffi::CString::new(policy.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: mkfifo reads a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(fifo.as_ptr(), 0o644) }, 0);
    let r = submit(
        &mut agent,
        "file.write",
        json!({"path": "docs/b.md"}),
        json!({"content": "b"}),
        "b",
    );
    assert!(
        r.to_string().contains("not a regular file"),
        "the answer names what is wrong: {r}"
    );
    assert!(
        !env.root().join("docs/b.md").exists(),
        "nothing ran under it"
    );
    std::fs::remove_file(&policy).unwrap();
    std::os::unix::fs::symlink("/dev/zero", &policy).unwrap();
    let r = submit(
        &mut agent,
        "file.write",
        json!({"path": "docs/c.md"}),
        json!({"content": "c"}),
        "c",
    );
    assert!(r.to_string().contains("not a regular file"), "{r}");
    std::fs::remove_file(&policy).unwrap();
    let _ = std::fs::remove_file(gaffer_dir.join("providers.yaml"));
    // SAFETY: as above.
    let providers = std::ffi::CString::new(
        gaffer_dir
            .join("providers.yaml")
            .as_os_str()
            .as_encoded_bytes(),
    )
    .unwrap();
    assert_eq!(unsafe { libc::mkfifo(providers.as_ptr(), 0o644) }, 0);
    // `gaffer/status` reads every trust-gated file, providers.yaml included.
    let r = agent.request("gaffer/status", json!({}));
    assert!(r.get("result").is_some(), "the server still answers: {r}");
    let r = submit(
        &mut agent,
        "kv.set",
        json!({"key": "k"}),
        json!({"value": 1}),
        "d",
    );
    assert!(r.get("result").is_some() || r.get("error").is_some(), "{r}");
}

/// A serving process configured (by a workspace settings file the agent wrote, say) with a
/// public key inside the workspace: the agent can replace that file with its own key, so it is
/// never the operator's. Nothing verifies against it — not even the real key copied there —
/// so the trusted policy's allow rules do not apply and the write waits for a human.
#[test]
fn a_public_key_inside_the_workspace_is_never_the_operators() {
    let env = Env::new(Some(ALLOW_DOCS));
    let inside = env.root().join(".gaffer/operator.pub");
    std::fs::copy(env.key_file.with_extension("pub"), &inside).unwrap();
    let inside = inside.display().to_string();
    let missing = env
        ._cfg
        .path()
        .join("none/operator.key")
        .display()
        .to_string();
    let token = env.token("agent-1");
    let key_env = [
        ("GAFFER_OPERATOR_KEY_FILE", missing.as_str()),
        ("GAFFER_OPERATOR_PUBLIC_KEY_FILE", inside.as_str()),
    ];
    let mut with_token = key_env.to_vec();
    with_token.push(("GAFFER_CLIENT_TOKEN", token.as_str()));
    let mut credentialed = Server::start_env(env.root(), Wire::Ndjson, &[], &with_token);
    let r = credentialed.request("initialize", json!({}));
    assert!(
        r["error"]["message"]
            .to_string()
            .contains("no operator public key"),
        "no credential checks against it: {r}"
    );
    let mut agent = Server::start_env(env.root(), Wire::Ndjson, &[], &key_env);
    agent.call("initialize", json!({}));
    let p = ok(&submit(
        &mut agent,
        "file.write",
        json!({"path": "docs/in.md"}),
        json!({"content": "x"}),
        "in",
    ))
    .clone();
    assert_eq!(
        p["state"], "pending",
        "no key verifies the trusted policy: {p}"
    );
    let status = agent.call("gaffer/status", json!({}));
    assert!(
        status.to_string().contains("no_operator_key"),
        "the policy's trust reads as having no operator key: {status}"
    );
    assert!(!env.root().join("docs/in.md").exists());
    // Configured outside, but a symlink (then a hard link) to the file inside: the same.
    let outside = env._cfg.path();
    let linked = outside.join("linked.pub");
    std::os::unix::fs::symlink(&inside, &linked).unwrap();
    let hard = outside.join("hard.pub");
    for configured in [&linked, &hard] {
        if configured == &hard {
            std::fs::hard_link(&inside, &hard).unwrap();
        }
        let configured = configured.display().to_string();
        let mut s = Server::start_env(
            env.root(),
            Wire::Ndjson,
            &[],
            &[
                ("GAFFER_OPERATOR_KEY_FILE", missing.as_str()),
                ("GAFFER_OPERATOR_PUBLIC_KEY_FILE", configured.as_str()),
                ("GAFFER_CLIENT_TOKEN", token.as_str()),
            ],
        );
        let r = s.request("initialize", json!({}));
        assert!(
            r["error"]["message"]
                .to_string()
                .contains("no operator public key"),
            "{configured}: {r}"
        );
    }
}
