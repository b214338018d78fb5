/*
 * ch3:rch - CH3 channel over rdma-channel: the channel's private declarations.
 *
 * Send side: a request that could not be put whole waits in its VC's send queue
 * (FIFO, so packets never interleave); the progress engine offers the head's iov to
 * rch_put_datav again, advanced past what was put. Receive side: each VC reads a
 * CH3 packet header (as long as its type's, see MPIDI_CH3I_Pkt_wire_len), hands it
 * to CH3's packet handler, and reads the data into the iov of the request the
 * handler returns, calling OnDataAvail as each iov fills. Both sides honour
 * rdma-channel's zero-copy contract by construction: the iov is only ever advanced
 * by the bytes counted.
 */

#ifndef MPIDI_CH3_IMPL_H_INCLUDED
#define MPIDI_CH3_IMPL_H_INCLUDED

#include "mpidimpl.h"
#include <rch.h>

/* Bytes a VC reads ahead into its stage while small packets are flowing: several
 * headers (and their small payloads) per rch_read_buffered instead of one call per
 * header. Large payloads never go through the stage: rch_read_buffered stops before
 * zero-copy transfers, and after a packet with more than RCH_READAHEAD_DATA_MAX bytes
 * of data the next header is read alone, so big eager data is copied once, from the
 * ring straight into its destination. */
#define RCH_STAGE_SIZE (8 * 1024)
#define RCH_READAHEAD_DATA_MAX 1024

/* A packet type's struct rounded up to 8 bytes, so that the data behind a header
 * stays 8-byte aligned in the stage (CH3's handlers read small payloads in place). */
#define RCH_WIRE_LEN(t) ((sizeof(t) + 7) & ~(size_t) 7)

/* Bytes a CH3 header takes on the wire, by its type: the struct of that type for the
 * point-to-point packets, which every small message carries, and the whole packet
 * union (80 bytes on x86-64) for the others. A whole union would make an 8-byte
 * message 112 ring bytes, two cache lines between the cores; its eager header (24
 * bytes) makes it one. Both ends run this build, so they agree on every length, and
 * CH3 builds each header in a whole MPIDI_CH3_Pkt_t, so reading this many bytes from
 * it stays inside it. An unknown type gets the union's size: the receiver then finds
 * it invalid with the whole header read, as before. */
static inline size_t MPIDI_CH3I_Pkt_wire_len(MPIDI_CH3_Pkt_type_t type)
{
    switch (type) {
        case MPIDI_CH3_PKT_EAGER_SEND:
        case MPIDI_CH3_PKT_EAGER_SYNC_SEND:
        case MPIDI_CH3_PKT_READY_SEND:
        case MPIDI_CH3_PKT_RNDV_REQ_TO_SEND:
            return RCH_WIRE_LEN(MPIDI_CH3_Pkt_send_t);
#if defined(USE_EAGER_SHORT)
        case MPIDI_CH3_PKT_EAGERSHORT_SEND:
            return RCH_WIRE_LEN(MPIDI_CH3_Pkt_eagershort_send_t);
#endif
        case MPIDI_CH3_PKT_EAGER_SYNC_ACK:
            return RCH_WIRE_LEN(MPIDI_CH3_Pkt_eager_sync_ack_t);
        case MPIDI_CH3_PKT_RNDV_CLR_TO_SEND:
            return RCH_WIRE_LEN(MPIDI_CH3_Pkt_rndv_clr_to_send_t);
        case MPIDI_CH3_PKT_RNDV_SEND:
            return RCH_WIRE_LEN(MPIDI_CH3_Pkt_rndv_send_t);
        case MPIDI_CH3_PKT_CANCEL_SEND_REQ:
            return RCH_WIRE_LEN(MPIDI_CH3_Pkt_cancel_send_req_t);
        case MPIDI_CH3_PKT_CANCEL_SEND_RESP:
            return RCH_WIRE_LEN(MPIDI_CH3_Pkt_cancel_send_resp_t);
        default:
            return sizeof(MPIDI_CH3_Pkt_t);
    }
}

