"""Loopback clusters of embedding hosts for tests.

``LoopbackCluster(num_hosts)`` starts `num_hosts` ``python -m tf_tpu_emb.server``
children (job "embedding", tasks 0..S-1) on free 127.0.0.1 ports through
``harness.start_python``, waits for each one's readiness line and ends them all
(SIGTERM, then SIGKILL) when the ``with`` block exits.  Every server also exits
by itself after `lifetime_s` seconds and when this process dies
(``--exit-with-parent``), so a crashed test session leaves nothing running.
The default lifetime (20 minutes) outlasts a module's tests in the slowest
lane (the sanitizer build, several times slower than the plain one): a module
shares one cluster, and a host that ends its own life mid-module fails the
module's later tests with "Socket closed".

A host started with ``load_library=False`` is a plain ``tf.distribute.Server``
(``plain_tf_server.py``): a task without tf_tpu_emb's kernels.
"""
import contextlib
import json
import queue
import signal
import subprocess
import threading
import time

import harness
from tf_tpu_emb.cluster.local import STOP_TIMEOUT_S, free_port, free_ports  # noqa: F401 (re-exported)
from tf_tpu_emb.server import READY_PREFIX

START_TIMEOUT_S = 120  # TensorFlow's import on two busy cores


class _Host:
    """One server child and the lines it printed (read by a thread so that its
    pipe never fills)."""

    def __init__(self, args):
        self.proc = harness.start_python(args)
        self.lines = []
        self._queue = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            self.lines.append(line)
            self._queue.put(line)
        self._queue.put(None)

    def wait_ready(self, timeout_s):
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                line = self._queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError("no readiness line within %ss; output:\n%s"
                                   % (timeout_s, self.output())) from None
            if line is None:
                self.proc.wait()
                raise RuntimeError("server exited with %s before it was ready; output:\n%s"
                                   % (self.proc.returncode, self.output()))
            if line.startswith(READY_PREFIX):
                return line.strip()

    def output(self):
        return "".join(self.lines)[-4000:]

    def stop(self, sig=signal.SIGTERM):
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


class LoopbackCluster:
    """`num_hosts` embedding hosts on 127.0.0.1 (a context manager).

    Attributes: ``cluster_spec`` (tf.train.ClusterSpec of job "embedding"; the
    test process connects as TF's job "localhost" and needs no entry),
    ``hosts`` (an ``EmbeddingHosts``), ``procs`` (the Popen of each host),
    ``ready_lines``; ``kill(k)`` SIGKILLs host k, ``restart(k)`` starts it again on
    the same port.  `load_library` is a bool or one bool per host.
    """

    def __init__(self, num_hosts, replicas_per_host=1, lifetime_s=1200, load_library=True):
        if isinstance(load_library, bool):
            load_library = [load_library] * num_hosts
        if len(load_library) != num_hosts:
            raise ValueError("load_library needs one entry per host")
        self.num_hosts = num_hosts
        self.replicas_per_host = replicas_per_host
        self.lifetime_s = lifetime_s
        self.load_library = list(load_library)
        self._hosts = [None] * num_hosts
        self.ready_lines = [None] * num_hosts
        self._choose_addresses()

    def _choose_addresses(self):
        import tensorflow as tf
        from tf_tpu_emb.cluster import EmbeddingHosts

        self.addresses = ["127.0.0.1:%d" % p for p in free_ports(self.num_hosts)]
        self.cluster_spec = tf.train.ClusterSpec({"embedding": list(self.addresses)})
        self.hosts = EmbeddingHosts(self.cluster_spec, replicas_per_host=self.replicas_per_host)

    def _args(self, k):
        cluster = json.dumps({"embedding": self.addresses})
        if self.load_library[k]:
            return ["-m", "tf_tpu_emb.server", "--cluster", cluster, "--job", "embedding",
                    "--task", str(k), "--replicas", str(self.replicas_per_host),
                    "--lifetime-seconds", str(self.lifetime_s), "--exit-with-parent"]
        return [harness.common_script("plain_tf_server.py"), cluster, str(k),
                str(self.replicas_per_host), str(self.lifetime_s)]

    @property
    def procs(self):
        return [h.proc if h else None for h in self._hosts]

    def output(self, k):
        """What host k printed so far (its last 4000 characters)."""
        return self._hosts[k].output()

    def start(self, hosts=None):
        started = []
        for k in range(self.num_hosts) if hosts is None else hosts:
            self._hosts[k] = _Host(self._args(k))
            started.append(k)
        for k in started:
            self.ready_lines[k] = self._hosts[k].wait_ready(START_TIMEOUT_S)
        return self

    def __enter__(self):
        # A free port can be taken between free_ports and the host's bind (an
        # outgoing connection's ephemeral port, seen once in CI: "Could not
        # start gRPC server"): then every host starts again on new ports.
        for attempt in range(3):
            try:
                return self.start()
            except RuntimeError as e:
                self.close()
                if "Could not start gRPC server" not in str(e) or attempt == 2:
                    raise
                self._hosts = [None] * self.num_hosts
                self._choose_addresses()
            except BaseException:
                self.close()
                raise
        raise AssertionError("unreachable")

    def kill(self, k):
        """SIGKILL host k and reap it (a machine that died)."""
        return self._hosts[k].stop(signal.SIGKILL)

    def terminate(self, k):
        """SIGTERM host k and reap it; returns its exit status."""
        return self._hosts[k].stop(signal.SIGTERM)

    def restart(self, k):
        """Host k again, on the same address (killed first if still running)."""
        if self._hosts[k] is not None:
            self.kill(k)
        self.start([k])

    def close(self):
        for h in self._hosts:
            if h is not None:
                h.stop()
        # Later tests in this session get a fresh, local-only context.
        self.hosts.disconnect()

    def __exit__(self, *exc):
        self.close()
        return False


@contextlib.contextmanager
def connected_hosts(num_hosts, replicas_per_host=1):
    """A module fixture's body: a LoopbackCluster this process is connected
    to, with the library loaded here; yields its ``EmbeddingHosts``.  On exit
    the hosts stop and this process is back to a local-only eager context
    (``close``)."""
    import tf_tpu_emb  # pylint: disable=import-outside-toplevel
    with LoopbackCluster(num_hosts, replicas_per_host=replicas_per_host) as cluster:
        cluster.hosts.connect()
        tf_tpu_emb.load_library()
        yield cluster.hosts
