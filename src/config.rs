//! Tunables of a connection: ring and chunk sizes, the tail-update threshold and the
//! blocking-wait policy. Set them with the builder methods or environment variables;
//! [`Config::from_env`] starts from the defaults and applies the variables.
//!
//! | variable | meaning | default |
//! | --- | --- | --- |
//! | `RCH_RING_SIZE` | most bytes a receive ring grows to (power of two, 4 KiB ..= 1 GiB) | 4 MiB |
//! | `RCH_RING_INITIAL` | bytes a receive ring starts with (power of two, 4 KiB ..= the ring size; the ring size itself turns growing off) | 16 KiB |
//! | `RCH_RING_IDLE_MS` | a grown ring that carried nothing for this long shrinks back to its initial size | 1000 |
//! | `RCH_CHUNK_SIZE` | largest packet in bytes (multiple of 64, 128 ..= ring/2) | 64 KiB |
//! | `RCH_WORKING_SET` | most ring bytes the sender keeps its traffic in while the receiver keeps up (a multiple of 64; on the emulated fabric smaller packets wrap sooner, `ring::lap_end`; the ring size or more turns it off) | 256 KiB |
//! | `RCH_TAIL_THRESHOLD` | consumed bytes before an explicit tail update | the smaller of ring/4 and working set/4 |
//! | `RCH_MAX_INLINE` | cap on inline writes (smaller forces the staging copy) | fabric's |
//! | `RCH_SPIN` | busy polls before a blocking wait yields | 2000 (100 in a process group with more ranks on the host than CPUs; 0 for a connection over a software RDMA device in a one-CPU process) |
//! | `RCH_YIELD` | `sched_yield`s before it sleeps | 50000 (0 when oversubscribed, as above) |
//! | `RCH_SLEEP_MAX_US` | longest sleep between polls (a connection over a software RDMA device in a one-CPU process sleeps at most 5 us for a wait's first [`SHORT_SLEEPS`] sleeps) | 1000 |
//! | `RCH_STREAM_BACKOFF` | CPU pause instructions a receiver that is only receiving spends before it polls its ring again, once per message that arrived (0 turns it off; see [`Config::with_stream_backoff`]) | 32 |
//! | `RCH_ZCOPY_THRESHOLD` | smallest buffer from [`alloc_mem`](crate::Channel::alloc_mem) sent zero-copy (`off` to disable) | fabric's |
//! | `RCH_ZCOPY_PRIVATE_THRESHOLD` | the same for any other memory | fabric's |
//! | `RCH_ZCOPY_PUSH` | percent of each zero-copy transfer the sender pushes by RDMA WRITE into the receiver's buffer while the receiver pulls the rest by RDMA READ (0 ..= 100; the receiver's setting counts) | fabric's |
//! | `RCH_RCACHE_ENTRIES` | most cached registrations per protection domain | 512 |
//! | `RCH_RCACHE_BYTES` | most bytes of cached registrations per protection domain | 1 GiB |
//! | `RCH_MEMORY_LIMIT` | most memory the library commits in this process ([`crate::limits`]) | half of RAM, cgroup or `ulimit -v` |
//! | `RCH_CONNECT_TIMEOUT_MS` | limit on connecting: by address (resolution, request, reply), and a Unix-socket handshake on either side | 10000 |
//! | `RCH_FABRIC` | fabric of the [`RdmaStream`](crate::RdmaStream) constructors and [`RdmaListener`](crate::RdmaListener): `emulated` or `verbs` (feature `verbs`; device from `RCH_IB_*`) | `emulated` |
//!
//! `RCH_FABRIC` is read by [`AnyFabric::from_env`](crate::fabric::AnyFabric::from_env),
//! not by [`Config::from_env`]: it picks the fabric, not a tunable of the connection.
//!
//! The zero-copy thresholds are per kind of memory because the cost of the peer's
//! read is: on the emulated fabric a buffer in a shared segment is read with a plain
//! copy, any other memory through `process_vm_readv`. Each fabric supplies measured
//! defaults ([`Fabric::zero_copy_defaults`](crate::fabric::Fabric::zero_copy_defaults)).
//!
//! The wait policy was measured with more busy threads than cores: sleeping while the
//! peer is merely descheduled collapses throughput, so the wait yields for a long time
//! (a yield with nothing else runnable returns at once) and sleeps only when the peer
//! has been quiet for tens of milliseconds.
//!
//! Sizes accept `k`, `m` and `g` suffixes (`RCH_RING_SIZE=1m`).

