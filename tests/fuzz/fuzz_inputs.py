"""Step inputs of the fuzz suite's cases: a valid enqueue of one batch for a
config (every enqueue op and input form) and its mutations, and a step's
Send gradients and learning rates (valid or mutated).  Importing this module
does not import TensorFlow.
"""
import numpy as np

from fuzz_configs import (BAD_FLOATS, BIG_INTS, I32_MAX, I32_MIN, I64_MAX, I64_MIN,
                          num_dynamic, outputs_of, pick)


def random_ids(rng, vocab, n, dtype):
    return rng.integers(0, vocab, n).astype(dtype)


def random_weights(rng, n, weighted):
    return (rng.uniform(0.25, 2.0, n) if weighted else np.zeros(0)).astype(np.float32)


def _dense_bag_inputs(rng, vocab, shape, weighted, index_dtype, id_dtype):
    """One id per output position, no indices (dense)."""
    n = int(np.prod(shape))
    return [np.zeros(0, index_dtype), random_ids(rng, vocab, n, id_dtype),
            random_weights(rng, n, weighted)]


def _splits_inputs(rng, vocab, rows, weighted, index_dtype, id_dtype, max_len=3):
    counts = rng.integers(0, max_len + 1, rows)
    splits = np.concatenate([[0], np.cumsum(counts)]).astype(index_dtype)
    n = int(splits[-1])
    return [splits, random_ids(rng, vocab, n, id_dtype), random_weights(rng, n, weighted)]


def _coo_inputs(rng, vocab, shape, weighted, index_dtype, id_dtype, extra_col, max_len=3):
    """COO indices [n, rank (+1)] in row-major order, bag = position."""
    rows = []
    for p in range(int(np.prod(shape))):
        pos = list(np.unravel_index(p, shape))
        for k in range(int(rng.integers(0, max_len + 1))):
            rows.append(pos + ([k] if extra_col else []))
    cols = len(shape) + (1 if extra_col else 0)
    idx = np.array(rows, index_dtype).reshape(-1, cols)
    n = idx.shape[0]
    return [idx, random_ids(rng, vocab, n, id_dtype), random_weights(rng, n, weighted)]


def valid_enqueue(rng, c, op=None, replica=0, mode="unspecified"):
    """(op name, kwargs) of a valid enqueue of one batch for config `c`."""
    outputs = outputs_of(c)
    feature_mode = len(c.feature_descriptor) > 0
    ops = ["EnqueueTPUEmbeddingArbitraryTensorBatch",
           "DynamicEnqueueTPUEmbeddingArbitraryTensorBatch",
           "EnqueueTPUEmbeddingSparseTensorBatch", "EnqueueTPUEmbeddingRaggedTensorBatch",
           "DynamicEnqueueTPUEmbeddingRaggedTensorBatch"]
    if not feature_mode:
        ops += ["EnqueueTPUEmbeddingIntegerBatch", "EnqueueTPUEmbeddingSparseBatch"]
    elif all(len(s) == 1 for _, s in outputs):
        ops += ["EnqueueTPUEmbeddingIntegerBatch", "EnqueueTPUEmbeddingSparseBatch"]
    op = op or pick(rng, ops)
    index_dtype = pick(rng, (np.int32, np.int64))
    id_dtype = pick(rng, (np.int32, np.int64))
    weighted = bool(rng.random() < 0.5)
    vocab = [d.vocabulary_size for d in c.table_descriptor]
    kw = {"mode_override": mode}
    if op == "EnqueueTPUEmbeddingIntegerBatch":
        kw["batch"] = [random_ids(rng, vocab[t], int(np.prod(s)), np.int32) for t, s in outputs]
        kw["device_ordinal"] = replica
        return op, kw
    if op == "EnqueueTPUEmbeddingSparseBatch":
        triples = []
        for t, s in outputs:
            n = int(rng.integers(0, 3 * int(np.prod(s)) + 1))
            triples.append([np.sort(rng.integers(0, int(np.prod(s)), n)).astype(np.int32),
                            random_ids(rng, vocab[t], n, id_dtype),
                            random_weights(rng, n, weighted)])
        names = ("sample_indices", "embedding_indices", "aggregation_weights")
    elif "Arbitrary" in op or feature_mode:
        triples = []
        for t, s in outputs:
            kind = int(rng.integers(3))
            if kind == 0:
                triples.append(_dense_bag_inputs(rng, vocab[t], s, weighted, index_dtype, id_dtype))
            elif kind == 1 and ("Arbitrary" in op or "Ragged" in op):
                triples.append(_splits_inputs(rng, vocab[t], int(np.prod(s)), weighted,
                                              index_dtype, id_dtype))
            elif "Ragged" in op:
                triples.append(_dense_bag_inputs(rng, vocab[t], s, weighted, index_dtype, id_dtype))
            else:
                triples.append(_coo_inputs(rng, vocab[t], s, weighted, index_dtype, id_dtype,
                                           extra_col=bool(rng.random() < 0.5)))
        first = "sample_splits" if "Ragged" in op else (
            "sample_indices" if "SparseTensor" in op else "sample_indices_or_row_splits")
        names = (first, "embedding_indices", "aggregation_weights")
        if "Arbitrary" not in op:
            kw["table_ids"] = [t for t, _ in outputs]
    else:  # feature ops on a table-mode config: num_features inputs of width 1 per table
        triples, table_ids = [], []
        for t, d in enumerate(c.table_descriptor):
            for _ in range(d.num_features):
                b = c.batch_size_per_tensor_core
                if "Ragged" in op:
                    triples.append(
                        _splits_inputs(rng, vocab[t], b, weighted, index_dtype, id_dtype))
                elif rng.random() < 0.5:
                    triples.append(_dense_bag_inputs(rng, vocab[t], [b], weighted, index_dtype,
                                                     id_dtype))
                else:
                    tr = _coo_inputs(rng, vocab[t], [b], weighted, index_dtype, id_dtype,
                                     extra_col=bool(rng.random() < 0.5))
                    if tr[0].shape[1] == 1 and rng.random() < 0.5:
                        tr[0] = tr[0].reshape(-1)  # rank-1 sample_indices form
                    triples.append(tr)
                table_ids.append(t)
        first = "sample_splits" if "Ragged" in op else "sample_indices"
        names = (first, "embedding_indices", "aggregation_weights")
        kw["table_ids"] = table_ids
    for i, name in enumerate(names):
        kw[name] = [tr[i] for tr in triples]
    if rng.random() < 0.5:
        kw["combiners"] = [str(pick(rng, ("sum", "mean", "sqrtn"))) for _ in triples]
    if op.startswith("Dynamic"):
        kw["device_ordinal"] = np.int32(replica)
    else:
        kw["device_ordinal"] = replica
    return op, kw


