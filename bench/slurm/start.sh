#!/usr/bin/env bash
# Starts a one-node local Slurm (Debian's slurmctld + slurmd + munge) on 127.0.0.1 for the
# benchmarks, with its own configuration and state in DIR (default /tmp/clan-slurm). The
# system's /etc/slurm is not touched. Prints the SLURM_CONF to export.
#   eval "$(bench/slurm/start.sh)"; srun -N1 true; bench/slurm/stop.sh
set -euo pipefail
D=${1:-/tmp/clan-slurm}
mkdir -p "$D/state" "$D/spool"
cat > "$D/slurm.conf" <<CONF
ClusterName=clanbench
SlurmctldHost=localhost(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
StateSaveLocation=$D/state
SlurmdSpoolDir=$D/spool
SlurmctldPidFile=$D/slurmctld.pid
SlurmdPidFile=$D/slurmd.pid
SlurmctldLogFile=$D/slurmctld.log
SlurmdLogFile=$D/slurmd.log
SlurmctldPort=6817
SlurmdPort=6818
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SwitchType=switch/none
MpiDefault=none
ReturnToService=2
SchedulerType=sched/builtin
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
NodeName=localhost NodeAddr=127.0.0.1 CPUs=2 State=UNKNOWN
PartitionName=bench Nodes=localhost Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:8
CONF
export SLURM_CONF="$D/slurm.conf"
if ! pgrep -x munged >/dev/null; then
  mkdir -p /run/munge /var/log/munge /var/lib/munge
  chown munge:munge /run/munge /var/log/munge /var/lib/munge
  [ -s /etc/munge/munge.key ] || { dd if=/dev/urandom of=/etc/munge/munge.key bs=1024 count=1 status=none; chown munge:munge /etc/munge/munge.key; chmod 400 /etc/munge/munge.key; }
  runuser -u munge -- /usr/sbin/munged
  touch "$D/started-munged"
fi
pgrep -f "slurmctld.*$D" >/dev/null || slurmctld -f "$SLURM_CONF"
pgrep -f "slurmd.*$D" >/dev/null || slurmd -f "$SLURM_CONF" -N localhost
for _ in $(seq 120); do
  if timeout 10 srun -N1 true >/dev/null 2>&1; then
    echo "export SLURM_CONF=$SLURM_CONF"
    exit 0
  fi
  sleep 0.5
done
echo "slurm did not come up; see $D/slurmctld.log and $D/slurmd.log" >&2
exit 1
