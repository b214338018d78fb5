//! Tunables of a connection: ring and chunk sizes, the tail-update threshold and the
//! blocking-wait policy. Set them with the builder methods or environment variables;
//! [`Config::from_env`] starts from the defaults and applies the variables.
//!
//! The variables `from_env` applies (`RCH_RING_SIZE`, `RCH_CHUNK_SIZE`, ... each named
//! after the builder method it overrides) are listed with their defaults in
//! [`crate::settings`], the one module that reads the environment, and in the
//! README's table, which a test keeps equal to that list. `RCH_FABRIC` is read by
//! [`AnyFabric::from_env`](crate::fabric::AnyFabric::from_env), not here: it picks
//! the fabric, not a tunable of the connection. Under oversubscription a process
//! group lowers the wait's defaults (`RCH_SPIN`, `RCH_YIELD`) unless they are set;
//! a connection over a software RDMA device in a one-CPU process sleeps at most 5 us
//! for a wait's first [`SHORT_SLEEPS`] sleeps.
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

mod rails;
pub use rails::{RailSpec, StripePolicy, DEFAULT_ALPHA_PERCENT, MAX_RAILS};

/// Zero-copy thresholds per kind of memory, because the cost of the peer's read is:
/// `alloc_mem` is memory from [`Fabric::alloc_region`](crate::fabric::Fabric::alloc_region) (on the emulated fabric a
/// shared segment, read with a plain copy), `other` any other memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct ZeroCopyThresholds<T = usize> {
    /// Smallest buffer from `alloc_mem` memory sent zero-copy.
    pub alloc_mem: T,
    /// Smallest buffer in any other memory sent zero-copy.
    pub other: T,
}

/// Bounds on what a [`RegCache`](crate::rcache::RegCache) keeps registered for reuse. Registrations in use and
/// memory from [`RegCache::alloc`](crate::rcache::RegCache::alloc) are not counted: the first cannot be dropped, the
/// second is the user's explicit memory.
///
/// ```
/// let l = rdma_channel::rcache::CacheLimits::default();
/// assert_eq!((l.max_entries, l.max_bytes), (512, 1 << 30));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CacheLimits {
    /// Most cached registrations (kept well below the emulated fabric's 8192-entry
    /// registration table, which every connection of a domain shares).
    pub max_entries: usize,
    /// Most bytes of cached registrations (pinned memory, on verbs).
    pub max_bytes: usize,
}

impl Default for CacheLimits {
    fn default() -> CacheLimits {
        CacheLimits {
            max_entries: 512,
            max_bytes: 1 << 30,
        }
    }
}

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
    zero_copy_adaptive: Option<usize>,
    /// Unset `zero_copy_adaptive` means the fabric's default (a process group's
    /// connections) rather than off.
    pub(crate) zero_copy_adaptive_by_default: bool,
    /// A process group whose ranks on this host outnumber its CPUs, with no path
    /// policy chosen: an unset private threshold means the fabric's
    /// [`zero_copy_outnumbered_default`](crate::fabric::Fabric::zero_copy_outnumbered_default).
    pub(crate) zero_copy_outnumbered: bool,
    rcache: CacheLimits,
    connect_timeout: Duration,
    /// The rails of a connection (empty: one, the fabric's default queue pair).
    rails: Vec<RailSpec>,
    stripe: StripePolicy,
    stripe_min: usize,
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
/// Default working set of the ring (chosen by measurement, see bench/notebook/2026-11.md): the
/// sender starts over at the ring's offset 0 once past it whenever the receiver has
/// caught up, so the lines both cores touch stay in their caches; the rest of the
/// ring is slack for a receiver that falls behind.
pub const DEFAULT_WORKING_SET: usize = 256 << 10;
/// Default [`Config::with_stream_backoff`]: 32 pauses, ~0.8 us on this project's
/// AMD EPYC (bench/notebook/2026-11.md, "A receiver that only receives").
pub const DEFAULT_STREAM_BACKOFF: u32 = 32;
/// Largest stream backoff: 4096 pauses (~0.1 ms here), so that an empty `get` stays
/// a short call.
pub const MAX_STREAM_BACKOFF: u32 = 4096;
/// Default [`Config::with_stripe_min`]: zero-copy steps from 64 KiB are striped
/// across the rails (below it a stripe's round trip outweighs what a second rail
/// adds).
pub const DEFAULT_STRIPE_MIN: usize = 64 << 10;
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
            zero_copy_adaptive: None,
            zero_copy_adaptive_by_default: false,
            zero_copy_outnumbered: false,
            rcache: CacheLimits::default(),
            connect_timeout: DEFAULT_CONNECT_TIMEOUT,
            rails: Vec::new(),
            stripe: StripePolicy::default(),
            stripe_min: DEFAULT_STRIPE_MIN,
        }
    }
}

