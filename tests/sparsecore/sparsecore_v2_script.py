"""A TPUEmbeddingV2 program for the stand-in SparseCore TPU (child script of
test_sparsecore_v2_standin.py; run as ``python -m tf_tpu_emb.run --embedding
v2 --replicas N sparsecore_v2_script.py MODE OUT.json [OPTIMIZER STEPS]``).

It is an ordinary TPU program: resolver, initialize_tpu_system, TPUStrategy,
TF's ``tf.tpu.experimental.embedding.TPUEmbeddingV2``.  Its inputs are drawn
from a fixed seed and do not depend on N (a global batch of ``GLOBAL_BATCH``
samples, replica k gets samples [k*B, (k+1)*B)); it writes the inputs, the
logical tables before and after training (read from ``embedding_tables``
with TF's own unshuffle, tpu_embedding_v3_utils) and every step's global
activations to OUT.json, for the test's numpy model.  Even steps look up with
``embedding(features)``, odd ones with ``enqueue`` + ``dequeue``.

MODE: ``train`` (the above), ``pipelined`` (train with
``pipeline_execution_with_tensor_core=True``, then two lookups without an
update), ``sequential`` (the same object, its step traced in TF's
``SequentialEmbeddingContext``), ``checkpoint`` (train, save, restore into a
fresh object and write both objects' tables), ``missing`` (one replica runs a
lookup alone), ``bad_ids`` (an id past the table on replica N-1),
``enqueue_device`` (``enqueue(..., device=worker_devices[0])``, one replica).
"""
import json
import sys

import numpy as np
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3_utils

GLOBAL_BATCH = 32
E = tf.tpu.experimental.embedding
# name: (vocabulary, width, combiner).  video and user share width and
# optimizer: TF stacks them; item (width 4, padded to 8 by TF's layout, and 100
# rows, padded too) has a learning rate of its own, so a stack of its own.
TABLES = {"video": (64, 8, "sum"), "user": (32, 8, "mean"), "item": (100, 4, "sqrtn")}
# feature: (table, form, max ids per sample)
FEATURES = {"watched": ("video", "ragged", 3), "clicked": ("video", "dense", 1),
            "friends": ("user", "ragged", 2), "bought": ("item", "ragged", 4),
            "tags": ("user", "sparse", 3)}
HYPER = {"sgd": {}, "adagrad": {"initial_accumulator_value": 0.1},
         # Adam's update of a row whose summed gradient nearly cancels moves by
         # (lr / epsilon) times the gradient's rounding; a TPU's order of the
         # sum over replicas is not ours, nor the model's, so epsilon keeps that
         # factor near 1 and the comparison at 1e-6 meaningful.
         "adam": {"beta_1": 0.9, "beta_2": 0.99, "epsilon": 0.1, "sum_inside_sqrt": True},
         # AdagradMomentum's first step moves a row by lr * g / sqrt(g * g +
         # epsilon): where g nearly cancels that is (lr / sqrt(epsilon)) times
         # the gradient's rounding, 3.2 at epsilon 1e-3 -- enough for the
         # tables' random draw to cross 1e-6 now and then (CI, stop 36).
         "adagrad_momentum": {"momentum": 0.5, "beta2": 1.0, "epsilon": 0.1,
                              "exponent": 2.0, "use_nesterov": False},
         "ftrl": {"learning_rate_power": -0.5, "initial_accumulator_value": 0.1,
                  "l1_regularization_strength": 0.0, "l2_regularization_strength": 0.01,
                  "beta": 0.1, "multiply_linear_by_learning_rate": False}}
LEARNING_RATES = {"video": 0.1, "user": 0.1, "item": 0.05}


def optimizer(name, lr):
    h = dict(HYPER[name])
    if name == "sgd":
        return E.SGD(learning_rate=lr)
    if name == "adagrad":
        return E.Adagrad(learning_rate=lr, **h)
    if name == "adam":
        return E.Adam(learning_rate=lr, lazy_adam=True, **h)
    if name == "adagrad_momentum":
        return E.AdagradMomentum(learning_rate=lr, **h)
    if name == "ftrl":
        return E.FTRL(learning_rate=lr, **h)
    raise ValueError(name)


