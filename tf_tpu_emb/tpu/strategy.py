"""The stand-in's cluster resolver and TPU strategy (what ``tf_tpu_emb.tpu.install``
puts behind TF's public names).

* :class:`TPUClusterResolver` is a subclass of TF's: any ``tpu`` argument
  (``""``, ``"local"``, a name, a ``grpc://`` address) resolves to the local
  stand-in TPU system; nothing is contacted.  It answers ``master()``,
  ``cluster_spec()``, ``num_accelerators()`` (``{"TPU": replicas}``),
  ``get_tpu_system_metadata()`` and ``tpu_hardware_feature`` (embedding
  feature V1, or V2 on a SparseCore system: ``install(embedding="v2")``).
* :class:`TPUStrategy` is a subclass of both ``tf.distribute.TPUStrategy``
  (TF's ``TPUStrategyV2``) and ``tf.distribute.experimental.TPUStrategy``:
  ``isinstance`` against TF's TPU strategy classes holds, so libraries take
  their TPU paths (build ``tf.tpu.experimental.embedding.TPUEmbedding``, read
  ``extended.tpu_hardware_feature``).  It *computes* as a
  ``MirroredStrategy`` over the system's N logical CPU devices (replica k on
  ``/device:CPU:k``, one engine replica each): its ``extended`` is a
  ``MirroredExtended`` that also answers what TPU code asks of a
  ``TPUExtended``.

Class-name heuristics.  tf-keras (``backend.is_tpu_strategy``) and TF's
``tpu_replication.is_tpu_strategy`` decide between TPU *compilation* paths
(XLA replicate contexts, ON_WRITE metric variables, reporting the first
replica's per-replica outputs) and CPU ones by the names of
``strategy.__class__`` and its bases, not by ``isinstance``.  The stand-in
runs no TPU compiler, so for them ``__class__`` is :class:`CPUStandInStrategy`
(a plain ``tf.distribute.Strategy`` subclass) while ``type(strategy)`` -- what
``isinstance`` checks -- stays the TPU subclass.  That keeps the losses and
metrics Keras reports equal to those of a ``MirroredStrategy`` with the same
replicas (tests/tpu/test_standin_keras.py).

SparseCore systems (``install(embedding="v2")``; TF's ``TPUEmbeddingV2``,
tf_tpu_emb/tpu/embedding_v2.py).  Three more things of a ``TPUExtended`` /
``TPUStrategy``, on such a system only (a V1 system is as before):
``extended._tpu_devices`` (the [replicas, 1] device array TF's class reads),
``skip_mirrored_creator`` honoured at variable creation (TF creates each
table shard on its own device), and an eager ``run`` traced and run as a
``tf.function`` (TF's ``TPUStrategy`` compiles an eager ``run`` too; the
replicas' SparseCore kernels of a step meet within one function call).
TF's switch that turns embedding pipelining off for what is traced under it
(``SequentialEmbeddingContext``, a thread-local of TF 2.17 on) reaches the
replicas' functions, which ``MirroredStrategy`` runs in threads of their own
(on a TPU they run in the caller's).

Collective keys.  On a TPU a strategy's cross-replica sums are compiled into
its own XLA program, so two TPU strategies of one process (a test suite that
builds a model per test, as Model Garden's ``train_test.py`` does) never
meet.  The stand-in's sums are TF collective ops, which TF's runtime matches
by (group key, instance key) and remembers for the process: two strategies
that start their keys at the same number make the second model's gradient
all-reduce meet the first one's record ("Shape mismatch in the collective
instance ...").  Each stand-in strategy therefore draws a key range of its
own (TF's own tests do the same with ``MirroredStrategy._collective_key_base``).
"""
import contextlib
import copy
import functools
import itertools
import weakref

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute import distribute_utils
from tensorflow.python.distribute import mirrored_strategy
from tensorflow.python.distribute import tpu_strategy
from tensorflow.python.distribute.cluster_resolver.tpu import tpu_cluster_resolver
from tensorflow.python.tpu import tpu_hardware_feature
try:
    from tensorflow.python.tpu import embedding_context_utils
