/* test_fscopy.c - unit tests for src/fs/fs-copy.c: fs.copy_in and fs.copy_out against a
 * temporary directory as the sandbox's root, with the host file as a regular file and as a
 * pipe (refused: a copy starts from the file's beginning), the path rules (a planted link
 * to a host directory resolves inside the root), the file size limit, and the lent fd's
 * absence. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/cleanup.h"
#include "core/fsutil.h"
#include "fs/fs.h"

static char dir[64], outside[64];
static int root_fd = -1;
static struct conch_fs_error ferr;

static void setup(void)
{
    strcpy(dir, "/tmp/conch-test-fscopy-XXXXXX");
    strcpy(outside, "/tmp/conch-test-fscopy-out-XXXXXX");
    cr_assert_not_null(mkdtemp(dir));
    cr_assert_not_null(mkdtemp(outside));
    char ws[128];
    snprintf(ws, sizeof(ws), "%s/workspace", dir);
    cr_assert_eq(mkdir(ws, 0755), 0);
    root_fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    cr_assert_geq(root_fd, 0);
    umask(022);
    signal(SIGXFSZ, SIG_IGN);
}

static int rm_one(const char *p, const struct stat *st, int flag, struct FTW *ftw)
{
    (void)st;
    (void)ftw;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}

static void teardown(void)
{
    if (root_fd >= 0)
        close(root_fd);
    nftw(dir, rm_one, 32, FTW_DEPTH | FTW_PHYS);
    nftw(outside, rm_one, 32, FTW_DEPTH | FTW_PHYS);
}

TestSuite(fscopy, .init = setup, .fini = teardown, .timeout = 60);

static json_t *copy(const char *method, const char *path, int data_fd)
{
    json_t *p = json_pack("{s:s}", "path", path);
    json_t *r = conch_fs_call_rooted_data(root_fd, "/workspace", method, p, data_fd, &ferr);
    json_decref(p);
    return r;
}

/* A host file of @len pseudo-random bytes (NULs and all), open for reading. */
static int host_file(size_t len, char **ret_data)
{
    char *data = malloc(len);
    for (size_t i = 0; i < len; i++)
        data[i] = (char)((i * 2654435761u) >> 13);
    char p[128];
    snprintf(p, sizeof(p), "%s/src", outside);
    int fd = open(p, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert_geq(fd, 0);
    cr_assert_eq(conch_write_all(fd, data, len), 0);
    *ret_data = data;
    return fd;
}

static char *slurp(int fd, size_t *len)
{
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    char *b = malloc((size_t)st.st_size + 1);
    cr_assert_eq(pread(fd, b, (size_t)st.st_size, 0), st.st_size);
    *len = (size_t)st.st_size;
    return b;
}

Test(fscopy, in_and_out_of_a_regular_file_identical)
{
    _cleanup_free_ char *data = NULL;
    size_t len = (3u << 20) + 17;
    _cleanup_close_ int src = host_file(len, &data); /* its position at the end: rewound */
    json_t *r = copy("copy_in", "sub/f.bin", src);
    cr_assert_not_null(r, "%s", ferr.message);
    cr_assert_eq(json_integer_value(json_object_get(r, "bytes_written")), (json_int_t)len);
    cr_assert(json_is_true(json_object_get(r, "created")));
    json_decref(r);
    char p[128];
    snprintf(p, sizeof(p), "%s/out", outside);
    _cleanup_close_ int dst = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    cr_assert_eq(conch_write_all(dst, "longer old content", 18), 0);
    r = copy("copy_out", "/workspace/sub/f.bin", dst);
    cr_assert_not_null(r, "%s", ferr.message);
    cr_assert_eq(json_integer_value(json_object_get(r, "size")), (json_int_t)len);
    json_decref(r);
    size_t n;
    _cleanup_free_ char *got = slurp(dst, &n);
    cr_assert_eq(n, len);
    cr_assert_eq(memcmp(got, data, len), 0);
}

Test(fscopy, a_pipe_is_refused_with_a_clear_error)
{
    int pfd[2];
    cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
    cr_assert_eq(write(pfd[1], "through a pipe\n", 15), 15);
    close(pfd[1]);
    /* lseek fails on a pipe: the copy_in refuses it with a clear error, nothing written */
    json_t *r = copy("copy_in", "p.txt", pfd[0]);
    cr_assert_null(r);
    cr_assert_neq(ferr.message[0], '\0');
    char p[128];
    snprintf(p, sizeof(p), "%s/workspace/p.txt", dir);
    cr_assert_neq(access(p, F_OK), 0);
    close(pfd[0]);
    /* copy_out into a pipe: ftruncate refuses it */
    cr_assert_eq(pipe2(pfd, O_CLOEXEC), 0);
    _cleanup_free_ char *data = NULL;
    _cleanup_close_ int src = host_file(100, &data);
    json_decref(copy("copy_in", "q.txt", src));
    cr_assert_null(copy("copy_out", "q.txt", pfd[1]));
    close(pfd[0]);
    close(pfd[1]);
}

Test(fscopy, a_planted_link_to_a_host_directory_resolves_inside)
{
    char link[128], target[128];
    snprintf(link, sizeof(link), "%s/workspace/out", dir);
    cr_assert_eq(symlink(outside, link), 0);
    snprintf(link, sizeof(link), "%s/workspace/up", dir);
    cr_assert_eq(symlink("../../../../../../..", link), 0);
    _cleanup_free_ char *data = NULL;
    _cleanup_close_ int src = host_file(64, &data);
    cr_assert_null(copy("copy_in", "out/planted", src));
    snprintf(target, sizeof(target), "%s/planted", outside);
    cr_assert_neq(access(target, F_OK), 0, "copy_in followed a link out of the root");
    /* ".." climbs stop at the root: the file lands inside it */
    json_t *r = copy("copy_in", "up/tmp-planted", src);
    json_decref(r);
    cr_assert_neq(access("/tmp-planted", F_OK), 0, "copy_in left the root");
    /* "../escape" from /workspace is "/escape" of the root: inside it, never beside it */
    json_decref(copy("copy_in", "../escape", src));
    snprintf(target, sizeof(target), "%s/escape", dir);
    cr_assert_eq(access(target, F_OK), 0, "%s", ferr.message);
    cr_assert_neq(access("/tmp/escape", F_OK), 0, "copy_in left the root");
}

Test(fscopy, past_the_file_size_limit_too_large_and_nothing_left)
{
    _cleanup_free_ char *data = NULL;
    _cleanup_close_ int src = host_file(2u << 20, &data);
    json_decref(copy("copy_in", "big.bin", src)); /* before the limit */
    struct rlimit rl = {.rlim_cur = 1u << 20, .rlim_max = RLIM_INFINITY};
    cr_assert_eq(setrlimit(RLIMIT_FSIZE, &rl), 0);
    cr_assert_null(copy("copy_in", "new.bin", src));
    cr_assert_eq(ferr.code, CONCH_FS_TOO_LARGE, "%s", ferr.message);
    char p[128];
    snprintf(p, sizeof(p), "%s/workspace", dir);
    _cleanup_close_ int w = open(p, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    DIR *d = fdopendir(dup(w));
    struct dirent *e;
    while ((e = readdir(d)))
        cr_assert(e->d_name[0] == '.'
                      ? !strncmp(e->d_name, ".", 1) && strncmp(e->d_name, ".conch-write-", 13)
                      : !strcmp(e->d_name, "big.bin"),
                  "left behind: %s", e->d_name);
    closedir(d);
    snprintf(p, sizeof(p), "%s/out", outside);
    _cleanup_close_ int dst = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    cr_assert_null(copy("copy_out", "big.bin", dst));
    cr_assert_eq(ferr.code, CONCH_FS_TOO_LARGE, "%s", ferr.message);
    cr_assert_not_null(strstr(ferr.message, "in chunks"), "%s", ferr.message);
}

Test(fscopy, errors_of_the_sandbox_side_and_no_lent_fd)
{
    char p[128];
    snprintf(p, sizeof(p), "%s/workspace/d", dir);
    cr_assert_eq(mkdir(p, 0755), 0);
    snprintf(p, sizeof(p), "%s/out", outside);
    _cleanup_close_ int dst = open(p, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    cr_assert_null(copy("copy_out", "d", dst));
    cr_assert_eq(ferr.code, CONCH_FS_IS_DIRECTORY);
    cr_assert_null(copy("copy_out", "nope", dst));
    cr_assert_eq(ferr.code, CONCH_FS_FILE_NOT_FOUND);
    cr_assert_null(copy("copy_in", "x", -1));
    cr_assert_eq(ferr.code, CONCH_FS_IO_ERROR);
    cr_assert_null(copy("copy_out", "x", -1));
    /* the other methods ignore a lent fd; these two take no other param */
    json_t *p2 = json_pack("{s:s,s:s}", "path", "x", "content", "y");
    cr_assert_null(conch_fs_call_rooted_data(root_fd, "/workspace", "copy_in", p2, dst, &ferr));
    cr_assert_eq(ferr.code, CONCH_FS_INVALID_PARAMS);
    json_decref(p2);
}
