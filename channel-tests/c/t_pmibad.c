/* A PMI server that misbehaves: rch_init_process_group must fail with
 * RCH_ERR_PMI and a message, quickly, never crash or hang. One scenario per run:
 *   garbage  the server answers init with garbage
 *   hangup   the server closes the socket at once
 *   silent   the server never answers (the client's RCH_PMI_TIMEOUT_MS expires)
 *   midway   the server answers the handshake, then hangs up during the exchange
 *   badfd    PMI_FD is not a number
 *   closedfd PMI_FD names no open descriptor */
#define _GNU_SOURCE
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "rch.h"

static void serve(int fd, const char *mode)
{
    char buf[4096];
    if (strcmp(mode, "hangup") == 0)
        _exit(0);
    ssize_t n = read(fd, buf, sizeof buf);
    if (strcmp(mode, "garbage") == 0) {
        const char junk[] = "\x01\x02 this is not PMI =\xff\n cmd=response_to_init rc=banana\n";
        (void)!write(fd, junk, sizeof junk - 1);
        sleep(5);
        _exit(0);
    }
    if (strcmp(mode, "silent") == 0) {
        sleep(30);
        _exit(0);
    }
    /* midway: a plausible handshake, then gone */
    (void)n;
    const char *answers[] = {
        "cmd=response_to_init pmi_version=1 pmi_subversion=1 rc=0\n",
        "cmd=maxes rc=0 kvsname_max=256 keylen_max=64 vallen_max=1024\n",
        "cmd=my_kvsname rc=0 kvsname=kvs_1\n",
    };
    for (int i = 0; i < 3; i++) {
        if (i > 0 && read(fd, buf, sizeof buf) <= 0)
            _exit(0);
        (void)!write(fd, answers[i], strlen(answers[i]));
    }
    /* the next request (the put of the hello card, or a barrier) gets no answer */
    (void)!read(fd, buf, sizeof buf);
    _exit(0);
}

int main(int argc, char **argv)
{
    const char *mode = argc > 1 ? argv[1] : "garbage";
    pid_t server = -1;
    if (strcmp(mode, "badfd") == 0) {
        setenv("PMI_FD", "seven", 1);
    } else if (strcmp(mode, "closedfd") == 0) {
        setenv("PMI_FD", "987", 1);
    } else {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM, 0, sv) != 0)
            return 2;
        server = fork();
        if (server == 0) {
            close(sv[1]);
            serve(sv[0], mode);
        }
        close(sv[0]);
        char v[16];
        snprintf(v, sizeof v, "%d", sv[1]);
        setenv("PMI_FD", v, 1);
    }
    setenv("PMI_RANK", "0", 1);
    setenv("PMI_SIZE", "2", 1);
    setenv("RCH_PMI_TIMEOUT_MS", "1500", 1);
    int rank, size, parent;
    struct timespec t0, t1;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    int rc = rch_init_process_group(&rank, &size, &parent);
    if (rc == RCH_SUCCESS)
        rc = rch_init();
    clock_gettime(CLOCK_MONOTONIC, &t1);
    double secs = (double)(t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) * 1e-9;
    if (server > 0) {
        kill(server, SIGKILL);
        waitpid(server, NULL, 0);
    }
    if (rc != RCH_ERR_PMI) {
        fprintf(stderr, "%s: expected RCH_ERR_PMI, got %d (%s): %s\n", mode, rc, rch_strerror(rc),
                rch_last_error());
        return 1;
    }
    if (!rch_last_error()[0] || secs > 10) {
        fprintf(stderr, "%s: no message or too slow (%.1f s)\n", mode, secs);
        return 1;
    }
    printf("pmibad %s ok: %.2f s: %s\n", mode, secs, rch_last_error());
    /* the library is left uninitialised, and says so */
    if (rch_rank(&rank) != RCH_ERR_NOT_INITIALIZED)
        return 1;
    return 0;
}
