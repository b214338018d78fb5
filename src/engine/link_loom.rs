//! The send queue's accounting under loom (`scripts/loom`): the real [`SendQueue`]
//! (its atomics and lock are loom's under `cfg(loom)`, see [`crate::sync`]) driven by
//! the two threads that post on one connection, against a model NIC with a finite
//! queue that completes in posting order.
//!
//! What a verbs queue pair does, and the model checks (`Nic`):
//! * a request posted beyond the queue's depth is refused: every post asserts that the
//!   hardware queue has a free slot, and that the software count
//!   (`posted - retired`) stays within the depth;
//! * completions come in posting order, and a signalled success retires every request
//!   posted before it; the engine reads "completed > n" as "request n is done", which
//!   holds only if numbering order is posting order: every post asserts that it
//!   carries the next number;
//! * a read's completion means its bytes landed: `wait_completed` returning for a
//!   read that the NIC has not executed would hand its buffer back too early.
//!
//! The sender half posts packet writes (`Sender::write_gathered` through
//! `Link::post_staged`), the receiver half an RDMA READ (`zerocopy::receive::post_read`)
//! and waits for it (`Link::wait_completed`), then a control word (`Link::post_ctrl`).
//! Both drain completions while they wait, as `Link::check_health` does.

use std::collections::VecDeque;

use loom::sync::atomic::{AtomicBool, Ordering};
use loom::sync::{Arc, Mutex};

use super::SendQueue;

/// The smallest queue where writes go unsignalled: two slots, every second write
/// signalled (any `DEPTH` consecutive requests then hold a signalled one, so a full
/// queue always has a completion coming, as `send_queue_for`'s `depth / 2` ensures).
const DEPTH: u64 = 2;
const INTERVAL: u64 = 2;

/// A queue pair's send queue and completion queue.
#[derive(Default)]
struct Nic {
    /// Requests holding a slot, in posting order: (number, signalled).
    queue: VecDeque<(u64, bool)>,
    /// The number the next posted request must carry.
    next: u64,
    /// Requests the NIC has executed (a read's bytes have landed).
    executed: Vec<u64>,
}

impl Nic {
    /// `QueuePair::post`: takes a slot, or fails the model where a real queue would
    /// refuse the request (or reorder what the engine thinks it numbered).
    fn post(nic: &Mutex<Nic>, sq: &SendQueue, wr_id: u64, signaled: bool) {
        let mut nic = nic.lock().unwrap();
        assert_eq!(
            wr_id, nic.next,
            "send queue: request {wr_id} posted where {} was due (numbering is not posting order)",
            nic.next
        );
        nic.next += 1;
        assert!(
            (nic.queue.len() as u64) < DEPTH,
            "send queue overrun: request {wr_id} posted with {} slots taken",
            nic.queue.len()
        );
        // The software count includes this request (numbered before the post).
        let in_flight = sq.posted.load(Ordering::Relaxed) - sq.retired.load(Ordering::Relaxed);
        assert!(
            in_flight <= DEPTH,
            "send queue: {in_flight} requests counted in flight"
        );
        nic.queue.push_back((wr_id, signaled));
    }

    /// `QueuePair::poll`: executes the queue in order and reports each signalled
    /// request, which frees its slot and those of the requests posted before it.
    /// Unsignalled requests after the last signalled one keep their slots.
    fn poll(nic: &Mutex<Nic>) -> Vec<u64> {
        let mut nic = nic.lock().unwrap();
        let mut reported = Vec::new();
        while let Some(last) = nic.queue.iter().rposition(|&(_, s)| s) {
            for _ in 0..=last {
                let (id, signaled) = nic.queue.pop_front().unwrap();
                nic.executed.push(id);
                if signaled {
                    reported.push(id);
                }
            }
        }
        reported
    }
}

/// `Link::drain_completions`: polls, then counts each completion outside the NIC (the
/// counters are updated after `poll` returns, possibly by both halves at once).
fn drain(nic: &Mutex<Nic>, sq: &SendQueue) {
    for id in Nic::poll(nic) {
        sq.complete(id, true);
    }
}

