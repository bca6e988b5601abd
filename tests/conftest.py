"""Shared pytest setup: quiet TensorFlow's C++ logging and load the op library once."""
import os

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
