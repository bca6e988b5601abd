"""Seeded case generators of the fuzz suite, one per family.

A case is a list of steps, each ``{"op", "args", "expect"}``, regenerated
deterministically from (family, seed, index): reproducers only need the triple.
``expect`` is ``"ok"`` (valid input: the op must succeed), ``"fail"`` (input
that is invalid for sure: the op must raise a TF error), ``"any"`` (boundary
or mutated input: either) or ``"model"`` (the executor predicts it from its
model of the engine: queues, in-flight batches, configured or not).

Valid inputs are built from the op contracts in README.md and the semantics
of TF's TPU embedding ops; mutations replace one piece with a boundary or
hostile value (ids outside the vocabulary, non-monotone splits, NaN weights,
wrong ranks/shapes/dtypes/counts, extreme attrs, mutated config protos and
bytes).  Importing this module does not import TensorFlow (the runner only
needs the family names); generation does.
"""
import numpy as np

FAMILIES = ("config", "enqueue", "recv_send", "load_retrieve", "lifecycle", "embedding_bag",
            "cluster", "sparsecore")
#: Families whose cases are slow (``cluster``: S server processes a case):
#: ``runner.py`` runs at most this many of them unless ``--no-case-limits``.
CASE_LIMITS = {"cluster": 100}
#: selftest: deliberate crash / hang / wrong-error / corruption cases that
#: prove the runner records each (tests/fuzz/test_fuzz_quick.py).
ALL_FAMILIES = FAMILIES + ("selftest",)

I32_MAX, I32_MIN = 2**31 - 1, -2**31
I64_MAX, I64_MIN = 2**63 - 1, -2**63
BIG_INTS = (0, -1, 1, 2, 255, 256, 2**16, 2**20, I32_MAX, I32_MIN, 2**31, 2**32 + 1,
            2**40, I64_MAX, I64_MIN)
BAD_FLOATS = (float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e38, -1e38, 1e-45)

_templates = None


def step(op, expect="ok", **args):
    return {"op": op, "args": args, "expect": expect}


def _pb():
    from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2
    return tpu_embedding_configuration_pb2


def optimizer_templates():
    """{proto_field: OptimizationParameters} built by the package's own
    optimizer classes (TF's for the ones TF has) with learning rate 0.1."""
    global _templates
    if _templates is None:
        import tensorflow as tf
        import tf_tpu_emb
        from tf_tpu_emb import optimizers as opt_mod
        E = tf.tpu.experimental.embedding
        extra = {"frequency_estimator": dict(tau=1.0, max_delta=1.0, outlier_threshold=1.0,
                                             weight_exponent=1.0)}
        _templates = {}
        for info in opt_mod.OPTIMIZERS:
            if not opt_mod.tf_has_optimizer(info):
                continue  # this TF's protos cannot express it (README "TensorFlow versions")
            kwargs = dict(learning_rate=0.1, **extra.get(info.proto_field, {}))
            if info.class_name:
                opt = getattr(tf_tpu_emb, info.class_name)(**kwargs)
            elif info.tf_class:
                opt = opt_mod.fix_tf_optimizer(getattr(E, info.tf_class)(**kwargs))
            else:
                continue
            desc = opt_mod.table_descriptor_for(E.TableConfig(8, 1, name="t"), optimizer=opt)
            _templates[info.proto_field] = desc.optimization_parameters
    return _templates


def slots_of(proto_field):
    from tf_tpu_emb.optimizers import BY_PROTO_FIELD
    return BY_PROTO_FIELD[proto_field].slots


# ================================================================== configs

def valid_config(rng, *, feature_mode=None, max_replicas=1, mode=None, dynamic_lr=True,
                 max_vocab=40, max_tables=3):
    """A small valid TPUEmbeddingConfiguration (proto)."""
    pb = _pb()
    c = pb.TPUEmbeddingConfiguration()
    c.mode = mode if mode is not None else int(rng.choice(
        [pb.TPUEmbeddingConfiguration.TRAINING, pb.TPUEmbeddingConfiguration.INFERENCE,
         pb.TPUEmbeddingConfiguration.BACKWARD_PASS_ONLY], p=[0.7, 0.15, 0.15]))
    c.num_tensor_cores = int(rng.integers(1, max_replicas + 1))
    c.sharding_strategy = int(rng.choice([pb.TPUEmbeddingConfiguration.DIV_DEFAULT,
                                          pb.TPUEmbeddingConfiguration.MOD]))
    c.pipeline_execution_with_tensor_core = bool(rng.random() < 0.2)
    templates = optimizer_templates()
    num_tables = int(rng.integers(1, max_tables + 1))
    num_tags = 0
    for t in range(num_tables):
        d = c.table_descriptor.add()
        d.name = "t%d" % t
        field = str(rng.choice(sorted(templates)))
        d.optimization_parameters.CopyFrom(templates[field])
        d.vocabulary_size = int(rng.integers(1, max_vocab + 1))
        d.dimension = 1 if field == "frequency_estimator" else int(rng.integers(1, 9))
        p = d.optimization_parameters
        if p.learning_rate.HasField("dynamic"):
            p.learning_rate.dynamic.tag = num_tags  # frequency-aware step counter etc.
            num_tags += 1
        if dynamic_lr and rng.random() < 0.2:
            p.learning_rate.dynamic.tag = num_tags
            num_tags += 1
        if rng.random() < 0.15:
            q = p.simulated_quantization
            q.enabled = True
            q.num_buckets = int(rng.integers(2, 256))
            q.clipping_limits.lower.value = -float(rng.uniform(0.5, 3))
            q.clipping_limits.upper.value = float(rng.uniform(0.5, 3))
        if rng.random() < 0.15:
            p.gradient_clipping_limits.lower.value = -1.0
            p.gradient_clipping_limits.upper.value = 1.0
        if rng.random() < 0.1:
            p.weight_decay_factor = 0.01
    _renumber_dynamic_tags(c)
    if feature_mode is None:
        feature_mode = rng.random() < 0.6
    if feature_mode:
        for t in range(num_tables):  # every table needs a feature
            _add_feature(rng, c, t)
        for _ in range(int(rng.integers(0, 3))):
            _add_feature(rng, c, int(rng.integers(0, num_tables)))
    else:
        c.batch_size_per_tensor_core = int(rng.integers(1, 5))
        for d in c.table_descriptor:
            d.num_features = int(rng.integers(1, 4))
    return c


