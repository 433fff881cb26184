//! Worker-pattern selection benchmarks: in process (the 84-case conformance mix and four
//! fixed requests), sequential round trips to one serving process over stdio (NDJSON
//! `patterns/select`, MCP `tools/call` `select_worker_pattern`, LSP-framed `patterns/select`),
//! and the one-shot CLI. Round trips print, beside their wall-clock quantiles, the serving
//! process's own CPU time per call (all its threads, from schedstat): on a machine whose parked
//! CPUs exit the VM the wall time is mostly wake-ups, and this column is gaffer's part. Prints
//! gaffer's own figures only; the reference selector appears as a figure labelled with the
//! date it was measured, never as a ratio against a constant (a constant goes stale while the
//! machine and the reference change). Each wire is measured twice: placed freely, and with the
//! bench and the server pinned to one CPU, which separates gaffer's cost from the cross-CPU
//! wake-ups of an idle VM. Asserts nothing.
//! Run with `cargo bench --bench patterns`.

use std::hint::black_box;
use std::io::{BufRead, BufReader, Write};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use gaffer::patterns::{SelectContext, build_plan, parse_params, render::write_output, select};
use serde_json::{Value, json};

/// The reference selector as measured once, on this machine kind: labels, not live figures.
const REFERENCE_IN_PROCESS: &str = "reference: 4.9 ms per call in process, measured 2026-12-01";
const REFERENCE_ROUND_TRIP: &str = "reference: 4.6 ms per MCP round trip, measured 2026-12-01";
const REFERENCE_CLI: &str = "reference: 141 ms per CLI run, measured 2026-12-01";
const BIN: &str = env!("CARGO_BIN_EXE_gaffer");

mod common;
#[path = "../tests/patterns_support.rs"]
mod support;

fn scopes(n: usize) -> Vec<String> {
    (0..n).map(|i| format!("pkg-{i:04}")).collect()
}

/// CPU time this thread has run, from `/proc/thread-self/schedstat` (Linux). Unlike wall time
/// it does not count time spent waiting for a core, so it stays meaningful on a busy machine.
fn thread_cpu_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/schedstat").ok()?;
    text.split_whitespace().next()?.parse().ok()
}

/// Median of several timed batches: (wall µs per call, CPU µs per call if known).
fn measure(mut f: impl FnMut()) -> (f64, Option<f64>) {
    let start = Instant::now();
    let mut calls = 0u64;
    while start.elapsed() < Duration::from_millis(200) {
        f();
        calls += 1;
    }
    let per_batch = (calls / 5).max(1);
    let mut wall = Vec::new();
    let mut cpu = Vec::new();
    for _ in 0..9 {
        let c = thread_cpu_ns();
        let t = Instant::now();
        for _ in 0..per_batch {
            f();
        }
        wall.push(t.elapsed().as_secs_f64() * 1e6 / per_batch as f64);
        if let (Some(before), Some(after)) = (c, thread_cpu_ns()) {
            cpu.push(after.saturating_sub(before) as f64 / 1e3 / per_batch as f64);
        }
    }
    wall.sort_by(f64::total_cmp);
    cpu.sort_by(f64::total_cmp);
    (wall[wall.len() / 2], cpu.get(cpu.len() / 2).copied())
}

fn show((wall, cpu): (f64, Option<f64>)) -> String {
    match cpu {
        Some(c) => format!("{wall:.2} ({c:.2})"),
        None => format!("{wall:.2}"),
    }
}

