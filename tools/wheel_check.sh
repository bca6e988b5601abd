#!/usr/bin/env bash
# `make wheel-check`: the binary wheel as a user without a compiler gets it.
#   1. a PATH with no C or C++ compiler, assembler or linker: a folder of links
#      to the system's programs less those (checked: `command -v g++` etc.
#      find nothing), with the fresh virtualenv's bin/ first;
#   2. a fresh virtualenv that has TensorFlow (the build virtualenv's
#      site-packages appended by a .pth file: TensorFlow is shared, nothing
#      of tf_tpu_emb is visible); the wheel installed into it under that PATH,
#      binary only and offline, with its dependencies resolved against what is
#      installed -- its pin on TensorFlow's minor must be met by the
#      TensorFlow it was built against, never by a second one;
#   3. the package tests (tests/packaging: version, licence, the pin, the
#      portable build) and a functional part of the suite, run under that PATH
#      from a copy of tests/ outside the source tree, so that the installed
#      package is what is imported.  tests/c_api is not among them: it
#      compiles a C program (make package-check runs it against a wheel).
# usage: tools/wheel_check.sh BUILD_PYTHON WHEEL OUTDIR
set -euo pipefail
PY="$1"
WHEEL="$(cd "$(dirname "$2")" && pwd)/$(basename "$2")"
OUT="$3"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
rm -rf "$OUT" && mkdir -p "$OUT/nocc"
cd "$ROOT"

echo "== a PATH without compilers"
# Compiler drivers, the preprocessor, assembler, linker and compiler caches,
# under their plain, versioned and target-prefixed names.
COMPILER='^((.*-)?(cc|c\+\+|c89|c99|gcc|g\+\+|cpp|clang|clang\+\+|tcc|as|ld|ld\..*|gold|lld|ccache|distcc)(-[0-9.]+)?)$'
for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
  [ -d "$dir" ] || continue
  for prog in "$dir"/*; do
    name="$(basename "$prog")"
    [ -x "$prog" ] && [ ! -d "$prog" ] || continue
    [ -e "$OUT/nocc/$name" ] && continue
    [[ "$name" =~ $COMPILER ]] && continue
    ln -s "$prog" "$OUT/nocc/$name"
  done
done
"$PY" -m venv "$OUT/venv"
NOCC_PATH="$OUT/venv/bin:$OUT/nocc"
for tool in g++ gcc cc c++ clang clang++ cpp as ld; do
  if env PATH="$NOCC_PATH" bash -c "command -v $tool" >/dev/null 2>&1; then
    echo "wheel-check: $tool is still on the compiler-free PATH"; exit 1
  fi
done
nocc() { env PATH="$NOCC_PATH" "$@"; }

echo "== fresh virtualenv with TensorFlow, the wheel installed without a compiler"
SITE="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
NEW_SITE="$("$OUT/venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
echo "$SITE" >"$NEW_SITE/zz_shared_tensorflow.pth"
nocc python -m pip install -q --no-index --only-binary=:all: "$WHEEL"
nocc python -m pip check

echo "== tests against the installed wheel"
mkdir -p "$OUT/run"
cp -r tests "$OUT/run/tests"
# The JAX front end's tests run in their own virtualenv (make test-jax).
rm -rf "$OUT/run/tests/jax_frontend"
# Documents some tests run as printed (README, docs/ commands, examples/).
cp -r README.md docs examples "$OUT/run/"
find "$OUT/run" -name __pycache__ -prune -exec rm -rf {} +
cd "$OUT/run"
export TF_CPP_MIN_LOG_LEVEL=3
nocc python - "$NEW_SITE" "$(basename "$WHEEL")" <<'PYEOF'
import os, sys, tf_tpu_emb
from tf_tpu_emb import _loader
site, wheel = sys.argv[1:]
assert tf_tpu_emb.__file__.startswith(site), tf_tpu_emb.__file__
assert _loader.library_path().startswith(site), _loader.library_path()
assert wheel.startswith("tf_tpu_emb-%s-" % tf_tpu_emb.__version__), wheel
_loader.load_library()
print("tf_tpu_emb", tf_tpu_emb.__version__, "from", os.path.dirname(tf_tpu_emb.__file__))
PYEOF
nocc python -m pytest -q -p no:cacheprovider -n 2 --dist loadfile --durations=10 \
  ${WHEEL_CHECK_TESTS:-tests/packaging tests/api/test_loader.py tests/api/test_gradient_layout.py \
  tests/api/test_gradients_tf2.py tests/engine/test_forward_combiners.py \
  tests/engine/test_forward_shapes.py tests/engine/test_optimizer_formulas.py \
  tests/keras/test_keras_layer.py}
echo "wheel-check: OK ($(basename "$WHEEL"))"
