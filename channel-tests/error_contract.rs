//! The error contract of `rdma_channel::stream` (its module documentation has the
//! table): each failure a caller can meet through the public API, produced on the
//! fabric `RCH_FABRIC` selects, gives its documented `io::ErrorKind`. A peer's death
//! is matched in `peer_death.rs`, bounded waits in `bounded_waits.rs` and memory
//! limits in `limits.rs`; this file checks the rest and one case of each of those,
//! so that the table is checked in one place.

mod common;

use std::io::{ErrorKind, IoSlice, IoSliceMut, Read, Write};
use std::os::unix::net::UnixListener;
use std::time::Duration;

use common::peer::{scratch_dir, RemoveOnDrop};
use rdma_channel::{oob, Config, RdmaListener, RdmaStream};

fn kind_of<T>(r: std::io::Result<T>) -> ErrorKind {
    match r {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.kind(),
    }
}

#[test]
fn peer_closed_its_sending_side_reads_end_then_get_says_eof() {
    let (mut a, mut b) = RdmaStream::pair().unwrap();
    a.write_all(b"last").unwrap();
    a.shutdown_write().unwrap();
    let mut four = [0u8; 4];
    b.read_exact(&mut four).unwrap();
    assert_eq!(b.read(&mut four).unwrap(), 0, "read: Ok(0) at the end");
    let e = b.get(&mut [IoSliceMut::new(&mut four)]);
    assert_eq!(kind_of(e), ErrorKind::UnexpectedEof);
}

#[test]
fn writing_to_a_peer_that_closed_is_a_broken_pipe() {
    let (mut a, b) = RdmaStream::pair().unwrap();
    drop(b);
    let e = (0..1000).try_for_each(|_| a.put(&[IoSlice::new(&[1u8; 4096])]).map(drop));
    assert_eq!(kind_of(e), ErrorKind::BrokenPipe);
    // The connection stays failed the same way.
    assert_eq!(kind_of(a.write(b"x")), ErrorKind::BrokenPipe);
}

#[test]
fn a_read_past_its_timeout_is_timed_out() {
    let (mut a, _b) = RdmaStream::pair().unwrap();
    a.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
    assert_eq!(kind_of(a.read(&mut [0u8; 8])), ErrorKind::TimedOut);
}

#[test]
fn nobody_listening_is_refused_and_a_missing_path_not_found() {
    let dir = scratch_dir("contract-refused");
    let _cleanup = RemoveOnDrop(dir.clone());
    let stale = dir.join("stale");
    drop(UnixListener::bind(&stale).unwrap());
    assert_eq!(
        kind_of(RdmaStream::connect(&stale)),
        ErrorKind::ConnectionRefused
    );
    assert_eq!(
        kind_of(RdmaStream::connect(dir.join("absent"))),
        ErrorKind::NotFound
    );
}

#[test]
fn a_listener_that_answers_garbage_is_a_protocol_error() {
    let dir = scratch_dir("contract-garbage");
    let _cleanup = RemoveOnDrop(dir.clone());
    let path = dir.join("sock");
    let server = UnixListener::bind(&path).unwrap();
    let t = std::thread::spawn(move || {
        let (s, _) = server.accept().unwrap();
        let _hello = oob::recv_frame(&s);
        // A well-framed answer that is no handshake frame.
        oob::send_frame(&s, b"NOPE, not rdma-channel").unwrap();
        std::thread::sleep(Duration::from_millis(200));
    });
    let cfg = Config::default().with_connect_timeout(Duration::from_secs(5));
    let e = RdmaStream::connect_with(&path, cfg).map(drop).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidData, "{e}");
    t.join().unwrap();
}

#[test]
fn absurd_memory_is_out_of_memory_and_bad_settings_invalid_input() {
    let (a, _b) = RdmaStream::pair().unwrap();
    assert_eq!(kind_of(a.alloc_mem(1 << 46)), ErrorKind::OutOfMemory);
    let bad_ring = Config::default().with_ring_size(1000);
    assert_eq!(
        kind_of(RdmaStream::pair_with(bad_ring)),
        ErrorKind::InvalidInput
    );
    let (mut a, _b) = RdmaStream::pair().unwrap();
    assert_eq!(
        kind_of(a.set_read_timeout(Some(Duration::ZERO))),
        ErrorKind::InvalidInput
    );
}

#[test]
fn a_live_listeners_path_is_in_use() {
    let dir = scratch_dir("contract-inuse");
    let _cleanup = RemoveOnDrop(dir.clone());
    let _first = RdmaListener::bind(dir.join("sock")).unwrap();
    assert_eq!(
        kind_of(RdmaListener::bind(dir.join("sock"))),
        ErrorKind::AddrInUse
    );
}
