/*
 * ch3:rch - CH3 channel over rdma-channel: the progress engine.
 *
 * One pass (progress_once) pushes the send queues of the VCs on the active list and
 * reads the VCs with traffic: the busy ones (written to or read from lately, read
 * directly, which costs what a look would), those rdma-channel lists as having
 * something to read (rch_poll_ready, asked every few passes, whose cost follows the
 * connections with traffic, not the size of the job: seed 003, figure 6), and those
 * whose read-ahead stage still holds bytes. A pass does not touch the idle VCs. A blocking wait repeats passes until a request completes, and between
 * passes that found nothing sleeps in rch_wait (which spins briefly, then yields,
 * then naps), with CH3's global critical section released so that other threads can
 * enter MPI meanwhile; rch_wakeup ends that sleep early when another thread
 * completes a request.
 */

#include "mpidi_ch3_impl.h"

static MPIDI_CH3_PktHandler_Fcn *pktArray[MPIDI_CH3_PKT_END_CH3 + 1];

volatile unsigned int MPIDI_CH3I_progress_completion_count = 0;
#ifdef MPICH_IS_THREADED
volatile int MPIDI_CH3I_progress_blocked = FALSE;
volatile int MPIDI_CH3I_progress_wakeup_signalled = FALSE;
#if (MPICH_THREAD_GRANULARITY == MPICH_THREAD_GRANULARITY__GLOBAL)
static MPID_Thread_cond_t progress_completion_cond;
#endif
#endif

/* VCs whose stage holds bytes not handled yet (singly linked). */
static MPIDI_VC_t *staged_head;

/* Most connections one pass takes from rch_poll_ready (the rest wait for the next
 * pass: the list is level-triggered). */
#define RCH_READY_BATCH 64

/* Passes in a row that read nothing from a busy VC before it leaves the busy list
 * (rch_poll_ready finds it again when its peer writes). */
#define RCH_BUSY_QUIET 256

/* Passes between two rch_poll_ready calls while some VC is busy: a busy VC is read
 * directly, so the call only finds the others. A call costs ~100 ns (the library's
 * lock and its own looks); every 8 passes it still added ~50 ns to a pair's MPI
 * latency (bench/mpich-ab.sh), every 64 it is within noise, and a quiet peer's
 * first message then waits up to 64 passes per two quiet peers. */
#define RCH_READY_EVERY 64

static unsigned long pass_count;

/* How long one rch_wait sleeps at most before the pass is repeated: progress hooks
 * (non-blocking collectives, generalized requests) also need passes. */
#define RCH_WAIT_SLICE_MS 100

/* Idle passes of a blocking wait before it sleeps in rch_wait. */
#define RCH_IDLE_PASSES 64

/* The same where rch_wait yields at once (more ranks than CPUs: rch_wait_spins says
 * fewer spins than RCH_IDLE_PASSES): a pass spent polling is CPU time another rank
 * on this CPU may need, yet a reply from a rank on the other CPU often comes within
 * a few. 4 ranks on 2 CPUs, interleaved runs (bench/notebook/2026-12.md): with 64,
 * osu_barrier 17-23 us and osu_allreduce 8 B-4 KiB 18-23 against 16's 8-17 and
 * 12-16 (Open MPI 2.5 and 3-7); with 1, NPB CG 0.39-0.45 s against 16's and 64's
 * 0.36-0.38 (Open MPI 0.35-0.37). */
#define RCH_IDLE_PASSES_OUTNUMBERED 16

/* Idle passes of a blocking wait in this process: -1 until the first wait asks. */
static int idle_passes = -1;

static int blocking_idle_passes(void)
{
    if (idle_passes < 0) {
        /* RCH_CH3_IDLE_PASSES=N (1 or more) sets it, for a comparison. */
        const char *set = getenv("RCH_CH3_IDLE_PASSES");
        int spins = RCH_IDLE_PASSES;
        if (set != NULL && atoi(set) > 0)
            idle_passes = atoi(set);
        else if (rch_wait_spins(&spins) == RCH_SUCCESS && spins < RCH_IDLE_PASSES)
            idle_passes = RCH_IDLE_PASSES_OUTNUMBERED;
        else
            idle_passes = RCH_IDLE_PASSES;
    }
    return idle_passes;
}

/* Packets of a burst one blocking pass handles after a completion, and the largest
 * such packet (ring payload: CH3's header and its data), see recv_progress. A
 * connection whose last RCH_BURST_MISSES looks found no burst (a ping-pong, where the
 * look cost ~70 instructions a round trip, on the reply's path) looks again after
 * one completion in RCH_BURST_RETRY (a power of two). */
#define RCH_BURST_MAX 64
#define RCH_BURST_PACKET_MAX 1024
#define RCH_BURST_MISSES 8
#define RCH_BURST_RETRY 16

/* Runs a receive request's completion action once its iov is full; *complete says
 * whether the request is done (else its iov was reloaded). */
static int recv_iov_done(MPIDI_VC_t * vc, MPIR_Request * rreq, int *complete)
{
    int (*reqFn) (MPIDI_VC_t *, MPIR_Request *, int *) = rreq->dev.OnDataAvail;
    if (reqFn == NULL) {
        MPIR_Assert(MPIDI_Request_get_type(rreq) != MPIDI_REQUEST_TYPE_GET_RESP);
        *complete = TRUE;
        return MPID_Request_complete(rreq);
    }
    *complete = FALSE;
    return reqFn(vc, rreq, complete);
}

/* The stage's unread bytes at an 8-byte-aligned address, for a handler that reads
 * its payload in place. */
static void align_stage(MPIDI_CH3I_Rch_recv * rs)
{
    if (((uintptr_t) (rs->stage + rs->pos) & 7) != 0) {
        memmove(rs->stage, rs->stage + rs->pos, rs->len - rs->pos);
        rs->len -= rs->pos;
        rs->pos = 0;
    }
}

/* The receive path below is inlined into the busy list's loop (read_vc_inline): as
 * calls, recv_progress and fill_header cost an 8 B ping-pong ~100 instructions a
 * message (callgrind over bench/c/osu_mpi.c). */
