#!/usr/bin/env python3
"""A scripted agent that makes real runs for loop-detection benchmarks.

No model: every scenario is a scripted sequence of actions whose parameters (file and
symbol names, prose, directory depth, number of repeats, job length ...) are drawn per
session from a seeded RNG. The actions are executed for real, in a small fake project
created in a fresh temporary directory, through two tools:

  bash       one persistent `bash` process per session, fed commands on stdin; after each
             command the agent sends `echo __END_<n>__ $?` and reads stdout+stderr (one pipe,
             so they interleave as the shell wrote them) up to that sentinel. The exit status
             gives action_status. bash fed from stdin numbers its input lines, so error
             messages carry growing line numbers, as in real agent harnesses.
  edit_file  inserts lines after line N ({"path", "line", "text"}) or replaces a unique
             string ({"path", "old", "new"}), writes the file and answers with the whole
             file, numbered like `cat -n`, under a `[File: path (N lines total)]` header.

Writes two files in the flat step-record format of ../../shared/datasets/real_runs:

    python3 bench/real_runs/scripted/agent.py --seed 1 --out bench/real_runs/scripted

  steps.jsonl     one step per line: session_id, agent_id, step, intent, tool_call,
                  action_status, tool_input, result (cut to 2,048 UTF-8 bytes), source
  sessions.jsonl  one line per session with the scenario's label and the exact-match
                  statistics of the dev corpus (see README.md)

Needs python3 (standard library only), bash, coreutils, grep and findutils; git is used by
the `ordinary` scenario when it is installed. Touches nothing outside its temporary
directories. Outputs carry real dates, sizes, timings and temp paths, so two runs with
the same seed give the same sessions and actions but not byte-identical results.
"""
import argparse
import json
import os
import random
import re
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter

SOURCE = "scripted"
RESULT_BYTES = 2048

# --------------------------------------------------------------------------- dev-corpus rules
# Copied from ../../shared/datasets/real_runs/convert_dev.py so that tool_call, intent,
# result cutting and the exact-match statistics mean the same thing in both corpora.
EDIT_TOOLS = {"edit", "create", "insert", "str_replace_editor", "apply_patch", "patch", "write_file"}
VIEW_TOOLS = {"open", "goto", "scroll_up", "scroll_down", "cat", "head", "tail", "nl", "less", "more", "view"}
SEARCH_TOOLS = {"search_dir", "search_file", "find_file", "grep", "egrep", "rg", "ag", "find", "ls", "tree",
                "locate", "ack"}
RUN_TOOLS = {"python", "python3", "pytest", "py.test", "tox", "javac", "java", "mvn", "./mvnw", "gradle",
             "./gradlew", "make", "npm", "node", "npx", "yarn", "go", "cargo", "bash", "sh", "./runtests.py",
             "ruby", "rake", "cmake"}
VCS_TOOLS = {"git"}
NAV_TOOLS = {"cd", "pwd"}
ENV_TOOLS = {"pip", "pip3", "conda", "apt-get", "apt", "export", "source", "which", "env"}
FILE_TOOLS = {"rm", "mv", "cp", "mkdir", "touch", "chmod"}


def _segments(cmd):
    first_line = cmd.strip().split("\n", 1)[0]
    return [s.strip() for s in re.split(r"&&|\|\||;|\|", first_line) if s.strip()]


def shell_tool_and_intent(action):
    """(intent, tool_call) of a shell command, by the dev corpus's shell rules."""
    a = (action or "").strip()
    if not a:
        return "format_error", "none"
    lines = [ln for ln in a.split("\n") if ln.strip() and not ln.strip().startswith("#")]
    if not lines:
        return "comment", "#"
    a = "\n".join(lines)
    segs = _segments(a) or [a.split("\n", 1)[0]]
    seg = next((s for s in segs if s.split()[0] not in NAV_TOOLS), segs[0])
    words = seg.split()
    tool = words[0]
    if tool in ("sudo", "timeout", "time") and len(words) > 1:
        tool = words[1] if not words[1][0].isdigit() or len(words) < 3 else words[2]
    tool = re.sub(r"^.*/(python3?)$", r"\1", tool)
    first_line = a.split("\n", 1)[0]
    if tool == "sed" and re.search(r"\s-i\b|\s-i['\"]|\s-i\.", first_line):
        return "edit", tool
    if tool in ("cat", "echo", "printf", "tee") and (re.search(r"(^|[^2])>{1,2}\s*[\w./-]", first_line)
                                                      or tool == "tee"):
        return "edit", tool
    if tool == "sed":
        return "view", tool
    if tool in EDIT_TOOLS:
        return "edit", tool
    if tool in VIEW_TOOLS:
        return "view", tool
    if tool in SEARCH_TOOLS:
        return "search", tool
    if tool in RUN_TOOLS or tool.startswith("./") or tool.endswith(".py") or tool.endswith(".sh"):
        if tool in ("python", "python3") and re.search(r"-m\s+(pytest|unittest)|\btest", first_line):
            return "test", tool
        if tool in ("pytest", "py.test", "tox", "./runtests.py") or "test" in first_line.split()[1:2]:
            return "test", tool
        return "run", tool
    if tool in VCS_TOOLS:
        return "vcs", tool
    if tool in NAV_TOOLS:
        return "navigate", tool
    if tool in ENV_TOOLS:
        return "env", tool
    if tool in FILE_TOOLS:
        return "file_op", tool
    return "other", tool[:200]


RESULT_MARK = "\n[... cut ...]\n"


def cut_utf8(text, limit):
    """text cut to at most `limit` UTF-8 bytes: the first and the last part with a marker between."""
    text = text or ""
    b = text.encode("utf-8", "replace")
    if len(b) <= limit:
        return text
    mark = RESULT_MARK.encode()
    half = (limit - len(mark)) // 2
    return b[:half].decode("utf-8", "ignore") + RESULT_MARK + b[len(b) - half:].decode("utf-8", "ignore")


