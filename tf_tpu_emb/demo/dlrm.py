"""`make demo` / `python -m tf_tpu_emb.demo`: train a DLRM-style CTR model on CPU.

The main job: a click-through-rate model in the shape of MLPerf's DLRM-v2
(Criteo 1TB multi-hot) trained with TF's TPU-embedding programming model on
this library's CPU engine, then served from a stock-op SavedModel.

* **Data**: a generated click log with Criteo's layout -- 13 dense count
  features (log1p-transformed) and 26 categorical multi-hot features with
  MLPerf DLRM-v2's multi-hot sizes (3, 2, 1, 2, 6, ... 100, 27 ...) and its
  vocabulary sizes capped at ``--max-vocab`` rows so the tables fit a laptop.
  Ids follow a power law (Zipf) scattered over each table.  The labels come
  from a *planted* model -- per-id weights on several categorical features,
  two pairwise id interactions, a linear term on the dense features -> logit
  -> Bernoulli -- so a model that learns has a held-out AUC well above 0.5
  (the planted model's own AUC, the "oracle", is printed for reference).
* **Model**: ``tf_tpu_emb.TPUEmbedding`` (TF's ``TableConfig`` /
  ``FeatureConfig``, one table per feature, engine-side Adagrad) for the 26
  features; a Keras bottom MLP 13 -> 64 -> 32 -> dim on the dense features;
  DLRM's dot interaction (pairwise dot products of the 27 vectors, plus the
  bottom output) or concatenation; a Keras top MLP -> click logit, Adam.
* **Training**: one ``tf.function`` per step: ``enqueue(training=True)`` ->
  ``dequeue`` -> model -> loss -> gradients w.r.t. the activations and the
  dense weights -> ``embedding.apply_gradients`` (the engine updates the
  tables) + the Keras optimizer.  A progress bar shows the running loss, the
  last held-out AUC and examples/s.
* **Outputs** (``--out``, default ``out/demo``, ``out/demo-quick`` with
  ``--quick``): ``loss_auc.png`` (loss and held-out AUC over steps),
  ``metrics.json``, ``checkpoint/`` (a ``tf.train.Checkpoint`` of the
  embedding -- in TF's TPU-embedding layout --, the MLPs and the optimizer)
  and ``saved_model/`` (stock TF ops only: the tables copied by
  ``tf_tpu_emb.export_serving``, the MLPs; raw ids + dense features -> click
  probability).  Finally a fresh Python process that imports only TensorFlow
  and numpy loads the SavedModel and scores a few held-out examples
  (``serving_scores.json``).

* **Parquet** (``tf_tpu_emb.data.parquet``): ``--write-parquet PATH`` writes
  the training log the run would generate (``--steps`` x ``--batch-size``
  examples, the same seed) as Parquet with pyarrow and exits;
  ``--parquet PATH`` trains from such a file instead, read with
  tensorflow-io through ``tf.data`` (ragged ids straight into the enqueue;
  the held-out set is still generated).  Both need the tensorflow-io lane's
  packages (README "Reading Parquet with tensorflow-io").

    python -m tf_tpu_emb.demo               # default run (a few minutes on 2 cores)
    python -m tf_tpu_emb.demo --quick       # tiny smoke run
    python -m tf_tpu_emb.demo --quick --write-parquet log.parquet
    python -m tf_tpu_emb.demo --quick --parquet log.parquet
"""
import collections
import math
import os
import shutil
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_tpu_emb  # noqa: E402
from tf_tpu_emb.demo import cli  # noqa: E402
from tf_tpu_emb.demo import common  # noqa: E402

E = tf.tpu.experimental.embedding

# MLPerf DLRM-v2 (Criteo 1TB, multi-hot): rows per table and ids per sample.
CRITEO_VOCAB = [40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956,
                405282, 10, 2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000,
                590152, 12973, 108, 36]
MULTI_HOT = [3, 2, 1, 2, 6, 1, 1, 1, 1, 7, 3, 8, 1, 6, 9, 5, 1, 1, 1, 12, 100, 27, 10, 3, 1, 1]
NUM_DENSE = 13
NUM_SPARSE = len(MULTI_HOT)
FEATURES = ["C%d" % (i + 1) for i in range(NUM_SPARSE)]

# The planted model (indices into FEATURES).
SIGNAL_FEATURES = {  # feature -> std of its hidden per-id weight
    2: 0.5, 5: 0.6, 6: 0.5, 7: 0.6, 8: 0.7, 12: 0.5, 16: 0.5, 17: 0.6, 18: 0.5, 24: 0.6,
    25: 0.6, 0: 0.5, 13: 0.6}
