//! The atomics and lock of the state that `scripts/loom` model-checks (the send
//! queue's accounting, [`crate::engine`]'s `SendQueue`): `std`'s normally, loom's in
//! the unit tests under `cfg(loom)`, so the checker explores the real code's
//! interleavings and orderings. A re-export only: every other build gets exactly the
//! `std` types (and loom, a dev-dependency, exists only for the tests).

#[cfg(not(all(test, loom)))]
pub(crate) use std::sync::{atomic, Mutex};

#[cfg(all(test, loom))]
pub(crate) use loom::sync::{atomic, Mutex};
