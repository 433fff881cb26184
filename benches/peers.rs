//! gaffer against minimal servers built on the crates a Rust user would pick, all measured in
//! the same run on the same machine: `lsp-server` and `tower-lsp` for LSP, `rmcp` (the official
//! Rust MCP SDK) for MCP. The peers live in `benches/peers/` (their own cargo workspace, built
//! here in release with the same fat-LTO profile); if they cannot be built, only gaffer's rows
//! are printed.
//!
//! Rows, per server:
//! - startup: spawn → the reply to its first request (`initialize`; for plain NDJSON, `ping`);
//! - idle RSS after the handshake and a warm-up;
//! - sequential round trips of a trivial request (`ping` → `{}`) and, over MCP, a `tools/call`
//!   (gaffer: `gaffer_status`, a real read of the workspace; rmcp: a tool returning one text
//!   block): p50 / p90 / p99 / p99.9 / max. Servers take turns in blocks, so drift of the shared
//!   machine falls on all of them alike.
//!
//! On x86_64 glibc Linux gaffer is also built as a static PIE (README's install line there) and
//! its startup and idle RSS rows follow the dynamic build's.
//!
//! Then what the start-up figures depend on in gaffer's build: how much of `link/startup.order`
//! the binary still matches, and whether its relative relocations are packed (RELR).
//!
//! Run: `cargo bench --bench peers` (asserts nothing).

use std::collections::{HashMap, HashSet};
use std::io::{BufRead, BufReader, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

mod common;
use common::percentile as pct;

const GAFFER: &str = env!("CARGO_BIN_EXE_gaffer");

#[derive(Clone, Copy, PartialEq)]
enum Framing {
    /// `Content-Length` headers (LSP).
    Headers,
    /// One JSON text per line (MCP stdio, gaffer's `--jsonl`).
    Lines,
}

/// A server under test: how to start it and how it frames messages.
struct Server {
    name: &'static str,
    program: PathBuf,
    args: Vec<String>,
    framing: Framing,
    /// The first request and the notification that completes the handshake.
    handshake: Option<(&'static str, &'static str)>,
}

const LSP_INIT: (&str, &str) = (
    r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"processId":null,"rootUri":null,"capabilities":{}}}"#,
    r#"{"jsonrpc":"2.0","method":"initialized","params":{}}"#,
);
const MCP_INIT: (&str, &str) = (
    r#"{"jsonrpc":"2.0","id":0,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"bench","version":"1"}}}"#,
    r#"{"jsonrpc":"2.0","method":"notifications/initialized","params":{}}"#,
);

/// One running server and its pipes.
struct Conn {
    child: Child,
    stdin: ChildStdin,
    stdout: BufReader<ChildStdout>,
    framing: Framing,
    buf: Vec<u8>,
    header: String,
}

