//! The fabric chosen at run time: [`AnyFabric`] is the emulated fabric or, in builds
//! with the `verbs` feature, the verbs fabric, behind one type, so that one binary (an
//! application, a test suite, a benchmark) runs on either.
//!
//! [`AnyFabric::from_env`] reads `RCH_FABRIC`:
//!
//! | value | fabric |
//! | --- | --- |
//! | unset, empty or `emulated` | [`EmuFabric`] (shared memory, this machine only) |
//! | `verbs` | `verbs::VerbsFabric` on the device `RCH_IB_DEVICE` names (feature `verbs`) |
//!
//! The stream constructors that pick a fabric themselves ([`RdmaStream::pair`],
//! [`RdmaStream::connect`], [`RdmaListener::bind`] and their `_with` forms) use it.
//!
//! Every call is forwarded by a `match` on the variant: nothing is boxed and nothing
//! allocated, so the data path ([`QueuePair::post`], [`QueuePair::poll`]) costs one
//! well-predicted branch more than on the concrete fabric (none without the `verbs`
//! feature, where the enums have a single variant).
//!
//! Both ends of a connection must use the same fabric. Cards are forwarded unchanged
//! (an `AnyFabric` end connects to an end on the concrete fabric), and a card of the
//! other fabric is refused by [`PendingQp::connect`] with
//! [`io::ErrorKind::InvalidInput`] naming both fabrics.
//!
//! [`RdmaStream::pair`]: crate::RdmaStream::pair
//! [`RdmaStream::connect`]: crate::RdmaStream::connect
//! [`RdmaListener::bind`]: crate::RdmaListener::bind

use crate::fabric::ZeroCopyThresholds;
use std::fmt;
use std::io;
use std::str::FromStr;

use super::emulated::{EmuFabric, EmuPending, EmuQp, EmuRegion};
#[cfg(feature = "verbs")]
use super::verbs::{VerbsFabric, VerbsPending, VerbsQp, VerbsRegion};
use super::{
    Access, Caps, Card, Completion, Fabric, FabricError, MemoryRegion, PendingQp, QpState,
    QueuePair, WorkRequest,
};

/// The environment variable [`AnyFabric::from_env`] and [`FabricKind::from_env`] read.
pub const FABRIC_ENV: &str = crate::settings::FABRIC.name();

/// Which fabric: the value of `RCH_FABRIC`.
///
/// ```
/// use rdma_channel::fabric::any::FabricKind;
/// assert_eq!("emulated".parse::<FabricKind>()?, FabricKind::Emulated);
/// assert_eq!("verbs".parse::<FabricKind>()?, FabricKind::Verbs);
/// assert_eq!("".parse::<FabricKind>()?, FabricKind::Emulated, "empty means the default");
/// assert_eq!(FabricKind::Verbs.to_string(), "verbs");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum FabricKind {
    /// [`EmuFabric`]: shared memory between threads or processes of one machine.
    #[default]
    Emulated,
    /// The verbs fabric (`libibverbs`); only available with the `verbs` feature.
    Verbs,
}

