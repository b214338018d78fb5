//! Zero-copy transfers (RDMA READ rendezvous) and the registration cache, on the
//! fabric `RCH_FABRIC` selects (emulated by default): the mixed eager/zero-copy model,
//! blocking streams with zero-copy sizes, memory unmapped and mapped again at the same
//! address between sends, cache bounds, and the error paths of a transfer in flight.
//! `RCH_TEST_CASE_SCALE` scales the model's case count.

mod common;

use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use rdma_channel::fabric::AnyFabric;
use rdma_channel::rcache::WatchMode;
use rdma_channel::{Channel, Config, Peeked, Prepared, RdmaStream};

use common::zc::{run_zc_model, send_from_remapped_buffer, ZcCase};
use common::{ioe, join, stream_check, stream_fill, watched, Rng, SETTLE};

/// Two connected channels on the fabric `RCH_FABRIC` selects.
fn chan_pair(cfg: Config) -> (Channel<AnyFabric>, Channel<AnyFabric>) {
    let fa = AnyFabric::from_env().unwrap();
    let fb = fa.for_connection().unwrap();
    let a = Prepared::new(fa, cfg.clone()).unwrap();
    let b = Prepared::new(fb, cfg).unwrap();
    let (ca, cb) = (a.card().unwrap(), b.card().unwrap());
    (a.connect(cb).unwrap(), b.connect(ca).unwrap())
}

fn zc_config(ring: usize, chunk: usize, alloc_t: usize, private_t: usize) -> Config {
    Config::default()
        .with_ring_size(ring)
        .with_chunk_size(chunk)
        .with_zero_copy_threshold(Some(alloc_t))
        .with_zero_copy_private_threshold(Some(private_t))
        .with_wait_policy(rdma_channel::config::WaitPolicy {
            spin: 200,
            yields: 20,
            short_sleep_max: Duration::from_micros(1000),
            sleep_max: Duration::from_micros(200),
        })
}

fn case_strategy() -> impl Strategy<Value = (Config, ZcCase)> {
    (
        12u32..=17,   // ring 4 KiB ..= 128 KiB
        any::<u64>(), // seed
        1usize..=12,  // messages
        10u32..=18,   // largest buffer 1 KiB ..= 256 KiB
        0u64..=8,     // alloc_mem share
        0u32..=18,    // alloc threshold 1 B ..= 256 KiB
        prop_oneof![(0u32..=18).prop_map(|k| 1usize << k), Just(usize::MAX)],
        // Push share: all READ, all pushed, half, any.
        prop_oneof![Just(0u8), Just(100u8), Just(50u8), 0u8..=100],
    )
        .prop_map(
            |(ring_k, seed, messages, buf_k, alloc_in_8, at_k, private_t, push)| {
                let ring = 1usize << ring_k;
                let chunk = (ring / 2).min(64 << 10);
                let cfg =
                    zc_config(ring, chunk, 1 << at_k, private_t).with_zero_copy_push(Some(push));
                (
                    cfg,
                    ZcCase {
                        seed,
                        messages,
                        max_buf: 1 << buf_k,
                        alloc_in_8,
                    },
                )
            },
        )
}

proptest! {
    #![proptest_config(ProptestConfig { cases: common::scaled(400), max_shrink_iters: 200, max_shrink_time: 60_000, ..ProptestConfig::default() })]
    /// Eager and zero-copy bytes, from private and allocated memory, interleave in one
    /// FIFO stream whatever the receiver's buffer sizes.
    #[test]
    fn model_mixed_eager_and_zero_copy((cfg, case) in case_strategy()) {
        let what = format!("{cfg:?} {case:?}");
        let r = watched("zc-model", common::limit(60), move || {
            let (mut a, mut b) = chan_pair(cfg);
            run_zc_model(&mut a, &mut b, &case)
        });
        prop_assert!(r.is_ok(), "{what}: {:?}", r.err());
    }
}

