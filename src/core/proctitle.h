/* proctitle.h - what a forked child shows as its command line. The warden is a fork of the
 * daemon or of `conch run`: without this, /proc/1/cmdline inside a sandbox would show the
 * caller's arguments (host paths such as the state dir). */
#ifndef CONCH_CORE_PROCTITLE_H
#define CONCH_CORE_PROCTITLE_H

/* conch_proctitle_init - remember where main()'s @argv strings lie (call once, first thing in
 * main). Without it conch_proctitle_set_child does nothing. */
void conch_proctitle_init(int argc, char **argv);

/*
 * conch_proctitle_set_child - overwrite the remembered argv area with @title followed by
 * NULs (truncated to the area). For a forked child: it changes only the child's copy of the
 * memory. Async-signal-safe, no allocation.
 */
void conch_proctitle_set_child(const char *title);

#endif
