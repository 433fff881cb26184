//! Bundle and worker benchmarks: digest throughput, `bundles/sync` of a 1 MiB bundle,
//! create → first output latency, transcript append rate, and memory of 1,000 listed workers.
//!
//! `cargo bench --bench bundles` (set `GAFFER_BENCH_SECS` for the per-case duration). Stores
//! live in temporary directories on the system temp disk.

use std::sync::Arc;
use std::time::{Duration, Instant};

use gaffer::bundles::{self, digest, jcs};
use gaffer::methods::{App, AppConfig, call_local};
use gaffer::rpc::Role;
use gaffer::workers::state::records;
use gaffer::workers::{self, RunState, Stream, Worker, WorkerState, WorkerStatus};
use serde_json::{Value, json};

mod common;
use common::percentile;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A bundle of about `bytes` canonical bytes: many profiles with long labels and argv.
fn big_bundle(id: &str, bytes: usize) -> Value {
    let per_profile = 1900;
    let n = bytes.div_ceil(per_profile);
    let profiles: Vec<Value> = (0..n)
        .map(|i| {
            json!({
                "selector": {"kind": "named", "value": format!("profile-{i:06}")},
                "label": format!("{} {i}", "lorem ipsum dolor sit amet, \"quoted\" \\ text; ".repeat(24)),
                "command": ["sh", "scripts/run.sh", format!("--lane={i}"), "x".repeat(200)],
                "toolsets": ["read", "write", "search"],
                "timeout_ms": 60000,
            })
        })
        .collect();
    json!({
        "metadata": {"id": id, "revision": "r1", "created_at": "2026-11-29", "provenance": {"source": "bench"}},
        "profiles": profiles,
        "declarations": [{"kind": "secret_ref", "name": "token", "reference": "env:BENCH_TOKEN"}],
    })
}

/// CPU time of the calling thread: throughput that does not depend on how busy the machine is.
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes into the timespec we own.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Runs `f` for about `secs` seconds; returns (iterations, CPU time used).
fn measure<F: FnMut()>(secs: f64, mut f: F) -> (u64, Duration) {
    let start = Instant::now();
    let cpu = thread_cpu();
    let mut n = 0;
    while start.elapsed().as_secs_f64() < secs || n == 0 {
        f();
        n += 1;
    }
    (n, thread_cpu() - cpu)
}

fn rss_kib() -> u64 {
    common::rss_kib("self").unwrap_or(0)
}

fn bench_digest(secs: f64) {
    let value = big_bundle("digest-bench", 1 << 20);
    let bundle = bundles::parse_value(value).expect("bench bundle is valid");
    let c = digest::canonicalize(&bundle);
    let normalized = digest::normalize(&bundle);
    let mb = c.bytes.len() as f64 / 1e6;
    println!(
        "bundle: {} profiles, {:.2} MB canonical (MB/s per CPU-second of the bench thread)",
        bundle.profiles.len(),
        mb
    );

    let (n, t) = measure(secs, || {
        std::hint::black_box(digest::canonicalize(std::hint::black_box(&bundle)));
    });
    println!(
        "digest (normalise + JCS + sha256):  {:>8.1} MB/s",
        mb * n as f64 / t.as_secs_f64()
    );

    let (n, t) = measure(secs, || {
        std::hint::black_box(digest::encode(std::hint::black_box(&normalized)));
    });
    println!(
        "  typed JCS encoder alone:          {:>8.1} MB/s",
        mb * n as f64 / t.as_secs_f64()
    );
    let (n, t) = measure(secs, || {
        std::hint::black_box(digest::normalize(std::hint::black_box(&bundle)));
    });
    println!(
        "  normalise (clone + sort) alone:   {:>8.1} MB/s",
        mb * n as f64 / t.as_secs_f64()
    );
    let v = serde_json::to_value(&normalized).expect("bundle encodes");
    let (n, t) = measure(secs, || {
        std::hint::black_box(jcs::canonicalize(std::hint::black_box(&v)));
    });
    println!(
        "  generic JCS (Value tree) alone:   {:>8.1} MB/s",
        mb * n as f64 / t.as_secs_f64()
    );
    let (n, t) = measure(secs, || {
        std::hint::black_box(gaffer::util::sha256_hex(std::hint::black_box(&c.bytes)));
    });
    println!(
        "  sha256 alone:                     {:>8.1} MB/s",
        mb * n as f64 / t.as_secs_f64()
    );
    let (n, t) = measure(secs, || {
        let b = bundles::prepare(std::hint::black_box(&bundle)).expect("valid");
        std::hint::black_box(b);
    });
    println!(
        "  validate + digest (prepare):      {:>8.1} MB/s",
        mb * n as f64 / t.as_secs_f64()
    );
}

