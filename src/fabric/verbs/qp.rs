//! Reliable-connection queue pairs: the RAII [`RcQueuePair`], the unconnected
//! [`VerbsPending`] and the connected [`VerbsQp`].

use super::card::{QpCard, CM_CARD, LINK_LAYER_ETHERNET};
use super::cm::{CmEventKind, CmId};
use super::device::{CompChannel, CompletionQueue, Context, ProtectionDomain};
use super::error::{check, errno_of, last_verb_error, verb_error};
use crate::fabric::{
    Caps, Card, CompletedOp, Completion, CompletionStatus, FabricError, Opcode, PendingQp, QpState,
    QueuePair, WorkRequest,
};
use rdma_sys as sys;
use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

/// Most gather/scatter entries one work request may carry (the stack array in
/// [`VerbsQp::post`]).
pub const MAX_SGE: usize = 30;

/// Completions fetched per `ibv_poll_cq` call.
const POLL_BATCH: usize = 16;

/// How often (nanoseconds) [`VerbsQp::state`] asks the device.
const STATE_CHECK_NS: u64 = 1_000_000;

/// Send queue entries beyond the engine's depth, for the queue pair's own requests:
/// one keepalive, one linger marker and one wake report (see [`VerbsQp`]).
const RESERVED_WR: u32 = 3;
/// `wr_id` of a keepalive write; never returned by [`VerbsQp::poll`].
const KEEPALIVE_WR_ID: u64 = u64::MAX - 1;
/// `wr_id` of the linger marker posted on drop.
const LINGER_WR_ID: u64 = u64::MAX - 2;
/// `wr_id` of the zero-length receives that take the peer's wakes.
const WAKE_RECV_WR_ID: u64 = u64::MAX - 3;
/// `wr_id` of a wake report (a zero-length write with immediate data).
const REPORT_WR_ID: u64 = u64::MAX - 4;
/// Receives the peer may not be sure are posted again: our wakes in flight or not
/// yet reaped there stay below the peer's receive queue depth by this much, which
/// covers posts that race past the budget check, and the report.
const WAKE_MARGIN: u32 = 64;
/// Receives a queue pair that accepts wakes keeps posted (both ends post this
/// many, so each knows the other's depth). They are posted again as their
/// completions are reaped: at every poll of the queue pair and every wait.
pub(crate) const WAKE_RECEIVES: u32 = 1024;
/// How long a dropped queue pair waits for its last writes to be acknowledged.
const LINGER: std::time::Duration = std::time::Duration::from_secs(2);

/// What a queue pair is created with (upper bounds; the device may give more).
#[derive(Clone, Copy, Debug)]
pub(crate) struct QpRequest {
    pub send_wr: u32,
    pub send_sge: u32,
    pub inline: u32,
    /// Receive queue depth for wakes (see `VerbsConfig::wake`); 0: the queue pair
    /// accepts no wakes, and has no completion channel.
    pub recv_wr: u32,
}

/// Where and how a queue pair talks: the port and address of this end, plus the
/// RDMA READ limits of the device.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Endpoint {
    pub port: u8,
    pub gid_index: u32,
    pub gid: [u8; 16],
    pub lid: u16,
    pub link_layer: u8,
    pub active_mtu: u32,
    /// READs we accept as responder (`max_dest_rd_atomic`).
    pub rd_atomic_dest: u8,
    /// READs we may issue as initiator, before the peer's limit (`max_rd_atomic`).
    pub rd_atomic_init: u8,
    /// Local ACK timeout exponent (4.096 µs × 2^timeout).
    pub timeout: u8,
    /// Transport retries before `IBV_WC_RETRY_EXC_ERR`.
    pub retry_cnt: u8,
    /// RNR retries (7 = infinite).
    pub rnr_retry: u8,
    /// Silence on the send queue after which a keepalive is sent.
    pub keepalive: std::time::Duration,
}

/// An RC queue pair (`ibv_qp`) with its own completion queue, and, where it accepts
/// wakes, a second one for its receives, both on a completion channel of its own.
/// Dropping it destroys the queue pair, then the completion queues, then the channel.
pub struct RcQueuePair {
    qp: NonNull<sys::ibv_qp>,
    qpn: u32,
    cap: sys::ibv_qp_cap,
    /// Dropped after `qp` is destroyed (in `Drop`).
    cq: CompletionQueue,
    /// The receive queue's completions (wakes), when the queue pair takes them.
    recv_cq: Option<CompletionQueue>,
    /// The channel both queues signal (dropped after them: it is declared later and
    /// each queue holds an `Arc` of it).
    channel: Option<Arc<CompChannel>>,
    pd: Arc<ProtectionDomain>,
    /// The rdma_cm id the queue pair was made on (`rdma_create_qp`), which then
    /// destroys it (`rdma_destroy_qp`) and outlives it.
    cm: Option<Arc<CmId>>,
}

// SAFETY: verbs on a QP are thread-safe (providers lock the send queue); the raw
// pointer is only used through verbs.
unsafe impl Send for RcQueuePair {}
// SAFETY: as above.
unsafe impl Sync for RcQueuePair {}

impl std::fmt::Debug for RcQueuePair {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RcQueuePair")
            .field("qpn", &self.qpn)
            .field("max_send_wr", &self.cap.max_send_wr)
            .field("max_send_sge", &self.cap.max_send_sge)
            .field("max_inline_data", &self.cap.max_inline_data)
            .finish()
    }
}

impl RcQueuePair {
    /// Creates a completion queue and an RC queue pair in `pd` (state RESET). If the
    /// device refuses the inline size, it is halved until accepted (down to 0).
    ///
    /// # Errors
    ///
    /// `ibv_create_cq` / `ibv_create_qp` failures with their errno.
    pub(crate) fn create(pd: Arc<ProtectionDomain>, req: QpRequest) -> io::Result<RcQueuePair> {
        Self::create_with(pd, req, None)
    }

    /// As [`create`](Self::create), through `rdma_create_qp` on an rdma_cm id whose
    /// device context is `pd`'s. librdmacm moves it to INIT, and later (on connect or
    /// accept) to RTR and RTS.
    ///
    /// # Errors
    ///
    /// `rdma_create_qp` failures with their errno (`EINVAL` when `pd` is on another
    /// context than the id).
    pub(crate) fn create_on(
        pd: Arc<ProtectionDomain>,
        req: QpRequest,
        cm: Arc<CmId>,
    ) -> io::Result<RcQueuePair> {
        Self::create_with(pd, req, Some(cm))
    }

