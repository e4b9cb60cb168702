"""The checkpoint comparison as a static web page: the report's overall table, then one row per prompt and one
column per checkpoint, each cell the prompt's first sample at that checkpoint with its score and the prompt's
mean over its samples under it. Plain HTML and CSS with relative image paths: open eval/index.html from disk or
serve the folder; no server, no network. After loading, the page marks on its body whether every image decoded
(`data-images-loaded`), which a headless browser can read back."""

from __future__ import annotations

import html as html_lib

from glmrl.evaluation.report import format_ci

_STYLE = """
body { font-family: sans-serif; margin: 1.5em; }
table { border-collapse: collapse; }
th, td { border: 1px solid #ccc; padding: 4px 6px; vertical-align: top; font-size: 13px; }
td.prompt { max-width: 26em; }
figure { margin: 0; text-align: center; }
figure img { width: 160px; height: auto; image-rendering: pixelated; display: block; }
.up { color: #17612b; } .down { color: #a11; }
"""

_LOADED = """
window.addEventListener("load", () => {
  const images = Array.from(document.images);
  document.body.dataset.imagesLoaded = String(images.every((im) => im.complete && im.naturalWidth > 0));
  document.body.dataset.imageCount = String(images.length);
});
"""


# What each drift measure of `glmrl.evaluation.drift` reads as, on the page beside the rewards.
_DRIFT_MEANING = {
    "drift/ssim": "1 - SSIM: 0 for the base's own image, about 1 where the structure is unrelated to the base's, "
                  "above 1 (up to 2) where it is anti-correlated (SSIM below 0: light where the base is dark)",
    "drift/rmse": "root mean square pixel difference on [0, 1]",
    "drift/lpips": "LPIPS (VGG) distance: 0 for the same image, higher for perceptually farther",
}


def _drift_table(report: dict, steps, name) -> list[str]:
  """The images' distance from the base's at the same prompt and seed, per checkpoint: the sign of reward hacking
  the rewards alone do not show (`glmrl.evaluation.drift`). Nothing when the report holds no drift."""
  esc = html_lib.escape
  keys = sorted(k for k in report["rewards"] if k.startswith("drift/"))
  if not keys:
    return []
  parts = [f"<h2>Drift from {esc(name(report['base_step']))}</h2><p>How far each checkpoint's images moved from the "
           "base's at the same prompt and seed (means over prompts with their intervals). A reward that rises with "
           "a large drift may be a reward hacked rather than earned.</p><ul>"]
  parts += [f"<li><b>{esc(k)}</b>: {esc(_DRIFT_MEANING.get(k, ''))}</li>" for k in keys]
  parts.append("</ul><table><tr><th>measure</th><th>category</th>" + "".join(f"<th>{esc(name(s))}</th>" for s in steps)
               + "</tr>")
  for k in keys:
    for group, row in report["rewards"][k].items():
      parts.append(f"<tr><td>{esc(k)}</td><td>{esc(group)}</td>"
                   + "".join(f"<td>{format_ci(row['mean'][str(s)])}</td>" for s in steps) + "</tr>")
  parts.append("</table>")
  return parts


def html(report: dict, title: str, image_dir: str = "images", reward: str = "reward") -> str:
  """The page of `report` (`glmrl.evaluation.report.compare`, with its prompts' text), its images at
  `<image_dir>/<step>/<prompt index>.png` relative to the page, cells scored by `reward`."""
  esc = html_lib.escape
  steps, base = report["steps"], report["base_step"]
  name = lambda s: "base (step 0)" if s == 0 else f"step {s}"
  table = report["rewards"][reward]
  parts = ["<!DOCTYPE html>", "<html lang=\"en\"><head><meta charset=\"utf-8\">", f"<title>{esc(title)}</title>",
           f"<style>{_STYLE}</style>", f"<script>{_LOADED}</script></head><body>", f"<h1>{esc(title)}</h1>",
           f"<p>{report['prompts']} prompts x {report['samples_per_prompt']} samples, the same seeds for every "
           f"checkpoint; {esc(reward)}: means with {int(report['level'] * 100)}% bootstrap intervals over prompts, "
           f"differences paired per prompt against {esc(name(base))}.</p>", "<table><tr><th>category</th>"
           "<th>prompts</th>" + "".join(f"<th>{esc(name(s))}</th>" for s in steps) +
           "".join(f"<th>{esc(name(s))} - {esc(name(base))}</th>" for s in steps[1:]) + "</tr>"]
  for group, row in table.items():
    cells = [esc(group), str(report["categories"][group])] + [format_ci(row["mean"][str(s)]) for s in steps]
    for s in steps[1:]:
      d = row["difference"][str(s)]
      mark = " up" if d["excludes_zero"] and d["mean"] > 0 else " down" if d["excludes_zero"] else ""
      cells.append(f"<span class=\"{mark.strip()}\">{format_ci(d, signed=True)}</span>")
    parts.append("<tr>" + "".join(f"<td>{c}</td>" for c in cells) + "</tr>")
  parts.append("</table>")
  parts += _drift_table(report, steps, name)
  parts.append("<h2>Samples</h2><table><tr><th>#</th><th>prompt</th><th>category</th>" +
               "".join(f"<th>{esc(name(s))}</th>" for s in steps) + "</tr>")
  per_prompt, first = report["per_prompt"][reward], report["first_sample"][reward]
  texts = report.get("prompt_text") or [""] * report["prompts"]
  for i, (text, category) in enumerate(zip(texts, report["prompt_category"])):
    cells = []
    for s in steps:
      cells.append(f"<td><figure><img src=\"{esc(image_dir)}/{s}/{i}.png\" alt=\"prompt {i}, {esc(name(s))}\">"
                   f"<figcaption>{esc(reward)} {first[str(s)][i]:.4f}<br>prompt mean {per_prompt[str(s)][i]:.4f}"
                   "</figcaption></figure></td>")
    parts.append(f"<tr><td>{i}</td><td class=\"prompt\">{esc(text)}</td><td>{esc(category)}</td>" + "".join(cells)
                 + "</tr>")
  parts.append("</table></body></html>")
  return "\n".join(parts) + "\n"
