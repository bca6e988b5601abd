"""MovieLens-100k for ``python -m tf_tpu_emb.demo --data movielens-100k``.

The data set travels inside a package registry: the wheel of RecBole 1.2.1
(``pip download --no-deps recbole==1.2.1``, about 2 MB) holds MovieLens-100k in
RecBole's *atomic files* (``recbole/dataset_example/ml-100k/ml-100k.{inter,user,item}``:
100,000 ratings of 1,682 movies by 943 users).  The wheel is a zip and is read
directly; RecBole itself is never installed or imported.

Atomic files are tab-separated with a header of ``name:type`` fields, ``type``
one of ``token``, ``token_seq`` (space-separated tokens), ``float`` and
``float_seq``.  This module parses them, encodes the features the rating model
uses (row 0 of every vocabulary is "unknown"), splits the ratings into
cross-validation folds and fits the bias baseline.
"""
import dataclasses
import os
import subprocess
import sys
import zipfile

import numpy as np

from tf_tpu_emb.demo.cli import CACHE_ENV  # noqa: F401  (the one definition)

RECBOLE = "recbole==1.2.1"
WHEEL = "recbole-1.2.1-py3-none-any.whl"
MEMBER_DIR = "recbole/dataset_example/ml-100k/"
FILES = {"inter": "ml-100k.inter", "user": "ml-100k.user", "item": "ml-100k.item"}
ATOMIC_TYPES = ("token", "token_seq", "float", "float_seq")
# MovieLens' own age groups (the 1M release's): under 18, 18-24, 25-34, 35-44,
# 45-49, 50-55, 56+; bucket k + 1 holds ages in [AGE_EDGES[k], AGE_EDGES[k + 1]).
AGE_EDGES = (0, 18, 25, 35, 45, 50, 56)
AGE_LABELS = ("unknown", "<18", "18-24", "25-34", "35-44", "45-49", "50-55", "56+")


class DataError(Exception):
    """The data cannot be found, fetched or parsed (the message says what to do)."""


def how_to_get(cache):
    return ("Get MovieLens-100k with\n"
            "    %s -m pip download --no-deps %s -d %s\n"
            "(a 2 MB wheel that ships the data set; it is read as a zip, nothing is "
            "installed), or point --data-path at that wheel, at a folder holding it, or at "
            "a folder with %s." % (sys.executable, RECBOLE, cache, ", ".join(FILES.values())))


def default_cache_dir():
    """``$TF_TPU_EMB_CACHE``, else ``$XDG_CACHE_HOME/tf_tpu_emb``, else ``~/.cache/tf_tpu_emb``."""
    if os.environ.get(CACHE_ENV):
        return os.environ[CACHE_ENV]
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(base, "tf_tpu_emb")


def fetch_wheel(cache, timeout=300):
    """Downloads the RecBole wheel into `cache` with pip (once); returns its path."""
    path = os.path.join(cache, WHEEL)
    if os.path.isfile(path):
        return path
    os.makedirs(cache, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--disable-pip-version-check",
           "--no-input", "-q", RECBOLE, "-d", cache]
    try:
        result = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise DataError("Downloading %s failed (%s).\n%s" % (RECBOLE, e, how_to_get(cache)))
    if result.returncode != 0 or not os.path.isfile(path):
        tail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise DataError("`pip download %s` failed (exit %d%s).\n%s" % (
            RECBOLE, result.returncode, ": " + " | ".join(tail) if tail else "",
            how_to_get(cache)))
    return path