use std::io;
use std::time::Duration;

use crate::fabric::ZeroCopyThresholds;
use crate::rcache::CacheLimits;

/// Connection tunables.
///
/// ```
/// use rdma_channel::Config;
/// let cfg = Config::default().with_ring_size(1 << 20).with_chunk_size(32 << 10);
/// cfg.validate().unwrap();
/// assert_eq!(cfg.ring_size(), 1 << 20);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Config {
    ring_size: usize,
    initial_ring_size: usize,
    ring_idle: Duration,
    chunk_size: usize,
    working_set: usize,
    tail_threshold: Option<usize>,
    max_inline: Option<usize>,
    wait: WaitPolicy,
    /// The spin or yield count was chosen (RCH_SPIN, RCH_YIELD, `with_wait_policy`),
    /// so no automatic adjustment may override it.
    wait_set: bool,
    stream_backoff: u32,
    zero_copy: ZeroCopyThresholds<Option<usize>>,
    zero_copy_push: Option<u8>,
    rcache: CacheLimits,
    connect_timeout: Duration,
}

/// How a blocking wait polls: `spin` busy polls, then `yields` calls to
/// `sched_yield`, then sleeps doubling from 1 us up to `short_sleep_max` for its first
/// [`SHORT_SLEEPS`] sleeps, and on up to `sleep_max` after them.
///
/// ```
/// use std::time::Duration;
/// use rdma_channel::config::WaitPolicy;
/// let p = WaitPolicy {
///     spin: 100,
///     yields: 0,
///     short_sleep_max: Duration::from_micros(10),
///     sleep_max: Duration::from_micros(500),
/// };
/// let cfg = rdma_channel::Config::default().with_wait_policy(p);
/// assert_eq!(cfg.wait_policy(), p);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct WaitPolicy {
    /// Busy polls before the first yield.
    pub spin: u32,
    /// Yields before the first sleep.
    pub yields: u32,
    /// Longest sleep of a young wait (its first [`SHORT_SLEEPS`] sleeps), while the
    /// message it waits for is likely on its way; `sleep_max` if that is less.
    pub short_sleep_max: Duration,
    /// Longest sleep between two polls.
    pub sleep_max: Duration,
}

/// Sleeps of a wait capped at [`WaitPolicy::short_sleep_max`]: a wait still going
/// after them (10 ms and more at 5 us a sleep) is for a message that was not on its
/// way, and need not wake as often.
pub const SHORT_SLEEPS: u32 = 2_000;

/// The default wait policy: see the module docs for how it was chosen.
pub const DEFAULT_WAIT_POLICY: WaitPolicy = WaitPolicy {
    spin: 2_000,
    yields: 50_000,
    short_sleep_max: Duration::from_micros(1000),
    sleep_max: Duration::from_micros(1000),
};

/// Default largest receive ring, chosen with `bench/sweep.sh` (see README): rings that
/// hold a whole 64-message window let sender and receiver run decoupled.
pub const DEFAULT_RING_SIZE: usize = 4 << 20;
/// Default size a receive ring starts with: a connection costs this much (and, on the
/// emulated fabric, only the pages it touched) until its traffic asks for more; the
/// ring then grows fourfold per stall up to the ring size (ARCHITECTURE.md, "Rings
/// that grow"). 16 KiB holds three 4 KiB messages, an all-to-all's round of them.
pub const DEFAULT_INITIAL_RING_SIZE: usize = 16 << 10;
/// Default idle time after which a grown ring shrinks back to its initial size.
pub const DEFAULT_RING_IDLE: Duration = Duration::from_secs(1);
/// Default largest packet (chosen by measurement, see README).
pub const DEFAULT_CHUNK_SIZE: usize = 64 << 10;
/// Default working set of the ring (chosen by measurement, see bench/README.md): the
/// sender starts over at the ring's offset 0 once past it whenever the receiver has
/// caught up, so the lines both cores touch stay in their caches; the rest of the
/// ring is slack for a receiver that falls behind.
pub const DEFAULT_WORKING_SET: usize = 256 << 10;
/// Default [`Config::with_stream_backoff`]: 32 pauses, ~0.8 us on this project's
/// AMD EPYC (bench/README.md, "A receiver that only receives").
pub const DEFAULT_STREAM_BACKOFF: u32 = 32;
/// Largest stream backoff: 4096 pauses (~0.1 ms here), so that an empty `get` stays
/// a short call.
pub const MAX_STREAM_BACKOFF: u32 = 4096;
/// Default limit on setting up a connection by address (resolution, request, reply).
pub const DEFAULT_CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

