//! The queue between committers and the writer thread.
//!
//! A committer wakes the writer only when the writer waits for that very job: the one that
//! completes the count a gathering writer waits for, or the first after a pause. The others
//! join without a system call. (A std channel wakes its receiver on every send, so a writer
//! gathering eight commits was woken, and parked again, eight times per batch.)
//!
//! A commit queued quietly belongs to the runtime that queued it, which writes it when it
//! parks: the writer takes it only once kicked, or along with a commit pushed for the writer.
//! (Taking it on its own, the writer split a runtime's clients into two cohorts whose batches
//! alternated, one fdatasync each, and the split kept itself going.)

use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub(super) struct CommitQueue<T> {
    inner: Mutex<Inner<T>>,
    ready: Condvar,
}

struct Inner<T> {
    items: Vec<T>,
    /// How many of `items` were pushed for the writer (the rest were queued quietly).
    loud: usize,
    closed: bool,
    /// How many queued items the writer is parked for; 0 while it is not parked.
    waiting_for: usize,
    /// A kick came: the writer takes what is queued without waiting for more.
    kicked: bool,
    /// Wake-ups pushes have made (tests count them).
    wakes: u64,
}

impl<T> CommitQueue<T> {
    pub(super) fn new() -> Self {
        CommitQueue {
            inner: Mutex::new(Inner {
                items: Vec::new(),
                loud: 0,
                closed: false,
                waiting_for: 0,
                kicked: false,
                wakes: 0,
            }),
            ready: Condvar::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<T>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues `item`, or hands it back when the queue is closed.
    pub(super) fn push(&self, item: T) -> Result<(), T> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(item);
        }
        inner.items.push(item);
        inner.loud += 1;
        let wake = inner.waiting_for != 0 && inner.for_writer() >= inner.waiting_for;
        inner.wakes += u64::from(wake);
        drop(inner);
        if wake {
            self.ready.notify_one();
        }
        Ok(())
    }

    /// Queues `item` without waking the writer, even one parked for it: the caller's thread
    /// writes it when its runtime goes idle (see `Workspace::commit`), or calls [`Self::kick`].
    pub(super) fn push_quiet(&self, item: T) -> Result<(), T> {
        let mut inner = self.lock();
        if inner.closed {
            return Err(item);
        }
        inner.items.push(item);
        Ok(())
    }

    /// Has the writer take what is queued now, woken if parked, without gathering more:
    /// whoever deferred it cannot write it. Nothing queued: nothing to do.
    pub(super) fn kick(&self) {
        let mut inner = self.lock();
        if inner.items.is_empty() {
            return;
        }
        inner.kicked = true;
        let wake = inner.waiting_for != 0;
        inner.wakes += u64::from(wake);
        drop(inner);
        if wake {
            self.ready.notify_one();
        }
    }

    /// Up to `max` queued items, oldest first, without waiting (none: empty).
    pub(super) fn take_now(&self, max: usize) -> Vec<T> {
        let mut inner = self.lock();
        let n = inner.items.len().min(max);
        inner.drain(n)
    }

    /// Nothing is queued (an instant's answer: a push may follow at once).
    pub(super) fn is_empty(&self) -> bool {
        self.lock().items.is_empty()
    }

    /// No more items are accepted; the writer takes what is queued, then sees the end.
    pub(super) fn close(&self) {
        self.lock().closed = true;
        self.ready.notify_one();
    }

    /// Closes the queue and returns what is still queued (the writer is gone: its callers
    /// must be answered by whoever drains it).
    pub(super) fn close_and_drain(&self) -> Vec<T> {
        let mut inner = self.lock();
        inner.closed = true;
        let n = inner.items.len();
        inner.drain(n)
    }

