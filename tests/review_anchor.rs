//! Review of the anchor (review2): attacks by an agent that can write every file of the
//! workspace, `.gaffer/` included, and nothing outside it, played end to end on the real
//! binary (real framing, real crcs, the journal's own hash chain), with the anchor kept
//! outside every workspace (`GAFFER_STATE_DIR`, one per test binary).
//!
//! Each test's doc comment says whether the attack works on the code under review (the test
//! fails at its primary assertion) or is refused (a regression test).

mod common;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Server;
use common::gate::*;
use serde_json::{Value, json};

const WATCH: Duration = Duration::from_secs(15);

fn anchor_outside_the_workspace() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("review-anchor-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the anchor directory");
        // SAFETY: every test calls this before it starts a process or reads the environment,
        // and `Once` holds the others back until the variable is set.
        unsafe { std::env::set_var("GAFFER_STATE_DIR", &dir) };
    });
}

fn state_of(s: &mut Server, id: &str) -> Option<String> {
    let r = s.request("operations/get", json!({ "id": id }));
    r["result"]["state"].as_str().map(str::to_string)
}

fn is_terminal(state: Option<&str>) -> bool {
    matches!(
        state,
        Some("succeeded" | "failed" | "denied" | "expired" | "canceled")
    )
}

fn watch(mut done: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + WATCH;
    loop {
        if done() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Submits a write of `path` and waits until it is written or its operation ended (or `WATCH`
/// passed); returns whether the file was written.
fn write_lands(env: &Env, s: &mut Server, path: &str, key: &str) -> bool {
    let file = env.root().join(path);
    let r = submit(
        s,
        "file.write",
        json!({ "path": path }),
        json!({"content": "x"}),
        key,
    );
    let id = r["result"]["id"].as_str().map(str::to_string);
    watch(|| {
        file.exists()
            || match &id {
                Some(id) => is_terminal(state_of(s, id).as_deref()),
                None => true,
            }
    });
    let landed = file.exists();
    eprintln!(
        "write of {path}: {r}; now {:?}; written: {landed}",
        id.as_deref().map(|id| state_of(s, id))
    );
    landed
}

fn deny_docs(v1: &[u8]) -> String {
    let v2 = String::from_utf8(v1.to_vec()).unwrap().replacen(
        "  - id: docs\n    effect: allow",
        "  - id: docs\n    effect: deny",
        1,
    );
    assert_ne!(v2.as_bytes(), v1, "the docs rule was found");
    v2
}

// ---- the journal as the agent sees it ----

const FLAG_FIRST: u32 = 1 << 31;
const FLAG_LAST: u32 = 1 << 30;

#[derive(Clone, Debug)]
struct Rec {
    at: usize,
    first: bool,
    last: bool,
    body: Vec<u8>,
}

impl Rec {
    fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a record body is JSON")
    }
    fn kind(&self) -> String {
        self.json()["kind"].as_str().unwrap_or_default().to_string()
    }
    fn payload(&self) -> Value {
        self.json()["payload"].clone()
    }
    fn raw_payload(&self) -> Vec<u8> {
        let text = std::str::from_utf8(&self.body).expect("UTF-8 body");
        let kind_at = text.find(",\"kind\":\"").expect("a kind");
        let at = kind_at + text[kind_at..].find(",\"payload\":").expect("a payload");
        text.as_bytes()[at + ",\"payload\":".len()..text.len() - 1].to_vec()
    }
    fn frame_len(&self) -> usize {
        8 + self.body.len()
    }
}

struct Segment {
    path: PathBuf,
    bytes: Vec<u8>,
    recs: Vec<Rec>,
}

fn the_segment(root: &Path) -> Segment {
    let dir = root.join(".gaffer/journal");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("a journal")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    names.sort();
    assert_eq!(names.len(), 1, "one segment to edit: {names:?}");
    let path = names.remove(0);
    let bytes = std::fs::read(&path).unwrap();
    let recs = common::frames(&bytes)
        .into_iter()
        .map(|(at, len)| {
            let word = u32::from_le_bytes(bytes[at..at + 4].try_into().unwrap());
            Rec {
                at,
                first: word & FLAG_FIRST != 0,
                last: word & FLAG_LAST != 0,
                body: bytes[at + 8..at + len].to_vec(),
            }
        })
        .collect();
    Segment { path, bytes, recs }
}

impl Segment {
    fn find(&self, what: &str, pred: impl Fn(&str, &Value) -> bool) -> usize {
        let hits: Vec<usize> = (0..self.recs.len())
            .filter(|&i| pred(&self.recs[i].kind(), &self.recs[i].payload()))
            .collect();
        assert_eq!(hits.len(), 1, "exactly one {what} record: {hits:?}");
        hits[0]
    }

    fn head(&self) -> (u64, String) {
        let last = self.recs.last().expect("a record");
        let seq = last.json()["seq"].as_u64().expect("a seq");
        (seq, gaffer::util::sha256_hex(&last.body))
    }
}

fn frame(body: &[u8], first: bool, last: bool) -> Vec<u8> {
    let mut word = body.len() as u32;
    if first {
        word |= FLAG_FIRST;
    }
    if last {
        word |= FLAG_LAST;
    }
    let mut crc = crc32fast::Hasher::new();
    crc.update(&word.to_le_bytes());
    crc.update(body);
    let mut out = word.to_le_bytes().to_vec();
    out.extend_from_slice(&crc.finalize().to_le_bytes());
    out.extend_from_slice(body);
    out
}

fn writer_lock(root: &Path) -> File {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(root.join(".gaffer/lock"))
        .unwrap();
    f.lock().unwrap();
    f
}

/// Appends records after the journal's head, each a batch of its own, chained from the head
/// and framed with valid crcs: `(kind, payload JSON bytes)`.
fn append_chained(root: &Path, records: &[(&str, Vec<u8>)]) {
    let lock = writer_lock(root);
    let seg = the_segment(root);
    let (mut seq, mut prev) = seg.head();
    let now = gaffer::util::now_ms();
    let mut out = Vec::new();
    for (kind, payload) in records {
        seq += 1;
        let mut body = format!(
            "{{\"seq\":{seq},\"prev\":\"{prev}\",\"time_ms\":{now},\"kind\":{},\"payload\":",
            json!(kind)
        )
        .into_bytes();
        body.extend_from_slice(payload);
        body.push(b'}');
        out.extend(frame(&body, true, true));
        prev = gaffer::util::sha256_hex(&body);
    }
    let mut f = OpenOptions::new().append(true).open(&seg.path).unwrap();
    f.write_all(&out).unwrap();
    f.sync_data().unwrap();
    lock.unlock().unwrap();
}

/// Replaces record `i`'s kind and payload in place: same seq, same `prev`, same time, same
/// batch flags, a valid crc. Every other byte of the segment stays as it was, so every later
/// record (the anchored head among them) hashes as before; only the link from record `i` to
/// the next one no longer holds.
fn replace_in_place(seg: &Segment, i: usize, kind: &str, payload: &[u8]) {
    let r = &seg.recs[i];
    let j = r.json();
    let mut body = format!(
        "{{\"seq\":{},\"prev\":\"{}\",\"time_ms\":{},\"kind\":{},\"payload\":",
        j["seq"],
        j["prev"].as_str().unwrap(),
        j["time_ms"],
        json!(kind)
    )
    .into_bytes();
    body.extend_from_slice(payload);
    body.push(b'}');
    let mut out = seg.bytes[..r.at].to_vec();
    out.extend(frame(&body, r.first, r.last));
    out.extend_from_slice(&seg.bytes[r.at + r.frame_len()..]);
    std::fs::write(&seg.path, out).unwrap();
}

fn trust_version(payload: &Value) -> Option<u64> {
    let text = payload["operator_signature"]["payload"].as_str()?;
    serde_json::from_str::<Value>(text).ok()?["version"].as_u64()
}

fn verify(env: &Env) -> (i32, String) {
    let (code, out, err) = env.cli(&["store", "verify"]);
    (code, format!("{out}{err}"))
}

// ---- 1. the anchor compares one record's hash, not the chain that leads to it ----

/// WORKS (the test fails). The operator trusted v1 (docs/ allowed) and a docs write ran under
/// it; then the operator trusted v2 (docs/ denied) with `gaffer trust`, which signs
/// `policy.yaml` and `providers.yaml` in one batch: the anchored head is the providers record,
/// one after policy v2's. No process has checked the policy since, so the anchor's trust floor
/// for `policy.yaml` is still 1 (`version_holds` raises it only when a check reads v2;
/// `trust::sign` never does).
///
/// The agent overwrites policy v2's record in place with a copy of v1's (same seq, same prev,
/// valid crc), leaving every other byte of the journal as it was, and puts v1's bytes back on
/// disk. The anchored head record is byte-identical, so `judge` finds its hash and says
/// intact; the broken link (seq H, prev ≠ hash of H-1) only sets `chain_ok = false`, which
/// gates signed approvals but not trust. The newest valid policy trust is v1 = the floor: the
/// restarted server enforces v1 and the docs write v2 denies lands (fails at "a write the
/// trusted policy (v2) denies ran ...").
#[test]
fn a_trust_record_overwritten_before_the_anchored_head_does_not_restore_the_old_policy() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let policy = env.root().join(".gaffer/policy.yaml");
    let v1 = std::fs::read(&policy).unwrap();
    {
        let mut a = env.agent("agent-1");
        assert!(
            write_lands(&env, &mut a, "docs/v1.md", "under-v1"),
            "control: the trusted v1 allows docs/ writes"
        );
    }
    std::fs::write(&policy, deny_docs(&v1)).unwrap();
    let (code, out, err) = env.cli(&["trust"]);
    assert_eq!(code, 0, "gaffer trust (v2): {out}{err}");
    let seg = the_segment(env.root());
    let v2 = seg.find("policy v2 trust", |kind, p| {
        kind == "trust.signed" && p["file"] == "policy.yaml" && trust_version(p) == Some(2)
    });
    let v1_rec = seg.find("policy v1 trust", |kind, p| {
        kind == "trust.signed" && p["file"] == "policy.yaml" && trust_version(p) == Some(1)
    });
    assert!(v2 + 1 < seg.recs.len(), "a record (providers v2) follows");
    assert_eq!(seg.recs[v2 + 1].kind(), "trust.signed");
    let (code, text) = verify(&env);
    assert_eq!(code, 0, "control: the genuine journal verifies:\n{text}");
    replace_in_place(&seg, v2, "trust.signed", &seg.recs[v1_rec].raw_payload());
    std::fs::write(&policy, &v1).unwrap();
    let mut b = env.agent("agent-1");
    let st = b.call("gaffer/status", json!({}));
    eprintln!(
        "after the overwrite: store {}\ntrust {}",
        st["store"], st["trust"]
    );
    let landed = write_lands(&env, &mut b, "docs/after.md", "after-overwrite");
    let (code, text) = verify(&env);
    eprintln!("store verify: exit {code}\n{text}");
    assert!(
        !landed,
        "a write the trusted policy (v2) denies ran after v2's record was overwritten before \
         the anchored head (the anchor judged the store intact)"
    );
}

// ---- 2. a client revocation is neither anchored nor safe from a flood ----

/// WORKS (the test fails). `ClientState::apply` keeps the first 8 `client.revoked` records per
/// credential and drops the rest. The agent knows its own credential id (it is in its token's
/// payload) and appends 8 forged revocations of it (invalid signatures) ahead of time. When
/// the operator then runs `gaffer client revoke agent-1`, the genuine revocation is the ninth
/// and is dropped at every fold: the token stays valid, and a rule naming agent-1 still lets
/// it write (fails at "a credential the operator revoked still ...").
#[test]
fn forged_revocations_do_not_crowd_out_the_operators_client_revocation() {
    anchor_outside_the_workspace();
    let policy = format!(
        "{ALLOW_DOCS}  - id: agent1-notes\n    effect: allow\n    clients: [agent-1]\n    \
         operations: [\"file.write\"]\n    targets:\n      - kind: file\n        fields:\n          \
         path: [\"notes/**\"]\n"
    );
    let env = Env::new(Some(&policy));
    let token = env.token("agent-1");
    {
        let mut a = env.agent("agent-1");
        assert!(
            write_lands(&env, &mut a, "notes/before.md", "before"),
            "control: agent-1's rule lets it write notes/"
        );
    }
    let (payload_b64, _) = token.split_once('.').unwrap();
    let cred: Value =
        serde_json::from_slice(&gaffer::util::base64url_decode(payload_b64).unwrap()).unwrap();
    let cid = cred["credential_id"].as_str().unwrap().to_string();
    let forged = json!({
        "credential_id": cid,
        "operator_signature": {
            "head": {"seq": 1, "hash": "0".repeat(64)},
            "payload": "{}",
            "signature": "AAAA",
        }
    })
    .to_string()
    .into_bytes();
    let flood: Vec<(&str, Vec<u8>)> = (0..8).map(|_| ("client.revoked", forged.clone())).collect();
    append_chained(env.root(), &flood);
    // A flooded credential already counts as revoked (fail closed), so the operator's revoke
    // either records one more revocation or finds nothing left to revoke.
    let (code, out, err) = env.cli(&["client", "revoke", "agent-1"]);
    assert!(
        code == 0 || err.contains("no unrevoked credential"),
        "gaffer client revoke: {out}{err}"
    );
    let (_, listed, _) = env.cli(&["client", "list"]);
    eprintln!("after the revocation: {listed}");
    let mut s = env.start(&[]);
    let init = s.request(
        "initialize",
        json!({"clientInfo": {"name": "agent-1"}, "initializationOptions": {"clientToken": token}}),
    );
    eprintln!("initialize with the revoked token: {init}");
    let accepted = init.get("error").is_none();
    let landed = accepted && {
        s.notify("initialized", json!({}));
        write_lands(&env, &mut s, "notes/after.md", "after")
    };
    assert!(
        !accepted && !landed,
        "a credential the operator revoked still authenticates (accepted {accepted}) and \
         writes under its rule (written {landed}): {init}"
    );
}

// ---- 3. forged trust records claiming a high version (regression) ----

/// REFUSED (regression test). v1 then v2 trusted, and checked (the floor is 2). The agent
/// appends 16 forged `trust.signed` records for `policy.yaml` claiming version 1000 (invalid
/// signatures): eviction by lowest claimed version pushes both genuine records out. The newest
/// valid trust is then none (version 0 < floor 2): everything is refused, and in particular
/// v1, put back on disk, is not enforced.
#[test]
fn forged_high_version_trust_records_fail_closed() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let policy = env.root().join(".gaffer/policy.yaml");
    let v1 = std::fs::read(&policy).unwrap();
    let mut a = env.agent("agent-1");
    assert!(write_lands(&env, &mut a, "docs/v1.md", "under-v1"));
    std::fs::write(&policy, deny_docs(&v1)).unwrap();
    let (code, out, err) = env.cli(&["trust"]);
    assert_eq!(code, 0, "gaffer trust (v2): {out}{err}");
    assert!(
        !write_lands(&env, &mut a, "docs/v2.md", "under-v2"),
        "control: v2 denies docs/"
    );
    drop(a);
    let seg = the_segment(env.root());
    let v2 = seg.find("policy v2 trust", |kind, p| {
        kind == "trust.signed" && p["file"] == "policy.yaml" && trust_version(p) == Some(2)
    });
    let mut genuine = seg.recs[v2].payload();
    let flood: Vec<(&str, Vec<u8>)> = (0..16)
        .map(|n| {
            let text = genuine["operator_signature"]["payload"].as_str().unwrap();
            let mut p: Value = serde_json::from_str(text).unwrap();
            p["version"] = json!(1000 + n);
            genuine["operator_signature"]["payload"] = json!(p.to_string());
            ("trust.signed", genuine.to_string().into_bytes())
        })
        .collect();
    append_chained(env.root(), &flood);
    std::fs::write(&policy, &v1).unwrap();
    let mut b = env.agent("agent-1");
    let st = b.call("gaffer/status", json!({}));
    eprintln!("trust after the flood: {}", st["trust"]);
    assert!(
        !write_lands(&env, &mut b, "docs/flood.md", "flood"),
        "a write the trusted policy (v2) denies ran after forged high-version records"
    );
    let shown = st["trust"].to_string();
    assert!(
        shown.contains("rolled_back"),
        "policy.yaml must stand rolled back (everything refused): {shown}"
    );
}

