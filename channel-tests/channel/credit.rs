//! Credit requests and delayed tail updates: a stalled sender is always answered.

use super::*;

/// Common start of the credit scenarios: A sends one 1000-byte packet that B reads
/// whole (B's tail moves but is not announced, being below the threshold), B answers
/// with 3 bytes that A reads (so A learns B's tail through the piggyback), then A fills
/// the ring until `put` takes nothing (and asks for credit). Returns A, B, and the
/// bytes A has sent.
pub(crate) fn stall_sender_with_known_tail(t: &Tun, fill: u8) -> (RdmaStream, RdmaStream, usize) {
    let (mut a, mut b) = t.pair();
    let pkt = vec![fill; 1000]; // one chunk = one 1024-byte packet
    let mut buf = vec![0u8; 1000];
    assert_eq!(a.put(&[IoSlice::new(&pkt)]).unwrap(), 1000);
    assert_eq!(get_settled(&mut b, &mut buf, 1000).unwrap(), 1000);
    assert_eq!(b.put(&[IoSlice::new(b"ack")]).unwrap(), 3);
    let mut g = [0u8; 3];
    assert_eq!(get_settled(&mut a, &mut g, 3).unwrap(), 3);
    let mut sent = 1000usize;
    loop {
        let n = a.put(&[IoSlice::new(&pkt)]).unwrap();
        if n == 0 {
            break;
        }
        sent += n;
    }
    // Where writes land later, give the credit request time to arrive, so that the
    // scenarios below run as on the emulated fabric (the properties they check hold
    // whenever it arrives).
    settle_in_flight();
    (a, b, sent)
}

/// Where writes land later, waits a moment for writes still in flight (no reader can
/// tell when a control word has landed); nothing to wait for on the emulated fabric.
pub(crate) fn settle_in_flight() {
    if lands_later() {
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Deterministic scenario: the sender already knows (through a piggybacked ack) the
/// tail the receiver will answer its credit request with, so that answer frees nothing;
/// the receiver then reads everything without reaching the threshold. The sender must
/// still be able to send without reading its own incoming ring (as a blocking
/// `write_all` does).
#[test]
fn credit_answer_that_frees_nothing_does_not_strand_the_sender() {
    bounded(
        "credit_answer_that_frees_nothing_does_not_strand_the_sender",
        || {
            let t = Tun::new(4096, 1024).threshold(4096 - 64);
            // 1.-3. A's packet read by B, B's ack read by A, A fills the ring.
            let (mut a, mut b, sent) = stall_sender_with_known_tail(&t, 0xAB);
            let pkt = vec![0xABu8; 1000];
            let mut one = [0u8; 1];
            let mut buf = vec![0u8; 1000];
            // 4. B reads one byte: no packet completes, but B answers the credit request with
            //    its tail, which A already knows.
            assert_eq!(get_settled(&mut b, &mut one, 1).unwrap(), 1);
            let mut got = 1001usize;
            // 5. B finishes that packet and piggybacks its new tail on a packet A will not read.
            let m = b.get(&mut [IoSliceMut::new(&mut buf[..999])]).unwrap();
            got += m;
            assert_eq!(b.put(&[IoSlice::new(b"unread")]).unwrap(), 6);
            // 6. B reads everything A sent.
            let start = Instant::now();
            loop {
                let m = b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap();
                if m == 0 {
                    if got < sent && lands_later() && start.elapsed() < SETTLE {
                        continue;
                    }
                    break;
                }
                got += m;
            }
            assert_eq!(got, sent, "B read everything A sent");
            // 7. A (which only sends now, like a blocking write) must be able to continue once B
            //    has polled again.
            for _ in 0..10 {
                assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
            }
            let n = put_while_peer_polls(&mut a, &mut b, &pkt);
            assert!(
            n > 0,
            "sender stranded: B consumed all {sent} bytes and polled, but A's put still finds the ring full \
             (B answered A's credit request with a tail A already knew; the tail it sent later travels \
             piggybacked on a packet A has not read, and the threshold {} was not reached)",
            t.threshold
        );
        },
    );
}

/// The shrunk case proptest found for the same liveness rule: here B's *put* (even an
/// empty one, which runs `serve_credit`) answers A's credit request with a tail A
/// already knows.
#[test]
fn credit_answered_by_an_empty_put_does_not_strand_the_sender() {
    bounded("credit_answered_by_an_empty_put", || {
        let t = Tun::new(4096, 768).threshold(2432);
        let (mut a, mut b) = t.pair();
        let mut buf = vec![0u8; 4096];
        let data = Rng::new(1).bytes(4031);
        // A -> B 1 byte, read; B -> A 1 byte (ack 64), read: A knows tail 64.
        assert_eq!(a.put(&[IoSlice::new(&data[..1])]).unwrap(), 1);
        assert_eq!(get_settled(&mut b, &mut buf[..1], 1).unwrap(), 1);
        // An empty get gives the packet back (Receiver::release_read), so the ack is 64.
        assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
        assert_eq!(b.put(&[IoSlice::new(b"y")]).unwrap(), 1);
        assert_eq!(get_settled(&mut a, &mut buf[..1], 1).unwrap(), 1);
        // A fills the ring: 3928 of 4031 bytes, head 4160, credit requested.
        let n = a.put(&[IoSlice::new(&data)]).unwrap();
        assert_eq!(n, 3928, "fill");
        settle_in_flight();
        // B's empty put runs serve_credit: it answers with tail 64, which A knows.
        assert_eq!(b.put(&[IoSlice::new(&[])]).unwrap(), 0);
        // B reads 2232 bytes, piggybacks its tail (2368) on a packet A never reads,
        // then reads the rest (tail 4160; 4160 - 2368 < threshold 2432: no update).
        assert_eq!(get_settled(&mut b, &mut buf[..2232], 2232).unwrap(), 2232);
        assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf[..0])]).unwrap(), 0);
        assert_eq!(b.put(&[IoSlice::new(b"z")]).unwrap(), 1);
        assert_eq!(get_settled(&mut b, &mut buf[..1696], 1696).unwrap(), 1696);
        for _ in 0..10 {
            assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
        }
        let n = put_while_peer_polls(&mut a, &mut b, b"x");
        assert!(n > 0, "sender stranded: B read all 3929 bytes and polled 10 times, A's put still takes nothing");
    });
}

