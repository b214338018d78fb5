//! The library's global state: the process group, its connections (set up lazily,
//! see [`hello`](super::hello)), and the progress of their handshakes.

use std::ffi::c_int;
use std::io::{self, IoSlice, IoSliceMut};
use std::os::unix::net::{UnixListener, UnixStream};
use std::time::{Duration, Instant};

use super::error::Error;
use super::exchange::Exchange;
use super::hello::{self, Hello};
use super::lock::{Guard, SpinLock};
use super::sys::{rch_stats, rch_status};
use crate::config::Config;
use crate::engine::{Backoff, Prepared, Receiver, Sender};
use crate::fabric::{AnyFabric, Card, Fabric};

/// Key under which every process publishes its hello card.
pub(crate) const HELLO_KEY: &str = "rch-hello";
/// Data calls on connections that are not up (yet) between two looks at the listener
/// and the handshakes in progress (each look costs a few system calls), and polls of
/// rch_wait between two such looks while it spins.
const PROGRESS_EVERY: u32 = 64;
/// Data calls on connections that are up between two such looks: a process that only
/// ever polls its established connections still answers new peers.
const BACKGROUND_EVERY: u32 = 4096;

/// Where the library is in its life cycle.
pub(crate) enum Phase {
    Uninit,
    /// After an init_process_group: rank, size and the card are known.
    Group(Group),
    /// After rch_init: connections can be used.
    Ready(Group),
    Finalized,
}

pub(crate) static LIB: SpinLock<Phase> = SpinLock::new(Phase::Uninit);

/// Locks the library; a poisoned lock (a panic inside a call) makes it unusable.
#[inline]
pub(crate) fn lock() -> Result<Guard<'static, Phase>, Error> {
    LIB.lock().map_err(|_| {
        Error::new(
            rch_status::RCH_ERR_INTERNAL,
            "an earlier call failed with an internal error; the library is unusable",
        )
    })
}

impl Phase {
    /// The group, once rch_init has run.
    #[inline]
    pub(crate) fn ready(&mut self) -> Result<&mut Group, Error> {
        match self {
            Phase::Ready(g) => Ok(g),
            Phase::Uninit | Phase::Group(_) => Err(Error::new(
                rch_status::RCH_ERR_NOT_INITIALIZED,
                "rch_init has not been called",
            )),
            Phase::Finalized => Err(finalized()),
        }
    }

    /// The group, after an init_process_group (before or after rch_init).
    pub(crate) fn group(&mut self) -> Result<&mut Group, Error> {
        match self {
            Phase::Ready(g) | Phase::Group(g) => Ok(g),
            Phase::Uninit => Err(Error::new(
                rch_status::RCH_ERR_NOT_INITIALIZED,
                "rch_init_process_group has not been called",
            )),
            Phase::Finalized => Err(finalized()),
        }
    }
}

