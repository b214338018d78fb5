/*
 * ch3:rch - CH3 channel over rdma-channel: the send side.
 *
 * Every CH3 packet goes as a header as long as its type's struct
 * (MPIDI_CH3I_Pkt_wire_len: the receiver reads the type, then knows how much header
 * to read before the packet handler tells it the rest) followed by its data. A send
 * first tries to put everything at once (a header, or a header and its data, small
 * enough for one packet is written through the VC's send lane, without a library
 * call, when the lane has room: rch_lane_send); what the connection does not take now
 * (ring full, connection being set up, zero-copy buffer announced and not yet read)
 * waits in the VC's send queue, with the header copied into the request, and the
 * progress engine offers it again. Packets never interleave: while the queue is not
 * empty, new sends go behind it.
 *
 * A send's large buffers are lent (rch_put_lend): counted at once, they stay where
 * they are until the peer has read them, and the send waits for that in the VC's
 * lent queue while the sends behind it go out. A window of large MPI_Isends is then
 * read back to back by the peer, not one per round trip. Sends that load their data
 * piece by piece (OnDataAvail: a packed datatype, RMA responses) reuse their buffer
 * for the next piece, so they are not lent. RCH_CH3_LEND=0 turns lending off.
 */

#include "mpidi_ch3_impl.h"

#if defined(__GNUC__)
#define RCH_SEND_INLINE inline __attribute__((always_inline))
#else
#define RCH_SEND_INLINE inline
#endif

/* The rdma-channel connection of a VC, looked up on first use. */
static int vc_connection(MPIDI_VC_t * vc, struct rch_vc **out)
{
    MPIDI_CH3I_VC *vcch = &vc->ch;
    if (vcch->rvc == NULL) {
        int rc = rch_vc_get(vc->pg_rank, &vcch->rvc);
        if (rc != RCH_SUCCESS)
            return MPIDI_CH3I_Rch_error(rc, "put", vc->pg_rank);
        vcch->state = MPIDI_CH3I_VC_STATE_CONNECTED;
    }
    *out = vcch->rvc;
    return MPI_SUCCESS;
}

/* Whether this process may write through send lanes: not while another thread may
 * be in rch_wait (block_in_rch leaves CH3's lock for it), which the lane's contract
 * excludes. */
#ifdef MPICH_IS_THREADED
#define RCH_LANES_OK (!MPIR_IS_THREADED)
#else
#define RCH_LANES_OK 1
#endif

/* A lane that takes nothing: the VC's once rch_vc_send_lane refused it (the loopback
 * to this process), so that it is not asked again. */
static rch_send_lane no_lane;

/* Looks up the VC's send lane after a put went through (the connection is up then;
 * before, rch_vc_send_lane gives none and is asked again after the next put). */
static void find_send_lane(MPIDI_CH3I_VC * vcch)
{
    if (vcch->send_lane == NULL && RCH_LANES_OK &&
        rch_vc_send_lane(vcch->rvc, &vcch->send_lane) != RCH_SUCCESS)
        vcch->send_lane = &no_lane;
}

/* One or two entries through the VC's send lane, whole: 1 when they went. */
static RCH_SEND_INLINE int lane_put(MPIDI_CH3I_VC * vcch, const struct iovec *iov, int n)
{
    if (vcch->send_lane == NULL || n > 2)
        return 0;
    if (n == 1)
        return rch_lane_send(vcch->send_lane, iov[0].iov_base, iov[0].iov_len, NULL, 0);
    return rch_lane_send(vcch->send_lane, iov[0].iov_base, iov[0].iov_len, iov[1].iov_base,
                         iov[1].iov_len);
}

/* Whether sends may lend their buffers (RCH_CH3_LEND, read once: 1 unless "0"). */
static int lend_ok(void)
{
    static int ok = -1;
    if (ok < 0) {
        const char *v = getenv("RCH_CH3_LEND");
        ok = !(v != NULL && strcmp(v, "0") == 0);
    }
    return ok;
}

