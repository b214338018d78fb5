//! Access to a peer process's *private* memory (registered memory that is not in a
//! shared segment) with `process_vm_readv` / `process_vm_writev`.
//!
//! These calls need ptrace-level permission over the peer (same user and, under Yama
//! `ptrace_scope = 1`, the peer must be a descendant or have allowed us with
//! `PR_SET_PTRACER`). A refusal surfaces as an error the queue pair turns into a
//! remote-access-error completion.
//!
//! Writes keep the placement order with two calls: everything but the last aligned word
//! of the target range, then that word. The kernel copies the word with one aligned
//! store on the architectures we know of, but does not promise it.

use super::copy::{for_each_chunk, gather, last_word};
use crate::fabric::Sge;
use std::io;
use std::mem::MaybeUninit;

/// Room for two ranges of a gather list of the fabric's maximum length.
const MAX_IOV: usize = 64;

/// A fixed-capacity iovec list that can be consumed from the front. Entries
/// `[0, end)` are initialized; the rest are not, so that a list costs no 1 KiB
/// memset per transfer (two lists a read: ~150 instructions of a 16 KiB zero-copy
/// round trip's ~9,000, bench/notebook/2026-12.md).
struct IovList {
    v: [MaybeUninit<libc::iovec>; MAX_IOV],
    start: usize,
    end: usize,
}

impl IovList {
    fn new() -> IovList {
        IovList {
            v: [const { MaybeUninit::uninit() }; MAX_IOV],
            start: 0,
            end: 0,
        }
    }

    /// Appends a piece; errors when the list is full (more pieces than the fabric's
    /// gather limit allows, which `post` rules out).
    fn push(&mut self, base: *mut u8, len: usize) -> io::Result<()> {
        if len == 0 {
            return Ok(());
        }
        if self.end == MAX_IOV {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "too many iovec pieces",
            ));
        }
        self.v[self.end].write(libc::iovec {
            iov_base: base.cast(),
            iov_len: len,
        });
        self.end += 1;
        Ok(())
    }

    /// Appends the pieces of `sges` that make up bytes `[from, to)`.
    fn push_chunks(&mut self, sges: &[Sge], from: u64, to: u64) -> io::Result<()> {
        let mut result = Ok(());
        for_each_chunk(sges, from, to, |p, len, _| {
            if result.is_ok() {
                result = self.push(p, len);
            }
        });
        result
    }

    fn pending(&self) -> &[libc::iovec] {
        let live = &self.v[self.start..self.end];
        // SAFETY: entries below `end` were written by `push` (the invariant above),
        // and MaybeUninit<T> has T's layout.
        unsafe { &*(live as *const [MaybeUninit<libc::iovec>] as *const [libc::iovec]) }
    }

    /// Drops the first `bytes` bytes (after a partial transfer).
    fn advance(&mut self, mut bytes: usize) {
        while bytes > 0 && self.start < self.end {
            // SAFETY: start < end, so the entry was written by `push`.
            let iov = unsafe { self.v[self.start].assume_init_mut() };
            if bytes >= iov.iov_len {
                bytes -= iov.iov_len;
                self.start += 1;
            } else {
                iov.iov_base = iov.iov_base.cast::<u8>().wrapping_add(bytes).cast();
                iov.iov_len -= bytes;
                bytes = 0;
            }
        }
    }
}

/// Direction of a transfer.
#[derive(Clone, Copy)]
enum Dir {
    ToPeer,
    FromPeer,
}

/// Moves all bytes between the two lists, retrying after partial transfers.
fn transfer(pid: i32, local: &mut IovList, remote: &mut IovList, dir: Dir) -> io::Result<()> {
    while !remote.pending().is_empty() {
        let (l, r) = (local.pending(), remote.pending());
        // SAFETY: both lists hold valid iovecs; local ones describe memory of this
        // process that the caller vouched for (post's contract), remote ones are checked
        // by the kernel against the peer's address space.
        let n = unsafe {
            match dir {
                Dir::ToPeer => libc::process_vm_writev(
                    pid,
                    l.as_ptr(),
                    l.len() as libc::c_ulong,
                    r.as_ptr(),
                    r.len() as libc::c_ulong,
                    0,
                ),
                Dir::FromPeer => libc::process_vm_readv(
                    pid,
                    l.as_ptr(),
                    l.len() as libc::c_ulong,
                    r.as_ptr(),
                    r.len() as libc::c_ulong,
                    0,
                ),
            }
        };
        if n < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        if n == 0 {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                "the kernel moved no bytes",
            ));
        }
        local.advance(n as usize);
        remote.advance(n as usize);
    }
    Ok(())
}

