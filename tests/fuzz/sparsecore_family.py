"""The fuzz suite's ``sparsecore`` family: random shapes, ids, attrs and
buffer sizes into the SparseCore kernels (docs/sparsecore_semantics.md),
under our name or TF's.  A case is one step ``{"op": "sparsecore", "args":
{"name", "inputs", "attrs", "functions"}, "expect"}``: valid inputs must
run (``ok``), inputs invalid for sure must raise a TF error (``fail``),
boundary ones either (``any``); never a crash, a hang or a non-TF error.

Every generator builds a valid case from the semantics, then (with
probability MUTATE) replaces one piece with a hostile value.  Inputs reach
the kernel with their shapes hidden (the kernel, not the shape function,
must reject them); an op-def error at graph construction (a ValueError or
TypeError of TF's op builder: an attr out of its declared range) counts as
a rejection.  Importing this module does not import TensorFlow.
"""
import numpy as np

MUTATE = 0.6
PREFIX = "TfTpuEmb>"
PAD = 2**31 - 1
HOSTILE_INTS = (-1, 2**31 - 1, -2**31, 2**20)
OPTIMIZERS = {"Sgd": [], "Adagrad": ["accumulator"],
              "AdagradMomentum": ["accumulator", "momenta"], "Adam": ["momenta", "velocity"],
              "Ftrl": ["accumulator", "linear"]}
HYPER = {"AdagradMomentum": dict(use_nesterov=False, exponent=2.0, beta1=0.9, beta2=0.99,
                                 epsilon=1e-3),
         "Adam": dict(use_sum_inside_sqrt=True, beta1=0.9, beta2=0.999, epsilon=1e-3),
         "Ftrl": dict(multiply_linear_by_learning_rate=False, beta=0.1, learning_rate_power=-0.5,
                      l1_regularization_strength=0.01, l2_regularization_strength=0.01)}


def _i32(x):
    return np.asarray(x, np.int32)


def _f32(x):
    return np.asarray(x, np.float32)


def _pick(rng, values):
    return values[int(rng.integers(len(values)))]


def _case(name, inputs, attrs, expect="ok", functions=()):
    return [{"op": "sparsecore", "expect": expect,
             "args": {"name": name, "inputs": inputs, "attrs": attrs,
                      "functions": list(functions)}}]


def _poke(rng, a, values=HOSTILE_INTS):
    """A copy of `a` with one element replaced (a must not be empty)."""
    a = a.copy()
    a.reshape(-1)[int(rng.integers(a.size))] = _pick(rng, values)
    return a


# ------------------------------------------------------ §1 COO conversion

def gen_coo(rng):
    sample_count = int(_pick(rng, (1, 2, 4, 8)))
    lens = rng.integers(0, 4, sample_count)
    split = _i32(np.concatenate([[0], np.cumsum(lens)]))
    n = int(split[-1])
    values = _i32(rng.integers(0, 50, n))
    weights = _f32(rng.uniform(0.1, 2.0, n)) if rng.random() < 0.5 else _f32(1.0)
    combiner = str(_pick(rng, ("sum", "mean", "sqrtn")))
    inputs = dict(indices_or_row_splits=split, values=values, weights=weights)
    listed = rng.random() < 0.5
    attrs = dict(sample_count=sample_count, combiner=combiner)
    if listed:
        num_sc = int(_pick(rng, [k for k in (1, 2, 4) if sample_count % k == 0]))
        attrs.update(num_sc_per_chip=num_sc, row_offset=int(rng.integers(0, 4)),
                     col_offset=int(rng.integers(0, 64)), col_shift=int(rng.integers(0, 4)),
                     num_sc_shards=int(_pick(rng, (1, 2, 4))),
                     stacked_table_sample_count=sample_count * int(rng.integers(1, 3)))
    expect = "ok"
    if rng.random() < MUTATE:
        kind = int(rng.integers(8))
        expect = "fail"
        if kind == 0:
            split = split.copy()
            split[int(rng.integers(split.size))] = _pick(rng, (-1, n + 1, 2**31 - 1))
            inputs["indices_or_row_splits"] = split
            expect = "any"  # a changed inner split may still be valid
        elif kind == 1 and n:
            inputs["values"] = _poke(rng, values, (-1, -2**31))
        elif kind == 2:
            inputs["weights"] = _f32(np.ones(n + 1 + int(rng.integers(3))))
        elif kind == 3:
            attrs["combiner"] = str(_pick(rng, ("max", "", "SUM")))
        elif kind == 4:
            inputs["indices_or_row_splits"] = _i32(rng.integers(-2, sample_count + 2, (n, 2)))
            expect = "any"
        elif kind == 5 and listed:
            attrs["num_sc_shards"] = int(_pick(rng, (3, 5, 6)))
        elif kind == 6:
            inputs["weights"] = _f32(_pick(rng, (np.nan, np.inf, -np.inf, 0.0)))
            expect = "any"
        else:
            inputs["values"] = values.reshape(1, -1)  # rank 2
    name = "ConvertToListOfSparseCoreCooTensors" if listed else "ConvertToCooTensor"
    return _case(_name(rng, name), inputs, attrs, expect)


