//! The model under test: tunable configurations, the operations and data a case is
//! made of, and the reference model (a `VecDeque<u8>` per direction) they run against.

use super::*;

/// The tunables a case runs with (kept apart from `Config` for readable failure output).
#[derive(Clone, Debug)]
pub(crate) struct Tun {
    pub(crate) ring: usize,
    pub(crate) chunk: usize,
    pub(crate) threshold: usize,
    pub(crate) max_inline: Option<usize>,
    /// Ring offset past which the sender wraps early (the ring size: never).
    pub(crate) working_set: usize,
    /// Size the rings start with (the ring size: fixed rings), growing to `ring`.
    pub(crate) initial: usize,
    /// A grown ring that carried nothing this long shrinks back.
    pub(crate) idle_ms: u64,
}

impl Tun {
    pub(crate) fn new(ring: usize, chunk: usize) -> Tun {
        Tun {
            ring,
            chunk,
            threshold: ring / 4,
            max_inline: None,
            working_set: ring,
            initial: ring,
            idle_ms: 1000,
        }
    }

    pub(crate) fn threshold(mut self, t: usize) -> Tun {
        self.threshold = t;
        self
    }

    pub(crate) fn inline(mut self, i: usize) -> Tun {
        self.max_inline = Some(i);
        self
    }

    pub(crate) fn config(&self) -> Config {
        let c = Config::default()
            .with_ring_size(self.ring)
            .with_initial_ring_size(self.initial)
            .with_ring_idle(Duration::from_millis(self.idle_ms))
            .with_chunk_size(self.chunk)
            .with_tail_threshold(self.threshold)
            .with_working_set(self.working_set)
            // Blocking waits (only the blocking tests use them) poll briefly, then sleep.
            .with_wait_policy(rdma_channel::config::WaitPolicy {
                spin: 200,
                yields: 20,
                short_sleep_max: Duration::from_micros(1000),
                sleep_max: Duration::from_micros(200),
            });
        match self.max_inline {
            Some(i) => c.with_max_inline(i),
            None => c,
        }
    }

    pub(crate) fn pair(&self) -> (RdmaStream, RdmaStream) {
        RdmaStream::pair_with(self.config())
            .unwrap_or_else(|e| panic!("pair_with({self:?}): {}", ioe(&e)))
    }
}

pub(crate) fn tun_strategy() -> impl Strategy<Value = Tun> {
    (12u32..=16)
        .prop_flat_map(|log| {
            let ring = 1usize << log;
            let max_units = ring / 2 / 64;
            let chunk = prop_oneof![
                2 => Just(128usize),
                2 => Just(ring / 2),
                1 => Just(1024usize.min(ring / 2)),
                4 => (2..=max_units).prop_map(|u| u * 64),
            ];
            let threshold = prop_oneof![
                1 => Just(1usize),
                2 => Just(ring - 64),
                1 => Just(ring / 4),
                3 => 1..=ring - 64,
            ];
            let max_inline = prop_oneof![
                3 => Just(None),
                1 => Just(Some(64usize)),
                2 => (64usize..=1024).prop_map(Some),
                1 => (1025usize..=70_000).prop_map(Some),
            ];
            // Early wraps: never, after every packet, or past a random offset.
            let working_set = prop_oneof![
                2 => Just(ring),
                1 => Just(64usize),
                3 => (1..=ring / 64).prop_map(|u| u * 64),
            ];
            // Fixed rings, or rings that start small and grow to `ring`; grown rings
            // shrink back after an idle check or two, or after a second.
            let initial = prop_oneof![
                2 => Just(ring),
                3 => (12..=log).prop_map(|l| 1usize << l),
            ];
            let idle_ms = prop_oneof![2 => Just(0u64), 1 => Just(1000u64)];
            (
                Just(ring),
                chunk,
                threshold,
                max_inline,
                working_set,
                initial,
                idle_ms,
            )
        })
        .prop_map(
            |(ring, chunk, threshold, max_inline, working_set, initial, idle_ms)| Tun {
                ring,
                chunk,
                threshold,
                max_inline,
                working_set,
                initial,
                idle_ms,
            },
        )
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Dir {
    /// A writes, B reads.
    AB,
    /// B writes, A reads.
    BA,
}

impl Dir {
    pub(crate) fn idx(self) -> usize {
        match self {
            Dir::AB => 0,
            Dir::BA => 1,
        }
    }
    /// (writer, reader) stream indices.
    pub(crate) fn ends(self) -> (usize, usize) {
        match self {
            Dir::AB => (0, 1),
            Dir::BA => (1, 0),
        }
    }
}

/// How a put's payload is made.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Data {
    Random,
    Zeros,
    /// Flag words placed so that a correct sender must cut every packet (see
    /// `common::cut_chain`); positions taken from the sender's real head when known.
    Chain {
        lap: u64,
        flags: Flags,
    },
    /// Flag words placed for a sender that would not cut (`common::aligned_flags`).
    Aligned {
        lap: u64,
        flags: Flags,
    },
    /// Random flag words near the estimated positions (`common::flag_soup`).
    Soup {
        density: u64,
    },
}

