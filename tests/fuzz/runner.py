"""The fuzz runner: runs generated cases in worker child processes and
classifies each one as ok / crash / hang / wrong_error / corruption.

A worker (``worker.py``) imports TensorFlow once and runs cases one after
the other until it dies; the runner sends it (family, seed, index) triples
and waits for each result with a per-case timeout.  A worker that dies in a
case (signal or exit) records a *crash*, one that does not answer in time is
killed and records a *hang*; either way a fresh worker carries on with the
next case.  Every finding is written as a reproducer file (JSON: the case's
triple, its outcome, the worker's output tail and the generated steps) that
``python tests/fuzz/runner.py --replay FILE`` runs again.

Usage (``make fuzz`` runs the first)::

    python tests/fuzz/runner.py --cases 10000 --seed 1 --out out/fuzz
    python tests/fuzz/runner.py --families embedding_bag --cases 200 --seed 7
    python tests/fuzz/runner.py --replay out/fuzz/findings/config-1-42.json

The exit status is 1 when any case was not ok.
"""
import argparse
import collections
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import families  # noqa: E402  (no TensorFlow: only names and counts)

OUTCOMES = ("ok", "crash", "hang", "wrong_error", "corruption", "harness_error")


class Worker:
    """One worker child process; results come back on a pipe of their own
    (TensorFlow and the sanitizers write to stdout/stderr freely)."""

    def __init__(self, log_dir, env=None):
        read_fd, write_fd = os.pipe()
        self.log = tempfile.NamedTemporaryFile(
            "w+b", dir=log_dir, prefix="worker-", suffix=".log", delete=False)
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "worker.py"), str(write_fd)],
            stdin=subprocess.PIPE, stdout=self.log, stderr=subprocess.STDOUT,
            pass_fds=(write_fd,), env=env, cwd=os.path.dirname(os.path.dirname(HERE)))
        os.close(write_fd)
        self.results = os.fdopen(read_fd, "rb", buffering=0)
        self.buffer = b""
        self.eof = False

    def send(self, request):
        self.proc.stdin.write((json.dumps(request) + "\n").encode())
        self.proc.stdin.flush()

    def receive(self, timeout):
        """The next result line (a dict), or None on timeout / EOF."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            ready, _, _ = select.select([self.results], [], [], left)
            if not ready:
                return None
            chunk = os.read(self.results.fileno(), 1 << 16)
            if not chunk:
                self.eof = True
                return None
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return json.loads(line)

    def output_tail(self, limit=6000):
        self.log.flush()
        with open(self.log.name, "rb") as f:
            data = f.read()
        return data[-limit:].decode("utf-8", "replace")

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()

    def close(self):
        try:
            self.proc.stdin.close()
        except OSError:
            pass
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.kill()
        self.results.close()
        self.log.close()
        os.unlink(self.log.name)


def describe_exit(returncode):
    if returncode is None:
        return "still running"
    if returncode < 0:
        try:
            return "killed by %s" % signal.Signals(-returncode).name
        except ValueError:
            return "killed by signal %d" % -returncode
    return "exited with status %d" % returncode


def run_cases(requests, *, timeout, log_dir, env=None, start_timeout=300, on_result=None,
              cases_per_worker=1000):
    """Runs `requests` (dicts with family/seed/index) in workers; returns one
    result dict per request, in order: {"outcome", "detail", "output"?}.

    A worker is replaced after `cases_per_worker` cases: TensorFlow's eager
    context caches a kernel per distinct op attribute set (every fuzzed
    config is one), so a worker's memory grows with the cases it ran."""
    results = []
    worker = None
    served = 0
    try:
        for request in requests:
            if worker is not None and served >= cases_per_worker:
                worker.close()
                worker = None
            if worker is None:
                served = 0
                worker = Worker(log_dir, env)
                ready = worker.receive(start_timeout)
                if ready is None or not ready.get("ready"):
                    raise RuntimeError("fuzz worker did not start (%s):\n%s" % (
                        describe_exit(worker.proc.poll()), worker.output_tail()))
            worker.send(request)
            served += 1
            result = worker.receive(timeout)
            if result is None:
                code = worker.proc.poll()
                if code is None and worker.eof:
                    try:  # the results pipe closed: the worker is dying
                        code = worker.proc.wait(timeout=60)
                    except subprocess.TimeoutExpired:
                        pass
                if code is None:
                    worker.kill()
                    result = {"outcome": "hang",
                              "detail": "no result within %g s; worker killed" % timeout}
                else:
                    result = {"outcome": "crash", "detail": describe_exit(worker.proc.wait())}
                result["output"] = worker.output_tail()
                worker.close()
                worker = None
            elif result.get("restart"):
                worker.close()
                worker = None
            results.append(result)
            if on_result is not None:
                on_result(request, result)
    finally:
        if worker is not None:
            worker.close()
    return results


