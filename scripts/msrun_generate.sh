#!/usr/bin/env bash
# Parallel offline generation: msrun starts one process per card, each runs scripts/generate.py
# (ms-atb-generate). Tensor parallelism: the N ranks of a replica run the same prompts and its rank 0 writes.
# Data parallelism: D independent replicas each run their share of the prompts into <output>.part<k>-of-<D>;
# the last one done merges them into --output (ms-atb-generate --merge does it by hand).
#
#   scripts/msrun_generate.sh [launch options] -- <ms-atb-generate arguments>
#
# Launch options (the sizes are passed to the engine as --set tensor_parallel_size=N --set
# data_parallel_size=D, before your own --set options, so an explicit one still wins):
#   -n, --tp N           tensor-parallel size, the ranks of one replica (default 2)
#   --dp D               data-parallel size, independent replicas (default 1); N x D workers in all
#   --nodes K            machines taking part (default 1); each runs N x D / K workers
#   --node-rank R        this machine's index, 0..K-1 (default 0); run the script once on each machine
#   --master-addr ADDR   address of node 0, where msrun's scheduler listens (default 127.0.0.1)
#   --master-port PORT   the scheduler's port (default 8118)
#   --log-dir DIR        one log per worker, scheduler.log and msrun.log (default msrun_log)
# On failure the exit status is msrun's (non-zero) and the rank that failed first is named.
# Example, 2 ranks on this machine:
#   scripts/msrun_generate.sh -n 2 -- --config configs/tiny_llama.yaml --input prompts.txt --output out.jsonl
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TP=2 DP=1 NODES=1 NODE_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=8118 LOG_DIR=msrun_log

usage() { sed -n '2,20p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "msrun_generate.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--tp) need "$@"; TP="$2"; shift 2 ;;
    --dp) need "$@"; DP="$2"; shift 2 ;;
    --nodes) need "$@"; NODES="$2"; shift 2 ;;
    --node-rank) need "$@"; NODE_RANK="$2"; shift 2 ;;
    --master-addr) need "$@"; MASTER_ADDR="$2"; shift 2 ;;
    --master-port) need "$@"; MASTER_PORT="$2"; shift 2 ;;
    --log-dir) need "$@"; LOG_DIR="$2"; shift 2 ;;
    -h|--help) usage 0 ;;
    --) shift; break ;;
    *) echo "msrun_generate.sh: unknown option $1 (ms-atb-generate arguments go after --)" >&2; usage 2 ;;
  esac
done
for v in TP DP NODES NODE_RANK MASTER_PORT; do   # decimal only: bash and YAML read a leading 0 as octal
  [[ "${!v}" =~ ^(0|[1-9][0-9]*)$ ]] || {
    echo "msrun_generate.sh: $v must be a non-negative decimal integer without leading zeros, got '${!v}'" >&2; exit 2; }
done
if (( MASTER_PORT < 1 || MASTER_PORT > 65535 )); then
  echo "msrun_generate.sh: --master-port must be in 1..65535, got $MASTER_PORT" >&2; exit 2
fi
WORKERS=$((TP * DP))
if (( TP < 1 || DP < 1 || NODES < 1 || WORKERS % NODES != 0 )); then
  echo "msrun_generate.sh: --tp $TP x --dp $DP must be >= 1 and a multiple of --nodes $NODES" >&2; exit 2
fi
if (( NODE_RANK >= NODES )); then
  echo "msrun_generate.sh: --node-rank $NODE_RANK must be below --nodes $NODES" >&2; exit 2
fi
# msrun starts `python` from PATH: make it the project's environment unless one is active.
if [[ -z "${VIRTUAL_ENV:-}" && -x "$ROOT/.venv/bin/python" ]]; then
  export PATH="$ROOT/.venv/bin:$PATH"
fi
# msrun's workers report to its scheduler every MS_RETRY_INTERVAL_LOWER..UPPER seconds (MindSpore's default 3..5),
# and a job waits for one report to start and for one to end: every second keeps both waits short.
export MS_RETRY_INTERVAL_LOWER="${MS_RETRY_INTERVAL_LOWER:-1}" MS_RETRY_INTERVAL_UPPER="${MS_RETRY_INTERVAL_UPPER:-1}"
command -v msrun >/dev/null || { echo "msrun_generate.sh: msrun not found (it comes with mindspore)" >&2; exit 2; }
# Node 0 runs msrun's scheduler on the port: if another program holds it, msrun's workers would retry for
# minutes (cluster_time_out) with the reason only in scheduler.log.
if (( NODE_RANK == 0 )) && ! python - "$MASTER_ADDR" "$MASTER_PORT" <<'PY'
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind((sys.argv[1], int(sys.argv[2])))
except OSError as e:
    sys.exit(f"msrun_generate.sh: --master-addr {sys.argv[1]} --master-port {sys.argv[2]} cannot be used on this "
             f"machine ({e.strerror}); pick a free port with --master-port")
