//! The verbs fabric: the [`Fabric`] traits over real InfiniBand verbs (`libibverbs`,
//! through the `rdma-sys` bindings), for InfiniBand HCAs, RoCE NICs and Soft-RoCE
//! (`rdma_rxe`). Built with cargo feature `verbs`.
//!
//! # Objects
//!
//! Each verbs object has one RAII type that releases it on drop, and every object holds
//! an `Arc` of what it was made from, so they are always released in the right order:
//!
//! | verbs object | type | released with |
//! | --- | --- | --- |
//! | `ibv_context` (open device) | [`Context`] | `ibv_close_device` |
//! | `ibv_pd` | [`ProtectionDomain`] | `ibv_dealloc_pd` |
//! | `ibv_cq` | [`CompletionQueue`] | `ibv_destroy_cq` |
//! | `ibv_qp` (RC) | [`RcQueuePair`] (inside [`VerbsPending`] / [`VerbsQp`]) | `ibv_destroy_qp` |
//! | `ibv_mr` | [`VerbsRegion`] | `ibv_dereg_mr` (then `munmap` for owned pages) |
//!
//! Every error names the verb and carries the errno, e.g.
//! `ibv_reg_mr: Cannot allocate memory (os error 12)`.
//!
//! # Mapping of the fabric contract
//!
//! * [`VerbsFabric`] is a protection domain on one port of one device.
//!   [`alloc_region`](Fabric::alloc_region) maps zeroed, page-aligned anonymous memory
//!   and registers it; [`register`](Fabric::register) registers caller memory. Verbs
//!   need `IBV_ACCESS_LOCAL_WRITE` with remote rights, so it is added (and reported by
//!   [`MemoryRegion::access`]).
//! * [`create_qp`](Fabric::create_qp) makes an RC queue pair with its own completion
//!   queue, moved to INIT. Its card ([`PendingQp::card`]) carries link layer, MTU, LID,
//!   GID, QP number, a random 24-bit PSN and the READ depth it accepts, and no
//!   descriptors. [`PendingQp::connect`] validates the peer's card
//!   ([`io::ErrorKind::InvalidData`]), then moves to RTR (path MTU = the smaller active
//!   MTU, GRH when the link layer is Ethernet or the GID is set) and RTS (timeout 14,
//!   retry count 6, RNR retry 7; see [`VerbsConfig`] for why 6).
//! * [`QueuePair::post`] is one `ibv_post_send` (RDMA WRITE / READ, `IBV_SEND_INLINE`,
//!   `IBV_SEND_SIGNALED`) and allocates nothing. A full send queue (`ENOMEM`) is
//!   [`FabricError::QueueFull`]. [`Caps::max_send_wr`] is the send queue depth (finite,
//!   so the engine signals every half queue), [`Caps::max_inline`] the inline size the
//!   queue pair was actually created with.
//! * [`QueuePair::poll`] is `ibv_poll_cq`; error statuses map to [`CompletionStatus`]
//!   (`LOC_PROT_ERR`, `REM_ACCESS_ERR`, `LOC_LEN_ERR`, `WR_FLUSH_ERR` one to one,
//!   everything else, retry exhaustion included, to `TransportError`) and make the
//!   error state sticky. [`QueuePair::state`] also asks the device at most once per
//!   millisecond (`ibv_query_qp`, and the context's asynchronous events, read without
//!   blocking).
//!
//! The fabric guarantees of [`crate::fabric`] hold as on any RC queue pair: writes are
//! placed in posting order, and the ring's "last word last" rule relies on in-order
//! placement within a write, as seed 000 (Liu, Wu, Panda, ICS
//! 2003) sec. 4.2 does for InfiniBand hardware.
//!
//! # Choosing device, port and GID
//!
//! [`VerbsFabric::open`] reads [`VerbsConfig::from_env`]: `RCH_IB_DEVICE` (default: the
//! first device), `RCH_IB_PORT` (default 1), `RCH_IB_GID_INDEX`, else
//! `SOFTROCE_GID_INDEX`, else automatic: on Ethernet (RoCE) the first RoCE v2 GID
//! holding an IPv4 address (then any IPv4-mapped GID, then any RoCE v2 GID, then any
//! non-zero one); on InfiniBand index 0.
//!
//! # Example
//!
//! ```no_run
//! use rdma_channel::fabric::verbs::VerbsFabric;
//! use rdma_channel::{Config, Prepared};
//!
//! let a = Prepared::new(VerbsFabric::open()?, Config::default())?;
//! let b = Prepared::new(VerbsFabric::open()?, Config::default())?;
//! let (card_a, card_b) = (a.card()?, b.card()?);
//! let (mut a, mut b) = (a.connect(card_b)?, b.connect(card_a)?);
//! # let _ = (&mut a, &mut b);
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! [`MemoryRegion::access`]: crate::fabric::MemoryRegion::access
//! [`PendingQp::card`]: crate::fabric::PendingQp::card
//! [`PendingQp::connect`]: crate::fabric::PendingQp::connect
//! [`QueuePair::post`]: crate::fabric::QueuePair::post
//! [`QueuePair::poll`]: crate::fabric::QueuePair::poll
//! [`QueuePair::state`]: crate::fabric::QueuePair::state
//! [`FabricError::QueueFull`]: crate::fabric::FabricError::QueueFull
//! [`CompletionStatus`]: crate::fabric::CompletionStatus

