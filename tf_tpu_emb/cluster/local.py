"""Embedding hosts on this machine: ``LocalHosts(num_hosts)``.

For a one-machine run of a clustered job (``python -m tf_tpu_emb.demo
--hosts 2``, ``benchmarks/bench_cluster.py``): starts `num_hosts`
``python -m tf_tpu_emb.server`` children (job "embedding", tasks 0..S-1) on
free 127.0.0.1 ports, waits for each one's readiness line, and stops them
(SIGTERM, then SIGKILL) when the ``with`` block exits.  Each child also exits
by itself after `lifetime_s` seconds and when this process dies
(``--exit-with-parent``), so nothing outlives a crashed run.  On several
machines start the servers by hand instead (README "Running on several
machines") and build an ``EmbeddingHosts`` from their addresses.
"""
import gc
import json
import queue
import signal
import socket
import subprocess
import sys
import threading
import time

from tf_tpu_emb.cluster.hosts import EmbeddingHosts
from tf_tpu_emb.server import READY_PREFIX

START_TIMEOUT_S = 180  # TensorFlow's import on a busy machine
STOP_TIMEOUT_S = 10


def free_port():
    """A free TCP port on 127.0.0.1 (free when asked; nothing holds it)."""
    return free_ports(1)[0]


def free_ports(n):
    """`n` distinct free TCP ports on 127.0.0.1: every socket is held until
    all are chosen, so no two are the same.  (Two gRPC servers can bind one
    port -- TF's set SO_REUSEPORT -- and then share its connections: a
    cluster whose tasks got the same port mixes up its hosts.)"""
    sockets = []
    try:
        for _ in range(int(n)):
            s = socket.socket()
            sockets.append(s)
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


class LocalHosts:
    """`num_hosts` embedding-host processes on 127.0.0.1 (a context manager).

    ``hosts`` is their ``EmbeddingHosts`` (not yet connected).  Leaving the
    block stops the children and, when this process was connected to them,
    gives it back a local-only eager context (TF would otherwise keep waiting
    on the stopped tasks)."""

    def __init__(self, num_hosts, replicas_per_host=1, lifetime_s=3600):
        if int(num_hosts) < 1:
            raise ValueError("num_hosts must be >= 1, got %r" % num_hosts)
        self.addresses = ["127.0.0.1:%d" % p for p in free_ports(num_hosts)]
        self.replicas_per_host = int(replicas_per_host)
        self.lifetime_s = lifetime_s
        self.hosts = EmbeddingHosts({"embedding": self.addresses},
                                    replicas_per_host=self.replicas_per_host)
        self.procs = []

    def _start(self, k):
        cmd = [sys.executable, "-m", "tf_tpu_emb.server", "--cluster",
               json.dumps({"embedding": self.addresses}), "--job", "embedding",
               "--task", str(k), "--replicas", str(self.replicas_per_host),
               "--lifetime-seconds", str(self.lifetime_s), "--exit-with-parent"]
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    @staticmethod
    def _wait_ready(proc, k, deadline):
        lines, found = queue.Queue(), []

        def read():  # keeps reading so that the child's pipe never fills
            for line in proc.stdout:
                found.append(line)
                lines.put(line)
            lines.put(None)
        threading.Thread(target=read, daemon=True).start()
        while True:
            try:
                line = lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise TimeoutError("embedding host %d printed no readiness line within %ss:\n%s"
                                   % (k, START_TIMEOUT_S, "".join(found)[-2000:])) from None
            if line is None:
                raise RuntimeError("embedding host %d exited with %s before it was ready:\n%s"
                                   % (k, proc.wait(), "".join(found)[-2000:]))
            if line.startswith(READY_PREFIX):
                return

    def __enter__(self):
        try:
            self.procs = [self._start(k) for k in range(len(self.addresses))]
            deadline = time.monotonic() + START_TIMEOUT_S
            for k, proc in enumerate(self.procs):
                self._wait_ready(proc, k, deadline)
        except BaseException:
            self.close()
            raise
        return self

    def close(self):
        if self.hosts.connected:
            # Functions the run no longer holds are removed from the hosts
            # while they still answer (TF logs an error for each one left).
            gc.collect()
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        self.hosts.disconnect()

    def __exit__(self, *exc):
        self.close()
        return False