async fn bench_sync(app: &Arc<App>, secs: f64) {
    let template = big_bundle("sync-0", 1 << 20);
    let text_len = serde_json::to_vec(&template).map(|v| v.len()).unwrap_or(0);
    let mut times = Vec::new();
    let start = Instant::now();
    let mut i = 0;
    while start.elapsed().as_secs_f64() < secs || times.len() < 5 {
        let mut b = template.clone();
        b["metadata"]["id"] = json!(format!("sync-{i}"));
        i += 1;
        let t = Instant::now();
        let r = call_local(
            Arc::clone(app),
            Role::Agent,
            "bundles/sync",
            json!({"bundle": b}),
        )
        .await;
        times.push(t.elapsed());
        assert!(r.is_ok(), "sync failed: {r:?}");
    }
    times.sort();
    println!(
        "bundles/sync 1 MiB ({:.2} MB JSON), new id each time: n={} p50 {:.2} ms  p90 {:.2} ms",
        text_len as f64 / 1e6,
        times.len(),
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.9).as_secs_f64() * 1e3
    );
    let same = json!({"bundle": template});
    let _ = call_local(Arc::clone(app), Role::Agent, "bundles/sync", same.clone()).await;
    let t = Instant::now();
    let reps = 5;
    for _ in 0..reps {
        let r = call_local(Arc::clone(app), Role::Agent, "bundles/sync", same.clone()).await;
        assert!(r.is_ok());
    }
    println!(
        "bundles/sync 1 MiB, already synced (idempotent): {:.2} ms",
        t.elapsed().as_secs_f64() * 1e3 / reps as f64
    );
}

async fn bench_first_output(app: &Arc<App>, rounds: usize) {
    let b = json!({
        "metadata": {"id": "latency", "revision": "r1", "created_at": "now", "provenance": {"source": "bench"}},
        "profiles": [{"selector": {"kind": "named", "value": "hello"}, "command": ["echo", "hello"]}],
    });
    let r = call_local(
        Arc::clone(app),
        Role::Agent,
        "bundles/sync",
        json!({"bundle": b}),
    )
    .await
    .expect("sync");
    let reference = r["reference"].clone();
    let mut times = Vec::new();
    for _ in 0..rounds {
        let mut notices = app.workspace.subscribe();
        let t = Instant::now();
        let created = call_local(
            Arc::clone(app),
            Role::Agent,
            "workers/create",
            json!({"profile": {"kind": "named", "value": "hello"}, "config_bundle": reference}),
        )
        .await
        .expect("create");
        let id = created["worker"]["id"].clone();
        loop {
            match tokio::time::timeout(Duration::from_secs(10), notices.recv()).await {
                Ok(Ok(n))
                    if &*n.method == "workers/output"
                        && n.params.str_field("worker_id") == id.as_str() =>
                {
                    break;
                }
                Ok(_) => continue,
                Err(_) => panic!("no output within 10 s"),
            }
        }
        times.push(t.elapsed());
    }
    times.sort();
    println!(
        "create -> first workers/output (echo hello): n={} p50 {:.2} ms  p90 {:.2} ms  (flush interval {} ms)",
        times.len(),
        percentile(&times, 0.5).as_secs_f64() * 1e3,
        percentile(&times, 0.9).as_secs_f64() * 1e3,
        workers::runtime::FLUSH_INTERVAL.as_millis()
    );
}

