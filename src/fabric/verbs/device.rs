//! RAII wrappers of the device-level verbs objects: [`Context`] (an open device),
//! [`ProtectionDomain`], [`CompChannel`] and [`CompletionQueue`].

use super::error::{check, last_verb_error, verb_error};
use rdma_sys as sys;
use std::ffi::CStr;
use std::io;
use std::mem::MaybeUninit;
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// What the context's asynchronous events have reported so far.
#[derive(Default)]
struct Failures {
    /// QP numbers named by a fatal QP event.
    qpns: Vec<u32>,
    /// Completion queues named by a CQ error event (as addresses).
    cqs: Vec<usize>,
}

/// An open RDMA device (`ibv_context`). Closed (`ibv_close_device`) on drop, which
/// happens after every object made from it, since they all hold an `Arc` of it.
pub struct Context {
    ctx: NonNull<sys::ibv_context>,
    name: String,
    /// Opened by us (closed on drop), or librdmacm's (see [`Context::of_rdma_cm`]).
    owned: bool,
    /// Set by `IBV_EVENT_DEVICE_FATAL`.
    device_fatal: AtomicBool,
    /// Number of `IBV_EVENT_PORT_ERR` events seen.
    port_errors: AtomicU64,
    failures: Mutex<Failures>,
    epoch: Instant,
}

// SAFETY: libibverbs contexts may be used from any thread (rdma-core documents all verbs
// as thread-safe); the Rust-side state is atomics and a mutex.
unsafe impl Send for Context {}
// SAFETY: as above: concurrent verbs calls on one context are allowed.
unsafe impl Sync for Context {}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context").field("name", &self.name).finish()
    }
}

/// The names of the RDMA devices on this host, in `ibv_get_device_list` order.
///
/// # Errors
///
/// [`io::ErrorKind::NotFound`] ("no RDMA device found: ...") when libibverbs finds no
/// device or the kernel has no RDMA support.
pub fn device_names() -> io::Result<Vec<String>> {
    with_device_list(|devs| Ok(devs.iter().map(|(_, n)| n.clone()).collect()))
}

/// True when an RDMA device of this host is implemented in software (Soft-RoCE
/// `rxe`, `siw`): the kernel's protocol processing for it then runs on the host's
/// CPUs, so a process that busy-polls competes with its own transfers. Such devices
/// sit under `/sys/devices/virtual/infiniband`; adapters under their bus (PCI).
pub fn software_device_present() -> bool {
    let Ok(entries) = std::fs::read_dir("/sys/class/infiniband") else {
        return false;
    };
    entries.flatten().any(|e| {
        std::fs::canonicalize(e.path()).is_ok_and(|p| p.starts_with("/sys/devices/virtual"))
    })
}

/// True when device `name` is a software one (Soft-RoCE, siw): its sysfs node is
/// virtual rather than a PCI function's.
pub fn is_software_device(name: &str) -> bool {
    std::fs::canonicalize(format!("/sys/class/infiniband/{name}"))
        .is_ok_and(|p| p.starts_with("/sys/devices/virtual"))
}

/// Calls `f` with the device list (pointer and name of each device); frees the list.
fn with_device_list<T>(
    f: impl FnOnce(&[(*mut sys::ibv_device, String)]) -> io::Result<T>,
) -> io::Result<T> {
    let mut n: i32 = 0;
    // SAFETY: `n` is a valid out-pointer; the list is freed below.
    let list = unsafe { sys::ibv_get_device_list(&mut n) };
    if list.is_null() {
        let e = last_verb_error("ibv_get_device_list");
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            format!("no RDMA device found: {e}"),
        ));
    }
    let mut devs = Vec::with_capacity(n.max(0) as usize);
    for i in 0..n.max(0) as usize {
        // SAFETY: the list holds `n` valid device pointers.
        let dev = unsafe { *list.add(i) };
        // SAFETY: `dev` is a valid device; the name is a NUL-terminated string owned
        // by the device, copied out before the list is freed.
        let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name(dev)) }
            .to_string_lossy()
            .into_owned();
        devs.push((dev, name));
    }
    let result = if devs.is_empty() {
        Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no RDMA device found: ibv_get_device_list returned an empty list \
             (no RDMA hardware, no rdma_rxe/siw link, or no libibverbs provider)",
        ))
    } else {
        f(&devs)
    };
    // SAFETY: `list` came from ibv_get_device_list and is freed once; devices opened
    // from it stay valid (libibverbs keeps a reference).
    unsafe { sys::ibv_free_device_list(list) };
    result
}