mod card;
pub mod cm;
mod device;
mod error;
mod mr;
mod qp;

pub use device::{
    device_names, software_device_present, CompChannel, CompletionQueue, Context, ProtectionDomain,
};
pub use mr::VerbsRegion;
pub use qp::{RcQueuePair, VerbsPending, VerbsQp, MAX_SGE};

use self::card::{LINK_LAYER_ETHERNET, LINK_LAYER_INFINIBAND};
use self::cm::CmId;
use self::qp::{Endpoint, QpRequest};
use super::{Access, Caps, Fabric, ZeroCopyThresholds};
use std::io;
use std::sync::Arc;

/// Settings of [`VerbsFabric::open_with`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerbsConfig {
    /// Device name (`rxe0`, `mlx5_0`); `None` for the first device.
    pub device: Option<String>,
    /// Port number (from 1).
    pub port: u8,
    /// GID index; `None` to choose automatically (see the module documentation).
    pub gid_index: Option<u32>,
    /// Send queue depth to create queue pairs with ([`Caps::max_send_wr`]).
    pub send_queue_depth: u32,
    /// Inline size to ask for; the granted size is [`Caps::max_inline`].
    pub max_inline: u32,
    /// Gather entries to ask for (at most [`MAX_SGE`]).
    pub max_sge: u32,
    /// Local ACK timeout exponent: a request is retried after 4.096 µs × 2^`timeout`
    /// without an acknowledgement (14: about 67 ms; with 7 tries a dead peer is
    /// noticed in about 0.5 s). Raise it (`RCH_IB_TIMEOUT`) where the peer may stall
    /// longer, as emulated VMs on a loaded host do.
    pub timeout: u8,
    /// Transport retries before a request fails with `IBV_WC_RETRY_EXC_ERR`
    /// ([`CompletionStatus::TransportError`]). The default is 6, not the usual 7:
    /// Soft-RoCE (`rdma_rxe`) treats 7 as "retry forever", so a vanished peer would
    /// never be reported.
    ///
    /// [`CompletionStatus::TransportError`]: crate::fabric::CompletionStatus::TransportError
    pub retry_count: u8,
    /// Receiver-not-ready retries (7: forever; the channel posts no receives, so RNR
    /// never happens).
    pub rnr_retry: u8,
    /// Silence on a queue pair's send queue after which it sends a keepalive (a
    /// zero-length RDMA WRITE), so that a process that only reads still learns of a
    /// dead peer or link (`RCH_IB_KEEPALIVE_MS`; 0 turns keepalives off).
    pub keepalive: std::time::Duration,
    /// Whether a connection's blocking waits (reads, waits for room) block until
    /// the peer writes (`RCH_IB_WAKE=1`; off by default), on the completion
    /// channel of [`take_wakes`](Self::take_wakes), instead of sleeping on a timer.
    /// That frees the CPU entirely while a process waits. It is off by default
    /// because between two one-CPU Soft-RoCE VMs it was slower than the timer
    /// (2 B latency 434-720 us against 376-497 sleeping, in four one-boot A/Bs,
    /// bench/notebook/2026-11.md, 2026-11-26): there a blocked guest CPU is a descheduled
    /// host thread, slow to wake. Implies `take_wakes`.
    pub wake: bool,
    /// Whether queue pairs take *wakes* (`RCH_IB_WAKE=select` or `1`; off by
    /// default): a receive queue of 1,024 zero-length receives and a completion
    /// channel per queue pair, and the peer writes with immediate data (within a
    /// budget of those receives), so that a selector or an async task sleeps in
    /// the kernel until the peer writes (`crate::select`). Blocking waits use them
    /// only with [`wake`](Self::wake). Off by default for what it costs every
    /// write: between two one-CPU Soft-RoCE VMs 2 B latency 352 against 339 us and
    /// 4 KiB 12.4 against 14.6 MB/s (medians of 5 interleaved rounds, 64 KiB level,
    /// bench/notebook/2026-12.md).
    pub take_wakes: bool,
}