def action_key(tool, tool_input):
    """Canonical form of an action: tool name + sorted-key compact JSON of its input."""
    return tool + "\x00" + json.dumps(tool_input, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def runs(keys):
    """(longest run length, its start, first start of a run >= 4) over consecutive equal keys."""
    best, best_start, first4 = 0, None, None
    i = 0
    while i < len(keys):
        j = i + 1
        while j < len(keys) and keys[j] == keys[i]:
            j += 1
        if j - i > best:
            best, best_start = j - i, i
        if j - i >= 4 and first4 is None:
            first4 = i
        i = j
    return best, best_start, first4


def exact_label(keys, limit_exit=False):
    """The dev corpus's label rule: looping (run >= 4), clean (no adjacent repeat, no limit exit), other."""
    longest = runs(keys)[0]
    if longest >= 4:
        return "looping"
    adjacent = any(keys[i] == keys[i - 1] for i in range(1, len(keys)))
    return "clean" if not adjacent and not limit_exit else "other"


# --------------------------------------------------------------------------- tools
class Shell:
    """One persistent bash per session, fed on stdin; output read up to a per-command sentinel."""

    def __init__(self, cwd, env, timeout=30.0):
        self.timeout = timeout
        self.n = 0
        self.env = env
        self.proc = subprocess.Popen(["bash"], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, cwd=cwd, env=env, start_new_session=True)
        self.fd = self.proc.stdout.fileno()

    def run(self, command):
        # A command that does not parse would swallow the sentinel; scripted commands must parse.
        check = subprocess.run(["bash", "-n"], input=command.encode(), capture_output=True, env=self.env)
        if check.returncode != 0:
            raise ValueError(f"scripted command does not parse: {command!r}: {check.stderr.decode()}")
        self.n += 1
        sentinel = re.compile(rb"__END_%d__ (\d+)\n" % self.n)
        self.proc.stdin.write(command.encode() + b"\n" + b"echo __END_%d__ $?\n" % self.n)
        self.proc.stdin.flush()
        buf = b""
        deadline = time.monotonic() + self.timeout
        while True:
            m = sentinel.search(buf)
            if m:
                break
            left = deadline - time.monotonic()
            ready = select.select([self.fd], [], [], max(left, 0))[0] if left > 0 else []
            if not ready:
                raise TimeoutError(f"no sentinel after {self.timeout}s for {command!r}")
            chunk = os.read(self.fd, 65536)
            if not chunk:
                raise EOFError(f"bash exited during {command!r}")
            buf += chunk
        return buf[:m.start()].decode("utf-8", "replace"), int(m.group(1))

    def close(self):
        try:
            self.proc.stdin.write(b"exit\n")
            self.proc.stdin.close()
            self.proc.wait(timeout=5)
        except (OSError, subprocess.TimeoutExpired):
            pass
        try:  # leftovers of this session's own process group (a background job)
            os.killpg(self.proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if self.proc.poll() is None:
            self.proc.wait()
        self.proc.stdout.close()


def file_echo(path, lines):
    body = "".join(f"{i:>6}\t{line}\n" for i, line in enumerate(lines, 1))
    return f"[File: {path} ({len(lines)} lines total)]\n{body}"


def edit_file(root, tool_input):
    """The edit tool: (result text, ok). Writes the file for real and echoes all of it."""
    path = tool_input["path"]
    full = os.path.join(root, path)
    if not os.path.isfile(full):
        return f"Error: file not found: {path}\n", False
    with open(full, encoding="utf-8") as f:
        content = f.read()
    if "line" in tool_input:
        lines = content.splitlines()
        n = tool_input["line"]
        if not 0 <= n <= len(lines):
            return f"Error: line {n} is outside 0..{len(lines)} in {path}\n", False
        lines[n:n] = tool_input["text"].split("\n")
    else:
        count = content.count(tool_input["old"])
        if count != 1:
            what = "not found" if count == 0 else f"found {count} times (must be unique)"
            return f"Error: old text {what} in {path}\n", False
        lines = content.replace(tool_input["old"], tool_input["new"], 1).splitlines()
    with open(full, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return file_echo(path, lines), True


# --------------------------------------------------------------------------- the fake project
PROJECTS = ["inventory", "ledger", "weather", "shipping", "billing", "catalog", "scheduler", "mailer",
            "metrics", "geocoder", "invoicer", "tracker", "payroll", "booking"]
MODULES = ["core", "pricing", "models", "storage", "report", "rules", "units", "totals", "calc", "money"]
SCRIPTS = ["migrate", "import_rows", "rebuild_index", "export_report", "load_fixtures", "sync_accounts"]
SETTINGS_KEYS = ["database_url", "api_token", "cache_dir", "region", "batch_size", "output_dir"]
MISSING_VERBS = ["parse", "load", "resolve", "render", "merge", "compute", "fetch", "decode"]
MISSING_NOUNS = ["legacy_header", "tenant_quota", "fx_snapshot", "shard_map", "route_plan", "ledger_delta",
                 "batch_cursor", "vat_bracket"]
DIR_NAMES = ["raw", "clean", "archive", "2023", "2024", "q1", "q2", "q3", "eu", "us", "apac", "daily",
             "weekly", "v1", "v2", "exports", "staging", "tmp_out"]

# (names, buggy body, fixed body, test call, expected): small functions a test checks.
FUNCS = [
    (["add_tax", "with_tax", "gross_amount"], "return amount * rate", "return amount * (1 + rate)",
     "{f}(100, 0.25)", "125.0", "amount, rate"),
    (["clamp", "bound", "limit_range"], "return max(lo, min(x, lo))", "return max(lo, min(x, hi))",
     "{f}(7, 0, 5)", "5", "x, lo, hi"),
    (["mean", "average", "avg"], "return sum(xs) / (len(xs) + 1)", "return sum(xs) / len(xs)",
     "{f}([2, 4, 6])", "4.0", "xs"),
    (["slug", "slugify", "make_slug"], "return s.strip().lower().replace(' ', '_')",
     "return s.strip().lower().replace(' ', '-')", "{f}(' Big Box ')", "'big-box'", "s"),
    (["first_word", "head_word", "leading_word"], "return s.split()[-1]", "return s.split()[0]",
     "{f}('alpha beta gamma')", "'alpha'", "s"),
    (["percent", "pct", "share"], "return round(100 * part // whole, 1)", "return round(100 * part / whole, 1)",
     "{f}(1, 8)", "12.5", "part, whole"),
]


def make_project(base, rng):
    """A small project under base/<name>; returns what the scenarios need to know about it."""
    name = rng.choice(PROJECTS)
    root = os.path.join(base, name)
    p = {"name": name, "root": root, "pkg": name, "mod": rng.choice(MODULES)}
    p["util"] = rng.choice([m for m in MODULES if m != p["mod"]])
    p["script"] = rng.choice(SCRIPTS)
    p["key"] = rng.choice(SETTINGS_KEYS)

    def write(rel, text, mode=None):
        full = os.path.join(root, rel)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as f:
            f.write(text)
        if mode:
            os.chmod(full, mode)

    # the module under test: every function, some of them buggy
    funcs = []
    n_bugs = rng.randint(2, 4)
    for i, (names, bad, good, call, expected, args) in enumerate(rng.sample(FUNCS, len(FUNCS))):
        funcs.append({"name": rng.choice(names), "bad": bad, "good": good, "call": call, "expected": expected,
                      "args": args, "buggy": i < n_bugs})
    p["funcs"] = funcs
    src = [f'"""{name.capitalize()} {p["mod"]} helpers."""', ""]
    for fn in funcs:
        src += ["", f"def {fn['name']}({fn['args']}):", f"    {fn['bad'] if fn['buggy'] else fn['good']}", ""]
    write(f"src/{name}/__init__.py", f'"""{name}: a small example package."""\n')
    write(f"src/{name}/{p['mod']}.py", "\n".join(src).rstrip("\n") + "\n")
    util_lines = [f'"""Shared helpers for {name}."""', "", "import os", "", "",
                  "def env_flag(name, default=False):",
                  "    value = os.environ.get(name)",
                  "    if value is None:",
                  "        return default",
                  "    return value.lower() in ('1', 'true', 'yes')", "", "",
                  "def chunks(items, size):",
                  "    for i in range(0, len(items), size):",
                  "        yield items[i:i + size]"]
    write(f"src/{name}/{p['util']}.py", "\n".join(util_lines) + "\n")
    tests = ["import os", "import sys", "import unittest", "",
             "sys.path.insert(0, os.path.join(os.path.dirname(__file__), '..', 'src'))", "",
             f"from {name}.{p['mod']} import " + ", ".join(fn["name"] for fn in funcs), "", "",
             f"class Test{p['mod'].capitalize()}(unittest.TestCase):"]
    for fn in funcs:
        tests += [f"    def test_{fn['name']}(self):",
                  f"        self.assertEqual({fn['call'].format(f=fn['name'])}, {fn['expected']})", ""]
    tests += ["", "if __name__ == '__main__':", "    unittest.main()"]
    write(f"tests/test_{p['mod']}.py", "\n".join(tests) + "\n")

    write("README.md", f"# {name}\n\nSmall {name} service.\n\n- `src/{name}/` the package\n"
                       f"- `tests/` unit tests: `python3 -m unittest discover -s tests`\n"
                       f"- `scripts/` maintenance scripts\n- `build.sh` build, package and smoke-test\n"
                       f"- `checks.sh` lint and type checks\n- `job.sh` the nightly reindex job\n")
    write("config/settings.json", json.dumps({k: f"<{k}>" for k in SETTINGS_KEYS if k != p["key"]},
                                             indent=2) + "\n")
    # a maintenance script that fails the same way every time (a missing settings key)
    write(f"scripts/{p['script']}.py",
          "import json\nimport sys\n\n\n"
          "def load_settings(path='config/settings.json'):\n"
          "    with open(path) as f:\n"
          "        return json.load(f)\n\n\n"
          "def main(argv):\n"
          "    settings = load_settings()\n"
          f"    target = settings['{p['key']}']\n"
          "    dry = '--dry-run' in argv\n"
          "    print(('would use ' if dry else 'using ') + target)\n\n\n"
          "if __name__ == '__main__':\n"
          "    main(sys.argv[1:])\n")

    # build.sh: a long log with a date, sizes and an elapsed time inside, failing at the end
    n_units = rng.randint(30, 70)
    units = [f"{rng.choice(MODULES)}_{rng.choice(['io', 'api', 'db', 'fmt', 'cli', 'sql', 'net'])}_{i:02d}"
             for i in range(n_units)]
    smoke = [fn["name"] for fn in funcs]
    bad_smoke = rng.choice(smoke)
    p["build_units"] = n_units
    write("build.sh", "#!/bin/bash\n"
                      "# build.sh: compile, package and smoke-test; everything is appended to build.log\n"
                      "log=build.log\n"
                      "start=$(date +%s%N)\n"
                      "{\n"
                      f"echo \"== {name} build\"\n"
                      "echo \"python: $(python3 --version 2>&1)\"\n"
                      "echo \"started: $(date)\"\n"
                      f"for u in {' '.join(units)}; do\n"
                      "  echo \"compiling $u ... ok\"\n"
                      "done\n"
                      f"echo \"packaging dist/{name}-0.{rng.randint(1, 9)}.{rng.randint(0, 20)}.tar ... ok\"\n"
                      "echo \"build log: $(du -b $log | cut -f1) bytes\"\n"
                      "ls -l $log\n"
                      + "".join(f"echo \"smoke {s} ... {'FAIL' if s == bad_smoke else 'ok'}\"\n" for s in smoke)
                      + f"echo \"  AssertionError: {bad_smoke} returned a wrong value\"\n"
                      "end=$(date +%s%N)\n"
                      "ms=$(( (end - start) / 1000000 ))\n"
                      "printf 'elapsed: %d.%03ds\\n' $((ms / 1000)) $((ms % 1000))\n"
                      "echo \"finished: $(date '+%d/%m/%Y %H:%M:%S.%3N')\"\n"
                      "echo \"BUILD FAILED: 1 smoke test failed\"\n"
                      "} 2>&1 | tee -a $log\n"
                      "exit 1\n", 0o755)
    write("build.log", "".join(f"compiling {u} ... ok\n" for u in units[:rng.randint(3, 12)]))

    # checks.sh: stdout and stderr written concurrently, so their order differs from run to run
    oks = [f"{rng.choice(['lint', 'typecheck', 'format'])} src/{name}/{m}.py" for m in
           rng.sample(MODULES, rng.randint(4, 6))]
    warns = [f"src/{name}/{rng.choice(MODULES)}.py:{rng.randint(3, 80)}: "
             f"{rng.choice(['unused import os', 'line too long', 'missing docstring', 'shadowed name id'])}"
             for _ in range(rng.randint(4, 6))]
    nfail = rng.randint(1, 3)
    write("checks.sh", "#!/bin/bash\n"
                       "# checks.sh: lint and type checks run in parallel; warnings go to stderr\n"
                       "(\n"
                       "  for w in " + " ".join(f"'{w}'" for w in warns) + "; do\n"
                       "    sleep 0.0$((RANDOM % 3))\n"
                       "    echo \"warning: $w\" >&2\n"
                       "  done\n"
                       ") &\n"
                       "for c in " + " ".join(f"'{c}'" for c in oks) + "; do\n"
                       "  sleep 0.0$((RANDOM % 3))\n"
                       "  echo \"check $c ... ok\"\n"
                       "done\n"
                       "wait\n"
                       f"echo \"error: {nfail} check(s) failed, see warnings above\" >&2\n"
                       "exit 1\n", 0o755)

    # job.sh: a background job that reports progress in job.status (and its log on stdout)
    p["job_batches"] = 0  # set by the job_poll scenario
    write("tools/sync.sh", "#!/bin/sh\n"
                           "# tools/sync.sh: sync fixtures to the local cache; busy right after start-up\n"
                           "if [ ! -f .cache/ready ]; then\n"
                           "  mkdir -p .cache && touch .cache/ready\n"
                           "  echo 'sync: cache is warming up (resource busy), try again' >&2\n"
                           "  exit 75\n"
                           "fi\n"
                           f"echo 'sync: {rng.randint(5, 40)} fixtures up to date'\n", 0o755)

    # nested data directories for walking
    depth = rng.randint(3, 5)
    spine = []
    d = "data"
    for level in range(depth):
        kids = rng.sample(DIR_NAMES, rng.randint(2, 3))
        for kid in kids:
            os.makedirs(os.path.join(root, d, kid), exist_ok=True)
            write(os.path.join(d, kid, rng.choice(["notes.txt", "part-000.csv", "MANIFEST", "index.json"])),
                  f"{kid}\n")
        spine.append(kids)
        d = os.path.join(d, kids[0])
    p["spine"] = spine  # spine[i] = children at depth i; the walk goes down kids[0]
    write("docs/usage.md", f"# Using {name}\n\nRun `python3 scripts/{p['script']}.py --dry-run` first.\n")
    return p


def make_job(p, rng, batches, period):
    with open(os.path.join(p["root"], "job.sh"), "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\n"
                "# job.sh: reindex the catalogue in batches; progress goes to job.status\n"
                f"n={batches}\n"
                "i=0\n"
                "mkdir -p results\n"
                "echo 'queued' > job.status\n"
                "while [ $i -lt $n ]; do\n"
                f"  sleep {period}\n"
                "  i=$((i + 1))\n"
                "  echo \"running $((i * 100 / n))% ($i/$n batches)\" > job.status.tmp && mv job.status.tmp job.status\n"
                "  echo \"batch $i/$n indexed\"\n"
                "done\n"
                "echo \"$n batches indexed, 0 errors\" > results/summary.txt\n"
                "echo \"done: $n batches, 0 errors\"\n"
                "echo \"done: $n batches, 0 errors\" > job.status.tmp && mv job.status.tmp job.status\n")


# --------------------------------------------------------------------------- a session
class Session:
    def __init__(self, scenario, k, label, p, env):
        self.scenario, self.k, self.label, self.p = scenario, k, label, p
        self.session_id = f"{SOURCE}/{scenario}/{k}"
        self.agent_id = f"{SOURCE}_{scenario}"
        self.shell = Shell(p["root"], env)
        self.steps = []
        self.loop_start = None

    def bash(self, command):
        out, status = self.shell.run(command)
        intent, tool = shell_tool_and_intent(command)
        self._record(intent, tool, status == 0, {"command": command}, out)
        return out, status

    def edit(self, **tool_input):
        out, ok = edit_file(self.p["root"], tool_input)
        self._record("edit", "edit_file", ok, tool_input, out)
        return out, ok

    def loop_starts_here(self):
        if self.loop_start is None:
            self.loop_start = len(self.steps)

    def _record(self, intent, tool, ok, tool_input, result):
        self.steps.append({"session_id": self.session_id, "agent_id": self.agent_id, "step": len(self.steps),
                           "intent": intent, "tool_call": tool, "action_status": "success" if ok else "failure",
                           "tool_input": tool_input, "result": cut_utf8(result, RESULT_BYTES), "source": SOURCE})

    def summary(self, repeats):
        keys = [action_key(s["tool_call"], s["tool_input"]) for s in self.steps]
        longest, start, first4 = runs(keys)
        return {"session_id": self.session_id, "source": SOURCE, "agent_id": self.agent_id,
                "harness": "scripted agent (bash + edit_file)", "model": "none (scripted)",
                "scenario": self.scenario, "label": self.label, "loop_start": self.loop_start,
                "loop_repeats": repeats, "n_steps": len(self.steps),
                "n_failures": sum(s["action_status"] == "failure" for s in self.steps),
                "longest_identical_run": longest, "longest_run_start": start,
                "longest_run_tool": self.steps[start]["tool_call"] if start is not None else None,
                "first_run4_start": first4, "exact_label": exact_label(keys), "exit_status": "ended",
                "limit_exit": False, "intents": dict(Counter(s["intent"] for s in self.steps))}


# --------------------------------------------------------------------------- ordinary steps
def ordinary_steps(s, rng, n):
    """n varied, unremarkable steps a real agent takes before the interesting part. No scenario
    body starts with one of these commands, so they never make an accidental repeat."""
    p = s.p
    pool = [
        lambda: s.bash("ls"),
        lambda: s.bash("cat README.md"),
        lambda: s.bash('find . -name "*.py" | sort'),
        lambda: s.bash(f"cat src/{p['pkg']}/{p['mod']}.py"),
        lambda: s.bash(f'grep -n "def " src/{p["pkg"]}/{p["mod"]}.py'),
        lambda: s.bash(f"wc -l src/{p['pkg']}/*.py tests/*.py"),
        lambda: s.bash(f"head -n 12 tests/test_{p['mod']}.py"),
        lambda: s.bash(f"ls -la src/{p['pkg']}"),
        lambda: s.bash("cat config/settings.json"),
        lambda: s.bash(f"sed -n 1,15p src/{p['pkg']}/{p['util']}.py"),
        lambda: s.bash("python3 -m unittest discover -s tests 2>&1 | tail -n 4"),
        lambda: s.bash("cat docs/usage.md"),
        lambda: s.bash("ls data"),
    ]
    for f in rng.sample(pool, n):
        f()


def closing_steps(s, rng, n):
    p = s.p
    pool = [
        lambda: s.bash(f"tail -n 5 src/{p['pkg']}/{p['mod']}.py"),
        lambda: s.bash(f"python3 -c \"import sys; sys.path.insert(0, 'src'); import {p['pkg']}.{p['util']} as m; "
                       f"print(sorted(n for n in dir(m) if not n.startswith('_')))\""),
        lambda: s.bash("ls -la"),
        lambda: s.bash("du -sh src tests"),
        lambda: s.edit(path=f"src/{p['pkg']}/{p['util']}.py", line=1, text="# TODO: revisit after the release"),
        lambda: s.bash(f"grep -c assert tests/test_{p['mod']}.py"),
    ]
    for f in rng.sample(pool, n):
        f()


# --------------------------------------------------------------------------- scenarios
PROSE_HEADS = ["DISCUSSION", "THOUGHT", "Thought:", "Plan:"]
PROSE_LINES = [
    "Let me look at the file to see where the error comes from.",
    "I will open the {mod} module and check the {fn} function first.",
    "The test fails because the value is wrong. Let me fix it.",
    "Now I need to find where {fn} is defined.",
    "First I should reproduce the bug, then edit the code.",
    "Let me run the tests again to confirm the fix.",
    "The output shows a failure in {fn}, so the bug must be in {mod}.py.",
    "Next, I will search the repository for {fn}.",
]


def sc_prose_to_shell(s, rng, r):
    """Prose sent to the shell as if it were a command, the same text r times."""
    p = s.p
    fn = rng.choice(p["funcs"])["name"]
    lines = [rng.choice(PROSE_HEADS)] if rng.random() < 0.75 else []
    lines += [ln.format(mod=p["mod"], fn=fn) for ln in rng.sample(PROSE_LINES, rng.randint(1, 2))]
    prose = "\n".join(lines)
    ordinary_steps(s, rng, rng.randint(1, 3))
    s.loop_starts_here()
    for _ in range(r):
        s.bash(prose)
    closing_steps(s, rng, rng.randint(0, 2))


def sc_edit_reapplied(s, rng, r):
    """The same insertion applied r times; the echoed file grows by the same lines each time."""
    p = s.p
    path = f"src/{p['pkg']}/{p['mod']}.py"
    choice = rng.randrange(3)
    if choice == 0:
        line, text = 1, rng.choice(["import logging", "import math", "from decimal import Decimal"])
    elif choice == 1:
        line, text = 2, f"LOG = logging.getLogger('{p['pkg']}.{p['mod']}')"
    else:
        with open(os.path.join(p["root"], path)) as f:
            src = f.read().splitlines()
        i = next(i for i, ln in enumerate(src) if ln.startswith("def "))
        line = i + 1
        arg = src[i].split("(", 1)[1].split(",")[0].rstrip("):")
        text = f"    if {arg} is None:\n        raise ValueError('{arg} is required')"
    ordinary_steps(s, rng, rng.randint(1, 3))
    s.loop_starts_here()
    for _ in range(r):
        s.edit(path=path, line=line, text=text)
    closing_steps(s, rng, rng.randint(0, 2))


def whitespace_variants(base, r, rng):
    """r commands equal to base but for whitespace, each different from all before it."""
    out = [base]
    words = base.split(" ")
    tries = 0
    while len(out) < r and tries < 1000:
        tries += 1
        w = list(words)
        gaps = [" "] * (len(w) - 1)
        for _ in range(rng.randint(1, 2)):
            kind = rng.randrange(5)
            if kind == 0:
                gaps[rng.randrange(len(gaps))] = "  "
            elif kind == 1:
                gaps[rng.randrange(len(gaps))] = "\t"
            elif kind == 2:
                w[-1] += " "
            elif kind == 3:
                w[0] = " " + w[0]
            else:
                w[-1] += "\n"
        cmd = w[0] + "".join(g + x for g, x in zip(gaps, w[1:]))
        if cmd not in out:
            out.append(cmd)
    return out


def sc_whitespace_retry(s, rng, r):
    """A failing command retried r times, differing only in whitespace."""
    p = s.p
    base = f"python3 scripts/{p['script']}.py" + rng.choice(["", " --dry-run", " --verbose", " --limit 10"])
    ordinary_steps(s, rng, rng.randint(1, 3))
    s.loop_starts_here()
    for cmd in whitespace_variants(base, r, rng):
        s.bash(cmd)
    closing_steps(s, rng, rng.randint(0, 2))


def sc_volatile_output(s, rng, r):
    """A long build log that differs only in its date, log size and elapsed time, r times."""
    cmd = rng.choice(["./build.sh", "bash build.sh", "./build.sh 2>&1"])
    ordinary_steps(s, rng, rng.randint(1, 3))
    s.loop_starts_here()
    for _ in range(r):
        s.bash(cmd)
    closing_steps(s, rng, rng.randint(0, 2))


def missing_symbol(p, rng):
    while True:
        sym = f"{rng.choice(MISSING_VERBS)}_{rng.choice(MISSING_NOUNS)}"
        if not any(sym.lower() in open(os.path.join(d, f), errors="ignore").read().lower()
                   for d, _, fs in os.walk(p["root"]) for f in fs):
            return sym


def sc_missing_symbol_repeat(s, rng, r):
    """The same search for a symbol that does not exist, r times (grep exits 1, no output)."""
    p = s.p
    sym = missing_symbol(p, rng)
    cmd = rng.choice([f'grep -rn "{sym}" src/', f"grep -rn {sym} .", f'grep -rn "def {sym}" src/{p["pkg"]}',
                      f"grep -rnw {sym} --include=*.py ."])
    ordinary_steps(s, rng, rng.randint(1, 3))
    s.loop_starts_here()
    for _ in range(r):
        s.bash(cmd)
    closing_steps(s, rng, rng.randint(0, 2))


def sc_interleaved_output(s, rng, r):
    """The same failing check script r times; its stdout and stderr interleave differently."""
    cmd = rng.choice(["./checks.sh", "bash checks.sh"])
    ordinary_steps(s, rng, rng.randint(1, 3))
    s.loop_starts_here()
    for _ in range(r):
        s.bash(cmd)
    closing_steps(s, rng, rng.randint(0, 2))


def sc_search_miss_varied(s, rng, r):
    """A missing symbol looked for with different tools and patterns, then the agent moves on."""
    p = s.p
    sym = missing_symbol(p, rng)
    camel = "".join(x.capitalize() for x in sym.split("_"))
    tail = sym.split("_", 1)[1]
    searches = [f'grep -rn "{sym}" src/', f"grep -rni {sym} .", f'find . -name "*{tail}*"',
                f"grep -rl {camel} tests/", f'grep -rn "def {sym}" --include=*.py .',
                f"grep -rn {tail} scripts/ tools/", f'find src -name "*.py" | xargs grep -n "{sym}"',
                f"grep -rn {sym.split('_')[0]}_{tail.split('_')[0]} src/{p['pkg']}"]
    ordinary_steps(s, rng, rng.randint(1, 3))
    for cmd in rng.sample(searches, r):
        s.bash(cmd)
    # moves on: writes the helper it was looking for, then uses it
    path = f"src/{p['pkg']}/{p['util']}.py"
    with open(os.path.join(p["root"], path)) as f:
        n = len(f.read().splitlines())
    s.edit(path=path, line=n, text=f"\n\ndef {sym}(value):\n    return value")
    s.bash(f"python3 -c \"import sys; sys.path.insert(0, 'src'); from {p['pkg']}.{p['util']} import {sym}; "
           f"print({sym}(42))\"")
    closing_steps(s, rng, rng.randint(0, 1))


def sc_dir_walk(s, rng, r):
    """Walking the data tree: `cd ..` two or three times in a row, `ls`/`pwd` between, into different dirs."""
    p = s.p
    spine = p["spine"]
    ordinary_steps(s, rng, rng.randint(1, 2))
    depth = len(spine)
    s.bash("cd " + "/".join(["data"] + [kids[0] for kids in spine]))
    s.bash("ls")
    level = depth  # number of directories below data/
    visits = 0
    while level > 0 and visits < 3:
        ups = min(rng.randint(2, 3), level)
        for _ in range(ups):
            s.bash("cd ..")
        level -= ups
        s.bash(rng.choice(["ls", "pwd", "ls -1"]) if visits % 2 == 0 else "pwd")
        kids = spine[level]
        if rng.random() < 0.7:  # a look into a sibling of the directory it came from
            s.bash(f"cd {rng.choice(kids[1:])}")
            s.bash(rng.choice(["ls", "ls -la"]))
            s.bash("cd ..")
            s.bash("pwd")
        visits += 1
    if level > 0:
        s.bash("cd " + "/".join([".."] * level))
    s.bash("cd ..")  # back at the project root
    s.bash(rng.choice(["pwd", "ls"]))
    closing_steps(s, rng, rng.randint(0, 2))


def sc_job_poll(s, rng, r):
    """A background job polled with the same command while its progress moves, then its result used."""
    p = s.p
    period = 0.06
    poll_sleep = 0.15
    # sized so that r polls (each ~15 ms slower than its sleep) see it finish; a slow
    # machine makes the agent poll once or twice more, which is what a real agent would do
    batches = max(6, round((r - 0.5) * (poll_sleep + 0.015) / (period + 0.005)))
    make_job(p, rng, batches, period)
    poll = rng.choice([f"sleep {poll_sleep}; cat job.status", f"sleep {poll_sleep} && cat job.status",
                       f"sleep {poll_sleep}; tail -n 1 job.log"])
    ordinary_steps(s, rng, rng.randint(1, 2))
    s.bash("cat job.sh")
    s.bash("nohup sh job.sh > job.log 2>&1 &")
    for _ in range(12):
        out, _ = s.bash(poll)
        if out.startswith("done"):
            break
    s.bash("cat results/summary.txt")
    s.bash(rng.choice(["grep -c indexed job.log", "wc -l job.log", "ls -l results"]))
    closing_steps(s, rng, rng.randint(0, 1))


def sc_fix_and_rerun(s, rng, r):
    """Run the tests, fix one bug, run them again (fewer failures) ...; then a retry that succeeds."""
    p = s.p
    test = rng.choice(["python3 -m unittest discover -s tests", "python3 -m unittest discover -s tests -v",
                       f"python3 tests/test_{p['mod']}.py"])
    path = f"src/{p['pkg']}/{p['mod']}.py"
    ordinary_steps(s, rng, rng.randint(1, 2))
    s.bash(test)
    for fn in [f for f in p["funcs"] if f["buggy"]]:
        s.edit(path=path, old=fn["bad"], new=fn["good"])
        s.bash(test)
    sync = rng.choice(["sh tools/sync.sh", "./tools/sync.sh"])
    s.bash(sync)
    s.bash(sync)  # busy the first time, fine the second
    closing_steps(s, rng, rng.randint(0, 2))


def sc_edits_same_file(s, rng, r):
    """Different edits to the same file one after another (the echo grows by different lines)."""
    p = s.p
    path = f"src/{p['pkg']}/{p['util']}.py"
    edits = [
        dict(line=0, text="# -*- coding: utf-8 -*-"),
        dict(old="import os", new="import os\nimport logging"),
        dict(old="def chunks(items, size):", new="def chunks(items, size=100):"),
        dict(old="    return default", new="    return bool(default)"),
        dict(old="def env_flag(name, default=False):",
             new="def env_flag(name, default=False):\n    \"\"\"True when the variable is 1, true or yes.\"\"\""),
        dict(old="        yield items[i:i + size]",
             new="        yield items[i:i + size]\n\n\ndef first(items, default=None):\n"
                 "    return items[0] if items else default"),
        dict(old="value.lower()", new="value.strip().lower()"),
    ]
    ordinary_steps(s, rng, rng.randint(1, 3))
    chosen = sorted(rng.sample(range(len(edits)), r))  # in file order, like a careful pass
    if chosen[0] != 0 and rng.random() < 0.5:
        rng.shuffle(chosen)
    for i in chosen:
        s.edit(path=path, **edits[i])
    s.bash(f"python3 -c \"import sys; sys.path.insert(0, 'src'); import {p['pkg']}.{p['util']}\"")
    closing_steps(s, rng, rng.randint(0, 2))


def sc_ordinary(s, rng, r):
    """An ordinary session: read, search, edit, run, test, commit."""
    p = s.p
    path = f"src/{p['pkg']}/{p['mod']}.py"
    fn = next(f for f in p["funcs"] if f["buggy"])
    ordinary_steps(s, rng, rng.randint(2, 4))
    s.bash(f"grep -rn {fn['name']} src tests")
    s.bash(f"python3 -m unittest tests.test_{p['mod']} 2>&1 | tail -n 15")
    s.edit(path=path, old=fn["bad"], new=fn["good"])
    s.bash(f"python3 -c \"import sys; sys.path.insert(0, 'src'); from {p['pkg']}.{p['mod']} import {fn['name']}; "
           f"print({fn['call'].format(f=fn['name'])})\"")
    s.bash("python3 -m unittest discover -s tests -q 2>&1 | tail -n 3")
    if shutil.which("git"):
        s.bash("git diff --stat")
        s.bash(f"git add -A && git commit -qm 'Fix {fn['name']}' && git log --oneline | head -n 3")
    else:
        s.bash(f"diff -u /dev/null {path} | tail -n 5")
    closing_steps(s, rng, rng.randint(0, 2))


# ---- stuck, not only repeating: a loop and a near-miss for each class a careful reader calls stuck
def near_variants(line, r, rng):
    """r variants of a source line, each a character or two off (a typo, a swapped pair of
    letters, a bracket, an extra word), none of them in the file and none differing only in
    whitespace: what an agent misremembering the line sends to the editor."""
    body = line.strip()
    indent = line[:len(line) - len(line.lstrip())]
    letters = [i for i in range(len(body) - 1) if body[i].isalpha() and body[i + 1].isalpha()]
    variants = [indent + body[:i] + body[i + 1] + body[i] + body[i + 2:] for i in letters]  # swapped letters
    variants += [indent + body + suffix for suffix in [":", ")", " # fix", ";", " \\"]]
    variants += [indent + body.replace("(", "((", 1), indent + body.replace("return", "return (", 1) + ")"]
    variants = [v for v in dict.fromkeys(variants) if " ".join(v.split()) != " ".join(line.split())]
    return rng.sample(variants, r)


def sc_near_edit_rejected(s, rng, r):
    """Class 1: the same fix re-applied with a character changed each time; the editor answers
    with one identical error, because the text to replace is never quite the file's."""
    p = s.p
    fn = next(f for f in p["funcs"] if f["buggy"])
    path = f"src/{p['pkg']}/{p['mod']}.py"
    ordinary_steps(s, rng, rng.randint(1, 3))
    s.bash(f"grep -n \"{fn['name']}\" {path}")
    s.loop_starts_here()
    for old in near_variants("    " + fn["bad"], r, rng):
        s.edit(path=path, old=old, new="    " + fn["good"])
    closing_steps(s, rng, rng.randint(0, 2))


def sc_tune_until_pass(s, rng, r):
    """Class 1, near-miss: nearly identical edits (a constant raised each time) and the same check
    after each, its failure changing every time until it passes."""
    p = s.p
    path = f"src/{p['pkg']}/{p['util']}.py"
    need = 10 * r
    with open(os.path.join(p["root"], path), "a", encoding="utf-8") as f:
        f.write("\n\nBATCH_LIMIT = 0\n")
    check = (f"python3 -c \"import sys; sys.path.insert(0, 'src'); from {p['pkg']}.{p['util']} import BATCH_LIMIT as b; "
             f"sys.exit(0) if b >= {need} else sys.exit(f'batch limit {{b}} is too small for the nightly import "
             f"(needs {need})')\"")
    ordinary_steps(s, rng, rng.randint(1, 2))
    s.bash(check)
    for k in range(1, r + 1):
        s.edit(path=path, old=f"BATCH_LIMIT = {10 * (k - 1)}", new=f"BATCH_LIMIT = {10 * k}")
        s.bash(check)
    closing_steps(s, rng, rng.randint(0, 2))


def sc_usage_rejection(s, rng, r):
    """Class 2: differently worded calls, one identical rejection (a usage text) each time."""
    p = s.p
    month = f"2024-{rng.randint(1, 12):02d}"
    with open(os.path.join(p["root"], "tools", "report.sh"), "w", encoding="utf-8") as f:
        f.write("#!/bin/sh\n# tools/report.sh: the monthly report\n"
                "if [ \"$#\" -ne 2 ] || [ \"$1\" != \"--month\" ] || ! echo \"$2\" | grep -qE '^[0-9]{4}-[0-9]{2}$'; then\n"
                "  echo 'usage: tools/report.sh --month YYYY-MM' >&2\n"
                "  echo '  writes reports/<month>.csv from the ledger' >&2\n"
                "  exit 2\n"
                "fi\n"
                "mkdir -p reports && echo \"month,total\" > \"reports/$2.csv\" && echo \"wrote reports/$2.csv\"\n")
    os.chmod(os.path.join(p["root"], "tools", "report.sh"), 0o755)
    y, m = month.split("-")
    tries = [f"sh tools/report.sh --month={month}", f"sh tools/report.sh --from {month}-01",
             f"sh tools/report.sh -m {m}", f"sh tools/report.sh --period {month}", f"sh tools/report.sh {month}",
             f"sh tools/report.sh --month {y}/{m}", f"sh tools/report.sh --year {y} --month {m}",
             f"sh tools/report.sh --month {month} --format csv"]
    ordinary_steps(s, rng, rng.randint(1, 3))
    s.loop_starts_here()
    for cmd in rng.sample(tries, r):
        s.bash(cmd)
    closing_steps(s, rng, rng.randint(0, 2))


def sc_search_narrows(s, rng, r):
    """Class 2, near-miss: one search narrowed step by step, each answer smaller and different."""
    p = s.p
    fn = rng.choice(p["funcs"])["name"]
    steps = [f"grep -rn return src/", f"grep -rn return src/{p['pkg']}/",
             f"grep -rn return src/{p['pkg']}/{p['mod']}.py", f"grep -rn 'return.*(' src/{p['pkg']}/{p['mod']}.py",
             f"grep -n -A1 'def {fn}' src/{p['pkg']}/{p['mod']}.py", f"grep -n 'def {fn}' src/{p['pkg']}/{p['mod']}.py",
             f"grep -c 'def {fn}' src/{p['pkg']}/{p['mod']}.py"]
    ordinary_steps(s, rng, rng.randint(1, 2))
    for cmd in steps[:r]:
        s.bash(cmd)
    s.bash(f"sed -n 1,12p src/{p['pkg']}/{p['mod']}.py")
    closing_steps(s, rng, rng.randint(0, 2))


def view_round(p, n):
    files = [f"src/{p['pkg']}/{p['mod']}.py", f"src/{p['pkg']}/{p['util']}.py", f"tests/test_{p['mod']}.py",
             "README.md", "config/settings.json", f"scripts/{p['script']}.py", "docs/usage.md", "build.sh"]
    return [f"cat {f}" if f.endswith((".json", ".md")) else f"sed -n 1,25p {f}" for f in files[:n]]


def sc_long_view_cycle(s, rng, r):
    """Class 3: a round of six to eight views repeated with the same results, past the cycle rule's period."""
    p = s.p
    size = rng.randint(6, 8)
    views = view_round(p, size)
    rng.shuffle(views)
    ordinary_steps(s, rng, 1)
    s.loop_starts_here()
    for _ in range(2):
        for cmd in views:
            s.bash(cmd)
    for cmd in views[:r - 2]:  # a third round started
        s.bash(cmd)
    closing_steps(s, rng, rng.randint(0, 1))


def sc_poll_rounds(s, rng, r):
    """Class 3, near-miss: a round of status checks repeated while a background job moves."""
    p = s.p
    rounds = r
    # about six batches a round, so the answers move every round and the job ends after them
    make_job(p, rng, 6 * rounds + 2, 0.05)
    checks = ["cat job.status", "tail -n 1 job.log", "ls results 2>/dev/null | wc -l"]
    ordinary_steps(s, rng, rng.randint(1, 2))
    s.bash("nohup sh job.sh > job.log 2>&1 &")
    for _ in range(rounds):
        s.bash("sleep 0.3")
        for c in checks[:2]:
            s.bash(c)
    s.bash("sleep 1.5; cat job.status")
    closing_steps(s, rng, rng.randint(0, 1))


def sc_revisit_lookups(s, rng, r):
    """Class 4: earlier lookups re-run with other steps in between, their results unchanged."""
    p = s.p
    lookups = ["cat config/settings.json", f"grep -n 'def ' src/{p['pkg']}/{p['mod']}.py",
               f"python3 scripts/{p['script']}.py --dry-run", f"head -n 8 scripts/{p['script']}.py"]
    others = ["ls scripts", "ls config", f"wc -l scripts/{p['script']}.py", "ls tools", "ls docs",
              f"grep -c key config/settings.json", "ls tests"]
    ordinary_steps(s, rng, 1)
    s.loop_starts_here()
    for cmd in lookups:
        s.bash(cmd)
    rng.shuffle(others)
    for k in range(r):
        s.bash(others[k % len(others)])
        s.bash(lookups[k % len(lookups)])
    closing_steps(s, rng, rng.randint(0, 1))


def sc_many_targets(s, rng, r):
    """Class 4, near-miss: the same tools on different targets, a different answer each time."""
    p = s.p
    files = [f"src/{p['pkg']}/{p['mod']}.py", f"src/{p['pkg']}/{p['util']}.py", f"tests/test_{p['mod']}.py",
             f"scripts/{p['script']}.py", "build.sh", "checks.sh", "tools/sync.sh", "docs/usage.md"]
    rng.shuffle(files)
    ordinary_steps(s, rng, rng.randint(1, 2))
    for f in files[:r]:
        s.bash(f"head -n 3 {f}")
    for f in files[:3]:
        s.bash(f"wc -c {f}")
    closing_steps(s, rng, rng.randint(0, 1))


def sc_reread_ranges(s, rng, r):
    """Class 5: the same line ranges of a file opened again, no edit in between."""
    p = s.p
    path = f"tests/test_{p['mod']}.py"
    ranges = ["1,8", "8,16", "16,24", "24,32"]
    order = ["1,8", "8,16", "GREP", "1,8", "16,24", "8,16", "1,8", "24,32", "8,16", "16,24"]
    ordinary_steps(s, rng, rng.randint(1, 2))
    s.loop_starts_here()
    for step in order[:r + 3]:
        if step == "GREP":
            s.bash(f"grep -n assertEqual {path}")
        else:
            s.bash(f"sed -n {step}p {path}")
    closing_steps(s, rng, rng.randint(0, 1))


def sc_reread_after_edit(s, rng, r):
    """Class 5, near-miss: the same range re-read after every edit, each time showing the edit."""
    p = s.p
    path = f"src/{p['pkg']}/{p['util']}.py"
    ordinary_steps(s, rng, rng.randint(1, 2))
    s.bash(f"sed -n 1,12p {path}")
    for k in range(r):
        s.edit(path=path, line=1, text=f"# reviewed: pass {k + 1}")
        s.bash(f"sed -n 1,12p {path}")
    closing_steps(s, rng, rng.randint(0, 1))


def sc_echoed_error(s, rng, r):
    """Class 1, the error echoing its call: a python one-liner grown by a method each time, every
    version missing the same closing parenthesis; Python answers each with the same SyntaxError,
    quoting the longer line, so no two answers are the same text."""
    p = s.p
    path = f"src/{p['pkg']}/{p['mod']}.py"
    stages = rng.sample([".strip()", ".splitlines()", ".upper()", ".lower()", ".title()", ".swapcase()",
                         ".casefold()", ".lstrip()"], r)
    ordinary_steps(s, rng, rng.randint(1, 3))
    s.loop_starts_here()
    for k in range(1, r + 1):
        s.bash(f"python3 -c \"print(open('{path}').read(){''.join(stages[:k])}\"")
    s.bash(f"python3 -c \"print(open('{path}').read())\" | head -n 5")
    closing_steps(s, rng, rng.randint(0, 2))


def sc_path_walk_up(s, rng, r):
    """Class 1, near-miss: ls on a path that does not exist, then on its parent, and so on up to
    a directory that does: each error names the path it was given, each call one word shorter."""
    p = s.p
    missing = rng.sample(["legacy", "handlers", "old", "v1", "generated", "vendor", "tmp", "build"], r)
    ordinary_steps(s, rng, rng.randint(1, 2))
    for k in range(r, 0, -1):
        s.bash(f"ls src/{p['pkg']}/{'/'.join(missing[:k])}/")
    s.bash(f"ls src/{p['pkg']}/")
    closing_steps(s, rng, rng.randint(0, 2))


def sc_fenced_commands(s, rng, r):
    """Class 2, the rejection in front of every call: each command sent inside a Markdown fence
    (```SHELL ... ```); bash runs the fence as command substitutions, so every answer opens with
    `SHELL: command not found`, then the command's output run as a command (`mod.py: command
    not found`), or nothing; the status follows what comes after the rejection."""
    p = s.p
    commands = [f"ls src/{p['pkg']}", "find src -name '*.orig'", f"grep -c def src/{p['pkg']}/{p['mod']}.py",
                f"wc -l tests/test_{p['mod']}.py", "find . -name '*.rej' -print", "head -n 1 README.md",
                "ls tests", "find scripts -name '*.bak'"]
    ordinary_steps(s, rng, rng.randint(1, 3))
    s.loop_starts_here()
    for cmd in commands[:r]:
        s.bash(f"```SHELL\n{cmd}\n```")
    s.bash(f"ls src/{p['pkg']}")
    closing_steps(s, rng, rng.randint(0, 2))


def sc_lint_one_by_one(s, rng, r):
    """Class 2, near-miss: a linter run on one file after another; every answer opens with the
    linter's banner, some files fail and some pass, and each answer goes on with the linter's
    own report: the calls ran. Then the agent fixes a failing file and lints it again."""
    p = s.p
    root = p["root"]
    files = [f"src/{p['pkg']}/{p['mod']}.py", f"src/{p['pkg']}/{p['util']}.py", f"src/{p['pkg']}/__init__.py",
             f"tests/test_{p['mod']}.py", f"scripts/{p['script']}.py", "build.sh", "checks.sh"]
    files = [f for f in files if os.path.isfile(os.path.join(root, f))]
    rng.shuffle(files)
    files = files[:r]
    # the first and the last file linted have a TODO left
    for f in (files[0], files[-1]):
        with open(os.path.join(root, f), "a", encoding="utf-8") as fh:
            fh.write("# TODO: remove before release\n")
    with open(os.path.join(root, "tools", "lint.sh"), "w", encoding="utf-8") as fh:
        fh.write("#!/bin/sh\n# tools/lint.sh FILE: the release lint\n"
                 "echo '== release lint 1.4 =='\n"
                 "echo \"$(wc -l < \"$1\") lines in $1\"\n"
                 "n=$(grep -c TODO \"$1\")\n"
                 "if [ \"$n\" -gt 0 ]; then grep -n TODO \"$1\"; echo \"$1: $n TODO left: FAILED\"; exit 1; fi\n"
                 "echo \"$1: no TODO left: OK\"\n")
    os.chmod(os.path.join(root, "tools", "lint.sh"), 0o755)
    ordinary_steps(s, rng, rng.randint(1, 2))
    for f in files:
        s.bash(f"sh tools/lint.sh {f}")
    s.edit(path=files[0], old="# TODO: remove before release\n", new="")
    s.bash(f"sh tools/lint.sh {files[0]}")
    closing_steps(s, rng, rng.randint(0, 1))


MISSING_SETTINGS = ["retry_budget", "max_inflight", "warmup_seconds", "shard_count", "drain_timeout",
                    "backoff_base", "cache_ttl", "flush_every"]


def sc_empty_rework(s, rng, r):
    """Attempts that drift while nothing comes back: a search for a setting that is not there,
    then the same search reworked r + 1 times (a filter appended, a field cut, a sort, an include
    pattern), every answer empty; then the agent gives up on the search and writes the setting.
    No two attempts in a row are nearly identical, but each keeps the whole bare search. Six
    empty answers in a row at least (r + 2 = 6..9): an empty answer says little, and the
    verdict waits for six."""
    p = s.p
    key = rng.choice(MISSING_SETTINGS)
    base = f"grep -rn '{key}' src/"
    tails = ["| grep -v '#'", "| awk -F: '{print $1}'", "| sort -u", "--include='*.py'", "| cut -d: -f1",
             "| head -n 20", "| grep -v test", "| sed 's/^/  /'"]
    ordinary_steps(s, rng, rng.randint(1, 3))
    s.loop_starts_here()
    s.bash(base)
    for tail in rng.sample(tails, r + 1):
        s.bash(f"{base} {tail}")
    s.edit(path="config/settings.json", line=1, text=f'  "{key}": 5,')
    closing_steps(s, rng, rng.randint(0, 2))


def sc_empty_sweep(s, rng, r):
    """Near-miss: the same search for a setting that is not there, run on r + 2 different files
    one after another (6..9, as many as the loop's attempts), every answer empty; then the agent
    writes the setting. Each call names a new target: a sweep, not a rework."""
    p = s.p
    key = rng.choice(MISSING_SETTINGS)
    files = [f"src/{p['pkg']}/{p['mod']}.py", f"src/{p['pkg']}/{p['util']}.py", f"src/{p['pkg']}/__init__.py",
             f"tests/test_{p['mod']}.py", f"scripts/{p['script']}.py", "README.md", "config/settings.json",
             "docs/usage.md", "build.sh"]
    files = [f for f in files if os.path.isfile(os.path.join(p["root"], f))]
    rng.shuffle(files)
    ordinary_steps(s, rng, rng.randint(1, 2))
    for f in files[:r + 2]:
        s.bash(f"grep -n '{key}' {f}")
    s.edit(path="config/settings.json", line=1, text=f'  "{key}": 5,')
    closing_steps(s, rng, rng.randint(0, 2))


# name -> (function, label, uses_repeats)
SCENARIOS = {
    "prose_to_shell": (sc_prose_to_shell, "looping"),
    "edit_reapplied": (sc_edit_reapplied, "looping"),
    "whitespace_retry": (sc_whitespace_retry, "looping"),
    "volatile_output": (sc_volatile_output, "looping"),
    "missing_symbol_repeat": (sc_missing_symbol_repeat, "looping"),
    "interleaved_output": (sc_interleaved_output, "looping"),
    "search_miss_varied": (sc_search_miss_varied, "clean"),
    "dir_walk": (sc_dir_walk, "clean"),
    "job_poll": (sc_job_poll, "clean"),
    "fix_and_rerun": (sc_fix_and_rerun, "clean"),
    "edits_same_file": (sc_edits_same_file, "clean"),
    "ordinary": (sc_ordinary, "clean"),
    # stuck without an identical run: a loop and its near-miss per class
    "near_edit_rejected": (sc_near_edit_rejected, "looping"),
    "tune_until_pass": (sc_tune_until_pass, "clean"),
    "usage_rejection": (sc_usage_rejection, "looping"),
    "search_narrows": (sc_search_narrows, "clean"),
    "long_view_cycle": (sc_long_view_cycle, "looping"),
    "poll_rounds": (sc_poll_rounds, "clean"),
    "revisit_lookups": (sc_revisit_lookups, "looping"),
    "many_targets": (sc_many_targets, "clean"),
    "reread_ranges": (sc_reread_ranges, "looping"),
    "reread_after_edit": (sc_reread_after_edit, "clean"),
    # an error that echoes its call: a loop and its near-miss
    "echoed_error": (sc_echoed_error, "looping"),
    "path_walk_up": (sc_path_walk_up, "clean"),
    # a rejection in front of every call, the status flipping: a loop and its near-miss
    "fenced_commands": (sc_fenced_commands, "looping"),
    "lint_one_by_one": (sc_lint_one_by_one, "clean"),
    # attempts that drift while every answer is empty: a loop and its near-miss
    "empty_rework": (sc_empty_rework, "looping"),
    "empty_sweep": (sc_empty_sweep, "clean"),
}
# Looping scenarios whose repeats are not identical calls: no identical run is expected.
STUCK_WITHOUT_RUN = {"whitespace_retry", "near_edit_rejected", "usage_rejection", "long_view_cycle",
                     "revisit_lookups", "reread_ranges", "echoed_error", "fenced_commands", "empty_rework"}
REPEATS = (4, 7)


def shell_env(home):
    env = {"PATH": os.environ.get("PATH", "/usr/local/bin:/usr/bin:/bin"), "HOME": home, "LANG": "C.UTF-8",
           "LC_ALL": "C.UTF-8", "TZ": "UTC", "PYTHONDONTWRITEBYTECODE": "1", "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "scripted agent", "GIT_AUTHOR_EMAIL": "agent@example.invalid",
           "GIT_COMMITTER_NAME": "scripted agent", "GIT_COMMITTER_EMAIL": "agent@example.invalid"}
    return env


def run_session(scenario, k, seed):
    fn, label = SCENARIOS[scenario]
    rng = random.Random(f"{seed}/{scenario}/{k}")
    base = tempfile.mkdtemp(prefix="scripted-")
    try:
        p = make_project(base, rng)
        env = shell_env(base)
        if scenario == "ordinary" and shutil.which("git"):
            subprocess.run("git init -q && git add -A && git commit -qm 'Initial import'", shell=True,
                           cwd=p["root"], env=env, check=True, capture_output=True)
        s = Session(scenario, k, label, p, env)
        try:
            # every repeat count in REPEATS equally often (8 sessions: each twice), in a seeded order
            counts = list(range(REPEATS[0], REPEATS[1] + 1))
            random.Random(f"{seed}/{scenario}").shuffle(counts)
            repeats = counts[k % len(counts)]
            fn(s, rng, repeats)
        finally:
            s.shell.close()
        looping = label == "looping"
        if not looping:
            s.loop_start = None
        return s.steps, s.summary(repeats if looping else None)
    finally:
        shutil.rmtree(base, ignore_errors=True)


# --------------------------------------------------------------------------- checks
def check(steps_by_session, summaries):
    """Structural checks (errors) and timing-dependent ones (warnings) on what was recorded."""
    errors, warnings = [], []
    for summ in summaries:
        sid, sc = summ["session_id"], summ["scenario"]
        steps = steps_by_session[sid]
        ls = summ["loop_start"]
        rep = summ["loop_repeats"]
        loop = steps[ls:ls + rep] if ls is not None else []
        if summ["label"] == "looping" and sc not in STUCK_WITHOUT_RUN:
            if summ["longest_identical_run"] < 4 or summ["first_run4_start"] != ls:
                errors.append(f"{sid}: expected an identical run of {rep} at {ls}")
        if sc == "whitespace_retry":
            if summ["longest_identical_run"] != 1:
                errors.append(f"{sid}: whitespace variants should never repeat exactly")
            if len({" ".join(st["tool_input"]["command"].split()) for st in loop}) != 1:
                errors.append(f"{sid}: variants differ in more than whitespace")
            if len({st["result"] for st in loop}) != 1:
                warnings.append(f"{sid}: retries gave different results")
        if sc in ("search_miss_varied", "edits_same_file", "ordinary") and summ["exact_label"] != "clean":
            errors.append(f"{sid}: should be exact-clean, is {summ['exact_label']}")
        if sc == "dir_walk" and not 2 <= summ["longest_identical_run"] <= 3:
            errors.append(f"{sid}: cd .. runs should be 2-3 long, got {summ['longest_identical_run']}")
        if sc == "prose_to_shell":
            nums = [[int(x) for x in re.findall(r"line (\d+):", st["result"])] for st in loop]
            flat = [x for ns in nums for x in ns]
            if not flat or any(b <= a for a, b in zip(flat, flat[1:])) or len({st["result"] for st in loop}) != rep:
                errors.append(f"{sid}: bash line numbers should grow from repeat to repeat: {nums}")
        if sc == "edit_reapplied":
            sizes = [int(re.match(r"\[File: .* \((\d+) lines total\)\]", st["result"]).group(1)) for st in loop]
            d = {b - a for a, b in zip(sizes, sizes[1:])}
            if len(d) != 1 or d.pop() <= 0:
                errors.append(f"{sid}: the echo should grow by the same lines each time: {sizes}")
        if sc in ("missing_symbol_repeat",):
            if any(st["result"] != "" or st["action_status"] != "failure" for st in loop):
                errors.append(f"{sid}: the missing-symbol search should fail with empty output")
        if sc == "search_miss_varied":
            misses = [st for st in steps if st["intent"] == "search" and st["result"] == ""]
            if len(misses) < 4:
                errors.append(f"{sid}: expected at least 4 empty searches")
        if sc in ("volatile_output", "interleaved_output"):
            res = [st["result"] for st in loop]
            same = sum(a == b for a, b in zip(res, res[1:]))
            if same:
                warnings.append(f"{sid}: {same} consecutive repeats gave byte-identical output")
            if sc == "interleaved_output" and any(sorted(r.splitlines()) != sorted(res[0].splitlines()) for r in res):
                errors.append(f"{sid}: interleaved runs should hold the same lines")
        if sc in ("near_edit_rejected", "usage_rejection"):
            calls = [json.dumps(st["tool_input"], sort_keys=True) for st in loop]
            if len(set(calls)) != rep or len({st["result"] for st in loop}) != 1 or any(
                    st["action_status"] != "failure" for st in loop):
                errors.append(f"{sid}: expected {rep} different calls failing with one identical result")
        if sc == "echoed_error":
            last_lines = {st["result"].strip().splitlines()[-1] for st in loop}
            if (len({st["result"] for st in loop}) != rep or len(last_lines) != 1
                    or any(st["action_status"] != "failure" for st in loop)):
                errors.append(f"{sid}: expected {rep} grown calls failing with one error, each quoting its call")
        if sc == "fenced_commands":
            firsts = {re.sub(r"\d+", "#", st["result"].splitlines()[0]) for st in loop if st["result"]}
            statuses = {st["action_status"] for st in loop}
            if len(firsts) != 1 or statuses != {"success", "failure"} or any(
                    len(st["result"].splitlines()) > 2 for st in loop):
                errors.append(f"{sid}: expected short answers opening alike, failures and successes: {firsts}")
        if sc == "lint_one_by_one":
            lints = [st for st in steps if st["tool_input"].get("command", "").startswith("sh tools/lint.sh")]
            if len({st["result"].splitlines()[0] for st in lints}) != 1 or len(
                    {st["action_status"] for st in lints}) != 2:
                errors.append(f"{sid}: expected lint answers opening alike, failing and passing")
        if sc == "path_walk_up":
            walk = [st for st in steps if st["action_status"] == "failure"
                    and st["tool_input"].get("command", "").startswith("ls src/")]
            if len(walk) < 4 or any(st["tool_input"]["command"][3:] not in st["result"] for st in walk):
                errors.append(f"{sid}: expected ls failures, each naming the path it was given")
        if sc in ("long_view_cycle", "revisit_lookups", "reread_ranges"):
            seen = {}
            for st in steps[ls:]:
                key = json.dumps(st["tool_input"], sort_keys=True)
                if key in seen and seen[key] != st["result"]:
                    errors.append(f"{sid}: a revisited call changed its answer: {key}")
                seen.setdefault(key, st["result"])
        if sc in ("tune_until_pass", "search_narrows", "poll_rounds", "many_targets", "reread_after_edit"):
            res = {}
            for st in steps:
                res.setdefault(json.dumps(st["tool_input"], sort_keys=True), []).append(st["result"])
            again = [k for k, v in res.items() if len(v) > 1 and len(set(v)) < len(v) and "sleep" not in k]
            if again:
                warnings.append(f"{sid}: a repeated call answered the same twice: {again[:2]}")
        if sc == "job_poll":
            polls = [st for st in steps if st["tool_input"].get("command", "").startswith("sleep ")]
            outs = [st["result"] for st in polls]
            if len(polls) < 4:
                warnings.append(f"{sid}: only {len(polls)} polls")
            if any(a == b for a, b in zip(outs, outs[1:])) or not outs[-1].startswith("done"):
                warnings.append(f"{sid}: poll outputs did not move every time: {[o.strip() for o in outs]}")
    return errors, warnings


# --------------------------------------------------------------------------- main
def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)),
                    help="folder for steps.jsonl and sessions.jsonl")
    ap.add_argument("--sessions-per-scenario", type=int, default=8)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS), help="comma-separated subset")
    args = ap.parse_args()
    wanted = [x.strip() for x in args.scenarios.split(",") if x.strip()]
    for w in wanted:
        if w not in SCENARIOS:
            ap.error(f"unknown scenario {w!r}; known: {', '.join(SCENARIOS)}")
    if shutil.which("bash") is None:
        ap.error("bash is not on PATH")
    t0 = time.monotonic()
    all_steps, summaries = {}, []
    for sc in wanted:
        for k in range(args.sessions_per_scenario):
            steps, summ = run_session(sc, k, args.seed)
            all_steps[summ["session_id"]] = steps
            summaries.append(summ)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "steps.jsonl"), "w", encoding="utf-8") as f:
        for summ in summaries:
            for st in all_steps[summ["session_id"]]:
                f.write(json.dumps(st, ensure_ascii=False) + "\n")
    with open(os.path.join(args.out, "sessions.jsonl"), "w", encoding="utf-8") as f:
        for summ in summaries:
            f.write(json.dumps(summ, ensure_ascii=False) + "\n")

    errors, warnings = check(all_steps, summaries)
    print("| scenario | label | sessions | steps | failures | longest identical run | exact label |", file=sys.stderr)
    print("|---|---|---|---|---|---|---|", file=sys.stderr)
    for sc in wanted:
        rows = [x for x in summaries if x["scenario"] == sc]
        lir = sorted(x["longest_identical_run"] for x in rows)
        ex = Counter(x["exact_label"] for x in rows)
        print(f"| `{sc}` | {rows[0]['label']} | {len(rows)} | {sum(x['n_steps'] for x in rows)} | "
              f"{sum(x['n_failures'] for x in rows)} | {lir[0]}–{lir[-1]} | "
              + ", ".join(f"{k} {v}" for k, v in sorted(ex.items())) + " |", file=sys.stderr)
    lab = Counter(x["label"] for x in summaries)
    print(f"| **all** | looping {lab['looping']}, clean {lab['clean']} | {len(summaries)} | "
          f"{sum(x['n_steps'] for x in summaries)} | {sum(x['n_failures'] for x in summaries)} | | "
          + ", ".join(f"{k} {v}" for k, v in sorted(Counter(x['exact_label'] for x in summaries).items()))
          + " |", file=sys.stderr)
    for w in warnings:
        print("warning: " + w, file=sys.stderr)
    for e in errors:
        print("error: " + e, file=sys.stderr)
    print(f"{len(summaries)} sessions in {time.monotonic() - t0:.1f}s", file=sys.stderr)
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
