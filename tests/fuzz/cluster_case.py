"""The fuzz family ``cluster`` (worker side): a random model trained on S
real embedding hosts (``python -m tf_tpu_emb.server`` on free 127.0.0.1 ports,
``tf_tpu_emb.cluster.local.LocalHosts``: bounded lifetime, they exit with the
worker) against the same model on one in-process engine.

A case (``families.gen_cluster``) draws S in 1..3, 1-3 tables (vocabularies
from 1 row, fewer rows than hosts included, to 64; dims 1-8; combiner sum,
mean or sqrtn), 1-4 features over them, the optimizer (SGD, Adagrad, Adam,
FTRL), the sharding (DIV_DEFAULT or MOD), the batch (1-8), 1-3 training steps
of ragged bags (empty bags included, ids anywhere in the vocabulary) and their
activation gradients.  Half of the cases run every step in one
``tf.function`` call (the hosts then hold the next batch when an update
starts, and put its rows first), and 30% pipeline both sides
(``pipeline_execution_with_tensor_core``; in one call a host then looks a
batch up ahead of the previous step's gradients).  Every step's activations
and, at the end, every table and slot must equal the single engine's (rtol
1e-5: a bag split over hosts is summed in another order), else a
``corruption`` finding; a TF error on valid input is a ``wrong_error`` (the
executor's usual classification).
The worker starts afresh after each cluster case: leaving the cluster resets
TensorFlow's eager context, and the other families need the worker's
two-CPU one.
"""
import numpy as np
import tensorflow as tf

import tf_tpu_emb
from tf_tpu_emb.cluster import local as local_hosts

TE = tf.tpu.experimental.embedding
RTOL, ATOL = 1e-5, 1e-6


def _optimizer(name, lr):
    return {"sgd": lambda: TE.SGD(lr), "adagrad": lambda: TE.Adagrad(lr),
            "adam": lambda: TE.Adam(lr), "ftrl": lambda: TE.FTRL(lr)}[name]()


def _model(spec, hosts=None):
    tables = [TE.TableConfig(t["vocab"], t["dim"], name="t%d" % i, combiner=t["combiner"],
                             initializer=tf.constant_initializer(t["init"]))
              for i, t in enumerate(spec["tables"])]
    config = {"f%d" % i: TE.FeatureConfig(tables[t], name="f%d" % i)
              for i, t in enumerate(spec["features"])}
    kwargs = {} if hosts is None else {"cluster": hosts, "sharding_strategy": spec["sharding"]}
    emb = tf_tpu_emb.TPUEmbedding(config, _optimizer(spec["optimizer"], spec["lr"]),
                                  pipeline_execution_with_tensor_core=spec.get("pipeline", False),
                                  **kwargs)
    emb.build(per_replica_batch_size=spec["batch"])
    return emb


def _inputs(step):
    features = {name: tf.RaggedTensor.from_row_splits(
        tf.constant(ids, tf.int64), tf.constant(splits, tf.int64))
        for name, (splits, ids) in step["features"].items()}
    return features, {k: tf.constant(g) for k, g in step["grads"].items()}


def _train(emb, features, grads):
    emb.enqueue(features, training=True)
    acts = emb.dequeue()
    emb.apply_gradients(grads)
    return acts


def _steps(emb, steps, one_call):
    """Every step's activations: eagerly one by one, or (one_call) every
    step in one tf.function call."""
    if not one_call:
        return [{k: v.numpy() for k, v in _train(emb, *_inputs(s)).items()} for s in steps]
    call = tf.function(lambda batch: [_train(emb, f, g) for f, g in batch])
    return [{k: v.numpy() for k, v in acts.items()}
            for acts in call([_inputs(s) for s in steps])]


def _state(emb):
    return {"%s/%d" % (t.name, i): np.asarray(v)
            for t in emb.tables for i, v in enumerate(emb.retrieve_table(t))}


def run(spec, finding):
    """Runs one case; raises `finding(outcome, detail)` on a difference."""
    with local_hosts.LocalHosts(spec["hosts"], lifetime_s=900) as cluster:
        cluster.hosts.connect()
        local = _model(spec)
        remote = _model(spec, cluster.hosts)
        try:
            one_call = spec.get("one_call", False)
            wants = _steps(local, spec["steps"], one_call)
            gots = _steps(remote, spec["steps"], one_call)
            for n, (want, got) in enumerate(zip(wants, gots)):
                for name in want:
                    if not np.allclose(got[name], want[name], rtol=RTOL, atol=ATOL):
                        raise finding("corruption", "step %d, feature %s: activations on %d "
                                      "hosts differ from one engine's (max |diff| %g)" % (
                                          n, name, spec["hosts"],
                                          float(np.max(np.abs(got[name] - want[name])))))
            want, got = _state(local), _state(remote)
            for name in want:
                if got[name].shape != want[name].shape or not np.allclose(
                        got[name], want[name], rtol=RTOL, atol=ATOL):
                    raise finding("corruption", "%s after %d steps on %d hosts differs from "
                                  "one engine's" % (name, len(spec["steps"]), spec["hosts"]))
        finally:
            remote.shutdown()
            local.shutdown()
