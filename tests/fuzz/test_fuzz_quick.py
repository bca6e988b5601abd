"""The fuzz suite's quick profile (part of the test suite; `make fuzz` runs
the full one): a fixed seed, a few cases per family in a worker child
process, every case must be ok.  And a proof that the runner records what it
claims: deliberate abort / SIGSEGV / hang / non-TF exception / corrupting
rejection cases are classified as such, and the run itself survives them."""
import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import families  # noqa: E402
import runner  # noqa: E402

pytestmark = pytest.mark.system  # child processes, servers or compilers

QUICK_SEED = int(os.environ.get("TF_TPU_EMB_FUZZ_SEED", "20261123"))
QUICK_CASES = int(os.environ.get("TF_TPU_EMB_FUZZ_QUICK_CASES", "25"))
# The cluster family starts 1-3 server processes a case (seconds each).
QUICK_CLUSTER_CASES = int(os.environ.get("TF_TPU_EMB_FUZZ_QUICK_CLUSTER_CASES", "2"))


def quick_cases(family):
    return QUICK_CLUSTER_CASES if family == "cluster" else QUICK_CASES
TIMEOUT = float(os.environ.get("TF_TPU_EMB_FUZZ_TIMEOUT", "60"))


def test_runner_classifies_deliberate_failures(tmp_path):
    requests = [{"family": "selftest", "seed": 1, "index": i} for i in range(6)]
    results = runner.run_cases(requests, timeout=min(TIMEOUT, 8), log_dir=str(tmp_path))
    got = [r["outcome"] for r in results]
    assert got == ["crash", "crash", "hang", "wrong_error", "corruption", "ok"], results
    assert "SIGABRT" in results[0]["detail"]
    # AddressSanitizer (make sanitize) reports a SEGV itself and exits with 1
    assert "SIGSEGV" in results[1]["detail"] or "AddressSanitizer: SEGV" in results[1]["output"]
    assert "ValueError" in results[3]["detail"]
    assert "changed" in results[4]["detail"]
    path = runner.write_reproducer(str(tmp_path / "findings"), requests[1], results[1])
    assert os.path.exists(path)


# Cases `make fuzz` reported, replayed by every quick run (family, seed, index).
FOUND = [
    # A mutated config with 3 replicas was accepted; the drain then ran a Recv
    # on /CPU:2, which the 2-device worker does not have, so TF placed it on
    # CPU:0 and replica 0 answered: the executor now drains only replicas it
    # can reach (a harness defect, not the engine's).
    ("lifecycle", 1, 267), ("lifecycle", 1, 1667),
]


@pytest.fixture(scope="module")
def quick_results(tmp_path_factory):
    """Every family's quick cases and the FOUND cases, run by one worker (one
    TensorFlow start)."""
    requests = [{"family": f, "seed": QUICK_SEED, "index": i}
                for f in families.FAMILIES for i in range(quick_cases(f))]
    requests += [{"family": f, "seed": seed, "index": i} for f, seed, i in FOUND]
    results = runner.run_cases(requests, timeout=TIMEOUT,
                               log_dir=str(tmp_path_factory.mktemp("fuzz")))
    return list(zip(requests, results))


@pytest.mark.parametrize("family", families.FAMILIES)
def test_quick_profile(family, quick_results):
    bad = ["case %d: %s: %s\n%s" % (q["index"], r["outcome"], r.get("detail"),
                                    (r.get("output") or "")[-1500:])
           for q, r in quick_results if q["family"] == family and q["seed"] == QUICK_SEED
           and r["outcome"] != "ok"]
    assert not bad, "%d finding(s) (replay: python tests/fuzz/runner.py --families %s " \
        "--seed %d --cases %d):\n%s" % (len(bad), family, QUICK_SEED, quick_cases(family),
                                        "\n".join(bad))


@pytest.mark.parametrize("family,seed,index", FOUND)
def test_found_case(family, seed, index, quick_results):
    (result,) = [r for q, r in quick_results
                 if (q["family"], q["seed"], q["index"]) == (family, seed, index)]
    assert result["outcome"] == "ok", (result.get("detail"), (result.get("output") or "")[-1500:])