/* Eager messages of at least RCH_ALIGNED_DATA_MIN bytes carry their header padded
 * with zeros to RCH_ALIGNED_SEND_LEN bytes, so that their data starts on a cache line
 * of the ring: a packet starts on a line (RCH_LANE_CELL) and its library header is 16
 * bytes. Copies between the cores run slower from and into a ring position that is
 * not on a line, against a buffer that is (a C model of a 4 KiB ping-pong through a
 * ring, the ring's data 40 bytes past a line against a line: 904-940 ns one-way
 * against 834-861; bench/notebook/2026-12.md). Small messages keep the 24-byte header
 * (one cache line for an 8-byte message). */
#define RCH_ALIGNED_DATA_MIN 2048
#define RCH_ALIGNED_SEND_LEN 48u
_Static_assert(16 + RCH_ALIGNED_SEND_LEN == RCH_LANE_CELL, "data on a line");
_Static_assert(RCH_ALIGNED_SEND_LEN >= RCH_WIRE_LEN(MPIDI_CH3_Pkt_send_t), "the header fits");
_Static_assert(RCH_ALIGNED_SEND_LEN <= sizeof(MPIDI_CH3_Pkt_t), "the padding is in the union");

/* Whether a packet of `type` carries data behind a send header (data_sz bytes). */
static inline int MPIDI_CH3I_Pkt_carries_data(MPIDI_CH3_Pkt_type_t type)
{
    return type == MPIDI_CH3_PKT_EAGER_SEND || type == MPIDI_CH3_PKT_EAGER_SYNC_SEND ||
        type == MPIDI_CH3_PKT_READY_SEND;
}

/* Bytes the header at `pkt` takes on the wire, of which `avail` are there (at least
 * its type): MPIDI_CH3I_Pkt_wire_len of its type, but RCH_ALIGNED_SEND_LEN for an
 * eager message of RCH_ALIGNED_DATA_MIN bytes or more. While the send header itself
 * has not all arrived, its unpadded length: the caller waits for that many bytes
 * and asks again. */
static inline size_t MPIDI_CH3I_Pkt_wire_len_at(const void *pkt, size_t avail)
{
    MPIDI_CH3_Pkt_type_t type;
    intptr_t data_sz;
    memcpy(&type, pkt, sizeof(type));
    if (!MPIDI_CH3I_Pkt_carries_data(type))
        return MPIDI_CH3I_Pkt_wire_len(type);
    if (avail < RCH_WIRE_LEN(MPIDI_CH3_Pkt_send_t))
        return RCH_WIRE_LEN(MPIDI_CH3_Pkt_send_t);
    memcpy(&data_sz, (const char *) pkt + offsetof(MPIDI_CH3_Pkt_send_t, data_sz),
           sizeof(data_sz));
    return data_sz >= RCH_ALIGNED_DATA_MIN ? RCH_ALIGNED_SEND_LEN
        : RCH_WIRE_LEN(MPIDI_CH3_Pkt_send_t);
}

/* Every length above fits in the union (a header that is not a multiple of 8 costs
 * only align_stage's move). */
_Static_assert(RCH_WIRE_LEN(MPIDI_CH3_Pkt_send_t) <= sizeof(MPIDI_CH3_Pkt_t), "fits the union");
#if defined(USE_EAGER_SHORT)
_Static_assert(RCH_WIRE_LEN(MPIDI_CH3_Pkt_eagershort_send_t) <= sizeof(MPIDI_CH3_Pkt_t),
               "fits the union");
#endif
_Static_assert(RCH_WIRE_LEN(MPIDI_CH3_Pkt_cancel_send_req_t) <= sizeof(MPIDI_CH3_Pkt_t),
               "fits the union");
_Static_assert(RCH_WIRE_LEN(MPIDI_CH3_Pkt_cancel_send_resp_t) <= sizeof(MPIDI_CH3_Pkt_t),
               "fits the union");

/* Bytes read for a header before its type is known, after a large payload (the next
 * payload should go from the ring straight to its destination): the eager header,
 * the commonest. A shorter header leaves a few payload bytes in the stage, a longer
 * one is completed by a second read. */
#define RCH_HEADER_GUESS RCH_WIRE_LEN(MPIDI_CH3_Pkt_send_t)

/* Size of a VC's discard buffer (see MPIDI_CH3I_Rch_recv.discard). */
#define RCH_DISCARD_SIZE (64 * 1024)