def _name(rng, bare):
    return bare if rng.random() < 0.5 else PREFIX + bare


# ------------------------------------------------------ §2 sort and statistics

def gen_sort(rng):
    features = int(rng.integers(1, 4))
    per_sc = int(_pick(rng, (1, 2, 4)))
    rows, cols, gains = [], [], []
    for _ in range(features):
        n = int(rng.integers(0, 10))
        rows.append(_i32(rng.integers(0, per_sc, n)))
        cols.append(_i32(rng.integers(0, 40, n)))
        gains.append(_f32(rng.uniform(0.1, 1.0, n)))
    stats = rng.random() < 0.4
    attrs = dict(sample_count_list=[per_sc] * features,
                 col_offset_list=[int(_pick(rng, (0, 0, 16))) for _ in range(features)],
                 num_replica=int(_pick(rng, (1, 2))), table_vocab_size=64, feature_width=4,
                 num_sc_per_chip=int(_pick(rng, (1, 2, 4))), table_name="t")
    if not stats:
        attrs.update(max_ids_per_sparse_core=1024, max_unique_ids_per_sparse_core=1024)
    inputs = dict(row_ids_list=rows, col_ids_list=cols, gains_list=gains)
    expect = "ok"
    if rng.random() < MUTATE:
        kind = int(rng.integers(5))
        f = int(rng.integers(features))
        expect = "fail"
        if kind == 0:
            cols[f] = _i32(np.concatenate([cols[f], [1]]))
        elif kind == 1 and cols[f].size:
            cols[f] = _poke(rng, cols[f], (-1, -2**31))
        elif kind == 2:
            attrs["num_replica"] = int(_pick(rng, (3, 5, 6)))
        elif kind == 3 and not stats:
            attrs["max_ids_per_sparse_core"] = 1
            expect = "any"
        else:
            attrs["sample_count_list"] = attrs["sample_count_list"] + [1]
    name = "GetStatsFromListOfSparseCoreCooTensors" if stats else "SortListOfSparseCoreCooTensors"
    return _case(_name(rng, name), inputs, attrs, expect)


# ------------------------------------------------------ §3-§4 CSR buffers

