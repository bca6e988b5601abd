"""`python -m tf_tpu_emb.demo --data movielens-100k` (`make movielens`): ratings on real data.

A rating model trained on MovieLens-100k (100,000 ratings, 1-5 stars, of 1,682
movies by 943 users; see ``movielens_data``) with the standard protocol:
5-fold cross-validation over a random permutation of the ratings (fixed seed),
RMSE and MAE of the held-out fold, next to a baseline fitted in the same run
(global mean + regularised user and movie biases).

* **Model**: every embedding lives in the engine (``tf_tpu_emb.TPUEmbedding``,
  TF's ``TableConfig`` / ``FeatureConfig``, the engine's Adagrad): user id,
  movie id, genres (multi-hot, mean combiner), occupation, age group, gender,
  release year, and the movies the user rated in the fold's training part
  (multi-hot, sqrtn combiner: SVD++'s implicit feedback with its |N(u)|^-1/2
  scaling); one table per feature of ``dim + 1`` columns, the last one a bias.
  The user side is the sum of the user's five vectors, the movie side the sum
  of the movie's three; the predicted rating is
  ``mu + biases + <user side, movie side> + MLP(all vectors)`` with the global
  mean ``mu`` and the small MLP trained by Keras (Adam).  The loss is the
  squared error plus an L2 penalty on the looked-up vectors (``--l2``, the
  usual per-rating regularisation of matrix factorisation), summed over the
  batch.  Hyperparameters were chosen with ``--validate`` (scores on 10% of
  each training part), not on the test folds.
* **Outputs** (``--out``, default ``out/movielens``, ``out/movielens-quick``
  with ``--quick``): ``metrics.json`` (per fold RMSE/MAE of the model and the
  baseline, per-epoch curves, means and standard deviations, seed, run time,
  configuration), ``cv.png`` and ``saved_model/`` (stock TF ops only; the
  last fold's model): raw ``user_id`` and ``movie_id`` (int64, MovieLens
  ids) -> ``rating`` (clipped to 1..5) and ``score`` (unclipped); the side
  features of every user and movie are constants of the model, unknown ids
  use the tables' "unknown" row.  A fresh process that imports only
  TensorFlow scores the last fold's held-out pairs with it and must reproduce
  the in-process predictions.

    python -m tf_tpu_emb.demo --data movielens-100k           # the full 5-fold run
    python -m tf_tpu_emb.demo --data movielens-100k --quick   # one fold, one epoch, a slice
"""
import math
import os
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import tf_tpu_emb  # noqa: E402
from tf_tpu_emb.demo import cli  # noqa: E402
from tf_tpu_emb.demo import common  # noqa: E402
from tf_tpu_emb.demo import movielens_data as mld  # noqa: E402
from tf_tpu_emb.demo import movielens_report as report  # noqa: E402

E = tf.tpu.experimental.embedding

USER_SIDE = ("user", "occupation", "age", "gender", "rated")
MOVIE_SIDE = ("movie", "genres", "year")
FEATURES = USER_SIDE + MOVIE_SIDE
# Multi-hot features: feature -> (the id feature whose row selects the bag, table
# vocabulary, combiner).  "rated" is the movies the user rated in the fold's
# training part (SVD++'s implicit feedback; sqrtn = its |N(u)|^-1/2 scaling).
BAGS = {"genres": ("movie", "genres", "mean"), "rated": ("user", "movie", "sqrtn")}

DEFAULTS, QUICK = cli.MOVIELENS_DEFAULTS, cli.MOVIELENS_QUICK


# ----------------------------------------------------------------------- model

