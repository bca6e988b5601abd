"""The worker's side of the sharded data path: one model's router.

With ``num_hosts`` = S, host k's engine (``ConfigureTPUEmbeddingHostShard``)
holds shard k of every table (``core/sharding.h``; the same layout as
:mod:`tf_tpu_emb.sharding`).  A :class:`Router` names the model's
router in this process (``engine/routing.h``) and builds its three worker
ops, which run in the caller's step (one per replica and phase):

* :meth:`Router.route` -- one replica's ArbitraryTensorBatch inputs (the
  mid-level API's form) checked as one engine checks them (ids inside the
  vocabulary, finite weights, shapes; an ``InvalidArgument`` naming the
  feature, before any host sees anything) and split per host: one packed
  tensor per host holding only what its rows need;
* :meth:`Router.combine` -- the replica's activations from the hosts'
  routed Recv outputs;
* :meth:`Router.split` -- the replica's activation gradients (and dynamic
  learning rates) as one tensor per host.

Every packet carries the model's session id (the hosts' configure got the
same one), its sequence number and a checksum: a host refuses a truncated or
corrupt packet (``DataLoss``), one of another session or a replayed one
(``FailedPrecondition``) and changes nothing (``engine/routing.h``, "Packet
integrity").

Per output and step the C++ side picks the smaller of two forms (the bags a
host holds ids of with their partial sums, or the distinct rows it holds
with the combiner applied on the worker); ``engine/routing.h`` says how each
stays exact.
"""
import itertools
import os
import weakref

import numpy as np
import tensorflow as tf

from tf_tpu_emb import ops

COMBINERS = ("sum", "mean", "sqrtn")
_NAMES = itertools.count()


def _shutdown(name):
    try:
        with tf.init_scope():  # eagerly, even when collected while a function is traced
            ops.shutdown_tpu_embedding_router(name)
    except Exception:  # pylint: disable=broad-except  (interpreter shutdown)
        pass


class Router:
    """The router of one sharded model in this (worker) process.

    ``config``: the serialized ``TPUEmbeddingConfiguration`` (its
    ``num_hosts`` = S); ``features``: one :class:`tf_tpu_emb.features.Feature`
    per feature descriptor (their combiners, each one of :data:`COMBINERS`);
    ``name``: the router's name in this process
    (its ops' attr); ``form``: "auto" (the library's), or for
    tests and benchmarks "bags", "rows" or "host_filter" (every host gets the
    whole batch and keeps its own ids: the alternative design
    ``benchmarks/cluster_breakdown.py`` measures); ``session``: the hosts'
    session id (:func:`new_session`; their
    ``ConfigureTPUEmbeddingHostShard``'s), stamped on every packet.
    """

    FORMS = ("auto", "bags", "rows", "host_filter")

    def __init__(self, config, features, num_hosts, form="auto", name=None, session=0):
        if form not in self.FORMS:
            raise ValueError("form must be one of %s, got %r" % (self.FORMS, form))
        self.features = list(features)
        for f in self.features:
            if f.combiner not in COMBINERS:
                raise ValueError("feature {}: combiner {!r} is not one of {}"
                                 .format(f.path, f.combiner, COMBINERS))
        self.config = config
        self.num_hosts = int(num_hosts)
        self.form = form
        self.session = int(session)
        # The router's name is an attr of its ops: ShardedEngine names it after
        # its (pooled) engine name, so model churn does not grow TF's kernel
        # cache; without one, a fresh name.
        self.name = name or "tf_tpu_emb_router_%d_%d" % (os.getpid(), next(_NAMES))
        self._finalizer = weakref.finalize(self, _shutdown, self.name)
        self._finalizer.atexit = False

    @property
    def combiners(self):
        return [f.combiner for f in self.features]

    def route(self, indices, values, weights, mode, replica, name=None):
        """``(host_batches, host_floats, sequence)``: per host its packed
        batch, the floats each host's Recv returns (an int64 vector, before
        the sequence's two), and the batch's sequence number."""
        if not len(indices) == len(values) == len(weights) == len(self.features):
            raise ValueError("route: {} features are configured, got {} / {} / {} inputs"
                             .format(len(self.features), len(indices), len(values),
                                     len(weights)))
        return ops.route_tpu_embedding_arbitrary_tensor_batch(
            indices, values, weights, mode, num_hosts=self.num_hosts, device_ordinal=replica,
            config=self.config, router=self.name, combiners=self.combiners,
            form=self.form, session=self.session, name=name)

    def combine(self, host_activations, replica, name=None):
        """The replica's activations (Recv's outputs) from the hosts' parts."""
        return ops.combine_tpu_embedding_routed_activations(
            host_activations, num_outputs=len(self.features), device_ordinal=replica,
            config=self.config, router=self.name, name=name)

    def split(self, gradients, learning_rates, replica, name=None):
        """One gradient vector per host from the replica's activation gradients."""
        return ops.split_tpu_embedding_routed_gradients(
            gradients, learning_rates, num_hosts=self.num_hosts, device_ordinal=replica,
            config=self.config, router=self.name, name=name)

    def shutdown(self):
        """Forgets this router's queued batches (eagerly)."""
        self._finalizer()

    def __repr__(self):
        return "Router(%r, %d hosts)" % (self.name, self.num_hosts)


def new_session():
    """A random session id for a sharded model's hosts (a nonzero signed
    64-bit int; os.urandom: a user's seeded random stream must not move)."""
    while True:
        session = int.from_bytes(os.urandom(8), "little", signed=True)
        if session:
            return session


def bytes_per_host(host_batches, host_floats, training=True, learning_rates=0):
    """Per host ``(to_host, from_host)`` bytes of one step with these routed
    batches (``host_floats``: what :meth:`Router.route` returned with them):
    the packed batch (+ for training its gradient vector: the gradient
    floats, the learning rates, the sequence) and its Recv output (the
    activation floats and the sequence)."""
    out = []
    for batch, floats in zip(host_batches, np.asarray(host_floats).tolist()):
        recv = (floats + 2) * 4
        sent = int(np.size(batch)) + ((floats + learning_rates + 2) * 4 if training else 0)
        out.append((sent, recv))
    return out
