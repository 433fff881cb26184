//! The agent's tools for attacks on the anchor: an agent that can write every file of the
//! workspace, `.gaffer/` included, and nothing outside it. It edits the journal directly with
//! real framing (batch flags, crc32) and a recomputed hash chain, never through gaffer's own
//! writer (`append_as_agent`), whose commits advance the anchor the agent cannot reach. Also
//! what the attacks watch: the operation's state, `kv-exec.log`, files under `docs/`.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::Server;
use super::gate::{Env, lines, ok, submit, wait_state};
use serde_json::{Value, json};

/// Every process the test binary starts (servers, CLI) keeps its anchor in one directory
/// outside every workspace, as an operator's `$XDG_STATE_HOME/gaffer` is.
pub fn anchor_outside_the_workspace() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!(
            "{}-{}",
            env!("CARGO_CRATE_NAME"),
            std::process::id()
        ));
        std::fs::create_dir_all(&dir).expect("the anchor directory");
        // SAFETY: every test calls this before it starts a process or reads the environment,
        // and `Once` holds the others back until the variable is set.
        unsafe { std::env::set_var("GAFFER_STATE_DIR", &dir) };
    });
}

// ---- watching for what must not happen ----

/// How long a test watches for a side effect that must not happen, when nothing tells it
/// earlier that the server is done with the operation. Without the anchor the side effect
/// shows within a second or two; this is for loaded CI machines.
pub const WATCH: Duration = Duration::from_secs(15);

/// Polls until `done` holds or `WATCH` has passed; returns whether it held.
pub fn watch(mut done: impl FnMut() -> bool) -> bool {
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

/// The operation's state as `s` sees it (`None` while the server refuses to say).
pub fn state_of(s: &mut Server, id: &str) -> Option<String> {
    let r = s.request("operations/get", json!({ "id": id }));
    r["result"]["state"].as_str().map(str::to_string)
}

pub fn is_terminal(state: Option<&str>) -> bool {
    matches!(
        state,
        Some("succeeded" | "failed" | "denied" | "expired" | "canceled")
    )
}

/// Watches the operation `id` that a forged prune and re-creation brought back `approved`
/// until it ran again (a second line in `kv-exec.log`) or ended refused, or `WATCH` passed.
pub fn watch_the_recreated(root: &Path, s: &mut Server, id: &str) {
    watch(|| {
        kv_log(root) >= 2
            || matches!(
                state_of(s, id).as_deref(),
                Some("failed" | "denied" | "expired" | "canceled")
            )
    });
}

/// How many times the kv provider ran a `kv.set` in the workspace at `root`.
pub fn kv_log(root: &Path) -> usize {
    lines(&root.join("kv-exec.log"))
}

/// `gaffer store verify`: (exit code, stdout and stderr).
pub fn verify(env: &Env) -> (i32, String) {
    let (code, out, err) = env.cli(&["store", "verify"]);
    (code, format!("{out}{err}"))
}

/// Submits a write of `path` and waits until it is written or its operation ended (or `WATCH`
/// passed); returns whether the file was written.
pub fn write_lands(env: &Env, s: &mut Server, path: &str, key: &str) -> bool {
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

// ---- what the operator did before the attack ----

/// An operator approval of exactly one `kv.set` plan (one use), executed once by a serving
/// agent process: (the agent still serving, operation id, approval id).
pub fn one_use_approval_ran_once(env: &Env) -> (Server, String, String) {
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
    let (code, out, err) = env.approve_reviewed(&id, &[]);
    assert_eq!(code, 0, "gaffer approve: {out}{err}");
    let v = wait_state(&mut a, &id, &["succeeded", "failed"]);
    assert_eq!(v["state"], "succeeded", "{v}");
    let aid = v["approval_id"].as_str().expect("an approval").to_string();
    assert_eq!(kv_log(env.root()), 1, "the approved plan ran once");
    (a, id, aid)
}

/// The v1 policy (`ALLOW_DOCS`) with its docs rule turned to deny: what the operator trusts
/// as v2.
pub fn deny_docs(v1: &[u8]) -> String {
    let v2 = String::from_utf8(v1.to_vec()).unwrap().replacen(
        "  - id: docs\n    effect: allow",
        "  - id: docs\n    effect: deny",
        1,
    );
    assert_ne!(v2.as_bytes(), v1, "the docs rule was found");
    v2
}

/// Under v1 (`ALLOW_DOCS`, as `Env::new` trusted it) a docs write lands. Returns v1's bytes
/// and the agent connection, still serving.
pub fn a_docs_write_under_v1(env: &Env) -> (Vec<u8>, Server) {
    let v1 = std::fs::read(env.root().join(".gaffer/policy.yaml")).unwrap();
    let mut a = env.agent("agent-1");
    assert!(
        write_lands(env, &mut a, "docs/v1.md", "under-v1"),
        "control: the trusted v1 allows docs/ writes"
    );
    (v1, a)
}

/// The operator turns v1's docs rule to deny and trusts the result as v2 (`gaffer trust`).
pub fn trust_v2(env: &Env, v1: &[u8]) {
    std::fs::write(env.root().join(".gaffer/policy.yaml"), deny_docs(v1)).unwrap();
    let (code, out, err) = env.trust_reviewed();
    assert_eq!(code, 0, "gaffer trust (v2): {out}{err}");
}

/// A docs write lands under v1; the operator then trusts v2 (docs/ denied) and a docs write
/// by the same agent connection does not land. Returns v1's bytes; the connection is closed.
pub fn trust_v1_then_v2(env: &Env) -> Vec<u8> {
    let (v1, mut a) = a_docs_write_under_v1(env);
    trust_v2(env, &v1);
    assert!(
        !write_lands(env, &mut a, "docs/v2.md", "under-v2"),
        "control: the trusted v2 denies docs/ writes"
    );
    v1
}

/// The version a `trust.signed` payload's signed text names.
pub fn trust_version(payload: &Value) -> Option<u64> {
    let text = payload["operator_signature"]["payload"].as_str()?;
    serde_json::from_str::<Value>(text).ok()?["version"].as_u64()
}

// ---- the journal as the agent sees it: frames, flags, bodies ----

/// Length-word flags (`src/store/codec.rs`): first and last record of an append batch.
pub const FLAG_FIRST: u32 = 1 << 31;
pub const FLAG_LAST: u32 = 1 << 30;
/// Magic + format version + reserved.
pub const SEGMENT_HEADER: usize = 16;

/// One record as it stands in a segment: its offset, batch flags and body bytes.
#[derive(Clone, Debug)]
pub struct Rec {
    pub at: usize,
    pub first: bool,
    pub last: bool,
    pub body: Vec<u8>,
}

impl Rec {
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body).expect("a record body is JSON")
    }

    pub fn kind(&self) -> String {
        self.json()["kind"].as_str().unwrap_or_default().to_string()
    }

    pub fn payload(&self) -> Value {
        self.json()["payload"].clone()
    }

    /// The payload's bytes exactly as written: the body is
    /// `{"seq":…,"prev":"…","time_ms":…,"kind":"…","payload":P}`.
    pub fn raw_payload(&self) -> Vec<u8> {
        let text = std::str::from_utf8(&self.body).expect("UTF-8 body");
        let kind_at = text.find(",\"kind\":\"").expect("a kind");
        let at = kind_at + text[kind_at..].find(",\"payload\":").expect("a payload");
        text.as_bytes()[at + ",\"payload\":".len()..text.len() - 1].to_vec()
    }

    /// Length word, crc, body.
    pub fn frame_len(&self) -> usize {
        8 + self.body.len()
    }
}