/// Which fabric this run tests (see `RCH_FABRIC`); shown with `--nocapture`.
#[test]
fn fabric_under_test() {
    common::report_fabric();
}

/// Blocking streams in two threads: every write at or above the threshold is a
/// rendezvous (a third of them from `alloc_mem`), reads take random sizes; 64 MiB,
/// every byte checked.
#[test]
fn blocking_streams_with_zero_copy_sizes() {
    blocking_streams(None);
}

/// The same with the receiver lending half of each transfer to the sender to push
/// (RDMA WRITE), and all of it.
#[test]
fn blocking_streams_with_pushed_zero_copy() {
    blocking_streams(Some(50));
    blocking_streams(Some(100));
}

fn blocking_streams(push: Option<u8>) {
    let cfg = zc_config(1 << 20, 64 << 10, 16 << 10, 128 << 10).with_zero_copy_push(push);
    let (a, mut b) = RdmaStream::pair_with(cfg).unwrap();
    const BYTES: u64 = 64 << 20;
    const SEED: u64 = 77;
    let writer = std::thread::spawn(move || -> Result<RdmaStream, String> {
        let mut a = a;
        let mut rng = Rng::new(5);
        let mut private = vec![0u8; 1 << 20];
        let mut shared = a.alloc_mem(1 << 20).map_err(|e| ioe(&e))?;
        let mut off = 0u64;
        while off < BYTES {
            let n = (rng.log_uniform(1, 1 << 20) as u64).min(BYTES - off) as usize;
            let buf: &mut [u8] = if rng.chance(1, 3) {
                &mut shared[..n]
            } else {
                &mut private[..n]
            };
            stream_fill(SEED, off, buf);
            a.write_all(buf)
                .map_err(|e| format!("write at {off}: {}", ioe(&e)))?;
            off += n as u64;
        }
        a.shutdown_write().map_err(|e| ioe(&e))?;
        Ok(a)
    });
    let mut rng = Rng::new(6);
    let mut buf = vec![0u8; 2 << 20];
    let mut scratch = Vec::new();
    let mut got = 0u64;
    loop {
        let cap = rng.log_uniform(1, buf.len());
        let n = b.read(&mut buf[..cap]).expect("read");
        if n == 0 {
            break;
        }
        stream_check(SEED, got, &buf[..n], &mut scratch).expect("bytes");
        got += n as u64;
    }
    assert_eq!(got, BYTES);
    let lends = b.channel().receiver().lends();
    match push {
        Some(p) if p > 0 => assert!(lends > 0, "push {p}%: nothing was lent"),
        _ if common::fabric_kind() == rdma_channel::fabric::FabricKind::Emulated => {
            assert_eq!(lends, 0, "the emulated fabric's default is to read it all")
        }
        _ => {}
    }
    let a = join(writer, "writer").expect("writer");
    let stats = a.cache_stats();
    assert!(
        stats.hits > 0,
        "the reused buffers must hit the cache: {stats:?}"
    );
}

