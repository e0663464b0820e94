#!/usr/bin/env bash
# Builds clan's release binaries into target/release, with the `clan` CLI as deployed
# (docs/deployment.md): linked statically against musl when Rust has that target (no dynamic
# loader, no glibc start-up probing of the CPU, which costs 5 us per cpuid in a VM), else
# statically against glibc; either at a fixed address (no relocations to apply at start)
# and whole-program optimised (Cargo.toml's `cli` profile). Every `clan run` pays the CLI's
# start: it is part of each remote start's latency.
#   scripts/build-release.sh [extra cargo args for the workspace build]
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"
cargo build --release --workspace --bins -q "$@"
musl=x86_64-unknown-linux-musl
if [ "$(uname -m)" = x86_64 ] && [ -d "$(rustc --print sysroot)/lib/rustlib/$musl/lib" ]; then
  cargo rustc --profile cli -q -p clan-cli --bin clan --target "$musl" -- -C relocation-model=static
  install -m 755 "target/$musl/cli/clan" target/release/clan
else
  echo "build-release: Rust has no $musl target (rustup target add $musl);" \
    "the CLI is linked statically against glibc instead (0.3 ms slower to start)" >&2
  cargo rustc --profile cli -q -p clan-cli --bin clan -- -C target-feature=+crt-static -C relocation-model=static
  install -m 755 target/cli/clan target/release/clan
fi