/// Places the `n` bytes of gather list `src` at `addr` in process `pid`, the last
/// aligned word in a second call.
///
/// # Safety
///
/// `src` must describe at least `n` readable bytes of this process.
///
/// # Errors
///
/// The kernel's refusal (`EPERM`, `ESRCH`, `EFAULT`, ...).
pub(crate) unsafe fn write(pid: i32, addr: u64, src: &[Sge], n: u64) -> io::Result<()> {
    let remote_ptr = |a: u64| a as usize as *mut u8;
    let mut local = IovList::new();
    let mut remote = IovList::new();
    match last_word(addr, n) {
        None => {
            local.push_chunks(src, 0, n)?;
            remote.push(remote_ptr(addr), n as usize)?;
            transfer(pid, &mut local, &mut remote, Dir::ToPeer)
        }
        Some(w) => {
            local.push_chunks(src, 0, w)?;
            local.push_chunks(src, w + 8, n)?;
            remote.push(remote_ptr(addr), w as usize)?;
            remote.push(remote_ptr(addr + w + 8), (n - w - 8) as usize)?;
            transfer(pid, &mut local, &mut remote, Dir::ToPeer)?;
            let mut word = [0u8; 8];
            // SAFETY: bytes [w, w + 8) of the gather list are readable (caller contract)
            // and `word` holds 8 bytes.
            unsafe { gather(src, w, w + 8, word.as_mut_ptr()) };
            let mut local = IovList::new();
            let mut remote = IovList::new();
            local.push(word.as_mut_ptr(), 8)?;
            remote.push(remote_ptr(addr + w), 8)?;
            transfer(pid, &mut local, &mut remote, Dir::ToPeer)
        }
    }
}

/// Fetches `n` bytes at `addr` in process `pid` into scatter list `dst`.
///
/// # Safety
///
/// `dst` must describe at least `n` writable bytes of this process.
///
/// # Errors
///
/// The kernel's refusal (`EPERM`, `ESRCH`, `EFAULT`, ...).
pub(crate) unsafe fn read(pid: i32, addr: u64, dst: &[Sge], n: u64) -> io::Result<()> {
    let mut local = IovList::new();
    let mut remote = IovList::new();
    local.push_chunks(dst, 0, n)?;
    remote.push(addr as usize as *mut u8, n as usize)?;
    transfer(pid, &mut local, &mut remote, Dir::FromPeer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn me() -> i32 {
        // SAFETY: getpid has no preconditions.
        unsafe { libc::getpid() }
    }

    fn sge(buf: &mut [u8]) -> Sge {
        Sge::from_slice(buf, 0)
    }

    #[test]
    fn write_and_read_through_the_kernel() {
        let mut a: Vec<u8> = (0..100).collect();
        let mut b: Vec<u8> = (100..133).collect();
        let list = [sge(&mut a), sge(&mut b)];
        let mut target = vec![0u8; 200];
        let addr = target.as_mut_ptr() as u64 + 5;
        // SAFETY: the gather list covers 133 readable bytes; the target has room.
        unsafe { write(me(), addr, &list, 133).unwrap() };
        assert!(target[..5].iter().all(|&x| x == 0));
        assert_eq!(&target[5..138], &(0..133).collect::<Vec<u8>>()[..]);
        assert!(target[138..].iter().all(|&x| x == 0));

        let mut back = vec![0u8; 133];
        let out = [sge(&mut back)];
        // SAFETY: 133 writable bytes.
        unsafe { read(me(), addr, &out, 133).unwrap() };
        assert_eq!(&back[..], &target[5..138]);
    }

    #[test]
    fn bad_addresses_are_errors_not_crashes() {
        let mut buf = [0u8; 16];
        let list = [sge(&mut buf)];
        // SAFETY: the local side is valid; the remote address is unmapped.
        let e = unsafe { read(me(), 8, &list, 16) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
        // SAFETY: as above.
        let e = unsafe { write(me(), 8, &list, 16) }.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EFAULT));
    }

    #[test]
    fn advance_consumes_partial_entries() {
        let mut buf = [0u8; 10];
        let mut l = IovList::new();
        l.push(buf.as_mut_ptr(), 4).unwrap();
        l.push(buf.as_mut_ptr(), 0).unwrap();
        l.push(buf.as_mut_ptr(), 6).unwrap();
        assert_eq!(l.pending().len(), 2);
        l.advance(5);
        assert_eq!(l.pending().len(), 1);
        assert_eq!(l.pending()[0].iov_len, 5);
        l.advance(5);
        assert!(l.pending().is_empty());
    }
}