except ImportError:  # TF 2.16: no SequentialEmbeddingContext
    embedding_context_utils = None

from tf_tpu_emb.tpu import system as system_lib

__all__ = ["TPUClusterResolver", "TPUStrategy", "CPUStandInStrategy"]


def _system():
    system = system_lib.current()
    if system is None:
        raise RuntimeError("The CPU stand-in for the TPU system is not installed "
                           "(tf_tpu_emb.tpu.install, or python -m tf_tpu_emb.run).")
    return system


class _NoCloudClient:
    """The Cloud TPU client a resolver of the stand-in has: none to call."""

    def api_available(self):
        return False

    def enter(self):
        pass

    def exit(self, *unused):
        pass


class TPUClusterResolver(tpu_cluster_resolver.TPUClusterResolver):
    """``tf.distribute.cluster_resolver.TPUClusterResolver`` of the stand-in:
    every TPU name resolves to the local stand-in TPU system."""

    def __init__(self, tpu=None, zone=None, project=None, job_name="worker",
                 coordinator_name=None, coordinator_address=None, credentials="default",
                 service=None, discovery_url=None):
        # TF's constructor would ask the Cloud TPU API about `tpu`; the
        # arguments are kept for inspection only.
        del credentials, service, discovery_url
        self._system = _system()
        self._requested = (tpu, zone, project)
        self._cloud_tpu_client = _NoCloudClient()
        self._tpu = "local"
        self.task_type = job_name
        self.task_id = 0
        self._coordinator_name = coordinator_name
        self._coordinator_address = coordinator_address
        self._tpu_topology = self._system.topology_proto()

    @staticmethod
    def connect(tpu=None, zone=None, project=None):
        resolver = TPUClusterResolver(tpu, zone, project)
        _system().initialize()
        return resolver

    def master(self, task_type=None, task_id=None, rpc_layer=None):
        return ""

    def cluster_spec(self):
        return tf.train.ClusterSpec({})

    def num_accelerators(self, task_type=None, task_id=None, config_proto=None):
        return {"TPU": self._system.replicas}

    def get_tpu_system_metadata(self):
        n = self._system.replicas
        return tf.tpu.experimental.TPUSystemMetadata(
            num_cores=n, num_hosts=1, num_of_cores_per_host=n,
            topology=tf.tpu.experimental.Topology(
                serialized=self._system.topology_proto().SerializeToString()),
            devices=[tf.DeviceSpec.from_string(d) for d in self._system.devices])

    def __repr__(self):
        return "<stand-in TPUClusterResolver tpu=%r: %d CPU replica(s)>" % (
            self._requested[0], self._system.replicas)


class CPUStandInStrategy(distribute_lib.Strategy):
    """What class-name heuristics see of a stand-in :class:`TPUStrategy`
    (``strategy.__class__``): a strategy that runs no TPU compiler.  Never
    instantiated."""

    def __init__(self, *unused_args, **unused_kwargs):  # pylint: disable=super-init-not-called
        raise TypeError("CPUStandInStrategy is what class-name checks see of the stand-in "
                        "TPUStrategy; create a tf.distribute.TPUStrategy instead.")


