//! The ring's flag/credit protocol under loom (`scripts/loom`).
//!
//! The real ring is registered memory that a NIC (or the emulated fabric's memcpy)
//! writes, which loom cannot instrument, so this is a model: the same steps, in the
//! same order, with the same orderings as the code (each step names the function it
//! mirrors), on loom's atomics. The packet arithmetic is the real code's
//! ([`Header`], [`trailer_word`], [`max_payload_now`]). Payload is a
//! `loom::cell::UnsafeCell`, as it is plain memory copied with `memcpy`: loom
//! panics on any access to it that is not ordered after the other side's last one,
//! so a consumer reading bytes the producer has not finished writing, or a producer
//! overwriting bytes the consumer has not finished reading, fails the model.
//!
//! Three threads: the producer is the peer's sender; the consumer is our receiver,
//! which serves credit requests while it waits and after each packet
//! (`Receiver::maintain`); the publisher is our sender half, which serves them too
//! (`Link::serve_credit` runs in every `put` and `wait_writable`), so the tail can
//! reach the peer from another thread than the one that consumed the bytes: the case
//! where `rx_tail`'s Release/Acquire pair matters. Three one-cell packets go through a
//! two-cell ring, so the third reuses the first's cell, which the producer learns only
//! by asking for credit (the threshold publishing is left out: the credit path alone
//! must keep the stream moving, ARCHITECTURE.md "Tail updates and credit"; a model
//! that does not terminate fails too, by exceeding loom's branch limit).
//!
//! Not modelled here: payload bytes that look like flags (the boundary-word clearing;
//! a question of values, covered by the ring's unit and property tests, not of
//! ordering), and the piggybacked tail, which is the same chain (Acquire load of
//! `rx_tail`, carried under a packet's Release trailer, `tx_tail_piggy` Release and
//! Acquire) through more threads than loom can explore here.

use loom::cell::UnsafeCell;
use loom::sync::atomic::{AtomicU64, Ordering};
use loom::sync::{Arc, Mutex};

use super::max_payload_now;
use super::wire::{trailer_word, Header, PacketKind, CELL, HEADER_LEN};

/// Cells in the ring (a power of two, as `RingMemory::new` requires).
const CELLS: usize = 2;
const SIZE: u64 = (CELLS * CELL) as u64;
/// Packets sent: one more than the ring holds, so a cell is reused.
const PACKETS: u64 = 3;

/// One cell of the ring: its first word (header), one payload word and its last word
/// (trailer). The ack word and the rest of the payload add nothing to the orderings.
struct Cell {
    header: AtomicU64,
    payload: UnsafeCell<u64>,
    trailer: AtomicU64,
}

/// The orderings of the steps that carry the protocol; [`CODE`] is what the code uses.
#[derive(Clone, Copy)]
struct Orderings {
    /// The fabric's store of a write's last word (`emulated::copy::write_direct`).
    fabric_last_word: Ordering,
    /// `Receiver::next_packet`'s load of the trailer.
    trailer_load: Ordering,
    /// `Receiver::release_read`'s store of `rx_tail`.
    rx_tail_store: Ordering,
    /// `Link::serve_credit` / `Link::publish_tail`'s load of `rx_tail`.
    rx_tail_load: Ordering,
    /// `ControlWords::tail`, in `Sender::refresh_tail`.
    ctrl_tail_load: Ordering,
}

const CODE: Orderings = Orderings {
    fabric_last_word: Ordering::Release,
    trailer_load: Ordering::Acquire,
    rx_tail_store: Ordering::Release,
    rx_tail_load: Ordering::Acquire,
    ctrl_tail_load: Ordering::Acquire,
};

/// The memory both ends touch.
struct Shared {
    /// The consumer's incoming ring (`RingMemory`).
    ring: [Cell; CELLS],
    /// `Link::rx_tail`: the consumer's master tail.
    rx_tail: AtomicU64,
    /// The producer's control word `CtrlWord::Tail` (explicit tail updates).
    ctrl_tail: AtomicU64,
    /// The consumer's control word `CtrlWord::CreditRequest`.
    ctrl_credit: AtomicU64,
    /// `Link::credit_served`, `Link::rx_explicit` and `Link::publish`.
    credit_served: AtomicU64,
    rx_explicit: AtomicU64,
    publish: Mutex<()>,
}

