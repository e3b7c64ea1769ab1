#!/usr/bin/env bash
# as_user.sh CONCH_BIN - run the MCP SDK tests (node --test) as the unprivileged user
# `conchtest`, to check `conch mcp` in conch's unprivileged mode. Copies the binary and this
# directory (node_modules included: run `npm ci` first) to a fresh directory under /tmp owned
# by conchtest. Run as root.
set -euo pipefail
[ $# -eq 1 ] || { echo "usage: $0 CONCH_BIN" >&2; exit 2; }
bin=$(readlink -f "$1")
here=$(cd "$(dirname "$0")" && pwd)
user=conchtest
[ "$(id -u)" -eq 0 ] || { echo "$0: must run as root" >&2; exit 2; }
[ -d "$here/node_modules" ] || { echo "$0: run 'npm ci' in $here first" >&2; exit 2; }
id -u "$user" >/dev/null 2>&1 || useradd -m -s /bin/bash "$user"
dir=$(mktemp -d /tmp/conch-mcp-it.XXXXXX)
trap 'rm -rf "$dir"' EXIT
mkdir "$dir/bin"
cp "$bin" "$dir/bin/conch"
cp -r "$here" "$dir/mcp"
chown -R "$user:" "$dir"
chmod 755 "$dir"
home=$(getent passwd "$user" | cut -d: -f6)
# A login-like environment: the user's own HOME and state dir, no root's XDG_RUNTIME_DIR.
su "$user" -s /bin/bash -c "cd '$dir/mcp' && env -u XDG_RUNTIME_DIR -u XDG_STATE_HOME HOME='$home' CONCH_BIN='$dir/bin/conch' node --test"
