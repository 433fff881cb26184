//! The workspace: the journal folded into in-memory state, and the one place mutations happen.
//!
//! Every change goes through [`Workspace::commit`]: a closure validates against the current
//! state and returns the records to write. A dedicated writer thread drains all commits that are
//! waiting, takes the store lock once, folds in what other processes appended, runs each closure
//! in arrival order (each sees the records staged before it), appends the batch with a single
//! fdatasync (group commit), and only then answers the callers and pushes notifications.
//! The store (I/O) and the folded state (CPU) have separate locks: staging holds the state
//! lock, the append and its fdatasync do not, so reads never wait for the disk and the next
//! batch's commits queue while an fdatasync runs. A commit with no other under way runs
//! the same steps on its caller's thread instead: handing it to the writer and being woken
//! back cost more CPU than the commit itself.
//! A tailer thread folds in other processes' appends between writes, so their changes reach
//! this process's clients as notifications.
//!
//! The journal is hash-chained (see [`crate::store::chain`]); the chain as this process has
//! read it is readable without the state lock ([`Workspace::chain_status`]), and the store's
//! first record declares a random workspace id ([`Workspace::workspace_id`]) that operator
//! signatures bind to.

use std::borrow::Cow;
use std::panic::AssertUnwindSafe;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};
use serde_json::Value;
use tokio::sync::oneshot;

use crate::fanout::{Fanout, Subscription};

mod idle;
mod queue;
mod tail;

use crate::anchor::{Anchor, HeadMark, Standing};
use crate::operations::seal::SealSource;
pub use crate::store::Record;
use crate::store::end::JournalPeek;
use crate::store::{
    ChainStatus, ChainView, Head, RawSnapshot, SnapshotMark, SnapshotTarget, Store, StoreError,
};
use idle::LocalWriter;
pub use idle::write_queued_commits;
use queue::CommitQueue;

/// Write a snapshot after this many records since the last one, so opening stays fast.
const SNAPSHOT_EVERY: u64 = 50_000;
/// Most commits folded into one batch (one fdatasync).
const MAX_BATCH: usize = 512;
/// Longest a batch waits for the callers of the batch before it (see [`Gather::take`]).
const MAX_GATHER: Duration = Duration::from_millis(2);
/// Journal space the writer allocates ahead of its appends: a commit's fdatasync then writes
/// data, not the file's size too (one in ~130 operations pays for the next stretch).
const PREALLOCATE: u64 = 256 * 1024;
/// How often at most the tailer looks for other processes' appends while this process appends
/// steadily (more than once a millisecond), and how often it looks where the journal cannot be
/// watched.
const TAIL_INTERVAL: Duration = Duration::from_millis(25);
/// A read re-checks the journal itself when the last check is older than this, so a burst of
/// reads costs one check while a read after a pause still sees other processes' writes.
const READ_FRESHNESS: Duration = Duration::from_millis(2);

/// A record to append; the workspace assigns `seq` and `time_ms`.
/// The payload is encoded once, here, straight to JSON text; the journal writes it as it is,
/// and the fold decodes that text unless the committer kept the value it encoded.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct NewRecord {
    pub kind: String,
    pub payload: Box<serde_json::value::RawValue>,
    /// The value `payload` encodes, for the domains whose fold takes it (see [`Typed`]).
    #[serde(skip)]
    pub typed: Option<Typed>,
}

impl NewRecord {
    pub fn new(kind: impl Into<String>, payload: impl Serialize) -> Result<Self, WorkspaceError> {
        Ok(NewRecord {
            kind: kind.into(),
            payload: serde_json::value::to_raw_value(&payload).map_err(WorkspaceError::Encode)?,
            typed: None,
        })
    }

    /// A record of an already encoded payload.
    pub fn text(kind: impl Into<String>, payload: Box<serde_json::value::RawValue>) -> Self {
        NewRecord {
            kind: kind.into(),
            payload,
            typed: None,
        }
    }

    /// [`NewRecord::new`] keeping `payload` itself, so this process's fold skips decoding the
    /// text it just encoded. The text stays the record: replay and every other process decode
    /// it, and debug builds check at each fold that it decodes to this value.
    pub fn typed<T>(kind: impl Into<String>, payload: T) -> Result<Self, WorkspaceError>
    where
        T: Serialize + Clone + Send + Sync + 'static,
    {
        let mut rec = NewRecord::new(kind, &payload)?;
        // A text nested deeper than a reader parses folds nowhere else: this process must not
        // fold it either, so it takes the text path and is skipped like everywhere.
        if !crate::util::json_deeper_than(rec.payload.get().as_bytes(), TYPED_DEPTH_LIMIT) {
            rec.typed = Some(Typed(Arc::new(payload)));
        }
        Ok(rec)
    }
}

/// Deepest record text folded from its value: serde_json parses at most 127 nested levels.
const TYPED_DEPTH_LIMIT: usize = 100;

/// A staged record's payload as its committer built it.
#[derive(Clone)]
pub struct Typed(Arc<dyn std::any::Any + Send + Sync>);

impl Typed {
    /// The value if it is a `T` (moved out when this is its only holder).
    pub fn take<T: Clone + Send + Sync + 'static>(self) -> Option<T> {
        let value = self.0.downcast::<T>().ok()?;
        Some(Arc::try_unwrap(value).unwrap_or_else(|shared| (*shared).clone()))
    }
}

impl std::fmt::Debug for Typed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Typed(..)")
    }
}

/// Who receives a notification.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Audience {
    Everyone,
    Operators,
}

/// What a notice carries. Watchers read the few string fields they filter on; the JSON is
/// built only for a client the notice is sent to. (Every commit folds notices most of which
/// no client receives: building JSON maps for them was a tenth of a commit's allocations.)
pub trait NoticeParams: Send + Sync + std::fmt::Debug {
    /// A top-level string field, as the JSON holds it.
    fn str_field(&self, key: &str) -> Option<&str>;
    /// The params as sent.
    fn to_value(&self) -> Value;
}

impl NoticeParams for Value {
    fn str_field(&self, key: &str) -> Option<&str> {
        self.get(key).and_then(Value::as_str)
    }
    fn to_value(&self) -> Value {
        self.clone()
    }
}

/// A notification produced by folding a record. Shared, not copied, by every watcher and
/// subscriber it goes to (a fold's notices reach several of them per commit).
#[derive(Clone, Debug)]
pub struct Notice {
    pub method: Cow<'static, str>,
    pub params: Arc<dyn NoticeParams>,
    pub audience: Audience,
}

impl Notice {
    pub fn everyone(method: impl Into<Cow<'static, str>>, params: Value) -> Self {
        Self::to(Audience::Everyone, method, Arc::new(params))
    }
    pub fn operators(method: impl Into<Cow<'static, str>>, params: Value) -> Self {
        Self::to(Audience::Operators, method, Arc::new(params))
    }
    pub fn to(
        audience: Audience,
        method: impl Into<Cow<'static, str>>,
        params: Arc<dyn NoticeParams>,
    ) -> Self {
        Notice {
            method: method.into(),
            params,
            audience,
        }
    }
}

/// Everything the journal says, folded.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
pub struct State {
    pub last_seq: u64,
    /// Inside a commit closure: the seq the first record it returns will get (the records
    /// that follow get the next ones). Not meaningful elsewhere.
    #[serde(skip)]
    pub staging_seq: u64,
    #[serde(default)]
    pub bundles: crate::bundles::BundleState,
    #[serde(default)]
    pub workers: crate::workers::WorkerState,
    #[serde(default)]
    pub operations: crate::operations::OperationState,
    #[serde(default)]
    pub trust: crate::operations::trust::TrustState,
    #[serde(default)]
    pub clients: crate::clients::ClientState,
    #[serde(default)]
    pub plans: crate::plans::PlanState,
}

impl State {
    /// Folds one record. Deterministic; kinds this version does not know are skipped (logged).
    pub fn apply(&mut self, rec: &Record, out: &mut Vec<Notice>) {
        self.last_seq = rec.seq;
        let domain = rec.kind.split('.').next().unwrap_or("");
        match domain {
            "bundle" => self.bundles.apply(rec, out),
            "worker" => self.workers.apply(rec, out),
            "operation" | "approval" => self.operations.apply(rec, out),
            "trust" => self.trust.apply(rec, out),
            "client" => self.clients.apply(rec, out),
            "plan" => self.plans.apply(rec, &self.operations, out),
            // `store.created`: the id lives in the store's chain view, which a replay from the
            // start publishes only once it is read through; the seals need it before.
            "store" => {
                let payload = rec.payload.get();
                if let Some(id) = crate::store::declared_workspace_id(rec.seq, &rec.kind, payload) {
                    self.operations.seals.declared(&id);
                }
            }
            "gaffer" => {}
            _ => tracing::warn!(kind = %rec.kind, seq = rec.seq, "unknown record kind skipped"),
        }
    }

    /// [`State::apply`] for a record staged here with its payload's value at hand.
    pub fn apply_typed(&mut self, rec: &Record, typed: Typed, out: &mut Vec<Notice>) {
        match rec.kind.split('.').next() {
            Some("operation") => {
                self.last_seq = rec.seq;
                self.operations.apply_typed(rec, typed, out);
            }
            _ => self.apply(rec, out),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum WorkspaceError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("snapshot state does not decode: {0}")]
    Snapshot(serde_json::Error),
    #[error("record payload does not encode: {0}")]
    Encode(serde_json::Error),
    #[error("the workspace writer has stopped")]
    WriterGone,
    #[error("a commit failed inside the writer; state was reloaded from disk")]
    CommitPanicked,
    #[error("the store could not take the write: {0}")]
    Unavailable(String),
    #[error("workspace root {path} is not a directory")]
    NotADirectory { path: PathBuf },
}

/// Why a commit did not happen.
#[derive(Debug)]
pub enum CommitError<E> {
    /// The closure refused (validation); nothing was written.
    Rejected(E),
    /// The store failed; nothing was acknowledged.
    Store(WorkspaceError),
}

/// Called under the store lock before each append (see [`Workspace::before_write`]).
type WriteHook = Arc<dyn Fn() + Send + Sync>;

/// The I/O side: the store and what only its writer needs. The writer holds it for a whole
/// batch (flock, catch-up, append, fdatasync); nothing that answers a read waits for it.
struct Io {
    store: Store,
    before_write: Option<WriteHook>,
    since_snapshot: u64,
    /// The journal directory has been seen to exist.
    journal_exists: bool,
    /// Runs once, between a look at the journal and folding what it found (a test stands in
    /// for a thread descheduled there).
    #[cfg(test)]
    after_poll: Option<Box<dyn FnOnce() + Send>>,
}

/// The CPU side: the folded state. Held only to fold, stage or read, never across I/O.
struct Folded {
    state: State,
    /// When the last look at the journal for other processes' appends began: everything
    /// appended before it is folded. Taken before the look, not after: a look that read the
    /// journal and then waited (descheduled, or for this lock) must not pass for a fresh one.
    last_poll: Instant,
}

/// Both sides. Lock order: `io` before `folded`; `folded` is never held while taking `io`.
struct Shared {
    io: Mutex<Io>,
    folded: Mutex<Folded>,
    events: Fanout<Notice>,
    /// Subscribers to some notices only (see [`Workspace::watch`]).
    watchers: Mutex<Vec<Watcher>>,
    /// Batches appended (one fdatasync each), for benchmarks and status.
    syncs: std::sync::atomic::AtomicU64,
    /// Batches staged: the commit closures running now belong to the one this counts.
    staged_batches: std::sync::atomic::AtomicU64,
    /// Commits in the last batch written (by the writer thread or a caller's). While it is 1
    /// (one committer at a time), a commit that finds the queue empty and the writer idle runs
    /// on its caller's thread.
    last_batch: std::sync::atomic::AtomicUsize,
    /// Commits called and not yet answered.
    committing: std::sync::atomic::AtomicUsize,
    /// Set while the writer appends a staged batch: it holds the store lock and has folded
    /// everything on disk before it, so a read then has nothing to catch up on.
    appending: std::sync::atomic::AtomicBool,
    /// Set while the writer thread writes a batch: its answers wake the committers' runtimes,
    /// which then write their own queued commits (see `idle::LocalWriter::write`).
    writer_writing: std::sync::atomic::AtomicBool,
    /// Set while an automatic snapshot is being written (by its own thread, no lock held).
    snapshot_writing: Arc<std::sync::atomic::AtomicBool>,
    /// The workspace root (canonical), which names its anchor.
    root: PathBuf,
    /// The chain as the store publishes it (the same view across reloads).
    chain: ChainView,
    /// The anchor and how the store stands against it.
    guard: Arc<Mutex<Guard>>,
}

/// The workspace's anchor (outside it; see [`crate::anchor`]) and the store's standing.
struct Guard {
    anchor: Option<Arc<Anchor>>,
    standing: Standing,
}

/// A subscriber woken only by the notices it keeps.
struct Watcher {
    keep: Box<dyn Fn(&Notice) -> bool + Send + Sync>,
    to: WatcherSink,
}

/// Where a kept notice goes: the notice itself, or only a wake-up (a waiter that reads the
/// state again needs no copy, and a `Notify` costs no channel per wait).
enum WatcherSink {
    Notices(tokio::sync::mpsc::UnboundedSender<Notice>),
    Wake(Arc<tokio::sync::Notify>),
}

impl WatcherSink {
    /// The receiving side is gone.
    fn closed(&self) -> bool {
        match self {
            WatcherSink::Notices(tx) => tx.is_closed(),
            WatcherSink::Wake(n) => Arc::strong_count(n) == 1,
        }
    }

