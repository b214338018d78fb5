//! How hello cards move between processes: the caller's callbacks (mode b), PMI-1
//! (mode a), or nothing at all for a singleton.

use std::ffi::{c_int, c_void, CString};

use super::error::Error;
use super::hello::CARD_MAX;
use super::sys::{rch_exchange, rch_status};

/// Publish / lookup / fence, as PMI offers them.
pub(crate) trait Exchange: Send {
    /// Makes `value` visible to every process under (own rank, `key`).
    fn publish(&mut self, key: &str, value: &[u8]) -> Result<(), Error>;
    /// The value `rank` published under `key` (after a fence).
    fn lookup(&mut self, rank: u32, key: &str) -> Result<Vec<u8>, Error>;
    /// A barrier over all processes.
    fn fence(&mut self) -> Result<(), Error>;
    /// Ends the conversation (PMI finalize); called once, at rch_finalize.
    fn finish(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

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
                rch_status::RCH_ERR_NULL,
                format!("rch_exchange.{name} is NULL"),
            ));
        }
        Ok(Callbacks { ex: *ex })
    }

    fn failed(name: &str, rc: c_int) -> Error {
        Error::new(
            rch_status::RCH_ERR_EXCHANGE,
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
        let mut len: super::sys::size_t = super::sys::size_t::MAX;
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
                rch_status::RCH_ERR_EXCHANGE,
                format!("the lookup callback failed for rank {rank}, key {key:?} (returned {rc})"),
            ));
        }
        if len as usize > buf.len() {
            return Err(Error::new(
                rch_status::RCH_ERR_EXCHANGE,
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

/// A process alone (no PMI environment): rank 0 of 1.
#[derive(Default)]
pub(crate) struct Singleton {
    mine: Option<Vec<u8>>,
}

impl Exchange for Singleton {
    fn publish(&mut self, _key: &str, value: &[u8]) -> Result<(), Error> {
        self.mine = Some(value.to_vec());
        Ok(())
    }

    fn lookup(&mut self, rank: u32, key: &str) -> Result<Vec<u8>, Error> {
        match (&self.mine, rank) {
            (Some(v), 0) => Ok(v.clone()),
            _ => Err(Error::new(
                rch_status::RCH_ERR_INTERNAL,
                format!("singleton has no value for rank {rank}, key {key:?}"),
            )),
        }
    }

    fn fence(&mut self) -> Result<(), Error> {
        Ok(())
    }
}

/// PMI-1 (mode a): the process manager's key-value space and barrier.
pub(crate) struct Pmi {
    client: Option<crate::pmi::PmiClient>,
    rank: u32,
}

fn pmi_error(what: &str, e: &std::io::Error) -> Error {
    Error::new(rch_status::RCH_ERR_PMI, format!("PMI {what}: {e}"))
}

impl Pmi {
    /// Connects to the process manager named by the environment; `None` without one.
    pub(crate) fn from_env() -> Result<Option<Pmi>, Error> {
        let client = crate::pmi::PmiClient::from_env().map_err(|e| pmi_error("init", &e))?;
        Ok(client.map(|c| Pmi {
            rank: c.rank(),
            client: Some(c),
        }))
    }

    /// (rank, size, spawned).
    pub(crate) fn identity(&self) -> (u32, u32, bool) {
        let c = self.client.as_ref().expect("until finish");
        (c.rank(), c.size(), c.spawned())
    }

    fn client(&mut self) -> Result<&mut crate::pmi::PmiClient, Error> {
        self.client.as_mut().ok_or_else(|| {
            Error::new(
                rch_status::RCH_ERR_PMI,
                "the PMI connection is already finalised",
            )
        })
    }
}

impl Exchange for Pmi {
    fn publish(&mut self, key: &str, value: &[u8]) -> Result<(), Error> {
        let k = format!("{key}-{}", self.rank);
        let v = std::str::from_utf8(value).expect("hello cards are ASCII");
        self.client()?
            .put(&k, v)
            .map_err(|e| pmi_error(&format!("put {k}"), &e))
    }

    fn lookup(&mut self, rank: u32, key: &str) -> Result<Vec<u8>, Error> {
        let k = format!("{key}-{rank}");
        self.client()?
            .get(&k)
            .map(String::into_bytes)
            .map_err(|e| pmi_error(&format!("get {k}"), &e))
    }

    fn fence(&mut self) -> Result<(), Error> {
        self.client()?
            .barrier()
            .map_err(|e| pmi_error("barrier", &e))
    }

    fn finish(&mut self) -> Result<(), Error> {
        match self.client.take() {
            Some(c) => c.finalize().map_err(|e| pmi_error("finalize", &e)),
            None => Ok(()),
        }
    }
}
