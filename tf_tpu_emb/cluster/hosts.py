"""The embedding hosts of a cluster, as seen from a client (a trainer).

``EmbeddingHosts`` names the tasks of the embedding job (each one started with
``python -m tf_tpu_emb.server``), gives the device string of host k's replica,
connects this process to the cluster with TensorFlow's own runtime
(``tf.config.experimental_connect_to_cluster``: remote eager execution, this
process becomes job ``localhost``), checks that every host is reachable and
has tf_tpu_emb's kernels, and turns a remote error into one that names the
host and its task address.

Timeouts: a reachability check waits at most ``timeout_s`` seconds per host
(argument, else ``TF_TPU_EMB_HOST_TIMEOUT_SECONDS``, else 10 s) before raising
``tf.errors.UnavailableError`` naming the host.
"""
import os
import re
import socket
import time

import tensorflow as tf

TIMEOUT_ENV = "TF_TPU_EMB_HOST_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT_S = 10.0
START_HINT = "start it with `python -m tf_tpu_emb.server`"
# A remote task without our kernels answers NotFound / InvalidArgument with
# one of these (TF's placer and op registry wording).
_NO_KERNEL_MARKERS = ("no registered kernels", "not registered", "Could not find device for node",
                      "No OpKernel was registered", "neither a type of a primitive operation")


def host_timeout_s(timeout_s=None):
    """The reachability timeout: the argument, else the environment variable,
    else the default.  Raises ValueError for a value that is not > 0."""
    if timeout_s is None:
        raw = os.environ.get(TIMEOUT_ENV)
        timeout_s = DEFAULT_TIMEOUT_S if raw in (None, "") else raw
        source = TIMEOUT_ENV if raw not in (None, "") else "default"
    else:
        source = "timeout_s"
    try:
        value = float(timeout_s)
    except (TypeError, ValueError):
        raise ValueError("%s must be a number of seconds, got %r" % (source, timeout_s)) from None
    if not value > 0:
        raise ValueError("%s must be > 0, got %r" % (source, timeout_s))
    return value


