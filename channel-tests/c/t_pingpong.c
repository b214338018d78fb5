/* Ping-pong between ranks 0 and 1 over sizes 0 B .. 4 MiB, every byte checked; the
 * other ranks (if any) only take part in the barriers. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "mm.h"

static unsigned char pat(size_t i, size_t size, int round) { return (unsigned char)(i * 31 + size + round * 7); }

int main(void)
{
    mm_init();
    int rank = mm_rank(), size = mm_size();
    if (size < 2)
        mm_fatal("needs 2 ranks");
    size_t max = (size_t)4 << 20;
    unsigned char *buf = malloc(max), *out = malloc(max);
    if (!buf || !out)
        mm_fatal("oom");
    for (size_t s = 0; s <= max; s = s ? s * 4 : 1) {
        for (int round = 0; round < 3; round++) {
            if (rank == 0) {
                for (size_t i = 0; i < s; i++)
                    out[i] = pat(i, s, round);
                mm_send(out, s, 1, round);
                mm_status st;
                memset(buf, 0, s);
                mm_recv(buf, max, 1, round, &st);
                if (st.len != s || st.source != 1 || st.tag != round || st.truncated)
                    mm_fatal("size %zu: status len %zu source %d tag %d", s, st.len, st.source, st.tag);
                for (size_t i = 0; i < s; i++)
                    if (buf[i] != (unsigned char)~pat(i, s, round))
                        mm_fatal("size %zu: byte %zu is %d", s, i, buf[i]);
            } else if (rank == 1) {
                mm_status st;
                mm_recv(buf, max, 0, round, &st);
                if (st.len != s)
                    mm_fatal("size %zu: got %zu", s, st.len);
                for (size_t i = 0; i < s; i++) {
                    if (buf[i] != pat(i, s, round))
                        mm_fatal("size %zu: byte %zu is %d", s, i, buf[i]);
                    buf[i] = (unsigned char)~buf[i];
                }
                mm_send(buf, s, 0, round);
            }
        }
    }
    mm_barrier();
    if (rank == 0)
        printf("pingpong ok: %d ranks, %s mode\n", size, mm_mode());
    free(buf);
    free(out);
    mm_finalize();
    return 0;
}
