#!/usr/bin/env bash
# Stops the local Slurm started by start.sh (and munged, if start.sh started it).
set -uo pipefail
D=${1:-/tmp/clan-slurm}
for f in slurmd slurmctld; do
  [ -f "$D/$f.pid" ] && kill "$(cat "$D/$f.pid")" 2>/dev/null
done
pkill -f "slurmd -f $D/slurm.conf" 2>/dev/null
pkill -f "slurmctld -f $D/slurm.conf" 2>/dev/null
if [ -f "$D/started-munged" ]; then pkill -x munged; rm -f "$D/started-munged"; fi
for _ in $(seq 50); do pgrep -f "$D/slurm.conf" >/dev/null || break; sleep 0.1; done
pkill -9 -f "$D/slurm.conf" 2>/dev/null
exit 0
