# ptydrive.py - drive a program on a pseudo-terminal, as a person at a terminal would: wait
# for what it prints, type keys, collect everything until it exits.
import os
import pty
import select
import time


def drive(argv, steps, timeout=30, cwd=None):
    """Run argv on a pty; for each (wait_for, keys) wait until the output holds wait_for, then
    type keys. Returns (output, exit status)."""
    pid, fd = pty.fork()
    if pid == 0:
        if cwd:
            os.chdir(cwd)
        os.execv(argv[0], argv)
    out = b""
    done = False
    try:
        for want, keys in steps:
            end = time.monotonic() + timeout
            while want not in out and time.monotonic() < end:
                r, _, _ = select.select([fd], [], [], 0.2)
                if r:
                    try:
                        out += os.read(fd, 4096)
                    except OSError:
                        break
            assert want in out, (want, out)
            os.write(fd, keys)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            r, _, _ = select.select([fd], [], [], 0.2)
            if r:
                try:
                    data = os.read(fd, 4096)
                except OSError:
                    break
                if not data:
                    break
                out += data
        done = True
    finally:
        # A step failed, or the program still runs after the last keys (an EOF seen, or the
        # timeout): given time to end, then killed (a plain waitpid waited forever for a
        # program that lost its last key: CI hung), its status saying so.
        st = None
        end = time.monotonic() + (timeout if done else 0)
        while st is None:
            got, s = os.waitpid(pid, os.WNOHANG)
            if got == pid:
                st = s
            elif time.monotonic() >= end:
                os.kill(pid, 9)
                _, st = os.waitpid(pid, 0)
            else:
                time.sleep(0.05)
        os.close(fd)
    return out, os.waitstatus_to_exitcode(st)
