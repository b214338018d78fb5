#define _GNU_SOURCE
/* Bad input from C: every misuse of rch.h gives its documented status code and a
 * message, never a crash, a hang or lost data. Runs as a singleton (no PMI
 * environment, no rchx): rank 0 of 1, with its loopback connection. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rch.h"

static int failures;

#define EXPECT(call, want)                                                                   \
    do {                                                                                     \
        int rc_ = (call);                                                                    \
        if (rc_ != (want)) {                                                                 \
            fprintf(stderr, "FAIL line %d: %s returned %d (%s), expected %d (%s): %s\n",     \
                    __LINE__, #call, rc_, rch_strerror(rc_), (want), rch_strerror(want),     \
                    rch_last_error());                                                       \
            failures++;                                                                      \
        } else if (rc_ != RCH_SUCCESS && rc_ != RCH_ERR_TIMEOUT && rch_last_error()[0] == 0) { \
            fprintf(stderr, "FAIL line %d: %s gave no message\n", __LINE__, #call);          \
            failures++;                                                                      \
        }                                                                                    \
    } while (0)

static int cb_ok(void *c, const char *k, const void *v, size_t l) { (void)c; (void)k; (void)v; (void)l; return 0; }
static int cb_lookup(void *c, int r, const char *k, void *b, size_t cap, size_t *l) { (void)c; (void)r; (void)k; (void)b; (void)cap; (void)l; return 1; }
static int cb_fence(void *c) { (void)c; return 0; }

int main(void)
{
    unsetenv("PMI_FD");
    unsetenv("PMI_RANK");
    unsetenv("PMI_SIZE");
    unsetenv("PMI_PORT");
    setenv("RCH_ZCOPY_PRIVATE_THRESHOLD", "64k", 1); /* heap buffers from 64 KiB go zero-copy */
    char data[64] = "hello, loopback";
    struct iovec iov = {data, 15};
    size_t nb = 99;
    rch_vc *vc = NULL;
    int rank = -1, size = -1, parent = -1;

    /* strings */
    for (int c = 0; c <= RCH_ERR_INTERNAL; c++)
        if (!rch_strerror(c) || !rch_strerror(c)[0] || strcmp(rch_strerror(c), "unknown status code") == 0) {
            fprintf(stderr, "FAIL: no description for %d\n", c);
            failures++;
        }
    if (strcmp(rch_strerror(-1), "unknown status code") || strcmp(rch_strerror(1000), "unknown status code")) {
        fprintf(stderr, "FAIL: unknown codes\n");
        failures++;
    }

    /* before any init */
    EXPECT(rch_init(), RCH_ERR_NOT_INITIALIZED);
    EXPECT(rch_finalize(), RCH_ERR_NOT_INITIALIZED);
    EXPECT(rch_vc_get(0, &vc), RCH_ERR_NOT_INITIALIZED);
    EXPECT(rch_rank(&rank), RCH_ERR_NOT_INITIALIZED);
    EXPECT(rch_wait(0), RCH_ERR_NOT_INITIALIZED);
    EXPECT(rch_put_datav((rch_vc *)(uintptr_t)0xc5, &iov, 1, &nb), RCH_ERR_NOT_INITIALIZED);
    if (nb != 0) {
        fprintf(stderr, "FAIL: nbytes not zeroed on error\n");
        failures++;
    }
    EXPECT(rch_read_datav((rch_vc *)(uintptr_t)0xc5, &iov, 1, &nb), RCH_ERR_NOT_INITIALIZED);
    uint64_t ticket = 7;
    EXPECT(rch_put_lend((rch_vc *)(uintptr_t)0xc5, &iov, 1, &nb, &ticket), RCH_ERR_NOT_INITIALIZED);
    if (ticket != 0) {
        fprintf(stderr, "FAIL: ticket not zeroed on error\n");
        failures++;
    }
    EXPECT(rch_lends_released((rch_vc *)(uintptr_t)0xc5, &ticket), RCH_ERR_NOT_INITIALIZED);
    EXPECT(rch_read_buffered((rch_vc *)(uintptr_t)0xc5, data, 8, &nb), RCH_ERR_NOT_INITIALIZED);
    {
        rch_send_lane *sl = (rch_send_lane *)data;
        EXPECT(rch_vc_send_lane((rch_vc *)(uintptr_t)0xc5, &sl), RCH_ERR_NOT_INITIALIZED);
        if (sl != NULL) {
            fprintf(stderr, "FAIL: a failed rch_vc_send_lane left a lane\n");
            failures++;
        }
        EXPECT(rch_lane_ring((rch_vc *)(uintptr_t)0xc5), RCH_ERR_NOT_INITIALIZED);
    }

    /* bad init arguments */
    EXPECT(rch_init_process_group(NULL, &size, &parent), RCH_ERR_NULL);
    EXPECT(rch_init_process_group(&rank, NULL, &parent), RCH_ERR_NULL);
    EXPECT(rch_init_process_group(&rank, &size, NULL), RCH_ERR_NULL);
    rch_exchange ex = {NULL, cb_ok, cb_lookup, cb_fence};
    EXPECT(rch_init_process_group_external(0, 1, NULL), RCH_ERR_NULL);
    EXPECT(rch_init_process_group_external(0, 0, &ex), RCH_ERR_INVALID);
    EXPECT(rch_init_process_group_external(-1, 2, &ex), RCH_ERR_INVALID);
    EXPECT(rch_init_process_group_external(2, 2, &ex), RCH_ERR_INVALID);
    rch_exchange no_fence = {NULL, cb_ok, cb_lookup, NULL};
    EXPECT(rch_init_process_group_external(0, 2, &no_fence), RCH_ERR_NULL);

    /* singleton init */
    EXPECT(rch_init_process_group(&rank, &size, &parent), RCH_SUCCESS);
    if (rank != 0 || size != 1 || parent != 0) {
        fprintf(stderr, "FAIL: singleton is rank %d of %d (parent %d)\n", rank, size, parent);
        failures++;
    }
    EXPECT(rch_init_process_group(&rank, &size, &parent), RCH_ERR_STATE);
    EXPECT(rch_init_process_group_external(0, 1, &ex), RCH_ERR_STATE);
    EXPECT(rch_vc_get(0, &vc), RCH_ERR_NOT_INITIALIZED); /* before rch_init */
    EXPECT(rch_init(), RCH_SUCCESS);
    EXPECT(rch_init(), RCH_ERR_STATE);

    /* vc handles */
    EXPECT(rch_vc_get(0, NULL), RCH_ERR_NULL);
    EXPECT(rch_vc_get(-1, &vc), RCH_ERR_INVALID);
    EXPECT(rch_vc_get(1, &vc), RCH_ERR_INVALID);
    EXPECT(rch_vc_get(INT_MAX, &vc), RCH_ERR_INVALID);
    EXPECT(rch_vc_get(0, &vc), RCH_SUCCESS);
    int r = -1;
    EXPECT(rch_vc_rank(vc, &r), RCH_SUCCESS);
    EXPECT(rch_vc_rank(vc, NULL), RCH_ERR_NULL);
    EXPECT(rch_put_datav(NULL, &iov, 1, &nb), RCH_ERR_NULL);
    EXPECT(rch_put_lend(NULL, &iov, 1, &nb, &ticket), RCH_ERR_NULL);
    EXPECT(rch_put_lend((rch_vc *)data, &iov, 1, &nb, &ticket), RCH_ERR_UNKNOWN_VC);
    EXPECT(rch_lends_released(NULL, &ticket), RCH_ERR_NULL);
    EXPECT(rch_lends_released((rch_vc *)data, &ticket), RCH_ERR_UNKNOWN_VC);
    EXPECT(rch_lends_released(vc, NULL), RCH_ERR_NULL);
    ticket = 7;
    EXPECT(rch_lends_released(vc, &ticket), RCH_SUCCESS); /* nothing lent yet */
    if (ticket != 0) {
        fprintf(stderr, "FAIL: %llu released before anything was lent\n", (unsigned long long)ticket);
        failures++;
    }
    EXPECT(rch_put_datav((rch_vc *)data, &iov, 1, &nb), RCH_ERR_UNKNOWN_VC);
    EXPECT(rch_put_datav((rch_vc *)(uintptr_t)0x12345678, &iov, 1, &nb), RCH_ERR_UNKNOWN_VC);
    EXPECT(rch_put_datav((rch_vc *)(uintptr_t)((5 << 8) | 0xc5), &iov, 1, &nb), RCH_ERR_UNKNOWN_VC);
    EXPECT(rch_read_datav((rch_vc *)data, &iov, 1, &nb), RCH_ERR_UNKNOWN_VC);
    EXPECT(rch_read_buffered((rch_vc *)data, data, 8, &nb), RCH_ERR_UNKNOWN_VC);
    EXPECT(rch_read_buffered(NULL, data, 8, &nb), RCH_ERR_NULL);
    EXPECT(rch_read_buffered(vc, data, 8, NULL), RCH_ERR_NULL);
    EXPECT(rch_read_buffered(vc, NULL, 8, &nb), RCH_ERR_NULL);
    EXPECT(rch_read_buffered(vc, data, (size_t)SSIZE_MAX + 1, &nb), RCH_ERR_INVALID);
    EXPECT(rch_read_buffered(vc, NULL, 0, &nb), RCH_SUCCESS);
    EXPECT(rch_vc_wait_readable((rch_vc *)data, 0), RCH_ERR_UNKNOWN_VC);

    /* iovec arguments */
    EXPECT(rch_put_datav(vc, &iov, 1, NULL), RCH_ERR_NULL);
    EXPECT(rch_put_lend(vc, &iov, 1, NULL, &ticket), RCH_ERR_NULL);
    EXPECT(rch_put_lend(vc, &iov, 1, &nb, NULL), RCH_ERR_NULL);
    EXPECT(rch_put_lend(vc, NULL, 1, &nb, &ticket), RCH_ERR_NULL);
    EXPECT(rch_put_lend(vc, &iov, -1, &nb, &ticket), RCH_ERR_INVALID);
    EXPECT(rch_put_datav(vc, NULL, 1, &nb), RCH_ERR_NULL);
    EXPECT(rch_put_datav(vc, &iov, -1, &nb), RCH_ERR_INVALID);
    EXPECT(rch_put_datav(vc, &iov, INT_MIN, &nb), RCH_ERR_INVALID);
    EXPECT(rch_put_datav(vc, &iov, RCH_IOV_MAX + 1, &nb), RCH_ERR_INVALID);
    EXPECT(rch_put_datav(vc, &iov, INT_MAX, &nb), RCH_ERR_INVALID);
    EXPECT(rch_read_datav(vc, &iov, -5, &nb), RCH_ERR_INVALID);
    EXPECT(rch_read_datav(vc, NULL, 2, &nb), RCH_ERR_NULL);
    struct iovec nullbase[2] = {{data, 3}, {NULL, 4}};
    EXPECT(rch_put_datav(vc, nullbase, 2, &nb), RCH_ERR_INVALID);
    EXPECT(rch_read_datav(vc, nullbase, 2, &nb), RCH_ERR_INVALID);
    struct iovec huge[2] = {{data, SIZE_MAX / 2}, {data, SIZE_MAX / 2 + 2}};
    EXPECT(rch_put_datav(vc, huge, 2, &nb), RCH_ERR_INVALID);
    EXPECT(rch_read_datav(vc, huge, 2, &nb), RCH_ERR_INVALID);
    struct iovec one_huge = {data, (size_t)SSIZE_MAX + 1};
    EXPECT(rch_put_datav(vc, &one_huge, 1, &nb), RCH_ERR_INVALID);
    EXPECT(rch_put_datav(vc, NULL, 0, &nb), RCH_SUCCESS); /* n == 0: a no-op */
    if (nb != 0) {
        fprintf(stderr, "FAIL: n == 0 moved %zu bytes\n", nb);
        failures++;
    }

    /* nothing was lost or sent by the refused calls: loopback data is exact */
    struct iovec parts[3] = {{NULL, 0}, {data, 7}, {data + 7, 8}}; /* NULL base, length 0: fine */
    size_t put = 0;
    EXPECT(rch_put_datav(vc, parts, 3, &put), RCH_SUCCESS);
    if (put != 15) {
        fprintf(stderr, "FAIL: loopback put %zu of 15\n", put);
        failures++;
    }
    char back[64] = {0};
    size_t got = 0;
    for (int i = 0; i < 1000000 && got < 15; i++) {
        struct iovec in[2] = {{back + got, 15 - got}, {NULL, 0}};
        size_t n = 0;
        EXPECT(rch_read_datav(vc, in, 2, &n), RCH_SUCCESS);
        got += n;
    }
    if (got != 15 || memcmp(back, data, 15) != 0) {
        fprintf(stderr, "FAIL: loopback read %zu bytes: %.15s\n", got, back);
        failures++;
    }
    /* a buffered read gets loopback bytes too (no zero-copy is involved) */
    EXPECT(rch_put_datav(vc, parts, 3, &put), RCH_SUCCESS);
    got = 0;
    memset(back, 0, sizeof back);
    for (int i = 0; i < 1000000 && got < put; i++) {
        size_t n = 0;
        EXPECT(rch_read_buffered(vc, back + got, sizeof back - got, &n), RCH_SUCCESS);
        got += n;
    }
    if (got != put || memcmp(back, data, put) != 0) {
        fprintf(stderr, "FAIL: buffered loopback read %zu of %zu bytes\n", got, put);
        failures++;
    }
    /* bytes lent in place (rch_peek), consumed in parts, mixed with a buffered read */
    {
        const void *lent = data;
        size_t len = 99, zc = 99;
        EXPECT(rch_peek(NULL, &lent, &len, NULL), RCH_ERR_NULL);
        EXPECT(rch_peek((rch_vc *)data, &lent, &len, NULL), RCH_ERR_UNKNOWN_VC);
        EXPECT(rch_peek(vc, NULL, &len, NULL), RCH_ERR_NULL);
        EXPECT(rch_peek(vc, &lent, NULL, NULL), RCH_ERR_NULL);
        EXPECT(rch_consume(NULL, 1), RCH_ERR_NULL);
        EXPECT(rch_consume((rch_vc *)data, 1), RCH_ERR_UNKNOWN_VC);
        /* the send lane: none to the process itself */
        rch_send_lane *sl = (rch_send_lane *)data;
        EXPECT(rch_vc_send_lane(NULL, &sl), RCH_ERR_NULL);
        EXPECT(rch_vc_send_lane((rch_vc *)data, &sl), RCH_ERR_UNKNOWN_VC);
        EXPECT(rch_vc_send_lane(vc, NULL), RCH_ERR_NULL);
        sl = (rch_send_lane *)data;
        EXPECT(rch_vc_send_lane(vc, &sl), RCH_ERR_INVALID);
        if (sl != NULL) {
            fprintf(stderr, "FAIL: rch_vc_send_lane gave the loopback a lane\n");
            failures++;
        }
        EXPECT(rch_lane_ring(NULL), RCH_ERR_NULL);
        EXPECT(rch_lane_ring((rch_vc *)data), RCH_ERR_UNKNOWN_VC);
        EXPECT(rch_lane_ring(vc), RCH_ERR_INVALID);
        EXPECT(rch_peek(vc, &lent, &len, &zc), RCH_SUCCESS);
        if (lent != NULL || len != 0 || zc != 0) {
            fprintf(stderr, "FAIL: an empty peek lent %zu bytes at %p (zero-copy %zu)\n", len, lent, zc);
            failures++;
        }
        EXPECT(rch_consume(vc, 1), RCH_ERR_INVALID); /* nothing was lent */
        EXPECT(rch_consume(vc, 0), RCH_SUCCESS);
        EXPECT(rch_put_datav(vc, parts, 3, &put), RCH_SUCCESS);
        len = 0;
        for (int i = 0; i < 1000000 && len == 0; i++)
            EXPECT(rch_peek(vc, &lent, &len, NULL), RCH_SUCCESS);
        if (len != 15 || memcmp(lent, data, 15) != 0) {
            fprintf(stderr, "FAIL: peek lent %zu of 15 bytes\n", len);
            failures++;
        }
        const void *again = NULL;
        size_t len2 = 0;
        EXPECT(rch_peek(vc, &again, &len2, NULL), RCH_SUCCESS); /* the same bytes, in place */
        if (again != lent || len2 != len) {
            fprintf(stderr, "FAIL: a second peek lent %zu bytes at %p, the first %zu at %p\n", len2,
                    again, len, lent);
            failures++;
        }
        EXPECT(rch_consume(vc, 16), RCH_ERR_INVALID); /* past the lent bytes: nothing taken */
        EXPECT(rch_consume(vc, 7), RCH_SUCCESS);
        EXPECT(rch_peek(vc, &lent, &len, NULL), RCH_SUCCESS);
        if (len != 8 || memcmp(lent, data + 7, 8) != 0) {
            fprintf(stderr, "FAIL: after consuming 7, peek lent %zu bytes\n", len);
            failures++;
        }
        size_t n = 0;
        EXPECT(rch_read_buffered(vc, back, 3, &n), RCH_SUCCESS); /* a read passes lent bytes */
        if (n != 3 || memcmp(back, data + 7, 3) != 0) {
            fprintf(stderr, "FAIL: a buffered read after a peek read %zu bytes\n", n);
            failures++;
        }
        EXPECT(rch_peek(vc, &lent, &len, NULL), RCH_SUCCESS);
        if (len != 5 || memcmp(lent, data + 10, 5) != 0) {
            fprintf(stderr, "FAIL: after a read, peek lent %zu bytes\n", len);
            failures++;
        }
        EXPECT(rch_consume(vc, 5), RCH_SUCCESS);
        EXPECT(rch_peek(vc, &lent, &len, NULL), RCH_SUCCESS);
        if (len != 0 || lent != NULL) {
            fprintf(stderr, "FAIL: %zu bytes lent past the end of what was sent\n", len);
            failures++;
        }
        /* consume and peek in one call: a failed consume takes and lends nothing */
        EXPECT(rch_put_datav(vc, parts, 3, &put), RCH_SUCCESS);
        len = 0;
        for (int i = 0; i < 1000000 && len == 0; i++)
            EXPECT(rch_consume_peek(vc, 0, &lent, &len, NULL), RCH_SUCCESS);
        EXPECT(rch_consume_peek(vc, 16, &lent, &len, NULL), RCH_ERR_INVALID);
        if (len != 0 || lent != NULL) {
            fprintf(stderr, "FAIL: a refused consume_peek lent %zu bytes\n", len);
            failures++;
        }
        EXPECT(rch_consume_peek(vc, 6, &lent, &len, &zc), RCH_SUCCESS);
        if (len != 9 || memcmp(lent, data + 6, 9) != 0 || zc != 0) {
            fprintf(stderr, "FAIL: consume_peek(6) then lent %zu bytes\n", len);
            failures++;
        }
        /* rch_copy_lent: the lent bytes, as memcpy; bad pointers and overlaps refused */
        {
            char copy[9] = {0};
            EXPECT(rch_copy_lent(vc, copy, lent, 9), RCH_SUCCESS);
            if (memcmp(copy, data + 6, 9) != 0) {
                fprintf(stderr, "FAIL: rch_copy_lent copied other bytes\n");
                failures++;
            }
            EXPECT(rch_copy_lent(vc, NULL, lent, 9), RCH_ERR_NULL);
            EXPECT(rch_copy_lent(vc, copy, NULL, 9), RCH_ERR_NULL);
            EXPECT(rch_copy_lent(vc, NULL, NULL, 0), RCH_SUCCESS);
            EXPECT(rch_copy_lent(vc, copy + 1, copy, 8), RCH_ERR_INVALID);
            EXPECT(rch_copy_lent(NULL, copy, lent, 9), RCH_ERR_NULL);
            EXPECT(rch_copy_lent((rch_vc *)data, copy, lent, 9), RCH_ERR_UNKNOWN_VC);
        }
        EXPECT(rch_consume_peek(vc, 9, &lent, &len, NULL), RCH_SUCCESS);
        if (len != 0 || lent != NULL) {
            fprintf(stderr, "FAIL: consume_peek past the end lent %zu bytes\n", len);
            failures++;
        }
        EXPECT(rch_consume_peek(vc, 0, NULL, &len, NULL), RCH_ERR_NULL);
        EXPECT(rch_consume_peek(NULL, 0, &lent, &len, NULL), RCH_ERR_NULL);

        /* a quiet connection's watch: quiet until a word changes or its tests run out */
        rch_watch w;
        memset(&w, 0x55, sizeof w);
        EXPECT(rch_consume_peek_watch(NULL, 0, &lent, &len, NULL, &w), RCH_ERR_NULL);
        if (w.count != 0 || w.tests_left != 0 || rch_watch_quiet(&w)) {
            fprintf(stderr, "FAIL: a failed call left a watch of %d words\n", w.count);
            failures++;
        }
        /* a few calls may pass before the connection is quiet (upkeep it still owes) */
        for (int i = 0; i < 100 && w.count == 0; i++)
            EXPECT(rch_consume_peek_watch(vc, 0, &lent, &len, NULL, &w), RCH_SUCCESS);
        if (len != 0 || w.count < 1 || w.count > RCH_WATCH_WORDS || w.tests_left < 1) {
            fprintf(stderr, "FAIL: an idle connection's watch: %d words, %d tests, %zu bytes lent\n",
                    w.count, w.tests_left, len);
            failures++;
        }
        int tests = w.tests_left, quiet = 0;
        rch_watch copy = w;
        while (rch_watch_quiet(&copy))
            quiet++;
        if (quiet != tests || rch_watch_quiet(&copy)) {
            fprintf(stderr, "FAIL: a watch of %d tests said quiet %d times\n", tests, quiet);
            failures++;
        }
        EXPECT(rch_put_datav(vc, parts, 3, &put), RCH_SUCCESS);
        /* Wait for the write to land without calling the library (on verbs it lands
         * a little later), looking at the watched words themselves. */
        int landed = 0;
        for (int i = 0; i < 5000 && !landed; i++) {
            for (int k = 0; k < w.count; k++)
                landed |= *w.word[k] != w.value[k];
            if (!landed)
                usleep(1000);
        }
        if (!landed) {
            fprintf(stderr, "FAIL: no watched word changed in 5 s after a put\n");
            failures++;
        }
        if (rch_watch_quiet(&w) || w.tests_left != 0) {
            fprintf(stderr, "FAIL: the watch stayed quiet after a put landed\n");
            failures++;
        }
        EXPECT(rch_consume_peek_watch(vc, 0, &lent, &len, NULL, &w), RCH_SUCCESS);
        if (len != 15 || memcmp(lent, data, 15) != 0 || w.count != 0 || rch_watch_quiet(&w)) {
            fprintf(stderr, "FAIL: the call after the watch lent %zu bytes, watch of %d words\n", len,
                    w.count);
            failures++;
        }
        EXPECT(rch_consume_peek_watch(vc, 16, &lent, &len, NULL, &w), RCH_ERR_INVALID);
        if (w.count != 0 || len != 0) {
            fprintf(stderr, "FAIL: a refused consume left a watch of %d words\n", w.count);
            failures++;
        }
        EXPECT(rch_consume_peek_watch(vc, 15, &lent, &len, NULL, NULL), RCH_SUCCESS); /* no watch */
        for (int i = 0; i < 100 && w.count == 0; i++)
            EXPECT(rch_consume_peek_watch(vc, 0, &lent, &len, NULL, &w), RCH_SUCCESS);
        if (len != 0 || w.count == 0 || !rch_watch_quiet(&w)) {
            fprintf(stderr, "FAIL: no watch once the connection was read to its end\n");
            failures++;
        }

        /* the lane: the packet landing in a quiet connection's next cell, found and
         * lent without a call, then consumed (whole or in part) by the next call */
        rch_lane lane;
        memset(&lane, 0x55, sizeof lane);
        EXPECT(rch_consume_peek_lane(NULL, 0, &lent, &len, NULL, &lane), RCH_ERR_NULL);
        if (lane.cell != NULL || lane.lent != 0 || lane.watch.count != 0 ||
            rch_lane_packet(&lane, &lent, &len) != -1) {
            fprintf(stderr, "FAIL: a failed call left a lane\n");
            failures++;
        }
        for (int form = 0; form < 2; form++) {
            /* a full packet of 15 bytes, then a short one of 5 */
            size_t plen = form == 0 ? 15 : 5;
            struct iovec one = {data, plen};
            for (int i = 0; i < 100 && lane.cell == NULL; i++)
                EXPECT(rch_consume_peek_lane(vc, 0, &lent, &len, NULL, &lane), RCH_SUCCESS);
            if (len != 0 || lane.cell == NULL || lane.room < 64 || lane.room % 64 != 0 ||
                lane.pos % 64 != 0) {
                fprintf(stderr, "FAIL: no lane on a quiet connection (room %llu)\n",
                        (unsigned long long)lane.room);
                failures++;
                break;
            }
            rch_lane spare = lane;
            if (rch_lane_packet(&spare, &lent, &len) != 0 || spare.lent) {
                fprintf(stderr, "FAIL: a quiet lane lent a packet\n");
                failures++;
            }
            EXPECT(rch_put_datav(vc, &one, 1, &put), RCH_SUCCESS);
            /* wait for the write to land (the packet's second word), without a call */
            for (int i = 0; i < 5000 && lane.cell[1] == 0; i++)
                usleep(1000);
            for (int i = 0; i < 5000 && rch_lane_packet(&lane, &lent, &len) == 0; i++) {
                lane.watch.tests_left = 1; /* a packet still landing, on verbs */
                usleep(1000);
            }
            if (!lane.lent || len != plen || memcmp(lent, data, plen) != 0) {
                fprintf(stderr, "FAIL: the lane lent %zu bytes of a %zu-byte put\n", len, plen);
                failures++;
            }
            if (rch_lane_packet(&lane, &lent, &len) != -1) {
                fprintf(stderr, "FAIL: a spent lane said other than -1\n");
                failures++;
            }
            /* more than the lane lent: refused, nothing consumed, the lane emptied */
            EXPECT(rch_consume_peek_lane(vc, plen + 1, &lent, &len, NULL, &lane), RCH_ERR_INVALID);
            if (len != 0 || lane.cell != NULL || lane.lent != 0) {
                fprintf(stderr, "FAIL: a refused lane consume lent %zu bytes\n", len);
                failures++;
            }
            EXPECT(rch_consume_peek_lane(vc, 0, &lent, &len, NULL, &lane), RCH_SUCCESS);
            if (len != plen || memcmp(lent, data, plen) != 0) {
                fprintf(stderr, "FAIL: after a refused consume %zu bytes were lent\n", len);
                failures++;
            }
            /* read in two parts: the first through the call after a lane packet */
            memset(&lane, 0, sizeof lane);
            EXPECT(rch_consume_peek_lane(vc, 2, &lent, &len, NULL, &lane), RCH_SUCCESS);
            if (len != plen - 2 || memcmp(lent, data + 2, plen - 2) != 0) {
                fprintf(stderr, "FAIL: consume(2) left %zu bytes lent\n", len);
                failures++;
            }
            EXPECT(rch_consume_peek_lane(vc, plen - 2, &lent, &len, NULL, &lane), RCH_SUCCESS);
            if (len != 0) {
                fprintf(stderr, "FAIL: %zu bytes lent past the end\n", len);
                failures++;
            }
        }
        /* a lane packet read in part: the call lends the rest */
        for (int i = 0; i < 100 && lane.cell == NULL; i++)
            EXPECT(rch_consume_peek_lane(vc, 0, &lent, &len, NULL, &lane), RCH_SUCCESS);
        struct iovec five = {data, 5};
        EXPECT(rch_put_datav(vc, &five, 1, &put), RCH_SUCCESS);
        for (int i = 0; i < 5000 && lane.cell != NULL && lane.cell[1] == 0; i++)
            usleep(1000);
        for (int i = 0; i < 5000 && rch_lane_packet(&lane, &lent, &len) == 0; i++) {
            lane.watch.tests_left = 1;
            usleep(1000);
        }
        if (!lane.lent || len != 5) {
            fprintf(stderr, "FAIL: the lane lent %zu bytes of a 5-byte put\n", len);
            failures++;
        }
        EXPECT(rch_consume_peek_lane(vc, 2, &lent, &len, NULL, &lane), RCH_SUCCESS);
        if (len != 3 || memcmp(lent, data + 2, 3) != 0) {
            fprintf(stderr, "FAIL: a lane packet read in part: %zu bytes lent after\n", len);
            failures++;
        }
        EXPECT(rch_consume_peek_lane(vc, 3, &lent, &len, NULL, NULL), RCH_SUCCESS);

        /* rch_lane_next: two whole packets passed without a call, then consumed
         * together; a lane that claims more packets than landed is refused */
        struct iovec two[2] = {{data, 7}, {data + 7, 3}};
        memset(&lane, 0, sizeof lane);
        for (int i = 0; i < 100 && lane.cell == NULL; i++)
            EXPECT(rch_consume_peek_lane(vc, 0, &lent, &len, NULL, &lane), RCH_SUCCESS);
        EXPECT(rch_put_datav(vc, &two[0], 1, &put), RCH_SUCCESS);
        EXPECT(rch_put_datav(vc, &two[1], 1, &put), RCH_SUCCESS);
        int moved = 0;
        for (int k = 0; k < 2; k++) {
            int r = 0;
            for (int i = 0; i < 5000 && (r = rch_lane_packet(&lane, &lent, &len)) == 0; i++) {
                lane.watch.tests_left = 1;
                usleep(1000);
            }
            if (r != 1 || len != two[k].iov_len || memcmp(lent, two[k].iov_base, len) != 0) {
                fprintf(stderr, "FAIL: lane packet %d: %d, %zu bytes\n", k, r, len);
                failures++;
                break;
            }
            if (rch_lane_next(&lane, len - 1, len) != 0) {
                fprintf(stderr, "FAIL: rch_lane_next moved past a packet read in part\n");
                failures++;
            }
            moved += rch_lane_next(&lane, len, len);
        }
        if (moved != 2 || lane.passed != 2 || rch_lane_next(&lane, 0, 0) != 0) {
            fprintf(stderr, "FAIL: rch_lane_next passed %d packets (lane says %d)\n", moved, lane.passed);
            failures++;
        }
        EXPECT(rch_consume_peek_lane(vc, 0, &lent, &len, NULL, &lane), RCH_SUCCESS);
        if (len != 0 || lane.passed != 0) {
            fprintf(stderr, "FAIL: %zu bytes lent after the passed packets\n", len);
            failures++;
        }
        lane.passed = 3;
        EXPECT(rch_consume_peek_lane(vc, 0, &lent, &len, NULL, &lane), RCH_ERR_INVALID);
        lane.passed = -1;
        EXPECT(rch_consume_peek_lane(vc, 0, &lent, &len, NULL, &lane), RCH_ERR_INVALID);
        /* n beyond the passed packets with nothing lent after them */
        EXPECT(rch_put_datav(vc, &two[1], 1, &put), RCH_SUCCESS);
        memset(&lane, 0, sizeof lane);
        lane.passed = 1;
        EXPECT(rch_consume_peek_lane(vc, 2, &lent, &len, NULL, &lane), RCH_ERR_INVALID);
    }
    size_t extra = 0;
    EXPECT(rch_read_datav(vc, &iov, 1, &extra), RCH_SUCCESS);
    if (extra != 0) {
        fprintf(stderr, "FAIL: %zu bytes more than were sent\n", extra);
        failures++;
    }

    /* the zero-copy contract: a put that announced a buffer must be retried with it */
    {
        size_t big_len = (size_t)1 << 20;
        char *big = malloc(big_len), *other = malloc(64), *sink = malloc(big_len);
        memset(big, 'z', big_len);
        struct iovec bv = {big, big_len}, ov = {other, 64};
        size_t n = 99;
        EXPECT(rch_put_datav(vc, &bv, 1, &n), RCH_SUCCESS);
        if (n != 0) {
            fprintf(stderr, "FAIL: a 1 MiB put above the zero-copy threshold counted %zu at once\n", n);
            failures++;
        }
        EXPECT(rch_put_datav(vc, &ov, 1, &n), RCH_ERR_IN_FLIGHT);
        /* a zero-copy transfer is not in the ring: peek lends nothing and says so */
        const void *lent = data;
        size_t len = 99, zc = 0;
        for (int i = 0; i < 1000000 && zc == 0; i++)
            EXPECT(rch_peek(vc, &lent, &len, &zc), RCH_SUCCESS);
        if (lent != NULL || len != 0 || zc != big_len) {
            fprintf(stderr, "FAIL: peek before a zero-copy transfer: %zu bytes lent, %zu announced\n",
                    len, zc);
            failures++;
        }
        EXPECT(rch_consume(vc, 1), RCH_ERR_INVALID);
        /* the loopback peer (ourselves) pulls it, then the retry counts it */
        size_t got2 = 0;
        for (int i = 0; i < 1000000 && got2 < big_len; i++) {
            struct iovec in = {sink + got2, big_len - got2};
            EXPECT(rch_read_datav(vc, &in, 1, &n), RCH_SUCCESS);
            got2 += n;
        }
        EXPECT(rch_put_datav(vc, &bv, 1, &n), RCH_SUCCESS);
        if (got2 != big_len || n != big_len || memcmp(sink, big, big_len) != 0) {
            fprintf(stderr, "FAIL: zero-copy loopback: read %zu, counted %zu\n", got2, n);
            failures++;
        }
        free(big);
        free(other);
        free(sink);
    }

    /* waits */
    EXPECT(rch_wait(-2), RCH_ERR_INVALID);
    EXPECT(rch_wait(INT_MIN), RCH_ERR_INVALID);
    EXPECT(rch_wait(0), RCH_ERR_TIMEOUT);
    EXPECT(rch_wait(20), RCH_ERR_TIMEOUT);
    EXPECT(rch_vc_wait_readable(vc, 10), RCH_ERR_TIMEOUT);
    EXPECT(rch_vc_wait_writable(vc, 10), RCH_SUCCESS);
    EXPECT(rch_vc_wait_readable(NULL, 0), RCH_ERR_NULL);

    /* a closed vc */
    EXPECT(rch_vc_close(vc), RCH_SUCCESS);
    EXPECT(rch_vc_close(vc), RCH_SUCCESS);
    EXPECT(rch_put_datav(vc, &iov, 1, &nb), RCH_ERR_VC_CLOSED);
    EXPECT(rch_read_datav(vc, &iov, 1, &nb), RCH_ERR_VC_CLOSED);
    EXPECT(rch_read_buffered(vc, data, 8, &nb), RCH_ERR_VC_CLOSED);
    {
        const void *lent;
        size_t len;
        EXPECT(rch_peek(vc, &lent, &len, NULL), RCH_ERR_VC_CLOSED);
        EXPECT(rch_consume(vc, 1), RCH_ERR_VC_CLOSED);
        EXPECT(rch_consume(vc, 0), RCH_ERR_VC_CLOSED);
        EXPECT(rch_consume_peek(vc, 0, &lent, &len, NULL), RCH_ERR_VC_CLOSED);
        rch_watch w;
        memset(&w, 0x55, sizeof w);
        EXPECT(rch_consume_peek_watch(vc, 0, &lent, &len, NULL, &w), RCH_ERR_VC_CLOSED);
        if (w.count != 0 || rch_watch_quiet(&w)) {
            fprintf(stderr, "FAIL: a closed connection left a watch of %d words\n", w.count);
            failures++;
        }
    }
    EXPECT(rch_vc_close((rch_vc *)data), RCH_ERR_UNKNOWN_VC);
    EXPECT(rch_vc_close(NULL), RCH_ERR_NULL);

    /* after finalize */
    EXPECT(rch_finalize(), RCH_SUCCESS);
    EXPECT(rch_finalize(), RCH_ERR_FINALIZED);
    EXPECT(rch_init(), RCH_ERR_FINALIZED);
    EXPECT(rch_init_process_group(&rank, &size, &parent), RCH_ERR_FINALIZED);
    EXPECT(rch_init_process_group_external(0, 1, &ex), RCH_ERR_FINALIZED);
    EXPECT(rch_vc_get(0, &vc), RCH_ERR_FINALIZED);
    EXPECT(rch_put_datav(vc, &iov, 1, &nb), RCH_ERR_FINALIZED);
    EXPECT(rch_read_datav(vc, &iov, 1, &nb), RCH_ERR_FINALIZED);
    {
        const void *lent;
        size_t len;
        EXPECT(rch_peek(vc, &lent, &len, NULL), RCH_ERR_FINALIZED);
        EXPECT(rch_consume(vc, 0), RCH_ERR_FINALIZED);
    }
    EXPECT(rch_wait(0), RCH_ERR_FINALIZED);
    EXPECT(rch_rank(&rank), RCH_ERR_FINALIZED);
    if (strstr(rch_last_error(), "finalize") == NULL) {
        fprintf(stderr, "FAIL: last error %s\n", rch_last_error());
        failures++;
    }
    if (failures) {
        fprintf(stderr, "badinput: %d failures\n", failures);
        return 1;
    }
    printf("badinput ok\n");
    return 0;
}
