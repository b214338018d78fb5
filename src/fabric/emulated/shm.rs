//! Shared-memory segments: anonymous memory files (`memfd`) and their mappings.
//!
//! A [`Shm`] is a memfd of fixed size, sealed against shrinking and growing, mapped
//! `MAP_SHARED` in this process. A [`Mapping`] is just a mapping (of our own memfd or
//! of one received from a peer); it unmaps itself on drop.
//!
//! The seals matter: a peer maps our segments and copies into them with plain loads and
//! stores; if the owner could shrink the file, the peer would take `SIGBUS`. Before
//! mapping a received descriptor, [`Mapping::map_shared_fd`] checks that the file is
//! sealed, so a broken or hostile peer cannot crash us that way.

use crate::limits::{self, Charge};
use std::ffi::CString;
use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::ptr::NonNull;
use std::sync::OnceLock;

/// The system page size.
pub(crate) fn page_size() -> usize {
    static PAGE: OnceLock<usize> = OnceLock::new();
    *PAGE.get_or_init(|| {
        // SAFETY: sysconf has no memory-safety preconditions.
        let p = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
        if p > 0 {
            p as usize
        } else {
            4096
        }
    })
}

/// Rounds `len` up to a whole number of pages; `None` on overflow.
pub(crate) fn round_to_pages(len: usize) -> Option<usize> {
    let page = page_size();
    len.checked_add(page - 1).map(|l| l & !(page - 1))
}

/// Faults in the pages of `[ptr, ptr + len)`, writable, in one pass (the kernel's
/// `MADV_POPULATE_WRITE`, Linux 5.14), instead of one fault per page at the first
/// touches. Best effort: an older kernel or a failure leaves the pages to fault as
/// they are touched.
///
/// # Safety
///
/// The range must lie inside one live shared mapping of this process whose first
/// page starts at or before `ptr`'s page.
pub(crate) unsafe fn populate(ptr: *mut u8, len: usize) {
    let page = page_size();
    let start = (ptr as usize) & !(page - 1);
    let len = len + (ptr as usize - start);
    // SAFETY: the range is inside a live mapping of ours (the caller's contract);
    // MADV_POPULATE_WRITE only faults pages in as if written, without writing them,
    // so no byte of the memory changes, and it neither maps nor unmaps anything.
    unsafe {
        libc::madvise(start as *mut libc::c_void, len, libc::MADV_POPULATE_WRITE);
    }
}

/// A live `mmap` of a shared file, unmapped on drop.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: a Mapping is an address range plus its length; unmapping happens only in
// drop, which needs exclusive ownership. What is done with the memory is up to users.
unsafe impl Send for Mapping {}
// SAFETY: as above; `&Mapping` only hands out the base pointer and length.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps `len` bytes of `fd` read-write and shared. Nothing is pre-faulted: a page
    /// costs memory once it is touched, so a ring that carried little costs little.
    fn map(fd: RawFd, len: usize) -> io::Result<Mapping> {
        let flags = libc::MAP_SHARED;
        // SAFETY: a fresh mapping at a kernel-chosen address overlaps nothing we own;
        // the kernel validates fd and length.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                fd,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr =
            NonNull::new(p.cast::<u8>()).ok_or_else(|| io::Error::other("mmap returned null"))?;
        Ok(Mapping { ptr, len })
    }

    /// Maps a memfd received from a peer: checks that it is sealed against shrinking
    /// (so accesses can never fault) and at least `min_len` bytes long, and maps all of
    /// it. Returns the mapping; its length is the file's size.
    ///
    /// # Errors
    ///
    /// The descriptor is not a sealed memfd, is too short, or `mmap` failed.
    pub(crate) fn map_shared_fd(fd: &OwnedFd, min_len: usize) -> io::Result<Mapping> {
        // SAFETY: F_GET_SEALS only reads the file's seal set.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "peer descriptor is not a sealable memory file: {}",
                    io::Error::last_os_error()
                ),
            ));
        }
        if seals & libc::F_SEAL_SHRINK == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "peer memory file is not sealed against shrinking",
            ));
        }
        let size = fd_size(fd)?;
        if size < min_len || size == 0 {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("peer memory file has {size} bytes, expected at least {min_len}"),
            ));
        }
        Mapping::map(fd.as_raw_fd(), size)
    }

    /// Replaces the mapped file by private anonymous memory at the same addresses, so
    /// the file's pages can be freed while the address range stays valid for anyone
    /// still holding a pointer into it (their accesses then hit throw-away memory).
    /// Best effort: if the kernel refuses, the old mapping simply stays.
    pub(crate) fn release_pages(&self) {
        // SAFETY: MAP_FIXED over exactly our own mapping replaces it atomically; no
        // other mapping is touched, and the range stays readable and writable.
        unsafe {
            libc::mmap(
                self.ptr.as_ptr().cast(),
                self.len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_FIXED | libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
                -1,
                0,
            );
        }
    }

    /// Base address.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.ptr.as_ptr()
    }

    /// Length in bytes.
    pub(crate) fn len(&self) -> usize {
        self.len
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: ptr/len are exactly what mmap returned and nobody else unmaps them;
        // whoever holds pointers into the mapping keeps the Mapping alive.
        unsafe {
            libc::munmap(self.ptr.as_ptr().cast(), self.len);
        }
    }
}

/// The size of the file behind `fd`.
pub(crate) fn fd_size(fd: &OwnedFd) -> io::Result<usize> {
    let (_, _, size) = fd_identity(fd.as_raw_fd())?;
    Ok(size)
}

