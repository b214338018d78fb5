/*
 * MPI_Win_flush_local after large accumulates, each epoch in a new window (after
 * MPICH's rma/large_acc_flush_local, which hung on ch3:rch). An operation too large
 * to ride on the lock request waits for the lock grant, and CH3 then issues it from
 * its progress hook; when the channel takes it whole at once no request completes,
 * and a flush_local blocked in the progress engine must still wake. The window must
 * end with every byte counted.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MIN_SIZE (256 * 1024)
#define MAX_SIZE (2 * 1024 * 1024)
#define OPS 4
#define WINDOWS 40

int main(int argc, char **argv)
{
    int rank, nproc, w, i, size, errs = 0;
    unsigned char *target, *origin;
    MPI_Win win;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nproc);
    MPI_Alloc_mem(MAX_SIZE, MPI_INFO_NULL, &origin);
    MPI_Alloc_mem(MAX_SIZE, MPI_INFO_NULL, &target);
    memset(origin, 1, MAX_SIZE);
    memset(target, 0, MAX_SIZE);

    for (w = 0; w < WINDOWS; w++) {
        MPI_Win_create(target, MAX_SIZE, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win);
        MPI_Win_lock_all(0, win);
        if (rank != 0) {
            for (size = MIN_SIZE; size <= MAX_SIZE; size *= 2) {
                for (i = 0; i < OPS; i++) {
                    MPI_Accumulate(origin, size, MPI_UNSIGNED_CHAR, 0, 0, size,
                                   MPI_UNSIGNED_CHAR, MPI_SUM, win);
                    MPI_Win_flush_local(0, win);
                }
                MPI_Win_flush(0, win);
            }
        }
        MPI_Win_unlock_all(win);
        MPI_Win_free(&win);
    }

    if (rank == 0) {
        /* Byte b gained 1 from each other rank, OPS times, for every size above b. */
        for (i = 0; i < MAX_SIZE; i++) {
            long adds = 0;
            for (size = MIN_SIZE; size <= MAX_SIZE; size *= 2)
                if (i < size)
                    adds += (long) OPS * (nproc - 1) * WINDOWS;
            if (target[i] != (unsigned char) (adds & 0xff)) {
                if (errs < 5)
                    printf("byte %d is %u, expected %ld\n", i, target[i], adds & 0xff);
                errs++;
            }
        }
        if (errs == 0)
            printf("No Errors\n");
        else
            printf("%d wrong bytes\n", errs);
    }
    MPI_Free_mem(origin);
    MPI_Free_mem(target);
    MPI_Finalize();
    return 0;
}
