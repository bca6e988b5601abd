"""Run by tests/tpu/test_runner.py under ``python -m tf_tpu_emb.run
--replicas 3``: what a TPU program meets at a replica count above one.

* Several TPU strategies in one process (a test suite that builds a model
  per test, as Model Garden's train_test.py does), each training a Keras
  model of another size with the gradient summed over the replicas: each
  trains, and its weights equal the same program under MirroredStrategy
  computed in numpy (before the stand-in gave every strategy its own
  collective keys, the second model's all-reduce met the first one's record:
  "Shape mismatch in the collective instance").
* A dataset whose global batch does not divide by the replicas: a ValueError
  naming the batch, the replica count and what to change (a TPU gives every
  replica the same batch; MirroredStrategy would split it unevenly).
Exit code 0 and a last line "OK" = pass."""
import numpy as np
import tensorflow as tf

R = 3
rng = np.random.default_rng(3)


def new_strategy():
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu="")
    tf.tpu.experimental.initialize_tpu_system(resolver)
    strategy = tf.distribute.TPUStrategy(resolver)
    assert strategy.num_replicas_in_sync == R
    return strategy


for width in (5, 9, 5, 17):  # models of different sizes, strategy after strategy
    strategy = new_strategy()
    x = rng.normal(size=(6 * R, 4)).astype(np.float32)
    y = rng.normal(size=(6 * R, width)).astype(np.float32)
    w0 = rng.normal(size=(4, width)).astype(np.float32)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.Input((4,)), tf.keras.layers.Dense(
            width, use_bias=False, kernel_initializer=tf.constant_initializer(w0))])
        model.compile(optimizer=tf.keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y, batch_size=6 * R, epochs=2, verbose=0, shuffle=False)
    w = w0.astype(np.float64)
    for _ in range(2):   # full-batch gradient descent on the mean squared error
        w -= 0.1 * 2.0 * x.T @ (x @ w - y) / y.size
    np.testing.assert_allclose(model.get_weights()[0], w, rtol=1e-5, atol=1e-6)
print("strategies: 4 in one process, each trained exactly")

strategy = new_strategy()
try:
    strategy.experimental_distribute_dataset(
        tf.data.Dataset.range(64).batch(32, drop_remainder=True))
    raise AssertionError("no error for a global batch of 32 over 3 replicas")
except ValueError as e:
    message = str(e)
    assert "global batch of 32" in message and "3 replicas" in message, message
    assert "multiple of 3 (e.g. 30)" in message and "--replicas N" in message, message
print("indivisible batch: %s" % message.split(":")[0])
strategy.experimental_distribute_dataset(tf.data.Dataset.range(60).batch(30, drop_remainder=True))
print("OK")