class RatingModel:
    """The dense part (Keras / tf.Variables): global mean, biases, dot product, MLP."""

    def __init__(self, features, dim, hidden, mean):
        self.features, self.dim = features, dim
        self.mu = tf.Variable(float(mean), name="global_mean")
        layers = tf.keras.layers
        self.mlp = None
        if hidden:
            self.mlp = tf.keras.Sequential(
                [layers.Dense(h, activation="relu") for h in hidden]
                + [layers.Dense(1, kernel_initializer="zeros")], name="mlp")
            self.mlp.build((None, len(features) * (dim + 1)))

    @property
    def trainable_variables(self):
        return [self.mu] + (self.mlp.trainable_variables if self.mlp else [])

    def __call__(self, act):
        """act {feature: [B, dim + 1]} -> predicted ratings [B] (unclipped)."""
        user = tf.add_n([act[f] for f in USER_SIDE if f in act])
        movie = tf.add_n([act[f] for f in MOVIE_SIDE if f in act])
        d = self.dim
        score = (self.mu + user[:, d] + movie[:, d]
                 + tf.reduce_sum(user[:, :d] * movie[:, :d], axis=1))
        if self.mlp is not None:
            score += self.mlp(tf.concat([act[f] for f in self.features], axis=1))[:, 0]
        return score


def vocabulary_size(data, feature):
    return len(data.vocab[BAGS[feature][1] if feature in BAGS else feature])


def feature_config(features, data, dim, init_std):
    """One table per feature, dim + 1 columns (the last one a bias)."""
    config = {}
    for f in features:
        table = E.TableConfig(
            vocabulary_size=vocabulary_size(data, f), dim=dim + 1, name=f,
            combiner=BAGS[f][2] if f in BAGS else "sum",
            initializer=tf.initializers.TruncatedNormal(stddev=init_std))
        config[f] = E.FeatureConfig(table, name=f)
    return config


def batch_inputs(features, ids, bags, idx):
    """The tf.function inputs for ratings `idx`: ids, and values + row splits per bag."""
    out = {f: ids[f][idx] for f in features if f not in BAGS}
    for f in features:
        if f in BAGS:
            out[f + "_values"], out[f + "_row_splits"] = mld.gather_rows(
                *bags[f], ids[BAGS[f][0]][idx])
    return out


def to_features(features, inputs):
    return {f: tf.RaggedTensor.from_row_splits(inputs[f + "_values"],
                                               inputs[f + "_row_splits"], validate=False)
            if f in BAGS else inputs[f] for f in features}


def input_signature(features, batch):
    sig = {}
    for f in features:
        if f in BAGS:
            sig[f + "_values"] = tf.TensorSpec([None], tf.int64, f + "_values")
            sig[f + "_row_splits"] = tf.TensorSpec([batch + 1], tf.int64, f + "_row_splits")
        else:
            sig[f] = tf.TensorSpec([batch], tf.int64, f)
    return sig


# -------------------------------------------------------------------- training

class Fold:
    """One fold's engine, dense model, step functions and bags (genres per movie,
    the training part's rated movies per user)."""

    def __init__(self, args, data, ids, train):
        self.args, self.ids = args, ids
        features = self.features = args.features
        self.bags = {"genres": mld.ragged_rows(data.movie_genres),
                     "rated": mld.rated_movies(data, train)}
        self.embedding = tf_tpu_emb.TPUEmbedding(
            feature_config(features, data, args.dim, args.init_std),
            E.Adagrad(learning_rate=args.embedding_lr))
        self.embedding.build(per_replica_batch_size=args.batch_size)
        self.model = RatingModel(features, args.dim, args.hidden, data.rating[train].mean())
        self.optimizer = tf.keras.optimizers.Adam(args.dense_lr)
        self.optimizer.build(self.model.trainable_variables)
        sig = input_signature(features, args.batch_size)
        embedding, model, optimizer, l2 = self.embedding, self.model, self.optimizer, args.l2

        @tf.function(input_signature=[sig, tf.TensorSpec([args.batch_size], tf.float32)])
        def train_step(inputs, rating):
            embedding.enqueue(to_features(features, inputs), training=True)
            with tf.GradientTape() as tape:
                act = embedding.dequeue()
                tape.watch(act)
                # Summed over the batch, as per-rating SGD on matrix factorisation
                # sums it (a mean would shrink every row's gradient by the batch
                # size, which Adagrad's initial accumulator then dominates).
                se = tf.reduce_sum(tf.square(model(act) - rating))
                penalty = tf.add_n([tf.reduce_sum(tf.square(a)) for a in act.values()])
                loss = se + l2 * penalty
            act_grads, dense_grads = tape.gradient(loss, (act, model.trainable_variables))
            embedding.apply_gradients(act_grads)  # the engine's Adagrad updates the tables
            optimizer.apply_gradients(zip(dense_grads, model.trainable_variables))
            return se / args.batch_size

        @tf.function(input_signature=[sig])
        def predict_step(inputs):
            embedding.enqueue(to_features(features, inputs), training=False)
            return model(embedding.dequeue())

        self.train_step, self.predict_step = train_step, predict_step

    def inputs(self, idx):
        return batch_inputs(self.features, self.ids, self.bags, idx)

    def predict(self, idx):
        """Clipped predictions for ratings `idx` (the last batch padded)."""
        b = self.args.batch_size
        pad = -len(idx) % b
        padded = np.concatenate([idx, np.repeat(idx[-1:], pad)])
        out = [self.predict_step(self.inputs(padded[s:s + b])).numpy()
               for s in range(0, len(padded), b)]
        return np.clip(np.concatenate(out)[:len(idx)], 1.0, 5.0)

    def shutdown(self):
        self.embedding.shutdown()


