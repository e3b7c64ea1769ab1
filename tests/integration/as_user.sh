#!/usr/bin/env bash
# as_user.sh CONCH_BIN [PYTEST ARGS...] - run the integration suite as the unprivileged user
# `conchtest`, to check conch's unprivileged mode. Creates the user if needed; if the user
# cannot reach the binary or the tests where they are, copies both to a fresh directory
# under /tmp owned by conchtest. Exits with pytest's status. Run as root.
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 CONCH_BIN [PYTEST ARGS...]" >&2
    exit 2
fi
bin=$(readlink -f "$1")
shift
here=$(cd "$(dirname "$0")" && pwd)
user=conchtest
# pytest comes from Debian's python3-pytest: a pyenv python3 on PATH may not have it
py=/usr/bin/python3
[ -x "$py" ] || py=python3

if [ "$(id -u)" -ne 0 ]; then
    echo "$0: must run as root (it creates and switches to user $user)" >&2
    exit 2
fi
[ -x "$bin" ] || { echo "$0: $bin is not an executable" >&2; exit 2; }
id -u "$user" >/dev/null 2>&1 || useradd -m -s /bin/bash "$user"

can() { su "$user" -s /bin/bash -c "$1" >/dev/null 2>&1; }
tests=$here
if ! can "test -x '$bin' && test -r '$here/conftest.py' && test -x '$here'"; then
    dir=$(mktemp -d /tmp/conch-it.XXXXXX)
    mkdir "$dir/bin"
    cp "$bin" "$dir/bin/conch"
    # the remote transports (TLS), found next to the binary
    [ ! -x "$(dirname "$bin")/conch-remote" ] || cp "$(dirname "$bin")/conch-remote" "$dir/bin/"
    # the in-sandbox tool-bridge clients, found next to the binary (build/ptc)
    [ ! -d "$(dirname "$bin")/ptc" ] || cp -r "$(dirname "$bin")/ptc" "$dir/bin/ptc"
    cp -r "$here" "$dir/integration"
    rm -rf "$dir/integration/__pycache__"
    chown -R "$user:" "$dir"
    chmod 755 "$dir"
    trap 'rm -rf "$dir"' EXIT
    bin=$dir/bin/conch
    tests=$dir/integration
fi

set +e
# quote for the inner shell
q() { [ $# -eq 0 ] || printf '%q ' "$@"; }
su "$user" -s /bin/bash -c "cd /tmp && PYTHONDONTWRITEBYTECODE=1 CONCH_BIN=$(q "$bin") \
    $(q "$py") -m pytest -q -p no:cacheprovider $(q "$tests") $(q "$@")"
status=$?
exit $status
