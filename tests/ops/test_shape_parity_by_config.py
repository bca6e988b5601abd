"""Shape-function parity over generated configs: our ``TfTpuEmb>`` ops infer
exactly what TF's core ops infer.

For every config of shape_parity_configs.py, each op whose shape function
reads the config (RecvTPUEmbeddingActivations, LoadAll/RetrieveAllTPUEmbedding-
Parameters) and, with the config attr set, the ops that must *not* read it
(SendTPUEmbeddingGradients, per-table Load/Retrieve), are built in a fresh
graph both as TF's core op and as ours and compared (shape_parity_harness.py).
The config-independent ops have their own sweeps (test_shape_parity_by_shape.py).

Intentional differences, excluded from the comparison and tested on their own:
(a) a feature_descriptor whose table_id is outside [0, num_tables): TF reads out
of bounds (undefined behaviour), ours raises an error naming the feature;
(b) table mode with num_features * batch_size_per_tensor_core overflowing int32:
not generated; (c) user_defined_program: not generated; (d) TF's LoadAll /
RetrieveAll report some errors as an Internal RET_CHECK where ours reports
InvalidArgument: for those two ops only error-or-success is compared, plus the
messages when TF's error is an InvalidArgument one.
"""
import collections

import pytest
import tensorflow as tf

from shape_parity_configs import CONFIGS, OOB_CONFIGS, OPT_FIELDS, _parse, generate_configs
from shape_parity_harness import (LEARNING_RATES, Outcome, Ph, _selector, assert_parity,
                                  build_ours, build_pair, mismatch)
from tf_tpu_emb.optimizers import OPTIMIZERS


MAX_STATE_VARIABLES = 8
GROUPS = ("parameters",) + tuple("auxiliary%d" % i for i in range(1, MAX_STATE_VARIABLES))

pytestmark = [pytest.mark.tf_version, pytest.mark.usefixtures("lib")]

# Config names -> reason, for parity bugs found and not yet fixed (xfail, strict).
KNOWN_PARITY_BUGS = {}  # name -> reason; none known


def test_generator_is_deterministic_and_large():
    assert len(CONFIGS) >= 200
    assert generate_configs() == CONFIGS
    parsed = [_parse(c.data) for c in CONFIGS]
    assert sum(p is None for p in parsed) >= 20  # malformed bytes are really there
    assert sum(p is not None and len(p.feature_descriptor) > 0 for p in parsed) >= 60
    assert sum(p is not None and not p.feature_descriptor and len(p.table_descriptor) > 0
               for p in parsed) >= 60
    cases = {p.table_descriptor[0].optimization_parameters.WhichOneof("parameters")
             for p in parsed if p is not None and p.table_descriptor}
    assert cases == set(OPT_FIELDS) | {None}


def test_comparator_detects_differences():
    ok = Outcome(None, "", [[2, 4]])
    bad_value = Outcome(ValueError, "Shape must be rank 2 but is rank 1 for 'x'", None)
    other_value = Outcome(ValueError, "Shape must be rank 2 but is rank 3 for 'x'", None)
    internal = Outcome(tf.errors.InternalError, "RET_CHECK failure", None)
    recv = "RecvTPUEmbeddingActivations"
    assert mismatch(recv, ok, ok, "") is None
    assert mismatch(recv, bad_value, bad_value, "") is None
    assert mismatch(recv, ok, Outcome(None, "", [[2, None]]), "")
    assert mismatch(recv, ok, bad_value, "") and mismatch(recv, bad_value, ok, "")
    assert mismatch(recv, bad_value, other_value, "")  # same phrase, other numbers
    assert mismatch(recv, internal, bad_value, "")  # exception types differ
    assert mismatch("LoadAllTPUEmbeddingParameters", internal, bad_value, "") is None  # (d)
    assert mismatch("LoadAllTPUEmbeddingParameters", bad_value, other_value, "")
    assert mismatch(recv, Outcome(TypeError, "No argument", None),
                    Outcome(TypeError, "No argument", None), "")  # harness error
    with pytest.raises(AssertionError, match="1 parity mismatch"):
        assert_parity([(recv, ok, bad_value, "case")])


# ========================================================== per-config sweep

