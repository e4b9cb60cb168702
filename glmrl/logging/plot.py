"""Line plots of metrics.jsonl (one metric against step, or several series on shared axes), drawn with PIL only
(for the docs' figures)."""

import difflib
import json
import math
import os
import sys

from PIL import Image, ImageDraw

from glmrl.errors import UserError, run_command
from glmrl.logging.images import get_font

_AXIS = (0, 0, 0)
_GRID = (225, 225, 225)
_TICK_LEN = 5


def read_metric(metrics_jsonl_path: str | os.PathLike, key: str) -> tuple[list[float], list[float]]:
  """(steps, values) of `key`, sorted by step; nulls skipped, a repeated step keeps its last value."""
  path = os.fspath(metrics_jsonl_path)
  by_step: dict[float, float] = {}
  keys_seen: set[str] = set()
  with open(path, encoding="utf-8") as f:
    for lineno, line in enumerate(f, start=1):
      if not line.strip():
        continue
      try:
        row = json.loads(line)
      except json.JSONDecodeError as e:
        raise UserError(f"{path}:{lineno}: bad JSON: {e}") from e
      if not isinstance(row, dict) or not isinstance(row.get("step"), (int, float)):
        raise UserError(f"{path}:{lineno}: expected an object with a numeric 'step'")
      keys_seen.update(row)
      value = row.get(key)
      if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
        by_step[row["step"]] = float(value)
      elif key in row:
        by_step.pop(row["step"], None)  # a later null overrides an earlier value of that step
  if not by_step:
    close = difflib.get_close_matches(key, sorted(keys_seen - {"step", key}), n=1)
    raise UserError(f"{path}: no finite values for key {key!r}" + (f" (did you mean {close[0]!r}?)" if close else "")
                    + f"; keys present: {sorted(keys_seen)}")
  steps = sorted(by_step)
  return [float(s) for s in steps], [by_step[s] for s in steps]


def nice_ticks(lo: float, hi: float, target: int = 5) -> list[float]:
  """Ticks at multiples of 1, 2 or 5 x 10^k covering [lo, hi] with about `target` intervals."""
  if not hi > lo:
    raise ValueError(f"nice_ticks needs hi > lo, got lo={lo}, hi={hi}")
  raw = (hi - lo) / target
  mag = 10.0 ** math.floor(math.log10(raw))
  step = next(m * mag for m in (1, 2, 5, 10) if m * mag >= raw * (1 - 1e-9))
  first = math.floor(lo / step + 1e-9)
  last = math.ceil(hi / step - 1e-9)
  return [k * step for k in range(first, last + 1)]


def _format_tick(value: float, step: float) -> str:
  if value == 0:
    return "0"
  if abs(value) >= 1e6 or step < 1e-4:
    return f"{value:.3g}"
  decimals = max(0, -math.floor(math.log10(step) + 1e-9))
  return f"{value:.{decimals}f}"


def _span(values: list[float]) -> tuple[float, float]:
  lo, hi = min(values), max(values)
  if hi == lo:
    half = max(abs(lo) * 0.05, 0.5)
    return lo - half, hi + half
  return lo, hi


def _check_size(width: int, height: int) -> None:
  if width < 200 or height < 150:
    raise ValueError(f"plot size {width}x{height} is too small (minimum 200x150)")


_COLORS = ((31, 119, 180), (214, 39, 40), (44, 160, 44), (255, 127, 14), (148, 103, 189), (140, 86, 75))


def plot_metric(metrics_jsonl_path: str | os.PathLike, key: str, out_png: str | os.PathLike, *,
                width: int = 640, height: int = 400, title: str | None = None) -> str:
  """Draws `key` against step as a PNG of `width` x `height` pixels; returns the path."""
  _check_size(width, height)  # before reading the file
  steps, values = read_metric(metrics_jsonl_path, key)
  return plot_series({key: (steps, values)}, out_png, xlabel="step", ylabel=key, width=width, height=height,
                     title=title if title is not None else key, legend=False)