int MPIDI_CH3I_Put_iov(MPIDI_VC_t * vc, struct iovec **iovp, int *np, int *done,
                       unsigned long long *ticket)
{
    struct rch_vc *rvc;
    struct iovec *iov = *iovp;
    int n = *np;
    size_t nb = 0;
    int rc;
    int mpi_errno = vc_connection(vc, &rvc);

    *done = 0;
    if (mpi_errno != MPI_SUCCESS)
        return mpi_errno;
    if (lane_put(&vc->ch, iov, n)) {
        MPIDI_CH3I_VC_make_busy(vc);
        *iovp = iov + n;
        *np = 0;
        *done = 1;
        return MPI_SUCCESS;
    }
    if (ticket != NULL && lend_ok()) {
        uint64_t lent = 0;
        rc = rch_put_lend(rvc, iov, n, &nb, &lent);
        if (lent != 0)
            *ticket = lent;
    } else {
        rc = rch_put_datav(rvc, iov, n, &nb);
    }
    if (rc != RCH_SUCCESS)
        return MPIDI_CH3I_Rch_error(rc, "put", vc->pg_rank);
    if (nb != 0)
        find_send_lane(&vc->ch);
    /* A peer we write to answers: read it on every pass for a while. */
    MPIDI_CH3I_VC_make_busy(vc);
    MPIDI_CH3I_Advance_iov(&iov, &n, nb);
    *iovp = iov;
    *np = n;
    *done = (n == 0);
    return MPI_SUCCESS;
}

/* Copies what is left of a send into the request: the iov, and the header into the
 * request's own packet if any of it is still to go (the caller's header is on its
 * stack). `sent_hdr` is how many of its `hdr_len` bytes went already. */
static void save_rest(MPIR_Request * sreq, const struct iovec *iov, int n, int hdr_left,
                      const void *hdr, size_t hdr_len, size_t sent_hdr)
{
    int i;
    int first = 0;
    if (hdr_left) {
        sreq->dev.pending_pkt = *(const MPIDI_CH3_Pkt_t *) hdr;
        sreq->dev.iov[0].iov_base = (char *) &sreq->dev.pending_pkt + sent_hdr;
        sreq->dev.iov[0].iov_len = hdr_len - sent_hdr;
        first = 1;
        iov++;
        n--;
    }
    for (i = 0; i < n; i++)
        sreq->dev.iov[first + i] = iov[i];
    sreq->dev.iov_count = first + n;
    sreq->dev.iov_offset = 0;
}

/* The most data bytes of a send that the channel copies when the connection did not
 * take the send whole (a full ring, a connection being set up, sends queued before
 * it). MPI lets a program reuse an RMA operation's origin buffer only after a flush or
 * the epoch's end, yet programs reuse it at once, as a socket's or an eager buffer's
 * copy lets them elsewhere: MPICH's own rma/atomic_get tests refill theirs for the
 * next MPI_Accumulate, and when the ring was full for a moment half an element went
 * with one operation's value and the rest, 128 operations later, with another's.
 * Larger data stays where it is: copying it would cost bandwidth, and programs that
 * send it wait for completion. */
#define RCH_REST_COPY_MAX 4096

/* Copies a queued send's data entries (those after `first`: the header, when it is
 * still to go, is in the request already) into one buffer the request owns, when they
 * total at most RCH_REST_COPY_MAX bytes, and points the iov at it. `offered`: the
 * connection saw these buffers, so it may have announced one for zero-copy, which
 * must then go from its own memory; offering the copy at once tells (the library
 * refuses other buffers first with RCH_ERR_IN_FLIGHT, and the iov is put back).
 * Without memory for the copy the iov stays as it was. */
