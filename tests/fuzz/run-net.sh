#!/usr/bin/env bash
# run-net.sh - build the network proxy's parser fuzz target (request heads and rules) with
# libFuzzer + ASan + UBSan and run it for $1 seconds (default 60). Findings go to build-fuzz/.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${1:-60}
out=build-fuzz
mkdir -p "$out/corpus_net"
cc=${CC_FUZZ:-clang}
"$cc" -g -O1 -std=gnu17 -D_GNU_SOURCE -Isrc \
  -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined \
  -Wall -Wextra -Werror -Wno-unused-parameter \
  tests/fuzz/fuzz_net.c src/net/http.c src/net/policy.c src/core/error.c \
  $(pkg-config --cflags libuv) -o "$out/fuzz_net"
printf 'CONNECT a.example.com:443 HTTP/1.1\r\nHost: x\r\n\r\n' > "$out/corpus_net/seed1"
printf 'GET http://[::1]:8080/p?q HTTP/1.0\r\n\r\n' > "$out/corpus_net/seed2"
printf '*.example.com:8443' > "$out/corpus_net/seed3"
exec "$out/fuzz_net" -max_total_time="$secs" -max_len=4096 -timeout=10 -rss_limit_mb=2048 \
  -print_final_stats=1 -artifact_prefix="$out/" "$out/corpus_net"