/// The same situation with a blocking writer: must finish (watchdog).
#[test]
fn blocking_writer_with_unread_incoming_data_finishes() {
    bounded("blocking_writer_with_unread_incoming_data_finishes", || {
        let t = Tun::new(4096, 1024).threshold(4096 - 64);
        let (mut a, mut b, sent) = stall_sender_with_known_tail(&t, 0xCD);
        let mut buf = vec![0u8; 1000];
        let mut one = [0u8; 1];
        assert_eq!(get_settled(&mut b, &mut one, 1).unwrap(), 1);
        assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf[..999])]).unwrap(), 999);
        assert_eq!(b.put(&[IoSlice::new(b"unread")]).unwrap(), 6);
        // B has read 2000 of the `sent` bytes.
        let total_extra = 64 << 10;
        let writer = std::thread::spawn(move || {
            // A blocking write of more data; A does not read (its incoming data waits).
            a.write_all(&vec![0xEFu8; total_extra]).map(|_| a)
        });
        let r = with_watchdog("reader of blocking writer", limit(30), move || {
            let mut left = sent - 2000 + total_extra;
            let mut buf = vec![0u8; 4096];
            while left > 0 {
                let n = b.read(&mut buf).unwrap();
                assert!(n > 0);
                left -= n;
            }
            b
        });
        let _a = writer.join().unwrap().unwrap();
        drop(r);
    });
}

/// The receiver gives the packet it read last back one step later
/// (`Receiver::release_read`): at its next `get`, or when it waits. A receiver that
/// read a packet and then only waited must have given it back, so the tail its next
/// packet piggybacks frees the whole ring.
#[test]
fn a_receiver_that_waits_gives_back_the_packet_it_read_last() {
    bounded(
        "a_receiver_that_waits_gives_back_the_packet_it_read_last",
        || {
            // One packet is half the ring; no threshold update.
            let t = Tun::new(4096, 2048).threshold(4096 - 64);
            let (mut a, mut b) = t.pair();
            let data = Rng::new(7).bytes(8192);
            let mut buf = vec![0u8; 8192];
            let payload = 2048 - 64;
            for round in 0..2 {
                assert_eq!(a.put(&[IoSlice::new(&data[..payload])]).unwrap(), payload);
                assert_eq!(get_settled(&mut b, &mut buf, payload).unwrap(), payload);
                // B waits for more: nothing comes.
                if round == 0 {
                    assert!(!b.channel().receiver().poll_readable().unwrap());
                } else {
                    let soon = Instant::now() + Duration::from_millis(1);
                    let e = b
                        .channel()
                        .receiver()
                        .wait_readable_until(Some(soon))
                        .unwrap_err();
                    assert_eq!(e.kind(), io::ErrorKind::TimedOut);
                }
                // B's reply piggybacks its tail; once A has read it, A knows the ring is empty.
                assert_eq!(b.put(&[IoSlice::new(b"x")]).unwrap(), 1);
                assert_eq!(get_settled(&mut a, &mut buf[..1], 1).unwrap(), 1);
                // So A's next put takes more than the half ring that packet would leave.
                let n = a.put(&[IoSlice::new(&data)]).unwrap();
                assert!(
                    n > 2048,
                    "round {round}: the packet read last was not given back ({n})"
                );
                assert_eq!(get_settled(&mut b, &mut buf, n).unwrap(), n);
                assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf)]).unwrap(), 0);
            }
        },
    );
}

