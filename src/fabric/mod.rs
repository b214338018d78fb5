//! The fabric layer: what the channel needs from an RDMA network, and nothing more.
//!
//! The vocabulary is that of InfiniBand verbs so that a verbs implementation slots in
//! beside the emulated one without the engine noticing:
//!
//! * a [`Fabric`] is a protection domain: it registers memory and creates queue pairs;
//! * a [`MemoryRegion`] is registered memory with a local key, a remote key and
//!   [`Access`] rights; dropping it deregisters it;
//! * a [`QueuePair`] is one end of a reliable connection. It executes one-sided
//!   [`WorkRequest`]s (RDMA WRITE with a gather list, RDMA READ with a scatter list)
//!   against a peer's `(remote address, remote key)` and reports [`Completion`]s;
//! * errors arrive as completions with a non-success [`CompletionStatus`]; after the
//!   first one the queue pair is in the error state and flushes everything after it,
//!   as an RC queue pair does.
//!
//! Guarantees every fabric gives (and the only ones the ring relies on):
//!
//! 1. writes posted on one queue pair are placed in the peer's memory in posting order;
//! 2. within one write, the last aligned 8-byte word of the target range becomes
//!    visible only after every byte before it (seed 000 sec. 4.2, Liu, Wu, Panda,
//!    ICS 2003, relies on the same
//!    in-order placement of InfiniBand hardware);
//! 3. an 8-byte aligned word is never seen torn.
//!
//! Two fabrics implement the traits: [`emulated::EmuFabric`] (shared memory) and, with
//! the `verbs` feature, `verbs::VerbsFabric` (libibverbs). [`AnyFabric`] is either one,
//! chosen at run time by `RCH_FABRIC` (see [`any`]).

pub mod any;
pub mod emulated;
mod gather;
#[cfg(feature = "verbs")]
pub mod verbs;

pub use any::{AnyFabric, FabricKind};
pub use gather::GatherList;

use std::fmt;
use std::io;
use std::os::fd::OwnedFd;

/// Access rights of a registered region, as `ibv_access_flags`.
///
/// ```
/// use rdma_channel::fabric::Access;
/// let a = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
/// assert!(a.contains(Access::REMOTE_WRITE));
/// assert!(!a.contains(Access::REMOTE_READ));
/// ```
#[derive(Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Access(u32);

impl Access {
    /// No rights beyond local read (which every registration has).
    pub const NONE: Access = Access(0);
    /// The local side may write into the region (target of an RDMA READ).
    pub const LOCAL_WRITE: Access = Access(1);
    /// The peer may RDMA WRITE into the region.
    pub const REMOTE_WRITE: Access = Access(2);
    /// The peer may RDMA READ from the region.
    pub const REMOTE_READ: Access = Access(4);

    /// The raw bits.
    ///
    /// ```
    /// assert_eq!(rdma_channel::fabric::Access::REMOTE_READ.bits(), 4);
    /// ```
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Rebuilds rights from bits, ignoring unknown ones.
    ///
    /// ```
    /// use rdma_channel::fabric::Access;
    /// assert_eq!(Access::from_bits_truncate(0xff), Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ);
    /// ```
    pub const fn from_bits_truncate(bits: u32) -> Access {
        Access(bits & 7)
    }

    /// True when every right in `other` is also in `self`.
    ///
    /// ```
    /// use rdma_channel::fabric::Access;
    /// assert!((Access::REMOTE_READ | Access::REMOTE_WRITE).contains(Access::REMOTE_READ));
    /// ```
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }
}

impl std::ops::BitOr for Access {
    type Output = Access;
    fn bitor(self, rhs: Access) -> Access {
        Access(self.0 | rhs.0)
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut names = Vec::new();
        if self.contains(Access::LOCAL_WRITE) {
            names.push("LOCAL_WRITE");
        }
        if self.contains(Access::REMOTE_WRITE) {
            names.push("REMOTE_WRITE");
        }
        if self.contains(Access::REMOTE_READ) {
            names.push("REMOTE_READ");
        }
        write!(f, "Access({})", names.join("|"))
    }
}

