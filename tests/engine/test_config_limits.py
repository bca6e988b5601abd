"""Configure-time limits and the errors past them (README "Limits and errors"):
overflow-checked sizes, bounded and representable values, the memory budget,
finite hyper-parameters, exceptions turned into TF errors, and waits that
shutdown interrupts and a timeout bounds.  Each limit is tested at its
boundary: the largest accepted value and the smallest rejected one.

Inputs that used to kill the process (SIGSEGV, SIGABRT, SIGFPE, OOM kill, a
600 s hang) run in one child process (tests/engine/config_limits_child.py), so a
regression fails the case it died in instead of killing pytest.

The limits below are the documented ones, written here independently of the
C++ constants."""
import base64
import json
import os

import pytest
import tensorflow as tf

import engine_util as eu
from engine_util import FeatureSpec, TableSpec
import harness  # tests/common: the one way to start a child process

pytestmark = [pytest.mark.system, pytest.mark.usefixtures("lib")]

# `make sanitize` preloads AddressSanitizer, whose own mappings die under the
# address-space cap that the out-of-memory case relies on.
UNDER_ASAN = "libasan" in os.environ.get("LD_PRELOAD", "")
MAX_TENSOR_CORES = 4096
MAX_INPUT_RANK = 253          # TensorShape's 254 dimensions minus the embedding dimension
MAX_POSITIONS = 2 ** 24       # per feature (table mode: batch x num_features)
MAX_ACTIVATIONS = 2 ** 28     # floats of one replica's Recv outputs
MAX_DIMENSION = 2 ** 20
INT64_MAX = 2 ** 63 - 1
INT32_MAX = 2 ** 31 - 1
SLOTS = {"stochastic_gradient_descent": 0, "adagrad": 1, "adam": 2}

IA = "InvalidArgumentError"
RE = "ResourceExhaustedError"
VE = "ValueError"  # a shape function's error while tracing a tf.function


def feature(shape, dim=4, vocab=8, optimizer="stochastic_gradient_descent", cores=1):
    return eu.feature_mode_config([TableSpec("t", vocab, dim, optimizer=optimizer)],
                                  [FeatureSpec("f", 0, shape)], num_tensor_cores=cores)


def table_mode(batch, num_features, dim=4):
    return eu.table_mode_config(
        [TableSpec("t", 8, dim, optimizer="stochastic_gradient_descent",
                   num_features=num_features)], batch)


def two_features(dims):
    """Two features of one table, input_shape [2^24] and [1]."""
    return eu.feature_mode_config(
        [TableSpec("t", 8, dims, optimizer="stochastic_gradient_descent")],
        [FeatureSpec("big", 0, [MAX_POSITIONS]), FeatureSpec("one", 0, [1])])


def spmd_overflow():
    c = table_mode(INT32_MAX, INT32_MAX)
    c.spmd_sharding.enabled = True
    c.spmd_sharding.num_cores_per_replica = INT32_MAX
    return c


def rank(r):
    return feature([1] * r)


