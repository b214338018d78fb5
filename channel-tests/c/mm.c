/*
 * mm.c - the MPI-like layer of mm.h over rch.h (see mm.h).
 *
 * Wire format: every message is a 40-byte slot (a 16-byte header: kind, tag,
 * length; then the first 24 payload bytes, padded) followed by the rest of its
 * payload, on the byte pipe of the (sender, receiver) connection. The sender
 * offers header and payload to rch_put_datav as one iov and retries the rest; the
 * channel copies small payloads through its ring and announces large ones for RDMA
 * READ (the zero-copy contract of rch.h: we retry with the same, untouched buffer,
 * which the request owns until it completes, as MPI's send buffer rules say).
 * The receiver reads a header, matches it against the posted receives (or queues it
 * as unexpected, with a buffer of its own), then reads the payload straight into the
 * matched buffer, so a large payload is pulled by RDMA READ into the user's memory.
 */
#define _GNU_SOURCE
#include "mm.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "rch.h"

#define KIND_EAGER 0x4d4d4531u /* "1EMM" */
#define TAG_BARRIER (-10)
#define TAG_BCAST (-11)
#define TAG_REDUCE (-12)

typedef struct hdr {
    uint32_t kind;
    int32_t tag;
    uint64_t len;
} hdr;

/* What goes first on the wire for every message: the header and the first INLINE
 * bytes of the payload (padded), 40 bytes, which the channel writes as one 64-byte
 * ring cell. A message of up to INLINE bytes is then one put and one read. */
#define INLINE 24
typedef struct slot {
    hdr h;
    char inl[INLINE];
} slot;

struct mm_request {
    int is_send;
    int done;
    int heap;
    mm_request *next; /* send queue of a peer, or the posted queue */
    /* send */
    slot s;
    const char *sbuf;
    size_t total, sent; /* slot + payload beyond INLINE */
    int dest;
    /* receive */
    char *rbuf;
    size_t cap;
    int source, tag;
    mm_status st;
};

/* A message that arrived before its receive was posted. */
typedef struct umsg {
    int source, tag;
    size_t len, got;
    char *data;
    mm_request *claim; /* a receive matched it while its payload was still arriving */
    struct umsg *next;
} umsg;

typedef struct peer {
    rch_vc *vc;
    mm_request *sq_head, *sq_tail;
    /* receive side: reading a header (in_data 0) or a payload (in_data 1) */
    int in_data;
    slot s;
    size_t sgot;
    char *dst;      /* where the payload goes */
    size_t dlen;    /* payload bytes that go to dst */
    size_t dgot;    /* payload bytes received so far (into dst, then discarded) */
    mm_request *rreq; /* the matched receive, or NULL */
    umsg *um;       /* or the unexpected message */
} peer;

static int g_rank = -1, g_size = 0;
static peer *g_peers;
static mm_request *g_posted_head, *g_posted_tail;
static umsg *g_unexp_head, *g_unexp_tail;
static const char *g_mode = "none";
static char g_scratch[4096]; /* sink for the truncated part of a message */

void mm_fatal(const char *fmt, ...)
{
    va_list ap;
    fprintf(stderr, "rank %d: ", g_rank);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    fflush(stderr);
    exit(3);
}

static void check(int rc, const char *what)
{
    if (rc != RCH_SUCCESS)
        mm_fatal("%s: %s (%d): %s", what, rch_strerror(rc), rc, rch_last_error());
}

int mm_rank(void) { return g_rank; }
int mm_size(void) { return g_size; }
const char *mm_mode(void) { return g_mode; }

/* ---- mode (b): the card exchange served by the rchx driver over a socket ---- */

static int x_fd = -1;

