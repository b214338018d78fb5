/* rch_put_lend and rch_lends_released against the byte stream: rank 0 sends MSGS
 * messages, each a 16-byte header and a 48 KiB buffer of its own (zero-copy from
 * RCH_ZCOPY_PRIVATE_THRESHOLD=32k, which the test sets), with rch_put_lend, without
 * waiting for the peer between messages; it keeps every buffer untouched until
 * rch_lends_released reports its ticket, and then overwrites it at once, while the
 * peer may still be reading later ones. Rank 1 reads the stream and checks every
 * byte, so a buffer released before the peer read it shows as wrong bytes. Fails
 * also if tickets do not grow by one a transfer, if fewer than two transfers were
 * ever lent at a time (then lending is not being tested), if a release runs ahead of
 * what was lent, or if anything is left lent at the end. Rank 1 pauses before every
 * PAUSE_EVERY-th message so that rank 0 (which never waits for it) lends the next
 * ones meanwhile: without the pauses, a busy host that ran rank 1 right after each
 * lend would leave one transfer lent at a time and fail the window check by
 * scheduling alone. The other ranks (if any) only take part in the barriers. */
#define _POSIX_C_SOURCE 200809L
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "mm.h"
#include "rch.h"
#include "stream.h"

#define MSGS 300
#define LEN (48 * 1024)
#define HDR 16
/* Rank 1 sleeps PAUSE_MS before messages 0, PAUSE_EVERY, 2 * PAUSE_EVERY, ...: for the
 * window check to fail, rank 0 must get no CPU for PAUSE_MS every time. */
#define PAUSE_EVERY 50
#define PAUSE_MS 20

/* The byte at position i of message k's buffer (the header's bytes are k's). */
static unsigned char msg_byte(int k, size_t i)
{
    return stream_byte((uint64_t)k * LEN + i);
}

/* Rank 0: the messages, and what became of their buffers. */
struct sent {
    unsigned char *buf;
    uint64_t ticket; /* 0: not lent (copied) */
};

/* Releases what the library says it may, overwriting each released buffer. Returns
 * the ticket released. */
static uint64_t release(rch_vc *vc, struct sent *s, int sent, int *oldest, uint64_t lent_max)
{
    uint64_t released = 0;
    stream_check(rch_lends_released(vc, &released), "rch_lends_released");
    if (released > lent_max)
        mm_fatal("released ticket %llu, but only %llu were lent", (unsigned long long)released,
                 (unsigned long long)lent_max);
    while (*oldest < sent && s[*oldest].ticket <= released) {
        memset(s[*oldest].buf, 0xEE, LEN);
        (*oldest)++;
    }
    return released;
}

int main(void)
{
    mm_init();
    int rank = mm_rank(), size = mm_size();
    if (size < 2)
        mm_fatal("needs 2 ranks");
    /* Ranks 0 and 1 use their connection directly, not through mm, until the last
     * barrier: mm's progress would read (and keep) what the other sent. */
    rch_vc *vc = NULL;
    if (rank == 0) {
        struct sent *s = calloc(MSGS, sizeof *s);
        if (!s)
            mm_fatal("oom");
        stream_check(rch_vc_get(1, &vc), "rch_vc_get");
        uint64_t last_ticket = 0;
        int oldest = 0, most_lent = 0, lent = 0;
        for (int k = 0; k < MSGS; k++) {
            unsigned char hdr[HDR];
            memset(hdr, k & 0xff, HDR);
            s[k].buf = malloc(LEN);
            if (!s[k].buf)
                mm_fatal("oom");
            for (size_t i = 0; i < LEN; i++)
                s[k].buf[i] = msg_byte(k, i);
            struct iovec v[2] = {{hdr, HDR}, {s[k].buf, LEN}};
            size_t done = 0;
            while (done < HDR + LEN) {
                struct iovec left[2];
                int n = stream_rest(v, 2, done, left);
                size_t nb = 0;
                uint64_t ticket = 0;
                stream_check(rch_put_lend(vc, left, n, &nb, &ticket), "rch_put_lend");
                if (ticket != 0) {
                    if (ticket != last_ticket + 1)
                        mm_fatal("message %d: ticket %llu after %llu", k, (unsigned long long)ticket,
                                 (unsigned long long)last_ticket);
                    last_ticket = ticket;
                    s[k].ticket = ticket;
                    lent++;
                }
                done += nb;
                if (nb == 0) {
                    int rc = rch_wait(10);
                    if (rc != RCH_ERR_TIMEOUT)
                        stream_check(rc, "rch_wait");
                }
                release(vc, s, k, &oldest, last_ticket);
            }
            if (k + 1 - oldest > most_lent)
                most_lent = k + 1 - oldest;
        }
        /* Everything is counted: wait until every lent buffer is back. */
        while (oldest < MSGS) {
            if (release(vc, s, MSGS, &oldest, last_ticket) == last_ticket) {
                while (oldest < MSGS)
                    memset(s[oldest++].buf, 0xEE, LEN);
                break;
            }
            int rc = rch_wait(10);
            if (rc != RCH_ERR_TIMEOUT)
                stream_check(rc, "rch_wait");
        }
        if (lent < MSGS / 2)
            mm_fatal("only %d of %d buffers were lent: is RCH_ZCOPY_PRIVATE_THRESHOLD set?", lent, MSGS);
        if (most_lent < 2)
            mm_fatal("never more than %d transfer lent at a time", most_lent);
        for (int k = 0; k < MSGS; k++)
            free(s[k].buf);
        free(s);
        printf("lend ok: %d messages, %d lent, up to %d at a time\n", MSGS, lent, most_lent);
    } else if (rank == 1) {
        stream_check(rch_vc_get(0, &vc), "rch_vc_get");
        unsigned char *in = malloc(HDR + LEN);
        if (!in)
            mm_fatal("oom");
        for (int k = 0; k < MSGS; k++) {
            if (k % PAUSE_EVERY == 0) {
                struct timespec pause = {0, PAUSE_MS * 1000000L};
                nanosleep(&pause, NULL);
            }
            size_t done = 0;
            while (done < HDR + LEN) {
                struct iovec v = {in + done, HDR + LEN - done};
                size_t n = 0;
                stream_check(rch_read_datav(vc, &v, 1, &n), "rch_read_datav");
                done += n;
                if (n == 0) {
                    int rc = rch_wait(10);
                    if (rc != RCH_ERR_TIMEOUT)
                        stream_check(rc, "rch_wait");
                }
            }
            for (size_t i = 0; i < HDR; i++)
                if (in[i] != (unsigned char)(k & 0xff))
                    mm_fatal("message %d: header byte %zu is %d", k, i, in[i]);
            for (size_t i = 0; i < LEN; i++)
                if (in[HDR + i] != msg_byte(k, i))
                    mm_fatal("message %d: byte %zu is %d, expected %d", k, i, in[HDR + i],
                             msg_byte(k, i));
        }
        free(in);
    }
    mm_barrier();
    mm_finalize();
    return 0;
}