/// What a peer needs to address a region: its address in the owner's address space,
/// its length and its remote key. This is what travels in control packets and cards.
///
/// ```
/// use rdma_channel::fabric::RemoteRegion;
/// let r = RemoteRegion { addr: 0x1000, len: 64, rkey: 7 };
/// assert!(r.contains(0x1000, 64));
/// assert!(!r.contains(0x1001, 64));
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct RemoteRegion {
    /// Start address in the owner's address space.
    pub addr: u64,
    /// Length in bytes.
    pub len: u64,
    /// Remote key that grants access.
    pub rkey: u32,
}

/// Where a peer's registered region lies in this process, on a fabric whose writes
/// are plain stores into a mapping of the peer's memory (see
/// [`QueuePair::direct_target`]): what the send lane writes through.
#[derive(Clone, Copy, Debug)]
pub struct DirectTarget {
    /// The region's first byte in our mapping of the peer's memory, which stays
    /// mapped while the queue pair lives.
    pub base: *mut u8,
    /// The peer's count of changes to its registrations: while it reads `seen`, the
    /// region is still registered (a write after a change could land in memory the
    /// peer has given to something else).
    pub changes: *const std::sync::atomic::AtomicU64,
    /// Its value when `base` was checked.
    pub seen: u64,
}

// SAFETY: the pointers are addresses in mappings that live as long as the queue pair
// that gave them (which is Send and Sync); any thread may hold them, and writes
// through them follow the fabric's rules whichever thread makes them.
unsafe impl Send for DirectTarget {}
// SAFETY: as for Send: the struct itself is only copied.
unsafe impl Sync for DirectTarget {}

impl RemoteRegion {
    /// True when `[addr, addr + len)` lies inside the region (overflow counts as outside).
    ///
    /// ```
    /// use rdma_channel::fabric::RemoteRegion;
    /// let r = RemoteRegion { addr: u64::MAX - 8, len: 8, rkey: 1 };
    /// assert!(!r.contains(u64::MAX - 4, 8));
    /// ```
    pub fn contains(&self, addr: u64, len: u64) -> bool {
        match (addr.checked_sub(self.addr), addr.checked_add(len)) {
            (Some(_), Some(end)) => end <= self.addr.saturating_add(self.len),
            _ => false,
        }
    }

    /// Serialises to 20 little-endian bytes (addr, len, rkey).
    ///
    /// ```
    /// use rdma_channel::fabric::RemoteRegion;
    /// let r = RemoteRegion { addr: 1, len: 2, rkey: 3 };
    /// assert_eq!(RemoteRegion::from_bytes(&r.to_bytes()), Some(r));
    /// ```
    pub fn to_bytes(&self) -> [u8; 20] {
        let mut b = [0u8; 20];
        b[0..8].copy_from_slice(&self.addr.to_le_bytes());
        b[8..16].copy_from_slice(&self.len.to_le_bytes());
        b[16..20].copy_from_slice(&self.rkey.to_le_bytes());
        b
    }

    /// Parses what [`to_bytes`](Self::to_bytes) wrote; `None` if `b` is shorter than 20 bytes.
    ///
    /// ```
    /// assert_eq!(rdma_channel::fabric::RemoteRegion::from_bytes(&[0; 3]), None);
    /// ```
    pub fn from_bytes(b: &[u8]) -> Option<RemoteRegion> {
        if b.len() < 20 {
            return None;
        }
        Some(RemoteRegion {
            addr: u64::from_le_bytes(b[0..8].try_into().ok()?),
            len: u64::from_le_bytes(b[8..16].try_into().ok()?),
            rkey: u32::from_le_bytes(b[16..20].try_into().ok()?),
        })
    }
}

/// Registered memory. Dropping the value deregisters the region; once `drop` returns
/// no remote operation can reach it under its old keys.
pub trait MemoryRegion: Send + Sync {
    /// Start address (in this process).
    fn addr(&self) -> *mut u8;
    /// Length in bytes.
    fn len(&self) -> usize;
    /// True for a zero-length region.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// Key that local work requests use to name this memory in a gather/scatter list.
    fn lkey(&self) -> u32;
    /// Key a peer presents to access this memory.
    fn rkey(&self) -> u32;
    /// Rights granted at registration.
    fn access(&self) -> Access;
    /// Backs the whole region with memory now, in one pass, instead of page by page
    /// as it is first touched: for memory that is about to be written through (a
    /// receive ring that grew because its traffic filled the last one). Best effort;
    /// the contents do not change. The default does nothing: memory registered with
    /// an RDMA device is resident already (registration pins it).
    fn make_resident(&self) {}
    /// The triple a peer needs to address this region.
    fn remote(&self) -> RemoteRegion {
        RemoteRegion {
            addr: self.addr() as u64,
            len: self.len() as u64,
            rkey: self.rkey(),
        }
    }
}

