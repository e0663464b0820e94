#!/usr/bin/env bash
# Builds CRIU 4.1.1 from Debian's source package and installs it as /usr/local/sbin/criu, as
# root on Debian 12 (DESIGN.md section 19: Debian 12's criu 3.17 fails on these kernels with
# "vdso: Unexpected rt vDSO area bounds", fixed in 4.1). Skips everything when
# /usr/local/sbin/criu already is 4.1.1. Exits non-zero, with the reason, when it fails.
#   scripts/install-criu.sh
#
# The source comes from Debian 13 ("trixie") through a deb-src entry that reuses the URI of the
# machine's own Debian apt source. The entry lives in a private apt state under the work
# directory, so the system's sources, lists and caches are left as they are. The .dsc download
# fails there but the orig tarball arrives; it is checked against its sha256 and kept in
# $CLAN_CRIU_CACHE (default /var/cache/clan) so a rebuild does not fetch it again.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive

VERSION=4.1.1
TARBALL=criu_${VERSION}.orig.tar.xz
SHA256=f80a66cb3726bb2116266d4759ce3bcbfab7abdb6b6d430bf20dd41911717afe
DEST=/usr/local/sbin/criu
CACHE=${CLAN_CRIU_CACHE:-/var/cache/clan}
BUILD_DEPS=(build-essential make pkg-config python3 libprotobuf-dev libprotobuf-c-dev
  protobuf-c-compiler protobuf-compiler python3-protobuf libnl-3-dev libnet1-dev libcap-dev
  libbsd-dev libaio-dev libgnutls28-dev uuid-dev libnftables-dev)

say() { echo "install-criu: $*" >&2; }
die() { say "error: $*"; exit 1; }

[ "$(id -u)" -eq 0 ] || die "run as root"

if [ -x "$DEST" ] && "$DEST" --version 2>/dev/null | grep -q "Version: $VERSION\$"; then
  say "CRIU $VERSION already installed at $DEST"
  exit 0
fi

# Build dependencies, from Debian 12 itself.
missing=()
for p in "${BUILD_DEPS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  say "installing build dependencies: ${missing[*]}"
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi

work=$(mktemp -d /var/tmp/clan-criu.XXXXXX)
trap 'rm -rf "$work"' EXIT
mkdir -p "$CACHE"

have_tarball() { [ -s "$CACHE/$TARBALL" ] && echo "$SHA256  $CACHE/$TARBALL" | sha256sum -c --status; }

if ! have_tarball; then
  # The URI of the machine's Debian source for its own release (e.g. http://deb.debian.org/debian/).
  codename=$(. /etc/os-release && echo "${VERSION_CODENAME:-bookworm}")
  uri=$(apt-get indextargets --format '$(RELEASE) $(REPO_URI)' 2>/dev/null |
    awk -v r="$codename" '$1 == r { print $2; exit }')
  if [ -z "$uri" ]; then
    # Fall back to the first URI in the one-line or deb822 source files.
    uri=$(cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list /etc/apt/sources.list.d/*.sources 2>/dev/null |
      grep -v '^\s*#' | grep -oE 'https?://[^ ]*/debian/?( |$)' | grep -v security | head -n1 | tr -d ' ')
  fi
  [ -n "$uri" ] || die "no Debian apt source found to take the URI from"
  keyring=/usr/share/keyrings/debian-archive-keyring.gpg
  [ -s "$keyring" ] || die "$keyring is missing (apt-get install debian-archive-keyring)"
  say "fetching the CRIU $VERSION source from $uri (trixie)"

  apt_dir=$work/apt
  mkdir -p "$apt_dir/lists/partial" "$apt_dir/cache/archives/partial" "$work/src"
  echo "deb-src [signed-by=$keyring] $uri trixie main" > "$apt_dir/sources.list"
  apt_opts=(-o "Dir::Etc::SourceList=$apt_dir/sources.list" -o "Dir::Etc::SourceParts=$apt_dir/none"
    -o "Dir::State::Lists=$apt_dir/lists" -o "Dir::Cache=$apt_dir/cache"
    -o "APT::Sandbox::User=root")
  apt-get "${apt_opts[@]}" update -qq >"$work/apt.log" 2>&1 ||
    { cat "$work/apt.log" >&2; die "apt-get update of the trixie deb-src entry failed"; }
  # Expected to fail on the .dsc and the Debian diff; only the orig tarball is needed.
  (cd "$work/src" && apt-get "${apt_opts[@]}" source --download-only criu >>"$work/apt.log" 2>&1) || true
  if [ ! -s "$work/src/$TARBALL" ]; then
    cat "$work/apt.log" >&2
    die "apt-get source did not deliver $TARBALL"
  fi
  echo "$SHA256  $work/src/$TARBALL" | sha256sum -c --status ||
    die "$TARBALL has the wrong sha256 ($(sha256sum "$work/src/$TARBALL" | cut -d' ' -f1))"
  mv "$work/src/$TARBALL" "$CACHE/$TARBALL"
fi

say "building CRIU $VERSION"
tar -xJf "$CACHE/$TARBALL" -C "$work"
srcdir=$(find "$work" -maxdepth 1 -type d -name 'criu-*' | head -n1)
[ -n "$srcdir" ] || die "$TARBALL holds no criu-* directory"
if ! make -C "$srcdir" -j2 criu >"$work/build.log" 2>&1; then
  tail -n 40 "$work/build.log" >&2
  die "make criu failed"
fi
install -D -m 0755 "$srcdir/criu/criu" "$DEST"
"$DEST" --version | grep -q "Version: $VERSION\$" || die "$DEST does not report version $VERSION"

if out=$("$DEST" check 2>&1); then
  say "installed $DEST: $(echo "$out" | tail -n1)"
else
  echo "$out" >&2
  die "$DEST is installed but 'criu check' fails on this kernel"
fi