    fn create_with(
        pd: Arc<ProtectionDomain>,
        req: QpRequest,
        cm: Option<Arc<CmId>>,
    ) -> io::Result<RcQueuePair> {
        // Room for one completion per send queue entry, twice over: flushed requests
        // after an error and signalled completions never overflow it.
        let channel = if req.recv_wr > 0 {
            Some(Arc::new(CompChannel::new(pd.context().clone())?))
        } else {
            None
        };
        let cq = CompletionQueue::with_channel(
            pd.context().clone(),
            req.send_wr.saturating_mul(2) + 16,
            channel.clone(),
        )?;
        // As above: every posted receive completes once, successfully or flushed.
        let recv_cq = match &channel {
            Some(ch) => Some(CompletionQueue::with_channel(
                pd.context().clone(),
                req.recv_wr.saturating_mul(2) + 16,
                Some(ch.clone()),
            )?),
            None => None,
        };
        let mut inline = req.inline;
        loop {
            // SAFETY: ibv_qp_init_attr is plain C data; all-zero is valid.
            let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
            init.send_cq = cq.as_ptr();
            init.recv_cq = recv_cq.as_ref().unwrap_or(&cq).as_ptr();
            init.qp_type = sys::ibv_qp_type::IBV_QPT_RC;
            init.sq_sig_all = 0;
            init.cap = sys::ibv_qp_cap {
                max_send_wr: req.send_wr + RESERVED_WR,
                max_recv_wr: req.recv_wr.max(1),
                max_send_sge: req.send_sge,
                max_recv_sge: 1,
                max_inline_data: inline,
            };
            let qp = match &cm {
                // SAFETY: valid PD and CQ; `init` is initialised; on success the
                // provider writes the granted capabilities back into `init.cap`.
                None => unsafe { sys::ibv_create_qp(pd.as_ptr(), &mut init) },
                Some(id) => {
                    // SAFETY: valid id, PD and CQ, `init` as above; on success the id's
                    // `qp` field holds the new queue pair.
                    let r = unsafe { sys::rdma_create_qp(id.as_ptr(), pd.as_ptr(), &mut init) };
                    if r == 0 {
                        // SAFETY: valid id, whose qp rdma_create_qp just set.
                        unsafe { (*id.as_ptr()).qp }
                    } else {
                        std::ptr::null_mut()
                    }
                }
            };
            match NonNull::new(qp) {
                Some(qp) => {
                    // SAFETY: a freshly created, valid QP.
                    let qpn = unsafe { (*qp.as_ptr()).qp_num };
                    let mut cap = init.cap;
                    cap.max_send_wr = cap.max_send_wr.saturating_sub(RESERVED_WR);
                    return Ok(RcQueuePair {
                        qp,
                        qpn,
                        cap,
                        cq,
                        recv_cq,
                        channel,
                        pd,
                        cm,
                    });
                }
                None => {
                    let verb = if cm.is_some() {
                        "rdma_create_qp"
                    } else {
                        "ibv_create_qp"
                    };
                    let e = last_verb_error(verb);
                    if e.kind() == io::ErrorKind::InvalidInput && inline > 0 {
                        inline /= 2;
                        continue;
                    }
                    return Err(e);
                }
            }
        }
    }

    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.qpn
    }

    /// Posts one zero-length receive, which takes one write with immediate data of
    /// the peer's (a wake).
    fn post_wake_receive(&self) -> io::Result<()> {
        let mut wr = sys::ibv_recv_wr {
            wr_id: WAKE_RECV_WR_ID,
            next: std::ptr::null_mut(),
            sg_list: std::ptr::null_mut(),
            num_sge: 0,
        };
        let mut bad: *mut sys::ibv_recv_wr = std::ptr::null_mut();
        // SAFETY: valid QP; the request lives on our stack for the call and names no
        // memory (zero scatter entries), so nothing outlives the call.
        let r = unsafe { sys::ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if r == 0 {
            Ok(())
        } else {
            Err(verb_error("ibv_post_recv", errno_of(r)))
        }
    }

    /// Sets the receiver-not-ready delay this end announces (RTS to RTS).
    fn set_min_rnr_timer(&self, code: u8) -> io::Result<()> {
        // SAFETY: ibv_qp_attr is plain C data; all-zero is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.min_rnr_timer = code;
        self.modify(&mut a, sys::ibv_qp_attr_mask::IBV_QP_MIN_RNR_TIMER)
    }

    /// The capabilities the device granted (`ibv_qp_init_attr.cap` after creation).
    pub fn cap(&self) -> sys::ibv_qp_cap {
        self.cap
    }

    fn context(&self) -> &Arc<Context> {
        self.pd.context()
    }

    fn modify(&self, attr: &mut sys::ibv_qp_attr, mask: sys::ibv_qp_attr_mask) -> io::Result<()> {
        // SAFETY: valid QP; `attr` is initialised for every field named in `mask`.
        check("ibv_modify_qp", unsafe {
            sys::ibv_modify_qp(self.qp.as_ptr(), attr, mask.0 as i32)
        })
    }

    /// RESET → INIT on `port`, pkey index 0, remote write and read allowed.
    ///
    /// # Errors
    ///
    /// `ibv_modify_qp` failure with its errno.
    pub(crate) fn to_init(&self, port: u8) -> io::Result<()> {
        // SAFETY: plain C data; all-zero is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_INIT;
        a.pkey_index = 0;
        a.port_num = port;
        a.qp_access_flags = (sys::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE
            | sys::ibv_access_flags::IBV_ACCESS_REMOTE_READ)
            .0;
        use sys::ibv_qp_attr_mask as M;
        self.modify(
            &mut a,
            M::IBV_QP_STATE | M::IBV_QP_PKEY_INDEX | M::IBV_QP_PORT | M::IBV_QP_ACCESS_FLAGS,
        )
        .map_err(|e| context_error(e, "moving the QP to INIT"))
    }

    /// INIT → RTR towards `peer`, then RTR → RTS. Returns the RDMA READ depth set.
    ///
    /// # Errors
    ///
    /// `ibv_modify_qp` failures with their errno.
    pub(crate) fn connect_to(&self, me: &Endpoint, sq_psn: u32, peer: &QpCard) -> io::Result<u8> {
        use sys::ibv_qp_attr_mask as M;
        // SAFETY: plain C data; all-zero is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTR;
        a.path_mtu = me.active_mtu.min(peer.mtu);
        a.dest_qp_num = peer.qpn;
        a.rq_psn = peer.psn;
        a.max_dest_rd_atomic = me.rd_atomic_dest;
        a.min_rnr_timer = 12;
        a.ah_attr.dlid = peer.lid;
        a.ah_attr.sl = 0;
        a.ah_attr.src_path_bits = 0;
        a.ah_attr.port_num = me.port;
        if me.link_layer == LINK_LAYER_ETHERNET || peer.gid != [0; 16] {
            a.ah_attr.is_global = 1;
            a.ah_attr.grh.dgid = sys::ibv_gid { raw: peer.gid };
            a.ah_attr.grh.sgid_index = me.gid_index as u8;
            a.ah_attr.grh.hop_limit = 64;
            a.ah_attr.grh.traffic_class = 0;
            a.ah_attr.grh.flow_label = 0;
        }
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_AV
                | M::IBV_QP_PATH_MTU
                | M::IBV_QP_DEST_QPN
                | M::IBV_QP_RQ_PSN
                | M::IBV_QP_MAX_DEST_RD_ATOMIC
                | M::IBV_QP_MIN_RNR_TIMER,
        )
        .map_err(|e| context_error(e, "moving the QP to RTR"))?;

        let rd_atomic = me.rd_atomic_init.min(peer.rd_atomic).max(1);
        // SAFETY: plain C data; all-zero is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        a.qp_state = sys::ibv_qp_state::IBV_QPS_RTS;
        a.timeout = me.timeout;
        a.retry_cnt = me.retry_cnt;
        a.rnr_retry = me.rnr_retry;
        a.sq_psn = sq_psn;
        a.max_rd_atomic = rd_atomic;
        self.modify(
            &mut a,
            M::IBV_QP_STATE
                | M::IBV_QP_TIMEOUT
                | M::IBV_QP_RETRY_CNT
                | M::IBV_QP_RNR_RETRY
                | M::IBV_QP_SQ_PSN
                | M::IBV_QP_MAX_QP_RD_ATOMIC,
        )
        .map_err(|e| context_error(e, "moving the QP to RTS"))?;
        Ok(rd_atomic)
    }

    /// `ibv_query_qp` for the current state (`ibv_qp_state`).
    ///
    /// # Errors
    ///
    /// The verb's failure with its errno.
    pub fn query_state(&self) -> io::Result<u32> {
        Ok(self.query(sys::ibv_qp_attr_mask::IBV_QP_STATE)?.qp_state)
    }

    /// `ibv_query_qp` for the RDMA READs this end may have in flight
    /// (`max_rd_atomic`, as rdma_cm negotiated it).
    ///
    /// # Errors
    ///
    /// The verb's failure with its errno.
    pub fn query_rd_atomic(&self) -> io::Result<u8> {
        Ok(self
            .query(sys::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC)?
            .max_rd_atomic)
    }

    /// True when the connected peer is `me`, this port: the queue pair's address
    /// vector names our own GID (or, without a GRH, our LID).
    ///
    /// # Errors
    ///
    /// The failure of `ibv_query_qp` or `ibv_query_gid`.
    pub(crate) fn peer_is(&self, me: &Endpoint) -> io::Result<bool> {
        let ah = self.query(sys::ibv_qp_attr_mask::IBV_QP_AV)?.ah_attr;
        if ah.is_global == 0 {
            return Ok(ah.dlid == me.lid);
        }
        let port = if ah.port_num == 0 {
            me.port
        } else {
            ah.port_num
        };
        let ours = self
            .context()
            .query_gid(port, u32::from(ah.grh.sgid_index))?;
        // SAFETY: `raw` covers all 16 bytes of the union.
        Ok(ours == unsafe { ah.grh.dgid.raw })
    }

    fn query(&self, mask: sys::ibv_qp_attr_mask) -> io::Result<sys::ibv_qp_attr> {
        // SAFETY: plain C data; all-zero is valid.
        let mut a: sys::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: sys::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        // SAFETY: valid QP and out-pointers.
        check("ibv_query_qp", unsafe {
            sys::ibv_query_qp(self.qp.as_ptr(), &mut a, mask.0 as i32, &mut init)
        })?;
        Ok(a)
    }
}

