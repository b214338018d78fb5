//! The process group: this process's rank among `size`, how the others are reached
//! (their hello cards, exchanged through PMI or the caller's callbacks), and the
//! connection to each, set up lazily when a pair first communicates (see [`hello`]).
//! The C interface ([`crate::ffi`]) is its face: exports, status codes and the
//! library's global state live there.

pub(crate) mod cpus;
pub(crate) mod error;
pub(crate) mod exchange;
pub(crate) mod hello;
#[cfg(feature = "verbs")]
pub(crate) mod remote;

use std::io::{self, IoSlice, IoSliceMut};
use std::os::unix::net::{UnixListener, UnixStream};
use std::sync::Arc;

use self::cpus::CpuSet;
use self::error::{Error, ErrorKind};
use self::exchange::Exchange;
use self::hello::Hello;
use crate::config::{Config, WaitPolicy};
use crate::engine::lane::{LaneCell, SendLane};
use crate::engine::{
    available_cpus, Backoff, Lending, Peeked, Prepared, QuietWatch, Receiver, Sender,
    CONTENDED_SPIN,
};
use crate::fabric::{Access, AnyFabric, Card, Fabric};
use crate::handshake::unix;
use crate::ring::memory::Doorbell;

/// Key under which every process publishes its hello card.
pub(crate) const HELLO_KEY: &str = "rch-hello";
/// Data calls on connections that are not up (yet) between two looks at the listener
/// and the handshakes in progress (each look costs a few system calls), and polls of
/// rch_wait between two such looks while it spins.
pub(crate) const PROGRESS_EVERY: u32 = 64;
/// Data calls on connections that are up between two such looks: a process that only
/// ever polls its established connections still answers new peers.
const BACKGROUND_EVERY: u32 = 4096;
/// rch_poll_ready calls a watched connection may find nothing in a row before it
/// counts as quiet and is looked at only now and then ([`Watch`]).
const QUIET_AFTER: u32 = 256;
/// Quiet connections without a doorbell that rch_poll_ready looks at per call, in
/// turn.
const QUIET_PER_CALL: usize = 2;
/// rch_poll_ready calls between two looks at one quiet connection with a doorbell,
/// in turn: its peer rings when it writes, so these looks only catch the write that
/// raced the request to ring (`Sender::ring_if_asked`) and a peer that failed.
const BELLED_TURN_EVERY: u64 = 16;

/// What `rch_get_stats` reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Stats {
    /// Connections up.
    pub(crate) connections: usize,
    /// Handshakes in progress.
    pub(crate) pending: usize,
    /// Memory registered for the connections.
    pub(crate) registered_bytes: usize,
}

/// How rch_poll_ready finds traffic (rch_get_watch_stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct WatchStats {
    pub(crate) busy: usize,
    pub(crate) quiet: usize,
    pub(crate) quiet_belled: usize,
    pub(crate) rings: u64,
    pub(crate) found_by_bell: u64,
    pub(crate) found_in_turn: u64,
}

/// Where the zero-copy reads of the connections up went, rail by rail
/// (rch_get_rail_stats).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct RailStats {
    /// Connections up with more than one rail.
    pub(crate) connections: usize,
    /// Rails of the connection with the most.
    pub(crate) rails: usize,
    /// Bytes read over each rail.
    pub(crate) read_bytes: [u64; crate::config::MAX_RAILS],
}

/// A connection that is up: our sending and receiving halves.
struct Up {
    // Fields drop in order: the receiver first, so that the peer sees "stopped
    // reading" before it sees the end of our stream (rch_vc_close closes both).
    rx: Receiver<AnyFabric>,
    tx: Sender<AnyFabric>,
    /// The unused halves of a loopback connection, kept so that they do not close it.
    _spare: Option<(Receiver<AnyFabric>, Sender<AnyFabric>)>,
    /// As acceptor, the socket on which the initiator's READY is awaited; we do not
    /// write before it arrived.
    confirm: Option<UnixStream>,
    /// The handshake socket, kept open as a liveness signal once the handshake is
    /// done: the kernel closes it when the peer's process ends, and a peer that
    /// closes the connection in order says BYE on it first. (An RC queue pair on
    /// verbs only notices a dead peer when it sends, so a reader would wait forever.)
    link: Option<UnixStream>,
    /// The peer's process ended without BYE.
    gone: bool,
    /// Data calls that moved nothing, to look at `link` now and then.
    empty: u32,
}

/// Empty data calls between two looks at a connection's liveness socket.
const LIVENESS_EVERY: u32 = 1024;

impl Up {
    fn new(
        rx: Receiver<AnyFabric>,
        tx: Sender<AnyFabric>,
        confirm: Option<UnixStream>,
        link: Option<UnixStream>,
    ) -> Up {
        Up {
            rx,
            tx,
            _spare: None,
            confirm,
            link,
            gone: false,
            empty: 0,
        }
    }

    /// True once the peer's process is known to have ended without closing the
    /// connection (its socket hung up without BYE).
    fn peer_gone(&mut self) -> bool {
        if self.gone {
            return true;
        }
        let Some(s) = &self.link else {
            return false;
        };
        if !unix::readable(s) {
            return false;
        }
        match unix::recv(s) {
            Ok((t, _)) if &t == unix::TAG_BYE => self.link = None,
            _ => {
                self.link = None;
                self.gone = true;
            }
        }
        self.gone
    }

    /// After a data call that moved nothing: true if the peer is gone (checked
    /// every LIVENESS_EVERY such calls).
    #[inline]
    fn idle_gone(&mut self) -> bool {
        self.empty = self.empty.wrapping_add(1);
        self.gone || (self.empty % LIVENESS_EVERY == 0 && self.peer_gone())
    }
}

impl Drop for Up {
    fn drop(&mut self) {
        // An orderly close: tell the peer before its liveness socket hangs up.
        if let Some(s) = self.link.take() {
            let _ = s.set_nonblocking(true);
            let _ = unix::send(&s, unix::TAG_BYE, &[], None);
        }
    }
}

/// One virtual connection.
// `Up` is stored inline (3.4 KiB per rank, 110 KiB for 32 ranks): the data path
// then reaches the channel without one more dependent load.
#[allow(clippy::large_enum_variant)]
enum Conn {
    /// Nothing set up yet.
    Idle,
    /// We sent HELLO and wait for the answer.
    Outbound {
        sock: UnixStream,
        prepared: Box<Prepared<AnyFabric>>,
    },
    /// Our HELLO lost the race; the peer's HELLO is on its way.
    AwaitPeer,
    /// A peer on another host: our rdma_cm connection request is on its way.
    #[cfg(feature = "verbs")]
    CmOutbound(Box<crate::handshake::cm::Connector>),
    /// A peer on another host: we accepted its rdma_cm request and wait for the
    /// connection to be established.
    #[cfg(feature = "verbs")]
    CmAccepting,
    /// A peer on another host: connected through rdma_cm, the rails' cards on their
    /// way over rail 0 (`Channel::poll_connect_rails`), not used until both ends'
    /// rails are up or the deadline passes.
    #[cfg(feature = "verbs")]
    CmRails(Box<crate::engine::Channel<AnyFabric>>, std::time::Instant),
    Up(Up),
    Closed,
    Failed(Error),
}

/// What [`Group::peek`] lends: `len` bytes at `bytes` in the connection's ring
/// (none when 0), or, with `zero_copy_left` > 0, a zero-copy transfer that only a
/// read takes.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Lent {
    pub(crate) bytes: *const u8,
    pub(crate) len: usize,
    pub(crate) zero_copy_left: u64,
}

impl Lent {
    const NOTHING: Lent = Lent {
        bytes: std::ptr::null(),
        len: 0,
        zero_copy_left: 0,
    };
}

struct Vc {
    conn: Conn,
    /// Where rch_poll_ready looks for this connection's traffic.
    watch: Watched,
    /// A put returned less than offered (or left a zero-copy transfer in flight):
    /// rch_wait watches for room.
    want_write: bool,
    /// Transfers lent by rch_put_lend are not released yet: rch_wait watches for
    /// the peer's confirmations (and serves its pushes).
    want_release: bool,
    /// A read reported the connection's end or failure: rch_wait stops watching it.
    rx_done: bool,
    /// The peer's sender rings our doorbell when asked: a connection of this host
    /// (not the loopback, whose halves live in a domain of their own).
    belled: bool,
    /// The send lane handed to the C interface, kept so that its pointer stays valid
    /// until the group goes, whatever becomes of the connection.
    lane: Option<Arc<LaneCell>>,
}

impl Vc {
    /// rch_wait's look at one connection that is up: a read would return now
    /// (`read`), or, with `write`, a put would progress (where one wants to, or
    /// `any`) or a lent transfer can be released. Each is looked at, as each look
    /// also does the connection's upkeep.
    fn up_ready(&mut self, read: bool, write: bool, any: bool) -> bool {
        let Conn::Up(up) = &mut self.conn else {
            return false;
        };
        let readable = read && !self.rx_done && up.rx.poll_readable().unwrap_or(true);
        let mut writable = false;
        if write && up.confirm.is_none() {
            if self.want_write || any {
                writable = up.tx.poll_writable().unwrap_or(true);
            }
            if self.want_release {
                writable |= up.tx.poll_released().unwrap_or(true);
            }
        }
        readable | writable
    }
}

/// The CPUs the group's ranks on `host` may run on: the union of their affinity
/// masks (their hello cards carry them), so that ranks pinned to a core each count
/// one CPU each, not one CPU in all; fewer under a CPU quota this process sees (a
/// cgroup's, which no mask shows). This process's own count when a card has no mask.
fn host_cpus(peers: &[Hello], host: &str) -> usize {
    let own = available_cpus();
    let mut union = CpuSet::default();
    for h in peers.iter().filter(|h| h.host == host) {
        match &h.cpus {
            Some(c) => union.union_with(c),
            None => return own,
        }
    }
    // available_parallelism is the smaller of the mask and the quota: below the
    // mask's count, the quota is what binds.
    let quota = CpuSet::of_this_process()
        .filter(|m| own < m.count())
        .map(|_| own);
    union.count().min(quota.unwrap_or(usize::MAX)).max(1)
}