/// A receiver that reads a full ring with gets of exactly one packet each, none of
/// which finds the ring empty, still gives the space back as it goes: the upkeep a
/// straight-path get leaves for the next call (tail update, credit answer) is done
/// by the get of the next packet, not only by an empty poll or a wait.
#[test]
fn back_to_back_exact_gets_keep_giving_space_back() {
    bounded("back_to_back_exact_gets_keep_giving_space_back", || {
        let t = Tun::new(4096, 1024).threshold(1024);
        let (mut a, mut b) = t.pair();
        let msg = Rng::new(11).bytes(448);
        let mut sent = 0usize;
        // A fills the ring with one-packet messages until put takes nothing (and so
        // asks for credit).
        loop {
            let n = a.put(&[IoSlice::new(&msg)]).unwrap();
            if n == 0 {
                break;
            }
            assert_eq!(n, msg.len());
            sent += 1;
        }
        assert!(sent >= 4, "only {sent} messages fit");
        settle_in_flight();
        let mut buf = vec![0u8; msg.len()];
        for i in 0..sent {
            // Every get finds its packet there: no empty poll in between.
            assert_eq!(
                get_settled(&mut b, &mut buf, msg.len()).unwrap(),
                msg.len(),
                "message {i}"
            );
            assert_eq!(buf, msg, "message {i}");
        }
        settle_in_flight();
        // B has not polled an empty ring, waited or sent: A can only know the space
        // from the tail updates and credit answers B's gets made.
        assert_eq!(
            a.put(&[IoSlice::new(&msg)]).unwrap(),
            msg.len(),
            "the receiver's gets gave no space back"
        );
    });
}

/// A sender that stalled is answered by the receiver's next get that frees space,
/// even when that get reads exactly one waiting packet and the receiver makes no
/// call after it: the upkeep a straight-path get may leave for later is only ever
/// upkeep with nothing to do.
#[test]
fn exact_get_after_a_stall_answers_it() {
    bounded("exact_get_after_a_stall_answers_it", || {
        exact_read_after_a_stall_answers_it(|s, buf| s.get(&mut [IoSliceMut::new(buf)]));
    });
}

/// The same through `get_nowait` (the C interface's read), which takes the same
/// straight path for a whole small packet.
#[test]
fn exact_get_nowait_after_a_stall_answers_it() {
    bounded("exact_get_nowait_after_a_stall_answers_it", || {
        exact_read_after_a_stall_answers_it(|s, buf| {
            let rx = s.channel().receiver();
            // SAFETY: these messages go through the ring (no zero-copy transfer), so
            // no read is ever left in flight into `buf`.
            unsafe { rx.get_nowait(&mut [IoSliceMut::new(buf)]) }
        });
    });
}

/// A fills the ring with 448-byte messages until it stalls; B reads the first with
/// `read` and the second in two parts (gets that do their upkeep before they
/// return), which answers the stall; A fills again and stalls again; B reads one
/// more with `read` and makes no further call. A must then have room.
fn exact_read_after_a_stall_answers_it(read: fn(&mut RdmaStream, &mut [u8]) -> io::Result<usize>) {
    // The threshold is the whole ring less a cell: only credit answers move A.
    let t = Tun::new(4096, 1024).threshold(4032);
    let (mut a, mut b) = t.pair();
    let msg = Rng::new(12).bytes(448);
    let fill = |a: &mut RdmaStream| {
        let mut sent = 0usize;
        loop {
            let n = a.put(&[IoSlice::new(&msg)]).unwrap();
            if n == 0 {
                return sent;
            }
            assert_eq!(n, msg.len());
            sent += 1;
        }
    };
    let mut buf = vec![0u8; msg.len()];
    let mut read_one = |b: &mut RdmaStream, what: &str| {
        // Everything A sent has landed (settle_in_flight before each call).
        assert_eq!(read(b, &mut buf).unwrap(), msg.len(), "{what}");
        assert_eq!(buf, msg, "{what}");
    };
    assert!(fill(&mut a) >= 3);
    settle_in_flight();
    read_one(&mut b, "first message");
    let mut part = vec![0u8; msg.len()];
    let (head, rest) = part.split_at_mut(200);
    assert_eq!(get_settled(&mut b, head, 200).unwrap(), 200);
    assert_eq!(
        get_settled(&mut b, rest, msg.len() - 200).unwrap(),
        msg.len() - 200
    );
    assert_eq!(part, msg, "second message");
    settle_in_flight();
    assert!(fill(&mut a) >= 1, "the first stall was not answered");
    settle_in_flight();
    // A stalled again and asked for credit. This read releases the packet before
    // it, which is all A needs; it is B's last call.
    read_one(&mut b, "third message");
    settle_in_flight();
    assert_eq!(
        a.put(&[IoSlice::new(&msg)]).unwrap(),
        msg.len(),
        "the read that freed space left the stalled sender unanswered"
    );
}