/// The pre-`ded2bbf` reservation: slot check and numbering lock-free
/// (`reserve_write` / `reserve_read`), the post after them, outside any lock.
fn post_lock_free(
    sq: &SendQueue,
    read: bool,
    mut wait: impl FnMut(),
    post: impl FnOnce(u64, bool),
) -> u64 {
    while sq.is_full() {
        wait();
    }
    let wr_id = sq.posted.fetch_add(1, Ordering::AcqRel);
    post(wr_id, read || wr_id % sq.interval == sq.interval - 1);
    wr_id
}

/// Which reservation the threads use.
#[derive(Clone, Copy)]
enum Variant {
    /// `SendQueue::post_numbered`: check, number and post under one lock.
    Current,
    /// [`post_lock_free`].
    LockFree,
}

/// Sender half and receiver half posting on one queue, as described in the module docs.
fn run(variant: Variant) {
    loom::model(move || {
        let sq = Arc::new(SendQueue::new(DEPTH, INTERVAL));
        let nic = Arc::new(Mutex::new(Nic::default()));
        let post = move |sq: &SendQueue, nic: &Mutex<Nic>, read: bool| -> u64 {
            let wait = || {
                drain(nic, sq);
                loom::thread::yield_now();
            };
            let post = |wr_id, signaled| Nic::post(nic, sq, wr_id, signaled);
            match variant {
                Variant::Current => sq
                    .post_numbered(
                        read,
                        || {
                            wait();
                            Ok::<(), ()>(())
                        },
                        |wr_id, signaled| {
                            post(wr_id, signaled);
                            Ok(())
                        },
                    )
                    .unwrap(),
                Variant::LockFree => post_lock_free(sq, read, wait, post),
            }
        };

        let sender = {
            let (sq, nic) = (sq.clone(), nic.clone());
            loom::thread::spawn(move || {
                for _ in 0..2 {
                    post(&sq, &nic, false);
                }
            })
        };
        // The receiver half, on the model's main thread.
        let read = post(&sq, &nic, true);
        // Link::wait_completed.
        while !sq.is_completed(read) {
            drain(&nic, &sq);
            loom::thread::yield_now();
        }
        assert!(
            nic.lock().unwrap().executed.contains(&read),
            "read {read} counted as completed before the NIC executed it"
        );
        // Receiver::finish_reads: the ZeroCopyDone control word.
        post(&sq, &nic, false);
        sender.join().unwrap();
    });
}

#[test]
fn loom_send_queue_stays_within_depth_in_posting_order() {
    run(Variant::Current);
}

/// The lock-free reservation that `ded2bbf` replaced: loom finds an interleaving where
/// two posts pass the slot check for one slot, or a later number is posted first.
#[test]
#[should_panic(expected = "send queue")]
fn loom_lock_free_send_queue_reservation_is_caught() {
    run(Variant::LockFree);
}

/// A failed READ whose completion the other half drains: the reader waiting for it
/// (`Link::wait_completed`) looks for the connection's error once it sees the count,
/// so the failure must be recorded first (`SendQueue::complete_with`, as
/// `Link::drain_completions` counts); `record_first: false` is the order before, which
/// let peer_death's survivor return a READ's untouched buffer as data.
fn failed_read(record_first: bool) {
    loom::model(move || {
        let sq = Arc::new(SendQueue::new(DEPTH, INTERVAL));
        // Link::is_broken, as Link::fail stores it and Link::error loads it.
        let broken = Arc::new(AtomicBool::new(false));
        let read = sq
            .post_numbered(true, || Ok::<(), ()>(()), |_, _| Ok(()))
            .unwrap();
        let drainer = {
            let (sq, broken) = (sq.clone(), broken.clone());
            loom::thread::spawn(move || {
                let record = || broken.store(true, Ordering::Release);
                if record_first {
                    sq.complete_with(read, false, record);
                } else {
                    sq.complete(read, false);
                    record();
                }
            })
        };
        while !sq.is_completed(read) {
            loom::thread::yield_now();
        }
        assert!(
            broken.load(Ordering::Acquire),
            "failed read: counted as completed before its failure was recorded"
        );
        drainer.join().unwrap();
    });
}

#[test]
fn loom_a_failed_read_is_seen_failed_by_its_waiter() {
    failed_read(true);
}

#[test]
#[should_panic(expected = "failed read")]
fn loom_counting_a_failed_read_before_its_failure_is_caught() {
    failed_read(false);
}
