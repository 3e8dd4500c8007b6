#!/usr/bin/env bash
# Builds wc.wasm with Debian's clang and wasi-libc
# (apt-get install clang lld wasi-libc libclang-rt-dev-wasm32).
set -euo pipefail
out=${1:-wc.wasm}
exec clang --target=wasm32-wasi --sysroot=/usr -O2 -Wall -Werror -o "$out" "$(dirname "$0")/wc.c"
