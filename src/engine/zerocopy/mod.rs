//! Zero-copy transfers (seed 001 sec. 5: the MPICH2 RDMA Channel paper, Liu et al.,
//! IPDPS 2004): caller memory lent to the fabric.
//!
//! A buffer at or above the zero-copy threshold is not copied into the ring: the
//! sender registers it and announces it ([`Sender::put_nocopy`], or
//! [`Sender::put_lending`], which counts it at once and lends it until released),
//! and the receiver pulls it with RDMA READ straight into the caller's buffer
//! ([`Receiver::get_nowait`], or `get`, which waits for its reads). All three leave
//! memory in the fabric's hands beyond a call, on the caller's promise, so all are
//! `unsafe`; this folder, inside the engine's, holds those entry points and the
//! code that relies on their promise. The rest of the protocol (announcement
//! packets, confirmations, read accounting) is in `sender.rs` and `receiver.rs`,
//! which have no `unsafe`; `choose.rs` measures which path costs less for heap
//! buffers where neither wins everywhere.
//!
//! [`Sender::put_nocopy`]: crate::engine::Sender::put_nocopy
//! [`Sender::put_lending`]: crate::engine::Sender::put_lending
//! [`Receiver::get_nowait`]: crate::engine::Receiver::get_nowait

mod choose;
mod push;
mod receive;
mod relay;
mod send;

pub(crate) use choose::{
    advises_zero_copy, process_nanos, CopyInMeter, OwnPuts, PathMeter, MEASURE_MIN,
};
pub(crate) use push::{serve_all_lends, PushSource, PushState};
pub(crate) use relay::{Relay, Relayed};

/// Proof that the caller of `put_nocopy`, `put_lending` or `get_nowait` made its
/// promise: the buffers it names stay mapped and untouched until the transfer is
/// counted (lent ones: released). Only those three functions make one (the field
/// is private to this module); the engine carries it to the code here that relies
/// on it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Lent(());
