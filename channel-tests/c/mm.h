/*
 * mm.h - a small MPI-like layer over the rdma-channel C interface (ffi/rch.h), in
 * the style of MPICH's CH3 device over its channel: packet headers on the byte
 * pipes, posted and unexpected receive queues matched by (source, tag), eager
 * sends whose large payloads travel by the channel's own zero-copy path (the
 * receiver pulls them with RDMA READ), and collectives built on point-to-point.
 *
 * Written against rch.h only. Used by the C tests in channel-tests/c and by the
 * benchmark in bench/c. Errors of the channel are fatal: the layer prints the
 * channel's message and exits with status 3 (as MPI_ERRORS_ARE_FATAL).
 *
 * Process management: under the test driver rchx (RCHX_FD set) the layer owns the
 * card exchange itself and calls rch_init_process_group_external (mode b); otherwise
 * it calls rch_init_process_group (mode a: PMI-1 from rch-run or Hydra, or a
 * singleton).
 */
#ifndef MM_H
#define MM_H

#include <stddef.h>
#include <stdint.h>

#define MM_ANY_SOURCE (-1)
#define MM_ANY_TAG (-1)

typedef struct mm_status {
    int source;
    int tag;
    size_t len; /* bytes received */
    int truncated; /* the message was longer than the buffer */
} mm_status;

typedef struct mm_request mm_request;

/* Initialises the channel and connects the processes (logically). */
void mm_init(void);
/* Collective: completes the channel's finalize. */
void mm_finalize(void);
int mm_rank(void);
int mm_size(void);
/* "external" (mode b, under rchx) or "pmi" (mode a). */
const char *mm_mode(void);

/* Tags are >= 0 (negative ones are the collectives'). */
void mm_send(const void *buf, size_t len, int dest, int tag);
void mm_recv(void *buf, size_t cap, int source, int tag, mm_status *st);
mm_request *mm_isend(const void *buf, size_t len, int dest, int tag);
mm_request *mm_irecv(void *buf, size_t cap, int source, int tag);
/* Completes and frees the request; st may be NULL. */
void mm_wait(mm_request *req, mm_status *st);
/* 1 (and frees the request) when it completed, else 0. */
int mm_test(mm_request *req, mm_status *st);
void mm_waitall(int n, mm_request **reqs);

void mm_barrier(void);
void mm_bcast(void *buf, size_t len, int root);
/* Element-wise sum of n uint64_t over all processes, result everywhere. */
void mm_allreduce_sum_u64(const uint64_t *in, uint64_t *out, int n);
/* Element-wise maximum of n doubles over all processes, result everywhere. */
void mm_allreduce_max_double(const double *in, double *out, int n);

/* Drives the channel once (sends and receives on every connection). */
void mm_progress(void);

/* Prints "rank R: message" and exits with status 3. */
void mm_fatal(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));

#endif
