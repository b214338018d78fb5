//! The atomics and lock of the state that `scripts/loom` model-checks (the send
//! queue's accounting, [`crate::engine`]'s `SendQueue`): `std`'s normally, loom's in
//! the unit tests under `cfg(loom)`, so the checker explores the real code's
//! interleavings and orderings. A re-export only: every other build gets exactly the
//! `std` types (and loom, a dev-dependency, exists only for the tests).

#[cfg(not(all(test, loom)))]
pub(crate) use std::sync::{atomic, Mutex};

#[cfg(all(test, loom))]
pub(crate) use loom::sync::{atomic, Mutex};

/// `membarrier(2)` commands (linux/membarrier.h).
const MEMBARRIER_CMD_GLOBAL_EXPEDITED: libc::c_int = 1 << 1;
const MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED: libc::c_int = 1 << 2;

/// Registers this process for [`full_barrier`]'s barrier (once), so that a selector
/// in a peer's process orders our writes (`select`); true when the barrier is there.
pub(crate) fn register_barrier() -> bool {
    if cfg!(miri) {
        return false;
    }
    static REGISTERED: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *REGISTERED.get_or_init(|| {
        // SAFETY: membarrier takes a command, flags and a CPU id, and returns 0 or -1.
        unsafe {
            libc::syscall(
                libc::SYS_membarrier,
                MEMBARRIER_CMD_REGISTER_GLOBAL_EXPEDITED,
                0,
                0,
            ) == 0
        }
    })
}

/// A memory barrier on every CPU that runs a thread of a registered process: what a
/// fence in each writer would give, at the sleeper's expense only.
pub(crate) fn full_barrier() -> bool {
    if cfg!(miri) {
        return false;
    }
    // SAFETY: as in register_barrier.
    unsafe { libc::syscall(libc::SYS_membarrier, MEMBARRIER_CMD_GLOBAL_EXPEDITED, 0, 0) == 0 }
}
