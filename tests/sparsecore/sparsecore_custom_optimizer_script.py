"""XlaSparseDenseMatmulGradWithCsrInput (the optimizer as the user's
function) on the stand-in SparseCore TPU of R chips (child script of
test_sparsecore_custom_optimizer.py; ``python -m tf_tpu_emb.run --embedding
v2 --replicas R sparsecore_custom_optimizer_script.py OUT.json``).

Each replica preprocesses its own samples with TF's own host code
(``TPUEmbeddingV2._preprocess_features``, num_replicas_in_sync = R), and in
one ``strategy.run`` every replica runs the op on its chip's shard of the
table and of two slots (TF's documented Adagrad example as the function, plus
a [rows] count slot).  Writes the logical table and slots before and after,
and each replica's ids and activation gradients, for the test's numpy model
of one global-batch step (docs/sparsecore_semantics.md §10)."""
import json
import sys
import types

import numpy as np
import tensorflow as tf
from tensorflow.python.tpu import tpu_embedding_v3 as v3
from tensorflow.python.tpu.ops import gen_xla_ops

VOCAB, WIDTH, PER_REPLICA, LR = 64, 4, 8, 0.1
E = tf.tpu.experimental.embedding


def preprocess(replicas, rng):
    """Per replica: (its samples' ids, TF's CSR buffers of them)."""
    table = E.TableConfig(vocabulary_size=VOCAB, dim=WIDTH, combiner="sum", name="t")
    feature = E.FeatureConfig(table=table, output_shape=[PER_REPLICA], name="f")
    emb = v3.TPUEmbeddingV2.__new__(v3.TPUEmbeddingV2)  # only what the host code reads
    emb._table_to_max_ids_per_sparse_core = {"t": 1024}
    emb._table_to_max_unique_ids_per_sparse_core = {"t": 1024}
    emb._sparse_core_embedding_config = types.SimpleNamespace(allow_id_dropping=False)
    out = []
    for _ in range(replicas):
        lengths = rng.integers(0, 4, PER_REPLICA)
        ids = rng.integers(0, VOCAB, int(lengths.sum()))
        ids[: len(ids) // 3] %= 5  # rows touched by several replicas
        ragged = tf.RaggedTensor.from_row_lengths(ids.astype(np.int64), lengths)
        csr = emb._preprocess_features(
            num_replicas_in_sync=replicas, max_ids_per_chip_per_sample=16,
            max_minibatches_per_sc=1, num_sc_per_chip=4, num_sc_shards=4 * replicas,
            stacked_table_to_tables={"t": [table]},
            table_to_stacked_table_offset={"t": ("t", 0, 0)},
            table_to_sample_count={"t": PER_REPLICA}, feature_to_sample_offset={"f": 0},
            flat_features=[("f", feature)], flat_inputs=[ragged], flat_weights=[None])["t"][0]
        samples = [ids[a:b].tolist() for a, b in
                   zip(np.concatenate([[0], np.cumsum(lengths)[:-1]]), np.cumsum(lengths))]
        out.append((samples, {k: getattr(csr, k).numpy() for k in (
            "row_pointers", "sorted_sample_ids", "sorted_token_ids", "sorted_gains",
            "num_minibatches_per_physical_sparse_core")}))
    return out


def to_chips(logical, replicas):
    """The logical [VOCAB, ...] array in TF's layout, one local shard per
    chip: id i on global shard i % P, row i // P; chip c holds shards
    [4c, 4c + 4) (semantics §10)."""
    p = 4 * replicas
    shards = [logical[s::p] for s in range(p)]
    return [np.concatenate(shards[4 * c:4 * c + 4]) for c in range(replicas)]


def from_chips(chips, replicas):
    p = 4 * replicas
    shards = [s for chip in chips for s in np.split(chip, 4)]
    out = np.empty((VOCAB,) + chips[0].shape[1:], chips[0].dtype)
    for s in range(p):
        out[s::p] = shards[s]
    return out


def main():
    out_path = sys.argv[1]
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
    r = strategy.num_replicas_in_sync
    rng = np.random.default_rng(3)
    inputs = preprocess(r, rng)
    table = rng.normal(size=(VOCAB, WIDTH)).astype(np.float32)
    acc = rng.uniform(0.1, 1.0, (VOCAB, WIDTH)).astype(np.float32)
    count = np.zeros(VOCAB, np.float32)
    grads = [rng.normal(size=(PER_REPLICA, WIDTH)).astype(np.float32) for _ in range(r)]
    chips = [to_chips(x, r) for x in (table, acc, count)]

    @tf.function(autograph=False)
    def adagrad(grad, w, a, n, lr, bonus):
        new_a = a + grad * grad
        return w - lr * grad / tf.sqrt(new_a), new_a, n + bonus[:, 0]

    spec = tf.TensorSpec([1, WIDTH], tf.float32)
    fn = adagrad.get_concrete_function(spec, spec, spec, tf.TensorSpec([1], tf.float32), spec,
                                       spec)

    def values(ctx):
        k = ctx.replica_id_in_sync_group
        csr = inputs[k][1]
        return ({name: tf.constant(v) for name, v in csr.items()}, tf.constant(grads[k]),
                [tf.constant(chips[j][k]) for j in range(3)])

    dist = strategy.experimental_distribute_values_from_function(values)

    @tf.function
    def step(dist):
        def fn_replica(csr, act_grads, tables):
            return gen_xla_ops.xla_sparse_dense_matmul_grad_with_csr_input(
                row_pointers=csr["row_pointers"], sorted_sample_ids=csr["sorted_sample_ids"],
                sorted_token_ids=csr["sorted_token_ids"], sorted_gains=csr["sorted_gains"],
                activation_gradients=act_grads, tables=tables,
                hyperparameters=[tf.constant(LR), tf.constant(1.0)],
                num_minibatches_per_physical_sparse_core=csr[
                    "num_minibatches_per_physical_sparse_core"],
                custom_computation=fn, table_name="t")
        return strategy.run(fn_replica, args=dist)

    updated = step(dist)
    after = [from_chips([t.numpy() for t in strategy.experimental_local_results(updated[j])], r)
             for j in range(3)]
    result = {"replicas": r, "before": [table.tolist(), acc.tolist(), count.tolist()],
              "after": [a.tolist() for a in after],
              "samples": [s for s, _ in inputs], "grads": [g.tolist() for g in grads]}
    with open(out_path, "w") as f:
        json.dump(result, f)


if __name__ == "__main__":
    main()
