/* The lane (rch_lane_packet, rch_lane_next, rch_consume_peek_lane) against the byte
 * stream: rank 0 puts a known stream in pieces of 1 byte to 96 KiB from one to three
 * buffers, and every few pieces waits for rank 1's 8-byte answer, so that rank 1 is
 * often quiet when a packet lands and sometimes finds several there; rank 1 reads
 * the stream with the lane where it can and with rch_consume_peek_lane where it must,
 * consuming each packet in one or more parts (a third of them also copied out with
 * rch_copy_lent), and passes packets read whole with
 * rch_lane_next (the library consumes them later, together), and checks every byte.
 * The stream ends with a burst of 8-16 KiB pieces that land while rank 1 sleeps.
 * Fails if the lane never lent a packet or never passed one (then they are not being
 * tested), if passed packets hold more ring than rch.h allows, or if a byte is
 * wrong, lost or repeated. The other ranks (if any) only take
 * part in the barriers. */
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
static uint64_t rng_state = 0x9e3779b97f4a7c15ull;
static uint64_t rng(void) { return stream_rng(&rng_state); }

/* The length of piece k: mostly small (the lane's case: short packets of 1-8 bytes
 * and one- or two-cell packets), some of a few KiB, now and then 96 KiB (several
 * packets, or a zero-copy transfer, which the lane leaves to the library). */
static size_t piece_len(void)
{
    uint64_t r = rng();
    switch (r % 8) {
    case 0:
    case 1:
    case 2:
        return 1 + (r >> 8) % 8;
    case 3:
    case 4:
        return 9 + (r >> 8) % 120;
    case 5:
    case 6:
        return 129 + (r >> 8) % 4000;
    default:
        return (r >> 8) % 16 == 0 ? 96 * 1024 : 1 + (r >> 8) % 300;
    }
}

/* Pieces at RCH_TEST_CASE_SCALE 1 (stream_scaled), and at least: */
#define PIECES 20000
#define MIN_PIECES 1000
#define ANSWER_EVERY 3
/* The last pieces: a burst of BURST pieces of BURST_LEN / 2 to BURST_LEN bytes, put
 * while rank 1 sleeps, so that it finds them landed back to back and the lane passes
 * them. */
#define BURST 64
#define BURST_LEN 16000

/* A burst piece's length: 8-16 KiB, so that the packets passed together come in
 * mixed sizes (as they do on verbs, where a put may split a piece anywhere). */
static size_t burst_len(void)
{
    return BURST_LEN / 2 + rng() % (BURST_LEN / 2 + 1);
}

/* Whether rank 1 answers after piece k (both ranks use this rule): every few
 * pieces, not within the burst, and not after the last (the last word answers it). */
static int answered_after(int k, int pieces)
{
    return k % ANSWER_EVERY == ANSWER_EVERY - 1 && k < pieces - 1 - BURST;
}

static void put_all(rch_vc *vc, const unsigned char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        struct iovec v = {(void *)(buf + done), len - done};
        size_t n = 0;
        stream_check(rch_put_datav(vc, &v, 1, &n), "rch_put_datav");
        done += n;
        if (n == 0) {
            int rc = rch_wait(10);
            if (rc != RCH_ERR_TIMEOUT)
                stream_check(rc, "rch_wait");
        }
    }
}

static void read_all(rch_vc *vc, unsigned char *buf, size_t len)
{
    size_t done = 0;
    while (done < len) {
        struct iovec v = {buf + done, len - done};
        size_t n = 0;
        stream_check(rch_read_datav(vc, &v, 1, &n), "rch_read_datav");
        done += n;
    }
}

