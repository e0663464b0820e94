#!/usr/bin/env bash
# Installs what clan needs to build, run and test on Debian 12, as root. Idempotent, and takes
# well under a second when everything is present (apt-get update runs only when a package is
# missing).
#   scripts/install-deps.sh            build + run + test dependencies (and checks Rust)
#   scripts/install-deps.sh --slurm    also Slurm 22.05 and munge (bench/slurm/start.sh)
#   scripts/install-deps.sh --bench    also what bench/run compares against (Slurm, hyperfine)
#   scripts/install-deps.sh --criu     also CRIU 4.1.1 built from Debian's source
#                                      (scripts/install-criu.sh; a failure only warns)
#   scripts/install-deps.sh --no-fuse-uring
#                                      leaves the kernel's FUSE over io_uring switch alone
#                                      (by default it is turned on where the kernel has it)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
cd "$(dirname "$0")/.."

usage() { echo "usage: $0 [--slurm] [--bench] [--criu] [--no-fuse-uring]" >&2; exit 2; }
want_slurm=0 want_bench=0 want_criu=0 want_uring=1
for a in "$@"; do
  case "$a" in
    --slurm) want_slurm=1 ;;
    --bench) want_bench=1 want_slurm=1 ;;
    --criu) want_criu=1 ;;
    --no-fuse-uring) want_uring=0 ;;
    -h|--help) usage ;;
    *) usage ;;
  esac
done

if [ "$(id -u)" -ne 0 ]; then
  echo "install-deps: run as root (clan's local clusters need root for namespaces and cgroups)" >&2
  exit 1
fi

pkgs=(build-essential pkg-config git procps psmisc iproute2 util-linux bsdutils fuse3
  libfuse3-dev tmux python3 curl ca-certificates passwd)
[ "$want_slurm" = 1 ] && pkgs+=(slurmctld slurmd slurm-client munge)
[ "$want_bench" = 1 ] && pkgs+=(hyperfine)

# One dpkg-query for all of them; a package dpkg does not know is missing too.
installed=$(dpkg-query -W -f='${Package} ${Status}\n' "${pkgs[@]}" 2>/dev/null |
  awk '$NF == "installed" && $(NF-1) == "ok" { sub(/:.*/, "", $1); print $1 }' || true)
missing=()
for p in "${pkgs[@]}"; do
  grep -qxF "$p" <<<"$installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  echo "install-deps: installing ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

# Rust: the toolchain pinned in rust-toolchain.toml, through rustup in ~/.cargo/bin.
caller_path=$PATH
export PATH="$HOME/.cargo/bin:$PATH"
channel=$(sed -n 's/^channel *= *"\(.*\)"/\1/p' rust-toolchain.toml 2>/dev/null | head -n1)
channel=${channel:-1.95.0}
if ! command -v cargo >/dev/null 2>&1; then
  if ! command -v rustup >/dev/null 2>&1; then
    # Debian 12 has no rustup package (Debian 13 has); its own rustc 1.63 is too old for clan.
    has_rustup() { apt-cache policy rustup 2>/dev/null | grep -q 'Candidate: [^(]'; }
    has_rustup || apt-get update -qq
    if has_rustup; then
      echo "install-deps: installing rustup from Debian"
      apt-get install -y -qq --no-install-recommends rustup >/dev/null
    else
      echo "install-deps: error: no cargo on PATH or in ~/.cargo/bin, and this Debian has no rustup package." >&2
      echo "  Install Rust $channel with rustup (https://rustup.rs, as root into ~/.cargo) and re-run." >&2
      exit 1
    fi
  fi
  if ! rustup toolchain install "$channel" --profile minimal -c rustfmt -c clippy; then
    echo "install-deps: error: rustup could not install Rust $channel (its download server may be" >&2
    echo "  out of reach from here); install Rust $channel by other means and re-run." >&2
    exit 1
  fi
fi
if command -v rustup >/dev/null 2>&1; then
  if ! rustup toolchain list 2>/dev/null | grep -q "^$channel"; then
    rustup toolchain install "$channel" --profile minimal -c rustfmt -c clippy >/dev/null 2>&1 || {
      echo "install-deps: error: Rust $channel (rust-toolchain.toml) is not installed and rustup could not fetch it" >&2
      exit 1
    }
  fi
  # rustup answers for the toolchain that rust-toolchain.toml selects, since we are in the repo.
  comps=$(rustup component list --installed 2>/dev/null || true)
  if ! grep -q '^rustfmt' <<<"$comps" || ! grep -q '^clippy' <<<"$comps"; then
    rustup component add rustfmt clippy >/dev/null 2>&1 ||
      echo "install-deps: warning: could not add rustfmt and clippy to Rust $channel" >&2
  fi
  # The deployed CLI is linked against musl (scripts/build-release.sh); without the target
  # it is linked against glibc, which works and starts 0.3 ms slower.
  if [ "$(uname -m)" = x86_64 ] && ! rustup target list --installed 2>/dev/null | grep -qx x86_64-unknown-linux-musl; then
    timeout 120 rustup target add x86_64-unknown-linux-musl >/dev/null 2>&1 ||
      echo "install-deps: warning: could not add Rust's x86_64-unknown-linux-musl target; clan's CLI will link against glibc" >&2
  fi
fi
case ":$caller_path:" in
  *":$HOME/.cargo/bin:"*) ;;
  *) echo "install-deps: Rust is in ~/.cargo/bin; put it on your PATH with:"
     echo "  export PATH=\"\$HOME/.cargo/bin:\$PATH\"" ;;
esac

# FUSE over io_uring (Linux 6.14+): the cluster /proc view then answers each read on the
# reader's own CPU instead of waking a server thread on another (docs/proc.md, "Served over
# io_uring"). The kernel offers it only while this switch is on; it is read at each mount and
# touches no FUSE file system that does not ask for io_uring. Not kept across reboots: every
# entry point (scripts/demo.sh, scripts/test.sh) runs this script first.
uring=/sys/module/fuse/parameters/enable_uring
if [ "$want_uring" = 1 ]; then
  [ -e /sys/module/fuse ] || modprobe fuse 2>/dev/null || true
  if [ ! -e "$uring" ]; then
    echo "install-deps: this kernel has no FUSE over io_uring ($uring); the cluster /proc view will use /dev/fuse"
  elif [ "$(cat "$uring")" != Y ]; then
    if { echo Y > "$uring"; } 2>/dev/null; then
      echo "install-deps: turned on FUSE over io_uring ($uring)"
    else
      echo "install-deps: warning: could not turn on FUSE over io_uring ($uring); the cluster /proc view will use /dev/fuse" >&2
    fi
  fi
fi

if [ "$want_criu" = 1 ]; then
  # Nothing needs CRIU yet (migration will): a failure here only warns.
  if ! scripts/install-criu.sh; then
    echo "install-deps: WARNING: CRIU 4.1.1 is not installed or does not pass 'criu check' (see above);" \
      "going on without it, since nothing needs it yet" >&2
  fi
fi

echo "install-deps: ok"
