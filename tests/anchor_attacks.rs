//! Rollback and replay attacks on the store, played end to end on the real binary by an agent
//! that can write every file of the workspace, `.gaffer/` included, and nothing outside it.
//!
//! Each attack rewrites facts that authority is folded from (an approval's uses and status, an
//! operation's state, the set of trust signatures of `policy.yaml`) so that every record still
//! has a valid crc and every link of the hash chain holds: a snapshot with its `state_sha256`
//! recomputed, a journal cut back at a batch boundary, a journal with a record removed and
//! every later one re-chained, records appended after the head. The primary assertion is
//! always that the side effect did not happen (a line in `kv-exec.log`, a file under `docs/`).
//!
//! What refuses them is the anchor gaffer keeps outside the workspace (`GAFFER_STATE_DIR`):
//! the journal head after each commit, the headers of the snapshots gaffer wrote, the ledger
//! of approval uses and the highest trusted version per file. Without it every attack here
//! succeeds: each test's doc comment says how it fails on the code before the anchor.
//!
//! The agent edits the files directly, as a program with write access to `.gaffer/` can, and
//! never through gaffer's own writer (`append_as_agent`): that writer is gaffer's, and once
//! gaffer anchors its commits it advances the anchor, which the agent cannot reach.

mod common;

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::Server;
use common::gate::*;
use serde_json::{Value, json};

/// How long a test watches for a side effect that must not happen, when nothing tells it
/// earlier that the server is done with the operation. On the code before the anchor the
/// side effect shows within a second or two; this is for loaded CI machines.
const WATCH: Duration = Duration::from_secs(15);

/// Every process this test binary starts (servers, CLI) keeps its anchor in one directory
/// outside every workspace, as an operator's `$XDG_STATE_HOME/gaffer` is.
fn anchor_outside_the_workspace() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
            .join(format!("anchor-attacks-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("the anchor directory");
        // SAFETY: every test calls this before it starts a process or reads the environment,
        // and `Once` holds the others back until the variable is set.
        unsafe { std::env::set_var("GAFFER_STATE_DIR", &dir) };
    });
}

// ---- operations as the tests drive them ----

fn kv_log(env: &Env) -> usize {
    lines(&env.root().join("kv-exec.log"))
}

/// The operation's state as `s` sees it (`None` while the server refuses to say).
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

/// Polls until `done` holds or `WATCH` has passed; returns whether it held.
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

/// An operator approval of exactly one `kv.set` plan (one use), executed once by a serving
/// agent process: (the agent still serving, operation id, approval id).
fn one_use_approval_ran_once(env: &Env) -> (Server, String, String) {
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
    let aid = v["approval_id"].as_str().expect("an approval").to_string();
    assert_eq!(kv_log(env), 1, "the approved plan ran once");
    (a, id, aid)
}

/// `gaffer store verify`: (exit code, stdout and stderr).
fn verify(env: &Env) -> (i32, String) {
    let (code, out, err) = env.cli(&["store", "verify"]);
    (code, format!("{out}{err}"))
}

/// Submits `file.write` of `path`; the reply and the operation id, if one was made.
fn submit_write(s: &mut Server, path: &str, key: &str) -> (Value, Option<String>) {
    let r = submit(
        s,
        "file.write",
        json!({ "path": path }),
        json!({"content": "x"}),
        key,
    );
    let id = r["result"]["id"].as_str().map(str::to_string);
    (r, id)
}

