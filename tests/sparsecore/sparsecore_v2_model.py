"""The numpy model of a TPUEmbeddingV2 training run on a SparseCore TPU of any
chip count (docs/sparsecore_semantics.md §1 combiners, §6 optimizers,
"Multi-chip": one global-batch step -- every touched row of a logical table
is updated once with the gradient summed over all replicas' samples).  It
knows nothing of stacking, shards or replicas: the logical tables and the
global batch only.  Used by test_sparsecore_v2_standin.py with the inputs
and initial tables written by sparsecore_v2_script.py."""
import numpy as np

from sparsecore_reference import sc_update  # the §6 row updates, float32

f32 = np.float32


def initial_slots(opt, shape, hyper):
    """The slot variables' initial values of TF's optimizer classes
    (tpu_embedding_v2_utils: Adagrad / FTRL accumulators start at
    ``initial_accumulator_value``, AdagradMomentum's and Adam's at 0)."""
    if opt == "sgd":
        return []
    if opt == "adagrad":
        return [np.full(shape, hyper["initial_accumulator_value"], f32)]
    if opt == "ftrl":
        return [np.full(shape, hyper["initial_accumulator_value"], f32), np.zeros(shape, f32)]
    return [np.zeros(shape, f32), np.zeros(shape, f32)]


def _update_hyper(opt, h):
    """The script's optimizer arguments, as the §6 formulas name them."""
    if opt == "adagrad_momentum":
        return {"beta1": h["momentum"], "beta2": h["beta2"], "epsilon": h["epsilon"],
                "exponent": h["exponent"], "use_nesterov": h["use_nesterov"]}
    if opt == "adam":
        return {"beta1": h["beta_1"], "beta2": h["beta_2"], "epsilon": h["epsilon"],
                "use_sum_inside_sqrt": h["sum_inside_sqrt"]}
    if opt == "ftrl":
        return {"beta": h["beta"], "learning_rate_power": h["learning_rate_power"],
                "l1": h["l1_regularization_strength"], "l2": h["l2_regularization_strength"],
                "multiply_linear_by_learning_rate": h["multiply_linear_by_learning_rate"]}
    return {}


def _scale(combiner, weights):
    if combiner == "sum":
        return f32(1)
    s = f32(np.sum(weights, dtype=f32)) if combiner == "mean" else f32(np.sum(weights * weights,
                                                                            dtype=f32))
    if s == 0:
        return f32(0)
    return f32(1 / np.float64(s)) if combiner == "mean" else f32(1 / np.sqrt(np.float64(s)))


def activations(tables, step, tables_spec, features_spec):
    """One step's lookup of ``tables``: (activations per feature, per table
    its (row, sample, feature, gain) contributions)."""
    acts, contributions = {}, {t: [] for t in tables}
    for f, (table, _, _) in features_spec.items():
        combiner = tables_spec[table][2]
        lengths = np.array(step[f]["lengths"])
        ids = np.array(step[f]["ids"])
        weights = np.array(step[f]["weights"], f32)
        starts = np.concatenate([[0], np.cumsum(lengths)])
        act = np.zeros((len(lengths), tables[table].shape[1]), f32)
        for s in range(len(lengths)):
            sid, sw = ids[starts[s]:starts[s + 1]], weights[starts[s]:starts[s + 1]]
            scale = _scale(combiner, sw)
            for i, w in zip(sid, sw):
                act[s] += (w * scale) * tables[table][i]
                contributions[table].append((i, s, f, w * scale))
        acts[f] = act
    return acts, contributions


def train(result, opt, tables_spec, features_spec, hyper, learning_rates, pipelined=False,
          with_previous=False):
    """(tables after every step's update, activations of every step).

    ``pipelined`` (pipeline_execution_with_tensor_core, semantics
    "Pipelining"): step N+1's lookup reads the tables as they were before
    step N's update (step 0 and 1 read the initial tables); the updates are
    applied in order as always.  ``with_previous``: also the tables before
    the last update (what the next lookup of a pipelined run reads)."""
    tables = {t: np.array(v, f32) for t, v in result["initial"].items()}
    previous = {t: v.copy() for t, v in tables.items()}  # before the last update
    slots = {t: initial_slots(opt, tables[t].shape, hyper) for t in tables}
    h = _update_hyper(opt, hyper)
    all_acts = []
    for step in result["inputs"]:
        acts, contributions = activations(previous if pipelined else tables, step,
                                          tables_spec, features_spec)
        previous = {t: v.copy() for t, v in tables.items()}
        grads = {f: acts[f] + np.array(step[f]["offsets"], f32) for f in acts}
        for t, items in contributions.items():
            row_grads = {}
            for i, s, f, gain in items:
                row_grads.setdefault(i, np.zeros(tables[t].shape[1], f32))
                row_grads[i] += gain * grads[f][s]
            for i in sorted(row_grads):
                w, new_slots = sc_update(opt, tables[t][i], [x[i] for x in slots[t]],
                                         row_grads[i], learning_rates[t], h)
                tables[t][i] = w
                for x, v in zip(slots[t], new_slots):
                    x[i] = v
        all_acts.append(acts)
    if with_previous:
        return tables, all_acts, previous
    return tables, all_acts