impl Default for VerbsConfig {
    fn default() -> VerbsConfig {
        VerbsConfig {
            device: None,
            port: 1,
            gid_index: None,
            send_queue_depth: 256,
            max_inline: 256,
            max_sge: MAX_SGE as u32,
            timeout: 14,
            retry_count: 6,
            rnr_retry: 7,
            keepalive: std::time::Duration::from_millis(1000),
            wake: false,
            take_wakes: false,
        }
    }
}

impl VerbsConfig {
    /// The defaults, overridden by `RCH_IB_DEVICE`, `RCH_IB_PORT`,
    /// `RCH_IB_GID_INDEX` (or, without it, `SOFTROCE_GID_INDEX`), `RCH_IB_TIMEOUT`
    /// (the ACK timeout exponent), `RCH_IB_KEEPALIVE_MS` and `RCH_IB_WAKE` (`0`,
    /// the default: no wakes; `select`: wakes for selectors and async tasks only;
    /// `1`: blocking waits block on them too).
    ///
    /// ```
    /// let cfg = rdma_channel::fabric::verbs::VerbsConfig::from_env()?;
    /// assert!(cfg.port >= 1);
    /// # Ok::<(), std::io::Error>(())
    /// ```
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::InvalidInput`] for a variable that is not a number.
    pub fn from_env() -> io::Result<VerbsConfig> {
        use crate::settings as env;
        let mut cfg = VerbsConfig::default();
        if let Some(d) = env::IB_DEVICE.value()? {
            cfg.device = Some(d.trim().to_string());
        }
        if let Some(p) = env::IB_PORT.number::<u8>()? {
            cfg.port = p;
        }
        cfg.gid_index = match env::IB_GID_INDEX.number::<u32>()? {
            Some(i) => Some(i),
            None => env::SOFTROCE_GID_INDEX.number::<u32>()?,
        };
        if let Some(t) = env::IB_TIMEOUT.number::<u8>()? {
            cfg.timeout = t.min(31);
        }
        if let Some(ms) = env::IB_KEEPALIVE_MS.number::<u64>()? {
            cfg.keepalive = std::time::Duration::from_millis(ms);
        }
        (cfg.wake, cfg.take_wakes) = wake_setting(env::IB_WAKE.value()?.as_deref())?;
        Ok(cfg)
    }
}

/// `RCH_IB_WAKE`'s value as ([`VerbsConfig::wake`], [`VerbsConfig::take_wakes`]).
fn wake_setting(value: Option<&str>) -> io::Result<(bool, bool)> {
    match value.map(str::trim) {
        None | Some("0") => Ok((false, false)),
        Some("select") => Ok((false, true)),
        Some("1") => Ok((true, true)),
        Some(v) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("RCH_IB_WAKE={v:?} is none of 0, select and 1"),
        )),
    }
}

/// Score of a GID for automatic selection on Ethernet (higher is better).
fn gid_score(gid: &[u8; 16], gid_type: Option<&str>) -> u32 {
    if *gid == [0; 16] {
        return 0;
    }
    let v4 = gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff];
    let v2 = gid_type.is_some_and(|t| t.eq_ignore_ascii_case("RoCE v2"));
    1 + u32::from(v2) + 2 * u32::from(v4)
}

struct Inner {
    pd: Arc<ProtectionDomain>,
    cfg: VerbsConfig,
    gid_index: u32,
    gid: [u8; 16],
    link_layer: u8,
    request: QpRequest,
    caps: Caps,
    rd_atomic_dest: u8,
    rd_atomic_init: u8,
}

/// A protection domain on one port of one RDMA device: the verbs [`Fabric`].
/// Cloning is cheap and shares the domain.
#[derive(Clone)]
pub struct VerbsFabric {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for VerbsFabric {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsFabric")
            .field("device", &self.device_name())
            .field("port", &self.inner.cfg.port)
            .field("gid_index", &self.inner.gid_index)
            .field("caps", &self.inner.caps)
            .finish()
    }
}

impl VerbsFabric {
    /// Opens the fabric as [`VerbsConfig::from_env`] says.
    ///
    /// # Errors
    ///
    /// As [`open_with`](Self::open_with), plus malformed environment variables.
    pub fn open() -> io::Result<VerbsFabric> {
        VerbsFabric::open_with(VerbsConfig::from_env()?)
    }

    /// Opens the device, checks the port, picks the GID, allocates the protection
    /// domain, and creates (and destroys) one probe queue pair to learn the limits the
    /// device grants ([`caps`](Fabric::caps)).
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::NotFound`] ("no RDMA device found: ...") without a device or
    /// without the named one; `NotConnected` for a port that is not active;
    /// `InvalidInput` for an empty GID entry; failures of the verbs with their errno.
    pub fn open_with(cfg: VerbsConfig) -> io::Result<VerbsFabric> {
        let ctx = Arc::new(Context::open(cfg.device.as_deref())?);
        Self::on_context(ctx, cfg)
    }

    /// The fabric on the device and port an rdma_cm id is bound to (after address or
    /// route resolution, a bind to a device's address, or on a connection request):
    /// one per device and port for the whole process, on librdmacm's own context of
    /// the device, so that queue pairs made with [`create_qp_on`](Self::create_qp_on)
    /// and the memory they use are in the same protection domain. The settings other
    /// than device, port and GID come from [`VerbsConfig::from_env`].
    ///
    /// # Errors
    ///
    /// `NotConnected` when the id is bound to no device yet; as
    /// [`open_with`](Self::open_with) otherwise.
    pub fn for_cm_id(id: &CmId) -> io::Result<VerbsFabric> {
        static FABRICS: std::sync::Mutex<Vec<(usize, u8, VerbsFabric)>> =
            std::sync::Mutex::new(Vec::new());
        let ctx = id.verbs().ok_or_else(|| {
            io::Error::new(
                io::ErrorKind::NotConnected,
                "the rdma_cm id is bound to no RDMA device",
            )
        })?;
        let port = id.port_num().max(1);
        let mut all = FABRICS.lock().unwrap_or_else(|e| e.into_inner());
        if let Some((_, _, f)) = all
            .iter()
            .find(|(c, p, _)| *c == ctx.as_ptr() as usize && *p == port)
        {
            return Ok(f.clone());
        }
        device::keep_rdma_cm_devices()?;
        // SAFETY: `ctx` is librdmacm's context of the id's device, which
        // keep_rdma_cm_devices keeps open for the rest of the process.
        let context = Arc::new(unsafe { Context::of_rdma_cm(ctx) }?);
        let mut cfg = VerbsConfig::from_env()?;
        cfg.device = Some(context.name().to_string());
        cfg.port = port;
        // The connection manager picks the GID of its queue pairs itself; the fabric's
        // own choice only serves queue pairs connected by card exchange.
        let f = Self::on_context(context, cfg)?;
        all.push((ctx.as_ptr() as usize, port, f.clone()));
        Ok(f)
    }

    fn on_context(ctx: Arc<Context>, cfg: VerbsConfig) -> io::Result<VerbsFabric> {
        let dev = ctx.query_device()?;
        let port = ctx.query_port(cfg.port).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("port {} of {}: {e}", cfg.port, ctx.name()),
            )
        })?;
        if port.state != rdma_sys::ibv_port_state::IBV_PORT_ACTIVE
            && port.state != rdma_sys::ibv_port_state::IBV_PORT_ACTIVE_DEFER
        {
            return Err(io::Error::new(
                io::ErrorKind::NotConnected,
                format!(
                    "port {} of {} is not active (state {})",
                    cfg.port,
                    ctx.name(),
                    port.state
                ),
            ));
        }
        let link_layer = if port.link_layer == LINK_LAYER_ETHERNET {
            LINK_LAYER_ETHERNET
        } else {
            LINK_LAYER_INFINIBAND
        };
        let gid_index = match cfg.gid_index {
            Some(i) => i,
            None if link_layer == LINK_LAYER_INFINIBAND => 0,
            None => {
                let n = u32::try_from(port.gid_tbl_len).unwrap_or(0).min(256);
                let mut best = (0, 0);
                for i in 0..n {
                    let Ok(gid) = ctx.query_gid(cfg.port, i) else {
                        continue;
                    };
                    let score = gid_score(&gid, ctx.gid_type(cfg.port, i).as_deref());
                    if score > best.0 {
                        best = (score, i);
                    }
                    if score == 4 {
                        break;
                    }
                }
                best.1
            }
        };
        let gid = ctx.query_gid(cfg.port, gid_index).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!(
                    "GID index {gid_index} of {} port {}: {e}",
                    ctx.name(),
                    cfg.port
                ),
            )
        })?;
        if link_layer == LINK_LAYER_ETHERNET && gid == [0; 16] {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "GID index {gid_index} of {} port {} is empty (set RCH_IB_GID_INDEX)",
                    ctx.name(),
                    cfg.port
                ),
            ));
        }
        let pd = Arc::new(ProtectionDomain::new(ctx.clone())?);
        let max_wr = u32::try_from(dev.max_qp_wr).unwrap_or(0).max(2);
        let max_sge = u32::try_from(dev.max_sge).unwrap_or(0).max(1);
        let request = QpRequest {
            send_wr: cfg.send_queue_depth.clamp(2, max_wr),
            send_sge: cfg.max_sge.clamp(1, MAX_SGE as u32).min(max_sge),
            inline: cfg.max_inline,
            recv_wr: if cfg.wake || cfg.take_wakes {
                qp::WAKE_RECEIVES.min(max_wr)
            } else {
                0
            },
        };
        let probe = RcQueuePair::create(pd.clone(), request)?;
        let granted = probe.cap();
        drop(probe);
        // Later queue pairs ask for what the probe was granted, so they all match caps.
        let request = QpRequest {
            send_wr: request.send_wr,
            send_sge: granted.max_send_sge.min(request.send_sge.max(1)),
            inline: granted.max_inline_data,
            recv_wr: request.recv_wr,
        };
        let caps = Caps {
            max_inline: granted.max_inline_data as usize,
            max_sge: request.send_sge as usize,
            max_send_wr: granted.max_send_wr.min(request.send_wr) as usize,
            max_rd_atomic: usize::try_from(dev.max_qp_rd_atom).unwrap_or(0),
        };
        Ok(VerbsFabric {
            inner: Arc::new(Inner {
                pd,
                cfg,
                gid_index,
                gid,
                link_layer,
                request,
                caps,
                rd_atomic_dest: dev.max_qp_rd_atom.clamp(1, 255) as u8,
                rd_atomic_init: dev.max_qp_init_rd_atom.clamp(1, 255) as u8,
            }),
        })
    }

    /// The device name.
    pub fn device_name(&self) -> &str {
        self.inner.pd.context().name()
    }

    /// The port in use.
    pub fn port(&self) -> u8 {
        self.inner.cfg.port
    }

    /// The GID index in use.
    pub fn gid_index(&self) -> u32 {
        self.inner.gid_index
    }

    /// The GID in use (16 bytes, network order).
    pub fn gid(&self) -> [u8; 16] {
        self.inner.gid
    }

    /// True on an Ethernet (RoCE) port, false on InfiniBand.
    pub fn is_roce(&self) -> bool {
        self.inner.link_layer == LINK_LAYER_ETHERNET
    }

    /// Creates a queue pair on an rdma_cm id whose device is this fabric's (see
    /// [`for_cm_id`](Self::for_cm_id)); the connection manager connects it, and its
    /// [`PendingQp::card`](crate::fabric::PendingQp::card) is the short rdma_cm card.
    ///
    /// # Errors
    ///
    /// `InvalidInput` when the id is on another device; `rdma_create_qp` failures.
    pub fn create_qp_on(&self, id: Arc<CmId>) -> io::Result<VerbsPending> {
        if id.verbs().map(|c| c.as_ptr()) != Some(self.inner.pd.context().as_ptr()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "the rdma_cm id is on another device context than this fabric \
                 (use VerbsFabric::for_cm_id)",
            ));
        }
        let i = &self.inner;
        VerbsPending::new_on(i.pd.clone(), i.request, self.endpoint()?, i.caps, id)
    }

    /// The rdma_cm connection parameters of this fabric's queue pairs: the RDMA READ
    /// depths the device allows and the retry counts of [`VerbsConfig`].
    pub fn conn_params(&self) -> cm::ConnParams {
        let i = &self.inner;
        cm::ConnParams {
            responder_resources: i.rd_atomic_dest,
            initiator_depth: i.rd_atomic_init,
            retry_count: i.cfg.retry_count.min(7),
            rnr_retry_count: i.cfg.rnr_retry.min(7),
        }
    }

    /// The local ACK timeout exponent of [`VerbsConfig`].
    pub fn ack_timeout(&self) -> u8 {
        self.inner.cfg.timeout.min(31)
    }

    fn endpoint(&self) -> io::Result<Endpoint> {
        let i = &self.inner;
        // Ask the port again: LID and active MTU may have changed since `open`.
        let port = i.pd.context().query_port(i.cfg.port)?;
        Ok(Endpoint {
            port: i.cfg.port,
            gid_index: i.gid_index,
            gid: i.gid,
            lid: port.lid,
            link_layer: i.link_layer,
            active_mtu: port.active_mtu,
            rd_atomic_dest: i.rd_atomic_dest,
            rd_atomic_init: i.rd_atomic_init,
            timeout: i.cfg.timeout.min(31),
            retry_cnt: i.cfg.retry_count.min(7),
            rnr_retry: i.cfg.rnr_retry.min(7),
            keepalive: i.cfg.keepalive,
        })
    }

    /// The protection domain (and through it the device context).
    pub fn protection_domain(&self) -> &Arc<ProtectionDomain> {
        &self.inner.pd
    }
}

