"""The embedding host process (`python -m tf_tpu_emb.server`) and the client's
view of the hosts (`tf_tpu_emb.cluster.EmbeddingHosts`): readiness, exits
(SIGTERM, lifetime, parent gone), TF_CONFIG and flags, connection, devices,
a host without the library, a host down at start."""
import json
import os
import signal
import time

import pytest
import tensorflow as tf

import harness
from cluster import LoopbackCluster, free_port, READY_PREFIX
from tf_tpu_emb import server
from tf_tpu_emb.cluster import EmbeddingHosts
from tf_tpu_emb.cluster import hosts as hosts_mod

pytestmark = pytest.mark.system  # child processes, servers or compilers

EXIT_WAIT_S = 60  # bound on waiting for a server to exit by itself


def _start(args, **env):
    return harness.start_python(["-m", "tf_tpu_emb.server"] + args, **env)


def _ready_line(proc):
    for line in proc.stdout:
        if line.startswith(READY_PREFIX):
            return line.strip()
    proc.wait()
    raise AssertionError("server exited %s without a readiness line" % proc.returncode)


def _end(proc):
    if proc.poll() is None:
        proc.kill()
    proc.wait()


# ---------------------------------------------------------------- arguments
def _resolve(argv, tf_config=None):
    args = server._arg_parser().parse_args(argv)
    env = {} if tf_config is None else {"TF_CONFIG": json.dumps(tf_config)}
    return server.resolve(args, env)


TF_CONFIG = {"cluster": {"embedding": ["a:1", "b:2", "c:3"], "worker": ["w:9"]},
             "task": {"type": "embedding", "index": 2}}


def test_tf_config_gives_cluster_job_and_task():
    assert _resolve([], TF_CONFIG) == (TF_CONFIG["cluster"], "embedding", 2)


def test_flags_override_tf_config():
    cluster, job, task = _resolve(["--task", "0", "--cluster", "x:1,y:2"], TF_CONFIG)
    assert (cluster, job, task) == ({"embedding": ["x:1", "y:2"]}, "embedding", 0)
    cluster, job, task = _resolve(["--job", "worker", "--task", "0"], TF_CONFIG)
    assert (cluster, job, task) == (TF_CONFIG["cluster"], "worker", 0)


@pytest.mark.parametrize("argv,tf_config,fragment", [
    ([], None, "no cluster"),
    (["--cluster", "a:1"], None, "no task index"),
    (["--cluster", "a:1", "--task", "1"], None, "task 1 is out of range: job 'embedding' has 1"),
    (["--cluster", "a:1,b", "--task", "0"], None, "'b' is not HOST:PORT"),
    (["--cluster", '{"ps": ["a:1"]}', "--task", "0"], None,
     "job 'embedding' is not in the cluster"),
    (["--job", "worker"], TF_CONFIG, "task 2 is out of range: job 'worker' has 1"),
])
def test_bad_arguments_are_named(argv, tf_config, fragment):
    with pytest.raises(ValueError, match=fragment.replace("(", r"\(")):
        _resolve(argv, tf_config)


def test_bad_arguments_exit_2_with_message():
    proc = harness.run_python(["-m", "tf_tpu_emb.server", "--cluster", "a:1", "--task", "3"],
                              timeout=120, unset=("TF_CONFIG",))
    assert proc.returncode == 2, harness.describe(proc)
    assert "task 3 is out of range" in proc.stderr


# ---------------------------------------------------------------- process life
def test_ready_line_sigterm_exits_cleanly():
    port = free_port()
    proc = _start(["--cluster", "127.0.0.1:%d" % port, "--task", "0", "--replicas", "3",
                   "--lifetime-seconds", "300"])
    try:
        line = _ready_line(proc)
        assert line == ("tf_tpu_emb.server ready job=embedding task=0 address=127.0.0.1:%d "
                        "devices=3" % port)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(EXIT_WAIT_S) == 0
    finally:
        _end(proc)


def test_tf_config_server_and_lifetime_exit():
    ports = [free_port(), free_port()]
    cfg = {"cluster": {"embedding": ["127.0.0.1:%d" % p for p in ports]},
           "task": {"type": "embedding", "index": 1}}
    proc = _start(["--lifetime-seconds", "1"], TF_CONFIG=json.dumps(cfg))
    try:
        assert "job=embedding task=1 address=127.0.0.1:%d devices=1" % ports[1] in _ready_line(proc)
        assert proc.wait(EXIT_WAIT_S) == 0  # exits by itself
    finally:
        _end(proc)


PARENT = r"""
import subprocess, sys
p = subprocess.Popen([sys.executable, "-m", "tf_tpu_emb.server", "--cluster", sys.argv[1],
                      "--task", "0", "--lifetime-seconds", "300", "--exit-with-parent"],
                     stdout=subprocess.PIPE, text=True)
for line in p.stdout:
    if line.startswith("tf_tpu_emb.server ready"):
        break
print(p.pid, flush=True)
"""


