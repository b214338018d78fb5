/*
 * idle_wait.c - a rank blocked in MPI_Recv does not burn its CPU: rank 1 sleeps
 * 3 s before it sends; rank 0's CPU time over that wait must stay under a quarter
 * of the wall time (ch3:rch polls briefly, then sleeps in rch_wait). Run with 2
 * ranks; prints the CPU time, then " No Errors" as MPICH's tests do.
 */
#include <mpi.h>
#include <stdio.h>
#include <sys/resource.h>
#include <unistd.h>

static double cpu_seconds(void)
{
    struct rusage u;
    getrusage(RUSAGE_SELF, &u);
    return u.ru_utime.tv_sec + u.ru_stime.tv_sec + (u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

int main(int argc, char **argv)
{
    int rank, errs = 0, v = 0;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        sleep(3);
        v = 42;
        MPI_Send(&v, 1, MPI_INT, 0, 0, MPI_COMM_WORLD);
    } else if (rank == 0) {
        double c0 = cpu_seconds(), t0 = MPI_Wtime();
        MPI_Recv(&v, 1, MPI_INT, 1, 0, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        double cpu = cpu_seconds() - c0, wall = MPI_Wtime() - t0;
        if (v != 42) {
            printf("received %d, expected 42\n", v);
            errs++;
        }
        printf("MPI_Recv used %.2f s of CPU in %.2f s of waiting\n", cpu, wall);
        if (cpu > wall / 4)
            errs++;
        if (errs == 0)
            printf(" No Errors\n");
    }
    MPI_Finalize();
    return errs != 0;
}