def _count_outputs(parsed):
    if parsed is None:
        return 1
    return len(parsed.feature_descriptor) or len(parsed.table_descriptor)


VALID_SHARDINGS = ((2, 0), (2, 1), (3, 2), (4, 3), (4, 0), (3, 1))
INVALID_SHARDINGS = ((0, 0), (-1, 0), (2, 2), (3, -1), (1, 1))
SHARDINGS = ((1, 0),) + VALID_SHARDINGS + INVALID_SHARDINGS


def _fallback_groups(n_tables):
    """Plausible LoadAll inputs when TF could not tell us the right ones."""
    return [[(4, 4)] * n_tables, [(4, 4)] * n_tables] + [[(0, 0)] * n_tables] * 6


def _groups_kwargs(groups):
    return {name: [Ph(s) for s in shapes] for name, shapes in zip(GROUPS, groups)}


def _retrieved_groups(outcome, n_tables):
    """RetrieveAll's outputs regrouped: what LoadAll must accept."""
    return [[tuple(outcome.shapes[g * n_tables + t]) for t in range(n_tables)]
            for g in range(MAX_STATE_VARIABLES)]


def _all_tables_cases(gen, parsed, index, exhaustive=False):
    """(bare, core, ours, case) for LoadAll/RetrieveAll over shardings and inputs.

    TF's RET_CHECK errors are slow (~15 ms each), so unless `exhaustive` the
    shardings, the input variants and the NumTables mismatches are rotated over
    the configs: every one of them still runs for dozens of configs.
    """
    results = []
    n_tables = max(1, len(parsed.table_descriptor)) if parsed is not None else 1
    probe = build_pair("RetrieveAllTPUEmbeddingParameters", NumTables=n_tables,
                       config=gen.data, num_shards=1, shard_id=0)
    config_ok = probe[0].error is None
    if exhaustive:
        shardings = SHARDINGS
    elif config_ok:
        shardings = [(1, 0), VALID_SHARDINGS[index % len(VALID_SHARDINGS)],
                     VALID_SHARDINGS[(index + 2) % len(VALID_SHARDINGS)],
                     INVALID_SHARDINGS[index % len(INVALID_SHARDINGS)]]
    else:  # a config-level error: the sharding hardly matters
        shardings = [(1, 0), INVALID_SHARDINGS[index % len(INVALID_SHARDINGS)]]
    right = {}
    for num_shards, shard_id in shardings:
        attrs = dict(config=gen.data, num_shards=num_shards, shard_id=shard_id)
        case = "num_shards=%d shard_id=%d" % (num_shards, shard_id)
        if (num_shards, shard_id) == (1, 0):
            core, ours = probe
        else:
            core, ours = build_pair("RetrieveAllTPUEmbeddingParameters", NumTables=n_tables,
                                    **attrs)
        results.append(("RetrieveAllTPUEmbeddingParameters", core, ours, case))
        groups = (_retrieved_groups(core, n_tables) if core.error is None
                  else _fallback_groups(n_tables))
        if core.error is None:
            right[(num_shards, shard_id)] = groups
        core, ours = build_pair("LoadAllTPUEmbeddingParameters", **_groups_kwargs(groups), **attrs)
        results.append(("LoadAllTPUEmbeddingParameters", core, ours, case + " right shapes"))

    wrong_counts = [n_tables + 1, n_tables - 1]
    if not exhaustive:
        wrong_counts = [wrong_counts[index // 4 % 2]] if index % 4 == 0 else []
    for wrong in wrong_counts:
        if wrong >= 1:
            attrs = dict(config=gen.data, num_shards=1, shard_id=0)
            core, ours = build_pair("RetrieveAllTPUEmbeddingParameters", NumTables=wrong, **attrs)
            results.append(("RetrieveAllTPUEmbeddingParameters", core, ours,
                            "NumTables=%d" % wrong))
            groups = [(g * 2)[:wrong] for g in right.get((1, 0), _fallback_groups(n_tables))]
            core, ours = build_pair("LoadAllTPUEmbeddingParameters", **_groups_kwargs(groups),
                                    **attrs)
            results.append(("LoadAllTPUEmbeddingParameters", core, ours,
                            "NumTables=%d" % wrong))
    if not right and not exhaustive:
        return results

    # Input-shape variants at one valid sharding (rotated over configs).
    valid = sorted(right) or [(1, 0)]
    num_shards, shard_id = valid[index % len(valid)]
    base = right.get((num_shards, shard_id), _fallback_groups(n_tables))
    n_vars = sum(1 for g in base if g[0] != (0, 0))
    t = index % n_tables

    def grow(shape, axis):
        if shape is None or shape[axis] is None:
            return shape
        return tuple(d + 1 if i == axis else d for i, d in enumerate(shape))

    def set_all(groups, shape):
        for g in groups:
            g[:] = [shape] * len(g)

    variants = [
        ("all unknown rank", lambda g: set_all(g, None)),
        ("all [None, None]", lambda g: set_all(g, (None, None))),
        ("empty groups as [0]", lambda g: [
            g[i].__setitem__(t, (0,)) for i in range(max(1, n_vars), MAX_STATE_VARIABLES)]),
        ("empty groups as [2, 0, 5]", lambda g: [
            g[i].__setitem__(t, (2, 0, 5)) for i in range(max(1, n_vars), MAX_STATE_VARIABLES)]),
        ("parameters rows+1", lambda g: g[0].__setitem__(t, grow(g[0][t], 0))),
        ("all state rows+1", lambda g: [
            g[i].__setitem__(t, grow(g[i][t], 0)) for i in range(max(1, n_vars))]),
        ("all state dim+1", lambda g: [
            g[i].__setitem__(t, grow(g[i][t], 1)) for i in range(max(1, n_vars))]),
        ("aux1 dim+1", lambda g: g[1].__setitem__(t, grow(g[1][t], 1) if n_vars > 1
                                                  else (1, 1))),
        ("aux7 non-empty [2, 3]", lambda g: g[7].__setitem__(t, (2, 3))),
        ("parameters rank 1", lambda g: g[0].__setitem__(t, (4,))),
        ("parameters rank 3", lambda g: g[0].__setitem__(t, (4, 4, 1))),
        ("last state var rank 1", lambda g: g[max(1, n_vars) - 1].__setitem__(t, (4,))),
        ("parameters [None, dim]", lambda g: g[0].__setitem__(
            t, None if g[0][t] is None else (None,) + tuple(g[0][t][1:]))),
    ]
    if not exhaustive:
        variants = [variants[(index * 5 + k) % len(variants)] for k in range(5)]
    for description, mutate in variants:
        groups = [list(g) for g in base]
        mutate(groups)
        core, ours = build_pair("LoadAllTPUEmbeddingParameters", **_groups_kwargs(groups),
                                config=gen.data, num_shards=num_shards, shard_id=shard_id)
        results.append(("LoadAllTPUEmbeddingParameters", core, ours, "num_shards=%d shard_id=%d "
                        "%s (table %d)" % (num_shards, shard_id, description, t)))
    return results


def _config_results(gen, index):
    parsed = _parse(gen.data)
    results = []
    n = _count_outputs(parsed)
    recv_shapes = None
    for num_outputs in (n, n + 1, n - 1):
        core, ours = build_pair("RecvTPUEmbeddingActivations", num_outputs=num_outputs,
                                config=gen.data)
        results.append(("RecvTPUEmbeddingActivations", core, ours,
                        "num_outputs=%d" % num_outputs))
        if num_outputs == n and core.error is None:
            recv_shapes = core.shapes

    grads = [Ph(s) for s in (recv_shapes or [[2, 2]])]
    for k in (index, index + 3):
        rates = LEARNING_RATES[k % len(LEARNING_RATES)]
        core, ours = build_pair("SendTPUEmbeddingGradients", inputs=grads,
                                learning_rates=[Ph(s) for s in rates], config=gen.data)
        results.append(("SendTPUEmbeddingGradients", core, ours, "learning_rates=%s" % (rates,)))

    # Per-table ops must not read the config.
    core_table_opts = [o for o in OPTIMIZERS if o.core_has_table_ops]
    info = core_table_opts[index % len(core_table_opts)]
    tensors = ("parameters",) + info.slots
    load = "LoadTPUEmbedding%sParameters" % info.op_infix
    for selector, shapes in ((dict(table_id=0), [(10, 4)] * len(tensors)),
                             (dict(table_name="t0"), [(10, 4)] + [(10, 5)] * (len(tensors) - 1)),
                             (dict(), [(10, 4)] * len(tensors))):
        core, ours = build_pair(load, num_shards=2, shard_id=index % 3,
                                **_selector(config=gen.data, **selector),
                                **{k: Ph(s) for k, s in zip(tensors, shapes)})
        results.append((load, core, ours, "%s %s" % (selector, shapes)))
    retrieve = "RetrieveTPUEmbedding%sParameters" % info.op_infix
    core, ours = build_pair(retrieve, num_shards=1, shard_id=0,
                            **_selector(config=gen.data, table_id=index % 3))
    results.append((retrieve, core, ours, "table_id=%d" % (index % 3)))

    results += _all_tables_cases(gen, parsed, index)
    return results


def _config_params():
    params = []
    for index, gen in enumerate(CONFIGS):
        marks = ()
        if gen.name in KNOWN_PARITY_BUGS:
            marks = pytest.mark.xfail(reason=KNOWN_PARITY_BUGS[gen.name], strict=True)
        params.append(pytest.param(index, gen, marks=marks, id="%03d-%s" % (index, gen.name)))
    return params


@pytest.mark.parametrize("index,gen", _config_params())
def test_config_parity(index, gen):
    assert_parity(_config_results(gen, index), "config %s (bytes %r)" % (gen.name, gen.data[:200]))


EXHAUSTIVE_CONFIGS = ("spec_A_tables", "spec_D_features", "v2_style_shared_tables", "vocab_1",
                      "vocab_3", "vocab_-3", "opt_centered_rms_prop_enabled",
                      "opt_assign_disabled", "opt_none_unspecified", "empty_config",
                      "wire_reference_ok", "garbage_00")


@pytest.mark.parametrize("name", EXHAUSTIVE_CONFIGS)
def test_all_tables_ops_exhaustive(name):
    """Every sharding, every input variant and both NumTables mismatches."""
    index = [g.name for g in CONFIGS].index(name)
    gen = CONFIGS[index]
    results = _all_tables_cases(gen, _parse(gen.data), index, exhaustive=True)
    assert len(results) >= 2 * len(SHARDINGS)
    assert_parity(results, name)


def test_sweep_is_not_vacuous():
    """Over a sample of configs, each swept op both succeeds and fails (with
    InvalidArgument) for TF, so the parity checks compare real shapes and errors."""
    seen = collections.defaultdict(set)
    for index, gen in list(enumerate(CONFIGS))[::6]:
        for bare, core, _, _ in _config_results(gen, index):
            kind = "Load" if bare.startswith("LoadTPU") else (
                "Retrieve" if bare.startswith("RetrieveTPU") else bare)
            seen[kind].add(core.error.__name__ if core.error else "ok")
    for op in ("RecvTPUEmbeddingActivations", "SendTPUEmbeddingGradients", "Load",
               "LoadAllTPUEmbeddingParameters", "RetrieveAllTPUEmbeddingParameters"):
        assert {"ok", "ValueError"} <= seen[op], (op, seen[op])
    assert "InternalError" in seen["LoadAllTPUEmbeddingParameters"]
    assert "ok" in seen["Retrieve"] and "TypeError" not in set().union(*seen.values())


# ================================================ (a) out-of-range table_id

@pytest.mark.parametrize("gen", OOB_CONFIGS, ids=lambda g: g.name)
def test_feature_table_id_out_of_range_is_an_error(gen):
    parsed = _parse(gen.data)
    n = len(parsed.feature_descriptor)
    bad = [f for f in parsed.feature_descriptor
           if not 0 <= f.table_id < len(parsed.table_descriptor)][0]
    outcome = build_ours("RecvTPUEmbeddingActivations", num_outputs=n, config=gen.data)
    assert outcome.error is ValueError, outcome
    assert bad.name in outcome.message and str(bad.table_id) in outcome.message, outcome.message
    # The all-tables ops never look at features: full parity there.
    results = [r for r in _all_tables_cases(gen, parsed, 0)]
    assert_parity(results, gen.name)