impl Drop for RcQueuePair {
    fn drop(&mut self) {
        match &self.cm {
            // SAFETY: the QP is the id's (made by rdma_create_qp) and destroyed once,
            // through the id, which also forgets it; the id outlives this call (we
            // hold an Arc of it) and so does the CQ (a field).
            Some(id) => unsafe { sys::rdma_destroy_qp(id.as_ptr()) },
            None => {
                // SAFETY: the QP is valid and destroyed once; the CQ (a field) outlives
                // this call.
                let r = unsafe { sys::ibv_destroy_qp(self.qp.as_ptr()) };
                debug_assert_eq!(r, 0, "ibv_destroy_qp failed");
            }
        }
        self.context().forget(self.qpn, self.cq.as_ptr() as usize);
    }
}

fn context_error(e: io::Error, what: &str) -> io::Error {
    io::Error::new(e.kind(), format!("{what}: {e}"))
}

/// A random 24-bit packet sequence number.
fn random_psn() -> u32 {
    let mut b = [0u8; 4];
    // SAFETY: `b` is a valid 4-byte buffer.
    let n = unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), libc::GRND_NONBLOCK) };
    let v = if n == 4 {
        u32::from_ne_bytes(b)
    } else {
        // No entropy yet (early boot): any value works, the PSN only needs to differ
        // between incarnations of a connection.
        let t = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos())
            .unwrap_or(0);
        t ^ std::process::id().rotate_left(16)
    };
    v & 0xff_ffff
}

/// An RC queue pair in the INIT state, waiting for the peer's card.
#[derive(Debug)]
pub struct VerbsPending {
    qp: RcQueuePair,
    me: Endpoint,
    psn: u32,
    caps: Caps,
    /// Receives are posted for the peer's wakes ([`PendingQp::accept_wakes`]).
    wakes: bool,
}

impl VerbsPending {
    /// Creates the queue pair and moves it to INIT.
    pub(crate) fn new(
        pd: Arc<ProtectionDomain>,
        req: QpRequest,
        me: Endpoint,
        caps: Caps,
    ) -> io::Result<VerbsPending> {
        let qp = RcQueuePair::create(pd, req)?;
        qp.to_init(me.port)?;
        Ok(Self::with_qp(qp, req, me, caps))
    }

    /// Creates the queue pair on an rdma_cm id (librdmacm moves it to INIT and, when
    /// the connection is made, on to RTS).
    pub(crate) fn new_on(
        pd: Arc<ProtectionDomain>,
        req: QpRequest,
        me: Endpoint,
        caps: Caps,
        cm: Arc<CmId>,
    ) -> io::Result<VerbsPending> {
        let qp = RcQueuePair::create_on(pd, req, cm)?;
        Ok(Self::with_qp(qp, req, me, caps))
    }

