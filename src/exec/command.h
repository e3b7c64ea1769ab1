/* command.h - the one command driver: a command from its pipes to its report, whatever loop
 * drives it. It makes the command's stdio (two output pipes, stdin from a caller's fd, from
 * bytes or /dev/null), keeps each output stream in a conch_output (head and tail under a cap,
 * the rest spilled to a capped file, memory charged to a budget), starts the command as a
 * process object of the supervisor, reads its pipes when told they are readable, stops it
 * past the spill cap or a sampled limit, and classifies its end (exit, signal, timeout,
 * memory, processes, disk, output, lost) into the fields of a conch_run_result.
 *
 * It owns no loop. The caller watches the fds the command names (conch_command_fd, or the
 * ops->watch callback when its loop keeps registrations, like libuv's uv_poll) and calls
 * conch_command_read() when one is readable; it drives the supervisor as it always does, and
 * the command learns its end from it. `conch run`'s poll loop (exec/run.c) and the daemon's
 * libuv loop (daemon/commands.c) are the two drivers. Drive a command from one thread. */
#ifndef CONCH_EXEC_COMMAND_H
#define CONCH_EXEC_COMMAND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "core/budget.h"
#include "core/error.h"
#include "exec/output.h"
#include "exec/run.h"
#include "jail/jail.h"
#include "super/super.h"

/* The command's two output streams, the index of everything per stream below. */
enum { CONCH_COMMAND_STDOUT = 0, CONCH_COMMAND_STDERR = 1 };

/* What the caller's loop is to do with a stream's fd (ops->watch). */
enum conch_command_watch {
    CONCH_COMMAND_WATCH_READ,  /* poll it for readability (hang-ups count as readable) */
    CONCH_COMMAND_WATCH_PAUSE, /* stop polling it for now (conch_command_pause) */
    CONCH_COMMAND_WATCH_CLOSE, /* stop polling it for good: it is closed when watch returns */
};

/* Limits seen by sampling the sandbox (conch_command_sample, conch_command_limit_hit). */
#define CONCH_LIMIT_MEMORY 1u /* resident memory past the limit: the command is killed */
#define CONCH_LIMIT_PIDS 2u   /* the process table is full: noted (forks fail by themselves) */

struct conch_command;

/* What the command tells its caller. Every callback may be NULL. */
struct conch_command_ops {
    /* The caller's loop is to watch @fd of @stream as @what says. For a loop that asks
     * conch_command_fd() before each wait (poll) this may be NULL. Returns 0, or -errno
     * (only heeded for the first WATCH_READ of a stream: conch_command_start then fails). */
    int (*watch)(struct conch_command *c, int stream, int fd, enum conch_command_watch what);
    /* @len bytes of @stream (borrowed, valid during the call) were kept or spilled; @before:
     * the stream's byte count before them. The caller may pause the command here. */
    void (*output)(struct conch_command *c, int stream, const char *buf, size_t len,
                   uint64_t before);
    /* The command runs: @pid in its own pid namespace, whose inode is @pidns_ino. */
    void (*started)(struct conch_command *c, pid_t pid, uint64_t pidns_ino);
    /* Its final event came (conch_command_end has it); output may still be in the pipes. */
    void (*ended)(struct conch_command *c);
    /* Ended, and both streams are closed: the report is complete. Called once, as the last
     * thing the command does in that call: the callee may free @c (after
     * conch_command_done). */
    void (*finished)(struct conch_command *c);
    /* Send @sig to every process of the command. NULL: through the supervisor it was started
     * under (conch_super_signal); a caller that started the process itself sets it. */
    void (*signal)(struct conch_command *c, int sig);
};

