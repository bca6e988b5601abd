"""The engine behind a :class:`tf_tpu_emb.TPUEmbedding`: one interface, two kinds.

``TPUEmbedding.build`` gets its backend once from
:func:`tf_tpu_emb.backend_factory.create` and then only calls these methods
(``TPUEmbedding`` never asks which kind it has):

* :class:`LocalEngine`: an engine of this process, under an engine name of
  the owning object's own (README "Several engines per process");
* :class:`tf_tpu_emb.cluster.sharded.ShardedEngine` (``cluster=``): the
  engines of the embedding hosts, one shard of every table on each.

=====================  ======================================================
method                 what it does
=====================  ======================================================
``configure()``        creates the engine(s) for ``config`` (eager)
``attach()``           uses engines another worker configured (workers > 0)
``shutdown()``         releases what ``configure`` created (tables are lost)
``load(h, t, v)``      a whole table's state tensors -> the engine(s)
``retrieve(h, t)``     the whole table's state tensors from the engine(s)
``enqueue(...)``       one replica's ArbitraryTensorBatch inputs
``recv(n, replica)``   that replica's activations (``n`` outputs)
``send(...)``          that replica's activation gradients (one Send per step)
``step_count()``       steps applied (seeds bfloat16 rounding), whether any bf16
``load_step_count(n)`` a checkpoint's step count -> the engine(s)
``replica(local)``     the engine replica of this worker's replica ``local``
``abandon()``          the owner was collected (no op may run): release later
``stale()``            must ``reconfigure()`` before a restore loads the tables
``errors()``           context raising eager errors that name their host
=====================  ======================================================

``h`` is an ``ops.table_ops(...)`` handle set, ``t`` the table's name, ``v``
its state tensors in ``h.tensors`` order, each ``[vocabulary_size, dim]``.
Every method builds its ops in the caller's context (eager: runs them), so
one ``tf.function`` step holds every engine op of the step.
"""
import abc
import contextlib
import weakref

import tensorflow as tf

from tf_tpu_emb import engine_registry
from tf_tpu_emb import ops
from tf_tpu_emb import send as send_lib

__all__ = ["Backend", "LocalEngine"]


class Backend(abc.ABC):
    """The interface (see the module doc).  ``engine``: the engine name the
    step's ops carry (``Layout.engine``); ``configured``: this backend created
    engines that it has not released."""

    engine = ""
    configured = False

    @abc.abstractmethod
    def configure(self, takeover=False):
        """Creates the engine(s) for the config (eagerly); ``takeover``: take
        hosts another trainer's lease holds (``cluster=`` only)."""

    @abc.abstractmethod
    def attach(self):
        """Uses engines that another worker's backend configured."""

    @abc.abstractmethod
    def shutdown(self):
        """Releases the engine(s) ``configure`` created; no-op otherwise."""

    @abc.abstractmethod
    def load(self, handles, table_name, values):
        """A whole table's state tensors -> the engine(s)."""

    @abc.abstractmethod
    def retrieve(self, handles, table_name):
        """The whole table's state tensors (a list, ``handles.tensors`` order)."""

    @abc.abstractmethod
    def enqueue(self, indices, values, weights, mode, replica, name=None):
        """Enqueues one replica's ArbitraryTensorBatch inputs (per feature:
        COO indices, row splits or empty; ids; weights or empty)."""

    @abc.abstractmethod
    def recv(self, num_outputs, replica, name=None):
        """The replica's activations, one tensor per feature descriptor."""

    @abc.abstractmethod
    def send(self, layout, gradients, learning_rates, replica, control_inputs=None,
             name=None):
        """Sends the replica's activation gradients (``layout.features``
        order) with the dynamic learning rates; returns the op (None eagerly)."""

    @abc.abstractmethod
    def step_count(self):
        """``(steps applied, whether a table stores bfloat16)``: the count
        that seeds stochastic rounding, as tensors (eager)."""

    @abc.abstractmethod
    def load_step_count(self, count):
        """Sets the step count (a checkpoint's) on the engine(s)."""

    def replica(self, local_replica):
        """The engine replica of this worker's replica ``local_replica`` (an
        int, or an int32 tensor inside ``strategy.run``)."""
        return local_replica

    # Lifecycle hooks with defaults for an engine of this process.

    def abandon(self):
        """The owner was collected without ``shutdown`` (called by its
        finalizer: any thread, maybe inside a trace, so no op)."""

    def stale(self):
        """Whether the engines must be configured again before a restore
        loads them (a reconnect after a host restart)."""
        return False

    def reconfigure(self):
        """Configures the engines afresh (same names); the caller loads the tables."""
        raise NotImplementedError("a %s is never stale" % type(self).__name__)

    def errors(self):
        """A context in which eager errors of this backend's ops get raised
        (remote errors naming their host)."""
        return contextlib.nullcontext()


