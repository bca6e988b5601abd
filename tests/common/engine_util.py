"""Helpers for the engine tests: config builders, an engine context manager,
random table loading, a numpy reference lookup written from the spec formulas
(docs: docs/tpu_embedding_semantics.md §4.2), converters from
tf.SparseTensor / tf.RaggedTensor / dense ids into enqueue arguments (the way
TF's v2 mid-level API builds them, spec §4.4) and a TPUEmbeddingForServing
oracle (spec §4.7).

Bags are the common currency: a feature's input is a list (row-major over its
output positions) of bags, each bag a list of (id, weight) pairs.
"""
import contextlib
import dataclasses
import os
import zlib
from typing import Optional, Sequence, Tuple

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as config_pb2  # noqa: E402

import tf_tpu_emb  # noqa: E402
from tf_tpu_emb import ops as tte_ops  # noqa: E402
from tf_tpu_emb.optimizers import BY_PROTO_FIELD  # noqa: E402

Config = config_pb2.TPUEmbeddingConfiguration
TRAINING = Config.TRAINING
INFERENCE = Config.INFERENCE
DIV = Config.DIV_DEFAULT
MOD = Config.MOD


# ------------------------------------------------------------------ configs

@dataclasses.dataclass
class TableSpec:
    name: str
    vocab: int
    dim: int
    optimizer: str = "adagrad"       # OptimizationParameters oneof field
    num_features: int = 0            # table mode only
    quantization: Optional[Tuple[float, float, int]] = None  # (lower, upper, buckets)
    lr_tag: Optional[int] = None     # dynamic learning rate tag instead of a constant


@dataclasses.dataclass
class FeatureSpec:
    name: str
    table_id: int
    input_shape: Sequence[int]


def _fill_table(desc, spec: TableSpec):
    desc.name = spec.name
    desc.vocabulary_size = spec.vocab
    desc.dimension = spec.dim
    if spec.num_features:
        desc.num_features = spec.num_features
    params = desc.optimization_parameters
    if spec.optimizer:
        getattr(params, spec.optimizer).SetInParent()
    if spec.lr_tag is None:
        params.learning_rate.constant = 0.1
    else:
        params.learning_rate.dynamic.tag = spec.lr_tag
    if spec.quantization is not None:
        lo, hi, buckets = spec.quantization
        q = params.simulated_quantization
        q.enabled = True
        q.num_buckets = buckets
        q.clipping_limits.lower.value = lo
        q.clipping_limits.upper.value = hi


def table_mode_config(tables, batch_size, *, mode=TRAINING, num_tensor_cores=1,
                      sharding=DIV):
    """A config without feature descriptors: one output per table,
    [batch_size * num_features, dim]."""
    c = Config()
    c.mode = mode
    c.num_tensor_cores = num_tensor_cores
    c.batch_size_per_tensor_core = batch_size
    c.sharding_strategy = sharding
    for spec in tables:
        _fill_table(c.table_descriptor.add(), spec)
    return c


def feature_mode_config(tables, features, *, mode=TRAINING, num_tensor_cores=1,
                        sharding=DIV):
    """A config with feature descriptors (as TF's v2 API writes it): one output
    per feature, input_shape + [dim]."""
    c = Config()
    c.mode = mode
    c.num_tensor_cores = num_tensor_cores
    c.sharding_strategy = sharding
    for spec in tables:
        _fill_table(c.table_descriptor.add(), spec)
    for f in features:
        fd = c.feature_descriptor.add()
        fd.name = f.name
        fd.table_id = f.table_id
        fd.input_shape.extend(f.input_shape)
    return c


def serialize(config):
    return config if isinstance(config, bytes) else config.SerializeToString()


def output_shapes(config):
    """Recv output shapes of a (user-written) config, spec §2.1."""
    c = config
    if len(c.feature_descriptor):
        return [list(f.input_shape) + [c.table_descriptor[f.table_id].dimension]
                for f in c.feature_descriptor]
    return [[t.num_features * c.batch_size_per_tensor_core, t.dimension]
            for t in c.table_descriptor]


# ------------------------------------------------------------------- engine

