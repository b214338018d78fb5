/*
 * msg_farm: bench/farm.rs's farm over what runtimes use today, for bench/runtime.sh:
 * a master process whose emitter thread deals tasks of one size to WORKERS worker
 * processes in turn, each summing its task's bytes and sending the 8-byte sum to the
 * master's collector thread, which takes results from any worker.
 *
 *   zmq  the emitter's PUSH socket (round robin over connected workers) and the
 *        collector's PULL (fair queueing), over TCP on 127.0.0.1, as FastFlow's
 *        ZeroMQ channels (seed 004)
 *   tcp  a socket per worker and direction, messages framed by a 4-byte length
 *        (TCP_NODELAY); the collector waits with poll(2)
 *
 * Prints "farm SIZE MB/s" lines (task bytes over the time from the collector's start
 * on a size to its last result, at most 100,000 tasks a size); every result is
 * checked. Across hosts (bench/runtime-cluster.sh), MSG_ROLE=master runs the master
 * only, listening at MSG_HOST, and MSG_ROLE=workers the workers only (forked here),
 * connecting to it; the master then waits for a hello from each worker before it
 * starts (ZeroMQ's PUSH deals only to connected workers).
 * usage: [MSG_ROLE=master|workers MSG_HOST=IP] msg_farm zmq|tcp PORT SIZE[,SIZE...]
 *        [TASK_BYTES] [WORKERS] [MIN_TASKS]
 * It is a benchmark, never a test: nothing here asserts.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "msg_io.h"

#define MAX_WORKERS 64

static size_t sizes[64];
static int nsizes;
static long task_bytes = 64L << 20;
static int workers = 2;
static int use_zmq;
static int port;

static double now_s(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static long min_tasks = 1000;

static long tasks_for(size_t s)
{
    long n = task_bytes / (long) (s ? s : 1);
    return n < min_tasks ? min_tasks : (n > 100000 ? 100000 : n);
}

/* The hello a worker sends first in a run across hosts (no sum is all ones). */
static const uint64_t HELLO = ~(uint64_t) 0;
static int across_hosts;

static void tcp_send(int fd, const void *p, size_t n)
{
    uint32_t len = (uint32_t) n;
    static __thread char *buf;
    static __thread size_t cap;
    if (n + 4 > cap) {
        cap = n + 4;
        buf = realloc(buf, cap);
    }
    memcpy(buf, &len, 4);
    memcpy(buf + 4, p, n);
    full_write(fd, buf, n + 4);
}

/* The message's length, or -1 at the end. */
static long tcp_recv(int fd, void *p, size_t cap)
{
    uint32_t len;
    if (!full_read(fd, &len, 4))
        return -1;
    if (len > cap) {
        fprintf(stderr, "msg_farm: message of %u bytes\n", len);
        exit(1);
    }
    if (len > 0 && !full_read(fd, p, len)) {
        fprintf(stderr, "msg_farm: stream ended inside a message\n");
        exit(1);
    }
    return len;
}

static int tcp_listen(int p)
{
    struct sockaddr_in a = msg_addr(p);
    int one = 1, l = socket(AF_INET, SOCK_STREAM, 0);
    setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(l, (struct sockaddr *) &a, sizeof a) || listen(l, 128))
        die("bind");
    return l;
}

