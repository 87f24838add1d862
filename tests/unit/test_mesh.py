"""Mesh sizes from the ici_* keys and the device fractions; inconsistent ones are config errors that
name the keys and the device count."""

import pytest

from maxtext.configs.pyconfig import ConfigError
from maxtext.utils import mesh
from tests.conftest import make_config


@pytest.mark.parametrize(
  "args, devices, shape",
  [
    ((), 8, (1, 8, 1)),  # fsdp=-1 fills the devices
    (("ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"), 8, (1, 4, 2)),
    (("ici_data_parallelism=-1", "ici_fsdp_parallelism=2"), 8, (4, 2, 1)),
  ],
)
def test_mesh_shapes(args, devices, shape):
  assert mesh.mesh_shape(make_config(*args).mesh, devices) == shape


@pytest.mark.parametrize(
  "args, devices, message",
  [
    (("ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"), 4, r"product 8 does not match the 4 devices available"),
    (("ici_tensor_parallelism=3",), 8, r"8 devices are not divisible by the fixed sizes \(3\)"),
    (("ici_data_parallelism=-1",), 8, r"ici_data_parallelism, ici_fsdp_parallelism: at most one parallelism may be -1"),
    (("ici_tensor_parallelism=0",), 8, r"parallelism sizes must be positive or -1"),
  ],
)
def test_inconsistent_mesh_sizes_name_the_keys_and_devices(args, devices, message):
  with pytest.raises(ConfigError, match=message) as e:
    mesh.mesh_shape(make_config(*args).mesh, devices)
  assert "ici_" in str(e.value)


def test_device_fractions_need_a_device_each():
  with pytest.raises(
    ConfigError,
    match=r"trainer_devices_fraction=0.5, sampler_devices_fraction=0.5: need at "
    r"least one device each and no more than the 1 available \(got 0 \+ 0\)",
  ):
    mesh.create_meshes(make_config("trainer_devices_fraction=0.5", "sampler_devices_fraction=0.5").mesh, agentic=False)