/// Submits a write of `path` and waits until it is written or its operation ended (or `WATCH`
/// passed); returns whether the file was written.
fn write_lands(env: &Env, s: &mut Server, path: &str, key: &str) -> bool {
    let file = env.root().join(path);
    let (r, id) = submit_write(s, path, key);
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

/// The v1 policy (`ALLOW_DOCS`) with its docs rule turned to deny: what the operator trusts
/// as v2.
fn deny_docs(v1: &[u8]) -> String {
    let v2 = String::from_utf8(v1.to_vec()).unwrap().replacen(
        "  - id: docs\n    effect: allow",
        "  - id: docs\n    effect: deny",
        1,
    );
    assert_ne!(v2.as_bytes(), v1, "the docs rule was found");
    v2
}

/// With v1 (`ALLOW_DOCS`, as `Env::new` trusted it) a docs write lands; the operator then
/// trusts v2 (docs/ denied) and a docs write does not land. Returns v1's bytes; the agent
/// connection is closed.
fn trust_v1_then_v2(env: &Env) -> Vec<u8> {
    let policy = env.root().join(".gaffer/policy.yaml");
    let v1 = std::fs::read(&policy).unwrap();
    let mut a = env.agent("agent-1");
    assert!(
        write_lands(env, &mut a, "docs/v1.md", "under-v1"),
        "control: the trusted v1 allows docs/ writes"
    );
    std::fs::write(&policy, deny_docs(&v1)).unwrap();
    let (code, out, err) = env.cli(&["trust"]);
    assert_eq!(code, 0, "gaffer trust (v2): {out}{err}");
    assert!(
        !write_lands(env, &mut a, "docs/v2.md", "under-v2"),
        "control: the trusted v2 denies docs/ writes"
    );
    v1
}

// ---- forged snapshots ----

/// Every array whose first element is `id` (an operation in the snapshot's compact form,
/// `src/operations/compact.rs`) and every object whose `id` is `aid` (the approval),
/// rewritten to "approved, never used".
fn rewind(v: &mut Value, id: &str, aid: &str, plan: &Value) {
    // Positions in the compact form.
    const STATE: usize = 9;
    const TERMINAL_AT: usize = 14;
    const PLAN: usize = 18;
    const RESULT_TO_EXECUTOR: [usize; 4] = [19, 20, 21, 22];
    match v {
        Value::Array(a) => {
            if a.len() == 23 && a[0] == id {
                a[STATE] = json!("approved");
                a[TERMINAL_AT] = Value::Null;
                for i in RESULT_TO_EXECUTOR {
                    a[i] = Value::Null;
                }
                // A terminal operation's entry drops its plan; the journal has it.
                a[PLAN] = plan.clone();
                return;
            }
            for x in a {
                rewind(x, id, aid, plan);
            }
        }
        Value::Object(o) => {
            if o.get("id").and_then(Value::as_str) == Some(aid) && o.contains_key("uses") {
                o.insert("uses".into(), json!({}));
                o.insert("status".into(), json!("active"));
                return;
            }
            for (_, x) in o.iter_mut() {
                rewind(x, id, aid, plan);
            }
        }
        _ => {}
    }
}

/// Rewrites `.gaffer/snapshot.json`'s state with `edit` and recomputes `state_sha256`, as
/// anyone can.
fn forge_snapshot(env: &Env, edit: impl FnOnce(&mut Value)) {
    let path = env.root().join(".gaffer/snapshot.json");
    let mut snap: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    let before = snap["state"].clone();
    edit(&mut snap["state"]);
    assert_ne!(before, snap["state"], "the edit changed the state");
    let state = serde_json::to_vec(&snap["state"]).unwrap();
    snap["state_sha256"] = json!(gaffer::util::sha256_hex(&state));
    std::fs::write(&path, serde_json::to_vec(&snap).unwrap()).unwrap();
}

/// (Taken over from the review PoC.) After a one-use approval ran its `kv.set` and gaffer
/// wrote a snapshot, the agent edits the snapshot's state back to "operation approved,
/// approval active and unused" and recomputes `state_sha256`; the next serving process must
/// not run the plan a second time.
///
/// Before the anchor the forged snapshot is decoded as the state: the restarted server drives
/// the "approved" operation and `kv-exec.log` gets a second line (fails at "an approval of one
/// use ran its plan again from a forged snapshot": left 2, right 1).
#[test]
fn a_forged_snapshot_does_not_replay_a_used_one_use_approval() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (a, id, aid) = one_use_approval_ran_once(&env);
    drop(a);
    let (code, out, err) = env.cli(&["store", "compact"]);
    assert_eq!(code, 0, "gaffer store compact: {out}{err}");
    // Control: a restart on gaffer's own snapshot sees the operation done and runs nothing.
    {
        let mut b = env.agent("agent-1");
        let state = state_of(&mut b, &id);
        assert_eq!(
            state.as_deref(),
            Some("succeeded"),
            "control: genuine snapshot"
        );
    }
    assert_eq!(kv_log(&env), 1, "control: a restart runs nothing again");
    // The plan text, which a terminal operation's snapshot entry no longer holds.
    let (code, log, err) = env.cli(&["store", "log", "--kind", "operation.created"]);
    assert_eq!(code, 0, "{err}");
    let plan = log
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .find(|v| v["payload"]["operation"]["id"] == id.as_str())
        .expect("the operation.created record")["payload"]["operation"]["plan"]
        .clone();
    assert!(plan.is_string(), "the plan text: {plan}");
    forge_snapshot(&env, |state| rewind(state, &id, &aid, &plan));
    // The next serving process (an editor restart) recovers "approved" work.
    let mut b = env.agent("agent-1");
    watch(|| kv_log(&env) >= 2 || state_of(&mut b, &id).as_deref() == Some("succeeded"));
    let v = b.request("operations/get", json!({ "id": id }));
    let (code, text) = verify(&env);
    eprintln!("after the forged snapshot: {v}\nstore verify: exit {code}\n{text}");
    assert_eq!(
        kv_log(&env),
        1,
        "an approval of one use ran its plan again from a forged snapshot: {v}"
    );
}