fn bad(msg: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, msg)
}

/// Parses `123`, `64k`, `1m`, `2g` (case-insensitive); kept here for callers of
/// `config::parse_size`, and shared with every variable by [`crate::settings`].
pub use crate::settings::parse_size;

/// Largest payload a packet's header can describe (its 24-bit length field): the
/// bound on the chunk size. `ring::wire` asserts it equals its `MAX_PAYLOAD`.
pub(crate) const MAX_CHUNK_PAYLOAD: usize = (1 << 24) - 1;

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
        use crate::settings as env;
        let mut c = Config::default();
        // Each variable is applied and validated on its own, so an error names the
        // variable that caused it.
        let check = |c: &Config, name: &str| c.validate().map_err(|e| bad(format!("{name}: {e}")));
        let threshold = |s: &env::Setting| -> io::Result<Option<usize>> {
            match s.value()? {
                Some(v) if v.trim().eq_ignore_ascii_case("off") => Ok(Some(usize::MAX)),
                _ => s.size(),
            }
        };
        let count = |n: u64| n.min(u32::MAX as u64) as u32;
        if let Some(v) = env::RING_SIZE.size()? {
            c.ring_size = v;
            // A smaller ring may not hold the default chunk twice: shrink the chunk along
            // (an explicit RCH_CHUNK_SIZE is still checked below).
            if c.chunk_size > c.ring_size / 2 {
                c.chunk_size = (c.ring_size / 2).max(128);
            }
            check(&c, env::RING_SIZE.name())?;
        }
        if let Some(v) = env::RING_INITIAL.size()? {
            c.initial_ring_size = v;
            check(&c, env::RING_INITIAL.name())?;
        }
        if let Some(v) = env::RING_IDLE_MS.number()? {
            c.ring_idle = Duration::from_millis(v);
        }
        if let Some(v) = env::CHUNK_SIZE.size()? {
            c.chunk_size = v;
            check(&c, env::CHUNK_SIZE.name())?;
        }
        if let Some(v) = env::WORKING_SET.size()? {
            c.working_set = v;
            check(&c, env::WORKING_SET.name())?;
        }
        if let Some(v) = env::TAIL_THRESHOLD.size()? {
            c.tail_threshold = Some(v);
            check(&c, env::TAIL_THRESHOLD.name())?;
        }
        if let Some(v) = env::MAX_INLINE.size()? {
            c.max_inline = Some(v);
            check(&c, env::MAX_INLINE.name())?;
        }
        if let Some(v) = env::SPIN.number()? {
            c.wait.spin = count(v);
            c.wait_set = true;
        }
        if let Some(v) = env::YIELD.number()? {
            c.wait.yields = count(v);
            c.wait_set = true;
        }
        if let Some(v) = env::SLEEP_MAX_US.number()? {
            c.wait.sleep_max = Duration::from_micros(v);
            // One cap for the whole wait, as the default policy has: a short cap left
            // at the default would hold a raised sleep_max back for 2000 sleeps.
            c.wait.short_sleep_max = c.wait.sleep_max;
        }
        if let Some(v) = env::STREAM_BACKOFF.number()? {
            c.stream_backoff = count(v);
            check(&c, env::STREAM_BACKOFF.name())?;
        }
        if let Some(v) = threshold(&env::ZCOPY_THRESHOLD)? {
            c.zero_copy.alloc_mem = Some(v);
            check(&c, env::ZCOPY_THRESHOLD.name())?;
        }
        if let Some(v) = threshold(&env::ZCOPY_PRIVATE_THRESHOLD)? {
            c.zero_copy.other = Some(v);
            check(&c, env::ZCOPY_PRIVATE_THRESHOLD.name())?;
        }
        if let Some(v) = threshold(&env::ZCOPY_ADAPTIVE)? {
            c.zero_copy_adaptive = Some(v.max(1));
        }
        if let Some(pct) = env::ZCOPY_PUSH.number::<u64>()? {
            if pct > 100 {
                return Err(bad(format!(
                    "RCH_ZCOPY_PUSH: {pct} is not a percentage (0 ..= 100)"
                )));
            }
            c.zero_copy_push = Some(pct as u8);
        }
        if let Some(v) = env::RCACHE_ENTRIES.number::<u64>()? {
            c.rcache.max_entries = v.min(usize::MAX as u64) as usize;
            check(&c, env::RCACHE_ENTRIES.name())?;
        }
        if let Some(v) = env::RCACHE_BYTES.size()? {
            c.rcache.max_bytes = v;
            check(&c, env::RCACHE_BYTES.name())?;
        }
        if let Some(v) = env::CONNECT_TIMEOUT_MS.number()? {
            c.connect_timeout = Duration::from_millis(v);
            check(&c, env::CONNECT_TIMEOUT_MS.name())?;
        }
        if let Some(v) = env::RAILS.value()? {
            c.rails = RailSpec::parse_list(&v).map_err(|e| bad(format!("RCH_RAILS: {e}")))?;
            check(&c, env::RAILS.name())?;
        }
        if let Some(v) = env::STRIPE.value()? {
            c.stripe = v.parse().map_err(|e| bad(format!("RCH_STRIPE: {e}")))?;
            check(&c, env::STRIPE.name())?;
        }
        if let Some(v) = env::STRIPE_MIN.size()? {
            c.stripe_min = v;
            check(&c, env::STRIPE_MIN.name())?;
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

    /// Sets the smallest buffer in memory other than `alloc_mem`'s (below the
    /// private threshold) that goes by whichever path the receiver measures cheaper,
    /// the ring or zero-copy: the receiver times its copies on both and tells the
    /// sender (see ARCHITECTURE.md, "Zero-copy"). `usize::MAX` turns the choice off;
    /// `None` (the default) leaves it off for channels and streams, and lets a
    /// process group (the C library) use the fabric's
    /// [`zero_copy_adaptive_default`](crate::fabric::Fabric::zero_copy_adaptive_default).
    /// Only [`put_nocopy`](crate::Sender::put_nocopy) sends zero-copy, so only its
    /// buffers are concerned.
    ///
    /// ```
    /// let cfg = rdma_channel::Config::default().with_zero_copy_adaptive(Some(1 << 20));
    /// assert_eq!(cfg.zero_copy_adaptive(), Some(1 << 20));
    /// ```
    pub fn with_zero_copy_adaptive(mut self, bytes: Option<usize>) -> Self {
        self.zero_copy_adaptive = bytes.map(|b| b.max(1));
        self
    }

    /// The adaptive choice's smallest buffer as set (`None`: not set).
    pub fn zero_copy_adaptive(&self) -> Option<usize> {
        self.zero_copy_adaptive
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

    /// Sets the connection's rails (seed 002's subchannels; see [`RailSpec`]): one
    /// queue pair each, rail 0 carrying the ring and small messages, and zero-copy
    /// steps of at least [`stripe_min`](Self::stripe_min) bytes read in stripes across
    /// all of them (`RCH_RAILS`). Both ends must ask for rails: a connection uses as
    /// many as the end with fewer has. An empty list, or one plain rail, is the
    /// default single queue pair.
    ///
    /// ```
    /// use rdma_channel::config::{Config, RailSpec};
    /// let cfg = Config::default().with_rails(RailSpec::parse_list("@400m,@100m")?);
    /// assert_eq!(cfg.rails().len(), 2);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn with_rails(mut self, rails: Vec<RailSpec>) -> Self {
        self.rails = rails;
        self
    }

    /// The rails asked for (empty: the default single queue pair).
    pub fn rails(&self) -> &[RailSpec] {
        &self.rails
    }

    /// Sets how striped steps are split across the rails (`RCH_STRIPE`; default
    /// adaptive from equal weights).
    pub fn with_stripe_policy(mut self, policy: StripePolicy) -> Self {
        self.stripe = policy;
        self
    }

    /// The striping policy.
    pub fn stripe_policy(&self) -> &StripePolicy {
        &self.stripe
    }

    /// Sets the smallest zero-copy step striped across the rails (`RCH_STRIPE_MIN`,
    /// default 64 KiB); with more than one rail, buffers this large go zero-copy
    /// unless a zero-copy threshold was set.
    pub fn with_stripe_min(mut self, bytes: usize) -> Self {
        self.stripe_min = bytes;
        self
    }

    /// The smallest zero-copy step striped across the rails.
    pub fn stripe_min(&self) -> usize {
        self.stripe_min
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
        if c % 64 != 0 || c < 128 || c > r / 2 || c > MAX_CHUNK_PAYLOAD {
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
        if self.rails.len() > MAX_RAILS {
            return Err(bad(format!(
                "{} rails: at most {MAX_RAILS}",
                self.rails.len()
            )));
        }
        match &self.stripe {
            StripePolicy::Adaptive { alpha_percent } if !(1..=100).contains(alpha_percent) => {
                return Err(bad(format!(
                    "adaptive striping's alpha {alpha_percent} must be from 1 to 100 percent"
                )));
            }
            StripePolicy::Weights(w)
                if w.is_empty() || w.len() > MAX_RAILS || w.iter().all(|&x| x == 0) =>
            {
                return Err(bad(format!(
                    "stripe weights {w:?}: 1 to {MAX_RAILS} of them, not all 0"
                )));
            }
            _ => {}
        }
        if self.stripe_min < 4096 {
            return Err(bad(format!(
                "smallest striped step {} must be at least 4 KiB",
                self.stripe_min
            )));
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
