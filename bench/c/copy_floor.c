/*
 * copy_floor: what the MPI-level benchmarks' patterns cost with no MPI and no
 * channel, only the copies and one flag per message between two processes pinned to
 * CPUs 0 and 1 (as `-bind-to core` pins the two ranks). Two transports, as the peers
 * use them on one host:
 *
 *   single  the receiver copies the sender's heap buffer with one process_vm_readv
 *           (a CMA rendezvous: Open MPI's vader from 4 KiB, UCX from 16 KiB), then
 *           answers with a flag;
 *   double  the sender copies into a shared-memory slot and the receiver copies out
 *           (an eager copy-in/copy-out, as every MPI below its rendezvous size).
 *
 * For each size it prints lines "metric size value", the metrics of
 * bench/mpi-level.sh: the one-way time of a ping-pong (imb_pingpong_lat and
 * osu_latency, us), the time of an exchange where both send at once
 * (imb_pingping_lat, us), their bandwidths (MB/s), and osu_bw's pattern: a window of
 * 64 messages, then a 4-byte answer (MB/s). Each metric takes the faster transport
 * (single-copy only from 4 KiB, where any peer would use it), so a line is the least
 * the pattern costs on this host now: a floor for comparing MPIs measured beside it
 * (for one core's copy: a transport that splits a large message between both cores,
 * as rdma-channel's push does, can run below it).
 * The double transport copies whole messages (no pipelining) through a ring of
 * message-sized slots per direction, RING_BYTES long (at least two slots, at most
 * WINDOW, so that osu_bw's window never waits for room), so above 64 KiB only the
 * single transport is run.
 *
 * usage: copy_floor [--each] SIZE[,SIZE...]   (bench/mpi-level.sh --floor runs it)
 * --each also prints each transport's own figures first, as lines
 * "single|double pingpong|pingping|window size us" (one-way, exchange, window),
 * which is how to see where the ring's two copies stand against one read.
 * It is a benchmark, never a test: nothing here asserts.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/uio.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#define WINDOW 64
#define DOUBLE_MAX (64 << 10)
#define RING_BYTES (256 << 10)
#define LINE 64

/* One direction's flags, each on its own cache line: `sent` counts messages
 * announced (single) or copied into a slot (double), `done` counts messages read. */
struct dir {
    _Alignas(LINE) _Atomic uint64_t sent;
    _Alignas(LINE) _Atomic uint64_t done;
    _Alignas(LINE) char pad;
};

struct shared {
    struct dir to[2];           /* to[r]: messages for rank r */
    _Alignas(LINE) _Atomic int ready;
    pid_t pid[2];
    char *src[2];               /* each rank's heap send buffer */
    _Alignas(LINE) char ring[2][RING_BYTES];        /* ring[r]: rank r's incoming slots */
};

static struct shared *sh;
static int me;
static size_t slot_len;         /* the double transport's slots: bytes each, ... */
static uint64_t slots;          /* ... and how many per direction */

/* The slot of message i in rank r's incoming ring. */
static char *slot(int r, uint64_t i)
{
    return sh->ring[r] + (i % slots) * slot_len;
}

static double now(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double) t.tv_sec + (double) t.tv_nsec * 1e-9;
}

/* Gives up when the peer process is gone (a crash must not leave the other spinning). */
static void check_peer(unsigned long *spins)
{
    if ((++*spins & ((1ul << 22) - 1)) == 0 && sh->pid[!me] != 0 &&
        kill(sh->pid[!me], 0) != 0 && errno == ESRCH) {
        fprintf(stderr, "copy_floor: the other process is gone\n");
        exit(1);
    }
}

static void wait_at_least(_Atomic uint64_t *v, uint64_t n)
{
    unsigned long spins = 0;
    while (atomic_load_explicit(v, memory_order_acquire) < n) {
        __builtin_ia32_pause();
        check_peer(&spins);
    }
}

/* Both ranks arrive before either goes on. */
static void barrier(void)
{
    static int gen;
    unsigned long spins = 0;
    gen += 2;
    atomic_fetch_add(&sh->ready, 1);
    while (atomic_load(&sh->ready) < gen) {
        __builtin_ia32_pause();
        check_peer(&spins);
    }
}

static void cma_read(char *dst, size_t n)
{
    struct iovec l = { dst, n }, r = { sh->src[!me], n };
    if (process_vm_readv(sh->pid[!me], &l, 1, &r, 1, 0) != (ssize_t) n) {
        perror("copy_floor: process_vm_readv");
        exit(1);
    }
}

/* Message i (from 1) to the peer; single: announce it; double: copy it into the
 * peer's slot once the peer read the one two before it. */
static void send_msg(int single, const char *src, size_t n, uint64_t i)
{
    struct dir *d = &sh->to[!me];
    if (!single) {
        if (i > slots)
            wait_at_least(&d->done, i - slots);
        memcpy(slot(!me, i), src, n);
    }
    atomic_store_explicit(&d->sent, i, memory_order_release);
}

/* Receives message i into dst. */
static void recv_msg(int single, char *dst, size_t n, uint64_t i)
{
    struct dir *d = &sh->to[me];
    wait_at_least(&d->sent, i);
    if (single)
        cma_read(dst, n);
    else
        memcpy(dst, slot(me, i), n);
    atomic_store_explicit(&d->done, i, memory_order_release);
}

/* A single-copy sender may reuse its buffer only once the peer read it. */
static void send_done(int single, uint64_t i)
{
    if (single)
        wait_at_least(&sh->to[!me].done, i);
}