/// One entry of a gather (write) or scatter (read) list: local memory and its key.
#[derive(Clone, Copy, Debug)]
pub struct Sge {
    /// Local address.
    pub addr: *mut u8,
    /// Length in bytes.
    pub len: u32,
    /// Local key of the region the memory lies in. Ignored for inline writes.
    pub lkey: u32,
}

impl Sge {
    /// Describes `buf` under local key `lkey`. The entry borrows nothing: keeping `buf`
    /// valid until the request completes is the poster's promise (see
    /// [`QueuePair::post`]).
    ///
    /// ```
    /// let mut buf = [0u8; 16];
    /// let sge = rdma_channel::fabric::Sge::from_slice(&mut buf, 7);
    /// assert_eq!((sge.len, sge.lkey), (16, 7));
    /// ```
    pub fn from_slice(buf: &mut [u8], lkey: u32) -> Sge {
        Sge {
            addr: buf.as_mut_ptr(),
            len: buf.len() as u32,
            lkey,
        }
    }
}

// SAFETY: an Sge is a plain description of memory; whoever posts it promises validity.
unsafe impl Send for Sge {}
// SAFETY: as above, the struct itself holds no shared state.
unsafe impl Sync for Sge {}

/// The operation of a work request.
#[derive(Clone, Copy, Debug)]
pub enum Opcode<'a> {
    /// RDMA WRITE: gather `local` and place it at `remote_addr` in the peer's memory.
    Write {
        /// Gather list.
        local: &'a [Sge],
        /// Target address in the peer's address space.
        remote_addr: u64,
        /// Target region's remote key.
        rkey: u32,
        /// Copy the gather list at post time (`IBV_SEND_INLINE`): the memory needs no
        /// registration and may be reused as soon as `post` returns. Limited to
        /// [`Caps::max_inline`] bytes.
        inline: bool,
    },
    /// RDMA READ: fetch `remote_addr..` from the peer and scatter it into `local`.
    Read {
        /// Scatter list (must lie in regions registered with [`Access::LOCAL_WRITE`]).
        local: &'a [Sge],
        /// Source address in the peer's address space.
        remote_addr: u64,
        /// Source region's remote key.
        rkey: u32,
    },
}

/// A work request for the send queue.
#[derive(Clone, Copy, Debug)]
pub struct WorkRequest<'a> {
    /// Returned in the completion.
    pub wr_id: u64,
    /// What to do.
    pub opcode: Opcode<'a>,
    /// Generate a completion on success (errors always generate one). A successful
    /// signalled completion also retires every unsignalled request posted before it.
    pub signaled: bool,
}

impl WorkRequest<'_> {
    /// Bytes the request moves (the sum of its gather or scatter list).
    pub fn bytes(&self) -> u64 {
        let local = match self.opcode {
            Opcode::Write { local, .. } | Opcode::Read { local, .. } => local,
        };
        local.iter().map(|s| u64::from(s.len)).sum()
    }
}

/// Outcome of a work request, as `ibv_wc_status`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletionStatus {
    /// Done.
    Success,
    /// A local gather/scatter entry was not inside a registered region with the needed
    /// rights (`IBV_WC_LOC_PROT_ERR`).
    LocalProtectionError,
    /// The peer refused the access: bad key, out of bounds or missing right
    /// (`IBV_WC_REM_ACCESS_ERR`).
    RemoteAccessError,
    /// The request was malformed (too many entries, inline too long, ...).
    LocalLengthError,
    /// The peer is gone or unreachable (`IBV_WC_RETRY_EXC_ERR` on hardware).
    TransportError,
    /// Flushed because the queue pair was already in the error state.
    Flushed,
}

