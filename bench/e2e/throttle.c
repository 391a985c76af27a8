/*
 * A slow network card for one process, for the fabric-floor scenario of bench/gpu-e2e.sh.
 *
 * Loaded with LD_PRELOAD into one node's agent (--node-env N:LD_PRELOAD=...), it caps what the
 * process sends on its sockets to GPUVAL_THROTTLE_MBPS megabytes per second (one budget shared by
 * every socket and thread of the process), the way a NIC that trained at a lower rate would.
 * NCCL's socket transport and the agent's TCP check both send with send(2); a send is cut to at
 * most 64 KiB (a short send is legal on a stream socket and both callers loop), then the caller
 * sleeps until the bytes it sent fit the rate. Nothing else changes: the node's GPUs, its NCCL
 * settings and its peers stay as they are, so only groups that hold this node slow down.
 *
 *   cc -shared -fPIC -O2 -o throttle.so bench/e2e/throttle.c -ldl -lpthread
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/types.h>
#include <time.h>

#define CHUNK (64 * 1024)

typedef ssize_t (*send_fn)(int, const void *, size_t, int);

static send_fn real_send;
static double bytes_per_s;
static double next_free_s;
static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_once_t once = PTHREAD_ONCE_INIT;

static void init(void) {
    real_send = (send_fn)dlsym(RTLD_NEXT, "send");
    const char *mbps = getenv("GPUVAL_THROTTLE_MBPS");
    double rate = mbps ? strtod(mbps, NULL) : 0.0;
    bytes_per_s = rate > 0.0 ? rate * 1e6 : 0.0;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

/* Books n bytes against the shared budget and returns how long the caller must wait. */
static double book(ssize_t n) {
    pthread_mutex_lock(&lock);
    double now = now_s();
    if (next_free_s < now) next_free_s = now;
    next_free_s += (double)n / bytes_per_s;
    double wait = next_free_s - now;
    pthread_mutex_unlock(&lock);
    return wait;
}

ssize_t send(int fd, const void *buf, size_t len, int flags) {
    pthread_once(&once, init);
    if (real_send == NULL) {
        errno = ENOSYS;
        return -1;
    }
    if (bytes_per_s <= 0.0) return real_send(fd, buf, len, flags);
    ssize_t n = real_send(fd, buf, len > CHUNK ? CHUNK : len, flags);
    if (n > 0) {
        double wait = book(n);
        if (wait > 0.0) {
            struct timespec ts = {(time_t)wait, (long)((wait - (double)(time_t)wait) * 1e9)};
            while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {
            }
        }
    }
    return n;
}
