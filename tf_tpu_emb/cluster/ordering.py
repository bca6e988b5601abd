"""Program order per host, not across hosts, for the host ops of one step.

Inside a ``tf.function`` TF adds automatic control dependencies: every
stateful op that takes no resource input is chained after the previous such
op, in program order.  Our engine ops take no resource input (the engine is
named by an attr), so without help the S hosts' Enqueue, Recv and Send of a
step would run one host after the other, each link of the chain a cross-task
round trip.

An engine is a per-host resource: the ops on one host's engine must keep
program order (load before enqueue, Send before a later retrieve), the ops of
two hosts need none.  :func:`per_host` says exactly that to TF's automatic
control dependencies through their resource-resolver hook
(``auto_control_deps.register_acd_resource_resolver``): every host op built
in a function graph is given its host's key tensor as a resource it writes,
so TF orders it after that host's previous op and leaves the hosts
independent.  The key tensors are never evaluated (nothing consumes them; the
function runtime prunes them).

A host's engine queue (its Enqueue ops) is a resource of its own, which the
Recv reads (``queue=``): an Enqueue is ordered after the previous Enqueue and
after the Recvs before it, a Recv after the Enqueues before it, but a Send
and the next step's Enqueue are unordered: the host enqueues step k+1's
batch (already pulled from the worker) while step k's gradients travel, so a
step's critical path crosses the network twice (activations out, gradients
in), not three times (benchmarks/RESULTS.md, "the hosts as separate
machines").  The engine's queue makes that order-free: a Recv takes the
oldest batch, and the sequence a routed batch carries checks that worker and
hosts agree (engine/routing.h).

With ``pipeline_execution_with_tensor_core`` a host's engine looks one batch
ahead (engine/engine.h ``lookahead_``): the Recv of step k+1 may run before
the Send of step k, since that lookup must not see step k's update anyway.
Then a host's Recvs form a chain of their own (``recv="ahead"``: each after
the previous Recv and the Enqueues before it) and its Sends another
(``send=True``: each after the previous Send); every other op of the engine
is ordered after both.  Step k+1's lookup and its activations' trip to the
worker then overlap step k's gradients coming back; the engine keeps the
lookup after next waiting for the Send (benchmarks/RESULTS.md, "the hosts as
separate machines").

Where the hook is missing, :func:`per_host` does nothing and the step stays
correct, only serial.
"""
import tensorflow as tf

_GRAPH_ATTR = "_tf_tpu_emb_host_order"   # graph -> {"keys": {host: tensor}, "ops": {name: host}}

try:  # TF's private module; present in every supported TF (2.16-2.21)
    from tensorflow.python.framework import auto_control_deps as _acd
    _register = _acd.register_acd_resource_resolver
except (ImportError, AttributeError):  # pragma: no cover - older/newer TF
    _register = None


def _state(graph):
    state = getattr(graph, _GRAPH_ATTR, None)
    if state is None:
        state = {"keys": {}, "ops": {}}
        setattr(graph, _GRAPH_ATTR, state)
    return state


def _resolve(op, resource_reads, resource_writes):
    """ACD resolver: a marked host op writes its keys and reads its read
    keys (True when the sets changed, as the hook requires)."""
    state = getattr(op.graph, _GRAPH_ATTR, None)
    if state is None:
        return False
    marked = state["ops"].get(op.name)
    if marked is None:
        return False
    writes, reads = marked
    changed = False
    for keys, into in ((writes, resource_writes), (reads, resource_reads)):
        for name in keys:
            key = state["keys"][name]
            if key not in into:
                into.add(key)
                changed = True
    return changed


_resolve.__name__ = "tf_tpu_emb_per_host_order"
if _register is not None:
    try:
        _register(_resolve)
    except KeyError:  # the module was imported twice (reload): already registered
        pass


def enabled():
    """Whether per-host ordering is available in this TF."""
    return _register is not None


def per_host(built, host, queue=None):
    """Marks ``built`` (an op, a tensor, or a list of them; ``None`` in eager
    mode) as an op of host ``host``'s engine.  Returns ``built``.

    ``queue``: None (an op of the engine), "write" (an Enqueue: an op of the
    host's queue only), "read" (a Recv: an op of the engine that reads the
    queue), and for an engine that looks ahead (pipelining) "ahead" (a Recv
    ordered only after Recvs and Enqueues) or "send" (a Send ordered only
    after Sends; both before the engine's other ops)."""
    if queue not in (None, "write", "read", "ahead", "send"):
        raise ValueError("queue must be None, 'write', 'read', 'ahead' or 'send', got %r"
                         % (queue,))
    if built is None or tf.executing_eagerly() or _register is None:
        return built
    queue_key, recv_key = ("queue", host), ("recv", host)
    writes = {"write": (queue_key,), "ahead": (recv_key,), "send": (host,)}.get(
        queue, (host, recv_key))
    reads = (queue_key,) if queue in ("read", "ahead") else ()
    items = built if isinstance(built, (list, tuple)) else [built]
    ops_ = {x if isinstance(x, tf.Operation) else x.op for x in items}
    for op in ops_:
        graph = op.graph
        if not getattr(graph, "building_function", False):
            continue  # TF1 graphs have no automatic control dependencies
        state = _state(graph)
        for name in writes + reads:
            if name not in state["keys"]:
                state["keys"][name] = _make_key(graph, name, len(state["keys"]))
        state["ops"][op.name] = (writes, reads)
    return built


def _make_key(graph, name, index):
    """A scalar constant of ``graph`` that stands for ``name`` (a host's
    engine, or ("queue", host): its queue)."""
    label = "{}{}".format(*name) if isinstance(name, tuple) else "{}_engine".format(name)
    with graph.as_default(), graph.control_dependencies(None), graph.name_scope(None):
        return tf.constant(index, name="tf_tpu_emb_host{}".format(label))