PAIRS = [(8, 25), (7, 18)]  # hidden id-vector dot products
PAIR_DIM, PAIR_SCALE = 4, 0.45
DENSE_SCALE = 0.3
CLICK_RATE = 0.25  # the planted model's bias is solved for this mean click rate

DEFAULTS, QUICK = cli.DLRM_DEFAULTS, cli.DLRM_QUICK


# ------------------------------------------------------------------------ data

class ClickGenerator:
    """Criteo-shaped click log with a planted signal (see the module doc).

    ``batch(n)`` -> (dense float32 [n, 13], ids: list of 26 int64 arrays (the
    bag values, row-major, MULTI_HOT[f] ids per sample), labels float32 [n],
    planted click probabilities float64 [n]).
    """

    def __init__(self, vocab_sizes, seed, zipf=1.1):
        rng = np.random.default_rng(seed)
        self.vocab = list(vocab_sizes)
        self.zipf = zipf
        self.perm = [rng.permutation(v).astype(np.int64) for v in self.vocab]  # rank -> id
        self.dense_mu = rng.uniform(0.0, 4.0, NUM_DENSE)
        self.dense_sigma = rng.uniform(0.5, 1.5, NUM_DENSE)
        # Dense features are log1p(counts), counts ~ floor(lognormal(mu, sigma)), so
        # roughly N(mu, sigma): the planted term is linear in (x - mu) / sigma.
        self.dense_w = rng.normal(0, DENSE_SCALE, NUM_DENSE) / self.dense_sigma
        self.hidden = {f: rng.normal(0, s, self.vocab[f]) for f, s in SIGNAL_FEATURES.items()}
        self.pair_vecs = {f: rng.normal(0, 1, (self.vocab[f], PAIR_DIM)) for p in PAIRS
                          for f in p}
        # Bias: bisection on a pilot sample for the target mean click rate.
        self.bias = 0.0
        logit = self._sample(20000, rng)[2]
        lo, hi = -10.0, 10.0
        for _ in range(40):
            self.bias = (lo + hi) / 2
            lo, hi = ((self.bias, hi) if np.mean(1 / (1 + np.exp(-logit - self.bias)))
                      < CLICK_RATE else (lo, self.bias))

    def _ranks(self, vocab, n, rng):
        """Power-law ranks in [0, vocab): inverse CDF of x^-zipf on [1, vocab + 1)."""
        e = 1.0 - self.zipf
        x = (1.0 + rng.random(n) * ((vocab + 1.0) ** e - 1.0)) ** (1.0 / e)
        return np.minimum(x.astype(np.int64) - 1, vocab - 1)

    def _sample(self, n, rng):
        counts = np.floor(np.exp(rng.normal(self.dense_mu, self.dense_sigma, (n, NUM_DENSE))))
        dense = np.log1p(counts)
        logit = self.bias + (dense - self.dense_mu) @ self.dense_w
        ids = []
        for f, hot in enumerate(MULTI_HOT):
            ids.append(self.perm[f][self._ranks(self.vocab[f], n * hot, rng)])
        for f, w in self.hidden.items():
            logit += w[ids[f]].reshape(n, MULTI_HOT[f]).mean(1)
        for a, b in PAIRS:
            va = self.pair_vecs[a][ids[a]].reshape(n, MULTI_HOT[a], PAIR_DIM).mean(1)
            vb = self.pair_vecs[b][ids[b]].reshape(n, MULTI_HOT[b], PAIR_DIM).mean(1)
            logit += PAIR_SCALE * (va * vb).sum(1)
        return dense, ids, logit

    def batch(self, n, rng):
        dense, ids, logit = self._sample(n, rng)
        prob = 1.0 / (1.0 + np.exp(-logit))
        labels = (rng.random(n) < prob).astype(np.float32)
        return dense.astype(np.float32), ids, labels, prob


def auc(labels, scores):
    """ROC AUC (Mann-Whitney U, ties get average ranks)."""
    labels = np.asarray(labels) > 0.5
    scores = np.asarray(scores, np.float64)
    sorted_scores = np.sort(scores)
    ranks = (np.searchsorted(sorted_scores, scores, "left")
             + np.searchsorted(sorted_scores, scores, "right") + 1) / 2.0
    pos, neg = labels.sum(), (~labels).sum()
    if pos == 0 or neg == 0:
        return float("nan")
    return float((ranks[labels].sum() - pos * (pos + 1) / 2.0) / (pos * neg))