impl FabricKind {
    /// The name `RCH_FABRIC` uses for this fabric.
    ///
    /// ```
    /// assert_eq!(rdma_channel::fabric::any::FabricKind::Emulated.name(), "emulated");
    /// ```
    pub const fn name(self) -> &'static str {
        match self {
            FabricKind::Emulated => "emulated",
            FabricKind::Verbs => "verbs",
        }
    }

    /// True when this build can open the fabric (always for the emulated one; for
    /// verbs only with the `verbs` feature).
    ///
    /// ```
    /// use rdma_channel::fabric::any::FabricKind;
    /// assert!(FabricKind::Emulated.is_available());
    /// assert_eq!(FabricKind::Verbs.is_available(), cfg!(feature = "verbs"));
    /// ```
    pub const fn is_available(self) -> bool {
        match self {
            FabricKind::Emulated => true,
            FabricKind::Verbs => cfg!(feature = "verbs"),
        }
    }

    /// Reads `RCH_FABRIC` without opening anything: unset or empty is
    /// [`FabricKind::Emulated`].
    ///
    /// ```
    /// // The variable is unset in doc-tests (or names a valid fabric).
    /// let kind = rdma_channel::fabric::any::FabricKind::from_env()?;
    /// println!("RCH_FABRIC selects the {kind} fabric");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidInput`] naming the variable and the allowed values when
    /// it holds anything else (or is not Unicode).
    pub fn from_env() -> io::Result<FabricKind> {
        match crate::settings::FABRIC.value()? {
            Some(v) => v.parse().map_err(|e: io::Error| {
                io::Error::new(e.kind(), format!("{FABRIC_ENV}={v:?}: {e}"))
            }),
            None => Ok(FabricKind::Emulated),
        }
    }

    /// Opens a fabric of this kind: a new [`EmuFabric`] domain, or
    /// `VerbsFabric::open` (device, port and GID from `RCH_IB_*`).
    ///
    /// ```
    /// use rdma_channel::fabric::{any::FabricKind, Fabric};
    /// assert_eq!(FabricKind::Emulated.open()?.name(), "emulated");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::Unsupported`] for verbs in a build without the `verbs`
    /// feature; otherwise the fabric's own error, unchanged (for verbs on a machine
    /// without RDMA, `NotFound` "no RDMA device found").
    pub fn open(self) -> io::Result<AnyFabric> {
        match self {
            FabricKind::Emulated => EmuFabric::new().map(AnyFabric::Emulated),
            #[cfg(feature = "verbs")]
            FabricKind::Verbs => VerbsFabric::open().map(AnyFabric::Verbs),
            #[cfg(not(feature = "verbs"))]
            FabricKind::Verbs => Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "{FABRIC_ENV}=verbs: rdma-channel was built without the verbs feature \
                     (build with `--features verbs`)"
                ),
            )),
        }
    }

    /// The fabric whose cards start like `card` does, if either.
    fn of_card(card: &[u8]) -> Option<FabricKind> {
        if super::emulated::card::FORMAT.is_magic_of(card) {
            Some(FabricKind::Emulated)
        } else if card.starts_with(VERBS_CARD_MAGIC) {
            Some(FabricKind::Verbs)
        } else {
            None
        }
    }
}

const ALLOWED: &str = "unknown fabric; use `emulated` (the default) or `verbs`";

/// First bytes of a verbs card (`src/fabric/verbs/card.rs`, which is compiled only
/// with the feature).
const VERBS_CARD_MAGIC: &[u8] = b"RCHV";

impl FromStr for FabricKind {
    type Err = io::Error;

    /// Parses `emulated` or `verbs` (ASCII case and surrounding blanks ignored); the
    /// empty string is the default, `emulated`.
    fn from_str(s: &str) -> io::Result<FabricKind> {
        let s = s.trim();
        if s.is_empty() || s.eq_ignore_ascii_case("emulated") {
            Ok(FabricKind::Emulated)
        } else if s.eq_ignore_ascii_case("verbs") {
            Ok(FabricKind::Verbs)
        } else {
            Err(io::Error::new(io::ErrorKind::InvalidInput, ALLOWED))
        }
    }
}

impl fmt::Display for FabricKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Forwards one expression to whichever fabric a value of one of the `Any*` enums holds.
macro_rules! forward {
    ($value:expr, $enum:ident, $inner:ident => $call:expr) => {
        match $value {
            $enum::Emulated($inner) => $call,
            #[cfg(feature = "verbs")]
            $enum::Verbs($inner) => $call,
        }
    };
}

/// The emulated or the verbs fabric, chosen at run time (see the [module
/// documentation](self)). Cloning is cheap and shares the domain.
///
/// ```
/// use std::io::{IoSlice, IoSliceMut};
/// use rdma_channel::fabric::{any::AnyFabric, Fabric};
/// use rdma_channel::{Config, Prepared};
///
/// let fabric = AnyFabric::from_env()?; // RCH_FABRIC, emulated by default
/// let a = Prepared::new(fabric.clone(), Config::default())?;
/// let b = Prepared::new(fabric.for_connection()?, Config::default())?;
/// let (card_a, card_b) = (a.card()?, b.card()?);
/// let (mut a, mut b) = (a.connect(card_b)?, b.connect(card_a)?);
/// assert_eq!(a.put(&[IoSlice::new(b"any")])?, 3);
/// let mut buf = [0u8; 3];
/// let mut got = 0;
/// while got < 3 {
///     got += b.get(&mut [IoSliceMut::new(&mut buf[got..])])?;
/// }
/// assert_eq!(&buf, b"any");
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Clone, Debug)]
pub enum AnyFabric {
    /// The shared-memory fabric.
    Emulated(EmuFabric),
    /// The verbs fabric.
    #[cfg(feature = "verbs")]
    Verbs(VerbsFabric),
}

