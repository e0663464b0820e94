#!/usr/bin/env bash
# Installs what is missing, builds clan, starts a local 4-node cluster and shows what works.
# The cluster keeps running afterwards. Run as root on Debian 12:
#   scripts/demo.sh
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh
export PATH="$HOME/.cargo/bin:$PATH"
scripts/build-release.sh
install -m 755 target/release/clan target/release/cland target/release/clan-shepherd target/release/clan-procfs /usr/local/bin/
export PATH="/usr/local/bin:$PATH"
unset CLAN_DIR CLAN_NODE

say() { printf '\n\033[1m$ %s\033[0m\n' "$*"; }
run() { say "$*"; "$@"; }

if clan nodes >/dev/null 2>&1; then
  run clan down
fi
run clan up --nodes 4
run clan nodes

say "clan run -N 4 -l -- sh -c 'echo hello from \$(hostname), gpid \$CLAN_GPID, rank \$CLAN_RANK of \$CLAN_SIZE'"
clan run -N 4 -l -- sh -c 'echo hello from $(hostname), gpid $CLAN_GPID, rank $CLAN_RANK of $CLAN_SIZE'

say "for i in 1 2 3 4; do clan run -d -- sleep 600; done     # placed round-robin"
gpids=()
for i in 1 2 3 4; do gpids+=("$(clan run -d -- sleep 600 2>/dev/null)"); done
echo "${gpids[@]}"
run clan ps

say "clan kill -s TERM ${gpids[2]}; clan wait ${gpids[2]}        # a signal to node 3, the status comes back"
clan kill -s TERM "${gpids[2]}"
clan wait "${gpids[2]}" || true

say "clan run --node 3 -- sh -c 'exit 7'; echo \"exit status \$?\""
set +e; clan run --node 3 -- sh -c 'exit 7'; echo "exit status $?"; set -e

say "clan run --node 2 -- sh -c 'kill -TERM \$\$'; echo \"exit status \$?\"    # dies of the same signal"
set +e; clan run --node 2 -- sh -c 'kill -TERM $$'; echo "exit status $? (128 + SIGTERM)"; set -e

say "echo 'stdin crosses nodes too' | clan run --node 4 -- tr a-z A-Z"
echo 'stdin crosses nodes too' | clan run --node 4 -- tr a-z A-Z

run clan stats locks --node 1

say "clan run -d --node 1 -- sh -c 'clan run -d --node 2 -- sleep 601; clan run -d --node 3 -- sleep 602; exec sleep 603'"
leader=$(clan run -d --node 1 -- sh -c 'clan run -d --node 2 -- sleep 601 >/dev/null; clan run -d --node 3 -- sleep 602 >/dev/null; exec sleep 603' 2>/dev/null)
has_603() { clan ps -o json | python3 -c 'import json,sys; sys.exit(not any(p["cmd"] == "sleep 603" for p in json.load(sys.stdin)))'; }
for _ in $(seq 100); do has_603 && break; sleep 0.1; done
say "clan ps -o json   # (filtered) one process group across three nodes: PGID $leader"
clan ps -o json | python3 -c 'import json,sys
for p in json.load(sys.stdin):
    if p["cmd"].startswith("sleep 60") and p["cmd"] != "sleep 600":
        print(p["gpid"], "node", p["node"], "pgid", p["pgid"], "sid", p["sid"], p["cmd"])'
run clan sigsend -s STOP "pgid=$leader and not node=1"
sleep 0.2
clan ps | grep -E 'STAT|sleep 60[123]'
say "clan kill -s KILL -g $leader          # the whole group, on every node that holds members"
clan kill -s KILL -g "$leader"
# Its status is collected (as a shell collects its children), so no zombie stays behind.
clan wait "$leader" >/dev/null || true

say "clan run -d --node 4 -- sleep 604; clan node crash 4; clan wait ...   # a power cut looks like a kill"
victim=$(clan run -d --node 4 -- sleep 604 2>/dev/null)
clan node crash 4
clan wait "$victim" || true
run clan nodes
run clan node start 4

say "clan run --node 2 -- sh -c 'for i in 1 2 3 4 5 6; do echo tick \$i; sleep 0.3; done; exit 3' &   # then cland 2 is killed and restarted"
clan run --node 2 -- sh -c 'for i in 1 2 3 4 5 6; do echo tick $i; sleep 0.3; done; exit 3' &
stub=$!
sleep 0.5
kill -9 "$(cat /run/clan/node2/cland.pid)"
echo "(cland of node 2 killed; restarting it)"
setsid cland --config /run/clan/cluster.toml --node 2 >>/run/clan/node2/cland.log 2>&1 < /dev/null &
status=0
wait "$stub" || status=$?
echo "exit status $status: the run went on, nothing of its output lost"

say "clan run -N 2 -d -- sh -c '(setsid yes >/dev/null &); exec sleep 605'    # a job whose processes try to get away"
said=$(mktemp)
members=$(clan run -N 2 -d -- sh -c '(setsid yes >/dev/null &); exec sleep 605' 2>"$said")
job=$(awk '{print $2}' "$said")
say "clan run -N 2 -d -- sleep 606    # a second job, to switch with"
members2=$(clan run -N 2 -d -- sleep 606 2>"$said")
job2=$(awk '{print $2}' "$said")
run clan job tree "$job"
run clan job suspend "$job"
run clan job show "$job"
run clan job switch "$job" "$job2"
run clan job switch "$job2" "$job"
run clan job kill "$job"
run clan job kill "$job2"
# shellcheck disable=SC2086
clan wait $members $members2 >/dev/null || true
say "clan run --max-procs 20 -- bash -c 'f() { f | f & }; f'   # a fork bomb bounded by its task's pids limit"
bombs=$(clan run -d --max-procs 20 -- bash -c 'f() { f | f & }; f' 2>"$said")
bomb=$(awk '{print $2}' "$said")
rm -f "$said"
sleep 1
clan job show "$bomb"
run clan job kill "$bomb"
clan wait "$bombs" >/dev/null || true

say "clan shell --node 1 -- sh -c 'ps -eo pid,ppid,user,stat,args; pstree; pkill -f \"sleep 60[0]\"; pgrep -c -f \"sleep 60[0]\"'"
echo "# unmodified procps in a shell whose /proc is the cluster's: every node's processes, by gpid,"
echo "# under pid 1, the cluster's init"
clan shell --node 1 -- sh -c 'ps -eo pid,ppid,user,stat,args; pstree; pkill -f "sleep 60[0]"; pgrep -c -f "sleep 60[0]"' || true

for g in "${gpids[0]}" "${gpids[1]}" "${gpids[3]}"; do clan kill -s KILL "$g" 2>/dev/null || true; done
clan wait "${gpids[0]}" "${gpids[1]}" "${gpids[3]}" >/dev/null || true

cat <<'MSG'

The 4-node cluster is still running (state in /run/clan). Try:
  clan ps                         every process of every node
  clan run --node 2 -t -- bash    a shell on node 2
  clan shell                      a shell in which ps, top, pgrep, pkill, kill see every node
  clan run -d -- sleep 100        placed by policy; then clan ps, clan kill, clan wait
Stop it with:
  clan down
MSG
