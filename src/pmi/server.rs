//! The server side of PMI-1 for one job: key-value space, barrier, finalize and
//! abort, as pure logic with no I/O.
//!
//! [`PmiServer::handle`] takes one line received from a rank and returns what to do:
//! lines to send (to that rank, or to every rank when a barrier completes), an abort,
//! a finalize. The launcher (`rch-run`, [`super::launch`]) owns the sockets.
//!
//! ```
//! use rdma_channel::pmi::server::{Action, PmiServer};
//!
//! let mut s = PmiServer::new(2, "kvs_demo");
//! for rank in 0..2 {
//!     s.handle(rank, "cmd=init pmi_version=1 pmi_subversion=1")?;
//!     s.handle(rank, &format!("cmd=put kvsname=kvs_demo key=k{rank} value=v{rank}"))?;
//! }
//! assert!(s.handle(0, "cmd=barrier_in")?.is_empty()); // rank 1 is not there yet
//! let out = s.handle(1, "cmd=barrier_in")?;
//! assert_eq!(out.len(), 2); // barrier_out to both
//! let out = s.handle(0, "cmd=get kvsname=kvs_demo key=k1")?;
//! assert_eq!(out, vec![Action::Send { rank: 0, line: "cmd=get_result rc=0 msg=success value=v1\n".into() }]);
//! assert!(s.handle(0, "bogus").is_err());
//! # Ok::<(), std::io::Error>(())
//! ```

use super::wire;
use std::collections::HashMap;
use std::io;

/// `kvsname_max` announced by the server (as Hydra). Like all three limits it counts a
/// terminating NUL: names, keys and values may be one byte shorter.
pub const KVS_NAME_MAX: usize = 256;
/// `keylen_max` announced by the server (as Hydra): keys up to 63 bytes.
pub const KEY_MAX: usize = 64;
/// `vallen_max` announced by the server (as Hydra): values up to 1023 bytes.
pub const VALUE_MAX: usize = 1024;

/// What the caller of [`PmiServer::handle`] must do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Action {
    /// Send `line` (ending in `\n`) to `rank`.
    Send {
        /// The rank to send to.
        rank: u32,
        /// The line, with its `\n`.
        line: String,
    },
    /// `rank` asked to abort the job with exit code `code`.
    Abort {
        /// The rank that asked.
        rank: u32,
        /// The exit code it gave (1 when it gave none).
        code: i32,
        /// Its message (may be empty).
        message: String,
    },
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
enum Phase {
    #[default]
    New,
    Active,
    Finalized,
}

/// PMI-1 state of one job: its ranks' progress, the key-value space and the barrier.
#[derive(Debug)]
pub struct PmiServer {
    kvs_name: String,
    kvs: HashMap<String, String>,
    phase: Vec<Phase>,
    in_barrier: Vec<bool>,
    waiting: usize,
}

fn protocol(rank: u32, msg: String) -> io::Error {
    wire::invalid_data(format!("rank {rank}: {msg}"))
}

impl PmiServer {
    /// A server for `size` ranks whose key-value space is called `kvs_name`. The space
    /// starts with `PMI_process_mapping` = `(vector,(0,1,size))` (all ranks on one
    /// node), which MPICH's own device code asks for.
    ///
    /// # Panics
    ///
    /// When `size` is 0 or `kvs_name` is not a valid PMI token.
    pub fn new(size: u32, kvs_name: &str) -> PmiServer {
        assert!(size > 0, "a PMI job has at least one rank");
        wire::check_token("KVS name", kvs_name, KVS_NAME_MAX - 1).expect("valid KVS name");
        let mut kvs = HashMap::new();
        kvs.insert(
            "PMI_process_mapping".to_owned(),
            format!("(vector,(0,1,{size}))"),
        );
        PmiServer {
            kvs_name: kvs_name.to_owned(),
            kvs,
            phase: vec![Phase::New; size as usize],
            in_barrier: vec![false; size as usize],
            waiting: 0,
        }
    }

    /// The number of ranks.
    pub fn size(&self) -> u32 {
        self.phase.len() as u32
    }

    /// Whether `rank` has sent `init`.
    pub fn initialized(&self, rank: u32) -> bool {
        self.phase[rank as usize] != Phase::New
    }

    /// Whether `rank` has sent `finalize`.
    pub fn finalized(&self, rank: u32) -> bool {
        self.phase[rank as usize] == Phase::Finalized
    }