pub(crate) fn data_strategy() -> impl Strategy<Value = Data> {
    let flags = prop_oneof![Just(Flags::Trailer), Just(Flags::Header), Just(Flags::Both)];
    let lap = prop_oneof![4 => Just(1u64), 1 => 0u64..=3];
    prop_oneof![
        3 => Just(Data::Random),
        1 => Just(Data::Zeros),
        2 => (lap.clone(), flags.clone()).prop_map(|(lap, flags)| Data::Chain { lap, flags }),
        2 => (lap, flags).prop_map(|(lap, flags)| Data::Aligned { lap, flags }),
        2 => (1u64..=16).prop_map(|density| Data::Soup { density }),
    ]
}

/// Payload of `len` bytes for a put at (real or estimated) sender position `head`.
/// Only the first `gen_limit` bytes are generated with the chosen pattern (a single put
/// can never take more than a ring's worth); the rest is zero.
pub(crate) fn gen_data(
    data: Data,
    seed: u64,
    head: u64,
    ring: usize,
    len: usize,
    gen_limit: usize,
) -> Vec<u8> {
    let mut rng = Rng::new(seed);
    let g = len.min(gen_limit);
    let ring = ring as u64;
    let mut v = match data {
        Data::Random => rng.bytes(g),
        Data::Zeros => vec![0u8; g],
        Data::Chain { lap, flags } => cut_chain(&mut rng, head, ring, lap, flags, g),
        Data::Aligned { lap, flags } => aligned_flags(&mut rng, head, ring, lap, flags, g),
        Data::Soup { density } => flag_soup(&mut rng, head, ring, density, g),
    };
    v.resize(len, 0);
    v
}

/// Interesting lengths for a configuration.
pub(crate) fn special_lengths(t: &Tun) -> Vec<usize> {
    let (r, c) = (t.ring, t.chunk);
    let o = ONE_CELL_PAYLOAD;
    let mut v = vec![
        0,
        1,
        7,
        8,
        9,
        o - 1,
        o,
        o + 1,
        63,
        64,
        65,
        2 * CELL - 24,
        2 * CELL - 23,
        c - 25,
        c - 24,
        c - 23,
        c,
        c + 1,
        2 * c - 48,
        2 * c - 47,
        r - 65,
        r - 64,
        r - 63,
        r - 24,
        r,
        r + 1,
        r + 64,
        2 * r,
    ];
    v.sort_unstable();
    v.dedup();
    v
}

pub(crate) fn len_strategy(t: &Tun) -> BoxedStrategy<usize> {
    let specials = special_lengths(t);
    prop_oneof![
        4 => 0usize..=64,
        3 => 0usize..=2048,
        2 => proptest::sample::select(specials),
        1 => 0usize..=3 * t.ring,
    ]
    .boxed()
}

/// An iovec shape: piece lengths. Includes empty lists, empty pieces and many tiny
/// pieces (more than the fabric's gather limit).
pub(crate) fn shape_strategy(t: &Tun) -> BoxedStrategy<Vec<usize>> {
    let len = len_strategy(t);
    prop_oneof![
        12 => vec(len.clone(), 1..=3),
        4 => vec(len, 0..=8),
        1 => vec(0usize..=3, 30..=120),
        1 => vec(Just(1usize), 100..=100),
    ]
    .boxed()
}

#[derive(Clone, Debug)]
pub(crate) enum Op {
    Put {
        dir: Dir,
        shape: Vec<usize>,
        data: Data,
        seed: u64,
    },
    Get {
        dir: Dir,
        shape: Vec<usize>,
    },
    /// `peek`, then `consume` of at most `take` of the lent bytes.
    Peek {
        dir: Dir,
        take: usize,
    },
}

/// How a single-threaded case ends.
#[derive(Clone, Copy, Debug)]
pub(crate) enum End {
    /// Drain both directions, check nothing more arrives and both can still send.
    Drain,
    /// The writer of `Dir` calls `shutdown_write`.
    Shutdown(Dir),
    /// The writer of `Dir` drops its whole stream.
    Drop(Dir),
}

pub(crate) fn dir_strategy(bidir: bool) -> BoxedStrategy<Dir> {
    if bidir {
        prop_oneof![Just(Dir::AB), Just(Dir::BA)].boxed()
    } else {
        Just(Dir::AB).boxed()
    }
}

pub(crate) fn op_strategy(t: &Tun, bidir: bool) -> BoxedStrategy<Op> {
    let put = (
        dir_strategy(bidir),
        shape_strategy(t),
        data_strategy(),
        any::<u64>(),
    )
        .prop_map(|(dir, shape, data, seed)| Op::Put {
            dir,
            shape,
            data,
            seed,
        });
    let get =
        (dir_strategy(bidir), shape_strategy(t)).prop_map(|(dir, shape)| Op::Get { dir, shape });
    let peek = (
        dir_strategy(bidir),
        prop_oneof![0usize..=70, Just(usize::MAX)],
    )
        .prop_map(|(dir, take)| Op::Peek { dir, take });
    prop_oneof![4 => put, 3 => get, 1 => peek].boxed()
}

pub(crate) fn end_strategy(bidir: bool) -> BoxedStrategy<End> {
    let d = dir_strategy(bidir);
    prop_oneof![
        2 => Just(End::Drain),
        1 => d.clone().prop_map(End::Shutdown),
        1 => d.prop_map(End::Drop),
    ]
    .boxed()
}

pub(crate) fn single_case(
    bidir: bool,
    max_ops: usize,
) -> impl Strategy<Value = (Tun, Vec<Op>, End)> {
    tun_strategy().prop_flat_map(move |t| {
        let ops = vec(op_strategy(&t, bidir), 1..=max_ops);
        (Just(t), ops, end_strategy(bidir))
    })
}