impl Default for Config {
    fn default() -> Self {
        Config {
            ring_size: DEFAULT_RING_SIZE,
            initial_ring_size: DEFAULT_INITIAL_RING_SIZE,
            ring_idle: DEFAULT_RING_IDLE,
            chunk_size: DEFAULT_CHUNK_SIZE,
            working_set: DEFAULT_WORKING_SET,
            tail_threshold: None,
            max_inline: None,
            wait: DEFAULT_WAIT_POLICY,
            wait_set: false,
            stream_backoff: DEFAULT_STREAM_BACKOFF,
            zero_copy: ZeroCopyThresholds {
                alloc_mem: None,
                other: None,
            },
            zero_copy_push: None,
            rcache: CacheLimits::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
        }
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Parses `123`, `64k`, `1m`, `2g` (case-insensitive).
///
/// ```
/// assert_eq!(rdma_channel::config::parse_size("64k").unwrap(), 65536);
/// assert!(rdma_channel::config::parse_size("lots").is_err());
/// ```
///
/// # Errors
///
/// `InvalidInput` for anything else, or on overflow.
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
        .ok_or_else(|| bad(format!("not a size: {s:?} (expected e.g. 4096, 64k, 1m)")))
}

impl Config {
    /// Defaults overridden by the `RCH_*` environment variables.
    ///
    /// # Errors
    ///
    /// `InvalidInput` naming the variable when one is malformed or out of range.
    ///
    /// ```
    /// let cfg = rdma_channel::Config::from_env().unwrap();
    /// cfg.validate().unwrap();
    /// ```
    pub fn from_env() -> io::Result<Config> {
        let mut c = Config::default();
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let size = |name: &str, v: String| parse_size(&v).map_err(|e| bad(format!("{name}: {e}")));
        let num = |name: &str, v: String| {
            v.trim()
                .parse::<u64>()
                .map_err(|_| bad(format!("{name}: not a number: {v:?}")))
        };
        // Each variable is applied and validated on its own, so an error names the
        // variable that caused it.
        let check = |c: &Config, name: &str| c.validate().map_err(|e| bad(format!("{name}: {e}")));
        if let Some(v) = var("RCH_RING_SIZE") {
            c.ring_size = size("RCH_RING_SIZE", v)?;
            // A smaller ring may not hold the default chunk twice: shrink the chunk along
            // (an explicit RCH_CHUNK_SIZE is still checked below).
            if c.chunk_size > c.ring_size / 2 {
                c.chunk_size = (c.ring_size / 2).max(128);
            }
            check(&c, "RCH_RING_SIZE")?;
        }
        if let Some(v) = var("RCH_RING_INITIAL") {
            c.initial_ring_size = size("RCH_RING_INITIAL", v)?;
            check(&c, "RCH_RING_INITIAL")?;
        }
        if let Some(v) = var("RCH_RING_IDLE_MS") {
            c.ring_idle = Duration::from_millis(num("RCH_RING_IDLE_MS", v)?);
        }
        if let Some(v) = var("RCH_CHUNK_SIZE") {
            c.chunk_size = size("RCH_CHUNK_SIZE", v)?;
            check(&c, "RCH_CHUNK_SIZE")?;
        }
        if let Some(v) = var("RCH_WORKING_SET") {
            c.working_set = size("RCH_WORKING_SET", v)?;
            check(&c, "RCH_WORKING_SET")?;
        }
        if let Some(v) = var("RCH_TAIL_THRESHOLD") {
            c.tail_threshold = Some(size("RCH_TAIL_THRESHOLD", v)?);
            check(&c, "RCH_TAIL_THRESHOLD")?;
        }
        if let Some(v) = var("RCH_MAX_INLINE") {
            c.max_inline = Some(size("RCH_MAX_INLINE", v)?);
            check(&c, "RCH_MAX_INLINE")?;
        }
        if let Some(v) = var("RCH_SPIN") {
            c.wait.spin = num("RCH_SPIN", v)?.min(u32::MAX as u64) as u32;
            c.wait_set = true;
        }
        if let Some(v) = var("RCH_YIELD") {
            c.wait.yields = num("RCH_YIELD", v)?.min(u32::MAX as u64) as u32;
            c.wait_set = true;
        }
        if let Some(v) = var("RCH_SLEEP_MAX_US") {
            c.wait.sleep_max = Duration::from_micros(num("RCH_SLEEP_MAX_US", v)?);
            // One cap for the whole wait, as the default policy has: a short cap left
            // at the default would hold a raised sleep_max back for 2000 sleeps.
            c.wait.short_sleep_max = c.wait.sleep_max;
        }
        if let Some(v) = var("RCH_STREAM_BACKOFF") {
            c.stream_backoff = num("RCH_STREAM_BACKOFF", v)?.min(u32::MAX as u64) as u32;
            check(&c, "RCH_STREAM_BACKOFF")?;
        }
        let threshold = |name: &str, v: String| {
            if v.trim().eq_ignore_ascii_case("off") {
                Ok(usize::MAX)
            } else {
                size(name, v)
            }
        };
        if let Some(v) = var("RCH_ZCOPY_THRESHOLD") {
            c.zero_copy.alloc_mem = Some(threshold("RCH_ZCOPY_THRESHOLD", v)?);
            check(&c, "RCH_ZCOPY_THRESHOLD")?;
        }
        if let Some(v) = var("RCH_ZCOPY_PRIVATE_THRESHOLD") {
            c.zero_copy.other = Some(threshold("RCH_ZCOPY_PRIVATE_THRESHOLD", v)?);
            check(&c, "RCH_ZCOPY_PRIVATE_THRESHOLD")?;
        }
        if let Some(v) = var("RCH_ZCOPY_PUSH") {
            let pct = num("RCH_ZCOPY_PUSH", v)?;
            if pct > 100 {
                return Err(bad(format!(
                    "RCH_ZCOPY_PUSH: {pct} is not a percentage (0 ..= 100)"
                )));
            }
            c.zero_copy_push = Some(pct as u8);
        }
        if let Some(v) = var("RCH_RCACHE_ENTRIES") {
            c.rcache.max_entries = num("RCH_RCACHE_ENTRIES", v)?.min(usize::MAX as u64) as usize;
            check(&c, "RCH_RCACHE_ENTRIES")?;
        }
        if let Some(v) = var("RCH_RCACHE_BYTES") {
            c.rcache.max_bytes = size("RCH_RCACHE_BYTES", v)?;
            check(&c, "RCH_RCACHE_BYTES")?;
        }
        if let Some(v) = var("RCH_CONNECT_TIMEOUT_MS") {
            c.connect_timeout = Duration::from_millis(num("RCH_CONNECT_TIMEOUT_MS", v)?);
            check(&c, "RCH_CONNECT_TIMEOUT_MS")?;
        }
        Ok(c)
    }