impl Fabric for VerbsFabric {
    type Region = VerbsRegion;
    type Qp = VerbsQp;
    type Pending = VerbsPending;

    fn alloc_region(&self, len: usize, access: Access) -> io::Result<VerbsRegion> {
        VerbsRegion::alloc(self.inner.pd.clone(), len, access)
    }

    unsafe fn register(
        &self,
        addr: *mut u8,
        len: usize,
        access: Access,
    ) -> io::Result<VerbsRegion> {
        // SAFETY: forwarded from this function's contract.
        unsafe { VerbsRegion::register(self.inner.pd.clone(), addr, len, access) }
    }

    fn caps(&self) -> Caps {
        self.inner.caps
    }

    /// A rail on another device or port opens that device (its own protection
    /// domain, the GID chosen there); one on this domain's device and port is `None`.
    fn rail_domain(&self, spec: &crate::config::RailSpec) -> io::Result<Option<VerbsFabric>> {
        let device = spec.device.as_deref().unwrap_or(self.device_name());
        let port = spec.port.unwrap_or(self.inner.cfg.port);
        if device == self.device_name() && port == self.inner.cfg.port {
            return Ok(None);
        }
        let cfg = VerbsConfig {
            device: Some(device.to_string()),
            port,
            gid_index: None,
            ..self.inner.cfg.clone()
        };
        VerbsFabric::open_with(cfg)
            .map(Some)
            .map_err(|e| io::Error::new(e.kind(), format!("rail {spec}: {e}")))
    }