def locate(data_path=None, cache=None, download=True):
    """The source of the three atomic files: a wheel (zip) path or a folder.

    `data_path` (a wheel, a folder holding the wheel, or a folder holding the
    three files) wins; otherwise the cached wheel, downloaded first when absent
    and `download` is true.  Raises DataError saying how to get the data.
    """
    cache = cache or default_cache_dir()
    if data_path:
        if os.path.isfile(data_path):
            return data_path
        if os.path.isdir(data_path):
            if all(os.path.isfile(os.path.join(data_path, f)) for f in FILES.values()):
                return data_path
            if os.path.isfile(os.path.join(data_path, WHEEL)):
                return os.path.join(data_path, WHEEL)
            raise DataError("--data-path %s holds neither %s nor %s.\n%s" % (
                data_path, WHEEL, ", ".join(FILES.values()), how_to_get(cache)))
        raise DataError("--data-path %s does not exist.\n%s" % (data_path, how_to_get(cache)))
    if os.path.isfile(os.path.join(cache, WHEEL)):
        return os.path.join(cache, WHEEL)
    if not download:
        raise DataError("MovieLens-100k is not in the cache %s.\n%s" % (cache, how_to_get(cache)))
    return fetch_wheel(cache)


def read_texts(source):
    """{'inter' | 'user' | 'item': file text} from a wheel/zip or a folder."""
    texts = {}
    if os.path.isdir(source):
        for key, name in FILES.items():
            with open(os.path.join(source, name), "rb") as f:
                texts[key] = f.read()
    else:
        try:
            with zipfile.ZipFile(source) as z:
                members = set(z.namelist())
                for key, name in FILES.items():
                    if MEMBER_DIR + name not in members:
                        raise DataError("%s has no member %s%s." % (source, MEMBER_DIR, name))
                    texts[key] = z.read(MEMBER_DIR + name)
        except (zipfile.BadZipFile, OSError) as e:
            raise DataError("%s is not a readable wheel/zip (%s)." % (source, e))
    out = {}
    for key, raw in texts.items():
        try:
            out[key] = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise DataError("%s is not UTF-8 (%s)." % (FILES[key], e))
    return out


def parse_atomic(text, name):
    """Parses one atomic file: {field name: list of values} in file order.

    ``token`` -> str, ``token_seq`` -> list of str, ``float`` -> float,
    ``float_seq`` -> list of float.  A bad header, a row with the wrong number
    of fields or a value that is not a float raises DataError naming the file,
    line and field.
    """
    lines = text.splitlines()
    if not lines or not lines[0].strip():
        raise DataError("%s: empty file (expected a `name:type` header)." % name)
    fields = []
    for col, spec in enumerate(lines[0].split("\t")):
        field, sep, kind = spec.partition(":")
        if not sep or not field or kind not in ATOMIC_TYPES:
            raise DataError("%s line 1, column %d: header field %r is not `name:type` with type "
                            "in %s." % (name, col + 1, spec, ", ".join(ATOMIC_TYPES)))
        fields.append((field, kind))
    if len({f for f, _ in fields}) != len(fields):
        raise DataError("%s line 1: duplicate field names in %r." % (name, lines[0]))
    columns = {f: [] for f, _ in fields}
    for lineno, line in enumerate(lines[1:], start=2):
        if not line:
            continue
        parts = line.split("\t")
        if len(parts) != len(fields):
            raise DataError("%s line %d: %d fields, the header has %d." % (
                name, lineno, len(parts), len(fields)))
        for (field, kind), value in zip(fields, parts):
            if kind == "token":
                columns[field].append(value)
            elif kind == "token_seq":
                columns[field].append(value.split())
            else:
                try:
                    floats = [float(v) for v in value.split()]
                except ValueError:
                    raise DataError("%s line %d, field %s: %r is not a %s." % (
                        name, lineno, field, value, kind))
                if kind == "float" and len(floats) != 1:
                    raise DataError("%s line %d, field %s: %r is not one float." % (
                        name, lineno, field, value))
                columns[field].append(floats[0] if kind == "float" else floats)
    return columns


def _require(columns, fields, name):
    missing = [f for f in fields if f not in columns]
    if missing:
        raise DataError("%s has no field %s (fields: %s)." % (
            name, ", ".join(missing), ", ".join(columns)))


def age_bucket(age_token):
    """MovieLens age group index (1..7) of an age token; 0 when not a number."""
    try:
        age = float(age_token)
    except ValueError:
        return 0
    return int(np.searchsorted(AGE_EDGES, age, side="right")) if age >= 0 else 0