#if defined(__GNUC__)
#define RCH_ALWAYS_INLINE inline __attribute__((always_inline))
#define RCH_NOINLINE __attribute__((noinline))
#else
#define RCH_ALWAYS_INLINE inline
#define RCH_NOINLINE
#endif

/* Copies a CH3 header of `len` bytes (MPIDI_CH3I_Pkt_wire_len of its type) out of
 * the ring. The small messages' header lengths are copied as constants: a copy of a
 * variable length compiles to `rep movsq`, whose start-up costs more cycles than the
 * copy of a 24- or 48-byte header itself. */
static RCH_ALWAYS_INLINE void copy_pkt_header(MPIDI_CH3_Pkt_t * dst, const void *src, size_t len)
{
    if (len == RCH_WIRE_LEN(MPIDI_CH3_Pkt_send_t))
        memcpy(dst, src, RCH_WIRE_LEN(MPIDI_CH3_Pkt_send_t));
    else if (len == RCH_ALIGNED_SEND_LEN)
        memcpy(dst, src, RCH_ALIGNED_SEND_LEN);
#if defined(USE_EAGER_SHORT)
    else if (len == RCH_WIRE_LEN(MPIDI_CH3_Pkt_eagershort_send_t))
        memcpy(dst, src, RCH_WIRE_LEN(MPIDI_CH3_Pkt_eagershort_send_t));
#endif
    else
        memcpy(dst, src, len);
}

/* The header length of the packet at stage + pos, once its type has arrived (0 before). */
static RCH_ALWAYS_INLINE size_t staged_header_len(const MPIDI_CH3I_Rch_recv * rs)
{
    if (rs->len - rs->pos < sizeof(MPIDI_CH3_Pkt_type_t))
        return 0;
    return MPIDI_CH3I_Pkt_wire_len_at(rs->stage + rs->pos, rs->len - rs->pos);
}

/* Makes a whole header available at stage + pos if the connection has one: moves a
 * partial header to the front and reads (ahead, while packets are small). Returns an
 * rch status; *hdr_len is the header's length once it is all there, else 0. */
static RCH_ALWAYS_INLINE int fill_header(MPIDI_CH3I_VC * vcch, size_t *hdr_len,
                                         int *made_progress)
{
    MPIDI_CH3I_Rch_recv *rs = vcch->recv;
    size_t need = staged_header_len(rs);
    int reads;

    *hdr_len = 0;
    if (need != 0 && rs->len - rs->pos >= need) {
        *hdr_len = need;
        return RCH_SUCCESS;
    }
    if (rs->stage == NULL) {
        rs->stage = MPL_malloc(RCH_STAGE_SIZE, MPL_MEM_BUFFER);
        if (rs->stage == NULL)
            return RCH_ERR_NO_MEMORY;
    }
    if (rs->pos > 0) {
        memmove(rs->stage, rs->stage + rs->pos, rs->len - rs->pos);
        rs->len -= rs->pos;
        rs->pos = 0;
    }
    /* At most two reads: the second completes a header longer than the first read's
     * guess at it. */
    for (reads = 0; reads < 2; reads++) {
        size_t want, nb = 0;
        int rc;
        /* Only the header after a large payload: the next payload may be large too,
         * and it should go from the ring straight to its destination. */
        if (rs->last_data > RCH_READAHEAD_DATA_MAX)
            want = (need != 0 ? need : RCH_HEADER_GUESS) - rs->len;
        else
            want = RCH_STAGE_SIZE - rs->len;
        MPIDI_CH3I_Rch_unwatch(rs);
        rc = rch_read_buffered(vcch->rvc, rs->stage + rs->len, want, &nb);
        if (rc != RCH_SUCCESS)
            return rc;
        if (nb == 0)
            return RCH_SUCCESS;
        *made_progress = TRUE;
        rs->len += nb;
        need = staged_header_len(rs);
        if (need != 0 && rs->len >= need) {
            *hdr_len = need;
            return RCH_SUCCESS;
        }
    }
    return RCH_SUCCESS;
}

/* Passes the payload of a request whose data CH3 drops: an RMA operation that
 * arrived with a lock request the target queued without room for its data
 * (dev.drop_data; the origin sends it again once the lock is granted). Its iov
 * only counts bytes: the bases are not memory (user_buf is NULL), so nothing is
 * written there. The bytes come from the stage, then from the connection into the
 * VC's discard buffer. *full says whether every entry was passed. */
static RCH_NOINLINE int drop_iov(MPIDI_CH3I_VC * vcch, MPIR_Request * rreq, int *full,
                                 int *made_progress)
{
    MPIDI_CH3I_Rch_recv *rs = vcch->recv;
    struct iovec *cur = rreq->dev.iov + rreq->dev.iov_offset;
    int left = rreq->dev.iov_count - (int) rreq->dev.iov_offset;
    int rc = RCH_SUCCESS;

    while (left > 0) {
        size_t n;
        if (cur->iov_len == 0) {
            cur++;
            left--;
            continue;
        }
        if (rs->pos < rs->len) {
            n = MPL_MIN(cur->iov_len, rs->len - rs->pos);
            rs->pos += n;
            if (rs->pos == rs->len)
                rs->pos = rs->len = 0;
        } else {
            struct iovec piece;
            if (rs->discard == NULL) {
                rs->discard = MPL_malloc(RCH_DISCARD_SIZE, MPL_MEM_BUFFER);
                if (rs->discard == NULL) {
                    rc = RCH_ERR_NO_MEMORY;
                    break;
                }
                rs->discard_off = 0;
            }
            /* The piece ends at the same place on every call until it is counted
             * whole (its start advances by what was counted), as the zero-copy
             * contract asks of a read that left RDMA READs in flight. */
            piece.iov_base = rs->discard + rs->discard_off;
            piece.iov_len = MPL_MIN(cur->iov_len, RCH_DISCARD_SIZE - rs->discard_off);
            MPIDI_CH3I_Rch_unwatch(rs);
            n = 0;
            rc = rch_read_datav(vcch->rvc, &piece, 1, &n);
            if (rc != RCH_SUCCESS || n == 0)
                break;
            rs->discard_off += n;
            if (rs->discard_off == RCH_DISCARD_SIZE)
                rs->discard_off = 0;
        }
        *made_progress = TRUE;
        rs->last_data += n;
        /* Only the length counts down: the base is no address. */
        cur->iov_len -= n;
        if (cur->iov_len == 0) {
            cur++;
            left--;
        }
    }
    rreq->dev.iov_offset = cur - rreq->dev.iov;
    *full = (left == 0);
    return rc;
}

