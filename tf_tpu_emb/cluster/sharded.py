"""The cross-host data path of one model whose tables are sharded over hosts.

:class:`ShardedEngine` drives the S host engines of an
:class:`~tf_tpu_emb.cluster.hosts.EmbeddingHosts` cluster (host k = task k of
its job, engine replica r = the task's CPU device r) the way
``tf_tpu_emb.TPUEmbedding`` drives one local engine:

* ``configure``: ``ConfigureTPUEmbeddingHostShard(config, host_id=k)`` on every host
  (the config's ``num_hosts`` = S): host k allocates only shard k of every
  table and slot (empty for a table of fewer than S rows, TF's layout), under
  the model's random session id, which the worker's router stamps on every
  packet (a host refuses a packet of another session, a replayed, truncated
  or corrupt one: ``engine/routing.h``, "Packet integrity");
* ``load`` / ``retrieve``: a whole table (TF's TPU-embedding layout, the same
  whatever S) cut into the S shards of the config's sharding strategy and
  loaded with ``num_shards=S, shard_id=k``, and reassembled after retrieval
  (``tf_tpu_emb.sharding``);
* ``enqueue``: the worker's router (:mod:`tf_tpu_emb.cluster.routing`)
  checks the replica's batch and packs, per host, only what its rows need;
  each host enqueues its packed part (``EnqueueTPUEmbeddingRoutedBatch``);
* ``recv``: each host returns only its part (the bags it holds ids of, or
  its distinct rows) in one tensor; the worker combines them into the
  replica's activations;
* ``send``: the worker splits the activation gradients into one tensor per
  host (the rows of its bags, or each of its rows' summed gradient) and each
  host applies the update of its rows once every replica of every worker has
  sent (the engine's step protocol): one synchronous global update.  A batch
  any host would refuse is refused by the worker's route, before any host
  sees it.

So one replica's step moves one tensor per host and phase (batch, partial
activations, gradients).  Enqueue, Recv and Send of all hosts are built in
the caller's function, so one ``tf.function`` step carries every host's
part, and every host op is marked :func:`~tf_tpu_emb.cluster.ordering.per_host`
(the worker's router ops as one more "host"): TF keeps program order among
one host's ops and runs the hosts' parts in parallel.  Enqueues (and the
worker's routes) are ordered only among themselves and before the Recvs
after them: step k+1's batch reaches its host while step k's gradients are
on their way (ordering.py).

With ``pipeline_execution_with_tensor_core`` each host's engine defers a
step's update until the next lookup has read its tables (engine/engine.h,
``deferred_``): the update of step k runs on the host while step k+1's
activations travel to the worker and its gradients come back, and the
result equals one in-process engine with the same flag
(tests/cluster/test_pipelined.py).
"""
import tensorflow as tf

from tf_tpu_emb import backend
from tf_tpu_emb import engine_registry
from tf_tpu_emb import layout as layout_lib
from tf_tpu_emb import ops
from tf_tpu_emb import send as send_lib
from tf_tpu_emb import sharding
from tf_tpu_emb.cluster import lease
from tf_tpu_emb.cluster import ordering
from tf_tpu_emb.cluster import routing

WORKER = "worker"  # the ordering key of the worker's router ops
# The worker's routes have a key of their own: the router queues routed
# batches (engine/routing.h) and Combine takes the one its hosts answer, so
# step k+1's batch is routed (and pulled by the hosts) before step k's
# activations come back (tf_tpu_emb/cluster/ordering.py).
ROUTES = "worker_routes"