/// The corruption of libfabric-cray #1000 / Open MPI #4509: a buffer is sent, unmapped,
/// and new memory with new content is mapped at the same address before the next
/// send. The receiver must always get the new bytes, and the cache must register the
/// new mapping rather than reuse the old registration (on verbs that would pin and
/// send the old pages).
#[test]
fn unmapped_and_remapped_buffer_is_never_sent_stale() {
    const LEN: usize = 1 << 20;
    const ROUNDS: usize = 40;
    let cfg = zc_config(1 << 20, 64 << 10, 4096, 4096);
    let (a, mut b) = RdmaStream::pair_with(cfg).unwrap();
    let mode = a.registration_cache().watch_mode();
    let writer = std::thread::spawn(move || -> Result<RdmaStream, String> {
        let mut a = a;
        send_from_remapped_buffer(LEN, ROUNDS, |buf| a.write_all(buf))?;
        Ok(a)
    });
    let mut buf = vec![0u8; LEN];
    for round in 0..ROUNDS {
        b.read_exact(&mut buf).expect("read");
        let want = round as u8 + 1;
        if let Some(at) = buf.iter().position(|&x| x != want) {
            panic!(
                "round {round}: byte {at} is {} instead of {want} (stale registration?)",
                buf[at]
            );
        }
    }
    let a = join(writer, "writer").expect("writer");
    let stats = a.cache_stats();
    match mode {
        WatchMode::Userfaultfd => {
            // Every round's send found its old registration invalidated by the unmap.
            assert!(
                stats.invalidations >= ROUNDS as u64 - 1,
                "each unmap must invalidate: {stats:?}"
            );
            assert!(stats.misses >= ROUNDS as u64, "{stats:?}");
        }
        WatchMode::Unavailable(why) => {
            eprintln!("note: userfaultfd unavailable ({why}); checked the uncached mode");
            assert_eq!(
                stats.hits, 0,
                "nothing may be cached without a watch: {stats:?}"
            );
        }
    }
}

/// Sending from many distinct buffers keeps the cache within its bounds.
#[test]
fn registration_cache_stays_within_its_bounds() {
    let cfg = zc_config(1 << 20, 64 << 10, 4096, 4096).with_registration_cache(
        rdma_channel::rcache::CacheLimits {
            max_entries: 4,
            max_bytes: 1 << 20,
        },
    );
    let (mut a, mut b) = RdmaStream::pair_with(cfg).unwrap();
    let bufs: Vec<Vec<u8>> = (0..24).map(|i| vec![i as u8; 64 << 10]).collect();
    let reader = std::thread::spawn(move || {
        let mut buf = vec![0u8; 64 << 10];
        for round in 0..3 {
            for i in 0..24 {
                b.read_exact(&mut buf).unwrap();
                assert!(
                    buf.iter().all(|&x| x == i as u8),
                    "round {round} buffer {i}"
                );
            }
        }
    });
    for _ in 0..3 {
        for buf in &bufs {
            a.write_all(buf).unwrap();
            let s = a.cache_stats();
            assert!(s.entries <= 4 && s.bytes <= 1 << 20, "{s:?}");
        }
    }
    reader.join().unwrap();
    let s = a.cache_stats();
    if a.registration_cache().watch_mode() == WatchMode::Userfaultfd {
        assert!(
            s.evictions > 0,
            "24 buffers through 4 entries must evict: {s:?}"
        );
    }
}

/// Offering other buffers while a transfer is in flight is refused, and the transfer
/// still completes when the right buffers come back.
#[test]
fn mismatched_retry_is_refused_and_the_transfer_survives() {
    let (mut a, mut b) = chan_pair(zc_config(1 << 16, 1 << 14, 1024, 1024));
    let big = vec![3u8; 100_000];
    let other = vec![4u8; 100_000];
    // SAFETY: `big` outlives every call below and is not modified.
    let n = unsafe { a.sender().put_nocopy(&[IoSlice::new(&big)]) }.unwrap();
    assert_eq!(n, 0);
    assert!(a.sender().zero_copy_pending());
    // SAFETY: as above; `other` is never announced (the call is refused).
    let e = unsafe { a.sender().put_nocopy(&[IoSlice::new(&other)]) }.unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    let e = a.put(&[IoSlice::new(&big[1..])]).unwrap_err();
    assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    let mut got = vec![0u8; 100_000];
    let mut at = 0;
    while at < got.len() {
        at += b.get(&mut [IoSliceMut::new(&mut got[at..])]).unwrap();
    }
    assert!(got.iter().all(|&x| x == 3));
    // SAFETY: as above.
    let n = unsafe { a.sender().put_nocopy(&[IoSlice::new(&big)]) }.unwrap();
    assert_eq!(n, 100_000);
    assert!(!a.sender().zero_copy_pending());
}

