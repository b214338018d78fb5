//! Connections by IP address through rdma_cm: the connection cards travel as the
//! private data of the connection manager's own messages, so a connection costs no
//! exchange beyond rdma_cm's request, reply and ready-to-use.
//!
//! ```text
//! initiator                                   acceptor (listening)
//! resolve address, route (-> device)
//! queue pair on the id, ring, control words
//! REQ  [hello | engine card]  ------------->  CONNECT_REQUEST: parse, queue pair,
//!                                             ring, accept; queue pair RTR/RTS
//!      <-----------------  [engine card]  REP
//! RTR/RTS, ESTABLISHED (usable)
//! RTU  ------------------------------------>  ESTABLISHED (usable)
//! ```
//!
//! The acceptor writes into the initiator's ring only after `ESTABLISHED`, when the
//! initiator's queue pair is ready to receive. A request is refused with a reason
//! (`REJ` private data) when it is malformed or its end cannot be set up.
//!
//! Private data (REQ at most 56 bytes on InfiniBand and RoCE, REP 196, REJ 148):
//!
//! | offset | size | field |
//! | --- | --- | --- |
//! | 0 | 2 | `RC` (connect, accept) or `RX` (reject) |
//! | 2 | 1 | hello length *h* (the caller's bytes, e.g. a process group's ranks) |
//! | 3 | 1 | card length *c* (reject: reason length) |
//! | 4 | *h* | hello |
//! | 4 + *h* | *c* | engine card (reject: the reason, UTF-8) |
//!
//! On InfiniBand the private data arrives padded with zeros to the message's full
//! size; the lengths in the header say what counts.

use std::collections::HashMap;
use std::io;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::config::Config;
use crate::engine::{Channel, Prepared};
use crate::fabric::any::AnyPending;
use crate::fabric::verbs::cm::{CmEvent, CmEventKind, CmId, EventChannel};
use crate::fabric::verbs::VerbsFabric;
use crate::fabric::{AnyFabric, Card};

const TAG_CONNECT: &[u8; 2] = b"RC";
const TAG_REJECT: &[u8; 2] = b"RX";
/// Backlog of a listening id.
const BACKLOG: i32 = 128;

/// Frames a connect or accept message.
fn frame(hello: &[u8], card: &[u8]) -> io::Result<Vec<u8>> {
    let (h, c) = (u8::try_from(hello.len()), u8::try_from(card.len()));
    let (Ok(h), Ok(c)) = (h, c) else {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "hello or card longer than 255 bytes",
        ));
    };
    let mut b = Vec::with_capacity(4 + hello.len() + card.len());
    b.extend_from_slice(TAG_CONNECT);
    b.push(h);
    b.push(c);
    b.extend_from_slice(hello);
    b.extend_from_slice(card);
    Ok(b)
}

/// A reject message carrying `reason`.
fn reject_frame(reason: &str) -> Vec<u8> {
    let r = &reason.as_bytes()[..reason.len().min(140)];
    let mut b = Vec::with_capacity(4 + r.len());
    b.extend_from_slice(TAG_REJECT);
    b.push(0);
    b.push(r.len() as u8);
    b.extend_from_slice(r);
    b
}

/// A parsed message: (hello, card) of a connect/accept, or the reason of a reject.
enum Message<'a> {
    Connect { hello: &'a [u8], card: &'a [u8] },
    Reject(String),
}

fn parse(b: &[u8]) -> io::Result<Message<'_>> {
    let bad = |m: &str| {
        io::Error::new(
            io::ErrorKind::InvalidData,
            format!("bad rdma_cm private data: {m}"),
        )
    };
    if b.len() < 4 {
        return Err(bad("shorter than its header (is the peer rdma-channel?)"));
    }
    let (h, c) = (usize::from(b[2]), usize::from(b[3]));
    if b.len() < 4 + h + c {
        return Err(bad("shorter than its lengths say"));
    }
    match &b[0..2] {
        t if t == TAG_CONNECT => Ok(Message::Connect {
            hello: &b[4..4 + h],
            card: &b[4 + h..4 + h + c],
        }),
        t if t == TAG_REJECT => Ok(Message::Reject(
            String::from_utf8_lossy(&b[4 + h..4 + h + c]).into_owned(),
        )),
        _ => Err(bad("unknown tag (is the peer rdma-channel?)")),
    }
}