def log_loss(labels, probs):
    p = np.clip(np.asarray(probs, np.float64), 1e-7, 1 - 1e-7)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log(1 - p)))


# ----------------------------------------------------------------------- model

class DLRMDense:
    """DLRM's dense part: bottom MLP, interaction, top MLP (Keras layers)."""

    def __init__(self, dim, interaction="dot", bottom=(64, 32), top=(128, 64)):
        layers = tf.keras.layers
        self.interaction = interaction
        self.bottom = tf.keras.Sequential(
            [layers.Dense(u, activation="relu") for u in bottom]
            + [layers.Dense(dim, activation="relu")], name="bottom_mlp")
        self.top = tf.keras.Sequential(
            [layers.Dense(u, activation="relu") for u in top] + [layers.Dense(1)],
            name="top_mlp")
        n = NUM_SPARSE + 1
        if interaction == "dot":
            rows, cols = np.triu_indices(n, k=1)
            self._pairs = tf.constant(rows * n + cols, tf.int32)
            top_in = dim + len(rows)
        else:
            top_in = dim * n
        self.bottom.build((None, NUM_DENSE))
        self.top.build((None, top_in))

    @property
    def trainable_variables(self):
        return self.bottom.trainable_variables + self.top.trainable_variables

    def __call__(self, dense, activations):
        """dense [B, 13], activations {feature: [B, dim]} -> click logits [B]."""
        x = self.bottom(dense)
        vectors = [x] + [activations[f] for f in FEATURES]
        if self.interaction == "dot":
            t = tf.stack(vectors, axis=1)                         # [B, 27, dim]
            z = tf.matmul(t, t, transpose_b=True)                 # [B, 27, 27]
            z = tf.reshape(z, [-1, (NUM_SPARSE + 1) ** 2])
            features = tf.concat([x, tf.gather(z, self._pairs, axis=1)], axis=1)
        else:
            features = tf.concat(vectors, axis=1)
        return self.top(features)[:, 0]


def ragged_features(values, batch_size):
    """The 26 fixed-hotness bags as RaggedTensors (row_splits = k * hotness)."""
    return {f: tf.RaggedTensor.from_row_splits(
        v, tf.range(batch_size + 1, dtype=tf.int64) * hot, validate=False)
        for f, v, hot in zip(FEATURES, values, MULTI_HOT)}


# ---------------------------------------------------------------------- output

def plot(train, evals, oracle_auc, oracle_loss, path):
    """loss_auc.png: training / held-out loss and held-out AUC over steps."""
    plt = common.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    ax1.plot([h["step"] for h in train], [h["loss"] for h in train],
             label="train loss (mean of last 50 steps)", lw=1)
    ax1.plot([h["step"] for h in evals], [h["loss"] for h in evals], "o-", ms=4,
             label="held-out loss")
    ax1.axhline(oracle_loss, ls="--", color="gray", label="planted model")
    ax1.set_xlabel("step")
    ax1.set_ylabel("binary cross-entropy")
    ax1.set_title("Loss")
    ax1.grid(alpha=0.3)
    ax1.legend()
    ax2.plot([h["step"] for h in evals], [h["auc"] for h in evals], "o-", ms=4,
             color="C2", label="held-out AUC")
    ax2.axhline(oracle_auc, ls="--", color="gray", label="planted model (ceiling)")
    ax2.axhline(0.5, ls=":", color="gray")
    ax2.set_xlabel("step")
    ax2.set_ylabel("AUC")
    ax2.set_ylim(0.45, 1.0)
    ax2.set_title("Held-out AUC")
    ax2.grid(alpha=0.3)
    ax2.legend(loc="lower right")
    fig.suptitle("DLRM-style CTR model trained with tf_tpu_emb (CPU engine)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# --------------------------------------------------------------------- serving

def export_saved_model(path, embedding, model):
    """A stock-op SavedModel: raw ids + dense features -> click probability.

    ``tf_tpu_emb.export_serving`` copies the trained tables into a module whose
    ``lookup`` is TF's CPU serving lookup; the DLRM dense part runs on top of
    it.  The flat signature ``serving_default`` takes ``dense`` [n, 13] and
    ``C<k>_values`` / ``C<k>_row_splits`` per feature and returns
    ``probability`` and ``logit`` [n]; ``predict(dense, {feature: ragged ids})``
    is the same with composite inputs.
    """
    ragged = {f: tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1)
              for f in FEATURES}
    lookup_module = common.serving_lookup(embedding, ragged)

    def outputs(dense, features):
        logits = model(dense, lookup_module.lookup(features))
        return {"probability": tf.sigmoid(logits), "logit": logits}

    flat_spec = {"dense": tf.TensorSpec([None, NUM_DENSE], tf.float32, "dense")}
    for f in FEATURES:
        flat_spec[f + "_values"] = tf.TensorSpec([None], tf.int64, f + "_values")
        flat_spec[f + "_row_splits"] = tf.TensorSpec([None], tf.int64, f + "_row_splits")

    @tf.function(input_signature=[flat_spec])
    def serve(inputs):
        features = {f: tf.RaggedTensor.from_row_splits(inputs[f + "_values"],
                                                       inputs[f + "_row_splits"])
                    for f in FEATURES}
        return outputs(inputs["dense"], features)

    @tf.function(input_signature=[tf.TensorSpec([None, NUM_DENSE], tf.float32), ragged])
    def predict(dense, features):
        return outputs(dense, features)

    return common.save_stock_op_model(path, "dlrm_serving", lookup_module, serve,
                                      predict=predict)


