"""A TPU training program run by tests/tpu/test_runner.py under
``python -m tf_tpu_emb.run --replicas 2``: written as for a TPU (resolver,
initialize_tpu_system, TPUStrategy, tf.tpu.experimental.embedding) and checked,
step by step, against the numpy reference of TPU Adagrad
(tests/common/optimizer_reference.py): eager and tf.function steps, inputs
from a distributed dataset and through ``enqueue(device="/TPU:k")``.
Exit code 0 and a last line "OK" = pass."""
import numpy as np
import tensorflow as tf

import optimizer_reference as ref

E = tf.tpu.experimental.embedding
resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
tf.config.experimental_connect_to_cluster(resolver)
tf.tpu.experimental.initialize_tpu_system(resolver)
strategy = tf.distribute.TPUStrategy(resolver)
R = strategy.num_replicas_in_sync
assert R == 2, R
PER_REPLICA, VOCAB, DIM, STEPS, LR = 3, 11, 4, 4, 0.2
rng = np.random.default_rng(7)
TABLE0 = rng.normal(size=(VOCAB, DIM)).astype(np.float32)
C = rng.normal(size=(DIM,)).astype(np.float32)  # loss = sum(act . C) / global batch

with strategy.scope():
    table = E.TableConfig(VOCAB, DIM, name="t", combiner="mean",
                          initializer=tf.constant_initializer(TABLE0))
    embedding = E.TPUEmbedding({"f": E.FeatureConfig(table)}, E.Adagrad(LR),
                               pipeline_execution_with_tensor_core=False)
assert type(embedding).__module__ == "tf_tpu_emb.mid_level", type(embedding)

BAGS = [[list(rng.integers(0, VOCAB, rng.integers(1, 4))) for _ in range(PER_REPLICA * R)]
        for _ in range(2 * STEPS)]


def sparse(bags):
    idx = [(i, j) for i, bag in enumerate(bags) for j in range(len(bag))]
    return tf.SparseTensor(np.array(idx, np.int64), np.array(sum(bags, []), np.int64),
                           [len(bags), 3])


dataset = tf.data.Dataset.from_tensor_slices({"f": sparse(sum(BAGS, []))}).batch(
    PER_REPLICA * R, drop_remainder=True)
iterator = iter(strategy.experimental_distribute_dataset(
    dataset, options=tf.distribute.InputOptions(experimental_fetch_to_device=False)))


def replica_step():
    with tf.GradientTape() as tape:
        act = embedding.dequeue()
        tape.watch(act)
        loss = tf.reduce_sum(act["f"] * C) / (PER_REPLICA * R)
    embedding.apply_gradients(tape.gradient(loss, act))
    return loss


def eager_step(features):
    embedding.enqueue(features, training=True)
    return strategy.run(replica_step)


@tf.function
def function_step(features):
    embedding.enqueue(features, training=True)
    return strategy.run(replica_step)


def device_step(bags):
    """Each replica's slice enqueued by naming its TPU core, as TPU code does."""
    for k in range(R):
        embedding.enqueue({"f": sparse(bags[k * PER_REPLICA:(k + 1) * PER_REPLICA])},
                          training=True, device="/TPU:%d" % k)
    return strategy.run(replica_step)


state = [TABLE0.astype(np.float64), np.full((VOCAB, DIM), 0.1)]
params = ref.TableParams("adagrad", lr=LR)
worst = 0.0
for step in range(2 * STEPS):
    bags = BAGS[step]
    if step % 4 == 3:
        next(iterator)  # the dataset's copy of these bags goes unused
        device_step(bags)
    else:
        (eager_step if step % 2 == 0 else function_step)(next(iterator))
    grads = np.tile(C / (PER_REPLICA * R), (len(bags), 1))
    ref.step(params, state, ref.contributions([([[(i, 1.0) for i in b] for b in bags],
                                                "mean", grads)]))
    got = embedding.embedding_tables[table].numpy()
    worst = max(worst, float(np.max(np.abs(got - state[0]))))
    np.testing.assert_allclose(got, state[0], rtol=1e-5, atol=1e-6, err_msg="step %d" % step)
print("steps %d, replicas %d, max |engine - numpy| %.3g" % (2 * STEPS, R, worst))
print("OK")