    /// Sets the largest receive ring in bytes: rings start at the
    /// [initial size](Self::with_initial_ring_size) (or this, if smaller) and grow up
    /// to it.
    pub fn with_ring_size(mut self, bytes: usize) -> Self {
        self.ring_size = bytes;
        self
    }

    /// Sets the size a receive ring starts with; the [ring size](Self::with_ring_size)
    /// (or more) turns growing off, so the ring has that size from the start.
    ///
    /// ```
    /// use rdma_channel::Config;
    /// let cfg = Config::default().with_initial_ring_size(64 << 10);
    /// assert_eq!(cfg.initial_ring_size(), 64 << 10);
    /// // Never more than the ring size: a 4 KiB ring is 4 KiB from the start.
    /// assert_eq!(cfg.with_ring_size(4096).initial_ring_size(), 4096);
    /// ```
    pub fn with_initial_ring_size(mut self, bytes: usize) -> Self {
        self.initial_ring_size = bytes;
        self
    }

    /// Sets how long a grown ring must carry nothing before it shrinks back to its
    /// initial size.
    pub fn with_ring_idle(mut self, idle: Duration) -> Self {
        self.ring_idle = idle;
        self
    }

    /// Sets the largest packet in bytes (the pipelining unit of
    /// the MPICH2 RDMA Channel paper, seed 001, sec. 4.4).
    pub fn with_chunk_size(mut self, bytes: usize) -> Self {
        self.chunk_size = bytes;
        self
    }

