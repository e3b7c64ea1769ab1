/* spec.h - the sandbox spec: what a sandbox is made of as a caller asks for it (workspace,
 * mode, root filesystem, identity, environment, limits, sizes, timeouts), with ONE set of
 * defaults, read from JSON params (sandbox.create) or from command-line options (conch run,
 * conch create, conch mcp) by one table of fields, and written back as JSON params.
 *
 * It sits right above core in the module order: the jail takes its defaults from here, the
 * daemon parses sandbox.create with it, cli/ and mcp/ parse and send it. */
#ifndef CONCH_SPEC_SPEC_H
#define CONCH_SPEC_SPEC_H

#include <jansson.h>
#include <stdbool.h>
#include <stdint.h>
#include <sys/stat.h>

#include "core/error.h"
#include "net/net.h"

/* How the workspace is mounted at /workspace. */
enum conch_ws_mode {
    CONCH_WS_OVERLAY = 0, /* copy-on-write over the host dir (default) */
    CONCH_WS_RO,          /* read-only bind */
    CONCH_WS_RW,          /* live bind */
};

/* conch_ws_mode_parse - "overlay" | "ro" | "rw" → *@ret; -EINVAL (kind usage) otherwise. */
int conch_ws_mode_parse(const char *s, enum conch_ws_mode *ret, struct conch_err *err);
/* conch_ws_mode_name - the name of @mode; a static string. */
const char *conch_ws_mode_name(enum conch_ws_mode mode);

/*
 * The defaults (conch_spec_defaults fills them in; nothing else should use these but code
 * that has no spec at hand, such as a pool sandbox or one recovered from the state database).
 *
 * The disk default is one for every way a sandbox is made (conch run, through the daemon's
 * pool or not, sandbox.create, conch mcp): 4 GiB, what a real build needs (a virtualenv
 * with a deep-learning wheel, node_modules, a Rust target dir) rather than what a toy
 * command needs. conch run's upper dir is a tmpfs, so it costs memory only as it is written;
 * a daemon sandbox's is on disk. A pool sandbox is built with it and lent to conch run
 * commands of any workspace: its own RLIMIT_FSIZE is the ceiling of every borrower's --disk.
 */
#define CONCH_SPEC_TMP_DEFAULT (256ULL << 20)
#define CONCH_SPEC_HOME_DEFAULT (64ULL << 20)
#define CONCH_SPEC_DISK_DEFAULT (4ULL << 30)

/* The ranges every way in checks (docs/PROTOCOL.md, "Ranges"): 0 means none (limits) or the
 * default (sizes); otherwise at least MIN and at most MAX. */
#define CONCH_SPEC_MEMORY_MIN (1ULL << 20)
#define CONCH_SPEC_MEMORY_MAX (1ULL << 40)
#define CONCH_SPEC_PIDS_MIN 2
#define CONCH_SPEC_PIDS_MAX 4194304
#define CONCH_SPEC_CPU_MIN 0.01
#define CONCH_SPEC_CPU_MAX 1024
#define CONCH_SPEC_SIZE_MIN (64ULL << 10) /* tmp, home, disk */
#define CONCH_SPEC_TMP_MAX (1ULL << 40)
#define CONCH_SPEC_DISK_MAX (64ULL << 40)
#define CONCH_SPEC_IDLE_MAX (365.0 * 86400)
#define CONCH_SPEC_TOOL_TIMEOUT_MIN 0.001
#define CONCH_SPEC_TOOL_TIMEOUT_MAX 86400.0
#define CONCH_SPEC_TOOL_CALLS_MAX 1000000

/* Extra mounts (mounts.c). */
#define CONCH_SPEC_MOUNTS_MAX 8
/* A store mount is a named store's files (workspace/'s stores) in a view dir (the daemon's, or
 * conch run's) that the sandbox gets as a writable bind: its maker fills @source before the
 * sandbox starts; the jail binds it as it binds any rw source. */
/* An overlay mount is a host directory seen through an overlay whose upper dir sits beside the
 * workspace's (a daemon's <state>/sandboxes/<id>/m<i>; conch run's in its upper's tmpfs): the
 * sandbox writes, the host dir is untouched until workspace.commit {"mount": target} (conch
 * run: --commit). Its source is checked as a read-only bind's. */
enum conch_mount_type {
    CONCH_MOUNT_TMPFS,
    CONCH_MOUNT_BIND,
    CONCH_MOUNT_STORE,
    CONCH_MOUNT_OVERLAY
};
#define CONCH_MOUNT_STORE_NAME_MAX 64
struct conch_mount {
    enum conch_mount_type type;
    char source[1024]; /* bind, overlay: an absolute host dir; store: its view (the daemon's) */
    char target[1024]; /* an absolute path inside the sandbox */
    uint64_t bytes;    /* tmpfs: its size (default 64 MiB); store: its cap if it is new */
    bool rw;           /* bind: writable (default read-only); tmpfs and store: always */
    char name[CONCH_MOUNT_STORE_NAME_MAX + 1]; /* store: which one */
};

