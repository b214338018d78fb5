//! The C interface (`ffi/rch.h`): the MPICH2 RDMA channel's five functions
//! (`rch_init_process_group`, `rch_init`, `rch_finalize`, `rch_put_datav`,
//! `rch_read_datav`) and what an upper layer needs around them.
//!
//! The header is the source of truth and documents every function; `build.rs` runs
//! bindgen on it, [`sys`] holds the result, and every export below is checked at
//! compile time against the declaration bindgen generated (same parameter and return
//! types), and every struct crossing the boundary against libc and std layouts.
//!
//! Design, in short (see the header; the process group itself is `src/group/`, its
//! handshake `src/group/hello.rs`):
//!
//! * one global state behind one lock; every export catches panics and turns them and
//!   every error into a status code plus a thread-local message (`rch_last_error`);
//! * a process group comes from PMI-1 (mode a, `src/group/exchange.rs`), or from the caller's
//!   publish/lookup/fence callbacks (mode b);
//! * connections are logical after `rch_init`; a pair's rings are set up when it first
//!   communicates, through a handshake over the peer's abstract Unix socket, driven
//!   by whatever library calls either side makes;
//! * the data calls map onto [`Sender::put_nocopy`](crate::Sender::put_nocopy) and
//!   [`Receiver::get_nowait`](crate::Receiver::get_nowait), so the zero-copy rules of
//!   the header are the engine's.
//!
//! A C program links `librdma_channel.a` (or `.so`) and includes `rch.h`; see
//! `ffi/README.md`. Rust programs have no reason to call these functions.

mod error;
mod exchange;
mod lock;
mod state;
pub mod sys;

use std::ffi::{c_char, c_int, c_void};
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};

use crate::engine::Lending;
use crate::group::exchange::{Exchange, Pmi, Singleton};
use crate::group::Group;
use error::{report, Error};
use exchange::Callbacks;
use state::{lock, Phase};
use sys::{
    iovec, rch_exchange, rch_lane, rch_rail_stats, rch_send_lane, rch_stats, rch_status, rch_vc,
    rch_watch, rch_watch_stats, size_t,
};

/// Most iovec entries per data call (`RCH_IOV_MAX`).
pub(crate) const IOV_MAX: usize = 1024;

/// Most ring bytes an `rch_lane` moves over from where the library filled it (its
/// `room`, when the ring's end is farther): `rch_lane_next` refuses a step that
/// leaves no room, so the packets it passes hold at most `RCH_LANE_PASS_BYTES_MAX`
/// of ring, in any mix of sizes, and a packet bigger than that is read by the library.
const LANE_ROOM_MAX: u64 = sys::RCH_LANE_PASS_BYTES_MAX as u64 + sys::RCH_LANE_CELL as u64;

/// Low byte of every connection handle: handles are not addresses but tagged ranks,
/// so that a stale or made-up pointer is recognised without being dereferenced.
const VC_TAG: usize = 0xc5;

fn vc_handle(rank: usize) -> *mut rch_vc {
    ((rank << 8) | VC_TAG) as *mut rch_vc
}

#[inline]
fn vc_rank(vc: *mut rch_vc) -> Result<usize, Error> {
    let v = vc as usize;
    if vc.is_null() {
        return Err(Error::new(rch_status::RCH_ERR_NULL, "vc is NULL"));
    }
    if v & 0xff != VC_TAG {
        return Err(Error::new(
            rch_status::RCH_ERR_UNKNOWN_VC,
            format!("{vc:p} is not a connection handle of this library"),
        ));
    }
    Ok(v >> 8)
}

/// Runs `f`, turning its error, or a panic, into a status code.
#[inline]
fn guard(f: impl FnOnce() -> Result<(), Error>) -> c_int {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(())) => rch_status::RCH_SUCCESS as c_int,
        Ok(Err(e)) => report(e),
        Err(p) => {
            let what = p
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| p.downcast_ref::<String>().cloned())
                .unwrap_or_default();
            report(Error::new(
                rch_status::RCH_ERR_INTERNAL,
                format!("internal error (panic): {what}"),
            ))
        }
    }
}

#[cold]
fn null(what: &str) -> Error {
    Error::new(rch_status::RCH_ERR_NULL, format!("{what} is NULL"))
}

#[cold]
fn invalid(msg: String) -> Error {
    Error::new(rch_status::RCH_ERR_INVALID, msg)
}

/// Writes `v` through an out-pointer that the caller checked for NULL.
///
/// # Safety
///
/// `p` is non-NULL and valid for a write of a `T`, as the header requires.
unsafe fn out<T>(p: *mut T, v: T) {
    // SAFETY: forwarded from this function's contract.
    unsafe { p.write(v) }
}

