#!/usr/bin/env bash
# siphon on a multi-host Cloud TPU VM slice (v4, v5e, v5p, v6e): run this on your workstation.
# Copy it, edit the defaults below or pass flags, then:
#
#   deploy/tpu-vm/siphon-tpu-vm.sh --tpu my-v5e-16 --zone us-west4-a install
#   deploy/tpu-vm/siphon-tpu-vm.sh --tpu my-v5e-16 --zone us-west4-a start -- extract \
#       --model hf://Qwen/Qwen2.5-7B --corpus 'gs://bucket/corpus/*.parquet' \
#       --layers 20-27 --seq-len 1024 --batch-size 32 --output gs://bucket/activations --run qwen7b-l20-27
#   deploy/tpu-vm/siphon-tpu-vm.sh --tpu my-v5e-16 --zone us-west4-a logs      # worker 0's log
#   deploy/tpu-vm/siphon-tpu-vm.sh --tpu my-v5e-16 --zone us-west4-a status
#   deploy/tpu-vm/siphon-tpu-vm.sh --tpu my-v5e-16 --zone us-west4-a stop
#
# install  pip-installs siphon and libtpu (from PyPI) into ~/.local on every worker
#          (`gcloud compute tpus tpu-vm ssh --worker=all`). Where the image's Python refuses
#          user installs (PEP 668), set SIPHON_INSTALL_COMMAND, e.g. to a venv install that
#          links ~/.local/bin/siphon.
# start    makes a fresh job token here, copies it to ~/.siphon/job-token (mode 600) on every
#          worker with `gcloud ... scp --worker=all`, then starts the same
#          `siphon <args> --job-token-file ~/.siphon/job-token` on every worker, detached (setsid nohup),
#          logging to ~/.siphon/logs/<job>.log; --foreground waits for every worker instead.
#
# Identity: nothing is passed per worker. Each worker finds its process id (metadata attribute
# agent-worker-number), the process count and the coordinator (worker 0's address from
# worker-network-endpoints, port 8476 or SIPHON_COORDINATOR_PORT) in the TPU VM's GCE metadata,
# or in TPU_WORKER_ID / TPU_WORKER_HOSTNAMES where those are set. The script exports
# TPU_ACCELERATOR_TYPE, which tells siphon it runs on a Cloud TPU VM (plain TPU VM shells set
# no TPU_* variable). `siphon cluster info` on a worker shows what it found.
# A model larger than one host: pass `start -- extract ...` the mesh flags `siphon plan`
# suggests (--mesh 3d --data D --fsdp F --model-parallel M); every worker then holds its part of
# one mesh over the whole slice (libtpu finds the workers itself), each data group's lowest
# worker writing its rows.
# Plugin: libtpu from the pip install is found in the user's site-packages; `siphon doctor` on
# a worker checks it.
#
# Outputs: wherever --output points; use a gs:// bucket the TPU VM's service account can write
# (local disks of the workers vanish with the slice).
# Preemption (spot/preemptible slices): when the slice is back, run `install` if the workers
# were recreated and then the same `start` command with the same --run: every host resumes
# after its last committed shard, and the dataset is the one an uninterrupted run writes.
#
# For tests, GCLOUD names a stand-in for gcloud (deploy/testing/fake-gcloud runs the commands
# as N local workers) and SIPHON_INSTALL_COMMAND replaces the pip install.
set -euo pipefail

# ---- defaults: edit or override with flags / environment ----
TPU="${SIPHON_TPU:-}"                       # --tpu NAME
ZONE="${SIPHON_TPU_ZONE:-}"                 # --zone ZONE
PROJECT="${SIPHON_TPU_PROJECT:-}"           # --project PROJECT (default: gcloud's)
PIP_SPEC="${SIPHON_PIP_SPEC:-siphon}"       # what pip installs: siphon, siphon==X, git+https://...
LIBTPU_SPEC="${SIPHON_LIBTPU_SPEC:-libtpu}" # pin it (libtpu==X) for reproducible runs
JOB="${SIPHON_JOB_NAME:-siphon}"            # names the log and pid files on the workers
GCLOUD="${GCLOUD:-gcloud}"
FOREGROUND=0

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'; exit "${1:-0}"; }
die() { echo "siphon-tpu-vm: $*" >&2; exit 1; }
say() { echo "siphon-tpu-vm: $*" >&2; }

while [[ $# -gt 0 ]]; do
    case "$1" in
        --tpu) TPU="$2"; shift 2 ;;
        --zone) ZONE="$2"; shift 2 ;;
        --project) PROJECT="$2"; shift 2 ;;
        --pip-spec) PIP_SPEC="$2"; shift 2 ;;
        --libtpu-spec) LIBTPU_SPEC="$2"; shift 2 ;;
        --job) JOB="$2"; shift 2 ;;
        --foreground) FOREGROUND=1; shift ;;
        -h|--help) usage 0 ;;
        -*) die "unknown flag $1 (see --help)" ;;
        *) break ;;
    esac
