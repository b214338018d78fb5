//! The MPICH2 RDMA Channel, in Rust: a byte pipe per connection and direction, built
//! from one-sided RDMA writes into a ring that lives at the receiver.
//!
//! ```
//! use std::io::{IoSlice, IoSliceMut};
//! use rdma_channel::RdmaStream;
//!
//! let (mut a, mut b) = RdmaStream::pair()?;
//! // put: non-blocking, takes a list of buffers, returns how many bytes it took.
//! let n = a.put(&[IoSlice::new(b"hello, "), IoSlice::new(b"world")])?;
//! assert_eq!(n, 12);
//! // get: non-blocking, returns how many bytes it delivered (0 if none yet).
//! let mut buf = [0u8; 12];
//! let mut got = 0;
//! while got < 12 {
//!     got += b.get(&mut [IoSliceMut::new(&mut buf[got..])])?;
//! }
//! assert_eq!(&buf, b"hello, world");
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! The main layers, top to bottom, each in its own folder and each using only the
//! layers below it (ARCHITECTURE.md declares the whole order; a test checks the code
//! against it):
//!
//! * [`stream`]: [`RdmaStream`] with `std::io::Read`/`Write`, split halves, an
//!   in-process [`RdmaStream::pair`] and [`RdmaListener`] for two processes;
//! * [`engine`]: put/get of seed 001 sec. 3.2 (the MPICH2 RDMA Channel
//!   paper, Liu et al., IPDPS 2004) on any fabric: replicated head and tail,
//!   piggybacked and delayed tail updates, chunked pipelining;
//! * [`ring`]: the packet format and placement rules, pure logic with no I/O;
//! * [`fabric`]: what RDMA hardware offers (registration, keys, one-sided write and
//!   read, completions, errors) and the [`fabric::emulated`] implementation on shared
//!   memory;
//! * [`config`] and [`settings`] at the bottom: the connection's tunables, and the
//!   one module that reads environment variables.
//!
//! See `ARCHITECTURE.md` for the design and its reasons.

#![deny(unsafe_op_in_unsafe_fn)]
#![warn(missing_docs)]

pub mod config;
pub mod engine;
pub mod fabric;
pub mod ffi;
#[cfg(feature = "fuzzing")]
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod group;
pub mod handshake;
pub mod limits;
pub use handshake::oob;
pub mod patterns;
pub mod pmi;
pub mod rcache;
pub mod ring;
pub mod select;
pub mod settings;
pub mod stream;
pub(crate) mod sync;
#[cfg(feature = "tokio")]
pub mod tokio;
pub mod wire;

pub use config::Config;
pub use engine::{Channel, Lending, Peeked, Prepared, RdmaBuf, Receiver, Sender};
pub use stream::{Address, RdmaListener, RdmaStream, ReadHalf, ToAddress, WriteHalf};
