#!/usr/bin/env bash
# run-strip.sh - build the JS stripping fuzz target (src/js/js-strip.c) with libFuzzer + ASan +
# UBSan and run it for $1 seconds (default 60), seeded with tests/unit/ts-corpus (the unit
# tests' TypeScript). The TypeScript grammar (third-party, from .deps/js: meson setup fetches
# it) is compiled without instrumentation. New inputs go to build-fuzz/corpus_strip, a crash
# to build-fuzz/crash-*.
set -euo pipefail
cd "$(dirname "$0")/../.."

secs=${1:-60}
out=build-fuzz
mkdir -p "$out/corpus_strip"
scripts/fetch-js-deps >/dev/null
ts=.deps/js/tree-sitter-typescript-0.23.2/package/typescript/src
qjs=.deps/js/qjsc-0.3.0/package/deps/quickjs_2021_03_27

cc=${CC_FUZZ:-clang}
if ! command -v "$cc" >/dev/null; then
  echo "run-strip.sh: $cc not found (scripts/bootstrap installs clang and libclang-rt-14-dev)" >&2
  exit 1
fi

if [ ! -f "$out/tsts-parser.o" ] || [ "$ts/parser.c" -nt "$out/tsts-parser.o" ]; then
  "$cc" -O1 -w -c -I"$ts" "$ts/parser.c" -o "$out/tsts-parser.o"
  "$cc" -O1 -w -c -I"$ts" "$ts/scanner.c" -o "$out/tsts-scanner.o"
fi
"$cc" -g -O1 -std=gnu17 -D_GNU_SOURCE -Isrc -isystem "$qjs" \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Wall -Wextra -Werror -Wno-unused-parameter \
  tests/fuzz/fuzz_strip.c src/js/js-strip.c src/core/strbuf.c src/core/error.c \
  "$out/tsts-parser.o" "$out/tsts-scanner.o" \
  $(pkg-config --cflags --libs tree-sitter jansson) -o "$out/fuzz_strip"

exec "$out/fuzz_strip" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus_strip" tests/unit/ts-corpus