/// Checks a C iovec array: its pointer, its count, every entry, and the sum of the
/// lengths. Returns the total; `clean` is false when some entry has a NULL base (with
/// length 0), which a Rust slice may not have.
///
/// # Safety
///
/// When `n > 0` and `iov` is not NULL, `iov` points to `n` readable entries.
#[inline(always)]
unsafe fn check_iov(iov: *const iovec, n: c_int) -> Result<(usize, bool), Error> {
    if n < 0 {
        return Err(invalid(format!("iovec count {n} is negative")));
    }
    let n = n as usize;
    if n > IOV_MAX {
        return Err(invalid(format!(
            "iovec count {n} is above RCH_IOV_MAX ({IOV_MAX})"
        )));
    }
    if n == 0 {
        return Ok((0, true));
    }
    if iov.is_null() {
        return Err(null("iov"));
    }
    if iov as usize % std::mem::align_of::<iovec>() != 0 {
        return Err(invalid(format!("iov {iov:p} is misaligned")));
    }
    let (mut total, mut clean) = (0usize, true);
    for i in 0..n {
        // SAFETY: i < n, and the caller promised n readable entries.
        let e = unsafe { &*iov.add(i) };
        let len = e.iov_len as usize;
        if e.iov_base.is_null() {
            if len != 0 {
                return Err(invalid(format!(
                    "iov[{i}] has a NULL base and length {len}"
                )));
            }
            clean = false;
        }
        total = total
            .checked_add(len)
            .filter(|&t| t <= isize::MAX as usize)
            .ok_or_else(|| {
                invalid(format!(
                    "iovec lengths add up beyond SSIZE_MAX (at iov[{i}])"
                ))
            })?;
    }
    Ok((total, clean))
}

/// Gets the library ready for a data call on `vc`: its rank, checked.
#[inline]
fn data_vc(g: &Group, vc: *mut rch_vc) -> Result<usize, Error> {
    let r = vc_rank(vc)?;
    g.check_rank(r)?;
    Ok(r)
}

/// Mode (a): see `rch_init_process_group` in `ffi/rch.h`.
///
/// # Safety
///
/// Each pointer is NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn rch_init_process_group(
    rank: *mut c_int,
    size: *mut c_int,
    has_parent: *mut c_int,
) -> c_int {
    guard(|| {
        for (p, name) in [(rank, "rank"), (size, "size"), (has_parent, "has_parent")] {
            if p.is_null() {
                return Err(null(name));
            }
        }
        let mut lib = lock()?;
        check_uninit(&lib)?;
        let (r, s, spawned, ex) = pmi_group()?;
        let g = Group::new(r, s, spawned, ex)?;
        // SAFETY: checked non-NULL above; the caller promised writable ints.
        unsafe {
            out(rank, g.rank as c_int);
            out(size, g.size as c_int);
            out(has_parent, g.spawned as c_int);
        }
        *lib = Phase::Group(g);
        Ok(())
    })
}

/// The process group from the PMI-1 environment, or a singleton without one.
fn pmi_group() -> Result<(u32, u32, bool, Box<dyn Exchange>), Error> {
    match Pmi::from_env()? {
        Some(p) => {
            let (r, s, spawned) = p.identity();
            Ok((r, s, spawned, Box::new(p)))
        }
        None => Ok((0, 1, false, Box::new(Singleton::default()))),
    }
}

fn check_uninit(lib: &Phase) -> Result<(), Error> {
    match lib {
        Phase::Uninit => Ok(()),
        Phase::Finalized => Err(state::finalized()),
        _ => Err(Error::new(
            rch_status::RCH_ERR_STATE,
            "the process group is already initialised",
        )),
    }
}

/// Mode (b): see `rch_init_process_group_external` in `ffi/rch.h`.
///
/// # Safety
///
/// `ex` is NULL or points to a readable `rch_exchange` whose callbacks and context
/// stay valid until `rch_finalize` returns, as the header requires.
#[no_mangle]
pub unsafe extern "C" fn rch_init_process_group_external(
    rank: c_int,
    size: c_int,
    ex: *const rch_exchange,
) -> c_int {
    guard(|| {
        if ex.is_null() {
            return Err(null("ex"));
        }
        if size < 1 {
            return Err(invalid(format!("size {size} is below 1")));
        }
        if rank < 0 || rank >= size {
            return Err(invalid(format!("rank {rank} is outside [0, {size})")));
        }
        // SAFETY: non-NULL, and the caller promised a readable struct.
        let cb = Callbacks::new(unsafe { &*ex })?;
        let mut lib = lock()?;
        check_uninit(&lib)?;
        let g = Group::new(rank as u32, size as u32, false, Box::new(cb))?;
        *lib = Phase::Group(g);
        Ok(())
    })
}

/// See `rch_init` in `ffi/rch.h`.
#[no_mangle]
pub extern "C" fn rch_init() -> c_int {
    guard(|| {
        let mut lib = lock()?;
        match std::mem::replace(&mut *lib, Phase::Uninit) {
            Phase::Group(mut g) => match g.connect_all() {
                Ok(()) => {
                    *lib = Phase::Ready(g);
                    Ok(())
                }
                Err(e) => {
                    *lib = Phase::Group(g);
                    Err(e.into())
                }
            },
            other => {
                let e = match &other {
                    Phase::Uninit => Error::new(
                        rch_status::RCH_ERR_NOT_INITIALIZED,
                        "rch_init_process_group has not been called",
                    ),
                    Phase::Finalized => state::finalized(),
                    _ => Error::new(rch_status::RCH_ERR_STATE, "rch_init was already called"),
                };
                *lib = other;
                Err(e)
            }
        }
    })
}