def shutdown():
    tte_ops.shutdown_tpu_embedding()


def is_initialized():
    return bool(tf.raw_ops.IsTPUEmbeddingInitialized().numpy())


RECV_TIMEOUT_VARIABLE = "TF_TPU_EMB_STEP_TIMEOUT_SECONDS"


@contextlib.contextmanager
def recv_timeout(seconds):
    """Sets the Recv wait's timeout for the engines configured inside (the
    engine reads it at configure)."""
    old = os.environ.get(RECV_TIMEOUT_VARIABLE)
    os.environ[RECV_TIMEOUT_VARIABLE] = str(seconds)
    try:
        yield
    finally:
        if old is None:
            del os.environ[RECV_TIMEOUT_VARIABLE]
        else:
            os.environ[RECV_TIMEOUT_VARIABLE] = old


@contextlib.contextmanager
def engine(config):
    """Configures the engine with `config` and always shuts it down.  A
    single-replica engine gets a 1 s Recv timeout unless the environment sets
    one: its Recv only ever waits for an enqueue, so a Recv with nothing
    enqueued fails fast (assert_nothing_enqueued)."""
    tf_tpu_emb.load_library()
    shutdown()  # a previous test that died half-way must not leak its engine
    if config.num_tensor_cores <= 1 and RECV_TIMEOUT_VARIABLE not in os.environ:
        with recv_timeout(1):
            tf.raw_ops.ConfigureTPUEmbedding(config=serialize(config))
    else:
        tf.raw_ops.ConfigureTPUEmbedding(config=serialize(config))
    try:
        yield config
    finally:
        shutdown()


def assert_nothing_enqueued(config, replica=0):
    """A Recv with nothing enqueued waits, then fails with the documented
    DeadlineExceeded naming the replica (README "Waits")."""
    import pytest
    with pytest.raises(tf.errors.DeadlineExceededError,
                       match="nothing was enqueued for replica %d" % replica):
        recv(config)


def recv(config, num_outputs=None):
    """RecvTPUEmbeddingActivations for `config`, as a list of numpy arrays."""
    if num_outputs is None:
        num_outputs = len(output_shapes(config))
    outs = tf.raw_ops.RecvTPUEmbeddingActivations(num_outputs=num_outputs,
                                                  config=serialize(config))
    return [o.numpy() for o in outs]


# ---------------------------------------------------------- load / retrieve

def optimizer_of(table_desc):
    return table_desc.optimization_parameters.WhichOneof("parameters")


def _table_op(kind, optimizer, engine=""):
    """(callable, optimizer info) for Load/Retrieve of `optimizer`: TF's core op
    via tf.raw_ops where TF has one (the default engine), our prefixed
    wrapper otherwise."""
    info = BY_PROTO_FIELD[optimizer]
    bare = "%sTPUEmbedding%sParameters" % (kind, info.op_infix)
    if info.core_has_table_ops and not engine:
        return getattr(tf.raw_ops, bare), info
    op = getattr(tte_ops, tte_ops._snake(bare))
    return (lambda **kwargs: op(engine=engine, **kwargs)), info


def load_table(table_desc, state, *, table_id=None, num_shards=1, shard_id=0, engine=""):
    """Loads `state` ([parameters, slot...], each [rows_in_shard, dim]) into the
    table described by `table_desc` (by name unless table_id is given), of
    the engine called `engine` ("" = the default engine)."""
    op, info = _table_op("Load", optimizer_of(table_desc), engine)
    names = ("parameters",) + info.slots
    assert len(state) == len(names), (names, len(state))
    kwargs = dict(zip(names, [np.asarray(s, np.float32) for s in state]))
    if table_id is None:
        kwargs["table_name"] = table_desc.name
    else:
        kwargs["table_id"] = table_id
    op(num_shards=num_shards, shard_id=shard_id, **kwargs)


def retrieve_table(table_desc, *, table_id=None, num_shards=1, shard_id=0, engine=""):
    op, _ = _table_op("Retrieve", optimizer_of(table_desc), engine)
    kwargs = {"table_name": table_desc.name} if table_id is None else {"table_id": table_id}
    outs = op(num_shards=num_shards, shard_id=shard_id, **kwargs)
    if isinstance(outs, tf.Tensor):
        outs = [outs]
    return [np.asarray(o) for o in outs]