    fn with_qp(qp: RcQueuePair, req: QpRequest, me: Endpoint, caps: Caps) -> VerbsPending {
        // What this very queue pair was granted (the same as the fabric's probe asked
        // for, on any sane device).
        let caps = Caps {
            max_inline: qp.cap.max_inline_data as usize,
            max_sge: (qp.cap.max_send_sge as usize).min(MAX_SGE),
            max_send_wr: qp.cap.max_send_wr.min(req.send_wr) as usize,
            ..caps
        };
        VerbsPending {
            qp,
            me,
            psn: random_psn(),
            caps,
            wakes: false,
        }
    }

    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn
    }

    /// The underlying verbs queue pair.
    pub fn queue_pair(&self) -> &RcQueuePair {
        &self.qp
    }
}

impl PendingQp for VerbsPending {
    type Qp = VerbsQp;

    /// Fills the receive queue with zero-length receives, one per write with
    /// immediate data of the peer's until they are reaped, when the fabric gave the
    /// queue pair a completion channel ([`VerbsConfig::wake`](super::VerbsConfig::wake)).
    fn accept_wakes(&mut self) -> io::Result<bool> {
        if self.qp.recv_cq.is_none() || self.qp.cap.max_recv_wr < WAKE_RECEIVES || self.wakes {
            return Ok(self.wakes);
        }
        for _ in 0..WAKE_RECEIVES {
            self.qp.post_wake_receive()?;
        }
        self.wakes = true;
        Ok(true)
    }

    fn card(&self) -> io::Result<Card> {
        if self.qp.cm.is_some() {
            return Ok(Card {
                bytes: CM_CARD.to_vec(),
                fds: Vec::new(),
            });
        }
        let card = QpCard {
            link_layer: self.me.link_layer,
            mtu: self.me.active_mtu,
            lid: self.me.lid,
            qpn: self.qp.qpn,
            psn: self.psn,
            rd_atomic: self.me.rd_atomic_dest,
            gid: self.me.gid,
        };
        Ok(Card {
            bytes: card.to_bytes(),
            fds: Vec::new(),
        })
    }

    /// Connects to the peer's card. A queue pair made on an rdma_cm id was connected
    /// by the connection manager: its peer's card must be the rdma_cm card too, and
    /// the connection established.
    fn connect(self, peer: Card) -> io::Result<VerbsQp> {
        let rd_atomic = match &self.qp.cm {
            Some(id) => {
                if peer.bytes != CM_CARD {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        "bad verbs card: the peer's queue pair was not connected by rdma_cm, ours was",
                    ));
                }
                if !id.is_established() {
                    return Err(io::Error::new(
                        io::ErrorKind::NotConnected,
                        "the rdma_cm connection is not established yet",
                    ));
                }
                self.qp.query_rd_atomic()?.max(1)
            }
            None => {
                let card = QpCard::from_bytes(&peer.bytes)?;
                if card.link_layer != self.me.link_layer {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidData,
                        format!(
                            "bad verbs card: the peer's link layer ({}) differs from ours ({})",
                            link_layer_name(card.link_layer),
                            link_layer_name(self.me.link_layer)
                        ),
                    ));
                }
                self.qp.connect_to(&self.me, self.psn, &card)?
            }
        };
        // A failed query only costs the loopback defaults.
        let loopback = self.qp.peer_is(&self.me).unwrap_or(false);
        if self.wakes && self.qp.cm.is_some() {
            // The connection manager leaves the receiver-not-ready delay we announce
            // at 0, which means 655 ms: should the peer's wakes ever outrun our
            // receives, its write is to be retried as soon as they are reposted (the
            // manual path sets 12, 0.64 ms). Best effort: a refusal only costs time.
            let _ = self.qp.set_min_rnr_timer(12);
        }
        let ctx = self.qp.context().clone();
        let port_errors_at = ctx.port_errors();
        let caps = Caps {
            max_rd_atomic: usize::from(rd_atomic),
            ..self.caps
        };
        Ok(VerbsQp {
            caps,
            loopback,
            wakes: self.wakes,
            sends_wakes: AtomicBool::new(false),
            wake_events: AtomicU64::new(0),
            wake_budget: WAKE_RECEIVES - WAKE_MARGIN,
            wakes_sent: AtomicU32::new(0),
            wakes_reaped: AtomicU32::new(0),
            reaped_told: AtomicU32::new(0),
            peer_reaped: AtomicU32::new(0),
            report_in_flight: AtomicBool::new(false),
            event_seen: AtomicBool::new(false),
            posted: AtomicBool::new(false),
            qp: self.qp,
            ctx,
            error: AtomicBool::new(false),
            last_check: AtomicU64::new(0),
            port_errors_at,
            last_error: Mutex::new(None),
            keepalive_ns: self.me.keepalive.as_nanos().min(u128::from(u64::MAX)) as u64,
            quiet: Mutex::new(Quiet::default()),
            keepalive_in_flight: AtomicBool::new(false),
            linger_done: AtomicBool::new(false),
        })
    }
}

fn link_layer_name(l: u8) -> &'static str {
    if l == LINK_LAYER_ETHERNET {
        "Ethernet"
    } else {
        "InfiniBand"
    }
}

