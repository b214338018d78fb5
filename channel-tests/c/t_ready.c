#define _GNU_SOURCE
/* rch_poll_ready lists the connections with something to read, and only those.
 * Every rank connects to every other (one message each way), then rank 0 polls
 * rch_poll_ready alone while the others stay silent, long enough for every
 * connection to go quiet; then ranks 1, 2, ... each send one message, one at a
 * time: rank p sends when rank p - 1 passes it a "go", which rank p - 1 sends
 * once rank 0 has read its message and told it so (rank 1's "go" comes from the
 * last rank, told by rank 0 when its quiet time is over). So only rank 0's
 * connections to ranks it has finished with, and to the last rank (well before
 * its turn), carry anything but those messages, and no timing is assumed (under
 * TCG a VM's ranks run milliseconds to seconds apart). Rank 0 must see each
 * sender listed (a quiet connection's peer rings rank 0's doorbell after writing;
 * quiet connections are also looked at in turn), and never a rank that sent
 * nothing; each message is then read with mm_recv, after which the rank must drop
 * off the list; rch_get_watch_stats must count the doorbell's finds. Also checks
 * the argument errors, and rch_wait_spins against RCH_SPIN and the CPUs. */
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "mm.h"
#include "rch.h"

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* Polls until a rank is listed (or 20 s pass); returns it, or -1. Fails on a listed
 * rank that is not `expect`. */
static int wait_listed(int expect, long *calls)
{
    int ranks[64], n = 0;
    double t0 = now();
    *calls = 0;
    while (now() - t0 < 20.0) {
        int rc = rch_poll_ready(ranks, 64, &n);
        (*calls)++;
        if (rc != RCH_SUCCESS)
            mm_fatal("rch_poll_ready: %s", rch_strerror(rc));
        for (int i = 0; i < n; i++)
            if (ranks[i] != expect)
                mm_fatal("rank %d listed while only rank %d sent", ranks[i], expect);
        if (n > 0)
            return ranks[0];
    }
    return -1;
}

