//! Setting up a connection: [`Prepared`] holds one end's rings and an unconnected
//! queue pair until the peer's card arrives, then builds the [`Channel`].

use std::io;
use std::sync::atomic::{AtomicBool, AtomicU64};
use std::sync::{Arc, Mutex};

use super::card::{CardFlags, ConnCard, CTRL_SIZE};
use super::link::{IncomingRings, Link, Rail, RailDomain, SendQueue};
use super::receiver::Receiver;
use super::sender::{Sender, MAX_SGE};
use super::wait::wait_policy_for;
use super::zerocopy::PushState;
use super::Channel;
use crate::config::Config;
use crate::fabric::{
    Access, Caps, Card, Fabric, MemoryRegion, PendingQp, QueuePair, ZeroCopyThresholds,
};
use crate::rcache::RegCache;
use crate::ring::memory::{
    ControlWords, CtrlWord, RingMemory, StagingBuffer, RAIL_CARDS_MAX, RAIL_CARDS_SLOT,
};
use crate::ring::wire::{Rendezvous, MAX_RNDV_SEGS, OVERHEAD};

/// A connection being set up: create it, send [`card`](Prepared::card) to the peer,
/// then [`connect`](Prepared::connect) with the peer's card.
///
/// ```
/// use std::io::{IoSlice, IoSliceMut};
/// use rdma_channel::fabric::emulated::EmuFabric;
/// use rdma_channel::{Config, Prepared};
///
/// // Two ends in one process; across processes the cards travel over a Unix socket
/// // (see `rdma_channel::oob` and `RdmaStream::handshake`).
/// let a = Prepared::new(EmuFabric::new()?, Config::default())?;
/// let b = Prepared::new(EmuFabric::new()?, Config::default())?;
/// let (card_a, card_b) = (a.card()?, b.card()?);
/// let mut a = a.connect(card_b)?;
/// let mut b = b.connect(card_a)?;
/// assert_eq!(a.put(&[IoSlice::new(b"pipe")])?, 4);
/// let mut buf = [0u8; 4];
/// assert_eq!(b.get(&mut [IoSliceMut::new(&mut buf)])?, 4);
/// assert_eq!(&buf, b"pipe");
/// # Ok::<(), std::io::Error>(())
/// ```
pub struct Prepared<F: Fabric> {
    fabric: F,
    pending: F::Pending,
    ring: RingMemory<F::Region>,
    ctrl: ControlWords<F::Region>,
    cfg: Config,
    /// The queue pair takes wakes (`PendingQp::accept_wakes`), which the card says.
    wakes: bool,
    /// The queue pairs of the rails after rail 0 (`Config::with_rails`), each with
    /// its own protection domain where it is on another device.
    rails: Vec<(F::Pending, Option<F>)>,
}

impl<F: Fabric> Prepared<F> {
    /// Allocates the incoming ring and control region and an unconnected queue pair.
    ///
    /// # Errors
    ///
    /// An invalid `cfg` or a fabric failure.
    pub fn new(fabric: F, cfg: Config) -> io::Result<Prepared<F>> {
        cfg.validate()?;
        let pending = match cfg.rails().first() {
            Some(rail0) => {
                // Rail 0 carries the ring: it is on the connection's own domain.
                if fabric.rail_domain(rail0)?.is_some() {
                    return Err(io::Error::new(
                        io::ErrorKind::InvalidInput,
                        format!(
                            "rail 0 ({rail0}) carries the ring and must be on the \
                             connection's own device; name another device for rails 1 on"
                        ),
                    ));
                }
                let here = crate::config::RailSpec {
                    device: None,
                    port: None,
                    ..rail0.clone()
                };
                fabric.create_rail_qp(&here)?
            }
            None => fabric.create_qp()?,
        };
        Self::prepare(fabric, pending, cfg)
    }

