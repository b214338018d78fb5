/* All-to-all exchange with checksums: every rank sends every rank (itself included)
 * messages of mixed sizes with non-blocking sends and receives, in several rounds;
 * the receivers check every byte, and an allreduce compares the sums of what was
 * sent and what was received. Also checks barrier, broadcast and allreduce. Run with
 * more ranks than cores, it shows that waiting ranks yield. */
#define _GNU_SOURCE
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mm.h"

static size_t msg_size(int src, int dst, int round)
{
    static const size_t sizes[] = {0, 1, 8, 100, 4096, 70000, 300000};
    return sizes[(size_t)(src * 3 + dst * 5 + round) % (sizeof sizes / sizeof *sizes)];
}

static unsigned char pat(int src, int dst, int round, size_t i)
{
    return (unsigned char)(src * 37 + dst * 11 + round * 5 + i * 13 + (i >> 8));
}

int main(int argc, char **argv)
{
    int rounds = argc > 1 ? atoi(argv[1]) : 4;
    mm_init();
    int rank = mm_rank(), size = mm_size();
    uint64_t sent_sum = 0, recv_sum = 0;
    unsigned char **sbuf = calloc((size_t)size, sizeof *sbuf), **rbuf = calloc((size_t)size, sizeof *rbuf);
    mm_request **reqs = calloc(2 * (size_t)size, sizeof *reqs);
    if (!sbuf || !rbuf || !reqs)
        mm_fatal("oom");
    for (int round = 0; round < rounds; round++) {
        for (int p = 0; p < size; p++) {
            size_t rs = msg_size(p, rank, round);
            rbuf[p] = malloc(rs + 1);
            reqs[p] = mm_irecv(rbuf[p], rs, p, round);
        }
        for (int k = 0; k < size; k++) {
            int p = (rank + k) % size; /* stagger the destinations */
            size_t ss = msg_size(rank, p, round);
            sbuf[p] = malloc(ss + 1);
            for (size_t i = 0; i < ss; i++) {
                sbuf[p][i] = pat(rank, p, round, i);
                sent_sum += sbuf[p][i];
            }
            reqs[size + p] = mm_isend(sbuf[p], ss, p, round);
        }
        for (int p = 0; p < size; p++) {
            mm_status st;
            if (p % 2) /* half by polling with mm_test (yielding between), half by mm_wait */
                while (!mm_test(reqs[p], &st))
                    sched_yield();
            else
                mm_wait(reqs[p], &st);
            size_t rs = msg_size(p, rank, round);
            if (st.len != rs || st.source != p || st.tag != round)
                mm_fatal("round %d from %d: len %zu (want %zu) source %d tag %d", round, p, st.len, rs,
                         st.source, st.tag);
            for (size_t i = 0; i < rs; i++) {
                if (rbuf[p][i] != pat(p, rank, round, i))
                    mm_fatal("round %d from %d: byte %zu", round, p, i);
                recv_sum += rbuf[p][i];
            }
            free(rbuf[p]);
        }
        mm_waitall(size, reqs + size);
        for (int p = 0; p < size; p++)
            free(sbuf[p]);
    }
    uint64_t in[2] = {sent_sum, recv_sum}, out[2];
    mm_allreduce_sum_u64(in, out, 2);
    if (out[0] != out[1])
        mm_fatal("checksums differ: sent %llu, received %llu", (unsigned long long)out[0],
                 (unsigned long long)out[1]);
    /* broadcast from every root, and a max-allreduce */
    for (int root = 0; root < size; root++) {
        char msg[64] = {0};
        if (rank == root)
            snprintf(msg, sizeof msg, "from root %d", root);
        mm_bcast(msg, sizeof msg, root);
        char want[64] = {0};
        snprintf(want, sizeof want, "from root %d", root);
        if (memcmp(msg, want, sizeof msg) != 0)
            mm_fatal("bcast from %d: got %s", root, msg);
    }
    double mine = rank * 1.5, mx;
    mm_allreduce_max_double(&mine, &mx, 1);
    if (mx != (size - 1) * 1.5)
        mm_fatal("allreduce max %g", mx);
    mm_barrier();
    if (rank == 0)
        printf("alltoall ok: %d ranks, %d rounds, checksum %llu, %s mode\n", size, rounds,
               (unsigned long long)out[0], mm_mode());
    free(sbuf);
    free(rbuf);
    free(reqs);
    mm_finalize();
    return 0;
}
