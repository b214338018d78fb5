//! Process management: a PMI-1 client, and the launcher behind `rch-run`.
//!
//! MPI jobs learn who they are and find each other through a process manager. The
//! simple PMI-1 wire protocol is the one every MPICH-compatible process manager
//! speaks (Hydra's `mpiexec.hydra`, Slurm's `--mpi=pmi1`): a text line per request
//! over a socket named by the environment (`PMI_FD`, or `PMI_PORT` + `PMI_ID`), giving
//! rank, size, a job-wide key-value space and a barrier. That is enough to publish each
//! rank's connection card and fetch its peers'.
//!
//! * [`PmiClient`]: the client, used by process-group initialisation;
//! * [`server`]: the protocol's server side as pure logic (key-value space, barrier);
//! * [`launch`]: runs N local ranks and serves them, the core of the `rch-run` binary
//!   (`rch-run -n 4 prog args...`), so no MPI installation is needed.
//!
//! The exchange, as one rank sees it:
//!
//! ```no_run
//! use rdma_channel::pmi::PmiClient;
//!
//! let mut pmi = PmiClient::from_env()?.expect("started by rch-run or mpiexec");
//! pmi.put_bytes(&format!("card-{}", pmi.rank()), b"my connection card")?;
//! pmi.barrier()?;
//! for peer in 0..pmi.size() {
//!     let card = pmi.get_bytes(&format!("card-{peer}"))?;
//!     println!("rank {peer}: {} bytes", card.len());
//! }
//! pmi.finalize()?;
//! # Ok::<(), std::io::Error>(())
//! ```
//!
//! Wire facts this follows (checked against Hydra 4.0.2): the handshake is `init`
//! (answered `response_to_init ... rc=0`), `get_maxes` (Hydra: `kvsname_max=256
//! keylen_max=64 vallen_max=1024`, limits that count C's terminating NUL: Hydra keeps 1023
//! bytes of a longer value and 63 of a longer key, silently), `get_my_kvsname`; a
//! missing key gives
//! `get_result rc=-1`; Hydra makes puts visible only after the next barrier; an
//! unknown command makes Hydra end the job; `abort` gets no answer (the job is killed
//! with the given exit code). With `PMI_PORT`, the client first sends
//! `initack pmiid=<PMI_ID>` and reads `initack`, `set size=`, `set rank=`, `set debug=`.

mod client;
mod conn;
pub mod launch;
pub mod server;
pub(crate) mod wire;

pub use client::{timeout_from_env, PmiClient, DEFAULT_TIMEOUT, TIMEOUT_ENV};
