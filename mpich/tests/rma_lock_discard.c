/*
 * Exclusive locks contended by every rank, with RMA operations that ride on the lock
 * request and a target that keeps none of their data while the lock waits
 * (MPIR_CVAR_CH3_RMA_TARGET_LOCK_DATA_BYTES=0): CH3 then has the channel read and
 * drop each such operation's payload (a request with dev.drop_data) and the origin
 * sends it again once the lock is granted. Rank 0 holds its own window's lock for a
 * while each round so that the others' requests queue. Every accumulate adds 1 to
 * each element, so the window must end as rounds * ranks everywhere.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define ROUNDS 60
/* Accumulates of 1 KiB to 64 KiB: all below CH3's piggyback limit (64 KiB), so they
 * travel with the lock request; the larger ones span more than one ring packet. */
#define MAX_INTS (64 * 1024 / (int) sizeof(int))

int main(int argc, char **argv)
{
    int rank, nproc, round, errs = 0, n, i;
    int *win_buf, *ones;
    MPI_Win win;

    /* CH3 reads its settings in MPI_Init. An operation rides on the lock request
     * only when CH3 holds it back until the epoch's end. */
    setenv("MPIR_CVAR_CH3_RMA_TARGET_LOCK_DATA_BYTES", "0", 0);
    setenv("MPIR_CVAR_CH3_RMA_DELAY_ISSUING_FOR_PIGGYBACKING", "1", 0);
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nproc);

    ones = malloc(MAX_INTS * sizeof(int));
    for (i = 0; i < MAX_INTS; i++)
        ones[i] = 1;
    MPI_Alloc_mem(MAX_INTS * sizeof(int), MPI_INFO_NULL, &win_buf);
    memset(win_buf, 0, MAX_INTS * sizeof(int));
    MPI_Win_create(win_buf, MAX_INTS * sizeof(int), sizeof(int), MPI_INFO_NULL,
                   MPI_COMM_WORLD, &win);

    for (round = 0; round < ROUNDS; round++) {
        /* Sizes cycle so every round covers the whole window at least once. */
        n = MAX_INTS >> (round % 7);
        if (rank == 0) {
            /* Hold the lock while the others' lock-and-accumulate packets arrive. */
            MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
            MPI_Barrier(MPI_COMM_WORLD);
            usleep(2000);
            MPI_Accumulate(ones, MAX_INTS, MPI_INT, 0, 0, MAX_INTS, MPI_INT, MPI_SUM, win);
            MPI_Win_unlock(0, win);
        } else {
            MPI_Barrier(MPI_COMM_WORLD);
            MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
            MPI_Accumulate(ones, n, MPI_INT, 0, 0, n, MPI_INT, MPI_SUM, win);
            MPI_Win_unlock(0, win);
            /* The rest of the window, so each element gains 1 per rank per round. */
            if (n < MAX_INTS) {
                MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
                MPI_Accumulate(ones, MAX_INTS - n, MPI_INT, 0, n, MAX_INTS - n, MPI_INT,
                               MPI_SUM, win);
                MPI_Win_unlock(0, win);
            }
        }
        /* Rank 0's next lock must not be queued before this round's last unlock: it
         * holds that lock across the barrier. */
        MPI_Barrier(MPI_COMM_WORLD);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        MPI_Win_lock(MPI_LOCK_EXCLUSIVE, 0, 0, win);
        for (i = 0; i < MAX_INTS; i++) {
            if (win_buf[i] != ROUNDS * nproc) {
                if (errs < 5)
                    printf("element %d is %d, expected %d\n", i, win_buf[i], ROUNDS * nproc);
                errs++;
            }
        }
        MPI_Win_unlock(0, win);
    }
    MPI_Win_free(&win);
    MPI_Free_mem(win_buf);
    free(ones);
    if (rank == 0) {
        if (errs == 0)
            printf("No Errors\n");
        else
            printf("%d wrong elements\n", errs);
    }
    MPI_Finalize();
    return 0;
}