# The graphs (tf.function traces, TF1 graphs) holding an enqueue, per engine:
# a Recv built in one of them, or in a graph nested in one, follows its step's
# enqueue; any other first asserts that a batch is there.
_ENQUEUED_IN = weakref.WeakKeyDictionary()  # graph -> {engine name}


def _note_enqueue(engine):
    if not tf.executing_eagerly():
        _ENQUEUED_IN.setdefault(tf.compat.v1.get_default_graph(), set()).add(engine)


def _enqueued_in_this_step(engine):
    graph = None if tf.executing_eagerly() else tf.compat.v1.get_default_graph()
    while graph is not None:
        if engine in _ENQUEUED_IN.get(graph, ()):
            return True
        graph = getattr(graph, "outer_graph", None)
    return False


class LocalEngine(Backend):
    """An engine of this process under the pooled name ``engine_registry``
    gives ``owner`` (the :class:`tf_tpu_emb.TPUEmbedding`), which the
    registry records as its owner: the engine lives until ``shutdown`` or
    until the owner is collected (the registry's finalizer releases it, so
    ``abandon`` has nothing left to do).  Every method that builds ops in a
    graph pins the name to that graph (``engine_registry.pin``)."""

    def __init__(self, config, combiners, owner, name=None):
        self.config = config
        self.combiners = list(combiners)
        self._owner = weakref.ref(owner)  # the owner's life ends the engine's
        # A name given (the stand-in TPU system's one engine) is not pooled.
        self._lease = engine_registry.lease_for(owner) if name is None else None
        self.engine = self._lease.name if name is None else name
        if name is not None:
            engine_registry.release_when_collected(owner, name)

    def _pin(self):
        if self._lease is not None:
            engine_registry.pin(self._lease)

    def configure(self, takeover=False):
        del takeover  # no lease on an engine of this process
        ops.configure_tpu_embedding(self.config, engine=self.engine)
        engine_registry.claim(self._owner(), self.engine)
        self.configured = True

    def attach(self):
        raise ValueError("a local engine has one worker: it configures, it never attaches")

    def shutdown(self):
        if self.configured:
            self.configured = False
            owner = self._owner()
            if owner is not None:  # else its finalizer released the engine
                engine_registry.release(owner)

    def load(self, handles, table_name, values):
        self._pin()
        return handles.load(*values, num_shards=1, shard_id=0, table_name=table_name,
                            engine=self.engine)

    def retrieve(self, handles, table_name):
        self._pin()
        values = handles.retrieve(num_shards=1, shard_id=0, table_name=table_name,
                                  engine=self.engine)
        return [values] if isinstance(values, tf.Tensor) else list(values)

    def step_count(self):
        return ops.retrieve_tpu_embedding_step_count(engine=self.engine)

    def load_step_count(self, count):
        ops.load_tpu_embedding_step_count(count, engine=self.engine)

    def enqueue(self, indices, values, weights, mode, replica, name=None):
        self._pin()
        _note_enqueue(self.engine)
        if isinstance(replica, int):
            op = ops.enqueue_tpu_embedding_arbitrary_tensor_batch(
                indices, values, weights, device_ordinal=replica, combiners=self.combiners,
                mode_override=mode, engine=self.engine, name=name)
        else:  # an int32 tensor: the replica of strategy.run's replica context
            op = ops.dynamic_enqueue_tpu_embedding_arbitrary_tensor_batch(
                indices, values, weights, replica, combiners=self.combiners,
                mode_override=mode, engine=self.engine, name=name)
        return None if tf.executing_eagerly() else op

    def recv(self, num_outputs, replica, name=None):
        # The Recv's device picks the replica (the caller's device scope).
        del replica
        self._pin()
        # A Recv that no enqueue of its step precedes first checks that its
        # replica has a batch: the mistake fails at once (README "Waits").
        checks = [] if _enqueued_in_this_step(self.engine) else [
            ops.assert_tpu_embedding_enqueued("TPUEmbedding.dequeue()", engine=self.engine)]
        with tf.control_dependencies(checks):
            return ops.recv_tpu_embedding_activations(
                num_outputs=num_outputs, config=self.config, engine=self.engine, name=name)

    def send(self, layout, gradients, learning_rates, replica, control_inputs=None,
             name=None):
        # On the device of the Recv outputs it follows, when given (that
        # device picks the replica), else in the caller's device scope.
        del replica
        self._pin()
        device = send_lib.device_of(control_inputs[0]) if control_inputs else None
        return send_lib.build_send(layout, gradients, learning_rates, config=self.config,
                                   control_inputs=control_inputs, device=device or None,
                                   name=name)