    /// As [`new`](Self::new), with a queue pair the caller created (for instance
    /// through rdma_cm, which connects it while the cards travel).
    ///
    /// # Errors
    ///
    /// An invalid `cfg` or a fabric failure.
    /// # Errors
    ///
    /// An invalid `cfg` or a fabric failure; `InvalidInput` when `cfg` places rail 0
    /// somewhere (a device, a rate): the caller made its queue pair.
    pub fn with_pending(fabric: F, pending: F::Pending, cfg: Config) -> io::Result<Prepared<F>> {
        if let Some(rail0) = cfg.rails().first().filter(|r| !r.is_plain()) {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "rail 0 is the queue pair the caller made; it cannot be placed by the \
                     rail {rail0:?}"
                ),
            ));
        }
        Self::prepare(fabric, pending, cfg)
    }

    fn prepare(fabric: F, mut pending: F::Pending, cfg: Config) -> io::Result<Prepared<F>> {
        cfg.validate()?;
        let wakes = pending.accept_wakes()?;
        let rails = cfg
            .rails()
            .iter()
            .skip(1)
            .map(|spec| match fabric.rail_domain(spec)? {
                Some(domain) => {
                    let here = crate::config::RailSpec {
                        device: None,
                        port: None,
                        ..spec.clone()
                    };
                    Ok((domain.create_rail_qp(&here)?, Some(domain)))
                }
                None => Ok((fabric.create_rail_qp(spec)?, None)),
            })
            .collect::<io::Result<Vec<_>>>()?;
        let rights = Access::LOCAL_WRITE | Access::REMOTE_WRITE;
        let ring = RingMemory::new(fabric.alloc_region(cfg.initial_ring_size(), rights)?)?;
        let ctrl = ControlWords::new(fabric.alloc_region(CTRL_SIZE, rights)?)?;
        Ok(Prepared {
            fabric,
            pending,
            ring,
            ctrl,
            cfg,
            wakes,
            rails,
        })
    }

    /// The card for the peer: the fabric's card plus where our ring and control words are.
    ///
    /// # Errors
    ///
    /// A fabric failure.
    pub fn card(&self) -> io::Result<Card> {
        let fabric_card = self.pending.card()?;
        let flags = self.flags();
        let mut fds = fabric_card.fds;
        let rail_cards = self
            .rails
            .iter()
            .map(|(p, _)| p.card())
            .collect::<io::Result<Vec<Card>>>()?;
        let rails: Vec<(&[u8], usize)> = rail_cards
            .iter()
            .map(|c| (&c.bytes[..], c.fds.len()))
            .collect();
        let bytes = ConnCard::encode_with_rails(
            self.ring.region().remote(),
            self.ctrl.region().remote(),
            flags,
            &fabric_card.bytes,
            &rails,
        )?;
        for c in rail_cards {
            fds.extend(c.fds);
        }
        if fds.len() > crate::fabric::MAX_CARD_FDS {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!(
                    "the rails' cards carry {} descriptors, more than {} can travel",
                    fds.len(),
                    crate::fabric::MAX_CARD_FDS
                ),
            ));
        }
        Ok(Card { bytes, fds })
    }

    /// As [`card`](Self::card), for a handshake with no room for the rails' cards
    /// (rdma_cm's private data): the card only says how many extra rails this end
    /// has, and their cards follow over rail 0 once the channel is up
    /// ([`Channel::connect_rails`], which both ends must then call).
    ///
    /// # Errors
    ///
    /// A fabric failure.
    pub fn card_rails_in_band(&self) -> io::Result<Card> {
        let fabric_card = self.pending.card()?;
        let bytes = ConnCard::encode_with_rails_in_band(
            self.ring.region().remote(),
            self.ctrl.region().remote(),
            self.flags(),
            &fabric_card.bytes,
            self.rails.len(),
        )?;
        Ok(Card {
            bytes,
            fds: fabric_card.fds,
        })
    }

    /// The flags of this end's card.
    fn flags(&self) -> CardFlags {
        // Whether this end may lend part of a transfer sent by threshold: its push
        // share (`start_reads`), the fabric's for either kind of peer unless set.
        let lends = self.cfg.zero_copy_push().map_or_else(
            || {
                self.fabric.zero_copy_push_default(false) > 0
                    || self.fabric.zero_copy_push_default(true) > 0
            },
            |share| share > 0,
        );
        CardFlags {
            wakes: self.wakes,
            lends,
        }
    }

    /// Connects to the peer described by `peer` and returns the channel.
    ///
    /// # Errors
    ///
    /// `InvalidData` for a malformed card (see [`ConnCard::new_checked`]); fabric
    /// failures as they come.
    pub fn connect(self, peer: Card) -> io::Result<Channel<F>> {
        let card = ConnCard::new_checked(&peer.bytes[..])?;
        let (peer_ring, peer_ctrl) = (card.ring(), card.ctrl());
        let peer_rails = card.rails();
        let mut fds = peer.fds;
        let rail_fds: usize = peer_rails.iter().map(|r| r.1).sum();
        if rail_fds > fds.len() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!(
                    "bad connection card: its rails name {rail_fds} descriptors, {} came",
                    fds.len()
                ),
            ));
        }
        let mut later = fds.split_off(fds.len() - rail_fds).into_iter();
        let qp = self.pending.connect(Card {
            bytes: card.fabric_card().to_vec(),
            fds,
        })?;
        // Rails whose cards follow over rail 0 wait for `Channel::connect_rails`: as
        // many as the end with fewer has, which both ends count the same.
        let (own_rails, in_band) = match card.rails_in_band() {
            0 => (self.rails, Vec::new()),
            n => {
                let mut later = self.rails;
                later.truncate(n);
                (Vec::new(), later)
            }
        };
        // As many rails as the end with fewer has; both ends count the same.
        let mut rails = Vec::with_capacity(own_rails.len().min(peer_rails.len()));
        for ((pending, domain), (bytes, nfds)) in own_rails.into_iter().zip(&peer_rails) {
            let rail_qp = pending.connect(Card {
                bytes: bytes.to_vec(),
                fds: later.by_ref().take(*nfds).collect(),
            })?;
            let sq = send_queue_for(&rail_qp.caps());
            let domain = domain.map(|fabric| RailDomain {
                rcache: registration_cache(&fabric, &self.cfg),
                fabric,
            });
            rails.push(Rail {
                qp: rail_qp,
                sq,
                domain,
            });
        }
        if card.wakes() {
            qp.send_wakes();
        }
        let caps = qp.caps();
        let loopback = qp.loopback();
        if caps.max_sge < 4 {
            return Err(io::Error::new(
                io::ErrorKind::Unsupported,
                format!(
                    "fabric allows {} gather entries; the ring needs at least 4",
                    caps.max_sge
                ),
            ));
        }
        let inline_limit = caps
            .max_inline
            .min(self.cfg.max_inline().unwrap_or(usize::MAX));
        // A packet is at most half the peer's ring, so two are always in flight. The
        // peer's first ring is its smallest: it grows from there and shrinks back to it.
        let chunk = self.cfg.chunk_for(peer_ring.len);
        let staging = staging_for(&self.fabric, &self.cfg, inline_limit, peer_ring.len)?;
        // Rails asked for (even one, placed somewhere): large transfers go zero-copy,
        // the path that is striped, and that a rail's rate limit paces.
        let striped = !self.cfg.rails().is_empty();
        let link = Arc::new(Link {
            serial: super::link::next_serial(),
            qp,
            rails: if in_band.is_empty() {
                std::sync::OnceLock::from(rails)
            } else {
                std::sync::OnceLock::new()
            },
            rails_setup: Mutex::new(RailsSetup::new(in_band)),
            left_staging: Mutex::new(Vec::new()),
            incoming: Mutex::new(IncomingRings {
                current: self.ring.clone(),
                offered: None,
            }),
            ctrl: self.ctrl,
            peer_ctrl,
            rx_tail: AtomicU64::new(0),
            rx_explicit: AtomicU64::new(0),
            rx_piggy: AtomicU64::new(0),
            tx_lane_head: AtomicU64::new(0),
            tx_lane_notes: AtomicU64::new(0),
            credit_served: AtomicU64::new(0),
            large_put_at: AtomicU64::new(0),
            ring_copy_in_at: AtomicU64::new(0),
            ring_copy_in_ps: AtomicU64::new(0),
            tx_tail_piggy: AtomicU64::new(0),
            publish: Mutex::new(()),
            sq: send_queue_for(&caps),
            broken: Mutex::new(None),
            is_broken: AtomicBool::new(false),
            zc_thresholds: zero_copy_thresholds(&self.fabric, &self.cfg, loopback, striped),
            zc_adaptive_min: zero_copy_adaptive_min(&self.fabric, &self.cfg),
            zc_push: self
                .cfg
                .zero_copy_push()
                .unwrap_or_else(|| self.fabric.zero_copy_push_default(loopback))
                .min(100),
            // A push share the user set applies to every zero-copy transfer.
            zc_adaptive_push: self
                .cfg
                .zero_copy_push()
                .unwrap_or_else(|| self.fabric.zero_copy_adaptive_push_default(loopback))
                .min(100),
            push: Mutex::new(PushState::default()),
            peer_lends: card.lends(),
            zc_unconfirmed: AtomicU64::new(0),
            zc_receiving: AtomicBool::new(false),
            zc_exchange_at: AtomicU64::new(0),
            lends_served: AtomicU64::new(0),
            rcache: registration_cache(&self.fabric, &self.cfg),
            wait: wait_policy_for(&self.fabric, &self.cfg),
            wakes: self.wakes && self.fabric.blocking_waits_take_wakes(),
            cfg: self.cfg,
            fabric: self.fabric,
        });
        // Rails still to come may each have keys of their own: room for them.
        let keys = link.rail_keys().max(lock_setup(&link).pending.len());
        let max_rndv_segs = ((chunk as usize - OVERHEAD - Rendezvous::encoded_len(0))
            / Rendezvous::encoded_len_with_keys(1, keys)
                .saturating_sub(Rendezvous::encoded_len(0)))
        .clamp(1, MAX_RNDV_SEGS);
        Ok(Channel {
            tx: Sender::new(
                link.clone(),
                peer_ring,
                staging,
                inline_limit,
                caps.max_sge.min(MAX_SGE) - 3,
                max_rndv_segs,
                link.fabric.shares_caches(),
            ),
            rx: Receiver::new(link, self.ring, caps.max_rd_atomic),
        })
    }
}

