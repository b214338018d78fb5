/* Unexpected messages: rank 0 sends rank 1 many messages (small and large, one per
 * tag) before rank 1 posts any receive; rank 1 then receives them in reverse tag
 * order, then by MM_ANY_TAG and MM_ANY_SOURCE, and checks a truncated receive. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mm.h"

#define K 24

static size_t sz(int tag) { return tag % 4 == 3 ? (size_t)(300000 + tag) : (size_t)(tag * 10); }

int main(void)
{
    mm_init();
    int rank = mm_rank();
    if (mm_size() < 2)
        mm_fatal("needs 2 ranks");
    if (rank == 0) {
        mm_request *r[K];
        unsigned char *b[K];
        for (int t = 0; t < K; t++) {
            b[t] = malloc(sz(t) + 1);
            memset(b[t], t + 1, sz(t));
            r[t] = mm_isend(b[t], sz(t), 1, t);
        }
        mm_waitall(K, r);
        for (int t = 0; t < K; t++)
            free(b[t]);
        mm_barrier(); /* everything above was received as unexpected */
        /* in order, same tag, for MM_ANY_TAG */
        for (int i = 0; i < 5; i++)
            mm_send(&i, sizeof i, 1, 100);
        char big[100];
        memset(big, 9, sizeof big);
        mm_send(big, sizeof big, 1, 101); /* received into 10 bytes: truncated */
    } else if (rank == 1) {
        mm_barrier(); /* rank 0's messages arrive while we wait here */
        for (int t = K - 1; t >= 0; t--) {
            unsigned char *b = malloc(sz(t) + 1);
            mm_status st;
            mm_recv(b, sz(t), 0, t, &st);
            if (st.len != sz(t) || st.tag != t)
                mm_fatal("tag %d: len %zu", t, st.len);
            for (size_t i = 0; i < sz(t); i++)
                if (b[i] != t + 1)
                    mm_fatal("tag %d byte %zu = %d", t, i, b[i]);
            free(b);
        }
        for (int i = 0; i < 5; i++) {
            int v = -1;
            mm_status st;
            mm_recv(&v, sizeof v, i % 2 ? MM_ANY_SOURCE : 0, MM_ANY_TAG, &st);
            if (v != i || st.tag != 100 || st.source != 0)
                mm_fatal("ordered message %d: got %d (tag %d source %d)", i, v, st.tag, st.source);
        }
        char small[10];
        mm_status st;
        mm_recv(small, sizeof small, 0, 101, &st);
        if (!st.truncated || st.len != sizeof small || small[9] != 9)
            mm_fatal("truncation not reported: len %zu truncated %d", st.len, st.truncated);
    } else {
        mm_barrier();
    }
    mm_barrier();
    if (rank == 0)
        printf("unexpected ok: %s mode\n", mm_mode());
    mm_finalize();
    return 0;
}
