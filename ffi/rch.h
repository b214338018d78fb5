/*
 * rch.h - the C interface of rdma-channel: the MPICH2 "RDMA channel" (ch3:rdma).
 *
 * This header is the source of truth: the Rust library is built against it (bindgen
 * generates the types and the declarations the exports are checked against).
 *
 * The channel gives every pair of processes a connection ("virtual connection", vc)
 * that is a FIFO byte pipe in each direction, built from one-sided RDMA writes into
 * a ring in the receiver's memory, and an RDMA-READ path that moves large buffers
 * without copying them. The five functions of MPICH2's channel are here under the
 * prefix rch_:
 *
 *   MPIDI_CH3I_RDMA_init_process_group  rch_init_process_group (PMI-1 itself) or
 *                                       rch_init_process_group_external (caller's PMI)
 *   MPIDI_CH3I_RMDA_init                rch_init
 *   MPIDI_CH3I_RMDA_finalize            rch_finalize
 *   MPIDI_CH3I_RDMA_put_datav           rch_put_datav
 *   MPIDI_CH3I_RDMA_read_datav          rch_read_datav
 *
 * plus what an upper layer needs around them: rch_vc_get (the handle of a rank's
 * connection), rch_wait (sleep until a connection can progress), rch_vc_close, error
 * codes with rch_strerror and rch_last_error, and rch_wakeup (end another thread's
 * rch_wait).
 *
 * Life cycle
 * ----------
 *   1. rch_init_process_group() or rch_init_process_group_external(): learn rank and
 *      size, open the fabric, publish this process's "hello" card.
 *   2. rch_init(): wait for every process to publish (a fence) and read their cards.
 *      Every pair is then connected logically: rch_vc_get works for every rank
 *      (including this process's own rank: a loopback connection).
 *   3. rch_put_datav / rch_read_datav / rch_wait on the connections.
 *   4. rch_finalize(): collective (a fence), then every connection is torn down.
 *   Calls out of this order fail with RCH_ERR_NOT_INITIALIZED, RCH_ERR_STATE or
 *   RCH_ERR_FINALIZED; a process initialises the library once (as MPI_Init).
 *
 * Lazy connections
 * ----------------
 * The rings of a pair are allocated only when the pair first communicates: the
 * first rch_put_datav on a vc starts a handshake with the peer and returns 0; the
 * peer answers during any of its own rch_* calls (rch_wait included). Both sides
 * may start at the same moment; the attempt of the lower rank wins. N idle processes
 * therefore cost one listening socket each, not N rings.
 *
 * Which way a pair connects depends on where the peer runs, as in MPI libraries.
 * Every hello card names the process's host (kernel and network namespace). A peer
 * on the same host is reached through a Unix socket named in its card, on the
 * process's fabric (RCH_FABRIC: shared memory by default, or verbs); the handshake
 * carries the connection cards and, for shared memory, the segment descriptors. A
 * peer on another host is reached through rdma_cm on verbs, at the IP address and
 * port its card publishes: every process with an RDMA device that has an IP address
 * (a RoCE v2 IPv4 GID, or IPoIB; RCH_CM_ADDR chooses another) listens for such
 * peers. A process without one can reach only peers of its own host, and a data call
 * on a vc to another host then fails with RCH_ERR_PEER_GONE saying why. The same
 * program therefore runs on one host or many (mpiexec.hydra -hosts a,b ...),
 * unchanged.
 *
 * The data calls
 * --------------
 * rch_put_datav and rch_read_datav never block. Each returns RCH_SUCCESS with
 * *nbytes = the bytes completed by this call (possibly 0); the caller offers the rest
 * again later, with the iov advanced past *nbytes bytes. Bytes arrive in order (FIFO
 * per direction). A put may be cut anywhere (a message is not atomic), and a read
 * returns what has arrived, up to the iov's total length; message boundaries are the
 * upper layer's business (packet headers, as CH3 does).
 *
 * Zero-copy contract. A put may announce a large buffer to the peer instead of
 * copying it; the peer then reads it straight from the caller's memory with RDMA
 * READ. In that case rch_put_datav counts the bytes before that buffer and reports 0
 * for the buffer itself. The caller must call rch_put_datav again with an iov that
 * starts with the same buffers (same addresses and lengths), whose memory it has not
 * modified or freed, until they are counted (the peer has read them all); calling
 * with other buffers first fails with RCH_ERR_IN_FLIGHT. Likewise a read may leave
 * RDMA READs in flight into the caller's buffer and report 0 (or the bytes before
 * it): call rch_read_datav again with an iov that starts at the first byte not yet
 * counted, and do not touch, move or free that buffer until the bytes are counted.
 * A plain upper-layer loop that advances its iov by *nbytes and retries honours both
 * rules. Which buffers go zero-copy is the library's choice (RCH_ZCOPY_THRESHOLD,
 * RCH_ZCOPY_PRIVATE_THRESHOLD, and for large heap buffers the receiver's measure of
 * which path delivers faster, RCH_ZCOPY_ADAPTIVE; see the project README).
 *
 * Threads: every call is serialised by one lock inside the library, so calls from
 * several threads are safe but do not run in parallel (rch_wait releases the lock
 * while it sleeps). The zero-copy rules hold whichever thread retries.
 *
 * Errors: every function returns an rch_status. On an error, rch_last_error() in the
 * same thread gives a message with the details. A connection that failed (peer gone,
 * fabric error, protocol error) stays failed; other connections are unaffected.
 * The library never aborts the process on bad input or a lost peer.
 *
 * Error contract (the same on both fabrics; the Rust API's io::ErrorKind in
 * brackets, see the rdma_channel::stream documentation):
 *   peer closed in order .......... RCH_ERR_PEER_CLOSED  (UnexpectedEof / BrokenPipe)
 *   peer died, queue pair or link
 *   failed, peer's memory refused . RCH_ERR_PEER_GONE    (ConnectionReset; never
 *                                                          another code for a death)
 *   peer unreachable or refused, or
 *   a connection timed out ........ RCH_ERR_PEER_GONE    (ConnectionRefused, TimedOut)
 *   peer broke the protocol ....... RCH_ERR_PROTOCOL     (InvalidData)
 *   out of memory or over the
 *   process limit (RCH_MEMORY_LIMIT) RCH_ERR_NO_MEMORY   (OutOfMemory)
 *   rch_wait without progress ..... RCH_ERR_TIMEOUT      (not a failure)
 *
 * Environment: RCH_FABRIC (emulated | verbs), the RCH_* settings of the channel
 * (ring size, chunk size, wait policy, zero-copy thresholds: see the README),
 * RCH_CM_ADDR and RCH_HOST_ID (see "Lazy connections"), RCH_CONNECT_TIMEOUT_MS (a
 * connection's setup and handshake), RCH_MEMORY_LIMIT (most memory the library
 * commits in the process; default half of RAM, the cgroup's or ulimit -v's limit), RCH_IB_TIMEOUT and RCH_IB_KEEPALIVE_MS (how soon a
 * dead peer on another host is noticed: about keepalive + 7 ACK timeouts, 1.5 s by
 * default), and in rch_init_process_group the PMI-1 variables PMI_FD, PMI_RANK,
 * PMI_SIZE.
 */