/// A registered copy of a peer ring of `ring_len` bytes, where packets longer than
/// the inline limit must be assembled before they are written; `None` where every
/// packet goes inline.
pub(super) fn staging_for<F: Fabric>(
    fabric: &F,
    cfg: &Config,
    inline_limit: usize,
    ring_len: u64,
) -> io::Result<Option<StagingBuffer<F::Region>>> {
    if (inline_limit as u64) >= cfg.chunk_for(ring_len) {
        return Ok(None);
    }
    let len = usize::try_from(ring_len)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "ring too large"))?;
    Ok(Some(StagingBuffer::new(
        fabric.alloc_region(len, Access::LOCAL_WRITE)?,
    )?))
}

/// Send-queue accounting for the queue pair's depth: a finite queue is signalled
/// every half depth, so completions keep freeing room; the emulated fabric's queue
/// never fills.
fn send_queue_for(caps: &Caps) -> SendQueue {
    let (depth, interval) = if caps.max_send_wr == usize::MAX {
        (u64::MAX, u64::MAX)
    } else {
        let d = caps.max_send_wr.max(2) as u64;
        (d, (d / 2).max(1))
    };
    SendQueue::new(depth, interval)
}

/// The zero-copy thresholds in force: the configuration's, else the fabric's
/// measured defaults for a peer on the same port (`loopback`) or elsewhere, at most
/// the smallest striped step where rails were asked for (`striped`: only zero-copy
/// transfers are striped).
fn zero_copy_thresholds<F: Fabric>(
    fabric: &F,
    cfg: &Config,
    loopback: bool,
    striped: bool,
) -> ZeroCopyThresholds {
    let mut default = if loopback {
        fabric.zero_copy_loopback_defaults()
    } else {
        fabric.zero_copy_defaults()
    };
    if striped {
        default.alloc_mem = default.alloc_mem.min(cfg.stripe_min());
        default.other = default.other.min(cfg.stripe_min());
    }
    let set = cfg.zero_copy_thresholds();
    let other = match fabric.zero_copy_outnumbered_default() {
        Some(n) if cfg.zero_copy_outnumbered => n.min(default.other),
        _ => default.other,
    };
    ZeroCopyThresholds {
        alloc_mem: set.alloc_mem.unwrap_or(default.alloc_mem).max(1),
        other: set.other.unwrap_or(other).max(1),
    }
}