def _renumber_dynamic_tags(c):
    """Dynamic tags must be 0..n-1: renumber in order of first use."""
    seen = {}
    for d in c.table_descriptor:
        p = d.optimization_parameters
        msgs = [p.learning_rate] + ([p.frequency_aware_adagrad.step_counter]
                                    if p.WhichOneof("parameters") == "frequency_aware_adagrad"
                                    and p.frequency_aware_adagrad.HasField("step_counter")
                                    else [])
        for m in msgs:
            if m.HasField("dynamic"):
                key = (id(d), m.dynamic.tag) if m is not p.learning_rate else ("lr", id(d))
                m.dynamic.tag = seen.setdefault(key, len(seen))


def _add_feature(rng, c, table_id):
    f = c.feature_descriptor.add()
    f.name = "f%d" % (len(c.feature_descriptor) - 1)
    f.table_id = table_id
    rank = int(rng.choice([1, 2, 3], p=[0.6, 0.3, 0.1]))
    f.input_shape.extend(int(x) for x in rng.integers(1, 5, rank))


def num_dynamic(c):
    tags = set()
    for d in c.table_descriptor:
        p = d.optimization_parameters
        if p.learning_rate.HasField("dynamic"):
            tags.add(p.learning_rate.dynamic.tag)
        if p.WhichOneof("parameters") == "frequency_aware_adagrad" and \
                p.frequency_aware_adagrad.HasField("step_counter"):
            tags.add(p.frequency_aware_adagrad.step_counter.tag)
    return len(tags)


def outputs_of(c):
    """[(table id, input shape)] of the completed config (one per Recv output)."""
    if len(c.feature_descriptor):
        return [(f.table_id, list(f.input_shape)) for f in c.feature_descriptor]
    return [(t, [c.batch_size_per_tensor_core * d.num_features])
            for t, d in enumerate(c.table_descriptor)]


def recv_shapes(c):
    """The Recv outputs' shapes of config `c` (input shape + the table's
    dimension): what a Recv's own config must agree on with the engine's
    (kernels/recv_send_kernels.cc Prepare; TF's op uses its config for
    shapes alone), table ids aside."""
    return [shape + [c.table_descriptor[t].dimension] for t, shape in outputs_of(c)]


def _pick(rng, values):
    return values[int(rng.integers(len(values)))]