class _Extended(mirrored_strategy.MirroredExtended):
    """``MirroredExtended`` over the system's CPU devices, plus what TPU code
    reads of a ``TPUExtended``."""

    def __init__(self, container, system, resolver):
        super().__init__(container, devices=list(system.devices))
        # Read by tf_tpu_emb.TPUEmbedding (one embedding per system).
        self.tf_tpu_emb_system = system
        self._tpu_cluster_resolver = resolver
        self._device_assignment = None   # no model parallelism: one logical device per replica

    def _create_variable(self, next_creator, **kwargs):
        # TPUExtended's rule on a SparseCore system: TF's TPUEmbeddingV2
        # creates each table shard on its own device and asks for no
        # mirroring (``skip_mirrored_creator``); MirroredExtended does not
        # know the argument and would mirror every shard.
        if self.tf_tpu_emb_system.embedding == "v2" and kwargs.pop("skip_mirrored_creator", False):
            return next_creator(**kwargs)
        return super()._create_variable(next_creator, **kwargs)

    def _validate_colocate_with_variable(self, colocate_with_variable):
        # TPUExtended's rule, not MirroredExtended's: any variable created under
        # this strategy -- the TPU embedding's host tables included, whose
        # slots a Keras optimizer colocates with them (TFRS's translated
        # optimizers) -- not only distributed ones.
        distribute_utils.validate_colocate(colocate_with_variable, self)

    def _experimental_distribute_dataset(self, dataset, options):
        _check_global_batch(dataset.element_spec, self._num_replicas_in_sync)
        return super()._experimental_distribute_dataset(dataset, options)

    @property
    def tpu_hardware_feature(self):
        return tpu_hardware_feature.HardwareFeature(self.tf_tpu_emb_system.hardware_feature_proto())

    @property
    def _tpu_devices(self):
        """What TF's ``TPUEmbeddingV2`` reads of a ``TPUExtended`` on a
        SparseCore system (``embedding="v2"``): the devices as a numpy array
        [replicas, cores per replica] -- replica k's one core is
        ``/device:CPU:k``.  Absent (AttributeError) on a V1 system, as it is
        no part of what V1 programs read."""
        system = self.tf_tpu_emb_system
        if system.embedding != "v2":
            raise AttributeError("_tpu_devices")
        devices = np.empty((system.replicas, 1), dtype=object)
        for k, device in enumerate(system.devices):
            devices[k, 0] = device
        return devices

    @property
    def num_hosts(self):
        return 1

    @property
    def num_replicas_per_host(self):
        return self.tf_tpu_emb_system.replicas

    @property
    def steps_per_run(self):
        return 1

    @contextlib.contextmanager
    def experimental_logical_device(self, logical_device_id):
        _check_logical_device(logical_device_id)
        yield


