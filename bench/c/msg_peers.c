/*
 * msg_peers: what a parallel runtime's channel costs today between two processes of
 * one host, for bench/runtime.sh: ZeroMQ (a PAIR socket, as FastFlow's external
 * channels used, seed 004) over TCP on the loopback, and plain TCP (messages framed
 * by a 4-byte length, TCP_NODELAY). Two patterns of seed 004's evaluation:
 *
 *   pingpong  a message to the peer and the same size back (Table II): one-way us
 *   stream    messages sent continuously one way, then a 1-byte answer (Table I): MB/s
 *
 * The parent (CPU 0) is the client, a forked child (CPU 1) the server, over
 * 127.0.0.1. Across hosts (bench/runtime-cluster.sh), MSG_ROLE=server or client
 * runs one side only and MSG_HOST is the server's address. Prints "pattern size
 * value" lines.
 *
 * usage: [MSG_ROLE=server|client MSG_HOST=IP] msg_peers zmq|tcp PORT SIZE[,SIZE...]
 *        [PINGPONG_ITERS] [STREAM_BYTES]
 * It is a benchmark, never a test: nothing here asserts.
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sched.h>
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

static double now_us(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec * 1e6 + t.tv_nsec / 1e3;
}

static void pin(int cpu)
{
    cpu_set_t s;
    CPU_ZERO(&s);
    CPU_SET(cpu, &s);
    sched_setaffinity(0, sizeof s, &s);
}

/* ---- a channel: ZeroMQ PAIR or a framed TCP socket ---- */

typedef struct chan {
    int zmq;
    void *ctx, *sock; /* zmq */
    int fd;           /* tcp */
} chan;

static void send_msg(chan *c, const void *p, size_t n)
{
    if (c->zmq) {
        if (zmq_send(c->sock, p, n, 0) < 0)
            die("zmq_send");
        return;
    }
    uint32_t len = (uint32_t) n;
    /* One write for small messages, as a runtime would gather them. */
    if (n <= 65536) {
        static char buf[65536 + 4];
        memcpy(buf, &len, 4);
        memcpy(buf + 4, p, n);
        full_write(c->fd, buf, n + 4);
    } else {
        full_write(c->fd, &len, 4);
        full_write(c->fd, p, n);
    }
}

static size_t recv_msg(chan *c, void *p, size_t cap)
{
    if (c->zmq) {
        int r = zmq_recv(c->sock, p, cap, 0);
        if (r < 0)
            die("zmq_recv");
        return (size_t) r;
    }
    uint32_t len;
    if (!full_read(c->fd, &len, 4)) {
        fprintf(stderr, "msg_peers: peer closed\n");
        exit(1);
    }
    if (len > cap) {
        fprintf(stderr, "msg_peers: message of %u bytes\n", len);
        exit(1);
    }
    if (len > 0 && !full_read(c->fd, p, len)) {
        fprintf(stderr, "msg_peers: peer closed inside a message\n");
        exit(1);
    }
    return len;
}

static chan open_chan(int zmq, int server, int port)
{
    chan c = { .zmq = zmq, .fd = -1 };
    char addr[64];
    if (zmq) {
        c.ctx = zmq_ctx_new();
        c.sock = zmq_socket(c.ctx, ZMQ_PAIR);
        snprintf(addr, sizeof addr, "tcp://%s:%d", msg_host(), port);
        if ((server ? zmq_bind(c.sock, addr) : zmq_connect(c.sock, addr)) != 0)
            die("zmq bind/connect");
        return c;
    }
    struct sockaddr_in a = msg_addr(port);
    int one = 1;
    if (server) {
        int l = socket(AF_INET, SOCK_STREAM, 0);
        setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
        if (bind(l, (struct sockaddr *) &a, sizeof a) || listen(l, 1))
            die("bind");
        c.fd = accept(l, NULL, NULL);
        close(l);
    } else {
        c.fd = socket(AF_INET, SOCK_STREAM, 0);
        for (int tries = 0; connect(c.fd, (struct sockaddr *) &a, sizeof a) != 0; tries++) {
            if (tries > 20000)
                die("connect");
            usleep(1000);
            close(c.fd);
            c.fd = socket(AF_INET, SOCK_STREAM, 0);
        }
    }
    setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    return c;
}

