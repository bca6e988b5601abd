"""The JAX stand-in (tf_tpu_emb.jax.standin, `python -m tf_tpu_emb.run --jax`):
what a TPU program sees, and guards on the facts of its clients it relies on.

The runner's checks run in child processes (the stand-in sets XLA's device
count before jax starts, and rebinds jax's names); the guards run here and
fail when jax-tpu-embedding or Keras-RS change what the stand-in relies on
(tf_tpu_emb/jax/standin.py lists it).
"""
import importlib
import inspect
import os
import subprocess
import sys
import textwrap

import pytest

pytest.importorskip("jax_tpu_embedding")
pytest.importorskip("keras_rs")

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

PROGRAM = textwrap.dedent("""
    import sys
    import jax
    import keras
    import keras_rs
    from jax_tpu_embedding.sparsecore.lib.nn import embedding
    from jax_tpu_embedding.sparsecore.utils import utils

    cpu = jax.devices("cpu")
    tpu = jax.devices("tpu")
    assert tpu == cpu == jax.devices() == jax.local_devices(backend="tpu"), tpu
    assert jax.device_count("tpu") == jax.local_device_count("tpu") == len(cpu)
    assert keras.distribution.list_devices("tpu") == [f"cpu:{d.id}" for d in cpu]
    print("sc", utils.num_sparsecores_per_device(), utils.num_sparsecores_per_device(cpu[-1]),
          embedding._get_num_sc_per_device(None))

    table = keras_rs.layers.TableConfig(name="t", vocabulary_size=64, embedding_dim=8,
                                        placement=sys.argv[1])
    feature = keras_rs.layers.FeatureConfig(name="f", table=table, input_shape=(16, 1),
                                            output_shape=(16, 8))
    layer = keras_rs.layers.DistributedEmbedding({"f": feature})
    print("placements", sorted(layer._placement_to_path_to_feature_config))
    print("tensorflow imported:", "tensorflow" in sys.modules)

    from tf_tpu_emb.jax import standin
    try:
        standin.install(1)
    except RuntimeError as e:
        print("second install:", e)
    standin.uninstall()  # jax's and the clients' own names again
    try:
        jax.devices("tpu")
    except RuntimeError:
        print("uninstalled: no tpu devices")
    try:
        utils.num_sparsecores_per_device(cpu[0])
    except ValueError:
        print("uninstalled: cpu sparsecores unknown")
    print("uninstalled: has_sparsecore", layer._has_sparsecore())
""")


def run(tmp_path, *runner_args, placement="auto", env_extra=None):
  script = tmp_path / "program.py"
  script.write_text(PROGRAM)
  env = dict(os.environ)
  for name in ("XLA_FLAGS", "JAX_PLATFORMS", "KERAS_BACKEND", "TF_TPU_EMB_SPARSECORES"):
    env.pop(name, None)
  env.update(env_extra or {})
  return subprocess.run(
      [sys.executable, "-m", "tf_tpu_emb.run", *runner_args, str(script), placement],
      cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)


@pytest.mark.parametrize("replicas,sparsecores,placement", [(2, None, "auto"),
                                                            (3, "2", "sparsecore")])
def test_runner_presents_sparsecore_chips(tmp_path, replicas, sparsecores, placement):
  args = ["--jax", "--replicas", str(replicas)]
  if sparsecores:
    args += ["--sparsecores-per-chip", sparsecores]
  proc = run(tmp_path, *args, placement=placement)
  assert proc.returncode == 0, proc.stderr[-4000:]
  s = int(sparsecores or 4)
  assert f"sc {s} {s} {s}" in proc.stdout, proc.stdout
  assert "placements ['sparsecore']" in proc.stdout, proc.stdout
  assert "tensorflow imported: False" in proc.stdout, proc.stdout
  assert "second install: a JAX stand-in is already installed" in proc.stdout, proc.stdout
  for line in ("no tpu devices", "cpu sparsecores unknown", "has_sparsecore False"):
    assert "uninstalled: " + line in proc.stdout, proc.stdout


