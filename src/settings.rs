//! Every environment variable rdma-channel reads, in one place: its name, what it
//! does and its default, and the parsing rules they share. Other modules read the
//! environment only through the [`Setting`] constants here, so this list is complete
//! by construction, and a test (`channel-tests/house.rs`) checks it against the
//! README's table both ways.
//!
//! The rules, the same for every variable: unset, empty or only blanks counts as
//! unset (the default); a value that is not Unicode is refused naming the variable;
//! numbers are decimal, sizes take `k`, `m` and `g` suffixes (`RCH_RING_SIZE=1m`).
//! Where a setting has a builder method too ([`Config`](crate::Config)), the
//! variable is applied by `Config::from_env` over the defaults.
//!
//! ```
//! use rdma_channel::settings::{self, RING_SIZE};
//! assert_eq!(RING_SIZE.name(), "RCH_RING_SIZE");
//! assert!(settings::ALL.iter().any(|s| s.name() == "RCH_FABRIC"));
//! // Unset in doc-tests, or a valid size.
//! let ring = RING_SIZE.size()?.unwrap_or(4 << 20);
//! assert!(ring >= 4096);
//! # Ok::<(), std::io::Error>(())
//! ```

use std::io;

/// One environment variable the library reads.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Setting {
    name: &'static str,
    default: &'static str,
    meaning: &'static str,
}

impl Setting {
    /// The variable's name.
    pub const fn name(&self) -> &'static str {
        self.name
    }

    /// Its default, in words.
    pub const fn default_value(&self) -> &'static str {
        self.default
    }

    /// What it does.
    pub const fn meaning(&self) -> &'static str {
        self.meaning
    }

    /// The value as set: `None` when unset, empty or only blanks.
    ///
    /// # Errors
    ///
    /// `InvalidInput` naming the variable when its value is not Unicode.
    pub fn value(&self) -> io::Result<Option<String>> {
        match std::env::var(self.name) {
            Ok(v) if v.trim().is_empty() => Ok(None),
            Ok(v) => Ok(Some(v)),
            Err(std::env::VarError::NotPresent) => Ok(None),
            Err(std::env::VarError::NotUnicode(v)) => {
                Err(invalid(format!("{}={v:?} is not valid UTF-8", self.name)))
            }
        }
    }

    /// The value as a decimal number of type `T`.
    ///
    /// # Errors
    ///
    /// `InvalidInput` naming the variable and its value when it is set and not a
    /// number of that type (or not Unicode).
    pub fn number<T: std::str::FromStr>(&self) -> io::Result<Option<T>> {
        let Some(v) = self.value()? else {
            return Ok(None);
        };
        v.trim()
            .parse()
            .map(Some)
            .map_err(|_| invalid(format!("{}: not a number: {v:?}", self.name)))
    }

    /// The value as a size in bytes ([`parse_size`]: `4096`, `64k`, `1m`, `2g`).
    ///
    /// # Errors
    ///
    /// `InvalidInput` naming the variable when it is set and not a size.
    pub fn size(&self) -> io::Result<Option<usize>> {
        let Some(v) = self.value()? else {
            return Ok(None);
        };
        parse_size(&v)
            .map(Some)
            .map_err(|e| invalid(format!("{}: {e}", self.name)))
    }
}

