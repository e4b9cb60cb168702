"""3D (temporal, height, width) M-RoPE positions of GLM-Image prompts and generated tokens.

Host-side numpy port of transformers' `GlmImageModel.get_rope_index`: text
tokens advance all three rows together; a condition image (tokens between an
image-start and an image-end token) gets a 2D grid of positions and advances the
text counter by max(h, w). Generated grids continue from there, in reverse order
of the per-sample grid list (text-to-image: preview grid, then target grid),
followed by one position for the end token. Left padding is skipped (padded
slots keep position 1, as in the reference).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def grid_positions(start: int, h: int, w: int) -> np.ndarray:
  """[3, h * w]: temporal = start, height = start + row, width = start + col (row-major)."""
  rows, cols = np.meshgrid(np.arange(h), np.arange(w), indexing="ij")
  return np.stack([np.full(h * w, start), start + rows.reshape(-1), start + cols.reshape(-1)])


def text_positions(start: int, n: int) -> np.ndarray:
  """[3, n]: the same ramp on all three rows."""
  return np.broadcast_to(np.arange(start, start + n), (3, n))


def split_grids(image_grid_thw: np.ndarray, images_per_sample: Sequence[int]) -> list[np.ndarray]:
  """Per-sample [n_i, 3] grid lists from the packed [sum n_i, 3] array."""
  image_grid_thw = np.asarray(image_grid_thw, dtype=np.int64).reshape(-1, 3)
  counts = [int(c) for c in images_per_sample]
  if sum(counts) != len(image_grid_thw):
    raise ValueError(f"images_per_sample={counts} sums to {sum(counts)} but image_grid_thw has "
                     f"{len(image_grid_thw)} rows")
  return np.split(image_grid_thw, np.cumsum(counts)[:-1])


def sample_positions(ids: np.ndarray, grids: np.ndarray, image_start_id: int,
                     image_end_id: int) -> tuple[np.ndarray, np.ndarray]:
  """One unpadded sample -> (prompt positions [3, len(ids)], generated positions [3, N_new])."""
  ends = np.flatnonzero(ids == image_end_id)
  # An image's grid starts right after its start token; the start token itself is text.
  starts = np.flatnonzero(ids == image_start_id) + 1
  pieces, pos, prev_end = [], 0, 0
  for img, (start, end) in enumerate(zip(starts, ends)):
    if img >= len(grids):
      break
    n_text = int(start - prev_end)
    pieces.append(text_positions(pos, n_text))
    pos += n_text
    _, h, w = (int(v) for v in grids[img])
    pieces.append(grid_positions(pos, h, w))
    pos += max(h, w)
    prev_end = int(end)
  n_text = len(ids) - prev_end
  pieces.append(text_positions(pos, n_text))
  pos += n_text
  prompt = np.concatenate(pieces, axis=1)

  decode = []
  for grid in grids[len(ends):][::-1]:
    _, h, w = (int(v) for v in grid)
    decode.append(grid_positions(pos, h, w))
    pos += max(h, w)
  decode.append(text_positions(pos, 1))
  return prompt, np.concatenate(decode, axis=1)


def rope_index(input_ids_BxL: np.ndarray, valid_BxL: np.ndarray, image_grid_thw: np.ndarray,
               images_per_sample: Sequence[int], *, image_start_id: int,
               image_end_id: int) -> tuple[np.ndarray, np.ndarray]:
  """Prefill positions [3, B, L] and decode positions [B, 3, N_new] (int32).

  image_grid_thw: [sum(images_per_sample), 3], per sample its condition-image
  grids then its generation grids (the processor's layout). Decode position j
  belongs to generated token j (the token fed back at decode step j).
  """
  input_ids_BxL = np.asarray(input_ids_BxL)
  valid_BxL = np.asarray(valid_BxL).astype(bool)
  if input_ids_BxL.ndim != 2 or input_ids_BxL.shape != valid_BxL.shape:
    raise ValueError(f"input_ids {input_ids_BxL.shape} and valid {valid_BxL.shape} must both be [B, L]")
  b, l = input_ids_BxL.shape
  grids = split_grids(image_grid_thw, images_per_sample)
  if len(grids) != b:
    raise ValueError(f"images_per_sample has {len(grids)} entries for a batch of {b}")
  positions_3xBxL = np.ones((3, b, l), np.int32)
  decodes = []
  for i in range(b):
    prompt, decode = sample_positions(input_ids_BxL[i][valid_BxL[i]], grids[i], image_start_id, image_end_id)
    positions_3xBxL[:, i, valid_BxL[i]] = prompt
    decodes.append(decode)
  n_new = max(d.shape[1] for d in decodes)
  # Samples with fewer generated tokens repeat their last position (reference behaviour).
  decode_Bx3xN = np.stack([np.pad(d, ((0, 0), (0, n_new - d.shape[1])), mode="edge") for d in decodes])
  return positions_3xBxL, decode_Bx3xN.astype(np.int32)


def sequence_positions(positions_3xBxL: np.ndarray, decode_Bx3xN: np.ndarray) -> np.ndarray:
  """Positions of the whole prompt + generated sequence, [3, B, L + N_new]."""
  return np.concatenate([np.asarray(positions_3xBxL), np.transpose(np.asarray(decode_Bx3xN), (1, 0, 2))], axis=2)