/// The store's only journal segment (no attack compacts before editing the journal).
pub struct Segment {
    pub path: PathBuf,
    pub bytes: Vec<u8>,
    pub recs: Vec<Rec>,
}

/// The journal's segment files, oldest first.
fn segment_paths(root: &Path) -> Vec<PathBuf> {
    let dir = root.join(".gaffer/journal");
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("a journal")
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
        .collect();
    names.sort();
    names
}

pub fn the_segment(root: &Path) -> Segment {
    let mut names = segment_paths(root);
    assert_eq!(names.len(), 1, "one segment to edit: {names:?}");
    let path = names.remove(0);
    let bytes = std::fs::read(&path).unwrap();
    let recs = super::frames(&bytes)
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
    pub fn find(&self, what: &str, pred: impl Fn(&str, &Value) -> bool) -> usize {
        let hits: Vec<usize> = (0..self.recs.len())
            .filter(|&i| pred(&self.recs[i].kind(), &self.recs[i].payload()))
            .collect();
        assert_eq!(hits.len(), 1, "exactly one {what} record: {hits:?}");
        hits[0]
    }

    /// Index of the first record of the batch that holds record `i`.
    pub fn batch_start(&self, i: usize) -> usize {
        let mut at = i;
        while !self.recs[at].first {
            at -= 1;
        }
        at
    }

    /// Cuts the segment back to just before record `i`: the journal ends with record `i - 1`.
    pub fn cut_before(&self, i: usize) {
        let file = OpenOptions::new().write(true).open(&self.path).unwrap();
        file.set_len(self.recs[i].at as u64).unwrap();
    }

    /// The last record's seq and hash (`store::chain::record_hash`: sha256 of its body bytes).
    pub fn head(&self) -> (u64, String) {
        let last = self.recs.last().expect("a record");
        let seq = last.json()["seq"].as_u64().expect("a seq");
        (seq, gaffer::util::sha256_hex(&last.body))
    }
}

