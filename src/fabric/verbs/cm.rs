//! rdma_cm (librdmacm): connections set up by IP address and port, the way RoCE and
//! iWARP expect (iWARP can connect no other way) and InfiniBand allows through IPoIB
//! addresses. The connection manager resolves the address to a device, port, GID and
//! path, exchanges the queue pair numbers and PSNs, carries a little private data in
//! both directions, and takes the queue pair through INIT, RTR and RTS itself.
//!
//! | librdmacm object | type | released with |
//! | --- | --- | --- |
//! | `rdma_event_channel` | [`EventChannel`] | `rdma_destroy_event_channel` |
//! | `rdma_cm_id` | [`CmId`] | `rdma_destroy_id` (after its queue pair, see `RcQueuePair`) |
//! | `rdma_cm_event` | [`CmEvent`] (an owned copy) | acknowledged at once |
//!
//! An event channel's descriptor is non-blocking and can be polled
//! ([`EventChannel::fd`]); [`EventChannel::next`] waits for the next event with a
//! timeout. Every event is copied (kind, status, private data) and acknowledged before
//! it is returned, so `rdma_destroy_id` and `rdma_migrate_id`, which wait for the
//! acknowledgements of their id's events, never block on us.
//!
//! The device contexts of rdma_cm ids are librdmacm's own (one per device, opened by
//! the library). Queue pairs and memory regions used with an id must come from a
//! protection domain on that very context; [`super::VerbsFabric::for_cm_id`] keeps one
//! such fabric per device and port for the whole process.

use super::error::{check, last_verb_error, verb_error};
use rdma_sys as sys;
use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::os::fd::RawFd;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// Most private data a connection request carries on InfiniBand and RoCE (the CM
/// REQ's 92 bytes less rdma_cm's own 36-byte header).
pub const MAX_REQUEST_PRIVATE: usize = 56;
/// Most private data a connection reply carries (the CM REP's).
pub const MAX_REPLY_PRIVATE: usize = 196;
/// Most private data a rejection carries (the CM REJ's).
pub const MAX_REJECT_PRIVATE: usize = 148;

// `rdma_set_option` levels and names (anonymous enums in rdma_cma.h).
const RDMA_OPTION_ID: i32 = 0;
const RDMA_OPTION_ID_REUSEADDR: i32 = 1;
const RDMA_OPTION_ID_ACK_TIMEOUT: i32 = 3;

/// An rdma_cm event channel: the descriptor on which the events of its ids arrive.
pub struct EventChannel {
    ch: NonNull<sys::rdma_event_channel>,
}

// SAFETY: an event channel is a kernel file; librdmacm's calls on it may come from any
// thread (each rdma_get_cm_event is one system call).
unsafe impl Send for EventChannel {}
// SAFETY: as above.
unsafe impl Sync for EventChannel {}

impl std::fmt::Debug for EventChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventChannel")
            .field("fd", &self.fd())
            .finish()
    }
}

/// What an event says, as `rdma_cm_event_type`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CmEventKind {
    /// `rdma_resolve_addr` finished.
    AddrResolved,
    /// `rdma_resolve_addr` failed (no route, no RDMA device for the address).
    AddrError,
    /// `rdma_resolve_route` finished.
    RouteResolved,
    /// `rdma_resolve_route` failed.
    RouteError,
    /// A peer asks to connect (listening side); the event carries the new id.
    ConnectRequest,
    /// An error while connecting (e.g. the reply timed out).
    ConnectError,
    /// The peer did not answer.
    Unreachable,
    /// The peer (or its host, when nothing listens) refused.
    Rejected,
    /// The connection is up.
    Established,
    /// The peer disconnected, or its host tore the connection down.
    Disconnected,
    /// The device went away.
    DeviceRemoval,
    /// The id's address changed.
    AddrChange,
    /// The id left the time-wait state.
    TimewaitExit,
    /// Anything else (multicast events, newer kinds).
    Other(u32),
}

