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

/* Keys read ahead (conch_cli_lineedit_take_keys) and not yet edited. */
#define CONCH_CLI_LINEEDIT_AHEAD 4096

struct conch_cli_lineedit {
    int in, out; /* the terminal's fds (borrowed) */
    bool tty;    /* @in is a terminal: raw-mode editing */
    FILE *plain; /* lines read as they come when not a terminal (borrowed) */
    char **hist; /* oldest first */
    size_t n_hist;
    bool raw;             /* the terminal is in raw mode (since the first line read) */
    struct termios saved; /* its mode before */
    unsigned char ahead[CONCH_CLI_LINEEDIT_AHEAD];
    size_t n_ahead;
};

/* conch_cli_lineedit_init - an editor reading @in (@plain: the same input as a FILE, read
 * when @in is not a terminal) and echoing to @out. */
void conch_cli_lineedit_init(struct conch_cli_lineedit *le, int in, int out, FILE *plain);

/*
 * conch_cli_lineedit_read - show @prompt and read one line, edited on a terminal. The
 * terminal goes to raw mode at the first line and stays so until conch_cli_lineedit_cooked
 * (or _done): keys typed between lines (while a cell runs) wait as typed, and neither the
 * terminal's line discipline nor a switch of modes eats one (in cooked mode a Ctrl-D became
 * a NUL, a Ctrl-C flushed what was typed). Returns 1 with *@ret_line (a new string, without
 * its newline), 0 at the end of input (Ctrl-D on an empty line), -EINTR when Ctrl-C
 * discarded the line, or -errno.
 */
int conch_cli_lineedit_read(struct conch_cli_lineedit *le, const char *prompt, char **ret_line);

/* conch_cli_lineedit_add - keep @line (copied) in the history; empty lines and a repeat of
 * the last one are not kept. */
void conch_cli_lineedit_add(struct conch_cli_lineedit *le, const char *line);

/*
 * conch_cli_lineedit_take_keys - between lines: read the keys typed so far, without waiting,
 * and keep them for the next line. Returns 1 when one was Ctrl-C (it and the keys before it
 * are dropped, as a terminal drops them at an interrupt), 0 if not (or not a terminal), or
 * -errno. Call it when @in is readable: the caller's way to see a Ctrl-C in raw mode.
 */
int conch_cli_lineedit_take_keys(struct conch_cli_lineedit *le);

/* conch_cli_lineedit_cooked - the terminal back in the mode it had before the first line. */
void conch_cli_lineedit_cooked(struct conch_cli_lineedit *le);

/* conch_cli_lineedit_done - the terminal back in its mode (conch_cli_lineedit_cooked), the
 * history freed. */
void conch_cli_lineedit_done(struct conch_cli_lineedit *le);

#endif