    fn create_qp(&self) -> io::Result<VerbsPending> {
        let i = &self.inner;
        VerbsPending::new(i.pd.clone(), i.request, self.endpoint()?, i.caps)
    }

    fn name(&self) -> &'static str {
        "verbs"
    }

    fn domain_id(&self) -> usize {
        // The shared state (which owns the protection domain): stable while any
        // clone lives, and a live domain's address is never another's.
        Arc::as_ptr(&self.inner) as usize
    }

    /// A zero-copy transfer pays announcement, lend or READ request, and
    /// confirmation, about three one-way latencies, per message, and only one
    /// transfer per direction is in flight; the ring keeps a window of messages in
    /// flight for the price of the copies. Between two Soft-RoCE VMs the ring moved
    /// 64 KiB messages 1.6-1.7x faster than any zero-copy form, and READ lost
    /// dropped responses to the ACK timeout (3.2 against the ring's 10.5 MB/s at
    /// 1 MiB), while a transfer pushed whole by the sender was level with the ring
    /// at 1 MiB (bench/notebook/2026-11.md, 2026-11-25). So a peer elsewhere gets zero-copy
    /// from 1 MiB, pushed. Memory from `alloc_mem` is registered already but the
    /// round trips are the same, hence one threshold.
    fn zero_copy_defaults(&self) -> ZeroCopyThresholds {
        ZeroCopyThresholds {
            alloc_mem: ZERO_COPY_REMOTE,
            other: ZERO_COPY_REMOTE,
        }
    }

    /// A software device (Soft-RoCE, siw) sits under `/sys/devices/virtual`.
    fn uses_host_cpus(&self) -> bool {
        device::is_software_device(self.device_name())
    }

    /// Only with `RCH_IB_WAKE=1` ([`VerbsConfig::wake`]).
    fn blocking_waits_take_wakes(&self) -> bool {
        self.inner.cfg.wake
    }

    /// On this same port the round trips are short against the copies, and
    /// splitting a transfer between READ and push keeps two CPUs at rxe's work
    /// where the ring's copies and `ib_write_bw` keep one: 64 KiB messages at
    /// 43.6 MB/s against the ring's 31.0 and `ib_write_bw`'s 31.6 in one boot
    /// (bench/notebook/2026-11.md, 2026-11-25).
    fn zero_copy_loopback_defaults(&self) -> ZeroCopyThresholds {
        ZeroCopyThresholds {
            alloc_mem: ZERO_COPY_LOOPBACK,
            other: ZERO_COPY_LOOPBACK,
        }
    }

    /// rxe does a request's work on the CPU that posts it: on the same port half of
    /// each transfer pushed and half read keeps both CPUs busy; to a peer elsewhere
    /// READ responses lost on the link wait for the ACK timeout, so all of it is
    /// pushed (see above).
    fn zero_copy_push_default(&self, loopback: bool) -> u8 {
        if loopback {
            50
        } else {
            100
        }
    }
}