done
[[ $# -ge 1 ]] || usage 1
action="$1"; shift
[[ -n "$TPU" ]] || die "--tpu NAME is required"
[[ -n "$ZONE" ]] || die "--zone ZONE is required"
[[ "$JOB" =~ ^[A-Za-z0-9._-]+$ ]] || die "--job must be a plain name"

tpu_flags=(--zone "$ZONE")
[[ -n "$PROJECT" ]] && tpu_flags+=(--project "$PROJECT")

# on_all COMMAND: runs a bash command on every worker of the slice.
on_all() { "$GCLOUD" compute tpus tpu-vm ssh "$TPU" "${tpu_flags[@]}" --worker=all --command "$1"; }

# quote ARGS...: one shell word per argument, safe to paste into a remote command line.
quote() { local out="" a; for a in "$@"; do out+=" $(printf '%q' "$a")"; done; printf '%s' "${out# }"; }

case "$action" in
install)
    install="${SIPHON_INSTALL_COMMAND:-python3 -m pip install --user --upgrade --quiet $(quote "$PIP_SPEC" "$LIBTPU_SPEC")}"
    say "installing on every worker of $TPU: $install"
    on_all "set -e; $install; mkdir -p ~/.siphon/logs; ~/.local/bin/siphon --version"
    ;;
start)
    [[ $# -ge 1 && "$1" == "--" ]] && shift
    [[ $# -ge 1 ]] || die "start needs the siphon command after --, e.g. start -- extract --model ..."
    accelerator="${SIPHON_TPU_ACCELERATOR_TYPE:-$("$GCLOUD" compute tpus tpu-vm describe "$TPU" "${tpu_flags[@]}" --format='value(acceleratorType)')}"
    [[ -n "$accelerator" ]] || die "cannot read the accelerator type of $TPU"
    say "$TPU is a $accelerator slice"

    # A fresh token per start: it only has to be the same on every worker of this job.
    token_dir="$(mktemp -d)"
    trap 'rm -rf "$token_dir"' EXIT
    (umask 077; od -An -tx1 -N32 /dev/urandom | tr -d ' \n' > "$token_dir/job-token")
    say "handing the job token to every worker (~/.siphon/job-token)"
    on_all "mkdir -p ~/.siphon/logs && chmod 700 ~/.siphon && rm -f ~/.siphon/job-token"
    "$GCLOUD" compute tpus tpu-vm scp "$token_dir/job-token" "$TPU:.siphon/job-token" "${tpu_flags[@]}" --worker=all
    on_all "chmod 600 ~/.siphon/job-token"

    command="$(quote "$@") --job-token-file \"\$HOME/.siphon/job-token\""
    env_prefix="export TPU_ACCELERATOR_TYPE=$(printf '%q' "$accelerator") TF_CPP_MIN_LOG_LEVEL=\${TF_CPP_MIN_LOG_LEVEL:-2};"
    log="\$HOME/.siphon/logs/$JOB.log"
    if [[ "$FOREGROUND" == 1 ]]; then
        say "running on every worker (foreground): siphon $*"
        on_all "$env_prefix cd \$HOME && ~/.local/bin/siphon $command 2>&1 | tee $log; exit \${PIPESTATUS[0]}"
    else
        say "starting on every worker (detached): siphon $*"
        # setsid + nohup: the job outlives the ssh session that started it.
        on_all "$env_prefix cd \$HOME && setsid nohup ~/.local/bin/siphon $command > $log 2>&1 < /dev/null & echo \$! > \$HOME/.siphon/$JOB.pid"
        say "started; follow it with: $0 --tpu $TPU --zone $ZONE logs"
    fi
    ;;
logs)
    "$GCLOUD" compute tpus tpu-vm ssh "$TPU" "${tpu_flags[@]}" --worker=0 --command "tail -n 200 -f \$HOME/.siphon/logs/$JOB.log"
    ;;
status)
    on_all "pid=\$(cat \$HOME/.siphon/$JOB.pid 2>/dev/null || true); if [ -n \"\$pid\" ] && kill -0 \"\$pid\" 2>/dev/null; then echo \"\$(hostname): running (pid \$pid)\"; else echo \"\$(hostname): not running; last log line: \$(tail -n 1 \$HOME/.siphon/logs/$JOB.log 2>/dev/null)\"; fi"
    ;;
stop)
    # SIGTERM: the host that gets it reports the stop, so every other host stops within ~1 s.
    on_all "pid=\$(cat \$HOME/.siphon/$JOB.pid 2>/dev/null || true); [ -n \"\$pid\" ] && kill -TERM \"\$pid\" 2>/dev/null || true"
    ;;
*)
    die "unknown action '$action': install, start, logs, status or stop"
    ;;
esac
