//! The queue of encoded messages waiting for the writer, with its size in bytes, so the reader
//! can stop taking requests while the client is not reading replies (bounded memory).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::{Notify, mpsc};

/// An encoded message for the writer: its text whole, or a reply whose encoded result goes
/// between its head and its tail only as the frame is written (a selection of megabytes is
/// then copied once, into the writer's buffer, not into a reply string first).
#[derive(Debug)]
pub enum Message {
    Whole(String),
    Spliced {
        head: String,
        body: String,
        tail: &'static str,
    },
}

impl Message {
    /// Bytes of text (the frame's body).
    pub fn len(&self) -> usize {
        match self {
            Message::Whole(text) => text.len(),
            Message::Spliced { head, body, tail } => head.len() + body.len() + tail.len(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The pieces of text in order.
    pub fn pieces(&self) -> [&str; 3] {
        match self {
            Message::Whole(text) => [text, "", ""],
            Message::Spliced { head, body, tail } => [head, body, tail],
        }
    }

    /// The text in one string (for a batch's array of replies).
    pub fn into_string(self) -> String {
        match self {
            Message::Whole(text) => text,
            Message::Spliced { head, body, tail } => {
                let mut text = String::with_capacity(head.len() + body.len() + tail.len());
                text.push_str(&head);
                text.push_str(&body);
                text.push_str(tail);
                text
            }
        }
    }
}

impl From<String> for Message {
    fn from(text: String) -> Message {
        Message::Whole(text)
    }
}

#[derive(Debug, Default)]
struct Level {
    bytes: AtomicUsize,
    drained: Notify,
}

/// The sending side; cheap to clone.
#[derive(Clone, Debug)]
pub struct Outbox {
    tx: mpsc::UnboundedSender<Message>,
    level: Arc<Level>,
}

/// The writer's side.
#[derive(Debug)]
pub struct OutboxReceiver {
    rx: mpsc::UnboundedReceiver<Message>,
    level: Arc<Level>,
}

pub fn outbox() -> (Outbox, OutboxReceiver) {
    let (tx, rx) = mpsc::unbounded_channel();
    let level = Arc::new(Level::default());
    (
        Outbox {
            tx,
            level: Arc::clone(&level),
        },
        OutboxReceiver { rx, level },
    )
}

impl Outbox {
    /// Queues a message; false when the writer is gone.
    pub fn send(&self, msg: impl Into<Message>) -> bool {
        let msg = msg.into();
        let n = msg.len();
        self.level.bytes.fetch_add(n, Ordering::SeqCst);
        if self.tx.send(msg).is_err() {
            self.level.bytes.fetch_sub(n, Ordering::SeqCst);
            return false;
        }
        true
    }

    /// Bytes queued and not yet written.
    pub fn queued(&self) -> usize {
        self.level.bytes.load(Ordering::SeqCst)
    }

    /// Waits until at most `limit` bytes are queued (or the writer is gone).
    pub async fn wait_below(&self, limit: usize) {
        loop {
            let drained = self.level.drained.notified();
            if self.queued() <= limit || self.tx.is_closed() {
                return;
            }
            drained.await;
        }
    }
}

impl OutboxReceiver {
    pub async fn recv(&mut self) -> Option<Message> {
        self.rx.recv().await
    }

    pub fn try_recv(&mut self) -> Option<Message> {
        self.rx.try_recv().ok()
    }

    /// Marks `n` bytes as written.
    pub fn written(&self, n: usize) {
        self.level.bytes.fetch_sub(n, Ordering::SeqCst);
        self.level.drained.notify_waiters();
    }
}

impl Drop for OutboxReceiver {
    fn drop(&mut self) {
        self.rx.close();
        self.level.drained.notify_waiters();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_until_the_writer_catches_up() {
        let (out, mut rx) = outbox();
        assert!(out.send("x".repeat(100)));
        assert_eq!(out.queued(), 100);
        let waiter = tokio::spawn({
            let out = out.clone();
            async move { out.wait_below(10).await }
        });
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        let msg = rx.recv().await.expect("queued");
        rx.written(msg.len());
        waiter.await.expect("waiter ends");
        assert_eq!(out.queued(), 0);
        assert!(out.send("y".to_string()));
        drop(rx);
        out.wait_below(0).await; // a gone writer never blocks the reader
        assert!(!out.send("z".to_string()));
    }
}
