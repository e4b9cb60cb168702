"""glmrl.runtime.device_memory: what the backend reports, and nothing where it reports nothing."""

import jax

from glmrl.runtime import device_memory


class _Device:
  def __init__(self, stats):
    self._stats = stats

  def memory_stats(self):
    if isinstance(self._stats, Exception):
      raise self._stats
    return self._stats


def test_peak_is_the_largest_device_peak(monkeypatch):
  devices = [_Device({"peak_bytes_in_use": 5, "bytes_limit": 80}), _Device({"peak_bytes_in_use": 7}), _Device(None)]
  monkeypatch.setattr(jax, "local_devices", lambda: devices)
  assert device_memory.peak_bytes() == 7
  assert device_memory.limit_bytes() == 80


def test_no_statistics_no_peak(monkeypatch):
  monkeypatch.setattr(jax, "local_devices", lambda: [_Device(None), _Device(NotImplementedError("no stats"))])
  assert device_memory.peak_bytes() is None
  assert device_memory.limit_bytes() > 0  # the host's RAM, shared by its devices