/// Whether an outnumbered group spreads its ranks over its CPUs (`RCH_SPREAD`).
fn spread_wanted() -> Result<bool, Error> {
    match crate::settings::SPREAD.value() {
        Ok(None) => Ok(true),
        Ok(Some(v)) if v == "auto" => Ok(true),
        Ok(Some(v)) if v == "off" => Ok(false),
        Ok(Some(v)) => Err(Error::new(
            ErrorKind::Invalid,
            format!("RCH_SPREAD={v:?}: expected `auto` or `off`"),
        )),
        Err(e) => Err(Error::new(ErrorKind::Invalid, e.to_string())),
    }
}

/// The CPU rank `rank` of a group outnumbering its CPUs binds itself to: the local
/// ranks' CPUs taken in turn, by the rank's place among the ranks on its host, when
/// every one of them may run on all of those CPUs (no launcher bound any; one that
/// did chose for them). `None` otherwise, or when a card did not say.
///
/// Why: ranks that yield whenever they wait are always runnable and always
/// cache-hot, and the kernel's load balancer leaves them where `MPI_Init` left them;
/// at 4 ranks on 2 CPUs that was three on one CPU (`perf sched`), and `osu_barrier`
/// took 11.7-12.6 us against 6.0-8.1 bound two and two (NPB IS 0.31 against 0.29 s,
/// CG 0.33 against 0.30; bench/notebook/2026-12.md).
fn spread_cpu(peers: &[Hello], host: &str, rank: usize) -> Option<usize> {
    let local: Vec<(usize, &Hello)> = peers
        .iter()
        .enumerate()
        .filter(|(_, h)| h.host == host)
        .collect();
    let mut union = CpuSet::default();
    for (_, h) in &local {
        union.union_with(h.cpus.as_ref()?);
    }
    if local.iter().any(|(_, h)| h.cpus.as_ref() != Some(&union)) {
        return None;
    }
    let place = local.iter().position(|&(r, _)| r == rank)?;
    union.nth(place % union.count().max(1))
}

/// What a look at one connection found (see `Group::readiness`).
enum Readiness {
    Ready,
    Nothing,
    Done,
}

/// Where rch_poll_ready stands with one connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Watched {
    /// Not enrolled (never used, or done).
    No,
    /// Looked at on every call; the count of calls in a row that found nothing.
    Busy(u32),
    /// Quiet: found by its peer ringing our doorbell if `belled`, and looked at in
    /// turn ([`QUIET_PER_CALL`] per call, or one every [`BELLED_TURN_EVERY`] calls
    /// if belled).
    Quiet,
}

/// The connections rch_poll_ready watches, so that a call costs the busy ones and a
/// few quiet ones, not every connection of the job (seed 003, figure 6: polling
/// every peer's buffer is what made latency grow with the number of peers).
#[derive(Debug, Default)]
struct Watch {
    busy: Vec<usize>,
    quiet: Vec<usize>,
    /// The next quiet connection to look at.
    next_quiet: usize,
    /// Quiet connections whose peers ring our doorbell.
    quiet_belled: Vec<usize>,
    next_belled: usize,
    /// Slots found rung by the last look at the doorbell (kept to reuse its memory).
    rung: Vec<usize>,
    /// Doorbell words found set.
    rings: u64,
    /// Quiet connections found with something to read: by their peer's ring, and
    /// by a look in turn.
    found_by_bell: u64,
    found_in_turn: u64,
    calls: u64,
    /// The coarse clock (`coarse_ms`) at the last look at the sockets.
    looked_at: u64,
}

/// Most milliseconds of the coarse clock between two looks at the sockets by
/// rch_poll_ready.
const LOOK_EVERY_MS: u64 = 2;

/// Milliseconds of `CLOCK_MONOTONIC_COARSE`: a few nanoseconds to read (no
/// hardware counter), at the kernel tick's resolution (1-4 ms), which is all a
/// "look now and then" needs.
fn coarse_ms() -> u64 {
    let mut t = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: clock_gettime writes one timespec into the live local `t`.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC_COARSE, &mut t) };
    (t.tv_sec as u64).wrapping_mul(1000) + (t.tv_nsec as u64) / 1_000_000
}

/// The process group and its connections.
pub(crate) struct Group {
    pub(crate) rank: u32,
    pub(crate) size: u32,
    pub(crate) spawned: bool,
    exchange: Box<dyn Exchange>,
    fabric: AnyFabric,
    cfg: Config,
    /// Whether this host's CPUs are short for what runs on them, which decides how a
    /// wait gives its CPU away (see `wait_policy`). Known after rch_init.
    contention: Contention,
    listener: UnixListener,
    hello: Hello,
    peers: Vec<Hello>,
    vcs: Vec<Vc>,
    /// rch_poll_ready's watch over the connections.
    watch: Watch,
    /// Where the senders of our host ring when we ask (`Vc::belled`); `None` if it
    /// could not be allocated (then quiet connections are only looked at in turn).
    doorbell: Option<Doorbell<<AnyFabric as Fabric>::Region>>,
    /// Accepted sockets whose HELLO has not arrived yet.
    inbound: Vec<UnixStream>,
    /// Handshakes in progress (outbound or awaiting READY), to skip the scan when none.
    handshakes: usize,
    tick: u32,
    /// Where the last wait's backoff stopped when it timed out with nothing to do;
    /// the next wait continues from there (an upper layer that waits in slices, as
    /// MPI's progress engine does, would otherwise spin and yield again each slice).
    /// Cleared when data moves.
    pub(crate) idle_backoff: Option<Backoff>,
    uid: u32,
    /// Our rdma_cm listener, through which peers of other hosts connect.
    #[cfg(feature = "verbs")]
    remote: Option<remote::Remote>,
    /// Why this process cannot reach peers of other hosts, if it cannot.
    remote_why: Option<String>,
}

impl Group {
    /// Opens the fabric, listens, and publishes this process's hello card.
    pub(crate) fn new(
        rank: u32,
        size: u32,
        spawned: bool,
        mut exchange: Box<dyn Exchange>,
    ) -> Result<Group, Error> {
        let mut cfg =
            Config::from_env().map_err(|e| Error::new(ErrorKind::Config, e.to_string()))?;
        // MPI programs send from heap memory: let the receivers measure which path
        // moves their large buffers faster on this host.
        cfg.zero_copy_adaptive_by_default = true;
        // Every peer on this host costs a few descriptors: with tens of ranks a soft
        // limit of 1024 runs out mid-handshake. Best effort: the handshake's own error
        // names the limit if it still runs out.
        let _ = crate::limits::raise_descriptor_limit();
        let fabric =
            AnyFabric::from_env().map_err(|e| Error::from_setup(&e, "opening the fabric"))?;
        let socket = unix::socket_name().map_err(|e| Error::system(&e, "getrandom"))?;
        let listener = unix::listen(&socket)
            .map_err(|e| Error::system(&e, &format!("listening on @{socket}")))?;
        #[cfg(feature = "verbs")]
        let (remote, remote_why) = match remote::Remote::open(&cfg) {
            Ok(r) => (Some(r), None),
            Err(why) => (None, Some(why)),
        };
        #[cfg(not(feature = "verbs"))]
        let remote_why =
            Some("rdma-channel was built without the verbs feature (rdma_cm)".to_string());
        // One word per rank: a few KiB even for thousands of ranks, registered once.
        let doorbell = fabric
            .alloc_region(
                Doorbell::<<AnyFabric as Fabric>::Region>::bytes_for(size as usize),
                Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            )
            .and_then(|r| Doorbell::new(r, size as usize))
            .ok();
        let hello = Hello {
            bell: doorbell.as_ref().map(Doorbell::remote),
            fabric: fabric.kind(),
            pid: std::process::id(),
            socket,
            host: hello::host_id(),
            #[cfg(feature = "verbs")]
            cm: remote.as_ref().map(|r| r.addr),
            #[cfg(not(feature = "verbs"))]
            cm: None,
            cpus: CpuSet::of_this_process(),
        };
        exchange.publish(HELLO_KEY, hello.encode().as_bytes())?;
        let vcs = (0..size)
            .map(|_| Vc {
                conn: Conn::Idle,
                watch: Watched::No,
                want_write: false,
                want_release: false,
                rx_done: false,
                belled: false,
                lane: None,
            })
            .collect();
        Ok(Group {
            rank,
            size,
            spawned,
            exchange,
            fabric,
            cfg,
            contention: Contention::None,
            listener,
            hello,
            peers: Vec::new(),
            vcs,
            watch: Watch::default(),
            doorbell,
            inbound: Vec::new(),
            handshakes: 0,
            tick: 0,
            idle_backoff: None,
            // SAFETY: getuid cannot fail and touches no memory.
            uid: unsafe { libc::getuid() },
            #[cfg(feature = "verbs")]
            remote,
            remote_why,
        })
    }

    /// rch_init: a fence, then every process's card.
    pub(crate) fn connect_all(&mut self) -> Result<(), Error> {
        self.exchange.fence()?;
        let mut peers = Vec::with_capacity(self.size as usize);
        for r in 0..self.size {
            if r == self.rank {
                peers.push(self.hello.clone());
                continue;
            }
            let v = self.exchange.lookup(r, HELLO_KEY)?;
            let h = Hello::decode(&v).map_err(|m| {
                Error::new(ErrorKind::Exchange, format!("hello card of rank {r}: {m}"))
            })?;
            // Peers of our host share our fabric; those of other hosts are reached
            // through rdma_cm whatever their local fabric.
            if h.host == self.hello.host && h.fabric != self.hello.fabric {
                return Err(Error::new(
                    ErrorKind::Fabric,
                    format!(
                        "rank {r} uses the {} fabric, this process (rank {}) the {} fabric (RCH_FABRIC)",
                        h.fabric, self.rank, self.hello.fabric
                    ),
                ));
            }
            peers.push(h);
        }
        self.peers = peers;
        let local = self
            .peers
            .iter()
            .filter(|h| h.host == self.hello.host)
            .count();
        let cpus = host_cpus(&self.peers, &self.hello.host);
        // Soft-RoCE's protocol runs in this host's kernel: count one CPU as its when
        // our traffic goes through it (peers elsewhere, or the verbs fabric here). A
        // 1-CPU VM with one rank otherwise spins the kernel out.
        #[cfg(feature = "verbs")]
        let device_cpu = (self.peers.iter().any(|h| h.host != self.hello.host)
            || self.hello.fabric == crate::fabric::FabricKind::Verbs)
            && crate::fabric::verbs::software_device_present();
        #[cfg(not(feature = "verbs"))]
        let device_cpu = false;
        self.contention = Contention::of(local, cpus, device_cpu);
        if self.contention == Contention::Ranks && spread_wanted()? {
            if let Some(cpu) = spread_cpu(&self.peers, &self.hello.host, self.rank as usize) {
                // Best effort: a refused mask (a container that forbids it) leaves the
                // rank where it was, as before.
                let _ = CpuSet::pin_this_thread(cpu);
            }
        }
        // The path choice times copies and reads by the clock: with ranks waiting for
        // a CPU it would time the scheduler, and its probes cost CPU time the ranks
        // are short of (NPB IS at 4 ranks on 2 CPUs: 0.51-0.58 s measuring, 0.47-0.48
        // on the ring alone, bench/notebook/2026-11.md). Unless the user chose, the
        // connections of an outnumbered group do not measure: they keep the ring,
        // but for heap buffers from the fabric's outnumbered threshold (next).
        self.cfg.zero_copy_adaptive_by_default &= self.contention.measures_paths();
        self.cfg.zero_copy_outnumbered = self
            .contention
            .sends_large_heap_buffers_zero_copy(self.cfg.zero_copy_adaptive().is_some());
        Ok(())
    }