async fn bench_transcript_rate(app: &Arc<App>) {
    let lines = env_or("GAFFER_BENCH_LINES", 400_000u64);
    let b = json!({
        "metadata": {"id": "chatty", "revision": "r1", "created_at": "now", "provenance": {"source": "bench"}},
        "profiles": [{"selector": {"kind": "named", "value": "yes"},
                      "command": ["sh", "-c", format!("yes 'a line of worker output, about fifty bytes long' | head -n {lines}")]}],
    });
    let r = call_local(
        Arc::clone(app),
        Role::Agent,
        "bundles/sync",
        json!({"bundle": b}),
    )
    .await
    .expect("sync");
    let seq0 = app.workspace.seq();
    let t = Instant::now();
    let created = call_local(
        Arc::clone(app),
        Role::Agent,
        "workers/create",
        json!({"profile": {"kind": "named", "value": "yes"}, "config_bundle": r["reference"]}),
    )
    .await
    .expect("create");
    let id = created["worker"]["id"]
        .as_str()
        .unwrap_or_default()
        .to_string();
    let w = loop {
        let w = app
            .workspace
            .read(|s| s.workers.get(&id).cloned())
            .expect("worker");
        if w.status != WorkerStatus::Running {
            break w;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    let secs = t.elapsed().as_secs_f64();
    let recs = app.workspace.seq() - seq0;
    println!(
        "transcript append (live worker, journalled): {:.1} MB/s, {} lines in {} records, {:.2} s",
        w.output_bytes as f64 / 1e6 / secs,
        lines,
        recs,
        secs
    );

    // The fold alone: records applied to the in-memory state.
    let mut st = WorkerState::default();
    let base = worker("w");
    let (k, p) = records::created(&base, None);
    st.apply_record(k, 1, 1, &p);
    let payloads: Vec<Value> = (0..10_000)
        .map(|i| records::output("w", Stream::Stdout, &format!("line {i} of output\n")).1)
        .collect();
    let t = Instant::now();
    for (i, p) in payloads.iter().enumerate() {
        st.apply_record("worker.output", 2 + i as u64, 2, p);
    }
    println!(
        "transcript fold (in memory): {:.0} records/s",
        payloads.len() as f64 / t.elapsed().as_secs_f64()
    );
}

fn worker(id: &str) -> Worker {
    Worker {
        id: id.to_string(),
        profile: bundles::ProfileSelector::Named("p".into()),
        config_bundle: bundles::BundleRef {
            id: "b".into(),
            digest: format!("sha256:{}", "0".repeat(64)),
        },
        display_name: Some("a worker with a display name".into()),
        status: WorkerStatus::Stopped,
        run_state: RunState::Stopped,
        input_capable: false,
        input_mode: bundles::InputMode::StdinText,
        backend: "process".into(),
        owner: None,
        operation_id: None,
        reason: Some("exited with status 0".into()),
        diagnostic: None,
        exit: None,
        stop_requested: false,
        stop_reason: None,
        created_by: None,
        idempotency_key: None,
        request_fingerprint: format!("sha256:{}", "1".repeat(64)),
        created_seq: 0,
        created_ms: 0,
        updated_ms: 0,
        last_seq: 0,
        input_count: 0,
        output_bytes: 0,
    }
}

fn bench_memory_1000() {
    let before = rss_kib();
    let mut st = WorkerState::default();
    for i in 0..1000u64 {
        let w = worker(&workers::new_worker_id());
        let input = vec![workers::Segment::Text {
            content: format!("initial input of worker {i}"),
        }];
        let (k, p) = records::created(&w, Some(&input));
        st.apply_record(k, i + 1, i + 1, &p);
    }
    let t = Instant::now();
    let listed: Vec<Worker> = st.list().cloned().collect();
    let json = serde_json::to_vec(&json!({ "workers": listed })).expect("encodes");
    let list_ms = t.elapsed().as_secs_f64() * 1e3;
    let after = rss_kib();
    println!(
        "1,000 workers: state + list RSS delta {} KiB, workers/list reply {:.1} KiB, built in {:.2} ms",
        after.saturating_sub(before),
        json.len() as f64 / 1024.0,
        list_ms
    );
}

fn main() {
    let secs: f64 = env_or("GAFFER_BENCH_SECS", 2.0);
    bench_memory_1000();
    bench_digest(secs);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let dir = tempfile::tempdir().expect("temp dir");
        let app = App::open(dir.path(), AppConfig::default()).expect("open workspace");
        bench_sync(&app, secs).await;
        bench_first_output(&app, 30).await;
        bench_transcript_rate(&app).await;
    });
}
