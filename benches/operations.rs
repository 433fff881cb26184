//! Operations throughput and recovery, printed as plain numbers.
//!
//! Every ratio is against the disk's limit measured in the same run and the same kind of
//! directory: `raw` is a plain file's write(208 B) + fdatasync rate, taken just before each
//! case (the disk is shared, so the rate drifts). `syncs/op` counts the workspace's
//! fdatasyncs (one per appended batch) and `CPU/op` the whole process's CPU time, with the
//! part spent in user space beside it (the rest is the kernel's, the fdatasyncs first).
//!
//! - raw write+fdatasync, and a workspace commit (append + fdatasync) from one task;
//! - durable submits/s from one client (allow rule, no-op provider; execution runs behind);
//! - submit -> succeeded/s with 1 and 8 concurrent clients;
//! - approval round trip across two gaffer processes (agent submits, operator approves);
//! - growth: the same per-operation cost with 1k and 100k operations held (pending awaiting
//!   approval, and terminal), `operations/list` (limit 1 and 100) at each size, and what one
//!   snapshot of that state costs (written before the submits, so it is printed, not mixed in);
//!   `--growth-only N` runs just these rows at N held (`--success-only`: the submit ->
//!   succeeded rows alone, `--clients N` with one client count; `--approval-only`: the
//!   approval round trip alone);
//! - recovery: opening a workspace whose journal holds 100,000 operations, and a serving
//!   process on it: time to its first reply, to its first reply that needs the operations, and
//!   its RSS holding them (`--recovery-only N`);
//! - Ed25519 cost per decision: signing a real `approvals/prepare` payload and opening it as
//!   the serving process does, in µs, beside the raw commit cost measured in the same run.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use gaffer::operations::adapter::{Catalog, Registry};
use gaffer::operations::engine::{OperationRuntime, RuntimeConfig};
use gaffer::operations::policy::Classification;
use gaffer::workspace::{NewRecord, Workspace};
use serde_json::{Value, json};

mod common;

use common::noop::{
    Noop, bench_operator_key, ended, input, noop_desc, runtime, workspace_with_allow,
};

fn rate(n: usize, d: Duration) -> f64 {
    n as f64 / d.as_secs_f64()
}

async fn raw_appends(n: usize) -> f64 {
    let dir = tempfile::tempdir().expect("tempdir");
    let ws = Workspace::open(dir.path()).expect("open");
    let t = Instant::now();
    for i in 0..n {
        ws.commit(move |_s: &gaffer::workspace::State| {
            Ok::<_, String>((
                vec![NewRecord::new("gaffer.bench", json!({"i": i})).expect("rec")],
                (),
            ))
        })
        .await
        .map_err(|_| "commit")
        .expect("commit");
    }
    rate(n, t.elapsed())
}

async fn submits(n: usize) -> f64 {
    let dir = workspace_with_allow();
    let ws = Workspace::open(dir.path()).expect("open");
    let rt = runtime(&ws);
    let t = Instant::now();
    for i in 0..n {
        rt.submit("c", input(&format!("k{i}")))
            .await
            .expect("submit");
    }
    let r = rate(n, t.elapsed());
    tokio::time::sleep(Duration::from_millis(200)).await;
    r
}

/// One client with `depth` submissions in flight (as a JSON-RPC client pipelining requests).
async fn pipelined_submits(n: usize, depth: usize) -> f64 {
    let dir = workspace_with_allow();
    let ws = Workspace::open(dir.path()).expect("open");
    let rt = runtime(&ws);
    let t = Instant::now();
    let mut next = 0;
    let mut inflight = tokio::task::JoinSet::new();
    while next < n || !inflight.is_empty() {
        while next < n && inflight.len() < depth {
            let rt = Arc::clone(&rt);
            let key = format!("k{next}");
            inflight.spawn(async move { rt.submit("c", input(&key)).await.map(|_| ()) });
            next += 1;
        }
        if let Some(r) = inflight.join_next().await {
            r.expect("join").expect("submit");
        }
    }
    let r = rate(n, t.elapsed());
    tokio::time::sleep(Duration::from_millis(200)).await;
    r
}

/// What a run of operations cost: rate, fdatasyncs and process CPU per operation.
struct Cost {
    rate: f64,
    syncs_per_op: f64,
    cpu_us_per_op: f64,
    /// The part of `cpu_us_per_op` spent in user space (the rest is the kernel's, the
    /// fdatasyncs first among it).
    user_us_per_op: f64,
    /// Context switches (voluntary and not) of the whole process per operation.
    switches_per_op: f64,
    /// Minor page faults of the whole process per operation.
    faults_per_op: f64,
}

/// This whole process's CPU time (user and system, µs), context switches and page faults so
/// far (all zero where `getrusage` fails).
#[derive(Clone, Copy, Default)]
struct Usage {
    user_us: f64,
    system_us: f64,
    switches: f64,
    /// Minor page faults: memory touched for the first time.
    faults: f64,
}

