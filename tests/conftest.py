"""Shared pytest setup for tests/<layer>/: the shared helpers on sys.path, TensorFlow's
C++ logging quiet, the op library loaded once."""
import os
import sys

# Shared helpers (engine_util, optimizer_reference, mid_level_common, the
# child-process harness) live in tests/common; tests of every layer
# (tests/<layer>/) import them by name.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "common"))

# Must happen before anything imports tensorflow (test modules are imported
# after this file).
os.environ["TF_CPP_MIN_LOG_LEVEL"] = "3"

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def lib():
    """The loaded tf_tpu_emb op library module (loaded once per session)."""
    import tf_tpu_emb

    return tf_tpu_emb.load_library()


@pytest.fixture
def engine_released(lib):
    """The process's single engine is shut down before and after the test."""
    from tf_tpu_emb import ops

    del lib
    ops.shutdown_tpu_embedding()
    try:
        yield
    finally:
        ops.shutdown_tpu_embedding()


def pytest_collection_modifyitems(config, items):
    """Skips the cases parametrized with an optimizer this TensorFlow's protos
    lack (tests/common/tf_features.py): FrequencyAwareAdagrad before TF 2.19."""
    del config
    try:
        import tf_features
    except ModuleNotFoundError:  # no TensorFlow: the JAX lane (.venv-jax, tests/jax_frontend)
        return

    if not tf_features.MISSING_OPTIMIZERS:
        return
    for item in items:
        callspec = getattr(item, "callspec", None)
        if callspec is None:
            continue
        info = tf_features.missing_optimizer_in(
            callspec.id + " " + " ".join(repr(v) for v in callspec.params.values()))
        if info is not None:
            item.add_marker(pytest.mark.skip(reason=tf_features.missing_optimizer_reason(info)))
