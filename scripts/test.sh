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
log=$(mktemp)
set +e
cargo test --workspace 2>&1 | tee "$log"
rc=${PIPESTATUS[0]}
set -e
# One closing line with the totals of every test binary (unit, end-to-end and doc tests).
awk '/^test result:/ { for (i = 1; i < NF; i++) { if ($(i+1) == "passed;") p += $i; if ($(i+1) == "failed;") f += $i } }
     END { printf "tests: %d passed, %d failed\n", p, f }' "$log"
rm -f "$log"
exit "$rc"
