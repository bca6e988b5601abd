"""The model, inputs, training loop and numpy reference shared by
tests/api/test_mid_level.py and tests/api/mid_level_strategy_script.py (the
MirroredStrategy runs, which need their own process for TF's logical CPUs).

The model: two tables and five features covering every input kind of TF's
v2 API (``tf_tpu_emb.TPUEmbedding`` takes TF's own config/optimizer classes):

=================  =======  ======================  ====================================
path               table    input                   activation (per replica, batch b)
=================  =======  ======================  ====================================
``watched``        video    weighted SparseTensor   [b, 4]   (sum combiner)
``liked``          video    dense ids [b]           [b, 4]
``pair``           video    RaggedTensor,           [b/2, 2, 4]
                            ``output_shape=[b/2,2]``
``friends``        user     weighted RaggedTensor   [b, 3]   (mean combiner)
``seq/history``    user     SparseTensor [b, L],    [b, L, 3]
                            ``max_sequence_length``
=================  =======  ======================  ====================================

The loss of a step is ``Σ_features Σ act * c`` with a fixed random ``c`` per
feature, so dL/d(activations) = c and the expected update follows from the
inputs alone: tests/common/optimizer_reference.py (spec-derived, float64) is applied
to the GLOBAL batch; with R replicas, replica r gets rows [r*b, (r+1)*b) of it.
"""
import os
import sys

import numpy as np
import tensorflow as tf

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import optimizer_reference as ref  # noqa: E402

E = tf.tpu.experimental.embedding

GLOBAL_BATCH = 8
SEQ_L = 3          # max_sequence_length of seq/history
WIDTH = 3          # dense_shape[1] of `watched`
TABLES = {"video": (12, 4, "sum"), "user": (9, 3, "mean")}   # vocab, dim, combiner
# path -> (table, kind)
FEATURES = {"watched": ("video", "sparse"), "liked": ("video", "dense"),
            "pair": ("video", "ragged"), "friends": ("user", "ragged"),
            "seq/history": ("user", "sequence")}
WEIGHTED = ("watched", "friends")
PATHS = sorted(FEATURES)   # tf.nest order of the nested dict


# ------------------------------------------------------------------ optimizers

def optimizer_case(name, lr=None):
    """(TF optimizer object, reference TableParams, slot names, slot initial
    values) for one of sgd / adagrad / adam / ftrl.  `lr` may be a callable
    (dynamic learning rate; the reference's TableParams then has lr_tag 0)."""
    tag = 0 if callable(lr) else None
    if name == "sgd":
        lr = 0.1 if lr is None else lr
        return (E.SGD(learning_rate=lr),
                ref.TableParams("stochastic_gradient_descent", {}, _const(lr), tag), [], [])
    if name == "adagrad":
        lr = 0.1 if lr is None else lr
        return (E.Adagrad(learning_rate=lr, initial_accumulator_value=0.2),
                ref.TableParams("adagrad", {}, _const(lr), tag), ["accumulators"], [0.2])
    if name == "adam":
        lr = 0.05 if lr is None else lr
        return (E.Adam(learning_rate=lr, beta_1=0.8, beta_2=0.95, epsilon=1e-3),
                ref.TableParams("adam", dict(beta1=0.8, beta2=0.95, epsilon=1e-3,
                                             use_sum_inside_sqrt=True), _const(lr), tag),
                ["momenta", "velocities"], [0.0, 0.0])
    if name == "ftrl":
        lr = 0.1 if lr is None else lr
        return (E.FTRL(learning_rate=lr, learning_rate_power=-0.5,
                       l1_regularization_strength=0.01, l2_regularization_strength=0.05,
                       beta=0.1, initial_accumulator_value=0.1),
                ref.TableParams("ftrl", dict(l1=0.01, l2=0.05, lr_power=-0.5, beta=0.1),
                                _const(lr), tag),
                ["accumulators", "linears"], [0.1, 0.0])
    raise ValueError(name)


def _const(lr):
    return 0.0 if callable(lr) else lr