def plot_series(series: dict, out_png: str | os.PathLike, *, xlabel: str, ylabel: str, title: str = "",
                width: int = 640, height: int = 400, legend: bool = True) -> str:
  """Draws each `series` entry (label -> (xs, ys)) as a line on shared axes, with a legend of the labels; returns
  the path of the PNG."""
  _check_size(width, height)
  if not series or len(series) > len(_COLORS):
    raise ValueError(f"plot_series draws 1 to {len(_COLORS)} series, got {len(series)}")
  font = get_font(12)
  left, right, top, bottom = 72, 20, 30, 48
  x0, x1, y0, y1 = left, width - right, top, height - bottom  # plot area, y grows downwards

  xticks = nice_ticks(*_span([x for xs, _ in series.values() for x in xs]))
  yticks = nice_ticks(*_span([y for _, ys in series.values() for y in ys]))
  xlo, xhi = xticks[0], xticks[-1]
  ylo, yhi = yticks[0], yticks[-1]

  def px(s: float) -> float:
    return x0 + (s - xlo) / (xhi - xlo) * (x1 - x0)

  def py(v: float) -> float:
    return y1 - (v - ylo) / (yhi - ylo) * (y1 - y0)

  img = Image.new("RGB", (width, height), (255, 255, 255))
  draw = ImageDraw.Draw(img)
  xstep, ystep = xticks[1] - xticks[0], yticks[1] - yticks[0]
  for t in xticks:
    x = px(t)
    draw.line([(x, y0), (x, y1)], fill=_GRID)
    draw.line([(x, y1), (x, y1 + _TICK_LEN)], fill=_AXIS)
    draw.text((x, y1 + _TICK_LEN + 2), _format_tick(t, xstep), fill=_AXIS, font=font, anchor="mt")
  for t in yticks:
    y = py(t)
    draw.line([(x0, y), (x1, y)], fill=_GRID)
    draw.line([(x0 - _TICK_LEN, y), (x0, y)], fill=_AXIS)
    draw.text((x0 - _TICK_LEN - 3, y), _format_tick(t, ystep), fill=_AXIS, font=font, anchor="rm")
  draw.rectangle([x0, y0, x1, y1], outline=_AXIS)

  for (label, (xs, ys)), color in zip(series.items(), _COLORS):
    points = [(px(s), py(v)) for s, v in zip(xs, ys)]
    if len(points) > 1:
      draw.line(points, fill=color, width=2, joint="curve")
    if len(points) <= 60:
      for x, y in points:
        draw.ellipse([x - 2.5, y - 2.5, x + 2.5, y + 2.5], fill=color)
  if legend:
    for i, (label, color) in enumerate(zip(series, _COLORS)):
      ly = y0 + 8 + 16 * i
      draw.line([(x0 + 8, ly), (x0 + 28, ly)], fill=color, width=3)
      draw.text((x0 + 34, ly), label, fill=_AXIS, font=font, anchor="lm")

  draw.text(((x0 + x1) / 2, height - 6), xlabel, fill=_AXIS, font=font, anchor="md")
  draw.text(((x0 + x1) / 2, top / 2), title, fill=_AXIS, font=get_font(14), anchor="mm")
  # Rotated y-axis label: render horizontally, then turn it by 90 degrees.
  label_w = int(math.ceil(font.getlength(ylabel))) + 4
  label = Image.new("RGB", (label_w, 16), (255, 255, 255))
  ImageDraw.Draw(label).text((label_w / 2, 8), ylabel, fill=_AXIS, font=font, anchor="mm")
  label = label.rotate(90, expand=True)
  img.paste(label, (4, int((y0 + y1) / 2 - label.height / 2)))

  out_png = os.fspath(out_png)
  os.makedirs(os.path.dirname(os.path.abspath(out_png)), exist_ok=True)
  img.save(out_png, format="PNG")
  return out_png


def main(argv=None) -> int:
  """python -m glmrl.logging.plot WORKDIR/metrics.jsonl KEY OUT.png; prints the PNG's path."""
  args = sys.argv[1:] if argv is None else argv
  if len(args) != 3:
    return run_command(lambda: _usage(args))
  return run_command(lambda: plot_metric(*args))


def _usage(args):
  raise UserError(f"expected METRICS_JSONL KEY OUT_PNG, got {len(args)} argument(s) {args} "
                  "(python -m glmrl.logging.plot WORKDIR/metrics.jsonl reward/mean out.png)")


if __name__ == "__main__":
  sys.exit(main())
