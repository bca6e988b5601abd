"""Child of tests/engine/test_waits.py: a Recv that waits, in one of several
ways, for the parent to send SIGINT or for the main thread to end.

usage: waits_script.py MODE
  eager | function | session : the main thread waits in a Recv (eager op,
      tf.function, TF1 Session.run) and prints "waiting" first;
  recover : as eager, but catches the KeyboardInterrupt, then trains a step
      and prints the table (the engine must have lost nothing);
  sleep : the library loaded, no Recv: the main thread sleeps;
  thread : a non-daemon thread waits in a Recv; the main thread returns.
"""
import sys
import threading
import time

import numpy as np
import tensorflow as tf

import engine_util as eu
from tf_tpu_emb import ops

MODE = sys.argv[1]
CONFIG = eu.serialize(eu.table_mode_config(
    [eu.TableSpec("t", 8, 4, "stochastic_gradient_descent", num_features=1)], 2))
TABLE = np.arange(32, dtype=np.float32).reshape(8, 4)


def recv():
    return ops.recv_tpu_embedding_activations(num_outputs=1, config=CONFIG, engine="e")


ops.configure_tpu_embedding(CONFIG, engine="e")
ops.table_ops("stochastic_gradient_descent").load(TABLE, table_name="t", num_shards=1,
                                                  shard_id=0, engine="e")
if MODE == "sleep":
    print("waiting", flush=True)
    time.sleep(300)
elif MODE == "thread":
    threading.Thread(target=recv, name="recv-thread").start()
    time.sleep(1)
    print("main thread done", flush=True)
elif MODE == "session":
    with tf.Graph().as_default():
        op = recv()
        with tf.compat.v1.Session() as session:
            print("waiting", flush=True)
            session.run(op)
elif MODE == "function":
    # Traced first: "waiting" must come just before the wait.  A SIGINT that
    # arrives before the Recv waits (here, during a trace, which takes seconds
    # under ASan on a loaded machine) goes to Python's handler, and the
    # KeyboardInterrupt comes only once the main thread is back from C++:
    # after the step's timeout when the step then waits.
    step = tf.function(recv).get_concrete_function()
    print("waiting", flush=True)
    step()
else:
    print("waiting", flush=True)
    try:
        recv()
    except KeyboardInterrupt:
        if MODE != "recover":
            raise
        print("interrupted", flush=True)
    ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
        [np.array([0, 1, 2], np.int32)], [np.array([3, 5], np.int64)], [np.zeros([0], np.float32)],
        combiners=["sum"], engine="e")
    activations = recv()[0].numpy()
    print("activations", " ".join(map(repr, activations.ravel().tolist())), flush=True)
    table = ops.table_ops("stochastic_gradient_descent").retrieve(
        table_name="t", num_shards=1, shard_id=0, engine="e")
    print("table", " ".join(map(repr, np.asarray(table).ravel().tolist())), flush=True)
