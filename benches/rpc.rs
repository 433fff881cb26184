//! Stdio round trip of `gaffer/status` against the real binary, sequential and pipelined, and
//! the idle resident memory of a server. Prints a table; asserts nothing.
//!
//! Run: `cargo bench --bench rpc`

use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::{percentile, rss_kib};

const BIN: &str = env!("CARGO_BIN_EXE_gaffer");

fn main() {
    let ws = tempfile::tempdir().expect("tempdir");
    let mut child = Command::new(BIN)
        .arg("--workspace")
        .arg(ws.path())
        .args(["serve", "--jsonl"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn gaffer");
    let mut stdin = child.stdin.take().expect("stdin");
    let mut stdout = BufReader::new(child.stdout.take().expect("stdout"));
    let mut line = String::new();
    let mut roundtrip = |stdin: &mut std::process::ChildStdin, id: u64| {
        writeln!(
            stdin,
            r#"{{"jsonrpc":"2.0","id":{id},"method":"gaffer/status"}}"#
        )
        .expect("write");
        stdin.flush().expect("flush");
        line.clear();
        stdout.read_line(&mut line).expect("read");
        assert!(line.contains("\"result\""), "unexpected reply {line}");
    };
    // Warm up (first request opens the workspace).
    for id in 0..200 {
        roundtrip(&mut stdin, id);
    }
    std::thread::sleep(Duration::from_millis(300));
    let idle = rss_kib(&child.id().to_string());

    let n = 20_000u64;
    let mut samples = Vec::with_capacity(n as usize);
    for id in 0..n {
        let t = Instant::now();
        roundtrip(&mut stdin, 1_000 + id);
        samples.push(t.elapsed());
    }
    samples.sort();

    // Pipelined: write everything, then read everything.
    let m = 20_000u64;
    let start = Instant::now();
    let writer = {
        let mut stdin = stdin;
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            for id in 0..m {
                buf.extend_from_slice(
                    format!(
                        "{{\"jsonrpc\":\"2.0\",\"id\":{},\"method\":\"gaffer/status\"}}\n",
                        100_000 + id
                    )
                    .as_bytes(),
                );
            }
            stdin.write_all(&buf).expect("write");
            stdin.flush().expect("flush");
            stdin
        })
    };
    let mut got = 0;
    let mut l = String::new();
    while got < m {
        l.clear();
        stdout.read_line(&mut l).expect("read");
        got += 1;
    }
    let pipelined = start.elapsed();
    let stdin = writer.join().expect("writer");
    let busy = rss_kib(&child.id().to_string());
    drop(stdin);
    let _ = child.wait();

    println!("gaffer/status over stdio (NDJSON, release build)");
    println!(
        "  sequential: n={n} p50={:?} p90={:?} p99={:?} max={:?}",
        percentile(&samples, 0.50),
        percentile(&samples, 0.90),
        percentile(&samples, 0.99),
        samples[samples.len() - 1]
    );
    println!(
        "  pipelined:  n={m} total={pipelined:?} => {:.0} req/s, {:?}/req",
        m as f64 / pipelined.as_secs_f64(),
        pipelined / m as u32
    );
    println!(
        "  RSS idle after warm-up: {} KiB; after load: {} KiB",
        idle.map_or("?".into(), |v| v.to_string()),
        busy.map_or("?".into(), |v| v.to_string())
    );
}