def gen_csr(rng):
    num_sc = int(_pick(rng, (1, 2, 4)))
    num_replica = int(_pick(rng, (1, 2)))
    p = num_sc * num_replica
    minibatching = rng.random() < 0.4
    per_sc_counts = []
    rows, cols, gains, counts = [], [], [], []
    segments = 0
    for _ in range(num_sc):
        c = rng.integers(0, 4, p * 64 if minibatching else p)
        per_sc_counts.append(c)
        n = int(c.sum())
        counts.append(_i32(np.concatenate([[0], np.cumsum(c)])))
        rows.append(_i32(rng.integers(0, 8, n)))
        cols.append(_i32(rng.integers(0, 32, n)))
        gains.append(_f32(rng.uniform(0.1, 1.0, n)))
        segments += p + int(c.sum())
    # Enough room for every id and each segment's padding, a multiple of 8.
    sample_count_per_sc = 8
    per_sample = max(1, -(-(segments + 8 * p * num_sc) // (sample_count_per_sc * num_sc)))
    attrs = dict(sample_count_per_sc=sample_count_per_sc, num_replica=num_replica,
                 max_minibatches_per_sc=int(_pick(rng, (1, 2, 4))),
                 max_ids_per_chip_per_sample=per_sample, table_vocab_size=64, feature_width=4,
                 table_name="t",  # num_sc_per_chip: the lists' length
                 allow_id_dropping=bool(rng.random() < 0.3))
    inputs = dict(sorted_row_ids_list=rows, sorted_col_ids_list=cols, sorted_gains_list=gains,
                  id_counts_list=counts, splits=np.int64(0))
    expect = "ok"
    if rng.random() < MUTATE:
        kind = int(rng.integers(7))
        s = int(rng.integers(num_sc))
        expect = "fail"
        if kind == 0:
            counts[s] = _poke(rng, counts[s], (-1, 2**20, -2**31))
            expect = "any"  # may land on a value that is still in order
        elif kind == 1:
            counts[s] = counts[s][:-1]
        elif kind == 2:
            inputs["splits"] = np.int64(-int(rng.integers(1, 2**40)))
        elif kind == 3:
            inputs["splits"] = np.int64(rng.integers(1, 2**40))
            expect = "any"  # more minibatches than allowed, or ids over the buffer
        elif kind == 4:
            gains[s] = _f32(np.concatenate([gains[s], [1.0]]))
        elif kind == 5:
            attrs["max_ids_per_chip_per_sample"] = int(_pick(rng, (1, 3, 2**12)))
            expect = "any"  # too small (dropped or an error), or not a multiple of 8
        else:
            attrs["max_minibatches_per_sc"] = int(_pick(rng, (1, 2**12)))
            expect = "any"
    return _case(_name(rng, "ConvertToSparseCoreCsrWrappedCooTensor"), inputs, attrs, expect)


def gen_minibatch(rng):
    num_sc = int(_pick(rng, (1, 2, 4)))
    sample_count = num_sc * int(_pick(rng, (1, 2, 4)))
    vocab = int(_pick(rng, (1, 7, 64, 200)))
    n = int(rng.integers(0, 12))
    rows = _i32(np.sort(rng.integers(0, sample_count, n)))
    cols = _i32(rng.integers(0, vocab, n))
    gains = _f32(rng.uniform(0.1, 1.0, n))
    common = dict(program_key=np.array([""]))
    attrs = dict(sample_count=sample_count, num_replica=1, table_vocab_size=vocab,
                 feature_width=4, num_sc_per_chip=num_sc, table_name="t")
    in_csr = rng.random() < 0.5
    if in_csr:  # GetMinibatchesInCsr on id counts of 64 divisions per (sc, replica)
        divisions = 64 * num_sc * num_sc  # (sc, replica, division); num_replica 1
        counts = _i32(np.concatenate([[0], np.cumsum(
            np.bincount(rng.integers(0, divisions, n), minlength=divisions))]))
        inputs = dict(common, row_ids=_i32(rng.integers(0, sample_count // num_sc, n)),
                      col_ids=_i32(rng.integers(0, vocab, n)), gains=gains,
                      splits=np.zeros([1], np.int64), id_counts=counts)
        attrs.update(max_minibatches_per_sc=2, mini_batch_in_csr="",
                     max_ids_per_chip_per_sample=8 * (1 + (n + 8 * num_sc**2) // sample_count))
    else:
        inputs = dict(common, row_ids=rows, col_ids=cols, gains=gains)
        attrs["mini_batch_splits"] = ""
    expect = "ok"
    if rng.random() < MUTATE:
        kind = int(rng.integers(5))
        expect = "fail"
        if kind == 0 and n and not in_csr:
            inputs["row_ids"] = _poke(rng, rows, (-1, sample_count, 2**31 - 1))
            expect = "any"  # the poked row may keep the order and the range
        elif kind == 1 and n and not in_csr:
            inputs["col_ids"] = _poke(rng, cols, (-1, vocab, -2**31))
        elif kind == 2:
            attrs["sample_count"] = sample_count + 1 if num_sc > 1 else sample_count
            expect = "fail" if num_sc > 1 else "ok"
        elif kind == 3 and in_csr:
            inputs["id_counts"] = _poke(rng, inputs["id_counts"], (-1, n + 1, 2**31 - 1))
            expect = "any"
        else:
            inputs["gains"] = _f32(np.ones(n + 1))
    name = ("GetMinibatchesInCsrWithPhysicalReplica" if in_csr
            else "GetMinibatchSplitsWithPhysicalReplica")
    return _case(_name(rng, name), inputs, attrs, expect)


# ------------------------------------------------------ §5-§8 lookups, gradients

def pack_csr(rng, num_sc, m, batch, shard_rows, pos_ids=False, max_valency=0):
    """Random buffers in §5's layout (§8.1's with pos_ids, m = 1): per group
    (sample SparseCore major, minibatch minor), per shard, a few ids."""
    g = -(-num_sc // 8) * 8
    rp, sid, tid, pid, gn = [], [], [], [], []
    used = set()
    for k in range(num_sc * m):
        for j in range(g):
            for _ in range(int(rng.integers(0, 4)) if j < num_sc else 0):
                s = int(rng.integers(0, batch))
                if pos_ids:
                    free = [q for q in range(max_valency) if (k, s, q) not in used]
                    if not free:
                        continue
                    q = free[int(rng.integers(len(free)))]
                    used.add((k, s, q))
                    pid.append(q)
                sid.append(s)
                tid.append(int(rng.integers(0, shard_rows)))
                gn.append(float(rng.uniform(0.1, 1.5)))
            rp.append(len(sid))
            pad = -len(sid) % 8
            sid += [PAD] * pad
            tid += [PAD] * pad
            pid += [PAD] * (pad if pos_ids else 0)
            gn += [float(PAD)] * pad
    rp += [len(sid)] * (8 * g)  # a producer's padded tail
    out = dict(row_pointers=_i32(rp), sorted_sample_ids=_i32(sid), sorted_token_ids=_i32(tid),
               sorted_gains=_f32(gn))
    if pos_ids:
        out["sorted_pos_ids"] = _i32(pid)
        valencies = np.zeros(num_sc * batch, np.int32)
        for k, s, q in used:
            valencies[k * batch + s] = max(valencies[k * batch + s], q + 1)
        return out, valencies
    return out


def _mutate_buffers(rng, bufs, batch, shard_rows):
    """One hostile change to the buffers; the expectation."""
    kind = int(rng.integers(5))
    n = bufs["sorted_sample_ids"].size
    real = [i for i in range(n) if bufs["sorted_sample_ids"][i] != PAD]
    if kind == 0 and real:
        i = real[int(rng.integers(len(real)))]
        bufs["sorted_sample_ids"] = bufs["sorted_sample_ids"].copy()
        bufs["sorted_sample_ids"][i] = _pick(rng, (-1, batch, 2**31 - 1))
        return "fail"
    if kind == 1 and real:
        i = real[int(rng.integers(len(real)))]
        bufs["sorted_token_ids"] = bufs["sorted_token_ids"].copy()
        bufs["sorted_token_ids"][i] = _pick(rng, (-1, shard_rows, -2**31))
        return "fail"
    if kind == 2:
        bufs["row_pointers"] = _poke(rng, bufs["row_pointers"], (-1, n + 1, 2**31 - 1))
        return "any"
    if kind == 3:
        bufs["sorted_gains"] = bufs["sorted_gains"][:-1]
        return "fail" if n else "any"
    bufs["row_pointers"] = bufs["row_pointers"][:int(rng.integers(0, 3))]
    return "fail"


def gen_matmul(rng):
    num_sc = int(_pick(rng, (1, 2, 4)))
    m = int(_pick(rng, (1, 2)))
    batch, shard_rows, width = int(rng.integers(1, 4)), int(rng.integers(1, 5)), int(
        rng.integers(1, 4))
    bufs = pack_csr(rng, num_sc, m, batch, shard_rows)
    table = _f32(rng.normal(size=(num_sc * shard_rows, width)))
    kind = str(_pick(rng, ("lookup", "grad", "standalone")))
    expect = "ok"
    if kind == "standalone":
        opt = str(_pick(rng, tuple(OPTIMIZERS)))
        return gen_standalone(rng, opt, table)
    common = dict(bufs, embedding_table=table,
                  num_minibatches_per_physical_sparse_core=np.int32(m))
    attrs = dict(table_name="t", num_sparsecores_per_device=num_sc)
    static = rng.random() < 0.3  # the ...StaticBufferSize twins: the same kernels
    if static:
        attrs.update(max_ids_per_sparse_core=64, max_unique_ids_per_sparse_core=64)
    form = "StaticBufferSize" if static else "CsrInput"
    if kind == "lookup":
        name = "XlaSparseDenseMatmulWith" + form
        attrs.update(input_size=num_sc * batch, quantization_config_low=0.0,
                     quantization_config_high=0.0, quantization_config_num_buckets=0)
        inputs = common
    else:
        opt = str(_pick(rng, tuple(OPTIMIZERS)))
        name = "XlaSparseDenseMatmulGradWith%sAnd%s" % (opt, form)
        inputs = dict(common, activation_gradients=_f32(rng.normal(size=(num_sc * batch, width))),
                      learning_rate=_f32(0.1))
        for slot in OPTIMIZERS[opt]:
            inputs[slot] = _f32(rng.uniform(0.1, 1.0, table.shape))
        attrs.update(HYPER.get(opt, {}), clip_weight_min=-1.0, clip_weight_max=1.0)
    if rng.random() < MUTATE:
        what = int(rng.integers(5))
        expect = "fail"
        if what == 0:
            expect = _mutate_buffers(rng, inputs, batch, shard_rows)
        elif what == 1:
            inputs["embedding_table"] = _f32(np.ones((num_sc * shard_rows + 1, width)))
            expect = "fail" if num_sc > 1 else "any"
        elif what == 2:
            count = int(_pick(rng, (0, -1, 2**20, 9)))
            inputs["num_minibatches_per_physical_sparse_core"] = np.int32(count)
            expect = "any" if count == 9 else "fail"  # 9: may read the padded tail
        elif what == 3:
            attrs["num_sparsecores_per_device"] = int(_pick(rng, (-1, 0, 3)))
        elif kind == "grad":
            inputs["activation_gradients"] = _f32(np.ones((num_sc * batch, width + 1)))
        else:
            attrs["quantization_config_num_buckets"] = 4
    return _case(_name(rng, name), inputs, attrs, expect)


def gen_standalone(rng, opt, table):
    rows, width = table.shape
    n = int(rng.integers(0, 6))
    inputs = dict(indices=_i32(rng.integers(0, rows, n)),
                  gradient=_f32(rng.normal(size=(n, width))), learning_rate=_f32(0.1),
                  embedding_table=table)
    attrs = dict(feature_width=width)
    slot_names = {"Adagrad": ["accumulator"], "AdagradMomentum": ["accumulator", "momentum"],
                  "Adam": ["momentum", "velocity"], "Ftrl": ["accumulator", "linear"]}
    for slot in slot_names.get(opt, []):
        inputs[slot] = _f32(rng.uniform(0.1, 1.0, table.shape))
    if opt == "AdagradMomentum":
        inputs.update(beta_1=_f32(0.9), epsilon=_f32(1e-3))
        attrs.update(use_nesterov=True, beta_2=0.99, exponent=2.0)
    elif opt == "Adam":
        inputs.update(beta_1=_f32(0.9), beta_2=_f32(0.99), epsilon=_f32(1e-3))
        attrs["use_sum_inside_sqrt"] = False
    elif opt == "Ftrl":
        inputs.update(beta=_f32(0.1), learning_rate_power=_f32(-0.5),
                      l2_regularization_strength=_f32(0.0))
        attrs.update(multiply_linear_by_learning_rate=True, l1_regularization_strength=0.0)
    expect = "ok"
    if rng.random() < MUTATE:
        kind = int(rng.integers(4))
        expect = "fail"
        if kind == 0 and n:
            inputs["indices"] = _poke(rng, inputs["indices"], (-1, rows, 2**31 - 1, -2**31))
        elif kind == 1:
            inputs["gradient"] = _f32(np.ones((n + 1, width)))
        elif kind == 2:
            attrs["feature_width"] = int(_pick(rng, (0, -1, width + 1)))
        else:
            inputs["learning_rate"] = _f32(np.ones(2))
    return _case(_name(rng, "XlaSparseCore" + opt), inputs, attrs, expect)


def gen_coo_matmul(rng):
    n, input_size = int(rng.integers(0, 12)), int(rng.integers(1, 6))
    rows_, width = int(rng.integers(1, 8)), int(rng.integers(1, 4))
    inputs = dict(row_ids=_i32(rng.integers(0, input_size, n)),
                  col_ids=np.asarray(rng.integers(0, rows_, n), np.uint32),
                  values=_f32(rng.uniform(0.1, 1.0, n)), offsets=np.uint32(0),
                  embedding_table=_f32(rng.normal(size=(rows_, width))))
    attrs = dict(max_ids_per_partition=64, max_unique_ids_per_partition=64, input_size=input_size)
    expect = "ok"
    if rng.random() < MUTATE:
        kind = int(rng.integers(5))
        expect = "fail"
        if kind == 0 and n:
            inputs["row_ids"] = _poke(rng, inputs["row_ids"], (-1, input_size, -2**31))
        elif kind == 1 and n:
            inputs["col_ids"] = _poke(rng, inputs["col_ids"], (rows_, 2**32 - 1))
        elif kind == 2:
            inputs["values"] = _f32(np.ones(n + 1))
        elif kind == 3:
            inputs["offsets"] = np.uint32(_pick(rng, (1, 2**32 - 1)))
        else:
            attrs["max_ids_per_partition"] = 0
            expect = "fail" if n else "ok"
    return _case(_name(rng, "XlaSparseDenseMatmul"), inputs, attrs, expect)


def gen_combiner(rng):
    """The custom-combiner lookup with a masked-sum combiner, or a gradient
    with its VJP (or ones returning the wrong shape); the functions are
    built by the executor (_function)."""
    num_sc, batch, shard_rows = int(_pick(rng, (1, 2))), int(rng.integers(1, 4)), int(
        rng.integers(1, 4))
    valency, width = int(rng.integers(1, 4)), int(rng.integers(1, 4))
    size = num_sc * batch
    bufs, valencies = pack_csr(rng, num_sc, 1, batch, shard_rows, pos_ids=True,
                               max_valency=valency)
    table = _f32(rng.normal(size=(num_sc * shard_rows, width)))
    attrs = dict(max_valency=valency, num_weights=0, table_name="t",
                 num_sparsecores_per_device=num_sc)
    spec = {"size": size, "valency": valency, "width": width}
    grad = rng.random() < 0.5
    if grad:
        opt = str(_pick(rng, tuple(OPTIMIZERS)))
        name = "XlaSparseDenseMatmulCustomCombinerOnTcGradWith%sAndCsrInput" % opt
        inputs = dict(bufs, weights=_f32(np.zeros([0])), preserved_valencies=valencies,
                      preserved_vectors=_f32(rng.normal(size=(size, valency, width))),
                      preserved_weights=_f32(np.zeros([0])),
                      activation_gradients=_f32(rng.normal(size=(size, width))),
                      learning_rate=_f32(0.1), combiner_weights_learning_rate=_f32(0.1),
                      embedding_table=table)
        for slot in OPTIMIZERS[opt]:
            inputs[slot] = _f32(rng.uniform(0.1, 1.0, table.shape))
        attrs.update(HYPER.get(opt, {}), clip_weight_min=-1.0, clip_weight_max=1.0)
        fns = [dict(spec, attr="combiner_table_vjp_computation", kind="table_vjp"),
               dict(spec, attr="combiner_weights_vjp_computation", kind="weights_vjp")]
    else:
        name = "XlaSparseDenseMatmulCustomCombinerOnTcWithCsrInput"
        inputs = dict(bufs, embedding_table=table, weights=_f32(np.zeros([0])))
        attrs.update(input_size=size, quantization_config_low=0.0, quantization_config_high=0.0,
                     quantization_config_num_buckets=0)
        fns = [dict(spec, attr="combiner_computation", kind="masked_sum")]
    expect = "ok"
    if rng.random() < MUTATE:
        kind = int(rng.integers(4))
        expect = "fail"
        if kind == 0:
            expect = _mutate_buffers(rng, inputs, batch, shard_rows)
        elif kind == 1 and any(p != PAD for p in bufs["sorted_pos_ids"]):
            inputs["sorted_pos_ids"] = _poke(rng, bufs["sorted_pos_ids"], (-1, valency))
            expect = "any"  # the poked entry may be padding
        elif kind == 2 and grad:
            inputs["preserved_valencies"] = _pick(rng, (
                valencies[:-1], np.zeros_like(valencies), valencies.reshape(1, -1)))
            expect = "any"  # zero valencies fail only where a sample has ids
        else:
            fns[0]["kind"] = "wrong_shape"
    return _case(_name(rng, name), inputs, attrs, expect, functions=fns)


GENERATORS = (gen_coo, gen_sort, gen_csr, gen_minibatch, gen_matmul, gen_coo_matmul,
              gen_combiner)


def generate(rng):
    return _pick(rng, GENERATORS)(rng)


# ------------------------------------------------------ the executor's side

def _function(spec):
    """A concrete function for a `func` attr of a case (semantics §8.1's
    argument lists, num_weights 0)."""
    import tensorflow as tf  # pylint: disable=import-outside-toplevel

    size, valency, width, kind = spec["size"], spec["valency"], spec["width"], spec["kind"]
    val = tf.TensorSpec([size], tf.int32)
    vec = tf.TensorSpec([size, valency, width], tf.float32)
    act = tf.TensorSpec([size, width], tf.float32)

    def mask(valencies):
        return tf.cast(tf.range(valency)[None, :] < valencies[:, None], tf.float32)

    def masked_sum(valencies, vectors):
        return tf.einsum("bv,bvw->bw", mask(valencies), vectors)

    def table_vjp(valencies, vectors, grads):
        del vectors
        return mask(valencies)[:, :, None] * grads[:, None, :]

    def weights_vjp(valencies, vectors, grads):
        del valencies, vectors, grads
        return tf.zeros([0])

    def wrong_shape(valencies, vectors, *grads):
        del grads
        return tf.concat([masked_sum(valencies, vectors)] * 2, axis=1)

    body, specs = {"masked_sum": (masked_sum, (val, vec)),
                   "table_vjp": (table_vjp, (val, vec, act)),
                   "weights_vjp": (weights_vjp, (val, vec, act)),
                   "wrong_shape": (wrong_shape, (val, vec) + (
                       (act,) if spec["attr"] != "combiner_computation" else ()))}[kind]
    return tf.function(body, autograph=False).get_concrete_function(*specs)


def run(name, inputs, attrs, functions):
    """Runs the op once in a graph, the inputs' shapes hidden; an op-def
    error at construction is raised as InvalidArgumentError."""
    # pylint: disable=import-outside-toplevel,protected-access
    import tensorflow as tf
    from tensorflow.core.framework import attr_value_pb2
    from tensorflow.python.framework import op_def_library

    fns = [(spec["attr"], _function(spec)) for spec in functions]

    def hidden(x):
        if isinstance(x, list):
            return [hidden(e) for e in x]
        return tf.compat.v1.placeholder_with_default(x, shape=None)

    @tf.function(autograph=False)
    def graph():
        args = {k: hidden(v) for k, v in inputs.items()}
        args.update(attrs)
        for attr, fn in fns:
            fn.add_to_graph()
            args[attr] = attr_value_pb2.NameAttrList(name=fn.name)
        try:
            _, _, op, _ = op_def_library._apply_op_helper(name, **args)
        except (ValueError, TypeError) as e:
            raise tf.errors.InvalidArgumentError(None, None, "op construction: %s" % e)
        return list(op.outputs)

    return [o.numpy() for o in graph()]