def mutate_config(rng, c):
    """Applies 1-3 boundary / hostile field mutations to config proto `c`."""
    pb = _pb()
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, 19))
        tables = c.table_descriptor
        d = tables[int(rng.integers(len(tables)))] if len(tables) else tables.add()
        p = d.optimization_parameters
        if kind == 0:
            d.vocabulary_size = _pick(rng, BIG_INTS[:9] + (2**40, I64_MAX, I64_MIN, 2**31))
        elif kind == 1:
            d.dimension = _pick(rng, (0, -1, 1, 2**16, 2**20, I32_MAX, I32_MIN))
        elif kind == 2:
            c.num_tensor_cores = _pick(rng, (0, -1, 2, 3, 64, 4096, 2**20, I32_MAX, I32_MIN))
        elif kind == 3:
            c.batch_size_per_tensor_core = _pick(rng, (0, -1, 1, 2**16, 2**30, I32_MAX, I32_MIN))
        elif kind == 4:
            d.num_features = _pick(rng, (0, -1, 1, 2**16, 2**30, I32_MAX, I32_MIN))
        elif kind == 5 and len(c.feature_descriptor):
            f = c.feature_descriptor[int(rng.integers(len(c.feature_descriptor)))]
            choice = int(rng.integers(4))
            if choice == 0 and len(f.input_shape):
                f.input_shape[int(rng.integers(len(f.input_shape)))] = _pick(
                    rng, (0, -1, 2**15, 2**16, 2**20, I32_MAX, I32_MIN))
            elif choice == 1:
                f.input_shape.extend([int(rng.integers(1, 3))] * int(_pick(rng, (30, 253, 254, 300))))
            elif choice == 2:
                del f.input_shape[:]
            else:
                f.input_shape.extend([2**16, 2**16])
        elif kind == 6 and len(c.feature_descriptor):
            f = c.feature_descriptor[int(rng.integers(len(c.feature_descriptor)))]
            f.table_id = _pick(rng, (-1, len(tables), 1000, I32_MAX, I32_MIN))
        elif kind == 7:
            d.name = _pick(rng, ("", tables[0].name, "x" * 1000, "\u00e9\u0000b"))
        elif kind == 8:
            p.Clear()
            if rng.random() < 0.5:
                getattr(p, _pick(rng, ("mdl_adagrad_light", "user_defined_program",
                                       "adam", "ftrl"))).SetInParent()
        elif kind == 9:
            p.learning_rate.constant = _pick(rng, BAD_FLOATS)
        elif kind == 10:
            p.learning_rate.dynamic.tag = _pick(rng, (-1, 1, 5, I32_MAX, I32_MIN))
        elif kind == 11:
            q = p.simulated_quantization
            q.enabled = True
            q.num_buckets = _pick(rng, (0, 1, 2, -1, I32_MAX, I32_MIN))
            q.clipping_limits.lower.value = _pick(rng, BAD_FLOATS)
            q.clipping_limits.upper.value = _pick(rng, BAD_FLOATS)
        elif kind == 12:
            lim = p.gradient_clipping_limits if rng.random() < 0.5 else p.clipping_limits
            lim.lower.value = _pick(rng, BAD_FLOATS)
            lim.upper.value = _pick(rng, BAD_FLOATS)
        elif kind == 13:
            p.weight_decay_factor = _pick(rng, BAD_FLOATS)
            p.multiply_weight_decay_factor_by_learning_rate = bool(rng.random() < 0.5)
        elif kind == 14:
            which = p.WhichOneof("parameters")
            if which:
                msg = getattr(p, which)
                fields = [f for f in msg.DESCRIPTOR.fields if f.cpp_type == f.CPPTYPE_FLOAT]
                if fields:
                    setattr(msg, _pick(rng, fields).name, _pick(rng, BAD_FLOATS))
        elif kind == 15:
            c.mode = _pick(rng, (0, 1, 2, 3, 4, 99, -1))
            c.sharding_strategy = _pick(rng, (0, 1, 2, 99))
        elif kind == 16:
            c.spmd_sharding.enabled = True
            c.spmd_sharding.num_cores_per_replica = _pick(rng, (0, -1, 1, 2, I32_MAX))
            manual = bool(rng.random() < 0.3)
            if "use_manual_partitioning" in c.spmd_sharding.DESCRIPTOR.fields_by_name:
                c.spmd_sharding.use_manual_partitioning = manual
            elif manual:  # TF < 2.19: the field as a newer TF writes it (refused)
                c.spmd_sharding.MergeFromString(b"\x18\x01")
        elif kind == 17:
            p.gradient_accumulation_status = _pick(rng, (0, 1, 2, 7))
            p.low_dimensional_packing_status = _pick(rng, (0, 1, 2, 9))
        else:
            for _ in range(int(_pick(rng, (2, 20, 200)))):
                nd = tables.add()
                nd.CopyFrom(d)
                nd.name = "%s_%d" % (d.name, len(tables))
    return c


def mutate_bytes(rng, data):
    """Byte-level mutation of a serialized proto."""
    data = bytearray(data)
    for _ in range(int(rng.integers(1, 6))):
        kind = int(rng.integers(5))
        if kind == 0 and data:  # flip bits
            i = int(rng.integers(len(data)))
            data[i] ^= 1 << int(rng.integers(8))
        elif kind == 1 and data:  # random byte
            data[int(rng.integers(len(data)))] = int(rng.integers(256))
        elif kind == 2 and data:  # truncate
            del data[int(rng.integers(len(data))):]
        elif kind == 3:  # insert random bytes (often a varint of a large value)
            i = int(rng.integers(len(data) + 1))
            data[i:i] = bytes(rng.integers(0, 256, int(rng.integers(1, 11))).astype(np.uint8))
        elif kind == 4 and data:  # duplicate a slice (repeated fields)
            i, j = sorted(int(x) for x in rng.integers(0, len(data) + 1, 2))
            data[j:j] = data[i:j]
    return bytes(data)


# ============================================================ enqueue inputs

def _ids(rng, vocab, n, dtype):
    return rng.integers(0, vocab, n).astype(dtype)


def _weights(rng, n, weighted):
    return (rng.uniform(0.25, 2.0, n) if weighted else np.zeros(0)).astype(np.float32)


def _dense_bag_inputs(rng, vocab, shape, weighted, index_dtype, id_dtype):
    """One id per output position, no indices (dense)."""
    n = int(np.prod(shape))
    return [np.zeros(0, index_dtype), _ids(rng, vocab, n, id_dtype), _weights(rng, n, weighted)]


def _splits_inputs(rng, vocab, rows, weighted, index_dtype, id_dtype, max_len=3):
    counts = rng.integers(0, max_len + 1, rows)
    splits = np.concatenate([[0], np.cumsum(counts)]).astype(index_dtype)
    n = int(splits[-1])
    return [splits, _ids(rng, vocab, n, id_dtype), _weights(rng, n, weighted)]