/* Path rules in the workspace (rules.c): read-only subpaths and hidden paths, relative to
 * the workspace, normalised (no "", "." or ".." component, no leading or trailing '/'). */
#define CONCH_SPEC_RULES_MAX 32
#define CONCH_SPEC_RULE_PATH_MAX 1024
enum conch_rule_kind { CONCH_RULE_READONLY, CONCH_RULE_HIDDEN };
struct conch_path_rule {
    enum conch_rule_kind kind;
    char path[CONCH_SPEC_RULE_PATH_MAX];
};
/* Host unix sockets passed into the sandbox (mounts.c): a bind of the socket file, nothing
 * else of the host's. */
#define CONCH_SPEC_SOCKETS_MAX 8
#define CONCH_SOCKET_PATH_MAX 108 /* sizeof(sun_path): what a program inside can connect to */
struct conch_socket {
    char host[1024];                  /* an absolute host path of a unix socket the caller owns */
    char path[CONCH_SOCKET_PATH_MAX]; /* where it is inside (default: the host path) */
};

/*
 * struct conch_sandbox_spec - one sandbox as asked for. Strings are borrowed from what they
 * were parsed from (argv, or the JSON params) and must outlive the spec's use; @env is an
 * owned reference (conch_spec_done drops it).
 */
struct conch_sandbox_spec {
    const char *workspace; /* host dir at /workspace; NULL: an empty one (conch run: ".") */
    enum conch_ws_mode mode;
    const char *rootfs; /* NULL: the host's /usr, /bin, /lib* and a curated /etc */
    bool as_root;       /* commands run as root of the namespace, not uid 1000 'agent' */
    json_t *env;        /* {"NAME": "value"} added to every command's environment, or NULL */
    struct {
        uint64_t memory_bytes;  /* 0: none */
        uint64_t pids_max;      /* 0: none given (the jail applies CONCH_DEFAULT_PIDS) */
        uint64_t cpu_millicpus; /* 1000 = one CPU; 0: none */
    } limits;
    uint64_t tmp_bytes;         /* size of /tmp */
    uint64_t home_bytes;        /* size of /home/agent */
    uint64_t disk_bytes;        /* what may be written to the workspace (and largest file) */
    double idle_timeout;        /* seconds unused before the daemon destroys it; 0: never;
                                 * < 0: the daemon's --idle-timeout */
    const char *name;           /* a label shown in lists; NULL: none */
    double tool_timeout;        /* seconds a tool call may take; 0: the bridge's default */
    unsigned max_tool_calls;    /* per command; 0: the bridge's default */
    struct conch_mount *mounts; /* owned (conch_spec_done frees it); n_mounts of them */
    unsigned n_mounts;
    struct conch_path_rule *rules; /* owned (conch_spec_done frees it); n_rules of them */
    unsigned n_rules;
    struct conch_socket *sockets; /* owned (conch_spec_done frees it); n_sockets of them */
    unsigned n_sockets;
    /* The network (net/net.h): none (default), allow (through the proxy, by @allow and
     * @deny: arrays of rule strings, owned references or NULL), host. */
    enum conch_net_mode net;
    bool net_given; /* --net or "net" was given (an --allow without it implies allow) */
    json_t *allow, *deny;
};

/* conch_spec_defaults - fill @s with THE defaults: overlay, no workspace, the host's root, uid
 * 1000, no limits, 256 MiB /tmp, 64 MiB home, 4 GiB disk, the daemon's idle timeout. */
void conch_spec_defaults(struct conch_sandbox_spec *s);

/* conch_spec_done - drop what @s owns (its env); @s may be reused after conch_spec_defaults. */
void conch_spec_done(struct conch_sandbox_spec *s);

/*
 * conch_spec_from_json - fill @s (defaults first) from sandbox.create params @params
 * (borrowed; strings of @s point into it). Keys it does not know are ignored (the RPC
 * dispatcher refuses them before). Checks types, ranges, that workspace and rootfs are
 * absolute paths of directories and env maps names to strings; "mounts" and the path rules
 * "readonly" and "hidden" (conch_spec_add_rule) are checked too. Returns 0, or -EINVAL with
 * @err filled (kind usage) and *@ret_param naming the offending key (a static string).
 */
int conch_spec_from_json(struct conch_sandbox_spec *s, json_t *params, const char **ret_param,
                         struct conch_err *err);

/*
 * conch_spec_net_policy - the network policy of @s into @ret (conch_net_policy_done frees
 * it): its mode and rules. Rules outside the allow mode are refused. Returns 0, or -EINVAL
 * (kind usage) with @err naming the rule or the conflict.
 */