impl Conn {
    fn spawn(s: &Server) -> Conn {
        let mut child = Command::new(&s.program)
            .args(&s.args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", s.name));
        let stdin = child.stdin.take().expect("stdin");
        let stdout = BufReader::new(child.stdout.take().expect("stdout"));
        Conn {
            child,
            stdin,
            stdout,
            framing: s.framing,
            buf: Vec::new(),
            header: String::new(),
        }
    }

    fn send(&mut self, body: &str) {
        // One write per message, as clients send them (an unbuffered `write!` would issue one
        // write(2) per piece and wake the server for each).
        let msg = match self.framing {
            Framing::Lines => format!("{body}\n"),
            Framing::Headers => format!("Content-Length: {}\r\n\r\n{body}", body.len()),
        };
        self.stdin.write_all(msg.as_bytes()).expect("write");
    }

    /// The next message, whole.
    fn recv(&mut self) -> &[u8] {
        self.buf.clear();
        match self.framing {
            Framing::Lines => {
                self.stdout.read_until(b'\n', &mut self.buf).expect("read");
            }
            Framing::Headers => {
                let mut len = 0usize;
                loop {
                    self.header.clear();
                    self.stdout.read_line(&mut self.header).expect("header");
                    let h = self.header.trim_end();
                    if h.is_empty() {
                        break;
                    }
                    if let Some(v) = h.strip_prefix("Content-Length:") {
                        len = v.trim().parse().expect("length");
                    }
                }
                self.buf.resize(len, 0);
                self.stdout.read_exact(&mut self.buf).expect("body");
            }
        }
        assert!(!self.buf.is_empty(), "server closed its output");
        &self.buf
    }

    /// A request and its reply (nothing else is in flight).
    fn call(&mut self, body: &str) {
        self.send(body);
        let reply = self.recv();
        assert!(
            reply.windows(8).any(|w| w == b"\"result\""),
            "unexpected reply {}",
            String::from_utf8_lossy(reply)
        );
    }

    fn rss_kib(&self) -> Option<u64> {
        common::rss_kib(&self.child.id().to_string())
    }
}

impl Drop for Conn {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawn → the reply to the first request, with the handshake (or a `ping`) as that request.
fn startup(s: &Server) -> Duration {
    let t = Instant::now();
    let mut c = Conn::spawn(s);
    match s.handshake {
        Some((init, _)) => c.call(init),
        None => c.call(r#"{"jsonrpc":"2.0","id":0,"method":"ping"}"#),
    }
    t.elapsed()
}

fn ready(s: &Server) -> Conn {
    let mut c = Conn::spawn(s);
    if let Some((init, done)) = s.handshake {
        c.call(init);
        c.send(done);
    }
    c
}

fn show(d: Duration) -> String {
    let us = d.as_secs_f64() * 1e6;
    if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.1} µs")
    }
}

struct Dist {
    p50: Duration,
    p90: Duration,
    p99: Duration,
    p999: Duration,
    max: Duration,
}

fn dist(mut v: Vec<Duration>) -> Dist {
    v.sort();
    Dist {
        p50: pct(&v, 0.5),
        p90: pct(&v, 0.9),
        p99: pct(&v, 0.99),
        p999: pct(&v, 0.999),
        max: v[v.len() - 1],
    }
}

fn print_dist(name: &str, d: &Dist) {
    println!(
        "  {name:<28} p50 {:>9}  p90 {:>9}  p99 {:>9}  p99.9 {:>9}  max {:>9}",
        show(d.p50),
        show(d.p90),
        show(d.p99),
        show(d.p999),
        show(d.max)
    );
}

/// Sequential round trips of `body` (with `{id}` replaced), servers taking turns in blocks.
fn round_trips(servers: &[&Server], body: &str, blocks: usize, per_block: usize) -> Vec<Dist> {
    let mut conns: Vec<Conn> = servers.iter().map(|s| ready(s)).collect();
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(blocks * per_block); conns.len()];
    let mut id = 1u64;
    for c in &mut conns {
        for _ in 0..500 {
            id += 1;
            c.call(&body.replace("{id}", &id.to_string()));
        }
    }
    for _ in 0..blocks {
        for (c, out) in conns.iter_mut().zip(samples.iter_mut()) {
            for _ in 0..per_block {
                id += 1;
                let msg = body.replace("{id}", &id.to_string());
                let t = Instant::now();
                c.call(&msg);
                out.push(t.elapsed());
            }
        }
    }
    samples.into_iter().map(dist).collect()
}

fn startups(servers: &[&Server], rounds: usize) -> Vec<Dist> {
    let mut samples: Vec<Vec<Duration>> = vec![Vec::with_capacity(rounds); servers.len()];
    for s in servers {
        startup(s); // page cache warm
    }
    for _ in 0..rounds {
        for (s, out) in servers.iter().zip(samples.iter_mut()) {
            out.push(startup(s));
        }
    }
    samples.into_iter().map(dist).collect()
}

