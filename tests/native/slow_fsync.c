/* A slow disk for the fault tests (issue 12), loaded with LD_PRELOAD: fsync and fdatasync
 * first sleep for the number of microseconds written in the file that
 * SLOW_FSYNC_FILE names (no file, no variable or 0: no delay), then do the real call.
 * The file is read at every call, so a test slows a running node's disk and heals it by
 * rewriting it. Device-mapper's dm-delay would slow the device itself, but this kernel has
 * no device-mapper; delaying the calls is what a process sees of a slow disk. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static void wait_as_a_slow_disk(void)
{
    const char *path = getenv("SLOW_FSYNC_FILE");
    if (path == NULL)
        return;
    FILE *file = fopen(path, "r");
    if (file == NULL)
        return;
    long delay_us = 0;
    if (fscanf(file, "%ld", &delay_us) != 1)
        delay_us = 0;
    fclose(file);
    if (delay_us > 0) {
        struct timespec delay = {delay_us / 1000000, (delay_us % 1000000) * 1000};
        while (nanosleep(&delay, &delay) != 0)
            ;
    }
}

int fsync(int fd)
{
    static int (*real_fsync)(int);
    if (real_fsync == NULL)
        real_fsync = (int (*)(int))dlsym(RTLD_NEXT, "fsync");
    wait_as_a_slow_disk();
    return real_fsync(fd);
}

int fdatasync(int fd)
{
    static int (*real_fdatasync)(int);
    if (real_fdatasync == NULL)
        real_fdatasync = (int (*)(int))dlsym(RTLD_NEXT, "fdatasync");
    wait_as_a_slow_disk();
    return real_fdatasync(fd);
}