int conch_spec_net_policy(const struct conch_sandbox_spec *s, struct conch_net_policy *ret,
                          struct conch_err *err);

/*
 * conch_spec_to_json - the sandbox.create params for @s: only what differs from the
 * defaults (home_bytes has no param and is left out). Returns a new object, or NULL when out
 * of memory.
 */
json_t *conch_spec_to_json(const struct conch_sandbox_spec *s);

/* The command-line spelling of the fields: conch_spec_set_option's names. */
enum conch_spec_opt {
    CONCH_SPEC_OPT_WORKSPACE = 1 << 0,
    CONCH_SPEC_OPT_MODE = 1 << 1,
    CONCH_SPEC_OPT_ROOTFS = 1 << 2,
    CONCH_SPEC_OPT_AS_ROOT = 1 << 3,
    CONCH_SPEC_OPT_ENV = 1 << 4,
    CONCH_SPEC_OPT_MEMORY = 1 << 5,
    CONCH_SPEC_OPT_PIDS = 1 << 6,
    CONCH_SPEC_OPT_CPU = 1 << 7,
    CONCH_SPEC_OPT_TMP_SIZE = 1 << 8,
    CONCH_SPEC_OPT_HOME_SIZE = 1 << 9,
    CONCH_SPEC_OPT_DISK = 1 << 10,
    CONCH_SPEC_OPT_NAME = 1 << 11,
    CONCH_SPEC_OPT_IDLE_TIMEOUT = 1 << 12,
    CONCH_SPEC_OPT_MOUNT = 1 << 13,
    CONCH_SPEC_OPT_NET = 1 << 14,    /* --net, --allow, --deny */
    CONCH_SPEC_OPT_RULES = 1 << 15,  /* --readonly, --hidden */
    CONCH_SPEC_OPT_SOCKET = 1 << 16, /* --pass-socket HOST[:INSIDE] */
};

/*
 * conch_spec_option - the option @name ("memory", without dashes) if it is one of @which (a
 * set of enum conch_spec_opt); 0 otherwise. *@ret_takes_value: whether it takes a value
 * (--as-root does not). Lets a verb's option table take the spec's options it offers.
 */
unsigned conch_spec_option(const char *name, unsigned which, bool *ret_takes_value);

/*
 * conch_spec_set_option - apply the command-line option @name (without dashes; one that
 * conch_spec_option knows) with @value (borrowed: strings of @s point into it; NULL for a
 * flag) to @s. Sizes take suffixes (64k, 512M, 4G), --cpu a number of CPUs, --idle-timeout
 * seconds, --env NAME=VALUE (a copy is kept: the caller may blank the value in its argv),
 * --mount, --readonly and --hidden (repeatable, checked as their JSON forms);
 * the ranges are the JSON params' ones, and 0 means none or the default as there. Paths are
 * stored as given (the caller resolves them). Returns 0, or -EINVAL with @err (kind usage)
 * naming "--@name" and the value.
 */
int conch_spec_set_option(struct conch_sandbox_spec *s, const char *name, const char *value,
                          struct conch_err *err);

/*
 * conch_mount_parse - a mount as --mount writes it: "type=tmpfs,target=/scratch,size=64m",
 * "type=bind,source=/host/dir,target=/opt/x[,ro|,rw]" (a bind is read-only unless rw), into
 * *@ret, checked (conch_mount_check). conch_mount_from_json - the same from a JSON string of
 * that form or an object {type, source?, target, size? (bytes or "64m"), readonly?}.
 * Return 0 or -errno with @err (kind usage).
 */
int conch_mount_parse(const char *text, struct conch_mount *ret, struct conch_err *err);
int conch_mount_from_json(json_t *v, struct conch_mount *ret, struct conch_err *err);
/*
 * conch_mount_check - @m is one a sandbox may have: absolute paths of plain components (no
 * "", "." or ".."); a target neither over nor beneath /workspace, /proc, /dev, /sys, /run,
 * /etc, /usr and the other system dirs, nor over / , /tmp, /home/agent...; a tmpfs size in
 * range; a bind source that exists and is a directory (followed as the caller follows it:
 * what it may read is checked by the kernel when the sandbox binds it with the caller's
 * rights). Returns 0 or -errno with @err (kind usage).
 */
int conch_mount_check(const struct conch_mount *m, struct conch_err *err);
/* conch_mount_to_json - @m as an object of sandbox.create's "mounts" (a new reference). */
json_t *conch_mount_to_json(const struct conch_mount *m);
/* conch_spec_add_mount - append a copy of @m (checked) to @s: at most CONCH_SPEC_MOUNTS_MAX,
 * no two targets overlapping. conch_spec_mounts_from_json - append each of the array @arr. */