def random_state(rng, table_desc):
    """Random float32 [parameters, slots...] for a whole table."""
    info = BY_PROTO_FIELD[optimizer_of(table_desc)]
    shape = (table_desc.vocabulary_size, table_desc.dimension)
    params = rng.standard_normal(shape).astype(np.float32)
    slots = [rng.uniform(0.1, 2.0, shape).astype(np.float32) for _ in info.slots]
    return [params] + slots


def stable_seed(*parts):
    """A data seed from a test case's parameters, the same in every process:
    Python's hash() of a str is salted per process (PYTHONHASHSEED), so a
    failure seeded by it could not be replayed (tests/api/test_replayable_seeds.py).
    Put the seed in the assertion messages."""
    return zlib.crc32(repr(parts).encode())


def load_random_tables(config, seed=0):
    """Loads random parameters and slots into every table of the configured
    engine; returns {table name: [parameters, slots...]} (numpy)."""
    rng = np.random.default_rng(seed)
    tables = {}
    for t, desc in enumerate(config.table_descriptor):
        state = random_state(rng, desc)
        # alternate selection by name and by id to exercise both
        load_table(desc, state, table_id=t if t % 2 else None)
        tables[desc.name] = state
    return tables


def shard_rows(vocab, num_shards, shard_id, mod):
    """Global ids held by a shard (spec §2.7): DIV = contiguous ranges with the
    first vocab % n shards one row longer; MOD = ids with id % n == shard."""
    if mod:
        return np.arange(shard_id, vocab, num_shards)
    base, extra = divmod(vocab, num_shards)
    start = shard_id * base + min(shard_id, extra)
    return np.arange(start, start + base + (1 if shard_id < extra else 0))


# ------------------------------------------------------- numpy reference

def quantize(x, lower, upper, buckets):
    """Simulated quantization of each gathered element (float32 like the engine)."""
    x = np.asarray(x, np.float32)
    lo, hi = np.float32(lower), np.float32(upper)
    step = np.float32((hi - lo) / np.float32(buckets - 1))
    c = np.minimum(np.maximum(x, lo), hi)
    q = np.floor((c - lo) / step + np.float32(0.5)).astype(np.float32)
    return (q * step + lo).astype(np.float32)


def combine_bag(table, bag, combiner, quant=None):
    """Spec §4.2: sum = Σ w·E[i]; mean = Σ w·E[i] / Σ w; sqrtn = Σ w·E[i] /
    sqrt(Σ w²); empty bag or zero normaliser -> zeros."""
    dim = table.shape[1]
    if not bag:
        return np.zeros(dim, np.float64)
    ids = np.array([i for i, _ in bag], np.int64)
    w = np.array([float(np.float32(w)) for _, w in bag], np.float64)
    rows = table[ids]
    if quant is not None:
        rows = quantize(rows, *quant)
    s = (w[:, None] * rows.astype(np.float64)).sum(0)
    if combiner == "sum":
        return s
    norm = w.sum() if combiner == "mean" else np.sqrt((w * w).sum())
    return s / norm if norm != 0 else np.zeros(dim, np.float64)


def reference_lookup(table, bags, combiner, shape=None, quant=None):
    """Output of one feature: `bags` row-major over `shape` (default [len(bags)])."""
    shape = [len(bags)] if shape is None else list(shape)
    assert int(np.prod(shape)) == len(bags), (shape, len(bags))
    out = np.stack([combine_bag(table, b, combiner, quant) for b in bags]) if bags else \
        np.zeros((0, table.shape[1]))
    return out.reshape(shape + [table.shape[1]])


def reference_sequence(table, sequences, length):
    """Sequence feature: out[b, p] = E[ids_b[p]] for p < L, zeros after."""
    out = np.zeros((len(sequences), length, table.shape[1]))
    for b, seq in enumerate(sequences):
        for p, (i, w) in enumerate(seq[:length]):
            out[b, p] = w * table[i]
    return out


