#!/usr/bin/env bash
# slicegate developer entry point: setup | serve [ARGS...] | test [PYTEST ARGS...]
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")"
VENV=.venv
PY="$VENV/bin/python"
STAMP="$VENV/.slicegate-stamp"

log() { echo "slicegate: $*" >&2; }
die() { log "error: $*"; exit 1; }

usage() {
    cat >&2 <<'USAGE'
usage: ./slicegate.sh setup              create .venv, install, prepare the default model
       ./slicegate.sh serve [ARGS...]    setup, then serve
       ./slicegate.sh test [PYTEST...]   setup, then ruff, mypy and pytest
USAGE
    exit 2
}

# The first of $PYTHON, python3.13 .. python3 that is at least 3.11.
find_python() {
    local candidate
    for candidate in ${PYTHON:-} python3.13 python3.12 python3.11 python3; do
        if command -v "$candidate" >/dev/null 2>&1 &&
            "$candidate" -c 'import sys; sys.exit(sys.version_info < (3, 11))' 2>/dev/null; then
            echo "$candidate"
            return
        fi
    done
    die "python >= 3.11 not found (set PYTHON=/path/to/python3.11)"
}

ensure_venv() {
    [[ -x "$PY" ]] && return
    local python
    python="$(find_python)"
    log "creating $VENV with $python"
    "$python" -m venv "$VENV" || die "could not create $VENV (on Debian: apt-get install python3-venv)"
}

# NOTE: reinstall only when pyproject.toml changed; the stamp holds its sha256.
ensure_deps() {
    local want have=""
    want="$("$PY" -c 'import hashlib, sys; print(hashlib.sha256(open(sys.argv[1], "rb").read()).hexdigest())' pyproject.toml)"
    [[ -f "$STAMP" ]] && have="$(<"$STAMP")"
    [[ "$want" == "$have" ]] && return
    local pip_log="$VENV/.slicegate-pip.log" started=$SECONDS
    if [[ -f "$STAMP" ]]; then
        log "pyproject.toml changed: updating the dependencies in $VENV"
    else
        log "installing slicegate and its dependencies (torch CPU, transformers, fastapi, ...)" \
            "into $VENV; on a fresh machine this takes about 2 minutes"
    fi
    log "progress: tail -f $pip_log"
    if ! "$PY" -m pip install --progress-bar off -e '.[dev]' >"$pip_log" 2>&1; then
        tail -n 40 "$pip_log" >&2
        die "pip install failed (full log: $pip_log)"
    fi
    echo "$want" >"$STAMP"
    log "dependencies installed in $((SECONDS - started)) s"
}

setup() {
    ensure_venv
    ensure_deps
    # NOTE: instant once prepared; the first time it downloads ~100 MB and converts (~30 s).
    local model
    model="$("$PY" -m models prepare default)" || die "could not prepare the default model"
    log "default model (SmolLM2-135M-Instruct) ready in $model"
}

serve() {
    setup
    if [[ -f gateway/__main__.py ]]; then
        log "starting the server: python -m gateway serve $*"
        log "it loads the model and measures its operators first (~30 s); ready at 'Uvicorn running'"
        exec "$PY" -m gateway serve "$@"
    fi
    exec "$PY" -m models generate --model default --chat \
        --prompt "${PROMPT:-What is the capital of France?}" --max-tokens 32 "$@"
}

# NOTE: the browser test drives Debian's chromium (Playwright's own browser download is not
# reachable everywhere). Installed once where apt-get can run as root; quick when present.
ensure_chromium() {
    command -v chromium >/dev/null 2>&1 && return
    if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        log "no chromium and no root apt-get: the browser test will be skipped"
        return
    fi
    log "installing Debian's chromium for the browser test"
    local apt_log="$VENV/.slicegate-apt.log"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq chromium; } >"$apt_log" 2>&1; then
        tail -n 20 "$apt_log" >&2
        die "apt-get install chromium failed (full log: $apt_log)"
    fi
}

# NOTE: the native CPU kernels (models/csrc) are compiled at first use with cc/gcc; where none
# is found models fall back to torch's kernels and their tests skip. Installed like chromium.
ensure_cc() {
    command -v cc >/dev/null 2>&1 || command -v gcc >/dev/null 2>&1 || [[ -n "${CC:-}" ]] && return
    if [[ "$(id -u)" -ne 0 ]] || ! command -v apt-get >/dev/null 2>&1; then
        log "no C compiler and no root apt-get: the native CPU kernels and their tests are off"
        return
    fi
    log "installing Debian's gcc for the native CPU kernels"
    local apt_log="$VENV/.slicegate-apt-gcc.log"
    if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
            apt-get install -y -qq gcc libc6-dev; } >"$apt_log" 2>&1; then
        tail -n 20 "$apt_log" >&2
        die "apt-get install gcc failed (full log: $apt_log)"
    fi
}

# Runs every check even after a failure, so one run shows all of them.
run_tests() {
    setup
    ensure_chromium
    ensure_cc
    local failed=()
    "$VENV/bin/ruff" check . || failed+=(ruff)
    "$VENV/bin/mypy" || failed+=(mypy)
    "$PY" -m pytest -q -p no:cacheprovider "$@" || failed+=(pytest)
    if ((${#failed[@]})); then
        die "failed: ${failed[*]}"
    fi
    log "all checks passed"
}

main() {
    (($#)) || usage
    local cmd="$1"
    shift
    case "$cmd" in
        setup) setup "$@" ;;
        serve) serve "$@" ;;
        test) run_tests "$@" ;;
        -h | --help | help) usage ;;
        *) log "unknown command: $cmd"; usage ;;
    esac
}

main "$@"
