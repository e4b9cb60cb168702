"""glmrl's event file against tensorboardX's own writer: the summaries it serializes parse as the ones
tensorboardX builds, and the file frames them as TFRecords TensorBoard reads (tensorboardX's checksums)."""

import io

import numpy as np
from PIL import Image
from tensorboardX import summary as tbx_summary
from tensorboardX.proto import summary_pb2

from glmrl.logging import event_file
from tests.logging.tfrecords import read_events


def test_scalar_summary_is_tensorboardx_s():
  for tag, value in (("reward/mean", 0.5), ("decoder/dgpo/clip_frac", -3.25e-7), ("grad_norm", 1e30)):
    got = summary_pb2.Summary.FromString(event_file.scalar_summary(tag, value))
    assert got == tbx_summary.scalar(tag, value), (got, tag)


def test_image_summary_is_tensorboardx_s_and_its_png_is_the_image():
  image = np.random.default_rng(0).integers(0, 256, (5, 7, 3), dtype=np.uint8)
  got = summary_pb2.Summary.FromString(event_file.image_summary("samples", image))
  want = tbx_summary.image("samples", image, dataformats="HWC")
  (value,), (want_value,) = got.value, want.value
  assert value.tag == want_value.tag == "samples"
  fields = lambda v: (v.image.height, v.image.width, v.image.colorspace)
  assert fields(value) == fields(want_value) == (5, 7, 3)
  np.testing.assert_array_equal(np.asarray(Image.open(io.BytesIO(value.image.encoded_image_string))), image)


def test_the_file_holds_the_version_then_each_event_checksummed(tmp_path):
  f = event_file.EventFile(str(tmp_path))
  f.write(event_file.event(3, summary=event_file.scalar_summary("a", 1.5), wall_time=12.5))
  f.write(event_file.event(2**40, summary=event_file.scalar_summary("b", -2.0)))
  f.close()
  assert f.path.startswith(str(tmp_path / "events.out.tfevents."))
  first, a, b = read_events(f.path)
  assert first.file_version == "brain.Event:2" and first.step == 0 and first.wall_time > 0
  assert (a.step, a.wall_time, a.summary.value[0].tag, a.summary.value[0].simple_value) == (3, 12.5, "a", 1.5)
  assert (b.step, b.summary.value[0].simple_value) == (2**40, -2.0)


def test_crc32c_is_castagnoli_s():
  # The check value of CRC-32C (RFC 3720's polynomial): "123456789" -> 0xE3069283.
  assert event_file.crc32c(b"123456789") == 0xE3069283 and event_file.crc32c(b"") == 0