/// A whole frame: length word with the batch flags, crc32 of word and body, body.
pub fn frame(body: &[u8], first: bool, last: bool) -> Vec<u8> {
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
pub fn relink(body: &[u8], seq: u64, prev: &str) -> Vec<u8> {
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
pub fn write_rechained(seg: &Segment, recs: &[Rec]) {
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

/// Replaces record `i`'s kind and payload in place: same seq, same `prev`, same time, same
/// batch flags, a valid crc. Every other byte of the segment stays as it was, so every later
/// record (the anchored head among them) hashes as before; only the link from record `i` to
/// the next one no longer holds.
pub fn replace_in_place(seg: &Segment, i: usize, kind: &str, payload: &[u8]) {
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

/// Holds the store's writer lock (`.gaffer/lock`), as gaffer's own writers do, so an append
/// never interleaves with a serving process's commit.
pub fn writer_lock(root: &Path) -> File {
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
pub fn append_chained(root: &Path, records: &[(&str, Vec<u8>)]) {
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
    // Right after the last record, as gaffer's writer does (the zeros after it are space
    // allocated ahead, not written).
    let end = seg.recs.last().map_or(16, |r| r.at + r.frame_len());
    let f = OpenOptions::new().write(true).open(&seg.path).unwrap();
    f.write_all_at(&out, end as u64).unwrap();
    f.sync_data().unwrap();
    lock.unlock().unwrap();
}

/// The records an agent appends to the journal at `root` to bring a used approval back once
/// gaffer has pruned the finished operations (see [`genuinely_pruned_by`]; a prune the agent
/// writes itself is skipped): byte-identical copies of the operation's genuine
/// `operation.created`, `approval.decided` and `pending -> approved` records. (Without the
/// last one the operation stays `pending`: nothing drives it.)
pub fn recreate_after_the_prune(root: &Path, id: &str, aid: &str) {
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
    append_chained(
        root,
        &[
            ("operation.created", seg.recs[created].raw_payload()),
            ("approval.decided", seg.recs[decided].raw_payload()),
            ("operation.transitioned", seg.recs[approved].raw_payload()),
        ],
    );
}

/// gaffer prunes the finished operations itself, then the agent brings the used approval
/// back ([`recreate_after_the_prune`]): the journal as an agent that waited for retention
/// would leave it. `start` starts a server on `root` with the extra environment it is given.
pub fn prune_and_recreate_used(
    root: &Path,
    start: impl FnOnce(&[(&str, &str)]) -> Server,
    id: &str,
    aid: &str,
) {
    genuinely_pruned_by(root, start);
    recreate_after_the_prune(root, id, aid);
}

/// The payloads of the `operation.pruned` records in every journal segment, in order (a
/// snapshot starts a new segment).
pub fn prunes(root: &Path) -> Vec<Value> {
    let mut out = Vec::new();
    for path in segment_paths(root) {
        let bytes = std::fs::read(&path).unwrap();
        for (at, len) in super::frames(&bytes) {
            let body: Value = serde_json::from_slice(&bytes[at + 8..at + len]).unwrap();
            if body["kind"] == "operation.pruned" {
                out.push(body["payload"].clone());
            }
        }
    }
    out
}

/// Has gaffer prune the workspace's finished operations itself: a server `start`ed with no
/// retention records its sealed `operation.pruned` as it starts. Returns that record's
/// payload once it is there.
pub fn genuinely_pruned_by(root: &Path, start: impl FnOnce(&[(&str, &str)]) -> Server) -> Value {
    let before = prunes(root).len();
    let server = start(&[("GAFFER_OPERATIONS_RETENTION_HOURS", "0")]);
    let mut got = None;
    assert!(
        watch(|| {
            got = prunes(root).get(before).cloned();
            got.is_some()
        }),
        "gaffer recorded no prune"
    );
    drop(server);
    got.unwrap()
}

/// [`genuinely_pruned_by`] a server `client` connects to.
pub fn genuinely_pruned(env: &super::gate::Env, client: &str) -> Value {
    genuinely_pruned_by(env.root(), |extra| env.agent_env(client, extra))
}

/// The credential id inside a client token (its first part is the signed payload).
pub fn credential_id(token: &str) -> String {
    let (payload_b64, _) = token.split_once('.').expect("a token");
    let cred: Value =
        serde_json::from_slice(&gaffer::util::base64url_decode(payload_b64).expect("base64url"))
            .expect("a credential");
    cred["credential_id"].as_str().expect("an id").to_string()
}

/// Appends `n` forged `client.revoked` records for `credential_id` (signed by nobody): as
/// many as gaffer keeps per credential floods it.
pub fn flood_client_revocations(root: &Path, credential_id: &str, n: usize) {
    let forged = json!({
        "credential_id": credential_id,
        "operator_signature": {"head": {"seq": 1, "hash": "0".repeat(64)}, "payload": "{}", "signature": "AAAA"}
    })
    .to_string()
    .into_bytes();
    let flood: Vec<(&str, Vec<u8>)> = (0..n).map(|_| ("client.revoked", forged.clone())).collect();
    append_chained(root, &flood);
}