/// A connection made through rdma_cm.
pub(crate) struct Connected {
    pub(crate) channel: Channel<AnyFabric>,
    /// The hello the initiator sent (empty on the initiator's side).
    pub(crate) hello: Vec<u8>,
    pub(crate) local: SocketAddr,
    pub(crate) peer: SocketAddr,
}

fn timed_out(what: &str, addr: &SocketAddr, t: Duration) -> io::Error {
    io::Error::new(
        io::ErrorKind::TimedOut,
        format!("connecting to {addr}: {what} timed out after {t:?}"),
    )
}

/// Turns an unexpected or failing event while connecting to `addr` into an error.
fn connect_error(ev: &CmEvent, addr: &SocketAddr, stage: &str) -> io::Error {
    match ev.kind {
        CmEventKind::Rejected => {
            let reason = match parse(&ev.private_data) {
                Ok(Message::Reject(r)) => r,
                _ if ev.status == 8 => "nothing listens there (no such service)".to_string(),
                _ => format!("rejected with reason {}", ev.status),
            };
            io::Error::new(
                io::ErrorKind::ConnectionRefused,
                format!("connecting to {addr}: refused: {reason}"),
            )
        }
        CmEventKind::AddrError => io::Error::new(
            io::ErrorKind::HostUnreachable,
            format!(
                "connecting to {addr}: no RDMA device reaches it ({})",
                ev.describe()
            ),
        ),
        CmEventKind::RouteError | CmEventKind::Unreachable => io::Error::new(
            io::ErrorKind::HostUnreachable,
            format!("connecting to {addr}: unreachable ({})", ev.describe()),
        ),
        _ => io::Error::new(
            io::ErrorKind::ConnectionAborted,
            format!(
                "connecting to {addr}: rdma_cm reported {} while {stage}",
                ev.describe()
            ),
        ),
    }
}

/// Connects to a listener at `addr`, sending `hello` with the card, within
/// `cfg`'s connect timeout (blocking; see [`Connector`] for the steps).
///
/// # Errors
///
/// `ConnectionRefused` (nothing listens, or the listener refused: its reason is in
/// the message), `HostUnreachable` (no RDMA device reaches the address, no route, no
/// answer), `TimedOut`, `NotFound` (no RDMA device here), `InvalidData` (the peer is
/// not rdma-channel), fabric failures.
pub(crate) fn connect(addr: &SocketAddr, cfg: &Config, hello: &[u8]) -> io::Result<Connected> {
    let mut c = Connector::start(addr, cfg, hello)?;
    loop {
        let wait = c.deadline.saturating_duration_since(Instant::now());
        if let Some(done) = c.poll(wait)? {
            return Ok(done);
        }
    }
}

/// `e`, with "`what` `addr`: " in front unless its message names `addr` already.
fn naming(e: io::Error, what: &str, addr: &SocketAddr) -> io::Error {
    if e.to_string().contains(&addr.to_string()) {
        e
    } else {
        io::Error::new(e.kind(), format!("{what} {addr}: {e}"))
    }
}

/// Where a [`Connector`] is.
enum Step {
    /// Waiting for `ADDR_RESOLVED`.
    Address,
    /// Waiting for `ROUTE_RESOLVED`.
    Route,
    /// Request sent, waiting for `ESTABLISHED` (our end is ready to connect).
    Request(Box<Prepared<AnyFabric>>),
    /// Connected, or failed.
    Spent,
}

/// A connection being made, one step per event of its own event channel: address
/// resolution, route resolution, the request, the reply. [`poll`](Self::poll)
/// advances it without blocking (or waiting up to a given time), so a caller can
/// drive many at once; [`connect`] drives one to the end.
pub(crate) struct Connector {
    addr: SocketAddr,
    cfg: Config,
    hello: Vec<u8>,
    channel: Arc<EventChannel>,
    id: Arc<CmId>,
    step: Step,
    deadline: Instant,
}