class ShardedEngine(backend.Backend):
    """The engines of ``hosts`` holding one model's tables, sharded: the
    :class:`tf_tpu_emb.backend.Backend` of ``TPUEmbedding(cluster=...)``.

    ``config``: the serialized ``TPUEmbeddingConfiguration`` (its
    ``num_hosts`` = ``hosts.num_hosts``); ``features``: one
    :class:`~tf_tpu_emb.features.Feature` per feature descriptor;
    ``replica_offset``: the engine replica of this worker's replica 0
    (``worker index * replicas per worker``); ``owner``: the
    ``TPUEmbedding``, whose pooled engine name (``engine_registry``, prefixed
    with this process's trainer session, ``lease.SESSION_PREFIX``) names the
    engines this backend configures on the hosts.

    Lifecycle (``tf_tpu_emb.cluster.lease``): every host engine is a lease
    kept by ``hosts.leases`` (the heartbeat) until ``shutdown``; an owner
    collected without one ``abandon`` s it (no op on the finalizer's thread);
    after ``hosts.reconnect()`` the backend is ``stale`` and the next restore
    ``reconfigure`` s every host under the same name.
    """

    def __init__(self, hosts, config, features, *, replica_offset=0, owner=None):
        from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb
        proto = pb.TPUEmbeddingConfiguration.FromString(config)
        if proto.num_hosts != hosts.num_hosts:
            raise ValueError("the config's num_hosts is {} but the cluster has {} hosts"
                             .format(proto.num_hosts, hosts.num_hosts))
        self.hosts = hosts
        self.config = config
        self.num_hosts = hosts.num_hosts
        self.sharding = sharding.sharding_of(proto.sharding_strategy)
        self.features = list(features)
        # The worker's router, named after the engine (configure / attach).
        self.router = None
        # Hosts apply a step's update after their Send returned (the next
        # Recv waits for it): the worker routes the next batch meanwhile.
        self.background_updates = True
        # Pipelining: each host's engine looks one batch ahead (ordering.py).
        self.lookahead = bool(proto.pipeline_execution_with_tensor_core)
        self.replica_offset = int(replica_offset)
        self._owner = owner
        self._generation = None
        # The hosts' session id: chosen by configure, kept by reconfigure
        # (traced steps carry it), read from the hosts by attach.
        self.session = 0
        self.configured = False

    def replica(self, local_replica):
        """The engine replica (a Python int: it picks the host's device) of
        this worker's replica ``local_replica``."""
        local = tf.get_static_value(local_replica)
        if local is None:
            raise ValueError("with cluster=, the replica must be known when the step is "
                             "traced (strategy.run of a MirroredStrategy)")
        return self.replica_offset + int(local)

    def _device(self, k, replica=0):
        return self.hosts.device(k, replica)

    # ------------------------------------------------------------ lifecycle

    def configure(self, takeover=False):
        """Configures every host's shard under this trainer's lease (eagerly).
        A host another trainer's running lease holds refuses with
        FailedPrecondition naming the host, the holder and when its lease
        ends (``takeover`` evicts it); no host is left configured then."""
        self.hosts.connect()
        self._shut_down_orphans()
        if self._owner is not None:
            self.engine = engine_registry.name_for(self._owner, prefix=lease.SESSION_PREFIX)
        else:  # a backend without an owning object: a name of its own
            self.engine = engine_registry.EngineName(lease.SESSION_PREFIX).name
        self.session = routing.new_session()
        self._configure_hosts(takeover)
        self.wait_for_hosts()
        self._make_router()
        self.configured = True
        self.hosts.leases.keep(self.engine)

    def _make_router(self):
        if self.router is None:
            self.router = routing.Router(self.config, self.features, self.num_hosts,
                                         name="router_" + self.engine, session=self.session)
        self.router.session = self.session

    def _configure_hosts(self, takeover):
        # Every host's lease first (evicting ended ones): a refusal is an
        # answer, not a failing op (that would taint the host's executor).
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                refusal = ops.claim_tpu_embedding_host(
                    takeover=takeover, engine=self.engine).numpy().decode()
            if refusal:
                raise tf.errors.FailedPreconditionError(
                    None, None, "{}: {}".format(self.hosts.describe(k), refusal))
        done = []
        try:
            for k in range(self.num_hosts):
                with self.hosts.synchronous(), tf.device(self._device(k)):
                    ops.configure_tpu_embedding_host_shard(
                        self.config, k, lease_seconds=self.hosts.lease_s, takeover=takeover,
                        engine=self.engine, session=self.session)
                done.append(k)
        except tf.errors.OpError as e:  # leave no host configured behind
            self._shut_down_hosts(done)
            raise self.hosts.translate(e, len(done)) from None
        self._generation = self.hosts.generation

    def _shut_down_hosts(self, hosts, engine=None):
        """Shuts `engine` (this backend's) down on `hosts`; a host that cannot
        be reached has no engine any more (its process is gone) or keeps it
        until its lease ends."""
        for k in hosts:
            try:
                with self.hosts.synchronous(), tf.device(self._device(k)):
                    ops.shutdown_tpu_embedding(engine=engine or self.engine)
            except tf.errors.OpError:
                pass

    def _shut_down_orphans(self):
        """Engines of owners collected without a shutdown (``abandon``): shut
        down now, at a point where running ops is safe."""
        for engine in self.hosts.leases.take_orphans():
            self._shut_down_hosts(range(self.num_hosts), engine)

    def attach(self):
        """Uses the engines another worker configured (and loaded: callers
        order a worker's build after worker 0's): the engine whose lease runs
        on every host; FailedPrecondition naming the first host that has none."""
        self.hosts.connect()
        names = []
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                names.append(ops.leased_tpu_embedding_engine().numpy().decode())
            if not names[-1]:
                raise tf.errors.FailedPreconditionError(
                    None, None, "{} has no configured engine: worker 0 builds the model's "
                    "TPUEmbedding before the other workers".format(self.hosts.describe(k)))
        if len(set(names)) > 1:
            raise tf.errors.FailedPreconditionError(
                None, None, "the embedding hosts hold the engines of different trainers ({}): "
                "worker 0 builds the model's TPUEmbedding (takeover=True to take them all) "
                "before the other workers".format(", ".join(
                    "host %d: %s" % (k, n) for k, n in enumerate(names))))
        self.engine = names[0]
        sessions = []
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                # .numpy(): a lazy build runs this inside a traced step, where
                # autograph would make int() of a tensor a cast.
                sessions.append(int(ops.tpu_embedding_host_session(engine=self.engine).numpy()))
        if len(set(sessions)) > 1:
            raise tf.errors.FailedPreconditionError(
                None, None, "the embedding hosts' engines {!r} belong to different sessions "
                "({}): a host was configured again by another trainer".format(
                    self.engine, ", ".join("host %d: %d" % (k, s)
                                           for k, s in enumerate(sessions))))
        self.session = sessions[0]
        self._make_router()

    def shutdown(self):
        """Shuts every host's engine down (tables are lost: retrieve first)."""
        if self.router is not None:
            self.router.shutdown()
            self.router = None
        if not self.configured:
            return
        self.configured = False
        self.hosts.leases.drop(self.engine)
        self._shut_down_hosts(range(self.num_hosts))

    def abandon(self):
        """The owner was collected: stop the heartbeat now (any thread, no
        op); the next configure through these hosts shuts the engines down,
        else their leases end."""
        if self.configured:
            self.configured = False
            self.hosts.leases.drop(self.engine, orphan=True)

    def stale(self):
        """Configured before the last ``hosts.reconnect()``: a restarted host
        has lost its shard, the others may hold a half-applied step."""
        return self.configured and self._generation != self.hosts.generation

    def reconfigure(self):
        """Every host afresh under the same name (the caller loads every
        table, e.g. a checkpoint restore): the recovery after a host restart."""
        self._shut_down_hosts(range(self.num_hosts))
        self._configure_hosts(takeover=False)
        self.hosts.leases.keep(self.engine)

    def errors(self):
        """Eager remote errors name their host (``hosts.translate``)."""
        return self.hosts.translating()

    def wait_for_hosts(self):
        """Eagerly: returns once every op sent to the hosts so far has run.
        TF's remote eager ops return before the host runs them, and a step
        function sent next can run on a host before them (seen on loopback
        hosts: a first step finding no engine, the configure still queued).
        One answered op per host drains its queue."""
        if not tf.executing_eagerly():
            return
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                ops.is_tpu_embedding_initialized().numpy()

    # ---------------------------------------------------------- tables

    def step_count(self):
        """Host 0's step count (every host applies every step) and whether a
        table stores bfloat16 there."""
        with tf.device(self._device(0)):
            return ops.retrieve_tpu_embedding_step_count(engine=self.engine)

    def load_step_count(self, count):
        """Every host's step count (bfloat16 rounding seeds, checkpoints)."""
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                ops.load_tpu_embedding_step_count(count, engine=self.engine)

    def load(self, handles, table_name, values):
        """Loads a whole table's state tensors (``handles.tensors`` order,
        each ``[vocabulary_size, dim]``) into every host's shard (eagerly:
        done on every host when it returns)."""
        values = [tf.convert_to_tensor(v) for v in values]
        for k in range(self.num_hosts):
            shards = [sharding.shard_rows(v, self.num_hosts, k, self.sharding) for v in values]
            with tf.device(self._device(k)):
                ordering.per_host(handles.load(*shards, num_shards=self.num_hosts,
                                               shard_id=k, table_name=table_name,
                                               engine=self.engine), k)
        self.wait_for_hosts()

    def retrieve(self, handles, table_name):
        """The whole table's state tensors, reassembled from every host."""
        per_host = []
        for k in range(self.num_hosts):
            with tf.device(self._device(k)):
                values = ordering.per_host(
                    handles.retrieve(num_shards=self.num_hosts, shard_id=k,
                                     table_name=table_name, engine=self.engine), k)
            per_host.append([values] if isinstance(values, tf.Tensor) else list(values))
        return [sharding.assemble([h[i] for h in per_host], self.sharding)
                for i in range(len(per_host[0]))]

    # ---------------------------------------------------------- the step

    def enqueue(self, indices, values, weights, mode, replica, name=None):
        """Routes one replica's ArbitraryTensorBatch inputs on this worker and
        enqueues each host's packed part on that host's replica device."""
        batches, _, _ = self.router.route(indices, values, weights, mode, replica, name=name)
        ordering.per_host(batches, ROUTES)
        enqueues = []
        for k, batch in enumerate(batches):
            with tf.device(self._device(k, replica)):
                enqueues.append(ordering.per_host(ops.enqueue_tpu_embedding_routed_batch(
                    batch, engine=self.engine,
                    name=None if name is None else "{}_host{}".format(name, k)), k,
                    queue="write"))
        return None if tf.executing_eagerly() else tf.group(enqueues)

    def recv(self, num_outputs, replica, name=None):
        """The replica's activations, combined from every host's part."""
        if num_outputs != len(self.router.features):
            raise ValueError("recv: the config has {} outputs, not {}"
                             .format(len(self.router.features), num_outputs))
        parts = []
        for k in range(self.num_hosts):
            with tf.device(self._device(k, replica)):
                parts.append(ordering.per_host(
                    ops.recv_tpu_embedding_routed_activations(engine=self.engine, name=name), k,
                    queue="ahead" if self.lookahead else "read"))
        return list(ordering.per_host(self.router.combine(parts, replica, name=name), WORKER))

    def send(self, layout, gradients, learning_rates, replica, control_inputs=None,
             name=None):
        """Splits the replica's activation gradients per host and sends each
        host its part."""
        inputs = layout_lib.send_inputs(layout, gradients)
        rates = send_lib.learning_rates_for(layout, learning_rates)
        after = send_lib._control_ops(control_inputs)  # pylint: disable=protected-access
        with tf.control_dependencies(after):
            parts = ordering.per_host(self.router.split(inputs, rates, replica, name=name),
                                      WORKER)
        sends = []
        for k, part in enumerate(parts):
            with tf.device(self._device(k, replica)):
                sends.append(ordering.per_host(ops.send_tpu_embedding_routed_gradients(
                    part, background=self.background_updates, engine=self.engine, name=name), k,
                    queue="send" if self.lookahead else None))
        return None if tf.executing_eagerly() else tf.group(sends)
