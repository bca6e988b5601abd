"""The trainer process of the fault soak (tests/cluster/test_fault_soak.py).

``python soak_trainer_script.py CLUSTER_JSON LEASE_S STEP_TIMEOUT_S``:
connects to the embedding hosts, builds ``soak_model``'s model (retrying
while a crashed trainer's lease still holds the hosts: the time it waited is
printed as ``BUILT <seconds>``), then obeys one command per stdin line:

  ``steps A B``      training steps A..B-1, two a call (one where one is
                     left), each call under
                     ``hosts.run(step, timeout_s=STEP_TIMEOUT_S)`` (the first
                     one after a connect: 120 s, it traces and instantiates);
                     ``OK``, or ``ERROR <class> <message>`` at the first failure
  ``save PATH``      ``tf.train.Checkpoint(embedding=emb).write(PATH)``; ``OK``
  ``recover PATH``   the documented recovery: ``hosts.reconnect()``, then
                     ``checkpoint.restore(PATH)``; ``OK`` or ``ERROR ...``
  ``restore PATH``   ``checkpoint.restore(PATH)`` only
  ``dump FILE``      every table and slot into FILE (``np.savez``); ``OK``
  ``quit``           ``emb.shutdown()``, ``OK``, exit

Inside a step two hooks (``tf.numpy_function``) print ``POINT <name> <n>``
and wait for a line on stdin before the step goes on: ``enqueue`` (the ids,
before they are routed and enqueued) and ``recv`` (the activations are back
from every host; the gradients, hence every host's Send and update, wait for
it).  The test chooses a fault at a point, delivers it, and answers the hook.
"""
import json
import sys
import time

import numpy as np
import tensorflow as tf

import soak_model as model
from tf_tpu_emb.cluster import EmbeddingHosts


FIRST_STEP_TIMEOUT_S = 120


def say(*words):
    print(*words, flush=True)


ACTIVE = [()]  # the steps of the call the main loop waits for (none after it failed)


def hook(point):
    def wait(x, n):
        if int(n) not in ACTIVE[0]:
            # A step abandoned at its deadline, going on once the hung host
            # was killed: it must not take the test's next line from stdin.
            return x
        say("POINT", point, int(n))
        sys.stdin.readline()
        return x
    return wait


def main():
    spec, lease_s, timeout_s = json.loads(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
    hosts = EmbeddingHosts(spec, lease_s=lease_s)
    hosts.connect()
    emb = model.make(hosts)
    start = time.monotonic()
    while True:  # a crashed trainer's lease holds the hosts until it ends
        try:
            emb.build(model.B)
            break
        except tf.errors.FailedPreconditionError as e:
            if "held by trainer session" not in e.message or \
                    time.monotonic() - start > lease_s + 60:
                raise
            time.sleep(0.1)
    say("BUILT %.2f" % (time.monotonic() - start))
    checkpoint = tf.train.Checkpoint(embedding=emb)
    features = list(model.TABLES)

    def one_step(ids, grads, n):
        first = tf.numpy_function(hook("enqueue"), [ids[features[0]], n], tf.int64,
                                  stateful=True)
        first.set_shape(ids[features[0]].shape)
        emb.enqueue(dict(ids, **{features[0]: first}), training=True)
        acts = emb.dequeue()
        gate = tf.numpy_function(hook("recv"), [acts[features[0]], n], tf.float32,
                                 stateful=True)
        with tf.control_dependencies([gate]):
            grads = {f: tf.identity(g) for f, g in grads.items()}
        emb.apply_gradients(grads)

    step = tf.function(one_step)

    @tf.function
    def two_steps(ids, grads, n, ids_next, grads_next, n_next):
        # A host holds step n+1's batch while step n's update runs and puts
        # its rows first (engine/engine.h first_rows_); with pipelining it
        # looks step n+1 up before step n's gradients come (lookahead_): a
        # fault can find either under way.
        one_step(ids, grads, n)
        one_step(ids_next, grads_next, n_next)

    per_call = 2

    # The first step after a (re)connect traces the function and instantiates
    # it on every host: seconds on two busy cores, so it gets a long deadline
    # (a hang still fails it); later steps get STEP_TIMEOUT_S.
    warm = [False]

    for line in sys.stdin:
        words = line.split()
        if not words:
            continue
        try:
            if words[0] == "steps":
                n, end = int(words[1]), int(words[2])
                while n < end:
                    ACTIVE[0] = (n,)
                    args = [model.ids(n), model.grads(n), tf.constant(n, tf.int64)]
                    fn = step
                    if per_call == 2 and n + 1 < end:
                        fn = two_steps
                        ACTIVE[0] = (n, n + 1)
                        args += [model.ids(n + 1), model.grads(n + 1),
                                 tf.constant(n + 1, tf.int64)]
                    hosts.run(fn, *args,
                              timeout_s=timeout_s if warm[0] else FIRST_STEP_TIMEOUT_S)
                    n += 2 if fn is two_steps else 1
                    warm[0] = True
            elif words[0] == "save":
                checkpoint.write(words[1])
            elif words[0] == "recover":
                warm[0] = False
                hosts.reconnect()
                checkpoint.restore(words[1])
            elif words[0] == "restore":
                checkpoint.restore(words[1])
            elif words[0] == "dump":
                np.savez(words[1], **model.state(emb))
            elif words[0] == "quit":
                emb.shutdown()
                say("OK")
                return
            else:  # a hook's answer that no hook waited for (its step had failed)
                continue
            say("OK")
        except tf.errors.OpError as e:
            ACTIVE[0] = ()
            say("ERROR", type(e).__name__, e.message.replace("\n", " ")[:500])


if __name__ == "__main__":
    main()