impl AnyFabric {
    /// Opens the fabric `RCH_FABRIC` names: see [`FabricKind::from_env`] and
    /// [`FabricKind::open`].
    ///
    /// ```
    /// use rdma_channel::fabric::{any::AnyFabric, Fabric};
    /// let fabric = AnyFabric::from_env()?;
    /// assert!(["emulated", "verbs"].contains(&fabric.name()));
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// `InvalidInput` naming `RCH_FABRIC` for a value other than `emulated` or `verbs`;
    /// `Unsupported` for `verbs` in a build without the `verbs` feature; the fabric's
    /// own error when it cannot be opened (verbs without a device: `NotFound`, "no
    /// RDMA device found").
    pub fn from_env() -> io::Result<AnyFabric> {
        FabricKind::from_env()?.open()
    }

    /// A new emulated domain.
    ///
    /// ```
    /// use rdma_channel::fabric::any::{AnyFabric, FabricKind};
    /// assert_eq!(AnyFabric::emulated()?.kind(), FabricKind::Emulated);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`EmuFabric::new`].
    pub fn emulated() -> io::Result<AnyFabric> {
        EmuFabric::new().map(AnyFabric::Emulated)
    }

    /// Which fabric this is.
    ///
    /// ```
    /// use rdma_channel::fabric::any::{AnyFabric, FabricKind};
    /// let f = AnyFabric::from(rdma_channel::fabric::emulated::EmuFabric::new()?);
    /// assert_eq!(f.kind(), FabricKind::Emulated);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn kind(&self) -> FabricKind {
        match self {
            AnyFabric::Emulated(_) => FabricKind::Emulated,
            #[cfg(feature = "verbs")]
            AnyFabric::Verbs(_) => FabricKind::Verbs,
        }
    }

    /// A fabric of the same kind for one more connection of this process: a new
    /// domain on the emulated fabric (as each connection had before this type
    /// existed, so that cards stay small), the same protection domain on verbs (one
    /// device context per process, as verbs programs do).
    ///
    /// ```
    /// use rdma_channel::fabric::any::AnyFabric;
    /// let f = AnyFabric::emulated()?;
    /// assert_eq!(f.for_connection()?.kind(), f.kind());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// As [`EmuFabric::new`] on the emulated fabric; never on verbs.
    pub fn for_connection(&self) -> io::Result<AnyFabric> {
        match self {
            AnyFabric::Emulated(_) => AnyFabric::emulated(),
            #[cfg(feature = "verbs")]
            AnyFabric::Verbs(f) => Ok(AnyFabric::Verbs(f.clone())),
        }
    }

    /// The emulated fabric inside, if that is what this is.
    ///
    /// ```
    /// let f = rdma_channel::fabric::any::AnyFabric::emulated()?;
    /// assert!(f.as_emulated().is_some());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn as_emulated(&self) -> Option<&EmuFabric> {
        match self {
            AnyFabric::Emulated(f) => Some(f),
            #[cfg(feature = "verbs")]
            AnyFabric::Verbs(_) => None,
        }
    }

    /// The verbs fabric inside, if that is what this is.
    ///
    /// ```
    /// let f = rdma_channel::fabric::any::AnyFabric::emulated()?;
    /// assert!(f.as_verbs().is_none());
    /// # Ok::<(), std::io::Error>(())
    /// ```
    #[cfg(feature = "verbs")]
    pub fn as_verbs(&self) -> Option<&VerbsFabric> {
        match self {
            AnyFabric::Verbs(f) => Some(f),
            AnyFabric::Emulated(_) => None,
        }
    }
}

impl From<EmuFabric> for AnyFabric {
    fn from(f: EmuFabric) -> AnyFabric {
        AnyFabric::Emulated(f)
    }
}