int conch_spec_add_mount(struct conch_sandbox_spec *s, const struct conch_mount *m,
                         struct conch_err *err);
int conch_spec_mounts_from_json(struct conch_sandbox_spec *s, json_t *arr, struct conch_err *err);

/*
 * conch_rule_path_normalize - @in (a path relative to the workspace, as a caller wrote it) as
 * a rule path into @out (@size bytes): "" and "." components and a trailing '/' dropped, a
 * leading "./" too. Refused (-EINVAL, kind usage, naming @in): an absolute path, a ".."
 * component, a path naming the workspace itself, one of CONCH_SPEC_RULE_PATH_MAX bytes or
 * more, or one holding a control byte.
 */
int conch_rule_path_normalize(const char *in, char *out, size_t size, struct conch_err *err);
/* conch_rule_kind_name - "readonly" or "hidden" (the JSON key); a static string. */
const char *conch_rule_kind_name(enum conch_rule_kind kind);
/*
 * conch_spec_add_rule - append the rule (@kind, @path normalised) to @s: at most
 * CONCH_SPEC_RULES_MAX; the same path twice in one kind is kept once; a path in both kinds,
 * or at or beneath a hidden path (whose content the sandbox cannot see), is refused.
 * conch_spec_rules_from_json - append each string of the array @arr as a rule of @kind.
 * Return 0 or -errno with @err (kind usage).
 */
int conch_spec_add_rule(struct conch_sandbox_spec *s, enum conch_rule_kind kind, const char *path,
                        struct conch_err *err);
int conch_spec_rules_from_json(struct conch_sandbox_spec *s, enum conch_rule_kind kind, json_t *arr,
                               struct conch_err *err);
/* conch_spec_rules_to_json - the paths of @kind among @rules as a JSON array (a new
 * reference; NULL when out of memory). */
json_t *conch_spec_rules_to_json(const struct conch_path_rule *rules, unsigned n,
                                 enum conch_rule_kind kind);
/*
 * conch_socket_parse - a socket as --pass-socket writes it: "HOST[:INSIDE]" (INSIDE defaults
 * to HOST), into *@ret, checked (conch_socket_check). conch_socket_from_json - the same from
 * a JSON string of that form or an object {host, path?}. Return 0 or -errno with @err (kind
 * usage).
 */
int conch_socket_parse(const char *text, struct conch_socket *ret, struct conch_err *err);
int conch_socket_from_json(json_t *v, struct conch_socket *ret, struct conch_err *err);
/*
 * conch_socket_check - @s is one a sandbox may have: an inside path of plain components,
 * shorter than sun_path, on the sandbox's own root (not beneath /workspace, /tmp, /home/agent,
 * /run/conch, /proc, /dev, /etc, /usr and the other system dirs), and a host path that
 * conch_socket_open accepts now. Returns 0 or -errno with @err (kind usage).
 */
int conch_socket_check(const struct conch_socket *s, struct conch_err *err);
/*
 * conch_socket_open - open host socket @host as it will be bound: O_PATH|O_NOFOLLOW, through
 * no magic link (/proc/PID/root, /proc/PID/fd: another sandbox's tool bridge, another mount
 * namespace), refusing a symbolic link (name the socket itself), anything but a unix socket,
 * and one owned by another user than the caller's effective uid (root may name any).
 * *@ret_st: its stat; @ret_path (@path_size bytes, may be NULL): where it really is (no
 * symbolic link in it). Returns the fd (O_CLOEXEC, the caller's), or -errno with @err (usage).
 */
int conch_socket_open(const char *host, struct stat *ret_st, char *ret_path, size_t path_size,
                      struct conch_err *err);
/*
 * conch_spec_sockets_clear - refuse a socket of @socks (n of them) that is conch's own control
 * socket @control (a path; NULL: none), or lies in its directory (unless that is a shared
 * sticky one, like /tmp), or beneath @state_dir (NULL: none): a sandbox that reached them could
 * drive the daemon. Returns 0 or -errno with @err (usage).
 */
int conch_spec_sockets_clear(const struct conch_socket *socks, unsigned n, const char *control,
                             const char *state_dir, struct conch_err *err);
/* conch_socket_to_json - @s as an object of sandbox.create's "sockets" (a new reference). */
json_t *conch_socket_to_json(const struct conch_socket *s);
/* conch_spec_add_socket - append a copy of @s (checked) to @spec: at most
 * CONCH_SPEC_SOCKETS_MAX, no two at one path, none over or beneath a mount's target.
 * conch_spec_sockets_from_json - append each of the array @arr. */
int conch_spec_add_socket(struct conch_sandbox_spec *spec, const struct conch_socket *s,
                          struct conch_err *err);
int conch_spec_sockets_from_json(struct conch_sandbox_spec *spec, json_t *arr,
                                 struct conch_err *err);

#endif