/// `put_lending` counts lent buffers at once and goes on: many transfers are in
/// flight at a time (at most 64), the peer reads them in order, and each is
/// released exactly when the peer has read it, never before: every released buffer
/// is overwritten at once while later ones are still being read. With and without
/// pushes (the receiver lends part of each buffer, and the sender must push from the
/// transfer the lend names, not the oldest one it still holds).
#[test]
fn lent_transfers_stay_in_flight_together_and_release_in_order() {
    for push in [0u8, 50] {
        let cfg = zc_config(1 << 17, 1 << 14, 1 << 30, 16 << 10).with_zero_copy_push(Some(push));
        let (mut a, mut b) = chan_pair(cfg);
        const MSGS: usize = 70;
        const LEN: usize = 40_000;
        let mut bufs: Vec<Vec<u8>> = (0..MSGS)
            .map(|i| (0..LEN).map(|j| (i * 7 + j % 251) as u8).collect())
            .collect();
        let header = [9u8; 24];
        let mut tickets = Vec::new();
        let mut sent = 0;
        // Lend until the limit: each message is a header (copied) and a lent buffer.
        while sent < MSGS {
            let iov = [IoSlice::new(&header), IoSlice::new(&bufs[sent])];
            // SAFETY: `bufs[sent]` is neither modified nor freed until lends_released
            // passes its ticket (checked before the overwrite below).
            let l = unsafe { a.sender().put_lending(&iov) }.unwrap();
            if l.ticket == 0 {
                // The limit: the header went, the buffer waits.
                assert_eq!(l.bytes, header.len(), "push {push}: message {sent}");
                break;
            }
            assert_eq!(l.bytes, header.len() + LEN, "push {push}: message {sent}");
            assert!(
                tickets.last().is_none_or(|&t| l.ticket == t + 1),
                "{tickets:?} {l:?}"
            );
            tickets.push(l.ticket);
            sent += 1;
        }
        assert_eq!(sent, 64, "push {push}: the limit of transfers in flight");
        assert_eq!(a.sender().lends_in_flight(), 64);
        // Nothing is released before the peer reads.
        assert_eq!(a.sender().lends_released().unwrap(), tickets[0] - 1);
        let mut got = vec![0u8; header.len() + LEN];
        for (i, &ticket) in tickets.iter().enumerate() {
            let mut at = 0;
            while at < got.len() {
                at += b.get(&mut [IoSliceMut::new(&mut got[at..])]).unwrap();
            }
            assert_eq!(&got[..header.len()], &header[..]);
            assert!(
                got[header.len()..] == bufs[i][..],
                "push {push}: message {i} differs"
            );
            let released = a.sender().lends_released().unwrap();
            assert_eq!(released, ticket, "push {push}: released after message {i}");
            // Released: this end may write it while the peer reads the next ones.
            bufs[i].fill(0xEE);
        }
        assert_eq!(a.sender().lends_in_flight(), 0);
        // The limit is gone: the rest are lent, the first without its header,
        // which went already.
        for (i, buf) in bufs.iter_mut().enumerate().skip(sent) {
            buf.iter_mut().for_each(|x| *x = i as u8);
            let both = [IoSlice::new(&header), IoSlice::new(buf)];
            let iov = if i == sent { &both[1..] } else { &both[..] };
            let want: usize = iov.iter().map(|s| s.len()).sum();
            // SAFETY: as above; `bufs` outlives the reads below.
            let l = unsafe { a.sender().put_lending(iov) }.unwrap();
            assert_eq!(l.bytes, want);
            assert!(l.ticket > *tickets.last().unwrap());
        }
        for (i, buf) in bufs.iter().enumerate().skip(sent) {
            let mut at = 0;
            while at < got.len() {
                at += b.get(&mut [IoSliceMut::new(&mut got[at..])]).unwrap();
            }
            assert!(got[header.len()..] == buf[..], "push {push}: message {i}");
        }
        while a.sender().lends_in_flight() > 0 {
            a.sender().lends_released().unwrap();
        }
    }
}

