#!/usr/bin/env bash
# Put an LTX farm worker on this Mac: venv, pip install, launchd agent, logs. Packs come from the
# coordinator when a render needs them (pulled once per farm); --pack REPO pulls one from the hub here.
#
#   ops/install-worker.sh --coordinator studio.local:8471 --token-file ~/Downloads/token
#   ops/install-worker.sh --dry-run ...   # print every step, change nothing (also works on Linux)
#
# Re-running is safe: the venv is reused, a pack pull resumes, the agent is reloaded.
set -euo pipefail

SCRIPT_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
SOURCE="$(cd "$SCRIPT_DIR/.." && pwd)"       # what pip installs: this checkout (or --source SPEC)
FARM_HOME="${FARM_HOME:-$HOME/.ltx-farm}"
PACK="ltx-2.3-mlx-q8"
KINDS="t2v,i2v"
COORDINATOR=""
TOKEN="${FARM_TOKEN:-}"
TOKEN_FILE=""
WORKER_ID="$(hostname -s 2>/dev/null || hostname)"
PYTHON="${PYTHON:-python3}"
DRY_RUN=0
SKIP_PACK=0
LABEL="com.ltxfarm.worker"

usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//'
  cat <<USAGE
options:
  --coordinator HOST:PORT   the coordinator's gRPC address (required)
  --token-file PATH         the coordinator's token file (copied to $FARM_HOME/token, mode 600)
  (or FARM_TOKEN in the environment: a token on the command line would show in `ps`)
  --pack NAME_OR_REPO_ID    the pack renders use (default $PACK, copied from the coordinator);
                            a repo id (owner/name) is pulled from the hub into $FARM_HOME/packs instead
  --kinds KINDS             with a repo id: the render kinds to fetch files for (default $KINDS)
  --skip-pack               do not pull a pack from the hub
  --worker-id NAME          name shown on the dashboard (default: $WORKER_ID)
  --source PATH_OR_SPEC     what to pip install (default: $SOURCE)
  --home DIR                farm folder on this Mac (default: $FARM_HOME)
  --python PATH             Python 3.11+ to build the venv with (default: $PYTHON)
  --dry-run                 print what would be done and exit 0
USAGE
}

while [ $# -gt 0 ]; do
  case "$1" in
    --coordinator) COORDINATOR="$2"; shift 2 ;;
    --token|--token=*) echo "install-worker: a token on the command line shows in \`ps\`: give --token-file PATH or FARM_TOKEN" >&2; exit 2 ;;
    --token-file) TOKEN_FILE="$2"; shift 2 ;;
    --pack) PACK="$2"; shift 2 ;;
    --kinds) KINDS="$2"; shift 2 ;;
    --skip-pack) SKIP_PACK=1; shift ;;
    --worker-id) WORKER_ID="$2"; shift 2 ;;
    --source) SOURCE="$2"; shift 2 ;;
    --home) FARM_HOME="$2"; shift 2 ;;
    --python) PYTHON="$2"; shift 2 ;;
    --dry-run) DRY_RUN=1; shift ;;
    -h|--help) usage; exit 0 ;;
    *) echo "install-worker: unknown option $1" >&2; usage >&2; exit 2 ;;
  esac
done

say() { printf '==> %s\n' "$*"; }
die() { printf 'install-worker: %s\n' "$*" >&2; exit 1; }
run() {  # run a command, or only show it under --dry-run
  if [ "$DRY_RUN" = 1 ]; then printf '+'; printf ' %q' "$@"; printf '\n'; else "$@"; fi
}

VENV="$FARM_HOME/venv"
LOG_DIR="$FARM_HOME/logs"
AGENTS="$HOME/Library/LaunchAgents"
PLIST="$AGENTS/$LABEL.plist"
TEMPLATE="$SCRIPT_DIR/launchd/$LABEL.plist"
HF_HOME_DIR="${HF_HOME:-$HOME/.cache/huggingface}"

[ -n "$COORDINATOR" ] || { [ "$DRY_RUN" = 1 ] && COORDINATOR="coordinator.local:8471"; } || die "--coordinator HOST:PORT is required"
[ -f "$TEMPLATE" ] || die "missing plist template $TEMPLATE"
if [ "$(uname -s)" != "Darwin" ] && [ "$DRY_RUN" = 0 ]; then
  die "workers run on macOS (MLX on Metal); use --dry-run to preview on $(uname -s)"
