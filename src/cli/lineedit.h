/* lineedit.h - a small line editor for the command line's REPLs (`conch js`): a line read
 * from a terminal in raw mode with left/right editing, Home/End, Ctrl-A/E/K/U/W, backspace
 * and delete, and up/down through a history kept in memory; plain line input when the input
 * is not a terminal. No readline or libedit: neither is among conch's dependencies. */
#ifndef CONCH_CLI_LINEEDIT_H
#define CONCH_CLI_LINEEDIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <termios.h>

/* Lines the history keeps (older ones go first). */
#define CONCH_CLI_LINEEDIT_HISTORY 1000

struct conch_cli_lineedit {
    int in, out; /* the terminal's fds (borrowed) */
    bool tty;    /* @in is a terminal: raw-mode editing */
    FILE *plain; /* lines read as they come when not a terminal (borrowed) */
    char **hist; /* oldest first */
    size_t n_hist;
};

/* conch_cli_lineedit_init - an editor reading @in (@plain: the same input as a FILE, read
 * when @in is not a terminal) and echoing to @out. */
void conch_cli_lineedit_init(struct conch_cli_lineedit *le, int in, int out, FILE *plain);

/*
 * conch_cli_lineedit_read - show @prompt and read one line, edited on a terminal (the
 * terminal is in raw mode only while it reads: a program run meanwhile sees it as it was).
 * Returns 1 with *@ret_line (a new string, without its newline), 0 at the end of input
 * (Ctrl-D on an empty line), -EINTR when Ctrl-C discarded the line, or -errno.
 */
int conch_cli_lineedit_read(struct conch_cli_lineedit *le, const char *prompt, char **ret_line);

/* conch_cli_lineedit_add - keep @line (copied) in the history; empty lines and a repeat of
 * the last one are not kept. */
void conch_cli_lineedit_add(struct conch_cli_lineedit *le, const char *line);

/* conch_cli_lineedit_done - free the history. */
void conch_cli_lineedit_done(struct conch_cli_lineedit *le);

#endif
