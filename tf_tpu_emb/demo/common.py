"""What the demo jobs share: progress bar, plotting set-up, metrics file,
stock-op SavedModel export and the fresh-process check of that SavedModel."""
import json
import os
import shutil
import subprocess
import sys
import time

import numpy as np
import tensorflow as tf

import tf_tpu_emb


class Progress:
    """A text progress bar on stdout (one redrawn line on a terminal, a line
    per report otherwise)."""

    def __init__(self, total, width=28, stream=sys.stdout):
        self.total, self.width, self.stream = total, width, stream
        self.tty = stream.isatty()
        self.start = time.perf_counter()
        self._last = 0.0
        self._open = False  # a redrawn line is on the terminal

    def update(self, step, text, force=False):
        now = time.perf_counter()
        if not self.tty and not force:
            return
        if self.tty and not force and now - self._last < 0.1 and step < self.total:
            return
        self._last = now
        frac = step / self.total
        filled = int(round(self.width * frac))
        elapsed = now - self.start
        eta = elapsed / frac - elapsed if frac > 0 else 0.0
        line = "[{}{}] {:>5}/{} {:3.0f}%  {}  {:d}:{:02d}<{:d}:{:02d}".format(
            "#" * filled, "." * (self.width - filled), step, self.total, 100 * frac, text,
            int(elapsed) // 60, int(elapsed) % 60, int(eta) // 60, int(eta) % 60)
        if self.tty:  # redraw in place; reports (force) stay on screen
            self.stream.write("\r" + line + "\033[K" + ("\n" if force else ""))
            self._open = not force
        else:
            self.stream.write(line + "\n")
        self.stream.flush()

    def close(self):
        if self._open:
            self.stream.write("\n")
            self.stream.flush()
            self._open = False


def require_matplotlib(target):
    """Fails before training when the plot at the end could not be drawn."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        raise SystemExit("The demo plots with matplotlib: pip install matplotlib "
                         "(`make %s` installs it)." % target)


def prepare_run(args, target):
    """Before training: matplotlib present, the output folder made, seeds set."""
    require_matplotlib(target)
    os.makedirs(args.out, exist_ok=True)
    tf.keras.utils.set_random_seed(args.seed)


def pyplot():
    """matplotlib.pyplot on the non-interactive Agg backend."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    return plt


def write_json(path, obj):
    with open(path, "w") as f:
        json.dump(obj, f, indent=1)
    return path


def serving_lookup(embedding, input_signature):
    """The in-process stock-op module of ``tf_tpu_emb.serving.serving_module``
    (the trained tables copied into variables, ``lookup`` = TF's CPU serving
    lookup) for a model to build on; nothing is written."""
    return tf_tpu_emb.serving.serving_module(embedding, input_signature)


def save_stock_op_model(path, name, lookup_module, serve, **functions):
    """Saves `serve` (a tf.function with an input signature, the SavedModel's
    ``serving_default``) and `functions` (more tf.functions with signatures) on a
    module that also tracks the lookup tables and every variable they read.
    Every function and the written SavedModel are checked to hold stock TF ops
    only (``tf_tpu_emb.serving.assert_stock_ops``)."""
    serve_cf = serve.get_concrete_function()
    tf_tpu_emb.serving.assert_stock_ops(serve_cf, "serving signature")
    for fname, fn in functions.items():
        tf_tpu_emb.serving.assert_stock_ops(fn.get_concrete_function(), fname)
    module = tf.Module(name=name)
    module.embedding = lookup_module
    tables = {id(v) for v in lookup_module.tables.values()}
    module.model_variables = [v for v in serve_cf.variables if id(v) not in tables]
    module.serve = serve
    for fname, fn in functions.items():
        setattr(module, fname, fn)
    shutil.rmtree(path, ignore_errors=True)
    tf.saved_model.save(module, path, signatures={"serving_default": serve_cf})
    tf_tpu_emb.serving.assert_stock_ops(path, "SavedModel")
    return module


# Run in a fresh interpreter: TensorFlow + numpy only.  Calls the SavedModel's
# serving_default on the inputs of an .npz (keys not starting with "_") and
# writes every output, and whether `output` matches "_expected", to a JSON file.
SCORE_SCRIPT = r"""
import json, os, sys
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
import numpy as np
import tensorflow as tf
saved_model, examples, output, out = sys.argv[1:5]
data = dict(np.load(examples))
serve = tf.saved_model.load(saved_model).signatures["serving_default"]
inputs = {k: tf.constant(v) for k, v in data.items() if not k.startswith("_")}
result = {k: v.numpy() for k, v in serve(**inputs).items()}
assert "tf_tpu_emb" not in sys.modules, "tf_tpu_emb was imported"
print("  fresh process (tensorflow %s only; tf_tpu_emb imported: %s) scored %d examples"
      % (tf.__version__, "tf_tpu_emb" in sys.modules, len(result[output])))
ok = bool(np.allclose(result[output], data["_expected"], rtol=1e-4, atol=1e-5))
json.dump({"outputs": {k: v.tolist() for k, v in result.items()},
           "matches_in_process": ok}, open(out, "w"))
if not ok:
    sys.exit("SavedModel outputs differ from the in-process model")
"""


def score_in_fresh_process(saved_model, inputs, output, expected, out_dir):
    """Runs `saved_model`'s serving_default on `inputs` ({name: array}) in a new
    Python process that imports only TensorFlow and numpy; fails unless its
    `output` matches `expected` (the in-process model).  Returns
    ``{"outputs": {name: list}, "matches_in_process": True}``; the inputs and
    scores are kept in `out_dir` (serving_examples.npz, serving_scores.json)."""
    examples = os.path.join(out_dir, "serving_examples.npz")
    np.savez(examples, _expected=np.asarray(expected), **inputs)
    scores = os.path.join(out_dir, "serving_scores.json")
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    result = subprocess.run(
        [sys.executable, "-c", SCORE_SCRIPT, os.path.abspath(saved_model), examples, output,
         scores], capture_output=True, text=True, env=env, cwd=out_dir)
    sys.stdout.write(result.stdout)
    if result.returncode != 0:
        sys.stderr.write(result.stderr[-4000:])
        raise SystemExit("scoring the SavedModel in a fresh process failed (exit %d)"
                         % result.returncode)
    with open(scores) as f:
        return json.load(f)
