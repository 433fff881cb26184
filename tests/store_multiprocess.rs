//! Two OS processes append to one store at the same time. The test binary re-executes itself
//! as each writer (`child_appender`, ignored unless run with the env vars set).

use std::collections::BTreeMap;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gaffer::store::{Record, Store, StoreError};
use serde_json::json;

const DIR_ENV: &str = "GAFFER_STORE_MP_DIR";
const ID_ENV: &str = "GAFFER_STORE_MP_ID";
const PER_WRITER: u64 = 500;
const WRITERS: u64 = 2;

fn writer_of(r: &Record) -> u64 {
    r.payload_value()["writer"].as_u64().expect("writer field")
}

#[test]
#[ignore = "child process of two_processes_append_concurrently"]
fn child_appender() {
    let (Ok(dir), Ok(id)) = (std::env::var(DIR_ENV), std::env::var(ID_ENV)) else {
        return;
    };
    let id: u64 = id.parse().unwrap();
    let mut store = Store::open(&dir).unwrap();
    // One writer allocates space ahead of its appends (as a workspace does), the other does
    // not: each must see the other's records and nothing of the zeros.
    if id % 2 == 1 {
        store.preallocate(4096);
    }
    // Every seq this process knows of, and who wrote it.
    let mut known: BTreeMap<u64, u64> = BTreeMap::new();
    let note = |records: Vec<Record>, known: &mut BTreeMap<u64, u64>| {
        for r in records {
            assert!(
                known.insert(r.seq, writer_of(&r)).is_none(),
                "seq {} seen twice",
                r.seq
            );
        }
    };
    let mut replayed = Vec::new();
    store
        .replay(0, |r| {
            replayed.push(r);
            Ok::<(), StoreError>(())
        })
        .unwrap();
    note(replayed, &mut known);

    let mut interleavings = 0u64;
    for i in 0..PER_WRITER {
        if i % 7 == 3 {
            note(store.poll().unwrap(), &mut known);
        }
        let mut txn = store.begin().unwrap();
        let new = txn.take_new().unwrap();
        if new.iter().any(|r| writer_of(r) != id) {
            interleavings += 1;
        }
        note(new, &mut known);
        let seq = txn.next_seq();
        let record = Record::new(seq, "mp.test", json!({ "writer": id, "i": i }));
        txn.append(std::slice::from_ref(&record)).unwrap();
        drop(txn);
        known.insert(seq, id);
        if i.is_multiple_of(50) {
            std::thread::yield_now();
        }
    }
    // Keep watching until the other writer is done too.
    let deadline = Instant::now() + Duration::from_secs(120);
    while (known.len() as u64) < PER_WRITER * WRITERS {
        assert!(Instant::now() < deadline, "other writer never finished");
        note(store.poll().unwrap(), &mut known);
        std::thread::sleep(Duration::from_millis(2));
    }
    let seqs: Vec<u64> = known.keys().copied().collect();
    assert_eq!(seqs, (1..=PER_WRITER * WRITERS).collect::<Vec<_>>());
    let others = known.values().filter(|w| **w != id).count() as u64;
    assert_eq!(others, PER_WRITER, "saw the other writer's records");
    println!("result writer={id} others_seen={others} interleavings={interleavings}");
}

fn spawn(dir: &Path, id: u64) -> std::process::Child {
    Command::new(std::env::current_exe().unwrap())
        .args([
            "child_appender",
            "--exact",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(DIR_ENV, dir)
        .env(ID_ENV, id.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn two_processes_append_concurrently() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(".gaffer");
    let children: Vec<_> = (0..WRITERS).map(|id| spawn(&dir, id)).collect();
    for (id, child) in children.into_iter().enumerate() {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "writer {id} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(
            stdout.contains(&format!("result writer={id} others_seen={PER_WRITER}")),
            "writer {id} did not report:\n{stdout}"
        );
        if let Some(line) = stdout.lines().find(|l| l.contains("result writer=")) {
            eprintln!("{line}");
        }
    }

    let mut store = Store::open(&dir).unwrap();
    let mut records = Vec::new();
    store
        .replay(0, |r| {
            records.push(r);
            Ok::<(), StoreError>(())
        })
        .unwrap();
    assert_eq!(records.len() as u64, PER_WRITER * WRITERS);
    let seqs: Vec<u64> = records.iter().map(|r| r.seq).collect();
    assert_eq!(seqs, (1..=PER_WRITER * WRITERS).collect::<Vec<_>>());
    for id in 0..WRITERS {
        let mine: Vec<u64> = records
            .iter()
            .filter(|r| writer_of(r) == id)
            .map(|r| r.payload_value()["i"].as_u64().unwrap())
            .collect();
        assert_eq!(mine, (0..PER_WRITER).collect::<Vec<_>>(), "writer {id}");
    }
    let report = gaffer::store::verify(&dir).unwrap();
    assert!(report.ok, "{:?}", report.problems);
    // Every writer chained onto what the others had appended.
    assert_eq!(report.chain.broken_at, None);
    assert_eq!(report.chain.verified_to, Some(PER_WRITER * WRITERS));
    assert_eq!(store.chain_status().broken_at, None);
    assert_eq!(store.chain_status().head, store.head());
}