/// (Taken over from the review PoC.) The operator trusted v1 (docs/ allowed), then v2 (docs/
/// denied); after gaffer wrote a snapshot, the agent removes v2's signature from the
/// snapshot's trust state, recomputes `state_sha256` and puts v1's bytes back on disk; a
/// docs/ write must not run.
///
/// Before the anchor the forged snapshot's trust set is believed, v1 is the latest trust and
/// matches the disk, and its allow rule writes the file (fails at "a write the trusted policy
/// (v2) denies ran under the replaced v1").
#[test]
fn a_forged_snapshot_does_not_drop_the_newest_trust_signature() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let v1 = trust_v1_then_v2(&env);
    let (code, out, err) = env.cli(&["store", "compact"]);
    assert_eq!(code, 0, "gaffer store compact: {out}{err}");
    forge_snapshot(&env, |state| {
        let shown = state["trust"].to_string();
        let sigs = state["trust"]["files"]["policy.yaml"]
            .as_array_mut()
            .unwrap_or_else(|| panic!("trust files: {shown}"));
        assert_eq!(sigs.len(), 2, "v1 and v2: {shown}");
        sigs.pop();
    });
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &v1).unwrap();
    let mut b = env.agent("agent-1");
    let st = b.call("gaffer/status", json!({}));
    eprintln!("trust after the forged snapshot: {}", st["trust"]);
    assert!(
        !write_lands(&env, &mut b, "docs/b.md", "after-forgery"),
        "a write the trusted policy (v2) denies ran under the replaced v1"
    );
}

// ---- the journal as the agent sees it: frames, flags, bodies ----

/// Length-word flags (`src/store/codec.rs`): first and last record of an append batch.
const FLAG_FIRST: u32 = 1 << 31;
const FLAG_LAST: u32 = 1 << 30;
/// Magic + format version + reserved.
const SEGMENT_HEADER: usize = 16;

/// One record as it stands in a segment: its offset, batch flags and body bytes.
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
}

/// The store's only journal segment (no test here compacts before editing the journal).
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
    /// Index of the only record `pred` picks.
    fn find(&self, what: &str, pred: impl Fn(&str, &Value) -> bool) -> usize {
        let hits: Vec<usize> = (0..self.recs.len())
            .filter(|&i| pred(&self.recs[i].kind(), &self.recs[i].payload()))
            .collect();
        assert_eq!(hits.len(), 1, "exactly one {what} record: {hits:?}");
        hits[0]
    }
}

/// A whole frame: length word with the batch flags, crc32 of word and body, body.
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

/// `body` with its `seq` and `prev` replaced; every other byte as it was.
fn relink(body: &[u8], seq: u64, prev: &str) -> Vec<u8> {
    let text = std::str::from_utf8(body).expect("UTF-8 body");
    let rest = text
        .strip_prefix("{\"seq\":")
        .expect("a body starts with its seq");
    let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
    let rest = rest[digits..]
        .strip_prefix(",\"prev\":\"")
        .expect("then its prev");
    let rest = &rest[64..];
    assert!(rest.starts_with('"'), "prev is 64 hex digits: {text}");
    format!("{{\"seq\":{seq},\"prev\":\"{prev}{rest}").into_bytes()
}

