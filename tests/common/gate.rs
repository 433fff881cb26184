//! The operations test environment: a workspace with an operator key pair, trusted (or
//! agent-written) policy and providers, authenticated agents, an operator connection that
//! logs in by challenge-response and signs its decisions, and the agent's own tools for
//! writing into the journal.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::{BIN, Server, Wire};
use gaffer::operations::plan::{PLAN_SCHEMA, Plan, PlanAuthorization};
use gaffer::operations::policy::{Classification, DecisionEffect, GrantMode};
use serde_json::{Value, json};

pub const ALLOW_DOCS: &str = r#"
rules:
  - id: docs
    effect: allow
    operations: ["file.write"]
    targets:
      - kind: file
        fields:
          path: ["docs/**"]
  - id: secrets
    effect: deny
    operations: ["file.*"]
    targets:
      - kind: file
        fields:
          path: ["secret/**"]
  - id: counter
    effect: allow
    operations: ["command.run"]
  - id: kv
    effect: request
    operations: ["kv.*", "file.delete"]
    grant_policy: {mode: execution, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10}
  - id: ask-src
    effect: request
    operations: ["file.write"]
    targets:
      - kind: file
        fields:
          path: ["src/**"]
    grant_policy: {mode: execution, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10}
  - id: greedy
    effect: request
    operations: ["file.write"]
    targets:
      - kind: file
        fields:
          path: ["greedy/**"]
    grant_policy: {mode: execution, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10, default_max_uses: 2, max_uses: 2}
"#;

/// The tests' Python provider, sandboxed like every process gaffer starts: it may read its
/// own directory (outside the workspace) and nothing else outside, and write the workspace
/// (its `kv.json`), which a provider may only when its declaration says so.
pub fn kv_providers_yaml() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/providers");
    format!(
        "providers:\n  - name: kv\n    command: [python3, {:?}]\n    read: [{:?}]\n    workspace: write\n",
        dir.join("kv_provider.py").display().to_string(),
        dir.display().to_string()
    )
}

pub static LOGS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

pub struct Env {
    pub ws: tempfile::TempDir,
    pub _cfg: tempfile::TempDir,
    pub key_file: PathBuf,
    /// Client tokens issued so far, by name.
    tokens: std::cell::RefCell<std::collections::HashMap<String, String>>,
}

impl Env {
    /// A workspace whose policy.yaml and providers.yaml the operator has trusted.
    pub fn new(policy: Option<&str>) -> Env {
        let env = Env::untrusted(policy);
        let (code, out, err) = env.trust_reviewed();
        assert_eq!(code, 0, "gaffer trust: {out} {err}");
        env
    }

    /// `gaffer trust` as an operator signs off a terminal: exactly the files on disk now, with
    /// the digests the operator reviewed (`--expect`).
    pub fn trust_reviewed(&self) -> (i32, String, String) {
        let args = self.trust_args();
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        self.cli(&args)
    }

    /// `trust --expect FILE=SHA256 …` for the trust-gated files on disk now.
    pub fn trust_args(&self) -> Vec<String> {
        let mut args = vec!["trust".to_string()];
        for file in ["policy.yaml", "providers.yaml"] {
            if let Ok(bytes) = std::fs::read(self.root().join(".gaffer").join(file)) {
                args.push("--expect".into());
                args.push(format!("{file}={}", gaffer::util::sha256_hex(&bytes)));
            }
        }
        args
    }

    /// The same files, as an agent could have written them: nobody has trusted them.
    pub fn untrusted(policy: Option<&str>) -> Env {
        let ws = super::workspace();
        let cfg = tempfile::tempdir().unwrap();
        let key_file = cfg.path().join("operator.key");
        gaffer::operator::OperatorSigner::init(&key_file, &key_file.with_extension("pub"), None)
            .unwrap();
        std::fs::create_dir_all(ws.path().join(".gaffer")).unwrap();
        if let Some(p) = policy {
            std::fs::write(ws.path().join(".gaffer/policy.yaml"), p).unwrap();
        }
        std::fs::write(
            ws.path().join(".gaffer/providers.yaml"),
            kv_providers_yaml(),
        )
        .unwrap();
        Env {
            ws,
            _cfg: cfg,
            key_file,
            tokens: Default::default(),
        }
    }

