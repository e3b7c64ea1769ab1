/* output.h - capturing one output stream of a command: the head and the tail kept in
 * memory under a cap, the full stream spilled to a file under a larger cap. The memory may
 * also be charged to a budget shared with other streams (conch_output_set_budget): when the
 * budget has no room, the stream keeps less in memory and spills early. */
#ifndef CONCH_EXEC_OUTPUT_H
#define CONCH_EXEC_OUTPUT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "core/budget.h"
#include "core/error.h"

/* Caller-allocated; all fields are owned by the module: read them, don't write them. */
struct conch_output {
    /* configuration */
    size_t max_bytes;    /* bytes kept in memory: head = max/2, tail = max - head */
    uint64_t spill_max;  /* bytes written to the spill file at most */
    char spill_dir[256]; /* where to create the spill file; "" = never spill */
    char name[32];       /* "stdout" / "stderr", used in the spill file's name */
    char shown_dir[64];  /* where readers find the spill file ("" = spill_dir) */
    /* state */
    uint64_t total; /* bytes seen */
    char *head;     /* owned, grows up to max_bytes/2 (NULL until the first byte) */
    size_t head_len, head_alloc;
    char *tail; /* owned ring, max_bytes - max_bytes/2, allocated when the head is full */
    size_t tail_len, tail_pos; /* tail_pos: next write index (the oldest byte once full) */
    int spill_fd;              /* -1 until the output first exceeds max_bytes */
    char spill_path[512];      /* set when spill_fd was opened; "" otherwise */
    uint64_t spilled;          /* bytes written to the spill file */
    bool spill_full;           /* spill_max reached: later bytes are counted, not stored */
    int spill_err;             /* errno of a failed spill open/write; spilling then stops */
    /* memory: what head and tail may hold (max_bytes split, less when the budget is short) */
    size_t head_max, tail_max;
    struct conch_budget *budget; /* borrowed, or NULL */
    uint64_t charged;            /* bytes of head and tail charged to budget */
};

/*
 * conch_output_init - set up @o (caller-allocated) to keep @max_bytes in memory and spill
 * up to @spill_max bytes to a file created in @spill_dir (mode 0600, O_CLOEXEC, named
 * "<spill_dir>/conch-<name>-XXXXXX.log") once the output exceeds @max_bytes. The spill
 * file holds the whole stream from its first byte. @max_bytes may be 0 (nothing kept in
 * memory, every byte spills). A NULL or empty @spill_dir, or a @spill_max of 0, means no
 * spill file: output past @max_bytes is counted and dropped, as if the spill cap were hit.
 * @name must be short and contain no '/'. The buffers grow as output arrives.
 * Returns 0, or -EINVAL/-ENAMETOOLONG with @err filled; on failure @o is still
 * safe to pass to conch_output_done().
 */
int conch_output_init(struct conch_output *o, const char *name, size_t max_bytes,
                      uint64_t spill_max, const char *spill_dir, struct conch_err *err);

/*
 * conch_output_set_budget - charge the memory @o allocates for its head and tail to @budget
 * (borrowed: it must outlive @o's buffers, until conch_output_done). Call after init, before
 * the first append. When the budget has no room for more, @o keeps what it has (the head
 * stops growing, the tail is smaller or none) and the stream goes to its spill file from
 * then on, from its first byte, as when it outgrows max_bytes: nothing is lost that the spill
 * file could hold, only less is kept in memory.
 */
void conch_output_set_budget(struct conch_output *o, struct conch_budget *budget);

/*
 * conch_output_append - account for @len bytes of @buf (borrowed; may contain NULs).
 * Returns 0; 1 when the spill cap has been exceeded by this or an earlier call (bytes past
 * the cap are counted but not stored; the caller decides whether to stop the command); or
 * -errno with @err filled when the spill file could not be created or written (or, -ENOMEM,
 * memory to keep the bytes could not be had: they are counted, not kept). After such
 * a failure spilling stops for good (the file would have a gap) and later calls return 0
 * while still keeping the head and tail in memory.
 */
int conch_output_append(struct conch_output *o, const void *buf, size_t len, struct conch_err *err);

/*
 * conch_output_show_spill_in - name the spill file as @dir/<its name> in results and text
 * instead of its path on the host: where the caller makes it readable (the daemon serves a
 * sandbox's spill files at /run/conch/output through fs.*). @dir is copied (< 64 bytes).
 */
void conch_output_show_spill_in(struct conch_output *o, const char *dir);

/*
 * conch_output_spill_shown - the spill file's name for readers (see above) into @buf, or ""
 * when there is no spill file.
 */
void conch_output_spill_shown(const struct conch_output *o, char *buf, size_t size);

/* conch_output_truncated - true when more was seen than is kept in memory (than max_bytes,
 * or than the budget let it keep). */
bool conch_output_truncated(const struct conch_output *o);

/*
 * conch_output_text - the kept text: everything when not truncated; otherwise the head,
 * "\n[... N bytes omitted; full output in PATH ...]\n" (or "...; spill limit of M bytes
 * reached, the rest was not kept ...]" when the spill cap was hit, or "...; the spill file
 * could not be written (CAUSE) ...]" after a spill failure), and the tail (the last
 * max_bytes - max_bytes/2 bytes, in order). Returns a new NUL-terminated string (*@ret,
 * caller frees) and its length (*@ret_len, may be NULL); NULs in the output are kept in
 * the byte count. Returns 0 or -ENOMEM.
 */
int conch_output_text(const struct conch_output *o, char **ret, size_t *ret_len);

/* conch_output_close_spill - close the spill file's fd once the stream has ended (the file
 * stays on disk, named as before): a finished command holds no fd. */
void conch_output_close_spill(struct conch_output *o);

/*
 * conch_output_done - close the spill file (it stays on disk) and free buffers. Safe to
 * call twice, after a failed init, and on a zeroed struct (fd 0 is never closed unless
 * init opened it as the spill file).
 */
void conch_output_done(struct conch_output *o);

#endif