def write_reproducer(directory, request, result):
    """Writes a JSON reproducer of one finding; returns its path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "%s-%d-%d.json" % (
        request["family"], request["seed"], request["index"]))
    steps = None
    try:
        steps = families.describe(request["family"], request["seed"], request["index"])
    except Exception as e:  # the description is a convenience only
        steps = "cannot describe the case: %r" % e
    with open(path, "w") as f:
        json.dump(dict(request, outcome=result["outcome"], detail=result.get("detail"),
                       output=result.get("output"), steps=steps,
                       replay="python tests/fuzz/runner.py --replay %s" % path), f, indent=1)
    return path


def summary_table(counts, seconds):
    lines = ["%-14s %7s %6s %6s %6s %12s %11s %14s %8s" % (
        ("family", "cases") + OUTCOMES + ("seconds",))]
    for family, c in counts.items():
        lines.append("%-14s %7d %6d %6d %6d %12d %11d %14d %8.1f" % (
            (family, sum(c.values())) + tuple(c[o] for o in OUTCOMES) + (seconds[family],)))
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--families", default=",".join(families.FAMILIES),
                        help="comma-separated families (default: all but selftest)")
    parser.add_argument("--cases", type=int, default=1000, help="cases per family")
    parser.add_argument("--seed", type=int, default=None,
                        help="seed (default: from the clock, printed)")
    parser.add_argument("--timeout", type=float, default=float(
        os.environ.get("TF_TPU_EMB_FUZZ_TIMEOUT", "60")), help="seconds per case")
    parser.add_argument("--out", default="out/fuzz", help="reproducers go to OUT/findings")
    parser.add_argument("--replay", help="run one reproducer file again and print it")
    parser.add_argument("--no-case-limits", action="store_true",
                        help="run --cases of every family (by default the slow ones, "
                        "families.CASE_LIMITS, run at most their limit)")
    args = parser.parse_args(argv)

    os.makedirs(args.out, exist_ok=True)
    if args.replay:
        with open(args.replay) as f:
            request = {k: v for k, v in json.load(f).items() if k in ("family", "seed", "index")}
        request["verbose"] = True
        result = run_cases([request], timeout=args.timeout, log_dir=args.out)[0]
        print(json.dumps({k: v for k, v in result.items() if k != "output"}, indent=1))
        print(result.get("output", ""))
        return 0 if result["outcome"] == "ok" else 1

    seed = args.seed if args.seed is not None else int(time.time()) % 100000
    names = [f for f in args.families.split(",") if f]
    for name in names:
        if name not in families.ALL_FAMILIES:
            parser.error("unknown family %r (known: %s)" % (name, ", ".join(families.ALL_FAMILIES)))
    print("fuzz: seed %d, %d cases per family, families %s, timeout %g s"
          % (seed, args.cases, ", ".join(names), args.timeout), flush=True)
    counts = collections.OrderedDict()
    seconds = {}
    findings = []
    for name in names:
        counts[name] = collections.Counter({o: 0 for o in OUTCOMES})
        start = time.monotonic()

        def on_result(request, result, name=name):
            counts[name][result["outcome"]] += 1
            if result["outcome"] != "ok":
                path = write_reproducer(os.path.join(args.out, "findings"), request, result)
                findings.append(path)
                print("  %s case %d: %s: %s (%s)" % (name, request["index"], result["outcome"],
                                                    (result.get("detail") or "")[:300], path),
                      flush=True)
            done = sum(counts[name].values())
            if done % 1000 == 0:
                print("  %s: %d/%d cases, %.0f s" % (name, done, cases,
                                                     time.monotonic() - start), flush=True)

        cases = args.cases if args.no_case_limits else min(
            args.cases, families.CASE_LIMITS.get(name, args.cases))
        run_cases([{"family": name, "seed": seed, "index": i} for i in range(cases)],
                  timeout=args.timeout, log_dir=args.out, on_result=on_result)
        seconds[name] = time.monotonic() - start
    table = summary_table(counts, seconds)
    print(table)
    with open(os.path.join(args.out, "summary.txt"), "w") as f:
        f.write("seed %d\n%s\n" % (seed, table))
    if findings:
        print("fuzz: %d finding(s); reproducers in %s" % (
            len(findings), os.path.join(args.out, "findings")))
        return 1
    print("fuzz: no findings")
    return 0


if __name__ == "__main__":
    sys.exit(main())