def _year(token):
    try:
        return int(token)
    except ValueError:
        return None


@dataclasses.dataclass
class MovieLens:
    """Encoded MovieLens: per rating the user/movie rows, per user and per movie
    the rows of their features (0 = unknown), and the vocabularies."""
    user: np.ndarray          # [n] int64 rows into user_ids + 1
    movie: np.ndarray         # [n] int64 rows into movie_ids + 1
    rating: np.ndarray        # [n] float32
    user_ids: list            # raw tokens, row k + 1 is user_ids[k]
    movie_ids: list
    user_features: dict       # name -> [len(user_ids) + 1] int64 (row 0: unknown user)
    movie_year: np.ndarray    # [len(movie_ids) + 1] int64
    movie_genres: np.ndarray  # [len(movie_ids) + 1, max genres] int64, -1 padded
    vocab: dict               # feature -> list of labels (index = row)

    @property
    def num_ratings(self):
        return len(self.rating)


def _index(tokens):
    """Sorted vocabulary (numerically when every token is an integer), row k + 1."""
    uniq = sorted(set(tokens), key=lambda t: (0, int(t), t) if t.lstrip("-").isdigit()
                  else (1, 0, t))
    return uniq, {t: k + 1 for k, t in enumerate(uniq)}


def encode(texts):
    """MovieLens from the three atomic file texts."""
    inter = parse_atomic(texts["inter"], FILES["inter"])
    users = parse_atomic(texts["user"], FILES["user"])
    items = parse_atomic(texts["item"], FILES["item"])
    _require(inter, ["user_id", "item_id", "rating"], FILES["inter"])
    _require(users, ["user_id", "age", "gender", "occupation"], FILES["user"])
    _require(items, ["item_id", "release_year", "class"], FILES["item"])
    if not inter["rating"]:
        raise DataError("%s has no ratings." % FILES["inter"])
    if not isinstance(inter["rating"][0], float):
        raise DataError("%s: field rating must be float." % FILES["inter"])
    if isinstance(items["class"][0] if items["class"] else [], str):
        raise DataError("%s: field class (genres) must be token_seq." % FILES["item"])

    user_ids, user_row = _index(users["user_id"] + inter["user_id"])
    movie_ids, movie_row = _index(items["item_id"] + inter["item_id"])
    vocab = {"user": ["unknown"] + user_ids, "movie": ["unknown"] + movie_ids,
             "age": list(AGE_LABELS)}
    feats = {}
    for f in ("gender", "occupation"):
        labels, row = _index(users[f])
        vocab[f] = ["unknown"] + labels
        feats[f] = np.zeros(len(user_ids) + 1, np.int64)
        for u, t in zip(users["user_id"], users[f]):
            feats[f][user_row[u]] = row[t]
    feats["age"] = np.zeros(len(user_ids) + 1, np.int64)
    for u, t in zip(users["user_id"], users["age"]):
        feats["age"][user_row[u]] = age_bucket(t)

    years = sorted({y for y in map(_year, items["release_year"]) if y is not None})
    vocab["year"] = ["unknown"] + [str(y) for y in years]
    year_row = {y: k + 1 for k, y in enumerate(years)}
    genres, genre_row = _index([g for seq in items["class"] for g in seq])
    vocab["genres"] = ["unknown"] + genres
    movie_year = np.zeros(len(movie_ids) + 1, np.int64)
    width = max([1] + [len(seq) for seq in items["class"]])
    movie_genres = np.full((len(movie_ids) + 1, width), -1, np.int64)
    movie_genres[:, 0] = 0  # movies without genres (and unknown movies): "unknown"
    for m, y, seq in zip(items["item_id"], items["release_year"], items["class"]):
        movie_year[movie_row[m]] = year_row.get(_year(y), 0)
        if seq:
            movie_genres[movie_row[m], :len(seq)] = [genre_row[g] for g in seq]

    return MovieLens(
        user=np.array([user_row[u] for u in inter["user_id"]], np.int64),
        movie=np.array([movie_row[m] for m in inter["item_id"]], np.int64),
        rating=np.array(inter["rating"], np.float32),
        user_ids=user_ids, movie_ids=movie_ids, user_features=feats,
        movie_year=movie_year, movie_genres=movie_genres, vocab=vocab)