impl CmEventKind {
    fn from_raw(t: u32) -> CmEventKind {
        use sys::rdma_cm_event_type as T;
        match t {
            T::RDMA_CM_EVENT_ADDR_RESOLVED => CmEventKind::AddrResolved,
            T::RDMA_CM_EVENT_ADDR_ERROR => CmEventKind::AddrError,
            T::RDMA_CM_EVENT_ROUTE_RESOLVED => CmEventKind::RouteResolved,
            T::RDMA_CM_EVENT_ROUTE_ERROR => CmEventKind::RouteError,
            T::RDMA_CM_EVENT_CONNECT_REQUEST => CmEventKind::ConnectRequest,
            T::RDMA_CM_EVENT_CONNECT_ERROR => CmEventKind::ConnectError,
            T::RDMA_CM_EVENT_UNREACHABLE => CmEventKind::Unreachable,
            T::RDMA_CM_EVENT_REJECTED => CmEventKind::Rejected,
            T::RDMA_CM_EVENT_ESTABLISHED => CmEventKind::Established,
            T::RDMA_CM_EVENT_DISCONNECTED => CmEventKind::Disconnected,
            T::RDMA_CM_EVENT_DEVICE_REMOVAL => CmEventKind::DeviceRemoval,
            T::RDMA_CM_EVENT_ADDR_CHANGE => CmEventKind::AddrChange,
            T::RDMA_CM_EVENT_TIMEWAIT_EXIT => CmEventKind::TimewaitExit,
            other => CmEventKind::Other(other),
        }
    }

    /// True for the kinds that carry connection parameters and private data.
    fn has_conn_param(self) -> bool {
        matches!(
            self,
            CmEventKind::ConnectRequest
                | CmEventKind::Established
                | CmEventKind::Rejected
                | CmEventKind::ConnectError
        )
    }
}

/// An event, copied out of librdmacm and already acknowledged.
#[derive(Debug)]
pub struct CmEvent {
    /// What happened.
    pub kind: CmEventKind,
    /// The event's status: 0, a negative errno, or (for [`CmEventKind::Rejected`]) the
    /// InfiniBand CM reject reason.
    pub status: i32,
    /// The private data the peer sent (connection events only; on InfiniBand padded
    /// with zeros to the message's full size).
    pub private_data: Vec<u8>,
    /// The RDMA READs the peer lets us have in flight to it (connection events only).
    pub responder_resources: u8,
    /// The RDMA READs the peer wants to have in flight to us.
    pub initiator_depth: u8,
    id: usize,
    /// The new id of a connection request, owned from now on.
    new_id: Option<CmId>,
}

impl CmEvent {
    /// True when the event is about `id`.
    pub fn is_for(&self, id: &CmId) -> bool {
        self.id == id.as_ptr() as usize
    }

    /// The address of the id the event is about (to match it with ids the caller
    /// keeps).
    pub fn id_key(&self) -> usize {
        self.id
    }

    /// The new id of a [`CmEventKind::ConnectRequest`]: accept or reject it.
    pub fn take_request_id(&mut self) -> Option<CmId> {
        self.new_id.take()
    }

    /// "ADDR_ERROR (status -110: Connection timed out)" and the like.
    pub fn describe(&self) -> String {
        let name = match self.kind {
            CmEventKind::Other(t) => format!("event {t}"),
            k => format!("{k:?}"),
        };
        if self.status == 0 {
            name
        } else if self.status < 0 {
            format!("{name} ({})", io::Error::from_raw_os_error(-self.status))
        } else {
            format!("{name} (status {})", self.status)
        }
    }
}

