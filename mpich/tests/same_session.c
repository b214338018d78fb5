/*
 * same_session.c - the ranks mpiexec starts on one host share one session, each in a
 * process group of its own (mpich/patches/hydra-ranks-share-a-session.patch). With
 * the kernel's autogroups a session is a scheduling group and sched_yield yields only
 * within it: ranks in sessions of their own, as Hydra made them, kept the CPU from
 * the rank beside them while they waited, when ranks outnumber CPUs. Run with 2 or
 * more ranks; prints " No Errors" as MPICH's tests do.
 */
#include <mpi.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int main(int argc, char **argv)
{
    int rank, size, errs = 0, i;
    long mine[2], all[2 * 64];
    char host[MPI_MAX_PROCESSOR_NAME], hosts[64][MPI_MAX_PROCESSOR_NAME];
    int len;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    if (size > 64) {
        if (rank == 0)
            printf("run with at most 64 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(host, 0, sizeof(host));
    MPI_Get_processor_name(host, &len);
    mine[0] = (long) getsid(0);
    mine[1] = (long) (getpgid(0) == getpid());
    MPI_Gather(mine, 2, MPI_LONG, all, 2, MPI_LONG, 0, MPI_COMM_WORLD);
    MPI_Gather(host, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, hosts, MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
               0, MPI_COMM_WORLD);
    if (rank == 0) {
        for (i = 0; i < size; i++) {
            int j;
            if (!all[2 * i + 1]) {
                printf("rank %d is not the leader of a process group of its own\n", i);
                errs++;
            }
            for (j = 0; j < i; j++) {
                if (strcmp(hosts[i], hosts[j]) == 0 && all[2 * i] != all[2 * j]) {
                    printf("ranks %d and %d on %s are in sessions %ld and %ld\n", j, i,
                           hosts[i], all[2 * j], all[2 * i]);
                    errs++;
                }
            }
        }
        if (errs == 0)
            printf(" No Errors\n");
    }
    MPI_Finalize();
    return 0;
}