    fn deliver(&self, n: &Notice) {
        match self {
            WatcherSink::Notices(tx) => {
                let _ = tx.send(n.clone());
            }
            WatcherSink::Wake(w) => w.notify_one(),
        }
    }
}

/// Woken (at least once) after any notice a [`Workspace::wake_on`] filter keeps; several
/// before an await give one wake-up. One that arrives while nobody awaits [`Wake::notified`]
/// is kept for the next await, so none between a look at the state and the await is lost.
/// Dropping it unsubscribes (at the next broadcast, as a dropped channel receiver does).
pub struct Wake(Arc<tokio::sync::Notify>);

impl Wake {
    pub async fn notified(&self) {
        self.0.notified().await;
    }
}

/// The records a batch has staged so far, and the state they produce.
struct Stage<'a> {
    state: &'a mut State,
    next_seq: u64,
    staged: Vec<Record>,
    notices: Vec<Notice>,
}

type Completion = Box<dyn FnOnce(Result<(), WorkspaceError>) + Send>;
/// A queued commit. Called with the stage to run, or with `Err` when the batch could not start.
type Job = Box<dyn FnOnce(Result<&mut Stage<'_>, WorkspaceError>) -> Option<Completion> + Send>;

pub struct Workspace {
    root: PathBuf,
    gaffer_dir: PathBuf,
    shared: Arc<Shared>,
    jobs: Arc<CommitQueue<Job>>,
    stop_tailer: Arc<tail::TailStop>,
    /// Shared with the store (kept across a reload), so chain queries never wait for a commit.
    chain: ChainView,
    /// Writes this workspace's commits on the thread that made them (see [`idle`]).
    local: Arc<LocalWriter>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while folding is caught and the state reloaded, so a poisoned lock is still usable.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The lock if nobody holds it: a read must not wait for a commit's I/O.
fn try_lock<T>(m: &Mutex<T>) -> Option<MutexGuard<'_, T>> {
    match m.try_lock() {
        Ok(g) => Some(g),
        Err(std::sync::TryLockError::Poisoned(p)) => Some(p.into_inner()),
        Err(std::sync::TryLockError::WouldBlock) => None,
    }
}

/// Opens the store (publishing its chain into `view`) and folds snapshot + later records into
/// a fresh state. The snapshot's text is decoded straight into the state and then dropped.
/// A snapshot is a cache: one that is damaged or does not decode is skipped (logged) and the
/// whole journal replayed.
fn load(dir: &Path, view: &ChainView) -> Result<Loaded, WorkspaceError> {
    let root = dir.parent().unwrap_or(dir);
    let mut store = match Store::open_with_view(dir, view.clone()) {
        Err(e @ StoreError::SnapshotCorrupt { .. }) => {
            tracing::warn!(error = %e, "snapshot skipped; replaying the journal");
            Store::open_without_snapshot(dir, view.clone())?
        }
        opened => opened?,
    };
    // Anyone can write a snapshot with a valid checksum: only one gaffer wrote on this machine
    // (its mark is anchored) is loaded.
    if let Some(mark) = store.snapshot_mark()
        && !snapshot_known(root, mark)
    {
        tracing::warn!(
            seq = mark.seq,
            "snapshot not written by gaffer on this machine; replaying the journal"
        );
        store = Store::open_without_snapshot(dir, view.clone())?;
    }
    store.preallocate(PREALLOCATE);
    let mark = store.snapshot_mark().cloned();
    let (mut state, after) = match store.take_raw_snapshot() {
        Some(raw) => match raw.decode::<State>() {
            Ok(state) => (state, raw.seq),
            Err(e) => {
                let e = WorkspaceError::Snapshot(e);
                tracing::warn!(error = %e, "snapshot skipped; replaying the journal");
                (State::default(), 0)
            }
        },
        None => (State::default(), 0),
    };
    // Prunes count only when this machine sealed them (`operations::seal`).
    state.operations.seals = SealSource::anchored(root, view.clone());
    let from_snapshot = mark.filter(|_| after > 0).map(|m| (m.seq, m.head));
    let mut scratch = Vec::new();
    let mut replayed = 0u64;
    store.replay(after, |rec: Record| -> Result<(), WorkspaceError> {
        state.apply(&rec, &mut scratch);
        scratch.clear();
        replayed += 1;
        Ok(())
    })?;
    state.last_seq = state.last_seq.max(after);
    let snapshot = from_snapshot.as_ref().map(|(s, h)| (*s, h.as_str()));
    let (guard, read_on) = judge_store(root, &mut store, view, snapshot, |rec| {
        state.apply(rec, &mut scratch);
        scratch.clear();
    });
    replayed += read_on;
    Ok(Loaded {
        store,
        state,
        replayed,
        guard,
    })
}

/// Judges the journal `store` has read against this machine's anchor, and returns the guard
/// and how many records were read on (each handed to `fold`).
///
/// A verdict of rollback may only mean that the anchor moved on after the journal was read:
/// another process appended and anchored in between. So the journal is then read on, without
/// the store lock, and judged again against the head judged first, which was read before
/// that. An appender anchors a head only once its batch is durable, so a journal read after
/// the head was read reaches it, unless the journal was truly rolled back. No lock is waited
/// for: a writer appending back to back cannot starve the judgment into a false verdict.
fn judge_store(
    root: &Path,
    store: &mut Store,
    view: &ChainView,
    snapshot: Option<(u64, &str)>,
    mut fold: impl FnMut(&Record),
) -> (Guard, u64) {
    let (mut guard, judged_against) = guard_of(root, view, snapshot);
    let mut read_on = 0;
    if let (Standing::RolledBack { .. }, Some(anchored)) = (&guard.standing, judged_against) {
        match store.poll() {
            Ok(more) => {
                read_on = more.len() as u64;
                more.iter().for_each(&mut fold);
                guard.standing = judge_chain(&anchored, view, snapshot);
            }
            Err(e) => tracing::warn!(error = %e, "the journal cannot be read on to judge it again"),
        }
    }
    report_rollback(&guard.standing);
    (guard, read_on)
}

/// A store opened and folded, with its standing against the anchor.
struct Loaded {
    store: Store,
    state: State,
    replayed: u64,
    guard: Guard,
}

fn snapshot_known(root: &Path, mark: &SnapshotMark) -> bool {
    let Some(id) = mark.workspace_id.as_deref() else {
        return false;
    };
    match Anchor::locate(root, id).and_then(|a| a.knows_snapshot(mark)) {
        Ok(known) => known,
        Err(e) => {
            tracing::warn!(error = %e, "the workspace anchor cannot be read");
            false
        }
    }
}

/// How the journal as read (`view`) stands against the head this machine anchored; a journal
/// first seen here is anchored now. `snapshot` is the authenticated snapshot the state starts
/// from (seq, head). When the standing came from comparing the journal with an anchored head,
/// that head is returned too (see [`judge_store`]).
fn guard_of(
    root: &Path,
    view: &ChainView,
    snapshot: Option<(u64, &str)>,
) -> (Guard, Option<HeadMark>) {
    let Some(id) = view.workspace_id() else {
        let standing = if view.head().seq == 0 {
            Standing::Empty
        } else {
            Standing::RolledBack {
                detail: "the journal's first record declares no workspace id".into(),
            }
        };
        let guard = Guard {
            anchor: None,
            standing,
        };
        return (guard, None);
    };
    let unavailable = |e: crate::anchor::AnchorError| {
        let guard = Guard {
            anchor: None,
            standing: Standing::Unavailable {
                detail: e.to_string(),
            },
        };
        (guard, None)
    };
    let anchor = match Anchor::locate(root, &id) {
        Ok(a) => Arc::new(a),
        Err(e) => return unavailable(e),
    };
    // A store replaced at this path by one with another id (a rewritten first record) is
    // rolled back too, not a new workspace.
    match anchor.adopt_root_id(&id) {
        Err(e) => return unavailable(e),
        Ok(Some(seen)) if seen != id => {
            let guard = Guard {
                anchor: Some(anchor),
                standing: Standing::RolledBack {
                    detail: format!(
                        "this path held the store of workspace {seen}; the journal now \
                         declares {id}: it was replaced"
                    ),
                },
            };
            return (guard, None);
        }
        Ok(_) => {}
    }
    let head = view.head();
    let judged = match anchor.head() {
        Err(e) => return unavailable(e),
        // First seen on this machine: taken as it is, unless another opener anchored it first.
        Ok(None) => anchor
            .adopt(&HeadMark {
                seq: head.seq,
                hash: head.hash.clone(),
            })
            .and_then(|()| anchor.head()),
        Ok(found) => Ok(found),
    };
    let (standing, against) = match judged {
        Err(e) => return unavailable(e),
        Ok(None) => (Standing::Intact, None),
        Ok(Some(m)) => (judge_chain(&m, view, snapshot), Some(m)),
    };
    // Heads after the anchored one are anchored by the processes that append (under the store
    // lock); an opener never writes one, or a stale open could move the anchor back.
    let guard = Guard {
        anchor: Some(anchor),
        standing,
    };
    (guard, against)
}

/// How the journal as read (`view`) stands against the `anchored` head; `snapshot` is the
/// authenticated snapshot the state starts from (seq, head).
fn judge_chain(anchored: &HeadMark, view: &ChainView, snapshot: Option<(u64, &str)>) -> Standing {
    let broken_at = view.broken_at().map(|b| b.seq);
    crate::anchor::judge(
        anchored,
        view.head().seq,
        |s| view.hash_at(s),
        snapshot,
        broken_at,
    )
}

/// Logs a final verdict of rollback.
fn report_rollback(standing: &Standing) {
    if let Standing::RolledBack { detail } = standing {
        tracing::error!(detail = %detail, "the store does not reach its anchored head");
    }
}

/// Anchors the head `view` reached while the store stands intact. A rolled-back store is
/// never anchored: its head would hide the rollback from the next open. Nor is a head whose
/// journal no longer reaches the one anchored so far: another process's acknowledged batches
/// past this one's cursor, destroyed (zeroed) before it read them, are appended over, and
/// anchoring that would hide it.
fn advance_guard(guard: &mut Guard, view: &ChainView) {
    if guard.standing != Standing::Intact {
        return;
    }
    let Some(anchor) = guard.anchor.clone() else {
        return;
    };
    let head = view.head();
    let mark = HeadMark {
        seq: head.seq,
        hash: head.hash,
    };
    match anchor.advance_checked(&mark, |anchored| judge_chain(anchored, view, None)) {
        Ok(Standing::Intact) => {}
        Ok(verdict) => {
            report_rollback(&verdict);
            guard.standing = verdict;
        }
        Err(e) => {
            tracing::error!(error = %e, "the workspace anchor cannot be written");
            guard.standing = Standing::Unavailable {
                detail: e.to_string(),
            };
        }
    }
}

/// After an append (the store lock still held): the first journal this process sees is
/// judged against the anchor; then the new head is anchored.
fn anchor_appended(shared: &Shared) {
    let mut guard = lock(&shared.guard);
    if guard.standing == Standing::Empty {
        // Final: every head is anchored under the store lock, so none is past this journal.
        *guard = guard_of(&shared.root, &shared.chain, None).0;
        report_rollback(&guard.standing);
        return;
    }
    advance_guard(&mut guard, &shared.chain);
}

/// A journal another process created while this one had none is judged against the anchor
/// as soon as it is read, not only at this process's first append. Records read on to judge
/// it (see [`judge_store`]) go to `fold`; returns how many.
fn judge_first_journal(shared: &Shared, store: &mut Store, fold: impl FnMut(&Record)) -> u64 {
    let mut guard = lock(&shared.guard);
    if guard.standing != Standing::Empty || shared.chain.head().seq == 0 {
        return 0;
    }
    let (judged, read_on) = judge_store(&shared.root, store, &shared.chain, None, fold);
    *guard = judged;
    read_on
}

/// Remembers a snapshot this process wrote, while the store stands intact.
fn anchor_snapshot(guard: &Mutex<Guard>, mark: SnapshotMark) {
    let guard = lock(guard);
    if guard.standing != Standing::Intact {
        return;
    }
    if let Some(a) = &guard.anchor
        && let Err(e) = a.remember_snapshot(mark)
    {
        tracing::warn!(error = %e, "the snapshot cannot be anchored; the next open replays");
    }
}

impl Workspace {
    /// Opens the workspace at `root` (its store is `<root>/.gaffer`, created on first write).
    pub fn open(root: &Path) -> Result<Arc<Workspace>, WorkspaceError> {
        if !root.is_dir() {
            return Err(WorkspaceError::NotADirectory {
                path: root.to_path_buf(),
            });
        }
        let root = root.canonicalize().unwrap_or_else(|_| root.to_path_buf());
        crate::operator::keys::refuse_keys_under(&root);
        let gaffer_dir = root.join(".gaffer");
        let chain = ChainView::default();
        let looked = Instant::now();
        let Loaded {
            store,
            state,
            replayed,
            guard,
        } = load(&gaffer_dir, &chain)?;
        tracing::info!(workspace = %root.display(), seq = state.last_seq, replayed, "workspace opened");
        let shared = Arc::new(Shared {
            io: Mutex::new(Io {
                store,
                before_write: None,
                since_snapshot: replayed,
                journal_exists: false,
                #[cfg(test)]
                after_poll: None,
            }),
            folded: Mutex::new(Folded {
                state,
                last_poll: looked,
            }),
            events: Fanout::default(),
            watchers: Mutex::new(Vec::new()),
            syncs: std::sync::atomic::AtomicU64::new(0),
            staged_batches: std::sync::atomic::AtomicU64::new(0),
            last_batch: std::sync::atomic::AtomicUsize::new(1),
            committing: std::sync::atomic::AtomicUsize::new(0),
            appending: std::sync::atomic::AtomicBool::new(false),
            writer_writing: std::sync::atomic::AtomicBool::new(false),
            snapshot_writing: Arc::new(std::sync::atomic::AtomicBool::new(false)),
            root: root.clone(),
            chain: chain.clone(),
            guard: Arc::new(Mutex::new(guard)),
        });
        let jobs = Arc::new(CommitQueue::new());
        let spawn_err = |e| StoreError::Io {
            path: gaffer_dir.clone(),
            source: e,
        };
        {
            let shared = Arc::clone(&shared);
            let dir = gaffer_dir.clone();
            let view = chain.clone();
            let jobs = Arc::clone(&jobs);
            std::thread::Builder::new()
                .name("gaffer-writer".into())
                .spawn(move || writer_loop(&shared, (&dir, &view), &jobs))
                .map_err(spawn_err)?;
        }
        let stop_tailer = Arc::new(tail::TailStop::new());
        {
            let shared = Arc::clone(&shared);
            let stop = Arc::clone(&stop_tailer);
            let dir = gaffer_dir.clone();
            std::thread::Builder::new()
                .name("gaffer-tailer".into())
                .spawn(move || tail_loop(&shared, &dir, &stop))
                .map_err(spawn_err)?;
        }
        let local = Arc::new(LocalWriter {
            shared: Arc::clone(&shared),
            jobs: Arc::clone(&jobs),
            dir: gaffer_dir.clone(),
            chain: chain.clone(),
        });
        Ok(Arc::new(Workspace {
            root,
            gaffer_dir,
            shared,
            jobs,
            stop_tailer,
            chain,
            local,
        }))
    }

    pub fn root(&self) -> &Path {
        &self.root
    }

    pub fn gaffer_dir(&self) -> PathBuf {
        self.gaffer_dir.clone()
    }

    /// Reads the current state, after folding in anything other processes appended. Never
    /// waits for a commit's append and fdatasync: the writer took the store lock and folded
    /// everything on disk before staging, and nobody can append while it holds the lock, so
    /// the journal check is skipped then. (A tailer poll or the writer's catch-up is waited
    /// for: both are short reads.) Records a batch has staged are visible here once staged,
    /// before their fdatasync ends, as they already are to other processes reading the
    /// journal; a commit is acknowledged and notified only once durable.
    pub fn read<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        let stale = lock(&self.shared.folded).last_poll.elapsed() >= READ_FRESHNESS;
        if stale {
            self.catch_up();
        }
        f(&lock(&self.shared.folded).state)
    }

    /// [`read`](Self::read), after folding whatever other processes appended however recently
    /// this process last looked: for a request naming what another process may have committed
    /// a moment ago (an operator preparing a decision on an id an agent just got), where a
    /// stale answer would be a wrong `not_found` or revision conflict, not merely an old view.
    pub fn read_fresh<T>(&self, f: impl FnOnce(&State) -> T) -> T {
        self.catch_up();
        f(&lock(&self.shared.folded).state)
    }

    /// Folds other processes' records, unless this process's writer holds the store lock for
    /// an append: it folded everything on disk when it took the lock, and nobody else can
    /// append until it lets go.
    fn catch_up(&self) {
        let io = match try_lock(&self.shared.io) {
            Some(io) => Some(io),
            None if self.shared.appending.load(Ordering::Acquire) => None,
            None => Some(lock(&self.shared.io)),
        };
        if let Some(mut io) = io {
            fold_new(&mut io, &self.shared);
        }
    }

    /// The last sequence number folded.
    pub fn seq(&self) -> u64 {
        self.read(|s| s.last_seq)
    }

    /// Batches this process has appended, one fdatasync each.
    pub fn syncs(&self) -> u64 {
        self.shared.syncs.load(Ordering::Relaxed)
    }

    /// From a commit closure: which batch it is staged in. Closures of one batch read the same
    /// number and a later batch's read a higher one, so a closure can reuse what an earlier one
    /// of its batch looked up (staging is one batch at a time, on the thread that runs them).
    pub fn staging_batch(&self) -> u64 {
        self.shared.staged_batches.load(Ordering::Relaxed)
    }

    /// Seq and hash of the last record folded (seq 0 and the genesis hash for an empty store).
    /// The store publishes a head when it reads or writes records, and they are folded under
    /// the same hold of the state lock. Takes only the chain view's lock: never waits for a
    /// commit's fdatasync or a journal read.
    pub fn journal_head(&self) -> Head {
        self.chain.head()
    }

    /// The head and the first broken link read since the store was opened.
    pub fn chain_status(&self) -> ChainStatus {
        self.chain.status()
    }

    /// The store's random id (from its `store.created` record); None while no store exists.
    pub fn workspace_id(&self) -> Option<String> {
        self.chain.workspace_id()
    }

    /// The hash of record `seq` if it is among the last 65,536 read (to confirm that a signed
    /// head lies on this chain).
    pub fn hash_at(&self, seq: u64) -> Option<String> {
        self.chain.hash_at(seq)
    }

    /// Validates and durably applies a change; see the module docs.
    pub async fn commit<T, E, F>(&self, f: F) -> Result<T, CommitError<E>>
    where
        F: FnOnce(&State) -> Result<(Vec<NewRecord>, T), E> + Send + 'static,
        T: Send + 'static,
        E: Send + 'static,
    {
        let (tx, mut rx) = oneshot::channel::<Result<T, CommitError<E>>>();
        let job: Job = Box::new(move |stage: Result<&mut Stage<'_>, WorkspaceError>| {
            let stage = match stage {
                Ok(s) => s,
                Err(e) => {
                    let _ = tx.send(Err(CommitError::Store(e)));
                    return None;
                }
            };
            stage.state.staging_seq = stage.next_seq;
            match f(stage.state) {
                Err(e) => {
                    let _ = tx.send(Err(CommitError::Rejected(e)));
                    None
                }
                Ok((records, value)) => {
                    stage.push(records);
                    Some(Box::new(move |outcome: Result<(), WorkspaceError>| {
                        let _ = tx.send(outcome.map(|()| value).map_err(CommitError::Store));
                    }))
                }
            }
        });
        let _counted = Counted::enter(&self.shared.committing);
        if self.lone_committer() {
            // Lets every task that is ready run up to its own commit first (on a runtime of
            // one thread they could not while this one writes): alone still, it writes here.
            tokio::task::yield_now().await;
        }
        let gone = |_| CommitError::Store(WorkspaceError::WriterGone);
        if let Some(job) = self.commit_here(job) {
            if idle::writes_when_idle() {
                self.local.defer(job).map_err(gone)?;
                // The runtime writes it when it parks; one that stays busy leaves it to the
                // writer, and so does a caller that stops waiting.
                let mut waiting = idle::KickUnlessAnswered::new(&self.jobs);
                let answer = match tokio::time::timeout(idle::IDLE_WAIT, &mut rx).await {
                    Ok(answer) => answer,
                    Err(_) => {
                        self.jobs.kick();
                        (&mut rx).await
                    }
                };
                waiting.answered();
                return answer.unwrap_or(Err(CommitError::Store(WorkspaceError::CommitPanicked)));
            } else {
                self.jobs.push(job).map_err(gone)?;
            }
        }
        rx.await
            .unwrap_or(Err(CommitError::Store(WorkspaceError::CommitPanicked)))
    }

    /// One committer at a time (the writer's last batch held one commit, nothing is queued and
    /// the writer is idle): runs `job` as a batch of its own on this thread, saving the two
    /// thread hand-offs (to the writer and back) that cost more CPU than the commit itself.
    /// Hands `job` back when commits contend; they go to the writer, which groups them.
    fn commit_here(&self, job: Job) -> Option<Job> {
        if !self.lone_committer() || !self.jobs.is_empty() {
            return Some(job);
        }
        self.local.write_lone(job).err()
    }

    /// No other commit is under way, and the writer's last batch held a single commit.
    fn lone_committer(&self) -> bool {
        self.shared.committing.load(Ordering::Relaxed) == 1
            && self.shared.last_batch.load(Ordering::Relaxed) <= 1
    }

    /// Registers `hook` to run under the store lock before every append, once the store
    /// directory exists (used to record this process's presence before it writes anything).
    pub fn before_write(&self, hook: impl Fn() + Send + Sync + 'static) {
        lock(&self.shared.io).before_write = Some(Arc::new(hook));
    }

    /// Notifications from every record folded from now on (this process's and others').
    /// How the store stands against what this machine anchored of it: anything but intact (or
    /// empty) and nothing executes.
    pub fn standing(&self) -> Standing {
        lock(&self.shared.guard).standing.clone()
    }

    /// The workspace's anchor whatever the store's standing, for facts that only restrict
    /// (a revocation, a trust version raised by the operator's own signature): they must hold
    /// after the operator accepts a rolled-back store.
    pub fn restricting_anchor(&self) -> Option<Arc<Anchor>> {
        lock(&self.shared.guard).anchor.clone()
    }

    /// The workspace's anchor while the store stands intact (approval uses and trust versions
    /// are recorded there).
    pub fn anchor(&self) -> Option<Arc<Anchor>> {
        let guard = lock(&self.shared.guard);
        guard.anchor.clone().filter(|_| guard.standing.is_intact())
    }

    /// The operator accepts the store as it is now: its head becomes the anchored one.
    pub fn reanchor(&self) -> Result<Head, WorkspaceError> {
        let head = self.chain.head();
        let id = self.workspace_id().ok_or(WorkspaceError::Unavailable(
            "there is no journal to anchor".into(),
        ))?;
        let anchor = Anchor::locate(&self.root, &id)
            .map_err(|e| WorkspaceError::Unavailable(e.to_string()))?;
        anchor
            .reanchor(
                &HeadMark {
                    seq: head.seq,
                    hash: head.hash.clone(),
                },
                &id,
            )
            .map_err(|e| WorkspaceError::Unavailable(e.to_string()))?;
        *lock(&self.shared.guard) = Guard {
            anchor: Some(Arc::new(anchor)),
            standing: Standing::Intact,
        };
        Ok(head)
    }

    /// Whether the hash chain verifies over everything this process has read. While it does
    /// not, no operator signature is taken as authority.
    pub fn chain_ok(&self) -> bool {
        self.chain.broken_at().is_none()
    }

    /// The workspace id, creating the store (whose first record carries it) if there is none
    /// yet: an operator signature must name the workspace it is for.
    pub async fn ensure_workspace_id(&self) -> Result<String, WorkspaceError> {
        if let Some(id) = self.workspace_id() {
            return Ok(id);
        }
        let rec = NewRecord::new(
            "gaffer.opened",
            serde_json::json!({"for": "operator signature"}),
        )?;
        self.commit(move |_: &State| Ok::<_, WorkspaceError>((vec![rec], ())))
            .await
            .map_err(|e| match e {
                CommitError::Rejected(e) | CommitError::Store(e) => e,
            })?;
        self.workspace_id()
            .ok_or_else(|| WorkspaceError::Unavailable("the store has no workspace id".into()))
    }

    /// Notifications from every record folded from now on (this process's and others').
    pub fn subscribe(&self) -> Subscription<Notice> {
        self.shared.events.subscribe()
    }

    /// The notifications `keep` accepts, from every record folded from now on: a task waiting
    /// for one operation is not woken by every other one's. Never lags (the queue is
    /// unbounded, and holds only what `keep` accepted); dropping the receiver unsubscribes.
    pub fn watch(
        &self,
        keep: impl Fn(&Notice) -> bool + Send + Sync + 'static,
    ) -> tokio::sync::mpsc::UnboundedReceiver<Notice> {
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        lock(&self.shared.watchers).push(Watcher {
            keep: Box::new(keep),
            to: WatcherSink::Notices(tx),
        });
        rx
    }

    /// Like [`watch`](Self::watch), for a waiter that reads the state again when woken: only
    /// the wake-up is delivered, with no queue of notices behind it.
    pub fn wake_on(&self, keep: impl Fn(&Notice) -> bool + Send + Sync + 'static) -> Wake {
        let wake = Arc::new(tokio::sync::Notify::new());
        lock(&self.shared.watchers).push(Watcher {
            keep: Box::new(keep),
            to: WatcherSink::Wake(Arc::clone(&wake)),
        });
        Wake(wake)
    }

    pub fn put_blob(&self, bytes: &[u8]) -> Result<String, WorkspaceError> {
        Ok(crate::store::put_blob_in(&self.gaffer_dir, bytes)?)
    }

    pub fn get_blob(&self, hex: &str) -> Result<Vec<u8>, WorkspaceError> {
        Ok(crate::store::get_blob_in(&self.gaffer_dir, hex)?)
    }

    /// Writes a snapshot of the folded state now (used by `gaffer store compact`).
    pub async fn compact(&self) -> Result<u64, WorkspaceError> {
        let shared = Arc::clone(&self.shared);
        tokio::task::spawn_blocking(move || {
            let mut io = lock(&shared.io);
            fold_new(&mut io, &shared);
            snapshot(&mut io, &shared)
        })
        .await
        .map_err(|_| WorkspaceError::CommitPanicked)?
    }
}

