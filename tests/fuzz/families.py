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
bytes).  The configs and their mutations are ``fuzz_configs.py``'s, the
enqueue inputs and Send gradients ``fuzz_inputs.py``'s.  Importing this
module does not import TensorFlow (the runner only needs the family names);
generation does.
"""
import numpy as np

from fuzz_configs import (BAD_FLOATS, I32_MAX, I32_MIN, I64_MAX, I64_MIN, config_protos,
                          copy_config, mutate_bytes, mutate_config, optimizer_templates, pick,
                          recv_shapes, valid_config)
from fuzz_inputs import mutate_enqueue, random_weights, send_gradients, valid_enqueue

FAMILIES = ("config", "enqueue", "recv_send", "load_retrieve", "lifecycle", "embedding_bag",
            "cluster", "sparsecore")
#: Families whose cases are slow (``cluster``: S server processes a case):
#: ``runner.py`` runs at most this many of them unless ``--no-case-limits``.
CASE_LIMITS = {"cluster": 100}
#: selftest: deliberate crash / hang / wrong-error / corruption cases that
#: prove the runner records each (tests/fuzz/test_fuzz_quick.py).
ALL_FAMILIES = FAMILIES + ("selftest",)


def step(op, expect="ok", **args):
    return {"op": op, "args": args, "expect": expect}


def gen_config(rng):
    pb = config_protos()
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
        mode = pick(rng, ("unspecified", "train", "inference"))
        op, kw = valid_enqueue(rng, c, replica=replica, mode=mode)
        expect = "ok"
        if rng.random() < 0.75:
            kw, expect = mutate_enqueue(rng, c, op, kw)
        steps.append(step("enqueue", expect, name=op, kwargs=kw))
    steps.append(step("drain", "ok"))
    return steps


def gen_recv_send(rng):
    pb = config_protos()
    c = valid_config(rng, max_replicas=2, mode=pb.TPUEmbeddingConfiguration.TRAINING)
    steps = [step("configure", "ok", config=c.SerializeToString()),
             step("load_random", "ok", seed=int(rng.integers(1 << 30)))]
    for _ in range(int(rng.integers(2, 12))):
        replica = int(rng.integers(c.num_tensor_cores))
        kind = int(rng.integers(10))
        if kind <= 2:
            mode = pick(rng, ("unspecified", "train", "train", "inference"))
            op, kw = valid_enqueue(rng, c, replica=replica, mode=mode)
            steps.append(step("enqueue", "ok", name=op, kwargs=kw))
        elif kind <= 5:
            steps.append(step("recv", "model", replica=replica))
        elif kind <= 8:
            grads, rates, expect = send_gradients(rng, c, mutate=rng.random() < 0.4)
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
                args["num_shards"] = pick(rng, (0, -1, I32_MAX, I32_MIN, d.vocabulary_size + 1))
                args["shard_id"] = int(rng.integers(0, 3))
            elif m == 1:
                args["shard_id"] = pick(rng, (-1, num_shards, I32_MAX, I32_MIN))
            elif m == 2:
                args.pop("table_name", None)
                args["table_id"] = pick(rng, (len(c.table_descriptor), 1000, I32_MAX))
            elif m == 3:
                args.pop("table_id", None)
                args["table_name"] = pick(rng, ("nope", "", d.name + "\0"))
            elif m == 4:
                field = pick(rng, fields)
            else:
                args["shape_delta"] = [int(pick(rng, (-1, 1, 0))), int(pick(rng, (-1, 1, 0)))]
            expect = "any"
        if kind <= 1:
            steps.append(step("load", expect, optimizer=field, **args))
        elif kind <= 3:
            args.pop("shape_delta", None)
            steps.append(step("retrieve", expect, optimizer=field, **args))
        elif kind == 4:
            args.pop("table_name", None), args.pop("table_id", None)
            args["num_tables"] = len(c.table_descriptor) if not mutated or rng.random() < 0.5 \
                else pick(rng, (0, len(c.table_descriptor) + 1))
            args["group_delta"] = int(rng.integers(-1, 2)) if mutated and rng.random() < 0.5 else 0
            args.pop("shape_delta", None)
            ok = all(shard_id < x.vocabulary_size for x in c.table_descriptor)
            steps.append(step("load_all", "ok" if ok and not mutated else "any", **args))
        else:
            args.pop("table_name", None), args.pop("table_id", None), args.pop("shape_delta", None)
            args["num_tables"] = len(c.table_descriptor) if not mutated else pick(
                rng, (1, 0, len(c.table_descriptor) + 1, 64))
            ok = all(shard_id < x.vocabulary_size for x in c.table_descriptor)
            steps.append(step("retrieve_all", "ok" if ok and not mutated else "any", **args))
    return steps


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
            bad = copy_config(c)
            bad_bytes = mutate_config(rng, bad).SerializeToString()
            steps.append(step("configure", "any", config=bad_bytes))
        else:
            steps.append(step("shutdown_under_recv", "model"))
    steps.append(step("drain", "ok"))
    steps.append(step("shutdown", "ok"))
    return steps


def gen_embedding_bag(rng):
    vocab = int(pick(rng, (0, 1, 2, 7, 30)))
    dim = int(pick(rng, (0, 1, 3, 8)))
    bags = int(rng.integers(0, 8))
    id_dtype = pick(rng, (np.int32, np.int64))
    split_dtype = pick(rng, (np.int32, np.int64))
    counts = rng.integers(0, 4, bags)
    splits = np.concatenate([[0], np.cumsum(counts)]).astype(split_dtype)
    n = int(splits[-1])
    ids = rng.integers(0, max(vocab, 1), n).astype(id_dtype)
    weights = random_weights(rng, n, bool(rng.random() < 0.5))
    params = rng.standard_normal([vocab, dim]).astype(np.float32)
    expect = "ok" if vocab > 0 or n == 0 else "fail"
    grad_expect = "ok"  # the gradient op does not read the table
    combiner = str(pick(rng, ("sum", "mean", "sqrtn")))
    grad = rng.standard_normal([bags, dim]).astype(np.float32)
    if rng.random() < 0.7:
        kind = int(rng.integers(9))
        expect = grad_expect = "fail"
        if kind == 0 and n:
            grad_expect = "ok"
            ids = ids.copy()
            wide = (I64_MAX, I64_MIN) if id_dtype == np.int64 else ()
            bad = pick(rng, (vocab, -1, I32_MAX, I32_MIN) + wide)
            ids[int(rng.integers(n))] = bad
        elif kind == 1:
            splits = splits.copy()
            splits[int(rng.integers(splits.size))] = pick(
                rng, (-1, n + 1, I32_MAX, I32_MIN)
                + ((I64_MAX, I64_MIN) if split_dtype == np.int64 else ()))
        elif kind == 2:
            splits = pick(rng, (np.zeros([0], split_dtype), splits[::-1].copy(),
                                splits.reshape(1, -1)))
            expect = grad_expect = "any"
        elif kind == 3:
            weights = np.ones(n + int(rng.integers(1, 3)), np.float32)
        elif kind == 4:
            weights = np.ones(n, np.float32)
            if n:
                weights[int(rng.integers(n))] = pick(rng, BAD_FLOATS)
            expect = grad_expect = "any"
        elif kind == 5:
            grad_expect = "ok"
            params = pick(rng, (params.reshape(-1), params.reshape(1, 1, -1),
                                np.zeros([], np.float32)))
        elif kind == 6:
            expect = "ok" if vocab > 0 or n == 0 else "fail"
            grad = pick(rng, (grad.reshape(-1), np.zeros([bags + 1, dim], np.float32),
                               np.zeros([], np.float32)))
        elif kind == 7:
            ids = ids.reshape(1, -1) if n else np.zeros([0, 2], id_dtype)
            expect = grad_expect = "any"
        else:
            combiner = pick(rng, ("max", "", "SUM"))
    return [step("embedding_bag", expect, params=params, splits=splits, ids=ids,
                 weights=weights, combiner=combiner, grad=grad, grad_expect=grad_expect)]


def gen_cluster(rng):
    """A random model on S real embedding hosts against one engine
    (``cluster_case.py``): one step, run by the executor's ``cluster`` op."""
    hosts = int(rng.integers(1, 4))
    tables = []
    for _ in range(int(rng.integers(1, 4))):
        vocab = int(pick(rng, (1, 2, 3, 5, 17, 64)))
        dim = int(rng.integers(1, 9))
        tables.append({"vocab": vocab, "dim": dim,
                       "combiner": str(pick(rng, ("sum", "mean", "sqrtn"))),
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
            "optimizer": str(pick(rng, ("sgd", "adagrad", "adam", "ftrl"))),
            "lr": float(pick(rng, (0.01, 0.1, 0.5))),
            "sharding": str(pick(rng, ("DIV_DEFAULT", "MOD"))), "steps": steps}
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
