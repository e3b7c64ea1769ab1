/* cleanup.h - scope-bound cleanup helpers (the systemd/crun way): a variable declared
 * with one of these attributes is released when it goes out of scope unless TAKE_*'d. */
#ifndef CONCH_CORE_CLEANUP_H
#define CONCH_CORE_CLEANUP_H

#include <dirent.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

static inline void conch__freep(void *p)
{
    free(*(void **)p);
}
static inline void conch__closep(int *fd)
{
    if (*fd >= 0) {
        int saved = errno;
        close(*fd);
        errno = saved;
    }
}
static inline void conch__fclosep(FILE **f)
{
    if (*f)
        fclose(*f);
}
static inline void conch__closedirp(DIR **d)
{
    if (*d)
        closedir(*d);
}

#define _cleanup_(f) __attribute__((cleanup(f)))
#define _cleanup_free_ _cleanup_(conch__freep)
#define _cleanup_close_ _cleanup_(conch__closep)
#define _cleanup_fclose_ _cleanup_(conch__fclosep)
#define _cleanup_closedir_ _cleanup_(conch__closedirp)

/* TAKE_PTR - return @p and set it to NULL, so a cleanup attribute no longer frees it. */
#define TAKE_PTR(p)                                                                                \
    ({                                                                                             \
        __typeof__(p) _tp = (p);                                                                   \
        (p) = NULL;                                                                                \
        _tp;                                                                                       \
    })
/* TAKE_FD - return @fd and set it to -1. */
#define TAKE_FD(fd)                                                                                \
    ({                                                                                             \
        int _tf = (fd);                                                                            \
        (fd) = -1;                                                                                 \
        _tf;                                                                                       \
    })

#define ARRAY_SIZE(a) (sizeof(a) / sizeof((a)[0]))

#endif