/// Writes `recs` as the whole segment, re-chained: seqs contiguous from the first record's,
/// each `prev` the hash of the body before it, every frame with its crc.
fn write_rechained(seg: &Segment, recs: &[Rec]) {
    let first = recs[0].json();
    let from = first["seq"].as_u64().unwrap();
    let mut prev = first["prev"].as_str().unwrap().to_string();
    let mut out = seg.bytes[..SEGMENT_HEADER].to_vec();
    for (seq, r) in (from..).zip(recs) {
        let body = relink(&r.body, seq, &prev);
        out.extend(frame(&body, r.first, r.last));
        prev = gaffer::util::sha256_hex(&body);
    }
    std::fs::write(&seg.path, out).unwrap();
}

/// `gaffer store verify` refuses the store and says it was rolled back.
fn assert_verify_reports_rollback(env: &Env) {
    let (code, text) = verify(env);
    assert_ne!(
        code, 0,
        "store verify accepts a rolled-back journal:\n{text}"
    );
    assert!(
        text.to_lowercase().contains("rolled back"),
        "store verify does not say the journal was rolled back:\n{text}"
    );
}

/// The version a `trust.signed` payload's signed text names.
fn trust_version(payload: &Value) -> Option<u64> {
    let text = payload["operator_signature"]["payload"].as_str()?;
    serde_json::from_str::<Value>(text).ok()?["version"].as_u64()
}

// ---- journals cut back or rewritten ----

/// After an approved `kv.set` ran once, the agent cuts the journal back to the batch boundary
/// before the claim (`approved -> executing` with the approval's reservation): the journal,
/// every link intact, ends with the operation `approved` and the approval unused. A restarted
/// server must not run it again, and `gaffer store verify` must say the store was rolled back.
///
/// Before the anchor the cut journal is a valid, shorter chain: recovery drives the approved
/// operation and `kv-exec.log` gets a second line (fails at "a journal cut back before the
/// claim ran the one-use approval again": left 2, right 1); `store verify` exits 0.
#[test]
fn a_journal_cut_back_before_the_claim_does_not_run_the_approval_again() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (a, id, _aid) = one_use_approval_ran_once(&env);
    drop(a);
    assert!(
        !env.root().join(".gaffer/snapshot.json").exists(),
        "the journal alone holds the state"
    );
    let (code, text) = verify(&env);
    assert_eq!(code, 0, "control: the genuine journal verifies:\n{text}");
    // The claim and the batch it was appended in.
    let seg = the_segment(env.root());
    let claim = seg.find("claim", |kind, p| {
        kind == "operation.transitioned" && p["id"] == id.as_str() && p["to"] == "executing"
    });
    let mut cut = claim;
    while !seg.recs[cut].first {
        cut -= 1;
    }
    assert!(seg.recs[cut - 1].last, "the cut falls between two batches");
    let kept = &seg.recs[..cut];
    let last_move = kept
        .iter()
        .rfind(|r| r.kind() == "operation.transitioned" && r.payload()["id"] == id.as_str())
        .expect("the operation's transitions")
        .payload();
    assert_eq!(last_move["to"], "approved", "the cut journal ends approved");
    let file = OpenOptions::new().write(true).open(&seg.path).unwrap();
    file.set_len(seg.recs[cut].at as u64).unwrap();
    drop(file);
    // The editor restarts.
    let mut b = env.agent("agent-1");
    watch(|| kv_log(&env) >= 2 || is_terminal(state_of(&mut b, &id).as_deref()));
    let v = b.request("operations/get", json!({ "id": id }));
    let (code, text) = verify(&env);
    eprintln!("after the cut: {v}\nstore verify: exit {code}\n{text}");
    assert_eq!(
        kv_log(&env),
        1,
        "a journal cut back before the claim ran the one-use approval again: {v}"
    );
    assert_verify_reports_rollback(&env);
}

