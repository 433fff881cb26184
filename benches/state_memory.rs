//! Where the bytes of a workspace holding many operations go, and what opening it costs.
//!
//! `cargo bench --bench state_memory [-- N]` (N operations, default 100,000; the same
//! terminal `operation.created` records as the operations bench's recovery rows). A counting
//! global allocator gives live and peak heap bytes (requested sizes, and glibc chunk sizes:
//! 16-byte granules, 8 bytes of header, 32 at least); `/proc/self/status` gives VmRSS/VmHWM.
//!
//! Rows: the snapshot file's size and the time to read it raw (the physical limit of loading
//! it), `Workspace::open` (snapshot + replay of nothing after it) with its peak and live heap,
//! the same open from the journal alone (the snapshot removed), and the live heap per held
//! operation split by component. `GAFFER_BENCH_KEEP=DIR` also leaves a copy of the store in
//! `DIR/.gaffer`, to profile a serving process on it.

use std::alloc::{GlobalAlloc, Layout, System};
use std::path::Path;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use gaffer::workspace::{State, Workspace};

mod common;

struct Counting;

static LIVE: AtomicUsize = AtomicUsize::new(0);
static PEAK: AtomicUsize = AtomicUsize::new(0);
static LIVE_CHUNKS: AtomicUsize = AtomicUsize::new(0);

/// What glibc malloc really takes for a request of `n` bytes.
fn chunk(n: usize) -> usize {
    ((n + 8 + 15) & !15).max(32)
}

unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, l: Layout) -> *mut u8 {
        let p = unsafe { System.alloc(l) };
        if !p.is_null() {
            let now = LIVE.fetch_add(l.size(), Ordering::Relaxed) + l.size();
            PEAK.fetch_max(now, Ordering::Relaxed);
            LIVE_CHUNKS.fetch_add(chunk(l.size()), Ordering::Relaxed);
        }
        p
    }
    unsafe fn dealloc(&self, p: *mut u8, l: Layout) {
        unsafe { System.dealloc(p, l) };
        LIVE.fetch_sub(l.size(), Ordering::Relaxed);
        LIVE_CHUNKS.fetch_sub(chunk(l.size()), Ordering::Relaxed);
    }
    unsafe fn realloc(&self, p: *mut u8, l: Layout, new: usize) -> *mut u8 {
        let q = unsafe { System.realloc(p, l, new) };
        if !q.is_null() {
            let now = LIVE.fetch_add(new, Ordering::Relaxed) + new;
            LIVE.fetch_sub(l.size(), Ordering::Relaxed);
            PEAK.fetch_max(now, Ordering::Relaxed);
            LIVE_CHUNKS.fetch_add(chunk(new), Ordering::Relaxed);
            LIVE_CHUNKS.fetch_sub(chunk(l.size()), Ordering::Relaxed);
        }
        q
    }
}

#[global_allocator]
static ALLOC: Counting = Counting;

fn live() -> (usize, usize) {
    (
        LIVE.load(Ordering::Relaxed),
        LIVE_CHUNKS.load(Ordering::Relaxed),
    )
}

fn reset_peak() -> usize {
    let now = LIVE.load(Ordering::Relaxed);
    PEAK.store(now, Ordering::Relaxed);
    now
}

fn status_kib(field: &str) -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(field))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn mib(b: usize) -> f64 {
    b as f64 / (1024.0 * 1024.0)
}

/// A workspace holding `n` terminal operations, settled by a snapshot.
async fn build(dir: &Path, n: usize) {
    let ws = Workspace::open(dir).expect("open");
    common::commit_terminal_operations(&ws, n).await;
    ws.compact().await.expect("compact");
}

/// CPU time of the calling thread (the one that opens and decodes).
fn thread_cpu() -> Duration {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid clock id and a valid out-pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32)
}

/// Waits until a dropped workspace's threads have let go of its state.
fn settle() {
    let mut last = live().0;
    loop {
        std::thread::sleep(Duration::from_millis(60));
        let now = live().0;
        if now == last {
            return;
        }
        last = now;
    }
}

struct Opened {
    wall: Duration,
    cpu: Duration,
    peak: usize,
    live: (usize, usize),
}

/// Opens the workspace 3 times; the median by wall time, with its CPU, peak and live heap.
fn open_measured(dir: &Path) -> Opened {
    let mut runs = Vec::new();
    for _ in 0..3 {
        settle();
        let base = reset_peak();
        let base_chunks = live().1;
        let (t, cpu) = (Instant::now(), thread_cpu());
        let ws = Workspace::open(dir).expect("open");
        let _ = ws.read(|s| s.operations.operations.len());
        let (wall, cpu) = (t.elapsed(), thread_cpu() - cpu);
        let peak = PEAK.load(Ordering::Relaxed) - base;
        let (l, c) = live();
        runs.push(Opened {
            wall,
            cpu,
            peak,
            live: (l - base, c - base_chunks),
        });
        drop(ws);
    }
    runs.sort_by_key(|r| r.wall);
    runs.swap_remove(1)
}