impl Drop for Workspace {
    fn drop(&mut self) {
        self.stop_tailer.stop();
        // Closing the queue lets the writer finish queued commits and exit.
        self.jobs.close();
    }
}

impl Stage<'_> {
    fn push(&mut self, records: Vec<NewRecord>) {
        let time_ms = crate::util::now_ms();
        for r in records {
            let rec = Record {
                seq: self.next_seq,
                time_ms,
                kind: r.kind,
                payload: r.payload,
            };
            self.next_seq += 1;
            match r.typed {
                Some(typed) => self.state.apply_typed(&rec, typed, &mut self.notices),
                None => self.state.apply(&rec, &mut self.notices),
            }
            self.staged.push(rec);
        }
    }
}

fn broadcast_all(shared: &Shared, notices: Vec<Notice>) {
    if notices.is_empty() {
        return;
    }
    let mut watchers = lock(&shared.watchers);
    watchers.retain(|w| !w.to.closed());
    for n in &notices {
        for w in watchers.iter().filter(|w| (w.keep)(n)) {
            w.to.deliver(n);
        }
    }
    drop(watchers);
    shared.events.send_all(&notices);
}

/// The tailer: folds other processes' appends when the journal changes (see [`tail`]). A
/// change that leaves nothing past where this process's Store last read or wrote was its own
/// append, and is not looked into. Otherwise the store found free, the records are folded at
/// once; held by this process's commit, which folds what others appended before it appends,
/// the tailer peeks again a millisecond later, backing off to an interval while it stays held
/// (never queueing behind this process's batches).
fn tail_loop(shared: &Shared, gaffer_dir: &Path, stop: &tail::TailStop) {
    let mut watch = tail::JournalWatch::new(gaffer_dir);
    let mut peek = JournalPeek::new(&gaffer_dir.join("journal"));
    let end = || shared.chain.end();
    let mut pace = tail::Pace::new(end().appends());
    let mut spacing = tail::MIN_SPACING;
    // While the store is held by this process: how long until the tailer peeks again.
    let mut again: Option<Duration> = None;
    let mut last_read = Instant::now();
    while !stop.stopped() {
        let changed = if let Some(backoff) = again {
            std::thread::sleep(backoff);
            true
        } else {
            // Where nothing can be watched, every wait ends in a look: a poll, an interval apart.
            let interval = if watch.watches() {
                spacing
            } else {
                TAIL_INTERVAL
            };
            // A steady writer's own appends would each queue an event nobody waits for.
            watch.watch_appends(!pace.steady());
            watch.wait(interval, stop)
        };
        let backoff = again.take();
        if stop.stopped() {
            return;
        }
        // A look at least every second (and the one after a second without changes) reads
        // under the lock whatever a peek would say.
        let peeked = changed && last_read.elapsed() < tail::FALLBACK;
        if peeked && peek.nothing_new(end()) {
            spacing = pace.next(false, end().appends(), TAIL_INTERVAL);
            continue;
        }
        let mut io = match shared.io.try_lock() {
            Ok(io) => io,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) => {
                // Held long (a commit waiting for another process's lock, a compaction):
                // peeks back off to an interval apart.
                again = Some(backoff.map_or(tail::MIN_SPACING, |b| (b * 2).min(TAIL_INTERVAL)));
                continue;
            }
        };
        let found_others = fold_new(&mut io, shared);
        drop(io);
        last_read = Instant::now();
        // Bytes past the end that a look under the lock found to be no record, and a peek
        // still finds there, keep the next look an interval away: bytes that are not records
        // must not buy a look every millisecond. (A "maybe" that was this process's own append
        // met mid-way is gone by now.)
        spacing = if peeked && !found_others && !peek.nothing_new(end()) {
            TAIL_INTERVAL
        } else {
            pace.next(found_others, end().appends(), TAIL_INTERVAL)
        };
    }
}

