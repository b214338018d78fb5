//! Errors of the process group, by kind; the C interface maps each kind to its
//! status code (`ffi/rch.h`). (Its own errors of argument checks, life cycle and
//! waits it makes itself.)

use std::io;

/// What went wrong, in the terms of the C interface's status codes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ErrorKind {
    /// A required pointer argument is NULL.
    Null,
    /// Not a connection of this group.
    UnknownVc,
    /// The connection was closed here.
    VcClosed,
    /// The peer closed the connection.
    PeerClosed,
    /// The peer is gone (died, or its connection failed).
    PeerGone,
    /// A zero-copy transfer is in flight: offer the same buffer again.
    InFlight,
    /// An argument out of range (more bytes consumed than were lent).
    Invalid,
    /// PMI failed.
    Pmi,
    /// A card exchange callback failed.
    Exchange,
    /// The fabric failed.
    Fabric,
    /// Out of memory.
    NoMemory,
    /// The peer sent malformed data.
    Protocol,
    /// A bad `RCH_*` configuration.
    Config,
    /// An operating-system call failed.
    System,
    /// An internal error.
    Internal,
}

/// An error of the process group: a kind and the message `rch_last_error` returns.
#[derive(Debug, Clone)]
pub(crate) struct Error {
    pub(crate) kind: ErrorKind,
    pub(crate) msg: String,
}

impl Error {
    #[cold]
    pub(crate) fn new(kind: ErrorKind, msg: impl Into<String>) -> Error {
        Error {
            kind,
            msg: msg.into(),
        }
    }

    /// An error of a connection (put, read, handshake), from the engine's `io::Error`.
    #[cold]
    pub(crate) fn from_conn(e: &io::Error, what: &str) -> Error {
        use io::ErrorKind as K;
        let kind = match e.kind() {
            K::UnexpectedEof | K::BrokenPipe => ErrorKind::PeerClosed,
            K::ConnectionReset
            | K::ConnectionAborted
            | K::ConnectionRefused
            | K::NotFound
            | K::HostUnreachable
            | K::TimedOut => ErrorKind::PeerGone,
            K::InvalidData => ErrorKind::Protocol,
            K::OutOfMemory => ErrorKind::NoMemory,
            _ => ErrorKind::Fabric,
        };
        Error::new(kind, format!("{what}: {e}"))
    }

    /// An error opening the fabric or reading the configuration.
    #[cold]
    pub(crate) fn from_setup(e: &io::Error, what: &str) -> Error {
        let kind = match e.kind() {
            io::ErrorKind::OutOfMemory => ErrorKind::NoMemory,
            _ => ErrorKind::Fabric,
        };
        Error::new(kind, format!("{what}: {e}"))
    }

    /// An operating-system failure.
    #[cold]
    pub(crate) fn system(e: &io::Error, what: &str) -> Error {
        Error::new(ErrorKind::System, format!("{what}: {e}"))
    }
}
