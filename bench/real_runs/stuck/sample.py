#!/usr/bin/env python3
"""The sample of the dev corpus that was read by hand and labelled stuck or fine.

    python3 bench/real_runs/stuck/sample.py                 # the sample: id, stratum, split
    python3 bench/real_runs/stuck/sample.py --show ID ...   # sessions as they were read
    python3 bench/real_runs/stuck/sample.py --show-stratum ic-other --from 0 --count 10

The sample is fixed by hashes, not by anything a detector says: each stratum of
../shared/datasets/real_runs/sessions.jsonl is ordered by the SHA-1 of
"stuck-sample:" + session_id and its first N sessions are taken (see STRATA). The split
into dev (tuning) and held-out is by another hash, decided before any rule was written:
a session is held out when the SHA-1 of "stuck-split:" + session_id starts with a hex
digit 0-4 (5 in 16, about 31 %).

`--show` prints each step as it was read: the command or arguments (one line, cut) and
the result (newlines as ⏎, cut), with exact-equality marks as a reading aid only: `[in=#k]`
when the tool input is byte-identical to step k's, `[out=#k]` when the result is.
Python 3 standard library only.
"""
import argparse
import gzip
import hashlib
import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
DATA = os.path.normpath(os.path.join(HERE, "../../../../shared/datasets/real_runs"))

# (stratum, predicate on a session summary, how many)
STRATA = [
    ("ic-other", lambda s: s["source"] == "intercode" and s["label"] == "other", 130),
    ("ic-looping", lambda s: s["source"] == "intercode" and s["label"] == "looping", 40),
    ("ic-clean", lambda s: s["source"] == "intercode" and s["label"] == "clean" and s["n_steps"] >= 3, 70),
    ("tau-long", lambda s: s["source"] == "tau-bench" and s["n_steps"] >= 15, 45),
    ("tau-short", lambda s: s["source"] == "tau-bench" and s["n_steps"] < 15, 15),
]


def sha1(text):
    return hashlib.sha1(text.encode()).hexdigest()


def split_of(session_id):
    return "held-out" if sha1("stuck-split:" + session_id)[0] in "01234" else "dev"


def sample(data=DATA):
    with open(os.path.join(data, "sessions.jsonl")) as f:
        sessions = [json.loads(line) for line in f]
    out = []
    for name, keep, n in STRATA:
        chosen = sorted((s for s in sessions if keep(s)), key=lambda s: sha1("stuck-sample:" + s["session_id"]))
        for s in chosen[:n]:
            out.append({"session_id": s["session_id"], "stratum": name, "split": split_of(s["session_id"]),
                        "exact_label": s["label"], "n_steps": s["n_steps"]})
    return out


def steps_of(ids, data=DATA):
    wanted = set(ids)
    steps = {i: [] for i in ids}
    with gzip.open(os.path.join(data, "steps.jsonl.gz"), "rt") as f:
        for line in f:
            r = json.loads(line)
            if r["session_id"] in wanted:
                steps[r["session_id"]].append(r)
    return steps


def one_line(text, width):
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False)
    text = text.replace("\r", "").replace("\n", "⏎")
    return text if len(text) <= width else text[: width - 12] + " …" + text[-10:]


def show(session_id, steps, info, width_in, width_out):
    print(f"=== {session_id}  [{info.get('stratum', '?')}, exact {info.get('exact_label', '?')}, "
          f"{len(steps)} steps]")
    seen_in, seen_out = {}, {}
    for k, r in enumerate(steps):
        ti = r["tool_input"]
        shown_in = ti.get("command") if isinstance(ti, dict) and set(ti) == {"command"} else ti
        key_in = json.dumps(ti, sort_keys=True)
        key_out = json.dumps(r.get("result"), sort_keys=True)
        marks = []
        if key_in in seen_in:
            marks.append(f"in=#{seen_in[key_in]}")
        if key_out in seen_out:
            marks.append(f"out=#{seen_out[key_out]}")
        seen_in.setdefault(key_in, k)
        seen_out.setdefault(key_out, k)
        status = "" if r["action_status"] == "success" else " FAIL"
        mark = f" [{' '.join(marks)}]" if marks else ""
        print(f"#{k} {r['tool_call']}{status}{mark}: {one_line(shown_in, width_in)}")
        print(f"    => {one_line(r.get('result') or '', width_out)}")


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=DATA)
    p.add_argument("--show", nargs="*")
    p.add_argument("--show-stratum")
    p.add_argument("--from", dest="start", type=int, default=0)
    p.add_argument("--count", type=int, default=10)
    p.add_argument("--width-in", type=int, default=220)
    p.add_argument("--width-out", type=int, default=260)
    a = p.parse_args()
    chosen = sample(a.data)
    info = {c["session_id"]: c for c in chosen}
    ids = a.show
    if a.show_stratum:
        ids = [c["session_id"] for c in chosen if c["stratum"] == a.show_stratum][a.start:a.start + a.count]
    if ids:
        steps = steps_of(ids, a.data)
        for i in ids:
            show(i, steps[i], info.get(i, {}), a.width_in, a.width_out)
        return
    for c in chosen:
        print(json.dumps(c))
    counts = {}
    for c in chosen:
        counts[(c["stratum"], c["split"])] = counts.get((c["stratum"], c["split"]), 0) + 1
    print(json.dumps({f"{k[0]}/{k[1]}": v for k, v in sorted(counts.items())}), file=sys.stderr)


if __name__ == "__main__":
    main()
