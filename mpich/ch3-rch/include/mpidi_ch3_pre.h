/*
 * ch3:rch - CH3 channel over rdma-channel: what the channel adds to CH3's structures.
 * Included by CH3 before its own types; see mpich/README.md in rdma-channel.
 */

#ifndef MPIDI_CH3_PRE_H_INCLUDED
#define MPIDI_CH3_PRE_H_INCLUDED

/* Dynamic processes (spawn, connect/accept, ports) need a way to reach a process
 * outside the job's PMI key space; rdma-channel connects the ranks of one job. */
#define MPIDI_CH3_HAS_NO_DYNAMIC_PROCESS

/* MPID_Isend sends a contiguous eager message without a request of its own when the
 * channel takes it whole at once (mpich/patches/ch3-isend-eager-without-request.patch:
 * the request's life cost an 8 B MPI_Isend more than its put). */
#define MPIDI_CH3_ISEND_EAGER_WITHOUT_REQUEST

/* MPID_Recv first offers the receive to the channel (MPIDI_CH3_Recv_fast, with the
 * patch mpich/patches/ch3-recv-fast.patch), which may complete it without a request. */
#define MPIDI_CH3_RECV_FAST

#undef MPID_USE_SEQUENCE_NUMBERS

typedef struct {
    int dummy;                  /* CH3 wants a type; the channel keeps nothing per comm */
} MPIDI_CH3I_CH_comm_t;

/* The channel's state of a connection. */
typedef enum MPIDI_CH3I_VC_state {
    MPIDI_CH3I_VC_STATE_UNCONNECTED,    /* nothing sent or received yet */
    MPIDI_CH3I_VC_STATE_CONNECTED,      /* in use */
    MPIDI_CH3I_VC_STATE_TERMINATED,     /* CH3 closed it; rch_vc_close once flushed */
    MPIDI_CH3I_VC_STATE_FAILED          /* the peer died or the connection broke */
} MPIDI_CH3I_VC_state_t;

struct rch_vc;
struct MPIR_Request;
struct MPIDI_CH3I_Rch_recv;

/* Channel fields of a VC: the send queue of requests not yet wholly put, the
 * rdma-channel connection, and the receive state (a packet header being read, or
 * the request whose iov is being filled). */
typedef struct MPIDI_CH3I_VC {
    struct MPIR_Request *sendq_head;
    struct MPIR_Request *sendq_tail;
    /* Sends wholly put whose data rdma-channel holds lent (rch_put_lend): each
     * completes once rch_lends_released reports its ticket. */
    struct MPIR_Request *lentq_head;
    struct MPIR_Request *lentq_tail;
    MPIDI_CH3I_VC_state_t state;
    struct rch_vc *rvc;
    /* The connection's send lane (rch_vc_send_lane), once a put went through: small
     * packets are written into the peer's ring without a call. */
    struct rch_send_lane *send_lane;
    struct MPIDI_CH3I_Rch_recv *recv;
    /* Position in the channel's list of VCs that need the progress engine. */
    struct MPIDI_VC *active_next;
    int in_active_list;
    /* Position in the list of VCs whose read-ahead stage holds bytes not handled
     * yet (rdma-channel cannot know of them: they left its ring). */
    struct MPIDI_VC *staged_next;
    int in_staged_list;
    /* Position in the list of VCs read on every pass (they had traffic lately), and
     * the passes in a row that read nothing from it. */
    struct MPIDI_VC *busy_next;
    int in_busy_list;
    int busy_quiet;
} MPIDI_CH3I_VC;

#define MPIDI_CH3_VC_DECL struct MPIDI_CH3I_VC ch;

/* Channel fields of a request: the buffer holding a copy of a queued send's small
 * rest (ch3_send.c, copy_rest), freed when the send leaves the VC's queue, and the
 * ticket of the last of its buffers rdma-channel holds lent (0: none). */
typedef struct MPIDI_CH3I_Request {
    void *rest_copy;
    unsigned long long lent_ticket;
} MPIDI_CH3I_Request;

#define MPIDI_CH3_REQUEST_DECL MPIDI_CH3I_Request ch;
#define MPIDI_CH3_REQUEST_INIT(req_) ((req_)->ch.rest_copy = NULL, (req_)->ch.lent_ticket = 0)

/* Progress state between MPID_Progress_start / wait / end. */
typedef struct MPIDI_CH3I_Progress_state {
    int completion_count;
} MPIDI_CH3I_Progress_state;

#define MPIDI_CH3_PROGRESS_STATE_DECL MPIDI_CH3I_Progress_state ch;

extern volatile unsigned int MPIDI_CH3I_progress_completion_count;

#if defined(MPICH_IS_THREADED)
extern volatile int MPIDI_CH3I_progress_blocked;
extern volatile int MPIDI_CH3I_progress_wakeup_signalled;
void MPIDI_CH3I_Progress_wakeup(void);
#define MPIDI_CH3I_PROGRESS_WAKEUP                                                                \
    do {                                                                                          \
        if (MPIDI_CH3I_progress_blocked == TRUE && MPIDI_CH3I_progress_wakeup_signalled == FALSE) \
        {                                                                                         \
            MPIDI_CH3I_progress_wakeup_signalled = TRUE;                                          \
            MPIDI_CH3I_Progress_wakeup();                                                         \
        }                                                                                         \
    } while (0)
#endif

#endif /* MPIDI_CH3_PRE_H_INCLUDED */
