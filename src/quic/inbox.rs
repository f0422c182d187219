//! A connection's queue of datagrams: the worker's endpoint puts in what it routes to the
//! connection, the connection's task takes them out. Both run on the worker's thread, so
//! the queue is a plain `RefCell` with the waiting task's waker (no lock, no atomic
//! bookkeeping per wait, as a `Notify` would have), with no allocation while it is empty:
//! an idle connection's queue costs its few fields. It holds at most [`INBOX`]
//! datagrams: a connection whose task falls that far behind loses datagrams (QUIC
//! retransmits), not the worker's memory.

use std::cell::{Cell, RefCell};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::rc::Rc;
use std::task::{Poll, Waker};

/// Datagrams queued for one connection before the endpoint drops more of them.
pub(super) const INBOX: usize = 256;

/// Datagrams the queue keeps room for between bursts.
const SMALL_BURST: usize = 8;

/// A datagram for a connection, as received.
pub(super) struct Datagram {
    pub data: Vec<u8>,
    pub from: SocketAddr,
}

#[derive(Default)]
pub(super) struct Inbox {
    queue: RefCell<VecDeque<Datagram>>,
    /// The connection's task while it waits for datagrams (one task reads an inbox).
    waiting: Cell<Option<Waker>>,
}

impl Inbox {
    pub(super) fn new() -> Rc<Inbox> {
        Rc::default()
    }

    /// Queues a datagram; false when the queue is full and the datagram was dropped.
    pub(super) fn push(&self, datagram: Datagram) -> bool {
        let mut queue = self.queue.borrow_mut();
        if queue.len() >= INBOX {
            return false;
        }
        queue.push_back(datagram);
        drop(queue);
        // A task not waiting yet finds the datagram when it next looks.
        if let Some(task) = self.waiting.take() {
            task.wake();
        }
        true
    }

    /// Waits until datagrams are queued, then moves them all to the end of `into`.
    pub(super) async fn take_all(&self, into: &mut Vec<Datagram>) {
        std::future::poll_fn(|cx| {
            let mut queue = self.queue.borrow_mut();
            if queue.is_empty() {
                // The same task waits turn after turn: its waker is kept, not cloned again.
                let task = match self.waiting.take() {
                    Some(task) if task.will_wake(cx.waker()) => task,
                    _ => cx.waker().clone(),
                };
                self.waiting.set(Some(task));
                return Poll::Pending;
            }
            into.extend(queue.drain(..));
            // Room for a large burst is given back once it is read (what a handshake or a
            // request brings fits in the rest).
            if queue.capacity() > SMALL_BURST {
                queue.shrink_to(SMALL_BURST);
            }
            Poll::Ready(())
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn datagram(byte: u8) -> Datagram {
        Datagram {
            data: vec![byte],
            from: "127.0.0.1:1".parse().unwrap(),
        }
    }

    /// Datagrams come out in order, all that were queued at once; a full queue refuses
    /// more until it is read; a waiting task wakes for the next one.
    #[tokio::test]
    async fn datagrams_come_out_in_order_and_a_full_queue_drops() {
        let inbox = Inbox::new();
        for byte in 0..INBOX {
            assert!(inbox.push(datagram(byte as u8)));
        }
        assert!(!inbox.push(datagram(0)), "a full queue takes no more");
        let mut taken = Vec::new();
        inbox.take_all(&mut taken).await;
        let bytes: Vec<u8> = taken.iter().map(|d| d.data[0]).collect();
        assert_eq!(bytes, (0..INBOX).map(|b| b as u8).collect::<Vec<_>>());

        let local = tokio::task::LocalSet::new();
        local
            .run_until(async {
                let waiting = inbox.clone();
                let reader = tokio::task::spawn_local(async move {
                    let mut taken = Vec::new();
                    waiting.take_all(&mut taken).await;
                    taken.len()
                });
                tokio::task::yield_now().await;
                assert!(inbox.push(datagram(7)));
                // A reader the push did not wake would wait forever: fail instead.
                let woken = tokio::time::timeout(std::time::Duration::from_secs(10), reader);
                assert_eq!(woken.await.expect("the push woke the reader").unwrap(), 1);
            })
            .await;
    }
}