/// See `rch_finalize` in `ffi/rch.h`.
#[no_mangle]
pub extern "C" fn rch_finalize() -> c_int {
    guard(|| {
        let mut lib = lock()?;
        match std::mem::replace(&mut *lib, Phase::Finalized) {
            Phase::Group(mut g) | Phase::Ready(mut g) => {
                let r = g.finish();
                drop(g);
                r.map_err(Error::from)
            }
            Phase::Uninit => {
                *lib = Phase::Uninit;
                Err(Error::new(
                    rch_status::RCH_ERR_NOT_INITIALIZED,
                    "rch_init_process_group has not been called",
                ))
            }
            Phase::Finalized => Err(state::finalized()),
        }
    })
}

/// See `rch_rank` in `ffi/rch.h`.
///
/// # Safety
///
/// `rank` is NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn rch_rank(rank: *mut c_int) -> c_int {
    guard(|| {
        if rank.is_null() {
            return Err(null("rank"));
        }
        let r = lock()?.group()?.rank;
        // SAFETY: checked non-NULL; the caller promised a writable int.
        unsafe { out(rank, r as c_int) };
        Ok(())
    })
}

/// See `rch_size` in `ffi/rch.h`.
///
/// # Safety
///
/// `size` is NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn rch_size(size: *mut c_int) -> c_int {
    guard(|| {
        if size.is_null() {
            return Err(null("size"));
        }
        let s = lock()?.group()?.size;
        // SAFETY: checked non-NULL; the caller promised a writable int.
        unsafe { out(size, s as c_int) };
        Ok(())
    })
}

/// See `rch_vc_get` in `ffi/rch.h`.
///
/// # Safety
///
/// `vc` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn rch_vc_get(rank: c_int, vc: *mut *mut rch_vc) -> c_int {
    guard(|| {
        if vc.is_null() {
            return Err(null("vc"));
        }
        let mut lib = lock()?;
        let g = lib.ready()?;
        if rank < 0 || rank as u32 >= g.size {
            return Err(invalid(format!("rank {rank} is outside [0, {})", g.size)));
        }
        // SAFETY: checked non-NULL; the caller promised a writable pointer.
        unsafe { out(vc, vc_handle(rank as usize)) };
        Ok(())
    })
}

/// See `rch_vc_rank` in `ffi/rch.h`.
///
/// # Safety
///
/// `rank` is NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn rch_vc_rank(vc: *mut rch_vc, rank: *mut c_int) -> c_int {
    guard(|| {
        if rank.is_null() {
            return Err(null("rank"));
        }
        let mut lib = lock()?;
        let r = data_vc(lib.ready()?, vc)?;
        // SAFETY: checked non-NULL; the caller promised a writable int.
        unsafe { out(rank, r as c_int) };
        Ok(())
    })
}

/// See `rch_put_datav` in `ffi/rch.h`.
///
/// # Safety
///
/// `iov` is NULL or points to `n` readable entries whose buffers are readable for
/// their lengths; `nbytes` is NULL or writable; the header's zero-copy contract holds
/// for buffers a call leaves in flight.
#[no_mangle]
pub unsafe extern "C" fn rch_put_datav(
    vc: *mut rch_vc,
    iov: *const iovec,
    n: c_int,
    nbytes: *mut size_t,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { put_common(vc, iov, n, nbytes, std::ptr::null_mut()) }
}

/// See `rch_put_lend` in `ffi/rch.h`.
///
/// # Safety
///
/// As `rch_put_datav`; `ticket` NULL or writable; the buffers the call lends stay
/// mapped and unmodified until `rch_lends_released` reports their ticket.
#[no_mangle]
pub unsafe extern "C" fn rch_put_lend(
    vc: *mut rch_vc,
    iov: *const iovec,
    n: c_int,
    nbytes: *mut size_t,
    ticket: *mut u64,
) -> c_int {
    if ticket.is_null() {
        return guard(|| Err(null("ticket")));
    }
    // SAFETY: forwarded from this function's contract; `ticket` is non-NULL.
    unsafe { put_common(vc, iov, n, nbytes, ticket) }
}