/// A sender dropped with lent transfers in flight revokes them all: the peer's
/// reads of the ones it has not read fail, and nothing reads freed memory.
#[test]
fn dropping_a_sender_revokes_every_lent_transfer() {
    let (mut a, mut b) = chan_pair(zc_config(1 << 16, 1 << 14, 1 << 30, 16 << 10));
    let bufs: Vec<Vec<u8>> = (0..4).map(|i| vec![i as u8 + 1; 50_000]).collect();
    for buf in &bufs {
        // SAFETY: `bufs` outlives the sender (dropped below, revoking the transfers).
        let l = unsafe { a.sender().put_lending(&[IoSlice::new(buf)]) }.unwrap();
        assert_eq!(l.bytes, buf.len());
    }
    assert_eq!(a.sender().lends_in_flight(), 4);
    let mut got = vec![0u8; 50_000];
    let mut at = 0;
    while at < got.len() {
        at += b.get(&mut [IoSliceMut::new(&mut got[at..])]).unwrap();
    }
    assert!(got.iter().all(|&x| x == 1));
    drop(a);
    let r = b.get(&mut [IoSliceMut::new(&mut got)]);
    assert!(r.is_err(), "a revoked transfer was read: {r:?}");
}

/// `get_buffered` copies what is in the ring and stops before a zero-copy transfer
/// without starting its reads; `get_nowait` then moves it into its destination.
#[test]
fn buffered_get_stops_before_a_zero_copy_transfer() {
    let (mut a, mut b) = chan_pair(zc_config(1 << 16, 1 << 14, 1024, 1024));
    let small = [7u8; 10];
    let big = vec![5u8; 100_000];
    assert_eq!(a.put(&[IoSlice::new(&small)]).unwrap(), 10);
    // SAFETY: `big` outlives every call below and is not modified.
    let n = unsafe { a.sender().put_nocopy(&[IoSlice::new(&big)]) }.unwrap();
    assert_eq!(n, 0, "announced, not copied");
    let mut stage = vec![0u8; 200_000];
    let start = Instant::now();
    let mut got = 0;
    while got < 10 {
        assert!(start.elapsed() < SETTLE, "the small bytes never arrived");
        got += b
            .receiver()
            .get_buffered(&mut [IoSliceMut::new(&mut stage[got..])])
            .unwrap();
    }
    assert_eq!(got, 10, "nothing of the zero-copy transfer in the stage");
    assert_eq!(&stage[..10], &small);
    for _ in 0..100 {
        let n = b
            .receiver()
            .get_buffered(&mut [IoSliceMut::new(&mut stage)])
            .unwrap();
        assert_eq!(n, 0, "stops before the transfer");
    }
    assert!(!b.receiver().reads_in_flight(), "no read was started");
    let mut dst = vec![0u8; 100_000];
    let mut at = 0;
    while at < dst.len() {
        assert!(start.elapsed() < SETTLE, "the transfer never landed");
        // SAFETY: `dst` stays untouched until every byte is counted.
        at += unsafe {
            b.receiver()
                .get_nowait(&mut [IoSliceMut::new(&mut dst[at..])])
        }
        .unwrap();
        if at > 0 && at < dst.len() {
            // In flight: a buffered get is refused rather than skipping ahead.
            if b.receiver().reads_in_flight() {
                let e = b
                    .receiver()
                    .get_buffered(&mut [IoSliceMut::new(&mut stage)])
                    .unwrap_err();
                assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
            }
        }
    }
    assert!(dst.iter().all(|&x| x == 5));
    // SAFETY: as above.
    let n = unsafe { a.sender().put_nocopy(&[IoSlice::new(&big)]) }.unwrap();
    assert_eq!(n, 100_000, "counted once read");
}

