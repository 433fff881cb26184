//! The deadlines of `operations/wait`, kept by one timer.
//!
//! A tokio timer due before every other timer the runtime holds makes tokio wake its driver
//! with a `write` to its eventfd, even when the task registering it runs on the runtime's own
//! thread. Each wait's timeout was such a timer, so every wait cost that system call. A wait's deadline is mostly later than those of
//! the waits before it: one task sleeping to the earliest deadline held serves them all, and
//! a deadline that is not earlier than its sleep registers no tokio timer at all. It keeps
//! sleeping to a deadline whose wait has ended (the next look is then the next deadline),
//! so a steady stream of waits re-arms it once per deadline, not once per wait.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};

use tokio::sync::Notify;
use tokio::time::Instant;

/// Deadlines waited on, and the task that wakes them.
#[derive(Default)]
pub(super) struct Deadlines {
    shared: Arc<Shared>,
}

#[derive(Default)]
struct Shared {
    held: Mutex<Held>,
    /// Tells the task a deadline arrived that is earlier than its sleep (or that the
    /// `Deadlines` is gone).
    earlier: Notify,
}

#[derive(Default)]
struct Held {
    /// Pending deadlines (with a number telling equal instants apart) and whom to wake.
    waiting: BTreeMap<(Instant, u64), Waker>,
    next_key: u64,
    /// Where the task sleeps to (`None`: until a deadline arrives).
    armed: Option<Instant>,
    /// Whether a task runs; it stops with the runtime it was spawned on.
    running: bool,
    /// The `Deadlines` was dropped: the task ends once no wait is left.
    closed: bool,
    /// The task panicked (a runtime without timers): waits panic in their callers, as a
    /// tokio timer of their own would, instead of starting one failing task after another.
    failed: bool,
}

impl Deadlines {
    /// Resolves at `deadline`.
    pub(super) fn until(&self, deadline: Instant) -> Until {
        Until {
            shared: Arc::clone(&self.shared),
            deadline,
            key: None,
        }
    }
}

impl Drop for Deadlines {
    fn drop(&mut self) {
        self.shared.held().closed = true;
        self.shared.earlier.notify_one();
    }
}

impl Shared {
    fn held(&self) -> MutexGuard<'_, Held> {
        // Nothing panics while holding it.
        self.held.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// A wait for one deadline; dropping it forgets the deadline.
pub(super) struct Until {
    shared: Arc<Shared>,
    deadline: Instant,
    key: Option<(Instant, u64)>,
}

impl Future for Until {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if Instant::now() >= this.deadline {
            this.forget();
            return Poll::Ready(());
        }
        let mut held = this.shared.held();
        if held.failed {
            drop(held);
            panic!("the wait timer's task panicked: does this runtime have timers enabled?");
        }
        let key = *this.key.get_or_insert_with(|| {
            held.next_key += 1;
            (this.deadline, held.next_key)
        });
        match held.waiting.get_mut(&key) {
            Some(w) => w.clone_from(cx.waker()),
            None => {
                held.waiting.insert(key, cx.waker().clone());
            }
        }
        let start = !held.running;
        held.running = true;
        let earlier = held.armed.is_none_or(|armed| this.deadline < armed);
        drop(held);
        if start {
            // Built here, not in the task: a task dropped before its first poll still marks
            // itself stopped.
            let running = Running {
                shared: Arc::clone(&this.shared),
                arming: false,
            };
            tokio::spawn(async move { keep(running).await });
        } else if earlier {
            this.shared.earlier.notify_one();
        }
        Poll::Pending
    }
}

impl Until {
    fn forget(&mut self) {
        if let Some(key) = self.key.take() {
            self.shared.held().waiting.remove(&key);
        }
    }
}

impl Drop for Until {
    fn drop(&mut self) {
        self.forget();
    }
}

/// Marks the task stopped however it ends (its runtime shut down drops it mid-sleep), and
/// wakes the waits still held: each polls again on its own runtime and starts another task
/// there, rather than waiting for a timer that no longer runs.
struct Running {
    shared: Arc<Shared>,
    /// Set while the task makes its timer, which panics on a runtime without timers.
    arming: bool,
}

impl Drop for Running {
    fn drop(&mut self) {
        let wakers: Vec<Waker> = {
            let mut held = self.shared.held();
            held.running = false;
            held.armed = None;
            held.failed |= self.arming;
            held.waiting.values().cloned().collect()
        };
        for w in wakers {
            w.wake();
        }
    }
}

/// The task: sleeps to the earliest deadline held, wakes the waits that are due, and sleeps
/// again; re-arms early only when told a deadline earlier than its sleep arrived.
async fn keep(mut running: Running) {
    let shared = Arc::clone(&running.shared);
    let mut due = Vec::new();
    loop {
        let next = {
            let mut held = shared.held();
            let now = Instant::now();
            while let Some(entry) = held.waiting.first_entry() {
                if entry.key().0 > now {
                    break;
                }
                due.push(entry.remove());
            }
            let next = held.waiting.keys().next().map(|(at, _)| *at);
            held.armed = next;
            next
        };
        // Woken with the lock released: a waker may drop a wait, which takes it.
        due.drain(..).for_each(Waker::wake);
        if next.is_none() && shared.held().closed {
            return;
        }
        match next {
            Some(at) => {
                running.arming = true;
                let sleep = tokio::time::sleep_until(at);
                running.arming = false;
                tokio::select! {
                    () = sleep => {}
                    () = shared.earlier.notified() => {}
                }
            }
            None => shared.earlier.notified().await,
        }
    }
}

