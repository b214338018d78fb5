/* Memory and time as ranks per node grow (seed 003, Shipman et al., "Infiniband
 * Scalability in Open MPI", figures 3-6), for any MPI: bench/scale.sh builds it with
 * each MPI's mpicc and runs it the same way for each.
 *
 * usage: scale_mpi PATTERN [ROUNDS]
 *   hello     MPI_Init, a barrier, then nothing
 *   pairwise  a ping-pong of 4 KiB with rank ^ 1, ROUNDS times (default 100)
 *   alltoall  every rank exchanges 4 KiB with every other rank, ROUNDS times
 *             (default 3), with MPI_Isend/MPI_Irecv to all then MPI_Waitall
 *   idle      zero-byte ping-pong latency of ranks 0 and 1, first before, then
 *             after every rank exchanged a message with every other (so the pair
 *             has size - 2 connected, idle peers); the other ranks sleep outside
 *             MPI meanwhile (blocked on a FIFO in /tmp), so the pair has the CPUs
 *             to itself (seed 003, figure 6);
 *             ROUNDS is the round trips per batch (default 20000, 7 batches)
 *   quiet     as idle, but rank 0 spins 2 ms outside MPI before each round trip,
 *             so the message reaches a rank 1 that has waited in MPI_Recv, its
 *             connections quiet (ROUNDS default 300; the median round trip)
 *
 * Prints one line of "key=value" fields from rank 0: the pattern, ranks, mean and
 * max PSS over ranks in KiB (from /proc/self/smaps_rollup, read before
 * MPI_Finalize, after the pattern), the pattern's time (alltoall: the slowest rank's
 * seconds, and that of its first round, in which every pair connects), and for idle
 * the two latencies in microseconds (medians of 7 batches).
 * A benchmark, never a test: nothing asserts.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#define MSG 4096

static long pss_kib(void)
{
    FILE *f = fopen("/proc/self/smaps_rollup", "r");
    char line[256];
    long kib = -1;
    if (!f)
        return -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "Pss: %ld kB", &kib) == 1)
            break;
    fclose(f);
    return kib;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *) a, y = *(const double *) b;
    return (x > y) - (x < y);
}

/* Median over 7 batches of the one-way zero-byte latency between ranks 0 and 1, in
 * microseconds (valid on rank 0). With `pause_us` > 0, rank 0 spins that long
 * outside MPI before each round trip, so rank 1 has waited in MPI_Recv that long
 * when the message comes; each round trip is then timed on its own and the median
 * of them all is returned (a batch's mean would be the few round trips that met a
 * timer interrupt or a page fault). */