impl Context {
    /// Opens the device called `name`, or the first device when `name` is `None`.
    /// The asynchronous event descriptor is made non-blocking, so that the queue
    /// pairs' state checks can drain events without ever waiting.
    ///
    /// # Errors
    ///
    /// [`io::ErrorKind::NotFound`] when there is no device or none of that name;
    /// `ibv_open_device` or `fcntl` failures with their errno.
    pub fn open(name: Option<&str>) -> io::Result<Context> {
        with_device_list(|devs| {
            let (dev, dev_name) = match name {
                None => devs[0].clone(),
                Some(want) => devs
                    .iter()
                    .find(|(_, n)| n == want)
                    .cloned()
                    .ok_or_else(|| {
                        let names: Vec<&str> = devs.iter().map(|(_, n)| n.as_str()).collect();
                        io::Error::new(
                            io::ErrorKind::NotFound,
                            format!(
                                "RDMA device {want:?} not found; devices: {}",
                                names.join(", ")
                            ),
                        )
                    })?,
            };
            // SAFETY: `dev` is a valid device of the live list.
            let ctx = NonNull::new(unsafe { sys::ibv_open_device(dev) })
                .ok_or_else(|| last_verb_error("ibv_open_device"))?;
            let c = Context {
                ctx,
                name: dev_name,
                owned: true,
                device_fatal: AtomicBool::new(false),
                port_errors: AtomicU64::new(0),
                failures: Mutex::new(Failures::default()),
                epoch: Instant::now(),
            };
            c.async_nonblocking()?;
            Ok(c)
        })
    }

    /// The context librdmacm opened for the device of an rdma_cm id (`id->verbs`).
    /// Queue pairs and regions used with that id must come from a protection domain
    /// on this very context. It is not closed on drop: librdmacm keeps it open while
    /// the device list taken by [`keep_rdma_cm_devices`] is held, that is for the
    /// rest of the process.
    ///
    /// # Safety
    ///
    /// `ctx` is a context of librdmacm's device list, kept open as said.
    pub(crate) unsafe fn of_rdma_cm(ctx: NonNull<sys::ibv_context>) -> io::Result<Context> {
        // SAFETY: a valid context (the contract); its device and name live as long.
        let name = unsafe { CStr::from_ptr(sys::ibv_get_device_name((*ctx.as_ptr()).device)) }
            .to_string_lossy()
            .into_owned();
        let c = Context {
            ctx,
            name,
            owned: false,
            device_fatal: AtomicBool::new(false),
            port_errors: AtomicU64::new(0),
            failures: Mutex::new(Failures::default()),
            epoch: Instant::now(),
        };
        c.async_nonblocking()?;
        Ok(c)
    }