    /// rch_finalize: a fence, then everything is dropped by the caller.
    pub(crate) fn finish(&mut self) -> Result<(), Error> {
        let r = self.exchange.fence();
        let f = self.exchange.finish();
        r.and(f)
    }

    #[inline]
    pub(crate) fn check_rank(&self, rank: usize) -> Result<(), Error> {
        if rank >= self.size as usize {
            return Err(unknown_vc());
        }
        Ok(())
    }

    /// Non-blocking put on the connection to `rank` (`total` = the iov's length).
    ///
    /// # Safety
    ///
    /// `rch_put_datav`'s zero-copy contract: buffers the call announces stay mapped
    /// and unmodified until a later call counts them.
    #[inline(always)]
    pub(crate) unsafe fn put(
        &mut self,
        rank: usize,
        iov: &[IoSlice<'_>],
        total: usize,
    ) -> Result<usize, Error> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.put_mode(rank, iov, total, false) }.map(|l| l.bytes)
    }

    /// rch_put_lend: as [`put`](Self::put), but buffers that go zero-copy are
    /// counted at once and lent until [`lends_released`](Self::lends_released)
    /// passes the returned ticket.
    ///
    /// # Safety
    ///
    /// `rch_put_lend`'s contract: the buffers it lends stay mapped and unmodified
    /// until their ticket is released.
    #[inline(always)]
    pub(crate) unsafe fn put_lend(
        &mut self,
        rank: usize,
        iov: &[IoSlice<'_>],
        total: usize,
    ) -> Result<Lending, Error> {
        // SAFETY: forwarded from this function's contract.
        unsafe { self.put_mode(rank, iov, total, true) }
    }

    /// rch_lends_released: the last ticket of the connection to `rank` whose
    /// buffers are the caller's again (serving the peer's pushes, releasing what it
    /// confirmed).
    pub(crate) fn lends_released(&mut self, rank: usize) -> Result<u64, Error> {
        let vc = &mut self.vcs[rank];
        match &mut vc.conn {
            Conn::Up(up) => {
                let r = up.tx.lends_released();
                vc.want_release = up.tx.lends_in_flight() > 0;
                r.map_err(|e| data_error(&e, rank, "put"))
            }
            Conn::Failed(e) => Err(e.clone()),
            Conn::Closed => Err(closed(rank)),
            // Nothing was ever lent on a connection that is not up.
            _ => Ok(0),
        }
    }

    /// [`put`](Self::put) or, with `lend`, [`put_lend`](Self::put_lend).
    ///
    /// # Safety
    ///
    /// As [`put`](Self::put), or as [`put_lend`](Self::put_lend) with `lend`.
    #[inline(always)]
    unsafe fn put_mode(
        &mut self,
        rank: usize,
        iov: &[IoSlice<'_>],
        total: usize,
        lend: bool,
    ) -> Result<Lending, Error> {
        // A peer we write to answers: its connection is watched closely.
        self.enrol(rank);
        // SAFETY: forwarded from this function's contract.
        let r = unsafe { self.put_inner(rank, iov, total, lend) };
        if matches!(r, Ok(l) if l.bytes > 0) {
            self.idle_backoff = None;
        }
        r
    }

    /// [`put_mode`](Self::put_mode) without the idle bookkeeping.
    ///
    /// # Safety
    ///
    /// As [`put_mode`](Self::put_mode).
    #[inline(always)]
    unsafe fn put_inner(
        &mut self,
        rank: usize,
        iov: &[IoSlice<'_>],
        total: usize,
        lend: bool,
    ) -> Result<Lending, Error> {
        self.background();
        let vc = &mut self.vcs[rank];
        if let Conn::Up(up) = &mut vc.conn {
            if up.confirm.is_none() {
                // C memory is never from alloc_mem: below the connection's threshold
                // for other memory (or the adaptive choice's minimum), the plain
                // copying path, which skips the eligibility checks.
                let copies = total < up.tx.zero_copy_other_min().max(1);
                let r = if copies && !up.tx.zero_copy_pending() {
                    up.tx.put(iov).map(|bytes| Lending { bytes, ticket: 0 })
                } else if lend {
                    // SAFETY: forwarded from this function's contract.
                    unsafe { up.tx.put_lending(iov) }
                } else {
                    // SAFETY: forwarded from this function's contract.
                    unsafe { up.tx.put_nocopy(iov) }.map(|bytes| Lending { bytes, ticket: 0 })
                };
                return match r {
                    Ok(l) if l.bytes == 0 && total > 0 && up.idle_gone() => {
                        vc.want_write = false;
                        Err(gone(rank))
                    }
                    Ok(l) => {
                        vc.want_write = l.bytes < total || up.tx.zero_copy_pending();
                        vc.want_release = up.tx.lends_in_flight() > 0;
                        Ok(l)
                    }
                    Err(e) => {
                        vc.want_write = false;
                        vc.want_release = false;
                        Err(data_error(&e, rank, "put"))
                    }
                };
            }
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { self.put_slow(rank, iov, total, lend) }
    }

    /// [`put`](Self::put) on a connection that is not up (yet).
    ///
    /// # Safety
    ///
    /// As [`put`](Self::put).
    #[cold]
    unsafe fn put_slow(
        &mut self,
        rank: usize,
        iov: &[IoSlice<'_>],
        total: usize,
        lend: bool,
    ) -> Result<Lending, Error> {
        match &self.vcs[rank].conn {
            Conn::Idle => self.start(rank)?,
            Conn::Closed => return Err(closed(rank)),
            Conn::Failed(e) => return Err(e.clone()),
            // Our own handshake: its socket has the answer as soon as the peer gave it.
            Conn::Outbound { .. } | Conn::Up(_) => {
                if !self.advance(rank) {
                    self.maybe_progress();
                }
            }
            #[cfg(feature = "verbs")]
            Conn::CmOutbound(_) | Conn::CmRails(..) => {
                if !self.advance(rank) {
                    self.maybe_progress();
                }
            }
            #[cfg(feature = "verbs")]
            Conn::CmAccepting => self.maybe_progress(),
            Conn::AwaitPeer => self.maybe_progress(),
        }
        self.vcs[rank].want_write = total > 0;
        match &self.vcs[rank].conn {
            // SAFETY: forwarded from this function's contract.
            Conn::Up(up) if up.confirm.is_none() => unsafe {
                self.put_mode(rank, iov, total, lend)
            },
            Conn::Failed(e) => Err(e.clone()),
            _ => Ok(Lending::default()),
        }
    }

    /// Non-blocking read from the connection to `rank`.
    ///
    /// # Safety
    ///
    /// `rch_read_datav`'s contract: a buffer that reads were left in flight into stays
    /// allocated and untouched until a later call counts them.
    #[inline(always)]
    pub(crate) unsafe fn read(
        &mut self,
        rank: usize,
        iov: &mut [IoSliceMut<'_>],
    ) -> Result<usize, Error> {
        // SAFETY: forwarded from this function's contract.
        let r = unsafe { self.read_inner(rank, iov, false) };
        if matches!(r, Ok(n) if n > 0) {
            self.idle_backoff = None;
        }
        r
    }

    /// rch_read_buffered: as [`read`](Self::read), but only bytes already in the
    /// ring; it stops before a zero-copy transfer, so it leaves no reads in flight.
    #[inline(always)]
    pub(crate) fn read_buffered(
        &mut self,
        rank: usize,
        iov: &mut [IoSliceMut<'_>],
    ) -> Result<usize, Error> {
        // SAFETY: in buffered mode no RDMA READ is started, so no buffer is left with
        // reads in flight: read's contract holds trivially.
        let r = unsafe { self.read_inner(rank, iov, true) };
        if matches!(r, Ok(n) if n > 0) {
            self.idle_backoff = None;
        }
        r
    }

    /// rch_peek: the bytes at the front of `rank`'s stream where they landed in the
    /// ring (see [`Receiver::peek`]), valid until they are consumed or read, or the
    /// connection is closed here (only `close` and finalize drop a receiver that is
    /// up: a failure found later leaves it in place, so the lent bytes stay mapped).
    #[inline(always)]
    pub(crate) fn peek(&mut self, rank: usize) -> Result<Lent, Error> {
        self.background();
        self.enrol(rank);
        let vc = &mut self.vcs[rank];
        let Conn::Up(up) = &mut vc.conn else {
            return self.peek_slow(rank);
        };
        // The borrow of the ring ends here: the bytes stay where they are (above).
        let peeked = up.rx.peek().map(|p| match p {
            Peeked::Bytes(b) => Lent {
                bytes: b.as_ptr(),
                len: b.len(),
                zero_copy_left: 0,
            },
            Peeked::ZeroCopy { left } => Lent {
                zero_copy_left: left,
                ..Lent::NOTHING
            },
            Peeked::Nothing => Lent::NOTHING,
        });
        match peeked {
            Ok(lent) if lent.len != 0 || lent.zero_copy_left != 0 => {
                self.idle_backoff = None;
                Ok(lent)
            }
            Ok(_) if up.idle_gone() => {
                vc.rx_done = true;
                Err(gone(rank))
            }
            Ok(nothing) => Ok(nothing),
            Err(e) => Err(read_failed(&mut vc.rx_done, &e, rank, "peek")),
        }
    }

    /// [`peek`](Self::peek) on a connection that is not up (yet): the handshake's
    /// step a read takes, then nothing lent this time.
    #[cold]
    fn peek_slow(&mut self, rank: usize) -> Result<Lent, Error> {
        // SAFETY: an empty buffered read starts no RDMA READ.
        unsafe { self.read_slow(rank, &mut [], true) }?;
        Ok(Lent::NOTHING)
    }

    /// rch_consume_peek: [`consume`](Self::consume) then [`peek`](Self::peek), in one
    /// call of the C interface (a packet handled in place costs one entry, not two).
    /// First the `passed` whole packets the caller read where its lane led it
    /// (rch_lane_next: see `Receiver::consume_passed`); with `landed` the `n` bytes
    /// are of the packet it found after them itself (rch_lane_packet): see
    /// `Receiver::consume_landed`.
    ///
    /// # Errors
    ///
    /// As `consume` (nothing is peeked then), then as `peek`.
    #[inline(always)]
    pub(crate) fn consume_landed_peek(
        &mut self,
        rank: usize,
        passed: usize,
        n: usize,
        landed: bool,
    ) -> Result<Lent, Error> {
        self.note_lane_sends(rank);
        if passed != 0 {
            self.consume_with(rank, passed, |rx, k| rx.consume_passed(k))?;
            if !landed && n != 0 {
                return Err(Error::new(
                    ErrorKind::Invalid,
                    format!(
                        "rch_consume({n}) after {passed} packets passed through the lane: \
                         nothing else was lent on the connection to rank {rank}"
                    ),
                ));
            }
        }
        if landed && n != 0 {
            self.consume_with(rank, n, |rx, n| rx.consume_landed(n))?;
        } else if n != 0 {
            self.consume(rank, n)?;
        }
        self.peek(rank)
    }

    /// Copies bytes lent on the connection to `rank` (see `rch_copy_lent`), timing
    /// the copy for its path meter while the connection is up.
    pub(crate) fn copy_lent(
        &mut self,
        rank: usize,
        dst: &mut [u8],
        src: &[u8],
    ) -> Result<(), Error> {
        match &mut self.vcs[rank].conn {
            Conn::Up(up) => up
                .rx
                .copy_lent(dst, src)
                .map_err(|e| data_error(&e, rank, "copy")),
            _ => {
                dst.copy_from_slice(src);
                Ok(())
            }
        }
    }

    /// A lane's rank is another process's: the loopback connection is the library's.
    fn lane_rank(&self, rank: usize) -> Result<(), Error> {
        if rank == self.rank as usize {
            return Err(Error::new(
                ErrorKind::Invalid,
                "no send lane to this process itself",
            ));
        }
        Ok(())
    }

    /// rch_vc_send_lane: the send lane of `rank`'s connection once it is up (`None`
    /// before), published from then on after each put. The pointer stays valid until
    /// the group goes; the lane is closed when the connection is.
    ///
    /// # Errors
    ///
    /// `Invalid` for our own rank (its loopback connection is the library's own).
    pub(crate) fn send_lane(
        &mut self,
        rank: usize,
        handle: *mut std::ffi::c_void,
    ) -> Result<Option<*mut SendLane>, Error> {
        self.lane_rank(rank)?;
        let vc = &mut self.vcs[rank];
        if let Some(l) = &vc.lane {
            return Ok(Some(l.as_ptr()));
        }
        // Not before the handshake is confirmed: puts take the slow path until then.
        let Conn::Up(up) = &mut vc.conn else {
            return Ok(None);
        };
        if up.confirm.is_some() {
            return Ok(None);
        }
        let lane = up.tx.send_lane();
        lane.set_vc(handle);
        let p = lane.as_ptr();
        vc.lane = Some(lane);
        Ok(Some(p))
    }

    /// rch_lane_ring: after packets the caller wrote through `rank`'s send lane, rings
    /// the peer's doorbell if it asked, and publishes the lane's room again.
    ///
    /// # Errors
    ///
    /// `Invalid` for our own rank, as [`send_lane`](Self::send_lane).
    pub(crate) fn after_lane(&mut self, rank: usize) -> Result<(), Error> {
        self.lane_rank(rank)?;
        self.enrol(rank);
        if let Conn::Up(up) = &mut self.vcs[rank].conn {
            if up.confirm.is_none() {
                up.tx.after_lane();
            }
        }
        Ok(())
    }

    /// rch_consume_peek_watch's watch: the words of `rank`'s connection that a caller
    /// may test in place of the next peeks, when it is up and quiet (see
    /// [`Receiver::quiet_watch`](crate::engine::Receiver)); `None` otherwise.
    #[inline]
    pub(crate) fn quiet_watch(&self, rank: usize) -> Option<QuietWatch<'_>> {
        match &self.vcs.get(rank)?.conn {
            Conn::Up(up) => up.rx.quiet_watch(),
            _ => None,
        }
    }

    /// `Receiver::lane_after_lend` of `rank`'s connection (rch_consume_peek_lane,
    /// when it lent a whole packet).
    pub(crate) fn lane_after_lend(&self, rank: usize) -> Option<QuietWatch<'_>> {
        match &self.vcs.get(rank)?.conn {
            Conn::Up(up) => up.rx.lane_after_lend(),
            _ => None,
        }
    }

    /// rch_consume: marks `n` of the bytes [`peek`](Self::peek) lent as read.
    ///
    /// # Errors
    ///
    /// `Invalid`, with nothing consumed, when `n` is more than the last peek lent
    /// (and no read passed since); the connection's failure, or its close here.
    #[inline(always)]
    pub(crate) fn consume(&mut self, rank: usize, n: usize) -> Result<(), Error> {
        self.note_lane_sends(rank);
        self.consume_with(rank, n, |rx, n| rx.consume(n))
    }

    /// Before a call of the C interface reads from the connection to `rank`: notes
    /// the packets its send lane wrote since the last (`Sender::note_lane_sends`),
    /// once a call, for the receiver's stream backoff.
    #[inline(always)]
    fn note_lane_sends(&mut self, rank: usize) {
        if let Some(Vc {
            conn: Conn::Up(up), ..
        }) = self.vcs.get(rank)
        {
            up.tx.note_lane_sends();
        }
    }

    /// [`consume`](Self::consume) by `how` (`Receiver::consume` or `consume_landed`).
    #[inline(always)]
    fn consume_with(
        &mut self,
        rank: usize,
        n: usize,
        how: impl FnOnce(&mut Receiver<AnyFabric>, usize) -> io::Result<()>,
    ) -> Result<(), Error> {
        let vc = &mut self.vcs[rank];
        match &mut vc.conn {
            Conn::Up(up) => how(&mut up.rx, n).map_err(|e| {
                if e.kind() == io::ErrorKind::InvalidInput {
                    return Error::new(ErrorKind::Invalid, format!("rch_consume: {e}"));
                }
                vc.rx_done = true;
                data_error(&e, rank, "consume")
            }),
            Conn::Closed => Err(closed(rank)),
            Conn::Failed(e) => Err(e.clone()),
            _ if n == 0 => Ok(()),
            _ => Err(Error::new(
                ErrorKind::Invalid,
                format!("rch_consume({n}): nothing was lent on the connection to rank {rank}"),
            )),
        }
    }

    /// [`read`](Self::read) (or, `buffered`, [`read_buffered`](Self::read_buffered))
    /// without the idle bookkeeping.
    ///
    /// # Safety
    ///
    /// As [`read`](Self::read).
    #[inline(always)]
    unsafe fn read_inner(
        &mut self,
        rank: usize,
        iov: &mut [IoSliceMut<'_>],
        buffered: bool,
    ) -> Result<usize, Error> {
        self.background();
        self.enrol(rank);
        let vc = &mut self.vcs[rank];
        if let Conn::Up(up) = &mut vc.conn {
            up.tx.note_lane_sends();
            let r = if buffered {
                up.rx.get_buffered(iov)
            } else {
                // SAFETY: forwarded from this function's contract.
                unsafe { up.rx.get_nowait(iov) }
            };
            return match r {
                Ok(0) if up.idle_gone() => {
                    vc.rx_done = true;
                    Err(gone(rank))
                }
                Ok(n) => Ok(n),
                Err(e) => Err(read_failed(&mut vc.rx_done, &e, rank, "read")),
            };
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { self.read_slow(rank, iov, buffered) }
    }

    /// [`read`](Self::read) on a connection that is not up (yet).
    ///
    /// # Safety
    ///
    /// As [`read`](Self::read).
    #[cold]
    unsafe fn read_slow(
        &mut self,
        rank: usize,
        iov: &mut [IoSliceMut<'_>],
        buffered: bool,
    ) -> Result<usize, Error> {
        match &self.vcs[rank].conn {
            Conn::Closed => return Err(closed(rank)),
            Conn::Failed(e) => return Err(e.clone()),
            // Nothing to read before the peer connects; its HELLO is answered by the
            // background looks and by rch_wait, so polling idle peers stays cheap.
            Conn::Idle => return Ok(0),
            Conn::Outbound { .. } => {
                if !self.advance(rank) {
                    self.maybe_progress();
                }
            }
            #[cfg(feature = "verbs")]
            Conn::CmOutbound(_) | Conn::CmRails(..) => {
                if !self.advance(rank) {
                    self.maybe_progress();
                }
            }
            _ => self.maybe_progress(),
        }
        match &self.vcs[rank].conn {
            // SAFETY: forwarded from this function's contract.
            Conn::Up(_) => unsafe { self.read_inner(rank, iov, buffered) },
            Conn::Failed(e) => Err(e.clone()),
            _ => Ok(0),
        }
    }

    /// Makes `rank`'s connection one rch_poll_ready looks at on every call: it was
    /// just used (a read, a put) or just came up. O(1); on every put and read, so
    /// the common case (already busy) is one inlined check.
    #[inline(always)]
    fn enrol(&mut self, rank: usize) {
        if !matches!(self.vcs[rank].watch, Watched::Busy(_)) {
            self.enrol_now(rank);
        }
    }

    #[cold]
    #[inline(never)]
    fn enrol_now(&mut self, rank: usize) {
        match self.vcs[rank].watch {
            Watched::Busy(_) => {}
            Watched::No => {
                self.vcs[rank].watch = Watched::Busy(0);
                self.watch.busy.push(rank);
            }
            Watched::Quiet => {
                // Rare: rch_poll_ready reports quiet connections as busy already, so
                // only a read or put of the caller's own lands here.
                self.watch.quiet.retain(|&q| q != rank);
                self.watch.quiet_belled.retain(|&q| q != rank);
                self.vcs[rank].watch = Watched::Busy(0);
                self.watch.busy.push(rank);
            }
        }
    }

    /// What rch_poll_ready makes of one connection: something to read (data, the
    /// end, a failure: a read would return at once with more than 0 or an error),
    /// nothing now, or nothing ever again (closed, or its end already reported).
    fn readiness(&mut self, rank: usize) -> Readiness {
        let vc = &mut self.vcs[rank];
        if vc.rx_done {
            return Readiness::Done;
        }
        match &mut vc.conn {
            Conn::Up(up) => {
                if up.rx.poll_readable().unwrap_or(true) {
                    Readiness::Ready
                } else {
                    Readiness::Nothing
                }
            }
            Conn::Failed(_) | Conn::Closed => Readiness::Ready,
            _ => Readiness::Nothing,
        }
    }

    /// rch_poll_ready: writes into `out` the ranks of connections with something to
    /// read, at most `out.len()` of them, and returns how many. Costs the connections
    /// that carried traffic lately, one load of the doorbell, [`QUIET_PER_CALL`] of
    /// the quiet connections that have no doorbell, and now and then a quiet one that
    /// has, and a look at the listener and handshakes every [`PROGRESS_EVERY`] calls.
    /// A quiet connection whose peer writes is noticed at the next call through the
    /// doorbell (or, without one, within (quiet connections / [`QUIET_PER_CALL`])
    /// calls), and is busy from then on.
    ///
    /// Ranks are stored as `rank_as` makes them: the C interface writes its `int`s
    /// straight into the caller's array, with no buffer of its own to clear first.
    pub(crate) fn poll_ready<R>(&mut self, out: &mut [R], rank_as: fn(usize) -> R) -> usize {
        self.watch.calls += 1;
        let calls = self.watch.calls;
        // The sockets cost system calls: looked at every PROGRESS_EVERY calls while
        // handshakes are under way, else every BACKGROUND_EVERY calls or when a
        // coarse tick (a few ms) passed since the last look, whichever comes first:
        // a tight loop pays for a look every few ms, and a caller that polls rarely
        // (an MPI_Iprobe now and then) still answers a peer that asks to connect.
        let every = if self.handshakes > 0 || !self.inbound.is_empty() {
            PROGRESS_EVERY
        } else {
            BACKGROUND_EVERY
        };
        let tick = coarse_ms();
        if calls % u64::from(every) == 0 || tick.wrapping_sub(self.watch.looked_at) >= LOOK_EVERY_MS
        {
            self.watch.looked_at = tick;
            self.progress();
            // A handshake a peer started may have finished in that look: its
            // connection is watched from now on.
            for r in 0..self.vcs.len() {
                if self.vcs[r].watch == Watched::No
                    && !self.vcs[r].rx_done
                    && !matches!(self.vcs[r].conn, Conn::Idle)
                {
                    self.enrol(r);
                }
            }
        }
        let mut n = 0;
        // Quiet connections whose peers rang: busy again, and looked at below.
        if self.doorbell.as_ref().is_some_and(Doorbell::rung) {
            self.answer_bells();
        }
        let mut i = 0;
        while i < self.watch.busy.len() {
            let r = self.watch.busy[i];
            match self.readiness(r) {
                Readiness::Ready => {
                    self.vcs[r].watch = Watched::Busy(0);
                    if n < out.len() {
                        out[n] = rank_as(r);
                        n += 1;
                    }
                    i += 1;
                }
                Readiness::Nothing => match self.vcs[r].watch {
                    Watched::Busy(empty) if empty + 1 >= QUIET_AFTER => {
                        self.watch.busy.swap_remove(i);
                        if self.go_quiet(r) {
                            // It wrote meanwhile: busy after all.
                            self.watch.busy.push(r);
                        }
                    }
                    Watched::Busy(empty) => {
                        self.vcs[r].watch = Watched::Busy(empty + 1);
                        i += 1;
                    }
                    _ => {
                        self.watch.busy.swap_remove(i);
                    }
                },
                Readiness::Done => {
                    self.vcs[r].watch = Watched::No;
                    self.watch.busy.swap_remove(i);
                }
            }
        }
        // Each quiet connection at most once a call (with one, the second look would
        // repeat the first).
        for _ in 0..QUIET_PER_CALL.min(self.watch.quiet.len()) {
            n += self.look_in_turn(false, &mut out[n..], rank_as);
        }
        if calls % BELLED_TURN_EVERY == 0 {
            n += self.look_in_turn(true, &mut out[n..], rank_as);
        }
        n
    }

    /// Makes busy connection `r` quiet: on the list it is looked at in turn from,
    /// and, if its peer rings, with a request to ring sent. False, unless the look
    /// that follows the request finds it has something to read after all (then it
    /// stays busy, and the caller lists it again).
    #[cold]
    #[inline(never)]
    fn go_quiet(&mut self, r: usize) -> bool {
        let vc = &mut self.vcs[r];
        if !vc.belled {
            vc.watch = Watched::Quiet;
            self.watch.quiet.push(r);
            return false;
        }
        let Conn::Up(up) = &mut vc.conn else {
            vc.watch = Watched::Quiet;
            self.watch.quiet_belled.push(r);
            return false;
        };
        // A failed request leaves the connection to the looks in turn, which
        // report its failure.
        let _ = up.rx.ask_for_bell();
        // The request first, then this look (see `Sender::ring_if_asked`).
        if !matches!(self.readiness(r), Readiness::Nothing) {
            self.vcs[r].watch = Watched::Busy(0);
            return true;
        }
        self.vcs[r].watch = Watched::Quiet;
        self.watch.quiet_belled.push(r);
        false
    }

    /// Takes the slots rung on our doorbell and makes their quiet connections busy
    /// (the busy loop that follows looks at them).
    #[cold]
    #[inline(never)]
    fn answer_bells(&mut self) {
        let Some(bell) = &self.doorbell else {
            return;
        };
        let mut rung = std::mem::take(&mut self.watch.rung);
        rung.clear();
        bell.take(|r| rung.push(r));
        self.watch.rings += rung.len() as u64;
        for &r in &rung {
            if r < self.vcs.len() && self.vcs[r].watch == Watched::Quiet {
                self.watch.quiet_belled.retain(|&q| q != r);
                self.vcs[r].watch = Watched::Busy(0);
                self.watch.busy.push(r);
                self.watch.found_by_bell += 1;
            }
        }
        self.watch.rung = rung;
    }

    /// Looks at the next quiet connection of one list (those with a doorbell if
    /// `belled`) and lists it in `out` if it has something to read; returns how many
    /// it listed (0 or 1).
    fn look_in_turn<R>(&mut self, belled: bool, out: &mut [R], rank_as: fn(usize) -> R) -> usize {
        let (list, next) = if belled {
            (&mut self.watch.quiet_belled, &mut self.watch.next_belled)
        } else {
            (&mut self.watch.quiet, &mut self.watch.next_quiet)
        };
        if list.is_empty() {
            return 0;
        }
        if *next >= list.len() {
            *next = 0;
        }
        let at = *next;
        let r = list[at];
        match self.readiness(r) {
            Readiness::Nothing => {
                if belled {
                    self.watch.next_belled = at + 1;
                } else {
                    self.watch.next_quiet = at + 1;
                }
                0
            }
            Readiness::Ready => {
                self.unlist_quiet(belled, at);
                self.vcs[r].watch = Watched::Busy(0);
                self.watch.busy.push(r);
                self.watch.found_in_turn += 1;
                if let Some(o) = out.first_mut() {
                    *o = rank_as(r);
                    1
                } else {
                    0
                }
            }
            Readiness::Done => {
                self.unlist_quiet(belled, at);
                self.vcs[r].watch = Watched::No;
                0
            }
        }
    }

    fn unlist_quiet(&mut self, belled: bool, at: usize) {
        if belled {
            self.watch.quiet_belled.swap_remove(at);
        } else {
            self.watch.quiet.swap_remove(at);
        }
    }

    /// rch_vc_close.
    pub(crate) fn close(&mut self, rank: usize) {
        let vc = &mut self.vcs[rank];
        if matches!(vc.conn, Conn::Outbound { .. })
            || matches!(&vc.conn, Conn::Up(u) if u.confirm.is_some())
        {
            self.handshakes -= 1;
        }
        #[cfg(feature = "verbs")]
        if matches!(
            vc.conn,
            Conn::CmOutbound(_) | Conn::CmAccepting | Conn::CmRails(..)
        ) {
            self.handshakes -= 1;
        }
        vc.conn = Conn::Closed;
        vc.want_write = false;
        vc.want_release = false;
        vc.rx_done = true;
    }

    fn maybe_progress(&mut self) {
        if self.tick % PROGRESS_EVERY == 0 {
            self.progress();
        }
    }

    /// Counts a data call; now and then looks at the listener and handshakes.
    #[inline]
    fn background(&mut self) {
        self.tick = self.tick.wrapping_add(1);
        if self.tick % BACKGROUND_EVERY == 0 {
            self.progress_cold();
        }
    }

    #[cold]
    #[inline(never)]
    fn progress_cold(&mut self) {
        self.progress();
    }

    /// Starts the connection to `rank`: loopback at once, else an outbound HELLO.
    fn start(&mut self, rank: usize) -> Result<(), Error> {
        if rank == self.rank as usize {
            let up = self
                .loopback()
                .map_err(|e| Error::from_conn(&e, "loopback connection"))?;
            self.vcs[rank].conn = Conn::Up(up);
            return Ok(());
        }
        let started = if self.peers[rank].host == self.hello.host {
            self.outbound(rank)
        } else {
            self.outbound_remote(rank)
        };
        match started {
            Ok(c) => {
                self.vcs[rank].conn = c;
                self.handshakes += 1;
                Ok(())
            }
            Err(e) => {
                self.vcs[rank].conn = Conn::Failed(e.clone());
                Err(e)
            }
        }
    }

    fn loopback(&self) -> io::Result<Up> {
        let a = Prepared::new(self.fabric.for_connection()?, self.cfg.clone())?;
        let b = Prepared::new(self.fabric.for_connection()?, self.cfg.clone())?;
        let (ca, cb) = (a.card()?, b.card()?);
        let (a, b) = (a.connect(cb)?, b.connect(ca)?);
        let (rx_a, tx_a) = a.split();
        let (rx_b, tx_b) = b.split();
        let mut up = Up::new(rx_b, tx_a, None, None);
        up._spare = Some((rx_a, tx_b));
        Ok(up)
    }

    fn outbound(&mut self, rank: usize) -> Result<Conn, Error> {
        let peer = &self.peers[rank];
        let sock = unix::connect(&peer.socket).map_err(|e| {
            Error::new(
                ErrorKind::PeerGone,
                format!(
                    "cannot reach rank {rank} (pid {}) at @{}: {e}",
                    peer.pid, peer.socket
                ),
            )
        })?;
        let prepared = self.prepare()?;
        let card = prepared
            .card()
            .map_err(|e| Error::from_conn(&e, "connection card"))?;
        let mut body = Vec::with_capacity(8);
        body.extend_from_slice(&self.rank.to_le_bytes());
        body.extend_from_slice(&(rank as u32).to_le_bytes());
        unix::send_hello(&sock, &body, card).map_err(|e| {
            Error::new(
                ErrorKind::PeerGone,
                format!("sending HELLO to rank {rank}: {e}"),
            )
        })?;
        Ok(Conn::Outbound {
            sock,
            prepared: Box::new(prepared),
        })
    }

    /// Starts an rdma_cm connection to a peer of another host.
    fn outbound_remote(&mut self, rank: usize) -> Result<Conn, Error> {
        let peer = &self.peers[rank];
        let cannot = |why: &str| {
            Error::new(
                ErrorKind::PeerGone,
                format!(
                    "rank {rank} is on another host ({}) and cannot be reached: {why}",
                    peer.host
                ),
            )
        };
        if let Some(why) = &self.remote_why {
            return Err(cannot(&format!("this process has no rdma_cm: {why}")));
        }
        let Some(addr) = peer.cm else {
            return Err(cannot(
                "it published no rdma_cm address (no RDMA device with an IP address there)",
            ));
        };
        #[cfg(feature = "verbs")]
        {
            remote::Remote::connect(&addr, &self.cfg, self.rank, rank as u32)
                .map(|c| Conn::CmOutbound(Box::new(c)))
                .map_err(|e| Error::from_conn(&e, &format!("connecting to rank {rank}")))
        }
        #[cfg(not(feature = "verbs"))]
        {
            let _ = addr;
            unreachable!("remote_why is always set without the verbs feature")
        }
    }

    /// A connection's end, in the group's one protection domain: on the emulated
    /// fabric as on verbs, every connection of the process shares it (and its
    /// registration cache), so a connection costs its rings and table entries, not
    /// a domain's tables of its own.
    fn prepare(&self) -> Result<Prepared<AnyFabric>, Error> {
        Prepared::new(self.fabric.clone(), self.cfg.clone())
            .map_err(|e| Error::from_setup(&e, "connection memory"))
    }

    /// Accepts peers' HELLOs and advances our handshakes. True if anything changed.
    pub(crate) fn progress(&mut self) -> bool {
        let mut changed = false;
        while let Ok((s, _)) = self.listener.accept() {
            // Only processes of our own user may connect.
            if unix::peer_cred(&s).is_ok_and(|(_, uid)| uid == self.uid) {
                let _ = s.set_nonblocking(false);
                self.inbound.push(s);
            }
        }
        let mut i = 0;
        while i < self.inbound.len() {
            if unix::readable(&self.inbound[i]) {
                let s = self.inbound.swap_remove(i);
                self.on_hello(s);
                changed = true;
            } else {
                i += 1;
            }
        }
        #[cfg(feature = "verbs")]
        {
            changed |= self.progress_remote();
        }
        if self.handshakes > 0 {
            for r in 0..self.vcs.len() {
                changed |= self.advance(r);
            }
        }
        changed
    }

    /// Serves rdma_cm requests from peers of other hosts and installs the connections
    /// that came up. True if anything changed.
    #[cfg(feature = "verbs")]
    fn progress_remote(&mut self) -> bool {
        use crate::handshake::cm::Accepted;
        let Some(listener) = &self.remote else {
            return false;
        };
        let me = self.rank as usize;
        let mut changed = false;
        loop {
            let (vcs, handshakes) = (&mut self.vcs, &mut self.handshakes);
            let mut check = |hello: &[u8]| decide_remote(vcs, handshakes, me, hello);
            let from_of = |hello: &[u8]| remote::parse_hello(hello).map(|(f, _)| f as usize);
            match listener.accept(&mut check) {
                Ok(Some(Accepted::Up(c))) => {
                    changed = true;
                    let Some(from) = from_of(&c.hello) else {
                        continue;
                    };
                    // Closed meanwhile: dropping the channel disconnects it.
                    if matches!(self.vcs[from].conn, Conn::CmAccepting) {
                        // Its rails next (`advance`, in this same pass).
                        self.vcs[from].conn = self.cm_rails(c.channel);
                    }
                }
                Ok(Some(Accepted::Failed { hello, error })) => {
                    changed = true;
                    let Some(from) = from_of(&hello) else {
                        continue;
                    };
                    if matches!(self.vcs[from].conn, Conn::CmAccepting) {
                        self.vcs[from].conn = Conn::Failed(Error::from_conn(
                            &error,
                            &format!("accepting the connection of rank {from}"),
                        ));
                        self.handshakes -= 1;
                    }
                }
                Ok(None) | Err(_) => return changed,
            }
        }
    }

    /// A connection through rdma_cm that just came up, its rails still to connect.
    #[cfg(feature = "verbs")]
    fn cm_rails(&self, channel: crate::engine::Channel<AnyFabric>) -> Conn {
        Conn::CmRails(
            Box::new(channel),
            std::time::Instant::now() + self.cfg.connect_timeout(),
        )
    }

    /// Steps the rails of connection `r` (in `Conn::CmRails`): up once both ends'
    /// are. True if its state changed.
    #[cfg(feature = "verbs")]
    fn step_cm_rails(&mut self, r: usize) -> bool {
        let Conn::CmRails(chan, deadline) = &mut self.vcs[r].conn else {
            return false;
        };
        let next = match chan.poll_connect_rails() {
            Ok(false) if std::time::Instant::now() < *deadline => return false,
            Ok(false) => Conn::Failed(Error::from_conn(
                &io::Error::new(
                    io::ErrorKind::TimedOut,
                    "the peer's rails did not come up in time",
                ),
                &format!("connecting the rails of rank {r}"),
            )),
            Ok(true) => {
                let Conn::CmRails(chan, _) = std::mem::replace(&mut self.vcs[r].conn, Conn::Idle)
                else {
                    unreachable!("matched above");
                };
                let (rx, tx) = chan.split();
                Conn::Up(Up::new(rx, tx, None, None))
            }
            Err(e) => Conn::Failed(Error::from_conn(
                &e,
                &format!("connecting the rails of rank {r}"),
            )),
        };
        self.vcs[r].conn = next;
        self.handshakes -= 1;
        true
    }

    /// Advances the handshake of connection `r`, if its socket has news.
    fn advance(&mut self, r: usize) -> bool {
        #[cfg(feature = "verbs")]
        if matches!(self.vcs[r].conn, Conn::CmRails(..)) {
            return self.step_cm_rails(r);
        }
        #[cfg(feature = "verbs")]
        if let Conn::CmOutbound(c) = &mut self.vcs[r].conn {
            let next = match c.poll(std::time::Duration::ZERO) {
                Ok(None) => return false,
                Ok(Some(conn)) => {
                    self.vcs[r].conn = self.cm_rails(conn.channel);
                    self.step_cm_rails(r);
                    return true;
                }
                // Both started at once and the peer's attempt wins: it is on its way.
                Err(e) if e.to_string().contains(LOST_RACE) => Conn::AwaitPeer,
                Err(e) => Conn::Failed(Error::from_conn(&e, &format!("connecting to rank {r}"))),
            };
            self.vcs[r].conn = next;
            self.handshakes -= 1;
            return true;
        }
        match &mut self.vcs[r].conn {
            Conn::Outbound { sock, .. } if unix::readable(sock) => {}
            Conn::Up(up) => {
                let Some(sock) = &up.confirm else {
                    return false;
                };
                if !unix::readable(sock) {
                    return false;
                }
                let res = unix::recv(sock);
                self.handshakes -= 1;
                match res {
                    // The socket stays open as the connection's liveness signal.
                    Ok((t, _)) if &t == unix::TAG_READY => up.link = up.confirm.take(),
                    Ok((t, c)) => {
                        self.vcs[r].conn = Conn::Failed(Error::new(
                            ErrorKind::PeerGone,
                            format!("rank {r} failed to connect: {}", reason(&t, &c.bytes)),
                        ))
                    }
                    Err(e) => {
                        self.vcs[r].conn = Conn::Failed(Error::new(
                            ErrorKind::PeerGone,
                            format!("rank {r} vanished while connecting: {e}"),
                        ))
                    }
                }
                return true;
            }
            _ => return false,
        }
        let Conn::Outbound { sock, prepared } =
            std::mem::replace(&mut self.vcs[r].conn, Conn::Idle)
        else {
            unreachable!("matched above")
        };
        self.handshakes -= 1;
        self.vcs[r].conn = match unix::recv(&sock) {
            Ok((t, card)) if &t == unix::TAG_ACCEPT => match prepared.connect(card) {
                Ok(chan) => {
                    let (rx, tx) = chan.split();
                    match unix::send(&sock, unix::TAG_READY, &[], None) {
                        Ok(()) => Conn::Up(Up::new(rx, tx, None, Some(sock))),
                        Err(e) => Conn::Failed(Error::new(
                            ErrorKind::PeerGone,
                            format!("rank {r} vanished while connecting: {e}"),
                        )),
                    }
                }
                Err(e) => {
                    let _ = unix::send(&sock, unix::TAG_CLOSED, e.to_string().as_bytes(), None);
                    Conn::Failed(Error::from_conn(&e, &format!("connecting to rank {r}")))
                }
            },
            Ok((t, _)) if &t == unix::TAG_REJECT => Conn::AwaitPeer,
            Ok((t, c)) if &t == unix::TAG_CLOSED => Conn::Failed(Error::new(
                ErrorKind::PeerClosed,
                format!("rank {r} refused the connection: {}", reason(&t, &c.bytes)),
            )),
            Ok((t, c)) => Conn::Failed(Error::new(
                ErrorKind::Protocol,
                format!("rank {r} answered {}", reason(&t, &c.bytes)),
            )),
            Err(e) => Conn::Failed(Error::new(
                ErrorKind::PeerGone,
                format!("rank {r} closed the handshake (finalised or died): {e}"),
            )),
        };
        self.install_bell(r);
        true
    }

    /// A connection of this host just came up with rank `r`: its sender rings `r`'s
    /// doorbell when `r` asks, and `r`'s sender ours (it runs this same code).
    fn install_bell(&mut self, r: usize) {
        let mine = self.doorbell.is_some();
        let target = self.peers[r]
            .bell
            .and_then(|b| Doorbell::<<AnyFabric as Fabric>::Region>::target(b, self.rank as usize));
        let vc = &mut self.vcs[r];
        if let Conn::Up(up) = &mut vc.conn {
            if let Some(t) = target {
                up.tx.set_bell(t);
            }
            vc.belled = mine;
        }
    }

    /// A peer's HELLO arrived on an accepted socket.
    fn on_hello(&mut self, s: UnixStream) {
        let Ok((tag, body)) = unix::recv(&s) else {
            return;
        };
        let hello = if &tag == unix::TAG_HELLO {
            unix::parse_hello(body).ok()
        } else {
            None
        };
        let Some((b, peer_card)) = hello.filter(|(b, _)| b.len() == 8) else {
            let _ = unix::send(&s, unix::TAG_CLOSED, b"expected HELLO from a rank", None);
            return;
        };
        let from = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")) as usize;
        let to = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
        let pid = unix::peer_cred(&s).map(|(p, _)| p).unwrap_or(0);
        if to != self.rank
            || from >= self.vcs.len()
            || from == to as usize
            || self.peers[from].pid != pid
        {
            let _ = unix::send(
                &s,
                unix::TAG_CLOSED,
                format!(
                    "HELLO from rank {from} (pid {pid}) to rank {to} does not belong to this job"
                )
                .as_bytes(),
                None,
            );
            return;
        }
        match &self.vcs[from].conn {
            Conn::Idle | Conn::AwaitPeer => {}
            // Both started: the lower rank's attempt wins.
            Conn::Outbound { .. } if from < self.rank as usize => {
                self.handshakes -= 1;
            }
            Conn::Outbound { .. } | Conn::Up(_) => {
                let _ = unix::send(&s, unix::TAG_REJECT, b"", None);
                return;
            }
            Conn::Closed | Conn::Failed(_) => {
                let _ = unix::send(&s, unix::TAG_CLOSED, b"the connection was closed", None);
                return;
            }
            // That rank is on another host for us: it cannot say HELLO on our socket.
            #[cfg(feature = "verbs")]
            Conn::CmOutbound(_) | Conn::CmAccepting | Conn::CmRails(..) => {
                let _ = unix::send(
                    &s,
                    unix::TAG_CLOSED,
                    b"this rank connects to you through rdma_cm (another host)",
                    None,
                );
                return;
            }
        }
        self.vcs[from].conn = match self.accept(&s, peer_card) {
            Ok(mut up) => {
                self.handshakes += 1;
                up.confirm = Some(s);
                Conn::Up(up)
            }
            Err(e) => {
                let _ = unix::send(&s, unix::TAG_CLOSED, e.msg.as_bytes(), None);
                Conn::Failed(e)
            }
        };
        self.install_bell(from);
    }

    fn accept(&self, s: &UnixStream, peer: Card) -> Result<Up, Error> {
        let prepared = self.prepare()?;
        let card = prepared
            .card()
            .map_err(|e| Error::from_conn(&e, "connection card"))?;
        let chan = prepared
            .connect(peer)
            .map_err(|e| Error::from_conn(&e, "accepting a connection"))?;
        unix::send(s, unix::TAG_ACCEPT, &[], Some(card))
            .map_err(|e| Error::new(ErrorKind::PeerGone, format!("answering HELLO: {e}")))?;
        let (rx, tx) = chan.split();
        Ok(Up::new(rx, tx, None, None))
    }

    /// True when a spinning rch_wait should look at the sockets now: on the same
    /// terms as rch_poll_ready (every [`PROGRESS_EVERY`] calls while handshakes are
    /// under way, else once a coarse tick passed since the last look). A look costs
    /// a system call per connection (its liveness socket), so a spinning wait over
    /// 63 peers that looked every 64 polls spent most of its time in them.
    pub(crate) fn sockets_due(&mut self) -> bool {
        if self.handshakes > 0 || !self.inbound.is_empty() {
            return true;
        }
        let tick = coarse_ms();
        if tick.wrapping_sub(self.watch.looked_at) >= LOOK_EVERY_MS {
            self.watch.looked_at = tick;
            return true;
        }
        false
    }

    /// One look for rch_wait: whether a read or a blocked put may progress, or a
    /// handshake moved, and how many connections it looked at (rch_wait's backoff
    /// counts its spins in connections looked at, see `ffi::state::wait`). `full`
    /// looks at every connection (else the watched ones,
    /// [`poll_watched`](Self::poll_watched)); `sockets` also at the listener,
    /// handshakes and each connection's liveness socket.
    pub(crate) fn poll(
        &mut self,
        only: Option<usize>,
        read: bool,
        write: bool,
        full: bool,
        sockets: bool,
    ) -> (bool, usize) {
        if only.is_none() && !full && !sockets {
            return self.poll_watched(read, write);
        }
        let mut ready = false;
        if sockets && (self.progress()) {
            ready = true;
        }
        let range = match only {
            Some(r) => r..r + 1,
            None => 0..self.vcs.len(),
        };
        let looked = range.len();
        for r in range {
            let vc = &mut self.vcs[r];
            match &mut vc.conn {
                Conn::Up(up) => {
                    if sockets && !vc.rx_done && up.peer_gone() {
                        ready = true;
                    }
                    let write = write && (vc.want_write || vc.want_release || only.is_some());
                    ready |= vc.up_ready(read, write, only.is_some());
                }
                Conn::Closed | Conn::Failed(_) if only.is_some() => ready = true,
                // A put on a connection nobody opened yet progresses: it starts one.
                Conn::Idle if only.is_some() && write => ready = true,
                _ => {}
            }
        }
        (ready, looked)
    }

    /// rch_wait's look between two full ones: the connections rch_poll_ready keeps
    /// busy, the doorbell, and the quiet connections that have none, so a wait
    /// over many quiet connections spins at the cost of the busy ones. The full
    /// look (every [`PROGRESS_EVERY`] polls and while sleeping) covers the rest: a
    /// write that raced a request to ring, a blocked put on a quiet connection, a
    /// connection that came up meanwhile.
    fn poll_watched(&mut self, read: bool, write: bool) -> (bool, usize) {
        if read && self.doorbell.as_ref().is_some_and(Doorbell::rung) {
            self.answer_bells();
        }
        let mut ready = false;
        let quiet = if read { self.watch.quiet.len() } else { 0 };
        for i in 0..self.watch.busy.len() + quiet {
            let r = match i.checked_sub(self.watch.busy.len()) {
                None => self.watch.busy[i],
                Some(q) => self.watch.quiet[q],
            };
            let vc = &mut self.vcs[r];
            let write = write && (vc.want_write || vc.want_release);
            ready |= vc.up_ready(read, write, false);
        }
        (ready, 1 + self.watch.busy.len() + quiet)
    }

    /// rch_get_watch_stats.
    pub(crate) fn watch_stats(&self) -> WatchStats {
        WatchStats {
            busy: self.watch.busy.len(),
            quiet: self.watch.quiet.len() + self.watch.quiet_belled.len(),
            quiet_belled: self.watch.quiet_belled.len(),
            rings: self.watch.rings,
            found_by_bell: self.watch.found_by_bell,
            found_in_turn: self.watch.found_in_turn,
        }
    }

    /// rch_get_rail_stats, over the connections up now.
    pub(crate) fn rail_stats(&self) -> RailStats {
        let mut s = RailStats::default();
        for vc in &self.vcs {
            if let Conn::Up(u) = &vc.conn {
                let bytes = u.rx.rail_read_bytes();
                if bytes.len() > 1 {
                    s.connections += 1;
                }
                s.rails = s.rails.max(bytes.len());
                for (sum, b) in s.read_bytes.iter_mut().zip(bytes) {
                    *sum += b;
                }
            }
        }
        s
    }

    /// rch_get_stats: connections up, handshakes, and the memory registered for
    /// them as it stands: each end's incoming ring (and one offered, not yet
    /// switched to), its control words, and its staging copy of the peer's ring
    /// where the fabric's inline limit calls for one.
    pub(crate) fn stats(&self) -> Stats {
        let mut up = 0usize;
        let mut registered = 0u64;
        for vc in &self.vcs {
            if let Conn::Up(u) = &vc.conn {
                up += 1;
                registered += u.rx.registered_bytes() + u.tx.registered_bytes();
                if let Some((rx, tx)) = &u._spare {
                    registered += rx.registered_bytes() + tx.registered_bytes();
                }
            }
        }
        Stats {
            connections: up,
            pending: self.handshakes + self.inbound.len(),
            registered_bytes: usize::try_from(registered).unwrap_or(usize::MAX),
        }
    }

    pub(crate) fn wait_policy(&self) -> Backoff {
        self.contention
            .backoff(self.cfg.wait_policy(), self.cfg.wait_policy_is_set())
    }
}

/// Whether a process group's host has fewer CPUs than what runs on it needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Contention {
    /// A CPU for every rank of the group on this host (and for the RDMA device's
    /// protocol, where that runs in the host's kernel).
    None,
    /// More ranks of the group on this host than CPUs they may run on
    /// ([`host_cpus`]).
    Ranks,
    /// Not a CPU for every rank and also one for the software RDMA device
    /// (Soft-RoCE) that the group's traffic goes through.
    Device,
}

impl Contention {
    /// The contention of `local` ranks on a host where this process may use `cpus`
    /// CPUs, one of them also wanted by a software RDMA device if `device_cpu`.
    fn of(local: usize, cpus: usize, device_cpu: bool) -> Contention {
        if device_cpu && local > cpus.saturating_sub(1) {
            Contention::Device
        } else if local > cpus {
            Contention::Ranks
        } else {
            Contention::None
        }
    }

    /// Whether large heap buffers take the path the receiver measures cheaper
    /// (`Config::zero_copy_adaptive`) when the user did not choose: only with a CPU
    /// for every rank, where a copy's time is the copy's.
    fn measures_paths(self) -> bool {
        self == Contention::None
    }

    /// Whether the group's large heap buffers go zero-copy by default (the
    /// fabric's `zero_copy_outnumbered_default`): with more ranks than CPUs the
    /// group is short of CPU time, which one copy spends half as much of as the
    /// ring's two; not when the user chose a path policy (`policy_set`).
    fn sends_large_heap_buffers_zero_copy(self, policy_set: bool) -> bool {
        self == Contention::Ranks && !policy_set
    }

    /// The backoff of a wait under this contention: `p` if the user set it
    /// (`policy_set`) or nothing contends.
    fn backoff(self, p: WaitPolicy, policy_set: bool) -> Backoff {
        if policy_set {
            return Backoff::with_policy(p);
        }
        match self {
            // More ranks on this host than CPUs we may run on: the rank a wait is for
            // is most likely runnable and waiting for a CPU, so give ours to it at
            // once. Every busy poll only delays it: MPICH's sendflood (3 ranks
            // flooding a 4th on 2 CPUs) took 12.1 s polling 100 times and then
            // sleeping, 3.1-3.4 s yielding at once, 40.5 s polling 2000 times first;
            // NPB CG class A 0.39-0.62 s against 0.34-0.42 (bench/notebook/2026-11.md,
            // 2026-11-28).
            Contention::Ranks => Backoff::new(0, p.yields, p.sleep_max),
            // The CPU short is the software RDMA device's, kernel work that a
            // yielding rank would still compete with: poll briefly, then sleep.
            Contention::Device => Backoff::new(p.spin.min(CONTENDED_SPIN), 0, p.sleep_max),
            Contention::None => Backoff::with_policy(p),
        }
    }
}

/// The reason a request loses when both ranks connect at once (the lower rank's
/// request wins, as on the Unix sockets).
#[cfg(feature = "verbs")]
const LOST_RACE: &str = "both ranks connected at once and the lower rank's request wins";

/// Decides on an rdma_cm request with `hello` (see [`remote::hello`]) at rank `me`,
/// and marks the connection as being accepted when it says yes.
#[cfg(feature = "verbs")]
fn decide_remote(
    vcs: &mut [Vc],
    handshakes: &mut usize,
    me: usize,
    hello: &[u8],
) -> Result<(), String> {
    let Some((from, to)) = remote::parse_hello(hello) else {
        return Err("not a process-group connection request".into());
    };
    let from = from as usize;
    if to as usize != me || from >= vcs.len() || from == me {
        return Err(format!(
            "a request from rank {from} to rank {to} does not belong to this job (rank {me} of {})",
            vcs.len()
        ));
    }
    match &vcs[from].conn {
        Conn::Idle | Conn::AwaitPeer => *handshakes += 1,
        // Ours is dropped (cancelled); the count of handshakes stays.
        Conn::CmOutbound(_) if from < me => {}
        Conn::CmOutbound(_) => return Err(LOST_RACE.into()),
        Conn::Closed | Conn::Failed(_) => return Err("the connection was closed".into()),
        _ => return Err("already connected".into()),
    }
    vcs[from].conn = Conn::CmAccepting;
    Ok(())
}

#[cold]
fn unknown_vc() -> Error {
    Error::new(
        ErrorKind::UnknownVc,
        "not a connection handle of this library",
    )
}

#[cold]
fn gone(rank: usize) -> Error {
    Error::new(
        ErrorKind::PeerGone,
        format!("rank {rank} is gone: its process ended without closing the connection"),
    )
}

#[cold]
fn closed(rank: usize) -> Error {
    Error::new(
        ErrorKind::VcClosed,
        format!("the connection to rank {rank} was closed by rch_vc_close"),
    )
}

/// A read's or peek's error as the group reports it. The connection's end or failure
/// also sets `rx_done` (rch_wait stops watching it); a misuse (`InvalidInput`: reads
/// in flight) leaves the connection as it was.
#[cold]
fn read_failed(rx_done: &mut bool, e: &io::Error, rank: usize, what: &str) -> Error {
    if e.kind() != io::ErrorKind::InvalidInput {
        *rx_done = true;
    }
    data_error(e, rank, what)
}

#[cold]
fn data_error(e: &io::Error, rank: usize, what: &str) -> Error {
    if e.kind() == io::ErrorKind::InvalidInput {
        return Error::new(
            ErrorKind::InFlight,
            format!("{what} on the connection to rank {rank}: {e}"),
        );
    }
    Error::from_conn(e, &format!("{what} on the connection to rank {rank}"))
}

fn reason(tag: &[u8; 4], body: &[u8]) -> String {
    unix::describe(tag, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contention_counts_ranks_and_a_software_device() {
        assert_eq!(Contention::of(2, 2, false), Contention::None);
        assert_eq!(Contention::of(3, 2, false), Contention::Ranks);
        assert_eq!(Contention::of(2, 2, true), Contention::Device);
        assert_eq!(Contention::of(4, 2, true), Contention::Device);
        assert_eq!(Contention::of(1, 2, true), Contention::None);
        assert_eq!(Contention::of(1, 1, false), Contention::None);
    }

    /// A hello card of a rank on `host` whose affinity mask is `cpus` (encoded).
    fn card(host: &str, cpus: Option<&str>) -> Hello {
        Hello {
            fabric: crate::fabric::FabricKind::Emulated,
            pid: 1,
            socket: "s".into(),
            host: host.into(),
            cm: None,
            bell: None,
            cpus: cpus.map(|c| CpuSet::decode(c).unwrap()),
        }
    }

    #[test]
    fn a_hosts_cpus_are_the_union_of_its_ranks_masks() {
        // A CPU quota on the test host (below its own mask) caps every count.
        let own = available_cpus();
        let quota = if own < CpuSet::of_this_process().unwrap().count() {
            own
        } else {
            usize::MAX
        };
        // Two ranks pinned to a core each (mpiexec -bind-to core): two CPUs, and
        // two ranks are not outnumbered.
        let pinned = [card("h", Some("0")), card("h", Some("1"))];
        assert_eq!(host_cpus(&pinned, "h"), 2.min(quota));
        if quota >= 2 {
            assert_eq!(
                Contention::of(2, host_cpus(&pinned, "h"), false),
                Contention::None
            );
        }
        // Four ranks pinned two to a core: two CPUs, outnumbered.
        let doubled = [
            card("h", Some("0")),
            card("h", Some("0")),
            card("h", Some("1")),
            card("h", Some("1")),
        ];
        assert_eq!(host_cpus(&doubled, "h"), 2.min(quota));
        assert_eq!(
            Contention::of(4, host_cpus(&doubled, "h"), false),
            Contention::Ranks
        );
        // Ranks of other hosts do not count; a card without a mask falls back to
        // this process's own count.
        let mixed = [card("h", Some("0-3")), card("other", Some("4-63"))];
        assert_eq!(host_cpus(&mixed, "h"), 4.min(quota));
        let unknown = [card("h", Some("0")), card("h", None)];
        assert_eq!(host_cpus(&unknown, "h"), own);
    }

    #[test]
    fn unbound_outnumbered_ranks_take_their_hosts_cpus_in_turn() {
        // Four unbound ranks on CPUs 2-3, a fifth on another host: by their place
        // among the host's ranks, 2, 3, 2, 3.
        let free = [
            card("h", Some("2-3")),
            card("other", Some("0-7")),
            card("h", Some("2-3")),
            card("h", Some("2-3")),
            card("h", Some("2-3")),
        ];
        let cpus: Vec<_> = [0, 2, 3, 4]
            .iter()
            .map(|&r| spread_cpu(&free, "h", r))
            .collect();
        assert_eq!(cpus, [Some(2), Some(3), Some(2), Some(3)]);
        assert_eq!(spread_cpu(&free, "other", 1), Some(0));
        // A launcher bound them (masks differ from their union): left alone.
        let bound = [
            card("h", Some("0")),
            card("h", Some("0")),
            card("h", Some("1")),
        ];
        assert_eq!(spread_cpu(&bound, "h", 2), None);
        // A card that does not say: left alone.
        let unknown = [
            card("h", Some("0-1")),
            card("h", None),
            card("h", Some("0-1")),
        ];
        assert_eq!(spread_cpu(&unknown, "h", 0), None);
        // Holes in the set are skipped.
        let holes = [
            card("h", Some("1.5")),
            card("h", Some("1.5")),
            card("h", Some("1.5")),
        ];
        assert_eq!(spread_cpu(&holes, "h", 1), Some(5));
        assert_eq!(spread_cpu(&holes, "h", 2), Some(1));
    }

    #[test]
    fn only_a_group_with_a_cpu_per_rank_measures_its_paths() {
        assert!(Contention::of(2, 2, false).measures_paths());
        assert!(!Contention::of(4, 2, false).measures_paths());
        assert!(!Contention::of(2, 2, true).measures_paths());
    }

    #[test]
    fn only_ranks_outnumbering_their_cpus_send_large_heap_buffers_zero_copy() {
        assert!(Contention::of(4, 2, false).sends_large_heap_buffers_zero_copy(false));
        assert!(!Contention::of(4, 2, false).sends_large_heap_buffers_zero_copy(true));
        assert!(!Contention::of(2, 2, false).sends_large_heap_buffers_zero_copy(false));
        assert!(!Contention::Device.sends_large_heap_buffers_zero_copy(false));
    }

    #[test]
    fn outnumbered_ranks_yield_at_once_and_a_device_cpu_polls_then_sleeps() {
        let p = crate::config::DEFAULT_WAIT_POLICY;
        let ranks = Contention::Ranks.backoff(p, false);
        assert!(ranks.is_past_spinning() && !ranks.is_sleeping());
        let mut device = Contention::Device.backoff(p, false);
        assert!(!device.is_past_spinning());
        for _ in 0..CONTENDED_SPIN {
            device.snooze();
        }
        assert!(device.is_past_spinning());
        // No yields: the next step sleeps.
        device.snooze();
        assert!(device.is_sleeping());
        // A policy the user set wins: it spins first.
        assert!(!Contention::Ranks.backoff(p, true).is_past_spinning());
        assert!(!Contention::None.backoff(p, false).is_past_spinning());
    }
}