/// `peek` lends ring bytes and says when a zero-copy transfer is next, which only a
/// `get` reads; a consume past what was lent is refused; bytes after the transfer are
/// lent again.
#[test]
fn peek_lends_ring_bytes_and_stops_at_a_zero_copy_transfer() {
    let (mut a, mut b) = chan_pair(zc_config(1 << 16, 1 << 14, 1024, 1024));
    let small = [7u8; 10];
    let big: Vec<u8> = (0..100_000u32).map(|i| (i % 251) as u8).collect();
    assert_eq!(a.put(&[IoSlice::new(&small)]).unwrap(), 10);
    // SAFETY: `big` outlives every call below and is not modified.
    let n = unsafe { a.sender().put_nocopy(&[IoSlice::new(&big)]) }.unwrap();
    assert_eq!(n, 0, "announced, not copied");
    let start = Instant::now();
    let rx = b.receiver();
    let lent = loop {
        assert!(start.elapsed() < SETTLE, "the small bytes never arrived");
        if let Peeked::Bytes(bytes) = rx.peek().unwrap() {
            break bytes.to_vec();
        }
    };
    assert_eq!(lent, small);
    assert_eq!(rx.consume(11).unwrap_err().kind(), ErrorKind::InvalidInput);
    rx.consume(10).unwrap();
    let left = loop {
        assert!(start.elapsed() < SETTLE, "the announcement never arrived");
        match rx.peek().unwrap() {
            Peeked::ZeroCopy { left } => break left,
            Peeked::Nothing => {}
            Peeked::Bytes(bytes) => panic!("lent {} bytes of a zero-copy transfer", bytes.len()),
        }
    };
    assert_eq!(left, 100_000);
    assert_eq!(rx.consume(1).unwrap_err().kind(), ErrorKind::InvalidInput);
    let mut dst = vec![0u8; 60_000];
    let mut at = 0;
    while at < dst.len() {
        assert!(start.elapsed() < SETTLE, "the transfer never landed");
        at += rx.get(&mut [IoSliceMut::new(&mut dst[at..])]).unwrap();
    }
    assert_eq!(dst, big[..60_000]);
    assert!(matches!(
        rx.peek().unwrap(),
        Peeked::ZeroCopy { left: 40_000 }
    ));
    let mut at = 0;
    while at < 40_000 {
        assert!(start.elapsed() < SETTLE, "the transfer never finished");
        at += rx
            .get(&mut [IoSliceMut::new(&mut dst[at..40_000])])
            .unwrap();
    }
    assert_eq!(dst[..40_000], big[60_000..]);
    assert!(matches!(rx.peek().unwrap(), Peeked::Nothing));
    // SAFETY: as above.
    let n = unsafe { a.sender().put_nocopy(&[IoSlice::new(&big)]) }.unwrap();
    assert_eq!(n, 100_000, "counted once read");
    assert_eq!(a.put(&[IoSlice::new(b"after")]).unwrap(), 5);
    let rx = b.receiver();
    let bytes = loop {
        assert!(
            start.elapsed() < SETTLE,
            "the bytes after the transfer never came"
        );
        if let Peeked::Bytes(bytes) = rx.peek().unwrap() {
            break bytes;
        }
    };
    assert_eq!(bytes, b"after");
    rx.consume(5).unwrap();
    assert!(matches!(rx.peek().unwrap(), Peeked::Nothing));
    a.sender().close().unwrap();
    let start = Instant::now();
    let e = loop {
        assert!(start.elapsed() < SETTLE, "end of stream never came");
        match b.receiver().peek() {
            Err(e) => break e,
            Ok(p) => assert!(matches!(p, Peeked::Nothing), "{p:?}"),
        }
    };
    assert_eq!(e.kind(), ErrorKind::UnexpectedEof);
}