# ------------------------------------------------------------------ model

def initial_tables(seed=0):
    rng = np.random.default_rng(seed)
    return {n: rng.uniform(-1, 1, (v, d)).astype(np.float32)
            for n, (v, d, _) in TABLES.items()}


def make_feature_config(per_replica_batch, initial=None):
    """(nested feature config, {table name: TableConfig}); fresh objects every
    call (TPUEmbedding sets the optimizer of tables that have none)."""
    initial = initial_tables() if initial is None else initial
    tables = {n: E.TableConfig(vocabulary_size=v, dim=d, combiner=c, name=n,
                               initializer=tf.constant_initializer(initial[n]))
              for n, (v, d, c) in TABLES.items()}
    fc = {
        "watched": E.FeatureConfig(tables["video"], name="watched"),
        "liked": E.FeatureConfig(tables["video"], name="liked"),
        "pair": E.FeatureConfig(tables["video"], name="pair",
                                output_shape=[per_replica_batch // 2, 2]),
        "friends": E.FeatureConfig(tables["user"], name="friends"),
        "seq": {"history": E.FeatureConfig(tables["user"], name="history",
                                           max_sequence_length=SEQ_L)},
    }
    return fc, tables


def put(tree, path, value):
    keys = path.split("/")
    for k in keys[:-1]:
        tree = tree.setdefault(k, {})
    tree[keys[-1]] = value


def get(tree, path):
    for k in path.split("/"):
        tree = tree[k]
    return tree


def nested(flat):
    """{path: x} -> the feature config's nested structure."""
    out = {}
    for p in PATHS:
        put(out, p, flat[p])
    return out


def flat(tree):
    return {p: get(tree, p) for p in PATHS}


def out_tail(path):
    """Output dims after the batch dim of a GLOBAL-batch reference array."""
    table = FEATURES[path][0]
    dim = TABLES[table][1]
    return [SEQ_L, dim] if path == "seq/history" else [dim]


def replica_output_shape(path, b):
    """Activation shape of one replica with per-replica batch b."""
    dim = TABLES[FEATURES[path][0]][1]
    if path == "pair":
        return [b // 2, 2, dim]
    if path == "seq/history":
        return [b, SEQ_L, dim]
    return [b, dim]


# ------------------------------------------------------------------ data

def make_batch(rng, batch=GLOBAL_BATCH):
    """Raw inputs of one global batch: per path a list of `batch` rows; a row
    is a bag [(id, weight)] (sparse/ragged/dense) or, for the sequence
    feature, [(position, id)]."""
    raw = {}
    for path, (table, kind) in FEATURES.items():
        vocab = TABLES[table][0]
        rows = []
        for _ in range(batch):
            if kind == "dense":
                rows.append([(int(rng.integers(vocab)), 1.0)])
            elif kind == "sequence":
                positions = sorted(rng.choice(SEQ_L, int(rng.integers(0, SEQ_L + 1)),
                                              replace=False))
                rows.append([(int(p), int(rng.integers(vocab))) for p in positions])
            else:
                n = int(rng.integers(0, (WIDTH if path == "watched" else 3) + 1))
                if path == "pair":
                    n = int(rng.integers(0, 3))
                ws = (rng.uniform(0.25, 2.0, n) if path in WEIGHTED else np.ones(n))
                rows.append([(int(i), float(np.float32(w)))
                             for i, w in zip(rng.integers(0, vocab, n), ws)])
        raw[path] = rows
    return raw


def make_grads(rng, batch=GLOBAL_BATCH):
    """c per path, GLOBAL shape [batch] + out_tail(path), float32."""
    return {p: rng.uniform(-1, 1, [batch] + out_tail(p)).astype(np.float32) for p in PATHS}


def to_tensors(raw):
    """(features, weights) as TF values with the nested structure (weights:
    None for unweighted features); static dense shapes."""
    feats, weights = {}, {}
    for path in PATHS:
        kind = FEATURES[path][1]
        rows = raw[path]
        w = None
        if kind == "dense":
            x = tf.constant([r[0][0] for r in rows], tf.int64)
        elif kind in ("sparse", "sequence"):
            if kind == "sparse":
                idx = [[b, k] for b, r in enumerate(rows) for k in range(len(r))]
                vals = [i for r in rows for i, _ in r]
                ws = [wt for r in rows for _, wt in r]
                width = WIDTH
            else:
                idx = [[b, p] for b, r in enumerate(rows) for p, _ in r]
                vals = [i for r in rows for _, i in r]
                ws = None
                width = SEQ_L
            idx = np.array(idx, np.int64).reshape(-1, 2)
            x = tf.SparseTensor(idx, tf.constant(vals, tf.int64), [len(rows), width])
            if path in WEIGHTED:
                w = tf.SparseTensor(idx, tf.constant(ws, tf.float32), [len(rows), width])
        else:
            splits = np.cumsum([0] + [len(r) for r in rows]).astype(np.int64)
            x = tf.RaggedTensor.from_row_splits(
                tf.constant([i for r in rows for i, _ in r], tf.int64), splits)
            if path in WEIGHTED:
                w = tf.RaggedTensor.from_row_splits(
                    tf.constant([wt for r in rows for _, wt in r], tf.float32), splits)
        feats[path] = x
        weights[path] = w
    return nested(feats), nested(weights)


def input_signature(batch=GLOBAL_BATCH):
    """tf.function input signature of (features, weights, c) for a batch."""
    feats, weights, cs = {}, {}, {}
    for path in PATHS:
        kind = FEATURES[path][1]
        if kind == "dense":
            feats[path] = tf.TensorSpec([batch], tf.int64)
        elif kind in ("sparse", "sequence"):
            feats[path] = tf.SparseTensorSpec([batch, WIDTH if kind == "sparse" else SEQ_L],
                                              tf.int64)
        else:
            feats[path] = tf.RaggedTensorSpec([batch, None], tf.int64, 1, tf.int64)
        if path in WEIGHTED:
            weights[path] = (tf.SparseTensorSpec(feats[path].shape, tf.float32)
                             if kind == "sparse" else
                             tf.RaggedTensorSpec([batch, None], tf.float32, 1, tf.int64))
        cs[path] = tf.TensorSpec([batch] + out_tail(path), tf.float32)
    # Weights: {path: spec} of the weighted features only (a signature cannot
    # hold None); see full_weights.
    return nested(feats), weights, nested(cs)


def full_weights(weights):
    """{weighted path: w} -> the nested weights structure (None elsewhere)."""
    return nested({p: weights.get(p) for p in PATHS})


def slice_rows(x, lo, size):
    """Rows [lo, lo+size) of a batch-major dense/sparse/ragged tensor."""
    if x is None:
        return None
    if isinstance(x, tf.SparseTensor):
        width = x.shape[1]
        out = tf.sparse.slice(x, [lo, 0], [size, width])
        return tf.SparseTensor(out.indices, out.values, [size, width])
    return x[lo:lo + size]


# ------------------------------------------------------------------ reference

def reference_forward(tables, raw):
    """Global activations {path: float64 [batch] + tail} (pair: [batch, dim])."""
    out = {}
    for path in PATHS:
        table_name, kind = FEATURES[path]
        table = np.asarray(tables[table_name], np.float64)
        comb = TABLES[table_name][2]
        rows = raw[path]
        if kind == "sequence":
            act = np.zeros([len(rows), SEQ_L, table.shape[1]])
            for b, r in enumerate(rows):
                for p, i in r:
                    act[b, p] = table[i]
        else:
            act = np.zeros([len(rows), table.shape[1]])
            for b, bag in enumerate(rows):
                if bag:
                    ids = [i for i, _ in bag]
                    coef = ref.bag_coefficients(bag, comb) if comb == "mean" else \
                        np.array([w for _, w in bag], np.float64)
                    act[b] = (coef[:, None] * table[ids]).sum(0)
        out[path] = act
    return out


def table_contributions(raw, c, table_name):
    """The reference's contributions of one table for one step."""
    outputs = []
    comb = TABLES[table_name][2]
    for path in PATHS:
        t, kind = FEATURES[path]
        if t != table_name:
            continue
        if kind == "sequence":
            bags = []
            for r in raw[path]:
                by_pos = dict(r)
                bags += [[(by_pos[p], 1.0)] if p in by_pos else [] for p in range(SEQ_L)]
            outputs.append((bags, comb, c[path].reshape(-1, TABLES[t][1])))
        else:
            outputs.append((raw[path], comb, c[path].reshape(-1, TABLES[t][1])))
    return ref.contributions(outputs)


class Reference:
    """float64 state [W, slots...] per table, stepped with the spec's rules."""

    def __init__(self, params, slot_inits, initial=None):
        initial = initial_tables() if initial is None else initial
        self.params = params  # {table name: TableParams}
        self.state = {}
        for n, (v, d, _) in TABLES.items():
            self.state[n] = [initial[n].astype(np.float64)] + [
                np.full((v, d), s, np.float64) for s in slot_inits[n]]

    def forward(self, raw):
        return reference_forward({n: s[0] for n, s in self.state.items()}, raw)

    def step(self, raw, c, dynamic=()):
        for n in TABLES:
            ref.step(self.params[n], self.state[n], table_contributions(raw, c, n), dynamic)


# ------------------------------------------------------------------ training

def loss_fn(act, c):
    return tf.add_n([tf.reduce_sum(a * cc) for a, cc in zip(tf.nest.flatten(act),
                                                            tf.nest.flatten(c))])


def dequeue_and_apply(embedding, c):
    with tf.GradientTape() as tape:
        act = embedding.dequeue()
        tape.watch(act)
        loss = loss_fn(act, c)
    embedding.apply_gradients(tape.gradient(loss, act))
    return act


def train_step(embedding, features, weights, c):
    embedding.enqueue(features, weights, training=True)
    return dequeue_and_apply(embedding, c)


class Trainer:
    """Runs training steps of `embedding` under `strategy` on GLOBAL batches.

    mode: "direct" (no strategy.run: plain inputs, one replica only),
    "inside" (enqueue + dequeue + apply_gradients inside strategy.run, inputs
    per replica from experimental_distribute_values_from_function) or
    "outside" (enqueue of the distributed values outside strategy.run, then
    dequeue + apply_gradients inside it); eagerly or in a tf.function (with an
    input signature of the global batch).
    """

    def __init__(self, strategy, embedding, batch=GLOBAL_BATCH):
        self.strategy, self.embedding, self.batch = strategy, embedding, batch
        self.replicas = strategy.num_replicas_in_sync
        self.b = batch // self.replicas
        self._fns = {}

    def _distribute(self, features, weights, c):
        b = self.b

        def value_fn(ctx):
            lo = ctx.replica_id_in_sync_group * b
            f = tf.nest.map_structure(lambda x: slice_rows(x, lo, b), features)
            w = {p: slice_rows(get(weights, p), lo, b) for p in PATHS}
            cs = {p: tf.reshape(get(c, p)[lo:lo + b], replica_output_shape(p, b))
                  for p in PATHS}
            return f, nested(w), nested(cs)
        return self.strategy.experimental_distribute_values_from_function(value_fn)

    def _run(self, mode, features, weights, c):
        emb = self.embedding
        if mode == "direct":
            cs = nested({p: tf.reshape(get(c, p), replica_output_shape(p, self.batch))
                         for p in PATHS})
            return train_step(emb, features, weights, cs)
        f, w, cs = self._distribute(features, weights, c)
        if mode == "inside":
            return self.strategy.run(lambda f, w, cs: train_step(emb, f, w, cs),
                                     args=(f, w, cs))
        emb.enqueue(f, w, training=True)
        return self.strategy.run(lambda cs: dequeue_and_apply(emb, cs), args=(cs,))

    def step(self, raw, c, mode, use_function):
        features, weights = to_tensors(raw)
        c = nested({p: tf.constant(c[p]) for p in PATHS})
        if use_function:
            key = mode
            if key not in self._fns:
                self._fns[key] = tf.function(
                    lambda f, w, cs, mode=mode: self._run(mode, f, full_weights(w), cs),
                    input_signature=list(input_signature(self.batch)))
            out = self._fns[key](features, {p: get(weights, p) for p in WEIGHTED}, c)
        else:
            out = self._run(mode, features, weights, c)
        return self.global_activations(out)

    def global_activations(self, out):
        """{path: numpy} with replicas concatenated along the batch axis, pair
        reshaped to [batch, dim]."""
        result = {}
        for p in PATHS:
            x = get(out, p)
            parts = (self.strategy.experimental_local_results(x)
                     if self.replicas > 1 else [x])
            arr = np.concatenate([np.asarray(t) for t in parts], axis=0)
            result[p] = arr.reshape([self.batch] + out_tail(p))
        return result


def engine_state(embedding, slot_names):
    """{table: [parameters, slots...]} as numpy, retrieved from the engine.
    slot_names: a list (every table) or {table name: list}."""
    tables = embedding.embedding_tables   # retrieves every table's state
    out = {}
    for table_config, var in tables.items():
        name = table_config.name
        names = slot_names[name] if isinstance(slot_names, dict) else slot_names
        out[name] = [var.numpy()] + [
            embedding._variables[name][s].numpy()  # pylint: disable=protected-access
            for s in names]
    return out


def compare_state(got, reference, what, rtol=2e-5, atol=2e-5):
    for name, want in reference.state.items():
        assert len(got[name]) == len(want), (what, name, len(got[name]), len(want))
        for k, (g, w) in enumerate(zip(got[name], want)):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol,
                                       err_msg="%s: table %s state %d" % (what, name, k))


def compare_activations(got, want, what, rtol=1e-5, atol=1e-5):
    for p in PATHS:
        assert got[p].shape == want[p].shape, (what, p, got[p].shape, want[p].shape)
        np.testing.assert_allclose(got[p], want[p], rtol=rtol, atol=atol,
                                   err_msg="%s: activation %s" % (what, p))


def run_training(strategy, embedding, optimizer_names, modes, *, seed=1, lr_var=None,
                 lr_schedule=None, what=""):
    """Trains `embedding` (built from make_feature_config and the optimizers
    of optimizer_case) for one step per entry of `modes` ((mode,
    use_function) pairs), checking each step's activations and, after it,
    the engine's tables + slots against the reference.

    optimizer_names: one optimizer_case name for both tables, or {table:
    name}.  lr_var / lr_schedule: the tables' optimizers read their learning
    rate from the tf.Variable `lr_var` (a callable learning rate, dynamic
    tag 0); before step s it is set to lr_schedule[s].
    Returns the Reference."""
    if isinstance(optimizer_names, str):
        optimizer_names = {n: optimizer_names for n in TABLES}
    params, slot_names, slot_inits = {}, {}, {}
    for n, opt in optimizer_names.items():
        _, params[n], slot_names[n], slot_inits[n] = optimizer_case(
            opt, lr=(lambda: lr_var) if lr_var is not None else None)
    reference = Reference(params, slot_inits)
    trainer = Trainer(strategy, embedding)
    rng = np.random.default_rng(seed)
    for s, (mode, use_function) in enumerate(modes):
        label = "%s %s step %d (%s, %s)" % (what, optimizer_names, s, mode,
                                            "tf.function" if use_function else "eager")
        raw, c = make_batch(rng), make_grads(rng)
        dynamic = ()
        if lr_var is not None:
            lr_var.assign(lr_schedule[s])
            dynamic = (float(np.float32(lr_schedule[s])),)
        act = trainer.step(raw, c, mode, use_function)
        compare_activations(act, reference.forward(raw), label)
        reference.step(raw, c, dynamic)
        compare_state(engine_state(embedding, slot_names), reference, label)
    return reference
