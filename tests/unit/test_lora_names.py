"""LoRA regexes written for Tunix, transformers/PEFT or MaxText select the same weights here as
there, the run logs which weights got adapters, and a regex alternative that selects nothing is
refused instead of silently adapting less."""

import logging

import pytest

from maxtext.models import builder, load
from maxtext.utils import errors, lora_names
from maxtext.utils.mesh import create_meshes
from tests.conftest import make_config

TINY = ("model_name=qwen3-tiny", "vocab_size=1024", "lora_rank=4")
ALL = {f"layers.{i}.{w}" for i in range(2) for w in lora_names.WEIGHTS}

# Tunix's Gemma examples' module_path, its Qwen3/Llama examples', and a MaxText-style path.
TUNIX_GEMMA = ".*q_einsum|.*kv_einsum|.*gate_proj|.*down_proj|.*up_proj|.*attn_vec_einsum"
TUNIX_QWEN3 = ".*q_proj|.*k_proj|.*v_proj|.*o_proj|.*gate_proj|.*down_proj|.*up_proj"
MAXTEXT = ".*self_attention/(query|key|value|out)|.*mlp/(wi_0|wi_1|wo)"


def _adapted(*overrides) -> set[str]:
  cfg = make_config(*TINY, *overrides)
  model = load.load_model(cfg.model, create_meshes(cfg.mesh, agentic=False)[0])
  return {name.rsplit("_lora_", 1)[0] for name in builder.adapters(model)}


def test_tunixs_gemma_regex_adapts_every_projection_as_it_does_there(caplog):
  """Tunix's Gemma regex names q, kv and the output projection by Gemma's einsum names: here they
  select q_proj, k_proj, v_proj and o_proj (they selected none, so only the MLP was adapted)."""
  with caplog.at_level(logging.INFO, logger="maxtext.models.builder"):
    assert _adapted(f"lora_module_path={TUNIX_GEMMA}") == ALL
  assert "LoRA adapters (rank 4, alpha 16) on attn.q_proj, attn.k_proj, attn.v_proj, attn.o_proj, " in caplog.text
  assert "mlp.gate_proj, mlp.up_proj, mlp.down_proj in all 2 layers" in caplog.text


@pytest.mark.parametrize("pattern", [TUNIX_GEMMA, TUNIX_QWEN3, MAXTEXT])
def test_peers_regexes_select_every_projection(pattern):
  assert lora_names.describe(pattern, 2) == f"{', '.join(lora_names.WEIGHTS)} in all 2 layers"
  assert lora_names.unused_alternatives(pattern, 2) == []


def test_the_log_says_which_weights_in_which_layers():
  assert lora_names.describe(".*kv_einsum", 2) == "attn.k_proj, attn.v_proj in all 2 layers"
  assert lora_names.describe(r"layers\.1\.attn\.q_proj|.*mlp\.wo", 2) == (
    "attn.q_proj in layers 1; mlp.down_proj in all 2 layers"
  )


@pytest.mark.parametrize(
  "pattern, unused",
  [(".*q_proj|.*w_qkv", "'.*w_qkv'"), (".*q_einsum|.*c_attn|.*c_proj", "'.*c_attn', '.*c_proj'")],
)
def test_an_alternative_that_selects_no_weight_is_refused(pattern, unused):
  with pytest.raises(errors.ConfigError, match=f"{unused} select\\(s\\) no weight of this decoder"):
    make_config(*TINY, f"lora_module_path={pattern}")


def test_alternatives_split_at_the_top_level_only():
  assert lora_names.alternatives(r"a|(b|c)|[|]|d\|e") == ["a", "(b|c)", "[|]", r"d\|e"]