/* Fills a receive request's iov: first from the stage, then straight from the
 * connection (where a zero-copy transfer lands directly in the destination).
 * *full says whether the iov is complete. */
static int fill_iov(MPIDI_CH3I_VC * vcch, MPIR_Request * rreq, int *full, int *made_progress)
{
    MPIDI_CH3I_Rch_recv *rs = vcch->recv;
    struct iovec *cur = rreq->dev.iov + rreq->dev.iov_offset;
    int left = rreq->dev.iov_count - (int) rreq->dev.iov_offset;
    size_t nb = 0;
    int rc = RCH_SUCCESS;

    if (unlikely(rreq->dev.drop_data))
        return drop_iov(vcch, rreq, full, made_progress);

    while (left > 0 && rs->pos < rs->len) {
        size_t n = MPL_MIN(cur->iov_len, rs->len - rs->pos);
        memcpy(cur->iov_base, rs->stage + rs->pos, n);
        rs->pos += n;
        rs->last_data += n;
        *made_progress = TRUE;
        cur->iov_base = (char *) cur->iov_base + n;
        cur->iov_len -= n;
        if (cur->iov_len == 0) {
            cur++;
            left--;
        }
    }
    if (rs->pos == rs->len)
        rs->pos = rs->len = 0;
    if (left > 0) {
        MPIDI_CH3I_Rch_unwatch(vcch->recv);
        rc = rch_read_datav(vcch->rvc, cur, left, &nb);
        if (rc == RCH_SUCCESS && nb > 0) {
            *made_progress = TRUE;
            rs->last_data += nb;
            MPIDI_CH3I_Advance_iov(&cur, &left, nb);
        }
    }
    rreq->dev.iov_offset = cur - rreq->dev.iov;
    *full = (left == 0);
    return rc;
}

/* Before the stage path reads a packet the lane lent: the packets the lane passed
 * before it go back to the library first, which lends that packet again (a read call
 * reads from the library's position, before the passed packets). */
static RCH_NOINLINE int settle_lane(MPIDI_CH3I_VC * vcch)
{
    MPIDI_CH3I_Rch_recv *rs = vcch->recv;
    const void *bytes;
    size_t len;
    if (rs->lane.passed == 0)
        return RCH_SUCCESS;
    return rch_consume_peek_lane(vcch->rvc, 0, &bytes, &len, NULL, &rs->lane);
}

/* A packet handled where it landed, of which `took` bytes of `avail` were read after
 * its header: consumed by the next look at this connection (the next loop's, or the
 * next pass's: a VC with lent bytes is on the busy list, read every pass). A packet
 * of a burst that the lane lent and that was read whole is passed instead, and the
 * lane goes on to the next one: the library consumes them together later (an 8-byte
 * message's library call is ~470 instructions). */
static RCH_ALWAYS_INLINE void give_back_later(MPIDI_CH3I_Rch_recv * rs, size_t hdr_len,
                                              size_t took, size_t avail, int from_lane)
{
    rs->lent_pending = hdr_len + took;
    if (from_lane && rch_lane_next(&rs->lane, rs->lent_pending, avail))
        rs->lent_pending = 0;
}

/* A blocking receive that the channel completes from the connection itself, without
 * a request (MPIDI_CH3_Recv_fast): where its data goes and what it matches. */
typedef struct rch_fast_recv {
    void *buf;
    intptr_t room;
    int rank;
    int tag;
    int context_id;
    MPI_Status *status;
} rch_fast_recv;

/* Smallest message a fast receive copies through rch_copy_lent: the library's
 * adaptive path choice starts at 32 KiB by default, and times no smaller copy. */
#define RCH_TIMED_COPY_MIN (32 * 1024)

/* Takes the packet at `lent` (hdr_len header bytes of `avail`) for the fast receive
 * `f` when it is an eager message to it, all of whose data is in the packet and fits
 * the buffer: copies the data, fills the status as CH3 does for a message found on
 * arrival, and gives the packet back as a handler that took it whole would (*handled
 * 1). Anything else is left where it is for CH3's handler, on the usual path
 * (*handled -2): other packet types, a tag with CH3's error bits, a truncation (whose
 * error the usual path reports). */