fn main() {
    // As `gaffer serve` starts: before any other thread exists.
    gaffer::runtime::tune_allocator();
    let ctx = SelectContext::isolated();
    let cases: [(&str, Value); 4] = [
        ("small request", json!({"objective": "small docs update"})),
        (
            "small request, output=select",
            json!({"objective": "small docs update", "output": "select"}),
        ),
        (
            "50 scopes",
            json!({"objective": "Apply the lint autofix", "scopes": scopes(50), "notes": ["disjoint"], "max_parallel_lanes": 8}),
        ),
        (
            "1,000 scopes",
            json!({"objective": "Apply the lint autofix", "scopes": scopes(1000), "notes": ["disjoint"], "max_parallel_lanes": 8}),
        ),
    ];
    conformance_mix();
    println!("patterns: in-process selection ({REFERENCE_IN_PROCESS})");
    println!("µs per call, wall (CPU)");
    println!(
        "{:<30} {:>18} {:>18} {:>18}",
        "request", "decide", "to Value", "to bytes"
    );
    let mut buf = Vec::with_capacity(64 * 1024);
    for (name, params) in &cases {
        // Decision only: parse + plan (no rendering of the output wrapper).
        let decide = measure(|| {
            let p = parse_params(black_box(params)).unwrap();
            let outcome = build_plan(&p.request, p.roster_path.as_deref(), &ctx).unwrap();
            black_box(outcome.plan.lanes.len());
        });
        // The library entry point: params in, serde_json::Value out.
        let value = measure(|| {
            black_box(select(black_box(params), &ctx).unwrap());
        });
        // What a server writing a reply does: params in, JSON bytes out (no intermediate Value).
        let bytes = measure(|| {
            let p = parse_params(black_box(params)).unwrap();
            let outcome = build_plan(&p.request, p.roster_path.as_deref(), &ctx).unwrap();
            buf.clear();
            write_output(&outcome, p.output, &mut buf).unwrap();
            black_box(buf.len());
        });
        println!(
            "{name:<30} {:>18} {:>18} {:>18}",
            show(decide),
            show(value),
            show(bytes)
        );
    }
    stdio_round_trip(&cases);
    one_shot_cli();
}

/// One call per conformance case (with its environment and fixtures), the whole mix per
/// batch: what `patterns_conformance` checks for correctness, timed. Requests the reference
/// refuses are part of the mix (they cost a parse and an error).
fn conformance_mix() {
    let cases: Vec<(Value, SelectContext)> = support::cases()
        .into_iter()
        .map(|case| {
            let ctx = support::context_for(&case);
            (case["request"].clone(), ctx)
        })
        .collect();
    let mut buf = Vec::with_capacity(64 * 1024);
    let mut bytes = 0usize;
    for (request, ctx) in &cases {
        buf.clear();
        if let Ok(p) = parse_params(request)
            && let Ok(outcome) = build_plan(&p.request, p.roster_path.as_deref(), ctx)
        {
            let _ = write_output(&outcome, p.output, &mut buf);
        }
        bytes += buf.len();
    }
    let (wall, cpu) = measure(|| {
        for (request, ctx) in &cases {
            buf.clear();
            if let Ok(p) = parse_params(black_box(request))
                && let Ok(outcome) = build_plan(&p.request, p.roster_path.as_deref(), ctx)
            {
                let _ = write_output(&outcome, p.output, &mut buf);
            }
            black_box(buf.len());
        }
    });
    let n = cases.len() as f64;
    println!(
        "patterns: conformance mix, {} cases, params in, reply bytes out ({} bytes per call on average): {:.2} µs per call wall{} ({REFERENCE_IN_PROCESS})",
        cases.len(),
        bytes / cases.len(),
        wall / n,
        cpu.map_or(String::new(), |c| format!(", {:.2} µs CPU", c / n))
    );
    println!();
}

