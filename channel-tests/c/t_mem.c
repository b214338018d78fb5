/* Memory per process, idle and after an all-to-all: connections are set up only
 * when a pair first communicates, so idle ranks hold no rings. Prints, on rank 0,
 * the mean and maximum over the ranks of VmRSS, its shared-memory part (RssShmem:
 * rings live in shared memory on the emulated fabric) and the registered bytes
 * (rch_get_stats), and checks the connection counts:
 *   idle: 0 connections; after the exchange: size (loopback included).
 * With the argument "idle" it stops after the idle measurement. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mm.h"
#include "rch.h"

static double kib(const char *field)
{
    FILE *f = fopen("/proc/self/status", "r");
    char line[256];
    double v = 0;
    size_t l = strlen(field);
    while (f && fgets(line, sizeof line, f))
        if (strncmp(line, field, l) == 0 && line[l] == ':')
            v = atof(line + l + 1);
    if (f)
        fclose(f);
    return v;
}

static void report(const char *phase, int want_conns)
{
    rch_stats st;
    if (rch_get_stats(&st) != RCH_SUCCESS)
        mm_fatal("rch_get_stats: %s", rch_last_error());
    if (st.connections != want_conns)
        mm_fatal("%s: %d connections, expected %d", phase, st.connections, want_conns);
    double mine[4] = {kib("VmRSS"), kib("RssShmem"), kib("RssAnon"), (double)st.registered_bytes / 1024};
    double mx[4];
    uint64_t sum_in[4], sum[4];
    for (int i = 0; i < 4; i++)
        sum_in[i] = (uint64_t)mine[i];
    mm_allreduce_max_double(mine, mx, 4);
    mm_allreduce_sum_u64(sum_in, sum, 4);
    int n = mm_size();
    if (mm_rank() == 0)
        printf("mem N=%-3d %-6s conns %-3d  RSS mean %7.0f KiB max %7.0f | shmem mean %7.0f max %7.0f | anon mean %6.0f | registered mean %8.0f KiB max %8.0f\n",
               n, phase, want_conns, (double)sum[0] / n, mx[0], (double)sum[1] / n, mx[1], (double)sum[2] / n,
               (double)sum[3] / n, mx[3]);
}

int main(int argc, char **argv)
{
    mm_init();
    int rank = mm_rank(), size = mm_size();
    report("idle", 0); /* the allreduce itself connects a few pairs: measured before */
    if (argc > 1 && strcmp(argv[1], "idle") == 0) {
        mm_finalize();
        return 0;
    }
    /* all-to-all: every pair (and each rank with itself) exchanges 4 KiB */
    char *out = malloc(4096), *in = malloc(4096 * (size_t)size);
    memset(out, rank, 4096);
    mm_request **r = malloc(2 * (size_t)size * sizeof *r);
    for (int p = 0; p < size; p++)
        r[p] = mm_irecv(in + 4096 * (size_t)p, 4096, p, 7);
    for (int k = 0; k < size; k++)
        r[size + k] = mm_isend(out, 4096, (rank + k) % size, 7);
    mm_waitall(2 * size, r);
    for (int p = 0; p < size; p++)
        if (in[4096 * (size_t)p] != (char)p)
            mm_fatal("bad data from %d", p);
    mm_barrier();
    report("a2a", size);
    free(out);
    free(in);
    free(r);
    mm_finalize();
    return 0;
}
