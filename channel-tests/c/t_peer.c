#define _GNU_SOURCE
/* A peer that closes or dies. Two ranks, raw rch.h calls:
 *   close: rank 1 sends 1000 bytes and closes its vc; rank 0 reads all of them, then
 *          RCH_ERR_PEER_CLOSED; its puts fail with RCH_ERR_PEER_CLOSED.
 *   die:   rank 1 connects, then exits without finalizing; rank 0's reads report
 *          RCH_ERR_PEER_GONE within seconds (never a hang), and rch_finalize's
 *          fence reports the missing rank (the library is finalised anyway). */
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

/* Reads until an error (or 30 s); returns it and the number of bytes read. */
static int read_until_error(rch_vc *vc, char *buf, size_t cap, size_t *total)
{
    double start = now();
    *total = 0;
    while (now() - start < 30) {
        struct iovec v = {buf + (*total % cap), cap - (*total % cap)};
        size_t n = 0;
        int rc = rch_read_datav(vc, &v, 1, &n);
        *total += n;
        if (rc != RCH_SUCCESS)
            return rc;
        if (n == 0)
            rch_vc_wait_readable(vc, 100);
    }
    return -1;
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "close";
    mm_init();
    int rank = mm_rank();
    rch_vc *vc;
    if (rch_vc_get(1 - rank, &vc) != RCH_SUCCESS)
        mm_fatal("vc");
    char buf[1000];
    if (strcmp(mode, "close") == 0) {
        if (rank == 1) {
            memset(buf, 'x', sizeof buf);
            size_t off = 0;
            while (off < sizeof buf) {
                struct iovec v = {buf + off, sizeof buf - off};
                size_t n;
                if (rch_put_datav(vc, &v, 1, &n) != RCH_SUCCESS)
                    mm_fatal("put: %s", rch_last_error());
                off += n;
                if (n == 0)
                    rch_wait(10);
            }
            if (rch_vc_close(vc) != RCH_SUCCESS)
                mm_fatal("close");
        } else {
            size_t total;
            int rc = read_until_error(vc, buf, sizeof buf, &total);
            if (rc != RCH_ERR_PEER_CLOSED || total != sizeof buf)
                mm_fatal("read after peer close: %s after %zu bytes (%s)", rch_strerror(rc), total,
                         rch_last_error());
            struct iovec v = {buf, 10};
            size_t n = 5;
            rc = rch_put_datav(vc, &v, 1, &n);
            if (rc != RCH_ERR_PEER_CLOSED || n != 0)
                mm_fatal("put after peer close: %s (%s)", rch_strerror(rc), rch_last_error());
            printf("peer close ok: read %zu bytes, then \"%s\"\n", total, rch_last_error());
        }
        if (rch_finalize() != RCH_SUCCESS)
            mm_fatal("finalize: %s", rch_last_error());
        return 0;
    }
    /* die */
    if (rank == 1) {
        struct iovec v = {"hi", 2};
        size_t off = 0;
        while (off < 2) {
            size_t n;
            if (rch_put_datav(vc, &v, 1, &n) != RCH_SUCCESS)
                mm_fatal("put: %s", rch_last_error());
            off += n;
            if (n == 0)
                rch_wait(10);
        }
        usleep(100000);
        _exit(0); /* no finalize: as if killed */
    }
    size_t total;
    double t0 = now();
    int rc = read_until_error(vc, buf, sizeof buf, &total);
    if (rc != RCH_ERR_PEER_GONE && rc != RCH_ERR_PEER_CLOSED)
        mm_fatal("read from a dead peer: %s after %zu bytes (%s)", rch_strerror(rc), total, rch_last_error());
    if (total != 2)
        mm_fatal("read %zu bytes of 2", total);
    rc = rch_finalize();
    if (rc != RCH_ERR_EXCHANGE && rc != RCH_SUCCESS)
        mm_fatal("finalize: %s", rch_strerror(rc));
    printf("peer death ok: \"%s\" after %.2f s; finalize: %s\n", rch_strerror(RCH_ERR_PEER_GONE),
           now() - t0, rch_strerror(rc));
    return 0;
}