fn read_raw(path: &Path) -> (Duration, usize) {
    let mut best = Duration::MAX;
    let mut len = 0;
    for _ in 0..3 {
        let t = Instant::now();
        let bytes = std::fs::read(path).expect("read");
        best = best.min(t.elapsed());
        len = bytes.len();
    }
    (best, len)
}

/// Live bytes (glibc chunks) freed by dropping what `take` removes from the state.
fn component(state: &mut State, take: impl FnOnce(&mut State) -> Box<dyn std::any::Any>) -> usize {
    let before = live().1;
    drop(take(state));
    before - live().1
}

fn per_op_breakdown(dir: &Path, n: usize) {
    let mut store = gaffer::store::Store::open(dir.join(".gaffer")).expect("store");
    let raw = store.take_raw_snapshot().expect("a snapshot");
    let mut state: State = raw.decode().expect("decode");
    drop(raw);
    let mut rows: Vec<(&str, usize)> = Vec::new();
    rows.push((
        "index (order, by state, by client, deadlines, refs, windows)",
        component(&mut state, |s| {
            Box::new(std::mem::take(&mut s.operations.index))
        }),
    ));
    rows.push((
        "terminal set",
        component(&mut state, |s| {
            Box::new(std::mem::take(&mut s.operations.terminal))
        }),
    ));
    rows.push((
        "by_key",
        component(&mut state, |s| {
            Box::new(std::mem::take(&mut s.operations.by_key))
        }),
    ));
    rows.push((
        "operations map (records and their strings)",
        component(&mut state, |s| {
            Box::new(std::mem::take(&mut s.operations.operations))
        }),
    ));
    rows.push((
        "the rest of the state",
        component(&mut state, |s| Box::new(std::mem::take(s))),
    ));
    let total: usize = rows.iter().map(|r| r.1).sum();
    println!("live heap per held operation (glibc chunks), by component:");
    for (what, bytes) in rows {
        println!("  {:>7.0} B  {what}", bytes as f64 / n as f64);
    }
    println!("  {:>7.0} B  total", total as f64 / n as f64);
}

/// Copies a store's journal (and its snapshot when `snapshot`) from `from` to `to`.
fn copy_store(from: &Path, to: &Path, snapshot: bool) {
    std::fs::create_dir_all(to.join("journal")).expect("mkdir");
    for e in std::fs::read_dir(from.join("journal")).expect("journal") {
        let e = e.expect("entry");
        std::fs::copy(e.path(), to.join("journal").join(e.file_name())).expect("copy");
    }
    if snapshot {
        std::fs::copy(from.join("snapshot.json"), to.join("snapshot.json")).expect("copy");
    }
}

fn main() {
    let n: usize = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(100_000);
    let dir = tempfile::tempdir().expect("tempdir");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(build(dir.path(), n));
    drop(rt);
    if let Some(keep) = std::env::var_os("GAFFER_BENCH_KEEP") {
        // Profiling aid: a copy of the store to open by hand (`gaffer --workspace DIR serve`).
        let to = Path::new(&keep).join(".gaffer");
        let _ = std::fs::remove_dir_all(&to);
        copy_store(&dir.path().join(".gaffer"), &to, true);
    }
    let snap = dir.path().join(".gaffer/snapshot.json");
    let (raw, len) = read_raw(&snap);
    println!(
        "snapshot of {n} operations: {:.1} MiB ({:.0} B/op), raw read {:.1} ms ({:.0} MiB/s): the floor",
        mib(len),
        len as f64 / n as f64,
        raw.as_secs_f64() * 1e3,
        mib(len) / raw.as_secs_f64()
    );
    let o = open_measured(dir.path());
    println!(
        "open from the snapshot: {:.0} ms wall, {:.0} ms CPU (median of 3 by wall); heap peak {:.1} MiB above the start, live after {:.1} MiB requested / {:.1} MiB in chunks ({:.0} B/op)",
        o.wall.as_secs_f64() * 1e3,
        o.cpu.as_secs_f64() * 1e3,
        mib(o.peak),
        mib(o.live.0),
        mib(o.live.1),
        o.live.1 as f64 / n as f64
    );
    println!(
        "size of one Operation record inline: {} B",
        std::mem::size_of::<gaffer::operations::state::Operation>()
    );
    per_op_breakdown(dir.path(), n);
    let journal_only = tempfile::tempdir().expect("tempdir");
    copy_store(
        &dir.path().join(".gaffer"),
        &journal_only.path().join(".gaffer"),
        false,
    );
    let o = open_measured(journal_only.path());
    println!(
        "open from the journal alone (replay): {:.0} ms wall, {:.0} ms CPU; heap peak {:.1} MiB, live after {:.1} MiB in chunks",
        o.wall.as_secs_f64() * 1e3,
        o.cpu.as_secs_f64() * 1e3,
        mib(o.peak),
        mib(o.live.1)
    );
    println!(
        "process: VmHWM {:.1} MiB, VmRSS {:.1} MiB",
        status_kib("VmHWM:") as f64 / 1024.0,
        status_kib("VmRSS:") as f64 / 1024.0
    );
}