    /// The ranks now waiting in a barrier.
    pub fn in_barrier(&self) -> impl Iterator<Item = u32> + '_ {
        (0..self.size()).filter(|&r| self.in_barrier[r as usize])
    }

    /// Handles one line (without its `\n`) received from `rank`.
    ///
    /// # Errors
    ///
    /// `InvalidData` naming the rank and the fault when the line is malformed, the
    /// command is unknown or unsupported (`spawn`, name publishing, ...), a required
    /// attribute is missing, the rank sends anything before `init` or after
    /// `finalize`, or enters a barrier twice. The job should then be ended: this
    /// rank's conversation is out of step.
    ///
    /// # Panics
    ///
    /// When `rank >= size`.
    pub fn handle(&mut self, rank: u32, line: &str) -> io::Result<Vec<Action>> {
        let r = rank as usize;
        assert!(r < self.phase.len(), "rank {rank} out of range");
        let m = wire::parse(line.as_bytes()).map_err(|e| protocol(rank, e.to_string()))?;
        let send = |line: String| vec![Action::Send { rank, line }];
        match (self.phase[r], m.cmd.as_str()) {
            (Phase::New, "init") => {
                let v = m
                    .require_int("pmi_version")
                    .map_err(|e| protocol(rank, e.to_string()))?;
                let sub = m
                    .int_or("pmi_subversion", 0)
                    .map_err(|e| protocol(rank, e.to_string()))?;
                let rc = if v == 1 && sub <= 1 { "0" } else { "-1" };
                if rc == "0" {
                    self.phase[r] = Phase::Active;
                }
                return Ok(send(wire::format(
                    "response_to_init",
                    &[("pmi_version", "1"), ("pmi_subversion", "1"), ("rc", rc)],
                )));
            }
            (Phase::New, cmd) => {
                return Err(protocol(rank, format!("sent cmd={cmd} before cmd=init")));
            }
            (Phase::Finalized, cmd) => {
                return Err(protocol(rank, format!("sent cmd={cmd} after cmd=finalize")));
            }
            (Phase::Active, _) => {}
        }
        let need = |key: &str| m.require(key).map_err(|e| protocol(rank, e.to_string()));
        Ok(match m.cmd.as_str() {
            "init" => return Err(protocol(rank, "sent cmd=init twice".into())),
            "get_maxes" => send(wire::format(
                "maxes",
                &[
                    ("kvsname_max", &KVS_NAME_MAX.to_string()),
                    ("keylen_max", &KEY_MAX.to_string()),
                    ("vallen_max", &VALUE_MAX.to_string()),
                ],
            )),
            "get_appnum" => send(wire::format("appnum", &[("appnum", "0")])),
            "get_universe_size" => send(wire::format(
                "universe_size",
                &[("size", &self.size().to_string())],
            )),
            "get_my_kvsname" => send(wire::format("my_kvsname", &[("kvsname", &self.kvs_name)])),
            "put" => {
                let (kvs, key, value) = (need("kvsname")?, need("key")?, need("value")?);
                let (rc, msg) = if kvs != self.kvs_name {
                    ("-1", "unknown_kvsname")
                } else if key.is_empty() || key.len() >= KEY_MAX || value.len() >= VALUE_MAX {
                    // Refused, where Hydra would silently truncate.
                    ("-1", "key_or_value_too_long")
                } else {
                    self.kvs.insert(key.to_owned(), value.to_owned());
                    ("0", "success")
                };
                send(wire::format("put_result", &[("rc", rc), ("msg", msg)]))
            }
            "get" => {
                let (kvs, key) = (need("kvsname")?, need("key")?);
                match self.kvs.get(key).filter(|_| kvs == self.kvs_name) {
                    Some(v) => send(wire::format(
                        "get_result",
                        &[("rc", "0"), ("msg", "success"), ("value", v)],
                    )),
                    None => send(wire::format(
                        "get_result",
                        &[
                            ("rc", "-1"),
                            (
                                "msg",
                                if kvs == self.kvs_name {
                                    "key_not_found"
                                } else {
                                    "unknown_kvsname"
                                },
                            ),
                            ("value", "unknown"),
                        ],
                    )),
                }
            }
            "barrier_in" => {
                if self.in_barrier[r] {
                    return Err(protocol(rank, "entered the barrier twice".into()));
                }
                self.in_barrier[r] = true;
                self.waiting += 1;
                if self.waiting < self.phase.len() {
                    Vec::new()
                } else {
                    self.waiting = 0;
                    self.in_barrier.iter_mut().for_each(|b| *b = false);
                    (0..self.size())
                        .map(|rank| Action::Send {
                            rank,
                            line: "cmd=barrier_out\n".into(),
                        })
                        .collect()
                }
            }
            "finalize" => {
                if self.in_barrier[r] {
                    return Err(protocol(
                        rank,
                        "sent cmd=finalize while in a barrier".into(),
                    ));
                }
                self.phase[r] = Phase::Finalized;
                send("cmd=finalize_ack\n".into())
            }
            "abort" => {
                let code = m
                    .int_or("exitcode", 1)
                    .map_err(|e| protocol(rank, e.to_string()))?;
                let code = i32::try_from(code).unwrap_or(1);
                vec![Action::Abort {
                    rank,
                    code,
                    message: m.get("message").unwrap_or("").to_owned(),
                }]
            }
            cmd => {
                return Err(protocol(
                    rank,
                    format!("sent cmd={cmd}, which this process manager does not support"),
                ))
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn started(n: u32) -> PmiServer {
        let mut s = PmiServer::new(n, "kvs_t");
        for r in 0..n {
            s.handle(r, "cmd=init pmi_version=1 pmi_subversion=1")
                .unwrap();
        }
        s
    }

    fn reply(s: &mut PmiServer, rank: u32, line: &str) -> String {
        match s.handle(rank, line).unwrap().as_slice() {
            [Action::Send { rank: to, line }] if *to == rank => line.clone(),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn handshake_and_kvs() {
        let mut s = PmiServer::new(1, "kvs_t");
        assert!(reply(&mut s, 0, "cmd=init pmi_version=1 pmi_subversion=1").contains("rc=0"));
        assert_eq!(
            reply(&mut s, 0, "cmd=get_maxes"),
            "cmd=maxes kvsname_max=256 keylen_max=64 vallen_max=1024\n"
        );
        assert_eq!(
            reply(&mut s, 0, "cmd=get_my_kvsname"),
            "cmd=my_kvsname kvsname=kvs_t\n"
        );
        assert!(reply(&mut s, 0, "cmd=put kvsname=kvs_t key=a value=b").contains("rc=0"));
        assert!(reply(&mut s, 0, "cmd=get kvsname=kvs_t key=a").ends_with("value=b\n"));
        assert!(reply(&mut s, 0, "cmd=get kvsname=kvs_t key=zz").contains("rc=-1"));
        assert!(reply(&mut s, 0, "cmd=get kvsname=other key=a").contains("rc=-1"));
        assert!(
            reply(&mut s, 0, "cmd=get kvsname=kvs_t key=PMI_process_mapping")
                .contains("(vector,(0,1,1))")
        );
        assert_eq!(reply(&mut s, 0, "cmd=finalize"), "cmd=finalize_ack\n");
        assert!(s.finalized(0));
        assert!(s.handle(0, "cmd=get_maxes").is_err());
    }

    #[test]
    fn refuses_other_versions() {
        let mut s = PmiServer::new(1, "kvs_t");
        assert!(reply(&mut s, 0, "cmd=init pmi_version=2 pmi_subversion=0").contains("rc=-1"));
        assert!(!s.initialized(0));
    }

    #[test]
    fn barrier_releases_everyone_once_all_arrive() {
        let mut s = started(3);
        assert!(s.handle(2, "cmd=barrier_in").unwrap().is_empty());
        assert!(s.handle(0, "cmd=barrier_in").unwrap().is_empty());
        assert_eq!(s.in_barrier().collect::<Vec<_>>(), vec![0, 2]);
        assert!(s.handle(0, "cmd=barrier_in").is_err());
        let out = s.handle(1, "cmd=barrier_in").unwrap();
        assert_eq!(out.len(), 3);
        assert_eq!(s.in_barrier().count(), 0);
        // And again.
        for r in 0..2 {
            assert!(s.handle(r, "cmd=barrier_in").unwrap().is_empty());
        }
        assert_eq!(s.handle(2, "cmd=barrier_in").unwrap().len(), 3);
    }

    #[test]
    fn protocol_faults_are_errors() {
        let mut s = PmiServer::new(2, "kvs_t");
        assert!(s.handle(0, "cmd=get_maxes").is_err());
        let mut s = started(2);
        for bad in [
            "garbage",
            "cmd=spawn",
            "cmd=put kvsname=kvs_t key=a",
            "cmd=init pmi_version=1",
        ] {
            let e = s.handle(1, bad).unwrap_err();
            assert_eq!(e.kind(), io::ErrorKind::InvalidData);
            assert!(e.to_string().starts_with("rank 1: "), "{e}");
        }
    }

    #[test]
    fn abort_carries_code_and_message() {
        let mut s = started(1);
        assert_eq!(
            s.handle(0, "cmd=abort exitcode=7 message=it\\ broke")
                .unwrap(),
            vec![Action::Abort {
                rank: 0,
                code: 7,
                message: "it broke".into()
            }]
        );
    }
}