    /// Every server log written so far (printed when a test fails).
    pub fn logs(&self) -> String {
        let mut out = String::new();
        for e in std::fs::read_dir(self.key_file.parent().unwrap())
            .unwrap()
            .flatten()
        {
            if e.file_name().to_string_lossy().ends_with(".log") {
                out.push_str(&std::fs::read_to_string(e.path()).unwrap_or_default());
            }
        }
        out
    }

    pub fn root(&self) -> &Path {
        self.ws.path()
    }

    /// Runs `gaffer <args>` as this workspace's operator; (exit code, stdout, stderr).
    pub fn cli(&self, args: &[&str]) -> (i32, String, String) {
        self.cli_with_key(&self.key_file, args)
    }

    pub fn cli_with_key(&self, key: &Path, args: &[&str]) -> (i32, String, String) {
        let out = std::process::Command::new(BIN)
            .arg("--workspace")
            .arg(self.root())
            .args(args)
            .env("GAFFER_OPERATOR_KEY_FILE", key)
            .output()
            .unwrap();
        (
            out.status.code().unwrap_or(-1),
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    pub fn env(&self) -> Vec<(&str, String)> {
        vec![(
            "GAFFER_OPERATOR_KEY_FILE",
            self.key_file.display().to_string(),
        )]
    }

    pub fn start(&self, extra: &[(&str, &str)]) -> Server {
        let key = self.key_file.display().to_string();
        let mut env: Vec<(&str, &str)> = vec![("GAFFER_OPERATOR_KEY_FILE", key.as_str())];
        env.extend_from_slice(extra);
        // Server logs go next to the key (outside the workspace) for post-mortems.
        let log = self.key_file.with_file_name(format!(
            "gaffer-{}.log",
            LOGS.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        ));
        let log = log.display().to_string();
        Server::start_env(
            self.root(),
            Wire::Ndjson,
            &["--log-file", log.as_str(), "--log-level", "warn"],
            &env,
        )
    }

    pub fn signer(&self) -> gaffer::operator::OperatorSigner {
        gaffer::operator::OperatorSigner::load_from(&self.key_file).unwrap()
    }

    /// A credential for `name`, issued by the operator (`gaffer client add`).
    pub fn token(&self, name: &str) -> String {
        if let Some(t) = self.tokens.borrow().get(name) {
            return t.clone();
        }
        let (code, out, err) = self.cli(&["client", "add", name]);
        assert_eq!(code, 0, "gaffer client add: {out} {err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        let t = v["token"].as_str().unwrap().to_string();
        self.tokens.borrow_mut().insert(name.into(), t.clone());
        t
    }

    /// The `plan_digest` the operator reviews for approval or operation `id` in `gaffer
    /// approvals` (what `gaffer approve --expect` takes).
    pub fn reviewed_digest(&self, id: &str) -> String {
        // Forged requests too: the tests that play them show what refuses them after this.
        let (code, out, err) = self.cli(&["approvals", "--all", "--include-unverified"]);
        assert_eq!(code, 0, "gaffer approvals: {out}{err}");
        let v: Value = serde_json::from_str(&out).unwrap();
        v["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["approval_id"] == id || a["operation_id"] == id)
            .and_then(|a| a["plan_digest"].as_str())
            .unwrap_or_else(|| panic!("no approval {id} listed: {out}"))
            .to_string()
    }

    /// `gaffer approve ID --expect DIGEST EXTRA…`, bound to the plan listed for `id`.
    pub fn approve_reviewed(&self, id: &str, extra: &[&str]) -> (i32, String, String) {
        let digest = self.reviewed_digest(id);
        let mut args = vec!["approve", id, "--expect", digest.as_str()];
        args.extend_from_slice(extra);
        self.cli(&args)
    }

    /// An agent connection authenticated as `name`.
    pub fn agent(&self, name: &str) -> Server {
        self.agent_env(name, &[])
    }

    pub fn agent_env(&self, name: &str, extra: &[(&str, &str)]) -> Server {
        let token = self.token(name);
        let mut s = self.start(extra);
        s.call(
            "initialize",
            json!({"clientInfo": {"name": name}, "initializationOptions": {"clientToken": token}}),
        );
        s.notify("initialized", json!({}));
        s
    }

    /// An operator connection: the challenge on the initialize reply, signed here.
    pub fn operator(&self) -> Server {
        self.operator_env(&[])
    }

    /// An operator connection whose serving process has `extra` in its environment.
    pub fn operator_env(&self, extra: &[(&str, &str)]) -> Server {
        let mut s = self.start(extra);
        let init = s.call(
            "initialize",
            json!({"clientInfo": {"name": "human"}, "initializationOptions": {"role": "operator"}}),
        );
        let challenge = init["operatorChallenge"].as_str().unwrap().to_string();
        let sig = self.signer().sign(challenge.as_bytes());
        let r = s.call("operator/login", json!({ "signature": sig }));
        assert_eq!(r["role"], "operator", "{r}");
        s.notify("initialized", json!({}));
        s
    }

    /// `approvals/prepare` with `p` (less its idempotency key), signed here, then
    /// `approvals/decide`: what an editor does. An approval binds the plan the editor showed:
    /// unless `p` names `expected_plan_digest`, the digest of the approval read just before.
    /// Returns the reply of whichever step refused.
    pub fn decide(&self, s: &mut Server, p: Value) -> Value {
        let mut prep = p.clone();
        if prep["decision"] == "approve" && prep.get("expected_plan_digest").is_none() {
            let shown = s.request("approvals/get", json!({"id": prep["id"]}));
            prep["expected_plan_digest"] = shown["result"]["plan_digest"].clone();
        }
        let idem = prep.as_object_mut().unwrap().remove("idempotency_key");
        let r = s.request("approvals/prepare", prep);
        if r.get("error").is_some() {
            return r;
        }
        let payload = r["result"]["payload"].as_str().unwrap().to_string();
        let signature = self.signer().sign(payload.as_bytes());
        s.request(
            "approvals/decide",
            json!({"payload": payload, "signature": signature, "idempotency_key": idem}),
        )
    }

    pub fn decide_ok(&self, s: &mut Server, p: Value) -> Value {
        let r = self.decide(s, p);
        ok(&r).clone()
    }

    pub fn revoke_ok(&self, s: &mut Server, id: &Value) -> Value {
        let r = s.call("approvals/get", json!({ "id": id }));
        let prep = s.call(
            "approvals/prepare",
            json!({"id": id, "decision": "revoke", "expected_revision": r["revision"]}),
        );
        let payload = prep["payload"].as_str().unwrap().to_string();
        let signature = self.signer().sign(payload.as_bytes());
        s.call(
            "approvals/revoke",
            json!({"payload": payload, "signature": signature}),
        )
    }
}

pub fn submit(s: &mut Server, op: &str, target: Value, args: Value, key: &str) -> Value {
    s.request(
        "operations/submit",
        json!({"operation": op, "target": target, "arguments": args, "reason": "needed for the task", "idempotency_key": key}),
    )
}

pub fn ok(r: &Value) -> &Value {
    r.get("result")
        .unwrap_or_else(|| panic!("expected success: {r}"))
}

pub fn err_code(r: &Value) -> String {
    r["error"]["data"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("expected error: {r}"))
        .to_string()
}

pub fn wait_state(s: &mut Server, id: &str, want: &[&str]) -> Value {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut rev = 0;
    loop {
        let v = s.call(
            "operations/wait",
            json!({"id": id, "after_revision": rev, "wait_seconds": 5}),
        );
        if want.contains(&v["state"].as_str().unwrap_or("")) {
            return v;
        }
        rev = v["revision"].as_u64().unwrap();
        assert!(Instant::now() < deadline, "operation {id} stuck in {v}");
    }
}

/// Every message the server sent that no test step has consumed yet (after a short quiet).
pub fn unread(s: &mut Server) -> String {
    s.wait_for(Duration::from_millis(300), |_| false);
    s.backlog_text()
}

pub fn lines(path: &Path) -> usize {
    std::fs::read_to_string(path)
        .map(|t| t.lines().count())
        .unwrap_or(0)
}

pub fn wait_for_approval(op: &mut Server, op_id: &str) -> Value {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let l = op.call("approvals/list", json!({}));
        if let Some(a) = l["approvals"]
            .as_array()
            .unwrap()
            .iter()
            .find(|a| a["operation_id"] == op_id)
        {
            return a.clone();
        }
        assert!(
            Instant::now() < deadline,
            "approval for {op_id} never appeared"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

pub fn approve(env: &Env, op: &mut Server, op_id: &str) {
    let ap = wait_for_approval(op, op_id);
    env.decide_ok(op, json!({"id": ap["approval_id"], "decision": "approve", "expected_revision": ap["revision"], "idempotency_key": format!("ok-{op_id}")}));
}

/// Syncs a bundle whose `cat` profile reads its input (`head -n 1`) and creates a worker of it
/// with `first` as its initial input: (the bundle's reference, the worker).
pub fn reader_worker(s: &mut Server, first: &str) -> (Value, Value) {
    let bundle = json!({
        "metadata": {"id": "reader", "revision": "r1", "created_at": "2026-12-01", "provenance": {"source": "e2e"}},
        "profiles": [{"selector": {"kind": "named", "value": "cat"}, "command": ["head", "-n", "1"],
                      "input_mode": "stdin_text"}],
    });
    let reference = s.call("bundles/sync", json!({"bundle": bundle}))["reference"].clone();
    let w = s.call(
        "workers/create",
        json!({"profile": {"kind": "named", "value": "cat"}, "config_bundle": reference,
               "initial_input": first}),
    )["worker"]
        .clone();
    (reference, w)
}

pub fn catalog(s: &mut Server) -> Value {
    s.call("operations/catalog", json!({}))
}

pub fn catalog_names(c: &Value) -> Vec<String> {
    c["operations"]
        .as_array()
        .unwrap()
        .iter()
        .map(|d| d["name"].as_str().unwrap().to_string())
        .collect()
}

pub fn show(env: &Env, key: &Path) -> Value {
    let (code, out, err) = env.cli_with_key(key, &["trust", "--show"]);
    assert_eq!(code, 0, "{out}{err}");
    serde_json::from_str(&out).unwrap()
}

pub fn status_in(shown: &Value, file: &str) -> String {
    shown["files"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["file"] == file)
        .unwrap_or_else(|| panic!("{file} missing from {shown}"))["status"]
        .as_str()
        .unwrap()
        .to_string()
}

/// Appends records to the journal as an agent with write access to `.gaffer/` can: through
/// the store's own writer, so framing, checksums and the chain are all valid.
pub fn append_as_agent(root: &Path, records: Vec<(&'static str, Value)>) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let ws = gaffer::workspace::Workspace::open(root).unwrap();
        let recs: Vec<_> = records
            .into_iter()
            .map(|(k, v)| gaffer::workspace::NewRecord::new(k, &v).unwrap())
            .collect();
        ws.commit(move |_s: &gaffer::workspace::State| Ok::<_, String>((recs, ())))
            .await
            .map_err(|_| "commit")
            .unwrap();
    });
}

pub fn workspace_id(root: &Path) -> String {
    gaffer::workspace::Workspace::open(root)
        .unwrap()
        .workspace_id()
        .expect("the store has a workspace id")
}

/// A key pair the agent made for itself.
pub fn agent_signer(env: &Env) -> gaffer::operator::OperatorSigner {
    let (k, p) = (
        env._cfg.path().join("agent.key"),
        env._cfg.path().join("agent.pub"),
    );
    if !k.exists() {
        gaffer::operator::OperatorSigner::init(&k, &p, None).unwrap();
    }
    gaffer::operator::OperatorSigner::load_from(&k).unwrap()
}

pub fn trust_record(
    signer: &gaffer::operator::OperatorSigner,
    ws_id: &str,
    file: &str,
    bytes: &[u8],
    version: u64,
) -> Value {
    let payload = gaffer::operations::trust::TrustPayload {
        domain: "gaffer/trust/v1".into(),
        workspace_id: ws_id.into(),
        file: file.into(),
        sha256: Some(gaffer::util::sha256_hex(bytes)),
        version,
        signed_at_ms: gaffer::util::now_ms(),
        head: gaffer::operator::Head {
            seq: 1,
            hash: String::new(),
        },
    };
    serde_json::to_value(gaffer::operations::trust::TrustRecord {
        file: file.into(),
        operator_signature: gaffer::operator::OperatorSignature::sign(signer, &payload),
    })
    .unwrap()
}

/// What a forged `file.write` plan shows and asks: the path it claims (its classification and
/// title), its summary, the rule it names, and (mode, seconds, uses) when it asks the operator
/// (else the rule allowed it).
pub struct ForgedWrite<'a> {
    pub claimed_path: &'a str,
    pub summary: String,
    pub rule: &'a str,
    pub asks: Option<(GrantMode, u64, u32)>,
}

/// The plan an agent forges for a `file.write` of `content` to `path` in `client`'s name,
/// and the classification it claims.
pub fn forged_write_plan(
    id: &str,
    client: &str,
    path: &str,
    content: &str,
    f: ForgedWrite<'_>,
) -> (Plan, Classification) {
    let now = gaffer::util::now_ms();
    let class = Classification {
        target_kind: "file".into(),
        fields: [("path".to_string(), [f.claimed_path.to_string()].into())].into(),
        ..Default::default()
    };
    let plan = Plan {
        schema: PLAN_SCHEMA.into(),
        operation: "file.write".into(),
        operation_revision: 1,
        provider: "workspace".into(),
        client_id: client.into(),
        operation_id: id.into(),
        target: json!({ "path": path }),
        arguments: json!({ "content": content }),
        preconditions: json!({ "prior_sha256": null }),
        presentation: gaffer::operations::adapter::Presentation {
            title: format!("Write {}", f.claimed_path),
            summary: f.summary,
        },
        authorization: PlanAuthorization {
            classification: class.clone(),
            policy_effect: if f.asks.is_some() {
                DecisionEffect::Request
            } else {
                DecisionEffect::Allow
            },
            rule_ids: vec![f.rule.into()],
            mode: f.asks.map(|a| a.0),
            requested_duration_seconds: f.asks.map(|a| a.1),
            requested_max_uses: f.asks.map(|a| a.2),
        },
        created_at_ms: now,
        expires_at_ms: now + 600_000,
    };
    (plan, class)
}

/// Appends, as the agent, a well-framed and chained pending `file.write` of `content` to
/// `path` in `client`'s name, whose plan text and approval record both ask for `asked`
/// (mode, uses, seconds) under the rule `notes`.
pub fn forge_file_write_request(
    root: &Path,
    client: &str,
    id: &str,
    path: &str,
    content: &str,
    asked: (GrantMode, u32, u64),
) {
    let (mode, uses, secs) = asked;
    let now = gaffer::util::now_ms();
    let summary = format!("Create {path} with {} bytes", content.len());
    let (plan, class) = forged_write_plan(
        id,
        client,
        path,
        content,
        ForgedWrite {
            claimed_path: path,
            summary,
            rule: "notes",
            asks: Some((mode, secs, uses)),
        },
    );
    let text = plan.canonical();
    let digest = Plan::digest_of(&text);
    let ap = format!("ap_{id}");
    let created = json!({
        "operation": {
            "id": id, "client_id": client, "idempotency_key": id, "operation": "file.write",
            "provider": "workspace", "submitted": "x", "reason": "write a note",
            "target": {"path": path}, "arguments": {"content": content},
            "state": "pending", "revision": 1, "approval_id": ap,
            "created_at_ms": now, "updated_at_ms": now, "terminal_at_ms": null,
            "presentation": plan.presentation, "plan_digest": digest, "plan": text,
            "result": null, "upstream_status": null, "error": null
        },
        "approval": {
            "id": ap, "operation_id": id, "client_id": client, "operation": "file.write",
            "plan_digest": digest, "mode": mode, "classification": class,
            "status": "pending", "revision": 1, "created_at_ms": now,
            "pending_expires_at_ms": now + 600_000,
            "requested_duration_seconds": secs, "requested_max_uses": uses,
            "decision": null, "uses": {}, "decision_keys": {}
        }
    });
    append_as_agent(root, vec![("operation.created", created)]);
}
