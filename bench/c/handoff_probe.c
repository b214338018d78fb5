/*
 * handoff_probe.c - the cross-core cache-line hand-off time of this machine right now:
 * two threads pinned to CPUs 0 and 1 bounce one counter; prints the one-way time in
 * ns. The benchmark scripts run it before and after each round and reject the round
 * when it reads above a limit (the shared host sometimes slows the hand-off from
 * ~35 ns to ~200 ns for seconds, and every figure of that round with it).
 *
 *   cc -O2 -pthread handoff_probe.c -o handoff_probe && ./handoff_probe [rounds]
 */
#define _GNU_SOURCE
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static _Alignas(64) atomic_long ball;
static long rounds = 200000;

static void pin(int cpu)
{
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    pthread_setaffinity_np(pthread_self(), sizeof set, &set);
}

static void *partner(void *arg)
{
    (void)arg;
    pin(1);
    for (long i = 1; i < 2 * rounds; i += 2) {
        while (atomic_load_explicit(&ball, memory_order_acquire) != i)
            ;
        atomic_store_explicit(&ball, i + 1, memory_order_release);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc > 1)
        rounds = atol(argv[1]);
    pthread_t t;
    pin(0);
    pthread_create(&t, NULL, partner, NULL);
    struct timespec a, b;
    clock_gettime(CLOCK_MONOTONIC, &a);
    for (long i = 0; i < 2 * rounds; i += 2) {
        atomic_store_explicit(&ball, i + 1, memory_order_release);
        while (atomic_load_explicit(&ball, memory_order_acquire) != i + 2)
            ;
    }
    clock_gettime(CLOCK_MONOTONIC, &b);
    pthread_join(t, NULL);
    double ns = ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / (2.0 * rounds);
    printf("%.1f\n", ns);
    return 0;
}