fi
if [ "$DRY_RUN" = 0 ]; then
  "$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 11))' || die "$PYTHON is older than Python 3.11"
  [ -n "$TOKEN" ] || [ -f "$TOKEN_FILE" ] || die "give --token-file PATH (copy data/token from the coordinator) or FARM_TOKEN"
fi

say "farm folder $FARM_HOME (logs in $LOG_DIR)"
run mkdir -p "$FARM_HOME/packs" "$FARM_HOME/cache" "$LOG_DIR" "$AGENTS"

say "virtual environment $VENV"
[ -x "$VENV/bin/python" ] || run "$PYTHON" -m venv "$VENV"
run "$VENV/bin/python" -m pip install --upgrade pip
# Through this checkout's lock: every Mac of the farm runs the same package set (farm workers shows it).
LOCK="$SCRIPT_DIR/../requirements.lock"
if [ -f "$LOCK" ]; then
  run "$VENV/bin/python" -m pip install --upgrade -c "$LOCK" "$SOURCE"
else
  run "$VENV/bin/python" -m pip install --upgrade "$SOURCE"
fi

say "farm token"
if [ -n "$TOKEN" ]; then
  if [ "$DRY_RUN" = 1 ]; then echo "+ write the token to $FARM_HOME/token (mode 600)"
  else (umask 077; printf '%s\n' "$TOKEN" > "$FARM_HOME/token"); fi
else
  run install -m 600 "$TOKEN_FILE" "$FARM_HOME/token"
fi

PACK_NAME="${PACK##*/}"
if [ "$SKIP_PACK" = 0 ] && [ "$PACK" != "$PACK_NAME" ]; then
  say "pack $PACK from the hub into $FARM_HOME/packs/$PACK_NAME, only what $KINDS renders load; resumes if interrupted"
  run env HF_HOME="$HF_HOME_DIR" "$VENV/bin/farm" pack pull "$PACK" --kinds "$KINDS" --packs-dir "$FARM_HOME/packs"
else
  say "no pack download: this worker copies $PACK_NAME from the coordinator when a render needs it"
fi

say "launchd agent $PLIST"
esc() { printf '%s' "$1" | sed -e 's/[|&\\]/\\&/g'; }
render_plist() {
  sed -e "s|__FARM_BIN__|$(esc "$VENV/bin/farm")|g" -e "s|__COORDINATOR__|$(esc "$COORDINATOR")|g" \
      -e "s|__TOKEN_FILE__|$(esc "$FARM_HOME/token")|g" -e "s|__PACKS_DIR__|$(esc "$FARM_HOME/packs")|g" \
      -e "s|__CACHE_DIR__|$(esc "$FARM_HOME/cache")|g" -e "s|__WORKER_ID__|$(esc "$WORKER_ID")|g" \
      -e "s|__HF_HOME__|$(esc "$HF_HOME_DIR")|g" -e "s|__FARM_HOME__|$(esc "$FARM_HOME")|g" \
      -e "s|__LOG_DIR__|$(esc "$LOG_DIR")|g" "$TEMPLATE"
}
if [ "$DRY_RUN" = 1 ]; then
  echo "+ write $PLIST:"
  render_plist | sed 's/^/    /'
else
  render_plist > "$PLIST.tmp" && mv "$PLIST.tmp" "$PLIST"
  if command -v plutil >/dev/null; then plutil -lint "$PLIST"; fi
fi
DOMAIN="gui/$(id -u)"
if [ "$DRY_RUN" = 1 ]; then
  echo "+ launchctl bootout $DOMAIN/$LABEL   (ignored when not loaded)"
else
  launchctl bootout "$DOMAIN/$LABEL" 2>/dev/null || true
fi
run launchctl bootstrap "$DOMAIN" "$PLIST"
run launchctl kickstart -k "$DOMAIN/$LABEL"

say "checking this Mac"
if [ "$DRY_RUN" = 1 ]; then
  run "$VENV/bin/farm" doctor --coordinator "$COORDINATOR" --pack "$PACK_NAME" --data "$FARM_HOME"
else
  "$VENV/bin/farm" doctor --coordinator "$COORDINATOR" --pack "$PACK_NAME" --data "$FARM_HOME" || \
    echo "install-worker: doctor reported problems (above); the agent keeps retrying meanwhile" >&2
fi

say "done: worker '$WORKER_ID' -> $COORDINATOR; logs: tail -f $LOG_DIR/worker.log"
[ "$DRY_RUN" = 1 ] && say "dry run: nothing was changed"
exit 0