static RCH_ALWAYS_INLINE void fast_take(MPIDI_VC_t * vc, const rch_fast_recv * f,
                                        MPIDI_CH3_Pkt_type_t type, const char *lent,
                                        size_t hdr_len, size_t avail, int from_lane,
                                        int *handled)
{
    MPIDI_CH3I_Rch_recv *rs = vc->ch.recv;
    const MPIDI_Message_match *m;
    const void *data;
    intptr_t data_sz, took;

    *handled = -2;
    if (type != MPIDI_CH3_PKT_EAGER_SEND
#ifdef USE_EAGER_SHORT
        && type != MPIDI_CH3_PKT_EAGERSHORT_SEND
#endif
)
        return;
    /* The ring's bytes are the peer's to write: decide on a copy of the header. */
    copy_pkt_header(&rs->pkt, lent, hdr_len);
#ifdef USE_EAGER_SHORT
    if (type == MPIDI_CH3_PKT_EAGERSHORT_SEND) {
        m = &rs->pkt.eagershort_send.match;
        data_sz = rs->pkt.eagershort_send.data_sz;
        data = rs->pkt.eagershort_send.data;
        took = 0;
        if (data_sz < 0 || data_sz > MPIDI_EAGER_SHORT_SIZE)
            return;
    } else
#endif
    {
        m = &rs->pkt.eager_send.match;
        data_sz = rs->pkt.eager_send.data_sz;
        data = lent + hdr_len;
        took = data_sz;
        if (data_sz < 0 || (size_t) data_sz > avail - hdr_len)
            return;
    }
    if (m->parts.context_id != f->context_id || m->parts.rank != f->rank ||
        MPIR_TAG_CHECK_ERROR_BIT(m->parts.tag) || (f->tag != MPI_ANY_TAG && m->parts.tag != f->tag)
        || data_sz > f->room)
        return;
    /* A large message's copy goes through the library, which times it for its choice
     * of path (osu_latency 32 KiB in the slow hand-off phase: the ring's ~9.5 us
     * against zero-copy's ~6.5); the bytes are copied whatever it returns, and a
     * failed connection is the next call's to report. */
    if (data_sz >= RCH_TIMED_COPY_MIN)
        (void) rch_copy_lent(vc->ch.rvc, f->buf, data, (size_t) data_sz);
    else if (data_sz > 0)
        memcpy(f->buf, data, data_sz);
    if (f->status != MPI_STATUS_IGNORE) {
        f->status->MPI_SOURCE = m->parts.rank;
        f->status->MPI_TAG = m->parts.tag;
        f->status->MPI_ERROR = MPI_SUCCESS;
        MPIR_STATUS_SET_COUNT(*f->status, data_sz);
        MPIR_STATUS_SET_CANCEL_BIT(*f->status, FALSE);
    }
    if (vc->state == MPIDI_VC_STATE_INACTIVE)
        MPIDI_CHANGE_VC_STATE(vc, ACTIVE);
    *handled = 1;
    rs->last_data = took;
    give_back_later(rs, hdr_len, (size_t) took, avail, from_lane);
}

/* The packet at the front of the connection, handed to its CH3 handler where it
 * landed in rdma-channel's ring: no copy into the stage, and at most one library
 * call a packet (rch_consume_peek_lane gives back what the packet before took, then
 * lends this one; on a quiet connection rch_lane_packet finds it without a call).
 * *handled is 1 when a packet was handled, -1 when nothing has arrived, 0 when the
 * stage path must read it (a header split across two of the peer's puts, or a
 * payload not 8-byte aligned, which CH3's handlers may read in place). With
 * `lane_only`, only a packet of at most RCH_BURST_PACKET_MAX bytes that the lane
 * finds without a call is handled; else *handled is -1 (a larger packet the lane lent
 * is lent again by the next look, which passes 0 for it). With `fast`, the packet
 * goes to fast_take instead of a handler (*handled -2 when it is not the receive's).
 * Returns an rch status; *mpi_errno is the handler's. */
static RCH_ALWAYS_INLINE int handle_in_place(MPIDI_VC_t * vc, int *handled, int *made_progress,
                                             int *mpi_errno, int lane_only,
                                             const rch_fast_recv * fast)
{
    MPIDI_CH3I_VC *vcch = &vc->ch;
    MPIDI_CH3I_Rch_recv *rs = vcch->recv;
    MPIR_Request *rreq = NULL;
    MPIDI_CH3_Pkt_type_t type;
    const void *lent;
    size_t avail, hdr_len;
    intptr_t buflen;
    int rc;
    int from_lane = 0;

    *handled = 0;
    /* A quiet connection: while its words have not changed, nothing to read, without
     * a call (an idle pass of an 8 B ping-pong spent ~230 of its ~440 instructions in
     * the library's empty look); and the packet that lands in its next cell is
     * handled where it landed, also without a call (the library's share, ~460
     * instructions an 8 B message, goes to the next look, after the reply).
     * Not while lent bytes are owed back. */
    if (rs->lent_pending == 0) {
        int r = rch_lane_packet(&rs->lane, &lent, &avail);
        if (r == 0) {
            *handled = -1;
            return RCH_SUCCESS;
        }
        if (r > 0 && (!lane_only || avail <= RCH_BURST_PACKET_MAX)) {
            from_lane = 1;
            goto landed;
        }
    }
    if (lane_only) {
        *handled = -1;
        return RCH_SUCCESS;
    }
    /* What the last packet handled here took goes back in the same call. */
    rc = rch_consume_peek_lane(vcch->rvc, rs->lent_pending, &lent, &avail, NULL, &rs->lane);
    if (rc != RCH_SUCCESS)
        return rc;
    rs->lent_pending = 0;
    if (avail == 0) {
        *handled = -1;
        return RCH_SUCCESS;
    }
    /* A whole packet lent by the library: the lane can go on past it as well. */
    from_lane = rs->lane.lent != 0;
  landed:
    if (avail < sizeof(type))
        return settle_lane(vcch);
    memcpy(&type, lent, sizeof(type));
    hdr_len = MPIDI_CH3I_Pkt_wire_len_at(lent, avail);
    if (avail < hdr_len || (((uintptr_t) lent + hdr_len) & 7) != 0)
        return settle_lane(vcch);
    if (fast != NULL) {
        fast_take(vc, fast, type, lent, hdr_len, avail, from_lane, handled);
        return RCH_SUCCESS;
    }
    *made_progress = TRUE;
    if (vc->state == MPIDI_VC_STATE_INACTIVE)
        MPIDI_CHANGE_VC_STATE(vc, ACTIVE);
    /* The handler reads only its type's struct; the ring's bytes are the peer's to
     * write, so the header it decodes is a copy. */
    copy_pkt_header(&rs->pkt, lent, hdr_len);
    if (type < 0 || type >= MPIDI_CH3_PKT_END_CH3 || pktArray[type] == NULL) {
        MPIR_ERR_SET1(*mpi_errno, MPI_ERR_OTHER, "**ch3|rch|peerlost",
                      "**ch3|rch|peerlost %d", vc->pg_rank);
        MPIDI_CH3I_VC_fail(vc, *mpi_errno);
        return RCH_SUCCESS;
    }
    *handled = 1;
    /* As on the stage path: REVOKE's handler takes no payload and leaves buflen. */
    buflen = type == MPIDI_CH3_PKT_REVOKE ? 0 : (intptr_t) (avail - hdr_len);
    *mpi_errno = pktArray[type] (vc, &rs->pkt, (char *) lent + hdr_len, &buflen, &rreq);
    if (*mpi_errno != MPI_SUCCESS)
        return RCH_SUCCESS;
    rs->last_data = buflen;
    if (rreq != NULL) {
        rreq->dev.iov_offset = 0;
        rs->active = rreq;
    }
    /* A handler may have closed the connection (CLOSE, a failure): its ring is gone,
     * and so is the need to give the space back. */
    if (vcch->state != MPIDI_CH3I_VC_STATE_CONNECTED)
        return RCH_SUCCESS;
    if (rreq == NULL) {
        give_back_later(rs, hdr_len, (size_t) buflen, avail, from_lane);
        return RCH_SUCCESS;
    }
    /* The rest of the data is read into the request's iov: give these bytes back
     * first, as the reads that follow pass them (with the lane, which may have lent
     * them; what the call lends after them is read by those reads). */
    rc = rch_consume_peek_lane(vcch->rvc, hdr_len + (size_t) buflen, &lent, &avail, NULL,
                               &rs->lane);
    MPIDI_CH3I_Rch_unwatch(rs);
    return rc;
}