def run_fold(fold_no, args, data, ids, train, test, progress, step0, rng):
    """Trains one fold; returns (metrics dict, Fold with its engine still up)."""
    t0 = time.perf_counter()
    num_users, num_movies = len(data.vocab["user"]), len(data.vocab["movie"])
    mu, b_user, b_movie = mld.fit_baseline(data.user[train], data.movie[train],
                                           data.rating[train], num_users, num_movies)
    base = np.clip(mu + b_user[data.user[test]] + b_movie[data.movie[test]], 1.0, 5.0)
    base_rmse, base_mae = mld.rmse_mae(base, data.rating[test])

    fold = Fold(args, data, ids, train)
    b = args.batch_size
    steps = len(train) // b
    curve, step = [], step0
    label = "fold %d/%d" % (fold_no + 1, args.run_folds)
    for epoch in range(1, args.epochs + 1):
        order = rng.permutation(train)
        sq = 0.0
        for s in range(steps):
            idx = order[s * b:(s + 1) * b]
            mse = float(fold.train_step(fold.inputs(idx), data.rating[idx]))
            if not math.isfinite(mse):
                progress.close()
                fold.shutdown()
                raise SystemExit("training diverged in %s, epoch %d (mse %r)"
                                 % (label, epoch, mse))
            sq += mse
            step += 1
            progress.update(step, "%s epoch %d/%d  train RMSE %.4f" % (
                label, epoch, args.epochs, math.sqrt(sq / (s + 1))))
        rmse, mae = mld.rmse_mae(fold.predict(test), data.rating[test])
        curve.append({"epoch": epoch, "train_rmse": math.sqrt(sq / steps),
                      "test_rmse": rmse, "test_mae": mae})
        progress.update(step, "%s epoch %d/%d  train RMSE %.4f  test RMSE %.4f MAE %.4f" % (
            label, epoch, args.epochs, curve[-1]["train_rmse"], rmse, mae),
            force=args.verbose)
    progress.update(step, "%s  RMSE %.4f  MAE %.4f  (baseline %.4f / %.4f)" % (
        label, rmse, mae, base_rmse, base_mae), force=True)
    return {"fold": fold_no + 1, "train_ratings": int(len(train)),
            "test_ratings": int(len(test)), "rmse": rmse, "mae": mae,
            "baseline_rmse": base_rmse, "baseline_mae": base_mae, "epochs": curve,
            "seconds": time.perf_counter() - t0}, fold


# ---------------------------------------------------------------------- export