#[cfg(feature = "verbs")]
impl From<VerbsFabric> for AnyFabric {
    fn from(f: VerbsFabric) -> AnyFabric {
        AnyFabric::Verbs(f)
    }
}

impl Fabric for AnyFabric {
    type Region = AnyRegion;
    type Qp = AnyQp;
    type Pending = AnyPending;

    fn alloc_region(&self, len: usize, access: Access) -> io::Result<AnyRegion> {
        match self {
            AnyFabric::Emulated(f) => f.alloc_region(len, access).map(AnyRegion::Emulated),
            #[cfg(feature = "verbs")]
            AnyFabric::Verbs(f) => f.alloc_region(len, access).map(AnyRegion::Verbs),
        }
    }

    unsafe fn register(&self, addr: *mut u8, len: usize, access: Access) -> io::Result<AnyRegion> {
        match self {
            AnyFabric::Emulated(f) => {
                // SAFETY: forwarded from this function's contract.
                let r = unsafe { f.register(addr, len, access) };
                r.map(AnyRegion::Emulated)
            }
            #[cfg(feature = "verbs")]
            AnyFabric::Verbs(f) => {
                // SAFETY: forwarded from this function's contract.
                let r = unsafe { f.register(addr, len, access) };
                r.map(AnyRegion::Verbs)
            }
        }
    }

    #[inline]
    fn caps(&self) -> Caps {
        forward!(self, AnyFabric, f => f.caps())
    }

    fn create_qp(&self) -> io::Result<AnyPending> {
        match self {
            AnyFabric::Emulated(f) => f.create_qp().map(AnyPending::Emulated),
            #[cfg(feature = "verbs")]
            AnyFabric::Verbs(f) => f.create_qp().map(AnyPending::Verbs),
        }
    }

    fn rail_domain(&self, spec: &crate::config::RailSpec) -> io::Result<Option<AnyFabric>> {
        match self {
            AnyFabric::Emulated(f) => Ok(f.rail_domain(spec)?.map(AnyFabric::Emulated)),
            #[cfg(feature = "verbs")]
            AnyFabric::Verbs(f) => Ok(f.rail_domain(spec)?.map(AnyFabric::Verbs)),
        }
    }

    fn create_rail_qp(&self, spec: &crate::config::RailSpec) -> io::Result<AnyPending> {
        match self {
            AnyFabric::Emulated(f) => f.create_rail_qp(spec).map(AnyPending::Emulated),
            #[cfg(feature = "verbs")]
            AnyFabric::Verbs(f) => f.create_rail_qp(spec).map(AnyPending::Verbs),
        }
    }

    fn name(&self) -> &'static str {
        forward!(self, AnyFabric, f => f.name())
    }

    fn domain_id(&self) -> usize {
        forward!(self, AnyFabric, f => f.domain_id())
    }

    fn zero_copy_defaults(&self) -> ZeroCopyThresholds {
        forward!(self, AnyFabric, f => f.zero_copy_defaults())
    }

    fn uses_host_cpus(&self) -> bool {
        forward!(self, AnyFabric, f => f.uses_host_cpus())
    }

    fn blocking_waits_take_wakes(&self) -> bool {
        forward!(self, AnyFabric, f => f.blocking_waits_take_wakes())
    }

    fn zero_copy_adaptive_default(&self) -> Option<usize> {
        forward!(self, AnyFabric, f => f.zero_copy_adaptive_default())
    }

    fn zero_copy_outnumbered_default(&self) -> Option<usize> {
        forward!(self, AnyFabric, f => f.zero_copy_outnumbered_default())
    }

    fn shares_caches(&self) -> bool {
        forward!(self, AnyFabric, f => f.shares_caches())
    }

    fn registrations_pin_pages(&self) -> bool {
        forward!(self, AnyFabric, f => f.registrations_pin_pages())
    }

    fn zero_copy_loopback_defaults(&self) -> ZeroCopyThresholds {
        forward!(self, AnyFabric, f => f.zero_copy_loopback_defaults())
    }

    fn zero_copy_push_default(&self, loopback: bool) -> u8 {
        forward!(self, AnyFabric, f => f.zero_copy_push_default(loopback))
    }

    fn zero_copy_adaptive_push_default(&self, loopback: bool) -> u8 {
        forward!(self, AnyFabric, f => f.zero_copy_adaptive_push_default(loopback))
    }
}

