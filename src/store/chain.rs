//! The hash chain over journal records: what a record's hash is, the genesis value, the
//! in-memory view of the chain (head, first break, recent hashes) and the workspace id.
//!
//! **Record hash** = sha256 of the record's body bytes exactly as they stand in the frame (the
//! `length` bytes after the 8-byte length word + crc; see [`record_hash`]). The body holds the
//! record's `prev`, so each hash covers the whole history before it. A verifier recomputes it
//! from the segment bytes alone; no re-encoding is involved.
//!
//! **Genesis**: the first record of a fresh store has `prev` = 64 zeros ([`GENESIS`]). After a
//! snapshot, the chain continues from the head the snapshot recorded, so a store whose early
//! segments are gone still verifies from there.
//!
//! A link `record[n].prev == hash(record[n-1])` that does not hold is a *break at seq n*.
//! Tampering with the bytes of record k therefore shows as a break at k + 1, and tampering
//! with the head record itself only as a different head hash: that is what an operator
//! signature over a head (seq + hash) pins.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::end::JournalEnd;

/// Kind of the first record of a store created by a workspace (payload: `workspace_id`,
/// `created_at_ms`).
pub const STORE_CREATED: &str = "store.created";
/// How many recent record hashes [`ChainView::hash_at`] remembers: 65,536 × 32 bytes = 2 MiB
/// at most, enough to confirm any head an operator saw in the last several thousand commits.
pub const RECENT_HASHES: usize = 65_536;

/// A sha256 digest; shown and stored as 64 lower-case hex digits.
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Digest32(pub [u8; 32]);

/// `prev` of the first record of a fresh store.
pub const GENESIS: Digest32 = Digest32([0u8; 32]);

impl Digest32 {
    pub fn to_hex(&self) -> String {
        crate::util::hex(&self.0)
    }

    /// The hex digits without allocating (ASCII).
    pub fn hex_digits(&self) -> [u8; 64] {
        crate::util::hex32(&self.0)
    }

    pub fn from_hex(text: &str) -> Option<Digest32> {
        crate::util::unhex32(text).map(Digest32)
    }
}

impl fmt::Display for Digest32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

impl fmt::Debug for Digest32 {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Digest32({})", self.to_hex())
    }
}

/// The hash of a record whose frame body is `body`: the one definition of what is chained.
pub fn record_hash(body: &[u8]) -> Digest32 {
    Digest32(Sha256::digest(body).into())
}

/// The last record of a chain: its seq and hash (seq 0 and 64 zeros, the genesis value, for
/// an empty store).
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Head {
    pub seq: u64,
    /// 64 lower-case hex digits.
    pub hash: String,
}

/// The first record whose `prev` is not the hash of the record before it (tampering with
/// record k shows here as seq k + 1).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ChainBreak {
    pub seq: u64,
    pub reason: String,
}

/// The chain as this process has read it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, JsonSchema)]
pub struct ChainStatus {
    pub head: Head,
    /// Null while every link read so far holds.
    pub broken_at: Option<ChainBreak>,
}

/// Hashes of the most recent records, contiguous by seq, at most [`RECENT_HASHES`].
#[derive(Clone, Debug, Default)]
pub(crate) struct Ring {
    first_seq: u64,
    hashes: VecDeque<Digest32>,
}

impl Ring {
    pub fn push(&mut self, seq: u64, hash: Digest32) {
        if self.hashes.is_empty() || seq != self.first_seq + self.hashes.len() as u64 {
            self.hashes.clear();
            self.first_seq = seq;
        }
        self.hashes.push_back(hash);
        if self.hashes.len() > RECENT_HASHES {
            self.hashes.pop_front();
            self.first_seq += 1;
        }
    }

    pub fn get(&self, seq: u64) -> Option<Digest32> {
        let i = usize::try_from(seq.checked_sub(self.first_seq)?).ok()?;
        self.hashes.get(i).copied()
    }

    fn extend(&mut self, other: Ring) {
        if other.hashes.len() == RECENT_HASHES {
            *self = other;
            return;
        }
        for (seq, hash) in (other.first_seq..).zip(other.hashes) {
            self.push(seq, hash);
        }
    }
}

/// What a journal read learned about the chain, published into a [`ChainView`] once the read
/// is done (so the view's lock is never held across disk I/O).
#[derive(Debug, Default)]
pub(crate) struct ChainLog {
    pub ring: Ring,
    pub broken_at: Option<ChainBreak>,
    pub workspace_id: Option<String>,
}

impl ChainLog {
    /// Notes record `seq` (with `prev`, hashing to `hash`) read after a head hashing to `head`.
    pub fn link(&mut self, seq: u64, head: Digest32, prev: Digest32, hash: Digest32) {
        if prev != head && self.broken_at.is_none() {
            let reason = format!(
                "prev is {prev}, but the record before it hashes to {head}: the journal was altered before seq {seq}"
            );
            tracing::error!(seq, %reason, "journal hash chain broken");
            self.broken_at = Some(ChainBreak { seq, reason });
        }
        self.ring.push(seq, hash);
    }
}