class EmbeddingHosts:
    """The tasks of one embedding job.

    Args:
      cluster_spec: a ``tf.train.ClusterSpec`` (or its dict) holding `job`.
      job: the embedding hosts' job name.
      replicas_per_host: CPU devices (replicas) each host exposes
        (``--replicas`` of the server); None means 1.
    """

    def __init__(self, cluster_spec, job="embedding", replicas_per_host=None):
        if not isinstance(cluster_spec, tf.train.ClusterSpec):
            cluster_spec = tf.train.ClusterSpec(cluster_spec)
        if job not in cluster_spec.jobs:
            raise ValueError("job %r is not in the cluster spec (jobs: %s)"
                             % (job, sorted(cluster_spec.jobs)))
        indices = cluster_spec.task_indices(job)
        if indices != list(range(len(indices))) or not indices:
            raise ValueError("job %r must have tasks 0..S-1, has %s" % (job, indices))
        replicas = 1 if replicas_per_host is None else int(replicas_per_host)
        if replicas < 1:
            raise ValueError("replicas_per_host must be >= 1, got %r" % replicas_per_host)
        self.cluster_spec = cluster_spec
        self.job = job
        self.replicas_per_host = replicas
        self.addresses = [cluster_spec.task_address(job, k) for k in indices]
        self._connected_spec = None

    @property
    def num_hosts(self):
        return len(self.addresses)

    def _index(self, k):
        if not 0 <= int(k) < self.num_hosts:
            raise ValueError("host %r out of range: the cluster has %d embedding hosts"
                             % (k, self.num_hosts))
        return int(k)

    def task(self, k):
        """'/job:embedding/replica:0/task:k' of host k."""
        return "/job:%s/replica:0/task:%d" % (self.job, self._index(k))

    def device(self, k, replica=0):
        """The TF device of host k's `replica` (its CPU:<replica>)."""
        if not 0 <= int(replica) < self.replicas_per_host:
            raise ValueError("replica %r out of range: each host has %d replicas"
                             % (replica, self.replicas_per_host))
        return "%s/device:CPU:%d" % (self.task(k), int(replica))

    def describe(self, k):
        """'embedding host k (/job:embedding/replica:0/task:k at HOST:PORT)'."""
        return "embedding host %d (%s at %s)" % (k, self.task(k), self.addresses[self._index(k)])

    # ------------------------------------------------------------------ health
    def _unreachable(self, k, why):
        return tf.errors.UnavailableError(
            None, None, "%s is unreachable: %s; is the host running? %s with "
            "`--job %s --task %d`" % (self.describe(k), why, START_HINT.capitalize(), self.job, k))

    def wait_reachable(self, timeout_s=None, hosts=None):
        """Waits until every host (or those in `hosts`) accepts a TCP connection,
        at most `timeout_s` in all (see `host_timeout_s`); raises
        UnavailableError naming the first host still unreachable."""
        timeout = host_timeout_s(timeout_s)
        deadline = time.monotonic() + timeout
        for k in range(self.num_hosts) if hosts is None else hosts:
            host, _, port = self.addresses[self._index(k)].rpartition(":")
            while True:
                left = deadline - time.monotonic()
                try:
                    with socket.create_connection((host.strip("[]"), int(port)),
                                                  timeout=max(0.05, min(left, 1.0))):
                        break
                except OSError as e:
                    if time.monotonic() >= deadline:
                        raise self._unreachable(
                            k, "no connection within %.3g s (%s)" % (timeout, e)) from None
                    time.sleep(min(0.1, max(0.0, deadline - time.monotonic())))

    def check(self, timeout_s=None):
        """Raises UnavailableError naming a host that cannot be reached within
        `timeout_s`; once connected, also runs one op of ours on every host and
        raises FailedPreconditionError naming a host without tf_tpu_emb's
        kernels (one not started with ``python -m tf_tpu_emb.server``)."""
        self.wait_reachable(timeout_s)
        if self._connected_spec is None:
            return
        from tf_tpu_emb import ops
        from tensorflow.python.eager import context

        for k in range(self.num_hosts):
            try:
                with tf.device(self.device(k)):
                    ops.is_tpu_embedding_initialized().numpy()
                context.async_wait()
            except tf.errors.OpError as e:
                context.async_clear_error()
                raise self.translate(e, k) from None

    def connect(self, timeout_s=None):
        """Connects this process to the cluster (remote eager execution, this
        process as job 'localhost'; the default device stays local) after
        checking every host is reachable.  Idempotent: a second call with the
        same cluster does nothing; `reconnect` starts afresh after a host was
        restarted."""
        if self._connected_spec == self.cluster_spec.as_dict():
            return
        self.wait_reachable(timeout_s)
        import tf_tpu_emb

        tf_tpu_emb.load_library()  # op definitions (and local kernels) on the client
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            self.cluster_spec, rpc_layer="grpc")
        try:
            tf.config.experimental_connect_to_cluster(resolver, make_master_device_default=False)
        except tf.errors.OpError as e:
            raise self.translate(e) from None
        self._connected_spec = self.cluster_spec.as_dict()
        self.check(timeout_s)

    def reconnect(self, timeout_s=None):
        """Connects again (a new remote context on every host): after a host
        was restarted its old context is gone and every op sent there fails."""
        self._connected_spec = None
        self.connect(timeout_s)

    # ------------------------------------------------------------------ errors
    def host_of(self, error):
        """The host index an error message names (by task or address), or None."""
        text = str(getattr(error, "message", "") or error)
        m = re.search(r"/job:%s/replica:\d+/task:(\d+)" % re.escape(self.job), text)
        if m and int(m.group(1)) < self.num_hosts:
            return int(m.group(1))
        for k, address in enumerate(self.addresses):
            if address in text:
                return k
        return None

    def translate(self, error, k=None):
        """`error` (a tf.errors.OpError from an op run on host k) as an error of
        the same class whose message starts with the host and its task address.
        A host without tf_tpu_emb's kernels gives FailedPreconditionError with
        the advice to start it with ``python -m tf_tpu_emb.server``.  When `k` is
        None the host is taken from the message (task or address); errors that
        name no host are returned unchanged."""
        if not isinstance(error, tf.errors.OpError):
            return error
        if k is None:
            k = self.host_of(error)
            if k is None:
                return error
        message = error.message
        if any(marker in message for marker in _NO_KERNEL_MARKERS):
            return tf.errors.FailedPreconditionError(
                error.node_def, error.op,
                "%s has no tf_tpu_emb kernels: %s there (it loads the op library before "
                "serving). Original error: %s" % (self.describe(k), START_HINT, message))
        prefix = self.describe(k) + ": "
        if message.startswith(prefix):
            return error
        return type(error)(error.node_def, error.op, prefix + message)

    def __repr__(self):
        return "EmbeddingHosts(job=%r, hosts=%r, replicas_per_host=%d)" % (
            self.job, self.addresses, self.replicas_per_host)