/// Registered memory of an [`AnyFabric`].
///
/// ```
/// use rdma_channel::fabric::{any::AnyFabric, Access, Fabric, MemoryRegion};
/// let r = AnyFabric::emulated()?.alloc_region(100, Access::REMOTE_WRITE)?;
/// assert_eq!(r.len(), 100);
/// assert!(r.access().contains(Access::REMOTE_WRITE));
/// # Ok::<(), std::io::Error>(())
/// ```
#[derive(Debug)]
pub enum AnyRegion {
    /// A region of the emulated fabric.
    Emulated(EmuRegion),
    /// A region of the verbs fabric.
    #[cfg(feature = "verbs")]
    Verbs(VerbsRegion),
}

impl MemoryRegion for AnyRegion {
    #[inline]
    fn addr(&self) -> *mut u8 {
        forward!(self, AnyRegion, r => r.addr())
    }

    #[inline]
    fn len(&self) -> usize {
        forward!(self, AnyRegion, r => r.len())
    }

    #[inline]
    fn is_empty(&self) -> bool {
        forward!(self, AnyRegion, r => r.is_empty())
    }

    #[inline]
    fn lkey(&self) -> u32 {
        forward!(self, AnyRegion, r => r.lkey())
    }

    #[inline]
    fn rkey(&self) -> u32 {
        forward!(self, AnyRegion, r => r.rkey())
    }

    #[inline]
    fn access(&self) -> Access {
        forward!(self, AnyRegion, r => r.access())
    }

    fn make_resident(&self) {
        forward!(self, AnyRegion, r => r.make_resident())
    }

    #[inline]
    fn remote(&self) -> super::RemoteRegion {
        forward!(self, AnyRegion, r => r.remote())
    }
}

/// A connected queue pair of an [`AnyFabric`].
#[derive(Debug)]
pub enum AnyQp {
    /// A queue pair of the emulated fabric.
    Emulated(EmuQp),
    /// A queue pair of the verbs fabric.
    #[cfg(feature = "verbs")]
    Verbs(VerbsQp),
}

impl AnyQp {
    /// Why the queue pair entered the error state, if it did and the fabric knows.
    ///
    /// ```
    /// use rdma_channel::fabric::{any::AnyFabric, Fabric, PendingQp};
    /// let f = AnyFabric::emulated()?;
    /// let (pa, pb) = (f.create_qp()?, f.for_connection()?.create_qp()?);
    /// let (ca, cb) = (pa.card()?, pb.card()?);
    /// let (qa, _qb) = (pa.connect(cb)?, pb.connect(ca)?);
    /// assert_eq!(qa.last_error(), None);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    pub fn last_error(&self) -> Option<String> {
        forward!(self, AnyQp, q => q.last_error())
    }
}

impl QueuePair for AnyQp {
    #[inline]
    unsafe fn post(&self, wr: &WorkRequest<'_>) -> Result<(), FabricError> {
        match self {
            // SAFETY: forwarded from this function's contract.
            AnyQp::Emulated(q) => unsafe { q.post(wr) },
            #[cfg(feature = "verbs")]
            // SAFETY: forwarded from this function's contract.
            AnyQp::Verbs(q) => unsafe { q.post(wr) },
        }
    }

    #[inline]
    unsafe fn post_completing(
        &self,
        wr: &WorkRequest<'_>,
    ) -> Result<Option<Completion>, FabricError> {
        match self {
            // SAFETY: forwarded from this function's contract.
            AnyQp::Emulated(q) => unsafe { q.post_completing(wr) },
            #[cfg(feature = "verbs")]
            // SAFETY: forwarded from this function's contract.
            AnyQp::Verbs(q) => unsafe { q.post_completing(wr) },
        }
    }

    #[inline]
    fn write_inline(&self, bytes: &[u8], remote_addr: u64, rkey: u32) -> Result<(), FabricError> {
        forward!(self, AnyQp, q => q.write_inline(bytes, remote_addr, rkey))
    }

