"""Reporting for the MovieLens-100k job: fold summary, table, plot, published results."""
import numpy as np

from tf_tpu_emb.demo import common

# Published 5-fold cross-validation results on MovieLens-100k (mean RMSE, MAE):
# the Surprise library's benchmark table (README "Benchmarks", default
# parameters, the same folds for every algorithm; read at the README of
# NicolasHug/Surprise as of commit 2381fb1, June 2024).
PUBLISHED_SOURCE = ("Surprise (scikit-surprise) README, 'Benchmarks', Movielens 100k, 5-fold CV: "
                    "https://github.com/NicolasHug/Surprise#benchmarks")
PUBLISHED = {"SVD": (0.934, 0.737), "SVD++": (0.919, 0.721), "NMF": (0.963, 0.758),
             "Slope One": (0.946, 0.743), "k-NN Baseline": (0.931, 0.733),
             "Baseline (BaselineOnly)": (0.944, 0.748)}


def summarize(folds):
    out = {"folds": len(folds)}
    for key in ("rmse", "mae", "baseline_rmse", "baseline_mae"):
        vals = np.array([f[key] for f in folds])
        out[key + "_mean"] = float(vals.mean())
        out[key + "_std"] = float(vals.std())
    return out


def print_table(folds, summary):
    print("\n  fold   RMSE    MAE     baseline RMSE  MAE     ratings train/test  seconds")
    for f in folds:
        print("  %4d   %.4f  %.4f  %.4f         %.4f  %6d / %5d      %5.1f" % (
            f["fold"], f["rmse"], f["mae"], f["baseline_rmse"], f["baseline_mae"],
            f["train_ratings"], f["test_ratings"], f["seconds"]))
    s = summary
    print("  mean   %.4f  %.4f  %.4f         %.4f" % (
        s["rmse_mean"], s["mae_mean"], s["baseline_rmse_mean"], s["baseline_mae_mean"]))
    print("  std    %.4f  %.4f  %.4f         %.4f" % (
        s["rmse_std"], s["mae_std"], s["baseline_rmse_std"], s["baseline_mae_std"]))
    print("  published (%s):" % PUBLISHED_SOURCE)
    print("    " + ", ".join("%s %.3f / %.3f" % (k, r, m) for k, (r, m) in PUBLISHED.items()))


def plot(folds, summary, path):
    """cv.png: per-epoch held-out RMSE per fold, and per-fold RMSE / MAE bars."""
    plt = common.pyplot()
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.2))
    for i, f in enumerate(folds):
        epochs = [c["epoch"] for c in f["epochs"]]
        ax1.plot(epochs, [c["test_rmse"] for c in f["epochs"]], "o-", ms=3, color="C%d" % i,
                 label="fold %d held-out" % f["fold"])
        ax1.plot(epochs, [c["train_rmse"] for c in f["epochs"]], "--", lw=1, color="C%d" % i,
                 alpha=0.6, label="training (dashed)" if i == 0 else None)
    ax1.axhline(summary["baseline_rmse_mean"], ls="--", color="gray",
                label="baseline (this run) %.4f" % summary["baseline_rmse_mean"])
    ax1.axhline(PUBLISHED["SVD"][0], ls=":", color="black",
                label="Surprise SVD (published) %.3f" % PUBLISHED["SVD"][0])
    ax1.set_xlabel("epoch")
    ax1.xaxis.get_major_locator().set_params(integer=True)
    ax1.set_ylabel("RMSE")
    top = max(summary["baseline_rmse_mean"] + 0.05, summary["rmse_mean"] + 0.08)
    ax1.set_ylim(min(c["train_rmse"] for f in folds for c in f["epochs"]) - 0.02, top)
    ax1.set_title("RMSE per epoch (held-out fold, solid; training, dashed)")
    ax1.grid(alpha=0.3)
    ax1.legend(fontsize=7, ncol=2)
    x = np.arange(len(folds) + 1)
    names = ["fold %d" % f["fold"] for f in folds] + ["mean"]
    width = 0.2
    for k, (key, label, color) in enumerate([
            ("rmse", "RMSE, model", "C0"), ("baseline_rmse", "RMSE, baseline", "C7"),
            ("mae", "MAE, model", "C2"), ("baseline_mae", "MAE, baseline", "silver")]):
        vals = [f[key] for f in folds] + [summary[key + "_mean"]]
        ax2.bar(x + (k - 1.5) * width, vals, width, label=label, color=color)
    ax2.set_xticks(x)
    ax2.set_xticklabels(names)
    ax2.set_ylim(0.6, 1.0)
    ax2.set_title("Per fold (held-out)")
    ax2.grid(alpha=0.3, axis="y")
    ax2.legend(fontsize=8, ncol=2, loc="upper left")
    fig.suptitle("MovieLens-100k, %d-fold CV: engine-trained embeddings (tf_tpu_emb) vs "
                 "bias baseline" % summary["folds"])
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