impl Shared {
    fn cell(&self, pos: u64) -> &Cell {
        &self.ring[(pos % SIZE) as usize / CELL]
    }
}

/// The payload of packet `i`, distinct from every other packet's and from zero.
fn payload_of(i: u64) -> u64 {
    0x5eed_0000 + i
}

/// The header word of a one-cell data packet at `pos` (`Header::fill`).
fn header_word(pos: u64) -> u64 {
    let mut bytes = [0u8; HEADER_LEN];
    Header::new_unchecked(&mut bytes[..]).fill(pos, PacketKind::Data, 8, 0);
    Header::new_unchecked(&bytes[..]).word()
}

/// The peer's sender: `Sender::put` of one-cell packets.
fn produce(sh: &Shared, o: Orderings) {
    let (mut head, mut tail) = (0u64, 0u64);
    let mut credit_requested_at = u64::MAX;
    for i in 0..PACKETS {
        // Sender::put_inner: room from the cached tail, else refresh_tail, else
        // request_credit and try again later.
        while max_payload_now(SIZE, head, tail, CELL as u64) == 0 {
            // Sender::refresh_tail (ControlWords::tail).
            tail = tail.max(sh.ctrl_tail.load(o.ctrl_tail_load));
            if max_payload_now(SIZE, head, tail, CELL as u64) == 0 {
                // Sender::request_credit, once per known tail; Link::post_ctrl's
                // one-word write is its own last word, stored with Release.
                if credit_requested_at != tail {
                    sh.ctrl_credit.store(tail + 1, Ordering::Release);
                    credit_requested_at = tail;
                }
                loom::thread::yield_now();
            }
        }
        // Sender::write_cell, as the fabric places it (write_direct): every byte but
        // the last word (the header word is never torn: fabric guarantee 3), then the
        // trailer with Release (guarantee 2).
        let end = head + CELL as u64;
        let cell = sh.cell(head);
        cell.header.store(header_word(head), Ordering::Relaxed);
        // SAFETY: `p` points into the cell, alive as long as `sh`; loom panics if this
        // write is not ordered after the consumer's copy of the cell's previous packet
        // (the exclusive access the credit protocol promises, and what is checked).
        cell.payload.with_mut(|p| unsafe { *p = payload_of(i) });
        cell.trailer.store(trailer_word(end), o.fabric_last_word);
        head = end;
    }
}

/// Our receiver: `Receiver::get` of each packet in turn.
fn consume(sh: &Shared, o: Orderings) {
    let mut read_pos = 0u64;
    for i in 0..PACKETS {
        let cell = sh.cell(read_pos);
        let end = read_pos + CELL as u64;
        // Receiver::next_packet: the header at the read position (Relaxed: not
        // trusted alone), the trailer it points at (Acquire: pairs with the fabric's
        // Release), the header again.
        loop {
            let first = cell.header.load(Ordering::Relaxed);
            let mut bytes = [0u8; HEADER_LEN];
            bytes[..8].copy_from_slice(&first.to_le_bytes());
            if Header::new_unchecked(&bytes[..]).is_at(read_pos)
                && cell.trailer.load(o.trailer_load) == trailer_word(end)
                && cell.header.load(Ordering::Relaxed) == first
            {
                break;
            }
            // Receiver::wait_readable_until: maintain between polls.
            serve_credit(sh, o);
            loom::thread::yield_now();
        }
        // RingMemory::copy_out.
        // SAFETY: `p` points into the cell, alive as long as `sh`; loom panics if this
        // read is not ordered after the producer's write of the packet (what the
        // trailer's Acquire promises, and what is checked).
        let got = cell.payload.with(|p| unsafe { *p });
        assert_eq!(got, payload_of(i), "packet {i}: stale or torn payload");
        // Receiver::release_read: clear the boundary words (RingMemory::clear_boundaries,
        // Relaxed), then publish the tail.
        cell.header.store(0, Ordering::Relaxed);
        cell.trailer.store(0, Ordering::Relaxed);
        read_pos = end;
        sh.rx_tail.store(read_pos, o.rx_tail_store);
        // Receiver::after_get -> maintain.
        serve_credit(sh, o);
    }
}

