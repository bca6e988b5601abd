#!/usr/bin/env bash
# `make package-check`: the pip package as a user gets it.
#   1. sdist (python -m build --sdist --no-isolation) from the git tree;
#   2. a wheel built by pip from that sdist (what `pip install <sdist>` runs:
#      --no-build-isolation, so it compiles against the TensorFlow installed);
#   3. a fresh virtualenv that has TensorFlow (the build venv's site-packages
#      appended by a .pth file: TensorFlow is shared, nothing of tf_tpu_emb is
#      visible), the wheel installed into it with dependencies resolved
#      offline -- the requirement on TensorFlow must be met by the one
#      installed, never by a second TensorFlow;
#   4. a representative part of the suite run from a copy of tests/ outside
#      the source tree, so that the installed package is what is imported.
# usage: tools/package_check.sh PYTHON OUTDIR
set -euo pipefail
PY="$1"
OUT="$2"
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
"$PY" -m pip wheel -q --no-build-isolation --no-deps -w "$OUT/dist" "$SDIST" >"$OUT/wheel.log" 2>&1 ||
  { tail -40 "$OUT/wheel.log"; exit 1; }
WHEEL="$(ls "$OUT"/dist/tf_tpu_emb-*.whl)"

echo "== fresh virtualenv with TensorFlow, wheel installed"
"$PY" -m venv "$OUT/venv"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
NEW_SITE="$("$OUT/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$SITE" >"$NEW_SITE/zz_shared_tensorflow.pth"
"$OUT/venv/bin/python" -m pip install -q --no-index "$WHEEL"
"$OUT/venv/bin/python" -m pip check

echo "== tests against the installed package"
mkdir -p "$OUT/run"
cp -r tests "$OUT/run/tests"
# Documents some tests run as printed (README, docs/ commands, examples/).
cp -r README.md docs examples "$OUT/run/"
find "$OUT/run" -name __pycache__ -prune -exec rm -rf {} +
cd "$OUT/run"
export TF_CPP_MIN_LOG_LEVEL=3
"$OUT/venv/bin/python" - "$NEW_SITE" <<'PYEOF'
import os, sys, tf_tpu_emb
assert tf_tpu_emb.__file__.startswith(sys.argv[1]), tf_tpu_emb.__file__
print("tf_tpu_emb", tf_tpu_emb.__version__, "from", os.path.dirname(tf_tpu_emb.__file__))
PYEOF
"$OUT/venv/bin/python" -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=15 ${PACKAGE_CHECK_TESTS:-tests/c_api \
  tests/packaging tests/api/test_loader.py tests/api/test_gradient_layout.py \
  tests/api/test_gradients_tf1.py tests/api/test_gradients_tf2.py \
  tests/engine/test_forward_combiners.py tests/engine/test_forward_shapes.py \
  tests/engine/test_forward_enqueue_ops.py tests/engine/test_forward_modes.py \
  tests/engine/test_load_retrieve.py tests/engine/test_optimizer_formulas.py \
  tests/engine/test_optimizer_pipeline.py tests/engine/test_optimizer_sends.py \
  tests/keras/test_keras_layer.py}
echo "package-check: OK ($SDIST, $WHEEL)"