    /// Sets the ring's working set: once the sender's position in the ring is past
    /// it and the receiver has consumed enough, the sender leaves the rest of the
    /// lap unused and continues at offset 0 (a `Wrap` packet), so that both cores
    /// keep touching the same, cached, lines. On the emulated fabric small packets
    /// wrap sooner, after room for two of them or 8 KiB ([`ring::lap_end`](crate::ring::lap_end)); the
    /// working set is the most. The ring size turns this off. The
    /// ring beyond the working set still holds bursts the receiver has not read.
    ///
    /// ```
    /// let cfg = rdma_channel::Config::default().with_working_set(64 << 10);
    /// cfg.validate().unwrap();
    /// assert_eq!(cfg.working_set(), 64 << 10);
    /// assert_eq!(cfg.tail_threshold(), 16 << 10); // follows the working set
    /// ```
    pub fn with_working_set(mut self, bytes: usize) -> Self {
        self.working_set = bytes;
        self
    }

    /// Sets how many consumed bytes the receiver accumulates before it sends an explicit
    /// tail update (seed 001 sec. 4.3's delayed update).
    pub fn with_tail_threshold(mut self, bytes: usize) -> Self {
        self.tail_threshold = Some(bytes);
        self
    }

    /// Sets the stream backoff: when a receiver that has received since it last sent
    /// (it is only receiving, as the far end of a stream or of a window of messages)
    /// finds its ring empty, it first spends `pauses` CPU pause instructions
    /// (`std::hint::spin_loop`) before it looks again, once per message that arrived.
    /// Polling the ring while the sender writes the next packet takes the cache lines
    /// it is writing away from it, packet after packet; waiting a moment lets it write
    /// several undisturbed. A receiver that replies (a ping-pong, a request and
    /// response) never waits, and an idle connection pays it once, after its last
    /// message. What it costs: a message that lands during the pause is seen up to
    /// that long later (32 pauses are ~0.8 us on the AMD EPYC this was measured on).
    /// 0 turns it off.
    ///
    /// ```
    /// let cfg = rdma_channel::Config::default().with_stream_backoff(0);
    /// assert_eq!(cfg.stream_backoff(), 0);
    /// assert!(rdma_channel::Config::default().with_stream_backoff(1 << 20).validate().is_err());
    /// ```
    pub fn with_stream_backoff(mut self, pauses: u32) -> Self {
        self.stream_backoff = pauses;
        self
    }

    /// Caps inline writes below the fabric's limit (larger packets go through the
    /// registered staging buffer of seed 001 sec. 4.2).
    pub fn with_max_inline(mut self, bytes: usize) -> Self {
        self.max_inline = Some(bytes);
        self
    }

    /// Sets the blocking-wait policy.
    pub fn with_wait_policy(mut self, policy: WaitPolicy) -> Self {
        self.wait = policy;
        self.wait_set = true;
        self
    }

    /// Sets the smallest buffer sent zero-copy when it lies in memory from
    /// [`alloc_mem`](crate::Channel::alloc_mem) (`usize::MAX` disables); `None` keeps the
    /// fabric's measured default.
    pub fn with_zero_copy_threshold(mut self, bytes: Option<usize>) -> Self {
        self.zero_copy.alloc_mem = bytes;
        self
    }

    /// Sets the smallest buffer in any other memory sent zero-copy (`usize::MAX`
    /// disables); `None` keeps the fabric's measured default.
    pub fn with_zero_copy_private_threshold(mut self, bytes: Option<usize>) -> Self {
        self.zero_copy.other = bytes;
        self
    }

    /// Sets the share, in percent, of each zero-copy transfer that the sender pushes
    /// with RDMA WRITE into the receiver's buffer while the receiver pulls the rest
    /// with RDMA READ (the receiver's setting decides); `None` keeps the fabric's
    /// default ([`Fabric::zero_copy_push_default`](crate::fabric::Fabric::zero_copy_push_default)).
    /// Values above 100 count as 100.
    ///
    /// ```
    /// let cfg = rdma_channel::Config::default().with_zero_copy_push(Some(50));
    /// assert_eq!(cfg.zero_copy_push(), Some(50));
    /// ```
    pub fn with_zero_copy_push(mut self, percent: Option<u8>) -> Self {
        self.zero_copy_push = percent.map(|p| p.min(100));
        self
    }