def score_in_fresh_process(saved_model, dense, ids, labels, planted, inprocess, out_dir):
    """Scores held-out examples with the SavedModel in a TensorFlow-only process."""
    n = len(labels)
    inputs = {"dense": dense}
    for f, v, hot in zip(FEATURES, ids, MULTI_HOT):
        inputs[f + "_values"] = v[:n * hot].astype(np.int64)
        inputs[f + "_row_splits"] = np.arange(n + 1, dtype=np.int64) * hot
    result = common.score_in_fresh_process(saved_model, inputs, "probability", inprocess,
                                           out_dir)
    prob = result["outputs"]["probability"]
    print("    #  label  P(click)  planted P  in-process")
    for i, (y, p, t, q) in enumerate(zip(labels, prob, planted, inprocess)):
        print("  %3d  %5d  %8.4f  %9.4f  %10.4f" % (i, y, p, t, q))
    return {"probability": prob, "label": labels.astype(int).tolist(),
            "planted_probability": np.asarray(planted).tolist(),
            "matches_in_process": result["matches_in_process"]}


# ------------------------------------------------------------------------ main

def parse_args(argv=None):
    """The job's arguments (tf_tpu_emb.demo.cli, parsed without TensorFlow)."""
    return cli.dlrm_args(argv)

def write_parquet(path, gen, rng, steps, batch):
    """The training log (`steps` batches of the generator) as a Parquet click log."""
    from tf_tpu_emb.data import parquet  # pylint: disable=import-outside-toplevel

    with parquet.ClickLogWriter(path) as writer:
        for _ in range(steps):
            dense, ids, labels, _ = gen.batch(batch, rng)
            writer.write(labels, {f: v.reshape(batch, hot)
                                  for f, v, hot in zip(FEATURES, ids, MULTI_HOT)},
                         dense=dense)
    print("wrote %s examples to %s" % (format(steps * batch, ","), path))


def main(argv=None):
    return run(parse_args(argv))