impl CompletionStatus {
    /// True for [`CompletionStatus::Success`].
    ///
    /// ```
    /// assert!(rdma_channel::fabric::CompletionStatus::Success.is_ok());
    /// ```
    pub fn is_ok(self) -> bool {
        self == CompletionStatus::Success
    }
}

/// Which operation a completion belongs to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompletedOp {
    /// An RDMA WRITE.
    Write,
    /// An RDMA READ.
    Read,
}

/// A completion queue entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Completion {
    /// The request's `wr_id`.
    pub wr_id: u64,
    /// Success or the error.
    pub status: CompletionStatus,
    /// The operation.
    pub op: CompletedOp,
    /// Bytes moved (meaningful on success).
    pub byte_len: u64,
}

/// Limits of a fabric, queried once at setup.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Caps {
    /// Longest inline write in bytes.
    pub max_inline: usize,
    /// Most entries in one gather or scatter list.
    pub max_sge: usize,
    /// Send queue depth: requests posted and not yet retired by a signalled completion.
    /// `usize::MAX` means requests retire as soon as they are posted.
    pub max_send_wr: usize,
    /// RDMA READs one queue pair may have in flight.
    pub max_rd_atomic: usize,
}

/// State of a queue pair, as the subset of `ibv_qp_state` the channel sees.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QpState {
    /// Connected and usable (`IBV_QPS_RTS`).
    ReadyToSend,
    /// A request failed or the peer vanished; every later request is flushed.
    Error,
}

/// Errors of fabric calls that fail synchronously (posting, registration, setup).
#[derive(Debug)]
pub enum FabricError {
    /// The send queue is full: poll completions and retry.
    QueueFull,
    /// A request violates the fabric's limits (`what` says which).
    InvalidRequest(&'static str),
    /// Any other failure, with the operating-system error where there is one.
    Io(io::Error),
}

impl fmt::Display for FabricError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FabricError::QueueFull => write!(f, "send queue full"),
            FabricError::InvalidRequest(what) => write!(f, "invalid work request: {what}"),
            FabricError::Io(e) => write!(f, "{e}"),
        }
    }
}

impl std::error::Error for FabricError {}

impl From<io::Error> for FabricError {
    fn from(e: io::Error) -> Self {
        FabricError::Io(e)
    }
}

impl From<FabricError> for io::Error {
    fn from(e: FabricError) -> io::Error {
        match e {
            FabricError::Io(e) => e,
            FabricError::QueueFull => io::Error::new(io::ErrorKind::WouldBlock, "send queue full"),
            FabricError::InvalidRequest(w) => io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("invalid work request: {w}"),
            ),
        }
    }
}