def test_sparsecores_from_the_environment(tmp_path):
  proc = run(tmp_path, "--jax", env_extra={"TF_TPU_EMB_SPARSECORES": "2"})
  assert proc.returncode == 0, proc.stderr[-4000:]
  assert "sc 2 2 2" in proc.stdout, proc.stdout


@pytest.mark.parametrize("args,message", [
    (["--jax", "--sparsecores-per-chip", "3"], "num_sc_per_device: '3'"),
    (["--jax", "--embedding", "v2"], "--embedding is TensorFlow's"),
    (["--sparsecores-per-chip", "4"], "--sparsecores-per-chip needs --jax"),
    (["--jax", "--replicas", "0"], "--replicas must be a positive integer"),
])
def test_runner_refuses_bad_usage(tmp_path, args, message):
  proc = run(tmp_path, *args)
  assert proc.returncode == 2, (proc.stdout, proc.stderr[-2000:])
  assert message in proc.stderr, proc.stderr[-2000:]


# --- guards on the clients' facts (module doc of tf_tpu_emb/jax/standin.py) ---

def test_guard_keras_rs_sparsecore_check():
  """The seam: Keras-RS's private _has_sparsecore(self) decides by
  jax.devices("tpu")[0].device_kind; the stand-in replaces that method."""
  os.environ.setdefault("KERAS_BACKEND", "jax")
  from tf_tpu_emb.jax import standin
  base = importlib.import_module(standin.KERAS_RS_BASE_MODULE)
  import jax
  import keras
  assert keras.backend.backend() == "jax"
  method = base.DistributedEmbedding.__dict__.get("_has_sparsecore")
  assert callable(method), "keras_rs moved its SparseCore check: update tf_tpu_emb/jax/standin.py"
  assert list(inspect.signature(method).parameters) == ["self"]
  # The JAX layer inherits it (the stand-in replaces it on the base class).
  jax_layer = importlib.import_module("keras_rs.src.layers.embedding.jax.distributed_embedding")
  assert "_has_sparsecore" not in jax_layer.DistributedEmbedding.__dict__
  assert issubclass(jax_layer.DistributedEmbedding, base.DistributedEmbedding)
  # What it reads: the first TPU device's kind (a CPU answers False).
  assert method(None) is False

  class Device:
    def __init__(self, kind):
      self.device_kind = kind

  original = jax.devices
  try:
    for kind, want in (("TPU v5", True), ("TPU v6 lite", True), ("cpu", False)):
      jax.devices = lambda backend=None, kind=kind: [Device(kind)] if backend == "tpu" else []
      assert method(None) is want, kind
  finally:
    jax.devices = original


def test_guard_jax_tpu_embedding_sparsecore_query():
  """The public function the stand-in rebinds, and that its callers reach it
  through the module attribute (a `from utils import ...` would miss it)."""
  from tf_tpu_emb.jax import standin
  utils = importlib.import_module(standin.JTE_UTILS_MODULE)
  assert list(inspect.signature(utils.num_sparsecores_per_device).parameters) == ["device"]
  assert {2, 4} <= set(utils.NUM_SC_PER_DEVICE_MAP.values())
  callers = ["jax_tpu_embedding.sparsecore.lib.nn.embedding",
             "jax_tpu_embedding.sparsecore.lib.core.input_preprocessing",
             "keras_rs.src.layers.embedding.jax.distributed_embedding",
             "keras_rs.src.layers.embedding.jax.embedding_lookup"]
  os.environ.setdefault("KERAS_BACKEND", "jax")
  for name in callers:
    module = importlib.import_module(name)
    source = inspect.getsource(module)
    assert "utils.num_sparsecores_per_device(" in source, name
    assert getattr(module, "num_sparsecores_per_device", None) is None, name


def test_guard_jax_device_functions_take_backend():
  """The jax names the stand-in rebinds each take a `backend` argument."""
  import jax
  from tf_tpu_emb.jax import standin
  for name in standin._JAX_DEVICE_NAMES:
    assert "backend" in inspect.signature(getattr(jax, name)).parameters, name