#[derive(Debug, Default)]
struct Chain {
    head_seq: u64,
    head: Digest32,
    broken_at: Option<ChainBreak>,
    ring: Ring,
    workspace_id: Option<String>,
}

/// A shared, cheap-to-read view of the chain a [`Store`](super::Store) has read or written,
/// and of where in the journal it ends. Reading it takes only its own short lock (the end: no
/// lock), never the store's or any disk I/O.
#[derive(Clone, Debug, Default)]
pub struct ChainView(Arc<Viewed>);

#[derive(Debug, Default)]
struct Viewed {
    chain: Mutex<Chain>,
    end: JournalEnd,
}

impl ChainView {
    fn lock(&self) -> MutexGuard<'_, Chain> {
        // Nothing panics while holding it; a poisoned lock still holds consistent data.
        self.0.chain.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Where the Store's reads and appends have got to in the journal.
    pub fn end(&self) -> &JournalEnd {
        &self.0.end
    }

    pub fn head(&self) -> Head {
        let chain = self.lock();
        Head {
            seq: chain.head_seq,
            hash: chain.head.to_hex(),
        }
    }

    pub fn status(&self) -> ChainStatus {
        let chain = self.lock();
        ChainStatus {
            head: Head {
                seq: chain.head_seq,
                hash: chain.head.to_hex(),
            },
            broken_at: chain.broken_at.clone(),
        }
    }

    /// The first broken link read, if any ([`ChainView::status`] without the head's hex).
    pub fn broken_at(&self) -> Option<ChainBreak> {
        self.lock().broken_at.clone()
    }

    /// The hash of record `seq` if it is among the [`RECENT_HASHES`] last ones read.
    pub fn hash_at(&self, seq: u64) -> Option<String> {
        self.lock().ring.get(seq).map(|h| h.to_hex())
    }

    pub fn workspace_id(&self) -> Option<String> {
        self.lock().workspace_id.clone()
    }

    /// Starts over from `head` (a replay from genesis or from a snapshot).
    pub(crate) fn reset(&self, seq: u64, head: Digest32, workspace_id: Option<String>) {
        let mut ring = Ring::default();
        if seq > 0 {
            ring.push(seq, head);
        }
        // The journal is not read yet.
        self.end().publish(0, 0);
        *self.lock() = Chain {
            head_seq: seq,
            head,
            workspace_id,
            ring,
            broken_at: None,
        };
    }

    /// Adds what a read or an append learned; the head moves to `seq`/`head`.
    pub(crate) fn publish(&self, seq: u64, head: Digest32, log: ChainLog) {
        let mut chain = self.lock();
        chain.head_seq = seq;
        chain.head = head;
        chain.ring.extend(log.ring);
        if chain.broken_at.is_none() {
            chain.broken_at = log.broken_at;
        }
        if log.workspace_id.is_some() {
            chain.workspace_id = log.workspace_id;
        }
    }
}

/// The workspace id a `store.created` record at seq 1 declares.
pub(crate) fn declared_workspace_id(seq: u64, kind: &str, payload: &str) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct Declared {
        workspace_id: String,
    }
    if seq != 1 || kind != STORE_CREATED {
        return None;
    }
    serde_json::from_str::<Declared>(payload)
        .ok()
        .map(|d| d.workspace_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_keeps_the_last_hashes_contiguously() {
        let mut ring = Ring::default();
        for seq in 1..=(RECENT_HASHES as u64 + 10) {
            ring.push(seq, record_hash(&seq.to_le_bytes()));
        }
        assert_eq!(ring.get(10), None, "older than the ring");
        assert_eq!(ring.get(11), Some(record_hash(&11u64.to_le_bytes())));
        let last = RECENT_HASHES as u64 + 10;
        assert_eq!(ring.get(last), Some(record_hash(&last.to_le_bytes())));
        assert_eq!(ring.get(last + 1), None);
        // A gap (a replay that restarted elsewhere) starts the ring over.
        ring.push(last + 5, GENESIS);
        assert_eq!(ring.get(last), None);
        assert_eq!(ring.get(last + 5), Some(GENESIS));
    }

    #[test]
    fn view_publishes_head_first_break_and_id() {
        let view = ChainView::default();
        assert_eq!(
            view.head(),
            Head {
                seq: 0,
                hash: "0".repeat(64)
            }
        );
        let h1 = record_hash(b"one");
        let mut log = ChainLog::default();
        log.link(1, GENESIS, GENESIS, h1);
        log.link(2, h1, GENESIS, GENESIS);
        log.workspace_id = Some("ws_x".into());
        view.publish(2, GENESIS, log);
        let status = view.status();
        assert_eq!(status.head.seq, 2);
        assert_eq!(status.broken_at.map(|b| b.seq), Some(2));
        assert_eq!(view.hash_at(1), Some(h1.to_hex()));
        assert_eq!(view.workspace_id().as_deref(), Some("ws_x"));
    }
}
