"""Numpy models of the SparseCore ops, written from docs/sparsecore_semantics.md
(never from our kernels' outputs), and the helper that runs an op by name
(ours, ``TfTpuEmb>Name``, or TF's core name) in a tf.function."""
import numpy as np
import tensorflow as tf
from tensorflow.python.framework import op_def_library

PAD = 2**31 - 1


def _hidden(x):
    if isinstance(x, (np.ndarray, np.generic)):
        return tf.compat.v1.placeholder_with_default(x, shape=None)
    if isinstance(x, list) and x and all(isinstance(e, np.ndarray) for e in x):
        return [_hidden(e) for e in x]
    return x


def run_op(name, _hide_shapes=False, _functions=(), **kwargs):
    """Runs op `name` once with `kwargs` (inputs and attrs); its outputs as numpy
    (lists for list outputs).  `_hide_shapes`: the numpy inputs reach the op
    with unknown shapes (the kernel, not the shape function, sees bad ones);
    `_functions`: concrete functions the op's func attrs name."""
    @tf.function(autograph=False)
    def fn():
        for f in _functions:  # concrete functions a func attr names
            f.add_to_graph()
        args = {k: _hidden(v) for k, v in kwargs.items()} if _hide_shapes else kwargs
        _, _, op, _ = op_def_library._apply_op_helper(name, **args)
        return list(op.outputs)

    return [o.numpy() for o in fn()]


# ------------------------------------------------------------- §1 COO conversion

def token_rows(form, split, n):
    if form == "dense":
        return np.arange(n)
    if form == "sparse":
        return np.asarray(split)[:, 0]
    split = np.asarray(split)
    return np.repeat(np.arange(len(split) - 1), np.diff(split))


def coo(rows, ids, weights, sample_count, combiner):
    """(rows, cols, gains) after adjacent dedup and combiner scaling."""
    weights = np.broadcast_to(np.float32(weights), (len(ids),)).astype(np.float32)
    scale = np.zeros(sample_count, np.float32)
    kr, kc, kg = [], [], []
    for r, c, w in zip(rows, ids, weights):
        if combiner == "mean":
            scale[r] = np.float32(scale[r] + w)
        elif combiner == "sqrtn":
            scale[r] = np.float32(scale[r] + np.float32(w * w))
        if kr and kr[-1] == r and kc[-1] == c:
            kg[-1] = np.float32(kg[-1] + w)
        else:
            kr.append(int(r))
            kc.append(int(c))
            kg.append(np.float32(w))
    gains = np.array(kg, np.float32)
    if combiner != "sum":
        with np.errstate(divide="ignore"):
            if combiner == "mean":
                s = np.where(scale == 0, 0, np.float32(1) / scale).astype(np.float32)
            else:
                s = np.where(scale == 0, 0, np.float32(1) / np.sqrt(scale)).astype(np.float32)
        gains = (gains * s[np.array(kr, np.int64)]).astype(np.float32) if kr else gains
    return np.array(kr, np.int32), np.array(kc, np.int32), gains