// ---- 4. the ledger is keyed by the workspace's path, the signatures only by its id ----

fn kv_log_in(root: &Path) -> usize {
    lines(&root.join("kv-exec.log"))
}

/// The records an agent appends to bring a used one-use approval back (as in
/// `tests/anchor_attacks.rs`): a prune of everything terminal, then byte-identical copies of
/// the operation's `operation.created`, `approval.decided` and `pending -> approved`.
fn forge_prune_and_recreate(root: &Path, id: &str, aid: &str) {
    let seg = the_segment(root);
    let created = seg.find("operation.created", |kind, p| {
        kind == "operation.created" && p["operation"]["id"] == id
    });
    let decided = seg.find("approval.decided", |kind, p| {
        kind == "approval.decided" && p["approval_id"] == aid
    });
    let approved = seg.find("approving transition", |kind, p| {
        kind == "operation.transitioned" && p["id"] == id && p["to"] == "approved"
    });
    let far_future = gaffer::util::now_ms() + 10 * 365 * 24 * 3600 * 1000;
    append_chained(
        root,
        &[
            (
                "operation.pruned",
                json!({ "before_ms": far_future }).to_string().into_bytes(),
            ),
            ("operation.created", seg.recs[created].raw_payload()),
            ("approval.decided", seg.recs[decided].raw_payload()),
            ("operation.transitioned", seg.recs[approved].raw_payload()),
        ],
    );
}