/// The smallest buffer whose path follows the peer receiver's advice
/// (`usize::MAX`: none): the configuration's, else for a process group the fabric's
/// default.
fn zero_copy_adaptive_min<F: Fabric>(fabric: &F, cfg: &Config) -> usize {
    match cfg.zero_copy_adaptive() {
        Some(n) => n,
        None if cfg.zero_copy_adaptive_by_default => {
            fabric.zero_copy_adaptive_default().unwrap_or(usize::MAX)
        }
        None => usize::MAX,
    }
}

/// The domain's registration cache (shared with every connection of the domain).
fn registration_cache<F: Fabric>(fabric: &F, cfg: &Config) -> Arc<RegCache<F>> {
    RegCache::for_domain(fabric, cfg.registration_cache())
}

fn lock_setup<F: Fabric>(link: &Link<F>) -> std::sync::MutexGuard<'_, RailsSetup<F>> {
    link.rails_setup.lock().unwrap_or_else(|p| p.into_inner())
}

/// Where connecting the rails whose cards follow over rail 0 stands
/// ([`Link::step_rails`]).
pub(crate) struct RailsSetup<F: Fabric> {
    /// Their queue pairs, with their own domains, until connected.
    pub(crate) pending: Vec<(F::Pending, Option<F>)>,
    /// This end's cards and `CtrlWord::RailCards` went out.
    cards_sent: bool,
    /// This end's rails are connected and `CtrlWord::RailsReady` went out.
    ready_sent: bool,
}