def run(args):
    """Runs the job with parsed arguments (``parse_args``)."""
    wall_start = time.perf_counter()
    common.prepare_run(args, "demo")
    vocab = [min(v, args.max_vocab) for v in CRITEO_VOCAB]
    rows = sum(vocab)
    print("DLRM-style CTR demo on tf_tpu_emb %s (TensorFlow %s, CPU engine)"
          % (tf_tpu_emb.__version__, tf.__version__))
    print("  26 tables (one per feature), %s rows x dim %d = %.1f M parameters, "
          "engine Adagrad(lr=%g); multi-hot sizes %s"
          % (format(rows, ","), args.dim, rows * args.dim / 1e6, args.embedding_lr,
             ",".join(map(str, MULTI_HOT))))
    print("  %s interaction, batch %d, %d steps, held-out %d examples, output %s"
          % (args.interaction, args.batch_size, args.steps,
             args.eval_batches * args.batch_size, os.path.abspath(args.out)))
    if args.parquet:
        print("  training from %s (Parquet, read with tensorflow-io through tf.data)"
              % args.parquet)

    # Data: one planted model; training and held-out streams from separate seeds.
    gen = ClickGenerator(vocab, seed=args.seed)
    train_rng = np.random.default_rng([args.seed, 1])
    if args.write_parquet:
        write_parquet(args.write_parquet, gen, train_rng, args.steps, args.batch_size)
        return 0
    eval_rng = np.random.default_rng([args.seed, 2])
    held_out = [gen.batch(args.batch_size, eval_rng) for _ in range(args.eval_batches)]
    eval_labels = np.concatenate([b[2] for b in held_out])
    planted = np.concatenate([b[3] for b in held_out])
    oracle_auc, oracle_loss = auc(eval_labels, planted), log_loss(eval_labels, planted)
    print("  held-out click rate %.3f; the planted model's own AUC is %.4f (the ceiling)"
          % (eval_labels.mean(), oracle_auc))

    # The embedding (engine) and the dense model (Keras).
    feature_config = {}
    for f, v in zip(FEATURES, vocab):
        table = E.TableConfig(vocabulary_size=v, dim=args.dim, name=f, combiner="mean")
        feature_config[f] = E.FeatureConfig(table, name=f)
    optimizer = E.Adagrad(learning_rate=args.embedding_lr)
    if args.hosts:
        from tf_tpu_emb.cluster import local  # pylint: disable=import-outside-toplevel

        with local.LocalHosts(args.hosts) as cluster:
            cluster.hosts.connect()
            print("  tables sharded (DIV_DEFAULT) over %d embedding hosts: %s"
                  % (args.hosts, ", ".join(cluster.addresses)))
            embedding = tf_tpu_emb.TPUEmbedding(feature_config, optimizer,
                                                cluster=cluster.hosts)
            result = _build_train_export(args, gen, train_rng, held_out, embedding)
    else:
        embedding = tf_tpu_emb.TPUEmbedding(feature_config, optimizer)
        result = _build_train_export(args, gen, train_rng, held_out, embedding)

    metrics = {
        "config": dict(vars(args)),
        "tables": {f: {"vocabulary_size": v, "multi_hot": h, "criteo_vocabulary_size": c}
                   for f, v, h, c in zip(FEATURES, vocab, MULTI_HOT, CRITEO_VOCAB)},
        "embedding_rows": rows,
        "final": dict(result["final"], oracle_auc=oracle_auc, oracle_loss=oracle_loss,
                      eval_click_rate=float(eval_labels.mean()),
                      wall_seconds=time.perf_counter() - wall_start),
        "train": result["train"],
        "eval": result["eval"],
        "serving_scores": result["serving_scores"],
        "files": result["files"],
    }
    plot_path = os.path.join(args.out, "loss_auc.png")
    plot(metrics["train"], metrics["eval"], oracle_auc, oracle_loss, plot_path)
    metrics["files"]["plot"] = plot_path
    metrics_path = os.path.join(args.out, "metrics.json")
    metrics["files"]["metrics"] = metrics_path
    common.write_json(metrics_path, metrics)
    final = metrics["final"]
    print("wrote %s" % ", ".join(metrics["files"].values()))
    print("held-out AUC %.4f (planted model %.4f), train loss %.4f, %s examples/s, "
          "%.0f s in all" % (final["eval_auc"], oracle_auc, final["train_loss"],
                             format(int(final["examples_per_sec"]), ","),
                             final["wall_seconds"]))
    return 0


def _build_train_export(args, gen, train_rng, held_out, embedding):
    try:
        embedding.build(per_replica_batch_size=args.batch_size)
        return _train_and_export(args, gen, train_rng, held_out, embedding)
    finally:
        embedding.shutdown()


