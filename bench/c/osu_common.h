/*
 * osu_common.h - what bench/c/osu.c (the channel's C layer) and bench/c/osu_mpi.c
 * (real MPI) share, so that their figures are measured the same way: iteration
 * counts per size, the command line, and pinning rank r to CPU r.
 */
#ifndef OSU_COMMON_H
#define OSU_COMMON_H

#define _GNU_SOURCE
#include <sched.h>
#include <stdlib.h>
#include <string.h>

/* Messages in flight in the bandwidth test. */
#define WINDOW 64
#define MAX_SIZES 64

/* Round trips timed for latency, windows for bandwidth: ~20 MB and ~2 GB moved. */
static inline size_t lat_iters(size_t s)
{
    size_t n = 20000000 / (s + 2000);
    return n < 50 ? 50 : n > 20000 ? 20000 : n;
}

static inline size_t bw_iters(size_t s)
{
    size_t n = 2000000000 / (s * WINDOW + 100000);
    return n < 5 ? 5 : n > 2000 ? 2000 : n;
}

struct osu_args {
    size_t sizes[MAX_SIZES];
    int nsizes;
    long fixed_iters;  /* --iters N, 0: per size */
    int latency_only;  /* --latency */
    int bandwidth_only; /* --bandwidth */
    int pingping_only;  /* --pingping */
    int preposted;      /* --preposted: the latency loop posts its receive first */
};

/* --sizes a,b,c (default 1 B .. 4 MiB in powers of 2), --iters N, --latency (only
 * latency), --bandwidth (only bandwidth), --pingping (only IMB's PingPing, where a
 * program reads it), --preposted (latency with each receive posted before the send
 * it answers, where a program reads it). */
static inline void osu_parse(int argc, char **argv, struct osu_args *a)
{
    memset(a, 0, sizeof *a);
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--sizes") == 0 && i + 1 < argc) {
            char *s = argv[++i];
            while (*s && a->nsizes < MAX_SIZES) {
                a->sizes[a->nsizes++] = strtoull(s, &s, 10);
                if (*s == ',')
                    s++;
            }
        } else if (strcmp(argv[i], "--latency") == 0) {
            a->latency_only = 1;
        } else if (strcmp(argv[i], "--bandwidth") == 0) {
            a->bandwidth_only = 1;
        } else if (strcmp(argv[i], "--pingping") == 0) {
            a->pingping_only = 1;
        } else if (strcmp(argv[i], "--preposted") == 0) {
            a->preposted = 1;
            a->latency_only = 1;
        } else if (strcmp(argv[i], "--iters") == 0 && i + 1 < argc) {
            a->fixed_iters = atol(argv[++i]);
        }
    }
    if (a->nsizes == 0)
        for (size_t s = 1; s <= ((size_t)4 << 20); s *= 2)
            a->sizes[a->nsizes++] = s;
}

static inline size_t osu_max_size(const struct osu_args *a)
{
    size_t max = 0;
    for (int i = 0; i < a->nsizes; i++)
        if (a->sizes[i] > max)
            max = a->sizes[i];
    return max;
}

/* Rank r on CPU r, unless OSU_NO_PIN is set. */
static inline void osu_pin(int rank)
{
    if (getenv("OSU_NO_PIN"))
        return;
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(rank, &set);
    sched_setaffinity(0, sizeof set, &set);
}

#endif