/// The operator trusted v1 (docs/ allowed), then v2 (docs/ denied). The agent removes v2's
/// `trust.signed` record for `policy.yaml` from the middle of the journal, renumbers and
/// re-chains every later record (each `prev` the sha256 of the body before it, each frame
/// with a valid crc and its batch flags kept whole), and puts v1's bytes back on disk. A docs/
/// write must not run, and `gaffer store verify` must say the store was rolled back.
///
/// Before the anchor the rewritten journal is a valid chain whose latest policy trust is v1,
/// which matches the disk: the write lands (fails at "a write the trusted policy (v2) denies
/// ran after v2's record was cut out of the journal"); `store verify` exits 0.
#[test]
fn a_journal_rewritten_without_the_newest_trust_record_does_not_restore_the_old_policy() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let v1 = trust_v1_then_v2(&env);
    let (code, text) = verify(&env);
    assert_eq!(code, 0, "control: the genuine journal verifies:\n{text}");
    let seg = the_segment(env.root());
    let v2 = seg.find("policy v2 trust", |kind, p| {
        kind == "trust.signed" && p["file"] == "policy.yaml" && trust_version(p) == Some(2)
    });
    assert!(
        v2 + 1 < seg.recs.len(),
        "records follow v2's: a middle record"
    );
    let mut recs = seg.recs.clone();
    let gone = recs.remove(v2);
    // Its batch stays whole: its neighbours take over the flags it had.
    if gone.first && !gone.last {
        recs[v2].first = true;
    }
    if gone.last && !gone.first {
        recs[v2 - 1].last = true;
    }
    write_rechained(&seg, &recs);
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &v1).unwrap();
    let after = the_segment(env.root());
    assert_eq!(after.recs.len(), seg.recs.len() - 1, "one record fewer");
    let mut b = env.agent("agent-1");
    let st = b.call("gaffer/status", json!({}));
    eprintln!("after the rewrite: chain and trust {}", st);
    let landed = write_lands(&env, &mut b, "docs/b.md", "after-rewrite");
    let (code, text) = verify(&env);
    eprintln!("store verify: exit {code}\n{text}");
    assert!(
        !landed,
        "a write the trusted policy (v2) denies ran after v2's record was cut out of the journal"
    );
    assert_verify_reports_rollback(&env);
}

// ---- records appended after the head ----

impl Rec {
    /// The payload's bytes exactly as written: the body is
    /// `{"seq":…,"prev":"…","time_ms":…,"kind":"…","payload":P}`.
    fn raw_payload(&self) -> Vec<u8> {
        let text = std::str::from_utf8(&self.body).expect("UTF-8 body");
        let kind_at = text.find(",\"kind\":\"").expect("a kind");
        let at = kind_at + text[kind_at..].find(",\"payload\":").expect("a payload");
        text.as_bytes()[at + ",\"payload\":".len()..text.len() - 1].to_vec()
    }
}

impl Segment {
    /// The hash of the last record (`store::chain::record_hash`: sha256 of its body bytes).
    fn head(&self) -> (u64, String) {
        let last = self.recs.last().expect("a record");
        let seq = last.json()["seq"].as_u64().expect("a seq");
        (seq, gaffer::util::sha256_hex(&last.body))
    }
}

/// Holds the store's writer lock (`.gaffer/lock`), as gaffer's own writers do, so an append
/// never interleaves with a serving process's commit.
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

/// The records an agent appends to bring a used one-use approval back: an `operation.pruned`
/// that drops every terminal operation (and its approval), then byte-identical copies of the
/// operation's genuine `operation.created`, `approval.decided` and `pending -> approved`
/// records. (Without the last one the operation stays `pending`: nothing drives it.)
fn forge_prune_and_recreate(env: &Env, id: &str, aid: &str) {
    let seg = the_segment(env.root());
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
        env.root(),
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

/// After a one-use approved `kv.set` ran, the agent appends (chained, real framing) a pruning
/// record far in the future, then the operation's genuine creation, decision and approval
/// again: the serving process that ran it folds them and must not run the plan a second time.
///
/// Before the anchor the fold forgets the operation and its used approval, re-creates both as
/// new, and the running server drives the "approved" copy: `kv-exec.log` gets a second line
/// (fails at "a forged prune and re-creation ran the one-use approval again in the serving
/// process": left 2, right 1).
#[test]
fn a_forged_prune_and_recreate_does_not_rerun_a_used_approval_in_a_running_server() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (mut a, id, aid) = one_use_approval_ran_once(&env);
    forge_prune_and_recreate(&env, &id, &aid);
    watch(|| {
        kv_log(&env) >= 2
            || matches!(
                state_of(&mut a, &id).as_deref(),
                Some("failed" | "denied" | "expired" | "canceled")
            )
    });
    let v = a.request("operations/get", json!({ "id": id }));
    assert_eq!(
        kv_log(&env),
        1,
        "a forged prune and re-creation ran the one-use approval again in the serving process: {v}"
    );
}