def _train_and_export(args, gen, train_rng, held_out, embedding):
    model = DLRMDense(args.dim, args.interaction)
    optimizer = tf.keras.optimizers.Adam(args.dense_lr)
    optimizer.build(model.trainable_variables)
    batch = args.batch_size
    signature = [tf.TensorSpec([batch, NUM_DENSE], tf.float32),
                 [tf.TensorSpec([batch * h], tf.int64) for h in MULTI_HOT]]

    def train_on(dense, features, labels):  # (`step` is the loop's counter below)
        embedding.enqueue(features, training=True)
        with tf.GradientTape() as tape:
            activations = embedding.dequeue()
            tape.watch(activations)
            logits = model(dense, activations)
            loss = tf.reduce_mean(tf.nn.sigmoid_cross_entropy_with_logits(labels, logits))
        act_grads, dense_grads = tape.gradient(loss, (activations, model.trainable_variables))
        embedding.apply_gradients(act_grads)   # the engine applies Adagrad to the tables
        optimizer.apply_gradients(zip(dense_grads, model.trainable_variables))
        return loss

    @tf.function(input_signature=signature + [tf.TensorSpec([batch], tf.float32)])
    def train_step(dense, values, labels):
        return train_on(dense, ragged_features(values, batch), labels)

    if args.parquet:  # tensorflow-io -> tf.data -> ragged ids (any multi-hot count)
        from tf_tpu_emb.data import parquet  # pylint: disable=import-outside-toplevel

        ragged = {f: tf.RaggedTensorSpec([batch, None], tf.int64, 1, tf.int64)
                  for f in FEATURES}
        train_step = tf.function(train_on, input_signature=[
            signature[0], ragged, tf.TensorSpec([batch], tf.float32)])
        batches = iter(parquet.read_click_log(args.parquet, FEATURES, batch_size=batch,
                                              num_dense=NUM_DENSE).repeat())

        def next_batch():
            dense, ids, _, labels = next(batches)
            return dense, ids, labels
    else:
        def next_batch():
            dense, ids, labels, _ = gen.batch(batch, train_rng)
            return dense, ids, labels

    @tf.function(input_signature=signature)
    def predict_step(dense, values):
        embedding.enqueue(ragged_features(values, batch), training=False)
        return tf.sigmoid(model(dense, embedding.dequeue()))

    eval_labels = np.concatenate([b[2] for b in held_out])

    def evaluate(step):
        probs = np.concatenate([predict_step(d, ids).numpy() for d, ids, _, _ in held_out])
        evals.append({"step": step, "auc": auc(eval_labels, probs),
                      "loss": log_loss(eval_labels, probs)})
        return probs

    train, evals = [], []
    evaluate(0)
    progress = common.Progress(args.steps)
    recent = collections.deque(maxlen=50)
    train_time, data_time, examples, rate = 0.0, 0.0, 0, 0.0
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        dense, ids, labels = next_batch()
        t1 = time.perf_counter()
        loss = float(train_step(dense, ids, labels))
        t2 = time.perf_counter()
        data_time += t1 - t0
        if step > 1 or args.steps == 1:  # the first step also traces the function
            train_time += t2 - t1
            examples += batch
            rate = examples / train_time
        if not math.isfinite(loss):
            progress.close()
            raise SystemExit("training diverged at step %d (loss %r)" % (step, loss))
        recent.append(loss)
        running = sum(recent) / len(recent)
        if step % max(1, args.steps // 200) == 0 or step == args.steps:
            train.append({"step": step, "loss": running, "examples_per_sec": rate})
        report = step % args.eval_every == 0 or step == args.steps
        if report:
            eval_probs = evaluate(step)
        progress.update(step, "loss %.4f  held-out AUC %.4f  %s ex/s"
                        % (running, evals[-1]["auc"], format(int(rate), ",")), force=report)
    progress.close()
    final = {"step": args.steps, "train_loss": running, "eval_loss": evals[-1]["loss"],
             "eval_auc": evals[-1]["auc"], "examples_per_sec": rate,
             "examples": args.steps * batch, "train_seconds": train_time,
             "data_seconds": data_time}
    print("train loss %.4f (mean of the last %d steps)  held-out loss %.4f  held-out AUC %.4f"
          % (running, len(recent), final["eval_loss"], final["eval_auc"]))
    print("%s examples/s in the training steps (%s examples; generating them took %.1f s more)"
          % (format(int(rate), ","), format(final["examples"], ","), data_time))

    # Checkpoint: the tables (in TF's TPU-embedding layout), the MLPs, the optimizer.
    checkpoint = tf.train.Checkpoint(embedding=embedding, bottom_mlp=model.bottom,
                                     top_mlp=model.top, optimizer=optimizer)
    ckpt_dir = os.path.join(args.out, "checkpoint")
    shutil.rmtree(ckpt_dir, ignore_errors=True)
    ckpt_path = checkpoint.save(os.path.join(ckpt_dir, "ckpt"))
    saved_model = os.path.join(args.out, "saved_model")
    shutil.rmtree(saved_model, ignore_errors=True)
    export_saved_model(saved_model, embedding, model)

    n = 8
    dense, ids, labels, planted = held_out[0]
    scores = score_in_fresh_process(os.path.abspath(saved_model), dense[:n], ids, labels[:n],
                                    planted[:n], eval_probs[:n], os.path.abspath(args.out))
    return {"final": final, "train": train, "eval": evals, "serving_scores": scores,
            "files": {"checkpoint": ckpt_path, "saved_model": saved_model,
                      "serving_scores": os.path.join(args.out, "serving_scores.json")}}


if __name__ == "__main__":
    sys.exit(main())