impl EventChannel {
    /// `rdma_create_event_channel`, its descriptor made non-blocking.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::NotFound`] ("no RDMA device found: ...") when the kernel has
    /// no rdma_cm (`/dev/infiniband/rdma_cm` missing); other failures with their errno.
    pub fn new() -> io::Result<Arc<EventChannel>> {
        // SAFETY: no arguments; returns a new channel or null with errno set.
        let ch = unsafe { sys::rdma_create_event_channel() };
        let Some(ch) = NonNull::new(ch) else {
            let errno = io::Error::last_os_error().raw_os_error();
            let e = last_verb_error("rdma_create_event_channel");
            return Err(match errno {
                Some(libc::ENOENT | libc::ENODEV | libc::ENXIO) => io::Error::new(
                    io::ErrorKind::NotFound,
                    format!("no RDMA device found: rdma_cm is not available ({e})"),
                ),
                _ => e,
            });
        };
        let channel = EventChannel { ch };
        let fd = channel.fd();
        // SAFETY: fcntl on the channel's descriptor, which it keeps open.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(last_verb_error("fcntl(rdma_cm channel, O_NONBLOCK)"));
        }
        Ok(Arc::new(channel))
    }

    /// The descriptor: readable when an event is pending.
    pub fn fd(&self) -> RawFd {
        // SAFETY: the channel is valid for as long as `self`.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// The next event, waiting at most `timeout` for one (`Duration::ZERO`: only one
    /// already pending). `Ok(None)` when none came.
    ///
    /// # Errors
    ///
    /// `rdma_get_cm_event` or `poll` failures with their errno.
    pub fn next(self: &Arc<Self>, timeout: Duration) -> io::Result<Option<CmEvent>> {
        let deadline = Instant::now() + timeout;
        loop {
            let mut ev: *mut sys::rdma_cm_event = std::ptr::null_mut();
            // SAFETY: valid channel and out-pointer; the descriptor is non-blocking, so
            // this returns -1 with EAGAIN when no event is pending.
            let r = unsafe { sys::rdma_get_cm_event(self.ch.as_ptr(), &mut ev) };
            if r == 0 {
                // SAFETY: a fresh event from rdma_get_cm_event, not yet acknowledged.
                return Ok(Some(unsafe { self.take(ev) }));
            }
            let e = io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => {}
                Some(libc::EINTR) => continue,
                _ => return Err(io::Error::new(e.kind(), format!("rdma_get_cm_event: {e}"))),
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Ok(None);
            }
            let mut p = libc::pollfd {
                fd: self.fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            let ms = left.as_millis().clamp(1, i32::MAX as u128) as i32;
            // SAFETY: one live pollfd.
            if unsafe { libc::poll(&mut p, 1, ms) } < 0 {
                let e = io::Error::last_os_error();
                if e.raw_os_error() != Some(libc::EINTR) {
                    return Err(e);
                }
            }
        }
    }

    /// Copies what we need out of `ev` and acknowledges it.
    ///
    /// # Safety
    ///
    /// `ev` came from `rdma_get_cm_event` on this channel and is not acknowledged yet.
    unsafe fn take(self: &Arc<Self>, ev: *mut sys::rdma_cm_event) -> CmEvent {
        // SAFETY: per the contract `ev` is a valid event. The type is read as the raw
        // value, so a kind newer than our bindings is `Other`.
        let (raw_kind, status, id) = unsafe { ((*ev).event, (*ev).status, (*ev).id) };
        let kind = CmEventKind::from_raw(raw_kind);
        let (mut private_data, mut responder_resources, mut initiator_depth) = (Vec::new(), 0, 0);
        if kind.has_conn_param() {
            // SAFETY: for connection events the union holds `conn`, whose private data
            // (if any) stays valid until the event is acknowledged below.
            unsafe {
                let p = (*ev).param.conn;
                if !p.private_data.is_null() && p.private_data_len > 0 {
                    private_data = std::slice::from_raw_parts(
                        p.private_data.cast::<u8>(),
                        usize::from(p.private_data_len),
                    )
                    .to_vec();
                }
                responder_resources = p.responder_resources;
                initiator_depth = p.initiator_depth;
            }
        }
        // A connection request's id is new: ours to accept or reject, and to destroy.
        let new_id = (kind == CmEventKind::ConnectRequest)
            .then(|| NonNull::new(id))
            .flatten()
            .map(|id| CmId::adopt(id, self.clone()));
        // SAFETY: every event is acknowledged exactly once; nothing points into it now.
        unsafe { sys::rdma_ack_cm_event(ev) };
        CmEvent {
            kind,
            status,
            private_data,
            responder_resources,
            initiator_depth,
            id: id as usize,
            new_id,
        }
    }
}

impl Drop for EventChannel {
    fn drop(&mut self) {
        // SAFETY: every id on this channel holds an Arc of it, so none is left.
        unsafe { sys::rdma_destroy_event_channel(self.ch.as_ptr()) };
    }
}

