/*
 * osu_mpi.c - OSU-style point-to-point benchmark against real MPI, for the same
 * table across MPI libraries (MPICH on ch3:rch, ch3:sock, ch4:ucx; Open MPI): built
 * with each library's mpicc and run with its mpiexec by bench/mpich-compare.sh.
 * The measurement is bench/c/osu.c's (the channel's own C-level figures):
 *
 *   latency:   ping-pong between ranks 0 and 1, one-way = half the mean round trip
 *   bandwidth: 64 messages in flight (MPI_Isend / MPI_Irecv), then a 4-byte ack
 *   pingping:  both ranks MPI_Isend, MPI_Recv, MPI_Wait at once (IMB's PingPing);
 *              the time of one exchange (run only with --pingping)
 *   preposted: the latency loop with every receive posted (MPI_Irecv) before the
 *              send it answers, so that no reply arrives unexpected however slow
 *              a rank runs (under callgrind, say); run only with --preposted
 *
 *   mpiexec -n 2 ./osu_mpi [--sizes 8,65536] [--iters N]
 *                          [--latency | --bandwidth | --pingping | --preposted]
 *
 * Rank r is pinned to CPU r unless OSU_NO_PIN is set. Heap buffers (malloc), as an
 * MPI application's are; separate send and receive buffers.
 */
#include "osu_common.h"

#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>


static double latency(int rank, char *sbuf, char *rbuf, size_t s, size_t iters, int preposted)
{
    size_t warm = iters / 10 + 10;
    double t0 = 0;
    for (size_t i = 0; i < iters + warm; i++) {
        if (i == warm) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        if (preposted) {
            MPI_Request req;
            int peer = 1 - rank;
            MPI_Irecv(rbuf, (int)s, MPI_CHAR, peer, 1, MPI_COMM_WORLD, &req);
            if (rank == 0) {
                MPI_Send(sbuf, (int)s, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
                MPI_Wait(&req, MPI_STATUS_IGNORE);
            } else {
                MPI_Wait(&req, MPI_STATUS_IGNORE);
                MPI_Send(sbuf, (int)s, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
            }
            continue;
        }
        if (rank == 0) {
            MPI_Send(sbuf, (int)s, MPI_CHAR, 1, 1, MPI_COMM_WORLD);
            MPI_Recv(rbuf, (int)s, MPI_CHAR, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            MPI_Recv(rbuf, (int)s, MPI_CHAR, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
            MPI_Send(sbuf, (int)s, MPI_CHAR, 0, 1, MPI_COMM_WORLD);
        }
    }
    return (MPI_Wtime() - t0) / (double)iters / 2 * 1e6;
}

static double bandwidth(int rank, char *sbuf, char *rbuf, size_t s, size_t iters)
{
    MPI_Request reqs[WINDOW];
    int ack = 0;
    size_t warm = iters / 10 + 2;
    double t0 = 0;
    for (size_t i = 0; i < iters + warm; i++) {
        if (i == warm) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        if (rank == 0) {
            for (int w = 0; w < WINDOW; w++)
                MPI_Isend(sbuf, (int)s, MPI_CHAR, 1, 2, MPI_COMM_WORLD, &reqs[w]);
            MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
            MPI_Recv(&ack, 1, MPI_INT, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        } else {
            for (int w = 0; w < WINDOW; w++)
                /* One receive buffer for the whole window, as OSU's osu_bw and our own
                 * pingpong bench do: 64 distinct buffers (256 MiB at 4 MiB) would
                 * measure the MPIs writing cold memory while the channel does not. */
                MPI_Irecv(rbuf, (int)s, MPI_CHAR, 0, 2, MPI_COMM_WORLD, &reqs[w]);
            MPI_Waitall(WINDOW, reqs, MPI_STATUSES_IGNORE);
            MPI_Send(&ack, 1, MPI_INT, 0, 3, MPI_COMM_WORLD);
        }
    }
    double t = MPI_Wtime() - t0;
    return (double)s * WINDOW * (double)iters / t / 1e9;
}

static double pingping(int rank, char *sbuf, char *rbuf, size_t s, size_t iters)
{
    int peer = 1 - rank;
    size_t warm = iters / 10 + 10;
    double t0 = 0;
    for (size_t i = 0; i < iters + warm; i++) {
        MPI_Request req;
        if (i == warm) {
            MPI_Barrier(MPI_COMM_WORLD);
            t0 = MPI_Wtime();
        }
        MPI_Isend(sbuf, (int)s, MPI_CHAR, peer, 4, MPI_COMM_WORLD, &req);
        MPI_Recv(rbuf, (int)s, MPI_CHAR, peer, 4, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        MPI_Wait(&req, MPI_STATUS_IGNORE);
    }
    return (MPI_Wtime() - t0) / (double)iters * 1e6;
}

int main(int argc, char **argv)
{
    struct osu_args a;
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    osu_parse(argc, argv, &a);
    if (size != 2) {
        if (rank == 0)
            fprintf(stderr, "osu_mpi runs on exactly 2 ranks, not %d\n", size);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }
    osu_pin(rank);
    size_t max = osu_max_size(&a);
    char *sbuf = malloc(max ? max : 1), *rbuf = malloc(max + 1), *lbuf = malloc(max ? max : 1);
    if (!sbuf || !rbuf || !lbuf) {
        fprintf(stderr, "osu_mpi: out of memory\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    memset(sbuf, 'a', max);
    memset(rbuf, 0, max + 1);
    if (rank == 0) {
        char lib[MPI_MAX_LIBRARY_VERSION_STRING];
        int len;
        MPI_Get_library_version(lib, &len);
        char *nl = strchr(lib, '\n');
        if (nl)
            *nl = '\0';
        printf("# %s\n", lib);
        printf("# latency: one-way = half the mean round trip; bandwidth: %d messages in flight\n", WINDOW);
        if (a.pingping_only)
            printf("%10s %12s\n", "size", "pingping_us");
        else
            printf("%10s %12s %12s\n", "size", "latency_us", "bw_GB/s");
    }
    for (int i = 0; i < a.nsizes; i++) {
        size_t s = a.sizes[i];
        if (a.pingping_only) {
            double t = pingping(rank, sbuf, lbuf, s, a.fixed_iters ? (size_t)a.fixed_iters : lat_iters(s));
            if (rank == 0) {
                printf("%10zu %12.3f\n", s, t);
                fflush(stdout);
            }
            continue;
        }
        double lat = a.bandwidth_only ? 0
                                      : latency(rank, sbuf, lbuf, s, a.fixed_iters ? (size_t)a.fixed_iters : lat_iters(s), a.preposted);
        double bw = a.latency_only ? 0
                                   : bandwidth(rank, sbuf, rbuf, s, a.fixed_iters ? (size_t)a.fixed_iters : bw_iters(s));
        if (rank == 0) {
            printf("%10zu %12.3f %12.3f\n", s, lat, bw);
            fflush(stdout);
        }
    }
    free(sbuf);
    free(rbuf);
    free(lbuf);
    MPI_Finalize();
    return 0;
}
