/* output.h - capturing one output stream of a command: the head and the tail kept in
 * memory under a cap, the full stream spilled to a file under a larger cap. */
#ifndef CONCH_EXEC_OUTPUT_H
#define CONCH_EXEC_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/error.h"

struct conch_output {
    /* configuration */
    size_t max_bytes;    /* bytes kept in memory: head = max/2, tail = max - head */
    uint64_t spill_max;  /* bytes written to the spill file at most */
    char spill_dir[256]; /* where to create the spill file */
    char name[32];       /* "stdout" / "stderr", used in the spill file's name */
    /* state */
    uint64_t total;      /* bytes seen */
    char *head;          /* owned, max_bytes/2 capacity */
    size_t head_len;
    char *tail;          /* owned ring buffer, max_bytes - max_bytes/2 capacity */
    size_t tail_len, tail_pos;
    int spill_fd;        /* -1 until the output first exceeds max_bytes */
    char spill_path[512];/* set when spill_fd was opened */
    uint64_t spilled;    /* bytes written to the spill file */
    bool spill_full;     /* spill_max reached: later bytes are counted, not stored */
};

/*
 * conch_output_init - set up @o (caller-allocated) to keep @max_bytes in memory and spill
 * up to @spill_max bytes to a file created in @spill_dir (mode 0600) once the output
 * exceeds @max_bytes. The spill file holds the whole stream from its first byte.
 */
int conch_output_init(struct conch_output *o, const char *name, size_t max_bytes,
                      uint64_t spill_max, const char *spill_dir, struct conch_err *err);

/*
 * conch_output_append - account for @len bytes of @buf. Returns 0, 1 when the spill cap
 * has now been exceeded (the caller decides whether to stop the command), or -errno
 * (spill write failure, with @err).
 */
int conch_output_append(struct conch_output *o, const void *buf, size_t len,
                        struct conch_err *err);

/* conch_output_truncated - true when more was seen than is kept in memory. */
bool conch_output_truncated(const struct conch_output *o);

/*
 * conch_output_text - the kept text: everything when not truncated; otherwise the head,
 * a line "[... N bytes omitted; full output in PATH ...]" (or "... not kept: spill limit
 * reached" when the spill cap was hit), and the tail. Returns a new NUL-terminated string
 * (*@ret, caller frees) and its length (*@ret_len, may be NULL); NULs in the output are
 * kept in the byte count. Returns 0 or -ENOMEM.
 */
int conch_output_text(const struct conch_output *o, char **ret, size_t *ret_len);

/* conch_output_done - close the spill file (it stays on disk) and free buffers. */
void conch_output_done(struct conch_output *o);

#endif
