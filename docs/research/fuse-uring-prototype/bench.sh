#!/bin/bash
# usage: bench.sh RUNS N   -- alternates mode a/b, 3 placements, fresh server per measurement
cd "$(dirname "$0")"
RUNS=${1:-3}; N=${2:-20000}; M=$PWD/mnt; mkdir -p $M
orig=$(cat /sys/module/fuse/parameters/enable_uring)
cleanup() { umount -l $M 2>/dev/null; [ -n "$SP" ] && kill $SP 2>/dev/null; wait $SP 2>/dev/null; SP=; }
trap 'cleanup; echo $orig > /sys/module/fuse/parameters/enable_uring' EXIT
one() { # mode placement run
  local mode=$1 pl=$2 run=$3 scpu= rpre=
  case $pl in unpinned) ;; r0) rpre="taskset -c 0";; r0s1) rpre="taskset -c 0"; scpu=1;; r0s0) rpre="taskset -c 0"; scpu=0;; esac
  [ $mode = b ] && echo Y > /sys/module/fuse/parameters/enable_uring || echo N > /sys/module/fuse/parameters/enable_uring
  ./srv $mode $M $scpu 2>>srv-bench.log & SP=$!
  for i in $(seq 50); do timeout 10 stat $M/f >/dev/null 2>&1 && break; sleep 0.05; done
  timeout 10 $rpre ./rd $M/f 500 >/dev/null   # warm-up
  out=$(timeout 60 $rpre ./rd $M/f $N) || echo "FAIL $mode $pl $run"
  echo "$mode $pl $run $out"
  cleanup
}
for run in $(seq $RUNS); do
  for pl in ${PLACEMENTS:-unpinned r0 r0s1}; do
    for mode in ${ORDER:-a b}; do one $mode $pl $run; done
  done
  echo "proc unpinned $run $(timeout 10 ./rd /proc/self/status $N)"
  echo "proc r0 $run $(timeout 10 taskset -c 0 ./rd /proc/self/status $N)"
done