fn usage() -> Usage {
    // SAFETY: getrusage only writes the struct we pass.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return Usage::default();
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 * 1e6 + t.tv_usec as f64;
    Usage {
        user_us: tv(u.ru_utime),
        system_us: tv(u.ru_stime),
        switches: (u.ru_nvcsw + u.ru_nivcsw) as f64,
        faults: u.ru_minflt as f64,
    }
}

impl Usage {
    fn cpu_us(&self) -> f64 {
        self.user_us + self.system_us
    }
}

/// User + system CPU time of this whole process, in µs.
fn process_cpu_us() -> f64 {
    usage().cpu_us()
}

/// Measures a run of operations on `ws`, from its start to [`Meter::cost`].
struct Meter {
    syncs: u64,
    usage: Usage,
    t: Instant,
}

impl Meter {
    fn start(ws: &Workspace) -> Meter {
        Meter {
            syncs: ws.syncs(),
            usage: usage(),
            t: Instant::now(),
        }
    }

    fn cost(&self, ws: &Workspace, n: usize) -> Cost {
        let elapsed = self.t.elapsed();
        let now = usage();
        let per_op = |v: f64| v / n as f64;
        Cost {
            rate: rate(n, elapsed),
            syncs_per_op: per_op((ws.syncs() - self.syncs) as f64),
            cpu_us_per_op: per_op(now.cpu_us() - self.usage.cpu_us()),
            user_us_per_op: per_op(now.user_us - self.usage.user_us),
            switches_per_op: per_op(now.switches - self.usage.switches),
            faults_per_op: per_op(now.faults - self.usage.faults),
        }
    }
}

/// The disk's limit: `n` write(208 B) + fdatasync on a plain file in a fresh temp dir.
fn raw_fdatasync(n: usize) -> f64 {
    raw_fdatasync_cost(n).0
}

/// The disk's limit for what the journal does since it writes zeros ahead: `n` write(208 B) +
/// fdatasync over zeros written (and synced) beforehand, so no write changes the file's size
/// or its extents. The ratios the targets name stay against [`raw_fdatasync`] (plain appends).
fn raw_allocated_fdatasync(n: usize) -> f64 {
    raw_allocated_fdatasync_cost(n).0
}

/// [`raw_allocated_fdatasync`]'s rate, and the process CPU one such write+fdatasync costs, in
/// µs: the kind of fdatasync a commit makes (over zeros written ahead), so what an operation
/// costs beyond its count of them is gaffer's work (its records are larger than 208 B, and
/// each commit also takes the store lock and advances the anchor).
fn raw_allocated_fdatasync_cost(n: usize) -> (f64, f64) {
    use std::os::unix::fs::FileExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let f = std::fs::File::create(dir.path().join("raw.log")).expect("raw file");
    // The journal's own calls, on a plain file.
    let _ = gaffer::store::allocate(&f, 0, (n * 208) as u64);
    gaffer::store::write_zeros(&f, 0, (n * 208) as u64).expect("zeros");
    f.sync_data().expect("fdatasync");
    let buf = [b'r'; 208];
    let cpu = process_cpu_us();
    let t = Instant::now();
    for i in 0..n {
        f.write_all_at(&buf, (i * 208) as u64).expect("write");
        f.sync_data().expect("fdatasync");
    }
    (rate(n, t.elapsed()), (process_cpu_us() - cpu) / n as f64)
}

/// The other way to make a write durable, beside write + fdatasync: `n` 4 KiB writes through
/// `O_DIRECT | O_DSYNC` (no page cache, the device flush inside the write) over zeros written
/// ahead, each rewriting the block a 208 B append falls in, as a direct-I/O journal would.
/// Returns the rate and the process CPU per write in µs, or `None` where the file system
/// refuses direct I/O (tmpfs).
fn raw_direct_dsync_cost(n: usize) -> Option<(f64, f64)> {
    use std::alloc::{Layout, alloc_zeroed, dealloc};
    use std::os::unix::fs::{FileExt, OpenOptionsExt};
    const BLOCK: usize = 4096;
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("raw.log");
    let size = (n * 208).div_ceil(BLOCK) * BLOCK + BLOCK;
    let f = std::fs::File::create(&path).expect("raw file");
    gaffer::store::write_zeros(&f, 0, size as u64).expect("zeros");
    f.sync_all().expect("fsync");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_DIRECT | libc::O_DSYNC)
        .open(&path)
        .ok()?;
    let layout = Layout::from_size_align(BLOCK, BLOCK).expect("layout");
    // SAFETY: the layout is non-zero; the block is freed below and only read as bytes.
    let ptr = unsafe { alloc_zeroed(layout) };
    if ptr.is_null() {
        return None;
    }
    // SAFETY: `ptr` is a live, zeroed allocation of BLOCK bytes.
    let block = unsafe { std::slice::from_raw_parts_mut(ptr, BLOCK) };
    block.fill(b'r');
    let cpu = process_cpu_us();
    let t = Instant::now();
    let mut ok = true;
    for i in 0..n {
        let at = (i * 208 / BLOCK * BLOCK) as u64;
        if f.write_all_at(block, at).is_err() {
            ok = false;
            break;
        }
    }
    let cost = (rate(n, t.elapsed()), (process_cpu_us() - cpu) / n as f64);
    // SAFETY: allocated above with this layout.
    unsafe { dealloc(ptr, layout) };
    ok.then_some(cost)
}