/// The same records appended while no gaffer runs; a freshly started server folds them at
/// startup and must not run the plan a second time.
///
/// Before the anchor startup recovery drives the re-created "approved" operation:
/// `kv-exec.log` gets a second line (fails at "a forged prune and re-creation ran the one-use
/// approval again after a restart": left 2, right 1).
#[test]
fn a_forged_prune_and_recreate_does_not_rerun_a_used_approval_after_a_restart() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let (a, id, aid) = one_use_approval_ran_once(&env);
    drop(a);
    // Control: a restart without the forged records runs nothing again.
    {
        let mut b = env.agent("agent-1");
        assert_eq!(state_of(&mut b, &id).as_deref(), Some("succeeded"));
    }
    assert_eq!(kv_log(&env), 1, "control: a restart runs nothing again");
    forge_prune_and_recreate(&env, &id, &aid);
    let mut b = env.agent("agent-1");
    watch(|| {
        kv_log(&env) >= 2
            || matches!(
                state_of(&mut b, &id).as_deref(),
                Some("failed" | "denied" | "expired" | "canceled")
            )
    });
    let v = b.request("operations/get", json!({ "id": id }));
    assert_eq!(
        kv_log(&env),
        1,
        "a forged prune and re-creation ran the one-use approval again after a restart: {v}"
    );
}

/// The operator trusted v1 (docs/ allowed), then v2 (docs/ denied). The agent appends copies
/// of v1's genuine `trust.signed` record (chained, real framing) and puts v1's bytes back on
/// disk. One copy changes nothing (the control: v2 is still the latest version); twenty push
/// v2's signature out of the signatures gaffer keeps per file (16), and a docs/ write must
/// still not run.
///
/// Before the anchor only v1's copies are left, v1 is the latest trust and matches the disk:
/// the write lands (fails at "a write the trusted policy (v2) denies ran after a flood of v1
/// trust records").
#[test]
fn a_flood_of_old_trust_records_does_not_restore_the_old_policy() {
    anchor_outside_the_workspace();
    let env = Env::new(Some(ALLOW_DOCS));
    let v1 = trust_v1_then_v2(&env);
    let seg = the_segment(env.root());
    let first = seg
        .recs
        .iter()
        .position(|r| r.kind() == "trust.signed" && r.payload()["file"] == "policy.yaml")
        .expect("v1's trust record");
    let v1_record = seg.recs[first].raw_payload();
    std::fs::write(env.root().join(".gaffer/policy.yaml"), &v1).unwrap();
    // Control: one replayed copy is refused (an older version than the latest).
    append_chained(env.root(), &[("trust.signed", v1_record.clone())]);
    {
        let mut b = env.agent("agent-1");
        assert!(
            !write_lands(&env, &mut b, "docs/one-copy.md", "one-copy"),
            "control: one replayed v1 record does not restore v1"
        );
    }
    let flood: Vec<(&str, Vec<u8>)> = (0..19)
        .map(|_| ("trust.signed", v1_record.clone()))
        .collect();
    append_chained(env.root(), &flood);
    let mut b = env.agent("agent-1");
    let st = b.call("gaffer/status", json!({}));
    eprintln!("trust after the flood: {}", st["trust"]);
    assert!(
        !write_lands(&env, &mut b, "docs/flood.md", "flood"),
        "a write the trusted policy (v2) denies ran after a flood of v1 trust records"
    );
}
