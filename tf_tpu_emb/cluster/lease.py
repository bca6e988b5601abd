"""Host leases: no embedding host is ever left locked by a dead trainer.

The engines a trainer configures on the hosts are named after its *session*
(``trainer_<machine>_<pid>_<token>_<n>``: unique across processes, pooled
within one by ``engine_registry``) and each is a **lease** of
``lease_s`` seconds on its host (``ConfigureTPUEmbeddingHostShard(...,
lease_seconds=)``; engine/engine.h ``EvictLeases``).  While a lease runs the
host refuses other trainers' configures with ``FailedPrecondition`` naming the
holder, its last heartbeat and when the lease ends.  :class:`Heartbeat` keeps
this process's leases running: one daemon thread per host renews every lease
held there each ``lease_s / 4`` (``RenewTPUEmbeddingLease``).  A trainer that
dies stops renewing; once its lease has run out the next trainer's configure
evicts its engines.  ``build(..., takeover=True)`` evicts at once.  An evicted
trainer's later ops fail naming why (taken over, or its lease ended), so a
stale trainer can never write into its successor's tables: those are a
different engine.

An owner collected without ``shutdown`` cannot run ops from its finalizer (it
may run inside another thread's trace), so its engines are *orphaned*: their
heartbeat stops at once, and the next configure through the same
:class:`~tf_tpu_emb.cluster.hosts.EmbeddingHosts` shuts them down (else their
lease runs out).

``lease_s``: ``EmbeddingHosts(lease_s=)``, else ``TF_TPU_EMB_HOST_LEASE_SECONDS``,
else 30 s.
"""
import atexit
import os
import socket
import threading
import weakref

LEASE_ENV = "TF_TPU_EMB_HOST_LEASE_SECONDS"
DEFAULT_LEASE_S = 30.0


def _session_prefix():
    machine = "".join(c if c.isalnum() else "-" for c in socket.gethostname())[:32]
    # os.urandom, not the random module: a user's seeded random stream (e.g.
    # keras.utils.set_random_seed before the first cluster import) must not move.
    return "trainer_%s_%d_%s" % (machine, os.getpid(), os.urandom(3).hex())


#: The prefix of this process's host-engine names (a trainer session).
SESSION_PREFIX = _session_prefix()

_heartbeats = weakref.WeakSet()


class Heartbeat:
    """Renews the leases this process holds on the hosts of one
    ``EmbeddingHosts``.  Thread-safe; creates no op on the caller's thread."""

    def __init__(self, hosts):
        self._hosts = weakref.ref(hosts)
        self._lock = threading.Lock()
        self._engines = set()
        self._orphans = set()
        self._threads = {}
        self._stop = threading.Event()
        self.lost = {}  # (host, engine) -> why the host refused a renewal
        _heartbeats.add(self)

    def keep(self, engine):
        """Starts renewing `engine`'s lease on every host."""
        with self._lock:
            self._engines.add(engine)
            self._orphans.discard(engine)
            for key in [key for key in self.lost if key[1] == engine]:
                del self.lost[key]
            hosts = self._hosts()
            for k in range(hosts.num_hosts if hosts is not None else 0):
                if k not in self._threads:
                    self._threads[k] = threading.Thread(
                        target=self._run, args=(k,), daemon=True,
                        name="tf_tpu_emb-lease-host%d" % k)
                    self._threads[k].start()

    def drop(self, engine, orphan=False):
        """Stops renewing `engine`; `orphan`: its owner is gone without a
        shutdown, so :meth:`take_orphans` hands it to the next configure."""
        with self._lock:
            self._engines.discard(engine)
            if orphan:
                self._orphans.add(engine)

    def engines(self):
        """The engines whose leases this process keeps, sorted."""
        with self._lock:
            return sorted(self._engines)

    def take_orphans(self):
        """The orphaned engines (now forgotten): the caller shuts them down."""
        with self._lock:
            orphans, self._orphans = sorted(self._orphans), set()
        return orphans

    def stop(self):
        self._stop.set()

    def _run(self, k):
        """Host k's renewals, for the life of the process (or of the hosts
        object).  One synchronous executor for the thread's whole life: a
        renewal's error is its own, and no executor is created or destroyed
        while another thread changes the remote context (TF's executor
        registry does not survive that; reconnects hold ``context_lock``)."""
        import tensorflow as tf  # pylint: disable=import-outside-toplevel
        from tf_tpu_emb import ops  # pylint: disable=import-outside-toplevel

        hosts = self._hosts()
        if hosts is None:
            return
        with hosts.synchronous():
            del hosts
            while True:
                hosts = self._hosts()
                if hosts is None:
                    return
                period = hosts.lease_s / 4
                del hosts
                if self._stop.wait(period):
                    return
                hosts = self._hosts()
                if hosts is None:
                    return
                for engine in self.engines():
                    try:
                        with hosts.context_lock, tf.device(hosts.device(k)):
                            lost = ops.renew_tpu_embedding_lease(engine=engine)[0]
                            lost = lost.numpy().decode()
                    except tf.errors.OpError:
                        continue  # unreachable now: the next period tries again
                    if lost:  # taken over, ended, or the host restarted
                        self.lost[(k, engine)] = lost
                    else:
                        self.lost.pop((k, engine), None)
                del hosts


@atexit.register
def _stop_all():
    for heartbeat in list(_heartbeats):
        heartbeat.stop()
