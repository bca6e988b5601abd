"""The FFI handlers under random damage: buffers of the hand-made valid case
(tests/jax_frontend/test_bad_input.py) and of the package's preprocessing with random
entries replaced by random and extreme values, random attributes and shapes.
Every call either succeeds or is an INVALID_ARGUMENT; none crashes (a child
process runs the cases, so a crash fails the test instead of pytest)."""
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax_tpu_embedding")

pytestmark = [pytest.mark.jax, pytest.mark.system]

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
CASES = int(os.environ.get("TF_TPU_EMB_JAX_FUZZ_CASES", "200"))

CHILD = textwrap.dedent("""
    import sys
    sys.path.insert(0, {tests!r})
    import jax
    import numpy as np
    import tf_tpu_emb.jax as tj
    import test_bad_input as t
    tj.install()
    rng = np.random.default_rng({seed})
    EXTREMES = np.array([0, 1, -1, 7, 8, 9, 15, 16, 17, 23, 24, 25, 2**31 - 1, -2**31], np.int64)

    def damage(b):
      b = {{k: v.copy() for k, v in b.items()}}
      for _ in range(int(rng.integers(1, 4))):
        key = str(rng.choice(["rp", "ids", "samples", "gains"]))
        a = b[key]
        if a.size == 0:
          continue
        i = int(rng.integers(0, a.size))
        if key == "gains":
          a[i] = rng.choice([np.nan, np.inf, -np.inf, 0.0, 1e38, -3.0])
        elif rng.random() < 0.5:
          a[i] = rng.choice(EXTREMES)
        else:
          a[i] = rng.integers(-40, 60)
      if rng.random() < 0.1:  # a truncated buffer
        key = str(rng.choice(["rp", "ids", "samples", "gains"]))
        b[key] = b[key][:int(rng.integers(0, b[key].size + 1))]
      return b

    counts = {{"ok": 0, "invalid": 0}}
    for case in range({cases}):
      b = damage(t.valid_buffers())
      num_sc = int(rng.choice([1, 2, 2, 2, 4, 8]))
      batch = int(rng.choice([4, 4, 4, 5, 8, 0]))
      rows = int(rng.choice([8, 8, 8, 7, 4, 0, 16]))
      table = np.ones((rows, t.DIM), np.float32)
      for call in ("lookup", "grad", "row_grads"):
        try:
          if call == "lookup":
            t.run_lookup(b, tbl=table, batch=batch, num_sc=num_sc)
          elif call == "row_grads":
            agrad = np.ones((int(rng.choice([4, 4, 2, 6])), t.DIM), np.float32)
            t.run_row_grads(b, tbl=table, agrad=agrad, offset=int(rng.choice([0, 0, 1, -1])),
                            capacity=int(rng.choice([rows, rows, 1, 0, 3])))
          else:
            opt = str(rng.choice(["sgd", "adagrad"]))
            vs = [table] + ([np.ones_like(table)] if opt == "adagrad" else [])
            agrad = np.ones((int(rng.choice([4, 4, 2, 6])), t.DIM), np.float32)
            outs = t.run_grad(b, vs, [np.float32(0.1)], agrad=agrad, optimizer=opt,
                              offset=int(rng.choice([0, 0, 0, 1, -1])))
            [np.asarray(o) for o in outs]
          counts["ok"] += 1
        except (jax.errors.JaxRuntimeError, ValueError) as e:
          if "INVALID_ARGUMENT" not in str(e):
            print("CASE", case, call, "unexpected error:", e)
            sys.exit(3)
          counts["invalid"] += 1
    print("COUNTS", counts["ok"], counts["invalid"])
""")


@pytest.mark.parametrize("seed", [1, 2])
def test_random_damage_is_invalid_argument_or_valid_never_a_crash(seed):
  env = dict(os.environ, JAX_PLATFORMS="cpu", PYTHONPATH=ROOT)
  code = CHILD.format(tests=os.path.dirname(os.path.abspath(__file__)), seed=seed,
                      cases=CASES // 2)
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                       timeout=600 + CASES * 0.25, cwd=ROOT)  # long runs: more time
  assert out.returncode == 0, (out.returncode, out.stdout[-2000:], out.stderr[-3000:])
  counts = [line for line in out.stdout.splitlines() if line.startswith("COUNTS")]
  assert counts, out.stdout
  ok, invalid = map(int, counts[0].split()[1:])
  assert ok + invalid == 3 * (CASES // 2)  # three calls a case, CASES // 2 cases a seed
  assert ok > 0 and invalid > 0, counts  # both kinds of outcome were reached