# name: (config, action, env, error class or None, message fragments)
CHILD_CASES = {
    # 1. size arithmetic overflows
    "vocab_x_dim_overflows": (
        feature([4], dim=4, vocab=INT64_MAX // 16 + 1), "configure", {}, IA,
        ["table 't' (id 0)", "vocabulary_size x dimension x 4 bytes x (1 + slots)",
         "overflows int64"]),
    # the largest vocabulary whose byte count fits in int64 passes the overflow
    # check and is then refused by the memory budget (no machine has 2^63 bytes)
    "vocab_x_dim_largest_representable": (
        feature([4], dim=4, vocab=INT64_MAX // 16), "configure", {}, RE,
        ["need %d bytes" % (INT64_MAX // 16 * 16), "largest tables (bytes): 't'"]),
    "input_shape_elements_at_limit": (
        feature([4096, 4096], dim=1), "configure", {}, None, []),
    "input_shape_elements_over_limit": (
        feature([4096, 4097], dim=1), "configure", {}, IA,
        ["feature_descriptor 'f'", "the element count of input_shape is 4096 x 4097 = "
         "16781312, more than the limit 16777216"]),
    "input_shape_elements_overflow": (
        feature([INT32_MAX] * 3), "configure", {}, IA,
        ["feature_descriptor 'f'", "element count of input_shape", "overflows int64"]),
    "table_mode_rows_at_limit": (table_mode(4096, 4096, dim=1), "configure", {}, None, []),
    "table_mode_rows_over_limit": (
        table_mode(4096, 4097, dim=1), "configure", {}, IA,
        ["table 't': batch_size_per_tensor_core x num_features is 4096 x 4097 = 16781312, "
         "more than the limit 16777216"]),
    "table_mode_rows_overflow_int32": (
        table_mode(INT32_MAX, INT32_MAX), "configure", {}, IA,
        ["batch_size_per_tensor_core x num_features", "more than the limit 16777216"]),
    "activations_at_limit": (
        feature([MAX_POSITIONS], dim=MAX_ACTIVATIONS // MAX_POSITIONS), "configure", {},
        None, []),
    "activations_over_limit": (
        feature([MAX_POSITIONS], dim=MAX_ACTIVATIONS // MAX_POSITIONS + 1), "configure",
        {}, IA, ["feature_descriptor 'f': the size of Recv's output", "more than the limit "
                 "268435456"]),
    "activations_sum_over_limit": (
        two_features(MAX_ACTIVATIONS // MAX_POSITIONS), "configure", {}, IA,
        ["Recv's outputs have more than 268435456 floats in all",
         "feature_descriptor 'one'"]),
    "spmd_shape_fn_overflow": (
        spmd_overflow(), "shape_fn", {}, VE, ["num_cores_per_replica", "overflows int64"]),
    # 2. unbounded or unrepresentable values
    "tensor_cores_at_limit": (feature([4], cores=MAX_TENSOR_CORES), "configure", {}, None, []),
    "tensor_cores_over_limit": (
        feature([4], cores=MAX_TENSOR_CORES + 1), "configure", {}, IA,
        ["Invalid num_tensor_cores: 4097; must be in [0, 4096]"]),
    "tensor_cores_int32_max": (
        feature([4], cores=INT32_MAX), "configure", {}, IA,
        ["Invalid num_tensor_cores: 2147483647"]),
    "rank_at_limit_recv": (rank(MAX_INPUT_RANK), "configure_recv", {}, None, []),
    "rank_over_limit": (
        rank(MAX_INPUT_RANK + 1), "configure", {}, IA,
        ["feature_descriptor 'f': input_shape has rank 254, more than the limit 253"]),
    "rank_over_limit_shape_fn": (
        rank(MAX_INPUT_RANK + 1), "shape_fn", {}, VE,
        ["input_shape has rank 254, more than the limit 253"]),
    "positions_2_31": (
        feature([INT32_MAX]), "configure", {}, IA,
        ["element count of input_shape is 2147483647, more than the limit 16777216"]),
    "dimension_at_limit": (feature([1], dim=MAX_DIMENSION, vocab=1), "configure", {}, None,
                           []),
    "dimension_over_limit": (
        feature([1], dim=MAX_DIMENSION + 1, vocab=1), "configure", {}, IA,
        ["table 't' (id 0) has dimension 1048577, more than the limit 1048576"]),
    # 4. memory budget without a user limit: MemAvailable / the cgroup limit
    "tables_exceed_available_memory": (
        feature([4], dim=8, vocab=2 ** 40, optimizer="adagrad"), "configure", {}, RE,
        ["need %d bytes" % (2 ** 40 * 8 * 4 * 2), "largest tables (bytes): 't' %d"
         % (2 ** 40 * 8 * 4 * 2), "TF_TPU_EMB_MEMORY_LIMIT_BYTES"]),
    # 3. C++ exceptions become TF errors (checked in test_enqueue_out_of_memory)
    "enqueue_oom": (feature([4], dim=4, vocab=10), "enqueue_oom",
                    {"TF_TPU_EMB_STEP_TIMEOUT_SECONDS": "1"}, None, []),
    # 5. waits end: shutdown, and the timeout (checked in the tests below)
    "recv_wait_shutdown": (feature([4], cores=2), "recv_waits", {}, None, []),
    "recv_wait_timeout": (feature([4], cores=3), "recv_waits",
                          {"TF_TPU_EMB_STEP_TIMEOUT_SECONDS": "0.5"}, None, []),
}


@pytest.fixture(scope="module")
def child_results():
    """Runs the CHILD_CASES cases in a child process: name -> result, or
    name -> {"crashed": ...} for a case the child died in (a new child then
    goes on with the cases after it)."""
    cases = [{"name": name, "config": base64.b64encode(eu.serialize(c)).decode(),
              "action": action, "env": env}
             for name, (c, action, env, _, _) in CHILD_CASES.items()
             if not (UNDER_ASAN and name == "enqueue_oom")]
    results = {}
    while cases:
        proc = harness.run_python(
            [harness.script(__file__, "config_limits_child.py")], input=json.dumps(cases),
            unset=("TF_TPU_EMB_MEMORY_LIMIT_BYTES", "TF_TPU_EMB_STEP_TIMEOUT_SECONDS"),
            timeout=1200)
        started = None
        for line in proc.stdout.splitlines():
            if line.startswith("START "):
                started = line[len("START "):]
            elif line.startswith("{"):
                r = json.loads(line)
                results[r["name"]] = r
                started = None
        if started is None:
            assert proc.returncode == 0 and "DONE" in proc.stdout, proc.stderr[-3000:]
            break
        results[started] = {"crashed": "child exited with %d during this case; stderr:\n%s"
                                       % (proc.returncode, proc.stderr[-3000:])}
        cases = [c for c in cases if c["name"] not in results]
    return results


def _child(child_results, name):
    assert name in child_results, "case %s never ran (the child died earlier)" % name
    r = child_results[name]
    assert "crashed" not in r, r["crashed"]
    return r


@pytest.mark.parametrize("name", [n for n, c in CHILD_CASES.items()
                                  if c[1] in ("configure", "configure_recv", "shape_fn")])
def test_configure_limit(child_results, name):
    _, _, _, error, fragments = CHILD_CASES[name]
    r = _child(child_results, name)
    assert r["error"] == error, r
    for f in fragments:
        assert f in r["message"], (f, r["message"])


def test_rank_at_limit_recv_shape(child_results):
    r = _child(child_results, "rank_at_limit_recv")
    assert r["shapes"] == [[1] * MAX_INPUT_RANK + [4]]


def test_enqueue_out_of_memory_is_an_error_and_changes_nothing(child_results):
    """std::bad_alloc inside an enqueue (address space capped below what its
    scratch needs) is ResourceExhausted; the queue stays empty and the
    engine works afterwards."""
    if UNDER_ASAN:
        pytest.skip("an address-space cap cannot be combined with AddressSanitizer")
    r = _child(child_results, "enqueue_oom")
    assert r["error"] is None, r
    assert r.get("enqueue_error") == RE, r
    assert "out of memory" in r["enqueue_message"], r
    assert "nothing was enqueued for replica 0" in r["queue_after"], r
    assert r["shapes"] == [[4, 4]]


def test_shutdown_ends_a_waiting_recv(child_results):
    """Replica 1 of 2 never sends (there is no CPU:1): ShutdownTPUEmbedding
    ends replica 0's wait with Cancelled naming it, and the process
    configures and runs again."""
    r = _child(child_results, "recv_wait_shutdown")
    assert r["error"] is None, r
    assert r["finished"], r
    assert r.get("recv_error") == "CancelledError", r
    assert "ShutdownTPUEmbedding" in r["recv_message"], r
    assert "replica(s) 1 (of 2" in r["recv_message"], r
    assert r["shapes"] == [[4, 4]]


def test_recv_wait_times_out_naming_missing_replicas(child_results):
    r = _child(child_results, "recv_wait_timeout")
    assert r["error"] is None, r
    assert r.get("recv_error") == "DeadlineExceededError", r
    for f in ["replica(s) 1, 2 (of 3", "never sent", "timed out after 0.5 s",
              "TF_TPU_EMB_STEP_TIMEOUT_SECONDS"]:
        assert f in r["recv_message"], (f, r["recv_message"])
    assert r["shapes"] == [[4, 4]]


# ================================================== in-process: memory budget

def _configure(config):
    eu.shutdown()
    return lambda: tf.raw_ops.ConfigureTPUEmbedding(config=eu.serialize(config))


BUDGET_TABLES = [("small", 10, 4, "adagrad"), ("big", 1000, 8, "adagrad"),
                 ("mid", 100, 8, "stochastic_gradient_descent")]


def _budget_config():
    return eu.feature_mode_config(
        [TableSpec(n, v, d, optimizer=o) for n, v, d, o in BUDGET_TABLES],
        [FeatureSpec("f%d" % i, i, [2]) for i in range(len(BUDGET_TABLES))])


def _budget_bytes():
    return {n: v * d * 4 * (1 + SLOTS[o]) for n, v, d, o in BUDGET_TABLES}


def test_memory_budget_exactly_enough(monkeypatch):
    monkeypatch.setenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES", str(sum(_budget_bytes().values())))
    with eu.engine(_budget_config()):
        assert eu.is_initialized()


def test_memory_budget_one_byte_short(monkeypatch):
    need = _budget_bytes()
    total = sum(need.values())
    monkeypatch.setenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES", str(total - 1))
    with pytest.raises(tf.errors.ResourceExhaustedError) as e:
        _configure(_budget_config())()
    msg = str(e.value)
    assert "need %d bytes but the memory budget is %d bytes (TF_TPU_EMB_MEMORY_LIMIT_BYTES)" \
        % (total, total - 1) in msg, msg
    largest = ", ".join("'%s' %d" % (n, b) for n, b in sorted(need.items(), key=lambda x: -x[1]))
    assert "largest tables (bytes): " + largest in msg, msg
    assert not eu.is_initialized()


@pytest.mark.parametrize("value", ["12abc", "-1", "1e9", "99999999999999999999"])
def test_memory_budget_variable_must_be_bytes(monkeypatch, value):
    monkeypatch.setenv("TF_TPU_EMB_MEMORY_LIMIT_BYTES", value)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match="TF_TPU_EMB_MEMORY_LIMIT_BYTES must be a non-negative integer"):
        _configure(_budget_config())()
    assert not eu.is_initialized()


@pytest.mark.parametrize("value", ["0", "-2", "abc", "86401", "nan"])
def test_step_timeout_variable_must_be_seconds(monkeypatch, value):
    monkeypatch.setenv("TF_TPU_EMB_STEP_TIMEOUT_SECONDS", value)
    with pytest.raises(tf.errors.InvalidArgumentError,
                       match=r"TF_TPU_EMB_STEP_TIMEOUT_SECONDS must be a number of seconds in "
                             r"\(0, 86400\]"):
        _configure(feature([4]))()
    assert not eu.is_initialized()


def test_step_timeout_largest_accepted(monkeypatch):
    monkeypatch.setenv("TF_TPU_EMB_STEP_TIMEOUT_SECONDS", "86400")
    with eu.engine(feature([4])):
        assert eu.is_initialized()


# ========================================= in-process: non-finite hyper-parameters

FLOAT_MAX = 3.4028234663852886e38


def _params(c):
    return c.table_descriptor[0].optimization_parameters


def _setter(path, value):
    def fn(c):
        obj = _params(c)
        parts = path.split(".")
        for p in parts[:-1]:
            obj = getattr(obj, p)
        setattr(obj, parts[-1], value)
    return fn


NON_FINITE = {
    "learning_rate_nan": ("adagrad", "learning_rate.constant", float("nan")),
    "learning_rate_inf": ("adagrad", "learning_rate.constant", float("inf")),
    "weight_decay_inf": ("adagrad", "weight_decay_factor", float("inf")),
    "gradient_clip_upper_nan": ("adagrad", "gradient_clipping_limits.upper.value", float("nan")),
    "weight_clip_lower_neg_inf": ("adagrad", "clipping_limits.lower.value", float("-inf")),
    "adam_beta1_nan": ("adam", "adam.beta1", float("nan")),
    "adam_epsilon_inf": ("adam", "adam.epsilon", float("inf")),
    "ftrl_l1_inf": ("ftrl", "ftrl.l1", float("inf")),
    "momentum_nan": ("momentum", "momentum.momentum", float("nan")),
    "adagrad_momentum_beta2_nan": ("adagrad_momentum", "adagrad_momentum.beta2",
                                   float("nan")),
}


def _optimizer_config(optimizer):
    return eu.feature_mode_config([TableSpec("video", 10, 4, optimizer=optimizer)],
                                  [FeatureSpec("f", 0, [4])])


@pytest.mark.parametrize("name", sorted(NON_FINITE))
def test_non_finite_hyper_parameter_rejected(name):
    optimizer, path, value = NON_FINITE[name]
    c = _optimizer_config(optimizer)
    _setter(path, value)(c)
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        _configure(c)()
    msg = str(e.value)
    assert "table 'video' (id 0): optimization_parameters.%s is %s" % (
        path, "nan" if value != value else ("inf" if value > 0 else "-inf")) in msg, msg
    assert "hyper-parameters must be finite" in msg
    assert not eu.is_initialized()


@pytest.mark.parametrize("name", sorted(NON_FINITE))
def test_largest_finite_hyper_parameter_accepted(name):
    """The boundary: the same field at the largest finite float32 configures."""
    optimizer, path, value = NON_FINITE[name]
    c = _optimizer_config(optimizer)
    _setter(path, -FLOAT_MAX if value < 0 else FLOAT_MAX)(c)
    with eu.engine(c):
        assert eu.is_initialized()


def _quantized(lower, upper, buckets):
    return eu.feature_mode_config([TableSpec("video", 10, 4, quantization=(lower, upper,
                                                                            buckets))],
                                  [FeatureSpec("f", 0, [4])])


@pytest.mark.parametrize("lower,upper,buckets,fragment", [
    (-FLOAT_MAX, FLOAT_MAX, 3, "which is not a normal, finite float32"),  # range overflows
    (0.0, 1e-30, INT32_MAX, "which is not a normal, finite float32"),     # width underflows
    (float("nan"), 1.0, 3, "simulated_quantization.clipping_limits.lower.value is nan"),
])
def test_quantization_range_must_be_representable(lower, upper, buckets, fragment):
    with pytest.raises(tf.errors.InvalidArgumentError) as e:
        _configure(_quantized(lower, upper, buckets))()
    assert "table 'video' (id 0)" in str(e.value) and fragment in str(e.value), str(e.value)
    assert not eu.is_initialized()


FLOAT_MIN_NORMAL = 1.1754943508222875e-38


@pytest.mark.parametrize("lower,upper,buckets", [
    (-FLOAT_MAX / 2, FLOAT_MAX / 2, 3),  # the widest range: upper - lower = FLOAT_MAX
    (0.0, FLOAT_MIN_NORMAL, 2),          # the narrowest bucket: the smallest normal float
])
def test_quantization_boundary_ranges_accepted(lower, upper, buckets):
    with eu.engine(_quantized(lower, upper, buckets)):
        assert eu.is_initialized()