#ifndef RCH_H
#define RCH_H

#include <stddef.h>
#include <stdint.h>
#include <sys/uio.h> /* struct iovec */

#ifdef __cplusplus
extern "C" {
#endif

/* Version of this interface. */
#define RCH_VERSION_MAJOR 1
#define RCH_VERSION_MINOR 14

/* The header's inline helpers (the lanes): inlined into the caller's loop even where
 * the compiler judges that loop too large (a call costs such a helper a third of its
 * instructions). */
#if defined(__GNUC__)
#define RCH_INLINE static inline __attribute__((always_inline))
#else
#define RCH_INLINE static inline
#endif

/* Most iovec entries one rch_put_datav / rch_read_datav accepts (IOV_MAX on Linux). */
#define RCH_IOV_MAX 1024

/* Longest hello card this library publishes, in bytes, terminating NUL excluded.
 * Cards are printable ASCII without spaces or '=' (so that a string key-value store
 * such as PMI's can hold them). */
#define RCH_CARD_MAX 255

/* Status codes. Every function returns one; RCH_SUCCESS is 0, errors are positive. */
typedef enum rch_status {
    RCH_SUCCESS = 0,
    /* A required pointer argument was NULL. */
    RCH_ERR_NULL = 1,
    /* An argument is out of range: a negative count or one above RCH_IOV_MAX, an
     * iovec entry with a NULL base and a non-zero length, lengths whose sum overflows,
     * a rank outside [0, size), a size below 1, a timeout below -1, an exchange
     * struct without a callback. */
    RCH_ERR_INVALID = 2,
    /* Called before rch_init_process_group* (or, for connection calls, before
     * rch_init). */
    RCH_ERR_NOT_INITIALIZED = 3,
    /* Called after rch_finalize. */
    RCH_ERR_FINALIZED = 4,
    /* Called in the wrong state: an init function called twice. */
    RCH_ERR_STATE = 5,
    /* The vc pointer is not a handle this library gave out. */
    RCH_ERR_UNKNOWN_VC = 6,
    /* The vc was closed with rch_vc_close. */
    RCH_ERR_VC_CLOSED = 7,
    /* The peer closed the connection in order (rch_vc_close or rch_finalize): a read
     * gets this after every byte the peer sent was read; a put gets it at once. */
    RCH_ERR_PEER_CLOSED = 8,
    /* The peer is gone: it died, or its end of the connection failed. */
    RCH_ERR_PEER_GONE = 9,
    /* A zero-copy transfer is in flight on this vc and the iov does not start with
     * its buffer (see "Zero-copy contract"). Nothing was moved; retry correctly. */
    RCH_ERR_IN_FLIGHT = 10,
    /* PMI failed: no server at PMI_FD, a server that hung up or answered garbage,
     * a bad PMI_* variable. */
    RCH_ERR_PMI = 11,
    /* A callback of rch_exchange returned non-zero or gave a malformed card. */
    RCH_ERR_EXCHANGE = 12,
    /* The fabric failed: it cannot be opened (RCH_FABRIC, no device), a registration
     * or queue pair failed, processes use different fabrics. */
    RCH_ERR_FABRIC = 13,
    /* Out of memory. */
    RCH_ERR_NO_MEMORY = 14,
    /* rch_wait: the timeout passed without progress. Not a failure. */
    RCH_ERR_TIMEOUT = 15,
    /* The peer sent something no correct peer sends (a bad card, ring contents). */
    RCH_ERR_PROTOCOL = 16,
    /* A bad RCH_* setting in the environment. */
    RCH_ERR_CONFIG = 17,
    /* An operating-system call failed (the message names it). */
    RCH_ERR_SYSTEM = 18,
    /* A bug in the library (an internal panic, caught). The library refuses further
     * calls with this code. */
    RCH_ERR_INTERNAL = 19
} rch_status;

/* One connection to one rank (opaque). Handles stay valid until rch_finalize; after
 * it, calls with them return RCH_ERR_FINALIZED. */
typedef struct rch_vc rch_vc;

/* Callbacks through which an upper layer that owns process management moves the hello
 * cards (mode b, rch_init_process_group_external). Each returns 0 on success and
 * non-zero on failure (the library then fails with RCH_ERR_EXCHANGE). They are called
 * only from inside rch_init_process_group_external, rch_init and rch_finalize, from
 * the calling thread; the struct is copied, `ctx` must stay valid until rch_finalize
 * returns. */
typedef struct rch_exchange {
    /* Opaque pointer handed to every callback. */
    void *ctx;
    /* Makes `value` (`len` bytes, printable ASCII, at most RCH_CARD_MAX) visible to
     * every process under (this process's rank, key). `key` is a NUL-terminated
     * string of at most 31 characters [a-z0-9-]; a caller backed by a global store
     * builds its own key from rank and key (e.g. "rch-hello-3"). */
    int (*publish)(void *ctx, const char *key, const void *value, size_t len);
    /* Copies the value published under (rank, key) into `buf` (capacity `cap`) and
     * stores its length in *len. Called only after a fence that followed the
     * publication. Returns non-zero if there is no such value or it does not fit. */
    int (*lookup)(void *ctx, int rank, const char *key, void *buf, size_t cap, size_t *len);
    /* A barrier over all `size` processes: returns once every process called it (as
     * PMI_Barrier). */
    int (*fence)(void *ctx);
} rch_exchange;

/* Mode (a): process management by PMI-1. With PMI_FD, PMI_RANK and PMI_SIZE set (a
 * launcher such as rch-run, MPICH's Hydra or Slurm), the library talks PMI-1 to the
 * launcher itself; without them it runs as a singleton (rank 0 of 1). Stores this
 * process's rank, the number of processes, and whether it was spawned by another
 * job (PMI's "spawned"; MPI_Comm_get_parent). Opens the fabric and publishes this
 * process's hello card in the PMI key-value store.
 * Errors: RCH_ERR_NULL (an output pointer), RCH_ERR_STATE (already initialised),
 * RCH_ERR_FINALIZED, RCH_ERR_PMI, RCH_ERR_FABRIC, RCH_ERR_CONFIG, RCH_ERR_SYSTEM. */
int rch_init_process_group(int *rank, int *size, int *has_parent);

/* Mode (b): the caller owns process management (an MPI whose device already runs
 * PMI; a second PMI client on the same PMI_FD would corrupt that conversation). The
 * caller gives rank and size and the callbacks through which the hello cards move.
 * Publishes this process's card with ex->publish (key "rch-hello").
 * Errors: RCH_ERR_NULL (ex or a callback), RCH_ERR_INVALID (size < 1, rank outside
 * [0, size)), RCH_ERR_STATE, RCH_ERR_FINALIZED, RCH_ERR_EXCHANGE, RCH_ERR_FABRIC,
 * RCH_ERR_CONFIG, RCH_ERR_SYSTEM. */
int rch_init_process_group_external(int rank, int size, const rch_exchange *ex);

/* Connects the processes (logically; see "Lazy connections"): a fence, then every
 * process's card is looked up. Collective: every process calls it.
 * Errors: RCH_ERR_NOT_INITIALIZED, RCH_ERR_STATE (called twice), RCH_ERR_FINALIZED,
 * RCH_ERR_PMI or RCH_ERR_EXCHANGE (a card missing or malformed), RCH_ERR_FABRIC (a
 * process on another fabric). */
int rch_init(void);

/* Collective: a fence (PMI barrier or ex->fence), then every connection is closed
 * and its memory released (the peers' reads see RCH_ERR_PEER_CLOSED after the data
 * sent before). Complete all communication first: zero-copy transfers still in
 * flight are revoked. Afterwards every call returns RCH_ERR_FINALIZED.
 * Errors: RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED (second call), RCH_ERR_PMI or
 * RCH_ERR_EXCHANGE (the fence failed; the library is finalised anyway). */
int rch_finalize(void);

/* This process's rank and the number of processes (after an init).
 * Errors: RCH_ERR_NULL, RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED. */
int rch_rank(int *rank);
int rch_size(int *size);

/* The connection to `rank` (its own rank included) in *vc.
 * Errors: RCH_ERR_NULL, RCH_ERR_INVALID (rank outside [0, size)),
 * RCH_ERR_NOT_INITIALIZED (before rch_init), RCH_ERR_FINALIZED. */
int rch_vc_get(int rank, rch_vc **vc);

/* The rank at the other end of `vc`.
 * Errors: RCH_ERR_NULL, RCH_ERR_UNKNOWN_VC, RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED. */
int rch_vc_rank(rch_vc *vc, int *rank);

/* Non-blocking put (MPIDI_CH3I_RDMA_put_datav): sends what fits of the `n` buffers
 * of `iov`, in order, and stores the number of bytes completed in *nbytes (possibly
 * 0: ring full, connection being set up, or a zero-copy transfer announced and not
 * yet read; see the contract above). Entries with length 0 are skipped (their base
 * may be NULL); n == 0 is a no-op.
 * Errors: RCH_ERR_NULL (vc, nbytes, or iov with n > 0), RCH_ERR_INVALID (n < 0,
 * n > RCH_IOV_MAX, a NULL base with a non-zero length, a total above SSIZE_MAX),
 * RCH_ERR_UNKNOWN_VC, RCH_ERR_VC_CLOSED, RCH_ERR_PEER_CLOSED, RCH_ERR_PEER_GONE,
 * RCH_ERR_IN_FLIGHT, RCH_ERR_FABRIC, RCH_ERR_PROTOCOL, RCH_ERR_NOT_INITIALIZED,
 * RCH_ERR_FINALIZED. *nbytes is 0 after an error. */
int rch_put_datav(rch_vc *vc, const struct iovec *iov, int n, size_t *nbytes);

/* As rch_put_datav, but a buffer that goes zero-copy is counted at once, and the
 * call goes on with the buffers after it: the buffer is lent. It must stay mapped and
 * unmodified until rch_lends_released reports *ticket or more; the peer reads lent
 * buffers in stream order while this end sends on, so a window of large sends is read
 * back to back rather than one per round trip. *ticket is the ticket of the last
 * buffer this call lent (tickets grow by one per transfer), or 0 when it lent none.
 * At most 64 transfers are lent at a time: a call that meets the limit stops before
 * the buffer it would lend (*nbytes counts what went before it). Mixed with
 * rch_put_datav on one vc, the zero-copy contract above holds for rch_put_datav's
 * announcements. Since interface 1.12.
 * Errors: as rch_put_datav (RCH_ERR_NULL for `ticket` NULL); *nbytes and *ticket
 * are 0 after an error. After an error on vc every lent buffer is revoked (the peer
 * can no longer read it) and may be reused. */
int rch_put_lend(rch_vc *vc, const struct iovec *iov, int n, size_t *nbytes,
                 uint64_t *ticket);

/* Stores in *ticket the last ticket of vc's whose buffers are the caller's again:
 * every buffer rch_put_lend lent under it or a lower ticket (0 before any was
 * released). Serves the peer's pushes of lent buffers (RCH_ZCOPY_PUSH), so a caller
 * with buffers lent calls it, or rch_wait, until they are released. Never blocks;
 * rch_wait returns when a lent buffer can be released. Since interface 1.12.
 * Errors: RCH_ERR_NULL, RCH_ERR_UNKNOWN_VC, RCH_ERR_VC_CLOSED, the connection's
 * error (its lent buffers are revoked then and may be reused),
 * RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED. */
int rch_lends_released(rch_vc *vc, uint64_t *ticket);

/* Non-blocking read (MPIDI_CH3I_RDMA_read_datav): fills the `n` buffers of `iov`, in
 * order, with bytes that have arrived and stores their number in *nbytes (possibly 0).
 * May leave RDMA READs in flight into the buffers (see the contract above).
 * Errors: as rch_put_datav; RCH_ERR_PEER_CLOSED once the peer closed and every byte
 * it sent was read. */
int rch_read_datav(rch_vc *vc, const struct iovec *iov, int n, size_t *nbytes);

/* As rch_read_datav into one buffer, but copies only bytes that have arrived in the
 * connection's ring: it stops before a zero-copy transfer instead of starting its
 * RDMA READs, so it never leaves reads in flight and `buf` may be a scratch buffer
 * the caller reuses at once. For an upper layer that reads ahead into a staging
 * buffer (several small packets per call) yet wants large transfers to land straight
 * in their destination: when it returns fewer bytes than `len`, a zero-copy transfer
 * may be next, to be read with rch_read_datav into its destination. Since interface
 * 1.1.
 * Errors: as rch_read_datav (RCH_ERR_NULL for `buf` NULL with `len` > 0,
 * RCH_ERR_INVALID for `len` above SSIZE_MAX), and RCH_ERR_IN_FLIGHT while reads
 * started by rch_read_datav are in flight (finish them with rch_read_datav first). */
int rch_read_buffered(rch_vc *vc, void *buf, size_t len, size_t *nbytes);

/* Lends the bytes at the front of vc's stream where the peer's RDMA writes put them
 * in this process's ring: no copy. On RCH_SUCCESS *bytes and *len are those bytes
 * (at most the rest of one packet the peer put, so a message may come in parts);
 * *len is 0 and *bytes NULL when nothing has arrived, or when a zero-copy transfer is
 * next, which only rch_read_datav reads (then *zero_copy_left, if not NULL, is its
 * number of bytes still to read, else 0). The same bytes are lent again until
 * rch_consume passes them. For an upper layer that decodes a packet where it lies:
 * a header it parses, a payload its handler copies once to its destination.
 * The bytes stay in place and unchanged (by a peer that keeps to the protocol) until
 * rch_consume, rch_read_datav or rch_read_buffered on vc passes them, or rch_vc_close
 * or rch_finalize; calls on other connections, puts on vc, rch_wait and
 * rch_poll_ready leave them. They are the peer's to write, as any RDMA receive
 * buffer: treat them as input from the network. Since interface 1.4.
 * Errors: as rch_read_buffered (RCH_ERR_NULL for `bytes` or `len` NULL). */
int rch_peek(rch_vc *vc, const void **bytes, size_t *len, size_t *zero_copy_left);

/* Marks the first `n` bytes rch_peek lent on vc as read; their ring space goes back
 * to the peer as after a read. rch_consume(vc, 0) does nothing. Since interface 1.4.
 * Errors: RCH_ERR_INVALID, with nothing consumed, when `n` is more than rch_peek lent
 * and no read has passed since; otherwise as rch_read_buffered. */
int rch_consume(rch_vc *vc, size_t n);

/* rch_consume(vc, n), then rch_peek(vc, bytes, len, zero_copy_left), in one call: for
 * a layer that handles packets in place, one library entry per packet. When the
 * consume fails nothing is peeked (*len 0, *bytes NULL). Since interface 1.4.
 * Errors: as rch_consume, then as rch_peek. */
int rch_consume_peek(rch_vc *vc, size_t n, const void **bytes, size_t *len,
                     size_t *zero_copy_left);

/* Most words one rch_watch compares. */
#define RCH_WATCH_WORDS 6

/* A connection's quiet state, for a progress loop that looks at a busy connection
 * on every pass: the words (in the ring and the control block the peer writes) whose
 * change means the connection may have something for the library to do, with the
 * values they had when rch_consume_peek_watch found nothing. Test it with
 * rch_watch_quiet instead of calling the library; while it says quiet, a call would
 * have found nothing either, except what only a call notices (a failure found
 * elsewhere, the library's periodic upkeep), which is why a watch runs out after a
 * few tests. `count` is 0 when there is nothing to watch (call again). */
typedef struct rch_watch {
    const volatile uint64_t *word[RCH_WATCH_WORDS];
    uint64_t value[RCH_WATCH_WORDS];
    int count;      /* words to compare, at most RCH_WATCH_WORDS */
    int tests_left; /* quiet answers left before the library must be called */
} rch_watch;

/* rch_consume_peek, and when it lends nothing and the connection is quiet, fills
 * *watch (if not NULL) so that the caller may test it on the next passes instead of
 * calling again; else sets watch->count and watch->tests_left to 0. The words stay
 * readable until the next rch_consume_peek_watch, rch_consume_peek, rch_peek,
 * rch_consume, rch_read_datav or rch_read_buffered on vc, or rch_vc_close or
 * rch_finalize: call one of them once rch_watch_quiet says 0. Other calls (on other
 * connections, puts, rch_wait, rch_poll_ready) may move the connection on (a
 * packet read ahead, a new ring taken); the watch then says quiet until it runs out,
 * never longer. Since interface 1.5.
 * Errors: as rch_consume_peek; the watch is empty after an error. */
int rch_consume_peek_watch(rch_vc *vc, size_t n, const void **bytes, size_t *len,
                           size_t *zero_copy_left, rch_watch *watch);

/* 1 while the connection rch_consume_peek_watch left `watch` for is still quiet:
 * every word holds its value and the watch has tests left (each 1 uses one). 0 once
 * a word changed or the tests ran out: call the library (rch_consume_peek_watch) to
 * look. A handful of loads, no call: a progress pass over busy connections pays this
 * instead of a library call per connection. Since interface 1.5. */
static inline int rch_watch_quiet(rch_watch *watch)
{
    int i;
    if (watch->tests_left <= 0 || watch->count <= 0)
        return 0;
    for (i = 0; i < watch->count; i++) {
#if defined(__GNUC__)
        /* Relaxed: a hint; the library's own look orders what it then reads. */
        uint64_t now = __atomic_load_n(watch->word[i], __ATOMIC_RELAXED);
#else
        uint64_t now = *watch->word[i];
#endif
        if (now != watch->value[i]) {
            watch->tests_left = 0;
            return 0;
        }
    }
    watch->tests_left--;
    return 1;
}

/* A quiet connection's watch, and with it a look at the ring cell where the next
 * packet will start: rch_lane_packet finds a packet of plain data that landed there
 * whole, and lends it, without calling the library. For a progress loop whose
 * critical path is the wait for the next message: the message is handled where it
 * landed at once, and the library's share (taking the packet's acknowledgement,
 * giving its space back) is done by the next rch_consume_peek_lane, off that path.
 * Filled by rch_consume_peek_lane; the fields are the library's, to be read only
 * through rch_lane_packet and rch_watch_quiet. Since interface 1.6. */
typedef struct rch_lane {
    rch_watch watch;               /* word[0] and word[1] are the cell's first two words */
    const volatile uint64_t *cell; /* the cell where the next packet starts; NULL: none */
    uint64_t pos;                  /* its position in the connection's stream of cells */
    uint64_t room;                 /* bytes it may move over: to the ring's end, and
                                      since 1.13 at most RCH_LANE_PASS_BYTES_MAX + one
                                      cell from where the library filled it */
    int lent;                      /* the cells of the packet rch_lane_packet lent; 0: none */
    int passed;                    /* packets rch_lane_next passed since the lane was filled */
} rch_lane;

/* rch_consume_peek_watch with a lane: first the packets rch_lane_next passed
 * (lane->passed, whole), then `n` counts from the packet lent last (lane->lent), if
 * one was, else from the bytes the previous call lent (none when packets were
 * passed: `n` is 0 then). Before anything else the call empties *lane (if not NULL);
 * when it lends nothing and the connection is quiet it fills it again: lane->watch
 * as rch_consume_peek_watch fills its watch, and the cell the next packet will start
 * in. When it lends a whole packet of plain data it fills the lane too, with that
 * packet as lent (lane->lent; its tests spent), so that rch_lane_next can go on past
 * it. The lane's words stay readable as long as the watch's. Since interface 1.6;
 * passed packets, and the lane after a whole packet, since 1.8.
 * Errors: as rch_consume_peek_watch; RCH_ERR_INVALID, with nothing consumed, when
 * `n` is more than the packet the lane lent (with the passed packets consumed), or
 * when fewer plain data packets than lane->passed are at the read position. The lane
 * is empty after an error. */
int rch_consume_peek_lane(rch_vc *vc, size_t n, const void **bytes, size_t *len,
                          size_t *zero_copy_left, rch_lane *lane);

/* Copies `len` bytes at `src`, bytes of vc's that rch_consume_peek_lane (or
 * rch_peek, or rch_lane_packet) lent and not yet given back, to `dst`, as memcpy
 * would, and lets the library time the copy: where it chooses the path of large
 * messages by measurement (a process group on one host), a caller that copies lent
 * messages out itself shows it what the ring costs. For copies of a message's data;
 * a copy the library does not time costs it a call over memcpy. The bytes are copied
 * even when the call fails with the connection's error. Since interface 1.11.
 * Errors: RCH_ERR_NULL (`dst` or `src` NULL with `len` > 0), RCH_ERR_INVALID (the
 * two ranges overlap), RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED,
 * RCH_ERR_UNKNOWN_VC, and the connection's error (as rch_read_datav). */
int rch_copy_lent(rch_vc *vc, void *dst, const void *src, size_t len);

/* The packet format rch_lane_packet reads (the library's ring wire format): a full
 * packet is a header word (tag 0xA in the top 4 bits, kind, 24-bit length, 32-bit
 * stamp: the cell number), an acknowledgement word (lowest bit set, top 4 bits 0),
 * the payload, and in its last cell's last word a trailer (a key xor the position
 * where the packet ends); a short packet (1-8 bytes) is a payload word and a short
 * header (tag 0x5, length, 24-bit acknowledgement, stamp). */
#define RCH_LANE_CELL 64u
#define RCH_LANE_OVERHEAD 24u /* a full packet's header and ack words, and trailer */
#define RCH_LANE_FULL_TAG 0xAull
#define RCH_LANE_SHORT_TAG 0x5ull
#define RCH_LANE_STAMP_MASK 0xffffffffull
#define RCH_LANE_TRAILER_KEY 0xC3A596E15A0F7B2Dull

/* 1 when a packet of plain data has landed whole in lane's cell: *bytes and *len are
 * its payload, where it landed (valid as rch_peek's bytes, until the next read call
 * on the connection), and lane->lent is set: pass how much of it was read as `n` to
 * the next rch_consume_peek_lane, or move on with rch_lane_next when all was read.
 * The lane is then spent (the next test says -1) until rch_lane_next moves it on.
 * 0 while the connection is quiet, as rch_watch_quiet's 1 (each 0 uses a test).
 * -1 when the library must be called (rch_consume_peek_lane): the lane is empty or
 * spent, its tests ran out, a watched word other than the cell's changed while
 * nothing landed in the cell (since 1.9; before, also when a packet had), or what
 * landed is not plain data (the library reads it). A handful of loads, no call.
 * Since interface 1.6. */
RCH_INLINE int rch_lane_packet(rch_lane *lane, const void **bytes, size_t *len)
{
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    rch_watch *w = &lane->watch;
    uint64_t first, second, stamp, end, n, cells;
    int i;

    if (w->tests_left <= 0 || w->count < 2 || lane->cell == NULL || lane->lent)
        return -1;
    w->tests_left--;
    /* Acquire on the second word: a short header is the last word of its write, so
     * once it is seen so is the payload word before it. */
    second = __atomic_load_n(&lane->cell[1], __ATOMIC_ACQUIRE);
    first = __atomic_load_n(&lane->cell[0], __ATOMIC_RELAXED);
    if ((first | second) == 0) {
        /* Nothing landed: then a watched word that changed is news only the
         * library reads (a credit or lend request, the end). Looked at only here:
         * a packet that landed comes first, and the library is called at the latest
         * after RCH_LANE_PASS_MAX packets of a burst, whose cells only it gives back
         * (so a credit request could not be served earlier anyway). */
        for (i = 2; i < w->count; i++) {
            /* Relaxed: a hint, as in rch_watch_quiet. */
            if (__atomic_load_n(w->word[i], __ATOMIC_RELAXED) != w->value[i]) {
                w->tests_left = 0;
                return -1;
            }
        }
        return 0;
    }
    stamp = (lane->pos / RCH_LANE_CELL) & RCH_LANE_STAMP_MASK;
    if ((second & 1) == 0 || (second >> 60) != 0) {
        /* Not an acknowledgement: a short header, or nothing yet (a short packet's
         * payload seen before its header). */
        if ((second >> 60) != RCH_LANE_SHORT_TAG || (second & RCH_LANE_STAMP_MASK) != stamp)
            return 0;
        n = (second >> 56) & 0xf;
        if (n == 0 || n > 8) {
            w->tests_left = 0;
            return -1;
        }
        *bytes = (const void *) lane->cell;
        cells = 1;
    } else {
        /* A full header counts once its acknowledgement word is there (above). */
        if ((first & (0xfull << 60 | RCH_LANE_STAMP_MASK)) != (RCH_LANE_FULL_TAG << 60 | stamp))
            return 0;
        n = (first >> 32) & 0xffffff;
        cells = (n + RCH_LANE_OVERHEAD + RCH_LANE_CELL - 1) / RCH_LANE_CELL;
        if (((first >> 56) & 0xf) != 1 || n == 0 || cells * RCH_LANE_CELL > lane->room) {
            w->tests_left = 0; /* not data, or an error the library reports */
            return -1;
        }
        end = lane->pos + cells * RCH_LANE_CELL;
        /* Acquire: the trailer is the last word of the write; once it is seen, the
         * whole packet is. */
        if (__atomic_load_n(&lane->cell[cells * (RCH_LANE_CELL / 8) - 1], __ATOMIC_ACQUIRE) !=
            (RCH_LANE_TRAILER_KEY ^ end))
            return 0;
        /* A header read while it was being written may have pointed at a wrong
         * trailer: read it again now that the packet is whole. */
        if (__atomic_load_n(&lane->cell[0], __ATOMIC_RELAXED) != first)
            return 0;
        *bytes = (const void *) (lane->cell + 2);
    }
    *len = (size_t) n;
    lane->lent = (int) cells;
    w->tests_left = 0;
    return 1;
#else
    (void) lane;
    (void) bytes;
    (void) len;
    return -1;
#endif
}

/* Most packets rch_lane_next passes before the library must be called: it gives
 * their ring space back to the sender, so a burst does not hold the ring long. */
#define RCH_LANE_PASS_MAX 64

/* Most ring bytes a burst of packets of one size may hold once passed: a passed
 * packet's space goes back to the sender only at the next library call, and 64
 * passed packets of 16 KiB held 1 MiB of ring in a 16 KiB two-way exchange (the
 * sender found the ring full, and it grew to 4 MiB, milliseconds of page faults
 * inside the exchange). rch_lane_next passes a packet while the packets passed and
 * it fit in this, whatever their sizes; a packet bigger than this is left to the
 * library (rch_lane_packet says -1). Since interface 1.13. */
#define RCH_LANE_PASS_BYTES_MAX 65536u

/* After rch_lane_packet lent a packet of `len` bytes and the caller read `n` of them:
 * when that is all of it, moves the lane on to the cell after the packet, so that
 * rch_lane_packet can lend the next packet of a burst without a call too; the next
 * rch_consume_peek_lane consumes every packet passed so, in one call (with `n` 0, or
 * the bytes read of a packet lent after them). Returns 1 when the lane moved on (the
 * packet now counts in lane->passed); 0 when it did not: `n` is not all of the
 * packet, the ring's end comes next, RCH_LANE_PASS_MAX packets were passed or
 * RCH_LANE_PASS_BYTES_MAX would be passed (since 1.13), or no packet is lent.
 * Then pass `n` to rch_consume_peek_lane as before. The lane keeps
 * only a few tests, so a connection that goes quiet after a burst calls the library
 * soon. No call. Since interface 1.8. */
RCH_INLINE int rch_lane_next(rch_lane *lane, size_t n, size_t len)
{
    uint64_t step;

    if (lane->lent <= 0 || n != len || lane->passed >= RCH_LANE_PASS_MAX ||
        lane->watch.count < 2)
        return 0;
    step = (uint64_t) lane->lent * RCH_LANE_CELL;
    /* The library bounds the room to RCH_LANE_PASS_BYTES_MAX and a cell: a step that
     * leaves none would end at the ring's end or pass more than that. */
    if (step >= lane->room)
        return 0;
    lane->cell += step / sizeof(uint64_t);
    lane->pos += step;
    lane->room -= step;
    lane->watch.word[0] = lane->cell;
    lane->watch.word[1] = lane->cell + 1;
    lane->lent = 0;
    lane->passed++;
    lane->watch.tests_left = 2;
    return 1;
}

/* A connection's send lane: where the caller writes a small message into the peer's
 * ring itself, without a call, on a fabric whose rings this process maps (the
 * emulated one, between processes of one host); on others it stays closed and every
 * message takes rch_put_datav. The lane is the library's sending state (its head is
 * the connection's), which the library keeps open after each put with room up to
 * what it knows the peer has read and to the end of the ring's current lap, and
 * closes while nothing may be written without it (a zero-copy transfer in flight,
 * the end of the stream, a new ring offered, a failure). Library-owned: read and
 * written only through rch_lane_send, from one thread, never while another rch_*
 * call on the same connection runs or while another thread is in rch_wait or
 * rch_poll_ready; valid (possibly closed) until rch_finalize. Since interface 1.7. */
typedef struct rch_send_lane {
    volatile uint64_t *ring;        /* the peer's ring as mapped here; NULL: closed */
    uint64_t mask;                  /* ring bytes - 1 */
    uint64_t head;                  /* stream position of the next packet */
    uint64_t end;                   /* lane packets end at or before this position */
    uint64_t max_payload;           /* largest payload of one lane packet */
    const volatile uint64_t *ack;   /* this end's receive tail, carried in each packet */
    volatile uint64_t *acked;       /* the highest tail carried so far */
    const volatile uint64_t *bell;  /* the peer's requests to ring its doorbell */
    uint64_t bell_seen;             /* the last request answered */
    const volatile uint64_t *changes; /* the peer's count of registration changes */
    uint64_t changes_seen;          /* its value while `ring` is known good */
    rch_vc *vc;                     /* the connection */
} rch_send_lane;

/* The send lane of the connection `vc` in *lane once the connection is up and its
 * handshake done (a put has gone through), else NULL (ask again after a put). The
 * pointer stays valid until rch_finalize; the same for every call. Since interface
 * 1.7.
 * Errors: RCH_ERR_NULL (vc or lane), RCH_ERR_UNKNOWN_VC, RCH_ERR_INVALID (the
 * process's own connection: its loopback has no lane), RCH_ERR_NOT_INITIALIZED,
 * RCH_ERR_FINALIZED; *lane is NULL after an error. */
int rch_vc_send_lane(rch_vc *vc, rch_send_lane **lane);

/* After packets written through vc's lane: rings the peer's doorbell if it asked
 * for it since it was last rung (rch_lane_send calls this itself when it sees the
 * request), watches the connection closely as a put does, and opens the lane again
 * with the room the library knows of now (a call when rch_lane_send returned 0
 * because its room ran out). Since interface 1.7.
 * Errors: as rch_vc_send_lane's (a failed connection is reported by the next put
 * or read, as after a write the fabric lost). */
int rch_lane_ring(rch_vc *vc);

/* Writes one message of alen + blen bytes (a, then b; either may be 0 long with a
 * NULL pointer) through `lane` (from rch_vc_send_lane, never NULL) as one packet of the ring's wire format (see
 * rch_lane_packet): 1 when it was written whole, as rch_put_datav of the same bytes
 * would have; 0 when it was not written at all: the lane is closed, the message is
 * empty or longer than lane->max_payload, its room ran out, or the peer's memory
 * changed since the lane was opened: put it with rch_put_datav, which opens the
 * lane again. The bytes may be reused at once. A handful of stores and a copy, no
 * call but rch_lane_ring when the peer asked for its doorbell. Since interface 1.7. */
static inline int rch_lane_send(rch_send_lane *lane, const void *a, size_t alen, const void *b,
                                size_t blen)
{
#if defined(__GNUC__) && defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    uint64_t len = (uint64_t) alen + (uint64_t) blen, head, bytes, end, ack;
    volatile uint64_t *cell;
    char *payload;

    if (lane->ring == NULL || len == 0 || len > lane->max_payload)
        return 0;
    head = lane->head;
    bytes = (len + RCH_LANE_OVERHEAD + RCH_LANE_CELL - 1) / RCH_LANE_CELL * RCH_LANE_CELL;
    end = head + bytes;
    if (end > lane->end)
        return 0;
    /* Acquire: as the library's own check, so the registration it counts is there. */
    if (__atomic_load_n(lane->changes, __ATOMIC_ACQUIRE) != lane->changes_seen)
        return 0;
    cell = (volatile uint64_t *) ((volatile char *) lane->ring + (head & lane->mask));
    payload = (char *) (uintptr_t) (cell + 2);
    if (alen != 0)
        __builtin_memcpy(payload, a, alen);
    if (blen != 0)
        __builtin_memcpy(payload + alen, b, blen);
    /* Acquire: the tail announced is one whose bytes this end has finished reading. */
    ack = __atomic_load_n(lane->ack, __ATOMIC_ACQUIRE);
    /* The header and ack words, then the trailer last with Release: a reader that
     * sees the trailer sees the whole packet (the fabric's own order). */
    __atomic_store_n(&cell[0],
                     RCH_LANE_FULL_TAG << 60 | 1ull << 56 | len << 32 |
                         ((head / RCH_LANE_CELL) & RCH_LANE_STAMP_MASK),
                     __ATOMIC_RELAXED);
    __atomic_store_n(&cell[1], ack | 1, __ATOMIC_RELAXED);
    __atomic_store_n(&cell[bytes / 8 - 1], RCH_LANE_TRAILER_KEY ^ end, __ATOMIC_RELEASE);
    lane->head = end;
    /* Relaxed: only this sender writes it; the receiver reads it as a hint. */
    if (ack > __atomic_load_n(lane->acked, __ATOMIC_RELAXED))
        __atomic_store_n(lane->acked, ack, __ATOMIC_RELAXED);
    /* Relaxed: a request only; loaded after the write, as the library does. */
    if (__atomic_load_n(lane->bell, __ATOMIC_RELAXED) != lane->bell_seen)
        (void) rch_lane_ring(lane->vc);
    return 1;
#else
    (void) lane;
    (void) a;
    (void) alen;
    (void) b;
    (void) blen;
    return 0;
#endif
}

/* The connections with something to read, for an upper layer's progress loop that
 * should not read every connection of the job on every pass: stores the peer ranks
 * of up to `max` of them (at most 64 a call) in `ranks` and their number in *n. A connection is
 * listed when a read on it would now return bytes or an error (its end, a
 * failure), as rch_wait counts it; when *n is as many as the call could store,
 * more may be ready. The cost of a call follows the
 * connections that carried traffic lately, not the number of connections: one
 * that went quiet (256 calls in a row with nothing) asks its peer to ring this
 * process's doorbell (one word per peer, which the peer's sender sets after its
 * next write; one load per call shows whether any was set), so its first new
 * packet is seen at the next call, and it is watched on every call again from then
 * on. Since interface 1.3: before, and still for peers of other hosts and the
 * loopback, which have no doorbell, quiet connections are looked at two at a time
 * in turn (first packet seen within quiet connections / 2 calls); those with a
 * doorbell are also looked at in turn, one every 16 calls, which catches a write
 * that raced the request to ring. A read or put on a connection
 * puts it back among the watched ones at once. Also answers peers that ask to
 * connect (a look at the sockets every 64 calls while handshakes are under way,
 * else every 4096 calls or every few milliseconds, whichever comes first). Level-triggered: a connection stays listed while bytes
 * are left in it. Since interface 1.2.
 * Errors: RCH_ERR_NULL (ranks with max > 0, or n), RCH_ERR_INVALID (max < 0),
 * RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED. */
int rch_poll_ready(int *ranks, int max, int *n);

/* Waits until some connection may progress: a read would return data (or an error),
 * a put that last returned fewer bytes than offered now has room or its zero-copy
 * transfer was read, a connection handshake advanced or a peer asked to connect.
 * It spins briefly, then yields the CPU, then sleeps with growing naps (the
 * RCH_SPIN / RCH_YIELD / RCH_SLEEP_MAX_US policy), so more processes than cores
 * still progress. timeout_ms: -1 waits without limit, 0 polls once.
 * Returns RCH_SUCCESS (something may progress; it may be spurious) or
 * RCH_ERR_TIMEOUT. Errors: RCH_ERR_INVALID (timeout_ms < -1),
 * RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED. */
int rch_wait(int timeout_ms);

/* Ends the rch_wait / rch_vc_wait_* calls sleeping in other threads early: each
 * returns RCH_SUCCESS within one nap (at most RCH_SLEEP_MAX_US) instead of sleeping
 * on; a wait that starts after this call is not affected. For an upper layer whose
 * progress thread sleeps in rch_wait while another thread completes a request (MPI
 * at MPI_THREAD_MULTIPLE). Safe from any thread and from a signal handler; never
 * blocks. Since interface 1.1.
 * Errors: none (always RCH_SUCCESS). */
int rch_wakeup(void);

/* As rch_wait, for one connection: returns once a read on `vc` would return data or
 * an error (readable) or a put would progress (writable). Same return values, plus
 * the vc errors. */
int rch_vc_wait_readable(rch_vc *vc, int timeout_ms);
int rch_vc_wait_writable(rch_vc *vc, int timeout_ms);

/* Closes this process's ends of `vc`: the peer reads the bytes sent so far, then
 * RCH_ERR_PEER_CLOSED; its puts fail with RCH_ERR_PEER_CLOSED. Later calls with `vc`
 * return RCH_ERR_VC_CLOSED. Closing a closed vc is a no-op.
 * Errors: RCH_ERR_NULL, RCH_ERR_UNKNOWN_VC, RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED. */
int rch_vc_close(rch_vc *vc);

/* What this process holds, for monitoring (rch_get_stats). */
typedef struct rch_stats {
    /* Connections whose rings are set up (a loopback connection counts once). */
    int connections;
    /* Handshakes in progress. */
    int pending;
    /* Bytes of memory registered for the rings, control words and staging buffers
     * of those connections (not counting zero-copy registrations of user buffers). */
    size_t registered_bytes;
} rch_stats;

/* Fills *stats. Errors: RCH_ERR_NULL, RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED. */
int rch_get_stats(rch_stats *stats);

/* How rch_poll_ready finds traffic, for a program or test that wants to see it
 * (cumulative since rch_init). Since interface 1.3. */
typedef struct rch_watch_stats {
    /* Connections looked at on every rch_poll_ready call now. */
    int busy;
    /* Quiet connections now (found by their doorbell or in turn). */
    int quiet;
    /* Quiet connections whose peers ring this process's doorbell now. */
    int quiet_belled;
    /* Doorbell words found set: rings of peers' senders, whether or not their
     * connection was still quiet when the ring was seen (a look in turn may have
     * found its data first). */
    unsigned long long rings;
    /* Quiet connections found with something to read through their doorbell. */
    unsigned long long found_by_bell;
    /* Quiet connections found with something to read by a look in turn. */
    unsigned long long found_in_turn;
} rch_watch_stats;

/* Fills *stats. Errors: RCH_ERR_NULL, RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED. */
int rch_get_watch_stats(rch_watch_stats *stats);

/* Most rails a connection may have (RCH_RAILS). */
#define RCH_MAX_RAILS 8

/* Where the zero-copy reads of this process's connections went, rail by rail
 * (RCH_RAILS), over the connections up now: for an operator checking that every
 * rail carries its share. Since interface 1.14. */
typedef struct rch_rail_stats {
    /* Connections up with more than one rail. */
    int connections;
    /* Rails of the connection with the most (1 without RCH_RAILS; 0 with no
     * connection up). */
    int rails;
    /* Bytes this process RDMA-read over rail i (rail 0 carries the ring), counted
     * as the reads are posted; 0 past `rails`. Bytes a peer pushed into a lent
     * buffer and bytes through the ring are not counted. */
    unsigned long long read_bytes[RCH_MAX_RAILS];
} rch_rail_stats;

/* Fills *stats. Errors: RCH_ERR_NULL, RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED. */
int rch_get_rail_stats(rch_rail_stats *stats);

/* The busy polls rch_wait makes in this process before it yields or sleeps (its
 * wait policy: RCH_SPIN, lowered to 0 when the group's ranks on this host outnumber
 * the CPUs they may run on, unless RCH_SPIN or RCH_YIELD was set), in *spins: how
 * long a caller polling a connection of its own before it waits may spin without
 * taking the CPU a peer needs. Since interface 1.10.
 * Errors: RCH_ERR_NULL, RCH_ERR_NOT_INITIALIZED, RCH_ERR_FINALIZED. */
int rch_wait_spins(int *spins);

/* A static, constant description of a status code ("unknown status code" for others). */
const char *rch_strerror(int code);

/* The detailed message of the last error in the calling thread ("" if none yet).
 * Successful calls leave it alone; it stays valid until the next failing rch_* call
 * in that thread. */
const char *rch_last_error(void);

#ifdef __cplusplus
}
#endif

#endif /* RCH_H */