PY
then
  exit 2
fi

# msrun runs in a session (and process group) of its own, so that a signal reaches the whole job: msrun,
# its scheduler and the `tail -f` it runs on the logs share that group; its workers start sessions of
# their own, so they are found as msrun's descendants (before msrun exits and they are reparented) and
# signalled with their groups. On SIGINT/SIGTERM all of them get SIGTERM, STOP_GRACE_S seconds to exit,
# then SIGKILL; after a normal end, whatever is left (the tails) is ended too. No process stays behind.
STOP_GRACE_S="${MS_ATB_STOP_GRACE_S:-10}"
mkdir -p "$LOG_DIR"
exec {LOG_FD}> >(tee "$LOG_DIR/msrun.log")      # msrun's own output, on the terminal and kept for failed_rank
TEE=$!
setsid msrun --worker_num="$WORKERS" --local_worker_num="$((WORKERS / NODES))" --node_rank="$NODE_RANK" \
  --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" --log_dir="$LOG_DIR" --join=True \
  "$ROOT/scripts/generate.py" --set "tensor_parallel_size=$TP" --set "data_parallel_size=$DP" "$@" \
  >&"$LOG_FD" 2>&1 &
JOB=$!           # a background child of a non-interactive shell leads no group: setsid makes its pid the group id

descendants() { local k; for k in $(pgrep -P "$1" 2>/dev/null); do echo "$k"; descendants "$k"; done; }
signal_all() {   # $1: signal; $2...: pids, each signalled with its group when it leads one
  local sig=$1 p; shift
  kill "-$sig" -- "-$JOB" 2>/dev/null || true
  for p in "$@"; do kill "-$sig" -- "-$p" 2>/dev/null || kill "-$sig" "$p" 2>/dev/null || true; done
}
any_alive() { local p; kill -0 -- "-$JOB" 2>/dev/null && return 0
  for p in "$@"; do kill -0 "$p" 2>/dev/null && return 0; done; return 1; }
end_job() {      # $1: seconds the job may take to exit after SIGTERM
  local pids waited=0
  pids=$(descendants "$JOB")
  # shellcheck disable=SC2086
  signal_all TERM $pids
  # shellcheck disable=SC2086
  while any_alive $pids && (( waited < $1 * 10 )); do sleep 0.1; waited=$((waited + 1)); done
  # shellcheck disable=SC2086
  signal_all KILL $pids
}
on_signal() {
  trap '' INT TERM
  echo "msrun_generate.sh: stopping the job (msrun, its scheduler and workers; at most ${STOP_GRACE_S}s)" >&2
  end_job "$STOP_GRACE_S"
  wait "$JOB" 2>/dev/null || true
  exec {LOG_FD}>&-
  wait "$TEE" 2>/dev/null || true
  exit "$1"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
# msrun logs the pid of the first worker that failed; each worker logs its rank and pid.
failed_rank() {
  local pid
  pid=$(grep -o 'Worker process [0-9]* exit with exception' "$LOG_DIR/msrun.log" 2>/dev/null | head -n 1 | grep -o '[0-9]*')
  [[ -n "$pid" ]] && grep -ho "^\[ms_atb\] msrun rank [0-9]* is pid $pid\b" "$LOG_DIR"/worker_*.log 2>/dev/null \
    | head -n 1 | sed 's/.*msrun rank \([0-9]*\).*/\1/'
}
rc=0
wait "$JOB" || rc=$?
end_job 1
exec {LOG_FD}>&-
wait "$TEE" 2>/dev/null || true
if (( rc != 0 )); then
  rank=$(failed_rank || true)
  echo "msrun_generate.sh: the job failed (exit status $rc)${rank:+; rank $rank failed first (see $LOG_DIR/worker_$rank.log)}" >&2
fi
exit "$rc"