/* Checks `len` bytes at `bytes` against the stream from position `at`. */
static void expect_stream(const unsigned char *bytes, size_t len, uint64_t at)
{
    for (size_t i = 0; i < len; i++)
        if (bytes[i] != stream_byte(at + i))
            mm_fatal("stream byte %llu is %d, expected %d", (unsigned long long)(at + i), bytes[i],
                     stream_byte(at + i));
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
    uint64_t total = 0, burst_at = 0;
    for (int k = 0; k < pieces; k++) {
        if (k == pieces - BURST)
            burst_at = total;
        lens[k] = k < pieces - BURST ? piece_len() : burst_len();
        total += lens[k];
    }
    /* Ranks 0 and 1 use their connection directly, not through mm, until the last
     * barrier: mm's progress would read (and keep) what the other sent. */
    if (rank == 0) {
        rch_vc *vc;
        stream_check(rch_vc_get(1, &vc), "rch_vc_get");
        size_t max = 96 * 1024;
        unsigned char *buf = malloc(max), answer[8];
        if (!buf)
            mm_fatal("oom");
        uint64_t at = 0;
        for (int k = 0; k < pieces; k++) {
            for (size_t i = 0; i < lens[k]; i++)
                buf[i] = stream_byte(at + i);
            /* One to three buffers, split where the generator says. */
            uint64_t r = rng();
            size_t a = lens[k] > 2 ? r % lens[k] : lens[k], b = lens[k] > 2 ? (r >> 20) % (lens[k] - a + 1) : 0;
            struct iovec v[3] = {{buf, a}, {buf + a, b}, {buf + a + b, lens[k] - a - b}};
            size_t done = 0;
            while (done < lens[k]) {
                /* Offer what is left as the rest of the three buffers. */
                struct iovec left[3];
                int n = stream_rest(v, 3, done, left);
                size_t nb = 0;
                stream_check(rch_put_datav(vc, left, n, &nb), "rch_put_datav");
                done += nb;
            }
            at += lens[k];
            if (answered_after(k, pieces)) {
                read_all(vc, answer, sizeof answer);
                uint64_t seen;
                memcpy(&seen, answer, 8);
                if (seen > at)
                    mm_fatal("rank 1 says it read %llu bytes of %llu sent", (unsigned long long)seen,
                             (unsigned long long)at);
            }
        }
        /* Rank 1's last word: every byte arrived. */
        read_all(vc, answer, sizeof answer);
        uint64_t seen;
        memcpy(&seen, answer, 8);
        if (seen != total)
            mm_fatal("rank 1 read %llu bytes of %llu", (unsigned long long)seen, (unsigned long long)total);
        free(buf);
    } else if (rank == 1) {
        rch_vc *vc;
        stream_check(rch_vc_get(0, &vc), "rch_vc_get");
        unsigned char *scratch = malloc(96 * 1024);
        if (!scratch)
            mm_fatal("oom");
        rch_lane lane;
        memset(&lane, 0, sizeof lane);
        uint64_t got = 0, lane_packets = 0, lane_parts = 0, calls = 0, passed = 0;
        /* Ring bytes of the packets passed since the last consume, and the most. */
        uint64_t held = 0, held_max = 0, held_burst = 0;
        uint64_t next_answer_at = 0; /* the stream's length after the next answered piece */
        int k = 0;
        size_t pending = 0; /* bytes of the last lent packet read, to consume */
        /* The stream's length after the next answered piece (none: past the end). */
        while (k < pieces && !answered_after(k, pieces))
            next_answer_at += lens[k++];
        next_answer_at = k < pieces ? next_answer_at + lens[k++] : total;
        while (got < total) {
            const void *bytes;
            size_t len = 0, zc = 0;
            int r = pending == 0 ? rch_lane_packet(&lane, &bytes, &len) : -1;
            if (r == 0)
                continue;
            if (r == 1) {
                lane_packets++;
            } else {
                calls++;
                stream_check(rch_consume_peek_lane(vc, pending, &bytes, &len, &zc, &lane), "rch_consume_peek_lane");
                pending = 0;
                held = held_burst = 0;
                if (len == 0 && zc != 0) {
                    /* A zero-copy transfer: only a read takes it. */
                    size_t n = zc < 96 * 1024 ? zc : 96 * 1024;
                    read_all(vc, scratch, n);
                    expect_stream(scratch, n, got);
                    got += n;
                }
            }
            if (len > 0) {
                /* Read a part of it, now and then: the rest is lent again. */
                size_t take = len;
                uint64_t rr = rng();
                if (len > 1 && rr % 4 == 0)
                    take = 1 + (rr >> 8) % (len - 1);
                if (r == 1 && take < len)
                    lane_parts++;
                if (rr % 3 == 0) {
                    /* Through the library, as ch3:rch copies a large message out. */
                    memset(scratch, 0, take);
                    stream_check(rch_copy_lent(vc, scratch, bytes, take), "rch_copy_lent");
                    expect_stream(scratch, take, got);
                }
                expect_stream(bytes, take, got);
                got += take;
                pending = take;
                /* All of it: go on past it without a call when the lane can. */
                uint64_t step = (uint64_t)lane.lent * RCH_LANE_CELL;
                if (rch_lane_next(&lane, take, len)) {
                    pending = 0;
                    passed++;
                    held += step;
                    if (got - take >= burst_at)
                        held_burst += step;
                    if (held > held_max)
                        held_max = held;
                    /* Passed packets hold their ring space until the next call:
                     * at most 64 KiB, whatever their sizes (rch.h,
                     * RCH_LANE_PASS_BYTES_MAX). Without the bound, the burst's
                     * packets held 192 KiB; with a bound that counted each packet
                     * at its own size, a burst of 16 KiB pieces that came as
                     * packets of 254 and 257 cells held 65600 bytes (verbs). */
                    if (held > RCH_LANE_PASS_BYTES_MAX)
                        mm_fatal("passed packets hold %llu ring bytes (%llu of the burst)",
                                 (unsigned long long)held, (unsigned long long)held_burst);
                }
            }
            if (got >= next_answer_at && got < total) {
                /* Give back what was read first: the sender may be waiting for room. */
                if (pending != 0 || lane.passed != 0) {
                    calls++;
                    stream_check(rch_consume_peek_lane(vc, pending, &bytes, &len, NULL, &lane),
                          "rch_consume_peek_lane");
                    pending = 0;
                    held = held_burst = 0;
                }
                unsigned char answer[8];
                memcpy(answer, &got, 8);
                put_all(vc, answer, 8);
                while (k < pieces && !answered_after(k, pieces))
                    next_answer_at += lens[k++];
                if (k < pieces) {
                    next_answer_at += lens[k++];
                } else {
                    /* The last answer before the burst: let it land whole. */
                    next_answer_at = total;
                    struct timespec pause = {0, 20 * 1000 * 1000};
                    nanosleep(&pause, NULL);
                }
            }
        }
        if (pending != 0 || lane.passed != 0) {
            const void *bytes;
            size_t len = 0;
            stream_check(rch_consume_peek_lane(vc, pending, &bytes, &len, NULL, &lane), "rch_consume_peek_lane");
            if (len != 0)
                mm_fatal("%zu bytes more than were sent", len);
        }
        unsigned char answer[8];
        memcpy(answer, &got, 8);
        put_all(vc, answer, 8);
        if (lane_packets == 0)
            mm_fatal("the lane lent no packet in %d pieces (%llu library calls)", pieces,
                     (unsigned long long)calls);
        if (passed == 0)
            mm_fatal("the lane passed no packet in %d pieces (%llu library calls)", pieces,
                     (unsigned long long)calls);
        printf("lane: %llu bytes, %llu packets lent by the lane (%llu read in parts), %llu passed "
               "(holding at most %llu ring bytes), %llu library calls\n",
               (unsigned long long)total, (unsigned long long)lane_packets, (unsigned long long)lane_parts,
               (unsigned long long)passed, (unsigned long long)held_max, (unsigned long long)calls);
        free(scratch);
    }
    free(lens);
    mm_barrier();
    if (rank == 0)
        printf("lane ok: %d ranks, %s mode\n", size, mm_mode());
    mm_finalize();
    return 0;
}
