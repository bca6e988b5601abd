"""What the bad-input tests of tests/engine share (test_bad_enqueue.py,
test_bad_recv_load.py, test_bad_configure.py): the two-table scenario, a
context that knows the loaded tables and a valid batch and checks that a
failed op left the engine untouched (nothing queued, tables unchanged, a
valid step still matches the numpy reference) -- the fixtures fctx and tctx
of tests/engine/conftest.py configure it in feature-descriptor and in table
mode --, and the error-message check."""
import dataclasses

import numpy as np
import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec


IA = tf.errors.InvalidArgumentError
FP = tf.errors.FailedPreconditionError
UNIMPL = tf.errors.UnimplementedError


B = 4
ARB = "EnqueueTPUEmbeddingArbitraryTensorBatch"
FEATURES = [("watched", 0), ("friends", 1), ("favorited", 0)]
TNAMES = ["video", "user"]
VOCAB = [10, 16]
COMBINERS = ["mean", "sqrtn"]  # per table


def _tables(nf=(0, 0)):
    return [TableSpec("video", 10, 4, num_features=nf[0]),
            TableSpec("user", 16, 3, num_features=nf[1])]


def feature_config():
    return eu.feature_mode_config(_tables(), [FeatureSpec(n, t, [B]) for n, t in FEATURES])


def table_config():
    return eu.table_mode_config(_tables(nf=(2, 1)), B)


@dataclasses.dataclass
class Ctx:
    config: object
    tables: dict
    bags: list

    def args(self):
        """Fresh (mutable numpy) valid enqueue arguments, one per feature:
        COO indices [n, 2] int64, ids int64, weights float32."""
        out = []
        for b in self.bags:
            sp, spw = eu.bags_to_sparse(b)
            out.append([sp.indices.numpy().copy(), sp.values.numpy().copy(),
                        spw.values.numpy().copy()])
        return out

    def ragged_args(self):
        out = []
        for b in self.bags:
            rg, rgw = eu.bags_to_ragged(b)
            out.append([rg.row_splits.numpy().copy(), rg.values.numpy().copy(),
                        rgw.values.numpy().copy()])
        return out

    def expected(self):
        ref = [eu.reference_lookup(self.tables[TNAMES[t]][0], b, COMBINERS[t])
               for b, (_, t) in zip(self.bags, FEATURES)]
        if self.config.feature_descriptor:
            return ref
        return [eu.interleave_table_rows([ref[0], ref[2]]), ref[1]]

    def valid_step(self):
        if self.config.feature_descriptor:
            eu.enqueue_arbitrary(self.args(), combiners=COMBINERS)
        else:
            eu.enqueue_sparse_tensor(self.args(), [t for _, t in FEATURES], combiners=COMBINERS)

    def check_recv(self, what="valid step"):
        got = eu.recv(self.config)
        for o, want in enumerate(self.expected()):
            eu.assert_close(got[o], want, what="%s output %d" % (what, o))

    def assert_untouched(self):
        """Nothing was queued, tables unchanged, the engine still works."""
        eu.assert_nothing_enqueued(self.config)
        for t, desc in enumerate(self.config.table_descriptor):
            for got, want in zip(eu.retrieve_table(desc), self.tables[desc.name]):
                np.testing.assert_array_equal(got, want)
        self.valid_step()
        self.check_recv()


def _make_ctx(config, seed):
    rng = np.random.default_rng(seed)
    bags = [eu.random_bags(rng, B, VOCAB[t], weighted=True, allow_empty=False, max_len=3)
            for _, t in FEATURES]
    tables = eu.load_random_tables(config, seed)
    return Ctx(config, tables, bags)


def _raises(error, fragments, fn):
    with pytest.raises(error) as excinfo:
        fn()
    message = str(excinfo.value)
    for f in fragments:
        assert f in message, "%r not in %r" % (f, message)
    return message


def _arbitrary(args, **kw):
    kw.setdefault("combiners", COMBINERS)
    return lambda: eu.enqueue_arbitrary(args, **kw)


RECV = "RecvTPUEmbeddingActivations"