/// One end of a reliable connection.
pub trait QueuePair: Send + Sync {
    /// Posts a work request to the send queue.
    ///
    /// # Safety
    ///
    /// For a non-inline write or a read, every [`Sge`] must describe memory that stays
    /// valid (and, for reads, unaliased) until the request's completion, or a later
    /// signalled completion, has been polled. Inline gather lists need only be valid
    /// during the call.
    ///
    /// # Errors
    ///
    /// [`FabricError::QueueFull`] when the send queue has no room;
    /// [`FabricError::InvalidRequest`] for requests beyond [`Caps`]. Access errors are
    /// not reported here but as completions.
    unsafe fn post(&self, wr: &WorkRequest<'_>) -> Result<(), FabricError>;

    /// Posts a work request as [`post`](Self::post) and, where the fabric carried it
    /// out before returning, hands back its completion (if it has one: signalled, or
    /// failed) instead of queueing it for [`poll`](Self::poll); the caller then
    /// accounts for it as if polled. `Ok(None)`: any completion comes through `poll`.
    /// The default posts and returns `None`, as an RDMA device must: only the
    /// emulated fabric's unbounded queue finishes requests in the call.
    ///
    /// # Safety
    ///
    /// As [`post`](Self::post).
    ///
    /// # Errors
    ///
    /// As [`post`](Self::post).
    unsafe fn post_completing(
        &self,
        wr: &WorkRequest<'_>,
    ) -> Result<Option<Completion>, FabricError> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.post(wr) }.map(|()| None)
    }

    /// Posts an inline RDMA WRITE of `list`: safe, because the fabric copies the
    /// gather list before returning and the list borrows every piece it names.
    ///
    /// # Errors
    ///
    /// As [`post`](Self::post); [`FabricError::InvalidRequest`] beyond
    /// [`Caps::max_inline`].
    #[inline]
    fn post_inline_write<const N: usize>(
        &self,
        wr_id: u64,
        list: &GatherList<'_, N>,
        remote_addr: u64,
        rkey: u32,
        signaled: bool,
    ) -> Result<(), FabricError>
    where
        Self: Sized,
    {
        let wr = WorkRequest {
            wr_id,
            opcode: Opcode::Write {
                local: list.as_sges(),
                remote_addr,
                rkey,
                inline: true,
            },
            signaled,
        };
        // SAFETY: inline: the memory need only be valid during the call, and the list
        // borrows each piece for longer than that.
        unsafe { self.post(&wr) }
    }

    /// Posts an unsignalled inline RDMA WRITE of one contiguous buffer: the same as
    /// [`post_inline_write`](Self::post_inline_write) with a one-entry list, work
    /// request id 0 and `signaled` false (so a completion only if it fails). A fabric
    /// whose inline writes are plain copies overrides it to skip building and
    /// decoding a work request (the ring's small packets come through here, once per
    /// small message).
    ///
    /// # Errors
    ///
    /// As [`post_inline_write`](Self::post_inline_write).
    #[inline]
    fn write_inline(&self, bytes: &[u8], remote_addr: u64, rkey: u32) -> Result<(), FabricError>
    where
        Self: Sized,
    {
        let mut list = GatherList::<1>::new();
        list.push(bytes);
        self.post_inline_write(0, &list, remote_addr, rkey, false)
    }

    /// Prepares the peer's `region` for this end's writes in one pass, where the
    /// fabric would otherwise do it page by page at the first writes: the emulated
    /// fabric maps the peer's memory into this process. For memory the peer made
    /// resident ([`MemoryRegion::make_resident`]); best effort, nothing is written.
    /// The default does nothing: an RDMA device needs nothing of the sender.
    fn prepare_remote(&self, region: RemoteRegion) {
        let _ = region;
    }

    /// Where the peer's `region` lies in this process, when this queue pair's writes
    /// into it would be plain stores there (the emulated fabric, with an unbounded send
    /// queue, once connected): a caller may then write by itself, checking
    /// [`DirectTarget::changes`] before each write, in the order the fabric's own
    /// writes keep (the last word last, with Release). `None` on an RDMA device, or
    /// when the region cannot be reached so now (a bad key or range, a peer gone).
    fn direct_target(&self, region: RemoteRegion) -> Option<DirectTarget> {
        let _ = region;
        None
    }

    /// Moves up to `out.len()` completions into `out` and returns how many.
    fn poll(&self, out: &mut [Completion]) -> usize;

    /// Current state.
    fn state(&self) -> QpState;

    /// The fabric's limits for this queue pair.
    fn caps(&self) -> Caps;

    /// Why the queue pair is in the error state, in words, when the fabric knows
    /// more than the state itself (the failed request's status, the peer's
    /// disconnect, an asynchronous event); `None` otherwise.
    fn error_reason(&self) -> Option<String> {
        None
    }

    /// True when the peer is this same port (loopback): requests and responses never
    /// leave the adapter, so round trips are cheap against moving the bytes. Chooses
    /// between [`Fabric::zero_copy_defaults`] and
    /// [`Fabric::zero_copy_loopback_defaults`]. False where the fabric cannot tell.
    fn loopback(&self) -> bool {
        false
    }

    /// From now on every RDMA WRITE also *wakes* the peer, which asked for that
    /// ([`PendingQp::accept_wakes`] returned true there): on verbs it carries
    /// immediate data, which completes a receive of the peer's. Called before the
    /// first post. A fabric without wakes ignores it.
    fn send_wakes(&self) {}

    /// Wakes a thread of the peer's process that sleeps on the eventfd it named by
    /// `fd`, its descriptor number (a selector's, see `crate::select`), adding
    /// `value` (nonzero, below 2^32) to its count: a notification beside the data
    /// path, sent only when the peer asked for it before sleeping. `Ok(false)` where
    /// the fabric has no such wake (the peer then bounds its sleep instead). The
    /// first call for a descriptor and `instance` (the peer's name for that eventfd,
    /// which changes when a newer one reuses the number) takes it from the peer's
    /// process (checked to be an eventfd), later ones reuse it.
    ///
    /// # Errors
    ///
    /// The peer's descriptor cannot be taken (not an eventfd, its process not
    /// verified, no such descriptor), or the write to it fails.
    fn notify(&self, fd: u32, instance: u32, value: u32) -> io::Result<bool> {
        let _ = (fd, instance, value);
        Ok(false)
    }

    /// True where [`notify`](Self::notify) can wake the peer (then the peer of this
    /// queue pair can wake us through it too: both ends are of one fabric).
    fn can_notify(&self) -> bool {
        false
    }

    /// The first half of a blocking wait, on an end that accepts wakes: asks to be
    /// told of the next write of the peer's or completion of ours, and returns a
    /// token for [`block_wake`](Self::block_wake). The caller must look for what it
    /// waits for once more before blocking (what landed before the arm raises no
    /// event). `None` where this end takes no wakes, or cannot count on them for
    /// this wait (verbs: the peer may have just spent its budget of wakes): then
    /// the caller sleeps a bounded time.
    fn arm_wake(&self) -> Option<u64> {
        None
    }

    /// The second half: blocks until something arrives after the
    /// [`arm_wake`](Self::arm_wake) that returned `token`, or `timeout` passes
    /// (which bounds what the wake cannot see: a peer's death, a deadline). Returns
    /// at once when another thread took the event meanwhile.
    fn block_wake(&self, token: u64, timeout: std::time::Duration) {
        let _ = token;
        std::thread::sleep(timeout);
    }

    /// The descriptor an [`arm_wake`](Self::arm_wake) makes readable when its wake
    /// comes (verbs: the queue pair's completion channel), for a caller that waits
    /// on many connections at once with `poll(2)` instead of
    /// [`block_wake`](Self::block_wake); after `poll` found it readable, call
    /// [`wake_fired`](Self::wake_fired). `None` where wakes come otherwise
    /// ([`notify`](Self::notify)) or not at all. The descriptor lives as long as the
    /// queue pair.
    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        None
    }

    /// After `poll(2)` found [`wake_fd`](Self::wake_fd) readable: takes the channel's
    /// events (the queues stay disarmed until the next [`arm_wake`](Self::arm_wake)),
    /// counts the wake as [`block_wake`](Self::block_wake) would, and reaps.
    fn wake_fired(&self) {}
}

