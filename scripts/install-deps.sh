#!/usr/bin/env bash
# Installs what clan needs to build, run and test on Debian 12, as root. Idempotent and quick
# when everything is present.
#   scripts/install-deps.sh            build + run + test dependencies
#   scripts/install-deps.sh --bench    also what bench/run compares against (Slurm, hyperfine)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cd "$(dirname "$0")/.."

want_bench=0
for a in "$@"; do
  case "$a" in
    --bench) want_bench=1 ;;
    *) echo "usage: $0 [--bench]" >&2; exit 2 ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (clan's local clusters need root for namespaces and cgroups)" >&2
  exit 1
fi

pkgs=(build-essential pkg-config git procps psmisc iproute2 util-linux bsdutils fuse3 libfuse3-dev tmux python3 curl ca-certificates passwd)
[ "$want_bench" = 1 ] && pkgs+=(slurmctld slurmd slurm-client munge hyperfine)

missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Rust: the toolchain pinned in rust-toolchain.toml, through rustup.
export PATH="$HOME/.cargo/bin:$PATH"
if ! command -v cargo >/dev/null 2>&1; then
  if ! command -v rustup >/dev/null 2>&1; then
    echo "install-deps: installing rustup from crates.io is not possible offline;" >&2
    echo "  install Rust 1.95 with rustup (https://rustup.rs) and re-run" >&2
    exit 1
  fi
fi
rustup component list --installed 2>/dev/null | grep -q rustfmt || rustup component add rustfmt clippy >/dev/null 2>&1 || true

echo "install-deps: ok"