#[cfg(test)]
mod tests {
    //! On the real clock: each check is an order (not before the deadline, before a later
    //! one), never a bound on how late.
    use super::*;
    use std::time::Duration;

    const SHORT: Duration = Duration::from_millis(40);
    const LONG: Duration = Duration::from_secs(3);

    #[tokio::test]
    async fn a_wait_resolves_at_its_deadline_not_before() {
        let d = Deadlines::default();
        let start = Instant::now();
        d.until(start + SHORT).await;
        assert!(start.elapsed() >= SHORT);
    }

    #[tokio::test]
    async fn an_earlier_deadline_arriving_after_a_later_one_wakes_first() {
        let d = Arc::new(Deadlines::default());
        let start = Instant::now();
        let late = {
            let d = Arc::clone(&d);
            tokio::spawn(async move { d.until(start + LONG).await })
        };
        // Once the task sleeps to the long deadline, the short one must re-arm it.
        while d.shared.held().armed.is_none() {
            tokio::task::yield_now().await;
        }
        assert_eq!(d.shared.held().armed, Some(start + LONG));
        d.until(start + SHORT).await;
        assert!(start.elapsed() >= SHORT);
        assert!(
            !late.is_finished(),
            "the short deadline resolved before the long one"
        );
        late.await.expect("late wait");
        assert!(start.elapsed() >= LONG);
    }

    #[tokio::test]
    async fn a_dropped_wait_is_forgotten_and_the_next_deadline_still_fires() {
        let d = Deadlines::default();
        let start = Instant::now();
        // Ended early, as a wait whose operation changed: the task keeps its sleep to LONG.
        let ended = tokio::time::timeout(SHORT, d.until(start + LONG)).await;
        assert!(ended.is_err());
        assert!(d.shared.held().waiting.is_empty());
        assert_eq!(d.shared.held().armed, Some(start + LONG));
        // A later deadline registers nothing earlier; it fires after the stale sleep ends.
        d.until(start + LONG + SHORT).await;
        assert!(start.elapsed() >= LONG + SHORT);
    }

    #[test]
    fn a_runtime_that_ends_takes_its_task_and_the_next_one_starts_another() {
        let d = Deadlines::default();
        for _ in 0..2 {
            let rt = tokio::runtime::Builder::new_current_thread()
                .enable_time()
                .build()
                .expect("runtime");
            rt.block_on(async {
                let start = Instant::now();
                d.until(start + SHORT).await;
                assert!(start.elapsed() >= SHORT);
            });
            drop(rt);
            assert!(!d.shared.held().running, "the task ended with its runtime");
        }
    }

    #[test]
    fn a_wait_on_another_runtime_outlives_the_runtime_that_ran_the_task() {
        let d = Arc::new(Deadlines::default());
        let first = tokio::runtime::Builder::new_current_thread()
            .enable_time()
            .build()
            .expect("runtime");
        // The task starts on `first`; a wait on another thread's runtime then relies on it.
        first.block_on(async { d.until(Instant::now() + SHORT).await });
        let waiter = {
            let d = Arc::clone(&d);
            std::thread::spawn(move || {
                let rt = tokio::runtime::Builder::new_current_thread()
                    .enable_time()
                    .build()
                    .expect("runtime");
                let start = Instant::now();
                // A guard on this runtime's own timer, so that a wait left to the dropped
                // task fails here instead of hanging (and is not merely polled by it).
                let woke = rt.block_on(async {
                    tokio::select! {
                        biased;
                        () = tokio::time::sleep(10 * LONG) => false,
                        () = d.until(start + LONG) => true,
                    }
                });
                (woke, start.elapsed())
            })
        };
        while d.shared.held().waiting.is_empty() && !waiter.is_finished() {
            std::thread::yield_now();
        }
        drop(first);
        let (woke, waited) = waiter.join().expect("waiter");
        assert!(
            woke,
            "the wait was left to the task of a runtime that ended"
        );
        assert!(waited >= LONG);
    }

    #[test]
    fn on_a_runtime_without_timers_a_wait_panics_in_its_caller() {
        let d = Deadlines::default();
        let rt = tokio::runtime::Builder::new_current_thread()
            .build()
            .expect("runtime");
        let waited = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            rt.block_on(d.until(Instant::now() + LONG))
        }));
        assert!(waited.is_err(), "the wait returned without a timer");
        assert!(d.shared.held().failed);
    }

    #[tokio::test]
    async fn the_task_ends_once_its_deadlines_are_dropped_and_no_wait_is_left() {
        let d = Deadlines::default();
        let shared = Arc::clone(&d.shared);
        d.until(Instant::now() + SHORT).await;
        assert!(shared.held().running);
        drop(d);
        for _ in 0..100 {
            if !shared.held().running {
                return;
            }
            tokio::task::yield_now().await;
        }
        panic!("the task still runs after its Deadlines was dropped");
    }
}
