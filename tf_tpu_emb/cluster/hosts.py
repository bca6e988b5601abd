"""The embedding hosts of a cluster, as seen from a client (a trainer).

``EmbeddingHosts`` names the tasks of the embedding job (each one started with
``python -m tf_tpu_emb.server``), gives the device string of host k's replica,
connects this process to the cluster with TensorFlow's own runtime
(``tf.config.experimental_connect_to_cluster``: remote eager execution, this
process becomes job ``localhost``), checks that every host is reachable and
has tf_tpu_emb's kernels, and turns a remote error into one that names the
host and its task address.

Failures and timeouts (what bounds what on TF 2.21, measured on loopback
clusters): a host that is down or dies closes its connections, and TF's
runtime fails the next op sent there at once with ``UnavailableError``;
`translate` names the host.  A host that hangs (stopped process, a machine
that vanished without closing its sockets) is bounded by nothing of TF's:
a remote op then waits forever -- ``operation_timeout_in_ms`` and gRPC
keepalive channel options (``TF_GRPC_DEFAULT_OPTIONS``) do not end it.  So:

* `wait_reachable` / `connect` / `check` wait at most ``timeout_s`` for every
  host, then raise ``UnavailableError`` naming the first one missing;
* `run` runs a step (any callable) under a deadline and raises
  ``DeadlineExceededError`` naming the hosts that did not answer a probe op.

``timeout_s`` is the argument, else ``TF_TPU_EMB_HOST_TIMEOUT_SECONDS``, else
60 s.
"""
import contextlib
import gc
import threading
import os
import re
import socket
import time
from typing import Any, Callable, Iterable, List, Mapping, Optional, Union

import tensorflow as tf

from tf_tpu_emb.cluster import lease

CLIENT_JOB = "localhost"  # the job TF gives the connecting process
TIMEOUT_ENV = "TF_TPU_EMB_HOST_TIMEOUT_SECONDS"
DEFAULT_TIMEOUT_S = 60.0
START_HINT = "start it with `python -m tf_tpu_emb.server`"
# A remote task without our kernels answers NotFound / InvalidArgument with
# one of these (TF's placer and op registry wording).
_NO_KERNEL_MARKERS = ("no registered kernels", "not registered", "Could not find device for node",
                      "No OpKernel was registered", "neither a type of a primitive operation")


def seconds_setting(value: Optional[Union[float, str]], variable: str, default: float,
                    argument: str) -> float:
    """A duration setting: `value` (the `argument`), else the environment
    `variable`, else `default`; ValueError naming its source unless a number
    of seconds > 0."""
    source = argument
    if value is None:
        raw = os.environ.get(variable)
        value, source = (default, "default") if raw in (None, "") else (raw, variable)
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        raise ValueError("%s must be a number of seconds, got %r" % (source, value)) from None
    if not seconds > 0:
        raise ValueError("%s must be > 0, got %r" % (source, value))
    return seconds


def host_timeout_s(timeout_s: Optional[Union[float, str]] = None) -> float:
    """The reachability timeout: the argument, else the environment variable,
    else the default.  Raises ValueError for a value that is not > 0."""
    return seconds_setting(timeout_s, TIMEOUT_ENV, DEFAULT_TIMEOUT_S, "timeout_s")