def mutate_enqueue(rng, c, op, kw):
    """One mutation of a valid enqueue; returns (kwargs, expect)."""
    lists = [k for k, v in kw.items() if isinstance(v, list) and v and isinstance(v[0], np.ndarray)]
    kind = int(rng.integers(0, 14))
    expect = "any"
    idx_key = lists[0]
    id_key = "embedding_indices" if "embedding_indices" in kw else "batch"
    i = int(rng.integers(len(kw[id_key])))
    ids = kw[id_key][i]
    if kind <= 2 and ids.size:  # id outside the vocabulary
        vocab = c.table_descriptor[outputs_or_table(c, kw, i)].vocabulary_size
        bad = pick(rng, (vocab, -1, vocab + 1, I32_MAX, I32_MIN, I64_MAX, I64_MIN, 2**31))
        if ids.dtype == np.int32 and not I32_MIN <= bad <= I32_MAX:
            bad = I32_MAX if bad > 0 else I32_MIN
        ids = ids.copy()
        ids[int(rng.integers(ids.size))] = bad
        kw[id_key][i] = ids
        expect = "fail"
    elif kind == 3 and id_key != "batch":  # non-finite weight
        w = kw["aggregation_weights"][i]
        if w.size:
            w = w.copy()
            w[int(rng.integers(w.size))] = pick(rng, BAD_FLOATS[:3])
            kw["aggregation_weights"][i] = w
            expect = "fail"
        else:
            kw["aggregation_weights"][i] = np.ones(ids.size + int(rng.integers(1, 3)), np.float32)
            expect = "fail"
    elif kind == 4 and idx_key != "batch":  # indices / splits values
        a = kw[idx_key][i].copy()
        if a.size:
            a.flat[int(rng.integers(a.size))] = pick(rng, (-1, -2**20, 2**20, I32_MAX, I32_MIN)
                                                      if a.dtype == np.int32 else BIG_INTS)
            kw[idx_key][i] = a
    elif kind == 5 and idx_key != "batch":  # shape/rank of indices
        a = kw[idx_key][i]
        kw[idx_key][i] = pick(rng, (a.reshape(-1), a.reshape(1, -1), a.reshape(-1, 1, 1)
                                     if a.size else np.zeros([0, 3, 1], a.dtype),
                                     np.zeros([ids.size, 5], a.dtype), np.zeros([1], a.dtype),
                                     np.zeros([0, 2], a.dtype),
                                     np.arange(ids.size + 3, dtype=a.dtype)))
    elif kind == 6:  # drop / add an input (every list of the op together)
        drop = rng.random() < 0.5 and len(kw[id_key]) > 1
        for k in lists + (["table_ids"] if "table_ids" in kw else []):
            kw[k] = kw[k][:-1] if drop else kw[k] + [kw[k][-1]]
        if "combiners" in kw and rng.random() < 0.5:
            kw["combiners"] = kw["combiners"][:-1] if drop else kw["combiners"] + ["sum"]
    elif kind == 7 and op != "EnqueueTPUEmbeddingIntegerBatch":
        kw["combiners"] = pick(rng, (["sum"] * int(rng.integers(0, 9)), ["max"], ["", "mean"]))
    elif kind == 8:
        kw["mode_override"] = pick(rng, ("", "training", "TRAIN", "inference\0", "x" * 300))
        expect = "fail"
    elif kind == 9:
        bad = pick(rng, (c.num_tensor_cores, 5, 2**20, I32_MAX, -2, I32_MIN))
        kw["device_ordinal"] = np.int32(bad) if op.startswith("Dynamic") else int(bad)
        if bad >= max(1, c.num_tensor_cores):
            expect = "fail"
        if op.startswith("Dynamic") and rng.random() < 0.3:
            kw["device_ordinal"] = pick(rng, (np.zeros([0], np.int32), np.zeros([2, 2], np.int32)))
    elif kind == 10 and "table_ids" in kw:
        t = list(kw["table_ids"])
        t[int(rng.integers(len(t)))] = pick(rng, (-1, len(c.table_descriptor), I32_MAX, I32_MIN, 0))
        kw["table_ids"] = t
        for k, v in (("max_sequence_lengths", (-1, 0, 1, 3, I32_MAX)),
                     ("num_features", (-1, 0, 2, I32_MAX))):
            if rng.random() < 0.4:
                kw[k] = [int(pick(rng, v)) for _ in range(int(rng.integers(0, len(t) + 2)))]
    elif kind == 11:  # dtype change (still a legal dtype for the op)
        key = pick(rng, lists)
        kw[key] = [a.astype(pick(rng, (np.int32, np.int64)) if a.dtype.kind == "i"
                            else pick(rng, (np.float32, np.float64))) for a in kw[key]]
    elif kind == 12:  # everything empty
        for k in lists:
            kw[k] = [np.zeros([0], a.dtype) for a in kw[k]]
    else:  # a huge (but cheap) splits tensor / index column
        if idx_key != "batch":
            a = kw[idx_key][i]
            kw[idx_key][i] = np.zeros([int(pick(rng, (2**16, 2**20)))], a.dtype)
    return kw, expect


