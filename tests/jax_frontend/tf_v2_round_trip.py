"""The TensorFlow half of test_table_round_trip.py (run by the TensorFlow
venv's Python under the stand-in: ``python -m tf_tpu_emb.run --embedding v2
--replicas N tf_v2_round_trip.py IN.npz STEP.json OUT_DIR``).

An ordinary TPU program with TF's ``TPUEmbeddingV2``: it builds the table
the JAX program trained (same name, shape, optimizer), loads the JAX
program's tables (IN.npz, tf_tpu_emb.table_exchange's per-table form) with
``tf_tpu_emb.sparsecore_checkpoint.load_into``, and writes:
  OUT_DIR/loaded.npz   the tables read back out of the V2 variables
                       (``tables_of``) right after loading;
  OUT_DIR/trained.npz  the same after one training step on STEP.json's batch
                       (ragged ids and weights, the activation gradients);
  OUT_DIR/step.json    that step's activations (global batch order).
"""
import json
import os
import sys

import numpy as np
import tensorflow as tf

from tf_tpu_emb import sparsecore_checkpoint, table_exchange

E = tf.tpu.experimental.embedding


def main():
    in_path, step_path, out_dir = sys.argv[1:4]
    with open(step_path) as f:
        step = json.load(f)
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
    n = strategy.num_replicas_in_sync
    batch = len(step["lengths"])
    per_replica = batch // n
    table = E.TableConfig(vocabulary_size=step["vocab"], dim=step["dim"], combiner="sum",
                          name=step["table"],
                          optimizer=E.Adagrad(learning_rate=step["learning_rate"],
                                              initial_accumulator_value=step["initial"]))
    features = {"f0": E.FeatureConfig(table, name="f0", output_shape=[per_replica])}
    with strategy.scope():
        embedding = E.TPUEmbeddingV2(
            features, sparse_core_embedding_config=E.SparseCoreEmbeddingConfig(
                max_ids_per_chip_per_sample=64))
        embedding.build()
    sparsecore_checkpoint.load_into(embedding, table_exchange.load(in_path))
    table_exchange.save(os.path.join(out_dir, "loaded.npz"),
                        sparsecore_checkpoint.tables_of(embedding))

    lengths = np.array(step["lengths"])
    starts = np.concatenate([[0], np.cumsum(lengths)])
    ids = np.array(step["ids"], np.int32)
    weights = np.array(step["weights"], np.float32)
    grads = np.array(step["grads"], np.float32)

    def replica_values(ctx):
        k = ctx.replica_id_in_sync_group
        lo, hi = k * per_replica, (k + 1) * per_replica
        rows = lengths[lo:hi]
        return ({"f0": tf.RaggedTensor.from_row_lengths(ids[starts[lo]:starts[hi]], rows)},
                {"f0": tf.RaggedTensor.from_row_lengths(weights[starts[lo]:starts[hi]], rows)},
                {"f0": tf.constant(grads[lo:hi])})

    @tf.function
    def train_step(dist):
        def fn(features, weights, gradients):
            activations, preserved = embedding(features, weights)
            embedding.apply_gradients(gradients, preserved)
            return activations["f0"]
        return strategy.run(fn, args=dist)

    acts = train_step(strategy.experimental_distribute_values_from_function(replica_values))
    table_exchange.save(os.path.join(out_dir, "trained.npz"),
                        sparsecore_checkpoint.tables_of(embedding))
    with open(os.path.join(out_dir, "step.json"), "w") as f:
        json.dump({"activations": np.concatenate(
            [a.numpy() for a in strategy.experimental_local_results(acts)]).tolist()}, f)


if __name__ == "__main__":
    main()