static int copy_rest(MPIDI_VC_t * vc, MPIR_Request * sreq, int first, int offered)
{
    struct iovec saved[MPL_IOV_LIMIT];
    struct iovec *iov = sreq->dev.iov;
    struct iovec *cur;
    int n = sreq->dev.iov_count;
    int left;
    size_t bytes = 0;
    size_t nb = 0;
    char *copy;
    int i, rc;

    for (i = first; i < n; i++)
        bytes += iov[i].iov_len;
    if (bytes == 0 || bytes > RCH_REST_COPY_MAX)
        return MPI_SUCCESS;
    copy = MPL_malloc(bytes, MPL_MEM_BUFFER);
    if (copy == NULL)
        return MPI_SUCCESS;
    memcpy(saved, iov, n * sizeof(*iov));
    for (i = first, bytes = 0; i < n; i++) {
        memcpy(copy + bytes, iov[i].iov_base, iov[i].iov_len);
        bytes += iov[i].iov_len;
    }
    iov[first].iov_base = copy;
    iov[first].iov_len = bytes;
    sreq->dev.iov_count = first + 1;
    MPL_free(sreq->ch.rest_copy);
    sreq->ch.rest_copy = copy;
    if (!offered)
        return MPI_SUCCESS;

    rc = rch_put_datav(vc->ch.rvc, iov, first + 1, &nb);
    if (rc == RCH_ERR_IN_FLIGHT) {
        /* A zero-copy transfer of the rest: it goes from the caller's memory. */
        memcpy(iov, saved, n * sizeof(*iov));
        sreq->dev.iov_count = n;
        MPL_free(copy);
        sreq->ch.rest_copy = NULL;
        return MPI_SUCCESS;
    }
    if (rc != RCH_SUCCESS)
        return MPIDI_CH3I_Rch_error(rc, "put", vc->pg_rank);
    /* What went now is behind the iov offset; all of it, and the progress engine
     * completes the request on its next pass. */
    cur = iov;
    left = first + 1;
    MPIDI_CH3I_Advance_iov(&cur, &left, nb);
    sreq->dev.iov_offset = cur - iov;
    return MPI_SUCCESS;
}

/* A request of CH3's "start" calls: two references (the caller's and the one
 * released at completion), completion action "complete". */
static MPIR_Request *new_send_request(void)
{
    MPIR_Request *sreq = MPIR_Request_create(MPIR_REQUEST_KIND__SEND);
    if (sreq == NULL)
        return NULL;
    MPIR_Object_set_ref(sreq, 2);
    sreq->dev.OnDataAvail = NULL;
    return sreq;
}

/* Queues a request behind the VC's others and has the progress engine push it. */
static void enqueue(MPIDI_VC_t * vc, MPIR_Request * sreq)
{
    MPIDI_CH3I_SendQ_enqueue(&vc->ch, sreq);
    MPIDI_CH3I_VC_make_active(vc);
}

/* A request wholly put with buffers lent: it waits in the lent queue, and the
 * progress engine completes it once they are released. */
static void enqueue_lent(MPIDI_VC_t * vc, MPIR_Request * sreq)
{
    MPIDI_CH3I_LentQ_enqueue(&vc->ch, sreq);
    MPIDI_CH3I_VC_make_active(vc);
}

/* Completes the lent queue's requests whose buffers the connection released. */
static int reap_lent(MPIDI_VC_t * vc, int *made_progress)
{
    MPIDI_CH3I_VC *vcch = &vc->ch;
    uint64_t released = 0;
    int mpi_errno = MPI_SUCCESS;
    int rc = rch_lends_released(vcch->rvc, &released);
    if (rc != RCH_SUCCESS)
        return MPIDI_CH3I_Rch_error(rc, "put", vc->pg_rank);
    while (!MPIDI_CH3I_LentQ_empty(vcch) && vcch->lentq_head->ch.lent_ticket <= released) {
        MPIR_Request *sreq = vcch->lentq_head;
        sreq->ch.lent_ticket = 0;
        *made_progress = 1;
        /* Lent requests have no OnDataAvail (lendable): completion is all. */
        mpi_errno = MPID_Request_complete(sreq);
        MPIDI_CH3I_LentQ_dequeue(vcch);
        if (mpi_errno != MPI_SUCCESS)
            break;
    }
    return mpi_errno;
}

/* Runs a send request's completion action once its iov has gone: complete it, or
 * let OnDataAvail load the next part (then *more is set and the request's iov is
 * fresh, to be sent from offset 0). */
