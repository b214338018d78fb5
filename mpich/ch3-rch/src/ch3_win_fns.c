/*
 * ch3:rch - CH3 channel over rdma-channel: RMA hooks. One-sided MPI runs on CH3's
 * default active-message implementation over the channel's packets.
 */

#include "mpidimpl.h"
#include "mpidrma.h"

int MPIDI_CH3_Win_fns_init(MPIDI_CH3U_Win_fns_t * win_fns)
{
    MPL_UNREFERENCED_ARG(win_fns);
    return MPI_SUCCESS;
}

int MPIDI_CH3_Win_hooks_init(MPIDI_CH3U_Win_hooks_t * win_hooks)
{
    MPL_UNREFERENCED_ARG(win_hooks);
    return MPI_SUCCESS;
}

int MPIDI_CH3_Win_pkt_orderings_init(MPIDI_CH3U_Win_pkt_ordering_t * win_pkt_orderings)
{
    /* Packets of one connection arrive in the order they were put. */
    win_pkt_orderings->am_flush_ordered = 1;
    return MPI_SUCCESS;
}
