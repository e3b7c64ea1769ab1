/* cli.h - the subcommands of the `conch` binary, one function per verb. Each returns the
 * process exit status. Only cli/ turns a conch_err into an exit status. */
#ifndef CONCH_CLI_CLI_H
#define CONCH_CLI_CLI_H

/* Exit statuses of `conch run` besides the command's own (documented in README.md). */
#define CONCH_EXIT_TIMEOUT 124
#define CONCH_EXIT_INFRA 125
#define CONCH_EXIT_USAGE 2

int conch_cli_run(int argc, char **argv);
int conch_cli_doctor(int argc, char **argv);
int conch_cli_serve(int argc, char **argv);
int conch_cli_gc(int argc, char **argv);
int conch_cli_ps(int argc, char **argv);
int conch_cli_exec(int argc, char **argv);
int conch_cli_rm(int argc, char **argv);
int conch_cli_mcp(int argc, char **argv);
int conch_cli_shell(int argc, char **argv);
int conch_cli_attach(int argc, char **argv);
int conch_cli_sessions(int argc, char **argv);
int conch_cli_create(int argc, char **argv);
int conch_cli_changes(int argc, char **argv);
int conch_cli_diff(int argc, char **argv);
int conch_cli_commit(int argc, char **argv);
int conch_cli_discard(int argc, char **argv);
int conch_cli_cp(int argc, char **argv);

#endif