impl Connector {
    /// Starts connecting to `addr` (resolving its address).
    ///
    /// # Errors
    ///
    /// As [`connect`], for what fails at once (no RDMA device here).
    pub(crate) fn start(addr: &SocketAddr, cfg: &Config, hello: &[u8]) -> io::Result<Connector> {
        let go = || -> io::Result<Connector> {
            cfg.validate()?;
            let deadline = Instant::now() + cfg.connect_timeout();
            let channel = EventChannel::new()?;
            let id = Arc::new(CmId::new(&channel)?);
            id.resolve_addr(addr, cfg.connect_timeout())?;
            Ok(Connector {
                addr: *addr,
                cfg: cfg.clone(),
                hello: hello.to_vec(),
                channel,
                id,
                step: Step::Address,
                deadline,
            })
        };
        go().map_err(|e| naming(e, "connecting to", addr))
    }

    /// Handles what has happened, waiting up to `wait` for an event; the connection
    /// once it is up.
    ///
    /// # Errors
    ///
    /// As [`connect`]; after an error (or the connection) the connector is spent.
    pub(crate) fn poll(&mut self, wait: Duration) -> io::Result<Option<Connected>> {
        let addr = self.addr;
        self.advance(wait).map_err(|e| {
            self.step = Step::Spent;
            naming(e, "connecting to", &addr)
        })
    }

    fn advance(&mut self, wait: Duration) -> io::Result<Option<Connected>> {
        let limit = self.cfg.connect_timeout();
        let now = Instant::now();
        if now >= self.deadline {
            let what = match self.step {
                Step::Address => "address resolution",
                Step::Route => "route resolution",
                Step::Request(_) => "the connection request",
                Step::Spent => "the connection",
            };
            return Err(timed_out(what, &self.addr, limit));
        }
        let wait = wait.min(self.deadline - now);
        let Some(ev) = self.channel.next(wait)? else {
            return Ok(None);
        };
        if !ev.is_for(&self.id) {
            return Ok(None);
        }
        let left = self.deadline.saturating_duration_since(Instant::now());
        match (std::mem::replace(&mut self.step, Step::Spent), ev.kind) {
            (Step::Address, CmEventKind::AddrResolved) => {
                self.id.resolve_route(left)?;
                self.step = Step::Route;
                Ok(None)
            }
            (Step::Route, CmEventKind::RouteResolved) => {
                let fabric = VerbsFabric::for_cm_id(&self.id)?;
                // Best effort: kernels before 4.20 lack the option and keep rdma_cm's.
                let _ = self.id.set_ack_timeout(fabric.ack_timeout());
                let pending = fabric.create_qp_on(self.id.clone())?;
                let params = fabric.conn_params();
                let prepared = Prepared::with_pending(
                    AnyFabric::Verbs(fabric),
                    AnyPending::Verbs(pending),
                    self.cfg.clone(),
                )?;
                // Extra rails' cards follow over rail 0 (`Channel::connect_rails`).
                let card = prepared.card_rails_in_band()?;
                self.id
                    .connect(&params, &frame(&self.hello, &card.bytes)?)?;
                self.step = Step::Request(Box::new(prepared));
                Ok(None)
            }
            (Step::Request(prepared), CmEventKind::Established) => {
                let peer_card = match parse(&ev.private_data)? {
                    Message::Connect { card, .. } => card.to_vec(),
                    Message::Reject(r) => {
                        return Err(io::Error::new(
                            io::ErrorKind::ConnectionRefused,
                            format!("refused: {r}"),
                        ))
                    }
                };
                self.id.set_established();
                let local = self.id.local_addr()?;
                let channel = prepared.connect(Card {
                    bytes: peer_card,
                    fds: Vec::new(),
                })?;
                Ok(Some(Connected {
                    channel,
                    hello: Vec::new(),
                    local,
                    peer: self.addr,
                }))
            }
            (Step::Address, _) => Err(connect_error(&ev, &self.addr, "resolving the address")),
            (Step::Route, _) => Err(connect_error(&ev, &self.addr, "resolving the route")),
            (Step::Request(_), _) => Err(connect_error(&ev, &self.addr, "connecting")),
            (Step::Spent, _) => Err(io::Error::other("the connector is spent")),
        }
    }
}

/// A request accepted and answered, waiting for `ESTABLISHED`.
struct Accepting {
    id: Arc<CmId>,
    prepared: Prepared<AnyFabric>,
    peer_card: Vec<u8>,
    hello: Vec<u8>,
}

/// What [`CmListener::accept`] found.
pub(crate) enum Accepted {
    /// A connection is up.
    Up(Box<Connected>),
    /// A request whose hello was accepted failed before it was up.
    Failed {
        /// Its hello.
        hello: Vec<u8>,
        /// Why.
        error: io::Error,
    },
}

