/* session-child.c - a session's shell, between the fences and execve(): a new pty of the
 * sandbox's own devpts instance (mounts-child.c mounts it with newinstance) becomes its
 * controlling terminal and stdio, and the pty's master goes to the daemon over a unix socket,
 * so the daemon reads and writes the terminal without any host pty. Runs in the command's
 * process after setsid(): no allocation. */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <termios.h>
#include <unistd.h>

#include "core/fdpass.h"
#include "jail/jail-internal.h"

#ifndef TIOCGPTPEER
#define TIOCGPTPEER _IO('T', 0x41)
#endif

int conch_jail_session_pty_setup_child(int fds[4])
{
    int master = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
    if (master < 0)
        return -1;
    int unlock = 0;
    if (ioctl(master, TIOCSPTLCK, &unlock) < 0)
        goto fail;
    int slave = ioctl(master, TIOCGPTPEER, O_RDWR | O_CLOEXEC);
    if (slave < 0)
        goto fail;
    if (ioctl(slave, TIOCSCTTY, 0) < 0)
        goto fail_slave;
    struct winsize ws = {.ws_row = 24, .ws_col = 80};
    ioctl(slave, TIOCSWINSZ, &ws);
    char byte = 'M';
    if (conch_send_fds(fds[0], &byte, 1, &master, 1, 0) != 1)
        goto fail_slave;
    close(master);
    /* Inherited by the shell (bash cannot set close-on-exec itself: it runs each command with
     * fd 62 closed, and marks it close-on-exec with the fdflags loadable when it exists). */
    if (dup2(fds[0], 62) < 0) {
        int e = errno;
        close(slave);
        errno = e;
        return -1;
    }
    close(fds[0]);
    close(fds[1]);
    close(fds[2]);
    fds[0] = fds[1] = fds[2] = slave;
    return 0;
fail_slave : {
    int e = errno;
    close(slave);
    errno = e;
}
fail : {
    int e = errno;
    close(master);
    errno = e;
}
    return -1;
}
