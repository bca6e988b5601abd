"""`tf_tpu_emb.TPUEmbedding`: TF's mid-level TPU embedding API, running on CPU.

The surface is that of ``tf.tpu.experimental.embedding.TPUEmbedding`` (v2):
``build``, ``enqueue``, ``dequeue``, ``apply_gradients``,
``embedding_tables``, with the same output-shape rules and validation
errors, and it takes TF's own ``TableConfig`` / ``FeatureConfig`` /
``QuantizationConfig`` and optimizer objects (plus ours, in
(:mod:`tf_tpu_emb.optimizers`, for the algorithms TF's Python lacks).  Instead of
a TPU it drives this library's CPU engine:

* ``build`` writes the ``TPUEmbeddingConfiguration`` (one feature descriptor
  per feature, as TF's v2 does), configures the engine, creates host
  variables (parameters + slots, named as TF names them) and loads them.
* ``enqueue`` -> ``EnqueueTPUEmbeddingArbitraryTensorBatch``; ``dequeue`` ->
  ``RecvTPUEmbeddingActivations``; ``apply_gradients`` ->
  ``SendTPUEmbeddingGradients`` (the engine applies each table's optimizer).
* **Strategies**: the default strategy, ``OneDeviceStrategy`` and
  ``MirroredStrategy`` over N logical CPU devices: replica k runs on CPU
  device k and is the engine's replica k (``num_tensor_cores`` = number of
  replicas).  Inside ``strategy.run`` each replica enqueues with its own
  replica id; outside it, per-replica inputs (distributed values) are
  enqueued one op per replica.  All replicas' gradients make one update of
  the global batch.  Under a real ``TPUStrategy`` the constructor returns
  TF's own ``TPUEmbedding`` instead.
* **Checkpoints**: the host variables are ordinary trackable children with
  TF's names (``<table>`` for the parameters, ``<table>/<slot>`` for slots),
  so ``tf.train.Checkpoint(embedding=...)`` writes TF's TPU embedding layout;
  a registered checkpoint callback retrieves the engine's tables into them
  before a save and loads them into the engine after a restore.  Checkpoints
  therefore move between this class, TF's ``TPUEmbedding`` and
  ``TPUEmbeddingForServing``.
* **Several hosts** (``cluster=``, a :class:`tf_tpu_emb.cluster.EmbeddingHosts`):
  every table is sharded over the cluster's embedding hosts
  (``sharding_strategy`` DIV_DEFAULT or MOD); ``tf_tpu_emb.cluster.sharded``
  configures, loads, routes, sums and sends across them.  ``workers=(index,
  count)``: this process is worker ``index`` of ``count`` client processes
  training the model; its replica r is the engine's replica
  ``index * replicas + r``, worker 0 configures and loads (the others build
  after it).  The dense part is the caller's: each worker computes it for its
  replicas (keep it in sync with a multi-worker strategy, as for any
  data-parallel model).  Checkpoints stay whole tables.
"""
import dataclasses
import logging
import threading
import weakref
from typing import (TYPE_CHECKING, Any, Callable, Iterable, List, Mapping, Optional, Sequence,
                    Tuple, Union)

import tensorflow as tf
from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as config_pb2
from tensorflow.python.distribute import tpu_strategy
from tensorflow.python.saved_model import registration
from tensorflow.python.tpu import tpu_embedding_v2
from tensorflow.python.tpu import tpu_embedding_v2_utils
from tensorflow.python.trackable import autotrackable
from tensorflow.python.trackable import data_structures
from tensorflow.python.util import nest

from tf_tpu_emb import backend_factory
from tf_tpu_emb import enqueue_inputs
from tf_tpu_emb import features as features_lib
from tf_tpu_emb import gradients as gradients_lib
from tf_tpu_emb import host_variables
from tf_tpu_emb import layout as layout_lib
from tf_tpu_emb import ops
from tf_tpu_emb import optimizers as optimizers_lib
from tf_tpu_emb import send as send_lib
from tf_tpu_emb import structure
from tf_tpu_emb import table_views

if TYPE_CHECKING:  # annotations only: the cluster package is imported on use
    from tf_tpu_emb.cluster import hosts as hosts_lib

_logger = logging.getLogger(__name__)

STEP_VARIABLE = host_variables.STEP_VARIABLE