    #[inline]
    fn poll(&self, out: &mut [Completion]) -> usize {
        forward!(self, AnyQp, q => q.poll(out))
    }

    fn prepare_remote(&self, region: super::RemoteRegion) {
        forward!(self, AnyQp, q => q.prepare_remote(region))
    }

    fn direct_target(&self, region: super::RemoteRegion) -> Option<super::DirectTarget> {
        forward!(self, AnyQp, q => q.direct_target(region))
    }

    #[inline]
    fn state(&self) -> QpState {
        forward!(self, AnyQp, q => q.state())
    }

    #[inline]
    fn caps(&self) -> Caps {
        forward!(self, AnyQp, q => q.caps())
    }

    fn loopback(&self) -> bool {
        forward!(self, AnyQp, q => q.loopback())
    }

    fn error_reason(&self) -> Option<String> {
        forward!(self, AnyQp, q => q.error_reason())
    }

    fn send_wakes(&self) {
        forward!(self, AnyQp, q => q.send_wakes())
    }

    fn notify(&self, fd: u32, instance: u32, value: u32) -> io::Result<bool> {
        forward!(self, AnyQp, q => q.notify(fd, instance, value))
    }

    fn can_notify(&self) -> bool {
        forward!(self, AnyQp, q => q.can_notify())
    }

    fn arm_wake(&self) -> Option<u64> {
        forward!(self, AnyQp, q => q.arm_wake())
    }

    fn block_wake(&self, token: u64, timeout: std::time::Duration) {
        forward!(self, AnyQp, q => q.block_wake(token, timeout))
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        forward!(self, AnyQp, q => q.wake_fd())
    }

    fn wake_fired(&self) {
        forward!(self, AnyQp, q => q.wake_fired())
    }
}

/// A queue pair of an [`AnyFabric`] that is not connected yet.
#[derive(Debug)]
pub enum AnyPending {
    /// A queue pair of the emulated fabric.
    Emulated(EmuPending),
    /// A queue pair of the verbs fabric.
    #[cfg(feature = "verbs")]
    Verbs(VerbsPending),
}

impl AnyPending {
    fn kind(&self) -> FabricKind {
        match self {
            AnyPending::Emulated(_) => FabricKind::Emulated,
            #[cfg(feature = "verbs")]
            AnyPending::Verbs(_) => FabricKind::Verbs,
        }
    }
}

impl PendingQp for AnyPending {
    type Qp = AnyQp;

    fn card(&self) -> io::Result<Card> {
        forward!(self, AnyPending, p => p.card())
    }

    fn accept_wakes(&mut self) -> io::Result<bool> {
        forward!(self, AnyPending, p => p.accept_wakes())
    }

