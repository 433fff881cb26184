//! `gaffer store verify|log|compact`.

use std::io::Write;
use std::path::Path;
use std::process::ExitCode;

use clap::Subcommand;

use crate::store::{self, Entry, Store, StoreError};
use crate::workspace::Workspace;

#[derive(Debug, Subcommand)]
pub enum StoreCmd {
    /// Check every segment, record checksum, sequence, hash-chain link, snapshot and blob
    /// (read-only); report how far the chain verifies and what operator signatures vouch for.
    Verify,
    /// Print the audit journal as JSON lines: each record with its `prev` and `hash`.
    Log {
        /// Only records whose kind equals this or starts with `KIND.`.
        #[arg(long)]
        kind: Option<String>,
        /// Only records after this sequence number.
        #[arg(long, default_value_t = 0)]
        after_seq: u64,
        /// Stop after this many records.
        #[arg(long)]
        limit: Option<usize>,
    },
    /// Write a snapshot now and start a new journal segment.
    Compact,
    /// Accept the store as it is now: its head becomes the one this machine remembers
    /// (outside the workspace). Run it only after `gaffer store verify` reported a rollback you
    /// understand (a backup restored, say): executions stay refused until then.
    Reanchor,
}

/// How the store stands against this machine's anchor (opening it as a serving process would).
fn standing_of(root: &Path) -> crate::anchor::Standing {
    match Workspace::open(root) {
        Ok(ws) => ws.standing(),
        Err(e) => crate::anchor::Standing::Unavailable {
            detail: format!("the workspace cannot be opened: {e}"),
        },
    }
}

pub async fn run(cmd: StoreCmd, root: &Path) -> ExitCode {
    let dir = root.join(".gaffer");
    match cmd {
        StoreCmd::Verify => verify(root, &dir),
        StoreCmd::Log {
            kind,
            after_seq,
            limit,
        } => log(&dir, kind.as_deref(), after_seq, limit),
        StoreCmd::Reanchor => reanchor(root),
        StoreCmd::Compact => compact(root).await,
    }
}

/// `store verify`: the store's own report with the workspace's standing beside it; fails
/// unless both are sound.
fn verify(root: &Path, dir: &Path) -> ExitCode {
    let report = match store::verify(dir) {
        Ok(report) => report,
        Err(e) => {
            eprintln!("gaffer: store verify: {e}");
            return ExitCode::FAILURE;
        }
    };
    let standing = standing_of(root);
    let mut shown = serde_json::to_value(&report).unwrap_or_default();
    shown["standing"] = serde_json::to_value(&standing).unwrap_or_default();
    let intact = standing.is_intact();
    shown["ok"] = serde_json::Value::Bool(report.ok && intact);
    crate::outln!("{}", super::output::json(&shown));
    if let Some(why) = standing.refusal() {
        eprintln!("gaffer: store verify: {why}");
    }
    if let Some(b) = &report.chain.broken_at {
        eprintln!(
            "gaffer: store verify: hash chain broken at seq {} ({}, offset {}): {}",
            b.seq,
            b.segment.display(),
            b.offset,
            b.reason
        );
    }
    if report.ok && intact {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `store log`: records after `after_seq` as JSON lines, only kind `kind` (and its
/// sub-kinds) when given, at most `limit`.
fn log(dir: &Path, kind: Option<&str>, after_seq: u64, limit: Option<usize>) -> ExitCode {
    let store = match Store::open(dir) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("gaffer: store log: {e}");
            return ExitCode::FAILURE;
        }
    };
    let stdout = std::io::stdout();
    let mut out = std::io::BufWriter::new(stdout.lock());
    let mut printed = 0usize;
    let limit = limit.unwrap_or(usize::MAX);
    let result = store.read_all_entries(after_seq, |entry: Entry| -> Result<(), StoreError> {
        let rec = &entry.record;
        if printed >= limit {
            return Ok(());
        }
        if let Some(k) = kind
            && !(rec.kind == k || rec.kind.starts_with(&format!("{k}.")))
        {
            return Ok(());
        }
        printed += 1;
        let line = serde_json::json!({
            "seq": rec.seq,
            "prev": entry.prev.to_hex(),
            "hash": entry.hash.to_hex(),
            "time_ms": rec.time_ms,
            "kind": rec.kind,
            "payload": rec.payload,
        });
        writeln!(out, "{}", super::output::json_line(&line)).map_err(|e| StoreError::Io {
            path: "stdout".into(),
            source: e,
        })
    });
    let _ = out.flush();
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("gaffer: store log: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `store reanchor`: this machine's anchor moves to the store's head as it is now.
fn reanchor(root: &Path) -> ExitCode {
    let ws = match Workspace::open(root) {
        Ok(ws) => ws,
        Err(e) => {
            eprintln!("gaffer: store reanchor: {e}");
            return ExitCode::FAILURE;
        }
    };
    let before = ws.standing();
    match ws.reanchor() {
        Ok(head) => {
            crate::outln!(
                "{}",
                super::output::json_line(&serde_json::json!({"anchored": head, "was": before}))
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gaffer: store reanchor: {e}");
            ExitCode::FAILURE
        }
    }
}

/// `store compact`: a snapshot now, and a new journal segment.
async fn compact(root: &Path) -> ExitCode {
    let ws = match Workspace::open(root) {
        Ok(ws) => ws,
        Err(e) => {
            eprintln!("gaffer: store compact: {e}");
            return ExitCode::FAILURE;
        }
    };
    match ws.compact().await {
        Ok(seq) => {
            crate::outln!(
                "{}",
                super::output::json_line(&serde_json::json!({"snapshot_seq": seq}))
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("gaffer: store compact: {e}");
            ExitCode::FAILURE
        }
    }
}