/// rch_put_datav (`ticket` NULL) and rch_put_lend.
///
/// # Safety
///
/// As `rch_put_lend`, with `ticket` NULL for rch_put_datav's contract.
#[inline(always)]
unsafe fn put_common(
    vc: *mut rch_vc,
    iov: *const iovec,
    n: c_int,
    nbytes: *mut size_t,
    ticket: *mut u64,
) -> c_int {
    guard(|| {
        if nbytes.is_null() {
            return Err(null("nbytes"));
        }
        // SAFETY: checked non-NULL; the caller promised a writable size_t.
        unsafe { out(nbytes, 0) };
        if !ticket.is_null() {
            // SAFETY: non-NULL; the caller promised a writable uint64_t.
            unsafe { out(ticket, 0) };
        }
        // SAFETY: the caller promised n readable entries at a non-NULL iov.
        let (total, clean) = unsafe { check_iov(iov, n) }?;
        let mut lib = lock()?;
        let g = lib.ready()?;
        let r = data_vc(g, vc)?;
        let lend = !ticket.is_null();
        // SAFETY: the header's zero-copy contract (rch_put_datav's, or rch_put_lend's
        // with `lend`) is the caller's.
        let put = |g: &mut Group, slices: &[IoSlice<'_>]| unsafe {
            if lend {
                g.put_lend(r, slices, total)
            } else {
                g.put(r, slices, total)
                    .map(|bytes| Lending { bytes, ticket: 0 })
            }
        };
        let done = if clean {
            let slices: &[IoSlice<'_>] = if n == 0 {
                &[]
            } else {
                // SAFETY: n > 0 entries, aligned (checked), each with a non-NULL base
                // valid for its length (the caller's promise); iovec and IoSlice have
                // one layout (sys.rs asserts it, std guarantees ABI compatibility).
                unsafe { std::slice::from_raw_parts(iov.cast::<IoSlice<'_>>(), n as usize) }
            };
            put(g, slices)?
        } else {
            // SAFETY: as above, reading the entries one by one and skipping the empty
            // ones (whose base may be NULL).
            let slices: Vec<IoSlice<'_>> = unsafe { entries(iov, n) }
                .map(|(p, l)| {
                    // SAFETY: a non-empty entry has a non-NULL base readable for its
                    // length (checked / promised).
                    IoSlice::new(unsafe { std::slice::from_raw_parts(p, l) })
                })
                .collect();
            put(g, &slices)?
        };
        // SAFETY: checked non-NULL above.
        unsafe { out(nbytes, done.bytes as size_t) };
        if !ticket.is_null() {
            // SAFETY: non-NULL, as above.
            unsafe { out(ticket, done.ticket) };
        }
        Ok(())
    })
}

/// See `rch_lends_released` in `ffi/rch.h`.
///
/// # Safety
///
/// `ticket` NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn rch_lends_released(vc: *mut rch_vc, ticket: *mut u64) -> c_int {
    guard(|| {
        if ticket.is_null() {
            return Err(null("ticket"));
        }
        // SAFETY: checked non-NULL; the caller promised a writable uint64_t.
        unsafe { out(ticket, 0) };
        let mut lib = lock()?;
        let g = lib.ready()?;
        let r = data_vc(g, vc)?;
        let released = g.lends_released(r)?;
        // SAFETY: as above.
        unsafe { out(ticket, released) };
        Ok(())
    })
}

/// The non-empty entries of a checked iovec array, as (base, length).
///
/// # Safety
///
/// `iov` points to `n` readable entries (`n >= 0`).
unsafe fn entries(iov: *const iovec, n: c_int) -> impl Iterator<Item = (*mut u8, usize)> {
    (0..n as usize).filter_map(move |i| {
        // SAFETY: i < n, per this function's contract.
        let e = unsafe { *iov.add(i) };
        (e.iov_len != 0).then_some((e.iov_base.cast::<u8>(), e.iov_len as usize))
    })
}

/// Entries of a read kept on the stack (more go to the heap).
const STACK_IOV: usize = 8;

/// See `rch_read_datav` in `ffi/rch.h`.
///
/// # Safety
///
/// `iov` is NULL or points to `n` readable entries whose buffers are writable for
/// their lengths and do not overlap; `nbytes` is NULL or writable; the header's rule
/// for reads left in flight holds.
#[no_mangle]
pub unsafe extern "C" fn rch_read_datav(
    vc: *mut rch_vc,
    iov: *const iovec,
    n: c_int,
    nbytes: *mut size_t,
) -> c_int {
    guard(|| {
        if nbytes.is_null() {
            return Err(null("nbytes"));
        }
        // SAFETY: checked non-NULL; the caller promised a writable size_t.
        unsafe { out(nbytes, 0) };
        // SAFETY: the caller promised n readable entries at a non-NULL iov.
        unsafe { check_iov(iov, n) }?;
        let mut lib = lock()?;
        let g = lib.ready()?;
        let r = data_vc(g, vc)?;
        if n == 1 {
            // The common case, without the general copy below.
            // SAFETY: checked above: one readable entry.
            let e = unsafe { *iov };
            let done = if e.iov_len == 0 {
                // SAFETY: the header's rule for reads in flight is the caller's.
                unsafe { g.read(r, &mut []) }?
            } else {
                // SAFETY: a non-empty entry has a non-NULL base (checked) writable for
                // its length (the caller's promise).
                let b = unsafe {
                    std::slice::from_raw_parts_mut(e.iov_base.cast::<u8>(), e.iov_len as usize)
                };
                // SAFETY: the header's rule for reads in flight is the caller's.
                unsafe { g.read(r, &mut [IoSliceMut::new(b)]) }?
            };
            // SAFETY: checked non-NULL above.
            unsafe { out(nbytes, done as size_t) };
            return Ok(());
        }
        // The entries are copied (the caller's array is const); empty ones dropped.
        // SAFETY: checked above; the caller promised n readable entries.
        let mut it = unsafe { entries(iov, n) }.map(|(p, l)| {
            // SAFETY: a non-empty entry has a non-NULL base writable for its length,
            // not overlapping the others (the caller's promise).
            IoSliceMut::new(unsafe { std::slice::from_raw_parts_mut(p, l) })
        });
        let mut stack: [MaybeUninit<IoSliceMut<'_>>; STACK_IOV] =
            [const { MaybeUninit::uninit() }; STACK_IOV];
        let mut count = 0;
        let mut heap = Vec::new();
        for s in it.by_ref() {
            if count < STACK_IOV {
                stack[count].write(s);
                count += 1;
            } else {
                heap.push(s);
            }
        }
        let done = if heap.is_empty() {
            // SAFETY: the first `count` entries were written above; MaybeUninit<T>
            // has T's layout.
            let slices = unsafe {
                std::slice::from_raw_parts_mut(stack.as_mut_ptr().cast::<IoSliceMut<'_>>(), count)
            };
            // SAFETY: the header's rule for reads in flight is the caller's.
            unsafe { g.read(r, slices) }?
        } else {
            let mut all: Vec<IoSliceMut<'_>> = Vec::with_capacity(count + heap.len());
            // SAFETY: as above: `count` initialised entries, moved out once.
            all.extend((0..count).map(|i| unsafe { stack[i].assume_init_read() }));
            all.append(&mut heap);
            // SAFETY: the header's rule for reads in flight is the caller's.
            unsafe { g.read(r, &mut all) }?
        };
        // SAFETY: checked non-NULL above.
        unsafe { out(nbytes, done as size_t) };
        Ok(())
    })
}

/// See `rch_read_buffered` in `ffi/rch.h`.
///
/// # Safety
///
/// `buf` is NULL (with `len` 0) or writable for `len` bytes; `nbytes` is NULL or
/// writable.
#[no_mangle]
pub unsafe extern "C" fn rch_read_buffered(
    vc: *mut rch_vc,
    buf: *mut c_void,
    len: size_t,
    nbytes: *mut size_t,
) -> c_int {
    guard(|| {
        if nbytes.is_null() {
            return Err(null("nbytes"));
        }
        // SAFETY: checked non-NULL; the caller promised a writable size_t.
        unsafe { out(nbytes, 0) };
        if buf.is_null() && len != 0 {
            return Err(null("buf"));
        }
        if len as u128 > isize::MAX as u128 {
            return Err(invalid(format!("len {len} is above SSIZE_MAX")));
        }
        let mut lib = lock()?;
        let g = lib.ready()?;
        let r = data_vc(g, vc)?;
        let done = if len == 0 {
            g.read_buffered(r, &mut [])?
        } else {
            // SAFETY: non-NULL (checked) and writable for len bytes (the caller's
            // promise); no reads are left in flight in buffered mode.
            let b = unsafe { std::slice::from_raw_parts_mut(buf.cast::<u8>(), len as usize) };
            g.read_buffered(r, &mut [IoSliceMut::new(b)])?
        };
        // SAFETY: checked non-NULL above.
        unsafe { out(nbytes, done as size_t) };
        Ok(())
    })
}

/// See `rch_peek` in `ffi/rch.h`.
///
/// # Safety
///
/// `bytes` and `len` are NULL or valid for writing a pointer and a `size_t`;
/// `zero_copy_left` is NULL or valid for writing a `size_t`.
#[no_mangle]
pub unsafe extern "C" fn rch_peek(
    vc: *mut rch_vc,
    bytes: *mut *const c_void,
    len: *mut size_t,
    zero_copy_left: *mut size_t,
) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe { rch_consume_peek(vc, 0, bytes, len, zero_copy_left) }
}

/// See `rch_consume_peek` in `ffi/rch.h`.
///
/// # Safety
///
/// As [`rch_peek`].
#[no_mangle]
pub unsafe extern "C" fn rch_consume_peek(
    vc: *mut rch_vc,
    n: size_t,
    bytes: *mut *const c_void,
    len: *mut size_t,
    zero_copy_left: *mut size_t,
) -> c_int {
    // SAFETY: forwarded from this function's contract; no watch.
    unsafe { rch_consume_peek_watch(vc, n, bytes, len, zero_copy_left, std::ptr::null_mut()) }
}

/// See `rch_consume_peek_watch` in `ffi/rch.h`.
///
/// # Safety
///
/// As [`rch_peek`]; `watch` is NULL or valid for writing an `rch_watch`.
#[no_mangle]
pub unsafe extern "C" fn rch_consume_peek_watch(
    vc: *mut rch_vc,
    n: size_t,
    bytes: *mut *const c_void,
    len: *mut size_t,
    zero_copy_left: *mut size_t,
    watch: *mut rch_watch,
) -> c_int {
    // SAFETY: forwarded from this function's contract; no lane.
    unsafe {
        consume_peek_watching(
            vc,
            n,
            Landed::default(),
            bytes,
            len,
            zero_copy_left,
            watch,
            std::ptr::null_mut(),
        )
    }
}

/// See `rch_consume_peek_lane` in `ffi/rch.h`.
///
/// # Safety
///
/// As [`rch_peek`]; `lane` is NULL or valid for reading and writing an `rch_lane`.
#[no_mangle]
pub unsafe extern "C" fn rch_consume_peek_lane(
    vc: *mut rch_vc,
    n: size_t,
    bytes: *mut *const c_void,
    len: *mut size_t,
    zero_copy_left: *mut size_t,
    lane: *mut rch_lane,
) -> c_int {
    let mut landed = Landed::default();
    let mut watch = std::ptr::null_mut();
    if !lane.is_null() {
        // SAFETY: non-NULL, so readable and writable by the caller's promise. Empty
        // until the call below finds the connection quiet.
        let l = unsafe { &mut *lane };
        landed = Landed {
            lent: l.lent != 0,
            passed: l.passed,
        };
        l.lent = 0;
        l.passed = 0;
        l.cell = std::ptr::null();
        l.pos = 0;
        l.room = 0;
        watch = std::ptr::addr_of_mut!(l.watch);
    }
    // SAFETY: forwarded from this function's contract; `watch` is NULL or the lane's.
    unsafe { consume_peek_watching(vc, n, landed, bytes, len, zero_copy_left, watch, lane) }
}

/// See `rch_copy_lent` in `ffi/rch.h`.
///
/// # Safety
///
/// `src` is NULL or valid for reading `len` bytes, `dst` NULL or valid for writing
/// `len` bytes, and nothing writes `src` or touches `dst` during the call.
#[no_mangle]
pub unsafe extern "C" fn rch_copy_lent(
    vc: *mut rch_vc,
    dst: *mut c_void,
    src: *const c_void,
    len: size_t,
) -> c_int {
    guard(|| {
        if len == 0 {
            return Ok(());
        }
        if dst.is_null() {
            return Err(null("dst"));
        }
        if src.is_null() {
            return Err(null("src"));
        }
        // A size_t is a usize on every target Rust supports for this library.
        let len = len as usize;
        if len > isize::MAX as usize {
            return Err(invalid(format!("rch_copy_lent of {len} bytes")));
        }
        let (d, s) = (dst as usize, src as usize);
        if d < s.saturating_add(len) && s < d.saturating_add(len) {
            return Err(invalid(format!(
                "rch_copy_lent: the {len} bytes at {src:p} and at {dst:p} overlap"
            )));
        }
        // SAFETY: non-NULL, valid for `len` bytes by the caller's promise, and
        // disjoint (checked above), so a shared and an exclusive slice may coexist.
        let (dst, src) = unsafe {
            (
                std::slice::from_raw_parts_mut(dst.cast::<u8>(), len),
                std::slice::from_raw_parts(src.cast::<u8>(), len),
            )
        };
        let mut lib = lock()?;
        let g = lib.ready()?;
        let r = data_vc(g, vc)?;
        Ok(g.copy_lent(r, dst, src)?)
    })
}

/// What a caller read through its lane without a call, for `rch_consume_peek_lane`.
#[derive(Clone, Copy, Default)]
struct Landed {
    /// `n` counts bytes of the packet `rch_lane_packet` lent.
    lent: bool,
    /// Whole packets `rch_lane_next` passed before it (a C int: negative is bad input).
    passed: c_int,
}

/// The body of `rch_consume_peek_watch` and `rch_consume_peek_lane`: `landed` says
/// what the caller read through the lane (the packets it passed, and whether `n`
/// counts bytes of the packet the lane lent).
///
/// # Safety
///
/// As [`rch_peek`]; `watch` is NULL or valid for writing an `rch_watch`; `lane` is
/// NULL or valid for writing an `rch_lane` whose `watch` is `watch`.
#[allow(clippy::too_many_arguments)]
#[inline(always)]
unsafe fn consume_peek_watching(
    vc: *mut rch_vc,
    n: size_t,
    landed: Landed,
    bytes: *mut *const c_void,
    len: *mut size_t,
    zero_copy_left: *mut size_t,
    watch: *mut rch_watch,
    lane: *mut rch_lane,
) -> c_int {
    if !watch.is_null() {
        // SAFETY: non-NULL, so writable by the caller's promise. Empty until the
        // call below finds the connection quiet.
        unsafe {
            (*watch).count = 0;
            (*watch).tests_left = 0;
        }
    }
    guard(|| {
        if bytes.is_null() {
            return Err(null("bytes"));
        }
        if len.is_null() {
            return Err(null("len"));
        }
        // SAFETY: both checked non-NULL; the caller promised writable locations.
        unsafe {
            out(bytes, std::ptr::null());
            out(len, 0);
        }
        if !zero_copy_left.is_null() {
            // SAFETY: non-NULL, so writable by the caller's promise.
            unsafe { out(zero_copy_left, 0) };
        }
        let passed = usize::try_from(landed.passed).map_err(|_| {
            invalid(format!(
                "the lane says it passed {} packets: it was not filled by this library",
                landed.passed
            ))
        })?;
        let mut lib = lock()?;
        let g = lib.ready()?;
        let r = data_vc(g, vc)?;
        // A size_t is a usize on every target Rust supports for this library.
        let lent = g.consume_landed_peek(r, passed, n as usize, landed.lent)?;
        // SAFETY: checked non-NULL above.
        unsafe {
            out(bytes, lent.bytes.cast::<c_void>());
            out(len, lent.len as size_t);
        }
        if !zero_copy_left.is_null() {
            // SAFETY: as above. A transfer is at most isize::MAX bytes (the sender's
            // buffer), so it fits a size_t.
            unsafe { out(zero_copy_left, lent.zero_copy_left as size_t) };
        }
        // A whole packet lent: a lane may go on past it (rch_lane_next) without a
        // call. Nothing lent on a quiet connection: the watch, and the lane's cell.
        let lend_lane = lent.len != 0 && !lane.is_null();
        if (lend_lane || (lent.len == 0 && lent.zero_copy_left == 0)) && !watch.is_null() {
            let w = if lend_lane {
                g.lane_after_lend(r)
            } else {
                g.quiet_watch(r)
            };
            if let Some(w) = w {
                // SAFETY: non-NULL, so writable by the caller's promise.
                let watch = unsafe { &mut *watch };
                for (i, (word, value)) in w.words.iter().enumerate() {
                    // The header's contract: the caller reads these words only until
                    // its next read call on this connection, which they outlive
                    // (Receiver::quiet_watch).
                    watch.word[i] = word.as_ptr().cast_const();
                    watch.value[i] = *value;
                }
                watch.count = w.words.len() as c_int;
                watch.tests_left = w.tests as c_int;
                if !lane.is_null() {
                    // SAFETY: non-NULL, so writable by the caller's promise; the
                    // watch's borrow above has ended. The cell is the first watched
                    // word (QuietWatch's order), as long-lived as it.
                    unsafe {
                        (*lane).cell = w.words[0].0.as_ptr().cast_const();
                        (*lane).pos = w.pos;
                        // The lane moves over at most this much before the next
                        // call: passed packets hold their ring space until then, and
                        // this bounds them to RCH_LANE_PASS_BYTES_MAX whatever their
                        // sizes (rch_lane_next refuses a step that leaves no room).
                        (*lane).room = w.room.min(LANE_ROOM_MAX);
                        // At most one packet's cells, which fit a ring.
                        (*lane).lent = c_int::try_from(w.lent_cells).unwrap_or(0);
                    }
                }
            }
        }
        Ok(())
    })
}

/// See `rch_vc_send_lane` in `ffi/rch.h`.
///
/// # Safety
///
/// `lane` is NULL or valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn rch_vc_send_lane(vc: *mut rch_vc, lane: *mut *mut rch_send_lane) -> c_int {
    guard(|| {
        if lane.is_null() {
            return Err(null("lane"));
        }
        // SAFETY: checked non-NULL; the caller promised a writable pointer.
        unsafe { out(lane, std::ptr::null_mut()) };
        let mut lib = lock()?;
        let g = lib.ready()?;
        let r = data_vc(g, vc)?;
        if let Some(p) = g.send_lane(r, vc.cast())? {
            // SAFETY: as above. SendLane and rch_send_lane have one layout (sys.rs).
            unsafe { out(lane, p.cast::<rch_send_lane>()) };
        }
        Ok(())
    })
}

/// See `rch_lane_ring` in `ffi/rch.h`.
#[no_mangle]
pub extern "C" fn rch_lane_ring(vc: *mut rch_vc) -> c_int {
    guard(|| {
        let mut lib = lock()?;
        let g = lib.ready()?;
        let r = data_vc(g, vc)?;
        g.after_lane(r)?;
        Ok(())
    })
}

/// See `rch_consume` in `ffi/rch.h`.
#[no_mangle]
pub extern "C" fn rch_consume(vc: *mut rch_vc, n: size_t) -> c_int {
    guard(|| {
        let mut lib = lock()?;
        let g = lib.ready()?;
        let r = data_vc(g, vc)?;
        // A size_t is a usize on every target Rust supports for this library.
        g.consume(r, n as usize)?;
        Ok(())
    })
}

fn check_timeout(t: c_int) -> Result<(), Error> {
    if t < -1 {
        return Err(invalid(format!("timeout {t} ms is below -1")));
    }
    Ok(())
}

/// Most connections one `rch_poll_ready` call lists (`rch.h` promises at most 64):
/// what does not fit waits for the next call (the list is level-triggered).
const POLL_READY_BATCH: usize = 64;

/// See `rch_poll_ready` in `ffi/rch.h`.
///
/// # Safety
///
/// `ranks` is NULL (with `max` 0) or valid for writing `max` ints; `n` is NULL or
/// valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn rch_poll_ready(ranks: *mut c_int, max: c_int, n: *mut c_int) -> c_int {
    guard(|| {
        if n.is_null() {
            return Err(null("n"));
        }
        // SAFETY: checked non-NULL; the caller promised a writable int.
        unsafe { out(n, 0) };
        if max < 0 {
            return Err(invalid(format!("max {max} is negative")));
        }
        if ranks.is_null() && max > 0 {
            return Err(null("ranks"));
        }
        let want = (max as usize).min(POLL_READY_BATCH);
        let found: &mut [c_int] = if want == 0 {
            &mut []
        } else {
            // SAFETY: non-NULL (checked above, as max > 0) and, as the caller promised,
            // valid for writing max >= want ints, which nothing else reaches meanwhile.
            unsafe { std::slice::from_raw_parts_mut(ranks, want) }
        };
        let mut lib = lock()?;
        let g = lib.ready()?;
        // Ranks are below the group's size, which rch_init handed out as an int.
        let got = g.poll_ready(found, |r| r as c_int);
        // SAFETY: checked non-NULL above.
        unsafe { out(n, got as c_int) };
        Ok(())
    })
}