/// `Link::serve_credit`: answers the credit request once our tail has passed it.
fn serve_credit(sh: &Shared, o: Orderings) {
    // Relaxed: only the value matters (ControlWords::credit_request); credit_served
    // as in the code (two halves racing at worst publish the same tail twice).
    let req = sh.ctrl_credit.load(Ordering::Relaxed);
    if req != sh.credit_served.load(Ordering::Relaxed) && sh.rx_tail.load(o.rx_tail_load) >= req {
        publish_tail(sh, o);
        sh.credit_served.store(req, Ordering::Relaxed);
    }
}

/// `Link::publish_tail`: the tail, if it moved, through `Link::post_ctrl`, whose
/// one-word write the fabric stores with Release.
fn publish_tail(sh: &Shared, o: Orderings) {
    let _g = sh.publish.lock().unwrap();
    let tail = sh.rx_tail.load(o.rx_tail_load);
    if tail > sh.rx_explicit.load(Ordering::Relaxed) {
        sh.ctrl_tail.store(tail, Ordering::Release);
        sh.rx_explicit.store(tail, Ordering::Relaxed);
    }
}

fn run(o: Orderings) {
    let mut model = loom::model::Builder::new();
    // Spin loops multiply the interleavings: three preemptions take about a minute
    // for the passing model (two, 5 s, already fail each weakened ordering below).
    // LOOM_MAX_PREEMPTIONS overrides.
    model.preemption_bound = model.preemption_bound.or(Some(3));
    model.check(move || {
        let sh = Arc::new(Shared {
            ring: std::array::from_fn(|_| Cell {
                header: AtomicU64::new(0),
                payload: UnsafeCell::new(0),
                trailer: AtomicU64::new(0),
            }),
            rx_tail: AtomicU64::new(0),
            ctrl_tail: AtomicU64::new(0),
            ctrl_credit: AtomicU64::new(0),
            credit_served: AtomicU64::new(0),
            rx_explicit: AtomicU64::new(0),
            publish: Mutex::new(()),
        });
        let producer = {
            let sh = sh.clone();
            loom::thread::spawn(move || produce(&sh, o))
        };
        // Our sender half: one `put`'s serve_credit, at any point of the run.
        let publisher = {
            let sh = sh.clone();
            loom::thread::spawn(move || serve_credit(&sh, o))
        };
        consume(&sh, o);
        producer.join().unwrap();
        publisher.join().unwrap();
    });
}

#[test]
fn loom_ring_with_the_codes_orderings() {
    run(CODE);
}

/// `Receiver::next_packet` trusting the trailer without Acquire: the payload copy is
/// not ordered after the fabric's writes.
#[test]
#[should_panic(expected = "Causality violation")]
fn loom_ring_relaxed_trailer_load_is_caught() {
    run(Orderings {
        trailer_load: Ordering::Relaxed,
        ..CODE
    });
}

/// `Receiver::release_read` publishing its tail without Release: the publisher's
/// Acquire gains nothing, and the producer's next write into the cell races with the
/// consumer's copy out of it.
#[test]
#[should_panic(expected = "Causality violation")]
fn loom_ring_relaxed_rx_tail_store_is_caught() {
    run(Orderings {
        rx_tail_store: Ordering::Relaxed,
        ..CODE
    });
}

/// `Link::serve_credit` / `Link::publish_tail` reading `rx_tail` without Acquire: the
/// tail they announce is not ordered after the copy that freed it.
#[test]
#[should_panic(expected = "Causality violation")]
fn loom_ring_relaxed_rx_tail_load_is_caught() {
    run(Orderings {
        rx_tail_load: Ordering::Relaxed,
        ..CODE
    });
}

/// `ControlWords::tail` without Acquire: the producer reuses the cell without being
/// ordered after the consumer's copy.
#[test]
#[should_panic(expected = "Causality violation")]
fn loom_ring_relaxed_ctrl_tail_load_is_caught() {
    run(Orderings {
        ctrl_tail_load: Ordering::Relaxed,
        ..CODE
    });
}