/// WORKS when the workspace is copied or moved (the test fails). A one-use approval of a
/// `kv.set` ran once. The workspace is then copied (`cp -a`, as an operator does to try
/// something on a copy; a `mv` of the project directory is the same). `Anchor::locate` keys
/// the anchor by (canonical root, workspace id), but every operator signature binds only the
/// workspace id: at the new path the anchor is empty (no head, no claimed uses, no
/// revocations, no trust floors) while every signature still verifies. The agent's forged
/// prune + re-creation there runs the used approval a second time (fails at "a used one-use
/// approval ran again in a copy of the workspace").
#[test]
fn a_used_approval_does_not_run_again_in_a_copy_of_the_workspace() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let token = env.token("agent-1");
    let (id, aid) = {
        let mut a = env.agent("agent-1");
        let p = ok(&submit(
            &mut a,
            "kv.set",
            json!({"key": "c"}),
            json!({"value": 1}),
            "replay",
        ))
        .clone();
        assert_eq!(p["state"], "pending", "kv.set waits for the operator: {p}");
        let id = p["id"].as_str().unwrap().to_string();
        let (code, out, err) = env.cli(&["approve", &id]);
        assert_eq!(code, 0, "gaffer approve: {out}{err}");
        let v = wait_state(&mut a, &id, &["succeeded", "failed"]);
        assert_eq!(v["state"], "succeeded", "{v}");
        (id, v["approval_id"].as_str().unwrap().to_string())
    };
    assert_eq!(kv_log_in(env.root()), 1, "the approved plan ran once");
    let copy_parent = tempfile::tempdir().unwrap();
    let copy = copy_parent.path().join("ws-copy");
    let st = std::process::Command::new("cp")
        .arg("-a")
        .arg(env.root())
        .arg(&copy)
        .status()
        .unwrap();
    assert!(st.success());
    assert_eq!(kv_log_in(&copy), 1, "the copy has the one line");
    forge_prune_and_recreate(&copy, &id, &aid);
    let key = env.key_file.display().to_string();
    let mut b = Server::start_env(
        &copy,
        common::Wire::Ndjson,
        &[],
        &[("GAFFER_OPERATOR_KEY_FILE", key.as_str())],
    );
    b.call(
        "initialize",
        json!({"clientInfo": {"name": "agent-1"}, "initializationOptions": {"clientToken": token}}),
    );
    b.notify("initialized", json!({}));
    watch(|| {
        kv_log_in(&copy) >= 2
            || matches!(
                state_of(&mut b, &id).as_deref(),
                Some("failed" | "denied" | "expired" | "canceled")
            )
    });
    let v = b.request("operations/get", json!({ "id": id }));
    assert_eq!(
        kv_log_in(&copy),
        1,
        "a used one-use approval ran again in a copy of the workspace: {v}"
    );
}