def _coo_inputs(rng, vocab, shape, weighted, index_dtype, id_dtype, extra_col, max_len=3):
    """COO indices [n, rank (+1)] in row-major order, bag = position."""
    rows = []
    for p in range(int(np.prod(shape))):
        pos = list(np.unravel_index(p, shape))
        for k in range(int(rng.integers(0, max_len + 1))):
            rows.append(pos + ([k] if extra_col else []))
    cols = len(shape) + (1 if extra_col else 0)
    idx = np.array(rows, index_dtype).reshape(-1, cols)
    n = idx.shape[0]
    return [idx, _ids(rng, vocab, n, id_dtype), _weights(rng, n, weighted)]


def valid_enqueue(rng, c, op=None, replica=0, mode="unspecified"):
    """(op name, kwargs) of a valid enqueue of one batch for config `c`."""
    outputs = outputs_of(c)
    feature_mode = len(c.feature_descriptor) > 0
    ops = ["EnqueueTPUEmbeddingArbitraryTensorBatch", "DynamicEnqueueTPUEmbeddingArbitraryTensorBatch",
           "EnqueueTPUEmbeddingSparseTensorBatch", "EnqueueTPUEmbeddingRaggedTensorBatch",
           "DynamicEnqueueTPUEmbeddingRaggedTensorBatch"]
    if not feature_mode:
        ops += ["EnqueueTPUEmbeddingIntegerBatch", "EnqueueTPUEmbeddingSparseBatch"]
    elif all(len(s) == 1 for _, s in outputs):
        ops += ["EnqueueTPUEmbeddingIntegerBatch", "EnqueueTPUEmbeddingSparseBatch"]
    op = op or _pick(rng, ops)
    index_dtype = _pick(rng, (np.int32, np.int64))
    id_dtype = _pick(rng, (np.int32, np.int64))
    weighted = bool(rng.random() < 0.5)
    vocab = [d.vocabulary_size for d in c.table_descriptor]
    kw = {"mode_override": mode}
    if op == "EnqueueTPUEmbeddingIntegerBatch":
        kw["batch"] = [_ids(rng, vocab[t], int(np.prod(s)), np.int32) for t, s in outputs]
        kw["device_ordinal"] = replica
        return op, kw
    if op == "EnqueueTPUEmbeddingSparseBatch":
        triples = []
        for t, s in outputs:
            n = int(rng.integers(0, 3 * int(np.prod(s)) + 1))
            triples.append([np.sort(rng.integers(0, int(np.prod(s)), n)).astype(np.int32),
                            _ids(rng, vocab[t], n, id_dtype), _weights(rng, n, weighted)])
        names = ("sample_indices", "embedding_indices", "aggregation_weights")
    elif "Arbitrary" in op or feature_mode:
        triples = []
        for t, s in outputs:
            kind = int(rng.integers(3))
            if kind == 0:
                triples.append(_dense_bag_inputs(rng, vocab[t], s, weighted, index_dtype, id_dtype))
            elif kind == 1 and ("Arbitrary" in op or "Ragged" in op):
                triples.append(_splits_inputs(rng, vocab[t], int(np.prod(s)), weighted,
                                              index_dtype, id_dtype))
            elif "Ragged" in op:
                triples.append(_dense_bag_inputs(rng, vocab[t], s, weighted, index_dtype, id_dtype))
            else:
                triples.append(_coo_inputs(rng, vocab[t], s, weighted, index_dtype, id_dtype,
                                           extra_col=bool(rng.random() < 0.5)))
        first = "sample_splits" if "Ragged" in op else (
            "sample_indices" if "SparseTensor" in op else "sample_indices_or_row_splits")
        names = (first, "embedding_indices", "aggregation_weights")
        if "Arbitrary" not in op:
            kw["table_ids"] = [t for t, _ in outputs]
    else:  # feature ops on a table-mode config: num_features inputs of width 1 per table
        triples, table_ids = [], []
        for t, d in enumerate(c.table_descriptor):
            for _ in range(d.num_features):
                b = c.batch_size_per_tensor_core
                if "Ragged" in op:
                    triples.append(_splits_inputs(rng, vocab[t], b, weighted, index_dtype, id_dtype))
                elif rng.random() < 0.5:
                    triples.append(_dense_bag_inputs(rng, vocab[t], [b], weighted, index_dtype,
                                                     id_dtype))
                else:
                    tr = _coo_inputs(rng, vocab[t], [b], weighted, index_dtype, id_dtype,
                                     extra_col=bool(rng.random() < 0.5))
                    if tr[0].shape[1] == 1 and rng.random() < 0.5:
                        tr[0] = tr[0].reshape(-1)  # rank-1 sample_indices form
                    triples.append(tr)
                table_ids.append(t)
        first = "sample_splits" if "Ragged" in op else "sample_indices"
        names = (first, "embedding_indices", "aggregation_weights")
        kw["table_ids"] = table_ids
    for i, name in enumerate(names):
        kw[name] = [tr[i] for tr in triples]
    if rng.random() < 0.5:
        kw["combiners"] = [str(_pick(rng, ("sum", "mean", "sqrtn"))) for _ in triples]
    if op.startswith("Dynamic"):
        kw["device_ordinal"] = np.int32(replica)
    else:
        kw["device_ordinal"] = replica
    return op, kw


