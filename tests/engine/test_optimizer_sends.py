"""The transactional behaviour of SendTPUEmbeddingGradients: an invalid Send
(no Recv, a second Send, after an inference batch, wrong gradient or
learning-rate shapes or counts, an unset learning rate, non-finite values
under TF_TPU_EMB_CHECK_NUMERICS) fails and leaves tables and slots
bit-identical, and a valid Send still works; without the check a NaN reaches
exactly the rows its bag touches.

Run with -s to see the maximum observed errors per case (ERRORS lines).
"""
import contextlib
import os

import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
import optimizer_reference as ref
from optimizer_reference import TableParams
from optimizer_training import (B, L, TABLES, compare_tables, enqueue, initial_state,
                                make_batch, make_config, make_grads, retrieve_all, send,
                                snapshot_equal, table_outputs, zlib_seed)
from optimizer_training import _print_errors  # noqa: F401 (an autouse fixture)

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]


# ==================================================== 5: transactional / errors

TX_PARAMS = [TableParams("adam", dict(beta1=0.9, beta2=0.99, epsilon=1e-3), lr_tag=0),
             TableParams("ftrl", dict(l1=0.3, l2=0.2, lr_power=-0.5), lr_tag=1)]
TX_LRS = [0.1, 0.2]


@contextlib.contextmanager
def env_var(name, value):
    """Sets (or, with None, removes) an environment variable, restoring it after."""
    old = os.environ.get(name)
    if value is None:
        os.environ.pop(name, None)
    else:
        os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


class Tx:
    """A configured engine with random state and its numpy reference."""

    def __init__(self, config, params, rng):
        self.config, self.params, self.rng = config, params, rng
        init = [initial_state(rng, p.optimizer, vocab, dim)
                for (_, vocab, dim), p in zip(TABLES, params)]
        for t, st in enumerate(init):
            eu.load_table(config.table_descriptor[t], st)
        self.want = [ref.copy_state(st) for st in init]

    def batch(self, mode="train"):
        bags = make_batch(self.rng)
        enqueue(bags, mode=mode)
        eu.recv(self.config)
        return bags, make_grads(self.rng)

    def apply(self, bags, grads, lrs=TX_LRS):
        send(self.config, grads, lrs)
        for t, p in enumerate(self.params):
            ref.step(p, self.want[t], ref.contributions(table_outputs(bags, grads, t)), lrs)
        self.check()

    def check(self):
        compare_tables(retrieve_all(self.config), self.want, "transactional")

    def snapshot(self):
        return retrieve_all(self.config)


@contextlib.contextmanager
def tx_engine(seed, params=TX_PARAMS, check_numerics=None, config=None):
    config = config or make_config(params)
    with env_var("TF_TPU_EMB_CHECK_NUMERICS", check_numerics):
        with eu.engine(config):
            yield Tx(config, params, np.random.default_rng(seed))


def expect_unchanged(tx, error, match, fn):
    before = tx.snapshot()
    with pytest.raises(error, match=match):
        fn()
    snapshot_equal(before, tx.snapshot())


def test_send_before_any_recv():
    with tx_engine(1) as tx:
        grads = make_grads(tx.rng)
        expect_unchanged(tx, tf.errors.FailedPreconditionError, "no batch to send",
                         lambda: send(tx.config, grads, TX_LRS))
        tx.apply(*tx.batch())


def test_second_send_for_one_recv():
    with tx_engine(2) as tx:
        bags, grads = tx.batch()
        tx.apply(bags, grads)
        expect_unchanged(tx, tf.errors.FailedPreconditionError, "send once per Recv",
                         lambda: send(tx.config, grads, TX_LRS))
        tx.apply(*tx.batch())


def test_send_after_inference_batch():
    with tx_engine(3) as tx:
        _, grads = tx.batch(mode="inference")
        expect_unchanged(tx, tf.errors.FailedPreconditionError, "inference",
                         lambda: send(tx.config, grads, TX_LRS))
        tx.apply(*tx.batch())


