import pytest

from glmrl import sharding


def test_mesh_shape_resolves_the_rest():
  assert sharding.mesh_shape(1, -1, 1, 8) == (1, 8, 1)
  assert sharding.mesh_shape(2, 2, -1, 8) == (2, 2, 2)
  with pytest.raises(ValueError, match="at most one axis may be -1"):
    sharding.mesh_shape(-1, -1, 1, 8)
  with pytest.raises(ValueError, match="does not divide 8 devices"):
    sharding.mesh_shape(3, -1, 1, 8)
  with pytest.raises(ValueError, match=r"data=2 x fsdp=2 x tensor=1 != 8 devices"):
    sharding.mesh_shape(2, 2, 1, 8)


class FakeMesh:
  shape = {"data": 2, "fsdp": 2, "tensor": 2}


def test_logical_to_spec_replicates_what_does_not_divide():
  mesh = FakeMesh()
  assert tuple(sharding.logical_to_spec(("embed", "mlp"), (64, 6), mesh)) == ("fsdp", "tensor")
  assert tuple(sharding.logical_to_spec(("embed", "mlp"), (63, 6), mesh)) == (None, "tensor")
  # Two dims mapping to one mesh axis: only the first is sharded.
  assert tuple(sharding.logical_to_spec(("heads", "mlp"), (8, 8), mesh)) == ("tensor", None)
  assert tuple(sharding.logical_to_spec(None, (4, 4), mesh)) == (None, None)