/* Receive state of one VC (allocated when the VC is initialised). */
typedef struct MPIDI_CH3I_Rch_recv {
    /* The header at hand, copied out of the stage (CH3's handlers want it aligned). */
    MPIDI_CH3_Pkt_t pkt;
    /* The request whose iov is being filled; NULL while reading a header. */
    MPIR_Request *active;
    /* Read-ahead bytes not consumed yet: stage[pos, len). */
    char *stage;
    size_t pos;
    size_t len;
    /* Data bytes of the last packet: whether to read ahead for the next header. */
    size_t last_data;
    /* Bytes of a packet handled in place (rch_peek) that the connection still lends:
     * the next look consumes them with rch_consume_peek, one library call per packet
     * (a reply the handler's completion leads to goes out before that look). */
    size_t lent_pending;
    /* The connection's quiet state as rch_consume_peek_lane left it: a look while
     * it holds costs a few loads, not a library call, and the packet that lands
     * next is found and handled without one (rch_lane_packet; the next
     * rch_consume_peek_lane gives it back). Its words are readable only until the
     * next read call on the connection: every read here other than
     * rch_consume_peek_lane empties it first (MPIDI_CH3I_Rch_unwatch). */
    rch_lane lane;
    /* Looks for a burst after a completion (recv_progress) that found nothing, in a
     * row, up to RCH_BURST_MISSES; past that, completions that skipped the look. */
    unsigned int burst_misses;
    unsigned int burst_skips;
    /* Where the payload of a request CH3 drops (dev.drop_data) is read from the
     * connection and forgotten, allocated on first use; discard_off is where the next
     * read starts in it (a zero-copy transfer read into it may be counted in parts). */
    char *discard;
    size_t discard_off;
} MPIDI_CH3I_Rch_recv;

/* Forgets a connection's lane, before a read call that may let its words go (and
 * that reads a packet the lane lent, if any, as the library's next bytes). */
static inline void MPIDI_CH3I_Rch_unwatch(MPIDI_CH3I_Rch_recv * rs)
{
    /* Packets the lane passed are the library's to consume first (settle_lane). */
    MPIR_Assert(rs->lane.passed == 0);
    rs->lane.watch.count = 0;
    rs->lane.watch.tests_left = 0;
    rs->lane.lent = 0;
}

/* A VC's request queues (the send queue, the lent queue) are lists through the
 * requests' `next` field, a request on one queue at a time; each queue holds a
 * reference to its requests so that `next` stays valid until it leaves. Not
 * thread-safe by themselves: callers hold CH3's global critical section, as for
 * every channel call. */
static inline void MPIDI_CH3I_Queue_append(MPIR_Request ** head, MPIR_Request ** tail,
                                           MPIR_Request * req)
{
    req->next = NULL;
    if (*tail != NULL)
        (*tail)->next = req;
    else
        *head = req;
    *tail = req;
}

/* Takes the head off a queue (with the queue's reference, for the caller). */
static inline MPIR_Request *MPIDI_CH3I_Queue_pop(MPIR_Request ** head, MPIR_Request ** tail)
{
    MPIR_Request *req = *head;
    *head = req->next;
    if (*head == NULL)
        *tail = NULL;
    return req;
}

static inline void MPIDI_CH3I_SendQ_enqueue(MPIDI_CH3I_VC * vcch, MPIR_Request * req)
{
    MPIR_Request_add_ref(req);
    MPIDI_CH3I_Queue_append(&vcch->sendq_head, &vcch->sendq_tail, req);
}

/* Takes the send queue's head off, its iov gone (or failed): nothing points into
 * the copy of its rest now. Returns it with the queue's reference. */
static inline MPIR_Request *MPIDI_CH3I_SendQ_pop(MPIDI_CH3I_VC * vcch)
{
    MPIR_Request *req = MPIDI_CH3I_Queue_pop(&vcch->sendq_head, &vcch->sendq_tail);
    MPL_free(req->ch.rest_copy);
    req->ch.rest_copy = NULL;
    return req;
}

static inline void MPIDI_CH3I_SendQ_dequeue(MPIDI_CH3I_VC * vcch)
{
    MPIR_Request_free(MPIDI_CH3I_SendQ_pop(vcch));
}

/* The queue of sends whose buffers are lent: a send wholly put leaves the send
 * queue for it (MPIDI_CH3I_SendQ_to_lent) or goes there at once. */
