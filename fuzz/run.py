"""Runs coverage-guided fuzz targets for a while from their corpora.

    python fuzz/run.py [--seconds N] [--no-build] TARGET ...   (or --all)
    python fuzz/run.py --report                                 (line coverage of the fuzzed files)

Each target (fuzz/build.py builds build/fuzz/<name>) runs for N seconds
on a working corpus, out/fuzz-cov/corpus/<name> (the committed seeds of
fuzz/corpus/<name> are copied there and never modified; the inputs the
fuzzer keeps accumulate there run after run), with the regression inputs of
fuzz/regressions/<name> replayed first.  One line per target:

    fuzz-cov <target>: <execs> execs, <edges> edges, <k> findings

A finding (crash, sanitizer report, leak, timeout, out-of-memory) is the
input libFuzzer saved, under out/fuzz-cov/findings/<target>/, with
REPLAY.txt there giving the command that replays it; the run's log is
out/fuzz-cov/logs/<target>.log.  The exit status is 1 when any target had a
finding.

--report builds the coverage binaries (fuzz/build.py --coverage), runs each
over its working corpus, seeds and regressions, and writes llvm-cov's line
coverage of every fuzzed C++ file of this tree to out/fuzz-cov/coverage/
(report.txt, summary.json and an HTML tree), printing one line per file.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
import build  # noqa: E402  (fuzz/build.py)

OUT = os.path.join(ROOT, "out", "fuzz-cov")
LLVM_PROFDATA = os.environ.get("FUZZ_LLVM_PROFDATA", "llvm-profdata-14")
LLVM_COV = os.environ.get("FUZZ_LLVM_COV", "llvm-cov-14")
# libFuzzer's per-input limits: an input running longer is a timeout finding,
# one allocating more an out-of-memory finding (the targets bound the engine's
# memory budget themselves).
TIMEOUT_S = 30
RSS_LIMIT_MB = 3072
ARTIFACT = re.compile(r"^(crash|leak|timeout|oom|slow-unit)-")


def _rel(path):
    return os.path.relpath(path, ROOT)


def seed_dirs(name):
    """The committed inputs of a target: its seeds, then its regressions."""
    return [d for d in (os.path.join(HERE, "corpus", name), os.path.join(HERE, "regressions", name))
            if os.path.isdir(d)]


def work_corpus(name):
    """out/fuzz-cov/corpus/<name>, with every committed seed copied in."""
    work = os.path.join(OUT, "corpus", name)
    os.makedirs(work, exist_ok=True)
    seeds = os.path.join(HERE, "corpus", name)
    for path in glob.glob(os.path.join(seeds, "*")):
        dest = os.path.join(work, os.path.basename(path))
        if os.path.isfile(path) and not os.path.exists(dest):
            shutil.copyfile(path, dest)
    return work


def _environment():
    """The targets' environment: the binaries carry their sanitizer settings
    (fuzz/targets/fuzz_input.h) and their own runtime, so the sanitizer
    lane's preloaded GCC runtimes and options are not passed on."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("LD_PRELOAD", "ASAN_OPTIONS", "UBSAN_OPTIONS", "LSAN_OPTIONS")}
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    return env


def parse_stats(log):
    """(execs, edges) from a libFuzzer log (-print_final_stats=1)."""
    execs = re.findall(r"stat::number_of_executed_units:\s*(\d+)", log)
    if not execs:
        execs = re.findall(r"^#(\d+)\s", log, re.M)
    edges = re.findall(r"\bcov: (\d+)", log)
    return (int(execs[-1]) if execs else 0), (int(edges[-1]) if edges else 0)


def run_target(name, seconds, binary=None):
    """Fuzzes `name` for `seconds`; returns (execs, edges, findings)."""
    binary = binary or os.path.join(build.OUT_DIRS[False], name)
    findings_dir = os.path.join(OUT, "findings", name)
    logs = os.path.join(OUT, "logs")
    os.makedirs(findings_dir, exist_ok=True)
    os.makedirs(logs, exist_ok=True)
    before = set(os.listdir(findings_dir))
    work = work_corpus(name)
    cmd = [binary, "-max_total_time=%d" % seconds, "-print_final_stats=1",
           "-timeout=%d" % TIMEOUT_S, "-rss_limit_mb=%d" % RSS_LIMIT_MB,
           "-artifact_prefix=" + findings_dir + os.sep, work] + seed_dirs(name)
    log_path = os.path.join(logs, name + ".log")
    with open(log_path, "w") as log_file:
        # Grace beyond the run's time: loading the corpus, a last slow input.
        try:
            proc = subprocess.run(cmd, cwd=ROOT, env=_environment(), stdout=log_file,
                                  stderr=subprocess.STDOUT, timeout=seconds + 2 * TIMEOUT_S + 120)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            rc = -1
    with open(log_path, errors="replace") as f:
        log = f.read()
    execs, edges = parse_stats(log)
    new = sorted(f for f in set(os.listdir(findings_dir)) - before if ARTIFACT.match(f))
    if new:
        with open(os.path.join(findings_dir, "REPLAY.txt"), "a") as f:
            for artifact in new:
                f.write("# %s (log: %s)\n" % (artifact, _rel(log_path)))
                f.write("python fuzz/build.py %s && build/fuzz/%s %s\n"
                        % (name, name, _rel(os.path.join(findings_dir, artifact))))
    # A non-zero exit without a saved input (a crash while starting, the run
    # killed) is a finding too: its log says what happened.
    findings = len(new) or (1 if rc != 0 else 0)
    if findings and not new:
        with open(os.path.join(findings_dir, "REPLAY.txt"), "a") as f:
            f.write("# exit status %d without a saved input (log: %s)\n%s\n"
                    % (rc, _rel(log_path), " ".join(_rel(c) if c.startswith(ROOT) else c
                                                    for c in cmd)))
    return execs, edges, findings