    /// Makes the asynchronous event descriptor non-blocking, so that the queue
    /// pairs' state checks can drain events without ever waiting.
    fn async_nonblocking(&self) -> io::Result<()> {
        // SAFETY: the context is valid; async_fd is its event descriptor, which we
        // only switch to non-blocking mode.
        let fd = unsafe { (*self.ctx.as_ptr()).async_fd };
        // SAFETY: fcntl on a descriptor the context owns and keeps open.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        if flags < 0 {
            return Err(last_verb_error("fcntl(async_fd, F_GETFL)"));
        }
        // SAFETY: as above.
        if unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(last_verb_error("fcntl(async_fd, F_SETFL)"));
        }
        Ok(())
    }

    /// The device name, e.g. `rxe0` or `mlx5_0`.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The raw context, for the other wrappers of this module.
    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_context {
        self.ctx.as_ptr()
    }

    /// Nanoseconds since the context was opened (a cheap monotonic clock for rate
    /// limits).
    pub(crate) fn now_ns(&self) -> u64 {
        self.epoch.elapsed().as_nanos() as u64
    }

    /// `ibv_query_device`.
    ///
    /// # Errors
    ///
    /// The verb's failure with its errno.
    pub fn query_device(&self) -> io::Result<sys::ibv_device_attr> {
        let mut attr = MaybeUninit::<sys::ibv_device_attr>::zeroed();
        // SAFETY: valid context and an out-pointer to a properly sized struct.
        check("ibv_query_device", unsafe {
            sys::ibv_query_device(self.as_ptr(), attr.as_mut_ptr())
        })?;
        // SAFETY: zero-initialised plain C data, filled in by the verb.
        Ok(unsafe { attr.assume_init() })
    }

    /// `ibv_query_port` (the inline wrapper that passes the full `ibv_port_attr`).
    ///
    /// # Errors
    ///
    /// The verb's failure with its errno (e.g. `EINVAL` for a port that does not exist).
    pub fn query_port(&self, port: u8) -> io::Result<sys::ibv_port_attr> {
        let mut attr = MaybeUninit::<sys::ibv_port_attr>::zeroed();
        // SAFETY: valid context and an out-pointer to a zeroed ibv_port_attr, whose size
        // the wrapper passes to the provider.
        check("ibv_query_port", unsafe {
            sys::___ibv_query_port(self.as_ptr(), port, attr.as_mut_ptr())
        })?;
        // SAFETY: zero-initialised plain C data, filled in by the verb.
        Ok(unsafe { attr.assume_init() })
    }

    /// `ibv_query_gid`: the 16 raw bytes of GID `index` of `port`.
    ///
    /// # Errors
    ///
    /// The verb's failure with its errno.
    pub fn query_gid(&self, port: u8, index: u32) -> io::Result<[u8; 16]> {
        let mut gid = MaybeUninit::<sys::ibv_gid>::zeroed();
        let index = i32::try_from(index).map_err(|_| verb_error("ibv_query_gid", libc::EINVAL))?;
        // SAFETY: valid context and an out-pointer to an ibv_gid.
        check("ibv_query_gid", unsafe {
            sys::ibv_query_gid(self.as_ptr(), port, index, gid.as_mut_ptr())
        })?;
        // SAFETY: the union was zeroed and filled; `raw` covers all 16 bytes.
        Ok(unsafe { gid.assume_init().raw })
    }

    /// The GID type of GID `index` of `port` from sysfs (`IB/RoCE v1`, `RoCE v2`), if
    /// the kernel exposes it.
    pub fn gid_type(&self, port: u8, index: u32) -> Option<String> {
        let path = format!(
            "/sys/class/infiniband/{}/ports/{port}/gid_attrs/types/{index}",
            self.name
        );
        std::fs::read_to_string(path)
            .ok()
            .map(|s| s.trim().to_string())
    }

    /// Drains pending asynchronous events without blocking and records the fatal ones
    /// (QP fatal / request / access errors, CQ errors, port errors, device fatal), so
    /// that the queue pairs concerned report [`QpState::Error`](crate::fabric::QpState).
    /// Another thread already draining is not waited for.
    pub(crate) fn poll_async_events(&self) {
        let Ok(mut failures) = self.failures.try_lock() else {
            return;
        };
        loop {
            let mut ev = MaybeUninit::<sys::ibv_async_event>::zeroed();
            // SAFETY: valid context and out-pointer; async_fd is non-blocking (see
            // `open`), so this returns -1 with EAGAIN when no event is pending.
            let r = unsafe { sys::ibv_get_async_event(self.as_ptr(), ev.as_mut_ptr()) };
            if r != 0 {
                return;
            }
            let p = ev.as_mut_ptr();
            // SAFETY: the event was filled in. The type is read as the raw C enum value
            // (a u32), so an event number newer than our bindings is no invalid Rust enum.
            let ty = unsafe { std::ptr::addr_of!((*p).event_type).cast::<u32>().read() };
            match ty {
                // QP_FATAL, QP_REQ_ERR, QP_ACCESS_ERR: `element.qp` is valid until acked.
                1..=3 => {
                    // SAFETY: for these types the union holds the QP pointer, valid until
                    // ibv_ack_async_event (the QP cannot be destroyed before the ack).
                    let qpn = unsafe { (*(*p).element.qp).qp_num };
                    failures.qpns.push(qpn);
                }
                // CQ_ERR: `element.cq`.
                0 => {
                    // SAFETY: for CQ_ERR the union holds the CQ pointer.
                    let cq = unsafe { (*p).element.cq } as usize;
                    failures.cqs.push(cq);
                }
                // DEVICE_FATAL. Release: pairs with qp_failed's Acquire, so the
                // failures recorded before it are seen with it.
                8 => self.device_fatal.store(true, Ordering::Release),
                // PORT_ERR
                10 => {
                    // AcqRel: a counter read by port_errors (Acquire) on other
                    // threads, which then also see this thread's earlier records.
                    self.port_errors.fetch_add(1, Ordering::AcqRel);
                }
                _ => {}
            }
            // SAFETY: every event obtained must be acknowledged exactly once.
            unsafe { sys::ibv_ack_async_event(p) };
        }
    }

    /// Number of port-error events seen so far.
    pub(crate) fn port_errors(&self) -> u64 {
        // Acquire: pairs with the AcqRel increment in the event loop.
        self.port_errors.load(Ordering::Acquire)
    }

    /// True when an asynchronous event said the QP `qpn` (with completion queue `cq`)
    /// failed, or the device died.
    pub(crate) fn qp_failed(&self, qpn: u32, cq: usize) -> bool {
        // Acquire: pairs with the Release store in the event loop.
        if self.device_fatal.load(Ordering::Acquire) {
            return true;
        }
        let f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        f.qpns.contains(&qpn) || f.cqs.contains(&cq)
    }

    /// Forgets events about a QP and CQ being destroyed (their numbers may be reused).
    pub(crate) fn forget(&self, qpn: u32, cq: usize) {
        let mut f = self.failures.lock().unwrap_or_else(|e| e.into_inner());
        f.qpns.retain(|&q| q != qpn);
        f.cqs.retain(|&c| c != cq);
    }
}