/// [`raw_fdatasync`]'s rate, and the process CPU (mostly kernel) one write+fdatasync costs,
/// in µs: the floor under a commit's CPU.
fn raw_fdatasync_cost(n: usize) -> (f64, f64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut f = std::fs::File::create(dir.path().join("raw.log")).expect("raw file");
    let buf = [b'r'; 208];
    let cpu = process_cpu_us();
    let t = Instant::now();
    for _ in 0..n {
        f.write_all(&buf).expect("write");
        f.sync_data().expect("fdatasync");
    }
    (rate(n, t.elapsed()), (process_cpu_us() - cpu) / n as f64)
}

async fn to_success(clients: usize, per_client: usize) -> Cost {
    let dir = workspace_with_allow();
    let ws = Workspace::open(dir.path()).expect("open");
    let rt = runtime(&ws);
    run_to_success(&ws, &rt, clients, per_client, "").await
}

/// `clients` tasks, each submitting `per_client` operations and waiting for each to succeed.
async fn run_to_success(
    ws: &Workspace,
    rt: &Arc<OperationRuntime>,
    clients: usize,
    per_client: usize,
    tag: &str,
) -> Cost {
    let meter = Meter::start(ws);
    let mut tasks = vec![];
    for c in 0..clients {
        let rt = Arc::clone(rt);
        let tag = tag.to_string();
        tasks.push(tokio::spawn(async move {
            let client = format!("client-{c}");
            for i in 0..per_client {
                let (v, _) = rt
                    .submit(&client, input(&format!("k{tag}{i}")))
                    .await
                    .expect("submit");
                let end = ended(&rt, &client, v).await;
                assert_eq!(end.state.as_str(), "succeeded");
            }
        }));
    }
    for t in tasks {
        t.await.expect("task");
    }
    meter.cost(ws, clients * per_client)
}

/// Held operation `i` of batch `b`: pending with its approval awaiting a decision, or
/// terminal (denied); each carries seals as long as an accepted request's.
fn held_op(
    b: usize,
    i: usize,
    pending: bool,
    now: u64,
) -> (
    gaffer::operations::state::Operation,
    Option<gaffer::operations::state::Approval>,
) {
    use gaffer::operations::adapter::Presentation;
    use gaffer::operations::lifecycle::OpState;
    use gaffer::operations::policy::GrantMode;
    use gaffer::operations::state::{Approval, ApprovalStatus, OpFailure, Operation};
    let id = format!("op_held_{b}_{i}");
    let ap = format!("ap_held_{b}_{i}");
    let op = Operation {
        id: id.clone(),
        client_id: "held".into(),
        idempotency_key: id.clone(),
        operation: "bench.noop".into(),
        provider: "bench".into(),
        submitted: "{}".into(),
        reason: "r".into(),
        target: json!({}).into(),
        arguments: json!({}).into(),
        state: if pending {
            OpState::Pending
        } else {
            OpState::Denied
        },
        revision: 1,
        approval_id: pending.then(|| ap.clone()),
        created_at_ms: now,
        updated_at_ms: now,
        terminal_at_ms: (!pending).then_some(now),
        presentation: Presentation {
            title: "t".into(),
            summary: String::new(),
        },
        plan_digest: None,
        plan: None,
        result: None,
        upstream_status: None,
        error: (!pending).then(|| OpFailure::new("operation_policy_denied", "no")),
        executor: None,
        request_seal: Some(format!("{b:032x}{i:032x}")),
        step_seal: (!pending).then(|| format!("{i:032x}{b:032x}")),
        created_seq: 0,
    };
    let approval = pending.then(|| Approval {
        id: ap,
        operation_id: id,
        client_id: "held".into(),
        operation: "bench.noop".into(),
        plan_digest: "0".repeat(64),
        classification: Classification {
            target_kind: "noop".into(),
            ..Default::default()
        },
        mode: GrantMode::Execution,
        status: ApprovalStatus::Pending,
        revision: 1,
        created_at_ms: now,
        pending_expires_at_ms: now + 3_600_000,
        requested_duration_seconds: 600,
        requested_max_uses: 1,
        decision: None,
        uses: Default::default(),
        decision_keys: Default::default(),
    });
    (op, approval)
}

/// `n` operations written straight into the journal (1,000 per commit), as [`held_op`].
async fn hold(ws: &Workspace, n: usize, pending: bool) {
    use gaffer::operations::state::Created;
    let per = 1000;
    for b in 0..n.div_ceil(per) {
        ws.commit(move |_s: &gaffer::workspace::State| {
            let now = gaffer::util::now_ms();
            let recs = (0..per.min(n - b * per))
                .map(|i| {
                    let (operation, approval) = held_op(b, i, pending, now);
                    NewRecord::new(
                        "operation.created",
                        Created {
                            operation,
                            approval,
                        },
                    )
                    .expect("rec")
                })
                .collect();
            Ok::<_, String>((recs, ()))
        })
        .await
        .map_err(|_| "commit")
        .expect("commit");
    }
}