/// See `rch_wait` in `ffi/rch.h`.
#[no_mangle]
pub extern "C" fn rch_wait(timeout_ms: c_int) -> c_int {
    guard(|| {
        check_timeout(timeout_ms)?;
        state::wait(timeout_ms, None, true, true)
    })
}

/// See `rch_wakeup` in `ffi/rch.h`. No lock and no allocation: one atomic add.
#[no_mangle]
pub extern "C" fn rch_wakeup() -> c_int {
    state::wake_waiters();
    rch_status::RCH_SUCCESS as c_int
}

/// See `rch_vc_wait_readable` in `ffi/rch.h`.
#[no_mangle]
pub extern "C" fn rch_vc_wait_readable(vc: *mut rch_vc, timeout_ms: c_int) -> c_int {
    guard(|| {
        check_timeout(timeout_ms)?;
        let r = vc_rank(vc)?;
        state::wait(timeout_ms, Some(r), true, false)
    })
}

/// See `rch_vc_wait_writable` in `ffi/rch.h`.
#[no_mangle]
pub extern "C" fn rch_vc_wait_writable(vc: *mut rch_vc, timeout_ms: c_int) -> c_int {
    guard(|| {
        check_timeout(timeout_ms)?;
        let r = vc_rank(vc)?;
        state::wait(timeout_ms, Some(r), false, true)
    })
}