/// Smallest buffer sent zero-copy by default on verbs to a peer elsewhere.
const ZERO_COPY_REMOTE: usize = 1 << 20;
/// The same for a peer on this same port.
const ZERO_COPY_LOOPBACK: usize = 64 << 10;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wake_settings_parse_and_reject_others() {
        for (v, want) in [
            (None, (false, false)),
            (Some("0"), (false, false)),
            (Some(" select\n"), (false, true)),
            (Some("1"), (true, true)),
        ] {
            assert_eq!(super::wake_setting(v).unwrap(), want, "{v:?}");
        }
        let e = super::wake_setting(Some("yes")).unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::InvalidInput);
        assert!(e.to_string().contains("none of 0, select and 1"), "{e}");
    }

    #[test]
    fn gid_scores_prefer_roce_v2_ipv4() {
        let v4 = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 169, 254, 77, 1];
        let mut ll = [0u8; 16];
        ll[0] = 0xfe;
        ll[1] = 0x80;
        ll[15] = 1;
        assert_eq!(gid_score(&[0; 16], Some("RoCE v2")), 0);
        assert_eq!(gid_score(&v4, Some("RoCE v2")), 4);
        assert!(gid_score(&v4, Some("IB/RoCE v1")) > gid_score(&ll, Some("RoCE v2")));
        assert!(gid_score(&ll, Some("RoCE v2")) > gid_score(&ll, None));
    }

    #[test]
    fn open_without_device_is_a_clear_error() {
        // On hosts with a device this opens it; on hosts without one it must be an
        // error that says so, never a panic.
        match VerbsFabric::open() {
            Ok(f) => assert!(f.caps().max_send_wr < usize::MAX),
            Err(e) => {
                if e.kind() == io::ErrorKind::NotFound {
                    assert!(e.to_string().contains("RDMA device"), "{e}");
                }
            }
        }
    }
}
