//! Commits written by the runtime thread that made them, once that runtime has nothing else
//! to run.
//!
//! A commit handed to the writer thread costs two cross-thread wake-ups: the writer's, and
//! then one per answered task on the committer's runtime (tokio wakes a runtime from another
//! thread with an eventfd write each time; on a VM, a halted CPU takes an interrupt). When
//! every task of a runtime waits for a commit, as the clients of a batch do, the runtime has
//! nothing to overlap with the batch's I/O: its own thread writes the batch just before it
//! would park, and the answers wake their tasks on that same thread, with no system call.
//!
//! A runtime opts in by calling [`write_queued_commits`] from tokio's `on_thread_park`. On its
//! threads, a commit that cannot be written at once is queued without waking the writer; if
//! the runtime stays busy for [`IDLE_WAIT`], the commit wakes the writer itself.

use std::cell::{Cell, RefCell};
use std::panic::AssertUnwindSafe;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::queue::CommitQueue;
use super::{Job, MAX_BATCH, Shared, reload, try_lock, write_batch};
use crate::store::ChainView;

/// Longest a deferred commit waits for its runtime to go idle before the writer takes it.
pub(super) const IDLE_WAIT: Duration = Duration::from_millis(1);

thread_local! {
    /// This thread's runtime calls [`write_queued_commits`] before it parks.
    static WRITES_WHEN_IDLE: Cell<bool> = const { Cell::new(false) };
    /// Workspaces holding commits this thread deferred, written when its runtime parks.
    static PENDING: RefCell<Vec<Arc<LocalWriter>>> = const { RefCell::new(Vec::new()) };
}

/// Writes the commits this thread's tasks queued, each workspace's as one batch. Install it
/// with `tokio::runtime::Builder::on_thread_park` (as [`crate::runtime::builder`] does), on a
/// runtime whose time driver is enabled: a deferred commit times its wait for it. The answered
/// tasks are scheduled on this thread, so the runtime runs them instead of parking. The
/// choice is the thread's from its first park on: a thread that later runs another runtime
/// must give it a time driver too (its contended commits then reach the writer after
/// [`IDLE_WAIT`]).
pub fn write_queued_commits() {
    WRITES_WHEN_IDLE.set(true);
    for writer in PENDING.take() {
        writer.write();
    }
}

/// Has this thread write `writer`'s queued commits at its next park.
fn write_at_next_park(writer: &Arc<LocalWriter>) {
    PENDING.with_borrow_mut(|pending| {
        if !pending.iter().any(|w| Arc::ptr_eq(w, writer)) {
            pending.push(Arc::clone(writer));
        }
    });
}

/// Whether commits made on this thread may wait for its runtime to go idle.
pub(super) fn writes_when_idle() -> bool {
    WRITES_WHEN_IDLE.get()
}

/// What a caller's thread needs to write one workspace's commits itself: a lone commit, or
/// those its runtime queued before parking.
pub(super) struct LocalWriter {
    pub(super) shared: Arc<Shared>,
    pub(super) jobs: Arc<CommitQueue<Job>>,
    pub(super) dir: PathBuf,
    pub(super) chain: ChainView,
}

impl LocalWriter {
    /// Queues `job` for this thread to write when its runtime parks (hands it back when the
    /// queue is closed).
    pub(super) fn defer(self: &Arc<Self>, job: Job) -> Result<(), Job> {
        self.jobs.push_quiet(job)?;
        write_at_next_park(self);
        Ok(())
    }

    /// Writes what is queued as one batch (at most [`MAX_BATCH`]). While the writer thread
    /// writes a batch, what is queued here waits for this thread's next park: that batch's
    /// answers wake the tasks here, which queue their next commits, and all of them then go
    /// in one batch (handed to the writer, they would form a second cohort, a fdatasync each,
    /// for good). The deferred commits' own timers bound the wait ([`IDLE_WAIT`]). Whatever
    /// else this thread cannot write without waiting goes to the writer, which is woken for
    /// it: the store held by the tailer or another process, a journal not created yet (that
    /// waits for the workspace root's lock), or more than a batch.
    fn write(self: &Arc<Self>) {
        let held = self
            .write_here((), |()| self.jobs.take_now(MAX_BATCH))
            .is_err();
        if held && self.shared.writer_writing.load(Ordering::Acquire) {
            write_at_next_park(self);
        } else {
            self.jobs.kick();
        }
    }

    /// Writes one commit as a batch of its own on the caller's thread, if the store is free
    /// now (see [`LocalWriter::write_here`]); hands it back otherwise.
    pub(super) fn write_lone(&self, job: Job) -> Result<(), Job> {
        self.write_here(job, |job| vec![job])
    }

    /// Writes the jobs `take` makes of `pending` as one batch on this thread, if the store is
    /// free now: not held by the writer, the tailer or another thread, and with a journal to
    /// append to (creating one waits for the workspace root's lock). Never waits: hands
    /// `pending` back untouched when the store is not free.
    ///
    /// A panic while writing (folding another process's records, say) must not unwind into
    /// the caller, which may be the runtime's park: the batch's callers are answered by their
    /// dropped completions, and the state is reloaded from disk, as after a failed batch.
    fn write_here<P>(&self, pending: P, take: impl FnOnce(P) -> Vec<Job>) -> Result<(), P> {
        let Some(mut io) = try_lock(&self.shared.io) else {
            return Err(pending);
        };
        if !io.journal_exists {
            return Err(pending);
        }
        let jobs = take(pending);
        if jobs.is_empty() {
            return Ok(());
        }
        self.shared.last_batch.store(jobs.len(), Ordering::Relaxed);
        let at = (self.dir.as_path(), &self.chain);
        let written = std::panic::catch_unwind(AssertUnwindSafe(|| {
            write_batch(&mut io, &self.shared, at, jobs, Some(&self.jobs));
        }));
        if written.is_err() {
            tracing::error!("a commit batch panicked; reloading state from disk");
            reload(&mut io, &self.shared, at);
        }
        Ok(())
    }
}

/// Held by a deferred commit while it waits: if its caller stops waiting before the answer
/// (a request timed out or was dropped), the writer is woken for its job, which must not wait
/// for a runtime that may stay busy.
pub(super) struct KickUnlessAnswered<'a> {
    jobs: &'a CommitQueue<Job>,
    answered: bool,
}

impl<'a> KickUnlessAnswered<'a> {
    pub(super) fn new(jobs: &'a CommitQueue<Job>) -> Self {
        KickUnlessAnswered {
            jobs,
            answered: false,
        }
    }

    pub(super) fn answered(&mut self) {
        self.answered = true;
    }
}

impl Drop for KickUnlessAnswered<'_> {
    fn drop(&mut self) {
        if !self.answered {
            self.jobs.kick();
        }
    }
}
