/*
 * thread_wakeup.c - MPI_THREAD_MULTIPLE: a thread blocked in the progress engine is
 * woken when another thread completes its request. Rank 0's helper thread receives
 * 200 messages that rank 0's main thread sends to rank 0 itself (CH3 completes
 * self-messages without the channel, so only the wakeup can end the helper's sleep
 * in rch_wait early; without it each message would wait out the channel's 100 ms
 * sleep slice: 20 s). Must finish within 5 s. Rank 1 only takes part in the
 * barriers. Run with 2 ranks.
 */
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <unistd.h>

#define N 200

static void *receiver(void *arg)
{
    (void)arg;
    for (int i = 0; i < N; i++) {
        int v = -1;
        MPI_Recv(&v, 1, MPI_INT, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        if (v != i) {
            printf("message %d carried %d\n", i, v);
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int rank, provided, errs = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_MULTIPLE, &provided);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    if (provided != MPI_THREAD_MULTIPLE) {
        if (rank == 0)
            printf("MPI_THREAD_MULTIPLE not provided (%d)\n", provided);
        MPI_Finalize();
        return 1;
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        pthread_t t;
        double t0 = MPI_Wtime();
        pthread_create(&t, NULL, receiver, NULL);
        for (int i = 0; i < N; i++) {
            usleep(1000); /* let the receiver block first */
            MPI_Send(&i, 1, MPI_INT, 0, 7, MPI_COMM_WORLD);
        }
        pthread_join(t, NULL);
        double took = MPI_Wtime() - t0;
        if (took > 5.0) {
            printf("%d woken receives took %.2f s\n", N, took);
            errs++;
        }
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0 && errs == 0)
        printf(" No Errors\n");
    MPI_Finalize();
    return errs != 0;
}