/* Reads what has arrived on one connection: headers, handed to CH3's handlers with
 * the payload bytes already staged, and the data they ask for. Stops when the
 * connection has nothing more, or, with `until_completion`, once a request completed
 * (a blocking wait's caller may be waiting for just that one: returning at once saves
 * a read on the critical path) and the lane shows no more small packets already
 * landed: those of a burst are handled in the same pass (at most RCH_BURST_MAX), so
 * that a Waitall over a window of receives does not re-enter the engine for each
 * (~200 instructions an 8 B message: the pass's entry, the hooks, the send queues).
 * Only small packets, found without a call: a receive not posted yet finds such a
 * message among the unexpected ones for the price of a small copy, where a large one
 * would be copied twice. */
static RCH_ALWAYS_INLINE int recv_progress(MPIDI_VC_t * vc, int *made_progress,
                                           int until_completion)
{
    unsigned int completions_before = MPIDI_CH3I_progress_completion_count;
    MPIDI_CH3I_VC *vcch = &vc->ch;
    MPIDI_CH3I_Rch_recv *rs = vcch->recv;
    int mpi_errno = MPI_SUCCESS;
    int rc = RCH_SUCCESS;
    int lane_only = 0;
    int burst = 0;

    while (vcch->state == MPIDI_CH3I_VC_STATE_CONNECTED) {
        if (until_completion && completions_before != MPIDI_CH3I_progress_completion_count) {
            if (rs->active != NULL || rs->pos != rs->len || rs->lent_pending != 0 ||
                ++burst > RCH_BURST_MAX)
                break;
            if (burst == 1 && rs->burst_misses >= RCH_BURST_MISSES &&
                (++rs->burst_skips & (RCH_BURST_RETRY - 1)) != 0)
                break;
            lane_only = 1;
        }
        if (rs->active == NULL) {
            MPIR_Request *rreq = NULL;
            intptr_t buflen;
            size_t hdr_len;

            if (rs->pos == rs->len) {
                /* Nothing staged: the next packet where it landed in the ring. */
                int handled = 0;
                rc = handle_in_place(vc, &handled, made_progress, &mpi_errno, lane_only, NULL);
                if (rc != RCH_SUCCESS)
                    goto read_error;
                MPIR_ERR_CHECK(mpi_errno);
                if (handled < 0) {
                    if (burst == 1 && rs->burst_misses < RCH_BURST_MISSES)
                        rs->burst_misses++;
                    break;
                }
                if (handled) {
                    if (lane_only)
                        rs->burst_misses = 0;
                    continue;
                }
            }
            if (lane_only)
                break;
            rc = fill_header(vcch, &hdr_len, made_progress);
            if (rc != RCH_SUCCESS)
                goto read_error;
            if (hdr_len == 0)
                break;
            /* A peer that talks to us uses this VC: CH3 must close it at finalize. */
            if (vc->state == MPIDI_VC_STATE_INACTIVE)
                MPIDI_CHANGE_VC_STATE(vc, ACTIVE);
            /* The handler reads only its type's struct, all of which came. */
            copy_pkt_header(&rs->pkt, rs->stage + rs->pos, hdr_len);
            rs->pos += hdr_len;
            rs->last_data = 0;
            if (rs->pkt.type < 0 || rs->pkt.type >= MPIDI_CH3_PKT_END_CH3 ||
                pktArray[rs->pkt.type] == NULL) {
                MPIR_ERR_SET1(mpi_errno, MPI_ERR_OTHER, "**ch3|rch|peerlost",
                              "**ch3|rch|peerlost %d", vc->pg_rank);
                MPIDI_CH3I_VC_fail(vc, mpi_errno);
                return mpi_errno;
            }
            align_stage(rs);
            /* CH3's handlers say in *buflen how much payload they took, except the
             * REVOKE handler, which takes none and leaves it alone: offer it none. */
            buflen = rs->pkt.type == MPIDI_CH3_PKT_REVOKE ? 0 : rs->len - rs->pos;
            mpi_errno = pktArray[rs->pkt.type] (vc, &rs->pkt, rs->stage + rs->pos, &buflen, &rreq);
            MPIR_ERR_CHECK(mpi_errno);
            /* The handler took `buflen` payload bytes from the stage. */
            rs->pos += buflen;
            rs->last_data = buflen;
            if (rs->pos == rs->len)
                rs->pos = rs->len = 0;
            if (rreq != NULL) {
                rreq->dev.iov_offset = 0;
                rs->active = rreq;
            }
        } else {
            /* The data of the request at hand. */
            MPIR_Request *rreq = rs->active;
            int full, complete;

            rc = fill_iov(vcch, rreq, &full, made_progress);
            if (rc != RCH_SUCCESS)
                goto read_error;
            if (!full)
                break;
            mpi_errno = recv_iov_done(vc, rreq, &complete);
            MPIR_ERR_CHECK(mpi_errno);
            if (complete)
                rs->active = NULL;
            else
                rreq->dev.iov_offset = 0;
        }
    }

  fn_exit:
    return mpi_errno;
  fn_fail:
    goto fn_exit;

  read_error:
    if (rc == RCH_ERR_PEER_CLOSED && vc->state == MPIDI_VC_STATE_INACTIVE && rs->active == NULL) {
        /* A peer we never exchanged a packet with closed: nothing was lost. */
        vcch->state = MPIDI_CH3I_VC_STATE_TERMINATED;
        return MPI_SUCCESS;
    }
    mpi_errno = MPIDI_CH3I_Rch_error(rc, "read", vc->pg_rank);
    MPIDI_CH3I_VC_fail(vc, mpi_errno);
    return mpi_errno;
}