    /// Connects to `peer`, which must be a card of the same fabric.
    ///
    /// ```
    /// use rdma_channel::fabric::{any::AnyFabric, Card, Fabric, PendingQp};
    /// let p = AnyFabric::emulated()?.create_qp()?;
    /// let verbs_card = Card { bytes: b"RCHV and the rest of a verbs card".to_vec(), fds: Vec::new() };
    /// let e = p.connect(verbs_card).unwrap_err();
    /// assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
    /// assert!(e.to_string().contains("verbs"), "{e}");
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidInput`] for a card of the other fabric; otherwise as
    /// the fabric's own `connect`.
    fn connect(self, peer: Card) -> io::Result<AnyQp> {
        let mine = self.kind();
        if let Some(theirs) = FabricKind::of_card(&peer.bytes) {
            if theirs != mine {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidInput,
                    format!(
                        "the peer is on the {theirs} fabric and this end on the {mine} fabric: \
                         both ends must use the same one ({FABRIC_ENV})"
                    ),
                ));
            }
        }
        match self {
            AnyPending::Emulated(p) => p.connect(peer).map(AnyQp::Emulated),
            #[cfg(feature = "verbs")]
            AnyPending::Verbs(p) => p.connect(peer).map(AnyQp::Verbs),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_parse_and_reject_with_the_allowed_values() {
        for (s, k) in [
            ("emulated", FabricKind::Emulated),
            ("", FabricKind::Emulated),
            ("  ", FabricKind::Emulated),
            ("Emulated", FabricKind::Emulated),
            ("verbs", FabricKind::Verbs),
            (" VERBS\n", FabricKind::Verbs),
        ] {
            assert_eq!(s.parse::<FabricKind>().unwrap(), k, "{s:?}");
        }
        for bad in ["emu", "rxe", "verbs0", "shm"] {
            let e = bad.parse::<FabricKind>().unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
            assert!(e.to_string().contains("`emulated`"), "{e}");
            assert!(e.to_string().contains("`verbs`"), "{e}");
        }
        for k in [FabricKind::Emulated, FabricKind::Verbs] {
            assert_eq!(k.name().parse::<FabricKind>().unwrap(), k);
        }
    }

    #[test]
    fn verbs_without_the_feature_says_so() {
        match FabricKind::Verbs.open() {
            Ok(f) => assert!(cfg!(feature = "verbs") && f.kind() == FabricKind::Verbs),
            Err(e) if !cfg!(feature = "verbs") => {
                assert_eq!(e.kind(), io::ErrorKind::Unsupported);
                assert!(
                    e.to_string().contains("built without the verbs feature"),
                    "{e}"
                );
            }
            // With the feature, a machine without RDMA reports the device error.
            Err(e) => assert!(e.to_string().contains("RDMA device"), "{e}"),
        }
    }

    #[test]
    fn emulated_cards_carry_the_magic_the_check_looks_for() {
        let f = AnyFabric::emulated().unwrap();
        let card = f.create_qp().unwrap().card().unwrap();
        assert_eq!(FabricKind::of_card(&card.bytes), Some(FabricKind::Emulated));
        assert_eq!(
            FabricKind::of_card(b"RCHV\x01\x00"),
            Some(FabricKind::Verbs)
        );
        assert_eq!(FabricKind::of_card(b"junk"), None);
    }

    #[cfg(feature = "verbs")]
    #[test]
    fn verbs_cards_carry_the_magic_the_check_looks_for() {
        // Only where a device exists (inside the Soft-RoCE VM).
        if let Ok(f) = FabricKind::Verbs.open() {
            let card = f.create_qp().unwrap().card().unwrap();
            assert_eq!(FabricKind::of_card(&card.bytes), Some(FabricKind::Verbs));
        }
    }

    #[test]
    fn mismatched_and_malformed_cards_are_refused() {
        let f = AnyFabric::emulated().unwrap();
        let e = f
            .create_qp()
            .unwrap()
            .connect(Card {
                bytes: b"RCHV\x01\x00rest of a verbs card".to_vec(),
                fds: Vec::new(),
            })
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput);
        let msg = e.to_string();
        assert!(
            msg.contains("verbs fabric") && msg.contains("emulated fabric"),
            "{msg}"
        );
        assert!(msg.contains("RCH_FABRIC"), "{msg}");
        // Neither fabric's card: the fabric's own check answers (InvalidData).
        let e = f
            .create_qp()
            .unwrap()
            .connect(Card {
                bytes: b"junk".to_vec(),
                fds: Vec::new(),
            })
            .unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidData, "{e}");
    }

    #[test]
    fn every_call_is_forwarded() {
        let any = AnyFabric::emulated().unwrap();
        let emu = any.as_emulated().unwrap().clone();
        assert_eq!(any.name(), emu.name());
        assert_eq!(any.caps(), emu.caps());
        assert_eq!(any.zero_copy_defaults(), emu.zero_copy_defaults());
        let r = any.alloc_region(4096, Access::REMOTE_READ).unwrap();
        assert!(matches!(r, AnyRegion::Emulated(_)));
        assert_eq!((r.len(), r.is_empty()), (4096, false));
        assert_eq!(r.remote().addr, r.addr() as u64);
        let other = any.for_connection().unwrap();
        let (pa, pb) = (any.create_qp().unwrap(), other.create_qp().unwrap());
        let (ca, cb) = (pa.card().unwrap(), pb.card().unwrap());
        let (qa, qb) = (pa.connect(cb).unwrap(), pb.connect(ca).unwrap());
        assert_eq!(qa.caps(), emu.caps());
        assert_eq!(qa.state(), QpState::ReadyToSend);
        drop(qb);
        assert_eq!(qa.state(), QpState::Error);
    }
}