// Defined with the settings that carry it (config is the bottom layer); its home
// for users stays here too.
pub use crate::config::ZeroCopyThresholds;

/// Most descriptors a [`Card`] may carry: what one Unix socket message can (the
/// kernel's `SCM_MAX_FD`).
pub const MAX_CARD_FDS: usize = 253;

/// What one side of a connection hands the other to connect: opaque bytes plus, for
/// fabrics that share memory through the kernel, file descriptors (sent over a Unix
/// socket with `SCM_RIGHTS`). A verbs card carries LID/GID/QPN/PSN and no descriptors.
#[derive(Debug, Default)]
pub struct Card {
    /// Fabric-specific description of the endpoint.
    pub bytes: Vec<u8>,
    /// Descriptors that travel with the card (may be empty).
    pub fds: Vec<OwnedFd>,
}

/// A queue pair between creation and connection (the verbs INIT state).
pub trait PendingQp: Send {
    /// The connected queue pair this becomes.
    type Qp: QueuePair;

    /// Describes this end for the peer: the domain (including every region registered
    /// so far, on fabrics that need that) and the queue pair.
    ///
    /// # Errors
    ///
    /// Failure to duplicate descriptors or to query the device.
    fn card(&self) -> io::Result<Card>;

    /// Connects to the end described by `peer` (RTR then RTS on verbs).
    ///
    /// # Errors
    ///
    /// A malformed card, a peer that is gone, or a device failure.
    fn connect(self, peer: Card) -> io::Result<Self::Qp>;

    /// Prepares this end to be woken by the peer's writes (see
    /// [`QueuePair::arm_wake`]); call before sending the card. True when the fabric
    /// does wakes for this queue pair (the peer must then be told to
    /// [`send_wakes`](QueuePair::send_wakes)), false where it does not.
    ///
    /// # Errors
    ///
    /// The fabric's failure to prepare (posting receives).
    fn accept_wakes(&mut self) -> io::Result<bool> {
        Ok(false)
    }
}