/* Busy looks at the source's connection a fast receive makes, at most, before it
 * leaves the receive to the usual path (which then polls and sleeps as it does): a
 * reply that comes within microseconds, as in a ping-pong, is taken here. No more
 * than rch_wait's own busy polls: with more ranks than CPUs, one look. */
#define RCH_FAST_LOOKS 1024

/* fast_looks: -1 until the first fast receive asks; RCH_FAST_OFF when turned off. */
#define RCH_FAST_OFF (-2)
static int fast_looks = -1;

/* MPID_Recv's first try (mpich/patches/ch3-recv-fast.patch), called when no receive
 * is posted and no message is unexpected: then the next message from `rank` that
 * fits is this receive's. It is taken from the connection into the buffer, with no
 * request, when it is a contiguous eager message already whole at the front of the
 * connection, or is within the looks; 1 then, with *status filled. 0 leaves the
 * receive to the usual path, which finds whatever came as it would have: a packet
 * this does not take stays at the front. Only where the send lanes are allowed (one
 * thread in MPI), on a connection with nothing staged or half read. */
int MPIDI_CH3_Recv_fast(void *buf, MPI_Aint count, MPI_Datatype datatype, int rank, int tag,
                        MPIR_Comm * comm, int context_offset, MPI_Status * status)
{
    MPIDI_VC_t *vc;
    MPIDI_CH3I_Rch_recv *rs;
    MPIR_Datatype *dt_ptr ATTRIBUTE((unused));
    MPI_Aint dt_true_lb;
    intptr_t room;
    int dt_contig, looks;
    rch_fast_recv f;

#ifdef MPICH_IS_THREADED
    if (MPIR_IS_THREADED)
        return 0;
#endif
    /* Queued sends wait for passes (a peer may need them before it answers). */
    if (rank < 0 || MPIDI_CH3I_active_head != NULL)
        return 0;
    MPIDI_Comm_get_vc(comm, rank, &vc);
    rs = vc->ch.recv;
    if (vc->ch.state != MPIDI_CH3I_VC_STATE_CONNECTED || vc->ch.rvc == NULL || rs == NULL ||
        rs->active != NULL || rs->pos != rs->len)
        return 0;
    MPIDI_Datatype_get_info(count, datatype, dt_contig, room, dt_ptr, dt_true_lb);
    if (!dt_contig)
        return 0;
    if (fast_looks < 0) {
        /* RCH_CH3_RECV_FAST=0 turns it off (a comparison, or a suspected fault). */
        const char *on = getenv("RCH_CH3_RECV_FAST");
        int spins = 0;
        if (rch_wait_spins(&spins) != RCH_SUCCESS)
            spins = 0;
        fast_looks = on != NULL && strcmp(on, "0") == 0 ? RCH_FAST_OFF
            : MPL_MIN(spins, RCH_FAST_LOOKS);
    }
    if (fast_looks == RCH_FAST_OFF)
        return 0;
    f.buf = MPIR_get_contig_ptr(buf, dt_true_lb);
    f.room = room;
    f.rank = rank;
    f.tag = tag;
    f.context_id = comm->recvcontext_id + context_offset;
    f.status = status;
    for (looks = 0;; looks++) {
        int handled = 0, made_progress = FALSE, mpi_errno = MPI_SUCCESS;
        int rc = handle_in_place(vc, &handled, &made_progress, &mpi_errno, 0, &f);
        if (handled == 1)
            return 1;
        /* A failure is the usual path's to report (it meets it again). */
        if (rc != RCH_SUCCESS || handled != -1 || looks >= fast_looks)
            return 0;
    }
}

/* CH3 finished its close protocol on this VC: once the queued packets (the last
 * CLOSE among them) are put, close the connection and report it terminated. */
static int finish_terminate(MPIDI_VC_t * vc)
{
    MPIDI_CH3I_VC *vcch = &vc->ch;
    if (vcch->rvc != NULL)
        rch_vc_close(vcch->rvc);
    return MPIDI_CH3U_Handle_connection(vc, MPIDI_VC_EVENT_TERMINATED);
}

int MPIDI_CH3_Connection_terminate(MPIDI_VC_t * vc)
{
    MPIDI_CH3I_VC *vcch = &vc->ch;

    if (vcch->state == MPIDI_CH3I_VC_STATE_FAILED)
        return MPIDI_CH3U_Handle_connection(vc, MPIDI_VC_EVENT_TERMINATED);
    vcch->state = MPIDI_CH3I_VC_STATE_TERMINATED;
    if (!MPIDI_CH3I_VC_send_busy(vcch))
        return finish_terminate(vc);
    MPIDI_CH3I_VC_make_active(vc);
    return MPI_SUCCESS;
}

/* Pushes the send queues of the active VCs and completes their sends whose lent
 * buffers came back; drops the VCs with neither left. */
