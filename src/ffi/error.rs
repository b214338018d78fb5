//! Status codes, their messages, and the thread-local detailed message of the last
//! error (`rch_strerror`, `rch_last_error`).

use std::cell::RefCell;
use std::ffi::{c_char, c_int, CStr, CString};

use super::sys::rch_status::{self, Type as Status};

/// An error on its way to C: a status code and the message `rch_last_error` returns.
#[derive(Debug, Clone)]
pub(crate) struct Error {
    pub(crate) code: Status,
    pub(crate) msg: String,
}

impl Error {
    #[cold]
    pub(crate) fn new(code: Status, msg: impl Into<String>) -> Error {
        Error {
            code,
            msg: msg.into(),
        }
    }
}

impl From<crate::group::error::Error> for Error {
    /// The status code of each kind of group error (`ffi/rch.h`).
    #[cold]
    fn from(e: crate::group::error::Error) -> Error {
        use crate::group::error::ErrorKind as K;
        let code = match e.kind {
            K::Null => rch_status::RCH_ERR_NULL,
            K::UnknownVc => rch_status::RCH_ERR_UNKNOWN_VC,
            K::VcClosed => rch_status::RCH_ERR_VC_CLOSED,
            K::PeerClosed => rch_status::RCH_ERR_PEER_CLOSED,
            K::PeerGone => rch_status::RCH_ERR_PEER_GONE,
            K::InFlight => rch_status::RCH_ERR_IN_FLIGHT,
            K::Invalid => rch_status::RCH_ERR_INVALID,
            K::Pmi => rch_status::RCH_ERR_PMI,
            K::Exchange => rch_status::RCH_ERR_EXCHANGE,
            K::Fabric => rch_status::RCH_ERR_FABRIC,
            K::NoMemory => rch_status::RCH_ERR_NO_MEMORY,
            K::Protocol => rch_status::RCH_ERR_PROTOCOL,
            K::Config => rch_status::RCH_ERR_CONFIG,
            K::System => rch_status::RCH_ERR_SYSTEM,
            K::Internal => rch_status::RCH_ERR_INTERNAL,
        };
        Error::new(code, e.msg)
    }
}

thread_local! {
    static LAST: RefCell<CString> = RefCell::new(CString::default());
}

/// Records `e` as this thread's last error and returns its code as C sees it.
#[cold]
pub(crate) fn report(e: Error) -> c_int {
    // Interior NULs cannot come from our messages, but never fail here.
    let msg = CString::new(e.msg.replace('\0', " ")).unwrap_or_default();
    // A thread being torn down has no slot: the code alone is returned then.
    let _ = LAST.try_with(|l| *l.borrow_mut() = msg);
    e.code as c_int
}

/// The message `rch_last_error` returns.
pub(crate) fn last() -> *const c_char {
    LAST.try_with(|l| l.borrow().as_ptr())
        .unwrap_or(c"".as_ptr())
}

/// The constant description of a status code (`rch_strerror`).
pub(crate) fn describe(code: c_int) -> &'static CStr {
    let Ok(code) = Status::try_from(code) else {
        return c"unknown status code";
    };
    match code {
        rch_status::RCH_SUCCESS => c"success",
        rch_status::RCH_ERR_NULL => c"a required pointer argument is NULL",
        rch_status::RCH_ERR_INVALID => c"invalid argument",
        rch_status::RCH_ERR_NOT_INITIALIZED => c"the library is not initialised",
        rch_status::RCH_ERR_FINALIZED => c"the library was finalised",
        rch_status::RCH_ERR_STATE => c"call out of order (already initialised)",
        rch_status::RCH_ERR_UNKNOWN_VC => c"not a connection handle of this library",
        rch_status::RCH_ERR_VC_CLOSED => c"the connection was closed",
        rch_status::RCH_ERR_PEER_CLOSED => c"the peer closed the connection",
        rch_status::RCH_ERR_PEER_GONE => c"the peer is gone (died or its connection failed)",
        rch_status::RCH_ERR_IN_FLIGHT => {
            c"a zero-copy transfer is in flight: offer the same buffer again"
        }
        rch_status::RCH_ERR_PMI => c"PMI error",
        rch_status::RCH_ERR_EXCHANGE => c"a card exchange callback failed",
        rch_status::RCH_ERR_FABRIC => c"fabric error",
        rch_status::RCH_ERR_NO_MEMORY => c"out of memory",
        rch_status::RCH_ERR_TIMEOUT => c"timed out without progress",
        rch_status::RCH_ERR_PROTOCOL => c"protocol error: the peer sent malformed data",
        rch_status::RCH_ERR_CONFIG => c"bad RCH_* configuration",
        rch_status::RCH_ERR_SYSTEM => c"operating-system call failed",
        rch_status::RCH_ERR_INTERNAL => c"internal error in rdma-channel",
        _ => c"unknown status code",
    }
}
