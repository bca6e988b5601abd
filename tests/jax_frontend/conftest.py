"""Setup of the JAX lane (tests/jax_frontend; `make test-jax` runs it in .venv-jax).

Where jax-tpu-embedding is installed, the process gets 8 CPU devices (XLA's
--xla_force_host_platform_device_count, read once when jax starts its CPU
backend, so it is set here, before any test imports jax) and the FFI library
is installed; Keras's backend is JAX.  Elsewhere (the main .venv, with TensorFlow and no jax) each
test module skips itself (pytest.importorskip at its top) and nothing here
touches the environment.
"""
import importlib.util
import os

import pytest

MAX_DEVICES = 8

if importlib.util.find_spec("jax_tpu_embedding") is not None:
  _flag = f"--xla_force_host_platform_device_count={MAX_DEVICES}"
  if _flag not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " " + _flag).strip()
  os.environ.setdefault("JAX_PLATFORMS", "cpu")
  os.environ.setdefault("KERAS_BACKEND", "jax")  # Keras-RS on JAX (no TensorFlow here)


@pytest.fixture(scope="session", autouse=True)
def _installed():
  if importlib.util.find_spec("jax_tpu_embedding") is None:
    yield
    return
  import tf_tpu_emb.jax as tj
  tj.install()
  yield
