/* Large messages (1, 4 and 16 MiB) exchanged by pairs of ranks in both directions at
 * once (non-blocking), every byte checked; with RCH_ZCOPY_PRIVATE_THRESHOLD set they
 * travel by the channel's zero-copy RDMA READ path straight into the receive buffer. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mm.h"

int main(void)
{
    mm_init();
    int rank = mm_rank(), size = mm_size();
    int peer = rank ^ 1;
    const size_t sizes[] = {(size_t)1 << 20, (size_t)4 << 20, (size_t)16 << 20};
    for (int k = 0; k < 3; k++) {
        size_t s = sizes[k];
        if (peer < size) {
            unsigned char *out = malloc(s), *in = malloc(s);
            if (!out || !in)
                mm_fatal("oom");
            for (size_t i = 0; i < s; i++)
                out[i] = (unsigned char)(i * 7 + rank + (i >> 12));
            memset(in, 0, s);
            mm_request *r = mm_irecv(in, s, peer, k);
            mm_request *w = mm_isend(out, s, peer, k);
            mm_status st;
            mm_wait(r, &st);
            mm_wait(w, NULL);
            if (st.len != s)
                mm_fatal("%zu bytes: got %zu", s, st.len);
            for (size_t i = 0; i < s; i++)
                if (in[i] != (unsigned char)(i * 7 + peer + (i >> 12)))
                    mm_fatal("%zu bytes: byte %zu", s, i);
            free(out);
            free(in);
        }
        mm_barrier();
    }
    if (rank == 0)
        printf("large ok: %d ranks, %s mode, zero-copy threshold %s\n", size, mm_mode(),
               getenv("RCH_ZCOPY_PRIVATE_THRESHOLD") ? getenv("RCH_ZCOPY_PRIVATE_THRESHOLD") : "default");
    mm_finalize();
    return 0;
}