/// Our end of a request, ready to accept.
struct Answer {
    prepared: Prepared<AnyFabric>,
    reply: Vec<u8>,
    peer_card: Vec<u8>,
    params: crate::fabric::verbs::cm::ConnParams,
    hello: Vec<u8>,
}

/// A listening rdma_cm id and the requests it is answering. Several requests
/// progress at once: one peer that stalls holds up nobody else.
pub(crate) struct CmListener {
    id: CmId,
    channel: Arc<EventChannel>,
    cfg: Config,
    accepting: Mutex<HashMap<usize, Accepting>>,
}

impl CmListener {
    /// The configuration its connections are made with.
    pub(crate) fn config(&self) -> &Config {
        &self.cfg
    }

    /// Listens on `addr` (port 0: a free port, see [`local_addr`](Self::local_addr)).
    ///
    /// # Errors
    ///
    /// `NotFound` without RDMA, `AddrInUse`, `AddrNotAvailable` (not an address of
    /// this host), rdma_cm failures.
    pub(crate) fn bind(addr: &SocketAddr, cfg: Config) -> io::Result<CmListener> {
        cfg.validate()?;
        let listening = || -> io::Result<(Arc<EventChannel>, CmId)> {
            let channel = EventChannel::new()?;
            let id = CmId::new(&channel)?;
            id.set_reuse_addr()?;
            id.bind(addr)?;
            id.listen(BACKLOG)?;
            Ok((channel, id))
        };
        let (channel, id) = listening().map_err(|e| naming(e, "cannot listen at", addr))?;
        Ok(CmListener {
            id,
            channel,
            cfg,
            accepting: Mutex::new(HashMap::new()),
        })
    }

    /// The address listened on (with the port picked for port 0).
    ///
    /// # Errors
    ///
    /// rdma_cm's id has no address (cannot happen once bound).
    pub(crate) fn local_addr(&self) -> io::Result<SocketAddr> {
        self.id.local_addr()
    }

