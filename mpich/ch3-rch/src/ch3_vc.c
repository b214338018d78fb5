/*
 * ch3:rch - CH3 channel over rdma-channel: the VC's state shared by the send side
 * and the progress engine.
 *
 * The two lists the progress engine walks (VCs with something to send, VCs to read on
 * every pass) and the calls that put a VC on them, a VC's failure, and the MPI error
 * codes of rdma-channel's statuses. This file calls neither ch3_send.c nor
 * ch3_progress.c: the send side uses it, and the progress engine uses both it and
 * the send side, so the calls between the files run one way.
 */

#include "mpidi_ch3_impl.h"

MPIDI_VC_t *MPIDI_CH3I_active_head;
MPIDI_VC_t *MPIDI_CH3I_busy_head;

int MPIDI_CH3I_Rch_error(int rc, const char *what, int rank)
{
    const char *detail = rch_last_error();
    const char *name = rch_strerror(rc);
    int errclass = MPI_ERR_OTHER;

    if (rc == RCH_ERR_NO_MEMORY)
        errclass = MPI_ERR_NO_MEM;
    if (rank >= 0 && what[0] == 'p')
        return MPIR_Err_create_code(MPI_SUCCESS, MPIR_ERR_RECOVERABLE, __func__, __LINE__, errclass,
                                    "**ch3|rch|put", "**ch3|rch|put %d %s %s", rank, name,
                                    detail);
    if (rank >= 0)
        return MPIR_Err_create_code(MPI_SUCCESS, MPIR_ERR_RECOVERABLE, __func__, __LINE__, errclass,
                                    "**ch3|rch|read", "**ch3|rch|read %d %s %s", rank, name,
                                    detail);
    if (what[0] == 'i')
        return MPIR_Err_create_code(MPI_SUCCESS, MPIR_ERR_FATAL, __func__, __LINE__, errclass,
                                    "**ch3|rch|init", "**ch3|rch|init %s %s", name, detail);
    if (what[0] == 'f')
        return MPIR_Err_create_code(MPI_SUCCESS, MPIR_ERR_RECOVERABLE, __func__, __LINE__, errclass,
                                    "**ch3|rch|finalize", "**ch3|rch|finalize %s %s", name,
                                    detail);
    return MPIR_Err_create_code(MPI_SUCCESS, MPIR_ERR_RECOVERABLE, __func__, __LINE__, errclass,
                                "**ch3|rch|wait", "**ch3|rch|wait %s %s", name, detail);
}

void MPIDI_CH3I_VC_make_active(MPIDI_VC_t * vc)
{
    if (!vc->ch.in_active_list) {
        vc->ch.in_active_list = 1;
        vc->ch.active_next = MPIDI_CH3I_active_head;
        MPIDI_CH3I_active_head = vc;
    }
}

/* Completes every queued or lent send and the receive in progress with `err`, then tells
 * CH3 the connection is gone (it fails the receives posted for this rank). */
int MPIDI_CH3I_VC_fail(MPIDI_VC_t * vc, int err)
{
    MPIDI_CH3I_VC *vcch = &vc->ch;
    int mpi_errno = MPI_SUCCESS;

    if (vcch->state == MPIDI_CH3I_VC_STATE_FAILED)
        return MPI_SUCCESS;
    vcch->state = MPIDI_CH3I_VC_STATE_FAILED;
    while (!MPIDI_CH3I_SendQ_empty(vcch)) {
        MPIR_Request *sreq = MPIDI_CH3I_SendQ_head(vcch);
        sreq->status.MPI_ERROR = err;
        MPID_Request_complete(sreq);
        MPIDI_CH3I_SendQ_dequeue(vcch);
    }
    /* Lent buffers are revoked with the connection (rch_vc_close below, or the
     * library did on the error): the sends that lent them complete with it too. */
    while (!MPIDI_CH3I_LentQ_empty(vcch)) {
        MPIR_Request *sreq = vcch->lentq_head;
        sreq->ch.lent_ticket = 0;
        sreq->status.MPI_ERROR = err;
        MPID_Request_complete(sreq);
        MPIDI_CH3I_LentQ_dequeue(vcch);
    }
    if (vcch->recv->active != NULL) {
        MPIR_Request *rreq = vcch->recv->active;
        vcch->recv->active = NULL;
        rreq->status.MPI_ERROR = err;
        MPID_Request_complete(rreq);
    }
    if (vcch->rvc != NULL)
        rch_vc_close(vcch->rvc);
    /* Only VCs CH3 knows as used have close state to unwind. */
    if (vc->state != MPIDI_VC_STATE_INACTIVE && vc->state != MPIDI_VC_STATE_MORIBUND)
        mpi_errno = MPIDI_CH3U_Handle_connection(vc, MPIDI_VC_EVENT_TERMINATED);
    return mpi_errno;
}

/* A peer we wrote to, or that rdma-channel reported ready: read it on every pass until
 * it has been quiet for a while (RCH_BUSY_QUIET passes, ch3_progress.c). */
void MPIDI_CH3I_VC_make_busy(MPIDI_VC_t * vc)
{
    MPIDI_CH3I_VC *vcch = &vc->ch;
    vcch->busy_quiet = 0;
    if (!vcch->in_busy_list) {
        vcch->in_busy_list = 1;
        vcch->busy_next = MPIDI_CH3I_busy_head;
        MPIDI_CH3I_busy_head = vc;
    }
}