// ---- 5. window approvals: uses and revocations outlive the journal (regressions) ----

const WINDOW: &str = r#"
rules:
  - id: window
    effect: request
    operations: ["kv.set"]
    grant_policy: {mode: window, default_minutes: 5, max_minutes: 60, request_ttl_minutes: 10, default_max_uses: 2, max_uses: 3}
"#;

/// A window approval (2 uses) granted on the first `kv.set` of key `shared`, which ran;
/// returns (agent, first operation id, approval id).
fn window_used_once(env: &Env) -> (Server, String, String) {
    let mut a = env.agent("agent-1");
    let first = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "shared"}),
        json!({"value": 1}),
        "w1",
    ))
    .clone();
    assert_eq!(first["state"], "pending");
    let id = first["id"].as_str().unwrap().to_string();
    let (code, out, err) = env.cli(&["approve", &id]);
    assert_eq!(code, 0, "gaffer approve: {out}{err}");
    let v = wait_state(&mut a, &id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    let aid = v["approval_id"].as_str().unwrap().to_string();
    (a, id, aid)
}

/// Submits one more `kv.set` of `shared` and waits for it to end (or `WATCH`).
fn one_more_use(env: &Env, a: &mut Server, key: &str) -> Value {
    let p = submit(
        a,
        "kv.set",
        json!({"key": "shared"}),
        json!({"value": 9}),
        key,
    );
    eprintln!("one more use: {p}");
    if let Some(id) = p["result"]["id"].as_str() {
        let id = id.to_string();
        watch(|| {
            lines(&env.root().join("kv-exec.log")) >= 3 || is_terminal(state_of(a, &id).as_deref())
        });
        let v = a.request("operations/get", json!({ "id": id }));
        eprintln!(
            "the further use ended: {} {}",
            v["result"]["state"], v["result"]["error"]
        );
        return v;
    }
    p
}