#[cold]
pub(crate) fn finalized() -> Error {
    Error::new(
        rch_status::RCH_ERR_FINALIZED,
        "rch_finalize has been called",
    )
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
        if !hello::readable(s) {
            return false;
        }
        match hello::recv(s) {
            Ok((t, _)) if &t == hello::TAG_BYE => self.link = None,
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
            let _ = hello::send(&s, hello::TAG_BYE, &[], None);
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
    Up(Up),
    Closed,
    Failed(Error),
}

struct Vc {
    conn: Conn,
    /// A put returned less than offered (or left a zero-copy transfer in flight):
    /// rch_wait watches for room.
    want_write: bool,
    /// A read reported the connection's end or failure: rch_wait stops watching it.
    rx_done: bool,
}

/// The process group and its connections.
pub(crate) struct Group {
    pub(crate) rank: u32,
    pub(crate) size: u32,
    pub(crate) spawned: bool,
    exchange: Box<dyn Exchange>,
    fabric: AnyFabric,
    cfg: Config,
    listener: UnixListener,
    hello: Hello,
    peers: Vec<Hello>,
    vcs: Vec<Vc>,
    /// Accepted sockets whose HELLO has not arrived yet.
    inbound: Vec<UnixStream>,
    /// Handshakes in progress (outbound or awaiting READY), to skip the scan when none.
    handshakes: usize,
    tick: u32,
    /// Smallest buffer the engine may send zero-copy (C memory is never from
    /// `alloc_mem`, so the threshold for other memory); smaller puts take the
    /// plain copying path, which skips the eligibility checks.
    zc_min: usize,
    uid: u32,
}

impl Group {
    /// Opens the fabric, listens, and publishes this process's hello card.
    pub(crate) fn new(
        rank: u32,
        size: u32,
        spawned: bool,
        mut exchange: Box<dyn Exchange>,
    ) -> Result<Group, Error> {
        let cfg = Config::from_env()
            .map_err(|e| Error::new(rch_status::RCH_ERR_CONFIG, e.to_string()))?;
        let fabric =
            AnyFabric::from_env().map_err(|e| Error::from_setup(&e, "opening the fabric"))?;
        let socket = hello::socket_name().map_err(|e| Error::system(&e, "getrandom"))?;
        let listener = hello::listen(&socket)
            .map_err(|e| Error::system(&e, &format!("listening on @{socket}")))?;
        let hello = Hello {
            fabric: fabric.kind(),
            pid: std::process::id(),
            socket,
        };
        exchange.publish(HELLO_KEY, hello.encode().as_bytes())?;
        let zc_min = cfg
            .zero_copy_thresholds()
            .1
            .unwrap_or(fabric.zero_copy_defaults().1)
            .max(1);
        let vcs = (0..size)
            .map(|_| Vc {
                conn: Conn::Idle,
                want_write: false,
                rx_done: false,
            })
            .collect();
        Ok(Group {
            rank,
            size,
            spawned,
            exchange,
            fabric,
            cfg,
            listener,
            hello,
            peers: Vec::new(),
            vcs,
            inbound: Vec::new(),
            handshakes: 0,
            tick: 0,
            zc_min,
            // SAFETY: getuid cannot fail and touches no memory.
            uid: unsafe { libc::getuid() },
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
                Error::new(
                    rch_status::RCH_ERR_EXCHANGE,
                    format!("hello card of rank {r}: {m}"),
                )
            })?;
            if h.fabric != self.hello.fabric {
                return Err(Error::new(
                    rch_status::RCH_ERR_FABRIC,
                    format!(
                        "rank {r} uses the {} fabric, this process (rank {}) the {} fabric (RCH_FABRIC)",
                        h.fabric, self.rank, self.hello.fabric
                    ),
                ));
            }
            peers.push(h);
        }
        self.peers = peers;
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
    #[inline]
    pub(crate) unsafe fn put(
        &mut self,
        rank: usize,
        iov: &[IoSlice<'_>],
        total: usize,
    ) -> Result<usize, Error> {
        self.background();
        let vc = &mut self.vcs[rank];
        if let Conn::Up(up) = &mut vc.conn {
            if up.confirm.is_none() {
                let r = if total < self.zc_min && !up.tx.zero_copy_pending() {
                    up.tx.put(iov)
                } else {
                    // SAFETY: forwarded from this function's contract.
                    unsafe { up.tx.put_nocopy(iov) }
                };
                return match r {
                    Ok(0) if total > 0 && up.idle_gone() => {
                        vc.want_write = false;
                        Err(gone(rank))
                    }
                    Ok(n) => {
                        vc.want_write = n < total || up.tx.zero_copy_pending();
                        Ok(n)
                    }
                    Err(e) => {
                        vc.want_write = false;
                        Err(data_error(&e, rank, "put"))
                    }
                };
            }
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { self.put_slow(rank, iov, total) }
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
    ) -> Result<usize, Error> {
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
            Conn::AwaitPeer => self.maybe_progress(),
        }
        self.vcs[rank].want_write = total > 0;
        match &self.vcs[rank].conn {
            // SAFETY: forwarded from this function's contract.
            Conn::Up(up) if up.confirm.is_none() => unsafe { self.put(rank, iov, total) },
            Conn::Failed(e) => Err(e.clone()),
            _ => Ok(0),
        }
    }

    /// Non-blocking read from the connection to `rank`.
    ///
    /// # Safety
    ///
    /// `rch_read_datav`'s contract: a buffer that reads were left in flight into stays
    /// allocated and untouched until a later call counts them.
    #[inline]
    pub(crate) unsafe fn read(
        &mut self,
        rank: usize,
        iov: &mut [IoSliceMut<'_>],
    ) -> Result<usize, Error> {
        self.background();
        let vc = &mut self.vcs[rank];
        if let Conn::Up(up) = &mut vc.conn {
            // SAFETY: forwarded from this function's contract.
            return match unsafe { up.rx.get_nowait(iov) } {
                Ok(0) if up.idle_gone() => {
                    vc.rx_done = true;
                    Err(gone(rank))
                }
                Ok(n) => Ok(n),
                Err(e) => {
                    if e.kind() != io::ErrorKind::InvalidInput {
                        vc.rx_done = true;
                    }
                    Err(data_error(&e, rank, "read"))
                }
            };
        }
        // SAFETY: forwarded from this function's contract.
        unsafe { self.read_slow(rank, iov) }
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
            _ => self.maybe_progress(),
        }
        match &self.vcs[rank].conn {
            // SAFETY: forwarded from this function's contract.
            Conn::Up(_) => unsafe { self.read(rank, iov) },
            Conn::Failed(e) => Err(e.clone()),
            _ => Ok(0),
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
        vc.conn = Conn::Closed;
        vc.want_write = false;
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
        match self.outbound(rank) {
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
        let sock = hello::connect(&peer.socket).map_err(|e| {
            Error::new(
                rch_status::RCH_ERR_PEER_GONE,
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
        hello::send(&sock, hello::TAG_HELLO, &body, Some(card)).map_err(|e| {
            Error::new(
                rch_status::RCH_ERR_PEER_GONE,
                format!("sending HELLO to rank {rank}: {e}"),
            )
        })?;
        Ok(Conn::Outbound {
            sock,
            prepared: Box::new(prepared),
        })
    }

    fn prepare(&self) -> Result<Prepared<AnyFabric>, Error> {
        let f = self
            .fabric
            .for_connection()
            .map_err(|e| Error::from_setup(&e, "fabric domain"))?;
        Prepared::new(f, self.cfg.clone()).map_err(|e| Error::from_setup(&e, "connection memory"))
    }

    /// Accepts peers' HELLOs and advances our handshakes. True if anything changed.
    pub(crate) fn progress(&mut self) -> bool {
        let mut changed = false;
        while let Ok((s, _)) = self.listener.accept() {
            // Only processes of our own user may connect.
            if hello::peer_cred(&s).is_ok_and(|(_, uid)| uid == self.uid) {
                let _ = s.set_nonblocking(false);
                self.inbound.push(s);
            }
        }
        let mut i = 0;
        while i < self.inbound.len() {
            if hello::readable(&self.inbound[i]) {
                let s = self.inbound.swap_remove(i);
                self.on_hello(s);
                changed = true;
            } else {
                i += 1;
            }
        }
        if self.handshakes > 0 {
            for r in 0..self.vcs.len() {
                changed |= self.advance(r);
            }
        }
        changed
    }

    /// Advances the handshake of connection `r`, if its socket has news.
    fn advance(&mut self, r: usize) -> bool {
        match &mut self.vcs[r].conn {
            Conn::Outbound { sock, .. } if hello::readable(sock) => {}
            Conn::Up(up) => {
                let Some(sock) = &up.confirm else {
                    return false;
                };
                if !hello::readable(sock) {
                    return false;
                }
                let res = hello::recv(sock);
                self.handshakes -= 1;
                match res {
                    // The socket stays open as the connection's liveness signal.
                    Ok((t, _)) if &t == hello::TAG_READY => up.link = up.confirm.take(),
                    Ok((t, c)) => {
                        self.vcs[r].conn = Conn::Failed(Error::new(
                            rch_status::RCH_ERR_PEER_GONE,
                            format!("rank {r} failed to connect: {}", reason(&t, &c.bytes)),
                        ))
                    }
                    Err(e) => {
                        self.vcs[r].conn = Conn::Failed(Error::new(
                            rch_status::RCH_ERR_PEER_GONE,
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
        self.vcs[r].conn = match hello::recv(&sock) {
            Ok((t, card)) if &t == hello::TAG_ACCEPT => match prepared.connect(card) {
                Ok(chan) => {
                    let (rx, tx) = chan.split();
                    match hello::send(&sock, hello::TAG_READY, &[], None) {
                        Ok(()) => Conn::Up(Up::new(rx, tx, None, Some(sock))),
                        Err(e) => Conn::Failed(Error::new(
                            rch_status::RCH_ERR_PEER_GONE,
                            format!("rank {r} vanished while connecting: {e}"),
                        )),
                    }
                }
                Err(e) => {
                    let _ = hello::send(&sock, hello::TAG_CLOSED, e.to_string().as_bytes(), None);
                    Conn::Failed(Error::from_conn(&e, &format!("connecting to rank {r}")))
                }
            },
            Ok((t, _)) if &t == hello::TAG_REJECT => Conn::AwaitPeer,
            Ok((t, c)) if &t == hello::TAG_CLOSED => Conn::Failed(Error::new(
                rch_status::RCH_ERR_PEER_CLOSED,
                format!("rank {r} refused the connection: {}", reason(&t, &c.bytes)),
            )),
            Ok((t, c)) => Conn::Failed(Error::new(
                rch_status::RCH_ERR_PROTOCOL,
                format!("rank {r} answered {}", reason(&t, &c.bytes)),
            )),
            Err(e) => Conn::Failed(Error::new(
                rch_status::RCH_ERR_PEER_GONE,
                format!("rank {r} closed the handshake (finalised or died): {e}"),
            )),
        };
        true
    }

    /// A peer's HELLO arrived on an accepted socket.
    fn on_hello(&mut self, s: UnixStream) {
        let Ok((tag, card)) = hello::recv(&s) else {
            return;
        };
        let b = &card.bytes;
        if &tag != hello::TAG_HELLO || b.len() < 8 {
            let _ = hello::send(&s, hello::TAG_CLOSED, b"expected HELLO", None);
            return;
        }
        let from = u32::from_le_bytes(b[0..4].try_into().expect("4 bytes")) as usize;
        let to = u32::from_le_bytes(b[4..8].try_into().expect("4 bytes"));
        let pid = hello::peer_cred(&s).map(|(p, _)| p).unwrap_or(0);
        if to != self.rank
            || from >= self.vcs.len()
            || from == to as usize
            || self.peers[from].pid != pid
        {
            let _ = hello::send(
                &s,
                hello::TAG_CLOSED,
                format!(
                    "HELLO from rank {from} (pid {pid}) to rank {to} does not belong to this job"
                )
                .as_bytes(),
                None,
            );
            return;
        }
        let peer_card = Card {
            bytes: b[8..].to_vec(),
            fds: card.fds,
        };
        match &self.vcs[from].conn {
            Conn::Idle | Conn::AwaitPeer => {}
            // Both started: the lower rank's attempt wins.
            Conn::Outbound { .. } if from < self.rank as usize => {
                self.handshakes -= 1;
            }
            Conn::Outbound { .. } | Conn::Up(_) => {
                let _ = hello::send(&s, hello::TAG_REJECT, b"", None);
                return;
            }
            Conn::Closed | Conn::Failed(_) => {
                let _ = hello::send(&s, hello::TAG_CLOSED, b"the connection was closed", None);
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
                let _ = hello::send(&s, hello::TAG_CLOSED, e.msg.as_bytes(), None);
                Conn::Failed(e)
            }
        };
    }

    fn accept(&self, s: &UnixStream, peer: Card) -> Result<Up, Error> {
        let prepared = self.prepare()?;
        let card = prepared
            .card()
            .map_err(|e| Error::from_conn(&e, "connection card"))?;
        let chan = prepared
            .connect(peer)
            .map_err(|e| Error::from_conn(&e, "accepting a connection"))?;
        hello::send(s, hello::TAG_ACCEPT, &[], Some(card)).map_err(|e| {
            Error::new(
                rch_status::RCH_ERR_PEER_GONE,
                format!("answering HELLO: {e}"),
            )
        })?;
        let (rx, tx) = chan.split();
        Ok(Up::new(rx, tx, None, None))
    }

    /// One look at every connection for rch_wait: true when a read or a blocked put
    /// may progress, or a handshake moved. `all` includes the listener and sockets.
    fn poll(&mut self, only: Option<usize>, read: bool, write: bool, sockets: bool) -> bool {
        let mut ready = false;
        if sockets && (self.progress()) {
            ready = true;
        }
        let range = match only {
            Some(r) => r..r + 1,
            None => 0..self.vcs.len(),
        };
        for r in range {
            let vc = &mut self.vcs[r];
            match &mut vc.conn {
                Conn::Up(up) => {
                    if sockets && !vc.rx_done && up.peer_gone() {
                        ready = true;
                    }
                    if read && !vc.rx_done && up.rx.poll_readable().unwrap_or(true) {
                        ready = true;
                    }
                    if up.confirm.is_none()
                        && write
                        && (vc.want_write || only.is_some())
                        && up.tx.poll_writable().unwrap_or(true)
                    {
                        ready = true;
                    }
                }
                Conn::Closed | Conn::Failed(_) if only.is_some() => ready = true,
                // A put on a connection nobody opened yet progresses: it starts one.
                Conn::Idle if only.is_some() && write => ready = true,
                _ => {}
            }
        }
        ready
    }

    /// rch_get_stats: connections up, handshakes, and the memory registered for
    /// them (as `Prepared::new` and `connect` allocate it: the incoming ring and
    /// control words, plus a staging copy of the outgoing ring where the fabric's
    /// inline limit is below the chunk size).
    pub(crate) fn stats(&self) -> rch_stats {
        let ring = self.cfg.ring_size_bytes();
        let inline = self
            .fabric
            .caps()
            .max_inline
            .min(self.cfg.max_inline_bytes().unwrap_or(usize::MAX));
        let staging = if inline < self.cfg.chunk_size_bytes().min(ring / 2) {
            ring
        } else {
            0
        };
        let per_direction = ring + crate::engine::CTRL_SIZE + staging;
        let mut up = 0usize;
        let mut ends = 0usize;
        for vc in &self.vcs {
            if let Conn::Up(u) = &vc.conn {
                up += 1;
                ends += if u._spare.is_some() { 2 } else { 1 };
            }
        }
        rch_stats {
            connections: up as c_int,
            pending: (self.handshakes + self.inbound.len()) as c_int,
            registered_bytes: (ends * per_direction) as _,
        }
    }

    fn wait_policy(&self) -> Backoff {
        let (s, y, m) = self.cfg.wait();
        Backoff::new(s, y, m)
    }
}

/// rch_wait and the per-connection waits: polls under the lock, snoozes without it.
pub(crate) fn wait(
    timeout_ms: i32,
    only: Option<usize>,
    read: bool,
    write: bool,
) -> Result<(), Error> {
    let start = Instant::now();
    let limit = (timeout_ms >= 0).then(|| Duration::from_millis(timeout_ms as u64));
    let mut backoff = None;
    let mut i: u32 = 0;
    loop {
        {
            let mut lib = lock()?;
            let g = lib.ready()?;
            if let Some(r) = only {
                g.check_rank(r)?;
            }
            let b = backoff.get_or_insert_with(|| g.wait_policy());
            let sockets = i % PROGRESS_EVERY == 0 || b.is_sleeping();
            if g.poll(only, read, write, sockets) {
                return Ok(());
            }
        }
        i = i.wrapping_add(1);
        if limit.is_some_and(|l| start.elapsed() >= l) {
            return Err(Error::new(
                rch_status::RCH_ERR_TIMEOUT,
                format!("no progress within {timeout_ms} ms"),
            ));
        }
        backoff.as_mut().expect("set above").snooze();
    }
}

#[cold]
fn unknown_vc() -> Error {
    Error::new(
        rch_status::RCH_ERR_UNKNOWN_VC,
        "not a connection handle of this library",
    )
}

#[cold]
fn gone(rank: usize) -> Error {
    Error::new(
        rch_status::RCH_ERR_PEER_GONE,
        format!("rank {rank} is gone: its process ended without closing the connection"),
    )
}

#[cold]
fn closed(rank: usize) -> Error {
    Error::new(
        rch_status::RCH_ERR_VC_CLOSED,
        format!("the connection to rank {rank} was closed by rch_vc_close"),
    )
}

#[cold]
fn data_error(e: &io::Error, rank: usize, what: &str) -> Error {
    if e.kind() == io::ErrorKind::InvalidInput {
        return Error::new(
            rch_status::RCH_ERR_IN_FLIGHT,
            format!("{what} on the connection to rank {rank}: {e}"),
        );
    }
    Error::from_conn(e, &format!("{what} on the connection to rank {rank}"))
}

fn reason(tag: &[u8; 4], body: &[u8]) -> String {
    format!(
        "{} {}",
        String::from_utf8_lossy(tag),
        String::from_utf8_lossy(&body[..body.len().min(200)])
    )
}