struct conch_command_opts {
    size_t max_output;           /* bytes of each stream kept in memory (head + tail) */
    uint64_t max_spill;          /* bytes of each stream kept in its spill file */
    const char *spill_dir;       /* where spill files go; NULL or "": none (see output.h) */
    const char *spill_shown_dir; /* how results name that dir (conch_output_show_spill_in) */
    struct conch_budget *budget; /* memory of both streams is charged to it; borrowed, or NULL */
    /* stdin: @stdin_fd (borrowed, dup'd; when it is not open, /dev/null), or when it is -1,
     * @stdin_len bytes of @stdin_data (copied into a memfd, so any amount is fed without a
     * loop writing a pipe), or /dev/null when there are none. */
    int stdin_fd;
    const char *stdin_data;
    size_t stdin_len;
    uint64_t timeout_ms;               /* enforced by the warden; 0: none */
    uint64_t grace_ms;                 /* between SIGTERM and SIGKILL at the deadline */
    struct conch_cgroup_limits limits; /* the sandbox's: what a limit's report names */
    /* The shell the command runs as (`SHELL -c COMMAND`; static, borrowed), or NULL: when it
     * cannot be executed, the sandbox cannot run commands (infrastructure, 125). */
    const char *shell;
};

/* One command. Caller-allocated (usually embedded in the caller's record); the fields are the
 * module's: read them through the functions below. */
struct conch_command {
    const struct conch_command_ops *ops;
    void *data; /* the caller's */
    /* private */
    struct conch_proc proc;
    struct conch_output out[2];
    int fd[2];    /* read ends of the output pipes; -1 once closed */
    int stdin_fd; /* borrowed from the opts until opened */
    const char *stdin_data;
    size_t stdin_len;
    bool paused;
    unsigned watched; /* a bit per stream: ops->watch was told READ, and not CLOSE yet */
    bool ended, finished;
    struct conch_proc_end end;
    uint64_t timeout_ms, grace_ms;
    struct conch_cgroup_limits limits;
    struct conch_jail *jail; /* borrowed from the supervisor between start and the end */
    bool has_cgroup;
    uint64_t oom_base, pids_base; /* the cgroup's counters when it started */
    bool oom_killed, pids_hit;    /* from the cgroup's counters at its end */
    bool over_spill, sampled_oom, sampled_pids;
    char disk_full[160]; /* conch_command_disk_full: what filled up; "" */
    uint64_t start_ms, end_ms;
    const char *shell; /* from the opts */
};

/*
 * conch_command_init - set @c up (caller-allocated) per @o with @ops (borrowed, must outlive
 * @c) and @data: the output streams are made (no fd yet). Returns 0, or -errno with @err (a
 * spill dir too long: kind usage); @c is then still safe to conch_command_done.
 */
int conch_command_init(struct conch_command *c, const struct conch_command_opts *o,
                       const struct conch_command_ops *ops, void *data, struct conch_err *err);

/*
 * conch_command_open - make the command's stdio: two pipes whose read ends the command keeps
 * (non-blocking, watched: ops->watch READ) and stdin as the opts said. The child's ends go to
 * @ret_stdio (stdin, stdout, stderr; the caller owns them and closes them once the process
 * has them). For a caller that starts the process itself (tests), which then sets
 * ops->signal and reports its end with conch_command_process_ended; conch_command_start does
 * this. Returns 0, or -errno with @err (nothing is then left open or watched).
 */
int conch_command_open(struct conch_command *c, int ret_stdio[3], struct conch_err *err);

/*
 * conch_command_process_ended - the final event of a process the caller started itself
 * (conch_command_open); under the supervisor it comes by itself. Exactly once. May end with
 * ops->finished.
 */
void conch_command_process_ended(struct conch_command *c, const struct conch_proc_end *end);

/*
 * conch_command_start - open the stdio and start @cmd (whose stdio fds are filled in here;
 * the rest is the caller's) under supervisor @s, as process object of @c: its end comes
 * through the supervisor's dispatch. Reads the sandbox's cgroup counters first, so that only
 * what grows during the command counts. Returns 0, or -errno with @err: nothing ran, no
 * callback will come (the streams were closed: ops->watch CLOSE), conch_command_done remains.
 */
int conch_command_start(struct conch_command *c, struct conch_super *s, struct conch_jail_cmd *cmd,
                        struct conch_err *err);

/*
 * conch_command_fd - the fd of @stream to poll for readability now, or -1 (closed, or the
 * command is paused).
 */
int conch_command_fd(const struct conch_command *c, int stream);

