//! How two ends of a connection meet: the exchange of connection cards that turns
//! two [`Prepared`](crate::Prepared) ends into a connected [`Channel`](crate::Channel).
//!
//! * Over a Unix socket (`unix`, on the frames of [`oob`]): cards as frames, with the
//!   emulated fabric's shared-memory descriptors attached; for processes of one
//!   host, on either fabric. One flow (HELLO, ACCEPT, READY) for the stream API and
//!   the process group.
//! * Through rdma_cm (`cm`, feature `verbs`): cards as the private data of the
//!   connection manager's request and reply; for ends on different hosts, addressed
//!   by IP address and port.
//!
//! The stream API ([`crate::RdmaStream`], [`crate::RdmaListener`]) and the process
//! group (the C interface) use both.

#[cfg(feature = "verbs")]
pub(crate) mod cm;
pub mod oob;
pub(crate) mod unix;