def mutate_enqueue(rng, c, op, kw):
    """One mutation of a valid enqueue; returns (kwargs, expect)."""
    lists = [k for k, v in kw.items() if isinstance(v, list) and v and isinstance(v[0], np.ndarray)]
    kind = int(rng.integers(0, 14))
    expect = "any"
    idx_key = lists[0]
    id_key = "embedding_indices" if "embedding_indices" in kw else "batch"
    i = int(rng.integers(len(kw[id_key])))
    ids = kw[id_key][i]
    if kind <= 2 and ids.size:  # id outside the vocabulary
        vocab = c.table_descriptor[outputs_or_table(c, kw, i)].vocabulary_size
        bad = _pick(rng, (vocab, -1, vocab + 1, I32_MAX, I32_MIN, I64_MAX, I64_MIN, 2**31))
        if ids.dtype == np.int32 and not I32_MIN <= bad <= I32_MAX:
            bad = I32_MAX if bad > 0 else I32_MIN
        ids = ids.copy()
        ids[int(rng.integers(ids.size))] = bad
        kw[id_key][i] = ids
        expect = "fail"
    elif kind == 3 and id_key != "batch":  # non-finite weight
        w = kw["aggregation_weights"][i]
        if w.size:
            w = w.copy()
            w[int(rng.integers(w.size))] = _pick(rng, BAD_FLOATS[:3])
            kw["aggregation_weights"][i] = w
            expect = "fail"
        else:
            kw["aggregation_weights"][i] = np.ones(ids.size + int(rng.integers(1, 3)), np.float32)
            expect = "fail"
    elif kind == 4 and idx_key != "batch":  # indices / splits values
        a = kw[idx_key][i].copy()
        if a.size:
            a.flat[int(rng.integers(a.size))] = _pick(rng, (-1, -2**20, 2**20, I32_MAX, I32_MIN)
                                                      if a.dtype == np.int32 else BIG_INTS)
            kw[idx_key][i] = a
    elif kind == 5 and idx_key != "batch":  # shape/rank of indices
        a = kw[idx_key][i]
        kw[idx_key][i] = _pick(rng, (a.reshape(-1), a.reshape(1, -1), a.reshape(-1, 1, 1)
                                     if a.size else np.zeros([0, 3, 1], a.dtype),
                                     np.zeros([ids.size, 5], a.dtype), np.zeros([1], a.dtype),
                                     np.zeros([0, 2], a.dtype), np.arange(ids.size + 3, dtype=a.dtype)))
    elif kind == 6:  # drop / add an input (every list of the op together)
        drop = rng.random() < 0.5 and len(kw[id_key]) > 1
        for k in lists + (["table_ids"] if "table_ids" in kw else []):
            kw[k] = kw[k][:-1] if drop else kw[k] + [kw[k][-1]]
        if "combiners" in kw and rng.random() < 0.5:
            kw["combiners"] = kw["combiners"][:-1] if drop else kw["combiners"] + ["sum"]
    elif kind == 7 and op != "EnqueueTPUEmbeddingIntegerBatch":
        kw["combiners"] = _pick(rng, (["sum"] * int(rng.integers(0, 9)), ["max"], ["", "mean"]))
    elif kind == 8:
        kw["mode_override"] = _pick(rng, ("", "training", "TRAIN", "inference\0", "x" * 300))
        expect = "fail"
    elif kind == 9:
        bad = _pick(rng, (c.num_tensor_cores, 5, 2**20, I32_MAX, -2, I32_MIN))
        kw["device_ordinal"] = np.int32(bad) if op.startswith("Dynamic") else int(bad)
        if bad >= max(1, c.num_tensor_cores):
            expect = "fail"
        if op.startswith("Dynamic") and rng.random() < 0.3:
            kw["device_ordinal"] = _pick(rng, (np.zeros([0], np.int32), np.zeros([2, 2], np.int32)))
    elif kind == 10 and "table_ids" in kw:
        t = list(kw["table_ids"])
        t[int(rng.integers(len(t)))] = _pick(rng, (-1, len(c.table_descriptor), I32_MAX, I32_MIN, 0))
        kw["table_ids"] = t
        for k, v in (("max_sequence_lengths", (-1, 0, 1, 3, I32_MAX)), ("num_features", (-1, 0, 2, I32_MAX))):
            if rng.random() < 0.4:
                kw[k] = [int(_pick(rng, v)) for _ in range(int(rng.integers(0, len(t) + 2)))]
    elif kind == 11:  # dtype change (still a legal dtype for the op)
        key = _pick(rng, lists)
        kw[key] = [a.astype(_pick(rng, (np.int32, np.int64)) if a.dtype.kind == "i"
                            else _pick(rng, (np.float32, np.float64))) for a in kw[key]]
    elif kind == 12:  # everything empty
        for k in lists:
            kw[k] = [np.zeros([0], a.dtype) for a in kw[k]]
    else:  # a huge (but cheap) splits tensor / index column
        if idx_key != "batch":
            a = kw[idx_key][i]
            kw[idx_key][i] = np.zeros([int(_pick(rng, (2**16, 2**20)))], a.dtype)
    return kw, expect


def outputs_or_table(c, kw, i):
    """Table of input i of an enqueue (feature ops carry table_ids)."""
    if "table_ids" in kw:
        t = kw["table_ids"][i] if i < len(kw["table_ids"]) else 0
        return t if 0 <= t < len(c.table_descriptor) else 0
    outs = outputs_of(c)
    return outs[i][0] if i < len(outs) else 0


