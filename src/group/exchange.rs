//! How hello cards move between processes: PMI-1 (the C interface's mode a), the
//! caller's callbacks (mode b, in [`crate::ffi`]), or nothing at all for a singleton.

use super::error::{Error, ErrorKind};

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
                ErrorKind::Internal,
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
    Error::new(ErrorKind::Pmi, format!("PMI {what}: {e}"))
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
        self.client
            .as_mut()
            .ok_or_else(|| Error::new(ErrorKind::Pmi, "the PMI connection is already finalised"))
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