/// A connected RC queue pair (state RTS) and its completion queue.
///
/// Any error completion, a QP found in `IBV_QPS_ERR`, a fatal asynchronous event
/// (QP fatal / request / access error, CQ error, port error, device fatal), or, for a
/// queue pair rdma_cm connected, a disconnect event of its id puts it in a sticky
/// [`QpState::Error`]; [`last_error`](Self::last_error) says why.
///
/// An RC queue pair only learns that its peer is unreachable when it sends, and a
/// process that only reads never does. So [`QueuePair::state`] (which the engine asks
/// while it waits) posts a *keepalive*, a zero-length RDMA WRITE, once the send queue
/// has been silent for [`VerbsConfig::keepalive`](super::VerbsConfig::keepalive): a
/// vanished peer or a dead link then exhausts the transport retries (7 tries of
/// 4.096 µs × 2^timeout each, about 0.5 s with the defaults) and the queue pair fails.
/// Three send queue entries beyond [`Caps::max_send_wr`] are reserved: for it, for the
/// wake report (below) and for the *linger* marker: dropping a queue pair that rdma_cm connected first waits (up to
/// 2 s) until everything posted before was acknowledged, so that the last writes (the
/// end of stream) are not flushed by the disconnect, then disconnects, which the peer
/// sees at once. (A queue pair connected by card exchange is destroyed at once, as
/// before; its users close by protocol before they drop it.)
///
/// *Wakes*: where both ends agreed ([`PendingQp::accept_wakes`] here,
/// [`QueuePair::send_wakes`] there), every RDMA WRITE of the peer's carries
/// immediate data, which takes one of our zero-length receives and so makes a
/// completion; a waiter arms both completion queues ([`QueuePair::arm_wake`]),
/// looks once more, and blocks on their channel ([`QueuePair::block_wake`]) until
/// the peer writes or one of our own signalled requests completes.
pub struct VerbsQp {
    /// Set by every post of the engine's, cleared by the keepalive's look: whether
    /// the send queue was silent since (a plain store on the data path, no lock).
    posted: AtomicBool,
    qp: RcQueuePair,
    ctx: Arc<Context>,
    caps: Caps,
    /// The peer is this port (`QueuePair::loopback`).
    loopback: bool,
    error: AtomicBool,
    /// `Context::now_ns` of the last device check in `state`.
    last_check: AtomicU64,
    port_errors_at: u64,
    last_error: Mutex<Option<String>>,
    /// Silence (nanoseconds) on the send queue after which `state` posts a keepalive.
    keepalive_ns: u64,
    quiet: Mutex<Quiet>,
    keepalive_in_flight: AtomicBool,
    linger_done: AtomicBool,
    /// This end takes wakes: its receive queue holds receives for them.
    wakes: bool,
    /// Our writes carry immediate data, to wake the peer.
    sends_wakes: AtomicBool,
    /// Channel events taken so far: a waiter that armed at one count and finds
    /// another knows that the event it armed for may have been taken by another
    /// thread, and looks again instead of blocking.
    wake_events: AtomicU64,
    /// The wake budget: writes of ours with immediate data in flight or not yet
    /// reaped by the peer, that is `wakes_sent - peer_reaped`, stay below this (its
    /// receive queue depth less [`WAKE_MARGIN`]), so a wake never finds the peer's
    /// receive queue empty; past it our writes go without immediate data.
    wake_budget: u32,
    /// Our writes with immediate data so far (wrapping).
    wakes_sent: AtomicU32,
    /// The peer's wakes reaped here so far (wrapping): the immediate data of each
    /// write of ours, so the peer learns how far it may go.
    wakes_reaped: AtomicU32,
    /// `wakes_reaped` as last carried to the peer.
    reaped_told: AtomicU32,
    /// The newest count of our wakes the peer said it reaped.
    peer_reaped: AtomicU32,
    /// A wake report is in flight (one at a time, in its reserved entry).
    report_in_flight: AtomicBool,
    /// A wait saw an event on the channel and left it there (see `block_wake`).
    event_seen: AtomicBool,
}

/// Since when the send queue has been silent (for keepalives).
#[derive(Default)]
struct Quiet {
    /// `Context::now_ns` at the last look that found a post.
    since: u64,
}

impl std::fmt::Debug for VerbsQp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("VerbsQp")
            .field("qp", &self.qp)
            .field("caps", &self.caps)
            // Relaxed: a snapshot for printing only.
            .field("error", &self.error.load(Ordering::Relaxed))
            .finish()
    }
}

fn wc_status_str(status: u32) -> String {
    // SAFETY: ibv_wc_status_str returns a static string for any value.
    let p = unsafe { sys::ibv_wc_status_str(status) };
    if p.is_null() {
        return format!("status {status}");
    }
    // SAFETY: a NUL-terminated static string.
    unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
}

fn map_status(status: u32) -> CompletionStatus {
    use sys::ibv_wc_status as S;
    match status {
        S::IBV_WC_SUCCESS => CompletionStatus::Success,
        S::IBV_WC_LOC_PROT_ERR => CompletionStatus::LocalProtectionError,
        S::IBV_WC_REM_ACCESS_ERR => CompletionStatus::RemoteAccessError,
        S::IBV_WC_LOC_LEN_ERR => CompletionStatus::LocalLengthError,
        S::IBV_WC_WR_FLUSH_ERR => CompletionStatus::Flushed,
        // RETRY_EXC_ERR, RNR_RETRY_EXC_ERR and everything else.
        _ => CompletionStatus::TransportError,
    }
}

impl VerbsQp {
    /// The queue pair number.
    pub fn qpn(&self) -> u32 {
        self.qp.qpn
    }

    /// The underlying verbs queue pair (e.g. for [`RcQueuePair::query_state`]).
    pub fn queue_pair(&self) -> &RcQueuePair {
        &self.qp
    }

    /// How many wakes a blocked wait of this end has taken from its completion
    /// channel so far (see [`QueuePair::block_wake`]).
    pub fn wakes_taken(&self) -> u64 {
        // Relaxed: a statistic.
        self.wake_events.load(Ordering::Relaxed)
    }

    /// How many of our writes carried immediate data to wake the peer so far (the
    /// rest went without: the peer had not said it wants wakes, or the budget of
    /// its receive queue was spent).
    pub fn wakes_sent(&self) -> u32 {
        // Relaxed: a statistic.
        self.wakes_sent.load(Ordering::Relaxed)
    }

    /// Why the queue pair is in the error state, in words (`None` while it is not).
    pub fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    #[cold]
    fn set_error(&self, why: String) {
        let mut g = self.last_error.lock().unwrap_or_else(|e| e.into_inner());
        if g.is_none() {
            *g = Some(why);
        }
        // Release: whoever sees the flag (Acquire loads below) may read the reason
        // stored above.
        self.error.store(true, Ordering::Release);
    }

    #[cold]
    fn check_device(&self) {
        self.ctx.poll_async_events();
        if self
            .ctx
            .qp_failed(self.qp.qpn, self.qp.cq.as_ptr() as usize)
        {
            self.set_error("a fatal asynchronous event (QP, CQ or device error)".into());
        } else if self.ctx.port_errors() != self.port_errors_at {
            self.set_error("a port error event (link down)".into());
        }
        match self.qp.query_state() {
            Ok(sys::ibv_qp_state::IBV_QPS_ERR) => {
                self.set_error("the queue pair is in IBV_QPS_ERR".into())
            }
            Ok(_) => {}
            Err(e) => self.set_error(e.to_string()),
        }
        self.check_cm_events();
        self.keepalive_tick();
    }