/// A receiver that goes away while a transfer is announced gives the sender an
/// error, not a hang; and end of stream comes only after a transfer is read.
#[test]
fn zero_copy_endings() {
    let (mut a, b) = chan_pair(zc_config(1 << 16, 1 << 14, 1024, 1024));
    let big = vec![9u8; 50_000];
    // SAFETY: `big` outlives the sender's use of it (the sender aborts on error).
    let n = unsafe { a.sender().put_nocopy(&[IoSlice::new(&big)]) }.unwrap();
    assert_eq!(n, 0);
    drop(b);
    let start = Instant::now();
    let e = loop {
        assert!(
            start.elapsed() < SETTLE,
            "no error {SETTLE:?} after the peer went away"
        );
        // SAFETY: as above.
        match unsafe { a.sender().put_nocopy(&[IoSlice::new(&big)]) } {
            Ok(0) => std::thread::sleep(Duration::from_millis(1)),
            Ok(n) => panic!("counted {n} bytes nobody read"),
            Err(e) => break e,
        }
    };
    assert_eq!(e.kind(), std::io::ErrorKind::BrokenPipe);
    assert!(!a.sender().zero_copy_pending(), "the transfer is revoked");

    let (mut a, mut b) = chan_pair(zc_config(1 << 16, 1 << 14, 1024, 1024));
    // SAFETY: `big` outlives the sender.
    let n = unsafe { a.sender().put_nocopy(&[IoSlice::new(&big)]) }.unwrap();
    assert_eq!(n, 0);
    let (_rx, mut tx) = a.split();
    tx.close().unwrap();
    let mut got = vec![0u8; 60_000];
    let mut at = 0;
    let start = Instant::now();
    loop {
        assert!(
            start.elapsed() < SETTLE,
            "no end of stream after {at} bytes"
        );
        match b.get(&mut [IoSliceMut::new(&mut got[at..])]) {
            Ok(n) => at += n,
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => break,
            Err(e) => panic!("{e}"),
        }
    }
    assert_eq!(at, 50_000, "end of stream only after the announced bytes");
    assert!(got[..at].iter().all(|&x| x == 9));
}

/// Heap buffers from the adaptive minimum up go by the path the receiver measures
/// cheaper: with the private threshold off, the receiver still asks for a zero-copy
/// sample (it never measured that path), so some transfers go zero-copy and the
/// sender's registration cache is used; the bytes arrive intact either way, at
/// sizes across the meter's size classes and read in pieces of any length. A
/// transfer sent on the advice is split with the sender on the emulated fabric (its
/// default push share for them) from 128 KiB, unless a push share is set; smaller
/// ones are read whole. With the choice off (the default for a stream), no heap
/// buffer is registered.
#[test]
fn adaptive_choice_measures_both_paths_and_loses_nothing() {
    let emulated = common::fabric_kind() == rdma_channel::fabric::FabricKind::Emulated;
    for (adaptive, push, max) in [
        (Some(32 << 10), None, 5 << 20),
        (Some(32 << 10), None, 120 << 10),
        (Some(1 << 20), Some(0), 5 << 20),
        (None, None, 5 << 20),
    ] {
        let cfg = Config::default()
            .with_zero_copy_private_threshold(Some(usize::MAX))
            .with_zero_copy_adaptive(adaptive)
            .with_zero_copy_push(push);
        let (a, mut b) = RdmaStream::pair_with(cfg).unwrap();
        const BYTES: u64 = 96 << 20;
        const SEED: u64 = 91;
        let writer = std::thread::spawn(move || -> Result<RdmaStream, String> {
            let mut a = a;
            write_heap_messages(&mut a, SEED, 17, BYTES, max)?;
            a.shutdown_write().map_err(|e| ioe(&e))?;
            Ok(a)
        });
        let mut rng = Rng::new(18);
        let mut buf = vec![0u8; max];
        let mut scratch = Vec::new();
        let mut got = 0u64;
        loop {
            let cap = rng.log_uniform(1, buf.len());
            let n = b.read(&mut buf[..cap]).expect("read");
            if n == 0 {
                break;
            }
            stream_check(SEED, got, &buf[..n], &mut scratch).expect("bytes");
            got += n as u64;
        }
        assert_eq!(got, BYTES);
        let lends = b.channel().receiver().lends();
        let a = join(writer, "writer").expect("writer");
        let stats = a.cache_stats();
        let acquires = stats.hits + stats.misses;
        let case = format!(
            "adaptive {adaptive:?}, push {push:?}, messages up to {max} B: {stats:?}, {lends} lends"
        );
        match adaptive {
            Some(_) => assert!(acquires > 0, "no transfer went zero-copy: {case}"),
            None => assert_eq!(acquires, 0, "the choice is off: {case}"),
        }
        if push == Some(0) {
            assert_eq!(lends, 0, "a push share of 0 lends nothing: {case}");
        } else if max < 128 << 10 {
            assert_eq!(lends, 0, "a transfer below 128 KiB was split: {case}");
        } else if adaptive.is_some() && emulated {
            assert!(lends > 0, "a transfer on the advice was not split: {case}");
        }
    }
}

