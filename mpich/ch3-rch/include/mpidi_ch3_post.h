/*
 * ch3:rch - CH3 channel over rdma-channel: progress macros and the eager limit.
 */

#ifndef MPIDI_CH3_POST_H_INCLUDED
#define MPIDI_CH3_POST_H_INCLUDED

/* Messages up to this size go eagerly (header and data in one put); larger ones use
 * CH3's rendezvous, whose data rdma-channel moves by RDMA READ from the sender's
 * buffer when it is large enough for zero-copy. */
#if !defined(MPIDI_CH3_EAGER_MAX_MSG_SIZE)
#define MPIDI_CH3_EAGER_MAX_MSG_SIZE (128 * 1024)
#endif

#define MPIDI_CH3_Progress_start(progress_state_)                                       \
    {                                                                                   \
        MPID_THREAD_CS_ENTER(POBJ, MPIR_THREAD_GLOBAL_ALLFUNC_MUTEX);                   \
        (progress_state_)->ch.completion_count = MPIDI_CH3I_progress_completion_count;  \
    }
#define MPIDI_CH3_Progress_end(progress_state_) \
    MPID_THREAD_CS_EXIT(POBJ, MPIR_THREAD_GLOBAL_ALLFUNC_MUTEX)
#define MPIDI_CH3_Progress_poke() (MPIDI_CH3_Progress_test())

int MPIDI_CH3I_Progress(int blocking, MPID_Progress_state * state);
#define MPIDI_CH3_Progress_test() MPIDI_CH3I_Progress(FALSE, NULL)
#define MPIDI_CH3_Progress_wait(state) MPIDI_CH3I_Progress(TRUE, state)

/* A blocking receive the channel may complete without a request (MPIDI_CH3_RECV_FAST). */
int MPIDI_CH3_Recv_fast(void *buf, MPI_Aint count, MPI_Datatype datatype, int rank, int tag,
                        MPIR_Comm * comm, int context_offset, MPI_Status * status);

#endif /* MPIDI_CH3_POST_H_INCLUDED */
