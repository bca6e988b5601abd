#!/usr/bin/env bash
# `make release-check` (slow tier, not in CI): the release wheels, one cell
# per Python.  Each cell: a virtualenv of that Python with TENSORFLOW and the
# build and test requirements (build/release/pyX.Y/venv), the wheel built
# against it and repaired (tools/wheel.sh), then installed into a fresh
# virtualenv without a compiler on PATH and tested there
# (tools/wheel_check.sh).  A table of the cells' results and times at the end;
# exits 1 if any cell failed.  Logs: build/release/pyX.Y/log.
# usage: tools/release_check.sh AUDITWHEEL TENSORFLOW PYTHON...
set -uo pipefail
AUDITWHEEL="$1"
TF_REQ="$2"
shift 2
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
REL="$ROOT/build/release"
mkdir -p "$REL/dist"
summary="$(mktemp)"
failed=0
for python in "$@"; do
  ver="$("$python" -c 'import sys; print("%d.%d" % sys.version_info[:2])')" ||
    { echo "release-check: $python does not run"; exit 1; }
  cell="$REL/py$ver"
  mkdir -p "$cell"
  start=$SECONDS
  echo "== release-check: Python $ver ($python), $TF_REQ; log in $cell/log"
  (
    set -euo pipefail
    # The cell's virtualenv is kept between runs while its requirements hold.
    reqs="$python setuptools>=64 wheel $TF_REQ numpy pytest pytest-xdist==3.8.0"
    if [ "$(cat "$cell/venv/.deps" 2>/dev/null)" != "$reqs" ]; then
      rm -rf "$cell/venv"
      "$python" -m venv "$cell/venv"
      "$cell/venv/bin/python" -m pip install -q ${reqs#"$python "}
      echo "$reqs" >"$cell/venv/.deps"
    fi
    bash "$ROOT/tools/wheel.sh" "$cell/venv/bin/python" "$AUDITWHEEL" "$cell/dist"
    wheel="$(ls "$cell"/dist/tf_tpu_emb-*.whl)"
    bash "$ROOT/tools/wheel_check.sh" "$cell/venv/bin/python" "$wheel" "$cell/check"
    cp "$wheel" "$wheel.auditwheel.txt" "$REL/dist/"
  ) >"$cell/log" 2>&1
  rc=$?
  result=$([ $rc -eq 0 ] && echo OK || echo FAILED)
  [ $rc -eq 0 ] || { failed=1; tail -30 "$cell/log"; }
  tests="$(grep -E '^[0-9]+ passed|^=+ .*(passed|failed)' "$cell/log" | tail -1 | tr -d '=')"
  printf "  Python %-5s %-7s %5d s  %s\n" "$ver" "$result" $((SECONDS - start)) "$tests" | tee -a "$summary"
done
echo "== release-check ($TF_REQ)"
cat "$summary"
ls "$REL"/dist/*.whl 2>/dev/null
exit $failed