/// Connection parameters of [`CmId::connect`] and [`CmId::accept`].
#[derive(Clone, Copy, Debug)]
pub struct ConnParams {
    /// RDMA READs we accept in flight from the peer (`responder_resources`).
    pub responder_resources: u8,
    /// RDMA READs we want in flight to the peer (`initiator_depth`).
    pub initiator_depth: u8,
    /// Transport retries before an operation fails (6: see `VerbsConfig::retry_count`).
    pub retry_count: u8,
    /// Receiver-not-ready retries (7: forever; the channel posts no receives).
    pub rnr_retry_count: u8,
}

/// An rdma_cm identifier (`rdma_cm_id`, port space TCP: reliable connections).
/// Destroyed on drop, after the queue pair made on it (which holds an `Arc` of it).
pub struct CmId {
    id: NonNull<sys::rdma_cm_id>,
    /// The channel its events arrive on; changed by [`migrate`](Self::migrate).
    channel: Mutex<Arc<EventChannel>>,
    established: AtomicBool,
}

// SAFETY: librdmacm calls on one id are serialised by the kernel (each is a command
// written to the rdma_cm file); the fields we read (`verbs`, `port_num`, the route's
// addresses) are written by librdmacm while it processes this id's events, which we
// only read after the event that completes them.
unsafe impl Send for CmId {}
// SAFETY: as above.
unsafe impl Sync for CmId {}

impl std::fmt::Debug for CmId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CmId")
            .field("local", &self.local_addr().ok())
            .field("peer", &self.peer_addr().ok())
            .finish()
    }
}

/// A `sockaddr` for `addr`, with its length.
fn to_sockaddr(addr: &SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
    // SAFETY: sockaddr_storage is plain data; all-zero is valid.
    let mut ss: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match addr {
        SocketAddr::V4(a) => {
            let sin = libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin) };
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(a) => {
            let sin6 = libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            };
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            unsafe { std::ptr::write((&mut ss as *mut libc::sockaddr_storage).cast(), sin6) };
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (ss, len as libc::socklen_t)
}

