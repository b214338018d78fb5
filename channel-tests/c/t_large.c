/* Large messages (1, 4 and 16 MiB) exchanged by pairs of ranks in both directions at
 * once (non-blocking), every byte checked; with RCH_ZCOPY_PRIVATE_THRESHOLD set they
 * travel by the channel's zero-copy RDMA READ path straight into the receive buffer.
 * With T_LARGE_RAILS=N, a rank with a peer also checks (rch_get_rail_stats) that its
 * connections have N rails and that it read bytes over every one of them. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mm.h"
#include "rch.h"

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
    const char *want = getenv("T_LARGE_RAILS");
    if (want && peer < size) {
        int n = atoi(want);
        rch_rail_stats rs;
        if (rch_get_rail_stats(&rs) != RCH_SUCCESS)
            mm_fatal("rch_get_rail_stats: %s", rch_last_error());
        if (n < 1 || n > RCH_MAX_RAILS || rs.rails != n || (n > 1 && rs.connections < 1))
            mm_fatal("rails: %d connections with rails, %d rails, wanted %d", rs.connections,
                     rs.rails, n);
        for (int r = 0; r < n; r++)
            if (rs.read_bytes[r] == 0)
                mm_fatal("rails: nothing read over rail %d of %d", r, n);
        for (int r = n; r < RCH_MAX_RAILS; r++)
            if (rs.read_bytes[r] != 0)
                mm_fatal("rails: %llu bytes over rail %d of %d", rs.read_bytes[r], r, n);
        printf("rails ok: rank %d read %llu bytes over rail 0, %llu over rail 1\n", rank,
               rs.read_bytes[0], n > 1 ? rs.read_bytes[1] : 0ULL);
    }
    if (rank == 0)
        printf("large ok: %d ranks, %s mode, zero-copy threshold %s\n", size, mm_mode(),
               getenv("RCH_ZCOPY_PRIVATE_THRESHOLD") ? getenv("RCH_ZCOPY_PRIVATE_THRESHOLD") : "default");
    mm_finalize();
    return 0;
}