/// See `rch_vc_close` in `ffi/rch.h`.
#[no_mangle]
pub extern "C" fn rch_vc_close(vc: *mut rch_vc) -> c_int {
    guard(|| {
        let mut lib = lock()?;
        let g = lib.ready()?;
        let r = data_vc(g, vc)?;
        g.close(r);
        Ok(())
    })
}

/// See `rch_get_stats` in `ffi/rch.h`.
///
/// # Safety
///
/// `stats` is NULL or valid for writing an `rch_stats`.
#[no_mangle]
pub unsafe extern "C" fn rch_get_stats(stats: *mut rch_stats) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        write_stats(stats, "stats", |g| {
            let s = g.stats();
            rch_stats {
                connections: s.connections as c_int,
                pending: s.pending as c_int,
                registered_bytes: s.registered_bytes as _,
            }
        })
    }
}

/// See `rch_wait_spins` in `ffi/rch.h`.
///
/// # Safety
///
/// `spins` is NULL or valid for writing an `int`.
#[no_mangle]
pub unsafe extern "C" fn rch_wait_spins(spins: *mut c_int) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        write_stats(spins, "spins", |g| {
            c_int::try_from(g.wait_policy().spins()).unwrap_or(c_int::MAX)
        })
    }
}

/// See `rch_get_watch_stats` in `ffi/rch.h`.
///
/// # Safety
///
/// `stats` is NULL or valid for writing an `rch_watch_stats`.
#[no_mangle]
pub unsafe extern "C" fn rch_get_watch_stats(stats: *mut rch_watch_stats) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        write_stats(stats, "stats", |g| {
            let w = g.watch_stats();
            rch_watch_stats {
                busy: w.busy as c_int,
                quiet: w.quiet as c_int,
                quiet_belled: w.quiet_belled as c_int,
                rings: w.rings,
                found_by_bell: w.found_by_bell,
                found_in_turn: w.found_in_turn,
            }
        })
    }
}