/// REFUSED (regression test, candidate 1). Both uses of a window approval were spent; the
/// agent's forged prune + re-creation (appended, chained) brings the approval back active with
/// no use in the journal. A further matching `kv.set` rides it, and the anchor's ledger
/// (two uses claimed on this machine) refuses it: `kv-exec.log` stays at 2.
#[test]
fn a_window_approval_gets_no_use_beyond_its_max_after_its_uses_are_forgotten() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(WINDOW));
    let (mut a, id, aid) = window_used_once(&env);
    let second = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "shared"}),
        json!({"value": 2}),
        "w2",
    ))
    .clone();
    assert_eq!(second["approval_id"], aid.as_str(), "{second}");
    let v = wait_state(
        &mut a,
        second["id"].as_str().unwrap(),
        &["succeeded", "failed"],
    );
    assert_eq!(v["state"], "succeeded", "{v}");
    assert_eq!(lines(&env.root().join("kv-exec.log")), 2, "both uses ran");
    forge_prune_and_recreate(env.root(), &id, &aid);
    let v = one_more_use(&env, &mut a, "w3");
    let log = lines(&env.root().join("kv-exec.log"));
    assert_eq!(log, 2, "a window approval of 2 uses ran a third time: {v}");
}

/// REFUSED (regression test, candidate 2). A window approval (2 uses) ran once; the operator
/// revokes it with `gaffer revoke` (the CLI, another process than the serving one). The
/// agent's forged prune + re-creation brings it back active; a further matching `kv.set`
/// rides it, and the anchor's revocation refuses it: `kv-exec.log` stays at 1.
#[test]
fn a_window_approval_revoked_with_the_cli_stays_revoked_after_a_forged_recreation() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(WINDOW));
    let (mut a, id, aid) = window_used_once(&env);
    let (code, out, err) = env.cli(&["revoke", &aid]);
    assert_eq!(code, 0, "gaffer revoke: {out}{err}");
    forge_prune_and_recreate(env.root(), &id, &aid);
    let v = one_more_use(&env, &mut a, "w2");
    let log = lines(&env.root().join("kv-exec.log"));
    assert_eq!(log, 1, "a revoked window approval ran again: {v}");
}