def coo_list(rows, cols, gains, sample_count, num_sc, row_offset, col_offset, col_shift,
             num_sc_shards, stacked_sample_count):
    per_sc = sample_count // num_sc
    mask = num_sc_shards - 1
    out = []
    for k in range(num_sc):
        sel = (rows // per_sc) == k
        r, c = rows[sel].astype(np.int64), cols[sel].astype(np.int64)
        out.append(((r % per_sc + row_offset // num_sc + stacked_sample_count // num_sc * k)
                    .astype(np.int32),
                    (((c + col_shift) & mask) + (c & ~mask) + col_offset).astype(np.int32),
                    gains[sel]))
    return out


# ----------------------------------------------------------------- §2 sort

def sort_list(features, col_offsets, num_physical):
    """features: [(rows, cols, gains)]; returns (kept per group in order,
    counts, uniques) as in semantics §2."""
    groups = {}
    for f, off in enumerate(col_offsets):
        groups.setdefault(off, []).append(f)
    counts = np.zeros(num_physical, np.int64)
    uniques = np.zeros(num_physical, np.int64)
    kept = []
    for off in sorted(groups):
        r = np.concatenate([features[f][0] for f in groups[off]])
        c = np.concatenate([features[f][1] for f in groups[off]])
        g = np.concatenate([features[f][2] for f in groups[off]])
        order = sorted(range(len(c)), key=lambda i: (c[i], i))
        group, prev = [], (None, None)
        for i in order:
            if (r[i], c[i]) != prev:
                group.append([int(r[i]), int(c[i]), np.float32(g[i])])
                counts[c[i] % num_physical] += 1
                if c[i] != prev[1]:
                    uniques[c[i] % num_physical] += 1
            else:
                group[-1][2] = np.float32(group[-1][2] + g[i])
            prev = (r[i], c[i])
        kept.append(group)
    return kept, counts, uniques


def sorted_outputs(kept, num_physical, batch):
    per_rep = [[] for _ in range(num_physical)]
    for group in kept:
        for r, c, g in group:
            per_rep[c % num_physical].append((r % batch, c // num_physical, g))
    flat = [e for rep in per_rep for e in rep]
    id_counts = np.concatenate([[0], np.cumsum([len(x) for x in per_rep])]).astype(np.int32)
    return (np.array([e[0] for e in flat], np.int32), np.array([e[1] for e in flat], np.int32),
            np.array([e[2] for e in flat], np.float32), id_counts)


# ------------------------------------------------------------------ §3-§4 CSR

def bucket_bounds(splits, level=6):
    pts = []
    for bit in range(63):
        if splits >> bit & 1:
            lvl = (bit + 1).bit_length() - 1
            sec = bit - (2**lvl - 1)
            size = 2 ** (level - 1 - lvl)
            pts.append(size + sec * size * 2)
    return [0] + sorted(pts) + [2**level]


def csr_wrapped(per_sc, splits, num_physical, max_minibatches, max_ids, allow_dropping):
    """per_sc: [(rows, cols, gains, id_counts)]; the seven outputs of
    ConvertToSparseCoreCsrWrappedCooTensor, or "error" on overflow."""
    bounds = bucket_bounds(splits)
    m = len(bounds) - 1
    g_size = -(-num_physical // 8) * 8
    rp, sid, tid, gn = [], [], [], []
    for rows, cols, gains, counts in per_sc:
        mini = len(counts) == num_physical * 64 + 1
        for b in range(1, m + 1):
            for rep in range(num_physical):
                lo = counts[rep * 64 + bounds[b - 1]] if mini else counts[rep]
                hi = counts[rep * 64 + bounds[b]] if mini else counts[rep + 1]
                n = hi - lo
                if len(tid) + n > max_ids:
                    if not allow_dropping:
                        return "error"
                    n = max_ids - len(tid)
                tid += list(cols[lo:lo + n])
                sid += list(rows[lo:lo + n])
                gn += list(gains[lo:lo + n])
                rp.append(len(tid))
                pad = -len(tid) % 8
                tid += [PAD] * pad
                sid += [PAD] * pad
                gn += [float(PAD)] * pad
            rp += [len(tid)] * (-len(rp) % 8)
    end = len(tid)
    rp += [end] * (max_minibatches * len(per_sc) * g_size - len(rp))
    tid += [PAD] * (max_ids - end)
    sid += [PAD] * (max_ids - end)
    gn += [float(PAD)] * (max_ids - end)
    return (np.array(rp, np.int32), np.array(sid, np.int32), np.array(tid, np.int32),
            np.array(gn, np.float32), len(per_sc) * m * g_size, end, m)


# ------------------------------------------------- §5-§7 lookup, gradient, optimizers

def sc_layout(table, num_sc):
    """The logical table in the SparseCore layout of the one-chip CPU model:
    id c = t * num_sc + j is row j * R + t."""
    rows = len(table)
    r = rows // num_sc
    out = np.empty_like(table)
    for c in range(rows):
        out[(c % num_sc) * r + c // num_sc] = table[c]
    return out


def from_sc_layout(table, num_sc):
    rows = len(table)
    r = rows // num_sc
    return np.stack([table[(c % num_sc) * r + c // num_sc] for c in range(rows)])


def pack_csr(ids_by_group, num_sc, m, max_minibatches, buffer_len):
    """Buffers in the layout of semantics §3/§5 from, per group (sample
    SparseCore major, minibatch minor), per shard j < num_sc, a list of
    (sample_id, token_id, gain)."""
    g = -(-num_sc // 8) * 8
    rp, sid, tid, gn = [], [], [], []
    for group in ids_by_group:
        for j in range(g):
            for s, t, w in (group[j] if j < num_sc else []):
                sid.append(s)
                tid.append(t)
                gn.append(w)
            rp.append(len(sid))
            pad = -len(sid) % 8
            sid += [PAD] * pad
            tid += [PAD] * pad
            gn += [float(PAD)] * pad
    rp += [len(sid)] * (max_minibatches * num_sc * g - len(rp))
    n = len(sid)
    sid += [PAD] * (buffer_len - n)
    tid += [PAD] * (buffer_len - n)
    gn += [float(PAD)] * (buffer_len - n)
    return (np.array(rp, np.int32), np.array(sid, np.int32), np.array(tid, np.int32),
            np.array(gn, np.float32))


def csr_ids(row_pointers, sample_ids, token_ids, gains, num_sc, m, shard_rows, batch):
    """(activation row, table row, gain) per id, in buffer order (semantics §5)."""
    g = -(-num_sc // 8) * 8
    out = []
    for k in range(num_sc * m * g):
        begin = 0 if k == 0 else -(-int(row_pointers[k - 1]) // 8) * 8
        for i in range(begin, int(row_pointers[k])):
            out.append(((k // g // m) * batch + int(sample_ids[i]),
                        (k % g) * shard_rows + int(token_ids[i]), np.float32(gains[i])))
    return out


def csr_lookup(ids, table, input_size):
    act = np.zeros((input_size, table.shape[1]), np.float32)
    for a, r, w in ids:
        act[a] = act[a] + w * table[r]
    return act


def csr_row_grads(ids, act_grads, rows):
    grads = {}
    for a, r, w in ids:
        grads[r] = grads.get(r, np.zeros(act_grads.shape[1], np.float32)) + w * act_grads[a]
    return grads


f32 = np.float32


def sc_update(opt, w, slots, g, lr, h):
    """One row update of semantics §6, float32; returns (w, slots)."""
    lr = f32(lr)
    if opt == "sgd":
        return w - lr * g, []
    if opt == "adagrad":
        acc = slots[0] + g * g
        return w - lr * g / np.sqrt(acc), [acc]
    if opt == "adagrad_momentum":
        acc, m = slots
        b1, b2, eps, ex = f32(h["beta1"]), f32(h["beta2"]), f32(h["epsilon"]), f32(h["exponent"])
        acc = acc + g * g if b2 == 1 else b2 * acc + (f32(1) - b2) * g * g
        s = np.power(acc + eps, -(f32(1) / ex)) * g
        m = b1 * m + s
        upd = b1 * m + s if h["use_nesterov"] else m
        return w - lr * upd, [acc, m]
    if opt == "adam":
        m, v = slots
        b1, b2, eps = f32(h["beta1"]), f32(h["beta2"]), f32(h["epsilon"])
        m = b1 * m + (f32(1) - b1) * g
        v = b2 * v + (f32(1) - b2) * g * g
        den = np.sqrt(v + eps * eps) if h["use_sum_inside_sqrt"] else np.sqrt(v) + eps
        return w - lr * m / den, [m, v]
    if opt == "ftrl":
        acc, lin = slots
        beta, p, l1, l2 = (f32(h[k]) for k in ("beta", "learning_rate_power", "l1", "l2"))
        acc_new = acc + g * g
        p_new = np.power(acc_new, -p)
        dp = p_new - np.power(acc, -p)
        if h["multiply_linear_by_learning_rate"]:
            lin = (lin + lr * g) - dp * w
            num = -lin if l1 == 0 else np.clip(lin, -lr * l1, lr * l1) - lin
            den = (p_new + f32(2) * lr * l2) + beta
        else:
            lin = (lin + g) - dp * w / lr
            num = -lin if l1 == 0 else np.clip(lin, -l1, l1) - lin
            den = (p_new + beta) / lr + f32(2) * l2
        return num / den, [acc_new, lin]
    raise ValueError(opt)


def minibatch_splits(rows, cols, gains, sample_count, num_sc, num_physical, vocab):
    """GetMinibatchSplitsWithPhysicalReplica's outputs on CPU (semantics §4):
    (sorted rows, cols, gains, splits, id_counts, max_ids, max_uniques)."""
    per_sc = sample_count // num_sc
    division = -(-vocab // 64)
    buckets = [[] for _ in range(64 * num_sc * num_physical)]
    max_ids = max_uniques = 0
    for s in range(num_sc):
        sel = (rows // per_sc) == s
        kept, counts, uniques = sort_list([(rows[sel], cols[sel], gains[sel])], [0],
                                          num_physical)
        max_ids, max_uniques = max(max_ids, counts.max()), max(max_uniques, uniques.max())
        for r, c, g in kept[0]:
            k = (s * num_physical + c % num_physical) * 64 + min(c // division, 63)
            buckets[k].append((r % per_sc, c // num_physical, g))
    flat = [e for b in buckets for e in b]
    id_counts = np.concatenate([[0], np.cumsum([len(b) for b in buckets])]).astype(np.int32)
    return (np.array([e[0] for e in flat], np.int32), np.array([e[1] for e in flat], np.int32),
            np.array([e[2] for e in flat], np.float32), 0, id_counts, max_ids, max_uniques)


# ------------------------------------------------- §8 custom combiner

def pack_pos_csr(groups, num_sc, buffer_len):
    """The custom-combiner ops' buffers (semantics §8: §5's layout, one
    minibatch) from, per sample SparseCore, per shard j < num_sc, a list of
    (sample_id, token_id, pos_id, gain); the row pointers padded to 8 groups
    (a producer's max_minibatches_per_sc) with the end."""
    g = -(-num_sc // 8) * 8
    rp, sid, tid, pid, gn = [], [], [], [], []
    for group in groups:
        for j in range(g):
            for s, t, p, w in (group[j] if j < num_sc else []):
                sid.append(s)
                tid.append(t)
                pid.append(p)
                gn.append(w)
            rp.append(len(sid))
            pad = -len(sid) % 8
            for buf in (sid, tid, pid):
                buf += [PAD] * pad
            gn += [float(PAD)] * pad
    rp += [len(sid)] * (8 * num_sc * g - len(rp))
    n = len(sid)
    for buf in (sid, tid, pid):
        buf += [PAD] * (buffer_len - n)
    gn += [float(PAD)] * (buffer_len - n)
    return (np.array(rp, np.int32), np.array(sid, np.int32), np.array(tid, np.int32),
            np.array(pid, np.int32), np.array(gn, np.float32))


def preserved(groups, num_sc, batch, shard_rows, table, max_valency):
    """(valencies, vectors, ids) of the custom-combiner lookup (§8): the id
    (sample, pos, row, gain) puts gain * table[row] at vectors[sample, pos];
    a sample's valency is 1 + its largest position."""
    size = num_sc * batch
    val = np.zeros(size, np.int32)
    vec = np.zeros((size, max_valency, table.shape[1]), np.float32)
    ids = []
    for k, group in enumerate(groups):
        for j, seg in enumerate(group):
            for s, t, p, w in seg:
                a, r = k * batch + s, j * shard_rows + t
                vec[a, p] = np.float32(w) * table[r]
                val[a] = max(val[a], p + 1)
                ids.append((a, p, r, np.float32(w)))
    return val, vec, ids
