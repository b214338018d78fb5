//! Registered memory: [`VerbsRegion`] (an `ibv_mr`, plus the pages it owns when it
//! came from [`alloc_region`](crate::fabric::Fabric::alloc_region)).

use super::device::ProtectionDomain;
use super::error::{last_verb_error, verb_error};
use crate::fabric::{Access, MemoryRegion};
use crate::limits::{self, Charge};
use rdma_sys as sys;
use std::io;
use std::ptr::NonNull;
use std::sync::Arc;

/// The verbs access flags for `access`. Verbs require `LOCAL_WRITE` whenever
/// `REMOTE_WRITE` is asked for (and `ibv_reg_mr` fails with `EINVAL` otherwise); we
/// add it for `REMOTE_READ` too, which every provider accepts.
pub(crate) fn effective_access(access: Access) -> Access {
    if access.contains(Access::REMOTE_WRITE) || access.contains(Access::REMOTE_READ) {
        access | Access::LOCAL_WRITE
    } else {
        access
    }
}

fn verbs_flags(access: Access) -> i32 {
    let mut f = 0u32;
    if access.contains(Access::LOCAL_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0;
    }
    if access.contains(Access::REMOTE_WRITE) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0;
    }
    if access.contains(Access::REMOTE_READ) {
        f |= sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0;
    }
    f as i32
}

/// Anonymous private pages owned by a region (`mmap`/`munmap`).
struct Pages {
    addr: NonNull<u8>,
    len: usize,
    /// The process budget this memory is charged to.
    _charge: Charge,
}

impl Pages {
    /// Maps `len` bytes (rounded up to whole pages) of zeroed memory.
    fn new(len: usize) -> io::Result<Pages> {
        // SAFETY: sysconf has no memory-safety preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as usize;
        let len = len
            .checked_add(page - 1)
            .ok_or_else(|| verb_error("mmap", libc::ENOMEM))?
            & !(page - 1);
        let charge = limits::charge(len, "registered memory")?;
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(last_verb_error("mmap"));
        }
        Ok(Pages {
            addr: NonNull::new(p.cast()).expect("mmap returned a null mapping"),
            len,
            _charge: charge,
        })
    }
}

impl Drop for Pages {
    fn drop(&mut self) {
        // SAFETY: the mapping is ours and is unmapped once, after its registration was
        // removed (field order of VerbsRegion: the MR goes first).
        unsafe { libc::munmap(self.addr.as_ptr().cast(), self.len) };
    }
}

/// A memory region registered with `ibv_reg_mr`. Dropping it deregisters it
/// (`ibv_dereg_mr`), then unmaps the pages if the region owns them.
pub struct VerbsRegion {
    mr: NonNull<sys::ibv_mr>,
    addr: *mut u8,
    len: usize,
    lkey: u32,
    rkey: u32,
    access: Access,
    /// The pages, for regions from `alloc_region`; dropped after the deregistration.
    pages: Option<Pages>,
    _pd: Arc<ProtectionDomain>,
}

// SAFETY: the region is a description of memory plus a kernel handle; deregistration
// may happen on any thread, and the owned pages are plain memory.
unsafe impl Send for VerbsRegion {}
// SAFETY: every method reads immutable fields.
unsafe impl Sync for VerbsRegion {}

impl std::fmt::Debug for VerbsRegion {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsRegion")
            .field("addr", &self.addr)
            .field("len", &self.len)
            .field("lkey", &self.lkey)
            .field("rkey", &self.rkey)
            .field("access", &self.access)
            .field("owned", &self.pages.is_some())
            .finish()
    }
}

impl VerbsRegion {
    /// Maps `len` bytes of zeroed, page-aligned memory and registers them.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for `len == 0`; `mmap` or `ibv_reg_mr` failures with their errno.
    pub fn alloc(pd: Arc<ProtectionDomain>, len: usize, access: Access) -> io::Result<VerbsRegion> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot allocate a zero-length region",
            ));
        }
        let pages = Pages::new(len)?;
        // SAFETY: the pages are mapped for at least `len` bytes and are dropped only
        // after the registration (they move into the region).
        let mut r = unsafe { VerbsRegion::register(pd, pages.addr.as_ptr(), len, access) }?;
        r.pages = Some(pages);
        Ok(r)
    }

    /// Registers `addr..addr + len` of existing memory.
    ///
    /// # Safety
    ///
    /// The memory must stay mapped until the region is dropped.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for `len == 0`; `ibv_reg_mr` failures with their errno (e.g.
    /// `ENOMEM` past the locked-memory limit, `EFAULT` for unmapped memory).
    pub unsafe fn register(
        pd: Arc<ProtectionDomain>,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> io::Result<VerbsRegion> {
        if len == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "cannot register a zero-length region",
            ));
        }
        let access = effective_access(access);
        // SAFETY: valid PD; the caller guarantees the memory stays mapped while
        // registered. The kernel pins the pages.
        let mr = unsafe { sys::ibv_reg_mr(pd.as_ptr(), addr.cast(), len, verbs_flags(access)) };
        let mr = NonNull::new(mr).ok_or_else(|| {
            let e = last_verb_error("ibv_reg_mr");
            if e.kind() == io::ErrorKind::OutOfMemory {
                // Registration pins pages: the usual cause is RLIMIT_MEMLOCK.
                io::Error::new(
                    e.kind(),
                    format!(
                        "{e} (registering {len} bytes; \
                         is the locked-memory limit, ulimit -l, too low?)"
                    ),
                )
            } else {
                e
            }
        })?;
        // SAFETY: a freshly returned, valid ibv_mr.
        let (lkey, rkey) = unsafe { ((*mr.as_ptr()).lkey, (*mr.as_ptr()).rkey) };
        Ok(VerbsRegion {
            mr,
            addr,
            len,
            lkey,
            rkey,
            access,
            pages: None,
            _pd: pd,
        })
    }
}

impl MemoryRegion for VerbsRegion {
    fn addr(&self) -> *mut u8 {
        self.addr
    }
    fn len(&self) -> usize {
        self.len
    }
    fn lkey(&self) -> u32 {
        self.lkey
    }
    fn rkey(&self) -> u32 {
        self.rkey
    }
    /// The rights actually granted: what was asked for, plus `LOCAL_WRITE` when a
    /// remote right was asked for (verbs require it).
    fn access(&self) -> Access {
        self.access
    }
}

impl Drop for VerbsRegion {
    fn drop(&mut self) {
        // SAFETY: the MR is valid and deregistered once; after this no remote access
        // under its keys is possible. The pages (if any) are unmapped afterwards, when
        // the `pages` field drops.
        let r = unsafe { sys::ibv_dereg_mr(self.mr.as_ptr()) };
        debug_assert_eq!(r, 0, "ibv_dereg_mr failed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn remote_rights_imply_local_write() {
        assert_eq!(
            effective_access(Access::REMOTE_WRITE),
            Access::REMOTE_WRITE | Access::LOCAL_WRITE
        );
        assert_eq!(
            effective_access(Access::REMOTE_READ),
            Access::REMOTE_READ | Access::LOCAL_WRITE
        );
        assert_eq!(effective_access(Access::NONE), Access::NONE);
        assert_eq!(
            verbs_flags(Access::LOCAL_WRITE | Access::REMOTE_READ),
            1 | 4
        );
    }
}