# ================================================================= families

def gen_config(rng):
    pb = _pb()
    kind = int(rng.integers(0, 10))
    c = valid_config(rng, max_replicas=4)
    probe = bool(rng.random() < 0.3)  # also trace Recv's shape function with it
    if kind <= 2:
        return [step("configure", "ok", config=c.SerializeToString(), probe=probe)]
    if kind <= 6:
        return [step("configure", "any", config=mutate_config(rng, c).SerializeToString(),
                     probe=probe)]
    if kind <= 8:
        return [step("configure", "any", config=mutate_bytes(rng, c.SerializeToString()),
                     probe=probe)]
    junk = bytes(rng.integers(0, 256, int(rng.integers(0, 64))).astype(np.uint8))
    del pb
    return [step("configure", "any", config=junk, probe=probe)]


def gen_enqueue(rng):
    c = valid_config(rng, max_replicas=2)
    steps = [step("configure", "ok", config=c.SerializeToString()),
             step("load_random", "ok", seed=int(rng.integers(1 << 30)))]
    for _ in range(int(rng.integers(1, 4))):
        replica = int(rng.integers(c.num_tensor_cores))
        mode = _pick(rng, ("unspecified", "train", "inference"))
        op, kw = valid_enqueue(rng, c, replica=replica, mode=mode)
        expect = "ok"
        if rng.random() < 0.75:
            kw, expect = mutate_enqueue(rng, c, op, kw)
        steps.append(step("enqueue", expect, name=op, kwargs=kw))
    steps.append(step("drain", "ok"))
    return steps


def _gradients(rng, c, mutate=False):
    pb_dims = [c.table_descriptor[t].dimension for t, _ in outputs_of(c)]
    grads = [rng.standard_normal(s + [d]).astype(np.float32)
             for (_, s), d in zip(outputs_of(c), pb_dims)]
    rates = [np.float32(rng.uniform(0.01, 0.2)) for _ in range(num_dynamic(c))]
    expect = "model"
    if mutate:
        kind = int(rng.integers(6))
        if kind == 0:
            grads = grads[:-1] if len(grads) > 1 else grads + grads
            expect = "fail"
        elif kind == 1:  # one gradient with a longer first dimension
            j = int(rng.integers(len(grads)))
            g = grads[j]
            grads[j] = np.zeros([g.shape[0] + int(rng.integers(1, 3))] + list(g.shape[1:]),
                                np.float32)
            expect = "fail"
        elif kind == 2:
            rates = rates + [np.float32(0.1)]
            expect = "fail"
        elif kind == 3 and rates:
            rates[0] = np.zeros([2], np.float32)
            expect = "fail"
        elif kind == 4:
            g = grads[0].copy()
            g.flat[0] = _pick(rng, BAD_FLOATS[:3])
            grads[0] = g
        else:
            grads[0] = grads[0].reshape(-1)
            expect = "fail" if grads[0].ndim != 1 or len(outputs_of(c)[0][1]) != 0 else "any"
    return grads, rates, expect


def gen_recv_send(rng):
    pb = _pb()
    c = valid_config(rng, max_replicas=2, mode=pb.TPUEmbeddingConfiguration.TRAINING)
    steps = [step("configure", "ok", config=c.SerializeToString()),
             step("load_random", "ok", seed=int(rng.integers(1 << 30)))]
    for _ in range(int(rng.integers(2, 12))):
        replica = int(rng.integers(c.num_tensor_cores))
        kind = int(rng.integers(10))
        if kind <= 2:
            mode = _pick(rng, ("unspecified", "train", "train", "inference"))
            op, kw = valid_enqueue(rng, c, replica=replica, mode=mode)
            steps.append(step("enqueue", "ok", name=op, kwargs=kw))
        elif kind <= 5:
            steps.append(step("recv", "model", replica=replica))
        elif kind <= 8:
            grads, rates, expect = _gradients(rng, c, mutate=rng.random() < 0.4)
            steps.append(step("send", expect, replica=replica, grads=grads, rates=rates))
        else:
            # Another config: the Recv fails where its outputs' shapes differ
            # from the engine's (seed 36 case 6887: other table ids, the
            # same shapes, accepted).
            wrong = valid_config(rng)
            steps.append(step("recv", "fail" if recv_shapes(wrong) != recv_shapes(c) else "any",
                              replica=replica, config=wrong.SerializeToString()))
    steps.append(step("drain", "ok"))
    return steps