/*
 * conch_command_read - @stream is readable (or hung up): read what is there, in reads of 64
 * KiB until the pipe is empty, the command is paused, or 2 MiB were read (so that one stream
 * cannot hold the loop), keep it, tell ops->output of each read; past the spill cap the
 * command is killed (an output flood must not fill the host's disk). At EOF the stream is
 * closed (ops->watch CLOSE) and, when the command has ended, ops->finished comes last.
 * Returns 0, or -errno with @err when the spill file could not be written (or memory could
 * not be had): the bytes were counted, the stream stays readable, the caller decides.
 */
int conch_command_read(struct conch_command *c, int stream, struct conch_err *err);

/*
 * conch_command_pause - @on: stop reading the output (ops->watch PAUSE; the command blocks on
 * its writes: backpressure, not memory), until called again with !@on (ops->watch READ).
 */
void conch_command_pause(struct conch_command *c, bool on);

/* conch_command_signal - send @sig to every process of @c (kept until it starts; a no-op after
 * its end). */
void conch_command_signal(struct conch_command *c, int sig);

/*
 * conch_command_sample - without a cgroup, which limits of @lim the processes of @j are at
 * (CONCH_LIMIT_* bits), from the sandbox's own /proc; 0 with a cgroup (it enforces them), with
 * no such limit, or when /proc could not be read. Cost grows with the number of processes.
 */
unsigned conch_command_sample(struct conch_jail *j, const struct conch_cgroup_limits *lim);

/* conch_command_sampling_wanted - @j has no cgroup and @lim limits memory or processes: the
 * caller samples (conch_command_sample) while commands run. */
bool conch_command_sampling_wanted(struct conch_jail *j, const struct conch_cgroup_limits *lim);

/*
 * conch_command_limit_hit - sampling saw the sandbox at @limits (CONCH_LIMIT_* bits): memory
 * kills the command (once), the process limit is noted. Both explain its end in the report.
 */
void conch_command_limit_hit(struct conch_command *c, unsigned limits);

/*
 * conch_command_disk_full - a disk the command writes is full, @what ("/tmp (256 MiB,
 * --tmp-size)", copied): the report names it; a command still running is killed. Also after
 * the end, when the caller finds that a full disk explains it.
 */
void conch_command_disk_full(struct conch_command *c, const char *what);

/*
 * conch_command_abandon - stop reading (both streams closed: ops->watch CLOSE) and, when no
 * final event came, end @c as lost (@why, a static string): its sandbox goes. Call only when
 * the supervisor holds it no more (conch_super_done ran) or it was never started. Ends with
 * ops->finished when it was not finished yet.
 */
void conch_command_abandon(struct conch_command *c, const char *why);

/* conch_command_ended - its final event came. */
bool conch_command_ended(const struct conch_command *c);

/* conch_command_finished - ended, and both streams closed (ops->finished came). */
bool conch_command_finished(const struct conch_command *c);

/* conch_command_end - how the process ended (valid once ended). */
const struct conch_proc_end *conch_command_end(const struct conch_command *c);

/* conch_command_output - @stream's capture: its kept text, counts and spill file. Borrowed. */
const struct conch_output *conch_command_output(const struct conch_command *c, int stream);

/*
 * conch_command_result - @c's report into @res, once finished: exit_code, signal, timed_out,
 * duration_ms (start to finish), cpu_ms, max_rss_kb, error_kind and error_msg, a limit
 * reported before the timeout it often causes (conch_run_result_end). Touches no other field:
 * the outputs are the caller's to borrow (conch_command_output) or take
 * (conch_command_take_outputs).
 */
void conch_command_result(const struct conch_command *c, struct conch_run_result *res);

/*
 * conch_command_take_outputs - move the two captures into @ret_out and @ret_err (the caller
 * then owns them: conch_output_done); @c keeps empty ones. Once finished.
 */
void conch_command_take_outputs(struct conch_command *c, struct conch_output *ret_out,
                                struct conch_output *ret_err);

/*
 * conch_command_done - close what @c still holds and free its captures (its spill files stay
 * on disk). The caller's loop must watch none of its fds any more. Safe after any
 * conch_command_init, also a failed one, and twice.
 */
void conch_command_done(struct conch_command *c);

#endif