/// The socket address in `ss`, if it is an IPv4 or IPv6 one.
fn from_sockaddr(ss: &libc::sockaddr_storage) -> Option<SocketAddr> {
    match i32::from(ss.ss_family) {
        libc::AF_INET => {
            // SAFETY: the family says the storage holds a sockaddr_in.
            let sin =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in>() };
            let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
            Some(SocketAddr::V4(SocketAddrV4::new(
                ip,
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: the family says the storage holds a sockaddr_in6.
            let sin6 =
                unsafe { &*(ss as *const libc::sockaddr_storage).cast::<libc::sockaddr_in6>() };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

fn ms(d: Duration) -> i32 {
    d.as_millis().clamp(1, i32::MAX as u128) as i32
}

impl CmId {
    /// `rdma_create_id` on `channel` in the TCP port space (reliable connections).
    ///
    /// # Errors
    ///
    /// The call's failure with its errno.
    pub fn new(channel: &Arc<EventChannel>) -> io::Result<CmId> {
        let mut id: *mut sys::rdma_cm_id = std::ptr::null_mut();
        // SAFETY: valid channel and out-pointer; no user context.
        check("rdma_create_id", unsafe {
            sys::rdma_create_id(
                channel.ch.as_ptr(),
                &mut id,
                std::ptr::null_mut(),
                sys::rdma_port_space::RDMA_PS_TCP,
            )
        })?;
        let id = NonNull::new(id).ok_or_else(|| verb_error("rdma_create_id", libc::EIO))?;
        Ok(CmId::adopt(id, channel.clone()))
    }

    fn adopt(id: NonNull<sys::rdma_cm_id>, channel: Arc<EventChannel>) -> CmId {
        CmId {
            id,
            channel: Mutex::new(channel),
            established: AtomicBool::new(false),
        }
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::rdma_cm_id {
        self.id.as_ptr()
    }

    /// The channel this id's events arrive on.
    pub fn channel(&self) -> Arc<EventChannel> {
        self.channel
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// `rdma_bind_addr`: this id's local address (port 0 picks a free port).
    ///
    /// # Errors
    ///
    /// `AddrInUse` for a taken port, `AddrNotAvailable` for an address that is not
    /// this host's; other failures with their errno.
    pub fn bind(&self, addr: &SocketAddr) -> io::Result<()> {
        let (mut ss, _) = to_sockaddr(addr);
        // SAFETY: valid id; `ss` holds a sockaddr of the family it says.
        check("rdma_bind_addr", unsafe {
            sys::rdma_bind_addr(
                self.as_ptr(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
            )
        })
    }

    /// Lets a later bind to the same port succeed while old connections linger.
    ///
    /// # Errors
    ///
    /// `rdma_set_option` failures with their errno.
    pub fn set_reuse_addr(&self) -> io::Result<()> {
        let mut on: i32 = 1;
        // SAFETY: valid id; the option value is a live int of the size passed.
        check("rdma_set_option(REUSEADDR)", unsafe {
            sys::rdma_set_option(
                self.as_ptr(),
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_REUSEADDR,
                (&mut on as *mut i32).cast(),
                std::mem::size_of::<i32>(),
            )
        })
    }

    /// The local ACK timeout exponent of the connection's queue pair (4.096 µs ×
    /// 2^`timeout` before a retry). Without it rdma_cm derives one from the path
    /// (about half a second per retry on RoCE), which makes a dead peer slow to see.
    ///
    /// # Errors
    ///
    /// `rdma_set_option` failures (kernels before 4.20 lack the option).
    pub fn set_ack_timeout(&self, timeout: u8) -> io::Result<()> {
        let mut t = timeout;
        // SAFETY: valid id; the option value is a live u8 of the size passed.
        check("rdma_set_option(ACK_TIMEOUT)", unsafe {
            sys::rdma_set_option(
                self.as_ptr(),
                RDMA_OPTION_ID,
                RDMA_OPTION_ID_ACK_TIMEOUT,
                (&mut t as *mut u8).cast(),
                1,
            )
        })
    }

    /// `rdma_listen`.
    ///
    /// # Errors
    ///
    /// The call's failure with its errno.
    pub fn listen(&self, backlog: i32) -> io::Result<()> {
        // SAFETY: valid, bound id.
        check("rdma_listen", unsafe {
            sys::rdma_listen(self.as_ptr(), backlog)
        })
    }

    /// `rdma_resolve_addr` towards `dst`; [`CmEventKind::AddrResolved`] follows.
    ///
    /// # Errors
    ///
    /// The call's failure with its errno (most failures arrive as an event).
    pub fn resolve_addr(&self, dst: &SocketAddr, timeout: Duration) -> io::Result<()> {
        let (mut ss, _) = to_sockaddr(dst);
        // SAFETY: valid id; `ss` holds a sockaddr of the family it says; no source.
        check("rdma_resolve_addr", unsafe {
            sys::rdma_resolve_addr(
                self.as_ptr(),
                std::ptr::null_mut(),
                (&mut ss as *mut libc::sockaddr_storage).cast(),
                ms(timeout),
            )
        })
    }

    /// `rdma_resolve_route`; [`CmEventKind::RouteResolved`] follows.
    ///
    /// # Errors
    ///
    /// The call's failure with its errno.
    pub fn resolve_route(&self, timeout: Duration) -> io::Result<()> {
        // SAFETY: valid id with a resolved address.
        check("rdma_resolve_route", unsafe {
            sys::rdma_resolve_route(self.as_ptr(), ms(timeout))
        })
    }

    fn conn_param(p: &ConnParams, private: &[u8]) -> sys::rdma_conn_param {
        sys::rdma_conn_param {
            private_data: private.as_ptr().cast(),
            private_data_len: private.len() as u8,
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: 1,
            retry_count: p.retry_count.min(7),
            rnr_retry_count: p.rnr_retry_count.min(7),
            srq: 0,
            qp_num: 0,
        }
    }

    fn check_private(private: &[u8], max: usize, what: &str) -> io::Result<()> {
        if private.len() > max {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "{what} private data of {} bytes; rdma_cm carries at most {max}",
                    private.len()
                ),
            ));
        }
        Ok(())
    }

    /// `rdma_connect` with `private` data (at most [`MAX_REQUEST_PRIVATE`] bytes);
    /// [`CmEventKind::Established`] (with the reply's private data) or an error
    /// event follows. The id's queue pair is taken to RTS by librdmacm.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for too much private data; the call's failure with its errno.
    pub fn connect(&self, p: &ConnParams, private: &[u8]) -> io::Result<()> {
        Self::check_private(private, MAX_REQUEST_PRIVATE, "connection request")?;
        let mut param = Self::conn_param(p, private);
        // SAFETY: valid id with a resolved route; `param` and the private data it
        // points to are live for the call (librdmacm copies them).
        check("rdma_connect", unsafe {
            sys::rdma_connect(self.as_ptr(), &mut param)
        })
    }

    /// `rdma_accept` of a connection request with `private` data (at most
    /// [`MAX_REPLY_PRIVATE`] bytes). The queue pair is in RTS when it returns; the
    /// peer's queue pair is ready to receive once [`CmEventKind::Established`] came.
    ///
    /// # Errors
    ///
    /// `InvalidInput` for too much private data; the call's failure with its errno.
    pub fn accept(&self, p: &ConnParams, private: &[u8]) -> io::Result<()> {
        Self::check_private(private, MAX_REPLY_PRIVATE, "connection reply")?;
        let mut param = Self::conn_param(p, private);
        // SAFETY: valid id of a connection request; `param` and its private data are
        // live for the call.
        check("rdma_accept", unsafe {
            sys::rdma_accept(self.as_ptr(), &mut param)
        })
    }

    /// `rdma_reject` with `private` data (cut to [`MAX_REJECT_PRIVATE`] bytes).
    ///
    /// # Errors
    ///
    /// The call's failure with its errno.
    pub fn reject(&self, private: &[u8]) -> io::Result<()> {
        let private = &private[..private.len().min(MAX_REJECT_PRIVATE)];
        // SAFETY: valid id of a connection request; the private data is live for the
        // call.
        check("rdma_reject", unsafe {
            sys::rdma_reject(self.as_ptr(), private.as_ptr().cast(), private.len() as u8)
        })
    }

    /// `rdma_disconnect`: the peer sees [`CmEventKind::Disconnected`]. librdmacm moves
    /// the queue pair to the error state first, flushing what it had not sent yet.
    ///
    /// # Errors
    ///
    /// The call's failure with its errno (e.g. when not connected).
    pub fn disconnect(&self) -> io::Result<()> {
        // SAFETY: valid id.
        check("rdma_disconnect", unsafe {
            sys::rdma_disconnect(self.as_ptr())
        })
    }

    /// `rdma_migrate_id`: from now on this id's events arrive on `to`.
    ///
    /// # Errors
    ///
    /// The call's failure with its errno.
    pub fn migrate(&self, to: Arc<EventChannel>) -> io::Result<()> {
        let mut ch = self.channel.lock().unwrap_or_else(|e| e.into_inner());
        // SAFETY: valid id and channel; every event of this id has been acknowledged
        // (EventChannel::next acknowledges at once), so the call does not wait.
        check("rdma_migrate_id", unsafe {
            sys::rdma_migrate_id(self.as_ptr(), to.ch.as_ptr())
        })?;
        *ch = to;
        Ok(())
    }

    /// Records that the connection is up ([`CmEventKind::Established`] came).
    pub fn set_established(&self) {
        // Release: pairs with the Acquire in `is_established`; a flag only.
        self.established.store(true, Ordering::Release);
    }

    /// True once [`set_established`](Self::set_established) was called.
    pub fn is_established(&self) -> bool {
        // Acquire: pairs with set_established's Release (what the event handler did
        // before it set the flag is visible to whoever sees it set).
        self.established.load(Ordering::Acquire)
    }

    /// The device context librdmacm bound this id to (after address resolution, a
    /// bind to a device's address, or on a connection request).
    pub(crate) fn verbs(&self) -> Option<NonNull<sys::ibv_context>> {
        // SAFETY: valid id; the field is set by librdmacm as documented above.
        NonNull::new(unsafe { (*self.as_ptr()).verbs })
    }

    /// The port of that device.
    pub fn port_num(&self) -> u8 {
        // SAFETY: valid id.
        unsafe { (*self.as_ptr()).port_num }
    }

    /// The local address (`rdma_get_local_addr`, an inline function in rdma_cma.h).
    ///
    /// # Errors
    ///
    /// `NotConnected` while the id has no IP address.
    pub fn local_addr(&self) -> io::Result<SocketAddr> {
        // SAFETY: valid id; the union is read as the sockaddr_storage that covers it.
        let ss = unsafe { (*self.as_ptr()).route.addr.src_addr_union.src_storage };
        let mut a = from_sockaddr(&ss)
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotConnected, "no local address"))?;
        // SAFETY: valid id.
        let port = u16::from_be(unsafe { sys::rdma_get_src_port(self.as_ptr()) });
        a.set_port(port);
        Ok(a)
    }

    /// The peer's address (`rdma_get_peer_addr`).
    ///
    /// # Errors
    ///
    /// `NotConnected` while the id has none.
    pub fn peer_addr(&self) -> io::Result<SocketAddr> {
        // SAFETY: valid id; the union is read as the sockaddr_storage that covers it.
        let ss = unsafe { (*self.as_ptr()).route.addr.dst_addr_union.dst_storage };
        match from_sockaddr(&ss) {
            Some(a) if !a.ip().is_unspecified() => Ok(a),
            _ => Err(io::Error::new(
                io::ErrorKind::NotConnected,
                "no peer address",
            )),
        }
    }

    /// Waits for the next event of this id on its channel, ignoring others; `None`
    /// at the deadline.
    ///
    /// # Errors
    ///
    /// The channel's failure.
    pub fn next_event(&self, deadline: Instant) -> io::Result<Option<CmEvent>> {
        let ch = self.channel();
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            match ch.next(left)? {
                Some(ev) if ev.is_for(self) => return Ok(Some(ev)),
                Some(_) => continue,
                None => return Ok(None),
            }
        }
    }
}

impl Drop for CmId {
    fn drop(&mut self) {
        // SAFETY: the queue pair made on this id (if any) holds an Arc of it and was
        // destroyed first; all its events were acknowledged, so this does not block.
        let r = unsafe { sys::rdma_destroy_id(self.as_ptr()) };
        debug_assert_eq!(r, 0, "rdma_destroy_id failed");
    }
}

/// The IP address that a RoCE v2 IPv4 GID (`::ffff:a.b.c.d`) stands for.
///
/// ```
/// use rdma_channel::fabric::verbs::cm::gid_ip;
/// let gid = [0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff, 169, 254, 77, 1];
/// assert_eq!(gid_ip(&gid), Some("169.254.77.1".parse().unwrap()));
/// assert_eq!(gid_ip(&[0; 16]), None);
/// ```
pub fn gid_ip(gid: &[u8; 16]) -> Option<IpAddr> {
    if gid[..10] == [0; 10] && gid[10..12] == [0xff, 0xff] {
        Some(IpAddr::V4(Ipv4Addr::new(
            gid[12], gid[13], gid[14], gid[15],
        )))
    } else {
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::MaybeUninit;

    #[test]
    fn sockaddrs_round_trip() {
        for a in [
            "169.254.77.1:7471",
            "0.0.0.0:0",
            "[::1]:9",
            "[fe80::1%2]:65535",
        ] {
            let a: SocketAddr = a.parse().unwrap();
            let (ss, len) = to_sockaddr(&a);
            assert!(len as usize <= std::mem::size_of::<libc::sockaddr_storage>());
            assert_eq!(from_sockaddr(&ss), Some(a));
        }
        // SAFETY: plain data; all-zero is valid (family AF_UNSPEC).
        let zero: libc::sockaddr_storage = unsafe { MaybeUninit::zeroed().assume_init() };
        assert_eq!(from_sockaddr(&zero), None);
    }

    #[test]
    fn event_kinds_map() {
        use sys::rdma_cm_event_type as T;
        assert_eq!(
            CmEventKind::from_raw(T::RDMA_CM_EVENT_REJECTED),
            CmEventKind::Rejected
        );
        assert_eq!(CmEventKind::from_raw(99), CmEventKind::Other(99));
        assert!(CmEventKind::Established.has_conn_param());
        assert!(!CmEventKind::Disconnected.has_conn_param());
    }
}