static int send_iov_done(MPIDI_VC_t * vc, MPIR_Request * sreq, int *more)
{
    int mpi_errno = MPI_SUCCESS;
    int (*reqFn) (MPIDI_VC_t *, MPIR_Request *, int *) = sreq->dev.OnDataAvail;
    *more = 0;
    if (reqFn == NULL) {
        MPIR_Assert(MPIDI_Request_get_type(sreq) != MPIDI_REQUEST_TYPE_GET_RESP);
        mpi_errno = MPID_Request_complete(sreq);
    } else {
        int complete = 0;
        mpi_errno = reqFn(vc, sreq, &complete);
        if (mpi_errno == MPI_SUCCESS && !complete) {
            sreq->dev.iov_offset = 0;
            *more = 1;
        }
    }
    return mpi_errno;
}

/* The common path of all four entry points: `iov[0]` is the header. With `sreq`
 * NULL a request is made only if something is left (the "start" calls). */
static int send_common(MPIDI_VC_t * vc, MPIR_Request * sreq, struct iovec *iov, int n,
                       MPIR_Request ** sreq_out)
{
    int mpi_errno = MPI_SUCCESS;
    MPIDI_CH3I_VC *vcch = &vc->ch;
    const void *hdr = iov[0].iov_base;
    size_t hdr_len;
    struct iovec *cur = iov;
    int left = n;
    int done = 0;
    unsigned long long ticket = 0;
    /* A send that loads its data piece by piece reuses the buffer: not lent. */
    int lendable = sreq == NULL || sreq->dev.OnDataAvail == NULL;

    MPIR_Assert(n >= 1 && n <= MPL_IOV_LIMIT);
    MPIR_Assert(iov[0].iov_len <= sizeof(MPIDI_CH3_Pkt_t));
    /* The receiver reads this many header bytes, by the type (and an eager
     * message's size), before the handler. */
    hdr_len = MPIDI_CH3I_Pkt_wire_len_at(hdr, sizeof(MPIDI_CH3_Pkt_t));
    if (hdr_len == RCH_ALIGNED_SEND_LEN) {
        /* The padding goes as zeros, not as what the caller's packet union held
         * there (CH3 builds each header in a whole MPIDI_CH3_Pkt_t, ours to fill). */
        memset((char *) (uintptr_t) hdr + sizeof(MPIDI_CH3_Pkt_send_t), 0,
               RCH_ALIGNED_SEND_LEN - sizeof(MPIDI_CH3_Pkt_send_t));
    }
    iov[0].iov_len = hdr_len;

    if (vcch->state == MPIDI_CH3I_VC_STATE_FAILED || vcch->state == MPIDI_CH3I_VC_STATE_TERMINATED) {
        MPIR_ERR_SET1(mpi_errno, MPI_ERR_OTHER, "**ch3|rch|peerlost", "**ch3|rch|peerlost %d",
                      vc->pg_rank);
        goto fail_request;
    }

    if (MPIDI_CH3I_SendQ_empty(vcch)) {
        mpi_errno = MPIDI_CH3I_Put_iov(vc, &cur, &left, &done, lendable ? &ticket : NULL);
        if (mpi_errno != MPI_SUCCESS) {
            /* The connection broke: everything queued on it fails with this error. */
            MPIDI_CH3I_VC_fail(vc, mpi_errno);
            goto fail_request;
        }
    }

    if (done && ticket != 0) {
        /* All went, with buffers lent: complete once they are released. */
        if (sreq == NULL) {
            sreq = new_send_request();
            MPIR_ERR_CHKANDJUMP(sreq == NULL, mpi_errno, MPI_ERR_OTHER, "**nomem");
            *sreq_out = sreq;
        }
        sreq->ch.lent_ticket = ticket;
        enqueue_lent(vc, sreq);
    } else if (done) {
        if (sreq == NULL) {
            *sreq_out = NULL;
        } else {
            int more;
            mpi_errno = send_iov_done(vc, sreq, &more);
            MPIR_ERR_CHECK(mpi_errno);
            if (more)
                enqueue(vc, sreq);
        }
    } else {
        /* Header bytes still to go: those of the first entry if it is the header. */
        int hdr_left = (cur == iov);
        size_t sent_hdr = hdr_left ? hdr_len - cur->iov_len : 0;
        if (sreq == NULL) {
            sreq = new_send_request();
            MPIR_ERR_CHKANDJUMP(sreq == NULL, mpi_errno, MPI_ERR_OTHER, "**nomem");
            *sreq_out = sreq;
        }
        save_rest(sreq, cur, left, hdr_left, hdr, hdr_len, sent_hdr);
        sreq->ch.lent_ticket = ticket;
        enqueue(vc, sreq);
        /* At the head of the queue the connection was offered its buffers. */
        mpi_errno = copy_rest(vc, sreq, hdr_left, MPIDI_CH3I_SendQ_head(vcch) == sreq);
        if (mpi_errno != MPI_SUCCESS) {
            /* The request is queued: failing the connection completes it with this
             * error, which the caller also sees returned. */
            MPIDI_CH3I_VC_fail(vc, mpi_errno);
        }
    }

  fn_exit:
    return mpi_errno;
  fn_fail:
    goto fn_exit;

  fail_request:
    /* The caller sees the error both as the return value and in the request. */
    {
        if (sreq == NULL) {
            sreq = MPIR_Request_create(MPIR_REQUEST_KIND__SEND);
            MPIR_ERR_CHKANDJUMP(sreq == NULL, mpi_errno, MPI_ERR_OTHER, "**nomem");
            MPIR_cc_set(&sreq->cc, 0);
            sreq->status.MPI_ERROR = mpi_errno;
            *sreq_out = sreq;
        } else {
            sreq->status.MPI_ERROR = mpi_errno;
            MPID_Request_complete(sreq);
        }
        goto fn_exit;
    }
}