    /// Polls the receive queue's completions (the peer's wakes, which carry no data)
    /// and posts a receive back for each.
    fn reap_wakes(&self) {
        let Some(rcq) = &self.qp.recv_cq else {
            return;
        };
        let mut wcs = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; POLL_BATCH];
        loop {
            let n = match rcq.poll(&mut wcs) {
                Ok(n) => n,
                Err(e) => {
                    self.set_error(e.to_string());
                    return;
                }
            };
            for w in &wcs[..n] {
                // SAFETY: ibv_poll_cq initialised the first `n` entries.
                let w = unsafe { w.assume_init_ref() };
                match w.status {
                    sys::ibv_wc_status::IBV_WC_SUCCESS => {
                        if let Err(e) = self.qp.post_wake_receive() {
                            self.set_error(format!("reposting a receive for wakes: {e}"));
                        }
                        // Relaxed: counters of the budget protocol only; posting
                        // orders nothing by them.
                        self.wakes_reaped.fetch_add(1, Ordering::Relaxed);
                        // SAFETY: a write with immediate data completed this receive,
                        // so the union holds the immediate data.
                        let told =
                            u32::from_be(unsafe { w.imm_data_invalidated_rkey_union.imm_data });
                        let _ = self.peer_reaped.fetch_update(
                            Ordering::Relaxed,
                            Ordering::Relaxed,
                            // Newer counts only (two posting threads may carry them
                            // out of order); the counts wrap.
                            |old| ((told.wrapping_sub(old) as i32) > 0).then_some(told),
                        );
                    }
                    // Flushed: the queue pair failed, which its send side reports.
                    sys::ibv_wc_status::IBV_WC_WR_FLUSH_ERR => {}
                    status => self.set_error(format!(
                        "a receive for wakes completed with {} (vendor error {:#x})",
                        wc_status_str(status),
                        w.vendor_err
                    )),
                }
            }
            if n < wcs.len() {
                return;
            }
        }
    }

    /// Whether the write being posted may carry immediate data: the peer asked for
    /// wakes, and the budget has room (then it is counted).
    #[inline]
    fn take_wake(&self) -> bool {
        // Relaxed: `sends_wakes` is set once before the engine's first post, by the
        // thread that connects; the counters order nothing (a race past the check
        // costs one of the margin's receives).
        if !self.sends_wakes.load(Ordering::Relaxed) {
            return false;
        }
        let sent = self.wakes_sent.load(Ordering::Relaxed);
        let reaped = self.peer_reaped.load(Ordering::Relaxed);
        if sent.wrapping_sub(reaped) >= self.wake_budget {
            return false;
        }
        self.wakes_sent.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The immediate data of a wake: how many of the peer's wakes we reaped.
    #[inline]
    fn tell_reaped(&self) -> u32 {
        // Relaxed: see take_wake.
        let reaped = self.wakes_reaped.load(Ordering::Relaxed);
        self.reaped_told.store(reaped, Ordering::Relaxed);
        reaped
    }

    /// Before a wait blocks: if we reaped a quarter of the peer's budget since we
    /// last told it, tell it now (a zero-length write with immediate data), so that
    /// a peer that ran out of budget wakes us with its next write.
    fn report_reaped(&self) {
        // Relaxed: see take_wake; the flag only limits reports to one in flight.
        let reaped = self.wakes_reaped.load(Ordering::Relaxed);
        if !self.sends_wakes.load(Ordering::Relaxed)
            || reaped.wrapping_sub(self.reaped_told.load(Ordering::Relaxed)) < self.wake_budget / 4
            || self.report_in_flight.swap(true, Ordering::Relaxed)
        {
            return;
        }
        self.wakes_sent.fetch_add(1, Ordering::Relaxed);
        if let Err(e) = self.post_own_with(REPORT_WR_ID, Some(self.tell_reaped())) {
            self.report_in_flight.store(false, Ordering::Relaxed);
            self.set_error(format!("posting a wake report: {e}"));
        }
    }

    /// Reads the events of our rdma_cm id (it has a channel of its own once
    /// connected): a disconnect or a device removal fails the queue pair.
    fn check_cm_events(&self) {
        let Some(id) = &self.qp.cm else {
            return;
        };
        let ch = id.channel();
        while let Ok(Some(ev)) = ch.next(std::time::Duration::ZERO) {
            if !ev.is_for(id) {
                continue;
            }
            match ev.kind {
                CmEventKind::Disconnected
                | CmEventKind::DeviceRemoval
                | CmEventKind::ConnectError
                | CmEventKind::Unreachable => self.set_error(format!(
                    "rdma_cm reported {} from the peer {}",
                    ev.describe(),
                    id.peer_addr()
                        .map_or_else(|_| "?".into(), |a| a.to_string())
                )),
                _ => {}
            }
        }
    }

    /// Posts a keepalive when the send queue has been silent long enough.
    fn keepalive_tick(&self) {
        // Acquire: pairs with set_error's Release.
        if self.keepalive_ns == 0 || self.error.load(Ordering::Acquire) {
            return;
        }
        let now = self.ctx.now_ns();
        let mut q = self.quiet.lock().unwrap_or_else(|p| p.into_inner());
        // Relaxed: the flag carries no data; a post racing with this look counts at
        // the next one, which only delays a keepalive.
        if self.posted.swap(false, Ordering::Relaxed) {
            q.since = now;
            return;
        }
        // Relaxed: the flag only limits keepalives to one in flight; its completion
        // carries no data.
        if now.saturating_sub(q.since) >= self.keepalive_ns
            && !self.keepalive_in_flight.swap(true, Ordering::Relaxed)
        {
            q.since = now;
            if let Err(e) = self.post_own(KEEPALIVE_WR_ID) {
                // Relaxed: as the swap above.
                self.keepalive_in_flight.store(false, Ordering::Relaxed);
                self.set_error(format!("posting a keepalive: {e}"));
            }
        }
    }

    /// Posts one of the queue pair's own requests: a signalled zero-length RDMA WRITE
    /// (no memory is touched, and the responder checks no key for zero bytes), into
    /// the send queue entries reserved for it.
    fn post_own(&self, wr_id: u64) -> io::Result<()> {
        self.post_own_with(wr_id, None)
    }

    /// As [`post_own`](Self::post_own), with immediate data when `imm` is set.
    fn post_own_with(&self, wr_id: u64, imm: Option<u32>) -> io::Result<()> {
        // SAFETY: ibv_send_wr is plain C data; all-zero is valid (null `next`, no
        // gather list).
        let mut wr: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = wr_id;
        wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE;
        if let Some(imm) = imm {
            wr.opcode = sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM;
            wr.imm_data_invalidated_rkey_union.imm_data = imm.to_be();
        }
        wr.send_flags = sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: valid QP; the request lives on our stack for the call and describes
        // no memory at all (zero gather entries).
        let r = unsafe { sys::ibv_post_send(self.qp.qp.as_ptr(), &mut wr, &mut bad) };
        if r == 0 {
            Ok(())
        } else {
            Err(verb_error("ibv_post_send", errno_of(r)))
        }
    }
}

