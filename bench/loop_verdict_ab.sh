#!/usr/bin/env bash
# What the loop verdict adds to a step, this tree against another commit, in one
# session: builds the core's loop_verdict bench at BASE (a temporary git worktree) and
# here, then runs the two binaries in alternating rounds, so both see the same load.
# Prints, per benchmark, each side's median over the rounds and their ratio (here /
# BASE). `baseline_step_digests` is the same code on both sides: its ratio is the noise.
#
#   bench/loop_verdict_ab.sh main            # 6 rounds
#   bench/loop_verdict_ab.sh main 10 'loop_verdict_small/'
#   bench/loop_verdict_ab.sh /path/to/a/checkout    # a built tree instead of a commit
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH="$HOME/.cargo/bin:$PATH"

base=${1:?usage: bench/loop_verdict_ab.sh BASE [ROUNDS] [FILTER]}
rounds=${2:-6}
filter=${3:-'verdict_added|baseline_step_digests'}
if [ -d "$base" ]; then
  wt=$base
else
  wt=$(mktemp -d /tmp/loop_verdict_ab.XXXXXX)
  trap 'git worktree remove --force "$wt" >/dev/null 2>&1 || true' EXIT
  git worktree add --detach -q "$wt" "$base"
fi

# The bench binary's path, built if needed.
binary() {
  (cd "$1" && cargo bench -p observatory_core --bench loop_verdict --no-run \
    --message-format=json -q 2>/dev/null |
    python3 -c 'import json,sys
for l in sys.stdin:
    m = json.loads(l)
    if m.get("reason") == "compiler-artifact" and m["target"]["name"] == "loop_verdict" and m.get("executable"):
        print(m["executable"])')
}

here_bin=$(binary .)
base_bin=$(binary "$wt")
out=$(mktemp)

for round in $(seq "$rounds"); do
  for side in base here; do
    bin=$here_bin
    [ "$side" = base ] && bin=$base_bin
    echo "=== $side" >>"$out"
    "$bin" --bench --warm-up-time 1 --measurement-time 2 "$filter" 2>&1 |
      grep -E '^loop_verdict|time:' >>"$out"
  done
done

python3 - "$out" "$base" <<'EOF'
import re, statistics, sys
side, name, times = None, None, {}
unit = {"ns": 1e-3, "µs": 1.0, "us": 1.0, "ms": 1e3}
for line in open(sys.argv[1]):
    if line.startswith("=== "):
        side = line.split()[1]
    elif line.startswith("loop_verdict"):
        name = line.split()[0]
    elif (m := re.search(r"time:\s+\[\S+ \S+ (\S+) (\S+)", line)) and name:
        times.setdefault(name, {}).setdefault(side, []).append(float(m[1]) * unit[m[2]])
print(f"{'benchmark':48} {sys.argv[2] + ' (µs)':>14} {'here (µs)':>10} {'ratio':>6}")
for name, sides in times.items():
    if "base" not in sides or "here" not in sides:
        # A benchmark one side does not have.
        med = lambda s: f"{statistics.median(sides[s]):.3f}" if s in sides else "-"
        print(f"{name:48} {med('base'):>14} {med('here'):>10} {'-':>6}")
        continue
    b, h = statistics.median(sides["base"]), statistics.median(sides["here"])
    print(f"{name:48} {b:14.3f} {h:10.3f} {h / b:6.2f}")
EOF
rm -f "$out"