static double pair_latency(int rank, int iters, double pause_us)
{
    double batch[7];
    double *each = pause_us > 0 ? malloc(sizeof(double) * 7 * (size_t) iters) : NULL;
    int timed = 0;
    char b = 0;
    for (int k = 0; k < 7; k++) {
        double t0 = 0;
        for (int i = -iters / 10; i < iters; i++) {
            if (i == 0)
                t0 = MPI_Wtime();
            if (rank == 0) {
                double r0 = 0;
                if (each) {
                    double p0 = MPI_Wtime();
                    while (MPI_Wtime() - p0 < pause_us * 1e-6)
                        ;
                    r0 = MPI_Wtime();
                }
                MPI_Send(&b, 0, MPI_CHAR, 1, 7, MPI_COMM_WORLD);
                MPI_Recv(&b, 0, MPI_CHAR, 1, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                if (each && i >= 0)
                    each[timed++] = (MPI_Wtime() - r0) * 1e6 / 2.0;
            } else {
                MPI_Recv(&b, 0, MPI_CHAR, 0, 7, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                MPI_Send(&b, 0, MPI_CHAR, 0, 7, MPI_COMM_WORLD);
            }
        }
        batch[k] = (MPI_Wtime() - t0) * 1e6 / (2.0 * iters);
    }
    if (each) {
        double m = 0;
        if (timed > 0) {
            qsort(each, (size_t) timed, sizeof each[0], cmp_double);
            m = each[timed / 2];
        }
        free(each);
        return m;
    }
    qsort(batch, 7, sizeof batch[0], cmp_double);
    return batch[3];
}

/* One idle phase: ranks 0 and 1 measure while the others sleep outside MPI, blocked
 * in open(2) of a FIFO that rank 0 opens for writing once it is done: they wake
 * neither the pair nor each other, and none of the MPIs has to progress a peer that
 * does not call it. The pair starts only after a settling sleep of its own: ranks
 * leave the barrier before at different times, and on an oversubscribed host the
 * last ones spin in it for a while. What the other ranks cost the pair is then
 * their connections, not their CPU time. Returns the latency on rank 0; `tag` names
 * the phase's FIFO. */
static double idle_phase(int rank, int size, int iters, int tag, double pause_us)
{
    double lat = 0;
    char path[128] = "";
    int writer = -1;
    if (rank == 0) {
        snprintf(path, sizeof path, "/tmp/scale_mpi_%d_%d.fifo", (int) getpid(), tag);
        unlink(path);
        if (mkfifo(path, 0600) != 0) {
            perror("scale_mpi: mkfifo");
            MPI_Abort(MPI_COMM_WORLD, 1);
        }
    }
    MPI_Bcast(path, sizeof path, MPI_CHAR, 0, MPI_COMM_WORLD);
    if (rank < 2) {
        usleep(size > 2 ? 1500000 : 0);
        if (size >= 2)
            lat = pair_latency(rank, iters, pause_us);
        /* Blocks until a sleeper has the FIFO open for reading (they all come). */
        if (rank == 0 && size > 2)
            writer = open(path, O_WRONLY);
    } else {
        int reader = open(path, O_RDONLY);
        if (reader >= 0)
            close(reader);
    }
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 0) {
        if (writer >= 0)
            close(writer);
        unlink(path);
    }
    return lat;
}

int main(int argc, char **argv)
{
    int rank, size;
    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &size);
    const char *pattern = argc > 1 ? argv[1] : "hello";
    int rounds = argc > 2 ? atoi(argv[2]) : -1;
    double elapsed = 0, first = 0, lat_alone = 0, lat_idle = 0;

    MPI_Barrier(MPI_COMM_WORLD);
    if (strcmp(pattern, "pairwise") == 0) {
        char *buf = calloc(1, MSG);
        int peer = rank ^ 1;
        if (rounds < 0)
            rounds = 100;
        double t0 = MPI_Wtime();
        if (peer < size)
            for (int r = 0; r < rounds; r++) {
                if (rank < peer) {
                    MPI_Send(buf, MSG, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
                    MPI_Recv(buf, MSG, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                } else {
                    MPI_Recv(buf, MSG, MPI_CHAR, peer, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    MPI_Send(buf, MSG, MPI_CHAR, peer, 1, MPI_COMM_WORLD);
                }
            }
        elapsed = MPI_Wtime() - t0;
        free(buf);
    } else if (strcmp(pattern, "alltoall") == 0) {
        char *out = calloc((size_t) size, MSG), *in = calloc((size_t) size, MSG);
        MPI_Request *req = malloc(sizeof(MPI_Request) * 2 * (size_t) size);
        if (rounds < 0)
            rounds = 3;
        double t0 = MPI_Wtime();
        for (int r = 0; r < rounds; r++) {
            int n = 0;
            for (int p = 0; p < size; p++)
                if (p != rank)
                    MPI_Irecv(in + (size_t) p * MSG, MSG, MPI_CHAR, p, 2, MPI_COMM_WORLD, &req[n++]);
            for (int k = 1; k < size; k++) {
                int p = (rank + k) % size;
                memset(out + (size_t) p * MSG, r + k, MSG);
                MPI_Isend(out + (size_t) p * MSG, MSG, MPI_CHAR, p, 2, MPI_COMM_WORLD, &req[n++]);
            }
            MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
            if (r == 0)
                first = MPI_Wtime() - t0;
        }
        elapsed = MPI_Wtime() - t0;
        free(out);
        free(in);
        free(req);
    } else if (strcmp(pattern, "idle") == 0 || strcmp(pattern, "quiet") == 0) {
        int quiet = strcmp(pattern, "quiet") == 0;
        int iters = rounds >= 0 ? rounds : quiet ? 300 : 20000;
        double pause_us = quiet ? 2000 : 0;
        char b = 0;
        lat_alone = idle_phase(rank, size, iters, 5, pause_us);
        /* Everyone connects to everyone: one zero-byte message each way per pair. */
        MPI_Request *req = malloc(sizeof(MPI_Request) * 2 * (size_t) size);
        int n = 0;
        for (int p = 0; p < size; p++)
            if (p != rank) {
                MPI_Irecv(&b, 0, MPI_CHAR, p, 3, MPI_COMM_WORLD, &req[n++]);
                MPI_Isend(&b, 0, MPI_CHAR, p, 3, MPI_COMM_WORLD, &req[n++]);
            }
        MPI_Waitall(n, req, MPI_STATUSES_IGNORE);
        free(req);
        lat_idle = idle_phase(rank, size, iters, 6, pause_us);
    } else if (strcmp(pattern, "hello") != 0) {
        if (rank == 0)
            fprintf(stderr, "scale_mpi: unknown pattern '%s'\n", pattern);
        MPI_Abort(MPI_COMM_WORLD, 2);
    }

    long pss = pss_kib();
    long sum = 0, max = 0;
    double slowest = 0, slowest_first = 0;
    MPI_Reduce(&pss, &sum, 1, MPI_LONG, MPI_SUM, 0, MPI_COMM_WORLD);
    MPI_Reduce(&pss, &max, 1, MPI_LONG, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&elapsed, &slowest, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    MPI_Reduce(&first, &slowest_first, 1, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
    if (rank == 0) {
        printf("pattern=%s ranks=%d pss_mean_kib=%ld pss_max_kib=%ld time_s=%.4f", pattern, size,
               sum / size, max, slowest);
        if (strcmp(pattern, "alltoall") == 0)
            printf(" first_round_s=%.4f", slowest_first);
        if (strcmp(pattern, "idle") == 0 || strcmp(pattern, "quiet") == 0)
            printf(" lat_alone_us=%.3f lat_idle_peers_us=%.3f", lat_alone, lat_idle);
        printf("\n");
        fflush(stdout);
    }
    MPI_Finalize();
    return 0;
}