impl QueuePair for VerbsQp {
    /// Posts one RDMA WRITE or READ with `ibv_post_send`, without allocating or
    /// locking: the work request is built on the stack, its gather/scatter list
    /// copied into a stack array of [`MAX_SGE`] `ibv_sge`s (zero-length entries are
    /// left out). The provider copies both before `ibv_post_send` returns.
    unsafe fn post(&self, wr: &WorkRequest<'_>) -> Result<(), FabricError> {
        let (local, opcode, remote_addr, rkey, inline) = match wr.opcode {
            Opcode::Write {
                local,
                remote_addr,
                rkey,
                inline,
            } => (
                local,
                if self.take_wake() {
                    sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM
                } else {
                    sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE
                },
                remote_addr,
                rkey,
                inline,
            ),
            Opcode::Read {
                local,
                remote_addr,
                rkey,
            } => (
                local,
                sys::ibv_wr_opcode::IBV_WR_RDMA_READ,
                remote_addr,
                rkey,
                false,
            ),
        };
        if local.len() > self.caps.max_sge {
            return Err(FabricError::InvalidRequest(
                "more gather/scatter entries than Caps::max_sge",
            ));
        }
        let mut sges = [const { MaybeUninit::<sys::ibv_sge>::uninit() }; MAX_SGE];
        let mut n = 0;
        let mut total = 0u64;
        for s in local.iter().filter(|s| s.len > 0) {
            sges[n] = MaybeUninit::new(sys::ibv_sge {
                addr: s.addr as u64,
                length: s.len,
                lkey: s.lkey,
            });
            n += 1;
            total += u64::from(s.len);
        }
        if inline && total > self.caps.max_inline as u64 {
            return Err(FabricError::InvalidRequest(
                "inline write longer than Caps::max_inline",
            ));
        }
        let mut flags = 0;
        if inline {
            flags |= sys::ibv_send_flags::IBV_SEND_INLINE.0;
        }
        if wr.signaled {
            flags |= sys::ibv_send_flags::IBV_SEND_SIGNALED.0;
        }
        // SAFETY: ibv_send_wr is plain C data; all-zero is valid (null `next`).
        let mut req: sys::ibv_send_wr = unsafe { std::mem::zeroed() };
        req.wr_id = wr.wr_id;
        req.sg_list = sges.as_mut_ptr().cast::<sys::ibv_sge>();
        req.num_sge = n as i32;
        req.opcode = opcode;
        req.send_flags = flags;
        req.wr.rdma = sys::rdma_t { remote_addr, rkey };
        if opcode == sys::ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM {
            req.imm_data_invalidated_rkey_union.imm_data = self.tell_reaped().to_be();
        }
        // Relaxed: a hint for the keepalive (see `posted`); it publishes nothing.
        self.posted.store(true, Ordering::Relaxed);
        let mut bad: *mut sys::ibv_send_wr = std::ptr::null_mut();
        // SAFETY: valid QP; `req` and the first `n` entries of `sges` (initialised
        // above; sg_list points at them) live on our stack for the call, `next` is
        // null, and the provider copies them (and inline data) before returning. The
        // caller guarantees, per the trait contract, that non-inline memory stays
        // valid until the request retires.
        let r = unsafe { sys::ibv_post_send(self.qp.qp.as_ptr(), &mut req, &mut bad) };
        if r == 0 {
            return Ok(());
        }
        match errno_of(r) {
            libc::ENOMEM => Err(FabricError::QueueFull),
            errno => Err(FabricError::Io(verb_error("ibv_post_send", errno))),
        }
    }

    fn poll(&self, out: &mut [Completion]) -> usize {
        if self.wakes {
            self.reap_wakes();
        }
        let mut wcs = [const { MaybeUninit::<sys::ibv_wc>::uninit() }; POLL_BATCH];
        let mut filled = 0;
        while filled < out.len() {
            let want = (out.len() - filled).min(POLL_BATCH);
            let n = match self.qp.cq.poll(&mut wcs[..want]) {
                Ok(n) => n,
                Err(e) => {
                    self.set_error(e.to_string());
                    break;
                }
            };
            for w in &wcs[..n] {
                // SAFETY: ibv_poll_cq initialised the first `n` entries.
                let w = unsafe { w.assume_init_ref() };
                let status = map_status(w.status);
                // The opcode is only defined for successful completions; for errors
                // it is a best guess (the engine only looks at the status).
                let op = if w.opcode == sys::ibv_wc_opcode::IBV_WC_RDMA_READ {
                    CompletedOp::Read
                } else {
                    CompletedOp::Write
                };
                if status != CompletionStatus::Success {
                    let what = match w.wr_id {
                        KEEPALIVE_WR_ID => "a keepalive".to_string(),
                        LINGER_WR_ID => "the linger marker".to_string(),
                        REPORT_WR_ID => "a wake report".to_string(),
                        id => format!("work request {id}"),
                    };
                    self.set_error(format!(
                        "{what} completed with {} (vendor error {:#x})",
                        wc_status_str(w.status),
                        w.vendor_err
                    ));
                }
                // Our own requests are not the engine's business.
                match w.wr_id {
                    KEEPALIVE_WR_ID => {
                        // Relaxed: as in keepalive_tick.
                        self.keepalive_in_flight.store(false, Ordering::Relaxed);
                        continue;
                    }
                    LINGER_WR_ID => {
                        // Release: pairs with the lingering drop's Acquire loop.
                        self.linger_done.store(true, Ordering::Release);
                        continue;
                    }
                    REPORT_WR_ID => {
                        // Relaxed: as in report_reaped.
                        self.report_in_flight.store(false, Ordering::Relaxed);
                        continue;
                    }
                    _ => {}
                }
                out[filled] = Completion {
                    wr_id: w.wr_id,
                    status,
                    op,
                    byte_len: u64::from(w.byte_len),
                };
                filled += 1;
            }
            if n < want {
                break;
            }
        }
        filled
    }