def report(names):
    """Coverage build, each target over its corpora, llvm-cov's line
    coverage per fuzzed file of this tree; returns the summary rows."""
    binaries = build.build(names, coverage=True)
    cov_dir = os.path.join(OUT, "coverage")
    shutil.rmtree(cov_dir, ignore_errors=True)
    os.makedirs(cov_dir)
    profiles = []
    for name, binary in zip(names, binaries):
        raw = os.path.join(cov_dir, name + ".profraw")
        dirs = [d for d in [os.path.join(OUT, "corpus", name)] if os.path.isdir(d)]
        env = dict(_environment(), LLVM_PROFILE_FILE=raw)
        subprocess.run([binary, "-runs=0", "-timeout=%d" % TIMEOUT_S] + dirs + seed_dirs(name),
                       cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        if os.path.exists(raw):
            profiles.append(raw)
    profdata = os.path.join(cov_dir, "merged.profdata")
    subprocess.run([LLVM_PROFDATA, "merge", "-sparse", "-o", profdata] + profiles, check=True)
    objects = [binaries[0]] + [x for b in binaries[1:] for x in ("-object", b)]
    # The tree's own C++ files: the target files themselves and TF's headers are not.
    ignore = ["-ignore-filename-regex=(^|/)(fuzz|external|tensorflow|site-packages|usr)/"]
    exported = subprocess.run([LLVM_COV, "export", "-summary-only", "-instr-profile", profdata]
                              + ignore + objects, check=True, capture_output=True, text=True)
    data = json.loads(exported.stdout)
    rows = []
    for entry in data["data"][0]["files"]:
        path = os.path.relpath(entry["filename"], ROOT)
        if path.startswith(".."):
            continue
        lines = entry["summary"]["lines"]
        rows.append((path, lines["covered"], lines["count"]))
    rows.sort()
    with open(os.path.join(cov_dir, "summary.json"), "w") as f:
        json.dump([{"file": p, "lines_covered": c, "lines": n} for p, c, n in rows], f, indent=1)
    text = subprocess.run([LLVM_COV, "report", "-instr-profile", profdata] + ignore + objects,
                          check=True, capture_output=True, text=True, cwd=ROOT).stdout
    with open(os.path.join(cov_dir, "report.txt"), "w") as f:
        f.write(text)
    subprocess.run([LLVM_COV, "show", "-format=html", "-output-dir",
                    os.path.join(cov_dir, "html"), "-instr-profile", profdata] + ignore + objects,
                   check=True, cwd=ROOT, stdout=subprocess.DEVNULL)
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("targets", nargs="*", help="target names")
    p.add_argument("--all", action="store_true", help="every target of fuzz/targets")
    p.add_argument("--seconds", type=int, default=60, help="per target (default %(default)s)")
    p.add_argument("--no-build", action="store_true", help="use the binaries as built")
    p.add_argument("--report", action="store_true",
                   help="line coverage of the fuzzed files into out/fuzz-cov/coverage")
    a = p.parse_args()
    names = build.targets() if (a.all or (a.report and not a.targets)) else a.targets
    if not names:
        p.error("name a target or pass --all (targets: %s)" % ", ".join(build.targets()))
    if a.report:
        rows = report(names)
        covered = sum(c for _, c, _ in rows)
        total = sum(n for _, _, n in rows)
        for path, c, n in rows:
            print("fuzz-cov-report %s: %.1f%% of %d lines" % (path, 100.0 * c / max(n, 1), n))
        print("fuzz-cov-report total: %.1f%% of %d lines (out/fuzz-cov/coverage/)"
              % (100.0 * covered / max(total, 1), total))
        return 0
    binaries = [None] * len(names) if a.no_build else build.build(names)
    failed = 0
    for name, binary in zip(names, binaries):
        execs, edges, findings = run_target(name, a.seconds, binary)
        print("fuzz-cov %s: %d execs, %d edges, %d findings" % (name, execs, edges, findings),
              flush=True)
        if findings:
            print("  findings and REPLAY.txt: %s" % _rel(os.path.join(OUT, "findings", name)),
                  flush=True)
            failed += 1
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