static int send_pass(int *made_progress)
{
    int mpi_errno = MPI_SUCCESS;
    MPIDI_VC_t **link = &MPIDI_CH3I_active_head;

    while (*link != NULL) {
        MPIDI_VC_t *vc = *link;
        MPIDI_CH3I_VC *vcch = &vc->ch;
        int err = MPI_SUCCESS;

        if (vcch->state != MPIDI_CH3I_VC_STATE_FAILED)
            err = MPIDI_CH3I_Send_progress(vc, made_progress);
        if (err != MPI_SUCCESS) {
            MPIDI_CH3I_VC_fail(vc, err);
            if (mpi_errno == MPI_SUCCESS)
                mpi_errno = err;
        }
        if (!MPIDI_CH3I_VC_send_busy(vcch)) {
            *link = vcch->active_next;
            vcch->in_active_list = 0;
            vcch->active_next = NULL;
            if (vcch->state == MPIDI_CH3I_VC_STATE_TERMINATED) {
                *made_progress = TRUE;
                err = finish_terminate(vc);
                if (err != MPI_SUCCESS && mpi_errno == MPI_SUCCESS)
                    mpi_errno = err;
            }
        } else {
            link = &vcch->active_next;
        }
    }
    return mpi_errno;
}

/* Remembers a VC whose stage still holds bytes after a read: they are not in
 * rdma-channel's ring any more, so rch_poll_ready will not report them. */
static void note_staged(MPIDI_VC_t * vc)
{
    MPIDI_CH3I_VC *vcch = &vc->ch;
    if (!vcch->in_staged_list && vcch->recv != NULL && vcch->recv->len > vcch->recv->pos) {
        vcch->in_staged_list = 1;
        vcch->staged_next = staged_head;
        staged_head = vc;
    }
}

/* Reads one VC if it can still be read, and remembers staged bytes: inlined into
 * the busy list's loop, the hot one; the other lists call read_vc. */
static RCH_ALWAYS_INLINE int read_vc_inline(MPIDI_VC_t * vc, int *made_progress, int blocking)
{
    int mpi_errno = MPI_SUCCESS;
    if (vc->ch.state == MPIDI_CH3I_VC_STATE_CONNECTED) {
        mpi_errno = recv_progress(vc, made_progress, blocking);
        note_staged(vc);
    }
    return mpi_errno;
}

static RCH_NOINLINE int read_vc(MPIDI_VC_t * vc, int *made_progress, int blocking)
{
    return read_vc_inline(vc, made_progress, blocking);
}

static int progress_once(int *made_progress, int blocking)
{
    int mpi_errno;
    MPIDI_PG_t *pg = MPIDI_Process.my_pg;
    int ready[RCH_READY_BATCH];
    int n = 0, k, rc;
    int hooks_progressed = FALSE;
    MPIDI_VC_t *staged, **link;

    /* A hook that progressed counts as a completion, as in ch3:sock and nemesis:
     * CH3's RMA issues queued operations from its hook, and one that goes out whole
     * completes no request, yet a blocking wait (MPI_Win_flush_local's) waits for
     * just that. */
    mpi_errno = MPIR_Progress_hook_exec_all(&hooks_progressed);
    MPIR_ERR_CHECK(mpi_errno);
    if (hooks_progressed) {
        *made_progress = TRUE;
        MPIDI_CH3_Progress_signal_completion();
    }

    mpi_errno = send_pass(made_progress);
    MPIR_ERR_CHECK(mpi_errno);

    /* Bytes already staged first: they arrived before anything in the rings. The
     * list is taken whole; a VC whose stage is still not empty goes back on it. */
    staged = staged_head;
    staged_head = NULL;
    while (staged != NULL) {
        MPIDI_VC_t *vc = staged;
        staged = vc->ch.staged_next;
        vc->ch.staged_next = NULL;
        vc->ch.in_staged_list = 0;
        mpi_errno = read_vc(vc, made_progress, blocking);
        if (mpi_errno != MPI_SUCCESS) {
            /* Keep the others' staged bytes for the next pass. */
            while (staged != NULL) {
                MPIDI_VC_t *rest = staged;
                staged = rest->ch.staged_next;
                rest->ch.staged_next = NULL;
                note_staged(rest);
            }
            goto fn_fail;
        }
    }

    /* The busy VCs, read directly; one that stayed quiet long leaves the list. */
    link = &MPIDI_CH3I_busy_head;
    while (*link != NULL) {
        MPIDI_VC_t *vc = *link;
        MPIDI_CH3I_VC *vcch = &vc->ch;
        int got = FALSE;
        mpi_errno = read_vc_inline(vc, &got, blocking);
        MPIR_ERR_CHECK(mpi_errno);
        /* A handler that sent made its VC busy, at the head: find ours again. */
        while (*link != vc)
            link = &(*link)->ch.busy_next;
        if (got) {
            *made_progress = TRUE;
            vcch->busy_quiet = 0;
        }
        if (!got && ++vcch->busy_quiet >= RCH_BUSY_QUIET) {
            *link = vcch->busy_next;
            vcch->busy_next = NULL;
            vcch->in_busy_list = 0;
        } else {
            link = &vcch->busy_next;
        }
    }

    /* The others, as rdma-channel sees them. */
    if (MPIDI_CH3I_busy_head == NULL || ++pass_count % RCH_READY_EVERY == 0) {
        rc = rch_poll_ready(ready, RCH_READY_BATCH, &n);
        if (rc != RCH_SUCCESS) {
            mpi_errno = MPIDI_CH3I_Rch_error(rc, "wait", -1);
            goto fn_fail;
        }
        for (k = 0; k < n; k++) {
            MPIDI_VC_t *vc;
            if (ready[k] == MPIDI_Process.my_pg_rank || ready[k] < 0 ||
                ready[k] >= MPIDI_PG_Get_size(pg))
                continue;
            MPIDI_PG_Get_vc(pg, ready[k], &vc);
            if (vc->ch.in_busy_list)
                continue;       /* read above */
            MPIDI_CH3I_VC_make_busy(vc);
            mpi_errno = read_vc(vc, made_progress, blocking);
            MPIR_ERR_CHECK(mpi_errno);
        }
    }
    /* Receiving may have queued replies (CTS, CLOSE acks): send them now. */
    if (MPIDI_CH3I_active_head != NULL) {
        mpi_errno = send_pass(made_progress);
        MPIR_ERR_CHECK(mpi_errno);
    }

  fn_exit:
    return mpi_errno;
  fn_fail:
    goto fn_exit;
}