impl<F: Fabric> RailsSetup<F> {
    pub(crate) fn new(pending: Vec<(F::Pending, Option<F>)>) -> RailsSetup<F> {
        RailsSetup {
            pending,
            cards_sent: false,
            ready_sent: false,
        }
    }
}

impl<F: Fabric> Link<F> {
    /// Connects the rails whose cards follow over rail 0 (see
    /// [`Channel::connect_rails`]), waiting up to `timeout` for the peer's steps.
    pub(crate) fn connect_rails(&self, timeout: std::time::Duration) -> io::Result<()> {
        let deadline = std::time::Instant::now() + timeout;
        let mut b = super::wait::Backoff::with_policy(self.wait);
        loop {
            if self.step_rails()? {
                return Ok(());
            }
            if std::time::Instant::now() >= deadline {
                let what = if lock_setup(self).ready_sent {
                    "word that its rails are up"
                } else {
                    "its rails' cards"
                };
                return Err(io::Error::new(
                    io::ErrorKind::TimedOut,
                    format!("the peer did not send {what} in time"),
                ));
            }
            b.snooze();
        }
    }

    /// One step of connecting the rails whose cards follow over rail 0, never
    /// waiting: writes this end's rail cards into the peer's control region
    /// (`RAIL_CARDS_SLOT`, then `CtrlWord::RailCards` behind them on the same queue
    /// pair); once the peer's are there, connects the rails and says so
    /// (`CtrlWord::RailsReady`); true once the peer said so too (at once where no
    /// rails' cards follow), so that neither end reads through a rail the other
    /// has not connected.
    pub(crate) fn step_rails(&self) -> io::Result<bool> {
        let mut setup = lock_setup(self);
        if !setup.cards_sent {
            if setup.pending.is_empty() {
                return Ok(true);
            }
            let mut blob = vec![setup.pending.len() as u8];
            for (p, _) in &setup.pending {
                let c = p.card()?;
                if !c.fds.is_empty() {
                    return Err(io::Error::new(
                        io::ErrorKind::Unsupported,
                        "a rail whose card carries descriptors cannot be connected over rail 0",
                    ));
                }
                let len = u16::try_from(c.bytes.len()).map_err(|_| {
                    io::Error::new(io::ErrorKind::InvalidInput, "rail card over 64 KiB")
                })?;
                blob.extend_from_slice(&len.to_le_bytes());
                blob.extend_from_slice(&c.bytes);
            }
            if blob.len() > RAIL_CARDS_MAX || blob.len() > self.qp.caps().max_inline {
                return Err(io::Error::new(
                    io::ErrorKind::Unsupported,
                    format!(
                        "the rails' cards take {} bytes: more than one inline write carries",
                        blob.len()
                    ),
                ));
            }
            self.post_ctrl_bytes(RAIL_CARDS_SLOT, &blob)?;
            self.post_ctrl(CtrlWord::RailCards, blob.len() as u64 + 1)?;
            setup.cards_sent = true;
        }
        if !setup.ready_sent {
            let Some(theirs) = self.ctrl.rail_cards() else {
                self.check_health()?;
                return Ok(false);
            };
            let pending = std::mem::take(&mut setup.pending);
            let cards = parse_rail_cards(&theirs, pending.len())?;
            let mut rails = Vec::with_capacity(pending.len());
            for ((p, domain), bytes) in pending.into_iter().zip(cards) {
                let qp = p.connect(Card {
                    bytes: bytes.to_vec(),
                    fds: Vec::new(),
                })?;
                let sq = send_queue_for(&qp.caps());
                let domain = domain.map(|fabric| RailDomain {
                    rcache: registration_cache(&fabric, &self.cfg),
                    fabric,
                });
                rails.push(Rail { qp, sq, domain });
            }
            let count = rails.len() as u64;
            if self.rails.set(rails).is_err() {
                return Err(io::Error::other("the rails were connected already"));
            }
            self.post_ctrl(CtrlWord::RailsReady, count + 1)?;
            setup.ready_sent = true;
        }
        if self.ctrl.rails_ready() != 0 {
            return Ok(true);
        }
        self.check_health()?;
        Ok(false)
    }
}