fn percentile(sorted: &[f64], p: f64) -> f64 {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// How a round trip reaches the selector.
#[derive(Clone, Copy)]
enum Wire {
    /// `serve --jsonl`, `patterns/select`, no handshake.
    Ndjson,
    /// `serve --mcp` (NDJSON), after `initialize`: `tools/call` `select_worker_pattern`.
    Mcp,
    /// `serve --lsp` (Content-Length frames), after `initialize`: `patterns/select`.
    Lsp,
}

/// One `gaffer serve` process and its pipes, speaking `wire`.
struct Conn {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: BufReader<std::process::ChildStdout>,
    wire: Wire,
    line: String,
}

impl Conn {
    fn start(ws: &std::path::Path, wire: Wire) -> Conn {
        let flag = match wire {
            Wire::Ndjson => "--jsonl",
            Wire::Mcp => "--mcp",
            Wire::Lsp => "--lsp",
        };
        let mut child = Command::new(BIN)
            .arg("--workspace")
            .arg(ws)
            .args(["serve", flag])
            .env_remove("WORKER_PATTERNS_ROSTER_PATH")
            .env_remove("HERMES_SWARM_ROSTER_PATH")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn gaffer");
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        let mut c = Conn {
            child,
            stdin,
            stdout,
            wire,
            line: String::new(),
        };
        match wire {
            Wire::Ndjson => {}
            Wire::Mcp => {
                c.call(0, "initialize", r#"{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}"#);
                c.send(r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}"#);
            }
            Wire::Lsp => {
                c.call(
                    0,
                    "initialize",
                    r#"{"processId":null,"rootUri":null,"capabilities":{}}"#,
                );
                c.send(r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#);
            }
        }
        c
    }

    fn send(&mut self, body: &str) {
        // One write(2) per message, as clients send them: an unbuffered `write!` issues one per
        // piece and wakes the server for each.
        let msg = match self.wire {
            Wire::Ndjson | Wire::Mcp => format!("{body}\n"),
            Wire::Lsp => format!("Content-Length: {}\r\n\r\n{body}", body.len()),
        };
        self.stdin.write_all(msg.as_bytes()).expect("write");
    }

    /// Sends a request and reads its reply (the next message: nothing else is in flight).
    fn call(&mut self, id: u64, method: &str, params: &str) -> &str {
        self.send(&format!(
            r#"{{"jsonrpc":"2.0","id":{id},"method":"{method}","params":{params}}}"#
        ));
        self.line.clear();
        match self.wire {
            Wire::Ndjson | Wire::Mcp => {
                self.stdout.read_line(&mut self.line).expect("read");
            }
            Wire::Lsp => {
                let mut len = 0usize;
                loop {
                    let mut h = String::new();
                    self.stdout.read_line(&mut h).expect("header");
                    let h = h.trim_end();
                    if h.is_empty() {
                        break;
                    }
                    if let Some(v) = h.strip_prefix("Content-Length:") {
                        len = v.trim().parse().expect("length");
                    }
                }
                let mut body = vec![0u8; len];
                std::io::Read::read_exact(&mut self.stdout, &mut body).expect("body");
                self.line = String::from_utf8(body).expect("utf-8");
            }
        }
        assert!(
            self.line.contains("\"result\""),
            "unexpected reply {}",
            self.line
        );
        &self.line
    }
}

impl Conn {
    /// The serving process's CPU time so far (all threads), ns.
    fn cpu_ns(&self) -> u64 {
        common::process_cpu_ns(self.child.id()).unwrap_or(0)
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where the kernel may run the bench and the serving process.
#[derive(Clone, Copy)]
enum Placement {
    /// Wherever the scheduler puts them: on an idle VM it wakes the server on the other,
    /// halted CPU, and a wake-up across CPUs costs a VM exit each way.
    Free,
    /// Both on one CPU (the bench pins itself before spawning; the child inherits the mask):
    /// the round trip without cross-CPU wake-ups, what the same request costs when the machine
    /// is busy enough that the scheduler keeps them together.
    OneCpu,
}

/// Restricts the calling thread (and the processes it spawns from now on) to `cpus`.
fn pin(cpus: &[usize]) {
    // SAFETY: a zeroed cpu_set_t is the empty set; the macros and the call touch only it.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        for &c in cpus {
            libc::CPU_SET(c, &mut set);
        }
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

/// The CPUs this process may run on now.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: as in `pin`; the kernel fills the set.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        if libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut set) != 0 {
            return Vec::new();
        }
        (0..libc::CPU_SETSIZE as usize)
            .filter(|&c| libc::CPU_ISSET(c, &set))
            .collect()
    }
}

/// Sequential selections to one serving process over each wire, placed freely and on one CPU.
fn stdio_round_trip(cases: &[(&str, Value)]) {
    let ws = tempfile::tempdir().expect("tempdir");
    let cpus = allowed_cpus();
    for (wire, title) in [
        (
            Wire::Ndjson,
            "patterns/select over stdio NDJSON, sequential",
        ),
        (
            Wire::Mcp,
            "MCP tools/call select_worker_pattern (serve --mcp), sequential",
        ),
        (
            Wire::Lsp,
            "patterns/select over LSP Content-Length frames (serve --lsp), sequential",
        ),
    ] {
        println!();
        println!(
            "{title} ({REFERENCE_ROUND_TRIP}; {})",
            common::machine_idle()
        );
        println!(
            "{:<44} {:>10} {:>10} {:>10} {:>14}",
            "request", "p50 µs", "p90 µs", "p99 µs", "server CPU µs"
        );
        round_trips(ws.path(), wire, Placement::Free, cases);
        if let Some(&first) = cpus.first() {
            pin(&[first]);
            round_trips(ws.path(), wire, Placement::OneCpu, cases);
            pin(&cpus);
        }
    }
}

/// One serving process on `wire`: its `ping` floor, then each case, one row each.
fn round_trips(ws: &std::path::Path, wire: Wire, placement: Placement, cases: &[(&str, Value)]) {
    let label = match placement {
        Placement::Free => "",
        Placement::OneCpu => ", one CPU",
    };
    let mut conn = Conn::start(ws, wire);
    // The floor of this wire in this run: a `ping` round trip (pipes, framing, dispatch).
    let mut id = 0u64;
    let cpu = conn.cpu_ns();
    let pings: Vec<f64> = (0..3_000)
        .map(|_| {
            id += 1;
            let t = Instant::now();
            conn.call(id, "ping", "{}");
            t.elapsed().as_secs_f64() * 1e6
        })
        .collect();
    let ping_cpu = (conn.cpu_ns() - cpu) as f64 / 3_000.0 / 1e3;
    print_row(&format!("ping (this wire's floor){label}"), pings, ping_cpu);
    for (name, params) in cases {
        let body = serde_json::to_string(params).expect("json");
        let (method, params) = match wire {
            Wire::Mcp => (
                "tools/call",
                format!(r#"{{"name":"select_worker_pattern","arguments":{body}}}"#),
            ),
            Wire::Ndjson | Wire::Lsp => ("patterns/select", body),
        };
        let n = if cases_is_big(params.len()) {
            if matches!(placement, Placement::OneCpu) {
                continue; // the large request's time is its work, wherever it runs
            }
            200
        } else {
            3_000
        };
        for _ in 0..n / 10 {
            id += 1;
            conn.call(id, method, &params);
        }
        let cpu = conn.cpu_ns();
        let samples: Vec<f64> = (0..n)
            .map(|_| {
                id += 1;
                let t = Instant::now();
                conn.call(id, method, &params);
                t.elapsed().as_secs_f64() * 1e6
            })
            .collect();
        let server_cpu = (conn.cpu_ns() - cpu) as f64 / n as f64 / 1e3;
        print_row(&format!("{name}{label}"), samples, server_cpu);
    }
}

/// One row: quantiles of the round trips (µs) and the server's CPU per call.
fn print_row(name: &str, mut samples: Vec<f64>, server_cpu: f64) {
    samples.sort_by(f64::total_cmp);
    println!(
        "{name:<44} {:>10.1} {:>10.1} {:>10.1} {:>14.1}",
        percentile(&samples, 0.5),
        percentile(&samples, 0.9),
        percentile(&samples, 0.99),
        server_cpu,
    );
}

/// Requests past this many bytes (the 1,000-scope one) get fewer samples.
fn cases_is_big(param_bytes: usize) -> bool {
    param_bytes > 4_000
}

/// `gaffer patterns select … --json` as a fresh process each time, next to `gaffer --version`
/// (process start and exit alone) for scale.
fn one_shot_cli() {
    let ws = tempfile::tempdir().expect("tempdir");
    let time_runs = |args: &[&str]| {
        let run = || {
            let out = Command::new(BIN)
                .arg("--workspace")
                .arg(ws.path())
                .args(args)
                .env_remove("WORKER_PATTERNS_ROSTER_PATH")
                .env_remove("HERMES_SWARM_ROSTER_PATH")
                .stderr(Stdio::null())
                .output()
                .expect("run gaffer");
            assert!(out.status.success());
        };
        for _ in 0..10 {
            run();
        }
        let mut samples: Vec<f64> = (0..200)
            .map(|_| {
                let t = Instant::now();
                run();
                t.elapsed().as_secs_f64() * 1e3
            })
            .collect();
        samples.sort_by(f64::total_cmp);
        (percentile(&samples, 0.5), percentile(&samples, 0.9))
    };
    let (base50, base90) = time_runs(&["--version"]);
    let (p50, p90) = time_runs(&["patterns", "select", "small docs update", "--json"]);
    println!();
    println!("one-shot CLI ({REFERENCE_CLI})");
    println!("gaffer --version (process start only): p50 {base50:.2} ms, p90 {base90:.2} ms");
    println!("gaffer patterns select --json:         p50 {p50:.2} ms, p90 {p90:.2} ms");
}
