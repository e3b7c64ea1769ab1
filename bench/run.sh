#!/usr/bin/env bash
# bench/run.sh - start-up cost of `conch run -- /bin/true` against bubblewrap with
# comparable isolation and against plain `bash -c true`, measured with hyperfine in one
# run: building its own sandbox (--no-daemon), and borrowing one from a running daemon's
# pool; prints medians, ratios and whether conch meets its goals (pool <= 0.5x bubblewrap,
# standalone <= 1.0x).
# See bench/README.md.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CONCH_BIN="${CONCH_BIN:-$ROOT/build/conch}"
RUNS="${BENCH_RUNS:-100}"
WARMUP="${BENCH_WARMUP:-5}"
SKIP_CONCH="${BENCH_SKIP_CONCH:-0}"     # 1: only the reference rows (bwrap, bash)
REQUIRE_GOAL="${BENCH_REQUIRE_GOAL:-0}" # 1: exit 2 when the goal is not met
JSON_OUT="${BENCH_JSON:-}"              # copy hyperfine's JSON here if set

die() {
    echo "bench: error: $*" >&2
    exit 1
}

for tool in hyperfine bwrap python3 bash; do
    command -v "$tool" >/dev/null 2>&1 || die "'$tool' not found in PATH"
done
[[ "$RUNS" =~ ^[1-9][0-9]*$ ]] || die "BENCH_RUNS must be a positive integer, got '$RUNS'"
[[ "$WARMUP" =~ ^[0-9]+$ ]] || die "BENCH_WARMUP must be a non-negative integer, got '$WARMUP'"

TMP="$(mktemp -d /tmp/conch-bench-XXXXXX)"
trap 'rm -rf "$TMP"' EXIT
# The workspace: a small directory like a tiny project, so a mode that copies or layers it
# pays for something real (but not much: this measures start-up, not I/O).
WS="$TMP/ws"
mkdir -p "$WS/src" "$WS/docs"
printf 'print("hello")\n' >"$WS/src/main.py"
printf '# bench workspace\n' >"$WS/README.md"
printf 'a,b\n1,2\n' >"$WS/docs/data.csv"
head -c 65536 /dev/zero >"$WS/blob.bin"

# Each row is declared once as an argv. It is checked by running that argv (preflight), and
# timed by hyperfine with --shell=none (no intermediate shell, so only the command itself
# is timed) from a command line that hyperfine splits like a shell: every word is quoted.
BWRAP=(bwrap --unshare-all --die-with-parent --new-session
    --ro-bind /usr /usr --symlink usr/bin /bin --symlink usr/lib /lib
    --symlink usr/lib64 /lib64 --symlink usr/sbin /sbin --ro-bind /etc /etc
    --tmpfs /tmp --proc /proc --dev /dev --bind "$WS" /workspace --chdir /workspace)

names=()
cmds=()
add() { # name argv...
    local name="$1" line="" w
    shift
    for w in "$@"; do
        [[ "$w" != *"'"* ]] || die "cannot quote '$w' for hyperfine"
        line+="${line:+ }'$w'"
    done
    names+=("$name")
    cmds+=("$line")
}

# preflight - run a row once before timing it, so a broken row fails here with its own
# output rather than deep inside hyperfine. Prints the command's output.
preflight() { # name argv...
    local name="$1" out rc
    shift
    set +e
    out="$(timeout 60 "$@" 2>&1)"
    rc=$?
    set -e
    if [[ $rc -ne 0 ]]; then
        echo "bench: error: the '$name' row fails (exit $rc): $*" >&2
        printf '%s\n' "$out" | head -20 | sed 's/^/  | /' >&2
        exit 1
    fi
    printf '%s' "$out"
}

# Exit status 0 is not enough: the command must really have run inside, so each sandbox
# is also asked to echo a random marker, which must come back.
marker="conch-bench-$$-$RANDOM"
check_runs() { # name argv-prefix... (the command is appended)
    local name="$1" out
    shift
    out="$(preflight "$name" "$@" /bin/echo "$marker")"
    if ! grep -qF "$marker" <<<"$out"; then
        echo "bench: error: the '$name' row exits 0 but did not run the command:" >&2
        echo "  '$* /bin/echo $marker' did not print '$marker'" >&2
        [[ "$name" != conch* ]] || echo "  (is 'conch run' implemented yet?)" >&2
        exit 1
    fi
}

