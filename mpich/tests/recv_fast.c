/*
 * recv_fast.c - MPI_Recv from one rank where ch3:rch may complete it without a
 * request (MPIDI_CH3_Recv_fast, mpich/patches/ch3-recv-fast.patch), and the cases
 * it must leave to the usual path: every message checked byte for byte, with its
 * status (source, tag, count). Run with 2 ranks; prints " No Errors" as MPICH's
 * tests do.
 *   1. sizes around CH3's eager-short (16 B) and ring-packet limits and past the
 *      eager threshold (rendezvous), exact tag and MPI_ANY_TAG, MPI_STATUS_IGNORE;
 *   2. a message with another tag at the connection's front: received later, in
 *      the order the program asks for;
 *   3. another communicator's message at the front;
 *   4. a receive posted earlier (MPI_Irecv) that the message matches first;
 *   5. truncation: MPI_ERR_TRUNCATE, as on the usual path;
 *   6. MPI_Ssend (its acknowledgement must go out);
 *   7. a ping-pong of 20,000 round trips of changing sizes.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int errs;

static void fill(unsigned char *b, int n, int seed)
{
    for (int i = 0; i < n; i++)
        b[i] = (unsigned char) (seed * 31 + i * 7 + 1);
}

static void check(const char *what, const unsigned char *b, int n, int seed,
                  const MPI_Status * st, int source, int tag)
{
    int count = -1;
    for (int i = 0; i < n; i++) {
        if (b[i] != (unsigned char) (seed * 31 + i * 7 + 1)) {
            printf("%s: byte %d of %d is %d\n", what, i, n, b[i]);
            errs++;
            break;
        }
    }
    if (st == MPI_STATUS_IGNORE)
        return;
    MPI_Get_count(st, MPI_BYTE, &count);
    if (count != n || st->MPI_SOURCE != source || st->MPI_TAG != tag) {
        printf("%s: status count %d source %d tag %d, expected %d %d %d\n", what, count,
               st->MPI_SOURCE, st->MPI_TAG, n, source, tag);
        errs++;
    }
}

int main(int argc, char **argv)
{
    static const int sizes[] = { 0, 1, 8, 15, 16, 17, 24, 40, 64, 500, 1000, 4000, 16384, 200000 };
    const int nsizes = (int) (sizeof sizes / sizeof sizes[0]);
    int rank, nprocs;
    unsigned char *buf = malloc(200000), *big = malloc(200000);
    MPI_Status st;
    MPI_Comm dup;

    MPI_Init(&argc, &argv);
    MPI_Comm_rank(MPI_COMM_WORLD, &rank);
    MPI_Comm_size(MPI_COMM_WORLD, &nprocs);
    if (nprocs != 2) {
        printf("recv_fast runs on 2 ranks\n");
        MPI_Abort(MPI_COMM_WORLD, 1);
    }
    MPI_Comm_dup(MPI_COMM_WORLD, &dup);

    /* 1. Sizes, exact tag / MPI_ANY_TAG / no status. */
    for (int k = 0; k < nsizes; k++) {
        int n = sizes[k];
        for (int mode = 0; mode < 3; mode++) {
            if (rank == 1) {
                fill(big, n, k + mode);
                MPI_Send(big, n, MPI_BYTE, 0, 100 + k, MPI_COMM_WORLD);
            } else {
                memset(buf, 0, n);
                if (mode == 0) {
                    MPI_Recv(buf, n, MPI_BYTE, 1, 100 + k, MPI_COMM_WORLD, &st);
                    check("sizes, exact tag", buf, n, k + mode, &st, 1, 100 + k);
                } else if (mode == 1) {
                    MPI_Recv(buf, n, MPI_BYTE, 1, MPI_ANY_TAG, MPI_COMM_WORLD, &st);
                    check("sizes, MPI_ANY_TAG", buf, n, k + mode, &st, 1, 100 + k);
                } else {
                    MPI_Recv(buf, n, MPI_BYTE, 1, 100 + k, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
                    check("sizes, no status", buf, n, k + mode, MPI_STATUS_IGNORE, 1, 0);
                }
            }
        }
    }

    /* 2. Tag 5 reaches the front first; tag 6 is received first. 3. The same with
     * the duplicate communicator's message first. Rank 0 makes no MPI call while
     * they land (a progress pass would move them to the unexpected queue), so they
     * wait at the connection's front. */
    MPI_Barrier(MPI_COMM_WORLD);
    if (rank == 1) {
        fill(big, 8, 5);
        MPI_Send(big, 8, MPI_BYTE, 0, 5, MPI_COMM_WORLD);
        fill(big, 8, 6);
        MPI_Send(big, 8, MPI_BYTE, 0, 6, MPI_COMM_WORLD);
        fill(big, 12, 7);
        MPI_Send(big, 12, MPI_BYTE, 0, 7, dup);
        fill(big, 12, 8);
        MPI_Send(big, 12, MPI_BYTE, 0, 7, MPI_COMM_WORLD);
    } else {
        usleep(300 * 1000);
        MPI_Recv(buf, 8, MPI_BYTE, 1, 6, MPI_COMM_WORLD, &st);
        check("another tag first: 6", buf, 8, 6, &st, 1, 6);
        MPI_Recv(buf, 8, MPI_BYTE, 1, 5, MPI_COMM_WORLD, &st);
        check("another tag first: 5", buf, 8, 5, &st, 1, 5);
        MPI_Recv(buf, 12, MPI_BYTE, 1, 7, MPI_COMM_WORLD, &st);
        check("another communicator first: world", buf, 12, 8, &st, 1, 7);
        MPI_Recv(buf, 12, MPI_BYTE, 1, 7, dup, &st);
        check("another communicator first: dup", buf, 12, 7, &st, 1, 7);
    }

    /* 4. An earlier MPI_Irecv matches the first message; MPI_Recv gets the second. */
    if (rank == 1) {
        MPI_Barrier(MPI_COMM_WORLD);
        fill(big, 8, 9);
        MPI_Send(big, 8, MPI_BYTE, 0, 9, MPI_COMM_WORLD);
        fill(big, 8, 10);
        MPI_Send(big, 8, MPI_BYTE, 0, 9, MPI_COMM_WORLD);
    } else {
        MPI_Request req;
        unsigned char first[8];
        MPI_Irecv(first, 8, MPI_BYTE, 1, MPI_ANY_TAG, MPI_COMM_WORLD, &req);
        MPI_Barrier(MPI_COMM_WORLD);
        MPI_Recv(buf, 8, MPI_BYTE, 1, 9, MPI_COMM_WORLD, &st);
        check("after an Irecv: Recv", buf, 8, 10, &st, 1, 9);
        MPI_Wait(&req, &st);
        check("after an Irecv: Irecv", first, 8, 9, &st, 1, 9);
    }

    /* 5. Truncation. */
    if (rank == 1) {
        fill(big, 32, 11);
        MPI_Send(big, 32, MPI_BYTE, 0, 11, MPI_COMM_WORLD);
    } else {
        int rc, cls;
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
        rc = MPI_Recv(buf, 8, MPI_BYTE, 1, 11, MPI_COMM_WORLD, &st);
        MPI_Error_class(rc, &cls);
        if (cls != MPI_ERR_TRUNCATE) {
            printf("truncation: error class %d, expected MPI_ERR_TRUNCATE\n", cls);
            errs++;
        }
        MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_ARE_FATAL);
    }

    /* 6. MPI_Ssend completes once received. */
    if (rank == 1) {
        fill(big, 8, 12);
        MPI_Ssend(big, 8, MPI_BYTE, 0, 12, MPI_COMM_WORLD);
    } else {
        MPI_Recv(buf, 8, MPI_BYTE, 1, 12, MPI_COMM_WORLD, &st);
        check("Ssend", buf, 8, 12, &st, 1, 12);
    }

    /* 7. A ping-pong of changing sizes. */
    for (int i = 0; i < 20000; i++) {
        int n = sizes[i % 12], peer = 1 - rank;
        if (rank == 0) {
            fill(big, n, i);
            MPI_Send(big, n, MPI_BYTE, peer, i & 0xff, MPI_COMM_WORLD);
            MPI_Recv(buf, n, MPI_BYTE, peer, i & 0xff, MPI_COMM_WORLD, &st);
            check("ping-pong reply", buf, n, i + 1, &st, peer, i & 0xff);
        } else {
            MPI_Recv(buf, n, MPI_BYTE, peer, i & 0xff, MPI_COMM_WORLD, &st);
            check("ping-pong", buf, n, i, &st, peer, i & 0xff);
            fill(big, n, i + 1);
            MPI_Send(big, n, MPI_BYTE, peer, i & 0xff, MPI_COMM_WORLD);
        }
        if (errs > 10)
            break;
    }

    MPI_Comm_free(&dup);
    MPI_Allreduce(MPI_IN_PLACE, &errs, 1, MPI_INT, MPI_SUM, MPI_COMM_WORLD);
    if (rank == 0 && errs == 0)
        printf(" No Errors\n");
    free(buf);
    free(big);
    MPI_Finalize();
    return errs != 0;
}