int MPIDI_CH3_iStartMsg(MPIDI_VC_t * vc, void *pkt, intptr_t pkt_sz, MPIR_Request ** sreq_ptr)
{
    MPIDI_CH3I_VC *vcch = &vc->ch;
    struct iovec iov[1];
    MPIR_Assert(pkt_sz <= (intptr_t) sizeof(MPIDI_CH3_Pkt_t));
    iov[0].iov_base = pkt;
    iov[0].iov_len = pkt_sz;
    /* The commonest send, an eager-short message or a control packet, on a connected
     * VC with nothing queued: one put of the header, and no request when it all went
     * (send_common's checks and its general iov walk cost an 8 B ping-pong ~100
     * instructions a message). What a put leaves takes the general path's steps. */
    if (vcch->rvc != NULL && vcch->state == MPIDI_CH3I_VC_STATE_CONNECTED &&
        MPIDI_CH3I_SendQ_empty(vcch)) {
        size_t len = MPIDI_CH3I_Pkt_wire_len_at(pkt, sizeof(MPIDI_CH3_Pkt_t));
        if (len == RCH_ALIGNED_SEND_LEN)        /* zeros, as in send_common */
            memset((char *) pkt + sizeof(MPIDI_CH3_Pkt_send_t), 0,
                   RCH_ALIGNED_SEND_LEN - sizeof(MPIDI_CH3_Pkt_send_t));
        size_t nb = 0;
        MPIR_Request *sreq;

        iov[0].iov_len = len;
        /* Through the lane, without a call, when it has room. */
        if (vcch->send_lane != NULL && rch_lane_send(vcch->send_lane, pkt, len, NULL, 0)) {
            MPIDI_CH3I_VC_make_busy(vc);
            *sreq_ptr = NULL;
            return MPI_SUCCESS;
        }
        if (rch_put_datav(vcch->rvc, iov, 1, &nb) != RCH_SUCCESS || nb == 0) {
            /* Nothing went (an error, a full ring): send_common puts again, and
             * queues the packet or reports the connection's error. */
            return send_common(vc, NULL, iov, 1, sreq_ptr);
        }
        /* A peer we write to answers: read it on every pass for a while. */
        MPIDI_CH3I_VC_make_busy(vc);
        find_send_lane(vcch);
        if (nb == len) {
            *sreq_ptr = NULL;
            return MPI_SUCCESS;
        }
        /* Part of the header went: the rest waits in a request, as in send_common. */
        sreq = new_send_request();
        if (sreq == NULL)
            return MPIR_Err_create_code(MPI_SUCCESS, MPIR_ERR_RECOVERABLE, __func__, __LINE__,
                                        MPI_ERR_OTHER, "**nomem", 0);
        iov[0].iov_base = (char *) pkt + nb;
        iov[0].iov_len = len - nb;
        save_rest(sreq, iov, 1, 1, pkt, len, nb);
        enqueue(vc, sreq);
        *sreq_ptr = sreq;
        return MPI_SUCCESS;
    }
    return send_common(vc, NULL, iov, 1, sreq_ptr);
}