def outputs_or_table(c, kw, i):
    """Table of input i of an enqueue (feature ops carry table_ids)."""
    if "table_ids" in kw:
        t = kw["table_ids"][i] if i < len(kw["table_ids"]) else 0
        return t if 0 <= t < len(c.table_descriptor) else 0
    outs = outputs_of(c)
    return outs[i][0] if i < len(outs) else 0


def send_gradients(rng, c, mutate=False):
    pb_dims = [c.table_descriptor[t].dimension for t, _ in outputs_of(c)]
    grads = [rng.standard_normal(s + [d]).astype(np.float32)
             for (_, s), d in zip(outputs_of(c), pb_dims)]
    rates = [np.float32(rng.uniform(0.01, 0.2)) for _ in range(num_dynamic(c))]
    expect = "model"
    if mutate:
        kind = int(rng.integers(6))
        if kind == 0:
            grads = grads[:-1] if len(grads) > 1 else grads + grads
            expect = "fail"
        elif kind == 1:  # one gradient with a longer first dimension
            j = int(rng.integers(len(grads)))
            g = grads[j]
            grads[j] = np.zeros([g.shape[0] + int(rng.integers(1, 3))] + list(g.shape[1:]),
                                np.float32)
            expect = "fail"
        elif kind == 2:
            rates = rates + [np.float32(0.1)]
            expect = "fail"
        elif kind == 3 and rates:
            rates[0] = np.zeros([2], np.float32)
            expect = "fail"
        elif kind == 4:
            g = grads[0].copy()
            g.flat[0] = pick(rng, BAD_FLOATS[:3])
            grads[0] = g
        else:
            grads[0] = grads[0].reshape(-1)
            expect = "fail" if grads[0].ndim != 1 or len(outputs_of(c)[0][1]) != 0 else "any"
    return grads, rates, expect
