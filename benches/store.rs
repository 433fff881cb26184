//! Store benchmarks: raw fdatasync rate vs durable appends (1 writer, 8 writers with and
//! without group commit), and open + replay of a 1,000,000-record store beside the raw read
//! of the same segment files (the floor).
//!
//! `cargo bench --bench store` (set `GAFFER_BENCH_SECS` to change the per-case duration,
//! `GAFFER_BENCH_RECORDS` the replay store size, `GAFFER_BENCH_ONLY=replay` to run only the
//! replay case on a kept store, for profiling). Files live under `target/store-bench/`,
//! on the same disk as the build.

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{self, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use gaffer::store::{Record, Snapshot, Store, StoreError};
use serde_json::json;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

/// A payload that makes a ~200-byte record body.
fn payload(i: u64) -> serde_json::Value {
    json!({
        "operation": format!("op-{i:012}"),
        "client": "bench-client-0001",
        "state": "approved",
        "note": "x".repeat(72),
    })
}

/// `"prev":"<64 hex>",`: what every body carries besides the record's own fields.
const PREV_FIELD: usize = r#""prev":"","#.len() + 64;

fn record_body_len() -> usize {
    PREV_FIELD
        + serde_json::to_vec(&Record {
            seq: 123_456,
            time_ms: 1_700_000_000_000,
            kind: "operation.changed".into(),
            payload: gaffer::store::raw_payload(payload(1)),
        })
        .map_or(0, |v| v.len())
}

struct Row {
    case: String,
    value: String,
    note: String,
}

fn raw_fdatasync(dir: &Path, secs: f64) -> f64 {
    let path = dir.join("raw.log");
    let mut file = OpenOptions::new()
        .create(true)
        .truncate(true)
        .write(true)
        .open(&path)
        .expect("open raw file");
    let buf = vec![b'r'; 208];
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        file.write_all(&buf).expect("write");
        file.sync_data().expect("fdatasync");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

fn one_writer(dir: &Path, secs: f64) -> f64 {
    let mut store = Store::open(dir).expect("open");
    let start = Instant::now();
    let mut n = 0u64;
    while start.elapsed().as_secs_f64() < secs {
        let mut txn = store.begin().expect("begin");
        let seq = txn.next_seq();
        txn.append(&[Record::new(seq, "operation.changed", payload(seq))])
            .expect("append");
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// 8 threads, each taking the store mutex and appending its own record with its own fdatasync.
fn eight_writers_no_grouping(dir: &Path, secs: f64) -> f64 {
    let store = Arc::new(Mutex::new(Store::open(dir).expect("open")));
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let handles: Vec<_> = (0..8)
        .map(|_| {
            let store = Arc::clone(&store);
            std::thread::spawn(move || {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let mut guard = store.lock().expect("mutex");
                    let mut txn = guard.begin().expect("begin");
                    let seq = txn.next_seq();
                    txn.append(&[Record::new(seq, "operation.changed", payload(seq))])
                        .expect("append");
                    n += 1;
                }
                n
            })
        })
        .collect();
    let total: u64 = handles.into_iter().map(|h| h.join().expect("thread")).sum();
    total as f64 / start.elapsed().as_secs_f64()
}

type Request = (serde_json::Value, Sender<u64>);

/// Drains whatever requests are queued into one batch: one lock, one append, one fdatasync.
fn committer(store: Arc<Mutex<Store>>, rx: Receiver<Request>) -> (u64, u64) {
    let (mut batches, mut records) = (0u64, 0u64);
    while let Ok(first) = rx.recv() {
        let mut pending = vec![first];
        while pending.len() < 4096 {
            match rx.try_recv() {
                Ok(req) => pending.push(req),
                Err(_) => break,
            }
        }
        let mut guard = store.lock().expect("mutex");
        let mut txn = guard.begin().expect("begin");
        txn.take_new().expect("take_new");
        let next = txn.next_seq();
        let batch: Vec<Record> = pending
            .iter()
            .enumerate()
            .map(|(i, (p, _))| Record::new(next + i as u64, "operation.changed", p.clone()))
            .collect();
        txn.append(&batch).expect("append");
        drop(txn);
        drop(guard);
        for (r, (_, reply)) in batch.iter().zip(pending) {
            let _ = reply.send(r.seq);
        }
        batches += 1;
        records += batch.len() as u64;
    }
    (batches, records)
}

fn eight_writers_group_commit(dir: &Path, secs: f64) -> (f64, f64) {
    let store = Arc::new(Mutex::new(Store::open(dir).expect("open")));
    let (tx, rx) = mpsc::channel::<Request>();
    let committer = {
        let store = Arc::clone(&store);
        std::thread::spawn(move || committer(store, rx))
    };
    let deadline = Instant::now() + Duration::from_secs_f64(secs);
    let start = Instant::now();
    let handles: Vec<_> = (0..8)
        .map(|w| {
            let tx = tx.clone();
            std::thread::spawn(move || {
                let mut n = 0u64;
                while Instant::now() < deadline {
                    let (reply_tx, reply_rx) = mpsc::channel();
                    tx.send((payload(w * 1_000_000 + n), reply_tx))
                        .expect("send");
                    reply_rx.recv().expect("acknowledged");
                    n += 1;
                }
                n
            })
        })
        .collect();
    drop(tx);
    let total: u64 = handles.into_iter().map(|h| h.join().expect("thread")).sum();
    let elapsed = start.elapsed().as_secs_f64();
    let (batches, records) = committer.join().expect("committer");
    assert_eq!(records, total);
    (
        total as f64 / elapsed,
        records as f64 / batches.max(1) as f64,
    )
}

fn build_big_store(dir: &Path, records: u64) {
    let mut store = Store::open(dir).expect("open");
    let mut txn = store.begin().expect("begin");
    let mut seq = 1u64;
    while seq <= records {
        let end = (seq + 10_000).min(records + 1);
        let batch: Vec<Record> = (seq..end)
            .map(|s| Record {
                seq: s,
                time_ms: 1_700_000_000_000 + s,
                kind: "op".into(),
                payload: gaffer::store::raw_payload(json!({ "id": s, "state": "done" })),
            })
            .collect();
        txn.append(&batch).expect("append");
        seq = end;
    }
}

fn time_open_replay(dir: &Path, use_snapshot: bool) -> (Duration, u64) {
    let start = Instant::now();
    let mut store = Store::open(dir).expect("open");
    let after = if use_snapshot {
        store.snapshot().expect("snapshot").map_or(0, |s| s.seq)
    } else {
        0
    };
    let mut n = 0u64;
    store
        .replay(after, |r| {
            n += r.seq & 1; // touch every record
            Ok::<(), StoreError>(())
        })
        .expect("replay");
    (start.elapsed(), store.last_seq())
}

/// Reads every segment of `dir`'s journal into memory and touches each byte: what opening
/// the store costs at least.
fn read_journal_raw(dir: &Path) -> Duration {
    let start = Instant::now();
    let mut sum = 0u64;
    for e in fs::read_dir(dir.join("journal"))
        .expect("journal")
        .flatten()
    {
        let bytes = fs::read(e.path()).expect("read segment");
        sum = bytes.iter().fold(sum, |a, b| a.wrapping_add(u64::from(*b)));
    }
    std::hint::black_box(sum);
    start.elapsed()
}

fn median(xs: &[f64]) -> f64 {
    let mut v = xs.to_vec();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(0.0)
}

fn median_of(runs: usize, mut f: impl FnMut() -> Duration) -> (Duration, Duration) {
    let mut times: Vec<Duration> = (0..runs).map(|_| f()).collect();
    times.sort();
    (times[0], times[runs / 2])
}

fn dir_bytes(dir: &Path) -> u64 {
    fs::read_dir(dir.join("journal"))
        .map(|entries| {
            entries
                .flatten()
                .filter_map(|e| e.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0)
}

fn fresh(root: &Path, name: &str) -> PathBuf {
    let dir = root.join(name);
    let _ = fs::remove_dir_all(&dir);
    dir
}

fn main() {
    let secs: f64 = env_or("GAFFER_BENCH_SECS", 6.0);
    let big: u64 = env_or("GAFFER_BENCH_RECORDS", 1_000_000);
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("target/store-bench");
    fs::create_dir_all(&root).expect("bench dir");
    let mut rows = Vec::new();
    let body = record_body_len();

    let only_replay = std::env::var("GAFFER_BENCH_ONLY").is_ok_and(|v| v == "replay");
    if only_replay {
        // Profiling aid: build (once) and replay the big store only.
        // Kept between runs for profiling, but rebuilt unless it holds exactly `big` records:
        // a store of another size would time the wrong thing under the asked size's label.
        let dir = root.join("replay-only");
        let kept = Store::open(&dir).ok().and_then(|mut s| {
            s.replay(0, |_| Ok::<(), StoreError>(())).ok()?;
            Some(s.last_seq())
        });
        if kept != Some(big) {
            let _ = fs::remove_dir_all(&dir);
            build_big_store(&dir, big);
        }
        let (best, median) = median_of(5, || {
            let (t, last) = time_open_replay(&dir, false);
            assert_eq!(last, big, "the replayed store holds the size asked");
            t
        });
        println!(
            "open + replay {big}: median {:.0} ms, best {:.0} ms",
            median.as_secs_f64() * 1e3,
            best.as_secs_f64() * 1e3
        );
        return;
    }
    // The disk is shared, so fsync rates drift: run the four append cases in interleaved
    // rounds and compare each against the raw rate of its own round.
    const ROUNDS: usize = 3;
    let slice = secs / ROUNDS as f64;
    let (mut raw, mut one, mut eight, mut grouped, mut batch) =
        (vec![], vec![], vec![], vec![], vec![]);
    for _ in 0..ROUNDS {
        raw.push(raw_fdatasync(&root, slice));
        one.push(one_writer(&fresh(&root, "one"), slice));
        eight.push(eight_writers_no_grouping(&fresh(&root, "eight"), slice));
        let (g, b) = eight_writers_group_commit(&fresh(&root, "group"), slice);
        grouped.push(g);
        batch.push(b);
    }
    let ratio = |xs: &[f64]| median(&xs.iter().zip(&raw).map(|(x, r)| x / r).collect::<Vec<_>>());
    let spread = |xs: &[f64]| {
        let mut v = xs.to_vec();
        v.sort_by(f64::total_cmp);
        format!("{:.0}..{:.0}", v[0], v[v.len() - 1])
    };
    rows.push(Row {
        case: "raw write+fdatasync (208 B)".into(),
        value: format!("{:.0} /s", median(&raw)),
        note: format!("the disk's floor; rounds {}", spread(&raw)),
    });
    rows.push(Row {
        case: "durable append, 1 writer".into(),
        value: format!("{:.0} /s", median(&one)),
        note: format!(
            "{body} B body; begin+append+fdatasync each; {:.2}x raw; rounds {}",
            ratio(&one),
            spread(&one)
        ),
    });
    rows.push(Row {
        case: "durable append, 8 threads, no grouping".into(),
        value: format!("{:.0} /s", median(&eight)),
        note: format!(
            "mutex, 1 fdatasync per record; {:.2}x raw; rounds {}",
            ratio(&eight),
            spread(&eight)
        ),
    });
    rows.push(Row {
        case: "durable append, 8 threads, group commit".into(),
        value: format!("{:.0} /s", median(&grouped)),
        note: format!(
            "avg batch {:.1}; {:.2}x raw (same round); rounds {}",
            median(&batch),
            ratio(&grouped),
            spread(&grouped)
        ),
    });

    let replay_dir = fresh(&root, "replay");
    let build_start = Instant::now();
    build_big_store(&replay_dir, big);
    let build = build_start.elapsed();
    let bytes = dir_bytes(&replay_dir);
    let (best, median) = median_of(5, || {
        let (t, last) = time_open_replay(&replay_dir, false);
        assert_eq!(last, big);
        t
    });
    let (raw_best, raw_median) = median_of(5, || read_journal_raw(&replay_dir));
    rows.push(Row {
        case: format!("raw read of the same {big} records' segments"),
        value: format!("{:.0} ms", raw_median.as_secs_f64() * 1e3),
        note: format!(
            "best {:.0} ms; {:.0} MB/s: the floor for opening them (page cache)",
            raw_best.as_secs_f64() * 1e3,
            bytes as f64 / raw_median.as_secs_f64() / 1e6
        ),
    });
    rows.push(Row {
        case: format!("open + replay {big} records"),
        value: format!("{:.0} ms", median.as_secs_f64() * 1e3),
        note: format!(
            "best {:.0} ms; {:.1} MB journal; {:.2} M rec/s; built in {:.1} s",
            best.as_secs_f64() * 1e3,
            bytes as f64 / 1e6,
            big as f64 / median.as_secs_f64() / 1e6,
            build.as_secs_f64()
        ),
    });

    // Snapshot at the end, then 1,000 more records after it.
    {
        let mut store = Store::open(&replay_dir).expect("open");
        store
            .replay(0, |_| Ok::<(), StoreError>(()))
            .expect("replay");
        let state: serde_json::Map<String, serde_json::Value> = (0..10_000)
            .map(|i| (format!("op-{i:06}"), json!({ "state": "done", "n": i })))
            .collect();
        let mut txn = store.begin().expect("begin");
        txn.write_snapshot(&Snapshot {
            seq: big,
            state: serde_json::Value::Object(state),
        })
        .expect("snapshot");
        let batch: Vec<Record> = (big + 1..=big + 1000)
            .map(|s| Record::new(s, "op", json!({ "id": s })))
            .collect();
        txn.append(&batch).expect("append");
    }
    let snap_bytes = fs::metadata(replay_dir.join("snapshot.json")).map_or(0, |m| m.len());
    let (best, median) = median_of(5, || {
        let (t, last) = time_open_replay(&replay_dir, true);
        assert_eq!(last, big + 1000);
        t
    });
    rows.push(Row {
        case: format!("open + snapshot + replay ({big} + 1000)"),
        value: format!("{:.1} ms", median.as_secs_f64() * 1e3),
        note: format!(
            "best {:.1} ms; snapshot {:.1} KB (10k entries), 1000 records after it",
            best.as_secs_f64() * 1e3,
            snap_bytes as f64 / 1e3
        ),
    });

    let load = fs::read_to_string("/proc/loadavg").unwrap_or_default();
    println!(
        "load average at the end: {} (on {} cores)",
        load.split_whitespace()
            .take(3)
            .collect::<Vec<_>>()
            .join(" "),
        std::thread::available_parallelism().map_or(1, |n| n.get())
    );
    let w0 = rows.iter().map(|r| r.case.len()).max().unwrap_or(0);
    let w1 = rows.iter().map(|r| r.value.len()).max().unwrap_or(0);
    println!("{:<w0$}  {:>w1$}  notes", "case", "result");
    println!("{}", "-".repeat(w0 + w1 + 40));
    for r in &rows {
        println!("{:<w0$}  {:>w1$}  {}", r.case, r.value, r.note);
    }
    let _ = fs::remove_dir_all(&root);
}
