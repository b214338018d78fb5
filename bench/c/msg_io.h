/*
 * What bench/c/msg_peers.c and bench/c/msg_farm.c share: whole reads and writes on
 * a socket, failing loudly, and the address and role of a run across hosts. A benchmark's helpers: nothing here asserts.
 */
#ifndef MSG_IO_H
#define MSG_IO_H

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static void die(const char *what)
{
    perror(what);
    exit(1);
}

static void full_write(int fd, const void *p, size_t n)
{
    const char *c = p;
    while (n > 0) {
        ssize_t w = write(fd, c, n);
        if (w < 0) {
            if (errno == EINTR)
                continue;
            die("write");
        }
        c += w;
        n -= (size_t) w;
    }
}

/* 1 once n bytes were read; 0 at a clean end before the first; exits at an end
 * inside them. */
static int full_read(int fd, void *p, size_t n)
{
    char *c = p;
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, c + got, n - got);
        if (r < 0) {
            if (errno == EINTR)
                continue;
            die("read");
        }
        if (r == 0) {
            if (got == 0)
                return 0;
            fprintf(stderr, "stream ended inside a message\n");
            exit(1);
        }
        got += (size_t) r;
    }
    return 1;
}

/* The listening side's IPv4 address: MSG_HOST, else the loopback. Across hosts
 * (bench/runtime-cluster.sh) each side runs one role (MSG_ROLE) and MSG_HOST names
 * the listener's address on the hosts' private link. */
static const char *msg_host(void)
{
    const char *h = getenv("MSG_HOST");
    return h && *h ? h : "127.0.0.1";
}

/* A sockaddr_in for msg_host() and port p. */
static struct sockaddr_in msg_addr(int p)
{
    struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons((uint16_t) p) };
    if (inet_pton(AF_INET, msg_host(), &a.sin_addr) != 1) {
        fprintf(stderr, "MSG_HOST=%s is not an IPv4 address\n", msg_host());
        exit(2);
    }
    return a;
}

/* MSG_ROLE, or NULL when this process plays every role (forking the others). */
static const char *msg_role(void)
{
    const char *r = getenv("MSG_ROLE");
    return r && *r ? r : NULL;
}

#endif
