#!/usr/bin/env bash
# run.sh - build the rpc fuzz target with libFuzzer + ASan + UBSan and run it for $1 seconds
# (default 60), starting from tests/fuzz/corpus_rpc. New inputs go to build-fuzz/corpus_rpc,
# a crash to build-fuzz/crash-*; the seed corpus is left untouched. Exits non-zero on a finding.
set -euo pipefail
cd "$(dirname "$0")/../.."

secs=${1:-60}
out=build-fuzz
mkdir -p "$out/corpus_rpc"

cc=${CC_FUZZ:-clang}
if ! command -v "$cc" >/dev/null; then
  echo "run.sh: $cc not found (scripts/bootstrap installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi

# Only the sources the target needs, all instrumented; jansson is the system library.
"$cc" -g -O1 -std=gnu17 -D_GNU_SOURCE -Isrc \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Wall -Wextra -Werror -Wno-unused-parameter \
  tests/fuzz/fuzz_rpc.c src/rpc/framer.c src/rpc/message.c src/rpc/dispatch.c src/core/error.c src/core/utf8.c src/core/budget.c \
  $(pkg-config --cflags --libs jansson) -o "$out/fuzz_rpc"

# -max_len well above the 64-byte cap the target can pick, so oversize lines get exercised.
exec "$out/fuzz_rpc" -max_total_time="$secs" -max_len=8192 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -dict=tests/fuzz/rpc.dict -artifact_prefix="$out/" "$out/corpus_rpc" tests/fuzz/corpus_rpc