    fn state(&self) -> QpState {
        // Acquire on `error`: pairs with set_error's Release. Relaxed on last_check:
        // it only rate-limits device checks; a lost race skips or repeats one.
        if !self.error.load(Ordering::Acquire) {
            let now = self.ctx.now_ns();
            let last = self.last_check.load(Ordering::Relaxed);
            if now.saturating_sub(last) >= STATE_CHECK_NS
                && self
                    .last_check
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                self.check_device();
            }
        }
        // Acquire: as above (check_device may just have set it).
        if self.error.load(Ordering::Acquire) {
            QpState::Error
        } else {
            QpState::ReadyToSend
        }
    }

    fn caps(&self) -> Caps {
        self.caps
    }

    fn loopback(&self) -> bool {
        self.loopback
    }

    fn send_wakes(&self) {
        // Relaxed: see `post`.
        self.sends_wakes.store(true, Ordering::Relaxed);
    }

    fn arm_wake(&self) -> Option<u64> {
        if !self.wakes || self.qp.channel.is_none() {
            return None;
        }
        // Acquire: pairs with block_wake's Release increment; read before arming, so
        // an event taken after this point changes it.
        let token = self.wake_events.load(Ordering::Acquire);
        // Arm first, reap after: a completion that lands after the arm raises an
        // event, one before it is seen by the caller's next look.
        // An event a wait saw but left (see block_wake) is taken now, before the
        // arm: its queue is disarmed until then, and the channel stays readable.
        // Relaxed: the flag only saves a system call when there is nothing to take.
        if self.event_seen.swap(false, Ordering::Relaxed) {
            if let Some(ch) = &self.qp.channel {
                ch.take_event();
            }
        }
        let armed = self
            .qp
            .cq
            .arm()
            .and_then(|()| self.qp.recv_cq.as_ref().map_or(Ok(()), |c| c.arm()));
        if let Err(e) = armed {
            self.set_error(e.to_string());
            return None;
        }
        self.reap_wakes();
        // A peer near the end of its budget may have posted writes without
        // immediate data that are still in flight, which no event would announce:
        // this wait is not covered (the report below restores the peer's budget,
        // and the caller's bounded sleep finds those writes). Relaxed: see take_wake.
        let behind = self
            .wakes_reaped
            .load(Ordering::Relaxed)
            .wrapping_sub(self.reaped_told.load(Ordering::Relaxed));
        let may_miss = self.sends_wakes.load(Ordering::Relaxed)
            && behind.saturating_add(WAKE_MARGIN) >= self.wake_budget;
        self.report_reaped();
        if may_miss {
            return None;
        }
        Some(token)
    }

    fn block_wake(&self, token: u64, timeout: std::time::Duration) {
        let Some(ch) = &self.qp.channel else {
            std::thread::sleep(timeout);
            return;
        };
        // Acquire: as in arm_wake.
        if self.wake_events.load(Ordering::Acquire) == token {
            match ch.wait(timeout) {
                Ok(true) => {
                    // Relaxed: see arm_wake.
                    self.event_seen.store(true, Ordering::Relaxed);
                    // Release: the count says an event arrived (see wake_events).
                    self.wake_events.fetch_add(1, Ordering::Release);
                }
                Ok(false) => {}
                Err(e) => self.set_error(e.to_string()),
            }
        }
        self.reap_wakes();
    }

    fn wake_fd(&self) -> Option<std::os::fd::RawFd> {
        if !self.wakes {
            return None;
        }
        self.qp.channel.as_ref().map(|ch| ch.fd())
    }

    fn wake_fired(&self) {
        let Some(ch) = &self.qp.channel else {
            return;
        };
        // Both queues may have fired: take every event, so that the descriptor is
        // quiet until the next arm (a poll would return at once on one left).
        let mut took = false;
        while ch.take_event() {
            took = true;
        }
        if took {
            // Relaxed: see arm_wake; the events are taken, nothing is left to see.
            self.event_seen.store(false, Ordering::Relaxed);
            // Release: as in block_wake.
            self.wake_events.fetch_add(1, Ordering::Release);
        }
        self.reap_wakes();
    }

    fn error_reason(&self) -> Option<String> {
        let why = self.last_error()?;
        Some(
            match self.qp.cm.as_ref().and_then(|id| id.peer_addr().ok()) {
                Some(peer) if !why.contains(&peer.to_string()) => format!("{why}; peer {peer}"),
                _ => why,
            },
        )
    }
}

impl Drop for VerbsQp {
    fn drop(&mut self) {
        let Some(id) = &self.qp.cm else {
            return;
        };
        // Linger: let everything posted so far be acknowledged before rdma_disconnect
        // moves the queue pair to the error state, which flushes what is not yet sent
        // (the end of stream, typically). Not when the peer has already disconnected.
        self.check_cm_events();
        // Acquire on both flags: pairs with their Release stores (poll, set_error).
        if !self.error.load(Ordering::Acquire) && self.post_own(LINGER_WR_ID).is_ok() {
            let start = std::time::Instant::now();
            let mut scratch = [Completion {
                wr_id: 0,
                status: CompletionStatus::Success,
                op: CompletedOp::Write,
                byte_len: 0,
            }; POLL_BATCH];
            let mut idle = 0u32;
            while !self.linger_done.load(Ordering::Acquire)
                && !self.error.load(Ordering::Acquire)
                && start.elapsed() < LINGER
            {
                if self.poll(&mut scratch) == 0 {
                    std::thread::sleep(std::time::Duration::from_micros(50));
                    idle += 1;
                    // A peer that disconnected meanwhile (it closed first) acknowledges
                    // nothing more: its DISCONNECTED ends the wait, not the 2 s bound
                    // (every such drop took 2.0 s between the Soft-RoCE VMs).
                    if idle % 20 == 0 {
                        self.check_cm_events();
                    }
                }
            }
        }
        // The peer sees DISCONNECTED at once (a peer that is gone: no harm).
        let _ = id.disconnect();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_mapping() {
        use sys::ibv_wc_status as S;
        assert_eq!(map_status(S::IBV_WC_SUCCESS), CompletionStatus::Success);
        assert_eq!(
            map_status(S::IBV_WC_LOC_PROT_ERR),
            CompletionStatus::LocalProtectionError
        );
        assert_eq!(
            map_status(S::IBV_WC_REM_ACCESS_ERR),
            CompletionStatus::RemoteAccessError
        );
        assert_eq!(
            map_status(S::IBV_WC_LOC_LEN_ERR),
            CompletionStatus::LocalLengthError
        );
        assert_eq!(
            map_status(S::IBV_WC_RETRY_EXC_ERR),
            CompletionStatus::TransportError
        );
        assert_eq!(
            map_status(S::IBV_WC_RNR_RETRY_EXC_ERR),
            CompletionStatus::TransportError
        );
        assert_eq!(
            map_status(S::IBV_WC_WR_FLUSH_ERR),
            CompletionStatus::Flushed
        );
        assert_eq!(
            map_status(S::IBV_WC_GENERAL_ERR),
            CompletionStatus::TransportError
        );
    }

    #[test]
    fn psn_is_24_bits() {
        for _ in 0..100 {
            assert!(random_psn() <= 0xff_ffff);
        }
    }
}