static inline void MPIDI_CH3I_LentQ_enqueue(MPIDI_CH3I_VC * vcch, MPIR_Request * req)
{
    MPIR_Request_add_ref(req);
    MPIDI_CH3I_Queue_append(&vcch->lentq_head, &vcch->lentq_tail, req);
}

static inline void MPIDI_CH3I_LentQ_dequeue(MPIDI_CH3I_VC * vcch)
{
    MPIR_Request_free(MPIDI_CH3I_Queue_pop(&vcch->lentq_head, &vcch->lentq_tail));
}

#define MPIDI_CH3I_LentQ_empty(vcch) ((vcch)->lentq_head == NULL)

/* Moves the send queue's head to the lent queue, the queue's reference with it. */
static inline void MPIDI_CH3I_SendQ_to_lent(MPIDI_CH3I_VC * vcch)
{
    MPIDI_CH3I_Queue_append(&vcch->lentq_head, &vcch->lentq_tail, MPIDI_CH3I_SendQ_pop(vcch));
}

/* Moves an iov past `nb` bytes that a put or read counted; a partly done entry keeps
 * its rest. */
static inline void MPIDI_CH3I_Advance_iov(struct iovec **iovp, int *np, size_t nb)
{
    struct iovec *iov = *iovp;
    int n = *np;
    while (n > 0 && nb >= iov->iov_len) {
        nb -= iov->iov_len;
        iov++;
        n--;
    }
    if (n > 0) {
        iov->iov_base = (char *) iov->iov_base + nb;
        iov->iov_len -= nb;
    }
    *iovp = iov;
    *np = n;
}

#define MPIDI_CH3I_SendQ_head(vcch) ((vcch)->sendq_head)
#define MPIDI_CH3I_SendQ_empty(vcch) ((vcch)->sendq_head == NULL)

/* ch3_progress.c */
int MPIDI_CH3I_Progress_init(void);
int MPIDI_CH3I_Progress_finalize(void);

/* ch3_vc.c: the lists the progress engine walks (singly linked through the VCs):
 * VCs with a non-empty send queue or a deferred close, and VCs read on every pass. */
extern MPIDI_VC_t *MPIDI_CH3I_active_head;
extern MPIDI_VC_t *MPIDI_CH3I_busy_head;
/* Puts the VC on the list the progress engine walks (idempotent). */
void MPIDI_CH3I_VC_make_active(MPIDI_VC_t * vc);
void MPIDI_CH3I_VC_make_busy(MPIDI_VC_t * vc);
/* Turns an rch_status into an MPI error code naming the call and, for a connection,
 * the rank (-1: none), with rch_last_error()'s detail. */
int MPIDI_CH3I_Rch_error(int rc, const char *what, int rank);
/* Marks a VC failed: its queued sends complete with `err`, CH3 is told the
 * connection terminated (which fails the receives posted for it). */
int MPIDI_CH3I_VC_fail(MPIDI_VC_t * vc, int err);

/* ch3_send.c: put as much of iov[0..n) as the connection takes now; *done is set when
 * all of it went (the iov is advanced in place past what was put). With `ticket` not
 * NULL large buffers may be lent (rch_put_lend): *ticket is raised to the ticket of
 * the last one lent. */
int MPIDI_CH3I_Put_iov(MPIDI_VC_t * vc, struct iovec **iov, int *n, int *done,
                       unsigned long long *ticket);
/* Pushes the VC's send queue as far as the connection takes it, and completes the
 * sends whose lent buffers the connection released. */
int MPIDI_CH3I_Send_progress(MPIDI_VC_t * vc, int *made_progress);
/* True while the VC has sends to push or lent buffers to wait for. */
#define MPIDI_CH3I_VC_send_busy(vcch) \
    (!MPIDI_CH3I_SendQ_empty(vcch) || !MPIDI_CH3I_LentQ_empty(vcch))

/* No shared-memory windows in this channel: the mutex hooks are empty. */
#define MPIDI_CH3I_SHM_MUTEX_LOCK(win_ptr)
#define MPIDI_CH3I_SHM_MUTEX_UNLOCK(win_ptr)
#define MPIDI_CH3I_SHM_MUTEX_INIT(win_ptr)
#define MPIDI_CH3I_SHM_MUTEX_DESTROY(win_ptr)

#endif /* MPIDI_CH3_IMPL_H_INCLUDED */