/// Parses a size with an optional `k`, `m` or `g` suffix (binary multiples).
///
/// ```
/// use rdma_channel::settings::parse_size;
/// assert_eq!(parse_size("64k")?, 64 << 10);
/// assert_eq!(parse_size(" 1M ")?, 1 << 20);
/// assert!(parse_size("lots").is_err());
/// # Ok::<(), std::io::Error>(())
/// ```
///
/// # Errors
///
/// `InvalidInput` for anything else, or a size that does not fit a `usize`.
pub fn parse_size(s: &str) -> io::Result<usize> {
    let t = s.trim().to_ascii_lowercase();
    let (num, mul) = match t.chars().last() {
        Some('k') => (&t[..t.len() - 1], 1usize << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        _ => (&t[..], 1),
    };
    num.parse::<usize>()
        .ok()
        .and_then(|n| n.checked_mul(mul))
        .ok_or_else(|| invalid(format!("not a size: {s:?} (expected e.g. 4096, 64k, 1m)")))
}

fn invalid(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Declares each variable as a documented constant, and [`ALL`] in the same order.
macro_rules! settings {
    ($($id:ident = $name:literal, default $default:literal: $meaning:literal;)*) => {
        $(
            #[doc = concat!("`", $name, "`: ", $meaning, " Default: ", $default, ".")]
            pub const $id: Setting = Setting {
                name: $name,
                default: $default,
                meaning: $meaning,
            };
        )*
        /// Every variable the library reads, in the order of the README's table.
        pub const ALL: &[Setting] = &[$($id),*];
    };
}

settings! {
    RING_SIZE = "RCH_RING_SIZE", default "4 MiB":
        "most bytes a receive ring grows to (a power of two, 4 KiB to 1 GiB).";
    RING_INITIAL = "RCH_RING_INITIAL", default "16 KiB":
        "bytes a receive ring starts with; it grows fourfold when its sender finds it \
         full, up to RCH_RING_SIZE (the ring size turns growing off).";
    RING_IDLE_MS = "RCH_RING_IDLE_MS", default "1000":
        "a grown ring that carried nothing this long shrinks back to its initial size.";
    CHUNK_SIZE = "RCH_CHUNK_SIZE", default "64 KiB":
        "largest packet (the pipelining unit), a multiple of 64.";
    WORKING_SET = "RCH_WORKING_SET", default "256 KiB":
        "most ring bytes the sender keeps its traffic in while the receiver keeps up; \
         the ring size turns it off.";
    TAIL_THRESHOLD = "RCH_TAIL_THRESHOLD", default "working set/4 (ring/4 if smaller)":
        "consumed bytes before an explicit tail update.";
    MAX_INLINE = "RCH_MAX_INLINE", default "the fabric's":
        "cap on inline writes (smaller uses the staging buffer).";
    SPIN = "RCH_SPIN", default "2000":
        "busy polls before a blocking wait yields.";
    YIELD = "RCH_YIELD", default "50000":
        "sched_yield calls before a blocking wait sleeps.";
    SLEEP_MAX_US = "RCH_SLEEP_MAX_US", default "1000":
        "longest sleep between polls of a blocking wait, in microseconds.";
    STREAM_BACKOFF = "RCH_STREAM_BACKOFF", default "32":
        "pause instructions a receiver that is only receiving spends before it polls its \
         ring again, once per message; 0 turns it off.";
    ZCOPY_THRESHOLD = "RCH_ZCOPY_THRESHOLD", default "the fabric's":
        "smallest alloc_mem buffer sent zero-copy (off disables).";
    ZCOPY_PRIVATE_THRESHOLD = "RCH_ZCOPY_PRIVATE_THRESHOLD", default "the fabric's":
        "smallest other buffer sent zero-copy (off disables).";
    ZCOPY_ADAPTIVE = "RCH_ZCOPY_ADAPTIVE", default "the fabric's (process groups)":
        "smallest other buffer that goes by the path the receiver measures cheaper, the \
         ring or zero-copy (off disables).";
    ZCOPY_PUSH = "RCH_ZCOPY_PUSH", default "the fabric's":
        "percent of each zero-copy transfer the receiver lends to the sender to push by \
         RDMA WRITE (0 to 100).";
    RAILS = "RCH_RAILS", default "one rail":
        "a connection's rails: a count, or a comma-separated list of `device[:port]` \
         (verbs; on the emulated fabric `domain` for a protection domain of its own) and \
         `@rate[/link]` (emulated, bytes a second); zero-copy steps are striped across them.";
    STRIPE = "RCH_STRIPE", default "adaptive":
        "how striped steps are split: adaptive[:alpha percent], even, or weights like 4:1.";
    STRIPE_MIN = "RCH_STRIPE_MIN", default "64 KiB":
        "smallest zero-copy step striped across the rails.";
    RCACHE_ENTRIES = "RCH_RCACHE_ENTRIES", default "512":
        "most cached registrations per protection domain.";
    RCACHE_BYTES = "RCH_RCACHE_BYTES", default "1 GiB":
        "most bytes of cached registrations per protection domain.";
    MEMORY_LIMIT = "RCH_MEMORY_LIMIT", default "half of the least of RAM, the cgroup's limit and ulimit -v":
        "most memory the library commits in this process.";
    EMU_SEND_QUEUE = "RCH_EMU_SEND_QUEUE", default "unbounded":
        "testing: a finite send queue of this depth (2 or more) for emulated queue pairs.";
    SPREAD = "RCH_SPREAD", default "auto":
        "auto (a process group whose ranks on a host outnumber its CPUs, none of them \
         bound by the launcher, binds each rank to one CPU in turn) or off.";
    RCACHE = "RCH_RCACHE", default "auto":
        "auto (userfaultfd when available) or off (never cache user memory).";
    FABRIC = "RCH_FABRIC", default "emulated":
        "fabric of the RdmaStream constructors, RdmaListener and a process group's peers \
         on one host: emulated or verbs.";
    CONNECT_TIMEOUT_MS = "RCH_CONNECT_TIMEOUT_MS", default "10000":
        "limit on connecting, by IP address or over a Unix socket, in milliseconds.";
    IB_DEVICE = "RCH_IB_DEVICE", default "the first device":
        "the RDMA device verbs opens.";
    IB_PORT = "RCH_IB_PORT", default "1":
        "the device's port.";
    IB_GID_INDEX = "RCH_IB_GID_INDEX", default "SOFTROCE_GID_INDEX, else chosen":
        "the GID index (else a RoCE v2 IPv4 GID is preferred).";
    SOFTROCE_GID_INDEX = "SOFTROCE_GID_INDEX", default "unset":
        "the GID index when RCH_IB_GID_INDEX is unset (set by the Soft-RoCE harness).";
    IB_TIMEOUT = "RCH_IB_TIMEOUT", default "14":
        "the verbs ACK timeout exponent (4.096 us times 2 to this; at most 31).";
    IB_KEEPALIVE_MS = "RCH_IB_KEEPALIVE_MS", default "1000":
        "send-queue silence after which a verbs queue pair sends a keepalive (0: never).";
    IB_WAKE = "RCH_IB_WAKE", default "0":
        "select: verbs connections take wakes (writes with immediate data) for selectors and \
         async tasks; 1: blocking waits block on them too instead of sleeping on a timer.";
    CM_ADDR = "RCH_CM_ADDR", default "the first RoCE v2 IPv4 GID's address, else IPoIB's":
        "the address (ip or ip:port) a process-group rank publishes for other hosts.";
    HOST_ID = "RCH_HOST_ID", default "kernel boot id and network namespace":
        "a process-group rank's host identity (equal ids use shared memory).";
    PMI_TIMEOUT_MS = "RCH_PMI_TIMEOUT_MS", default "60000":
        "limit on each PMI exchange with the process manager, in milliseconds.";
    PMI_FD = "PMI_FD", default "unset":
        "set by the launcher: the PMI-1 socket inherited as a file descriptor.";
    PMI_PORT = "PMI_PORT", default "unset":
        "set by the launcher: the PMI-1 server's host:port.";
    PMI_ID = "PMI_ID", default "unset":
        "set by the launcher with PMI_PORT: this process's rank, for the initack.";
    PMI_RANK = "PMI_RANK", default "unset":
        "set by the launcher: this process's rank.";
    PMI_SIZE = "PMI_SIZE", default "unset":
        "set by the launcher: the number of processes.";
    PMI_SPAWNED = "PMI_SPAWNED", default "0":
        "set by the launcher: 1 for a process started by MPI_Comm_spawn.";
}