/* Sleeps until a connection may progress, at most one slice, outside CH3's lock. */
static int block_in_rch(void)
{
    int rc;
    MPID_THREAD_CS_EXIT(GLOBAL, MPIR_THREAD_GLOBAL_ALLFUNC_MUTEX);
    rc = rch_wait(RCH_WAIT_SLICE_MS);
    MPID_THREAD_CS_ENTER(GLOBAL, MPIR_THREAD_GLOBAL_ALLFUNC_MUTEX);
    if (rc != RCH_SUCCESS && rc != RCH_ERR_TIMEOUT)
        return MPIDI_CH3I_Rch_error(rc, "wait", -1);
    return MPI_SUCCESS;
}

#ifdef MPICH_IS_THREADED
/* Another thread blocks in the engine: wait for it to report a completion. */
static void progress_delay(unsigned int completion_count)
{
#if (MPICH_THREAD_GRANULARITY == MPICH_THREAD_GRANULARITY__GLOBAL)
    int err;
    while (completion_count == MPIDI_CH3I_progress_completion_count)
        MPID_Thread_cond_wait(&progress_completion_cond, &MPIR_THREAD_GLOBAL_ALLFUNC_MUTEX, &err);
#endif
}

static void progress_continue(void)
{
#if (MPICH_THREAD_GRANULARITY == MPICH_THREAD_GRANULARITY__GLOBAL)
    int err;
    /* Only another thread of a threaded program can wait in progress_delay. */
    if (MPIR_IS_THREADED)
        MPID_Thread_cond_broadcast(&progress_completion_cond, &err);
#endif
}

void MPIDI_CH3I_Progress_wakeup(void)
{
    rch_wakeup();
}
#endif

int MPIDI_CH3I_Progress(int blocking, MPID_Progress_state * state)
{
    int mpi_errno = MPI_SUCCESS;
    int made_progress = FALSE;
    int idle = 0;

    if (!blocking) {
#ifdef MPICH_IS_THREADED
        /* The blocked thread progresses for everyone (as in ch3:sock). */
        if (MPIR_IS_THREADED && MPIDI_CH3I_progress_blocked == TRUE)
            return MPI_SUCCESS;
#endif
        return progress_once(&made_progress, FALSE);
    }

    do {
        made_progress = FALSE;
        mpi_errno = progress_once(&made_progress, TRUE);
        MPIR_ERR_CHECK(mpi_errno);
        if (state->ch.completion_count != MPIDI_CH3I_progress_completion_count)
            break;
        if (made_progress) {
            idle = 0;
            continue;
        }
        /* Poll a little before sleeping in rch_wait: a reply usually arrives within
         * a few passes, and a pass is cheaper than entering and leaving a wait. */
        if (++idle < blocking_idle_passes())
            continue;
        idle = 0;
#ifdef MPICH_IS_THREADED
        if (MPIR_IS_THREADED) {
            if (MPIDI_CH3I_progress_blocked == TRUE) {
                progress_delay(state->ch.completion_count);
                break;
            }
            MPIDI_CH3I_progress_blocked = TRUE;
            mpi_errno = block_in_rch();
            MPIDI_CH3I_progress_blocked = FALSE;
            MPIDI_CH3I_progress_wakeup_signalled = FALSE;
        } else
#endif
        {
            mpi_errno = block_in_rch();
        }
        MPIR_ERR_CHECK(mpi_errno);
    } while (state->ch.completion_count == MPIDI_CH3I_progress_completion_count);

#ifdef MPICH_IS_THREADED
    progress_continue();
#endif

  fn_exit:
    state->ch.completion_count = MPIDI_CH3I_progress_completion_count;
    return mpi_errno;
  fn_fail:
    goto fn_exit;
}

int MPIDI_CH3I_Progress_init(void)
{
    int mpi_errno = MPI_SUCCESS;
    MPIDI_PG_t *pg = MPIDI_Process.my_pg;
    int i;

#if defined(MPICH_IS_THREADED) && (MPICH_THREAD_GRANULARITY == MPICH_THREAD_GRANULARITY__GLOBAL)
    {
        int err;
        MPID_Thread_cond_create(&progress_completion_cond, &err);
        MPIR_Assert(err == 0);
    }
#endif
    MPIDI_CH3I_active_head = NULL;
    staged_head = NULL;
    MPIDI_CH3I_busy_head = NULL;

    /* Every VC of the job has a connection handle (rdma-channel sets the pair up on
     * first use); handles are cheap, so look them all up now. */
    for (i = 0; i < MPIDI_PG_Get_size(pg); i++) {
        MPIDI_VC_t *vc;
        int rc;
        if (i == MPIDI_Process.my_pg_rank)
            continue;
        MPIDI_PG_Get_vc(pg, i, &vc);
        rc = rch_vc_get(i, &vc->ch.rvc);
        if (rc != RCH_SUCCESS) {
            mpi_errno = MPIDI_CH3I_Rch_error(rc, "init", -1);
            goto fn_fail;
        }
        vc->ch.state = MPIDI_CH3I_VC_STATE_CONNECTED;
    }

    mpi_errno = MPIDI_CH3_PktHandler_Init(pktArray, MPIDI_CH3_PKT_END_CH3 + 1);
    MPIR_ERR_CHECK(mpi_errno);

  fn_exit:
    return mpi_errno;
  fn_fail:
    goto fn_exit;
}

int MPIDI_CH3I_Progress_finalize(void)
{
#if defined(MPICH_IS_THREADED) && (MPICH_THREAD_GRANULARITY == MPICH_THREAD_GRANULARITY__GLOBAL)
    {
        int err;
        MPID_Thread_cond_destroy(&progress_completion_cond, &err);
        MPIR_Assert(err == 0);
    }
#endif
    return MPI_SUCCESS;
}