    /// Waits for `want` items and returns at most `max`, oldest first (`None` once closed and
    /// empty). When more than one is wanted (the callers of the last batch, about to come
    /// back), it waits up to `back` for all of them and is woken only by the push that
    /// completes the count, not by the first as well: each wake-up is a system call on the
    /// committer's thread and a cross-CPU interrupt. If none came by then, it waits for a first
    /// item without limit, then up to `gather` for the rest.
    pub(super) fn take(
        &self,
        want: usize,
        (back, gather): (Duration, Duration),
        max: usize,
    ) -> Option<Vec<T>> {
        let want = want.min(max);
        let mut inner = self.lock();
        let mut gathered = false;
        if want > 1 {
            inner = self.wait_for(inner, want, back);
            gathered = inner.for_writer() > 0;
        }
        while inner.for_writer() == 0 {
            if inner.closed {
                // (Closed, every item is the writer's: none is left.)
                return None;
            }
            inner.waiting_for = 1;
            inner = self.ready.wait(inner).unwrap_or_else(|p| p.into_inner());
        }
        if !gathered {
            inner = self.wait_for(inner, want, gather);
        }
        inner.waiting_for = 0;
        // A kick stays until the queue is empty (see `Inner::drain`): the quiet items left past
        // `max` are the writer's too, their committers' timers may have fired already.
        let n = inner.items.len().min(max);
        Some(inner.drain(n))
    }

    /// Waits (parked, `waiting_for` set) until `want` items are queued, the queue closes, or
    /// `gather` has passed.
    fn wait_for<'a>(
        &'a self,
        mut inner: MutexGuard<'a, Inner<T>>,
        want: usize,
        gather: Duration,
    ) -> MutexGuard<'a, Inner<T>> {
        let until = Instant::now() + gather;
        inner.waiting_for = want;
        while inner.for_writer() < want && !inner.closed && !inner.kicked {
            let left = until.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            inner = self
                .ready
                .wait_timeout(inner, left)
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
        inner
    }
}

impl<T> Inner<T> {
    /// How many items the writer may take now: all of them once it is kicked, the queue is
    /// closed, or one was pushed for it; none while every item waits for its runtime.
    fn for_writer(&self) -> usize {
        if self.kicked || self.closed || self.loud > 0 {
            self.items.len()
        } else {
            0
        }
    }