    /// The push share set by the user (`None`: the fabric's default).
    pub fn zero_copy_push(&self) -> Option<u8> {
        self.zero_copy_push
    }

    /// Bounds the registration cache of the connection's protection domain (the
    /// first connection of a domain decides them).
    pub fn with_registration_cache(mut self, limits: CacheLimits) -> Self {
        self.rcache = limits;
        self
    }

    /// Limit on setting up a connection: by address, address and route resolution,
    /// the request and its reply; over a Unix socket, the whole handshake, on both
    /// sides (`RCH_CONNECT_TIMEOUT_MS`, default 10 s).
    ///
    /// ```
    /// use std::time::Duration;
    /// let cfg = rdma_channel::Config::default().with_connect_timeout(Duration::from_secs(2));
    /// assert_eq!(cfg.connect_timeout(), Duration::from_secs(2));
    /// ```
    pub fn with_connect_timeout(mut self, limit: Duration) -> Self {
        self.connect_timeout = limit;
        self
    }

    /// The connect timeout in force.
    pub fn connect_timeout(&self) -> Duration {
        self.connect_timeout
    }

    /// Zero-copy thresholds set by the user (`None`: the fabric's default).
    pub fn zero_copy_thresholds(&self) -> ZeroCopyThresholds<Option<usize>> {
        self.zero_copy
    }

    /// Registration cache bounds.
    pub fn registration_cache(&self) -> CacheLimits {
        self.rcache
    }

    /// Largest receive ring in bytes.
    pub fn ring_size(&self) -> usize {
        self.ring_size
    }

    /// Size a receive ring starts with (at most [`ring_size`](Self::ring_size)).
    pub fn initial_ring_size(&self) -> usize {
        self.initial_ring_size.min(self.ring_size)
    }

    /// Idle time after which a grown ring shrinks back.
    pub fn ring_idle(&self) -> Duration {
        self.ring_idle
    }

    /// Largest packet into a ring of `ring` bytes: the chunk size, at most half the
    /// ring, so two packets are always in flight.
    ///
    /// ```
    /// let cfg = rdma_channel::Config::default();
    /// assert_eq!(cfg.chunk_for(16 << 10), 8 << 10);
    /// assert_eq!(cfg.chunk_for(4 << 20), cfg.chunk_size() as u64);
    /// ```
    pub fn chunk_for(&self, ring: u64) -> u64 {
        (self.chunk_size as u64).min(ring / 2)
    }

    /// The working set of a ring of `ring` bytes: the configured one (the ring itself
    /// when early wraps are off: a working set of the ring size or more); in a ring
    /// that is still growing, at most half of it, so that its traffic still starts
    /// over at offset 0 while the rest is slack, as in the largest ring.
    ///
    /// ```
    /// let cfg = rdma_channel::Config::default();
    /// assert_eq!(cfg.working_set_for(4 << 20), 256 << 10);
    /// assert_eq!(cfg.working_set_for(16 << 10), 8 << 10);
    /// let off = cfg.with_working_set(4 << 20);
    /// assert_eq!(off.working_set_for(16 << 10), 16 << 10);
    /// ```
    pub fn working_set_for(&self, ring: u64) -> u64 {
        let ws = self.working_set as u64;
        let most = self.ring_size as u64;
        if ws >= most || ring >= most {
            ws.min(ring)
        } else {
            ws.min(ring / 2)
        }
    }

    /// The tail update threshold of a ring of `ring` bytes: a set threshold (at most
    /// the ring less one cell, so a stalled sender is always answered), else a quarter
    /// of the ring's working set.
    pub fn tail_threshold_for(&self, ring: u64) -> u64 {
        match self.tail_threshold {
            Some(t) => (t as u64).min(ring - 64).max(1),
            None => (self.working_set_for(ring) / 4).max(64),
        }
    }

    /// Largest packet in bytes.
    pub fn chunk_size(&self) -> usize {
        self.chunk_size
    }

    /// The ring's working set in bytes (the ring size when it is off).
    pub fn working_set(&self) -> usize {
        self.working_set.min(self.ring_size)
    }