def _gone(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            return f.read().split(")")[-1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


def test_exit_with_parent():
    proc = harness.run_python(["-c", PARENT, "127.0.0.1:%d" % free_port()], timeout=180)
    assert proc.returncode == 0, harness.describe(proc)
    pid = int(proc.stdout.split()[-1])
    deadline = time.monotonic() + EXIT_WAIT_S
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    try:
        assert _gone(pid), "server %d outlived its parent" % pid
    finally:
        if not _gone(pid):
            os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------- the client side
def test_hosts_names_devices_and_validates():
    hosts = EmbeddingHosts({"embedding": ["h0:1", "h1:2"]}, replicas_per_host=2)
    assert hosts.num_hosts == 2
    assert hosts.device(1) == "/job:embedding/replica:0/task:1/device:CPU:0"
    assert hosts.device(0, replica=1) == "/job:embedding/replica:0/task:0/device:CPU:1"
    assert hosts.describe(1) == "embedding host 1 (/job:embedding/replica:0/task:1 at h1:2)"
    with pytest.raises(ValueError, match="replica 2 out of range"):
        hosts.device(0, replica=2)
    with pytest.raises(ValueError, match="host 2 out of range"):
        hosts.device(2)
    with pytest.raises(ValueError, match="job 'embedding' is not in the cluster spec"):
        EmbeddingHosts({"ps": ["a:1"]})


def test_translate_names_host_and_task():
    hosts = EmbeddingHosts({"embedding": ["127.0.0.1:11", "127.0.0.1:12"]})
    err = tf.errors.UnavailableError(None, None, "Socket closed (127.0.0.1:12)")
    out = hosts.translate(err)
    assert isinstance(out, tf.errors.UnavailableError)
    assert out.message.startswith(
        "embedding host 1 (/job:embedding/replica:0/task:1 at 127.0.0.1:12): Socket closed")
    out = hosts.translate(tf.errors.AbortedError(None, None, "step aborted"), 0)
    assert isinstance(out, tf.errors.AbortedError) and "embedding host 0" in out.message
    unnamed = tf.errors.InternalError(None, None, "something")
    assert hosts.translate(unnamed) is unnamed
    no_kernel = tf.errors.NotFoundError(
        None, None, "Could not find device for node: {{node X}} All kernels registered for op "
        "X: <no registered kernels>")
    out = hosts.translate(no_kernel, 1)
    assert isinstance(out, tf.errors.FailedPreconditionError)
    assert "embedding host 1" in out.message and "python -m tf_tpu_emb.server" in out.message


@pytest.mark.parametrize("value,fragment", [("0", "must be > 0"),
                                            ("soon", "must be a number of seconds"),
                                            ("-1", "must be > 0")])
def test_host_timeout_env_is_validated(monkeypatch, value, fragment):
    monkeypatch.setenv(hosts_mod.TIMEOUT_ENV, value)
    with pytest.raises(ValueError, match="%s %s" % (hosts_mod.TIMEOUT_ENV, fragment)):
        hosts_mod.host_timeout_s()
    assert hosts_mod.host_timeout_s(2.5) == 2.5


def test_host_down_at_start_is_unavailable_naming_it(monkeypatch):
    monkeypatch.setenv(hosts_mod.TIMEOUT_ENV, "0.5")
    with LoopbackCluster(1) as up:
        spec = {"embedding": [up.addresses[0], "127.0.0.1:%d" % free_port()]}
        hosts = EmbeddingHosts(spec)
        with pytest.raises(tf.errors.UnavailableError) as info:
            hosts.connect()
    msg = info.value.message
    assert "embedding host 1 (/job:embedding/replica:0/task:1 at %s)" % spec["embedding"][1] in msg
    assert "no connection within 0.5 s" in msg and "python -m tf_tpu_emb.server" in msg


@pytest.fixture(scope="module")
def mixed_cluster():
    """Host 0 without the library (a plain TF server), host 1 a real embedding host
    with 2 replicas; this process connected to both."""
    with LoopbackCluster(2, replicas_per_host=2, load_library=[False, True]) as c:
        c.hosts._connected_spec = None
        try:
            c.hosts.connect()
        except tf.errors.FailedPreconditionError as e:  # host 0 has no kernels: expected
            c.connect_error = e
        yield c


def test_connect_reports_host_without_library(mixed_cluster):
    e = mixed_cluster.connect_error
    assert "embedding host 0 (/job:embedding/replica:0/task:0 at %s) has no tf_tpu_emb kernels"\
        % mixed_cluster.addresses[0] in e.message
    assert "start it with `python -m tf_tpu_emb.server`" in e.message


def test_op_on_host_without_library_fails_with_advice(mixed_cluster):
    from tf_tpu_emb import ops
    hosts = mixed_cluster.hosts
    with pytest.raises(tf.errors.FailedPreconditionError, match="tf_tpu_emb.server"):
        try:
            with tf.device(hosts.device(0)):
                ops.is_tpu_embedding_initialized().numpy()
        except tf.errors.OpError as e:
            raise hosts.translate(e, 0) from None


def test_engine_lives_on_the_host_where_its_ops_run(mixed_cluster):
    from tf_tpu_emb import ops
    hosts = mixed_cluster.hosts
    assert [d.name for d in tf.config.list_logical_devices() if "/job:embedding" in d.name
            and "task:1" in d.name] == [hosts.device(1, 0), hosts.device(1, 1)]
    from tensorflow.core.protobuf.tpu import tpu_embedding_configuration_pb2 as pb
    config = pb.TPUEmbeddingConfiguration(mode=pb.TPUEmbeddingConfiguration.TRAINING)
    table = config.table_descriptor.add(name="t", vocabulary_size=4, dimension=2)
    table.optimization_parameters.stochastic_gradient_descent.SetInParent()
    config.feature_descriptor.add(name="f", table_id=0, input_shape=[2])
    ops.shutdown_tpu_embedding()
    with tf.device(hosts.device(1)):
        assert not ops.is_tpu_embedding_initialized().numpy()
        ops.configure_tpu_embedding(config.SerializeToString())
        assert ops.is_tpu_embedding_initialized().numpy()
    assert not ops.is_tpu_embedding_initialized().numpy()  # not in this process
    with tf.device(hosts.device(1)):
        ops.shutdown_tpu_embedding()
        assert not ops.is_tpu_embedding_initialized().numpy()
