/*
 * A program that refills its origin buffer right after each MPI_Accumulate, as
 * MPICH's rma/atomic_get tests do. MPI allows reusing it only after a flush or the
 * epoch's end, but other MPIs take small operations' data at once and programs rely
 * on it; ch3:rch left the rest of an operation pointing into the buffer when the
 * target's ring was full (a ring starts at 16 KiB), so the rest went later with a
 * later operation's values. Here the target sleeps inside the epoch while rank 1
 * issues many small accumulates, contiguous (MPI_LONG) and not (a vector of longs
 * with gaps, which CH3 sends as an iov over the buffer), each with its own value;
 * the sums then tell whether any operation's bytes were read after it was issued.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#define OPS 2000
/* Longs per operation; an argument sets it (at most MAX_ELEMS). */
#define ELEMS_DEFAULT 10
#define MAX_ELEMS 256

int main(int argc, char **argv)
{
    int rank, nproc, i, k, errs = 0;
    long *win_buf;
    long origin[2 * MAX_ELEMS];
    long expect = 0;
    int ELEMS = ELEMS_DEFAULT;
    MPI_Datatype gappy;
    MPI_Win win;

    MPI_Init(&argc, &argv);
    if (argc > 1)
        ELEMS = atoi(argv[1]);
    if (ELEMS < 1 || ELEMS > MAX_ELEMS) {
        fprintf(stderr, "rma_reuse_origin: 1 to %d longs per operation\n", MAX_ELEMS);
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nproc);
    if (nproc < 2) {
        fprintf(stderr, "rma_reuse_origin needs 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    /* Every other long of the origin: not contiguous. */
    MPI_Type_vector(ELEMS, 1, 2, MPI_LONG, &gappy);
    MPI_Type_commit(&gappy);
    MPI_Alloc_mem(2 * ELEMS * sizeof(long), MPI_INFO_NULL, &win_buf);
    for (k = 0; k < 2 * ELEMS; k++)
        win_buf[k] = 0;
    MPI_Win_create(win_buf, 2 * ELEMS * sizeof(long), sizeof(long), MPI_INFO_NULL,
                   MPI_COMM_WORLD, &win);

    MPI_Win_fence(0, win);
    /* Both ranks are past the fence's synchronisation, so rank 1's operations go
     * out as they are issued rather than waiting for it. */
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        /* Read nothing for a while: the ring from rank 1 fills. */
        usleep(300 * 1000);
    } else if (rank == 1) {
        for (i = 0; i < OPS; i++) {
            for (k = 0; k < 2 * ELEMS; k++)
                origin[k] = i + 1 + k;
            MPI_Accumulate(origin, ELEMS, MPI_LONG, 0, 0, ELEMS, MPI_LONG, MPI_SUM, win);
            MPI_Accumulate(origin, 1, gappy, 0, ELEMS, ELEMS, MPI_LONG, MPI_SUM, win);
            /* The erroneous reuse: the next operation's values, at once. */
            for (k = 0; k < 2 * ELEMS; k++)
                origin[k] = -1;
        }
    }
    MPI_Win_fence(0, win);

    if (rank == 0) {
        for (i = 0; i < OPS; i++)
            expect += i + 1;
        for (k = 0; k < ELEMS; k++) {
            long contig = expect + (long) OPS * k;
            long gap = expect + (long) OPS * 2 * k;
            if (win_buf[k] != contig || win_buf[ELEMS + k] != gap) {
                if (errs < 10)
                    printf("element %d: contiguous %ld (expected %ld), vector %ld "
                           "(expected %ld)\n", k, win_buf[k], contig, win_buf[ELEMS + k], gap);
                errs++;
            }
        }
    }
    MPI_Win_free(&win);
    MPI_Free_mem(win_buf);
    MPI_Type_free(&gappy);
    MPI_Allreduce(MPI_IN_PLACE, &errs, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0) {
        if (errs == 0)
            printf(" No Errors\n");
        else
            printf(" Found %d errors\n", errs);
    }
    MPI_Finalize();
    return 0;
}