def interleave_table_rows(per_feature):
    """Table-mode output from per-feature [B, k, D] (or [B, D]) blocks, in the
    table's feature order: row = b * num_features + f."""
    blocks = [p if p.ndim == 3 else p[:, None, :] for p in per_feature]
    return np.concatenate(blocks, axis=1).reshape(-1, blocks[0].shape[-1])


def interleave_bags(per_feature):
    """Table-mode bags from per-feature bag lists of equal length B: row
    b * num_features + f holds bag b of feature f."""
    return [bags[b] for b in range(len(per_feature[0])) for bags in per_feature]


def assert_close(got, want, rtol=1e-5, atol=1e-5, what=""):
    got, want = np.asarray(got), np.asarray(want)
    assert got.shape == want.shape, "%s: shape %s != %s" % (what, got.shape, want.shape)
    np.testing.assert_allclose(got, want, rtol=rtol, atol=atol, err_msg=what)


# ------------------------------------------------------------------- bags

def random_bags(rng, positions, vocab, *, max_len=3, weighted=False, allow_empty=True,
                exactly_one=False):
    """`positions` random bags of ids in [0, vocab); weights in [0.25, 2) or 1."""
    bags = []
    for _ in range(positions):
        n = 1 if exactly_one else int(rng.integers(0 if allow_empty else 1, max_len + 1))
        ids = rng.integers(0, vocab, n)
        ws = rng.uniform(0.25, 2.0, n) if weighted else np.ones(n)
        bags.append([(int(i), float(np.float32(w))) for i, w in zip(ids, ws)])
    return bags


def bags_to_sparse(bags, shape=None, id_dtype=tf.int64, weight_dtype=tf.float32):
    """tf.SparseTensor ids and weights of rank len(shape) + 1: index
    (position..., k) for element k of the bag at `position`."""
    shape = [len(bags)] if shape is None else list(shape)
    width = max([len(b) for b in bags] + [1])
    indices, ids, ws = [], [], []
    for p, bag in enumerate(bags):
        pos = list(np.unravel_index(p, shape)) if shape else []
        for k, (i, w) in enumerate(bag):
            indices.append([int(x) for x in pos] + [k])
            ids.append(i)
            ws.append(w)
    indices = np.array(indices, np.int64).reshape(-1, len(shape) + 1)
    dense_shape = shape + [width]
    sp_ids = tf.SparseTensor(indices, tf.constant(ids, id_dtype), dense_shape)
    sp_w = tf.SparseTensor(indices, tf.constant(ws, weight_dtype), dense_shape)
    return sp_ids, sp_w


def bags_to_ragged(bags, id_dtype=tf.int64, weight_dtype=tf.float32,
                   splits_dtype=tf.int64):
    splits = np.cumsum([0] + [len(b) for b in bags])
    ids = [i for b in bags for i, _ in b]
    ws = [w for b in bags for _, w in b]
    rg_ids = tf.RaggedTensor.from_row_splits(tf.constant(ids, id_dtype),
                                             tf.constant(splits, splits_dtype))
    rg_w = tf.RaggedTensor.from_row_splits(tf.constant(ws, weight_dtype),
                                           tf.constant(splits, splits_dtype))
    return rg_ids, rg_w


def bags_to_dense(bags, shape=None, id_dtype=tf.int64):
    shape = [len(bags)] if shape is None else list(shape)
    assert all(len(b) == 1 for b in bags), "dense input needs one id per bag"
    return tf.constant(np.array([b[0][0] for b in bags]).reshape(shape), id_dtype)


def unit_weights(bags):
    return [[(i, 1.0) for i, _ in b] for b in bags]


# ------------------------------------------- inputs -> enqueue arguments

def empty(dtype):
    return tf.zeros([0], dtype)


def sparse_to_enqueue(sp_ids, sp_weights=None, index_dtype=tf.int32, id_dtype=tf.int64,
                      weight_dtype=tf.float32, pad_sequence=False):
    """(indices, ids, weights) from a SparseTensor, as TF's v2 enqueue does:
    indices int32 (rank-2 sequence input padded to [b, p, 0] when
    `pad_sequence`), ids int64, weights float32 or empty."""
    indices = tf.cast(sp_ids.indices, index_dtype)
    if pad_sequence:
        indices = tf.pad(indices, [[0, 0], [0, 1]])
    ids = tf.cast(sp_ids.values, id_dtype)
    w = empty(weight_dtype) if sp_weights is None else tf.cast(sp_weights.values, weight_dtype)
    return indices, ids, w