def _bad_send(kind, grads):
    """(gradients, learning rates) of an invalid Send."""
    g = list(grads)
    lrs = list(TX_LRS)
    if kind == "gradient_shape":
        g[1] = np.zeros((B, TABLES[1][2] + 1), np.float32)
    elif kind == "gradient_rank":
        g[3] = g[3].reshape(B * L, -1)
    elif kind == "gradient_batch":
        g[0] = g[0][:-1]
    elif kind == "too_few_gradients":
        g = g[:-1]
    elif kind == "too_many_gradients":
        g = g + [g[0]]
    elif kind == "too_few_learning_rates":
        lrs = lrs[:1]
    elif kind == "too_many_learning_rates":
        lrs = lrs + [0.3]
    elif kind == "no_learning_rates":
        lrs = []
    elif kind == "learning_rate_not_scalar":
        lrs = [[0.1, 0.1], 0.2]
    return g, lrs


@pytest.mark.parametrize("kind", [
    "gradient_shape", "gradient_rank", "gradient_batch", "too_few_gradients",
    "too_many_gradients", "too_few_learning_rates", "too_many_learning_rates",
    "no_learning_rates", "learning_rate_not_scalar"])
def test_invalid_send_leaves_state_untouched(kind):
    with tx_engine(zlib_seed(kind)) as tx:
        bags, grads = tx.batch()
        g, lrs = _bad_send(kind, grads)
        expect_unchanged(tx, tf.errors.InvalidArgumentError, "SendTPUEmbeddingGradients",
                         lambda: send(tx.config, g, lrs))
        tx.apply(bags, grads)  # the same Recv can still be sent for
        tx.apply(*tx.batch())


def test_unset_learning_rate_names_the_table():
    params = [TX_PARAMS[0], TableParams("ftrl", dict(l1=0.3, l2=0.2, lr_power=-0.5))]
    config = make_config(params)
    config.table_descriptor[1].optimization_parameters.ClearField("learning_rate")
    with tx_engine(4, params=params, config=config) as tx:
        _, grads = tx.batch()
        expect_unchanged(tx, tf.errors.FailedPreconditionError, "table 'u'.*learning_rate",
                         lambda: send(tx.config, grads, [0.1]))


@pytest.mark.parametrize("kind", ["nan_gradient", "inf_gradient", "nan_learning_rate"])
def test_check_numerics_rejects_non_finite(kind):
    with tx_engine(zlib_seed(kind), check_numerics="1") as tx:
        bags, grads = tx.batch()
        g, lrs = [x.copy() for x in grads], list(TX_LRS)
        if kind == "nan_gradient":
            g[3][2, 1, 0] = np.nan
        elif kind == "inf_gradient":
            g[1][0, 1] = -np.inf
        else:
            lrs[1] = np.nan
        expect_unchanged(tx, tf.errors.InvalidArgumentError, "finite",
                         lambda: send(tx.config, g, lrs))
        tx.apply(bags, grads)
        tx.apply(*tx.batch())


def test_nan_gradient_propagates_without_check_numerics():
    """Off by default (as on TPU): a NaN reaches exactly the rows its bag
    touches; every other row is updated normally."""
    params = [TableParams("adagrad"), TableParams("adagrad")]
    with tx_engine(5, params=params, check_numerics=None) as tx:
        bags, grads = tx.batch()
        grads[0][0, 1] = np.nan  # fsum bag 0 = ids 5, 5, 2 of table t
        send(tx.config, grads)
        for t, p in enumerate(params):
            ref.step(p, tx.want[t], ref.contributions(table_outputs(bags, grads, t)))
        got = tx.snapshot()
        compare_tables(got, tx.want, "nan propagation")  # NaN == NaN here
        nan_rows = set(np.nonzero(np.isnan(got[0][0]).any(1))[0].tolist())
        assert nan_rows == {2, 5}, nan_rows
        assert np.isnan(got[0][0][[2, 5], 1]).all() and np.isnan(got[0][1][[2, 5], 1]).all()
        assert not np.isnan(got[1][0]).any()