static int x_write(const char *s, size_t n)
{
    while (n > 0) {
        ssize_t w = write(x_fd, s, n);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return -1;
        s += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Reads one '\n'-terminated line (without it) into buf. */
static int x_line(char *buf, size_t cap)
{
    size_t n = 0;
    for (;;) {
        char c;
        ssize_t r = read(x_fd, &c, 1);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0)
            return -1;
        if (c == '\n')
            break;
        if (n + 1 >= cap)
            return -1;
        buf[n++] = c;
    }
    buf[n] = 0;
    return 0;
}

static const char HEX[] = "0123456789abcdef";

static int x_publish(void *ctx, const char *key, const void *value, size_t len)
{
    (void)ctx;
    char line[1024];
    int n = snprintf(line, sizeof line, "P %d %s ", g_rank, key);
    if (n < 0 || (size_t)n + 2 * len + 2 > sizeof line)
        return 1;
    for (size_t i = 0; i < len; i++) {
        line[n++] = HEX[((const unsigned char *)value)[i] >> 4];
        line[n++] = HEX[((const unsigned char *)value)[i] & 15];
    }
    line[n++] = '\n';
    if (x_write(line, (size_t)n) != 0 || x_line(line, sizeof line) != 0)
        return 2;
    return strcmp(line, "OK") == 0 ? 0 : 3;
}

static int unhex(char c)
{
    if (c >= '0' && c <= '9')
        return c - '0';
    if (c >= 'a' && c <= 'f')
        return c - 'a' + 10;
    return -1;
}

static int x_lookup(void *ctx, int rank, const char *key, void *buf, size_t cap, size_t *len)
{
    (void)ctx;
    char line[1024];
    int n = snprintf(line, sizeof line, "L %d %s\n", rank, key);
    if (n < 0 || x_write(line, (size_t)n) != 0 || x_line(line, sizeof line) != 0)
        return 2;
    if (line[0] != 'V' || line[1] != ' ')
        return 3;
    size_t hl = strlen(line + 2);
    if (hl % 2 || hl / 2 > cap)
        return 4;
    for (size_t i = 0; i < hl / 2; i++) {
        int a = unhex(line[2 + 2 * i]), b = unhex(line[3 + 2 * i]);
        if (a < 0 || b < 0)
            return 5;
        ((unsigned char *)buf)[i] = (unsigned char)(a * 16 + b);
    }
    *len = hl / 2;
    return 0;
}

static int x_fence(void *ctx)
{
    (void)ctx;
    char line[64];
    if (x_write("F\n", 2) != 0 || x_line(line, sizeof line) != 0)
        return 2;
    return strcmp(line, "OK") == 0 ? 0 : 3;
}

/* ---- init / finalize ---- */

void mm_init(void)
{
    const char *fd = getenv("RCHX_FD");
    if (fd) {
        x_fd = atoi(fd);
        g_rank = atoi(getenv("RCHX_RANK") ? getenv("RCHX_RANK") : "-1");
        g_size = atoi(getenv("RCHX_SIZE") ? getenv("RCHX_SIZE") : "0");
        rch_exchange ex = {NULL, x_publish, x_lookup, x_fence};
        check(rch_init_process_group_external(g_rank, g_size, &ex),
              "rch_init_process_group_external");
        g_mode = "external";
    } else {
        int parent;
        check(rch_init_process_group(&g_rank, &g_size, &parent), "rch_init_process_group");
        g_mode = "pmi";
    }
    check(rch_init(), "rch_init");
    g_peers = calloc((size_t)g_size, sizeof *g_peers);
    if (!g_peers)
        mm_fatal("out of memory");
    for (int r = 0; r < g_size; r++)
        check(rch_vc_get(r, &g_peers[r].vc), "rch_vc_get");
}

void mm_finalize(void)
{
    mm_barrier();
    check(rch_finalize(), "rch_finalize");
    for (umsg *u = g_unexp_head; u;) {
        umsg *n = u->next;
        free(u->data);
        free(u);
        u = n;
    }
    free(g_peers);
    g_peers = NULL;
}

/* ---- sending ---- */

/* Puts what fits of the request; returns 1 when it completed. */
static int send_step(peer *p, mm_request *q)
{
    struct iovec iov[2];
    int n = 0;
    if (q->sent < sizeof(slot)) {
        iov[n].iov_base = (char *)&q->s + q->sent;
        iov[n].iov_len = sizeof(slot) - q->sent;
        n++;
    }
    /* the rest of the payload, from byte INLINE on: always the same buffer from its
     * first retry on, as the zero-copy contract wants */
    size_t poff = q->sent > sizeof(slot) ? q->sent - sizeof(slot) : 0;
    size_t plen = q->total - sizeof(slot);
    if (plen > poff) {
        iov[n].iov_base = (char *)q->sbuf + INLINE + poff;
        iov[n].iov_len = plen - poff;
        n++;
    }
    size_t done = 0;
    check(rch_put_datav(p->vc, iov, n, &done), "rch_put_datav");
    q->sent += done;
    return q->sent == q->total;
}

static void send_progress(peer *p)
{
    while (p->sq_head) {
        mm_request *q = p->sq_head;
        if (!send_step(p, q))
            return;
        q->done = 1;
        p->sq_head = q->next;
        if (!p->sq_head)
            p->sq_tail = NULL;
    }
}

static void init_send(mm_request *q, const void *buf, size_t len, int dest, int tag)
{
    if (dest < 0 || dest >= g_size)
        mm_fatal("send to rank %d of %d", dest, g_size);
    q->is_send = 1;
    q->done = 0;
    q->heap = 0;
    q->next = NULL;
    q->s.h.kind = KIND_EAGER;
    q->s.h.tag = tag;
    q->s.h.len = len;
    size_t k = len < INLINE ? len : INLINE;
    if (k)
        memcpy(q->s.inl, buf, k);
    if (k < INLINE)
        memset(q->s.inl + k, 0, INLINE - k);
    q->sbuf = buf;
    q->total = sizeof(slot) + (len - k);
    q->sent = 0;
    q->dest = dest;
    memset(&q->st, 0, sizeof q->st);
}

/* Queues q behind the peer's earlier sends, trying it at once if it is first. */
static void start_send(mm_request *q)
{
    peer *p = &g_peers[q->dest];
    if (!p->sq_head && send_step(p, q)) {
        q->done = 1;
        return;
    }
    q->next = NULL;
    if (p->sq_tail)
        p->sq_tail->next = q;
    else
        p->sq_head = q;
    p->sq_tail = q;
}

/* ---- receiving ---- */

static int matches(int want_src, int want_tag, int src, int tag)
{
    return (want_src == MM_ANY_SOURCE || want_src == src) &&
           (want_tag == tag || (want_tag == MM_ANY_TAG && tag >= 0));
}

static void complete_recv(mm_request *r, int src, int tag, size_t len)
{
    r->st.source = src;
    r->st.tag = tag;
    r->st.len = len < r->cap ? len : r->cap;
    r->st.truncated = len > r->cap;
    r->done = 1;
}

static void finish_message(peer *p, int src)
{
    if (p->rreq) {
        complete_recv(p->rreq, src, p->s.h.tag, p->s.h.len);
    } else {
        umsg *u = p->um;
        u->got = u->len;
        if (u->claim) {
            mm_request *r = u->claim;
            memcpy(r->rbuf, u->data, u->len < r->cap ? u->len : r->cap);
            complete_recv(r, u->source, u->tag, u->len);
            /* unlink u (it is in the unexpected queue) */
            umsg **pp = &g_unexp_head, *prev = NULL;
            while (*pp != u) {
                prev = *pp;
                pp = &(*pp)->next;
            }
            *pp = u->next;
            if (g_unexp_tail == u)
                g_unexp_tail = prev;
            free(u->data);
            free(u);
        }
    }
    p->in_data = 0;
    p->rreq = NULL;
    p->um = NULL;
}

/* A header arrived from src: find its receive or queue it as unexpected. */
static void start_message(peer *p, int src)
{
    hdr *h = &p->s.h;
    if (h->kind != KIND_EAGER)
        mm_fatal("bad packet kind %#x from rank %d", h->kind, src);
    mm_request **pp = &g_posted_head, *prev = NULL;
    for (; *pp; prev = *pp, pp = &(*pp)->next)
        if (matches((*pp)->source, (*pp)->tag, src, h->tag))
            break;
    p->in_data = 1;
    if (*pp) {
        mm_request *r = *pp;
        *pp = r->next;
        if (g_posted_tail == r)
            g_posted_tail = prev;
        p->rreq = r;
        p->um = NULL;
        p->dst = r->rbuf;
        p->dlen = h->len < r->cap ? h->len : r->cap;
    } else {
        umsg *u = calloc(1, sizeof *u);
        if (!u)
            mm_fatal("out of memory");
        u->source = src;
        u->tag = h->tag;
        u->len = h->len;
        u->data = malloc(h->len ? h->len : 1);
        if (!u->data)
            mm_fatal("out of memory for an unexpected message of %zu bytes", u->len);
        if (g_unexp_tail)
            g_unexp_tail->next = u;
        else
            g_unexp_head = u;
        g_unexp_tail = u;
        p->rreq = NULL;
        p->um = u;
        p->dst = u->data;
        p->dlen = u->len;
    }
    /* the inline bytes are here already */
    size_t k = h->len < INLINE ? h->len : INLINE;
    memcpy(p->dst, p->s.inl, k < p->dlen ? k : p->dlen);
    p->dgot = k;
    if (p->dgot == h->len)
        finish_message(p, src);
}

/* Reads whatever has arrived from peer src; returns 1 if anything did. Stops early
 * once *stop is set (a blocking receive whose message is complete returns at once
 * instead of polling for the next one). */
static int recv_progress(peer *p, int src, const int *stop)
{
    int any = 0;
    for (;;) {
        if (stop && *stop)
            return any;
        size_t n = 0;
        struct iovec v;
        if (!p->in_data) {
            v.iov_base = (char *)&p->s + p->sgot;
            v.iov_len = sizeof(slot) - p->sgot;
            check(rch_read_datav(p->vc, &v, 1, &n), "rch_read_datav");
            if (n == 0)
                return any;
            any = 1;
            p->sgot += n;
            if (p->sgot < sizeof(slot))
                continue;
            p->sgot = 0;
            start_message(p, src);
        } else {
            if (p->dgot < p->dlen) {
                v.iov_base = p->dst + p->dgot;
                v.iov_len = p->dlen - p->dgot;
            } else { /* the part beyond a short receive buffer */
                size_t left = p->s.h.len - p->dgot;
                v.iov_base = g_scratch;
                v.iov_len = left < sizeof g_scratch ? left : sizeof g_scratch;
            }
            check(rch_read_datav(p->vc, &v, 1, &n), "rch_read_datav");
            if (n == 0)
                return any;
            any = 1;
            p->dgot += n;
            if (p->dgot == p->s.h.len)
                finish_message(p, src);
        }
    }
}

void mm_progress(void)
{
    for (int r = 0; r < g_size; r++) {
        peer *p = &g_peers[r];
        if (p->sq_head)
            send_progress(p);
        recv_progress(p, r, NULL);
    }
}

/* Progress until *flag is set: spin a little, then let rch_wait yield and sleep. */
static void progress_until(const int *flag)
{
    unsigned idle = 0;
    while (!*flag) {
        mm_progress();
        if (*flag)
            break;
        if (++idle < 64)
            continue;
        int rc = rch_wait(100);
        if (rc != RCH_SUCCESS && rc != RCH_ERR_TIMEOUT)
            check(rc, "rch_wait");
    }
}

/* A faster loop for a receive from one known source with nothing queued to send:
 * polls that connection only, most of the time. */
static void progress_recv_from(mm_request *r, int src)
{
    unsigned idle = 0;
    while (!r->done) {
        int any = recv_progress(&g_peers[src], src, &r->done);
        if (r->done)
            break;
        if (any)
            continue;
        if ((++idle & 15) == 0)
            mm_progress();
        if (idle > 1024) {
            progress_until(&r->done);
            break;
        }
    }
}

/* ---- the API ---- */

static mm_request *new_request(void)
{
    mm_request *q = malloc(sizeof *q);
    if (!q)
        mm_fatal("out of memory");
    return q;
}

mm_request *mm_isend(const void *buf, size_t len, int dest, int tag)
{
    mm_request *q = new_request();
    init_send(q, buf, len, dest, tag);
    q->heap = 1;
    start_send(q);
    return q;
}

void mm_send(const void *buf, size_t len, int dest, int tag)
{
    mm_request q;
    init_send(&q, buf, len, dest, tag);
    start_send(&q);
    progress_until(&q.done);
}

static void init_recv(mm_request *r, void *buf, size_t cap, int source, int tag)
{
    if (source != MM_ANY_SOURCE && (source < 0 || source >= g_size))
        mm_fatal("receive from rank %d of %d", source, g_size);
    /* only the fields a receive uses (the send part stays unset) */
    r->is_send = 0;
    r->done = 0;
    r->heap = 0;
    r->next = NULL;
    r->rbuf = buf;
    r->cap = cap;
    r->source = source;
    r->tag = tag;
    memset(&r->st, 0, sizeof r->st);
}

/* Matches r against the unexpected queue, else posts it. */
static void start_recv(mm_request *r)
{
    umsg **pp = &g_unexp_head, *prev = NULL;
    for (; *pp; prev = *pp, pp = &(*pp)->next) {
        umsg *u = *pp;
        if (u->claim || !matches(r->source, r->tag, u->source, u->tag))
            continue;
        if (u->got < u->len) { /* still arriving: it completes r when it has */
            u->claim = r;
            return;
        }
        *pp = u->next;
        if (g_unexp_tail == u)
            g_unexp_tail = prev;
        memcpy(r->rbuf, u->data, u->len < r->cap ? u->len : r->cap);
        complete_recv(r, u->source, u->tag, u->len);
        free(u->data);
        free(u);
        return;
    }
    r->next = NULL;
    if (g_posted_tail)
        g_posted_tail->next = r;
    else
        g_posted_head = r;
    g_posted_tail = r;
}

mm_request *mm_irecv(void *buf, size_t cap, int source, int tag)
{
    mm_request *r = new_request();
    init_recv(r, buf, cap, source, tag);
    r->heap = 1;
    start_recv(r);
    return r;
}

void mm_recv(void *buf, size_t cap, int source, int tag, mm_status *st)
{
    mm_request r;
    init_recv(&r, buf, cap, source, tag);
    start_recv(&r);
    if (!r.done) {
        if (source != MM_ANY_SOURCE)
            progress_recv_from(&r, source);
        else
            progress_until(&r.done);
    }
    if (st)
        *st = r.st;
}

void mm_wait(mm_request *req, mm_status *st)
{
    progress_until(&req->done);
    if (st)
        *st = req->st;
    if (req->heap)
        free(req);
}

int mm_test(mm_request *req, mm_status *st)
{
    if (!req->done)
        mm_progress();
    if (!req->done)
        return 0;
    if (st)
        *st = req->st;
    if (req->heap)
        free(req);
    return 1;
}

void mm_waitall(int n, mm_request **reqs)
{
    for (int i = 0; i < n; i++)
        if (reqs[i]) {
            mm_wait(reqs[i], NULL);
            reqs[i] = NULL;
        }
}

/* ---- collectives on point-to-point ---- */

void mm_barrier(void)
{
    /* dissemination: log2(size) rounds */
    char t = 0;
    for (int d = 1; d < g_size; d *= 2) {
        mm_request *r = mm_irecv(&t, 1, (g_rank - d + g_size) % g_size, TAG_BARRIER);
        mm_send(&t, 1, (g_rank + d) % g_size, TAG_BARRIER);
        mm_wait(r, NULL);
    }
}

void mm_bcast(void *buf, size_t len, int root)
{
    /* binomial tree over ranks relative to root */
    int rel = (g_rank - root + g_size) % g_size;
    int mask = 1;
    while (mask < g_size) {
        if (rel & mask) {
            mm_recv(buf, len, (rel - mask + root) % g_size, TAG_BCAST, NULL);
            break;
        }
        mask <<= 1;
    }
    mask >>= 1;
    while (mask > 0) {
        if (rel + mask < g_size)
            mm_send(buf, len, (rel + mask + root) % g_size, TAG_BCAST);
        mask >>= 1;
    }
}

/* Binomial reduce to rank 0 with `op`, then broadcast. */
static void allreduce(const void *in, void *out, size_t elem, int n,
                      void (*op)(void *acc, const void *x, int n))
{
    size_t bytes = elem * (size_t)n;
    char *tmp = malloc(bytes ? bytes : 1);
    if (!tmp)
        mm_fatal("out of memory");
    memcpy(out, in, bytes);
    for (int mask = 1; mask < g_size; mask <<= 1) {
        if (g_rank & mask) {
            mm_send(out, bytes, g_rank - mask, TAG_REDUCE);
            break;
        }
        if (g_rank + mask < g_size) {
            mm_recv(tmp, bytes, g_rank + mask, TAG_REDUCE, NULL);
            op(out, tmp, n);
        }
    }
    free(tmp);
    mm_bcast(out, bytes, 0);
}

static void sum_u64(void *acc, const void *x, int n)
{
    for (int i = 0; i < n; i++)
        ((uint64_t *)acc)[i] += ((const uint64_t *)x)[i];
}

static void max_double(void *acc, const void *x, int n)
{
    for (int i = 0; i < n; i++)
        if (((const double *)x)[i] > ((double *)acc)[i])
            ((double *)acc)[i] = ((const double *)x)[i];
}

void mm_allreduce_sum_u64(const uint64_t *in, uint64_t *out, int n)
{
    allreduce(in, out, sizeof *in, n, sum_u64);
}

void mm_allreduce_max_double(const double *in, double *out, int n)
{
    allreduce(in, out, sizeof *in, n, max_double);
}