impl Drop for Context {
    fn drop(&mut self) {
        if !self.owned {
            return;
        }
        // SAFETY: every object made from this context holds an Arc of it, so none is
        // left; the context is closed once.
        let r = unsafe { sys::ibv_close_device(self.ctx.as_ptr()) };
        debug_assert_eq!(r, 0, "ibv_close_device failed");
    }
}

/// Takes librdmacm's device list once and never frees it, so that librdmacm keeps
/// every device context open for the rest of the process (the contexts of rdma_cm
/// ids, see [`Context::of_rdma_cm`]).
///
/// # Errors
///
/// [`io::ErrorKind::NotFound`] when librdmacm finds no device.
pub(crate) fn keep_rdma_cm_devices() -> io::Result<()> {
    static KEPT: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    let n = *KEPT.get_or_init(|| {
        let mut n: i32 = 0;
        // SAFETY: valid out-pointer. The list is deliberately never freed (see above).
        let list = unsafe { sys::rdma_get_devices(&mut n) };
        if list.is_null() {
            0
        } else {
            n.max(0) as usize
        }
    });
    if n == 0 {
        return Err(io::Error::new(
            io::ErrorKind::NotFound,
            "no RDMA device found: rdma_get_devices returned no device",
        ));
    }
    Ok(())
}

/// A protection domain (`ibv_pd`). Deallocated on drop, after every region and queue
/// pair made in it (they hold an `Arc` of it).
pub struct ProtectionDomain {
    pd: NonNull<sys::ibv_pd>,
    ctx: std::sync::Arc<Context>,
}

// SAFETY: a PD is a kernel handle usable from any thread.
unsafe impl Send for ProtectionDomain {}
// SAFETY: verbs taking a PD are thread-safe.
unsafe impl Sync for ProtectionDomain {}

impl std::fmt::Debug for ProtectionDomain {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProtectionDomain")
            .field("device", &self.ctx.name)
            .finish()
    }
}

impl ProtectionDomain {
    /// `ibv_alloc_pd` on `ctx`.
    ///
    /// # Errors
    ///
    /// The verb's failure with its errno.
    pub fn new(ctx: std::sync::Arc<Context>) -> io::Result<ProtectionDomain> {
        // SAFETY: valid context.
        let pd = NonNull::new(unsafe { sys::ibv_alloc_pd(ctx.as_ptr()) })
            .ok_or_else(|| last_verb_error("ibv_alloc_pd"))?;
        Ok(ProtectionDomain { pd, ctx })
    }

