#!/usr/bin/env bash
# Installs what is missing and runs every check and test of clan. Run as root on Debian 12.
#   scripts/test.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
echo "== fmt";    cargo fmt --check
echo "== build";  cargo build --workspace --bins --all-targets
echo "== clippy"; cargo clippy --workspace --all-targets -- -D warnings
echo "== doc";    RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --quiet
echo "== test"
cargo test --workspace