class EmbeddingHosts:
    """The tasks of one embedding job.

    Pass it as ``cluster=`` to :class:`tf_tpu_emb.TPUEmbedding` or
    :class:`tf_tpu_emb.keras.TPUEmbeddingLayer` to shard their tables over
    these hosts.

    Args:
      cluster_spec: a ``tf.train.ClusterSpec`` (or its dict) holding `job`.
      job: the embedding hosts' job name.
      replicas_per_host: CPU devices (replicas) each host exposes
        (``--replicas`` of the server); None means 1.
      client_address: ``HOST:PORT`` at which the hosts reach this process
        (TF's job ``localhost``; the hosts fetch a step's inputs from it).
        None: ``localhost:<a free port>``, right when every task runs on this
        machine; on several machines give this machine's name and a free port.
      lease_s: how long a host keeps this process's engines without a
        heartbeat (:mod:`tf_tpu_emb.cluster.lease`): a trainer that dies frees
        the hosts after it.  None: ``TF_TPU_EMB_HOST_LEASE_SECONDS``, else 30.
    """

    def __init__(self, cluster_spec: Union[tf.train.ClusterSpec, Mapping[str, Any]],
                 job: str = "embedding", replicas_per_host: Optional[int] = None,
                 client_address: Optional[str] = None,
                 lease_s: Optional[Union[float, str]] = None) -> None:
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
        self._client_address = client_address
        self.lease_s = seconds_setting(lease_s, lease.LEASE_ENV, lease.DEFAULT_LEASE_S, "lease_s")
        # Bumped by every (re)connect: engines configured before a reconnect
        # are reconfigured by the next restore (ShardedEngine.stale).
        self.generation = 0
        # Held while the lease heartbeat runs an op, and by (re)connects and
        # disconnects, which change TF's remote context under it.
        self.context_lock = threading.RLock()
        self.leases = lease.Heartbeat(self)

    @staticmethod
    @contextlib.contextmanager
    def synchronous():
        """A context in which this thread's eager ops run synchronously (a
        fresh executor of its own): a remote op's error is raised by the op
        itself and poisons no other op.  TF runs remote ops without outputs
        asynchronously by default, where an error surfaces at some later op
        and clearing it (``async_clear_error``) waits for every pending remote
        node -- for ever when a host is dead."""
        from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
        from tensorflow.python.eager import executor  # pylint: disable=import-outside-toplevel

        own = executor.new_executor(enable_async=False, enable_streaming_enqueue=False)
        try:
            with context.executor_scope(own):
                yield
        finally:
            own.clear_error()  # else its finalizer re-raises the op's error

    @contextlib.contextmanager
    def _changing_context(self):
        """Holds `context_lock` (at most a lease period: a heartbeat blocked
        on a hung host must not block the recovery that frees it)."""
        held = self.context_lock.acquire(timeout=self.lease_s)
        try:
            yield
        finally:
            if held:
                self.context_lock.release()

    @property
    def num_hosts(self):
        return len(self.addresses)

    def _index(self, k):
        if not 0 <= int(k) < self.num_hosts:
            raise ValueError("host %r out of range: the cluster has %d embedding hosts"
                             % (k, self.num_hosts))
        return int(k)

    def task(self, k: int) -> str:
        """'/job:embedding/replica:0/task:k' of host k."""
        return "/job:%s/replica:0/task:%d" % (self.job, self._index(k))

    def device(self, k: int, replica: int = 0) -> str:
        """The TF device of host k's `replica` (its CPU:<replica>)."""
        if not 0 <= int(replica) < self.replicas_per_host:
            raise ValueError("replica %r out of range: each host has %d replicas"
                             % (replica, self.replicas_per_host))
        return "%s/device:CPU:%d" % (self.task(k), int(replica))

    def describe(self, k: int) -> str:
        """'embedding host k (/job:embedding/replica:0/task:k at HOST:PORT)'."""
        return "embedding host %d (%s at %s)" % (k, self.task(k), self.addresses[self._index(k)])

    # ------------------------------------------------------------------ health
    def _unreachable(self, k, why):
        return tf.errors.UnavailableError(
            None, None, "%s is unreachable: %s; is the host running? %s with "
            "`--job %s --task %d`" % (self.describe(k), why, START_HINT.capitalize(), self.job, k))

    def wait_reachable(self, timeout_s: Optional[Union[float, str]] = None,
                       hosts: Optional[Iterable[int]] = None) -> None:
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

    def check(self, timeout_s: Optional[Union[float, str]] = None) -> None:
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

    def connect(self, timeout_s: Optional[Union[float, str]] = None) -> None:
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
        if self._client_address is None:
            # This process's own task.  Named here (not picked anew by TF on
            # every connect) so that a reconnect keeps the address the hosts
            # already know this process by.
            with socket.socket() as sock:
                sock.bind(("localhost", 0))
                self._client_address = "localhost:%d" % sock.getsockname()[1]
        spec = dict(self.cluster_spec.as_dict())
        spec[CLIENT_JOB] = [self._client_address]
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec), rpc_layer="grpc")
        with self._changing_context():
            # Functions that are garbage but not yet collected (a tf.function
            # in a reference cycle) would be collected later, and TF would then
            # ask the new hosts to remove a function it never registered there:
            # "Tried to remove non-existent function" on the next host op
            # (CI, stop 37).  Collected now, they go before the hosts see them.
            gc.collect()
            try:
                tf.config.experimental_connect_to_cluster(resolver, job_name=CLIENT_JOB,
                                                          make_master_device_default=False)
            except tf.errors.OpError as e:
                raise self.translate(e) from None
            self._connected_spec = self.cluster_spec.as_dict()
            self.generation += 1
            self.check(timeout_s)

    @property
    def connected(self):
        """Whether `connect` has connected this process to these hosts."""
        return self._connected_spec is not None

    def forget_connection(self):
        """Marks this object unconnected (after TF's context was reset)."""
        self._connected_spec = None

    def disconnect(self):
        """After the hosts were stopped: gives this process a fresh,
        local-only eager context (the connected one still lists the hosts'
        devices, and TF functions that look at every device, such as
        checkpoint saving, would wait on the stopped tasks).  No-op when not
        connected."""
        if self.connected:
            from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel
            with self._changing_context():
                # The heartbeat's threads belong to the old context: end them.
                self.leases.stop()
                self.leases = lease.Heartbeat(self)
                context._reset_context()  # pylint: disable=protected-access
            self.forget_connection()

    def reconnect(self, timeout_s: Optional[Union[float, str]] = None) -> None:
        """Connects again (a new remote context on every host): after a host
        was restarted its old context is gone and every op sent there fails.
        Then sends a tensor over every pair of tasks until that succeeds
        (gRPC channels to the restarted host fail fast once before they
        reconnect; a training step must not be the one that finds out)."""
        with self._changing_context():
            self._connected_spec = None
            self.connect(timeout_s)
            self._warm_channels(host_timeout_s(timeout_s))

    def _warm_channels(self, timeout):
        tasks = ["/job:localhost/replica:0/task:0/device:CPU:0"] + [
            self.device(k) for k in range(self.num_hosts)]

        @tf.function
        def exchange(x):
            total = []
            for a in tasks:
                with tf.device(a):
                    y = x + 1.0
                for b in tasks:
                    with tf.device(b):
                        total.append(y * 1.0)
            return tf.add_n(total)

        deadline = time.monotonic() + timeout
        while True:
            try:
                exchange(tf.constant(0.0)).numpy()
                return
            except tf.errors.UnavailableError as e:
                if time.monotonic() >= deadline:
                    raise self.translate(e, (self.unreachable() or [None])[0]) from None
                time.sleep(0.2)

    def _answering(self, timeout_s):
        """Indices of the hosts that answer a probe op within `timeout_s` (the
        probes run in threads; a hung host leaves its thread blocked)."""
        from tf_tpu_emb import ops

        answered = [False] * self.num_hosts

        def probe(k):
            try:
                with tf.device(self.device(k)):
                    ops.is_tpu_embedding_initialized().numpy()
                answered[k] = True
            except tf.errors.OpError:
                pass

        threads = [threading.Thread(target=probe, args=(k,), daemon=True)
                   for k in range(self.num_hosts)]
        for t in threads:
            t.start()
        deadline = time.monotonic() + timeout_s
        for t in threads:
            t.join(max(0.0, deadline - time.monotonic()))
        return [k for k in range(self.num_hosts) if answered[k]]

    def run(self, fn: Callable[..., Any], *args: Any,
            timeout_s: Optional[Union[float, str]] = None, **kwargs: Any) -> Any:
        """``fn(*args, **kwargs)`` (a training step that uses the hosts) under a
        deadline of `timeout_s` (see `host_timeout_s`); returns its result.

        A remote error comes back translated (naming its host when the message
        names a task or address).  When the deadline passes, the hosts are
        probed and ``DeadlineExceededError`` names those that did not answer;
        the step is abandoned (its thread stays blocked until the host's
        connection closes) and the hosts' engines must be restored from the
        last checkpoint after the host is restarted and `reconnect` ed.  An
        abandoned step that had not started `fn` yet (it was asking a hung
        host for its step count) never starts it: it cannot apply a stale
        step to the hosts after they were restored.

        A step that fails leaves no doubt about what it changed: the error
        also says, per host, whether it applied the step(s) -- the step count
        of this process's engines before and after (`step_counts`) -- or
        could not be asked.  Restoring the last checkpoint (after restarting
        and reconnecting a host that died) makes every host consistent again."""
        timeout = host_timeout_s(timeout_s)
        result = {}
        state = {"abandoned": False, "started": False}
        lock = threading.Lock()

        def target():
            try:
                result["before"] = self.step_counts()
                with lock:
                    if state["abandoned"]:
                        # The deadline passed while a hung host was asked for
                        # its step count: the caller was told the step failed
                        # and will restore the hosts; starting it now could
                        # write a stale step into the restored tables.
                        return
                    state["started"] = True
                result["value"] = fn(*args, **kwargs)
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                result["error"] = e

        thread = threading.Thread(target=target, daemon=True, name="tf_tpu_emb-step")
        thread.start()
        thread.join(timeout)
        with lock:
            state["abandoned"] = thread.is_alive()
        if state["abandoned"]:
            raise self._deadline_error(
                "the step did not finish" if state["started"] else
                "the step did not finish (nor start: it never will, nothing was sent)", timeout,
                                       "the timeout_s argument or " + TIMEOUT_ENV)
        if "error" in result:
            error, k = result["error"], None
            if isinstance(error, tf.errors.UnavailableError):
                dead = self.unreachable()
                k = dead[0] if dead else None
            error = self.translate(error, k)
            if isinstance(error, tf.errors.OpError) and result.get("before"):
                error = type(error)(error.node_def, error.op, error.message + self._applied_report(
                    result["before"], self.step_counts()))
            raise error from None
        return result["value"]

    def step_counts(self):
        """``{engine: [steps applied on host k, or None when host k cannot be
        asked or has lost the engine]}`` for the engines whose leases this
        process holds (asking renews them)."""
        from tf_tpu_emb import ops  # pylint: disable=import-outside-toplevel

        counts = {}
        for engine in self.leases.engines():
            row = []
            for k in range(self.num_hosts):
                try:  # the lease op never fails on the host (no tainted executor)
                    with tf.device(self.device(k)):
                        count = int(ops.renew_tpu_embedding_lease(engine=engine)[1].numpy())
                    row.append(count if count >= 0 else None)
                except tf.errors.OpError:
                    row.append(None)
            counts[engine] = row
        return counts

    def _applied_report(self, before, after):
        """What a failed step changed on each host, from the step counts."""
        parts = []
        for engine, old in sorted(before.items()):
            new = after.get(engine, [None] * self.num_hosts)
            applied = [k for k in range(self.num_hosts)
                       if None not in (old[k], new[k]) and new[k] > old[k]]
            untouched = [k for k in range(self.num_hosts)
                         if None not in (old[k], new[k]) and new[k] == old[k]]
            unknown = [k for k in range(self.num_hosts) if None in (old[k], new[k])]
            name = lambda ks: ", ".join("host %d" % k for k in ks) or "none"  # noqa: E731
            parts.append("engine '%s': applied on %s%s; not applied on %s; unknown (host "
                         "unreachable, its shard is lost) on %s" % (
                             engine, name(applied),
                             "" if not applied else " (step count %s)" % ", ".join(
                                 "%d -> %d" % (old[k], new[k]) for k in applied),
                             name(untouched), name(unknown)))
        return (". What the failed step changed, per host: " + "; ".join(parts) +
                ". To make every host consistent: restart a host that died, "
                "hosts.reconnect(), then restore the last checkpoint (every host is "
                "configured again and loaded)")

    # ------------------------------------------------------------------ errors
    @contextlib.contextmanager
    def translating(self):
        """A context in which a remote error (tf.errors.OpError) is raised as
        `translate` makes it: naming its host (steps run eagerly, outside
        `run`)."""
        from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel

        late = None
        try:
            yield
            if tf.executing_eagerly():
                late = self._sync_remote()  # remote eager ops report their errors late
        except tf.errors.OpError as e:
            context.context().executor.clear_error()  # this thread's, without waiting
            k = None
            if isinstance(e, tf.errors.UnavailableError):
                dead = self.unreachable()
                k = dead[0] if dead else None
            raise self.translate(e, k) from None
        if late is not None:
            # Not through the executor: touching it (even clear_error) waits
            # for the ops still pending on the hung host.
            raise late

    def _deadline_error(self, what, timeout, source):
        """DeadlineExceededError: `what` within `timeout` s (set by `source`),
        naming the hosts that do not answer a probe op."""
        silent = sorted(set(range(self.num_hosts)) - set(self._answering(min(timeout, 5.0))))
        who = ("; ".join(self.describe(k) for k in silent) + " did not answer"
               if silent else "every host answers a probe")
        return tf.errors.DeadlineExceededError(
            None, None, "%s within %.3g s (%s): %s. Restart the host, reconnect and restore "
            "the last checkpoint." % (what, timeout, source, who))

    def _sync_remote(self):
        """``context.async_wait()`` (every executor here and on the hosts: the
        only way an output-less remote op's error comes back), bounded by
        `host_timeout_s`: TF's wait has no deadline and can block for ever on
        a host that died at the wrong moment, so it runs in a helper thread.
        Raises the hosts' error, or UnavailableError naming a host that
        refuses connections; returns a DeadlineExceededError naming the hosts
        that do not answer once the timeout passes (for the caller to raise
        without touching its executor; the helper stays blocked, as an
        abandoned `run` step does), else None."""
        from tensorflow.python.eager import context  # pylint: disable=import-outside-toplevel

        box, done = {}, threading.Event()

        def target():
            try:
                context.async_wait()
            except BaseException as e:  # noqa: BLE001 - re-raised in the caller
                box["error"] = e
            finally:
                done.set()

        threading.Thread(target=target, daemon=True, name="tf_tpu_emb-sync").start()
        timeout = host_timeout_s()
        deadline = time.monotonic() + timeout
        # A host that died refuses connections: say so at once rather than
        # at the deadline (TF's wait may never learn it).
        while not done.wait(min(1.0, max(0.0, deadline - time.monotonic()))):
            dead = self.unreachable(timeout_s=0.5)
            if dead:
                raise tf.errors.UnavailableError(
                    None, None, "%s: cannot be reached (it refuses connections); the step's "
                    "operations on it did not complete. Restart the host, hosts.reconnect() "
                    "and restore the last checkpoint." % self.describe(dead[0]))
            if time.monotonic() >= deadline:
                break
        if not done.is_set():
            return self._deadline_error("the hosts did not confirm this step's operations",
                                        timeout, TIMEOUT_ENV)
        if "error" in box:
            raise box["error"]
        return None

    def host_of(self, error: BaseException) -> Optional[int]:
        """The host an error is about, or None: the first host whose address the
        message names (gRPC names the address it failed to reach), else the
        first embedding task it names (relaying tasks name themselves too, so
        the address wins)."""
        text = str(getattr(error, "message", "") or error)
        found = [(text.find(a), k) for k, a in enumerate(self.addresses) if a in text]
        if found:
            return min(found)[1]
        m = re.search(r"/job:%s/replica:\d+/task:(\d+)" % re.escape(self.job), text)
        if m and int(m.group(1)) < self.num_hosts:
            return int(m.group(1))
        return None

    def unreachable(self, timeout_s: float = 1.0) -> List[int]:
        """Indices of the hosts that refuse or do not accept a TCP connection
        within `timeout_s` each (a dead host)."""
        out = []
        for k, address in enumerate(self.addresses):
            host, _, port = address.rpartition(":")
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s).close()
            except OSError:
                out.append(k)
        return out

    def translate(self, error: BaseException, k: Optional[int] = None) -> BaseException:
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