    /// The device this domain belongs to.
    pub fn context(&self) -> &std::sync::Arc<Context> {
        &self.ctx
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_pd {
        self.pd.as_ptr()
    }
}

impl Drop for ProtectionDomain {
    fn drop(&mut self) {
        // SAFETY: no region or QP of this PD is left (each holds an Arc of it).
        let r = unsafe { sys::ibv_dealloc_pd(self.pd.as_ptr()) };
        debug_assert_eq!(r, 0, "ibv_dealloc_pd failed");
    }
}

/// A completion channel (`ibv_comp_channel`): the descriptor through which armed
/// completion queues announce a new completion, so that a waiter can sleep in
/// `poll(2)` until the device has something for it instead of on a timer. Its
/// descriptor is non-blocking. Destroyed on drop, after every completion queue
/// attached to it (each holds an `Arc` of it).
pub struct CompChannel {
    ch: NonNull<sys::ibv_comp_channel>,
    ctx: std::sync::Arc<Context>,
}

// SAFETY: the channel is a descriptor; reading events from it is thread-safe (each
// event goes to one reader) and the pointer is only used through verbs.
unsafe impl Send for CompChannel {}
// SAFETY: as above.
unsafe impl Sync for CompChannel {}

impl std::fmt::Debug for CompChannel {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompChannel")
            .field("device", &self.ctx.name)
            .field("fd", &self.fd())
            .finish()
    }
}

impl CompChannel {
    /// `ibv_create_comp_channel`, with its descriptor made non-blocking.
    ///
    /// # Errors
    ///
    /// The verb's or `fcntl`'s failure with its errno.
    pub fn new(ctx: std::sync::Arc<Context>) -> io::Result<CompChannel> {
        // SAFETY: valid context.
        let ch = NonNull::new(unsafe { sys::ibv_create_comp_channel(ctx.as_ptr()) })
            .ok_or_else(|| last_verb_error("ibv_create_comp_channel"))?;
        let me = CompChannel { ch, ctx };
        let fd = me.fd();
        // SAFETY: fcntl on the channel's own open descriptor.
        let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
        // SAFETY: as above.
        if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
            return Err(last_verb_error("fcntl(O_NONBLOCK) on a completion channel"));
        }
        Ok(me)
    }

    /// The channel's descriptor (readable when an armed queue has a completion).
    pub fn fd(&self) -> std::os::fd::RawFd {
        // SAFETY: a valid channel; `fd` is set at creation and never changes.
        unsafe { (*self.ch.as_ptr()).fd }
    }

    /// Waits up to `timeout` for an event of an armed completion queue, without
    /// taking it (see [`take_event`](Self::take_event)): true when there is one. The
    /// event is left for later because taking it is a system call more, which a
    /// waiter woken for its message should not pay before it reads the message.
    ///
    /// # Errors
    ///
    /// `poll(2)`'s failure (but `EINTR`, which counts as a timeout).
    pub fn wait(&self, timeout: std::time::Duration) -> io::Result<bool> {
        let mut pfd = libc::pollfd {
            fd: self.fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // Round up, so that a short wait still blocks instead of spinning on 0 ms.
        let ms = timeout.as_micros().div_ceil(1000).min(i32::MAX as u128) as i32;
        // SAFETY: one valid pollfd for the duration of the call.
        let r = unsafe { libc::poll(&mut pfd, 1, ms) };
        if r < 0 {
            let e = io::Error::last_os_error();
            if e.kind() == io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(io::Error::new(
                e.kind(),
                format!("poll on a completion channel: {e}"),
            ));
        }
        Ok(r > 0)
    }

    /// Takes and acknowledges one event, if there is one (the queue it was for is
    /// then disarmed until armed again); false when there is none, or another
    /// thread took it first.
    pub fn take_event(&self) -> bool {
        let mut cq: *mut sys::ibv_cq = std::ptr::null_mut();
        let mut cq_ctx: *mut libc::c_void = std::ptr::null_mut();
        // SAFETY: valid channel; the descriptor is non-blocking, so this returns -1
        // (EAGAIN) at once when there is no event.
        if unsafe { sys::ibv_get_cq_event(self.ch.as_ptr(), &mut cq, &mut cq_ctx) } != 0 {
            return false;
        }
        // SAFETY: `cq` is the queue the event was for, alive (it is destroyed only
        // after all its events are acknowledged, which this does at once).
        unsafe { sys::ibv_ack_cq_events(cq, 1) };
        true
    }
}

impl Drop for CompChannel {
    fn drop(&mut self) {
        // SAFETY: no completion queue uses the channel any more (each holds an Arc).
        let r = unsafe { sys::ibv_destroy_comp_channel(self.ch.as_ptr()) };
        debug_assert_eq!(r, 0, "ibv_destroy_comp_channel failed");
    }
}

