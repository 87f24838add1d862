"""Mesh sizes from the ici_* keys and the device fractions; ones that do not fit the job's devices are
refused by RunConfig.check(job), naming the keys and the device count."""

import pytest

from maxtext.configs.pyconfig import ConfigError
from maxtext.utils import distributed
from tests.conftest import make_config


def _job(devices: int, processes: int = 1) -> distributed.Job:
  return distributed.Job(processes, devices, devices // processes, "cpu")


@pytest.mark.parametrize(
  "args, devices, shape",
  [
    ((), 8, (1, 8, 1)),  # fsdp=-1 fills the devices
    (("ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"), 8, (1, 4, 2)),
    (("ici_data_parallelism=-1", "ici_fsdp_parallelism=2"), 8, (4, 2, 1)),
  ],
)
def test_mesh_shapes(args, devices, shape):
  cfg = make_config(*args).check(_job(devices))
  assert cfg.mesh.shape(devices) == shape


@pytest.mark.parametrize(
  "args, devices, message",
  [
    (("ici_fsdp_parallelism=4", "ici_tensor_parallelism=2"), 4, r"product 8 does not match the 4 devices available"),
    (("ici_tensor_parallelism=3",), 8, r"8 devices are not divisible by the fixed sizes \(3\)"),
  ],
)
def test_mesh_sizes_that_do_not_fit_the_devices_name_the_keys_and_devices(args, devices, message):
  cfg = make_config(*args)
  with pytest.raises(ConfigError, match=message) as e:
    cfg.check(_job(devices))
  assert "ici_" in str(e.value)


@pytest.mark.parametrize(
  "args, message",
  [
    (
      ("ici_data_parallelism=-1",),
      r"^ici_data_parallelism=-1, ici_fsdp_parallelism=-1: at most one parallelism may be -1$",
    ),
    (("ici_tensor_parallelism=0",), r"^ici_tensor_parallelism=0: expected a positive mesh axis size, or -1"),
  ],
)
def test_mesh_sizes_are_refused_when_the_config_is_read(args, message):
  with pytest.raises(ConfigError, match=message):
    make_config(*args)


def test_device_fractions_need_a_device_each():
  cfg = make_config("trainer_devices_fraction=0.5", "sampler_devices_fraction=0.5")
  with pytest.raises(
    ConfigError,
    match=r"trainer_devices_fraction=0.5, sampler_devices_fraction=0.5: need at "
    r"least one device each and no more than the 1 available \(got 0 \+ 0\)",
  ):
    cfg.check(_job(1))
  cfg.check(_job(2))


def test_agentic_grpo_across_processes_needs_an_equal_share_and_no_dynamic_sampling():
  """Across processes agentic GRPO refuses rl.dynamic_sampling and batch sizes that do not split
  evenly (the rules of the job, checked with the job's process count); one process takes both."""
  agentic = ("rl.use_agentic_rollout=true", "batch_size=3", "train_micro_batch_size=3")
  make_config(*agentic).check(_job(2, processes=1))
  with pytest.raises(ConfigError, match=r"^batch_size=3: agentic GRPO across 2 processes .* multiple of 2$"):
    make_config(*agentic).check(_job(2, processes=2))
  with pytest.raises(ConfigError, match=r"^rl.dynamic_sampling=true: not supported in agentic GRPO across 2"):
    make_config("rl.use_agentic_rollout=true", "rl.dynamic_sampling=true").check(_job(2, processes=2))


def test_agentic_grpo_across_processes_needs_the_mesh_to_fit_each_process():
  """Each process samples on its own devices with the same axis keys: fixed sizes that fit all
  devices but not one process's are refused, naming the keys and what to set."""
  cfg = make_config("rl.use_agentic_rollout=true", "ici_fsdp_parallelism=4")
  cfg.check(_job(4, processes=1))
  with pytest.raises(
    ConfigError, match=r"product 4 does not match the 2 devices available .* set the one to fill to -1"
  ):
    cfg.check(_job(4, processes=2))
