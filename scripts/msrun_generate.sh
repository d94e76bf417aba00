#!/usr/bin/env bash
# Tensor-parallel offline generation: msrun starts one process per card, each runs scripts/generate.py
# (ms-atb-generate) on the same prompts; rank 0 writes --output and the progress.
#
#   scripts/msrun_generate.sh [launch options] -- <ms-atb-generate arguments>
#
# Launch options (tensor-parallel size = total number of workers; it is passed to the engine as
# --set tensor_parallel_size=N, before your own --set options, so an explicit one still wins):
#   -n, --tp N           tensor-parallel size, the total number of workers (default 2)
#   --nodes K            machines taking part (default 1); each runs N/K workers
#   --node-rank R        this machine's index, 0..K-1 (default 0); run the script once on each machine
#   --master-addr ADDR   address of node 0, where msrun's scheduler listens (default 127.0.0.1)
#   --master-port PORT   the scheduler's port (default 8118)
#   --log-dir DIR        one log per worker plus scheduler.log (default msrun_log)
# Example, 2 ranks on this machine:
#   scripts/msrun_generate.sh -n 2 -- --config configs/tiny_llama.yaml --input prompts.txt --output out.jsonl
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TP=2 NODES=1 NODE_RANK=0 MASTER_ADDR=127.0.0.1 MASTER_PORT=8118 LOG_DIR=msrun_log

usage() { sed -n '2,16p' "$0" | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
need() { [[ $# -ge 2 && -n "$2" ]] || { echo "msrun_generate.sh: $1 needs a value" >&2; exit 2; }; }
while [[ $# -gt 0 ]]; do
  case "$1" in
    -n|--tp) need "$@"; TP="$2"; shift 2 ;;
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
for v in TP NODES NODE_RANK MASTER_PORT; do   # decimal only: bash and YAML read a leading 0 as octal
  [[ "${!v}" =~ ^(0|[1-9][0-9]*)$ ]] || {
    echo "msrun_generate.sh: $v must be a non-negative decimal integer without leading zeros, got '${!v}'" >&2; exit 2; }
done
if (( MASTER_PORT < 1 || MASTER_PORT > 65535 )); then
  echo "msrun_generate.sh: --master-port must be in 1..65535, got $MASTER_PORT" >&2; exit 2
fi
if (( TP < 1 || NODES < 1 || TP % NODES != 0 )); then
  echo "msrun_generate.sh: --tp $TP must be >= 1 and a multiple of --nodes $NODES" >&2; exit 2
fi
if (( NODE_RANK >= NODES )); then
  echo "msrun_generate.sh: --node-rank $NODE_RANK must be below --nodes $NODES" >&2; exit 2
fi
# msrun starts `python` from PATH: make it the project's environment unless one is active.
if [[ -z "${VIRTUAL_ENV:-}" && -x "$ROOT/.venv/bin/python" ]]; then
  export PATH="$ROOT/.venv/bin:$PATH"
fi
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
setsid msrun --worker_num="$TP" --local_worker_num="$((TP / NODES))" --node_rank="$NODE_RANK" \
  --master_addr="$MASTER_ADDR" --master_port="$MASTER_PORT" --log_dir="$LOG_DIR" --join=True \
  "$ROOT/scripts/generate.py" --set "tensor_parallel_size=$TP" "$@" &
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
  exit "$1"
}
trap 'on_signal 130' INT
trap 'on_signal 143' TERM
rc=0
wait "$JOB" || rc=$?
end_job 1
exit "$rc"