    /// The oldest `n` items; once the queue is empty, a kick is spent (it was for them).
    fn drain(&mut self, n: usize) -> Vec<T> {
        let taken: Vec<T> = self.items.drain(..n).collect();
        // Which items were loud is not kept: the taken count as quiet first, so a loud item
        // left is never mistaken for a quiet one (a quiet one may be taken a kick early).
        self.loud = self.loud.min(self.items.len());
        if self.items.is_empty() {
            self.kicked = false;
        }
        taken
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn a_take_gets_everything_queued_and_its_gathering_ends_at_the_deadline() {
        let q = CommitQueue::new();
        for i in 0..3 {
            q.push(i).expect("open");
        }
        assert_eq!(
            q.take(1, (Duration::from_secs(60), Duration::from_secs(60)), 512),
            Some(vec![0, 1, 2])
        );
        q.push(3).expect("open");
        let t = Instant::now();
        assert_eq!(
            q.take(
                3,
                (Duration::from_millis(20), Duration::from_millis(20)),
                512
            ),
            Some(vec![3])
        );
        assert!(
            t.elapsed() >= Duration::from_millis(20),
            "it waited for the rest"
        );
        for i in 0..5 {
            q.push(i).expect("open");
        }
        assert_eq!(
            q.take(1, (Duration::ZERO, Duration::ZERO), 2),
            Some(vec![0, 1]),
            "at most max"
        );
        assert_eq!(
            q.take(1, (Duration::ZERO, Duration::ZERO), 512),
            Some(vec![2, 3, 4])
        );
    }

    #[test]
    fn the_item_a_gathering_writer_waits_for_wakes_it_and_close_ends_it() {
        let q = Arc::new(CommitQueue::new());
        q.push(0).expect("open");
        let pusher = {
            let q = Arc::clone(&q);
            std::thread::spawn(move || {
                std::thread::sleep(Duration::from_millis(30));
                q.push(1).expect("open");
                std::thread::sleep(Duration::from_millis(30));
                q.close();
            })
        };
        let t = Instant::now();
        // Wants two: woken by the second push, long before the 60 s gather ends.
        assert_eq!(
            q.take(2, (Duration::from_secs(60), Duration::from_secs(60)), 512),
            Some(vec![0, 1])
        );
        assert!(t.elapsed() < Duration::from_secs(30));
        // Parked for a first item: woken by close, which ends the queue.
        assert_eq!(
            q.take(1, (Duration::from_secs(60), Duration::from_secs(60)), 512),
            None
        );
        assert_eq!(q.push(2), Err(2), "a closed queue refuses");
        pusher.join().expect("pusher");
    }

    /// A writer thread taking a batch of three, gathering up to `gather`, once it is parked.
    fn parked_taker(
        q: &Arc<CommitQueue<i32>>,
        gather: Duration,
    ) -> std::thread::JoinHandle<Option<Vec<i32>>> {
        let taker = {
            let q = Arc::clone(q);
            std::thread::spawn(move || q.take(3, (gather, gather), 512))
        };
        let t = Instant::now();
        while q.lock().waiting_for == 0 {
            assert!(t.elapsed() < Duration::from_secs(30), "the taker parks");
            std::thread::sleep(Duration::from_millis(1));
        }
        taker
    }

    /// The callers of a batch of three come back one by one: the writer, gathering for
    /// three, is woken once, by the third, not by the first as well.
    #[test]
    fn a_writer_gathering_for_several_is_woken_once_by_the_push_completing_the_count() {
        let q = Arc::new(CommitQueue::new());
        let taker = parked_taker(&q, Duration::from_secs(30));
        for i in 0..3 {
            q.push(i).expect("open");
            std::thread::sleep(Duration::from_millis(5));
        }
        assert_eq!(taker.join().expect("taker"), Some(vec![0, 1, 2]));
        assert_eq!(q.lock().wakes, 1, "only the third push woke the writer");
    }

    /// A kick ends a gathering writer's wait: it takes what is queued at once.
    #[test]
    fn a_kick_has_a_gathering_writer_take_what_is_queued() {
        let q = Arc::new(CommitQueue::new());
        let taker = parked_taker(&q, Duration::from_secs(60));
        let t = Instant::now();
        q.push_quiet(0).expect("open");
        q.kick();
        assert_eq!(taker.join().expect("taker"), Some(vec![0]));
        assert!(
            t.elapsed() < Duration::from_secs(30),
            "not after the gather"
        );
        assert!(!q.lock().kicked, "a take consumes the kick");
    }

    /// Quietly queued items wait for their runtime: a writer that gathers (here for 50 ms)
    /// ends its batch without them, and a writer parked for an item is not woken by them.
    /// A push for the writer takes them along.
    #[test]
    fn quiet_items_are_left_to_their_runtime_until_a_push_for_the_writer_or_a_kick() {
        let q = Arc::new(CommitQueue::new());
        let taker = parked_taker(&q, Duration::from_millis(50));
        q.push_quiet(0).expect("open");
        q.push_quiet(1).expect("open");
        std::thread::sleep(Duration::from_millis(100));
        assert!(
            !taker.is_finished(),
            "the gather ended without taking quiet items"
        );
        assert_eq!(q.take_now(512), vec![0, 1], "their runtime takes them");
        q.push_quiet(2).expect("open");
        q.push(3).expect("open");
        assert_eq!(taker.join().expect("taker"), Some(vec![2, 3]));
        q.push_quiet(4).expect("open");
        assert_eq!(q.lock().for_writer(), 0);
        q.kick();
        assert_eq!(
            q.take(1, (Duration::ZERO, Duration::ZERO), 512),
            Some(vec![4])
        );
    }

    /// A kick is for everything queued: what a take leaves past its `max` is still the
    /// writer's, and the next take gets it without a new kick.
    #[test]
    fn a_kick_covers_what_a_take_leaves_past_its_max() {
        let q = CommitQueue::new();
        for i in 0..5 {
            q.push_quiet(i).expect("open");
        }
        q.kick();
        assert_eq!(
            q.take(1, (Duration::ZERO, Duration::ZERO), 3),
            Some(vec![0, 1, 2])
        );
        assert_eq!(q.lock().for_writer(), 2);
        assert_eq!(
            q.take(1, (Duration::ZERO, Duration::ZERO), 3),
            Some(vec![3, 4])
        );
        assert!(!q.lock().kicked, "spent once the queue is empty");
    }

    #[test]
    fn draining_a_closed_queue_returns_what_was_left() {
        let q = CommitQueue::new();
        q.push(7).expect("open");
        assert_eq!(q.close_and_drain(), vec![7]);
        assert_eq!(q.take(1, (Duration::ZERO, Duration::ZERO), 512), None);
    }
}
