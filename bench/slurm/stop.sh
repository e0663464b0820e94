#!/usr/bin/env bash
# Stops the local Slurm that bench/slurm/start.sh started from DIR (default /tmp/clan-slurm):
# cancels its jobs, stops slurmd, slurmctld and any leftover slurmstepd with their job
# processes, then its private munged. Only processes started from DIR are touched (found by
# their pid files and their SLURM_CONF), and none is left behind. Idempotent.
#   bench/slurm/stop.sh [DIR]
# (start.sh passes --keep-munge after DIR when it only restarts the Slurm daemons.)
set -uo pipefail
D=${1:-/tmp/clan-slurm}
keep_munge=0
[ "${2:-}" = --keep-munge ] && keep_munge=1
[ -d "$D" ] || exit 0
D=$(cd "$D" && pwd)
CONF=$D/slurm.conf
export SLURM_CONF=$CONF

# The pid in file $1 when it is alive and its command line mentions $2.
live_pid() {
  local pid
  pid=$(cat "$1" 2>/dev/null) || return 1
  [ -n "$pid" ] && [ -r "/proc/$pid/cmdline" ] && tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$2" && echo "$pid"
}

# Sends signal $1 to the pids that follow and waits (5 s at most) until they are gone; then KILL.
stop_pids() {
  local sig=$1 p alive
  shift
  [ $# -gt 0 ] || return 0
  kill "-$sig" "$@" 2>/dev/null
  for _ in $(seq 50); do
    alive=0
    for p in "$@"; do [ -d "/proc/$p" ] && alive=1; done
    [ "$alive" = 0 ] && return 0
    sleep 0.1
  done
  kill -KILL "$@" 2>/dev/null
  sleep 0.1
}

# All descendants of pid $1, deepest first.
descendants() {
  local c
  for c in $(ps -o pid= --ppid "$1" 2>/dev/null); do
    descendants "$c"
    echo "$c"
  done
}

# slurmstepd processes of this cluster (they inherit SLURM_CONF from slurmd).
stepds() {
  local p
  for p in $(pgrep -x slurmstepd 2>/dev/null); do
    tr '\0' '\n' 2>/dev/null <"/proc/$p/environ" | grep -qxF "SLURM_CONF=$CONF" && echo "$p"
  done
}

ctld=$(live_pid "$D/slurmctld.pid" "$CONF")
slurmd=$(live_pid "$D/slurmd.pid" "$CONF")

# Cancel the jobs while the controller still runs, so their steps end cleanly.
if [ -n "$ctld" ] && [ -n "$slurmd" ]; then
  jobs=$(timeout 5 squeue -h -o %i 2>/dev/null)
  if [ -n "$jobs" ]; then
    # shellcheck disable=SC2086
    timeout 5 scancel $jobs 2>/dev/null
    for _ in $(seq 50); do
      [ -z "$(timeout 5 squeue -h -t R,S,CG -o %i 2>/dev/null)" ] && [ -z "$(stepds)" ] && break
      sleep 0.1
    done
  fi
fi

stop_pids TERM $slurmd
stop_pids TERM $ctld

# Whatever steps survived, with their job processes.
for s in $(stepds); do
  # shellcheck disable=SC2046
  stop_pids KILL $(descendants "$s") "$s"
done

if [ "$keep_munge" = 0 ]; then
  munged=$(live_pid "$D/munge/munged.pid" "$D/munge/munge.socket")
  stop_pids TERM $munged
fi
rm -f "$D/slurmctld.pid" "$D/slurmd.pid"
exit 0
