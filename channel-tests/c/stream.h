/*
 * stream.h - what the stream tests (t_lane, t_send_lane) share: the known byte at
 * each position of the stream, a small deterministic generator that both ranks run
 * alike, the pieces' count scaled as the Rust tests' cases are, and a check that makes
 * a failed rch_* call fatal with the library's message.
 */
#ifndef STREAM_H
#define STREAM_H

#include <stdint.h>
#include <stdlib.h>
#include <sys/uio.h>

#include "mm.h"
#include "rch.h"

/* The byte at position i of the stream. */
static inline unsigned char stream_byte(uint64_t i)
{
    return (unsigned char)(i * 131 + (i >> 9) * 7 + 3);
}

/* xorshift64: the next value of *state (never 0 once seeded with a nonzero value). */
static inline uint64_t stream_rng(uint64_t *state)
{
    *state ^= *state << 13;
    *state ^= *state >> 7;
    *state ^= *state << 17;
    return *state;
}

/* `n` scaled by RCH_TEST_CASE_SCALE, as the Rust tests scale their case counts (CI
 * runs the verbs suites at 0.1: rxe under TCG is slow), and at least `min`. */
static inline int stream_scaled(int n, int min)
{
    const char *v = getenv("RCH_TEST_CASE_SCALE");
    double scale = v != NULL && *v != '\0' ? strtod(v, NULL) : 1.0;
    double k = scale > 0 ? n * scale : n;
    if (k > n * 100.0)
        k = n * 100.0;
    return k < min ? min : (int)k;
}

static inline void stream_check(int rc, const char *what)
{
    if (rc != RCH_SUCCESS)
        mm_fatal("%s: %s (%s)", what, rch_strerror(rc), rch_last_error());
}

/* The rest of the nv buffers v after their first `done` bytes, in `left` (room for
 * nv entries); returns how many entries that is. */
static inline int stream_rest(const struct iovec *v, int nv, size_t done, struct iovec *left)
{
    int n = 0;
    for (int j = 0; j < nv; j++) {
        if (done >= v[j].iov_len) {
            done -= v[j].iov_len;
            continue;
        }
        left[n].iov_base = (char *)v[j].iov_base + done;
        left[n].iov_len = v[j].iov_len - done;
        done = 0;
        n++;
    }
    return n;
}

#endif
