/* The send lane (rch_vc_send_lane, rch_lane_send, rch_lane_ring) against the byte
 * stream, both ways: rank 0 sends a known stream in pieces of 1 byte to 96 KiB, from
 * one or two buffers, through the lane where it takes them and with rch_put_datav
 * where it does not (too long, no room left in the lap, the lane closed while a
 * zero-copy transfer is in flight or a new ring is offered); every few pieces it
 * waits for rank 1's 8-byte answer, which rank 1 sends the same way. Now and then a
 * rank pauses before it sends, so that the other waits in rch_wait long enough to ask
 * for its doorbell, which rch_lane_send then rings. Rank 1 reads with rch_read_datav
 * and checks every byte. Fails if a byte is wrong, lost or repeated, if the lane
 * wrote nothing on the emulated fabric (then it is not being tested) or anything on
 * verbs (which has no lane). The other ranks (if any) only take part in the
 * barriers. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mm.h"
#include "rch.h"
#include "stream.h"

/* The generator's state, the same on both ranks. */
static uint64_t rng_state = 0x2545f4914f6cdd1dull;
static uint64_t rng(void) { return stream_rng(&rng_state); }

/* Mostly small pieces (a few bytes to a few hundred), some of 0.5-17 KiB (the lane
 * takes up to 16 KiB of ring, where its lap leaves room: around that edge), now and
 * then 96 KiB (a zero-copy transfer from 64 KiB, or ring packets). */
static size_t piece_len(void)
{
    uint64_t r = rng();
    switch (r % 8) {
    case 0:
    case 1:
    case 2:
        return 1 + (r >> 8) % 40;
    case 3:
    case 4:
        return 41 + (r >> 8) % 500;
    case 5:
        return (r >> 8) % 2 == 0 ? 541 + (r >> 9) % 4000 : 4541 + (r >> 9) % 12800;
    default:
        return (r >> 8) % 32 == 0 ? 96 * 1024 : 1 + (r >> 8) % 100;
    }
}

/* Pieces at RCH_TEST_CASE_SCALE 1 (stream_scaled), and at least: */
#define PIECES 30000
#define MIN_PIECES 1000
#define ANSWER_EVERY 4
/* Every this many answers, the sender of the next piece pauses first. */
#define PAUSE_EVERY 500

/* A pause long enough for the other rank's rch_wait to go quiet and ask for its
 * doorbell. */
static void pause_a_while(void)
{
    struct timespec t = {0, 20 * 1000 * 1000};
    nanosleep(&t, NULL);
}

static uint64_t lane_writes, library_puts;

/* The lane copies only what rch_put_datav would have copied too: its packets stay
 * within 16 KiB of ring and below the zero-copy threshold the test sets
 * (RCH_ZCOPY_PRIVATE_THRESHOLD, when given: bytes, or with k, m or g). */
static void check_lane_limit(const rch_send_lane *lane)
{
    const char *t = getenv("RCH_ZCOPY_PRIVATE_THRESHOLD");
    uint64_t limit = 16 * 1024 - 24;
    if (t != NULL && *t >= '1' && *t <= '9') {
        char *end;
        uint64_t bytes = strtoull(t, &end, 10);
        int shift = *end == 'k' ? 10 : *end == 'm' ? 20 : *end == 'g' ? 30 : 0;
        if ((bytes << shift) - 1 < limit)
            limit = (bytes << shift) - 1;
    }
    if (lane->ring != NULL && lane->max_payload > limit) {
        fprintf(stderr, "lane takes %llu bytes, more than %llu\n",
                (unsigned long long)lane->max_payload, (unsigned long long)limit);
        mm_fatal("the lane takes a packet a put would send zero-copy or past 16 KiB");
    }
}

/* Sends a + b whole: through the lane if it takes them, else with rch_put_datav. */
static void send_two(rch_vc *vc, rch_send_lane **lane, const unsigned char *a, size_t alen,
                     const unsigned char *b, size_t blen)
{
    if (*lane == NULL)
        stream_check(rch_vc_send_lane(vc, lane), "rch_vc_send_lane");
    if (*lane != NULL)
        check_lane_limit(*lane);
    if (*lane != NULL && rch_lane_send(*lane, alen ? a : NULL, alen, blen ? b : NULL, blen) == 1) {
        lane_writes++;
        return;
    }
    struct iovec v[2] = {{(void *)a, alen}, {(void *)b, blen}};
    size_t done = 0;
    library_puts++;
    while (done < alen + blen) {
        struct iovec left[2];
        int n = stream_rest(v, 2, done, left);
        size_t nb = 0;
        stream_check(rch_put_datav(vc, left, n, &nb), "rch_put_datav");
        done += nb;
        if (nb == 0) {
            int rc = rch_wait(10);
            if (rc != RCH_ERR_TIMEOUT)
                stream_check(rc, "rch_wait");
        }
    }
}

