"""Summarises a compile log written by bench/compile_log/sitecustomize.py (see there):

    python bench/compile_log/summarize.py /tmp/compiles [--top=30]

Prints the seconds spent compiling (and loading from the persistent cache) in all, by process layout, by test, by
program name, and the seconds spent compiling a program some process had compiled already (the same module text:
what a shared cache could have saved, e.g. in the processes of a CPU process group, which run without one); then
the CPU the processes used (user + system, at their exit): the pytest processes' own and, by test, that of the
processes each test started.
"""

import argparse
import collections
import glob
import json
import os


def load(folder: str) -> list[dict]:
  records = []
  for path in sorted(glob.glob(os.path.join(folder, "*.jsonl"))):
    with open(path) as f:
      records += [json.loads(line) for line in f if line.strip()]
  return records


def load_cpu(folder: str) -> list[dict]:
  """Each process's CPU record (`<pid>.cpu.json`)."""
  records = []
  for path in sorted(glob.glob(os.path.join(folder, "*.cpu.json"))):
    with open(path) as f:
      records.append(json.load(f))
  return records


def repeated_programs(records: list[dict]) -> dict[str, list[dict]]:
  """{digest: its compilations}, for the programs compiled more than once."""
  by_digest = collections.defaultdict(list)
  for r in records:
    if r["digest"]:
      by_digest[r["digest"]].append(r)
  return {d: rs for d, rs in by_digest.items() if len(rs) > 1}


def repeats(rs: list[dict]) -> float:
  """The seconds of a program's compilations but its slowest: what a cache every process reads would have saved."""
  return sum(r["s"] for r in rs) - max(r["s"] for r in rs)


def test_of(record: dict) -> str:
  return record["test"].rsplit(" (", 1)[0] or record["argv"][:100]


def summary(records: list[dict], top: int, cpu: list[dict] = ()) -> str:
  lines = [f"{len(records)} programs, {sum(r['s'] for r in records):.0f} s compiling or loading"]
  layouts = collections.defaultdict(list)
  for r in records:
    layouts[(r["processes"], r["devices"])].append(r)
  lines.append("\nby layout (processes x devices of the program):")
  for (p, d), rs in sorted(layouts.items()):
    lines.append(f"  {p} x {d}: {len(rs)} programs, {sum(r['s'] for r in rs):.0f} s")
  for title, key in (("test", test_of), ("program", lambda r: r["name"])):
    seconds, counts = collections.defaultdict(float), collections.Counter()
    for r in records:
      seconds[key(r)] += r["s"]
      counts[key(r)] += 1
    lines.append(f"\nby {title} (s, programs):")
    lines += [f"  {s:7.0f} {counts[k]:5d}  {k}" for k, s in sorted(seconds.items(), key=lambda kv: -kv[1])[:top]]
  again = repeated_programs(records)
  in_all = sum(repeats(rs) for rs in again.values())
  in_groups = sum(repeats(rs) for rs in again.values() if rs[0]["processes"] > 1)
  lines.append(f"\nthe same program compiled again: {in_all:.0f} s ({in_groups:.0f} s in process groups)")
  for rs in sorted(again.values(), key=lambda rs: -repeats(rs))[:top]:
    tests = sorted({test_of(r).split("::")[-1][:50] for r in rs})
    lines.append(f"  {repeats(rs):6.0f} s  x{len(rs)} {rs[0]['name']} ({rs[0]['processes']} x {rs[0]['devices']}): "
                 f"{', '.join(tests[:3])}{' ...' if len(tests) > 3 else ''}")
  if cpu:
    own = [r for r in cpu if r["pytest"]]
    started = collections.defaultdict(list)
    for r in cpu:
      if not r["pytest"]:
        started[test_of(r)].append(r)
    lines.append(f"\nCPU at exit (user + system): {len(cpu)} processes, {sum(r['cpu'] for r in cpu):.0f} s; the "
                 f"{len(own)} pytest processes' own: {sum(r['cpu'] for r in own):.0f} s")
    lines.append("by test (s, processes it started):")
    lines += [f"  {sum(r['cpu'] for r in rs):7.0f} {len(rs):5d}  {k}"
              for k, rs in sorted(started.items(), key=lambda kv: -sum(r["cpu"] for r in kv[1]))[:top]]
  return "\n".join(lines)


def main():
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("folder")
  parser.add_argument("--top", type=int, default=30)
  args = parser.parse_args()
  print(summary(load(args.folder), args.top, load_cpu(args.folder)))


if __name__ == "__main__":
  main()
