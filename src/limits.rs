//! The per-process limit on memory that a caller or a peer can make this library
//! commit: rings, control regions, staging buffers, `alloc_mem` buffers and the
//! emulated fabric's domain tables. Every such allocation takes a [`Charge`] first,
//! so a request beyond the limit fails with `OutOfMemory` before a page is touched,
//! instead of pre-faulting shared memory until the kernel's OOM killer picks victims
//! among unrelated processes.
//!
//! The limit is `RCH_MEMORY_LIMIT` (a size: `512m`, `8g`) when set, else half of the
//! memory this process may use: the least of the machine's RAM, the memory cgroup's
//! limit and `ulimit -v`. [`set_memory_limit`] changes it at run time. Registrations of the
//! caller's own memory are not charged here: they commit nothing new (the
//! registration cache bounds them, and on verbs the kernel's `RLIMIT_MEMLOCK`).
//!
//! ```
//! use rdma_channel::limits;
//! let before = limits::memory_in_use();
//! let fabric = rdma_channel::fabric::emulated::EmuFabric::new()?;
//! assert!(limits::memory_in_use() > before); // the domain's tables
//! let huge = rdma_channel::fabric::Fabric::alloc_region(
//!     &fabric, 1 << 46, rdma_channel::fabric::Access::LOCAL_WRITE);
//! assert_eq!(huge.unwrap_err().kind(), std::io::ErrorKind::OutOfMemory);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

/// A limit and what is charged against it. The process has one
/// ([`Budget::process`]); tests make their own.
#[derive(Debug)]
pub struct Budget {
    limit: AtomicUsize,
    in_use: AtomicUsize,
}

static PROCESS: OnceLock<Budget> = OnceLock::new();

impl Budget {
    /// A budget of `limit` bytes, nothing in use.
    pub const fn new(limit: usize) -> Budget {
        Budget {
            limit: AtomicUsize::new(limit),
            in_use: AtomicUsize::new(0),
        }
    }

    /// The process's budget: `RCH_MEMORY_LIMIT` when set (read at first use), else
    /// [`default_memory_limit`].
    pub fn process() -> &'static Budget {
        PROCESS.get_or_init(|| {
            // A malformed value is ignored here: the budget has no caller to tell.
            let from_env = crate::settings::MEMORY_LIMIT.size().ok().flatten();
            Budget::new(from_env.unwrap_or_else(default_memory_limit))
        })
    }

    /// The limit in bytes.
    pub fn limit(&self) -> usize {
        // Relaxed: a setting; charges compare against whichever value they see.
        self.limit.load(Ordering::Relaxed)
    }

    /// Sets the limit (charges already taken stay valid even above it).
    pub fn set_limit(&self, bytes: usize) {
        // Relaxed: as in `limit`.
        self.limit.store(bytes, Ordering::Relaxed);
    }

    /// Bytes charged now.
    pub fn in_use(&self) -> usize {
        // Relaxed: a statistic.
        self.in_use.load(Ordering::Relaxed)
    }

    /// Takes `bytes` for `what` (named in the error).
    ///
    /// # Errors
    ///
    /// `OutOfMemory` when the limit would be passed; nothing is taken then.
    pub fn charge(&'static self, bytes: usize, what: &str) -> io::Result<Charge> {
        let limit = self.limit();
        // AcqRel on success: charges from several threads are totalled exactly (the
        // CAS loop never lets two take the same headroom); Relaxed on a failed
        // exchange, which only reloads the value.
        let taken = self
            .in_use
            .fetch_update(Ordering::AcqRel, Ordering::Relaxed, |used| {
                used.checked_add(bytes).filter(|&total| total <= limit)
            });
        match taken {
            Ok(_) => Ok(Charge {
                budget: self,
                bytes,
            }),
            Err(used) => Err(io::Error::new(
                io::ErrorKind::OutOfMemory,
                format!(
                    "{what} of {bytes} bytes would pass this process's limit of {limit} bytes \
                     ({used} in use; RCH_MEMORY_LIMIT or limits::set_memory_limit raise it)"
                ),
            )),
        }
    }
}

/// The process's limit in bytes.
pub fn memory_limit() -> usize {
    Budget::process().limit()
}

/// Sets the process's limit (charges already taken stay valid even above it).
pub fn set_memory_limit(bytes: usize) {
    Budget::process().set_limit(bytes);
}

/// Bytes charged against the process's limit now.
pub fn memory_in_use() -> usize {
    Budget::process().in_use()
}