# TF's own class, held privately: the public name
# tf.tpu.experimental.embedding.TPUEmbedding is this class under the CPU
# stand-in for the TPU system (tf_tpu_emb.tpu), and __new__ must not recurse.
_TF_TPU_EMBEDDING = tpu_embedding_v2.TPUEmbedding


def _tpu_system(strategy):
    """The CPU stand-in's TPU system (``tf_tpu_emb.tpu``) `strategy` runs on, or None."""
    return getattr(strategy.extended, "tf_tpu_emb_system", None)


def _under_tpu_strategy():
    """A real TPU strategy (TF's classes, not the CPU stand-in)."""
    strategy = tf.distribute.get_strategy()
    return (isinstance(strategy, (tpu_strategy.TPUStrategyV2, tpu_strategy.TPUStrategy))
            and _tpu_system(strategy) is None)


class TPUEmbedding(autotrackable.AutoTrackable):
    """TF's ``tf.tpu.experimental.embedding.TPUEmbedding`` on CPU (see module doc).

    ```python
    table = tf.tpu.experimental.embedding.TableConfig(1000, 16, name="video")
    feature_config = {"watched": tf.tpu.experimental.embedding.FeatureConfig(table)}
    embedding = tf_tpu_emb.TPUEmbedding(
        feature_config, tf.tpu.experimental.embedding.Adagrad(0.1))
    embedding.build(per_replica_batch_size=64)

    embedding.enqueue({"watched": sparse_ids}, training=True)
    with tf.GradientTape() as tape:
        activations = embedding.dequeue()
        tape.watch(activations)
        loss = model(activations)
    embedding.apply_gradients(tape.gradient(loss, activations))
    ```

    Args:
      feature_config: TF's ``tf.tpu.experimental.embedding.FeatureConfig``
        objects, one or a nest of them (list, tuple, dict): the structure of
        every ``enqueue``, ``dequeue`` and ``apply_gradients``.  Their
        ``TableConfig`` s become the tables; a table without a name is named
        ``table_<i>`` and one without an optimizer gets ``optimizer``, as in
        TF.
      optimizer: the optimizer of the tables that name none: one of TF's
        (``tf.tpu.experimental.embedding.SGD``, ``Adagrad``, ``Adam``,
        ``FTRL`` ...) or of :mod:`tf_tpu_emb.optimizers`.  ``None`` is TF's
        serving-only form: no slot variables, and ``apply_gradients`` is
        refused.
      pipeline_execution_with_tensor_core: TF's flag, written into the
        ``TPUEmbeddingConfiguration``: when true, the forward pass of step
        N+1 may run before the backward pass of step N, so the activations
        need not see the previous step's update.  Here the engine keeps each
        step's update until every replica's next lookup has read the tables
        and then applies it on a thread of its own: step N+1's activations
        never include step N's update, step N+2's always do (a Retrieve, a
        Load or a checkpoint applies a kept update first).  With ``cluster=``
        each host's engine follows the same rule and also looks one batch
        ahead, so a step's lookup overlaps the previous step's gradients
        travelling back (docs/engine.md "Semantics worth knowing",
        docs/guides/several-machines.md).  Default ``False``: each lookup
        sees every update before it.
      cluster: the embedding hosts to shard every table over (a
        :class:`tf_tpu_emb.cluster.EmbeddingHosts`); ``None``: this process's
        engine holds the tables.
      sharding_strategy: how rows are sharded over the hosts,
        ``"DIV_DEFAULT"`` (contiguous ranges) or ``"MOD"`` (row ``i`` on
        shard ``i % shards``), TF's ``ShardingStrategy`` names.
      workers: ``(index, count)``: this process is worker ``index`` of
        ``count`` client processes training the model (``cluster=`` only).

    Raises:
      ValueError: a feature that is not a ``FeatureConfig``, an unsupported
        optimizer class, two tables with one name, an unknown
        ``sharding_strategy`` or bad ``workers``.
    """

    def __new__(cls, feature_config=None, optimizer=None,
                pipeline_execution_with_tensor_core=False, **cluster_options):
        if _under_tpu_strategy():
            # A real TPU: TF's own implementation drives the hardware.
            return _TF_TPU_EMBEDDING(feature_config, optimizer,
                                     pipeline_execution_with_tensor_core)
        return super().__new__(cls)

    def __init__(self,
                 feature_config: Union[tpu_embedding_v2_utils.FeatureConfig, Iterable],
                 optimizer: "Optional[optimizers_lib.Optimizer]",
                 pipeline_execution_with_tensor_core: bool = False, *,
                 cluster: Optional["hosts_lib.EmbeddingHosts"] = None,
                 sharding_strategy: str = "DIV_DEFAULT",
                 workers: Tuple[int, int] = (0, 1)) -> None:
        self._cluster = cluster
        self._sharding = config_pb2.TPUEmbeddingConfiguration.ShardingStrategy.Value(
            sharding_strategy)
        self._worker, self._num_workers = (int(w) for w in workers)
        if not 0 <= self._worker < self._num_workers or (
                cluster is None and (self._worker, self._num_workers) != (0, 1)):
            raise ValueError("workers={!r}: must be (index, count) with 0 <= index < count, "
                             "and only with cluster=".format(workers))
        self._feature_config = feature_config
        self._pipeline = bool(pipeline_execution_with_tensor_core)
        # One record per flat feature (features.Feature: its path, TF's
        # FeatureConfig, its output shape as known so far), in config order.
        self._features = []
        for path, feature in nest.flatten_with_joined_string_paths(feature_config):
            if not isinstance(feature, tpu_embedding_v2_utils.FeatureConfig):
                raise ValueError("Feature {} is a {}, not a "
                                 "tf.tpu.experimental.embedding.FeatureConfig."
                                 .format(path, type(feature).__name__))
            self._features.append(features_lib.Feature.of(path, feature))
        # Tables in order of first use, named and given the global optimizer
        # exactly as TF's TPUEmbedding does (TF mutates the TableConfigs too).
        self._table_config = []
        for feature in self._features:
            if feature.config.table not in self._table_config:
                self._table_config.append(feature.config.table)
        names = []
        base = tpu_embedding_v2_utils._Optimizer  # pylint: disable=protected-access
        for i, table in enumerate(self._table_config):
            if table.optimizer is None:
                table.optimizer = optimizer
            if table.optimizer is not None and not isinstance(table.optimizer, base):
                raise ValueError("{} is an unsupported optimizer class. Please pass an "
                                 "instance of one of the optimizer classes under "
                                 "tf.tpu.experimental.embedding or tf_tpu_emb."
                                 .format(type(table.optimizer)))
            if table.name is None:
                table.name = "table_{}".format(i)
            if table.name in names:
                raise ValueError("Tables must have a unique name. "
                                 f"Multiple tables with name {table.name} found.")
            names.append(table.name)
        # Dynamic inputs (callable learning rates, ...) get tags in order of
        # first appearance, deduplicated by identity, as in TF.
        self._dynamic_inputs = []
        for table in self._table_config:
            for fn in optimizers_lib.dynamic_input_fns(self._optimizer_of(table)):
                if not any(fn is known for known in self._dynamic_inputs):
                    self._dynamic_inputs.append(fn)
        self._combiners = [t.combiner for t in self._table_config]
        self._strategy = tf.distribute.get_strategy()
        self._num_replicas = self._strategy.num_replicas_in_sync
        self._engine_replicas = self._num_replicas * self._num_workers
        self._built = False
        # shutdown() ran after a build: only an explicit build() (or a
        # checkpoint restore) configures the engine again.
        self._shut_down = False
        # Serialises build, shutdown and the implicit build of the first
        # enqueue: an object builds once whichever threads race.
        self._lock = threading.RLock()
        self._config = None
        # The engine(s) behind this object (backend.Backend), chosen at build.
        self._backend = None
        self._layout = None
        self._variables = {}
        self._step_variable = None

    # ------------------------------------------------------------- properties

    @property
    def feature_config(self):
        """The nested feature config this object was created with."""
        return self._feature_config

    @property
    def config_proto(self):
        """The serialized ``TPUEmbeddingConfiguration`` (after ``build``)."""
        self._require_built("config_proto")
        return self._config

    @property
    def tables(self):
        """The ``TableConfig`` s in table-id order (the engine's), named and
        given their optimizer as TF's class does."""
        return list(self._table_config)

    @property
    def num_replicas(self):
        """Replicas of the strategy this object was created under (this
        worker's; the engine has ``num_replicas * workers``)."""
        return self._num_replicas

    @property
    def dynamic_learning_rates(self):
        """The callables of the dynamic learning rates (and other dynamic
        optimizer inputs), in tag order: what each step's Send evaluates."""
        return list(self._dynamic_inputs)

    @property
    def embedding_tables(self):
        """``{TableConfig: parameters variable}``, retrieved from the engine
        (also indexed by table name: a per-shard view, see ``table_views``).

        As TF's class off TPU, this works before ``build`` too: it creates the
        host variables (initialised, or restored from a checkpoint restored
        before) without configuring the engine; a later ``build`` loads them.
        (TF's own class refuses this under ``TPUStrategy``.)"""
        if self._built:
            self._retrieve_variables()
        else:
            self._ensure_variables()
        return table_views.EmbeddingTables(
            {t: self._variables[t.name]["parameters"] for t in self._table_config},
            num_shards=self._num_replicas)

    # ------------------------------------------------------------------ build

    def build(self,
              per_replica_input_shapes: Optional[Union[tf.TensorShape, Iterable, int]] = None,
              per_replica_batch_size: Optional[int] = None, *,
              takeover: bool = False) -> None:
        """Fixes the output shapes, configures the engine and creates and loads
        the tables (see ``tf.tpu.experimental.embedding.TPUEmbedding.build``).

        The argument forms are TF's:

        * ``build(per_replica_input_shapes=...)``: input shapes (``TensorShape``
          or lists) in the feature config's structure, or any structure with
          the same *flattened* length (a flat list for a nested config);
        * ``build(64)`` / ``build(per_replica_batch_size=64)``: an ``int``,
          passed either way, is the per-replica batch size (TensorFlow
          Recommenders' embedding layer calls ``build(batch_size)``);
        * ``build()``: shapes from ``FeatureConfig.output_shape`` only
          (``enqueue`` builds from its inputs when nothing was given).

        Shapes already set (``FeatureConfig.output_shape``) win; incoming ones
        that contradict them raise TF's ``ValueError`` ("Inconsistent shape
        founded for input feature ...").  Unlike TF, which ignores
        ``per_replica_batch_size`` when both are given, passing both is a
        ``ValueError``.  On TPU this call also initialises the TPU system for
        embeddings; here it configures this process's CPU engine, and if
        anything fails after that the engine is released again, so a fresh
        object can be built.

        After ``shutdown()`` a ``build()`` configures the engine again (the
        only way besides restoring a checkpoint: nothing rebuilds
        implicitly), loading the tables from the host variables (their last
        retrieve or restore).

        Args:
          per_replica_input_shapes: the input shapes, in the feature config's
            structure or flat; an ``int`` is taken as the per-replica batch
            size.
          per_replica_batch_size: the per-replica batch size.
          takeover: (``cluster=`` only) take the embedding hosts even while
            another trainer's lease on them runs (README "Running on several
            machines").
        """
        with self._lock:
            self._build(per_replica_input_shapes, per_replica_batch_size, takeover)

    def _build(self, per_replica_input_shapes, per_replica_batch_size, takeover):
        if self._built:
            return
        if per_replica_input_shapes is not None and per_replica_batch_size is not None:
            raise ValueError("Only one of per_replica_input_shapes and "
                             "per_replica_batch_size can be specified.")
        if isinstance(per_replica_input_shapes, int) and not isinstance(
                per_replica_input_shapes, bool):
            _logger.warning("Passing batch size to per_replica_input_shapes argument will be "
                            "deprecated, please specify all the input shapes using "
                            "per_replica_input_shapes argument.")
            per_replica_input_shapes, per_replica_batch_size = None, per_replica_input_shapes
        incoming = None
        if per_replica_input_shapes is not None:
            flat_shapes = enqueue_inputs.flatten_shapes(per_replica_input_shapes)
            nest.assert_same_structure(flat_shapes, [f.config for f in self._features])
            incoming = layout_lib.incoming_output_shapes(self._features, flat_shapes)
        elif per_replica_batch_size is not None:
            incoming = layout_lib.incoming_output_shapes(
                self._features, batch_size=per_replica_batch_size)
        if incoming is not None:
            self._features = layout_lib.merge_output_shapes(self._features, incoming)
        for f in self._features:
            if not f.fully_defined:
                raise ValueError(
                    f"Input Feature {f.path} has output shape set as "
                    f"{tf.TensorShape(f.output_shape)} which is not fully defined. Please "
                    "specify the fully defined shape in either FeatureConfig or for the "
                    "build method.")
        with tf.init_scope():
            system = _tpu_system(self._strategy)
            # One TPU embedding per (stand-in) TPU system: its engine.
            engine = system.embedding_engine() if system is not None else None
            # Variables a learning-rate callable creates on first use (Keras'
            # optimizer.iterations behind a schedule) are created now, not
            # inside the first traced step.
            for fn in self._dynamic_inputs:
                fn()
            self._config = self._create_config_proto().SerializeToString()
            self._configure(takeover, engine)
            try:
                self._layout = dataclasses.replace(layout_lib.Layout.for_features(
                    self._config, [t.name for t in self._table_config],
                    [t.dim for t in self._table_config],
                    [(f.path, self._table_config.index(f.config.table), f.output_shape)
                     for f in self._features],
                    len(self._dynamic_inputs)), engine=self._backend.engine)
                self._ensure_variables()
                self._ensure_step_variable()
                self._built = True
                self._shut_down = False
                self._load_variables()
            except BaseException:
                # Leave nothing configured behind: a fresh object (or this one,
                # retried) must be able to build.
                self._built = False
                self._release()
                raise

    def _configure(self, takeover=False, engine=None):
        """Gets the backend (``backend_factory.create``, the one place that
        knows the kinds) and configures it: an engine of this object's own (README "Several
        engines per process": other TPUEmbedding objects and the default
        engine are untouched), or (``cluster=``) every host's shard; a
        worker other than 0 attaches to the engines worker 0 configured.
        ``engine``: the name a local engine must have (the stand-in TPU
        system's), else a pooled one of its own."""
        self._backend = backend_factory.create(
            self._config, owner=self, combiners=self._combiners, engine=engine,
            cluster=self._cluster, replica_offset=self._worker * self._num_replicas,
            features=self._features)
        # Collected without shutdown: the backend lets go without ops.
        self._abandon = weakref.finalize(self, self._backend.abandon)
        if self._worker == 0:
            self._backend.configure(takeover=takeover)
        else:
            self._backend.attach()

    def _release(self):
        if self._backend is not None:
            self._abandon.detach()
            self._backend.shutdown()

    def _create_config_proto(self):
        config = config_pb2.TPUEmbeddingConfiguration()
        for table in self._table_config:
            optimizers_lib.table_descriptor_for(
                table, optimizer=self._optimizer_of(table),
                learning_rate_index=self._dynamic_inputs,
                table_descriptor=config.table_descriptor.add())
        for f in self._features:
            # The engine names a feature in its errors by the descriptor's
            # name: the user's key path ("user/friends").
            config.feature_descriptor.add(table_id=self._table_config.index(f.config.table),
                                          input_shape=f.output_shape, name=f.path)
        config.mode = config_pb2.TPUEmbeddingConfiguration.TRAINING
        config.num_hosts = 1 if self._cluster is None else self._cluster.num_hosts
        config.num_tensor_cores = self._engine_replicas
        config.sharding_strategy = self._sharding
        config.pipeline_execution_with_tensor_core = self._pipeline
        return config

    # -------------------------------------------------------------- variables

    def _ensure_variables(self):
        """Creates the host variables once (``embedding_tables`` may have
        created them before ``build``), named as TF names them."""
        if not self._variables:
            owner = weakref.ref(self)
            self._variables = host_variables.create_table_variables(
                self, self._table_config, self._optimizer_of,
                # pylint: disable-next=protected-access
                lambda t: owner() is not None and owner()._restored(t))

    def _ensure_step_variable(self):
        """bfloat16 storage: the checkpointed step count
        (``host_variables.STEP_VARIABLE``), created at the first build that
        finds a bfloat16 table."""
        if self._step_variable is not None or not self._backend.step_count()[1]:
            return
        owner = weakref.ref(self)
        self._step_variable = data_structures.NoDependency(host_variables.create_step_variable(
            # pylint: disable-next=protected-access
            self, lambda: owner() is not None and owner()._restored(STEP_VARIABLE)))

    @staticmethod
    def _optimizer_of(table):
        """The table's optimizer; for ``optimizer=None`` (TF's serving-only
        form: no slot variables) the engine runs the table with a
        learning-rate-0 SGD, which has no slots, and ``apply_gradients`` is
        refused."""
        if table.optimizer is None:
            return tpu_embedding_v2_utils.SGD(learning_rate=0.0)
        return table.optimizer

    def _table_ops(self, table):
        """The typed Load/Retrieve handles of the table's optimizer."""
        return ops.table_ops(optimizers_lib.info_of(self._optimizer_of(table)).proto_field)

    def table_state_names(self, table: tpu_embedding_v2_utils.TableConfig) -> List[str]:
        """The names of ``table`` 's state tensors: ``parameters``, then its
        optimizer's slots, in the order of ``load_table`` / ``retrieve_table``."""
        return list(self._table_ops(table).tensors)

    @property
    def layout(self):
        """Where each feature sits in the engine's outputs
        (:class:`tf_tpu_emb.layout.Layout`, feature names = paths; after ``build``)."""
        self._require_built("layout")
        return self._layout

    def _load_variables(self):
        """Host variables -> engine (also TF's checkpoint callback's entry point)."""
        for table in self._table_config:
            self._load_host_table(table)
        self._load_step_count()

    def _load_step_count(self):
        if self._built and self._backend.configured and self._step_variable is not None:
            with tf.init_scope(), self._backend.errors():
                self._backend.load_step_count(self._step_variable)

    def _restored(self, table=None):
        """A checkpoint restored the host variables of `table` (None: all):
        load them into the engine.  A restore is an explicit act, so an object
        shut down after a build is built again (and loads every table)."""
        with self._lock:
            if self._shut_down:
                self._build(None, None, False)
            elif self._built and self._backend.stale():
                # After hosts.reconnect() (a restarted host): every host afresh,
                # then every table from the host variables (README "Running on
                # several machines", recovery).
                self._backend.reconfigure()
                self._load_variables()
            elif table is None:
                self._load_variables()
            elif table == STEP_VARIABLE:
                self._load_step_count()
            else:
                self._load_host_table(table)

    def _load_host_table(self, table):
        """One table's host variables -> engine (no-op unless this object is
        built and configured its engine)."""
        if not self._built or not self._backend.configured:
            return
        with tf.init_scope():
            self.load_table(table, [self._variables[table.name][n]
                                    for n in self._table_ops(table).tensors])

    def _retrieve_variables(self):
        """Engine -> host variables."""
        with tf.init_scope():
            for table in self._table_config:
                for n, value in zip(self._table_ops(table).tensors, self.retrieve_table(table)):
                    self._variables[table.name][n].assign(value)
            if self._step_variable is not None:
                self._step_variable.assign(self._backend.step_count()[0])

    def load_table(self, table: tpu_embedding_v2_utils.TableConfig,
                   values: Sequence["tf.types.experimental.TensorLike"]):
        """Writes a whole table's state tensors (``table_state_names(table)``
        order, each ``[vocabulary_size, dim]``) into the engine (every host's
        shard of it with ``cluster=``).  After ``build``."""
        self._require_built("load_table")
        with self._backend.errors():
            return self._backend.load(self._table_ops(table), table.name, values)

    def retrieve_table(self, table: tpu_embedding_v2_utils.TableConfig) -> List[tf.Tensor]:
        """A whole table's state tensors (``table_state_names(table)`` order)
        from the engine (reassembled from the hosts with ``cluster=``)."""
        self._require_built("retrieve_table")
        with self._backend.errors():
            return self._backend.retrieve(self._table_ops(table), table.name)

    # ---------------------------------------------------------------- enqueue

    def enqueue(self,
                features: Union[tf.Tensor, tf.SparseTensor, tf.RaggedTensor, Iterable],
                weights: Optional[Union[tf.Tensor, tf.SparseTensor, tf.RaggedTensor,
                                        Iterable]] = None,
                training: Union[bool, tf.Tensor] = True, name: Optional[str] = None,
                device: Optional[str] = None) -> None:
        """Enqueues one step of ids (``features``, same structure as the
        feature config: dense ``tf.Tensor``, ``tf.SparseTensor`` or
        ``tf.RaggedTensor``; optional ``weights`` of the same kinds) for the
        next ``dequeue``.  Builds the object from the input shapes if needed.

        In ``strategy.run`` the replica's own id picks the engine queue;
        outside it, per-replica (distributed) inputs are enqueued to every
        replica, ``device`` names the one replica plain inputs go to (TF maps
        a TPU device to its core; here a replica's CPU device, or ``/TPU:k``
        for replica k), and plain inputs without ``device`` go to every
        replica, as TF's do.  ``training`` is a Python or tensor bool
        (False: an inference batch, which no ``apply_gradients`` may follow).
        ``name`` names the op; on TPU it tags the enqueue for the TPU
        compiler instead.  TPU-only in TF, and not done here: the check that
        inputs are not on a TPU device, and the outside-compilation rewrite of
        an enqueue inside a TPU replica function.

        Args:
          features: the ids, in the feature config's structure (per-replica
            distributed values too).
          weights: optional weights of the sparse or ragged features, same
            structure (``None`` leaves for unweighted features).
          training: ``False`` for an inference batch.
          name: the op's name.
          device: the replica that plain inputs go to, outside
            ``strategy.run`` (``None``: every replica).
        """
        structure.assert_same_structure(self._feature_config, features, "enqueue(features)")
        flat_weights = [None] * len(self._features)
        if weights is not None:
            structure.assert_same_structure(self._feature_config, weights, "enqueue(weights)")
            flat_weights = nest.flatten(weights)
        flat_inputs = nest.flatten(features)
        # Inside strategy.run of a (non-default) strategy: a replica context.
        in_replica_fn = (tf.distribute.has_strategy()
                         and not tf.distribute.in_cross_replica_context())
        distributed = any(isinstance(x, tf.distribute.DistributedValues) for x in flat_inputs)
        # Plain inputs outside strategy.run with several replicas go to every
        # replica, as TF's enqueue does (distribute_utils.select_replica).
        every_replica = not in_replica_fn and device is None and self._num_replicas > 1

        def local(x):
            if isinstance(x, tf.distribute.DistributedValues):
                return self._strategy.experimental_local_results(x)
            return [x] * self._num_replicas

        if distributed or every_replica:
            per_replica = [local(x) for x in flat_inputs]
            per_replica_w = [local(w) for w in flat_weights]
            devices = self._strategy.extended.worker_devices
            for r in range(self._num_replicas):
                inputs_r = [x[r] for x in per_replica]
                weights_r = [w[r] for w in per_replica_w]
                self._maybe_build(inputs_r)
                with tf.device(devices[r]):
                    self._enqueue_op(inputs_r, weights_r, training, r, name)
            return None
        self._maybe_build(flat_inputs)
        if in_replica_fn:
            ordinal = tf.cast(tf.distribute.get_replica_context().replica_id_in_sync_group,
                              tf.int32)
            self._enqueue_op(flat_inputs, flat_weights, training, ordinal, name)
            return None
        if device is not None:
            replica = enqueue_inputs.replica_of_device(self._strategy, device)
            with tf.device(enqueue_inputs.replica_devices(self._strategy)[replica]):
                self._enqueue_op(flat_inputs, flat_weights, training, replica, name)
            return None
        self._enqueue_op(flat_inputs, flat_weights, training, 0, name)
        return None

    def _maybe_build(self, flat_inputs):
        incoming = layout_lib.incoming_output_shapes(self._features, [
            enqueue_inputs.input_shape(f.path, x, f.config)
            for f, x in zip(self._features, flat_inputs)])
        with self._lock:
            self._check_not_shut_down("enqueue")
            merged = layout_lib.merge_output_shapes(self._features, incoming)
            if not self._built:
                self._features = merged
                self._build(None, None, False)

    def _enqueue_op(self, flat_inputs, flat_weights, training, device_ordinal, name):
        indices, values, weights = enqueue_inputs.arbitrary_tensor_batch(
            self._features, flat_inputs, flat_weights)
        mode = enqueue_inputs.mode_of(training)
        with self._backend.errors():
            return self._backend.enqueue(indices, values, weights, mode,
                                         self._backend.replica(device_ordinal), name=name)

    # ------------------------------------------------------ dequeue / gradients

    def _check_not_shut_down(self, what):
        if self._shut_down:
            raise RuntimeError(
                "{} called on a TPUEmbedding that was shut down: its engine and tables are "
                "gone. Call build() to configure it again (the tables are then loaded from "
                "its host variables), or restore a checkpoint into it; nothing rebuilds it "
                "implicitly.".format(what))

    def _require_built(self, what):
        self._check_not_shut_down(what)
        if not self._built:
            raise RuntimeError("{} called on unbuilt TPUEmbedding object. Please either "
                               "call enqueue first or manually call the build method."
                               .format(what))

    def dequeue(self, name: Optional[str] = None) -> Union[tf.Tensor, Iterable]:
        """This replica's activations for the oldest enqueued step, in the
        feature config's structure (each ``output_shape + [dim]``).

        Args:
          name: the op's name.
        """
        self._require_built("dequeue")
        with self._backend.errors():
            outputs = self._backend.recv(len(self._features),
                                         self._backend.replica(self._replica_id()), name=name)
        return nest.pack_sequence_as(self._feature_config, outputs)

    def apply_gradients(self, gradients: Union[Optional[tf.Tensor], Iterable],
                        name: Optional[str] = None):
        """Sends this replica's dL/d(activations) (structure of the feature
        config; ``None`` = zeros, with a warning) to the engine, which applies
        every table's optimizer once all replicas have sent.

        Args:
          gradients: the gradients of the loss with respect to the
            activations ``dequeue`` returned, in the feature config's
            structure.
          name: the op's name.
        """
        self._require_built("apply_gradients")
        no_optimizer = [t.name for t in self._table_config if t.optimizer is None]
        if no_optimizer:
            raise ValueError(
                "apply_gradients called on a TPUEmbedding created with optimizer=None "
                "(tables {} have no optimizer: the serving-only form, without slot "
                "variables). Pass an optimizer to train.".format(no_optimizer))
        structure.assert_same_structure(self._feature_config, gradients,
                                        "apply_gradients(gradients)")
        updated = send_lib.mid_level_gradients(
            self._layout, nest.flatten_with_joined_string_paths(gradients), logger=_logger)
        rates = [fn() for fn in self._dynamic_inputs]
        with self._backend.errors():
            return self._backend.send(self._layout, updated, rates,
                                      self._backend.replica(self._replica_id()), name=name)

    def hook_step(self, dummy_variables: Union[Sequence[tf.Variable], Mapping[Any, tf.Variable]],
                  recv_outputs: Sequence[tf.Tensor],
                  learning_rate_fn: Optional[Callable[[], Sequence[tf.Tensor]]] = None
                  ) -> List[tf.Tensor]:
        """:func:`tf_tpu_emb.gradients.hook_step` for this object's step: the flat
        ``dequeue()`` outputs (``recv_outputs``, layout order) wired so that
        the gradient of a loss w.r.t. ``dummy_variables`` (one ``[1]``
        variable per table, table-id order) builds this replica's one Send
        to this object's engine(s).  Returns the activations (a list, layout
        order).  ``learning_rate_fn`` returns the dynamic learning rates
        (default: ``dynamic_learning_rates`` evaluated)."""
        self._require_built("hook_step")
        backend, layout = self._backend, self._layout
        replica = backend.replica(self._replica_id())
        if learning_rate_fn is None:
            fns = list(self._dynamic_inputs)
            learning_rate_fn = lambda: [fn() for fn in fns]  # noqa: E731
        hooked = gradients_lib.hook_step(
            dummy_variables, layout, recv_outputs, learning_rate_fn,
            send_fn=lambda gradients, rates, control_inputs=None: backend.send(
                layout, gradients, rates, replica, control_inputs=control_inputs))
        return list(hooked.values())

    @staticmethod
    def _replica_id():
        """This replica's id in its strategy (0 outside ``strategy.run``)."""
        if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
            return 0
        return tf.distribute.get_replica_context().replica_id_in_sync_group

    def shutdown(self) -> None:
        """Releases the engine this object configured (its tables are lost:
        save a checkpoint first) so that another TPUEmbedding can be built.
        Afterwards enqueue/dequeue/apply_gradients raise until ``build()`` (or
        a checkpoint restore) configures it again.  When the object is
        garbage collected its engine is released too, from any thread
        (``engine_registry``'s finalizer; ``Backend.abandon``)."""
        with self._lock:
            if self._built:
                self._release()
                self._shut_down = True
            self._built = False


def _save_callback(trackables, **unused_kwargs):
    for trackable in trackables.values():
        # pylint: disable-next=protected-access
        if isinstance(trackable, TPUEmbedding) and trackable._built:
            trackable._retrieve_variables()  # pylint: disable=protected-access
    return []


def _restore_callback(trackables, **unused_kwargs):
    for trackable in trackables.values():
        if isinstance(trackable, TPUEmbedding):
            trackable._restored()  # pylint: disable=protected-access


registration.register_tf_checkpoint_saver(
    "TfTpuEmbTPUEmbeddingCallback",
    predicate=lambda x: isinstance(x, TPUEmbedding),
    save_fn=_save_callback,
    restore_fn=_restore_callback,
    strict_predicate_restore=False)