/* Seconds per iteration of `pattern` (0 ping-pong round trip, 1 exchange, 2 window
 * and answer), over enough iterations to take ~50 ms, after a warm-up. */
static double run(int pattern, int single, char *src, char *dst, size_t n)
{
    static uint64_t seq[2];     /* messages so far to rank 0 and to rank 1 */
    long iters = (long) (50e-3 / (1e-6 + (double) n * 1e-10 * (pattern == 2 ? WINDOW : 1)));
    double t0 = 0;
    if (iters < 20)
        iters = 20;
    barrier();
    for (long it = -iters / 5; it < iters; it++) {
        if (it == 0)
            t0 = now();
        if (pattern == 0) {
            uint64_t i = ++seq[1], j = ++seq[0];
            if (me == 0) {
                send_msg(single, src, n, i);
                recv_msg(single, dst, n, j);
                send_done(single, i);
            } else {
                recv_msg(single, dst, n, i);
                send_msg(single, src, n, j);
                send_done(single, j);
            }
        } else if (pattern == 1) {
            uint64_t mine = ++seq[!me], theirs = ++seq[me];
            send_msg(single, src, n, mine);
            recv_msg(single, dst, n, theirs);
            send_done(single, mine);
        } else {
            uint64_t first = seq[1] + 1, last = seq[1] + WINDOW, ack = ++seq[0];
            seq[1] = last;
            if (me == 0) {
                /* A window of sends from one buffer, as osu_bw: single-copy sends are
                 * all announced, then read by the peer in turn. */
                for (uint64_t i = first; i <= last; i++)
                    send_msg(single, src, n, i);
                send_done(single, last);
                recv_msg(0, dst, 4, ack);
            } else {
                for (uint64_t i = first; i <= last; i++)
                    recv_msg(single, dst, n, i);
                send_msg(0, src, 4, ack);
            }
        }
    }
    double t = (now() - t0) / (double) iters;
    barrier();
    return t;
}

int main(int argc, char **argv)
{
    int each = argc == 3 && strcmp(argv[1], "--each") == 0;
    if (argc != 2 + each) {
        fprintf(stderr, "usage: copy_floor [--each] SIZE[,SIZE...]\n");
        return 2;
    }
    char *list = argv[1 + each];
    size_t max = 0;
    for (char *p = list; *p;) {
        char *end;
        unsigned long v = strtoul(p, &end, 10);
        if (end == p || v == 0 || (*end != ',' && *end != 0)) {
            fprintf(stderr, "copy_floor: bad size list '%s'\n", list);
            return 2;
        }
        if (v > max)
            max = v;
        p = *end ? end + 1 : end;
    }
    sh = mmap(NULL, sizeof *sh, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    if (sh == MAP_FAILED) {
        perror("copy_floor: mmap");
        return 1;
    }
    pid_t child = fork();
    if (child < 0) {
        perror("copy_floor: fork");
        return 1;
    }
    me = child == 0;
    if (me == 1)
        prctl(PR_SET_PDEATHSIG, SIGKILL);
    cpu_set_t cpus;
    CPU_ZERO(&cpus);
    CPU_SET(me, &cpus);
    if (sched_setaffinity(0, sizeof cpus, &cpus) != 0)
        perror("copy_floor: sched_setaffinity (running unpinned)");
    /* Heap buffers, touched first, as the benchmarks' malloc'd ones. */
    char *src = malloc(max), *dst = malloc(max);
    if (src == NULL || dst == NULL) {
        perror("copy_floor: malloc");
        return 1;
    }
    memset(src, 'a' + me, max);
    memset(dst, 0, max);
    sh->pid[me] = getpid();
    sh->src[me] = src;
    barrier();

    for (char *p = list; *p;) {
        char *end;
        size_t n = strtoul(p, &end, 10);
        p = *end ? end + 1 : end;
        /* Above DOUBLE_MAX the double transport carries only osu_bw's answers. */
        slot_len = ((n < DOUBLE_MAX ? n : DOUBLE_MAX) + LINE - 1) / LINE * LINE;
        slots = RING_BYTES / slot_len;
        if (slots > WINDOW)
            slots = WINDOW;
        double best[3] = { 0, 0, 0 };
        for (int pattern = 0; pattern < 3; pattern++) {
            for (int single = 0; single < 2; single++) {
                if ((single && n < 4096) || (!single && n > DOUBLE_MAX))
                    continue;
                double t = run(pattern, single, src, dst, n);
                if (each && me == 0)
                    printf("%s %s %zu %.3f\n", single ? "single" : "double",
                           pattern == 0 ? "pingpong" : pattern == 1 ? "pingping" : "window", n,
                           (pattern == 0 ? t / 2 : t) * 1e6);
                if (best[pattern] == 0 || t < best[pattern])
                    best[pattern] = t;
            }
        }
        if (me == 0) {
            double one_way = best[0] / 2 * 1e6, exchange = best[1] * 1e6;
            printf("imb_pingpong_lat %zu %.2f\n", n, one_way);
            printf("osu_latency %zu %.2f\n", n, one_way);
            printf("imb_pingping_lat %zu %.2f\n", n, exchange);
            printf("imb_pingpong_bw %zu %.2f\n", n, (double) n / one_way);
            printf("imb_pingping_bw %zu %.2f\n", n, (double) n / exchange);
            printf("osu_bw %zu %.2f\n", n, (double) n * WINDOW / (best[2] * 1e6));
            fflush(stdout);
        }
    }
    if (me == 1)
        return 0;
    int status;
    waitpid(child, &status, 0);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 1;
}