def export_saved_model(path, fold, data):
    """A stock-op SavedModel: raw (user_id, movie_id) pairs -> predicted rating.

    The tables are copied by ``tf_tpu_emb.export_serving`` (TF's CPU serving
    lookup); the users' and movies' side features are constants; an id the
    data does not have maps to the "unknown" row (0) of every table.
    """
    def id_keys(tokens, what):
        try:
            return tf.constant([int(t) for t in tokens], tf.int64)
        except ValueError:
            raise SystemExit("the serving export takes integer %s ids; the data has %r"
                             % (what, next(t for t in tokens if not t.lstrip("-").isdigit())))

    user_keys, movie_keys = id_keys(data.user_ids, "user"), id_keys(data.movie_ids, "movie")
    # Per-rating id features as (table of rows by user or movie row, which row).
    by_row = {"user": None, "movie": None, "year": (data.movie_year, "movie")}
    by_row.update({f: (v, "user") for f, v in data.user_features.items()})
    by_row = {f: (tf.constant(v[0]), v[1]) if v else None for f, v in by_row.items()}
    bags = {f: tf.RaggedTensor.from_row_splits(tf.constant(values), tf.constant(splits))
            for f, (values, splits) in fold.bags.items()}

    def rows(keys, ids):
        """Row of each raw id (the vocabularies are sorted): k + 1, or 0 if absent."""
        n = tf.shape(keys, out_type=tf.int64)[0]
        pos = tf.searchsorted(keys, ids, side="left", out_type=tf.int64)
        hit = tf.logical_and(pos < n, tf.gather(keys, tf.minimum(pos, n - 1)) == ids)
        return tf.where(hit, pos + 1, tf.zeros_like(pos))

    spec = {f: tf.RaggedTensorSpec([None, None], tf.int64, ragged_rank=1) if f in BAGS
            else tf.TensorSpec([None], tf.int64) for f in fold.features}
    lookup_module = common.serving_lookup(fold.embedding, spec)
    model = fold.model

    @tf.function(input_signature=[{"user_id": tf.TensorSpec([None], tf.int64, "user_id"),
                                   "movie_id": tf.TensorSpec([None], tf.int64, "movie_id")}])
    def serve(inputs):
        row = {"user": rows(user_keys, inputs["user_id"]),
               "movie": rows(movie_keys, inputs["movie_id"])}
        features = {}
        for f in fold.features:
            if f in BAGS:
                features[f] = tf.gather(bags[f], row[BAGS[f][0]])
            else:
                features[f] = row[f] if by_row[f] is None else tf.gather(by_row[f][0],
                                                                         row[by_row[f][1]])
        score = model(lookup_module.lookup(features))
        return {"rating": tf.clip_by_value(score, 1.0, 5.0), "score": score}

    return common.save_stock_op_model(path, "movielens_serving", lookup_module, serve)


# ------------------------------------------------------------------------ main

def parse_args(argv=None):
    """The job's arguments (tf_tpu_emb.demo.cli, parsed without TensorFlow)."""
    return cli.movielens_args(argv)

def load_data(args):
    try:
        data, source = mld.load(args.data_path, args.cache_dir, not args.no_download)
    except mld.DataError as e:
        raise SystemExit("movielens-100k: %s" % e)
    if args.max_ratings is not None and args.max_ratings < data.num_ratings:
        n = args.max_ratings
        data.user, data.movie, data.rating = data.user[:n], data.movie[:n], data.rating[:n]
    return data, source


def main(argv=None):
    return run(parse_args(argv))


