"""Fixtures of the engine tests (tests/engine): fctx and tctx, the bad-input
tests' engine configured in feature-descriptor and in table mode with random
tables loaded (bad_input_common.Ctx)."""
import pytest

import engine_util as eu
from bad_input_common import _make_ctx, feature_config, table_config


@pytest.fixture
def fctx():
    config = feature_config()
    with eu.engine(config):
        yield _make_ctx(config, 1)


@pytest.fixture
def tctx():
    config = table_config()
    with eu.engine(config):
        yield _make_ctx(config, 2)
