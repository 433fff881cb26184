//! Fixtures and readings shared by the benches (each bench uses a part of them).
#![allow(dead_code)]

pub mod noop;

use std::time::Duration;

use gaffer::workspace::{NewRecord, State, Workspace};
use serde_json::json;

/// The resident set of process `pid` ("self" for this one), in KiB.
pub fn rss_kib(pid: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    status
        .lines()
        .find(|l| l.starts_with("VmRSS:"))?
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// CPU time process `pid` has run, all its threads, in ns (`/proc/<pid>/task/*/schedstat`,
/// Linux): the server's own cost of a round trip, beside the wall time that also holds the
/// machine's wake-ups.
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    let tasks = std::fs::read_dir(format!("/proc/{pid}/task")).ok()?;
    let mut ns = 0u64;
    for t in tasks.flatten() {
        let text = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
        ns += text
            .split_whitespace()
            .next()
            .and_then(|v| v.parse::<u64>().ok())
            .unwrap_or(0);
    }
    Some(ns)
}

/// How this machine's idle CPUs wait (cpuidle driver, and the guest halt-poll window when the
/// driver is haltpoll): with no polling every wake-up of a parked thread exits the VM, which
/// sets the floor under every cross-thread and cross-process round trip here.
pub fn machine_idle() -> String {
    let read = |p: &str| {
        std::fs::read_to_string(p)
            .ok()
            .map(|s| s.trim().to_string())
    };
    let driver =
        read("/sys/devices/system/cpu/cpuidle/current_driver").unwrap_or_else(|| "unknown".into());
    match read("/sys/module/haltpoll/parameters/guest_halt_poll_ns") {
        Some(ns) if driver == "haltpoll" => format!("cpuidle {driver}, guest halt-poll {ns} ns"),
        _ => format!("cpuidle {driver}"),
    }
}

/// The `p` quantile (0..=1) of sorted samples, nearest rank.
pub fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted[((sorted.len() as f64 - 1.0) * p).round() as usize]
}

/// Commits `n` operations, terminal (denied) now, in batches of 1,000 records, so a serving
/// process holds them (the 30-day retention does not prune them) and a snapshot carries them.
pub async fn commit_terminal_operations(ws: &Workspace, n: usize) {
    let per = 1000;
    for b in 0..n.div_ceil(per) {
        let count = per.min(n - b * per);
        ws.commit(move |_s: &State| {
            let now = gaffer::util::now_ms();
            let recs = (0..count)
                .map(|i| {
                    let id = format!("op_{b}_{i}");
                    NewRecord::new(
                        "operation.created",
                        json!({"operation": {
                            "id": id, "client_id": "c", "idempotency_key": id, "operation": "bench.noop",
                            "provider": "bench", "submitted": "{}", "reason": "r", "target": {}, "arguments": {},
                            "state": "denied", "revision": 1, "approval_id": null, "created_at_ms": now,
                            "updated_at_ms": now, "terminal_at_ms": now,
                            "presentation": {"title": "t", "summary": ""}, "plan_digest": null, "plan": null,
                            "result": null, "upstream_status": null,
                            "error": {"code": "operation_policy_denied", "message": "no"}},
                          "approval": null}),
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