/// See `rch_get_rail_stats` in `ffi/rch.h`.
///
/// # Safety
///
/// `stats` is NULL or valid for writing an `rch_rail_stats`.
#[no_mangle]
pub unsafe extern "C" fn rch_get_rail_stats(stats: *mut rch_rail_stats) -> c_int {
    // SAFETY: forwarded from this function's contract.
    unsafe {
        write_stats(stats, "stats", |g| {
            let r = g.rail_stats();
            rch_rail_stats {
                connections: r.connections as c_int,
                rails: r.rails as c_int,
                read_bytes: r.read_bytes,
            }
        })
    }
}

/// The calls that read a figure of the group (rch_get_*stats, rch_wait_spins):
/// `RCH_ERR_NULL` naming `what` for a NULL `dst`, else writes what `read` makes of
/// the group into it.
///
/// # Safety
///
/// `dst` is NULL or valid for writing a `T`.
unsafe fn write_stats<T>(dst: *mut T, what: &str, read: impl FnOnce(&Group) -> T) -> c_int {
    guard(|| {
        if dst.is_null() {
            return Err(null(what));
        }
        let v = read(lock()?.group()?);
        // SAFETY: checked non-NULL; the caller promised a writable `T`.
        unsafe { out(dst, v) };
        Ok(())
    })
}