/// The peer's rail cards (`[count][per rail: length u16, card]`), which must be
/// `want` of them, the count this end connects too.
fn parse_rail_cards(blob: &[u8], want: usize) -> io::Result<Vec<&[u8]>> {
    let bad =
        |m: String| io::Error::new(io::ErrorKind::InvalidData, format!("bad rail cards: {m}"));
    let (&n, mut rest) = blob.split_first().ok_or_else(|| bad("empty".into()))?;
    if usize::from(n) != want {
        return Err(bad(format!("{n} rails where both ends connect {want}")));
    }
    let mut out = Vec::with_capacity(want);
    for i in 0..want {
        let len = match rest {
            [a, b, ..] => usize::from(u16::from_le_bytes([*a, *b])),
            _ => return Err(bad(format!("rail {} cut short", i + 1))),
        };
        let card = rest
            .get(2..2 + len)
            .ok_or_else(|| bad(format!("rail {} cut short", i + 1)))?;
        out.push(card);
        rest = &rest[2 + len..];
    }
    if !rest.is_empty() {
        return Err(bad(format!("{} bytes after the last rail", rest.len())));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::zero_copy_thresholds;
    use crate::fabric::emulated::EmuFabric;
    use crate::Config;

    /// Heap buffers go zero-copy on the emulated fabric from 1 MiB in an outnumbered
    /// group, never otherwise; a threshold the user set holds in both.
    #[test]
    fn an_outnumbered_group_sends_large_heap_buffers_zero_copy() {
        let fabric = EmuFabric::new().unwrap();
        let mut cfg = Config::default();
        assert_eq!(
            zero_copy_thresholds(&fabric, &cfg, true, false).other,
            usize::MAX
        );
        cfg.zero_copy_outnumbered = true;
        assert_eq!(
            zero_copy_thresholds(&fabric, &cfg, true, false).other,
            1 << 20
        );
        assert_eq!(
            zero_copy_thresholds(&fabric, &cfg, false, false).other,
            1 << 20
        );
        let set = cfg.clone().with_zero_copy_private_threshold(Some(64 << 10));
        assert_eq!(
            zero_copy_thresholds(&fabric, &set, true, false).other,
            64 << 10
        );
        let off = cfg.with_zero_copy_private_threshold(Some(usize::MAX));
        assert_eq!(
            zero_copy_thresholds(&fabric, &off, true, false).other,
            usize::MAX
        );
    }
}