fn idle_rss(s: &Server, warm: &str) -> Option<u64> {
    let mut c = ready(s);
    for id in 1..=200u64 {
        c.call(&warm.replace("{id}", &id.to_string()));
    }
    std::thread::sleep(Duration::from_millis(300));
    c.rss_kib()
}

/// `cargo` as this bench was run by, and a directory of the target dir for a build of its own.
fn cargo_into(sub: &str) -> (Command, PathBuf) {
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("target"))
        .join(sub);
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    (Command::new(cargo), target)
}

/// Builds the peer servers; `None` (with the reason printed) when they cannot be built here.
fn build_peers() -> Option<PathBuf> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("benches/peers/Cargo.toml");
    let (mut cargo, target) = cargo_into("peers");
    eprintln!("building the peer servers (benches/peers) …");
    let status = cargo
        .args(["build", "--release", "--quiet", "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .status();
    match status {
        Ok(s) if s.success() => Some(target.join("release")),
        Ok(s) => {
            println!("peers not built ({s}): only gaffer's rows follow");
            None
        }
        Err(e) => {
            println!("peers not built ({e}): only gaffer's rows follow");
            None
        }
    }
}

/// gaffer built as a static PIE, as README's install line for x86_64 glibc Linux builds it
/// (`-C target-feature=+crt-static`): no dynamic loader runs and no shared library is mapped
/// at start. Built here like the peers, in its own target directory. `None` elsewhere.
fn build_static_gaffer() -> Option<PathBuf> {
    const TRIPLE: &str = "x86_64-unknown-linux-gnu";
    if !cfg!(all(
        target_arch = "x86_64",
        target_os = "linux",
        target_env = "gnu"
    )) {
        return None;
    }
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR")).join("Cargo.toml");
    let (mut cargo, target) = cargo_into("static");
    eprintln!("building gaffer as a static PIE ({TRIPLE}) …");
    let status = cargo
        .args([
            "build",
            "--release",
            "--quiet",
            "--locked",
            "--bin",
            "gaffer",
        ])
        .args(["--target", TRIPLE, "--manifest-path"])
        .arg(&manifest)
        .arg("--target-dir")
        .arg(&target)
        .env("RUSTFLAGS", "-C target-feature=+crt-static")
        .status();
    match status {
        Ok(s) if s.success() => Some(target.join(TRIPLE).join("release/gaffer")),
        Ok(s) => {
            println!("static gaffer not built ({s}): its rows are left out");
            None
        }
        Err(e) => {
            println!("static gaffer not built ({e}): its rows are left out");
            None
        }
    }
}

fn gaffer(
    ws: &Path,
    name: &'static str,
    flag: &str,
    handshake: Option<(&'static str, &'static str)>,
) -> Server {
    gaffer_at(Path::new(GAFFER), ws, name, flag, handshake)
}

fn gaffer_at(
    program: &Path,
    ws: &Path,
    name: &'static str,
    flag: &str,
    handshake: Option<(&'static str, &'static str)>,
) -> Server {
    let framing = if flag == "--lsp" {
        Framing::Headers
    } else {
        Framing::Lines
    };
    Server {
        name,
        program: program.to_path_buf(),
        args: vec![
            "--workspace".into(),
            ws.display().to_string(),
            "serve".into(),
            flag.into(),
        ],
        framing,
        handshake,
    }
}

fn peer(
    dir: &Path,
    name: &'static str,
    framing: Framing,
    handshake: (&'static str, &'static str),
) -> Server {
    Server {
        name,
        program: dir.join(name),
        args: Vec::new(),
        framing,
        handshake: Some(handshake),
    }
}

fn ratio(a: Duration, b: Duration) -> f64 {
    b.as_secs_f64() / a.as_secs_f64()
}

fn main() {
    let quick = std::env::args().any(|a| a == "--quick");
    let (blocks, per_block, spawns) = if quick {
        (4, 500, 40)
    } else {
        (10, 2_000, 200)
    };
    let ws = tempfile::tempdir().expect("tempdir");
    let peers = build_peers();
    let static_build = build_static_gaffer();

    let g_lsp = gaffer(ws.path(), "gaffer serve --lsp", "--lsp", Some(LSP_INIT));
    let g_mcp = gaffer(ws.path(), "gaffer serve --mcp", "--mcp", Some(MCP_INIT));
    let g_nd = gaffer(ws.path(), "gaffer serve --jsonl", "--jsonl", None);
    let peer_servers = peers.as_deref().map(|dir| {
        (
            peer(dir, "peer-lsp-server", Framing::Headers, LSP_INIT),
            peer(dir, "peer-tower-lsp", Framing::Headers, LSP_INIT),
            peer(dir, "peer-rmcp", Framing::Lines, MCP_INIT),
        )
    });

    let mut lsp: Vec<&Server> = vec![&g_lsp];
    let mut mcp: Vec<&Server> = vec![&g_mcp];
    if let Some((ls, tl, rm)) = &peer_servers {
        lsp.extend([ls, tl]);
        mcp.push(rm);
    }

    let ping = r#"{"jsonrpc":"2.0","id":{id},"method":"ping"}"#;
    println!(
        "LSP (Content-Length frames): `ping` → {{}}, sequential, {blocks}×{per_block} per server in turns"
    );
    let d = round_trips(&lsp, ping, blocks, per_block);
    for (s, d) in lsp.iter().zip(&d) {
        print_dist(s.name, d);
    }
    for (s, other) in lsp.iter().zip(&d).skip(1) {
        println!(
            "  gaffer vs {:<18} p50 {:.2}×  p99 {:.2}×  p99.9 {:.2}× (>1: gaffer faster)",
            s.name,
            ratio(d[0].p50, other.p50),
            ratio(d[0].p99, other.p99),
            ratio(d[0].p999, other.p999)
        );
    }

    println!("MCP (NDJSON): `ping`, then `tools/call`, sequential");
    let d = round_trips(&mcp, ping, blocks, per_block);
    for (s, d) in mcp.iter().zip(&d) {
        print_dist(&format!("{} ping", s.name), d);
    }
    let calls: Vec<(&Server, &str)> = mcp
        .iter()
        .map(|s| {
            let name = if s.name.starts_with("gaffer") {
                "gaffer_status"
            } else {
                "ping"
            };
            (*s, name)
        })
        .collect();
    for (s, tool) in &calls {
        let body = format!(
            r#"{{"jsonrpc":"2.0","id":{{id}},"method":"tools/call","params":{{"name":"{tool}","arguments":{{}}}}}}"#
        );
        let d = round_trips(&[s], &body, blocks, per_block / 2);
        print_dist(&format!("{} tools/call {tool}", s.name), &d[0]);
    }

    println!("startup: spawn → reply to the first request ({spawns} spawns each, in turns)");
    let statics = static_build.as_deref().map(|bin| {
        [
            gaffer_at(bin, ws.path(), "gaffer static --jsonl", "--jsonl", None),
            gaffer_at(
                bin,
                ws.path(),
                "gaffer static --lsp",
                "--lsp",
                Some(LSP_INIT),
            ),
            gaffer_at(
                bin,
                ws.path(),
                "gaffer static --mcp",
                "--mcp",
                Some(MCP_INIT),
            ),
        ]
    });
    let mut all: Vec<&Server> = vec![&g_nd, &g_lsp, &g_mcp];
    all.extend(statics.iter().flatten());
    if let Some((ls, tl, rm)) = &peer_servers {
        all.extend([ls, tl, rm]);
    }
    let d = startups(&all, spawns);
    for (s, d) in all.iter().zip(&d) {
        let first = if s.handshake.is_some() {
            "initialize"
        } else {
            "ping"
        };
        print_dist(&format!("{} ({first})", s.name), d);
    }

    println!("idle RSS after the handshake and 200 pings");
    for s in &all {
        let kib = idle_rss(s, ping);
        println!(
            "  {:<28} {}",
            s.name,
            kib.map_or("?".into(), |k| format!("{:.1} MiB", k as f64 / 1024.0))
        );
    }
    println!("{}", link_order_coverage());
    println!("{}", relocation_format());
}

/// How the measured binary's relative relocations are stored (build.rs packs them as RELR
/// where the glibc allows): the loader reads all of them at every start.
fn relocation_format() -> String {
    let Ok(out) = Command::new("readelf").args(["-d", GAFFER]).output() else {
        return "relocations: `readelf` not available to check them".into();
    };
    let dynamic = String::from_utf8_lossy(&out.stdout);
    // `0x… (RELASZ)   276240 (bytes)`: the size after the tag.
    let size_of = |tag: &str| {
        dynamic.lines().find(|l| l.contains(tag)).and_then(|l| {
            l.split(tag)
                .nth(1)?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
    };
    let rela = size_of("(RELASZ)").unwrap_or(0);
    match size_of("(RELRSZ)") {
        Some(relr) => format!(
            "relocations: packed as RELR ({relr} bytes, and {rela} bytes of RELA) read at each start"
        ),
        None => format!("relocations: RELA only ({rela} bytes read at each start)"),
    }
}

/// How much of `link/startup.order` (the start-up functions build.rs asks the linker to lay
/// out together) the measured binary still has. A toolchain or dependency update, or an edit
/// that moves code, renames symbols (legacy mangling ends each name in a hash), and idle RSS
/// grows back. The count of names found cannot tell (the file lists three builds, about a
/// third each); a listed function present in the binary under another hash can.
fn link_order_coverage() -> String {
    let order = Path::new(env!("CARGO_MANIFEST_DIR")).join("link/startup.order");
    let Ok(text) = std::fs::read_to_string(&order) else {
        return "link/startup.order: absent".into();
    };
    let Ok(out) = Command::new("nm").arg(GAFFER).output() else {
        return "link/startup.order: `nm` not available to check it".into();
    };
    let names = String::from_utf8_lossy(&out.stdout);
    let present: HashSet<&str> = names
        .lines()
        .filter_map(|l| l.split_whitespace().last())
        .collect();
    let wanted: Vec<&str> = text.lines().filter(|l| !l.is_empty()).collect();
    let found = wanted.iter().filter(|n| present.contains(*n)).count();
    let renamed = renamed_since(&wanted, &present);
    format!(
        "link/startup.order: {found} of {} start-up functions found in the binary (three builds listed, about a third each); {renamed} listed functions are in it under another hash only{}",
        wanted.len(),
        if renamed > 3 {
            ": the file is stale, regenerate it with link/startup-order.sh"
        } else {
            ""
        }
    )
}

/// Listed functions (counted by name without the legacy hash) that the binary has, but under
/// none of the hashes the file lists for them.
fn renamed_since(wanted: &[&str], present: &HashSet<&str>) -> usize {
    let mut listed: HashMap<&str, bool> = HashMap::new();
    for name in wanted {
        *listed.entry(without_hash(name)).or_default() |= present.contains(name);
    }
    let in_binary: HashSet<&str> = present.iter().map(|n| without_hash(n)).collect();
    listed
        .iter()
        .filter(|&(name, &any_found)| !any_found && in_binary.contains(name))
        .count()
}

/// A legacy-mangled name without its closing `17h<16 hex>E` (v0 names carry no such hash).
fn without_hash(name: &str) -> &str {
    let hash = name.len().checked_sub(20).and_then(|at| name.get(at..));
    match hash {
        Some(h)
            if h.starts_with("17h")
                && h.ends_with('E')
                && h[3..19].bytes().all(|b| b.is_ascii_hexdigit()) =>
        {
            &name[..name.len() - 20]
        }
        _ => name,
    }
}