/// See `rch_strerror` in `ffi/rch.h`.
#[no_mangle]
pub extern "C" fn rch_strerror(code: c_int) -> *const c_char {
    error::describe(code).as_ptr()
}

/// See `rch_last_error` in `ffi/rch.h`.
#[no_mangle]
pub extern "C" fn rch_last_error() -> *const c_char {
    error::last()
}

/// Every export has exactly the type of the declaration bindgen generated from the
/// header: the array below only compiles if each pair has one function-pointer type.
macro_rules! same_signature {
    ($($f:ident),* $(,)?) => {
        $(const _: () = {
            let _ = [sys::$f, $f];
        };)*
    };
}

same_signature!(
    rch_init_process_group,
    rch_init_process_group_external,
    rch_init,
    rch_finalize,
    rch_rank,
    rch_size,
    rch_vc_get,
    rch_vc_rank,
    rch_put_datav,
    rch_read_datav,
    rch_read_buffered,
    rch_peek,
    rch_consume,
    rch_consume_peek,
    rch_wait,
    rch_wakeup,
    rch_vc_wait_readable,
    rch_vc_wait_writable,
    rch_vc_close,
    rch_get_stats,
    rch_get_watch_stats,
    rch_get_rail_stats,
    rch_wait_spins,
    rch_strerror,
    rch_last_error,
);