/// Folds records other processes appended since we last looked; true when there were any.
/// The journal is read with only `io` held; the state lock is taken just to fold.
fn fold_new(io: &mut Io, shared: &Shared) -> bool {
    let looked = Instant::now();
    let polled = io.store.poll();
    #[cfg(test)]
    if let Some(hook) = io.after_poll.take() {
        hook();
    }
    let mut folded = lock(&shared.folded);
    folded.last_poll = looked;
    match polled {
        Ok(records) if records.is_empty() => false,
        Ok(records) => {
            let mut notices = Vec::new();
            io.since_snapshot += records.len() as u64;
            for rec in &records {
                folded.state.apply(rec, &mut notices);
            }
            // Judged before any read can see the new state (lock order: folded, then guard).
            io.since_snapshot += judge_first_journal(shared, &mut io.store, |rec| {
                folded.state.apply(rec, &mut notices)
            });
            drop(folded);
            broadcast_all(shared, notices);
            true
        }
        Err(e) => {
            tracing::error!(error = %e, "reading other processes' records failed");
            false
        }
    }
}

/// Takes the store lock just long enough to fold what others appended and rotate the journal,
/// then encodes the state (under the state lock, CPU only; `io` stays held, so nothing folds in
/// between and the state is exactly at the target's seq). The caller writes the file with no
/// lock held. The store does not keep the text: the state is in memory already.
fn prepare_snapshot(
    io: &mut Io,
    shared: &Shared,
) -> Result<(SnapshotTarget, RawSnapshot), WorkspaceError> {
    let target = {
        let mut txn = io.store.begin()?;
        let others = txn.take_new()?;
        let mut folded = lock(&shared.folded);
        folded.last_poll = Instant::now();
        let mut notices = Vec::new();
        for rec in &others {
            folded.state.apply(rec, &mut notices);
        }
        let target = txn.rotate_for_snapshot(folded.state.last_seq);
        drop(folded);
        broadcast_all(shared, notices);
        target?
    };
    let raw = {
        let folded = lock(&shared.folded);
        RawSnapshot::of(folded.state.last_seq, &folded.state)?
    };
    io.since_snapshot = 0;
    Ok((target, raw))
}

/// Writes a snapshot now and waits for it (used by `gaffer store compact`).
fn snapshot(io: &mut Io, shared: &Shared) -> Result<u64, WorkspaceError> {
    let (target, raw) = prepare_snapshot(io, shared)?;
    let mark = target.write(&raw)?;
    anchor_snapshot(&shared.guard, mark);
    Ok(raw.seq)
}