def run(args):
    """Runs the job with parsed arguments (``parse_args``)."""
    wall_start = time.perf_counter()
    args.features = [f for f in FEATURES if not (args.no_history and f == "rated")]
    common.prepare_run(args, "movielens")
    data, source = load_data(args)
    print("MovieLens-100k rating model on tf_tpu_emb %s (TensorFlow %s, CPU engine)"
          % (tf_tpu_emb.__version__, tf.__version__))
    print("  data: %s ratings, %d users, %d movies (%s)" % (
        format(data.num_ratings, ","), len(data.user_ids), len(data.movie_ids), source))
    print("  %d tables in the engine (%s), dim %d + bias, Adagrad(lr=%g); MLP %s, Adam(lr=%g); "
          "l2 %g" % (len(args.features), ", ".join("%s %d" % (f, vocabulary_size(data, f))
                                                   for f in args.features),
                     args.dim, args.embedding_lr, args.hidden or "none", args.dense_lr, args.l2))
    print("  %d-fold CV (seed %d)%s, %d epochs, batch %d, output %s" % (
        args.folds, args.seed, ", first %d folds" % args.run_folds
        if args.run_folds < args.folds else "", args.epochs, args.batch_size,
        os.path.abspath(args.out)))
    if args.validate:
        print("  --validate: scores are on 10% of each fold's training ratings, not its test fold")

    ids = mld.rating_ids(data)
    parts = mld.folds(data.num_ratings, args.folds, args.seed)
    rng = np.random.default_rng([args.seed, 1])
    splits = []
    for k in range(args.run_folds):
        train, test = mld.train_test(parts, k)
        if args.validate:
            train = rng.permutation(train)
            cut = len(train) // 10
            train, test = train[cut:], train[:cut]
        splits.append((train, test))
    progress = common.Progress(sum(args.epochs * (len(tr) // args.batch_size)
                                   for tr, _ in splits))
    folds, step, fold = [], 0, None
    for k, (train, test) in enumerate(splits):
        if fold is not None:
            fold.shutdown()  # one engine per process: the next fold configures a fresh one
        result, fold = run_fold(k, args, data, ids, train, test, progress, step, rng)
        step += args.epochs * (len(train) // args.batch_size)
        folds.append(result)
    progress.close()
    try:
        serving = _export_and_check(args, fold, data, splits[-1][1])
    finally:
        fold.shutdown()

    summary = report.summarize(folds)
    summary["wall_seconds"] = time.perf_counter() - wall_start
    report.print_table(folds, summary)
    files = {"plot": os.path.join(args.out, "cv.png"),
             "metrics": os.path.join(args.out, "metrics.json"),
             "saved_model": os.path.join(args.out, "saved_model")}
    report.plot(folds, summary, files["plot"])
    config = dict(vars(args))
    common.write_json(files["metrics"], {
        "data": {"source": source, "ratings": data.num_ratings, "users": len(data.user_ids),
                 "movies": len(data.movie_ids),
                 "vocabulary_sizes": {f: vocabulary_size(data, f) for f in args.features}},
        "protocol": "%d-fold CV over a random permutation of the ratings (seed %d)%s" % (
            args.folds, args.seed, "; --validate: 10%% of each training part held out"
            if args.validate else ""),
        "seed": args.seed, "config": config, "summary": summary, "folds": folds,
        "baseline": "global mean + user and movie biases, ALS (reg_user 15, reg_movie 10, "
                    "10 epochs), clipped to 1..5",
        "published": {"source": report.PUBLISHED_SOURCE,
                      "results": {k: {"rmse": r, "mae": m}
                                  for k, (r, m) in report.PUBLISHED.items()}},
        "serving": serving, "files": files})
    print("wrote %s" % ", ".join(files.values()))
    print("mean over %d folds: RMSE %.4f  MAE %.4f  (baseline %.4f / %.4f)  %.0f s in all" % (
        len(folds), summary["rmse_mean"], summary["mae_mean"], summary["baseline_rmse_mean"],
        summary["baseline_mae_mean"], summary["wall_seconds"]))
    return 0


def _export_and_check(args, fold, data, test):
    """Exports the last fold's model and scores its held-out pairs in a fresh process."""
    saved_model = os.path.join(args.out, "saved_model")
    export_saved_model(saved_model, fold, data)
    expected = fold.predict(test)
    inputs = {"user_id": np.array([int(data.user_ids[u - 1]) for u in data.user[test]]),
              "movie_id": np.array([int(data.movie_ids[m - 1]) for m in data.movie[test]])}
    result = common.score_in_fresh_process(saved_model, inputs, "rating", expected,
                                           os.path.abspath(args.out))
    rmse, mae = mld.rmse_mae(result["outputs"]["rating"], data.rating[test])
    print("  its RMSE %.4f, MAE %.4f on the last fold's %d held-out pairs (in-process %.4f / "
          "%.4f)" % (rmse, mae, len(test), *mld.rmse_mae(expected, data.rating[test])))
    return {"pairs": int(len(test)), "rmse": rmse, "mae": mae,
            "matches_in_process": result["matches_in_process"],
            "first_pairs": [{"user_id": int(u), "movie_id": int(m), "rating": float(r)}
                            for u, m, r in zip(inputs["user_id"][:5], inputs["movie_id"][:5],
                                               result["outputs"]["rating"][:5])]}


if __name__ == "__main__":
    sys.exit(main())
