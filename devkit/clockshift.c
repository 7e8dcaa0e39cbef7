/* An LD_PRELOAD shim that shifts one process's wall clock (CLOCK_REALTIME and what reads it) by an offset an
 * operator's misbehaving NTP could have set, for tests and chaos runs (devkit/clockshift.py builds and drives it).
 *
 * The offset, in nanoseconds, is a native int64 at the start of the file named by CLOCKSHIFT_FILE; the file is
 * mapped once, so a new offset written there takes effect at once (an NTP step) without a system call per read.
 * Monotonic clocks are never shifted: they are what a real clock step leaves alone too. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

static volatile const int64_t *offset_ns;
static int (*real_clock_gettime)(clockid_t, struct timespec *);

static void setup(void) {
    if (!real_clock_gettime)
        real_clock_gettime = (int (*)(clockid_t, struct timespec *))dlsym(RTLD_NEXT, "clock_gettime");
    if (offset_ns)
        return;
    const char *path = getenv("CLOCKSHIFT_FILE");
    if (!path)
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    void *map = mmap(NULL, sizeof(int64_t), PROT_READ, MAP_SHARED, fd, 0);
    close(fd);
    if (map != MAP_FAILED)
        offset_ns = (volatile const int64_t *)map;
}

static int realtime(clockid_t clock) {
    return clock == CLOCK_REALTIME || clock == CLOCK_REALTIME_COARSE;
}

int clock_gettime(clockid_t clock, struct timespec *ts) {
    setup();
    int rc = real_clock_gettime(clock, ts);
    if (rc == 0 && offset_ns && realtime(clock)) {
        int64_t ns = (int64_t)ts->tv_sec * 1000000000 + ts->tv_nsec + *offset_ns;
        ts->tv_sec = ns / 1000000000;
        ts->tv_nsec = ns % 1000000000;
        if (ts->tv_nsec < 0) {
            ts->tv_nsec += 1000000000;
            ts->tv_sec -= 1;
        }
    }
    return rc;
}

int gettimeofday(struct timeval *tv, void *tz) {
    struct timespec ts;
    (void)tz;
    if (!tv)
        return 0;
    int rc = clock_gettime(CLOCK_REALTIME, &ts);
    tv->tv_sec = ts.tv_sec;
    tv->tv_usec = ts.tv_nsec / 1000;
    return rc;
}

time_t time(time_t *out) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    if (out)
        *out = ts.tv_sec;
    return ts.tv_sec;
}
