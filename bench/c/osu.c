/*
 * osu.c - OSU-style point-to-point benchmark in C on the MPI-like layer of
 * channel-tests/c/mm.h (so through ffi/rch.h), for setting MPI-level numbers beside
 * MPICH's and Open MPI's osu_latency / osu_bw:
 *
 *   latency:   ping-pong between ranks 0 and 1, one-way = half the mean round trip
 *   bandwidth: 64 messages in flight (non-blocking sends), then a 4-byte ack
 *
 *   rch-run -n 2 osu [--sizes 8,65536] [--iters N] [--latency]
 *
 * --latency skips the bandwidth test.
 *
 * Rank r is pinned to CPU r (as bench/pingpong.rs pins its two processes), unless
 * OSU_NO_PIN is set. Separate send and receive buffers, as the OSU benchmarks use.
 */
#include "osu_common.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mm.h"


static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

static double latency(char *sbuf, char *rbuf, size_t s, size_t iters)
{
    int rank = mm_rank();
    size_t warm = iters / 10 + 10;
    double t0 = 0;
    for (size_t i = 0; i < iters + warm; i++) {
        if (i == warm) {
            mm_barrier();
            t0 = now();
        }
        if (rank == 0) {
            mm_send(sbuf, s, 1, 1);
            mm_recv(rbuf, s, 1, 1, NULL);
        } else {
            mm_recv(rbuf, s, 0, 1, NULL);
            mm_send(sbuf, s, 0, 1);
        }
    }
    return (now() - t0) / (double)iters / 2 * 1e6;
}

static double bandwidth(char *sbuf, char *rbuf, size_t s, size_t iters)
{
    int rank = mm_rank();
    mm_request *reqs[WINDOW];
    int ack = 0;
    size_t warm = iters / 10 + 2;
    double t0 = 0;
    for (size_t i = 0; i < iters + warm; i++) {
        if (i == warm) {
            mm_barrier();
            t0 = now();
        }
        if (rank == 0) {
            for (int w = 0; w < WINDOW; w++)
                reqs[w] = mm_isend(sbuf, s, 1, 2);
            mm_waitall(WINDOW, reqs);
            mm_recv(&ack, sizeof ack, 1, 3, NULL);
        } else {
            for (int w = 0; w < WINDOW; w++)
                reqs[w] = mm_irecv(rbuf, s, 0, 2); /* one buffer, as osu_mpi.c */
            mm_waitall(WINDOW, reqs);
            mm_send(&ack, sizeof ack, 0, 3);
        }
    }
    double t = now() - t0;
    return (double)s * WINDOW * (double)iters / t / 1e9;
}

int main(int argc, char **argv)
{
    struct osu_args a;
    osu_parse(argc, argv, &a);
    mm_init();
    int rank = mm_rank();
    if (mm_size() != 2)
        mm_fatal("osu runs on exactly 2 ranks");
    osu_pin(rank);
    size_t max = osu_max_size(&a);
    char *sbuf = malloc(max ? max : 1), *rbuf = malloc(max + 1), *lbuf = malloc(max ? max : 1);
    if (!sbuf || !rbuf || !lbuf)
        mm_fatal("oom");
    memset(sbuf, 'a', max);
    memset(rbuf, 0, max + 1);
    if (rank == 0) {
        printf("# rdma-channel C interface, MPI-like layer (channel-tests/c/mm.c), %s mode, ranks on CPUs 0 and 1\n",
               mm_mode());
        printf("# latency: one-way = half the mean round trip; bandwidth: %d messages in flight\n", WINDOW);
        printf("%10s %12s %12s\n", "size", "latency_us", "bw_GB/s");
    }
    for (int i = 0; i < a.nsizes; i++) {
        size_t s = a.sizes[i];
        double lat = latency(sbuf, lbuf, s, a.fixed_iters ? (size_t)a.fixed_iters : lat_iters(s));
        double bw = a.latency_only ? 0 : bandwidth(sbuf, rbuf, s, a.fixed_iters ? (size_t)a.fixed_iters : bw_iters(s));
        if (rank == 0) {
            printf("%10zu %12.3f %12.3f\n", s, lat, bw);
            fflush(stdout);
        }
    }
    free(sbuf);
    free(rbuf);
    free(lbuf);
    mm_finalize();
    return 0;
}