def inputs(steps, seed=7):
    """Per step, per feature: (row lengths, ids, weights) of the global batch
    and the gradient offsets [GLOBAL_BATCH, width]."""
    rng = np.random.RandomState(seed)
    data = []
    for _ in range(steps):
        step = {}
        for f, (table, form, most) in FEATURES.items():
            vocab, width, _ = TABLES[table]
            lengths = (np.ones(GLOBAL_BATCH, np.int64) if form == "dense"
                       else rng.randint(0 if f != "watched" else 1, most + 1, GLOBAL_BATCH))
            n = int(lengths.sum())
            ids = rng.randint(0, vocab, n)
            ids[: n // 4] = ids[: n // 4] % 5  # repeated ids across samples and replicas
            weights = (np.ones(n) if form == "dense" else rng.uniform(0.5, 2.0, n))
            offsets = rng.normal(0, 0.5, (GLOBAL_BATCH, width))
            step[f] = {"lengths": lengths.tolist(), "ids": ids.tolist(),
                       "weights": np.float32(weights).tolist(),
                       "offsets": np.float32(offsets).tolist()}
        data.append(step)
    return data


def replica_slice(feature, k, per_replica):
    lengths = np.array(feature["lengths"])
    starts = np.concatenate([[0], np.cumsum(lengths)])
    lo, hi = k * per_replica, (k + 1) * per_replica
    ids = np.array(feature["ids"][starts[lo]:starts[hi]], np.int32)
    weights = np.array(feature["weights"][starts[lo]:starts[hi]], np.float32)
    return lengths[lo:hi], ids, weights


def make_embedding(strategy, opt_name, per_replica, build=True, pipelining=False):
    tables = {name: E.TableConfig(vocabulary_size=v, dim=d, combiner=c, name=name,
                                  optimizer=optimizer(opt_name, LEARNING_RATES[name]))
              for name, (v, d, c) in TABLES.items()}
    config = {f: E.FeatureConfig(tables[t], name=f, output_shape=[per_replica])
              for f, (t, _, _) in FEATURES.items()}
    with strategy.scope():
        embedding = tf.tpu.experimental.embedding.TPUEmbeddingV2(
            config, pipeline_execution_with_tensor_core=pipelining,
            sparse_core_embedding_config=E.SparseCoreEmbeddingConfig(
                max_ids_per_chip_per_sample=64))
        if build:
            embedding.build()
    return embedding


def logical_tables(embedding):
    """Every logical table, from ``embedding_tables`` (the stacked, sharded
    variables) with TF's own unshuffle and padding removal."""
    out = {}
    for stacked, variable in embedding.embedding_tables.items():
        full = tf.concat([v.read_value() for v in variable.values], axis=0)
        for name, (vocab, width, _) in TABLES.items():
            layout = embedding.embedding_layouts[name]
            if layout.stacked_table_name != stacked:
                continue
            shards = layout.num_sparse_cores
            table = tpu_embedding_v3_utils.unshuffle_from_sc_to_cpu(
                full, num_sparse_cores=shards,
                offset_in_shard=layout.sparse_core_shard_row_offset,
                size_in_shard=layout.unsharded_padded_shape[0] // shards,
                shard_rotation=layout.sparse_core_shard_rotation)
            out[name] = table.numpy()[:vocab, :width].tolist()
    return out


def across_generations(strategy, opt_name, per_replica, path, logical):
    """The V2 checkpoint at `path` in the other generations: our per-table
    reader (tf_tpu_emb.sparsecore_checkpoint) against TF's unshuffle of the
    live tables; TF's TPUEmbeddingForServing restoring its parameters; and
    back: a per-table checkpoint (ForServing's, new values) restored into a
    fresh TPUEmbeddingV2 through TF's checkpoint adapter."""
    import tempfile  # pylint: disable=import-outside-toplevel
    from tf_tpu_emb import sparsecore_checkpoint  # pylint: disable=import-outside-toplevel
    out = {}
    tables = sparsecore_checkpoint.read_tables(path)
    out["read_states"] = {name: sorted(states) for name, states in tables.items()}
    out["read_equal"] = {name: bool(np.array_equal(tables[name]["parameters"],
                                                   np.array(logical[name], np.float32)))
                         for name in TABLES}
    configs = {name: E.TableConfig(vocabulary_size=v, dim=d, combiner=c, name=name)
               for name, (v, d, c) in TABLES.items()}
    features = {f: E.FeatureConfig(configs[t], name=f) for f, (t, _, _) in FEATURES.items()}
    serving = E.TPUEmbeddingForServing(features, optimizer=None)
    tf.train.Checkpoint(embedding=serving).restore(path).expect_partial()
    out["serving_equal"] = {c.name: bool(np.array_equal(v.numpy(),
                                                        np.array(logical[c.name], np.float32)))
                            for c, v in serving.embedding_tables.items()}
    # Back to V2: new values, saved per table (ForServing's layout), restored
    # into a fresh V2 object.
    new = {name: np.array(logical[name], np.float32) + 1.0 for name in TABLES}
    per_table = E.TPUEmbeddingForServing(features, optimizer=None)
    per_table.build()
    for c, v in per_table.embedding_tables.items():
        v.assign(new[c.name])
    back = tf.train.Checkpoint(embedding=per_table).save(tempfile.mkdtemp() + "/per_table")
    # Restored before it is built, so TF creates its variables from the
    # checkpoint through its adapter (unsharded -> sharded).
    fresh = make_embedding(strategy, opt_name, per_replica, build=False)
    tf.train.Checkpoint(embedding=fresh).restore(back).expect_partial()
    with strategy.scope():
        fresh.build()
    restored = logical_tables(fresh)
    out["back_equal"] = {name: bool(np.allclose(np.array(restored[name], np.float32), new[name]))
                         for name in TABLES}
    return out


# The serving export of the trained V2 model: every feature, as a serving
# program feeds it (dense ids, ragged rows, weights where a table combines).
SERVING_SIGNATURE = {"clicked": tf.TensorSpec([None], tf.int32),
                     "watched": tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1),
                     "friends": tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1),
                     "bought": tf.RaggedTensorSpec([None, None], tf.int32, ragged_rank=1),
                     "tags": tf.SparseTensorSpec([None, None], tf.int32)}