/// The automatic snapshot: prepared under the locks, then written by a thread of its own
/// (temp file, fsync, rename, directory fsync) while commits go on. One at a time.
fn snapshot_in_background(io: &mut Io, shared: &Shared) {
    if shared.snapshot_writing.swap(true, Ordering::AcqRel) {
        return;
    }
    let done = Arc::clone(&shared.snapshot_writing);
    let (target, raw) = match prepare_snapshot(io, shared) {
        Ok(p) => p,
        Err(e) => {
            tracing::warn!(error = %e, "automatic snapshot failed");
            done.store(false, Ordering::Release);
            return;
        }
    };
    // The thread takes the encoded snapshot from the slot; if no thread can be started, this
    // one writes it: slower commits, same result.
    let slot = Arc::new(Mutex::new(Some((target, raw))));
    let guard = Arc::clone(&shared.guard);
    let write = move |slot: &Mutex<Option<(SnapshotTarget, RawSnapshot)>>| {
        let taken = lock(slot).take();
        if let Some((target, raw)) = taken {
            match target.write(&raw) {
                Ok(mark) => anchor_snapshot(&guard, mark),
                Err(e) => tracing::warn!(error = %e, "automatic snapshot failed"),
            }
        }
        done.store(false, Ordering::Release);
    };
    let theirs = Arc::clone(&slot);
    let write_there = write.clone();
    if let Err(e) = std::thread::Builder::new()
        .name("gaffer-snapshot".into())
        .spawn(move || write_there(&theirs))
    {
        tracing::warn!(error = %e, "no snapshot thread; writing the snapshot here");
        write(&slot);
    }
}

/// Counts a commit under way until it is answered (or its caller gives up on it).
struct Counted<'a>(&'a std::sync::atomic::AtomicUsize);

impl<'a> Counted<'a> {
    fn enter(n: &'a std::sync::atomic::AtomicUsize) -> Self {
        n.fetch_add(1, Ordering::Relaxed);
        Counted(n)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// What the writer learned from its last batch, to decide how long the next one gathers.
struct Gather {
    /// Jobs in the last batch: their callers are about to commit again (a client's result
    /// after its intent, its next intent after the result), one commit in flight each.
    expect: usize,
    /// How long the last batch took (its fdatasync, mostly).
    took: Duration,
}

impl Gather {
    /// Everything queued, and while fewer than the last batch's callers have come back, up to
    /// two batches' time from the end of the last (their turnaround included) for them, or
    /// one batch's time from the first that comes back after that, at most [`MAX_GATHER`]:
    /// one fdatasync then serves them all instead of one carrying the first caller and the
    /// next the rest, so the wait costs at most the fdatasync it saves. One caller at a time
    /// (`expect` 1) never waits. `None` once the queue is closed and empty.
    fn take(&self, jobs: &CommitQueue<Job>) -> Option<Vec<Job>> {
        let back = self.took.saturating_mul(2).min(MAX_GATHER);
        jobs.take(self.expect, (back, self.took.min(MAX_GATHER)), MAX_BATCH)
    }
}

/// Answers whatever is still queued when the writer stops, by closing or by a panic: a
/// caller waits for an answer, never forever.
struct AnswerLeftovers<'a>(&'a CommitQueue<Job>);

impl Drop for AnswerLeftovers<'_> {
    fn drop(&mut self) {
        for job in self.0.close_and_drain() {
            let _ =
                std::panic::catch_unwind(AssertUnwindSafe(|| job(Err(WorkspaceError::WriterGone))));
        }
    }
}

fn writer_loop(shared: &Shared, (dir, view): (&Path, &ChainView), queue: &CommitQueue<Job>) {
    let _leftovers = AnswerLeftovers(queue);
    let mut gather = Gather {
        expect: 1,
        took: Duration::ZERO,
    };
    while let Some(jobs) = gather.take(queue) {
        gather.expect = jobs.len();
        shared.last_batch.store(jobs.len(), Ordering::Relaxed);
        let started = Instant::now();
        shared.writer_writing.store(true, Ordering::Release);
        write_batch(&mut lock(&shared.io), shared, (dir, view), jobs, None);
        shared.writer_writing.store(false, Ordering::Release);
        gather.took = started.elapsed();
    }
}

/// Runs one group commit (`io` held); a failed batch reloads the state from disk, and a
/// snapshot is started when enough has been written since the last. With `busy` (a caller's
/// thread, not the writer's), the batch never waits for another process's store lock: held,
/// its jobs go to that queue instead, and so does the snapshot. (A failed batch still reloads
/// here: nothing may commit on a state ahead of the disk.)
fn write_batch(
    io: &mut Io,
    shared: &Shared,
    (dir, view): (&Path, &ChainView),
    jobs: Vec<Job>,
    busy: Option<&CommitQueue<Job>>,
) {
    if let Err(e) = run_batch(io, shared, jobs, busy) {
        tracing::error!(error = %e, "commit batch failed; reloading state from disk");
        reload(io, shared, (dir, view));
    }
    if io.since_snapshot < SNAPSHOT_EVERY {
        return;
    }
    match busy {
        None => snapshot_in_background(io, shared),
        // Preparing a snapshot waits for the store lock: the writer does it, woken by a
        // commit that stages nothing.
        Some(queue) => {
            let _ = queue.push(Box::new(|_| None));
        }
    }
}

/// Replaces the store handle and the folded state with what the disk holds (after a batch
/// that may have left the state ahead of the disk).
fn reload(io: &mut Io, shared: &Shared, (dir, view): (&Path, &ChainView)) {
    match load(dir, view) {
        Ok(loaded) => {
            io.store = loaded.store;
            lock(&shared.folded).state = loaded.state;
            *lock(&shared.guard) = loaded.guard;
        }
        Err(e) => tracing::error!(error = %e, "reloading the store failed"),
    }
}

/// Records staged by a batch, their notices, and the completions to call once durable.
type Staged = (Vec<Record>, Vec<Notice>, Vec<Completion>);

/// Runs queued commits against the state, staging their records (each sees those before it).
/// Returns the staged records, their notices and the completions to call once durable.
fn stage_jobs(state: &mut State, next_seq: u64, jobs: Vec<Job>) -> Result<Staged, WorkspaceError> {
    let mut stage = Stage {
        next_seq,
        state,
        staged: Vec::new(),
        notices: Vec::new(),
    };
    let mut completions: Vec<Completion> = Vec::with_capacity(jobs.len());
    for job in jobs {
        match std::panic::catch_unwind(AssertUnwindSafe(|| job(Ok(&mut stage)))) {
            Ok(Some(done)) => completions.push(done),
            Ok(None) => {}
            Err(_) => {
                tracing::error!("a commit closure panicked; its batch is abandoned");
                fail(completions, &WorkspaceError::CommitPanicked);
                return Err(WorkspaceError::CommitPanicked);
            }
        }
    }
    Ok((stage.staged, stage.notices, completions))
}

/// [`stage_jobs`], plus the `store.created` record (seq 1, a fresh workspace id) in front when
/// this batch creates the journal: decided under the store lock, so racing first writers
/// agree on one id. The commits then start at seq 2; a batch staging nothing writes nothing.
fn stage_batch(
    shared: &Shared,
    state: &mut State,
    next_seq: u64,
    jobs: Vec<Job>,
) -> Result<Staged, WorkspaceError> {
    shared.staged_batches.fetch_add(1, Ordering::Relaxed);
    let fresh = next_seq == 1;
    let (mut staged, notices, completions) = stage_jobs(state, next_seq + u64::from(fresh), jobs)?;
    if fresh && !staged.is_empty() {
        match crate::store::store_created_record() {
            Ok(created) => staged.insert(0, created),
            Err(e) => {
                let e = WorkspaceError::from(e);
                fail(completions, &e);
                return Err(e);
            }
        }
    }
    Ok((staged, notices, completions))
}

fn fail(completions: Vec<Completion>, e: &WorkspaceError) {
    let msg = e.to_string();
    for c in completions {
        c(Err(WorkspaceError::Unavailable(msg.clone())));
    }
}

/// Acknowledges a durable batch and pushes its notices.
fn publish(shared: &Shared, written: usize, completions: Vec<Completion>, notices: Vec<Notice>) {
    if written > 0 {
        shared.syncs.fetch_add(1, Ordering::Relaxed);
    }
    for c in completions {
        c(Ok(()));
    }
    broadcast_all(shared, notices);
}

/// One group commit, `io` held throughout: stage under the state lock, append and fdatasync
/// without it, then publish. Returns Err when state may be ahead of disk and must be reloaded.
fn run_batch(
    io: &mut Io,
    shared: &Shared,
    jobs: Vec<Job>,
    busy: Option<&CommitQueue<Job>>,
) -> Result<(), WorkspaceError> {
    // Before the first write there is no store to lock, and a batch that writes nothing must
    // not create one: under a lock on the workspace root (which every creator of the store
    // holds), stage against the folded state and create the store only if records result.
    // Once the journal exists it stays (the store is never deleted under a running process),
    // so later batches skip the stat.
    if io.journal_exists {
        return run_batch_locked(io, shared, jobs, busy);
    }
    let journal = io.store.dir().join("journal");
    if journal.exists() {
        io.journal_exists = true;
        return run_batch_locked(io, shared, jobs, busy);
    }
    let root_lock = io
        .store
        .dir()
        .parent()
        .and_then(|root| std::fs::File::open(root).ok())
        .and_then(|f| f.lock().ok().map(|()| f));
    if root_lock.is_none() || journal.exists() {
        drop(root_lock);
        return run_batch_locked(io, shared, jobs, busy);
    }
    let (staged, notices, completions, next_seq) = {
        let mut folded = lock(&shared.folded);
        let next_seq = folded.state.last_seq + 1;
        let (staged, notices, completions) =
            stage_batch(shared, &mut folded.state, next_seq, jobs)?;
        (staged, notices, completions, next_seq)
    };
    if !staged.is_empty()
        && let Err(e) = create_journal(io, shared, &staged, next_seq)
    {
        fail(completions, &e);
        return Err(e);
    }
    drop(root_lock);
    io.journal_exists = !staged.is_empty();
    io.since_snapshot += staged.len() as u64;
    publish(shared, staged.len(), completions, notices);
    Ok(())
}

/// The first append, which creates the journal (the caller holds the workspace root's lock).
fn create_journal(
    io: &mut Io,
    shared: &Shared,
    staged: &[Record],
    next_seq: u64,
) -> Result<(), WorkspaceError> {
    let hook = io.before_write.clone();
    let mut txn = io.store.begin()?;
    if let Some(h) = hook {
        h();
    }
    // Nobody can have written first (creators hold the root lock); check anyway.
    let others = txn.take_new()?;
    if !others.is_empty() || txn.next_seq() != next_seq {
        return Err(WorkspaceError::Unavailable(
            "another process wrote first; retry".into(),
        ));
    }
    txn.append(staged)?;
    anchor_appended(shared);
    Ok(())
}