if [[ "$SKIP_CONCH" != 1 ]]; then
    [[ -x "$CONCH_BIN" ]] ||
        die "conch binary '$CONCH_BIN' not found or not executable (build it: meson setup build && ninja -C build, or set CONCH_BIN)"
    # A daemon of this user, as `conch run` finds one when `conch serve` runs: its pool lends
    # `conch run` a sandbox built ahead of need (the "pool" rows); the other rows build their
    # own (--no-daemon).
    "$CONCH_BIN" serve --socket "$TMP/conch.sock" --state-dir "$TMP/state" >"$TMP/serve.log" 2>&1 &
    SERVE_PID=$!
    trap 'kill "$SERVE_PID" 2>/dev/null; wait "$SERVE_PID" 2>/dev/null; rm -rf "$TMP"' EXIT
    for _ in $(seq 100); do [[ -S "$TMP/conch.sock" ]] && break; sleep 0.05; done
    [[ -S "$TMP/conch.sock" ]] || die "conch serve did not start: $(cat "$TMP/serve.log")"
    sleep 0.5 # the pool fills in the background
    for where in own pool; do
        for mode in default ro; do
            conch=("$CONCH_BIN" run --workspace "$WS")
            label="conch"
            if [[ "$where" == own ]]; then
                conch+=(--no-daemon)
            else
                conch+=(--socket "$TMP/conch.sock")
                label="conch pool"
            fi
            if [[ "$mode" != default ]]; then
                conch+=(--mode "$mode")
                label="$label --mode $mode"
            fi
            preflight "$label" "${conch[@]}" -- /bin/true >/dev/null
            check_runs "$label" "${conch[@]}" --
            add "$label" "${conch[@]}" -- /bin/true
        done
    done
fi
preflight bwrap "${BWRAP[@]}" -- /bin/true >/dev/null
check_runs bwrap "${BWRAP[@]}" --
add bwrap "${BWRAP[@]}" -- /bin/true
preflight "bash -c true" bash -c true >/dev/null
add "bash -c true" bash -c true

echo "kernel $(uname -r), $(nproc) CPUs, $(hyperfine --version), $(bwrap --version)"
echo "runs: $RUNS (+$WARMUP warmup) per row; workspace: $WS"
echo

args=(--shell=none --warmup "$WARMUP" --runs "$RUNS" --export-json "$TMP/results.json" --style basic)
for i in "${!names[@]}"; do
    args+=(--command-name "${names[$i]}" "${cmds[$i]}")
done
hyperfine "${args[@]}" >"$TMP/hyperfine.log" 2>&1 || {
    echo "bench: error: hyperfine failed:" >&2
    sed 's/^/  | /' "$TMP/hyperfine.log" >&2
    exit 1
}
[[ -z "$JSON_OUT" ]] || cp "$TMP/results.json" "$JSON_OUT"

python3 - "$TMP/results.json" "$REQUIRE_GOAL" <<'PY'
import json
import sys

results = json.load(open(sys.argv[1]))["results"]
require_goal = sys.argv[2] == "1"
med = {r["command"]: r["median"] * 1000.0 for r in results}
bwrap, bash = med["bwrap"], med["bash -c true"]

print(f"{'name':<18} {'median ms':>10} {'min ms':>8} {'max ms':>8} {'vs bwrap':>9} {'vs bash':>8}")
for r in results:
    m = r["median"] * 1000.0
    print(f"{r['command']:<18} {m:>10.3f} {r['min'] * 1000:>8.3f} {r['max'] * 1000:>8.3f} "
          f"{m / bwrap:>8.2f}x {m / bash:>7.2f}x")
print()

pool = {n: m for n, m in med.items() if n.startswith("conch pool")}
own = {n: m for n, m in med.items() if n.startswith("conch") and n not in pool}
if not pool and not own:
    print("goals: NOT EVALUATED (conch rows skipped)")
    sys.exit(0)
# Each goal must hold for every row it covers: report the slowest one. With a daemon running
# `conch run` borrows from its pool (goal 0.5x); standalone it should at least match.
met_all = True
for rows, limit, what in ((pool, 0.5, "conch run with a daemon's pool"),
                          (own, 1.0, "conch run standalone (--no-daemon)")):
    worst = max(rows, key=rows.get)
    ratio = rows[worst] / bwrap
    met = ratio <= limit
    met_all = met_all and met
    print(f"goal: {what} <= {limit}x bubblewrap: {'MET' if met else 'NOT MET'} "
          f"(slowest row '{worst}': {ratio:.2f}x)")
sys.exit(2 if require_goal and not met_all else 0)
PY
