"""What the forward-path tests of tests/engine share (test_forward_*.py,
test_load_retrieve.py): the two-table scenario (three features, two of them
on the video table) as a feature-descriptor and as a table-mode config, the
sequence helpers, and a seed that is stable across processes."""

import engine_util as eu
from engine_util import FeatureSpec, TableSpec


B = 4


_seed = eu.stable_seed


def _tables(optimizer="adagrad", nf=(0, 0)):
    return [TableSpec("video", 10, 4, optimizer, num_features=nf[0]),
            TableSpec("user", 16, 3, optimizer, num_features=nf[1])]


# Three features, two of them sharing the video table.
FEATURES = [("watched", 0), ("friends", 1), ("favorited", 0)]


def _feature_config():
    return eu.feature_mode_config(_tables(), [FeatureSpec(n, t, [B]) for n, t in FEATURES])


def _table_config():
    return eu.table_mode_config(_tables(nf=(2, 1)), B)


# Sequence length of the [B, L] sequence features.
L = 3


def _random_sequences(rng, vocab, lengths):
    return [[(int(i), 1.0) for i in rng.integers(0, vocab, n)] for n in lengths]