SERVING_WEIGHTED = ["watched", "bought", "tags"]


def export_from_v2(embedding):
    """tf_tpu_emb.serving.export_serving straight from the live V2 object (its
    stacked, sharded tables unstacked per table), stock ops only; returns the
    SavedModel's directory (the test loads it where tf_tpu_emb never was)."""
    import os  # pylint: disable=import-outside-toplevel
    from tf_tpu_emb.serving import export_serving  # pylint: disable=import-outside-toplevel
    path = os.path.join(os.getcwd(), "serving_from_v2")
    export_serving(path, embedding, SERVING_SIGNATURE, weighted_features=SERVING_WEIGHTED)
    return path


def distributed(strategy, step, per_replica, with_offsets=True, bad_replica=None):
    def fn(ctx):
        k = ctx.replica_id_in_sync_group
        features, weights, offsets = {}, {}, {}
        for f, (_, form, _) in FEATURES.items():
            lengths, ids, w = replica_slice(step[f], k, per_replica)
            if k == bad_replica and f == "watched":
                ids = ids.copy()
                ids[0] = 1 << 20  # far past every table of the stack
            if form == "dense":
                features[f], weights[f] = tf.constant(ids), None
            elif form == "sparse":  # [samples, most ids a sample]; some rows empty
                most = FEATURES[f][2]
                indices = np.array([[s, j] for s, n in enumerate(lengths) for j in range(n)],
                                   np.int64).reshape(-1, 2)
                features[f] = tf.SparseTensor(indices, ids, [per_replica, most])
                weights[f] = tf.SparseTensor(indices, w, [per_replica, most])
            else:
                features[f] = tf.RaggedTensor.from_row_lengths(ids, lengths)
                weights[f] = tf.RaggedTensor.from_row_lengths(w, lengths)
            offsets[f] = tf.constant(
                np.array(step[f]["offsets"], np.float32)[k * per_replica:(k + 1) * per_replica])
        return features, weights, offsets
    return strategy.experimental_distribute_values_from_function(fn)


def next_step(result, strategy, train_step, dist):
    """A whole step after a failed one: its activations of ``clicked``, or its error."""
    try:
        acts = train_step(dist)
        result["next_step"] = np.concatenate(
            [a.numpy() for a in strategy.experimental_local_results(acts["clicked"])]).tolist()
    except tf.errors.OpError as e:
        result["next_step"] = [type(e).__name__, e.message]


