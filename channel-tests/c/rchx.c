/*
 * rchx - a launcher that owns the card exchange itself (mode b of rch.h), with no
 * PMI: it forks N processes, gives each a socket (RCHX_FD) with its rank and size
 * (RCHX_RANK, RCHX_SIZE), and serves publish / lookup / fence requests on those
 * sockets, as the process-management layer of an MPI would. Programs built on mm.h
 * see RCHX_FD and initialise with rch_init_process_group_external.
 *
 *   rchx -n N prog args...
 *
 * Requests, one line each: "P rank key hexvalue" -> "OK"; "L rank key" -> "V hex"
 * or "E"; "F" -> "OK" once all N processes sent it ("E" if one has exited).
 * Exit status: 0 if every process exited 0; otherwise the first failure's status
 * (128 + signal for a signal), after killing the others.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAXN 256
#define MAXKV 4096

struct kv {
    int rank;
    char key[64];
    char *hex;
};

static struct kv kvs[MAXKV];
static int nkv;

struct proc {
    pid_t pid;
    int fd; /* our end of its socket, -1 once closed */
    char buf[2048];
    size_t len;
    int in_fence;
    int exited;
};

static struct proc procs[MAXN];
static int n;

static void reply(struct proc *p, const char *s)
{
    size_t l = strlen(s);
    while (l > 0 && p->fd >= 0) {
        ssize_t w = write(p->fd, s, l);
        if (w < 0 && errno == EINTR)
            continue;
        if (w <= 0)
            return;
        s += w;
        l -= (size_t)w;
    }
}

static void fence_check(void)
{
    int waiting = 0, gone = 0;
    for (int i = 0; i < n; i++) {
        waiting += procs[i].in_fence;
        gone += procs[i].exited && !procs[i].in_fence;
    }
    if (waiting == 0 || (waiting < n && !gone))
        return;
    const char *answer = waiting == n ? "OK\n" : "E\n";
    for (int i = 0; i < n; i++)
        if (procs[i].in_fence) {
            procs[i].in_fence = 0;
            reply(&procs[i], answer);
        }
}

static void handle(struct proc *p, char *line)
{
    if (line[0] == 'P') {
        int rank;
        char key[64], hex[1024];
        if (sscanf(line, "P %d %63s %1023s", &rank, key, hex) != 3 || nkv == MAXKV) {
            reply(p, "E\n");
            return;
        }
        kvs[nkv].rank = rank;
        strcpy(kvs[nkv].key, key);
        kvs[nkv].hex = strdup(hex);
        nkv++;
        reply(p, "OK\n");
    } else if (line[0] == 'L') {
        int rank;
        char key[64];
        if (sscanf(line, "L %d %63s", &rank, key) != 2) {
            reply(p, "E\n");
            return;
        }
        for (int i = nkv - 1; i >= 0; i--)
            if (kvs[i].rank == rank && strcmp(kvs[i].key, key) == 0) {
                reply(p, "V ");
                reply(p, kvs[i].hex);
                reply(p, "\n");
                return;
            }
        reply(p, "E\n");
    } else if (line[0] == 'F') {
        p->in_fence = 1;
        fence_check();
    } else {
        reply(p, "E\n");
    }
}

static int status_code(int st)
{
    if (WIFEXITED(st))
        return WEXITSTATUS(st);
    if (WIFSIGNALED(st))
        return 128 + WTERMSIG(st);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc < 4 || strcmp(argv[1], "-n") != 0 || (n = atoi(argv[2])) < 1 || n > MAXN) {
        fprintf(stderr, "usage: rchx -n N prog args...\n");
        return 2;
    }
    for (int i = 0; i < n; i++) {
        int sv[2];
        if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) != 0) {
            perror("rchx: socketpair");
            return 2;
        }
        pid_t pid = fork();
        if (pid < 0) {
            perror("rchx: fork");
            return 2;
        }
        if (pid == 0) {
            int fd = dup(sv[1]); /* without CLOEXEC */
            char v[32];
            snprintf(v, sizeof v, "%d", fd);
            setenv("RCHX_FD", v, 1);
            snprintf(v, sizeof v, "%d", i);
            setenv("RCHX_RANK", v, 1);
            snprintf(v, sizeof v, "%d", n);
            setenv("RCHX_SIZE", v, 1);
            execvp(argv[3], argv + 3);
            fprintf(stderr, "rchx: cannot run %s: %s\n", argv[3], strerror(errno));
            _exit(127);
        }
        close(sv[1]);
        procs[i].pid = pid;
        procs[i].fd = sv[0];
    }
    int running = n, result = 0;
    while (running > 0) {
        struct pollfd pf[MAXN];
        int idx[MAXN], np = 0;
        for (int i = 0; i < n; i++)
            if (procs[i].fd >= 0) {
                pf[np].fd = procs[i].fd;
                pf[np].events = POLLIN;
                idx[np++] = i;
            }
        if (np > 0 && poll(pf, (nfds_t)np, 50) < 0 && errno != EINTR) {
            perror("rchx: poll");
            break;
        }
        if (np == 0)
            usleep(10000);
        for (int k = 0; k < np; k++) {
            if (!pf[k].revents)
                continue;
            struct proc *p = &procs[idx[k]];
            ssize_t r = read(p->fd, p->buf + p->len, sizeof p->buf - 1 - p->len);
            if (r <= 0) {
                close(p->fd);
                p->fd = -1;
                continue;
            }
            p->len += (size_t)r;
            char *nl;
            while ((nl = memchr(p->buf, '\n', p->len)) != NULL) {
                *nl = 0;
                handle(p, p->buf);
                size_t used = (size_t)(nl - p->buf) + 1;
                memmove(p->buf, nl + 1, p->len - used);
                p->len -= used;
            }
            if (p->len == sizeof p->buf - 1)
                p->len = 0; /* an overlong line: drop it */
        }
        int st;
        pid_t pid;
        while ((pid = waitpid(-1, &st, WNOHANG)) > 0) {
            for (int i = 0; i < n; i++) {
                if (procs[i].pid != pid)
                    continue;
                procs[i].exited = 1;
                running--;
                int code = status_code(st);
                if (code != 0) {
                    fprintf(stderr, "rchx: rank %d (pid %d) %s %d\n", i, (int)pid,
                            WIFSIGNALED(st) ? "killed by signal" : "exited with status",
                            WIFSIGNALED(st) ? WTERMSIG(st) : code);
                    if (result == 0) {
                        result = code;
                        for (int j = 0; j < n; j++)
                            if (!procs[j].exited)
                                kill(procs[j].pid, SIGTERM);
                    }
                }
            }
        }
        fence_check();
    }
    for (int i = 0; i < nkv; i++)
        free(kvs[i].hex);
    return result;
}
