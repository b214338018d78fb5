//! Tests of the channel through its public API, on the fabric `RCH_FABRIC` selects
//! (the in-process emulated fabric by default; `verbs` in the Soft-RoCE VM, see
//! `scripts/softroce-test --fabric verbs`):
//!
//! * model-based property tests (proptest, `properties.rs`): random put/get sequences,
//!   single-threaded (deterministic interleaving, `single_threaded.rs`) and
//!   multi-threaded (`threads.rs`), one or both directions, against a `VecDeque<u8>`
//!   model per direction (`model.rs`), with payloads that are sometimes full of words
//!   equal to ring header/trailer values for current and future laps;
//! * edge cases (`edge_cases.rs`): empty puts/gets, tiny iovec pieces, boundary sizes,
//!   EOF and peer loss; flag-valued payloads (`flag_payloads.rs`);
//! * credit requests and delayed tail updates (`credit.rs`);
//! * "both rings full" deadlock tests, non-blocking and blocking (`deadlock.rs`);
//! * both halves posting into a finite send queue (`send_queue.rs`, emulated fabric).
//!
//! Helpers shared by the last four are in `support.rs`, helpers shared with other
//! test binaries in `../common/`.
//!
//! Every test is bounded in time: polling loops carry generous deadlines and blocking
//! calls run under a watchdog, so a hang fails instead of blocking CI. No assertion is
//! about speed.
//!
//! On the emulated fabric a write is in the peer's ring when `put` returns, and the
//! single-threaded checks rely on that (a `get` right after a `put` must deliver it
//! all). On verbs the NIC places the bytes later, so there those checks poll for at
//! most `common::SETTLE` for what is still in flight (see `common::lands_later`);
//! the properties checked are the same. `RCH_TEST_CASE_SCALE` scales every proptest
//! case count (for slow fabrics).

#[path = "../common/mod.rs"]
mod common;

mod credit;
mod deadlock;
mod edge_cases;
mod flag_payloads;
mod growth;
mod model;
mod properties;
mod send_queue;
mod single_threaded;
mod support;
mod threads;

use std::collections::VecDeque;
use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::collection::vec;
use proptest::prelude::*;
use proptest::test_runner::TestCaseError;

use common::Rng;
use common::*;
use rdma_channel::ring::wire::{header_match, trailer_word, CELL, ONE_CELL_PAYLOAD};
use rdma_channel::{Config, Peeked, RdmaStream};

use model::*;
use single_threaded::*;
use support::*;
use threads::*;
