"""Structure checks that speak the user's terms.

TF's ``nest.assert_same_structure`` reports a misspelled feature key as two
whole structures printed one after the other, with the difference at the very
end.  :func:`assert_same_structure` raises the same exception class with the
missing and the unexpected key paths first (``"user/friends"``: the path in
the user's nested dict), then TF's own report.  Used by ``TPUEmbedding``
(enqueue features and weights, gradients) and the Keras layers (their inputs).
"""
from tensorflow.python.util import nest


def key_paths(structure):
    """The key paths (``"a/b"``; list positions as numbers) of `structure`'s leaves."""
    return [path for path, _ in nest.flatten_with_joined_string_paths(structure)]


def assert_same_structure(expected, got, what, check_types=True):
    """Raises (ValueError, or TF's TypeError) unless `got` has the structure
    of `expected` -- the same key paths (nest's check alone does not compare
    dict keys when types are not checked) and what TF's check compares --;
    `what` names the argument (``"enqueue(features)"``)."""
    want, have = key_paths(expected), key_paths(got)
    missing = [p for p in want if p not in have]
    unexpected = [p for p in have if p not in want]
    error, detail = ValueError, None
    try:
        nest.assert_same_structure(expected, got, check_types=check_types)
    except (ValueError, TypeError) as e:
        error, detail = type(e), str(e)
    if not missing and not unexpected and detail is None:
        return
    if missing or unexpected:
        head = "%s does not match the feature config: missing %s; unexpected %s." % (
            what, _listing(missing), _listing(unexpected))
    else:
        head = "%s does not have the feature config's structure (the same keys, nested " \
               "or typed differently)." % what
    if detail is not None:
        head += "\nTensorFlow's structure check says: " + detail
    raise error(head)


def _listing(paths):
    return ", ".join(repr(p) for p in paths) if paths else "none"