def ragged_to_enqueue(rg_ids, rg_weights=None, splits_dtype=tf.int32, id_dtype=tf.int64,
                      weight_dtype=tf.float32):
    splits = tf.cast(rg_ids.row_splits, splits_dtype)
    ids = tf.cast(rg_ids.values, id_dtype)
    w = empty(weight_dtype) if rg_weights is None else tf.cast(rg_weights.values, weight_dtype)
    return splits, ids, w


def dense_to_enqueue(ids, index_dtype=tf.int32, id_dtype=tf.int64, weight_dtype=tf.float32):
    return empty(index_dtype), tf.cast(tf.reshape(ids, [-1]), id_dtype), empty(weight_dtype)


def enqueue_arbitrary(args, combiners=(), mode="unspecified", device_ordinal=-1):
    """EnqueueTPUEmbeddingArbitraryTensorBatch from a list of (splits, ids, w)."""
    tf.raw_ops.EnqueueTPUEmbeddingArbitraryTensorBatch(
        sample_indices_or_row_splits=[a[0] for a in args],
        embedding_indices=[a[1] for a in args],
        aggregation_weights=[a[2] for a in args],
        mode_override=mode, device_ordinal=device_ordinal, combiners=list(combiners))


def enqueue_sparse_tensor(args, table_ids, combiners=(), max_sequence_lengths=(),
                          num_features=(), mode="unspecified", device_ordinal=-1):
    tf.raw_ops.EnqueueTPUEmbeddingSparseTensorBatch(
        sample_indices=[a[0] for a in args], embedding_indices=[a[1] for a in args],
        aggregation_weights=[a[2] for a in args], mode_override=mode,
        device_ordinal=device_ordinal, combiners=list(combiners), table_ids=list(table_ids),
        max_sequence_lengths=list(max_sequence_lengths), num_features=list(num_features))


def enqueue_ragged_tensor(args, table_ids, combiners=(), max_sequence_lengths=(),
                          num_features=(), mode="unspecified", device_ordinal=-1):
    tf.raw_ops.EnqueueTPUEmbeddingRaggedTensorBatch(
        sample_splits=[a[0] for a in args], embedding_indices=[a[1] for a in args],
        aggregation_weights=[a[2] for a in args], mode_override=mode,
        device_ordinal=device_ordinal, combiners=list(combiners), table_ids=list(table_ids),
        max_sequence_lengths=list(max_sequence_lengths), num_features=list(num_features))


# ------------------------------------------ TPUEmbeddingForServing oracle

def serving_lookup(tables, features, inputs, weights=None):
    """CPU oracle: TF's TPUEmbeddingForServing (spec §4.7).

    tables: {name: (table numpy [vocab, dim], combiner)};
    features: {feature name: (table name, FeatureConfig kwargs)};
    inputs / weights: {feature name: tensor} (weights entries may be None).
    Returns {feature name: numpy}.  Weights must be > 0 for mean/sqrtn (the
    serving path drops weights <= 0 there).
    """
    E = tf.tpu.experimental.embedding
    table_cfgs = {name: E.TableConfig(vocabulary_size=t.shape[0], dim=t.shape[1],
                                      combiner=comb, name=name)
                  for name, (t, comb) in tables.items()}
    feature_cfgs = {fname: E.FeatureConfig(table=table_cfgs[tname], name=fname, **kw)
                    for fname, (tname, kw) in features.items()}
    model = E.TPUEmbeddingForServing(feature_cfgs, optimizer=None)
    model.build()
    for name, cfg in table_cfgs.items():
        model.embedding_tables[cfg].assign(tables[name][0])
    if weights is not None:
        weights = {k: weights.get(k) for k in inputs}
    out = model.embedding_lookup(dict(inputs), weights)
    return {k: v.numpy() for k, v in out.items()}