/// Per-operation cost with `held` operations already folded: submits awaiting approval (no
/// trusted policy) when `pending`, else submit -> succeeded (allow rule). Plus the median
/// time of `operations/list` with limit 1 and 100, in µs.
async fn growth(held: usize, pending: bool, n: usize) -> (Cost, f64, f64, f64) {
    let dir = if pending {
        tempfile::tempdir().expect("tempdir")
    } else {
        workspace_with_allow()
    };
    let ws = Workspace::open(dir.path()).expect("open");
    hold(&ws, held, pending).await;
    // Building the held state crossed the automatic snapshot threshold: write that snapshot
    // now, timed on its own, so the rows below measure submits rather than one snapshot that
    // happens to fall inside a few hundred of them (the row prints its cost beside).
    let t = Instant::now();
    ws.compact().await.expect("compact");
    let snapshot_ms = t.elapsed().as_secs_f64() * 1e3;
    // Building the held state left its journal and snapshot dirty in the page cache (~100 MB
    // at 100k): written back while the submits run, it would slow their fdatasyncs and bill
    // the setup to the operations. Flush it first.
    // SAFETY: sync takes no arguments and cannot fail.
    unsafe { libc::sync() };
    let rt = runtime(&ws);
    let cost = if pending {
        let meter = Meter::start(&ws);
        for i in 0..n {
            let (v, _) = rt
                .submit("c", input(&format!("g{i}")))
                .await
                .expect("submit");
            assert_eq!(
                v.state.as_str(),
                "pending",
                "no trusted policy: the submit waits"
            );
        }
        meter.cost(&ws, n)
    } else {
        run_to_success(&ws, &rt, 1, n, "g").await
    };
    let list_us = |limit: usize| {
        let f = gaffer::operations::engine::ListFilter {
            limit: Some(limit),
            ..Default::default()
        };
        let mut times: Vec<f64> = (0..41)
            .map(|_| {
                let t = Instant::now();
                std::hint::black_box(rt.list(None, &f).len());
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        times.sort_by(f64::total_cmp);
        times[times.len() / 2]
    };
    (cost, list_us(1), list_us(100), snapshot_ms)
}

/// A serving gaffer on `ws`: ms from spawn to its first reply (`ping`, which opens nothing),
/// ms from spawn to its first reply that needs the workspace (`operations/list`, limit 1), and
/// its RSS (KiB) after that reply, holding every operation, and its CPU time (ms) by then.
fn serve_open(ws: &Path) -> (f64, f64, u64, f64) {
    let t = Instant::now();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--workspace")
        .arg(ws)
        .args(["serve", "--jsonl"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn gaffer");
    let mut tx = child.stdin.take().expect("stdin");
    let mut rx = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    writeln!(tx, r#"{{"jsonrpc":"2.0","id":1,"method":"ping"}}"#).expect("write");
    rx.read_line(&mut line).expect("reply");
    let first = t.elapsed().as_secs_f64() * 1e3;
    writeln!(
        tx,
        r#"{{"jsonrpc":"2.0","id":2,"method":"operations/list","params":{{"limit":1}}}}"#
    )
    .expect("write");
    line.clear();
    rx.read_line(&mut line).expect("reply");
    assert!(line.contains("\"operations\""), "unexpected reply {line}");
    let opened = t.elapsed().as_secs_f64() * 1e3;
    let cpu = process_cpu_ms(child.id());
    let status =
        std::fs::read_to_string(format!("/proc/{}/status", child.id())).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    drop(tx);
    let _ = child.kill();
    let _ = child.wait();
    (first, opened, rss, cpu)
}

/// User + system CPU time of process `pid` so far, all threads, in ms (10 ms ticks): on a
/// shared machine wall time waits for the CPU, this does not.
fn process_cpu_ms(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which may hold spaces) start at the state, field 3.
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let ticks: u64 = rest
        .split_whitespace()
        .skip(11)
        .take(2)
        .filter_map(|v| v.parse::<u64>().ok())
        .sum();
    // SAFETY: sysconf takes no pointers.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    ticks as f64 * 1e3 / hz
}

async fn recovery(n: usize) -> (tempfile::TempDir, Duration, Duration, u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    {
        let ws = Workspace::open(dir.path()).expect("open");
        common::commit_terminal_operations(&ws, n).await;
        // Settle the store (snapshot + rotation) before timing a cold open.
        ws.compact().await.expect("compact");
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let t = Instant::now();
    let ws = Workspace::open(dir.path()).expect("open");
    let open = t.elapsed();
    let count = ws.read(|s| s.operations.operations.len() as u64);
    // The first write after opening may also write the store's automatic snapshot; time it
    // apart so the recovery pass below measures the operations runtime alone.
    let t = Instant::now();
    ws.commit(|_s: &gaffer::workspace::State| {
        Ok::<_, String>((
            vec![NewRecord::new("gaffer.bench", json!({})).expect("rec")],
            (),
        ))
    })
    .await
    .map_err(|_| "commit")
    .expect("commit");
    println!(
        "  first commit after open: {:.0} ms",
        t.elapsed().as_secs_f64() * 1000.0
    );
    let reg = Registry::new(
        &[Catalog {
            provider: "bench".into(),
            descriptors: vec![noop_desc()],
        }],
        vec![Arc::new(Noop::new(noop_desc()))],
    )
    .expect("registry");
    let rt = OperationRuntime::new(
        Arc::clone(&ws),
        reg,
        RuntimeConfig::default(),
        "bench:0".into(),
    );
    let t = Instant::now();
    rt.recover(&[]).await;
    let rec = t.elapsed();
    drop(rt);
    drop(ws);
    (dir, open, rec, count)
}

/// Minimal NDJSON JSON-RPC client over a child's stdio.
struct Proc {
    child: std::process::Child,
    tx: std::process::ChildStdin,
    rx: std::sync::mpsc::Receiver<Value>,
    id: i64,
    /// The initialize result.
    init: Value,
}

impl Proc {
    fn start(ws: &Path, key: &Path, init: Value) -> Proc {
        let mut child = Command::new(env!("CARGO_BIN_EXE_gaffer"))
            .arg("--workspace")
            .arg(ws)
            .arg("serve")
            .env("GAFFER_OPERATOR_KEY_FILE", key)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn gaffer");
        let tx = child.stdin.take().expect("stdin");
        let out = child.stdout.take().expect("stdout");
        let (stx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if let Ok(v) = serde_json::from_str::<Value>(&line)
                    && stx.send(v).is_err()
                {
                    break;
                }
            }
        });
        let mut p = Proc {
            child,
            tx,
            rx,
            id: 0,
            init: Value::Null,
        };
        p.init = p.call("initialize", init);
        p
    }
    fn call(&mut self, method: &str, params: Value) -> Value {
        self.id += 1;
        let id = self.id;
        writeln!(
            self.tx,
            "{}",
            json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params})
        )
        .expect("write");
        loop {
            let v = self
                .rx
                .recv_timeout(Duration::from_secs(30))
                .expect("reply");
            if v.get("id") == Some(&json!(id)) {
                return v["result"].clone();
            }
        }
    }
    fn until(&mut self, pred: impl Fn(&Value) -> bool) {
        loop {
            let v = self
                .rx
                .recv_timeout(Duration::from_secs(30))
                .expect("notification");
            if pred(&v) {
                return;
            }
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Round trips, and the last payload `approvals/prepare` returned (a real one to sign below).
fn approval_round_trips(n: usize) -> (Vec<Duration>, String) {
    let ws = tempfile::tempdir().expect("tempdir");
    let cfg = tempfile::tempdir().expect("tempdir");
    let key = cfg.path().join("operator.key");
    gaffer::operator::OperatorSigner::init(&key, &key.with_extension("pub"), None).expect("key");
    let signer = gaffer::operator::OperatorSigner::load_from(&key).expect("key");
    std::fs::create_dir_all(ws.path().join(".gaffer")).expect("mkdir");
    // The agent authenticates with a credential the operator issued (`gaffer client add`).
    // This also records the workspace id, which `approvals/prepare` needs: on a store that
    // only serving processes have written, prepare answers `operation_store_unavailable`
    // ("no workspace id") at the time of writing.
    let out = Command::new(env!("CARGO_BIN_EXE_gaffer"))
        .arg("--workspace")
        .arg(ws.path())
        .args(["client", "add", "agent"])
        .env("GAFFER_OPERATOR_KEY_FILE", &key)
        .output()
        .expect("gaffer client add");
    assert!(out.status.success(), "gaffer client add failed");
    let token: Value = serde_json::from_slice(&out.stdout).expect("client add prints JSON");
    let mut agent = Proc::start(
        ws.path(),
        &key,
        json!({"clientInfo": {"name": "agent"}, "initializationOptions": {"clientToken": token["token"]}}),
    );
    let mut op = Proc::start(
        ws.path(),
        &key,
        json!({"clientInfo": {"name": "human"}, "initializationOptions": {"role": "operator"}}),
    );
    let challenge = op.init["operatorChallenge"]
        .as_str()
        .expect("challenge")
        .to_string();
    op.call(
        "operator/login",
        json!({"signature": signer.sign(challenge.as_bytes())}),
    );
    let mut out = vec![];
    let mut last_payload = String::new();
    for i in 0..n {
        let v = agent.call(
            "operations/submit",
            json!({"operation": "file.write", "target": {"path": format!("f{i}")}, "arguments": {"content": "x"}, "reason": "bench", "idempotency_key": format!("k{i}")}),
        );
        let id = v["id"].as_str().expect("id").to_string();
        let ap = loop {
            let l = op.call("approvals/list", json!({}));
            if let Some(a) = l["approvals"]
                .as_array()
                .and_then(|a| a.iter().find(|a| a["operation_id"] == id.as_str()))
            {
                break a.clone();
            }
            std::thread::sleep(Duration::from_millis(2));
        };
        let t = Instant::now();
        let prep = op.call(
            "approvals/prepare",
            json!({"id": ap["approval_id"], "decision": "approve", "expected_revision": ap["revision"],
                   "expected_plan_digest": ap["plan_digest"]}),
        );
        let payload = prep["payload"].as_str().expect("payload").to_string();
        op.call(
            "approvals/decide",
            json!({"payload": payload, "signature": signer.sign(payload.as_bytes()), "idempotency_key": format!("d{i}")}),
        );
        agent.until(|v| {
            v["method"] == "operations/changed"
                && v["params"]["id"] == id.as_str()
                && v["params"]["state"] == "succeeded"
        });
        out.push(t.elapsed());
        last_payload = payload;
    }
    (out, last_payload)
}

/// Prints the approval round trip's p50 and max over `n` decisions; returns the last
/// decision's payload (`--approval-only` runs just this row).
fn approval_row(n: usize) -> String {
    let (mut rts, payload) = approval_round_trips(n);
    rts.sort();
    let p50 = rts[rts.len() / 2];
    let max = rts[rts.len() - 1];
    println!(
        "approval round trip across two processes (decide -> agent sees succeeded): p50 {:.1} ms, max {:.1} ms",
        p50.as_secs_f64() * 1000.0,
        max.as_secs_f64() * 1000.0
    );
    payload
}

/// Mean µs per call of `f` over `n` calls (after a short warm-up).
fn micros_per_op(n: usize, mut f: impl FnMut()) -> f64 {
    for _ in 0..n.min(100) {
        f();
    }
    let t = Instant::now();
    for _ in 0..n {
        f();
    }
    t.elapsed().as_secs_f64() * 1e6 / n as f64
}

/// Ed25519 cost of one decision, on `payload_text` (a real `approvals/prepare` payload),
/// signed with the bench's operator key (`$GAFFER_OPERATOR_KEY_FILE`, set in main).
fn decision_crypto(payload_text: &str, n: usize) {
    use gaffer::operations::decision::DecisionPayload;
    use gaffer::operator::{OperatorPublic, OperatorSignature, OperatorSigner};
    let key = gaffer::operator::key_path().expect("key path");
    let signer = OperatorSigner::load_from(&key).expect("signer");
    let public = OperatorPublic::load_from(&key.with_extension("pub")).expect("public");
    let payload: DecisionPayload = serde_json::from_str(payload_text).expect("decision payload");
    let envelope = OperatorSignature::sign(&signer, &payload);
    assert_eq!(
        envelope.payload, payload_text,
        "the prepared payload is canonical"
    );
    assert_eq!(
        envelope.open::<DecisionPayload>(&public).expect("opens"),
        payload
    );
    let bytes = envelope.payload.as_bytes();
    let mut sink = 0usize;
    let sign_env = micros_per_op(n, || {
        sink ^= OperatorSignature::sign(&signer, &payload).signature.len();
    });
    let sign_raw = micros_per_op(n, || {
        sink ^= signer.sign(bytes).len();
    });
    let open = micros_per_op(n, || {
        sink ^= envelope
            .open::<DecisionPayload>(&public)
            .expect("opens")
            .revision as usize;
    });
    let verify_raw = micros_per_op(n, || {
        sink ^= public.verify(bytes, &envelope.signature) as usize;
    });
    // What a serving process does per decision: look the public key up (a stat, cached
    // parse), then open the envelope.
    let served = micros_per_op(n, || {
        let k = gaffer::operator::current_public().expect("public key");
        sink ^= envelope
            .open::<DecisionPayload>(&k)
            .expect("opens")
            .revision as usize;
    });
    std::hint::black_box(sink);
    println!(
        "Ed25519 per decision ({} byte payload, {n} ops each):",
        bytes.len()
    );
    println!(
        "  sign: OperatorSignature::sign {sign_env:.1} µs/op (of which Ed25519 sign of the text {sign_raw:.1} µs)"
    );
    println!(
        "  verify: OperatorSignature::open::<DecisionPayload> {open:.1} µs/op (of which Ed25519 verify_strict {verify_raw:.1} µs); with current_public() as served {served:.1} µs/op"
    );
}

/// One growth row: `n` submits with `held` operations held, beside the raw rate just before.
async fn growth_row(held: usize, pending: bool, raw_n: usize, n: usize) {
    let raw = raw_fdatasync(raw_n);
    let (c, l1, l100, snap) = growth(held, pending, n).await;
    println!(
        "{} with {held} {} held: {}; operations/list limit 1 {l1:.0} µs, limit 100 {l100:.0} µs; a snapshot of that state {snap:.0} ms",
        if pending {
            "submit (awaits approval)"
        } else {
            "submit -> succeeded"
        },
        if pending { "pending" } else { "terminal" },
        show(&c, raw)
    );
}

fn show(c: &Cost, raw: f64) -> String {
    format!(
        "{:.0}/s = {:.2}x raw {raw:.0}/s; {:.2} syncs/op; {:.0} µs CPU/op ({:.0} in user space); {:.1} context switches/op; {:.2} page faults/op",
        c.rate,
        c.rate / raw,
        c.syncs_per_op,
        c.cpu_us_per_op,
        c.user_us_per_op,
        c.switches_per_op,
        c.faults_per_op
    )
}

fn main() {
    // As `gaffer serve` starts: before any other thread exists.
    gaffer::runtime::tune_allocator();
    let _key_dir = bench_operator_key();
    let quick = std::env::args().any(|a| a == "--quick");
    let n = if quick { 200 } else { 2000 };
    // The runtime `gaffer serve` runs on (one thread for every task, beside the writer
    // thread, writing queued commits itself when it would park); `--multi-thread` puts the
    // tasks on two workers instead.
    let rt = if std::env::args().any(|a| a == "--multi-thread") {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_all()
            .on_thread_park(gaffer::workspace::write_queued_commits)
            .build()
    } else {
        gaffer::runtime::builder().build()
    }
    .expect("runtime");
    if let Some(i) = std::env::args().position(|a| a == "--recovery-only") {
        let count = std::env::args()
            .nth(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(100_000);
        rt.block_on(recovery_rows(count));
        return;
    }
    let raw_n = n / 2;
    if let Some(i) = std::env::args().position(|a| a == "--growth-only") {
        let held = std::env::args()
            .nth(i + 1)
            .and_then(|v| v.parse().ok())
            .unwrap_or(100_000);
        rt.block_on(async {
            for pending in [true, false] {
                growth_row(held, pending, raw_n, n / 4).await;
            }
        });
        return;
    }
    if std::env::args().any(|a| a == "--approval-only") {
        approval_row(if quick { 5 } else { 30 });
        return;
    }
    if std::env::args().any(|a| a == "--success-only") {
        rt.block_on(success_rows(n, raw_n, 3));
        return;
    }
    let raw = rt.block_on(async {
        let raw = raw_fdatasync(raw_n);
        println!("raw write+fdatasync (208 B, plain file): {raw:.0}/s");
        println!(
            "raw write+fdatasync over zeros written ahead (208 B, as the journal): {:.0}/s",
            raw_allocated_fdatasync(raw_n)
        );
        let c = raw_appends(n).await;
        println!(
            "workspace commit (append + fdatasync), 1 task: {c:.0}/s ({:.2}x raw)",
            c / raw
        );
        let raw = raw_fdatasync(raw_n);
        let s = submits(n).await;
        println!(
            "durable submits, 1 client (allow rule, no-op provider): {s:.0}/s ({:.2}x raw {raw:.0}/s)",
            s / raw
        );
        let raw = raw_fdatasync(raw_n);
        let p = pipelined_submits(n, 32).await;
        println!(
            "durable submits, 1 client with 32 in flight: {p:.0}/s ({:.2}x raw {raw:.0}/s)",
            p / raw
        );
        success_rows(n, raw_n, 2).await;
        let big = if quick { 10_000 } else { 100_000 };
        for pending in [true, false] {
            for held in [1_000, big] {
                growth_row(held, pending, raw_n, n / 4).await;
            }
        }
        recovery_rows(big).await;
        raw
    });
    let payload = approval_row(if quick { 5 } else { 30 });
    decision_crypto(&payload, if quick { 500 } else { 5000 });
    // The physical limit beside it, from this run.
    let raw_again = raw_fdatasync(raw_n);
    println!(
        "  raw write+fdatasync in this run: {:.1} µs at start, {:.1} µs now",
        1e6 / raw,
        1e6 / raw_again
    );
}

/// The machine's other limit under one client's latency: one thread waking a parked thread
/// and being woken back by it (std channels, both sides blocking), the median of `n` round
/// trips in µs. A commit hands its batch to the writer thread and is woken when it is
/// durable, so an operation (two commits) crosses threads ~4 times beside its two fdatasyncs.
fn thread_hand_off(n: usize) -> f64 {
    let (to_tx, to_rx) = std::sync::mpsc::channel::<u32>();
    let (back_tx, back_rx) = std::sync::mpsc::channel::<u32>();
    let echo = std::thread::spawn(move || {
        while let Ok(v) = to_rx.recv() {
            if back_tx.send(v).is_err() {
                break;
            }
        }
    });
    let mut trips: Vec<f64> = (0..n as u32)
        .map(|i| {
            // Let the echo thread park, as the writer does between commits.
            std::thread::sleep(Duration::from_micros(200));
            let t = Instant::now();
            to_tx.send(i).expect("send");
            back_rx.recv().expect("echo");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    drop(to_tx);
    echo.join().expect("echo thread");
    trips.sort_by(f64::total_cmp);
    trips[trips.len() / 2]
}

/// submit -> succeeded with 1 and 8 clients, `rounds` times, each beside the raw rate just
/// before it (`--success-only` runs just these rows).
async fn success_rows(n: usize, raw_n: usize, rounds: usize) {
    // `--clients N` runs one client count alone (to profile it).
    let only: Option<usize> = std::env::args()
        .position(|a| a == "--clients")
        .and_then(|i| std::env::args().nth(i + 1))
        .and_then(|v| v.parse().ok());
    let counts = only.map_or(vec![1, 8], |c| vec![c]);
    for _ in 0..rounds {
        for &clients in &counts {
            let (raw, raw_cpu) = raw_fdatasync_cost(raw_n);
            // One client runs half as many: its operations take longest.
            let per_client = if clients == 1 {
                n / 2
            } else {
                n / clients.max(1)
            };
            let cost = to_success(clients, per_client).await;
            let (allocated, allocated_cpu) = raw_allocated_fdatasync_cost(raw_n);
            let noun = if clients == 1 { "client" } else { "clients" };
            println!(
                "submit -> succeeded, {clients} {noun}: {}; raw costs {raw_cpu:.0} µs CPU per write+fdatasync; {:.2}x raw over zeros written ahead {allocated:.0}/s, at {allocated_cpu:.0} µs CPU each; CPU/op beyond syncs/op such fdatasyncs: {:.0} µs",
                show(&cost, raw),
                cost.rate / allocated,
                cost.cpu_us_per_op - cost.syncs_per_op * allocated_cpu
            );
        }
    }
    // The floor under one client's CPU: an operation makes two writes durable, and no way of
    // doing so is cheap in CPU here.
    let (_, plain_cpu) = raw_fdatasync_cost(raw_n);
    let (_, ahead_cpu) = raw_allocated_fdatasync_cost(raw_n);
    let direct = raw_direct_dsync_cost(raw_n).map_or("refused here".to_string(), |(r, c)| {
        format!("{r:.0}/s at {c:.0} µs CPU each")
    });
    println!(
        "a durable write's CPU on this disk: write+fdatasync {plain_cpu:.0} µs; over zeros written ahead {ahead_cpu:.0} µs; 4 KiB O_DIRECT|O_DSYNC over zeros: {direct}"
    );
    println!(
        "a thread hand-off round trip on this machine (wake a parked thread, be woken back): p50 {:.1} µs; {}",
        thread_hand_off(2_000),
        common::machine_idle()
    );
    println!(
        "seals per operation (request seal at its seq, then the claim's and the ending's step seals, each checking the step before): {:.1} µs CPU",
        seal_cost(20_000)
    );
}

/// What sealing costs one operation that is allowed and runs: the request seal, then two
/// steps (approved -> executing -> succeeded), each made after checking the one before.
fn seal_cost(n: usize) -> f64 {
    use gaffer::operations::lifecycle::OpState;
    use gaffer::operations::seal::{SEAL_KEY_LEN, Sealer};
    use gaffer::operations::state::Transitioned;
    let sealer = Sealer::new([7; SEAL_KEY_LEN], "ws_bench");
    let (mut op, _) = held_op(0, 0, false, gaffer::util::now_ms());
    op.state = OpState::Approved;
    op.terminal_at_ms = None;
    op.error = None;
    op.target = json!({"path": "docs/notes/today.md"}).into();
    op.arguments = json!({"content": "x".repeat(200)}).into();
    op.created_seq = 41;
    let step = |op: &gaffer::operations::state::Operation, to: OpState| Transitioned {
        id: op.id.clone(),
        from: op.state,
        to,
        revision: op.revision + 1,
        at_ms: 1,
        error: None,
        result: (to == OpState::Succeeded).then(|| json!({"bytes": 200, "sha256": "0".repeat(64)})),
        upstream_status: None,
        approval: None,
        executor: None,
        seal: None,
    };
    let claim = step(&op, OpState::Executing);
    let mut executing = op.clone();
    executing.state = claim.to;
    executing.revision = claim.revision;
    executing.step_seal = sealer.seal_step(&op, &claim);
    let end = step(&executing, OpState::Succeeded);
    assert!(sealer.seal_step(&executing, &end).is_some());
    micros_per_op(n, || {
        let request = sealer.request(&op, None).at(41);
        let claim_seal = sealer.seal_step(&op, &claim);
        let end_seal = sealer.seal_step(&executing, &end);
        std::hint::black_box((request, claim_seal, end_seal));
    })
}

/// Opening a workspace holding `count` operations: in process, and as a serving process.
async fn recovery_rows(count: usize) {
    let (dir, open, rec, held) = recovery(count).await;
    println!(
        "recovery with {held} operations in the journal: open {:.0} ms, recover pass {:.1} ms",
        open.as_secs_f64() * 1000.0,
        rec.as_secs_f64() * 1000.0
    );
    type Run = (f64, f64, u64, f64);
    let runs: Vec<Run> = (0..3).map(|_| serve_open(dir.path())).collect();
    let col = |f: &dyn Fn(&Run) -> String| runs.iter().map(f).collect::<Vec<_>>().join(" / ");
    println!(
        "gaffer serve on it: first reply (ping) after {} ms; first reply holding the operations (operations/list) after {} ms ({} ms CPU), RSS then {} MiB",
        col(&|r| format!("{:.0}", r.0)),
        col(&|r| format!("{:.0}", r.1)),
        col(&|r| format!("{:.0}", r.3)),
        col(&|r| format!("{:.1}", r.2 as f64 / 1024.0)),
    );
}
