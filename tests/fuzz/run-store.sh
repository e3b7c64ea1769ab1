#!/usr/bin/env bash
# run-store.sh - build the store names' and paths' fuzz target with libFuzzer + ASan + UBSan
# and run it for $1 seconds (default 60). Findings go to build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}
out=build-fuzz
mkdir -p "$out/corpus_store"
cc=${CC_FUZZ:-clang}
"$cc" -g -O1 -std=gnu17 -D_GNU_SOURCE -Isrc \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Wall -Wextra -Werror -Wno-unused-parameter \
  tests/fuzz/fuzz_store.c src/workspace/store-db.c src/core/error.c \
  $(pkg-config --cflags --libs jansson sqlite3) -o "$out/fuzz_store"
printf '/a//b/./c' > "$out/corpus_store/seed1"
printf 'memories' > "$out/corpus_store/seed2"
printf 'a/../../etc/passwd' > "$out/corpus_store/seed3"
exec "$out/fuzz_store" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus_store"
