"""The CPU stand-in's TPU system: its replicas and the rules TF's TPU system keeps.

One process has at most one stand-in TPU system (:func:`current`), installed
by :func:`tf_tpu_emb.tpu.install`.  It has ``replicas`` TPU cores, each a
logical CPU device (``/device:CPU:k`` is core k), and one embedding engine:
the process's default engine ``""`` -- the one TF's core-named ops address,
as on a TPU host the raw TPU-embedding ops address the TPU's embedding.  The
rules of a TPU system that programs rely on (docs/tpu_embedding_semantics.md
§ "initialisation"):

* **one TPU embedding per TPU system**: a second ``TPUEmbedding.build`` while
  another object holds the system's embedding raises TF's
  ``RuntimeError("TPU is already initialized for embeddings.")``;
* **``initialize_tpu_system`` resets the embedding**: the engine is shut down
  (the object that built it stays built, as TF's does), and the next object's
  build and load is what every older object then retrieves from -- the table
  state lives in the TPU system, not in the Python objects (TF's checkpoint
  test ``test_checkpoint_save_retrieves``).

``tf_tpu_emb.TPUEmbedding`` reaches the system through the strategy it was
created under (``strategy.extended.tf_tpu_emb_system``), so this module
imports nothing of the mid-level API.

Embedding generations.  ``embedding="v1"`` (the default) is the
TensorCore-attached TPU embedding (feature V1, one embedding device per
chip) that ``tf.tpu.experimental.embedding.TPUEmbedding`` drives.
``embedding="v2"`` is a SparseCore TPU (feature V2,
:data:`SPARSECORES_PER_CHIP` SparseCores per chip) that TF's own
``TPUEmbeddingV2`` drives (:mod:`tf_tpu_emb.tpu.embedding_v2`); the system
then tells the op library's SparseCore kernels its chips
(``TfTpuEmbSetSparseCoreSystem``, engine/interrupts_and_c_api.cc), as a TPU's
kernels read the TPU topology (docs/sparsecore_semantics.md "Multi-chip").
"""
import ctypes
import threading

from tensorflow.core.protobuf.tpu import topology_pb2

from tf_tpu_emb import chips
from tf_tpu_emb import engine_registry
from tf_tpu_emb import ops

__all__ = ["TPUSystem", "current", "ALREADY_INITIALIZED", "EMBEDDINGS", "SPARSECORES_PER_CHIP"]

# The embedding generations a stand-in system can be (module doc).
EMBEDDINGS = ("v1", "v2")
# SparseCores per chip of the stand-in SparseCore TPU (one place for both
# stand-ins: tf_tpu_emb/chips.py).
SPARSECORES_PER_CHIP = chips.SPARSECORES_PER_CHIP

# TF's text (tensorflow/python/tpu/tpu_embedding_v2.py, build on a TPU system
# whose embedding is configured).
ALREADY_INITIALIZED = "TPU is already initialized for embeddings."

_lock = threading.Lock()
_current = None


def current():
    """The installed stand-in TPU system, or None."""
    return _current


def _set_current(system):
    global _current
    with _lock:
        _current = system