/// REFUSED (regression test, candidate 2). The same, revoked through a serving operator
/// connection (`approvals/revoke`).
#[test]
fn a_window_approval_revoked_by_a_server_stays_revoked_after_a_forged_recreation() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(WINDOW));
    let (mut a, id, aid) = window_used_once(&env);
    {
        let mut op = env.operator();
        let r = env.revoke_ok(&mut op, &json!(aid));
        eprintln!("revoked: {r}");
    }
    forge_prune_and_recreate(env.root(), &id, &aid);
    let v = one_more_use(&env, &mut a, "w2");
    let log = lines(&env.root().join("kv-exec.log"));
    assert_eq!(log, 1, "a revoked window approval ran again: {v}");
}

/// WORKS (the test fails), given an operator who revokes while the store stands rolled back and
/// later accepts the store (`gaffer store reanchor`). A window approval (2 uses) ran once.
/// The agent cuts the journal's last batch (a harmless pending request): every new process
/// judges the store rolled back. The operator, alarmed, revokes the window approval with
/// `gaffer revoke`: the revocation is committed to the journal, but `anchor_revocation` takes
/// `ws.anchor()`, which is `None` unless the store stands intact, so it is silently not
/// anchored. The operator then accepts the store (`gaffer store reanchor`); the agent's forged
/// prune + re-creation drops the revocation from the folded state, and a further matching
/// `kv.set` rides the revoked approval: the ledger has one claimed use of two and no
/// revocation (fails at "a window approval revoked while the store stood rolled back ran
/// again").
#[test]
fn a_revocation_made_while_the_store_stands_rolled_back_still_holds_after_reanchor() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(WINDOW));
    let (mut a, id, aid) = window_used_once(&env);
    let other = ok(&submit(
        &mut a,
        "kv.set",
        json!({"key": "other"}),
        json!({"value": 1}),
        "harmless",
    ))
    .clone();
    assert_eq!(other["state"], "pending", "{other}");
    drop(a);
    let seg = the_segment(env.root());
    let created = seg.find("harmless request", |kind, p| {
        kind == "operation.created" && p["operation"]["id"] == other["id"]
    });
    let mut cut = created;
    while !seg.recs[cut].first {
        cut -= 1;
    }
    let file = OpenOptions::new().write(true).open(&seg.path).unwrap();
    file.set_len(seg.recs[cut].at as u64).unwrap();
    drop(file);
    let (code, text) = verify(&env);
    assert_ne!(code, 0, "control: the cut is seen as a rollback:\n{text}");
    let (code, out, err) = env.cli(&["revoke", &aid]);
    eprintln!("gaffer revoke on the rolled-back store: exit {code}\n{out}{err}");
    assert_eq!(code, 0, "gaffer revoke: {out}{err}");
    let (code, out, err) = env.cli(&["store", "reanchor"]);
    assert_eq!(code, 0, "gaffer store reanchor: {out}{err}");
    forge_prune_and_recreate(env.root(), &id, &aid);
    let mut b = env.agent("agent-1");
    let v = one_more_use(&env, &mut b, "w2");
    let log = lines(&env.root().join("kv-exec.log"));
    assert_eq!(
        log, 1,
        "a window approval revoked while the store stood rolled back ran again: {v}"
    );
}