static int tcp_connect(int p)
{
    struct sockaddr_in a = msg_addr(p);
    int one = 1, fd = socket(AF_INET, SOCK_STREAM, 0);
    for (int tries = 0; connect(fd, (struct sockaddr *) &a, sizeof a) != 0; tries++) {
        if (tries > 30000)
            die("connect");
        usleep(1000);
        close(fd);
        fd = socket(AF_INET, SOCK_STREAM, 0);
    }
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static int tcp_accept(int l)
{
    int one = 1, fd = accept(l, NULL, NULL);
    if (fd < 0)
        die("accept");
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return fd;
}

static size_t max_size(void)
{
    size_t m = 8;
    for (int i = 0; i < nsizes; i++)
        if (sizes[i] > m)
            m = sizes[i];
    return m;
}

/* ---- the worker ---- */

static void worker(void)
{
    size_t cap = max_size();
    char *task = malloc(cap);
    if (use_zmq) {
        char addr[64];
        void *ctx = zmq_ctx_new();
        void *in = zmq_socket(ctx, ZMQ_PULL), *out = zmq_socket(ctx, ZMQ_PUSH);
        snprintf(addr, sizeof addr, "tcp://%s:%d", msg_host(), port);
        zmq_connect(in, addr);
        snprintf(addr, sizeof addr, "tcp://%s:%d", msg_host(), port + 1);
        zmq_connect(out, addr);
        if (across_hosts)
            zmq_send(out, &HELLO, 8, 0);
        for (;;) {
            int n = zmq_recv(in, task, cap, 0);
            if (n < 0)
                die("zmq_recv");
            if (n == 0)
                break; /* the end */
            uint64_t sum = 0;
            for (int i = 0; i < n; i++)
                sum += (unsigned char) task[i];
            zmq_send(out, &sum, 8, 0);
        }
        int zero = 0;
        zmq_setsockopt(in, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(in);
        zmq_close(out); /* lingers until the results are out */
        zmq_ctx_term(ctx);
        return;
    }
    int in = tcp_connect(port), out = tcp_connect(port + 1);
    long n;
    while ((n = tcp_recv(in, task, cap)) >= 0) {
        uint64_t sum = 0;
        for (long i = 0; i < n; i++)
            sum += (unsigned char) task[i];
        tcp_send(out, &sum, 8);
    }
    close(out);
    close(in);
}

/* ---- the master ---- */

static void *zctx;
static int task_fds[MAX_WORKERS], result_fds[MAX_WORKERS];
/* The emitter starts a size once the collector has every result of the one before:
 * results of two sizes never mix. */
static pthread_barrier_t size_done;

static void *emitter(void *arg)
{
    void *push = arg;
    char *task = malloc(max_size());
    int next = 0;
    for (int i = 0; i < nsizes; i++) {
        long n = tasks_for(sizes[i]);
        if (i > 0)
            pthread_barrier_wait(&size_done);
        for (long k = 0; k < n; k++) {
            memset(task, (int) (k % 251), sizes[i]);
            if (use_zmq) {
                if (zmq_send(push, task, sizes[i], 0) < 0)
                    die("zmq_send");
            } else {
                tcp_send(task_fds[next], task, sizes[i]);
                next = (next + 1) % workers;
            }
        }
    }
    /* The end: an empty message to each worker (PUSH deals them in turn too). */
    for (int w = 0; w < workers; w++) {
        if (use_zmq)
            zmq_send(push, "", 0, 0);
        else
            shutdown(task_fds[w], SHUT_WR);
    }
    return NULL;
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: msg_farm zmq|tcp PORT SIZE[,SIZE...] [TASK_BYTES] [WORKERS]\n");
        return 2;
    }
    use_zmq = strcmp(argv[1], "zmq") == 0;
    port = atoi(argv[2]);
    for (char *tok = strtok(argv[3], ","); tok && nsizes < 64; tok = strtok(NULL, ","))
        sizes[nsizes++] = (size_t) strtoul(tok, NULL, 10);
    if (argc > 4)
        task_bytes = atol(argv[4]);
    if (argc > 5)
        workers = atoi(argv[5]);
    if (argc > 6)
        min_tasks = atol(argv[6]);
    if (workers < 1 || workers > MAX_WORKERS || min_tasks < 1)
        return 2;
    const char *role = msg_role();
    across_hosts = role != NULL;
    if (role && strcmp(role, "master") != 0 && strcmp(role, "workers") != 0) {
        fprintf(stderr, "msg_farm: MSG_ROLE=%s is neither master nor workers\n", role);
        return 2;
    }

    /* The workers first: a ZeroMQ context is not to be shared across fork, and both
     * kinds of worker retry their connects until the master listens. */
    pid_t kids[MAX_WORKERS];
    int forked = role && strcmp(role, "master") == 0 ? 0 : workers;
    for (int w = 0; w < forked; w++) {
        kids[w] = fork();
        if (kids[w] == 0) {
            worker();
            _exit(0);
        }
    }
    if (role && strcmp(role, "workers") == 0) {
        int status = 0;
        for (int w = 0; w < forked; w++) {
            int st;
            waitpid(kids[w], &st, 0);
            if (!WIFEXITED(st) || WEXITSTATUS(st) != 0)
                status = 1;
        }
        return status;
    }
    void *push = NULL, *pull = NULL;
    int l_tasks = -1, l_results = -1;
    if (use_zmq) {
        char addr[64];
        zctx = zmq_ctx_new();
        push = zmq_socket(zctx, ZMQ_PUSH);
        pull = zmq_socket(zctx, ZMQ_PULL);
        snprintf(addr, sizeof addr, "tcp://%s:%d", msg_host(), port);
        if (zmq_bind(push, addr))
            die("zmq_bind");
        snprintf(addr, sizeof addr, "tcp://%s:%d", msg_host(), port + 1);
        if (zmq_bind(pull, addr))
            die("zmq_bind");
    } else {
        l_tasks = tcp_listen(port);
        l_results = tcp_listen(port + 1);
    }
    if (!use_zmq) {
        for (int w = 0; w < workers; w++)
            task_fds[w] = tcp_accept(l_tasks);
        for (int w = 0; w < workers; w++)
            result_fds[w] = tcp_accept(l_results);
    } else if (across_hosts) {
        /* Every worker's hello, then a moment for its task socket, which it
         * connected before sending the hello. */
        for (int w = 0; w < workers; w++) {
            uint64_t h;
            if (zmq_recv(pull, &h, 8, 0) != 8 || h != HELLO)
                die("a worker's hello");
        }
        usleep(200000);
    } else {
        /* PUSH deals only to connected workers: wait until each has one. */
        usleep(200000);
    }
    pthread_t em;
    pthread_barrier_init(&size_done, NULL, 2);
    pthread_create(&em, NULL, emitter, push);

    struct pollfd pf[MAX_WORKERS];
    int next = 0;
    int ended[MAX_WORKERS] = { 0 };
    for (int i = 0; i < nsizes; i++) {
        long n = tasks_for(sizes[i]), got = 0;
        uint64_t sum = 0, want = 0;
        for (long k = 0; k < n; k++)
            want += (uint64_t) (k % 251) * sizes[i];
        double t0 = now_s();
        while (got < n) {
            uint64_t r;
            if (use_zmq) {
                if (zmq_recv(pull, &r, 8, 0) != 8)
                    die("zmq_recv");
            } else {
                int from = -1, open = 0;
                for (int w = 0; w < workers; w++) {
                    /* An ended worker's descriptor is left out (-1: poll skips it). */
                    pf[w].fd = ended[w] ? -1 : result_fds[w];
                    pf[w].events = POLLIN;
                    pf[w].revents = 0;
                    open += !ended[w];
                }
                if (open == 0) {
                    fprintf(stderr, "msg_farm: the workers ended early\n");
                    return 1;
                }
                if (poll(pf, (nfds_t) workers, -1) < 0)
                    die("poll");
                for (int k = 0; k < workers && from < 0; k++) {
                    int w = (next + k) % workers;
                    if (pf[w].revents)
                        from = w;
                }
                next = (from + 1) % workers;
                if (tcp_recv(result_fds[from], &r, 8) != 8) {
                    ended[from] = 1;
                    continue;
                }
            }
            sum += r;
            got++;
        }
        double s = now_s() - t0;
        if (sum != want) {
            fprintf(stderr, "msg_farm: size %zu: results sum to %llu, not %llu\n", sizes[i],
                    (unsigned long long) sum, (unsigned long long) want);
            return 1;
        }
        printf("farm %zu %.1f\n", sizes[i], (double) sizes[i] * n / s / 1e6);
        fflush(stdout);
        if (i + 1 < nsizes)
            pthread_barrier_wait(&size_done);
    }
    pthread_join(em, NULL);
    for (int w = 0; w < forked; w++)
        waitpid(kids[w], NULL, 0);
    if (use_zmq) {
        int zero = 0;
        zmq_setsockopt(push, ZMQ_LINGER, &zero, sizeof zero);
        zmq_setsockopt(pull, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(push);
        zmq_close(pull);
        zmq_ctx_term(zctx);
    }
    return 0;
}