int MPIDI_CH3_iStartMsgv(MPIDI_VC_t * vc, struct iovec *iov, int n_iov, MPIR_Request ** sreq_ptr)
{
    return send_common(vc, NULL, iov, n_iov, sreq_ptr);
}

int MPIDI_CH3_iSend(MPIDI_VC_t * vc, MPIR_Request * sreq, void *pkt, intptr_t pkt_sz)
{
    struct iovec iov[1];
    MPIR_Request *unused = NULL;
    MPIR_Assert(pkt_sz <= (intptr_t) sizeof(MPIDI_CH3_Pkt_t));
    iov[0].iov_base = pkt;
    iov[0].iov_len = pkt_sz;
    return send_common(vc, sreq, iov, 1, &unused);
}

int MPIDI_CH3_iSendv(MPIDI_VC_t * vc, MPIR_Request * sreq, struct iovec *iov, int n_iov)
{
    MPIR_Request *unused = NULL;
    return send_common(vc, sreq, iov, n_iov, &unused);
}

int MPIDI_CH3I_Send_progress(MPIDI_VC_t * vc, int *made_progress)
{
    int mpi_errno = MPI_SUCCESS;
    MPIDI_CH3I_VC *vcch = &vc->ch;

    if (!MPIDI_CH3I_LentQ_empty(vcch)) {
        mpi_errno = reap_lent(vc, made_progress);
        MPIR_ERR_CHECK(mpi_errno);
    }
    while (!MPIDI_CH3I_SendQ_empty(vcch)) {
        MPIR_Request *sreq = MPIDI_CH3I_SendQ_head(vcch);
        struct iovec *cur = sreq->dev.iov + sreq->dev.iov_offset;
        int left = sreq->dev.iov_count - (int) sreq->dev.iov_offset;
        int done = 0;
        int more = 0;
        int lendable = sreq->dev.OnDataAvail == NULL;

        if (left > 0) {
            size_t before = left > 0 ? cur->iov_len : 0;
            mpi_errno = MPIDI_CH3I_Put_iov(vc, &cur, &left, &done,
                                           lendable ? &sreq->ch.lent_ticket : NULL);
            MPIR_ERR_CHECK(mpi_errno);
            if (cur != sreq->dev.iov + sreq->dev.iov_offset || (left > 0 && cur->iov_len != before))
                *made_progress = 1;
            sreq->dev.iov_offset = cur - sreq->dev.iov;
            if (!done)
                break;
        }
        *made_progress = 1;
        if (sreq->ch.lent_ticket != 0) {
            /* All went, with buffers lent: it moves to the lent queue (its
             * reference with it), and the next send goes out now. */
            MPIDI_CH3I_SendQ_to_lent(vcch);
            continue;
        }
        mpi_errno = send_iov_done(vc, sreq, &more);
        MPIR_ERR_CHECK(mpi_errno);
        if (!more)
            MPIDI_CH3I_SendQ_dequeue(vcch);
    }

  fn_exit:
    return mpi_errno;
  fn_fail:
    goto fn_exit;
}
