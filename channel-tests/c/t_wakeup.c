#define _GNU_SOURCE
/* rch_wakeup ends another thread's rch_wait early. One rank with nothing to
 * progress: the main thread waits up to 20 s in rch_wait; a second thread calls
 * rch_wakeup after 200 ms. The wait must return RCH_SUCCESS long before its timeout
 * (a broken wakeup gives RCH_ERR_TIMEOUT after 20 s). Repeated 5 times, and once with
 * the wakeup racing the start of the wait. */
#include <pthread.h>
#include <stdio.h>
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

static unsigned delay_us;

static void *waker(void *arg)
{
    (void)arg;
    usleep(delay_us);
    if (rch_wakeup() != RCH_SUCCESS)
        mm_fatal("rch_wakeup failed");
    return NULL;
}

static double wait_once(unsigned delay)
{
    pthread_t t;
    delay_us = delay;
    double t0 = now();
    if (pthread_create(&t, NULL, waker, NULL) != 0)
        mm_fatal("pthread_create");
    int rc = rch_wait(20000);
    double took = now() - t0;
    pthread_join(t, NULL);
    if (rc != RCH_SUCCESS)
        mm_fatal("rch_wait returned %d (%s) after %.3f s: the wakeup did not end it", rc,
                 rch_strerror(rc), took);
    return took;
}

int main(void)
{
    mm_init();
    if (mm_size() != 1)
        mm_fatal("t_wakeup runs on 1 rank");
    double worst = 0;
    for (int i = 0; i < 5; i++) {
        double took = wait_once(200000);
        if (took > worst)
            worst = took;
    }
    if (worst > 5.0)
        mm_fatal("a woken rch_wait took %.3f s", worst);
    /* The wakeup may land just before the wait starts: the wait then runs to a
     * later wakeup or its timeout, never longer; this must not hang either. */
    for (int i = 0; i < 20; i++) {
        delay_us = 0;
        pthread_t t;
        pthread_create(&t, NULL, waker, NULL);
        int rc = rch_wait(50);
        pthread_join(t, NULL);
        if (rc != RCH_SUCCESS && rc != RCH_ERR_TIMEOUT)
            mm_fatal("rch_wait returned %d", rc);
    }
    printf("wakeup ok: woken waits took at most %.3f s\n", worst);
    mm_finalize();
    return 0;
}