    /// Serves events until a connection is up, or a request whose hello `check`
    /// accepted fails, or `timeout` passed (`None`: no limit; `Duration::ZERO`: only
    /// what is pending). `Ok(None)` at the timeout. `check` decides on the hello of
    /// each request (`Err`: why not, which the peer is told).
    ///
    /// # Errors
    ///
    /// Failures of the event channel itself; a request that fails before `check`
    /// accepted it is refused (the peer hears why) and accepting goes on.
    pub(crate) fn accept(
        &self,
        timeout: Option<Duration>,
        check: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> io::Result<Option<Accepted>> {
        let deadline = timeout.map(|t| Instant::now() + t);
        loop {
            let left = match deadline {
                Some(d) => d.saturating_duration_since(Instant::now()),
                None => Duration::from_secs(3600),
            };
            let Some(mut ev) = self.channel.next(left)? else {
                if deadline.is_some() {
                    return Ok(None);
                }
                continue;
            };
            match ev.kind {
                CmEventKind::ConnectRequest => {
                    if let Some(id) = ev.take_request_id() {
                        if let Some(failed) = self.on_request(Arc::new(id), &ev, check) {
                            return Ok(Some(failed));
                        }
                    }
                }
                CmEventKind::Established => {
                    if let Some(a) = self.take(ev.id_key()) {
                        let hello = a.hello.clone();
                        return Ok(Some(match self.finish(a) {
                            Ok(c) => Accepted::Up(Box::new(c)),
                            // The connection is dropped, which disconnects it: the
                            // peer sees its end fail.
                            Err(error) => Accepted::Failed { hello, error },
                        }));
                    }
                }
                // A request that failed after we answered it.
                CmEventKind::ConnectError
                | CmEventKind::Rejected
                | CmEventKind::Unreachable
                | CmEventKind::Disconnected
                | CmEventKind::DeviceRemoval => {
                    if let Some(a) = self.take(ev.id_key()) {
                        return Ok(Some(Accepted::Failed {
                            hello: a.hello,
                            error: io::Error::new(
                                io::ErrorKind::ConnectionAborted,
                                format!(
                                    "the connection failed before it was up: {}",
                                    ev.describe()
                                ),
                            ),
                        }));
                    }
                }
                _ => {}
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                return Ok(None);
            }
        }
    }

    fn take(&self, key: usize) -> Option<Accepting> {
        self.accepting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .remove(&key)
    }

    /// Answers a connection request, or refuses it with the reason. A request whose
    /// hello `check` accepted but that cannot be answered is reported as failed.
    fn on_request(
        &self,
        id: Arc<CmId>,
        ev: &CmEvent,
        check: &mut dyn FnMut(&[u8]) -> Result<(), String>,
    ) -> Option<Accepted> {
        let hello = match parse(&ev.private_data) {
            Ok(Message::Connect { hello, .. }) => hello.to_vec(),
            Ok(Message::Reject(_)) => {
                let _ = id.reject(&reject_frame("a connection request carrying a rejection"));
                return None;
            }
            Err(e) => {
                let _ = id.reject(&reject_frame(&e.to_string()));
                return None;
            }
        };
        if let Err(why) = check(&hello) {
            let _ = id.reject(&reject_frame(&why));
            return None;
        }
        let a = match self.prepare(&id, &ev.private_data) {
            Ok(a) => a,
            Err(error) => {
                let _ = id.reject(&reject_frame(&error.to_string()));
                return Some(Accepted::Failed { hello, error });
            }
        };
        // Recorded before the reply goes out: another thread accepting on this
        // listener may read the ESTABLISHED that follows it.
        let key = id.as_ptr() as usize;
        self.accepting
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .insert(
                key,
                Accepting {
                    id: id.clone(),
                    prepared: a.prepared,
                    peer_card: a.peer_card,
                    hello: a.hello,
                },
            );
        match id.accept(&a.params, &a.reply) {
            Ok(()) => None,
            Err(error) => {
                drop(self.take(key));
                let _ = id.reject(&reject_frame(&error.to_string()));
                Some(Accepted::Failed { hello, error })
            }
        }
    }

    fn prepare(&self, id: &Arc<CmId>, private: &[u8]) -> io::Result<Answer> {
        let (hello, card) = match parse(private)? {
            Message::Connect { hello, card } => (hello, card.to_vec()),
            Message::Reject(_) => {
                return Err(io::Error::new(
                    io::ErrorKind::InvalidData,
                    "a connection request carrying a rejection",
                ))
            }
        };
        let fabric = VerbsFabric::for_cm_id(id)?;
        let _ = id.set_ack_timeout(fabric.ack_timeout());
        let pending = fabric.create_qp_on(id.clone())?;
        let params = fabric.conn_params();
        let prepared = Prepared::with_pending(
            AnyFabric::Verbs(fabric),
            AnyPending::Verbs(pending),
            self.cfg.clone(),
        )?;
        let reply = frame(&[], &prepared.card_rails_in_band()?.bytes)?;
        Ok(Answer {
            prepared,
            reply,
            peer_card: card,
            params,
            hello: hello.to_vec(),
        })
    }

    /// The connection is established: give it a channel of its own (so that its
    /// queue pair watches its own disconnect events) and connect the engine.
    fn finish(&self, a: Accepting) -> io::Result<Connected> {
        a.id.migrate(EventChannel::new()?)?;
        a.id.set_established();
        let local = a.id.local_addr()?;
        let peer = a.id.peer_addr()?;
        let channel = a.prepared.connect(Card {
            bytes: a.peer_card,
            fds: Vec::new(),
        })?;
        Ok(Connected {
            channel,
            hello: a.hello,
            local,
            peer,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_fit_a_request() {
        let card = [7u8; 38];
        let hello = [1u8; 8];
        let f = frame(&hello, &card).unwrap();
        assert!(f.len() <= crate::fabric::verbs::cm::MAX_REQUEST_PRIVATE);
        let mut padded = f.clone();
        padded.resize(56, 0);
        match parse(&padded).unwrap() {
            Message::Connect { hello: h, card: c } => {
                assert_eq!(h, hello);
                assert_eq!(c, card);
            }
            Message::Reject(_) => panic!("not a reject"),
        }
        match parse(&reject_frame("no room")).unwrap() {
            Message::Reject(r) => assert_eq!(r, "no room"),
            Message::Connect { .. } => panic!("a reject"),
        }
        for bad in [
            &b""[..],
            b"RC",
            b"RC\x01\x01",
            b"XX\x00\x00",
            b"RC\x00\x05abc",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
        }
        assert!(frame(&[0; 256], &[]).is_err());
    }
}