    /// Explicit tail update threshold in bytes. By default a quarter of the working
    /// set (or of the ring, if smaller): the sender can only start over at offset 0
    /// when it knows the receiver caught up, so it must hear of the tail well within
    /// one working set.
    pub fn tail_threshold(&self) -> usize {
        self.tail_threshold
            .unwrap_or((self.ring_size / 4).min(self.working_set() / 4).max(64))
    }

    /// Inline cap set by the user, if any.
    pub fn max_inline(&self) -> Option<usize> {
        self.max_inline
    }

    /// Pause instructions of the stream backoff (see
    /// [`with_stream_backoff`](Self::with_stream_backoff)).
    pub fn stream_backoff(&self) -> u32 {
        self.stream_backoff
    }

    /// The wait policy in force.
    pub fn wait_policy(&self) -> WaitPolicy {
        self.wait
    }

    /// True when the spin or yield count was chosen (RCH_SPIN, RCH_YIELD or
    /// [`with_wait_policy`](Self::with_wait_policy)) rather than left at its default.
    pub fn wait_policy_is_set(&self) -> bool {
        self.wait_set
    }

    /// Checks the values are usable together.
    ///
    /// # Errors
    ///
    /// `InvalidInput` with the reason.
    ///
    /// ```
    /// use rdma_channel::Config;
    /// assert!(Config::default().with_ring_size(5000).validate().is_err());
    /// assert!(Config::default().with_ring_size(4096).with_chunk_size(4096).validate().is_err());
    /// ```
    pub fn validate(&self) -> io::Result<()> {
        let r = self.ring_size;
        if !r.is_power_of_two() || !(4096..=1 << 30).contains(&r) {
            return Err(bad(format!(
                "ring size {r} must be a power of two from 4 KiB to 1 GiB"
            )));
        }
        let i = self.initial_ring_size;
        if !i.is_power_of_two() || i < 4096 {
            return Err(bad(format!(
                "initial ring size {i} must be a power of two of at least 4 KiB"
            )));
        }
        let c = self.chunk_size;
        if c % 64 != 0 || c < 128 || c > r / 2 || c > crate::ring::wire::MAX_PAYLOAD {
            return Err(bad(format!(
                "chunk size {c} must be a multiple of 64 from 128 to half the ring ({})",
                r / 2
            )));
        }
        let w = self.working_set;
        if w % 64 != 0 || w == 0 {
            return Err(bad(format!(
                "working set {w} must be a positive multiple of 64"
            )));
        }
        let t = self.tail_threshold();
        if t == 0 || t > r - 64 {
            return Err(bad(format!(
                "tail threshold {t} must be from 1 to ring size - 64"
            )));
        }
        if self.stream_backoff > MAX_STREAM_BACKOFF {
            return Err(bad(format!(
                "stream backoff of {} pauses is more than {MAX_STREAM_BACKOFF}",
                self.stream_backoff
            )));
        }
        if let Some(i) = self.max_inline {
            if i < 64 {
                return Err(bad(format!("max inline {i} must be at least 64")));
            }
        }
        for t in [self.zero_copy.alloc_mem, self.zero_copy.other]
            .into_iter()
            .flatten()
        {
            if t == 0 {
                return Err(bad(
                    "zero-copy threshold must be at least 1 byte (or off)".into()
                ));
            }
        }
        if self.rcache.max_entries == 0 || self.rcache.max_bytes == 0 {
            return Err(bad(
                "registration cache bounds must be at least 1 entry and 1 byte".into(),
            ));
        }
        if self.connect_timeout.is_zero() {
            return Err(bad("the connect timeout must be positive".into()));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        Config::default().validate().unwrap();
    }

    #[test]
    fn threshold_must_leave_room_for_progress() {
        assert!(Config::default()
            .with_ring_size(4096)
            .with_chunk_size(1024)
            .with_tail_threshold(4096)
            .validate()
            .is_err());
        assert!(Config::default()
            .with_ring_size(4096)
            .with_chunk_size(1024)
            .with_tail_threshold(4032)
            .validate()
            .is_ok());
    }

    #[test]
    fn sizes_parse_with_suffixes() {
        assert_eq!(parse_size("4096").unwrap(), 4096);
        assert_eq!(parse_size(" 1M ").unwrap(), 1 << 20);
        assert_eq!(parse_size("2g").unwrap(), 2 << 30);
        assert!(parse_size("").is_err());
        assert!(parse_size("99999999999999999999g").is_err());
    }
}
