"""The checkpoint comparison's report: per reward, overall and per category, each checkpoint's mean with its 95%
bootstrap interval and its paired difference to the first listed checkpoint (`stats`), as JSON and Markdown."""

from __future__ import annotations

import numpy as np

from glmrl.errors import UserError
from glmrl.evaluation import stats

OVERALL = "overall"


def parse_steps(text: str) -> list[int]:
  """config.eval.steps, "0,500,1000" -> [0, 500, 1000] (0: the models before RL); "" -> []."""
  if not text.strip():
    return []
  parts = [p.strip() for p in text.split(",")]
  if not all(p.isdigit() for p in parts) or len(set(parts)) != len(parts):
    raise UserError(f"config.eval.steps={text!r}: must be distinct step numbers >= 0 separated by commas, "
                    "e.g. 0,500,1000 (0: the models before RL)")
  return [int(p) for p in parts]


def compare(scores: dict, categories: list[str], seed: int, resamples: int = stats.RESAMPLES,
            prompts: list[str] | None = None) -> dict:
  """The report of `scores` ({step: {reward: [P, G] scores}}, steps in the order given, the first the base) on
  prompts of `categories` ([P] names). It keeps each prompt's mean score per reward and step (`per_prompt`: what
  the intervals were computed from), its first sample's (`first_sample`, the one the page shows) and, when given,
  the prompts' text."""
  steps = list(scores)
  base = steps[0]
  rewards = list(scores[base])
  num_prompts = len(categories)
  groups = {OVERALL: np.arange(num_prompts)}
  for k, name in enumerate(sorted(set(categories))):
    groups[name] = np.flatnonzero(np.asarray(categories) == name)
  indices = {g: stats.resample_indices(len(members), seed + k, resamples) for k, (g, members) in
             enumerate(groups.items())}
  out = {"steps": steps, "base_step": base, "prompts": num_prompts,
         "samples_per_prompt": int(np.asarray(scores[base][rewards[0]]).shape[1]), "resamples": resamples,
         "level": stats.LEVEL, "seed": seed, "categories": {g: int(len(m)) for g, m in groups.items()},
         "rewards": {}, "per_prompt": {}, "first_sample": {}, "prompt_text": list(prompts) if prompts is not None else None,
         "prompt_category": list(categories)}
  for reward in rewards:
    per_prompt = {s: stats.per_prompt(scores[s][reward]) for s in steps}
    out["per_prompt"][reward] = {str(s): per_prompt[s].tolist() for s in steps}
    out["first_sample"][reward] = {str(s): np.asarray(scores[s][reward], np.float64)[:, 0].tolist() for s in steps}
    table = {}
    for group, members in groups.items():
      row = {"mean": {}, "difference": {}}
      for s in steps:
        row["mean"][str(s)] = stats.mean_ci(per_prompt[s][members], indices[group])
        if s != base:
          row["difference"][str(s)] = stats.paired_difference(per_prompt[s][members], per_prompt[base][members],
                                                              indices[group])
      table[group] = row
    out["rewards"][reward] = table
  return out


def format_ci(c: dict, signed: bool = False) -> str:
  """"mean [low, high]" of `stats.mean_ci`'s output (4 decimals; signed for differences)."""
  fmt = "{:+.4f}" if signed else "{:.4f}"
  if c["low"] is None:
    return f"{fmt.format(c['mean'])} (one prompt: no interval)"
  return f"{fmt.format(c['mean'])} [{fmt.format(c['low'])}, {fmt.format(c['high'])}]"


def markdown(report: dict, title: str) -> str:
  """Tables of the report: one per reward, a row per category (overall first), a column per checkpoint's mean and
  per difference to the base; a difference whose interval excludes 0 is marked *."""
  steps, base = report["steps"], report["base_step"]
  name = lambda s: "base (step 0)" if s == 0 else f"step {s}"
  lines = [f"# {title}", "",
           f"{report['prompts']} prompts x {report['samples_per_prompt']} samples, the same seeds for every "
           f"checkpoint; means with {int(report['level'] * 100)}% bootstrap intervals over prompts "
           f"({report['resamples']} resamples, seed {report['seed']}); differences paired per prompt against "
           f"{name(base)}, * where the interval excludes 0.", ""]
  for reward, table in report["rewards"].items():
    head = ["category", "prompts"] + [name(s) for s in steps] + [f"{name(s)} - {name(base)}" for s in steps[1:]]
    lines += [f"## {reward}", "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for group, row in table.items():
      cells = [group, str(report["categories"][group])] + [format_ci(row["mean"][str(s)]) for s in steps]
      for s in steps[1:]:
        d = row["difference"][str(s)]
        cells.append(format_ci(d, signed=True) + (" *" if d["excludes_zero"] else ""))
      lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
  return "\n".join(lines)
