/*
 * What bench/c/msg_peers.c and bench/c/msg_farm.c share: whole reads and writes on
 * a socket, and failing loudly. A benchmark's helpers: nothing here asserts.
 */
#ifndef MSG_IO_H
#define MSG_IO_H

#include <errno.h>
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

#endif