/// A completion queue (`ibv_cq`), polled, and optionally attached to a
/// [`CompChannel`] so that a waiter can be told of its next completion
/// ([`arm`](Self::arm)). Destroyed on drop, after the queue pair using it.
pub struct CompletionQueue {
    cq: NonNull<sys::ibv_cq>,
    ctx: std::sync::Arc<Context>,
    /// Dropped after the queue is destroyed (fields drop after `Drop::drop`).
    channel: Option<std::sync::Arc<CompChannel>>,
}

// SAFETY: a CQ may be polled from any thread; providers lock internally.
unsafe impl Send for CompletionQueue {}
// SAFETY: as above.
unsafe impl Sync for CompletionQueue {}

impl std::fmt::Debug for CompletionQueue {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CompletionQueue")
            .field("device", &self.ctx.name)
            .field("channel", &self.channel.is_some())
            .finish()
    }
}

impl CompletionQueue {
    /// `ibv_create_cq` with room for at least `entries` completions.
    ///
    /// # Errors
    ///
    /// The verb's failure with its errno.
    pub fn new(ctx: std::sync::Arc<Context>, entries: u32) -> io::Result<CompletionQueue> {
        Self::with_channel(ctx, entries, None)
    }

    /// As [`new`](Self::new), attached to `channel` when there is one.
    ///
    /// # Errors
    ///
    /// The verb's failure with its errno.
    pub fn with_channel(
        ctx: std::sync::Arc<Context>,
        entries: u32,
        channel: Option<std::sync::Arc<CompChannel>>,
    ) -> io::Result<CompletionQueue> {
        let n = i32::try_from(entries).map_err(|_| verb_error("ibv_create_cq", libc::EINVAL))?;
        let ch = channel
            .as_ref()
            .map_or(std::ptr::null_mut(), |c| c.ch.as_ptr());
        // SAFETY: valid context; `ch` is null or a channel of the same context that
        // outlives the queue (held in `channel`); no user context, vector 0.
        let cq = NonNull::new(unsafe {
            sys::ibv_create_cq(ctx.as_ptr(), n, std::ptr::null_mut(), ch, 0)
        })
        .ok_or_else(|| last_verb_error("ibv_create_cq"))?;
        Ok(CompletionQueue { cq, ctx, channel })
    }

    /// Asks for an event on the channel at the next completion
    /// (`ibv_req_notify_cq`, every completion, not only solicited ones).
    ///
    /// # Errors
    ///
    /// `InvalidInput` for a queue without a channel; the verb's failure.
    pub fn arm(&self) -> io::Result<()> {
        if self.channel.is_none() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                "ibv_req_notify_cq: the completion queue has no channel",
            ));
        }
        // SAFETY: a valid CQ attached to a live channel.
        check("ibv_req_notify_cq", unsafe {
            sys::ibv_req_notify_cq(self.cq.as_ptr(), 0)
        })
    }

    pub(crate) fn as_ptr(&self) -> *mut sys::ibv_cq {
        self.cq.as_ptr()
    }

    /// `ibv_poll_cq` into `wc`; returns how many entries were filled.
    ///
    /// # Errors
    ///
    /// The provider's failure (a negative return) as `ibv_poll_cq: ...`.
    pub(crate) fn poll(&self, wc: &mut [MaybeUninit<sys::ibv_wc>]) -> io::Result<usize> {
        let n = wc.len().min(i32::MAX as usize) as i32;
        // SAFETY: the CQ is valid and `wc` has room for `n` entries; ibv_wc is plain C
        // data the provider writes.
        let r = unsafe { sys::ibv_poll_cq(self.as_ptr(), n, wc.as_mut_ptr().cast()) };
        if r < 0 {
            Err(verb_error("ibv_poll_cq", libc::EIO))
        } else {
            Ok(r as usize)
        }
    }
}

impl Drop for CompletionQueue {
    fn drop(&mut self) {
        // SAFETY: the QP using this CQ holds an Arc of it and is destroyed first.
        let r = unsafe { sys::ibv_destroy_cq(self.cq.as_ptr()) };
        debug_assert_eq!(r, 0, "ibv_destroy_cq failed");
    }
}