/* Reads len bytes, waiting as an MPI progress loop does: rch_poll_ready between
 * reads (a connection quiet for long asks its peer to ring the doorbell), then
 * rch_wait. */
static void read_all(rch_vc *vc, unsigned char *buf, size_t len)
{
    size_t done = 0;
    int idle = 0;
    while (done < len) {
        struct iovec v = {buf + done, len - done};
        size_t n = 0;
        stream_check(rch_read_datav(vc, &v, 1, &n), "rch_read_datav");
        done += n;
        if (n != 0) {
            idle = 0;
            continue;
        }
        int ranks[64], nr = 0;
        stream_check(rch_poll_ready(ranks, 64, &nr), "rch_poll_ready");
        if (nr == 0 && ++idle % 512 == 0) {
            int rc = rch_wait(100);
            if (rc != RCH_ERR_TIMEOUT)
                stream_check(rc, "rch_wait");
        }
    }
}

int main(void)
{
    mm_init();
    int rank = mm_rank(), size = mm_size();
    if (size < 2)
        mm_fatal("needs 2 ranks");
    int pieces = stream_scaled(PIECES, MIN_PIECES);
    size_t *lens = malloc(pieces * sizeof *lens);
    if (!lens)
        mm_fatal("oom");
    uint64_t total = 0;
    for (int k = 0; k < pieces; k++) {
        lens[k] = piece_len();
        total += lens[k];
    }
    const char *fabric = getenv("RCH_FABRIC");
    int verbs = fabric != NULL && strcmp(fabric, "verbs") == 0;
    /* Ranks 0 and 1 use their connection directly, not through mm, until the last
     * barrier: mm's progress would read (and keep) what the other sent. */
    if (rank == 0 || rank == 1) {
        rch_vc *vc;
        stream_check(rch_vc_get(1 - rank, &vc), "rch_vc_get");
        rch_send_lane *lane = NULL, *again = NULL;
        unsigned char *buf = malloc(96 * 1024), answer[8];
        if (!buf)
            mm_fatal("oom");
        uint64_t at = 0, answers = 0;
        for (int k = 0; k < pieces; k++) {
            size_t len = lens[k];
            if (rank == 0) {
                for (size_t i = 0; i < len; i++)
                    buf[i] = stream_byte(at + i);
                size_t a = rng() % (len + 1);
                send_two(vc, &lane, buf, a, buf + a, len - a);
            } else {
                (void)rng();
                read_all(vc, buf, len);
                for (size_t i = 0; i < len; i++)
                    if (buf[i] != stream_byte(at + i))
                        mm_fatal("stream byte %llu is %d, expected %d", (unsigned long long)(at + i),
                                 buf[i], stream_byte(at + i));
            }
            at += len;
            if (k % ANSWER_EVERY == ANSWER_EVERY - 1 || k == pieces - 1) {
                answers++;
                if (rank == 1) {
                    if (answers % PAUSE_EVERY == 0)
                        pause_a_while();
                    memcpy(answer, &at, 8);
                    send_two(vc, &lane, answer, 3, answer + 3, 5);
                } else {
                    read_all(vc, answer, 8);
                    uint64_t seen;
                    memcpy(&seen, answer, 8);
                    if (seen != at)
                        mm_fatal("rank 1 says it read %llu bytes of %llu sent", (unsigned long long)seen,
                                 (unsigned long long)at);
                    if (answers % PAUSE_EVERY == PAUSE_EVERY / 2)
                        pause_a_while();
                }
            }
        }
        if (at != total)
            mm_fatal("%llu bytes of %llu", (unsigned long long)at, (unsigned long long)total);
        /* The same lane for every call. */
        stream_check(rch_vc_send_lane(vc, &again), "rch_vc_send_lane");
        if (lane != NULL && again != lane)
            mm_fatal("rch_vc_send_lane gave %p, then %p", (void *)lane, (void *)again);
        if (!verbs && lane_writes == 0)
            mm_fatal("rank %d: the lane wrote nothing (%llu library puts)", rank,
                     (unsigned long long)library_puts);
        if (verbs && lane_writes != 0)
            mm_fatal("rank %d: the lane wrote %llu packets on verbs", rank, (unsigned long long)lane_writes);
        /* The doorbell: rank 0 waits for one more message with rch_poll_ready alone
         * (a read would keep the connection watched) until its connection is quiet
         * and asks to be rung; rank 1 pauses, then sends it through the lane alone
         * (no library put that would ring instead): rch_lane_send must ring. */
        rch_watch_stats ws;
        int lane_rang = -1; /* -1: not tested (more than two ranks, rank 1's message
                             * came first, or found no room in the lane); else whether
                             * the doorbell was rung */
        if (rank == 1) {
            struct timespec t = {0, 200 * 1000 * 1000};
            nanosleep(&t, NULL);
            /* One message, which says how it went: anything sent after it could ring
             * the doorbell in its place. */
            memcpy(answer, "the end.", 8);
            if (lane == NULL || rch_lane_send(lane, answer, 8, NULL, 0) != 1) {
                memcpy(answer, "the END.", 8);
                send_two(vc, &lane, answer, 8, NULL, 0);
            }
            /* Nothing more from this rank (a put would ring too) until rank 0 has
             * looked for the ring. */
            read_all(vc, answer, 1);
        } else {
            int listed = 0, idle = 0;
            unsigned long long rings_before = 0;
            while (!listed) {
                int ranks[64], nr = 0;
                stream_check(rch_poll_ready(ranks, 64, &nr), "rch_poll_ready");
                for (int i = 0; i < nr; i++)
                    listed |= ranks[i] == 1;
                if (listed)
                    break;
                stream_check(rch_get_watch_stats(&ws), "rch_get_watch_stats");
                /* With two ranks the one connection that can ask is rank 1's (the
                 * loopback has no doorbell); with more, another may be the one. */
                if (lane_rang == -1 && size == 2 && ws.quiet_belled > 0) {
                    lane_rang = 0;
                    rings_before = ws.rings;
                }
                if (nr == 0 && ++idle % 512 == 0) {
                    int rc = rch_wait(100);
                    if (rc != RCH_ERR_TIMEOUT)
                        stream_check(rc, "rch_wait");
                }
            }
            read_all(vc, answer, 8);
            if (memcmp(answer, "the END.", 8) == 0)
                lane_rang = -1; /* sent by rch_put_datav */
            else if (memcmp(answer, "the end.", 8) != 0)
                mm_fatal("the last message is wrong");
            /* The ring follows the packet in the same rch_lane_send, but a look in
             * turn may have found the packet first: wait for the ring to be seen (10 s
             * at most: nothing else rings now). */
            for (int i = 0; lane_rang == 0 && !verbs && i < 100000; i++) {
                int ranks[64], nr = 0;
                stream_check(rch_poll_ready(ranks, 64, &nr), "rch_poll_ready");
                stream_check(rch_get_watch_stats(&ws), "rch_get_watch_stats");
                if (ws.rings > rings_before)
                    lane_rang = 1;
                else if (i % 64 == 63) {
                    struct timespec t = {0, 100 * 1000};
                    nanosleep(&t, NULL);
                }
            }
            if (!verbs && lane_rang == 0)
                mm_fatal("a message sent through the lane to a quiet connection rang no doorbell");
            answer[0] = 1;
            send_two(vc, &lane, answer, 1, NULL, 0);
        }
        stream_check(rch_get_watch_stats(&ws), "rch_get_watch_stats");
        printf("send lane: rank %d, %llu bytes, %llu messages through the lane, %llu through "
               "rch_put_datav, doorbell rung %llu times%s\n",
               rank, (unsigned long long)total, (unsigned long long)lane_writes,
               (unsigned long long)library_puts, (unsigned long long)ws.rings,
               lane_rang == -1 && rank == 0 ? " (the last ring not tested)" : "");
        fflush(stdout);
        free(buf);
    }
    free(lens);
    mm_barrier();
    if (rank == 0)
        printf("send lane ok: %d ranks, %s mode\n", size, mm_mode());
    mm_finalize();
    return 0;
}