/// A protection domain on some fabric: registers memory and makes queue pairs.
pub trait Fabric: Send + Sync + Sized + 'static {
    /// Registered memory of this fabric.
    type Region: MemoryRegion + 'static;
    /// Queue pairs of this fabric.
    type Qp: QueuePair + 'static;
    /// A queue pair created but not yet connected.
    type Pending: PendingQp<Qp = Self::Qp>;

    /// Allocates `len` bytes of zeroed memory and registers it with `access`.
    /// On the emulated fabric this memory lives in a shared segment, so the peer
    /// reaches it with a plain copy.
    ///
    /// # Errors
    ///
    /// Out of memory, registration table full, or `len == 0`.
    fn alloc_region(&self, len: usize, access: Access) -> io::Result<Self::Region>;

    /// Registers existing memory.
    ///
    /// # Safety
    ///
    /// `addr..addr + len` must be valid memory of this process that stays mapped until
    /// the returned region is dropped.
    ///
    /// # Errors
    ///
    /// Registration table full, `len == 0`, or the operating system refused.
    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> io::Result<Self::Region>;

    /// The fabric's limits.
    fn caps(&self) -> Caps;

    /// Creates an unconnected queue pair (`INIT` state on verbs). Its card goes to the
    /// peer; the peer's card comes back into [`PendingQp::connect`].
    ///
    /// # Errors
    ///
    /// Resource exhaustion or a device failure.
    fn create_qp(&self) -> io::Result<Self::Pending>;

    /// The protection domain a rail's queue pair goes in
    /// ([`RailSpec`](crate::config::RailSpec)): `None` for this one (a rail
    /// without a device, or on this domain's device and port), or a domain of
    /// its own on the rail's device, whose registrations and keys are its own (a
    /// second HCA, seed 002's sec. 5.1). The rail's queue pair is then made with
    /// [`create_rail_qp`](Self::create_rail_qp) on the domain returned, from the
    /// rail without its device. The default knows no devices.
    ///
    /// # Errors
    ///
    /// `Unsupported` for a rail naming a device this fabric cannot open; the
    /// device's failures.
    fn rail_domain(&self, spec: &crate::config::RailSpec) -> io::Result<Option<Self>> {
        if spec.device.is_none() && spec.port.is_none() {
            return Ok(None);
        }
        Err(io::Error::new(
            io::ErrorKind::Unsupported,
            format!("rail {spec}: the {} fabric has no devices", self.name()),
        ))
    }

    /// Creates the unconnected queue pair of a rail
    /// ([`RailSpec`](crate::config::RailSpec)) of a connection on this domain. The
    /// default takes plain rails only (another queue pair like
    /// [`create_qp`](Self::create_qp)'s).
    ///
    /// # Errors
    ///
    /// `Unsupported` naming the rail when it asks for what this fabric cannot
    /// give it (a device other than the domain's, a rate on real hardware);
    /// failures of `create_qp`.
    fn create_rail_qp(&self, spec: &crate::config::RailSpec) -> io::Result<Self::Pending> {
        if !spec.is_plain() {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "rail {spec:?}: the {} fabric makes rails only as more queue pairs \
                     on the connection's own device",
                    self.name()
                ),
            ));
        }
        self.create_qp()
    }

    /// A short name for messages and benchmark tables.
    fn name(&self) -> &'static str;

    /// Identifies this protection domain among the live ones: equal for clones that
    /// share the domain, different for any other domain alive at the same time. The
    /// registration cache is kept per domain by this key.
    fn domain_id(&self) -> usize;

    /// Measured defaults for the zero-copy thresholds: the smallest buffer for which
    /// the peer's RDMA READ beats the ring's copies. `usize::MAX` means never.
    /// Fabrics override this with their own measurements.
    ///
    /// ```
    /// use rdma_channel::fabric::{emulated::EmuFabric, Fabric};
    /// let t = EmuFabric::new()?.zero_copy_defaults();
    /// assert!(t.alloc_mem <= t.other);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    fn zero_copy_defaults(&self) -> ZeroCopyThresholds {
        ZeroCopyThresholds {
            alloc_mem: 64 << 10,
            other: 64 << 10,
        }
    }

    /// Smallest buffer in memory other than `alloc_mem`'s that goes by whichever path
    /// the receiver measures cheaper, the ring or zero-copy, where neither wins on
    /// every host ([`Config::with_zero_copy_adaptive`](crate::Config::with_zero_copy_adaptive));
    /// `None` where the thresholds alone decide. Used where the adaptive choice is on.
    ///
    /// ```
    /// use rdma_channel::fabric::{emulated::EmuFabric, Fabric};
    /// assert_eq!(EmuFabric::new()?.zero_copy_adaptive_default(), Some(16 << 10));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    fn zero_copy_adaptive_default(&self) -> Option<usize> {
        None
    }

    /// The smallest heap buffer (memory not from `alloc_region`) sent zero-copy by
    /// default where the adaptive choice is off because the process group's ranks on
    /// this host outnumber its CPUs; `None` keeps [`zero_copy_defaults`](Self::zero_copy_defaults).
    ///
    /// ```
    /// use rdma_channel::fabric::{emulated::EmuFabric, Fabric};
    /// assert_eq!(EmuFabric::new()?.zero_copy_outnumbered_default(), Some(1 << 20));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    fn zero_copy_outnumbered_default(&self) -> Option<usize> {
        None
    }

    /// True when this fabric's protocol work (copies, checksums, retransmission) runs
    /// on this host's CPUs, as a software RDMA device's (Soft-RoCE, siw) does in the
    /// kernel: a waiter that spins takes those CPUs from it. False for adapters, and
    /// for the emulated fabric, whose copies the calling processes make themselves.
    fn uses_host_cpus(&self) -> bool {
        false
    }

    /// True when a connection's blocking waits (reads, waits for room) block on its
    /// queue pair's wakes ([`QueuePair::arm_wake`]) where it takes them; false where
    /// only selectors and async tasks use them (verbs with `RCH_IB_WAKE=select`).
    fn blocking_waits_take_wakes(&self) -> bool {
        true
    }

    /// True when a registration holds on to the pages it was made over (verbs pins
    /// them): one made before its memory was unmapped and mapped anew would move the
    /// old pages, so the registration cache confirms each hit with the kernel
    /// ([`crate::rcache`]). False when remote access follows the address, as the
    /// emulated fabric's does. True unless the fabric says otherwise.
    fn registrations_pin_pages(&self) -> bool {
        true
    }

    /// True when the ring's bytes move between the two ends' cores through their
    /// caches, as the emulated fabric's shared memory does: lines both cores touched
    /// a moment ago move faster, so the sender keeps a ping-pong in short laps
    /// ([`crate::ring::lap_end`]). False for adapters, whose DMA gains nothing from
    /// it while every lap costs a `Wrap` packet: they keep the working set.
    fn shares_caches(&self) -> bool {
        false
    }

    /// [`zero_copy_defaults`](Self::zero_copy_defaults) for a peer on this same port
    /// ([`QueuePair::loopback`]); the same unless the fabric measured otherwise.
    fn zero_copy_loopback_defaults(&self) -> ZeroCopyThresholds {
        self.zero_copy_defaults()
    }

    /// Default share, in percent, of a zero-copy transfer that the sender pushes by
    /// RDMA WRITE into the receiver's buffer while the receiver pulls the rest by RDMA
    /// READ ([`Config::with_zero_copy_push`](crate::Config::with_zero_copy_push)), for
    /// a peer on this same port (`loopback`) or elsewhere. 0, all READ, unless the
    /// fabric measured better.
    fn zero_copy_push_default(&self, loopback: bool) -> u8 {
        let _ = loopback;
        0
    }

    /// Default share, in percent, that the sender pushes of a transfer that goes
    /// zero-copy only because the receiver measured zero-copy cheaper (the adaptive
    /// choice, [`zero_copy_adaptive_default`](Self::zero_copy_adaptive_default)); the
    /// receiver's measurements then time that split. The same as
    /// [`zero_copy_push_default`](Self::zero_copy_push_default) unless the fabric
    /// measured otherwise.
    fn zero_copy_adaptive_push_default(&self, loopback: bool) -> u8 {
        self.zero_copy_push_default(loopback)
    }
}
