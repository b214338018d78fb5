//! Mode (b) of the C interface: the caller's publish / lookup / fence callbacks carry
//! the hello cards (an [`Exchange`] of the process group).

use std::ffi::{c_int, c_void, CString};

use super::sys::{rch_exchange, size_t};
use crate::group::error::{Error, ErrorKind};
use crate::group::exchange::Exchange;
use crate::group::hello::CARD_MAX;

/// The callbacks of an `rch_exchange` (mode b).
pub(crate) struct Callbacks {
    ex: rch_exchange,
}

// SAFETY: the callbacks and their context are only used from inside
// rch_init_process_group_external, rch_init and rch_finalize, on the thread that
// calls them (under the library's lock); the header makes keeping `ctx` valid until
// rch_finalize the caller's promise. Moving the pointers between threads moves no
// data.
unsafe impl Send for Callbacks {}

impl Callbacks {
    /// Takes a copy of `ex` after checking that every callback is there.
    pub(crate) fn new(ex: &rch_exchange) -> Result<Callbacks, Error> {
        let missing = [
            ("publish", ex.publish.is_none()),
            ("lookup", ex.lookup.is_none()),
            ("fence", ex.fence.is_none()),
        ];
        if let Some((name, _)) = missing.iter().find(|(_, m)| *m) {
            return Err(Error::new(
                ErrorKind::Null,
                format!("rch_exchange.{name} is NULL"),
            ));
        }
        Ok(Callbacks { ex: *ex })
    }

    fn failed(name: &str, rc: c_int) -> Error {
        Error::new(
            ErrorKind::Exchange,
            format!("the {name} callback failed (returned {rc})"),
        )
    }
}

impl Exchange for Callbacks {
    fn publish(&mut self, key: &str, value: &[u8]) -> Result<(), Error> {
        let k = CString::new(key).expect("keys are ours, without NUL");
        let f = self.ex.publish.expect("checked in new");
        // SAFETY: the caller vouched for the callback and ctx (see `Send` above); the
        // key and value pointers are valid for the call.
        let rc = unsafe {
            f(
                self.ex.ctx,
                k.as_ptr(),
                value.as_ptr().cast(),
                value.len() as _,
            )
        };
        if rc != 0 {
            return Err(Self::failed("publish", rc));
        }
        Ok(())
    }

    fn lookup(&mut self, rank: u32, key: &str) -> Result<Vec<u8>, Error> {
        let k = CString::new(key).expect("keys are ours, without NUL");
        let f = self.ex.lookup.expect("checked in new");
        let mut buf = vec![0u8; CARD_MAX + 1];
        // Poisoned with an impossible length, so that a callback that does not set
        // it is noticed.
        let mut len: size_t = size_t::MAX;
        // SAFETY: as in publish; `buf` has room for `cap` bytes and `len` is a live
        // local.
        let rc = unsafe {
            f(
                self.ex.ctx,
                rank as c_int,
                k.as_ptr(),
                buf.as_mut_ptr().cast::<c_void>(),
                buf.len() as _,
                &mut len,
            )
        };
        if rc != 0 {
            return Err(Error::new(
                ErrorKind::Exchange,
                format!("the lookup callback failed for rank {rank}, key {key:?} (returned {rc})"),
            ));
        }
        if len as usize > buf.len() {
            return Err(Error::new(
                ErrorKind::Exchange,
                format!(
                    "the lookup callback for rank {rank} reported {len} bytes in a buffer of {}",
                    buf.len()
                ),
            ));
        }
        buf.truncate(len as usize);
        Ok(buf)
    }

    fn fence(&mut self) -> Result<(), Error> {
        let f = self.ex.fence.expect("checked in new");
        // SAFETY: as in publish.
        let rc = unsafe { f(self.ex.ctx) };
        if rc != 0 {
            return Err(Self::failed("fence", rc));
        }
        Ok(())
    }
}