def gen_load_retrieve(rng):
    c = valid_config(rng, max_replicas=1, dynamic_lr=False)
    steps = [step("configure", "ok", config=c.SerializeToString()),
             step("load_random", "ok", seed=int(rng.integers(1 << 30)))]
    fields = sorted(optimizer_templates())
    for _ in range(int(rng.integers(1, 5))):
        kind = int(rng.integers(6))
        t = int(rng.integers(len(c.table_descriptor)))
        d = c.table_descriptor[t]
        field = d.optimization_parameters.WhichOneof("parameters")
        num_shards = int(rng.integers(1, 4))
        shard_id = int(rng.integers(num_shards))
        args = {"num_shards": num_shards, "shard_id": shard_id, "seed": int(rng.integers(1 << 30))}
        if rng.random() < 0.5:
            args["table_name"] = d.name
        else:
            args["table_id"] = t
        expect = "ok" if shard_id < d.vocabulary_size else "fail"  # else an empty shard
        mutated = rng.random() < 0.5
        if mutated:
            m = int(rng.integers(6))
            if m == 0:
                args["num_shards"] = _pick(rng, (0, -1, I32_MAX, I32_MIN, d.vocabulary_size + 1))
                args["shard_id"] = int(rng.integers(0, 3))
            elif m == 1:
                args["shard_id"] = _pick(rng, (-1, num_shards, I32_MAX, I32_MIN))
            elif m == 2:
                args.pop("table_name", None)
                args["table_id"] = _pick(rng, (len(c.table_descriptor), 1000, I32_MAX))
            elif m == 3:
                args.pop("table_id", None)
                args["table_name"] = _pick(rng, ("nope", "", d.name + "\0"))
            elif m == 4:
                field = _pick(rng, fields)
            else:
                args["shape_delta"] = [int(_pick(rng, (-1, 1, 0))), int(_pick(rng, (-1, 1, 0)))]
            expect = "any"
        if kind <= 1:
            steps.append(step("load", expect, optimizer=field, **args))
        elif kind <= 3:
            args.pop("shape_delta", None)
            steps.append(step("retrieve", expect, optimizer=field, **args))
        elif kind == 4:
            args.pop("table_name", None), args.pop("table_id", None)
            args["num_tables"] = len(c.table_descriptor) if not mutated or rng.random() < 0.5 \
                else _pick(rng, (0, len(c.table_descriptor) + 1))
            args["group_delta"] = int(rng.integers(-1, 2)) if mutated and rng.random() < 0.5 else 0
            args.pop("shape_delta", None)
            ok = all(shard_id < x.vocabulary_size for x in c.table_descriptor)
            steps.append(step("load_all", "ok" if ok and not mutated else "any", **args))
        else:
            args.pop("table_name", None), args.pop("table_id", None), args.pop("shape_delta", None)
            args["num_tables"] = len(c.table_descriptor) if not mutated else _pick(
                rng, (1, 0, len(c.table_descriptor) + 1, 64))
            ok = all(shard_id < x.vocabulary_size for x in c.table_descriptor)
            steps.append(step("retrieve_all", "ok" if ok and not mutated else "any", **args))
    return steps


def families_copy(c):
    d = type(c)()
    d.CopyFrom(c)
    return d


def gen_lifecycle(rng):
    configs = [valid_config(rng, max_replicas=2) for _ in range(2)]
    steps = []
    for _ in range(int(rng.integers(3, 15))):
        kind = int(rng.integers(11))
        c = configs[int(rng.integers(2))]
        if kind <= 2:
            steps.append(step("configure", "model", config=c.SerializeToString()))
        elif kind <= 4:
            steps.append(step("shutdown", "ok"))
        elif kind == 5:
            steps.append(step("is_initialized", "model"))
        elif kind == 6:
            op, kw = valid_enqueue(rng, c, replica=0)
            steps.append(step("enqueue", "model", name=op, kwargs=kw, config=c.SerializeToString()))
        elif kind == 7:
            steps.append(step("recv", "model", replica=0))
        elif kind == 8:
            steps.append(step("load_random", "model", seed=int(rng.integers(1 << 30))))
        elif kind == 9:
            bad = families_copy(c)
            steps.append(step("configure", "any", config=mutate_config(rng, bad).SerializeToString()))
        else:
            steps.append(step("shutdown_under_recv", "model"))
    steps.append(step("drain", "ok"))
    steps.append(step("shutdown", "ok"))
    return steps


def gen_embedding_bag(rng):
    vocab = int(_pick(rng, (0, 1, 2, 7, 30)))
    dim = int(_pick(rng, (0, 1, 3, 8)))
    bags = int(rng.integers(0, 8))
    id_dtype = _pick(rng, (np.int32, np.int64))
    split_dtype = _pick(rng, (np.int32, np.int64))
    counts = rng.integers(0, 4, bags)
    splits = np.concatenate([[0], np.cumsum(counts)]).astype(split_dtype)
    n = int(splits[-1])
    ids = rng.integers(0, max(vocab, 1), n).astype(id_dtype)
    weights = _weights(rng, n, bool(rng.random() < 0.5))
    params = rng.standard_normal([vocab, dim]).astype(np.float32)
    expect = "ok" if vocab > 0 or n == 0 else "fail"
    grad_expect = "ok"  # the gradient op does not read the table
    combiner = str(_pick(rng, ("sum", "mean", "sqrtn")))
    grad = rng.standard_normal([bags, dim]).astype(np.float32)
    if rng.random() < 0.7:
        kind = int(rng.integers(9))
        expect = grad_expect = "fail"
        if kind == 0 and n:
            grad_expect = "ok"
            ids = ids.copy()
            bad = _pick(rng, (vocab, -1, I32_MAX, I32_MIN) + ((I64_MAX, I64_MIN) if id_dtype == np.int64 else ()))
            ids[int(rng.integers(n))] = bad
        elif kind == 1:
            splits = splits.copy()
            splits[int(rng.integers(splits.size))] = _pick(
                rng, (-1, n + 1, I32_MAX, I32_MIN) + ((I64_MAX, I64_MIN) if split_dtype == np.int64 else ()))
        elif kind == 2:
            splits = _pick(rng, (np.zeros([0], split_dtype), splits[::-1].copy(), splits.reshape(1, -1)))
            expect = grad_expect = "any"
        elif kind == 3:
            weights = np.ones(n + int(rng.integers(1, 3)), np.float32)
        elif kind == 4:
            weights = np.ones(n, np.float32)
            if n:
                weights[int(rng.integers(n))] = _pick(rng, BAD_FLOATS)
            expect = grad_expect = "any"
        elif kind == 5:
            grad_expect = "ok"
            params = _pick(rng, (params.reshape(-1), params.reshape(1, 1, -1), np.zeros([], np.float32)))
        elif kind == 6:
            expect = "ok" if vocab > 0 or n == 0 else "fail"
            grad = _pick(rng, (grad.reshape(-1), np.zeros([bags + 1, dim], np.float32),
                               np.zeros([], np.float32)))
        elif kind == 7:
            ids = ids.reshape(1, -1) if n else np.zeros([0, 2], id_dtype)
            expect = grad_expect = "any"
        else:
            combiner = _pick(rng, ("max", "", "SUM"))
    return [step("embedding_bag", expect, params=params, splits=splits, ids=ids,
                 weights=weights, combiner=combiner, grad=grad, grad_expect=grad_expect)]