/// Both ends send large heap buffers at once with the adaptive choice on: a
/// receiver sending zero-copy itself reads an advised transfer whole instead of
/// lending part of it (its peer would serve the lend only after reading ours), and
/// a lend made while this end was not sending is still served by a writer blocked
/// in its own transfer. Every byte arrives in order both ways.
#[test]
fn adaptive_choice_both_ways_at_once_loses_nothing() {
    let cfg = Config::default()
        .with_zero_copy_private_threshold(Some(usize::MAX))
        .with_zero_copy_adaptive(Some(64 << 10));
    let (a, b) = RdmaStream::pair_with(cfg).unwrap();
    const BYTES: u64 = 64 << 20;
    const MAX: usize = 5 << 20;
    let write = |mut w: rdma_channel::WriteHalf, seed: u64| {
        std::thread::spawn(move || -> Result<(), String> {
            write_heap_messages(&mut w, seed, seed, BYTES, MAX)?;
            w.shutdown().map_err(|e| ioe(&e))
        })
    };
    let read = |mut r: rdma_channel::ReadHalf, seed: u64| {
        std::thread::spawn(move || -> Result<u64, String> {
            let mut rng = Rng::new(seed + 100);
            let mut buf = vec![0u8; MAX];
            let mut scratch = Vec::new();
            let mut got = 0u64;
            loop {
                let cap = rng.log_uniform(1, buf.len());
                let n = r.read(&mut buf[..cap]).map_err(|e| ioe(&e))?;
                if n == 0 {
                    return Ok(got);
                }
                stream_check(seed, got, &buf[..n], &mut scratch)?;
                got += n as u64;
            }
        })
    };
    let (ra, wa) = a.split();
    let (rb, wb) = b.split();
    let threads = [write(wa, 31), write(wb, 32)];
    let readers = [read(rb, 31), read(ra, 32)];
    for t in threads {
        join(t, "writer").expect("writer");
    }
    for t in readers {
        assert_eq!(join(t, "reader").expect("reader"), BYTES);
    }
}

/// Writes `bytes` of the `seed` stream from one heap buffer, in messages of 32 KiB to
/// `max` bytes (log-uniform, from `rng_seed`).
fn write_heap_messages(
    w: &mut impl Write,
    seed: u64,
    rng_seed: u64,
    bytes: u64,
    max: usize,
) -> Result<(), String> {
    let mut rng = Rng::new(rng_seed);
    let mut private = vec![0u8; max];
    let mut off = 0u64;
    while off < bytes {
        let n = (rng.log_uniform(32 << 10, max) as u64).min(bytes - off) as usize;
        stream_fill(seed, off, &mut private[..n]);
        w.write_all(&private[..n])
            .map_err(|e| format!("write at {off}: {}", ioe(&e)))?;
        off += n as u64;
    }
    Ok(())
}