def load(data_path=None, cache=None, download=True):
    """(MovieLens, source path) -- see `locate`."""
    source = locate(data_path, cache, download)
    return encode(read_texts(source)), source


def folds(num_ratings, k, seed):
    """k test folds of a random permutation of the ratings (fixed seed): each
    rating is in exactly one test fold; folds differ in size by at most one."""
    if not 2 <= k <= num_ratings:
        raise ValueError("need 2 <= folds (%d) <= ratings (%d)" % (k, num_ratings))
    perm = np.random.default_rng(seed).permutation(num_ratings)
    return np.array_split(perm, k)


def train_test(parts, fold):
    """(train indices, test indices) of fold `fold` of `folds(...)`."""
    test = parts[fold]
    train = np.concatenate([p for i, p in enumerate(parts) if i != fold])
    return train, test


def rating_ids(data):
    """Per rating, the row of each single-id feature."""
    ids = {"user": data.user, "movie": data.movie, "year": data.movie_year[data.movie]}
    for f in ("occupation", "age", "gender"):
        ids[f] = data.user_features[f][data.user]
    return ids


def ragged_rows(padded):
    """(values, row_splits) of a -1 padded matrix."""
    mask = padded >= 0
    return padded[mask], np.concatenate([[0], np.cumsum(mask.sum(1))]).astype(np.int64)


def rated_movies(data, train):
    """(values, row_splits) per user row: the movies rated in `train`."""
    users = data.user[train]
    values = data.movie[train][np.argsort(users, kind="stable")]
    counts = np.bincount(users, minlength=len(data.vocab["user"]))
    return values, np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)


def gather_rows(values, splits, rows):
    """Rows `rows` of the ragged (values, splits): (values, row_splits)."""
    starts = splits[rows]
    lengths = splits[rows + 1] - starts
    out = np.zeros(len(rows) + 1, np.int64)
    np.cumsum(lengths, out=out[1:])
    return values[np.arange(out[-1]) - np.repeat(out[:-1] - starts, lengths)], out


def fit_baseline(user, movie, rating, num_users, num_movies, reg_user=15.0, reg_movie=10.0,
                 epochs=10):
    """Global mean + regularised user and movie biases by alternating least squares.

    Minimises sum (r - mu - b_u - b_i)^2 + reg_user * sum b_u^2 + reg_movie * sum b_i^2
    (mu = mean rating) by exact coordinate steps, movie biases first:
    b_i = sum_{u in R(i)} (r_ui - mu - b_u) / (reg_movie + |R(i)|), then
    b_u = sum_{i in R(u)} (r_ui - mu - b_i) / (reg_user + |R(u)|)
    (Koren's baseline predictors; the defaults are the Surprise library's
    ``BaselineOnly``).  Returns (mu, b_user [num_users], b_movie [num_movies]).
    """
    rating = np.asarray(rating, np.float64)
    mu = float(rating.mean())
    b_user = np.zeros(num_users)
    b_movie = np.zeros(num_movies)
    n_user = np.bincount(user, minlength=num_users)
    n_movie = np.bincount(movie, minlength=num_movies)
    for _ in range(epochs):
        b_movie = (np.bincount(movie, rating - mu - b_user[user], num_movies)
                   / (reg_movie + n_movie))
        b_user = (np.bincount(user, rating - mu - b_movie[movie], num_users)
                  / (reg_user + n_user))
    return mu, b_user, b_movie


def rmse_mae(prediction, rating):
    err = np.asarray(prediction, np.float64) - np.asarray(rating, np.float64)
    return float(np.sqrt(np.mean(err ** 2))), float(np.mean(np.abs(err)))