def main():
    mode, out_path = sys.argv[1], sys.argv[2]
    opt_name = sys.argv[3] if len(sys.argv) > 3 else "sgd"
    steps = int(sys.argv[4]) if len(sys.argv) > 4 else 3
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
    feature = strategy.extended.tpu_hardware_feature
    n = strategy.num_replicas_in_sync
    per_replica = GLOBAL_BATCH // n
    embedding = make_embedding(strategy, opt_name, per_replica,
                               pipelining=mode in ("pipelined", "sequential"))
    data = inputs(steps)
    result = {"replicas": n, "embedding_feature": str(feature.embedding_feature),
              "sparsecores_per_chip": feature.num_embedding_devices_per_chip,
              "embedding_class": type(embedding).__mro__[1].__module__ + "." +
                                 type(embedding).__mro__[1].__name__,
              "stacked": {s: [t.name for t in ts]
                          for s, ts in embedding._stacked_table_to_tables.items()},  # pylint: disable=protected-access
              "inputs": data, "initial": logical_tables(embedding), "activations": []}

    @tf.function
    def train_step(dist, split=False):
        def fn(features, weights, offsets):
            if split:  # enqueue (preprocessing on the host) and dequeue (the lookup)
                activations, preserved = embedding.dequeue(embedding.enqueue(features, weights))
            else:      # __call__: embedding_lookup, the two in one
                activations, preserved = embedding(features, weights)
            grads = {f: activations[f] + offsets[f] for f in FEATURES}
            embedding.apply_gradients(grads, preserved)
            return activations
        return strategy.run(fn, args=dist)

    if mode == "missing":
        # One replica's lookup alone: the others never come (a clear error, not a hang).
        @tf.function
        def alone(features, weights):
            return embedding(features, weights)
        dist = distributed(strategy, data[0], per_replica)
        first = strategy.experimental_local_results(dist[0])[0]
        first_w = strategy.experimental_local_results(dist[1])[0]
        try:
            with tf.device("/device:CPU:0"):
                alone(first, first_w)
            result["error"] = None
        except tf.errors.OpError as e:
            result["error"] = [type(e).__name__, e.message]
        # The system goes on: the next step of every replica meets as before.
        next_step(result, strategy, train_step, distributed(strategy, data[0], per_replica))
        with open(out_path, "w") as f:
            json.dump(result, f)
        return
    if mode == "enqueue_device":
        # enqueue on a named device, as a TPU program passes its strategy's
        # worker device (seam 9), then dequeue in the replica: the lookup
        # equals embedding(features); a device that is no replica's keeps
        # TF's error.
        dist = distributed(strategy, data[0], per_replica)
        features = strategy.experimental_local_results(dist[0])[0]
        weights = strategy.experimental_local_results(dist[1])[0]

        @tf.function
        def on_device(features, weights):
            preprocessed = embedding.enqueue(features, weights,
                                             device=strategy.extended.worker_devices[0])
            return strategy.run(lambda p: embedding.dequeue(p)[0], args=(preprocessed,))

        @tf.function
        def direct(features, weights):
            return strategy.run(lambda f, w: embedding(f, w)[0], args=(features, weights))
        got, want = on_device(features, weights), direct(features, weights)
        result["equal"] = {f: bool(np.array_equal(got[f].numpy(), want[f].numpy()))
                           for f in FEATURES}
        try:
            embedding.enqueue(features, weights, device="/job:localhost/replica:0/task:0/"
                              "device:CPU:%d" % (n + 1))
            result["error"] = None
        except ValueError as e:
            result["error"] = str(e)
        with open(out_path, "w") as f:
            json.dump(result, f)
        return
    if mode == "bad_ids":
        try:
            train_step(distributed(strategy, data[0], per_replica, bad_replica=n - 1))
            result["error"] = None
        except tf.errors.OpError as e:
            result["error"] = [type(e).__name__, e.message]
        next_step(result, strategy, train_step, distributed(strategy, data[0], per_replica))
        with open(out_path, "w") as f:
            json.dump(result, f)
        return

    def global_acts(acts):
        return {f: np.concatenate([a.numpy() for a in strategy.experimental_local_results(
            acts[f])]).tolist() for f in FEATURES}

    for k, step in enumerate(data):
        dist = distributed(strategy, step, per_replica)
        if mode == "sequential":  # TF's switch: pipelining off for what is traced in it
            from tensorflow.python.tpu import embedding_context_utils  # pylint: disable=import-outside-toplevel
            with embedding_context_utils.SequentialEmbeddingContext():
                acts = train_step(dist, split=k % 2 == 1)
        else:
            acts = train_step(dist, split=k % 2 == 1)
        result["activations"].append(global_acts(acts))
    result["final"] = logical_tables(embedding)
    if mode == "pipelined":
        # Two lookups without an update: the first does not see the last
        # update, the second does.
        @tf.function
        def lookup(dist):
            return strategy.run(lambda f, w, o: embedding(f, w)[0], args=dist)
        result["lookups_after"] = [global_acts(lookup(distributed(strategy, data[0],
                                                                  per_replica)))
                                   for _ in range(2)]
    # The stand-in's seam 7 (tf_tpu_emb/tpu/embedding_v2.py): per traced
    # step, the in-place updates and TF's gradient ops still feeding anything.
    graphs = [f.graph for f in train_step._list_all_concrete_functions()]  # pylint: disable=protected-access
    result["in_place_ops"] = [sum(op.type.endswith("InPlace") for op in g.get_operations())
                              for g in graphs]
    result["used_grad_ops"] = [sum(op.type.startswith("XlaSparseDenseMatmulGradWith")
                                   and any(t.consumers() for t in op.outputs)
                                   for op in g.get_operations()) for g in graphs]
    # TF's pipelining marks on the lookup and in-place ops (seam 8).
    result["pipelining_marks"] = sorted({
        "%s=%s" % ("lookup" if "GradWith" not in op.type else "update",
                   op.node_def.attr["_embedding_pipelining"].s.decode()
                   if "_embedding_pipelining" in op.node_def.attr else "")
        for g in graphs for op in g.get_operations()
        if op.type.startswith("XlaSparseDenseMatmul") or op.type.endswith("InPlace")})
    # TF's two views of the stacked tables: embedding_tables (the sharded
    # variables, keyed by stacked table) and embedding_table_shards (each
    # chip's shard read on its device).
    tables = embedding.embedding_tables
    result["embedding_tables"] = {name: [list(v.shape) for v in var.values]
                                  for name, var in tables.items()}
    result["table_shards"] = {
        name: [[device, bool(np.array_equal(shard.numpy(), tables[name].values[k].numpy()))]
               for k, (device, shard) in enumerate(shards)]
        for name, shards in embedding.embedding_table_shards.items()}
    if mode == "checkpoint":
        import tempfile  # pylint: disable=import-outside-toplevel
        path = tf.train.Checkpoint(embedding=embedding).save(tempfile.mkdtemp() + "/ckpt")
        result["checkpoint_keys"] = {name: shape for name, shape in
                                     tf.train.list_variables(path)}
        reader = tf.train.load_checkpoint(path)
        result["checkpoint_tables"] = {
            s: np.array_equal(reader.get_tensor("embedding/%s/.ATTRIBUTES/VARIABLE_VALUE" % s),
                              tf.concat([v.read_value() for v in var.values], 0).numpy())
            for s, var in embedding.embedding_tables.items()}
        result["across_generations"] = across_generations(strategy, opt_name, per_replica,
                                                          path, logical_tables(embedding))
        result["serving_dir"] = export_from_v2(embedding)
        fresh = make_embedding(strategy, opt_name, per_replica)
        result["fresh_before_restore"] = logical_tables(fresh)
        tf.train.Checkpoint(embedding=fresh).restore(path).assert_consumed()
        result["restored"] = logical_tables(fresh)
        # The restored object trains on: one more step on both must agree.
        more = inputs(steps + 1)[-1]
        train_step(distributed(strategy, more, per_replica))
        result["after_more"] = logical_tables(embedding)
        embedding = fresh

        @tf.function
        def fresh_step(dist):
            def fn(features, weights, offsets):
                activations, preserved = fresh(features, weights)
                fresh.apply_gradients({f: activations[f] + offsets[f] for f in FEATURES},
                                      preserved)
            return strategy.run(fn, args=dist)
        fresh_step(distributed(strategy, more, per_replica))
        result["restored_after_more"] = logical_tables(fresh)
    with open(out_path, "w") as f:
        json.dump(result, f)
    print("done", n, opt_name)


if __name__ == "__main__":
    main()