int main(void)
{
    mm_init();
    int me = mm_rank(), size = mm_size();
    if (size < 3)
        mm_fatal("t_ready runs on 3 ranks or more");
    int ranks[64], n = -1;
    if (rch_poll_ready(ranks, -1, &n) != RCH_ERR_INVALID || n != 0)
        mm_fatal("max < 0 must be RCH_ERR_INVALID with *n = 0");
    if (rch_poll_ready(ranks, 1, NULL) != RCH_ERR_NULL)
        mm_fatal("n NULL must be RCH_ERR_NULL");
    if (rch_poll_ready(NULL, 1, &n) != RCH_ERR_NULL)
        mm_fatal("ranks NULL with max > 0 must be RCH_ERR_NULL");
    if (rch_poll_ready(NULL, 0, &n) != RCH_SUCCESS || n != 0)
        mm_fatal("max 0 lists nothing");

    /* The wait's busy polls: RCH_SPIN's when set (the test runs once with it); else
     * with more ranks here than CPUs at most the contended count (none on shared
     * memory, 100 where a software RDMA device needs a CPU too). */
    int spins = -1;
    if (rch_wait_spins(NULL) != RCH_ERR_NULL)
        mm_fatal("rch_wait_spins(NULL) must be RCH_ERR_NULL");
    if (rch_wait_spins(&spins) != RCH_SUCCESS)
        mm_fatal("rch_wait_spins: %s", rch_last_error());
    const char *spin_set = getenv("RCH_SPIN");
    cpu_set_t cpus;
    if (sched_getaffinity(0, sizeof cpus, &cpus) != 0)
        mm_fatal("sched_getaffinity failed");
    if (spin_set != NULL && spins != atoi(spin_set))
        mm_fatal("rch_wait_spins says %d with RCH_SPIN=%s", spins, spin_set);
    if (spin_set == NULL && getenv("RCH_YIELD") == NULL && size > CPU_COUNT(&cpus) && spins > 100)
        mm_fatal("rch_wait_spins says %d with %d ranks on %d CPUs", spins, size,
                 CPU_COUNT(&cpus));
    if (spins < 0)
        mm_fatal("rch_wait_spins says %d", spins);

    /* Every pair connected. */
    char out[64][8], in[64][8];
    mm_request *reqs[128];
    int k = 0;
    for (int p = 0; p < size && p < 64; p++) {
        if (p == me)
            continue;
        snprintf(out[p], sizeof out[p], "hi%d", me);
        reqs[k++] = mm_irecv(in[p], sizeof in[p], p, 1);
        reqs[k++] = mm_isend(out[p], strlen(out[p]) + 1, p, 1);
    }
    mm_waitall(k, reqs);
    mm_barrier();

    if (me == 0) {
        /* Nothing was sent since the barrier: nothing is listed, and every
         * connection goes quiet meanwhile. */
        double t0 = now();
        while (now() - t0 < 0.1) {
            if (rch_poll_ready(ranks, 64, &n) != RCH_SUCCESS)
                mm_fatal("rch_poll_ready failed");
            if (n != 0)
                mm_fatal("rank %d listed before anyone sent", ranks[0]);
        }
        /* The last rank starts the chain (rank 0 writes to it now, long before
         * its turn: the polls below leave the connection quiet again by then). */
        mm_send("start", 6, size - 1, 4);
        for (int p = 1; p < size; p++) {
            long calls;
            int got = wait_listed(p, &calls);
            if (got != p)
                mm_fatal("rank %d's message was never listed", p);
            char buf[8];
            mm_recv(buf, sizeof buf, p, 2, NULL);
            if (strcmp(buf, "ready") != 0)
                mm_fatal("rank %d sent '%s'", p, buf);
            /* Read: no longer listed. */
            for (int i = 0; i < 100; i++) {
                if (rch_poll_ready(ranks, 64, &n) != RCH_SUCCESS)
                    mm_fatal("rch_poll_ready failed");
                if (n != 0)
                    mm_fatal("rank %d still listed after its message was read", ranks[0]);
            }
            printf("rank %d listed after %ld calls\n", p, calls);
            if (p + 1 == size - 1) {
                /* The last rank's connection quiet again after "start" before its
                 * turn comes: 256 calls in a row with nothing. */
                for (int i = 0; i < 512; i++) {
                    if (rch_poll_ready(ranks, 64, &n) != RCH_SUCCESS)
                        mm_fatal("rch_poll_ready failed");
                    if (n != 0)
                        mm_fatal("rank %d listed before its turn", ranks[0]);
                }
            }
            /* Rank p may pass the turn on. */
            mm_send("next", 5, p, 5);
        }
        /* Every rank wrote to a connection that had long gone quiet, and its
         * sender then rang this process's doorbell. The ring follows the data (on
         * Soft-RoCE under TCG by milliseconds, so a look in turn may find the data
         * first): poll until every ring has been seen (or 20 s pass). */
        rch_watch_stats ws;
        if (rch_get_watch_stats(NULL) != RCH_ERR_NULL)
            mm_fatal("rch_get_watch_stats(NULL) must be RCH_ERR_NULL");
        double t1 = now();
        do {
            if (rch_poll_ready(ranks, 64, &n) != RCH_SUCCESS)
                mm_fatal("rch_poll_ready failed");
            if (n != 0)
                mm_fatal("rank %d listed after every message was read", ranks[0]);
            if (rch_get_watch_stats(&ws) != RCH_SUCCESS)
                mm_fatal("rch_get_watch_stats: %s", rch_last_error());
        } while (ws.rings < (unsigned long long)(size - 1) && now() - t1 < 20.0);
        printf("watch: busy %d quiet %d (belled %d), rings %llu, found by bell %llu, in turn %llu\n",
               ws.busy, ws.quiet, ws.quiet_belled, ws.rings, ws.found_by_bell, ws.found_in_turn);
        if (ws.rings < (unsigned long long)(size - 1))
            mm_fatal("%d ranks wrote to quiet connections, but only %llu rang the doorbell",
                     size - 1, ws.rings);
        if (ws.found_by_bell + ws.found_in_turn < (unsigned long long)(size - 1))
            mm_fatal("%d quiet connections were read, but only %llu counted as found", size - 1,
                     ws.found_by_bell + ws.found_in_turn);
        for (int p = 1; p < size; p++)
            mm_send("done", 5, p, 3);
    } else {
        char buf[8];
        if (me == size - 1) {
            /* Rank 0's quiet time is over: rank 1 may begin. */
            mm_recv(buf, sizeof buf, 0, 4, NULL);
            mm_send("go", 3, 1, 6);
        }
        /* My turn: rank 0 has read the message before mine. */
        mm_recv(buf, sizeof buf, me == 1 ? size - 1 : me - 1, 6, NULL);
        mm_send("ready", 6, 0, 2);
        /* Rank 0 read it: the next rank may send. */
        mm_recv(buf, sizeof buf, 0, 5, NULL);
        if (me + 1 < size)
            mm_send("go", 3, me + 1, 6);
        /* Silent until rank 0 is done: the barrier below would write to it. */
        mm_recv(buf, sizeof buf, 0, 3, NULL);
    }
    mm_barrier();
    if (me == 0)
        printf("ready ok\n");
    mm_finalize();
    return 0;
}
