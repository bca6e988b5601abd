#!/usr/bin/env bash
# `make package-check`: the pip package as a user gets it.
#   1. sdist (python -m build --sdist --no-isolation) from the git tree;
#   2. a wheel built by pip from that sdist, unpacked (what `pip install <sdist>` runs:
#      --no-build-isolation, so it compiles against the TensorFlow installed);
#   3. that wheel repaired to a manylinux tag as `make wheel` repairs its own
#      (tools/wheel.sh: TensorFlow's libraries excluded, nothing grafted);
#   4. tools/wheel_check.sh: a fresh virtualenv that has TensorFlow (the build
#      venv's site-packages appended by a .pth file) and no compiler on PATH,
#      the repaired wheel installed with dependencies resolved offline -- the
#      requirement on TensorFlow must be met by the one installed, never by a
#      second TensorFlow -- and a representative part of the suite run from a
#      copy of tests/ outside the source tree, so that the installed package
#      is what is imported;
#   5. tests/c_api against the same install with the compiler back on PATH
#      (it compiles a C client of the installed plugin).
# usage: tools/package_check.sh PYTHON AUDITWHEEL OUTDIR
set -euo pipefail
PY="$1"
AUDITWHEEL="$2"
OUT="$3"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
rm -rf "$OUT" && mkdir -p "$OUT/dist"
cd "$ROOT"

echo "== sdist"
"$PY" -m build --sdist --no-isolation --outdir "$OUT/dist" . >"$OUT/sdist.log" 2>&1 ||
  { tail -40 "$OUT/sdist.log"; exit 1; }
SDIST="$(ls "$OUT"/dist/tf_tpu_emb-*.tar.gz)"
# Everything the build reads must be in it (the C++ of every layer).
tar -tzf "$SDIST" | sed 's|^[^/]*/||' >"$OUT/sdist.files"
for f in $(git ls-files core engine kernels ops setup.py pyproject.toml LICENSE MANIFEST.in); do
  grep -qxF "$f" "$OUT/sdist.files" || { echo "sdist lacks $f"; exit 1; }
done
if grep -E '\.so$|_build_info\.py$' "$OUT/sdist.files"; then echo "sdist carries build outputs"; exit 1; fi

echo "== wheel from the sdist"
# Unpacked as pip unpacks it, but into a folder of the tree's (pip builds a
# local folder in place): ccache's base directory (the Makefile's
# CCACHE_BASEDIR) then covers it, and a compile another copy of the tree
# made is a cache hit, not 24 files compiled again.
mkdir -p "$OUT/src"
tar -xzf "$SDIST" -C "$OUT/src" --strip-components=1
"$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$OUT/dist" "$OUT/src" >"$OUT/wheel.log" 2>&1 ||
  { tail -40 "$OUT/wheel.log"; exit 1; }
WHEEL="$(ls "$OUT"/dist/tf_tpu_emb-*.whl)"

echo "== the wheel repaired to a manylinux tag"
bash tools/wheel.sh "$PY" "$AUDITWHEEL" "$OUT/repaired" "$WHEEL"
REPAIRED="$(ls "$OUT"/repaired/tf_tpu_emb-*-manylinux*.whl)"

WHEEL_CHECK_TESTS="${PACKAGE_CHECK_TESTS:-tests/packaging tests/api/test_loader.py \
  tests/api/test_gradient_layout.py tests/api/test_gradients_tf1.py tests/api/test_gradients_tf2.py \
  tests/engine/test_forward_combiners.py tests/engine/test_forward_shapes.py \
  tests/engine/test_forward_enqueue_ops.py tests/engine/test_forward_modes.py \
  tests/engine/test_load_retrieve.py tests/engine/test_optimizer_formulas.py \
  tests/engine/test_optimizer_pipeline.py tests/engine/test_optimizer_sends.py \
  tests/keras/test_keras_layer.py}" bash tools/wheel_check.sh "$PY" "$REPAIRED" "$OUT/check"

echo "== tests/c_api against the installed wheel, with a compiler"
cd "$OUT/check/run"
TF_CPP_MIN_LOG_LEVEL=3 PATH="$OUT/check/venv/bin:$PATH" "$OUT/check/venv/bin/python" -m pytest -q \
  -p no:cacheprovider --durations=5 tests/c_api
echo "package-check: OK ($SDIST, $(basename "$REPAIRED"))"
