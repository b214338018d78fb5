//! Out-of-band frames (a little-endian `u32` length, then that many bytes) as they
//! arrive on the Unix socket of a handshake, and the handshake frames inside them
//! (a four-byte tag, then a body; a `HELLO` body is a hello length, the hello and
//! the engine card).
//!
//! The input after its first byte is written into one end of a socket pair, which
//! is then shut; the other end is read frame by frame until an error, with
//! `oob::recv_frame` or (first byte odd) the handshake's own receive. Checks every
//! frame and the final error against a model of the format: a length above
//! `MAX_FRAME` is refused before anything is allocated, a frame cut short is
//! `UnexpectedEof` ("in the middle of a frame" unless the stream ended between
//! frames), no frame is longer than its length or read past; a handshake frame
//! shorter than its tag is refused; and a `HELLO` body splits into a hello of the
//! length its first byte says and the card after it, or is refused when too short.
#![no_main]

use std::io::{ErrorKind, Write};
use std::net::Shutdown;
use std::os::unix::net::UnixStream;
use std::time::{Duration, Instant};

use libfuzzer_sys::fuzz_target;
use rdma_channel::fuzzing::{handshake_hello, handshake_recv, HELLO_TAG};
use rdma_channel::oob::{self, MAX_FRAME};

/// Inputs beyond this would not fit in the socket's buffer before being read.
const MAX_INPUT: usize = 64 * 1024;

/// The next frame of `rest` by the format's definition, or the error kind and
/// whether the stream ended mid-frame.
fn model(rest: &[u8]) -> Result<&[u8], (ErrorKind, bool)> {
    if rest.len() < 4 {
        return Err((ErrorKind::UnexpectedEof, !rest.is_empty()));
    }
    let len = u32::from_le_bytes(rest[..4].try_into().unwrap()) as usize;
    if len > MAX_FRAME {
        return Err((ErrorKind::InvalidData, false));
    }
    rest.get(4..4 + len).ok_or((ErrorKind::UnexpectedEof, true))
}

fn check_hello(body: &[u8]) {
    match handshake_hello(body) {
        Ok((hello, card)) => {
            assert_eq!(usize::from(body[0]), hello.len());
            assert_eq!(body.len(), 1 + hello.len() + card.len());
            assert_eq!(&body[1..1 + hello.len()], &hello[..]);
            assert_eq!(&body[1 + hello.len()..], &card[..]);
        }
        Err(e) => {
            assert_eq!(e.kind(), ErrorKind::InvalidData);
            assert!(body.is_empty() || body.len() < 1 + usize::from(body[0]));
        }
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, bytes)) = data.split_first() else {
        return;
    };
    if bytes.len() > MAX_INPUT {
        return;
    }
    let handshake = mode & 1 == 1;
    let (a, b) = UnixStream::pair().expect("socket pair");
    (&a).write_all(bytes).expect("fits in the socket buffer");
    a.shutdown(Shutdown::Write).expect("shutdown");
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut rest = bytes;
    loop {
        let want = model(rest);
        let got = if handshake {
            handshake_recv(&b, deadline).map(|(tag, body)| {
                let mut frame = tag.to_vec();
                frame.extend_from_slice(&body);
                frame
            })
        } else {
            oob::recv_frame(&b)
        };
        match (got, want) {
            (Ok(frame), Ok(w)) => {
                assert_eq!(frame, w);
                if handshake && frame[..4] == HELLO_TAG {
                    check_hello(&frame[4..]);
                }
                rest = &rest[4 + w.len()..];
            }
            (Err(e), Ok(w)) => {
                // Only a handshake frame shorter than its tag is refused whole; the
                // stream goes on after it.
                assert!(handshake && w.len() < 4, "{e} for a {}-byte frame", w.len());
                assert_eq!(e.kind(), ErrorKind::InvalidData);
                rest = &rest[4 + w.len()..];
            }
            (Err(e), Err((kind, mid_frame))) => {
                assert_eq!(e.kind(), kind, "{e}");
                if kind == ErrorKind::UnexpectedEof {
                    assert_eq!(
                        e.to_string().contains("middle of a frame"),
                        mid_frame,
                        "{e}"
                    );
                }
                break;
            }
            (Ok(frame), Err(w)) => panic!("accepted {frame:?}, the format says {w:?}"),
        }
    }
});