/// `(st_dev, st_ino, st_size)` of an open descriptor.
pub(crate) fn fd_identity(fd: RawFd) -> io::Result<(u64, u64, usize)> {
    // SAFETY: an all-zero `stat` is a valid value of this plain C struct.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: `st` is a valid, writable stat buffer; fstat validates fd.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    Ok((
        st.st_dev,
        st.st_ino,
        usize::try_from(st.st_size).unwrap_or(0),
    ))
}

/// A memfd of fixed, sealed size, mapped shared in this process.
#[derive(Debug)]
pub(crate) struct Shm {
    map: Mapping,
    fd: OwnedFd,
    /// The process budget this memory is charged to (dropped after the mapping).
    _charge: Charge,
}

impl Shm {
    /// Creates a zero-filled memfd called `name` of `len` bytes (rounded up to pages),
    /// seals its size and maps it.
    ///
    /// # Errors
    ///
    /// `len == 0`, a name with a NUL byte; `OutOfMemory` beyond the process's memory
    /// limit ([`crate::limits`]), checked before anything is created; or the kernel
    /// refused.
    pub(crate) fn create(name: &str, len: usize) -> io::Result<Shm> {
        let len = round_to_pages(len)
            .filter(|&l| l > 0)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "invalid segment length"))?;
        let charge = limits::charge(len, "shared memory segment")?;
        let cname = CString::new(name)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "NUL in name"))?;
        // SAFETY: cname is a valid NUL-terminated string; the flags are valid.
        let raw = unsafe {
            libc::memfd_create(cname.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: memfd_create just returned this descriptor and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(len)
            .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "segment too large"))?;
        // SAFETY: ftruncate on our own memfd; the kernel validates the size.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let seals = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;
        // SAFETY: F_ADD_SEALS on our own memfd only restricts later size changes.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, seals) } != 0 {
            return Err(io::Error::last_os_error());
        }
        let map = Mapping::map(fd.as_raw_fd(), len)?;
        Ok(Shm {
            map,
            fd,
            _charge: charge,
        })
    }

    /// The mapping.
    pub(crate) fn mapping(&self) -> &Mapping {
        &self.map
    }

    /// The memfd.
    pub(crate) fn fd(&self) -> &OwnedFd {
        &self.fd
    }

    /// Frees the file's pages (a hole punched over all of it), in every process that
    /// maps it: they read zeros afterwards. Best effort: if the kernel refuses, the
    /// pages go when the last mapping does.
    pub(crate) fn release_pages(&self) {
        let len = libc::off_t::try_from(self.map.len()).unwrap_or(libc::off_t::MAX);
        // SAFETY: fallocate on our own memfd; punching a hole keeps the size (the
        // seals forbid changing it), so no mapping can fault on a missing page.
        unsafe {
            libc::fallocate(
                self.fd.as_raw_fd(),
                libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                0,
                len,
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_is_zeroed_page_rounded_and_sealed() {
        let shm = Shm::create("rdmaemu-test", 10).unwrap();
        assert_eq!(shm.mapping().len(), page_size());
        // SAFETY: the mapping is live and len bytes long.
        let bytes = unsafe { std::slice::from_raw_parts(shm.mapping().ptr(), shm.mapping().len()) };
        assert!(bytes.iter().all(|&b| b == 0));
        // SAFETY: ftruncate on our own memfd; the seal must refuse it.
        let r = unsafe { libc::ftruncate(shm.fd().as_raw_fd(), 1) };
        assert_eq!(r, -1, "a sealed segment must not shrink");
    }

    #[test]
    fn second_mapping_sees_the_same_bytes() {
        let shm = Shm::create("rdmaemu-test", 4096).unwrap();
        let dup = shm.fd().try_clone().unwrap();
        let other = Mapping::map_shared_fd(&dup, 4096).unwrap();
        // SAFETY: both mappings are live and at least 4096 bytes long.
        unsafe {
            shm.mapping().ptr().add(100).write(42);
            assert_eq!(other.ptr().add(100).read(), 42);
        }
    }

    #[test]
    fn released_pages_stay_addressable_and_detach_from_the_file() {
        let shm = Shm::create("rdmaemu-test", 4096).unwrap();
        let dup = shm.fd().try_clone().unwrap();
        let view = Mapping::map_shared_fd(&dup, 4096).unwrap();
        view.release_pages();
        // SAFETY: the range is still mapped (anonymous now) and 4096 bytes long.
        unsafe {
            view.ptr().write(7);
            assert_eq!(view.ptr().read(), 7);
            assert_eq!(
                shm.mapping().ptr().read(),
                0,
                "the file must no longer be reached"
            );
        }
    }

    #[test]
    fn unsealed_or_short_files_are_refused() {
        let shm = Shm::create("rdmaemu-test", 4096).unwrap();
        let dup = shm.fd().try_clone().unwrap();
        let e = Mapping::map_shared_fd(&dup, 8192).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
        let name = CString::new("plain").unwrap();
        // SAFETY: valid name; we own the result.
        let raw = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        assert!(raw >= 0);
        // SAFETY: freshly created descriptor.
        let plain = unsafe { OwnedFd::from_raw_fd(raw) };
        // SAFETY: sizing our own memfd.
        assert_eq!(unsafe { libc::ftruncate(plain.as_raw_fd(), 4096) }, 0);
        let e = Mapping::map_shared_fd(&plain, 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData);
    }

    #[test]
    fn round_to_pages_handles_overflow() {
        assert_eq!(round_to_pages(usize::MAX), None);
        assert_eq!(round_to_pages(1), Some(page_size()));
        assert_eq!(round_to_pages(0), Some(0));
    }
}