/// A batch on an existing journal: catch up with other processes' records, stage, append.
fn run_batch_locked(
    io: &mut Io,
    shared: &Shared,
    jobs: Vec<Job>,
    busy: Option<&CommitQueue<Job>>,
) -> Result<(), WorkspaceError> {
    let hook = io.before_write.clone();
    let locked = match busy {
        None => io.store.begin().map(Some),
        Some(_) => io.store.try_begin(),
    };
    let mut txn = match locked {
        Ok(Some(t)) => t,
        Ok(None) => {
            for job in jobs {
                if let Some(Err(job)) = busy.map(|queue| queue.push(job)) {
                    job(Err(WorkspaceError::WriterGone));
                }
            }
            return Ok(());
        }
        Err(e) => {
            let msg = e.to_string();
            tracing::error!(error = %msg, "cannot take the store lock");
            for job in jobs {
                job(Err(WorkspaceError::Unavailable(msg.clone())));
            }
            return Ok(());
        }
    };
    if let Some(h) = hook {
        h();
    }
    let others = txn.take_new()?;
    let (staged, notices, completions) = {
        let mut folded = lock(&shared.folded);
        folded.last_poll = Instant::now();
        let mut notices = Vec::new();
        for rec in &others {
            folded.state.apply(rec, &mut notices);
        }
        let (staged, staged_notices, completions) =
            stage_batch(shared, &mut folded.state, txn.next_seq(), jobs)?;
        notices.extend(staged_notices);
        (staged, notices, completions)
    };
    // The state lock is released: reads go on while this append and its fdatasync run, and
    // new commits queue up for the next batch.
    shared.appending.store(true, Ordering::Release);
    let appended = if staged.is_empty() {
        Ok(())
    } else {
        txn.append(&staged)
    };
    shared.appending.store(false, Ordering::Release);
    if appended.is_ok() && !staged.is_empty() {
        // Under the store lock, so heads reach the anchor in the journal's order.
        anchor_appended(shared);
    }
    drop(txn);
    if let Err(e) = appended {
        let e = WorkspaceError::from(e);
        fail(completions, &e);
        return Err(e);
    }
    io.since_snapshot += (others.len() + staged.len()) as u64;
    publish(shared, staged.len(), completions, notices);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn rec(kind: &str, n: u64) -> NewRecord {
        NewRecord::text(kind, crate::store::raw_payload(json!({ "n": n })))
    }

    /// The automatic snapshot is written by its own thread while commits go on; a reopen
    /// starts from it and the chain continues across it.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_background_snapshot_lets_commits_go_on_and_reopens_with_the_chain() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Workspace::open(dir.path()).expect("open a");
        for n in 0..20 {
            a.commit(move |_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", n)], ())))
                .await
                .expect("commit");
        }
        let at = a.seq();
        snapshot_in_background(&mut lock(&a.shared.io), &a.shared);
        // Commits while the snapshot is written.
        for n in 20..40 {
            a.commit(move |_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", n)], ())))
                .await
                .expect("commit during the snapshot write");
        }
        while a.shared.snapshot_writing.load(Ordering::Acquire) {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        let head = a.journal_head();
        let id = a.workspace_id();
        drop(a);
        let text = std::fs::read(dir.path().join(".gaffer/snapshot.json")).expect("snapshot");
        let env: Value = serde_json::from_slice(&text).expect("snapshot json");
        assert_eq!(
            env["seq"],
            json!(at),
            "the snapshot is at the seq it was prepared at"
        );
        let b = Workspace::open(dir.path()).expect("reopen");
        assert_eq!(b.journal_head(), head);
        assert_eq!(b.workspace_id(), id);
        assert_eq!(b.chain_status().broken_at, None);
        b.commit(|_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", 40)], ())))
            .await
            .expect("commit after reopen");
        assert_eq!(b.seq(), head.seq + 1);
    }

    /// A snapshot is a cache: damaged, or decoding to no state, it is skipped and the whole
    /// journal replayed to the same state.
    #[tokio::test]
    async fn a_damaged_or_undecodable_snapshot_is_skipped_and_the_journal_replayed() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Workspace::open(dir.path()).expect("open");
        for n in 0..5 {
            a.commit(move |_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", n)], ())))
                .await
                .expect("commit");
        }
        assert_eq!(a.compact().await.expect("compact"), 6);
        a.commit(|_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", 5)], ())))
            .await
            .expect("commit after the snapshot");
        let head = a.journal_head();
        drop(a);
        let path = dir.path().join(".gaffer/snapshot.json");
        let good = std::fs::read(&path).expect("snapshot");
        let text = String::from_utf8(good.clone()).expect("utf-8");
        // Damaged: the checksum no longer matches. Undecodable: a consistent envelope whose
        // state is no `State`.
        let damaged = text.replacen("\"last_seq\":6", "\"last_seq\":7", 1);
        assert_ne!(damaged, text);
        let undecodable = {
            let loaded = crate::store::Store::open(dir.path().join(".gaffer")).expect("store");
            let seq = loaded.raw_snapshot().expect("snapshot").seq;
            let raw = RawSnapshot::of(seq, &json!({"last_seq": "six"})).expect("encode");
            let at = text.find(",\"state\":").expect("state");
            let header: Value =
                serde_json::from_str(&format!("{}}}", &text[..at])).expect("header");
            let mut out = text[..at].replace(
                header["state_sha256"].as_str().expect("sha"),
                &crate::util::sha256_hex(raw.state_json()),
            );
            out.push_str(",\"state\":");
            out.push_str(std::str::from_utf8(raw.state_json()).expect("utf-8"));
            out.push('}');
            out
        };
        for bad in [damaged, undecodable] {
            std::fs::write(&path, &bad).expect("write");
            let b = Workspace::open(dir.path()).expect("opens from the journal");
            assert_eq!(b.seq(), 7);
            assert_eq!(b.journal_head(), head);
            assert_eq!(b.chain_status().broken_at, None);
        }
    }

    /// A watcher gets only the notices it keeps; a dropped one is forgotten at the next batch.
    #[tokio::test]
    async fn a_watch_delivers_only_what_it_keeps_and_ends_with_its_receiver() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(dir.path()).expect("open");
        let mut odd = ws.watch(|n| {
            n.params.to_value()["n"]
                .as_u64()
                .is_some_and(|v| v % 2 == 1)
        });
        let dropped = ws.watch(|_| true);
        drop(dropped);
        let notices = (0..4u64)
            .map(|n| Notice::everyone("test", json!({ "n": n })))
            .collect();
        broadcast_all(&ws.shared, notices);
        assert_eq!(
            lock(&ws.shared.watchers).len(),
            1,
            "the dropped watcher is gone"
        );
        let got: Vec<u64> = std::iter::from_fn(|| odd.try_recv().ok())
            .filter_map(|n| n.params.to_value()["n"].as_u64())
            .collect();
        assert_eq!(got, vec![1, 3]);
    }

    /// A wake-up watcher is woken by a kept notice even when it arrives before the await (so
    /// one between a look at the state and the await is not lost), not by others, and is
    /// forgotten once dropped.
    #[tokio::test]
    async fn a_wake_keeps_a_kept_notice_for_the_next_await_and_ends_when_dropped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(dir.path()).expect("open");
        let wake = ws.wake_on(|n| n.params.to_value()["n"] == json!(7));
        let some = |n: u64| vec![Notice::everyone("test", json!({ "n": n }))];
        broadcast_all(&ws.shared, some(1));
        let quiet = tokio::time::timeout(Duration::from_millis(20), wake.notified()).await;
        assert!(quiet.is_err(), "a notice it does not keep wakes nothing");
        broadcast_all(&ws.shared, some(7));
        tokio::time::timeout(Duration::from_secs(5), wake.notified())
            .await
            .expect("the kept notice, sent before the await, wakes it");
        drop(wake);
        broadcast_all(&ws.shared, some(7));
        assert_eq!(
            lock(&ws.shared.watchers).len(),
            0,
            "the dropped wake is gone"
        );
    }

    /// A batch takes everything queued, and its wait for the last batch's callers ends (at
    /// `MAX_GATHER`) when they do not come.
    #[test]
    fn gathering_takes_everything_queued_and_its_wait_ends() {
        let job = || -> Job { Box::new(|_stage: Result<&mut Stage<'_>, WorkspaceError>| None) };
        let queue = CommitQueue::new();
        let lone = Gather {
            expect: 1,
            took: Duration::from_secs(60),
        };
        for _ in 0..2 {
            assert!(queue.push(job()).is_ok());
        }
        assert_eq!(
            lone.take(&queue).map(|j| j.len()),
            Some(2),
            "everything queued joins"
        );
        let three = Gather {
            expect: 3,
            took: Duration::from_secs(60),
        };
        for _ in 0..2 {
            assert!(queue.push(job()).is_ok());
        }
        assert_eq!(
            three.take(&queue).map(|j| j.len()),
            Some(2),
            "the wait ends without them"
        );
        queue.close();
        assert!(
            lone.take(&queue).is_none(),
            "a closed, empty queue ends the writer"
        );
    }

    /// Where a commit's closure ran, and the fdatasyncs it took.
    async fn commit_where(ws: &Workspace, n: u64) -> std::thread::ThreadId {
        ws.commit(move |_s: &State| {
            Ok::<_, ()>((vec![rec("gaffer.test", n)], std::thread::current().id()))
        })
        .await
        .expect("commit")
    }

    /// One committer at a time writes on its own thread (no hand-off to the writer and
    /// back); committers that contend go to the writer, which groups them.
    #[tokio::test]
    async fn a_lone_commit_runs_on_its_callers_thread_and_contending_ones_are_grouped() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(dir.path()).expect("open");
        // The first creates the journal (under the root's lock): the writer does that. Any
        // commit may find the store held for a moment and go to the writer, as designed: the
        // writer answers before letting go of it, and the tailer takes it every 25 ms; on a
        // loaded machine either can be preempted holding it. So: three in a row here.
        let here = std::thread::current().id();
        let mut in_a_row = 0;
        for n in 0..200 {
            let syncs = ws.syncs();
            if commit_where(&ws, n).await == here {
                assert_eq!(ws.syncs() - syncs, 1, "a lone commit is one fdatasync");
                in_a_row += 1;
            } else {
                in_a_row = 0;
            }
            if in_a_row == 3 {
                break;
            }
            // Lets the writer and the tailer let go of the store.
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        assert_eq!(
            in_a_row, 3,
            "no three lone commits ran on their caller's thread"
        );
        let base = ws.seq();
        let syncs = ws.syncs();
        let tasks: Vec<_> = (0..8u64)
            .map(|n| {
                let ws = Arc::clone(&ws);
                tokio::spawn(async move { commit_where(&ws, 10 + n).await })
            })
            .collect();
        let mut ran_here = 0;
        for t in tasks {
            ran_here += usize::from(t.await.expect("join") == here);
        }
        // Only the first task yields before it chooses (the others find it committing); it
        // finds itself alone again only if the writer answered all seven first, as it may on
        // a loaded machine.
        assert!(
            ran_here <= 1,
            "{ran_here} contending commits ran on their caller's thread, not the writer"
        );
        assert!(
            ws.syncs() - syncs < 8,
            "8 contending commits took {} fdatasyncs",
            ws.syncs() - syncs
        );
        assert_eq!(ws.seq(), base + 8);
    }

    /// A current-thread runtime that writes its queued commits when it goes idle, as
    /// `gaffer serve` runs.
    fn idle_writing_runtime() -> tokio::runtime::Runtime {
        crate::runtime::builder().build().expect("runtime")
    }

    /// `commit_where` for each of `ns`, each from a task of its own.
    fn spawn_commits(
        ws: &Arc<Workspace>,
        ns: impl IntoIterator<Item = u64>,
    ) -> Vec<tokio::task::JoinHandle<std::thread::ThreadId>> {
        ns.into_iter()
            .map(|n| {
                let ws = Arc::clone(ws);
                tokio::spawn(async move { commit_where(&ws, n).await })
            })
            .collect()
    }

    /// Keeps a current-thread runtime busy (a yielding task never lets it park) until `done`;
    /// fails with `stuck` after 30 s.
    async fn stay_busy_until(done: impl Fn() -> bool, stuck: &str) {
        let busy = Instant::now();
        while !done() {
            assert!(busy.elapsed() < Duration::from_secs(30), "{stuck}");
            std::thread::sleep(Duration::from_micros(200));
            tokio::task::yield_now().await;
        }
    }

    /// Commits that contend on such a runtime are written by its own thread, once every task
    /// waits, as one batch: no hand-off to the writer and back.
    #[test]
    fn contending_commits_are_one_batch_written_by_their_runtime_when_it_goes_idle() {
        idle_writing_runtime().block_on(async {
            let dir = tempfile::tempdir().expect("tempdir");
            let ws = Workspace::open(dir.path()).expect("open");
            commit_where(&ws, 0).await;
            let here = std::thread::current().id();
            // The writer or the tailer may hold the store at the moment the runtime parks;
            // then the writer takes the batch, as designed. So: one round of several.
            for round in 0..50u64 {
                let syncs = ws.syncs();
                let base = ws.seq();
                let tasks = spawn_commits(&ws, (0..8).map(|n| 100 * round + n));
                let mut ran_here = 0;
                for t in tasks {
                    ran_here += usize::from(t.await.expect("join") == here);
                }
                assert_eq!(ws.seq(), base + 8);
                if ran_here == 8 && ws.syncs() - syncs == 1 {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            panic!("no 8 contending commits were one batch written by their runtime's thread");
        });
    }

    /// A runtime that never goes idle does not hold its commits back: after `IDLE_WAIT` each
    /// wakes the writer, which writes them while the runtime is still busy.
    #[test]
    fn a_runtime_that_stays_busy_leaves_its_queued_commits_to_the_writer() {
        idle_writing_runtime().block_on(async {
            let dir = tempfile::tempdir().expect("tempdir");
            let ws = Workspace::open(dir.path()).expect("open");
            // Its wait lets the runtime park once, which turns idle writing on here.
            commit_where(&ws, 0).await;
            let here = std::thread::current().id();
            let tasks = spawn_commits(&ws, 1..=2);
            stay_busy_until(
                || tasks.iter().all(|t| t.is_finished()),
                "the queued commits waited for a runtime that never went idle",
            )
            .await;
            for t in tasks {
                assert_ne!(t.await.expect("join"), here, "the writer wrote them");
            }
            assert_eq!(ws.seq(), 4);
        });
    }

    /// A deferred commit whose caller stops waiting (a request timed out, say) is not left
    /// for a runtime that stays busy: dropping the wait wakes the writer for it.
    #[test]
    fn a_deferred_commit_whose_caller_gives_up_is_written_while_its_runtime_stays_busy() {
        idle_writing_runtime().block_on(async {
            let dir = tempfile::tempdir().expect("tempdir");
            let ws = Workspace::open(dir.path()).expect("open");
            commit_where(&ws, 0).await;
            let tasks = spawn_commits(&ws, 1..=2);
            // Both run up to their deferred wait, then their callers give up on them.
            for _ in 0..4 {
                tokio::task::yield_now().await;
            }
            for t in &tasks {
                t.abort();
            }
            stay_busy_until(
                || ws.seq() >= 4,
                "abandoned commits waited for a runtime that never went idle",
            )
            .await;
        });
    }

    /// A lone commit never waits on this thread for another process's store lock: while one
    /// holds it, the commit goes to the writer and the caller's runtime runs on.
    #[tokio::test]
    async fn a_lone_commit_does_not_block_its_thread_on_another_processes_lock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(dir.path()).expect("open");
        commit_where(&ws, 0).await;
        let gaffer_dir = dir.path().join(".gaffer");
        let (held_tx, held_rx) = std::sync::mpsc::channel();
        let other = std::thread::spawn(move || {
            let mut store = Store::open(&gaffer_dir).expect("store");
            let txn = store.begin().expect("lock");
            held_tx.send(()).expect("held");
            std::thread::sleep(Duration::from_millis(300));
            drop(txn);
        });
        held_rx.recv().expect("the other process holds the lock");
        let ticks = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let ticker = {
            let ticks = Arc::clone(&ticks);
            tokio::spawn(async move {
                loop {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    ticks.fetch_add(1, Ordering::Relaxed);
                }
            })
        };
        let here = std::thread::current().id();
        assert_ne!(commit_where(&ws, 1).await, here, "the writer wrote it");
        ticker.abort();
        other.join().expect("other");
        assert!(
            ticks.load(Ordering::Relaxed) >= 5,
            "the runtime ran while the lock was held elsewhere"
        );
        assert_eq!(ws.seq(), 3);
    }

    #[tokio::test]
    async fn commits_are_durable_ordered_and_rejections_write_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(dir.path()).expect("open");
        assert!(
            !dir.path().join(".gaffer").exists(),
            "opening creates nothing"
        );
        let seq = ws
            .commit(|s: &State| Ok::<_, ()>((vec![rec("gaffer.test", 1)], s.last_seq)))
            .await
            .expect("commit");
        assert_eq!(seq, 0, "the closure saw the state before its own records");
        // Seq 1 is the store's `store.created` record.
        assert_eq!(ws.seq(), 2);
        let rejected = ws
            .commit(|_s: &State| Err::<(Vec<NewRecord>, ()), _>("no"))
            .await;
        assert!(matches!(rejected, Err(CommitError::Rejected("no"))));
        assert_eq!(ws.seq(), 2);
        // Many concurrent commits: every one lands exactly once, in a contiguous sequence.
        let mut handles = Vec::new();
        for i in 0..50u64 {
            let ws = Arc::clone(&ws);
            handles.push(tokio::spawn(async move {
                ws.commit(move |_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", i)], ())))
                    .await
            }));
        }
        for h in handles {
            assert!(h.await.expect("join").is_ok());
        }
        assert_eq!(ws.seq(), 52);
        let head = ws.journal_head();
        drop(ws);
        let again = Workspace::open(dir.path()).expect("reopen");
        assert_eq!(again.seq(), 52);
        assert_eq!(
            again.journal_head(),
            head,
            "the reopened chain ends where it was left"
        );
        assert_eq!(again.chain_status().broken_at, None);
        let mut seen = Vec::new();
        Store::open(dir.path().join(".gaffer"))
            .expect("store")
            .read_all(0, |r: Record| -> Result<(), StoreError> {
                seen.push(r.seq);
                Ok(())
            })
            .expect("read");
        assert_eq!(seen, (1..=52).collect::<Vec<_>>());
    }

    /// A fresh read sees what another instance committed a moment after this one last looked
    /// (a plain read may answer from that look for up to READ_FRESHNESS).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_fresh_read_sees_a_commit_made_just_after_this_instance_looked() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Workspace::open(dir.path()).expect("open a");
        let b = Workspace::open(dir.path()).expect("open b");
        a.commit(|_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", 0)], ())))
            .await
            .expect("first commit");
        for n in 1..=20u64 {
            let seen = b.read_fresh(|s| s.last_seq);
            a.commit(move |_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", n)], ())))
                .await
                .expect("commit a");
            assert_eq!(b.read_fresh(|s| s.last_seq), seen + 1, "round {n}");
        }
    }

    /// Appends `rec`s from `a` until `stop`: another process writing while one opens or
    /// first reads the store (it anchors each head once durable, under the store lock).
    fn keep_appending(
        a: Arc<Workspace>,
        stop: Arc<std::sync::atomic::AtomicBool>,
    ) -> tokio::task::JoinHandle<u64> {
        tokio::spawn(async move {
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                a.commit(move |_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", n)], ())))
                    .await
                    .expect("commit a");
            }
            n
        })
    }

    /// An anchor that moved on between reading the journal and reading the anchor is not a
    /// rollback: opening while another instance appends always finds the store intact.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn opening_while_another_instance_appends_is_never_judged_rolled_back() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Workspace::open(dir.path()).expect("open a");
        a.commit(|_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", 0)], ())))
            .await
            .expect("first commit");
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let appender = keep_appending(Arc::clone(&a), Arc::clone(&stop));
        for round in 0..40 {
            let b = Workspace::open(dir.path()).expect("open b");
            assert_eq!(b.standing(), Standing::Intact, "open {round}");
        }
        stop.store(true, Ordering::Relaxed);
        assert!(appender.await.expect("appender") > 0);
    }

    /// The same when the journal is first created by another instance after this one opened:
    /// its first fold judges it, and a head anchored after that fold's read is no rollback.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_journal_first_read_while_another_instance_appends_is_never_judged_rolled_back() {
        for round in 0..100 {
            let dir = tempfile::tempdir().expect("tempdir");
            let a = Workspace::open(dir.path()).expect("open a");
            let b = Workspace::open(dir.path()).expect("open b");
            let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
            let appender = keep_appending(Arc::clone(&a), Arc::clone(&stop));
            let seen = tokio::time::timeout(Duration::from_secs(30), async {
                while b.read_fresh(|s| s.last_seq) < 20 {
                    tokio::task::yield_now().await;
                }
            });
            seen.await.expect("b sees a's appends");
            stop.store(true, Ordering::Relaxed);
            appender.await.expect("appender");
            assert_eq!(b.standing(), Standing::Intact, "round {round}");
        }
    }

    /// A journal is read; then another instance appends and anchors more, and holds the store
    /// lock (as a writer mid-batch or one appending back to back does). The judgment, which
    /// finds the anchor past the journal it read, settles by reading on without that lock:
    /// waiting for it would let such a writer starve the judgment into a false rollback. A
    /// journal truly cut back is still judged rolled back, with the lock held the same way.
    #[tokio::test]
    async fn a_journal_read_before_the_anchor_moved_is_judged_without_the_store_lock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let root = dir.path().canonicalize().expect("root");
        let gaffer_dir = root.join(".gaffer");
        let a = Workspace::open(&root).expect("open a");
        commit_where(&a, 0).await;
        let segment = gaffer_dir.join("journal/000001.log");
        let cut_back = std::fs::read(&segment).expect("segment");
        let read_then_judged = || {
            let view = ChainView::default();
            let mut store = Store::open_with_view(&gaffer_dir, view.clone()).expect("store");
            store
                .replay(0, |_| Ok::<_, StoreError>(()))
                .expect("replay");
            (store, view)
        };
        let (mut store, view) = read_then_judged();
        assert_eq!(
            view.head().seq,
            2,
            "the journal as read: the genesis record and one commit"
        );
        for n in 1..=3 {
            commit_where(&a, n).await;
        }
        let mut holder = Store::open(&gaffer_dir).expect("holder");
        let held = holder
            .begin()
            .expect("the store lock, held by another writer");
        let mut read_on = Vec::new();
        let (guard, n) = judge_store(&root, &mut store, &view, None, |r| read_on.push(r.seq));
        assert_eq!(guard.standing, Standing::Intact);
        assert_eq!(
            (n, read_on),
            (3, vec![3, 4, 5]),
            "read on to the anchored head"
        );

        // The agent cuts the journal back to before those three commits.
        std::fs::write(&segment, &cut_back).expect("the agent cuts the journal back");
        let (mut store, view) = read_then_judged();
        let (guard, n) = judge_store(&root, &mut store, &view, None, |_| ());
        assert!(
            matches!(guard.standing, Standing::RolledBack { .. }),
            "{:?}",
            guard.standing
        );
        assert_eq!(n, 0);
        drop(held);
    }

    /// The same on the path of a journal first read by the fold (this process opened before
    /// any journal existed): the fold's judgment reads on without the store lock too.
    #[tokio::test]
    async fn a_first_fold_read_before_the_anchor_moved_is_judged_without_the_store_lock() {
        let dir = tempfile::tempdir().expect("tempdir");
        let b = Workspace::open(dir.path()).expect("open b before any journal");
        b.stop_tailer.stop();
        tokio::time::sleep(TAIL_INTERVAL * 3).await;
        assert_eq!(b.standing(), Standing::Empty);
        let a = Workspace::open(dir.path()).expect("open a");
        commit_where(&a, 0).await;
        // b reads a's first batch (its tailer stopped and no read made, nothing else does).
        let first = lock(&b.shared.io)
            .store
            .poll()
            .expect("b reads a's first batch");
        assert_eq!(b.journal_head().seq, 2);
        for n in 1..=3 {
            commit_where(&a, n).await;
        }
        let mut holder = Store::open(b.gaffer_dir()).expect("holder");
        let held = holder
            .begin()
            .expect("the store lock, held by another writer");
        let mut read_on = Vec::new();
        let mut io = lock(&b.shared.io);
        let n = judge_first_journal(&b.shared, &mut io.store, |r| read_on.push(r.seq));
        assert_eq!(b.standing(), Standing::Intact);
        assert_eq!((first.len(), n, read_on), (2, 3, vec![3, 4, 5]));
        drop((held, io));
    }

    /// The agent zeroes batches another process appended (and anchored) before this process
    /// read them: this process's next append lands on them, and must not move the anchor back
    /// below what the other process anchored. The store stands rolled back instead.
    #[tokio::test]
    async fn an_append_over_destroyed_acknowledged_batches_is_judged_rolled_back() {
        for attempt in 0..10 {
            let dir = tempfile::tempdir().expect("tempdir");
            let a = Workspace::open(dir.path()).expect("open a");
            commit_where(&a, 0).await;
            // The agent wins the race against a's tailer (it zeroes b's batches before a's
            // next poll): a stops polling, so it meets the zeroed journal in its own commit.
            // Without this, on a loaded machine, the tailer folded b's records first in every
            // attempt. (It may still fold once more after its current sleep.)
            a.stop_tailer.stop();
            tokio::time::sleep(TAIL_INTERVAL * 3).await;
            let segment = dir.path().join(".gaffer/journal/000001.log");
            let before = std::fs::read(&segment).expect("segment");
            let b = Workspace::open(dir.path()).expect("open b");
            for n in 1..=3 {
                commit_where(&b, n).await;
            }
            let after = std::fs::read(&segment).expect("segment");
            let start = before
                .iter()
                .zip(&after)
                .position(|(x, y)| x != y)
                .expect("b appended");
            let end = after.iter().rposition(|x| *x != 0).expect("records") + 1;
            let mut zeroed = after.clone();
            zeroed[start..end].fill(0);
            std::fs::write(&segment, &zeroed).expect("the agent zeroes b's batches");
            if a.journal_head().seq != 2 {
                continue; // a's tailer folded b's records first: no attack to play
            }
            commit_where(&a, 9).await;
            assert!(
                matches!(a.standing(), Standing::RolledBack { .. }),
                "attempt {attempt}: {:?}",
                a.standing()
            );
            let reopened = Workspace::open(dir.path()).expect("reopen");
            assert!(
                matches!(reopened.standing(), Standing::RolledBack { .. }),
                "the anchor still holds b's head: {:?}",
                reopened.standing()
            );
            return;
        }
        panic!("the tailer folded b's records before they were zeroed in every attempt");
    }

    #[tokio::test]
    async fn another_instance_sees_appends_and_snapshots_keep_state() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Workspace::open(dir.path()).expect("open a");
        let b = Workspace::open(dir.path()).expect("open b");
        a.commit(|_s: &State| {
            Ok::<_, ()>((vec![rec("gaffer.test", 1), rec("gaffer.test", 2)], ()))
        })
        .await
        .expect("commit a");
        // b folds a's records on read once READ_FRESHNESS has passed since a's commit (any look
        // younger than that began after the commit and saw it), however late a look of b's
        // tailer folds; and b's own commit continues the sequence.
        std::thread::sleep(READ_FRESHNESS * 2);
        assert_eq!(b.seq(), 3);
        b.commit(|s: &State| {
            assert_eq!(s.last_seq, 3);
            Ok::<_, ()>((vec![rec("gaffer.test", 3)], ()))
        })
        .await
        .expect("commit b");
        std::thread::sleep(READ_FRESHNESS * 2);
        assert_eq!(a.seq(), 4);
        assert_eq!(a.journal_head(), b.journal_head(), "both follow one chain");
        let signed = a.journal_head();
        assert_eq!(a.compact().await.expect("compact"), 4);
        a.commit(|_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", 4)], ())))
            .await
            .expect("commit after snapshot");
        let id = a.workspace_id();
        drop((a, b));
        let c = Workspace::open(dir.path()).expect("reopen");
        assert_eq!(c.seq(), 5);
        // The snapshot carries the id and the head: the chain continues across it.
        assert_eq!(c.workspace_id(), id);
        assert_eq!(
            c.hash_at(4),
            Some(signed.hash),
            "the snapshot head is known"
        );
        assert!(c.hash_at(5).is_some());
        assert_eq!(c.journal_head().seq, 5);
        assert_eq!(c.chain_status().broken_at, None);
    }

    /// A look at the journal that read it, then waited before folding (a descheduled tailer),
    /// counts as fresh from when it read, not from when it folded: a later read looks again.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_look_that_waited_before_folding_is_not_taken_for_a_fresh_one() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Workspace::open(dir.path()).expect("open a");
        a.commit(|_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", 1)], ())))
            .await
            .expect("commit a");
        let b = Workspace::open(dir.path()).expect("open b");
        assert_eq!(b.seq(), 2);
        // Only the looks this test makes: no tailer folds a's next record behind its back.
        b.stop_tailer.stop();
        let (looked_tx, looked_rx) = std::sync::mpsc::channel::<()>();
        let (go_tx, go_rx) = std::sync::mpsc::channel::<()>();
        lock(&b.shared.io).after_poll = Some(Box::new(move || {
            let _ = looked_tx.send(());
            let _ = go_rx.recv();
        }));
        let looker = {
            let b = Arc::clone(&b);
            std::thread::spawn(move || b.read_fresh(|s| s.last_seq))
        };
        looked_rx.recv().expect("b looked at the journal");
        a.commit(|_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", 2)], ())))
            .await
            .expect("commit a again");
        // b's held look read the journal before a's append, longer ago than READ_FRESHNESS.
        std::thread::sleep(READ_FRESHNESS * 2);
        go_tx.send(()).expect("release the look");
        looker.join().expect("looker");
        assert_eq!(
            b.seq(),
            3,
            "a read looks again: the held look ended just now but began before a's append"
        );
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn racing_first_writes_from_two_instances_all_land_and_empty_commits_create_nothing() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = Workspace::open(dir.path()).expect("open a");
        let b = Workspace::open(dir.path()).expect("open b");
        assert_eq!(a.workspace_id(), None, "no store, no id");
        assert_eq!(
            a.journal_head().hash,
            "0".repeat(64),
            "an empty store is at genesis"
        );
        a.commit(|_s: &State| Ok::<_, ()>((Vec::new(), ())))
            .await
            .expect("empty commit");
        assert!(
            !dir.path().join(".gaffer").exists(),
            "a commit that writes nothing creates nothing"
        );
        let mut handles = Vec::new();
        for i in 0..40u64 {
            let ws = Arc::clone(if i % 2 == 0 { &a } else { &b });
            handles.push(tokio::spawn(async move {
                ws.commit(move |_s: &State| Ok::<_, ()>((vec![rec("gaffer.test", i)], ())))
                    .await
            }));
        }
        for h in handles {
            assert!(h.await.expect("join").is_ok(), "every racing commit lands");
        }
        std::thread::sleep(READ_FRESHNESS * 2);
        assert_eq!(a.seq(), 41);
        assert_eq!(b.seq(), 41);
        // One store.created record at seq 1, and both instances read the same id from it.
        let mut created = Vec::new();
        Store::open(dir.path().join(".gaffer"))
            .expect("store")
            .read_all(0, |r: Record| -> Result<(), StoreError> {
                if r.kind == crate::store::STORE_CREATED {
                    created.push((r.seq, r.payload_value()["workspace_id"].clone()));
                }
                Ok(())
            })
            .expect("read");
        let id = a.workspace_id().expect("a knows the id");
        assert!(id.starts_with("ws_") && id.len() == 27, "{id}");
        assert_eq!(created, vec![(1, json!(id))]);
        assert_eq!(b.workspace_id(), Some(id));
        assert_eq!(a.journal_head(), b.journal_head());
    }

    /// An operation created and moved twice, as the engine's commits record it.
    fn typed_operation_records(reason: &str) -> Vec<NewRecord> {
        use crate::operations::lifecycle::OpState as S;
        use crate::operations::state::tests::op;
        use crate::operations::state::{Created, KIND_CREATED, KIND_TRANSITIONED, Transitioned};
        let mut o = op("op_typed", S::Approved, None);
        o.reason = reason.into();
        o.target = json!({"path": "dir/\u{1F600} \"quoted\"\n", "mode": null}).into();
        o.arguments =
            json!({"n": [1, -2, 2.5, 1e300, u64::MAX], "nested": {"b": true, "a": []}}).into();
        let step = |from, to, revision| Transitioned {
            id: "op_typed".into(),
            from,
            to,
            revision,
            at_ms: 20 * revision,
            error: None,
            result: (to == S::Succeeded).then(|| json!({"exit_code": 0, "bytes": 0.1})),
            upstream_status: None,
            approval: None,
            executor: Some("pr_x".into()),
            seal: None,
        };
        let created = Created {
            operation: o,
            approval: None,
        };
        vec![
            NewRecord::typed(KIND_CREATED, created).expect("encode"),
            NewRecord::typed(KIND_TRANSITIONED, step(S::Approved, S::Executing, 2))
                .expect("encode"),
            NewRecord::typed(KIND_TRANSITIONED, step(S::Executing, S::Succeeded, 3))
                .expect("encode"),
        ]
    }

    #[tokio::test]
    async fn a_record_folded_from_its_value_equals_its_replay_from_the_text() {
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(dir.path()).expect("open");
        let records = typed_operation_records("r");
        assert!(records.iter().all(|r| r.typed.is_some()));
        ws.commit(move |_| Ok::<_, ()>((records, ())))
            .await
            .expect("commit");
        let live = ws.read(|s| s.operations.get("op_typed").cloned());
        let live = live.expect("folded");
        assert_eq!(live.state, crate::operations::lifecycle::OpState::Succeeded);
        drop(ws);
        let again = Workspace::open(dir.path()).expect("reopen");
        let replayed = again.read(|s| s.operations.get("op_typed").cloned());
        assert_eq!(Some(live), replayed);
    }

    #[cfg(debug_assertions)]
    #[tokio::test]
    async fn a_value_its_text_does_not_decode_to_abandons_the_commit_in_debug_builds() {
        // The journal is the record: a value that differs from the text it travels with
        // would make this process's state differ from every replay.
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(dir.path()).expect("open");
        let mut records = typed_operation_records("the text");
        let other = typed_operation_records("another value");
        records[0].typed = other[0].typed.clone();
        let r = ws.commit(move |_| Ok::<_, ()>((records, ()))).await;
        assert!(
            matches!(r, Err(CommitError::Store(WorkspaceError::CommitPanicked))),
            "{r:?}"
        );
        assert!(ws.read(|s| s.operations.get("op_typed").is_none()));
    }

    #[tokio::test]
    async fn a_record_too_deep_to_read_back_is_not_folded_here_either() {
        // serde_json writes any depth and reads at most 127 levels: such a record is skipped
        // by every replay, so this process must not hold it in its state.
        let dir = tempfile::tempdir().expect("tempdir");
        let ws = Workspace::open(dir.path()).expect("open");
        let mut records = typed_operation_records("deep");
        let deep: Value = (0..126).fold(json!(1), |v, _| json!([v]));
        let mut created: crate::operations::state::Created =
            serde_json::from_str(records[0].payload.get()).expect("decode");
        created.operation.target = json!({ "x": deep }).into();
        records[0] =
            NewRecord::typed(crate::operations::state::KIND_CREATED, created).expect("encode");
        assert!(
            records[0].typed.is_none(),
            "a text this deep folds from its text"
        );
        ws.commit(move |_| Ok::<_, ()>((records, ())))
            .await
            .expect("commit");
        let live = ws.read(|s| s.operations.get("op_typed").cloned());
        drop(ws);
        let again = Workspace::open(dir.path()).expect("reopen");
        assert_eq!(live, None);
        assert_eq!(again.read(|s| s.operations.get("op_typed").cloned()), None);
    }
}