def _check_global_batch(element_spec, replicas):
    """A TPU gives every replica global batch / replicas examples;
    MirroredStrategy, whose input pipeline the stand-in runs, would split an
    indivisible batch unevenly and the replicas would train on different
    batch sizes.  Refuses that with the numbers (the batch dimension of a
    dataset batched with ``drop_remainder=True`` is static)."""
    for spec in tf.nest.flatten(element_spec):
        shape = getattr(spec, "shape", None)
        if shape is None or shape.rank in (None, 0) or shape[0] is None:
            continue
        if shape[0] % replicas:
            raise ValueError(
                "The dataset's global batch of {batch} examples does not divide by the {r} "
                "replicas of the TPU system: a TPU gives every replica the same batch "
                "(global batch / {r}).  Batch the dataset by a multiple of {r} (e.g. {fit}), "
                "or run on a replica count that divides {batch} (python -m tf_tpu_emb.run "
                "--replicas N, tf_tpu_emb.tpu.install(replicas=N)).".format(
                    batch=shape[0], r=replicas,
                    fit=max(replicas, shape[0] // replicas * replicas)))
        return


def _check_logical_device(logical_device_id):
    if logical_device_id != 0:
        raise ValueError(
            "logical device {} requested: the CPU stand-in for the TPU system has one "
            "logical device per replica (no model parallelism; README \"Running TPU "
            "programs unchanged\").".format(logical_device_id))


def _callers_pipelining(fn):
    """``fn``, run with the calling thread's embedding-pipelining switch
    (module doc, "SparseCore systems"); ``fn`` itself where it is on (every
    thread's default)."""
    state = getattr(embedding_context_utils, "embedding_pipelining_state", None)
    if state is None or state.enabled:
        return fn

    @functools.wraps(fn)
    def sequential(*args, **kwargs):
        before = state.enabled
        state.enabled = False
        try:
            return fn(*args, **kwargs)
        finally:
            state.enabled = before
    return sequential


class TPUStrategy(tpu_strategy.TPUStrategyV2, tpu_strategy.TPUStrategy):
    """``tf.distribute.TPUStrategy`` (and ``tf.distribute.experimental.TPUStrategy``)
    of the stand-in: synchronous training over the TPU system's N CPU replicas
    (see module doc)."""

    # Collective keys (see module doc, "Collective keys"): MirroredExtended
    # starts its group keys at 1 + ``_collective_key_base``; each stand-in
    # strategy gets a range of its own, above MirroredStrategy's 0.
    _KEY_BASE_START, _KEY_BASE_STRIDE = 1 << 20, 1 << 10
    _key_bases = itertools.count()

    def __init__(self, tpu_cluster_resolver=None, experimental_device_assignment=None,
                 experimental_spmd_xla_partitioning=False, device_assignment=None):
        # pylint: disable=non-parent-init-called,super-init-not-called
        system = _system()
        if tpu_cluster_resolver is None:
            tpu_cluster_resolver = TPUClusterResolver("")
        assignment = experimental_device_assignment or device_assignment
        if assignment is not None and (assignment.num_replicas != system.replicas
                                       or assignment.num_cores_per_replica != 1):
            raise ValueError(
                "device assignment of {} replica(s) x {} core(s): the CPU stand-in for "
                "the TPU system has {} replica(s) of one core each (no model "
                "parallelism).".format(assignment.num_replicas,
                                       assignment.num_cores_per_replica, system.replicas))
        del experimental_spmd_xla_partitioning
        self._v2_run_functions = {}  # fn -> its tf.function (run, SparseCore systems)
        self._collective_key_base = (self._KEY_BASE_START
                                     + self._KEY_BASE_STRIDE * next(self._key_bases))
        distribute_lib.Strategy.__init__(self, _Extended(self, system, tpu_cluster_resolver))

    @property
    def __class__(self):  # see module doc, "Class-name heuristics"
        return CPUStandInStrategy

    def run(self, fn, args=(), kwargs=None, options=None):
        if self.extended.tf_tpu_emb_system.embedding == "v2" and tf.executing_eagerly():
            # TF's TPUStrategy runs an eager ``run`` as a tf.function (one
            # replicated program per step: tpu_strategy.py
            # ``_tpu_function_creator``); on a SparseCore system the
            # replicas' SparseCore kernels of one step then share its step
            # (kernels/sparsecore/rendezvous.h).  V1 keeps MirroredStrategy's
            # eager run.
            function = self._v2_run_functions.get(fn)
            if function is None:
                def replicated(args, kwargs, options):
                    return distribute_lib.Strategy.run(self, _callers_pipelining(fn), args,
                                                       kwargs, options)
                function = tf.function(replicated, autograph=False)
                self._v2_run_functions[fn] = function
            return function(args, kwargs or {}, options)
        if self.extended.tf_tpu_emb_system.embedding == "v2":
            fn = _callers_pipelining(fn)
        return distribute_lib.Strategy.run(self, fn, args, kwargs, options)

    @property
    def cluster_resolver(self):
        return self.extended._tpu_cluster_resolver  # pylint: disable=protected-access

    def experimental_assign_to_logical_device(self, tensor, logical_device_id):
        _check_logical_device(logical_device_id)
        return tensor

    def experimental_split_to_logical_devices(self, tensor, partition_dimensions):
        if any(d != 1 for d in partition_dimensions):
            _check_logical_device(max(partition_dimensions) - 1)
        return tensor

    def experimental_replicate_to_logical_devices(self, tensor):
        return tensor

    def __deepcopy__(self, memo):
        # distribute_lib's copies through self.__class__ (see above).
        result = object.__new__(type(self))
        memo[id(self)] = result
        for k, v in self.__dict__.items():
            # tf.functions do not copy; a copy traces its own.
            setattr(result, k, {} if k == "_v2_run_functions" else copy.deepcopy(v, memo))
        # pylint: disable-next=protected-access
        result._extended._container_strategy_weakref = weakref.ref(result)
        return result

    def __repr__(self):
        return "<stand-in TPUStrategy: %d CPU replica(s)>" % self.num_replicas_in_sync
