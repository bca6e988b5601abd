"""Configurations of the fuzz suite's cases: small valid
``TPUEmbeddingConfiguration`` protos, their boundary / hostile mutations (of
fields and of the serialized bytes), and what a case needs to know of a
config (its Recv outputs, dynamic learning-rate tags, optimizer slots).
Generation is seeded by the caller's ``rng``; importing this module does not
import TensorFlow.
"""
import numpy as np

I32_MAX, I32_MIN = 2**31 - 1, -2**31
I64_MAX, I64_MIN = 2**63 - 1, -2**63
BIG_INTS = (0, -1, 1, 2, 255, 256, 2**16, 2**20, I32_MAX, I32_MIN, 2**31, 2**32 + 1,
            2**40, I64_MAX, I64_MIN)
BAD_FLOATS = (float("nan"), float("inf"), -float("inf"), 0.0, -0.0, 1e38, -1e38, 1e-45)

_templates = None


def config_protos():
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
    pb = config_protos()
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


def pick(rng, values):
    return values[int(rng.integers(len(values)))]


def mutate_config(rng, c):
    """Applies 1-3 boundary / hostile field mutations to config proto `c`."""
    for _ in range(int(rng.integers(1, 4))):
        kind = int(rng.integers(0, 19))
        tables = c.table_descriptor
        d = tables[int(rng.integers(len(tables)))] if len(tables) else tables.add()
        p = d.optimization_parameters
        if kind == 0:
            d.vocabulary_size = pick(rng, BIG_INTS[:9] + (2**40, I64_MAX, I64_MIN, 2**31))
        elif kind == 1:
            d.dimension = pick(rng, (0, -1, 1, 2**16, 2**20, I32_MAX, I32_MIN))
        elif kind == 2:
            c.num_tensor_cores = pick(rng, (0, -1, 2, 3, 64, 4096, 2**20, I32_MAX, I32_MIN))
        elif kind == 3:
            c.batch_size_per_tensor_core = pick(rng, (0, -1, 1, 2**16, 2**30, I32_MAX, I32_MIN))
        elif kind == 4:
            d.num_features = pick(rng, (0, -1, 1, 2**16, 2**30, I32_MAX, I32_MIN))
        elif kind == 5 and len(c.feature_descriptor):
            f = c.feature_descriptor[int(rng.integers(len(c.feature_descriptor)))]
            choice = int(rng.integers(4))
            if choice == 0 and len(f.input_shape):
                f.input_shape[int(rng.integers(len(f.input_shape)))] = pick(
                    rng, (0, -1, 2**15, 2**16, 2**20, I32_MAX, I32_MIN))
            elif choice == 1:
                rank = int(pick(rng, (30, 253, 254, 300)))
                f.input_shape.extend([int(rng.integers(1, 3))] * rank)
            elif choice == 2:
                del f.input_shape[:]
            else:
                f.input_shape.extend([2**16, 2**16])
        elif kind == 6 and len(c.feature_descriptor):
            f = c.feature_descriptor[int(rng.integers(len(c.feature_descriptor)))]
            f.table_id = pick(rng, (-1, len(tables), 1000, I32_MAX, I32_MIN))
        elif kind == 7:
            d.name = pick(rng, ("", tables[0].name, "x" * 1000, "\u00e9\u0000b"))
        elif kind == 8:
            p.Clear()
            if rng.random() < 0.5:
                getattr(p, pick(rng, ("mdl_adagrad_light", "user_defined_program",
                                       "adam", "ftrl"))).SetInParent()
        elif kind == 9:
            p.learning_rate.constant = pick(rng, BAD_FLOATS)
        elif kind == 10:
            p.learning_rate.dynamic.tag = pick(rng, (-1, 1, 5, I32_MAX, I32_MIN))
        elif kind == 11:
            q = p.simulated_quantization
            q.enabled = True
            q.num_buckets = pick(rng, (0, 1, 2, -1, I32_MAX, I32_MIN))
            q.clipping_limits.lower.value = pick(rng, BAD_FLOATS)
            q.clipping_limits.upper.value = pick(rng, BAD_FLOATS)
        elif kind == 12:
            lim = p.gradient_clipping_limits if rng.random() < 0.5 else p.clipping_limits
            lim.lower.value = pick(rng, BAD_FLOATS)
            lim.upper.value = pick(rng, BAD_FLOATS)
        elif kind == 13:
            p.weight_decay_factor = pick(rng, BAD_FLOATS)
            p.multiply_weight_decay_factor_by_learning_rate = bool(rng.random() < 0.5)
        elif kind == 14:
            which = p.WhichOneof("parameters")
            if which:
                msg = getattr(p, which)
                fields = [f for f in msg.DESCRIPTOR.fields if f.cpp_type == f.CPPTYPE_FLOAT]
                if fields:
                    setattr(msg, pick(rng, fields).name, pick(rng, BAD_FLOATS))
        elif kind == 15:
            c.mode = pick(rng, (0, 1, 2, 3, 4, 99, -1))
            c.sharding_strategy = pick(rng, (0, 1, 2, 99))
        elif kind == 16:
            c.spmd_sharding.enabled = True
            c.spmd_sharding.num_cores_per_replica = pick(rng, (0, -1, 1, 2, I32_MAX))
            manual = bool(rng.random() < 0.3)
            if "use_manual_partitioning" in c.spmd_sharding.DESCRIPTOR.fields_by_name:
                c.spmd_sharding.use_manual_partitioning = manual
            elif manual:  # TF < 2.19: the field as a newer TF writes it (refused)
                c.spmd_sharding.MergeFromString(b"\x18\x01")
        elif kind == 17:
            p.gradient_accumulation_status = pick(rng, (0, 1, 2, 7))
            p.low_dimensional_packing_status = pick(rng, (0, 1, 2, 9))
        else:
            for _ in range(int(pick(rng, (2, 20, 200)))):
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


def copy_config(c):
    d = type(c)()
    d.CopyFrom(c)
    return d