/// Takes `bytes` of the process's budget for `what`: see [`Budget::charge`].
///
/// # Errors
///
/// `OutOfMemory` beyond the limit.
pub fn charge(bytes: usize, what: &str) -> io::Result<Charge> {
    Budget::process().charge(bytes, what)
}

/// Half of the memory this process may use: the least of RAM, the memory cgroup's
/// limit and the address-space limit (`ulimit -v`).
pub fn default_memory_limit() -> usize {
    // SAFETY: sysconf has no memory-safety preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let ram = if pages > 0 && page > 0 {
        (pages as usize).saturating_mul(page as usize)
    } else {
        usize::MAX
    };
    let mut address_space = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct we pass, which lives on our stack.
    let as_limit = if unsafe { libc::getrlimit(libc::RLIMIT_AS, &mut address_space) } == 0
        && address_space.rlim_cur != libc::RLIM_INFINITY
    {
        usize::try_from(address_space.rlim_cur).unwrap_or(usize::MAX)
    } else {
        usize::MAX
    };
    ram.min(cgroup_memory_max().unwrap_or(usize::MAX))
        .min(as_limit)
        / 2
}

/// The memory limit of this process's cgroup (v2 `memory.max`, or v1
/// `memory.limit_in_bytes`), if it has one.
fn cgroup_memory_max() -> Option<usize> {
    let cgroups = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    cgroups.lines().find_map(|line| {
        let mut parts = line.splitn(3, ':');
        let (_, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
        let file = if controllers.is_empty() {
            format!("/sys/fs/cgroup{path}/memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            format!("/sys/fs/cgroup/memory{path}/memory.limit_in_bytes")
        } else {
            return None;
        };
        std::fs::read_to_string(file)
            .ok()?
            .trim()
            .parse::<usize>()
            .ok()
    })
}

/// Bytes of a budget held by one allocation, returned when dropped.
#[derive(Debug)]
pub struct Charge {
    budget: &'static Budget,
    bytes: usize,
}

impl Charge {
    /// The bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        // AcqRel: pairs with the charges' update, as above.
        self.budget.in_use.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_stop_at_the_limit_and_come_back_when_dropped() {
        static B: Budget = Budget::new(1000);
        let a = B.charge(600, "test buffer").unwrap();
        let e = B.charge(600, "second buffer").unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::OutOfMemory);
        assert!(e.to_string().contains("second buffer of 600 bytes"), "{e}");
        assert_eq!(B.in_use(), 600);
        drop(a);
        assert_eq!(B.in_use(), 0);
        let b = B.charge(1000, "all of it").unwrap();
        assert_eq!(b.bytes(), 1000);
        assert!(B.charge(usize::MAX, "everything").is_err());
        B.set_limit(5000);
        assert!(B.charge(4000, "after raising").is_ok());
    }

    #[test]
    fn the_default_is_half_of_a_positive_amount() {
        let d = default_memory_limit();
        assert!(d > 0 && d <= usize::MAX / 2);
    }
}

/// Raises this process's soft limit on open descriptors (`RLIMIT_NOFILE`) to its hard
/// limit, and returns the limit now in force. A process group's connections on one
/// host each hold a few descriptors (the shared memory of the peer's ring and control
/// words, a socket); with tens of ranks a soft limit of 1024, the default of many
/// systems, runs out, and the kernel then drops the descriptors a handshake carries
/// (seen as a truncated frame). The hard limit is the administrator's bound; the soft
/// one is only a default, which runtimes commonly raise so (Go does since 1.19).
///
/// # Errors
///
/// The error of `getrlimit` / `setrlimit`.
pub fn raise_descriptor_limit() -> io::Result<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(io::Error::last_os_error());
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: `raised` is a valid rlimit; a soft limit up to the hard one needs no
        // privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } != 0 {
            return Err(io::Error::last_os_error());
        }
        lim.rlim_cur = lim.rlim_max;
    }
    Ok(lim.rlim_cur)
}

#[cfg(test)]
mod descriptor_tests {
    #[test]
    fn the_soft_descriptor_limit_is_raised_to_the_hard_one() {
        let now = super::raise_descriptor_limit().expect("rlimit");
        let mut lim = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `lim` is a valid, writable rlimit for the call.
        assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) }, 0);
        assert_eq!(lim.rlim_cur, lim.rlim_max);
        assert_eq!(now, lim.rlim_cur);
    }
}