class TPUSystem:
    """The stand-in TPU system of this process (see module doc)."""

    engine = ""  # the default engine: the TPU system's embedding

    def __init__(self, replicas, embedding="v1"):
        if not isinstance(replicas, int) or isinstance(replicas, bool) or replicas < 1:
            raise ValueError("replicas must be a positive int, got %r" % (replicas,))
        if embedding not in EMBEDDINGS:
            raise ValueError("embedding must be one of %s, got %r" % (EMBEDDINGS, embedding))
        self.replicas = replicas
        self.embedding = embedding
        self.devices = tuple("/job:localhost/replica:0/task:0/device:CPU:%d" % k
                             for k in range(replicas))
        self.initialized = False
        self.embeddings_built = 0  # TPU embeddings configured on this system (for reports)

    # ---------------------------------------------------------- what TPU code reads

    def hardware_feature_proto(self):
        """``TPUHardwareFeature``: embedding feature V1 (the TensorCore-attached
        TPU embedding that ``tf.tpu.experimental.embedding.TPUEmbedding``
        drives), one embedding device per chip; or, for ``embedding="v2"``,
        feature V2 with :data:`SPARSECORES_PER_CHIP` SparseCores per chip."""
        if self.embedding == "v2":
            return topology_pb2.TPUHardwareFeature(
                embedding_feature=topology_pb2.TPUHardwareFeature.V2,
                num_embedding_devices_per_chip=SPARSECORES_PER_CHIP)
        return topology_pb2.TPUHardwareFeature(
            embedding_feature=topology_pb2.TPUHardwareFeature.V1,
            num_embedding_devices_per_chip=1)

    @property
    def sparsecores_per_chip(self):
        """SparseCores per chip: :data:`SPARSECORES_PER_CHIP` on a V2 system, else 0."""
        return SPARSECORES_PER_CHIP if self.embedding == "v2" else 0

    def publish_chips(self, installed=True):
        """Tells the op library's SparseCore kernels this system's chips (a
        V2 system; ``installed=False``: none).  Every call starts the
        kernels' per-call meeting counts afresh."""
        if self.embedding != "v2":
            return
        _set_sparsecore_system(self.replicas if installed else 0,
                               self.sparsecores_per_chip if installed else 0)

    def topology_proto(self):
        """One task with ``replicas`` cores on one chip row (mesh [1, 1, 1, N])."""
        proto = topology_pb2.TopologyProto(
            mesh_shape=[1, 1, 1, self.replicas], num_tasks=1,
            num_tpu_devices_per_task=self.replicas,
            tpu_hardware_feature=self.hardware_feature_proto())
        for k in range(self.replicas):
            proto.device_coordinates.extend([0, 0, 0, k])
        return proto

    # ------------------------------------------------------------------ lifecycle

    def initialize(self):
        """``initialize_tpu_system``: the embedding (if any) is shut down
        (and, on a V2 system, the SparseCore kernels' meetings start afresh)."""
        self._reset_embedding()
        self.publish_chips()
        self.initialized = True

    def shutdown(self):
        """``shutdown_tpu_system``."""
        self._reset_embedding()
        self.initialized = False

    def _reset_embedding(self):
        for owner in engine_registry.owners():
            if engine_registry.engine_of(owner) == self.engine:
                engine_registry.release(owner)
        if bool(ops.is_tpu_embedding_initialized(engine=self.engine)):
            ops.shutdown_tpu_embedding(engine=self.engine)  # configured by raw ops

    def embedding_engine(self):
        """The engine a ``TPUEmbedding`` being built configures: the system's
        one embedding.  Raises TF's RuntimeError when it is taken."""
        if (self.engine in engine_registry.engines()
                or bool(ops.is_tpu_embedding_initialized(engine=self.engine))):
            raise RuntimeError(ALREADY_INITIALIZED)
        self.embeddings_built += 1
        return self.engine


def _set_sparsecore_system(replicas, sparsecores_per_chip):
    from tf_tpu_emb import _loader  # pylint: disable=import-outside-toplevel
    _loader.load_library()  # TF loads it first (its op and kernel registrations)
    lib = ctypes.CDLL(_loader.library_path())  # the same loaded image
    lib.TfTpuEmbSetSparseCoreSystem.argtypes = [ctypes.c_int64, ctypes.c_int64]
    lib.TfTpuEmbSetSparseCoreSystem.restype = ctypes.c_int
    if lib.TfTpuEmbSetSparseCoreSystem(replicas, sparsecores_per_chip) != 0:
        raise ValueError("a SparseCore TPU system of %d chip(s) x %d SparseCore(s) is out of "
                         "range" % (replicas, sparsecores_per_chip))