static void close_chan(chan *c)
{
    if (c->zmq) {
        int zero = 0;
        zmq_setsockopt(c->sock, ZMQ_LINGER, &zero, sizeof zero);
        zmq_close(c->sock);
        zmq_ctx_term(c->ctx);
    } else {
        close(c->fd);
    }
}

/* ---- the patterns ---- */

static size_t sizes[64];
static int nsizes;
static long pp_iters = 2000;
static long stream_bytes = 64L << 20;

static long stream_count(size_t size)
{
    long n = stream_bytes / (long) (size ? size : 1);
    return n < 200 ? 200 : (n > 200000 ? 200000 : n);
}

static void server_loop(chan *c, char *buf, size_t cap)
{
    for (int i = 0; i < nsizes; i++) {
        for (long k = 0; k < pp_iters + pp_iters / 10; k++) {
            size_t n = recv_msg(c, buf, cap);
            send_msg(c, buf, n);
        }
        long count = stream_count(sizes[i]);
        for (long k = 0; k < count; k++)
            recv_msg(c, buf, cap);
        send_msg(c, buf, 1);
    }
}

static void client(chan *c, char *buf, size_t cap)
{
    for (int i = 0; i < nsizes; i++) {
        size_t s = sizes[i];
        long warm = pp_iters / 10;
        double t0 = 0;
        for (long k = 0; k < pp_iters + warm; k++) {
            if (k == warm)
                t0 = now_us();
            send_msg(c, buf, s);
            recv_msg(c, buf, cap);
        }
        printf("pingpong %zu %.3f\n", s, (now_us() - t0) / pp_iters / 2);
        long count = stream_count(s);
        t0 = now_us();
        for (long k = 0; k < count; k++)
            send_msg(c, buf, s);
        recv_msg(c, buf, cap);
        double us = now_us() - t0;
        printf("stream %zu %.1f\n", s, (double) s * count / us);
        fflush(stdout);
    }
}

int main(int argc, char **argv)
{
    if (argc < 4) {
        fprintf(stderr, "usage: msg_peers zmq|tcp PORT SIZE[,SIZE...] [PINGPONG_ITERS] [STREAM_BYTES]\n");
        return 2;
    }
    int zmq = strcmp(argv[1], "zmq") == 0;
    int port = atoi(argv[2]);
    size_t cap = 0;
    for (char *tok = strtok(argv[3], ","); tok && nsizes < 64; tok = strtok(NULL, ",")) {
        sizes[nsizes] = (size_t) strtoul(tok, NULL, 10);
        if (sizes[nsizes] > cap)
            cap = sizes[nsizes];
        nsizes++;
    }
    if (argc > 4)
        pp_iters = atol(argv[4]);
    if (argc > 5)
        stream_bytes = atol(argv[5]);
    char *buf = calloc(1, cap + 8);
    const char *role = msg_role();
    if (role) {
        int server = strcmp(role, "server") == 0;
        if (!server && strcmp(role, "client") != 0) {
            fprintf(stderr, "msg_peers: MSG_ROLE=%s is neither server nor client\n", role);
            return 2;
        }
        chan c = open_chan(zmq, server, port);
        if (server)
            server_loop(&c, buf, cap + 8);
        else
            client(&c, buf, cap + 8);
        close_chan(&c);
        return 0;
    }
    pid_t kid = fork();
    if (kid == 0) {
        pin(1);
        chan c = open_chan(zmq, 1, port);
        server_loop(&c, buf, cap + 8);
        close_chan(&c);
        return 0;
    }
    pin(0);
    chan c = open_chan(zmq, 0, port);
    client(&c, buf, cap + 8);
    close_chan(&c);
    int st;
    waitpid(kid, &st, 0);
    return 0;
}