def gen_cluster(rng):
    """A random model on S real embedding hosts against one engine
    (``cluster_case.py``): one step, run by the executor's ``cluster`` op."""
    hosts = int(rng.integers(1, 4))
    tables = []
    for _ in range(int(rng.integers(1, 4))):
        vocab = int(_pick(rng, (1, 2, 3, 5, 17, 64)))
        dim = int(rng.integers(1, 9))
        tables.append({"vocab": vocab, "dim": dim,
                       "combiner": str(_pick(rng, ("sum", "mean", "sqrtn"))),
                       "init": (rng.standard_normal((vocab, dim)) * 0.1).astype(np.float32)})
    features = [int(rng.integers(len(tables))) for _ in range(int(rng.integers(1, 5)))]
    batch = int(rng.integers(1, 9))
    steps = []
    for _ in range(int(rng.integers(1, 4))):
        feats, grads = {}, {}
        for i, t in enumerate(features):
            lengths = rng.integers(0, 4, batch)
            splits = np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64)
            feats["f%d" % i] = (splits, rng.integers(0, tables[t]["vocab"], int(splits[-1])))
            grads["f%d" % i] = rng.standard_normal((batch, tables[t]["dim"])).astype(np.float32)
        steps.append({"features": feats, "grads": grads})
    spec = {"hosts": hosts, "tables": tables, "features": features, "batch": batch,
            "optimizer": str(_pick(rng, ("sgd", "adagrad", "adam", "ftrl"))),
            "lr": float(_pick(rng, (0.01, 0.1, 0.5))),
            "sharding": str(_pick(rng, ("DIV_DEFAULT", "MOD"))), "steps": steps}
    # Every step in one tf.function call: the batches are queued on the hosts
    # ahead of the updates (engine first_rows_); with pipelining too, a host
    # looks the next batch up before the previous gradients come (lookahead_).
    spec["one_call"] = bool(rng.random() < 0.5)
    spec["pipeline"] = bool(rng.random() < 0.3)
    return [step("cluster", "ok", spec=spec)]


def gen_sparsecore(rng):
    """TF's SparseCore op family, kernels only (sparsecore_family.py)."""
    import sparsecore_family  # pylint: disable=import-outside-toplevel

    return sparsecore_family.generate(rng)


def gen_selftest(rng, index):
    """Cases that prove the runner: index % 6 = 0 abort, 1 SIGSEGV, 2 hang,
    3 a non-TF exception, 4 a rejected op that changes the tables, 5 ok."""
    kind = ("abort", "segv", "hang", "raise", "corrupt", "ok")[index % 6]
    c = valid_config(rng, max_replicas=1)
    return [step("configure", "ok", config=c.SerializeToString()),
            step("load_random", "ok", seed=1),
            step("selftest", "fail" if kind == "corrupt" else "ok", kind=kind)]


GENERATORS = {"config": gen_config, "enqueue": gen_enqueue, "recv_send": gen_recv_send,
              "load_retrieve": gen_load_retrieve, "lifecycle": gen_lifecycle,
              "embedding_bag": gen_embedding_bag, "cluster": gen_cluster,
              "sparsecore": gen_sparsecore}


def generate(family, seed, index):
    rng = np.random.default_rng([seed, ALL_FAMILIES.index(family), index])
    if family == "selftest":
        return gen_selftest(rng, index)
    return GENERATORS[family](rng)


def _jsonable(x):
    if isinstance(x, np.ndarray):
        return {"dtype": str(x.dtype), "shape": list(x.shape),
                "values": x.reshape(-1)[:64].tolist()}
    if isinstance(x, (np.integer, np.floating)):
        return x.item()
    if isinstance(x, bytes):
        return x.hex()
    if isinstance(x, dict):
        return {k: _jsonable(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, float) and x != x:
        return "nan"
    return x


def describe(family, seed, index):
    """The case's steps as JSON-able data (arrays cut to 64 values; configs
    as hex of the serialized proto)."""
    return _jsonable(generate(family, seed, index))
