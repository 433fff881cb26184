//! Notices fanned out to subscribers, each with its own bounded queue.
//!
//! A `tokio::sync::broadcast` channel allocates and initialises its whole ring when it is
//! made: 4,096 notices' worth (~360 KiB, ~90 page faults) at every workspace open, before any
//! client has asked for anything. Here a subscriber's queue takes memory only as notices wait
//! in it (tokio's mpsc grows in blocks of 32), and like a broadcast receiver a subscriber that
//! falls [`BACKLOG`] behind loses notices and is told how many (`RecvError::Lagged`).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

pub use tokio::sync::broadcast::error::{RecvError, TryRecvError};
use tokio::sync::mpsc;

/// Notices a subscriber may leave unread before newer ones are dropped for it.
pub const BACKLOG: usize = 4096;

/// The sending side: every subscriber gets a clone of every notice sent.
pub struct Fanout<T> {
    subscribers: Mutex<Vec<Subscriber<T>>>,
}

struct Subscriber<T> {
    tx: mpsc::Sender<T>,
    lost: Arc<AtomicU64>,
}

impl<T: Clone> Default for Fanout<T> {
    fn default() -> Self {
        Fanout {
            subscribers: Mutex::new(Vec::new()),
        }
    }
}

impl<T: Clone> Fanout<T> {
    /// A new subscriber, receiving every notice sent from now on.
    pub fn subscribe(&self) -> Subscription<T> {
        let (tx, rx) = mpsc::channel(BACKLOG);
        let lost = Arc::new(AtomicU64::new(0));
        self.lock().push(Subscriber {
            tx,
            lost: Arc::clone(&lost),
        });
        Subscription { rx, lost }
    }

    /// Sends `notices` to every subscriber; forgets those that are gone.
    pub fn send_all(&self, notices: &[T]) {
        let mut subscribers = self.lock();
        subscribers.retain(|s| !s.tx.is_closed());
        for s in subscribers.iter() {
            for n in notices {
                if let Err(mpsc::error::TrySendError::Full(_)) = s.tx.try_send(n.clone()) {
                    s.lost.fetch_add(1, Ordering::Relaxed);
                }
            }
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Vec<Subscriber<T>>> {
        self.subscribers.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// One subscriber's queue.
pub struct Subscription<T> {
    rx: mpsc::Receiver<T>,
    lost: Arc<AtomicU64>,
}

impl<T> Subscription<T> {
    /// The next notice; `Lagged(n)` once after `n` were dropped for falling behind, `Closed`
    /// once the sender is gone and everything queued was received.
    pub async fn recv(&mut self) -> Result<T, RecvError> {
        if let Some(n) = self.take_lost() {
            return Err(RecvError::Lagged(n));
        }
        self.rx.recv().await.ok_or(RecvError::Closed)
    }

    /// [`Subscription::recv`] without waiting.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        if let Some(n) = self.take_lost() {
            return Err(TryRecvError::Lagged(n));
        }
        self.rx.try_recv().map_err(|e| match e {
            mpsc::error::TryRecvError::Empty => TryRecvError::Empty,
            mpsc::error::TryRecvError::Disconnected => TryRecvError::Closed,
        })
    }

    fn take_lost(&self) -> Option<u64> {
        match self.lost.swap(0, Ordering::Relaxed) {
            0 => None,
            n => Some(n),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn every_subscriber_gets_every_notice_in_order_and_the_gone_are_forgotten() {
        let f = Fanout::default();
        let mut a = f.subscribe();
        let b = f.subscribe();
        f.send_all(&[1, 2]);
        drop(b);
        let mut c = f.subscribe();
        f.send_all(&[3]);
        assert_eq!(f.lock().len(), 2, "the dropped subscriber is forgotten");
        for want in [1, 2, 3] {
            assert_eq!(a.recv().await, Ok(want));
        }
        assert_eq!(
            c.try_recv(),
            Ok(3),
            "a late subscriber sees only what came after it"
        );
        assert_eq!(c.try_recv(), Err(TryRecvError::Empty));
        drop(f);
        assert_eq!(a.recv().await, Err(RecvError::Closed));
    }

    #[tokio::test]
    async fn a_subscriber_that_falls_behind_is_told_how_many_it_lost() {
        let f = Fanout::default();
        let mut s = f.subscribe();
        let notices: Vec<usize> = (0..BACKLOG + 5).collect();
        f.send_all(&notices);
        assert_eq!(s.recv().await, Err(RecvError::Lagged(5)));
        for want in 0..BACKLOG {
            assert_eq!(s.try_recv(), Ok(want), "what was queued is kept");
        }
        assert_eq!(s.try_recv(), Err(TryRecvError::Empty));
        f.send_all(&[7]);
        assert_eq!(s.recv().await, Ok(7), "and it goes on");
    }
}
