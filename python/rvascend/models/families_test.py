"""Each model family is one entry of models/families.py: nothing else in the package
compares against a family's name, and every entry is served and written the same way."""

from __future__ import annotations

import ast
import os
import sys

import pytest

from rvascend.models import families
from rvascend.models.config import ModelConfig
from rvascend.models.decoder import CausalLM
from rvascend.models.qwen3_5 import Qwen3_5CausalLM
from rvascend.models.registry import model_class_for

PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMES = {f.architecture for f in families.FAMILIES} | {f.gguf_architecture for f in families.FAMILIES}


def _comparisons_with_a_family_name(tree: ast.AST):
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            for side in (node.left, *node.comparators):
                values = side.elts if isinstance(side, (ast.Tuple, ast.List, ast.Set)) else (side,)
                for value in values:
                    if isinstance(value, ast.Constant) and value.value in NAMES:
                        yield node.lineno, value.value


def test_no_module_branches_on_a_family_name():
    found = []
    for directory, _, files in os.walk(PACKAGE):
        for f in files:
            if f.endswith(".py") and not f.endswith("_test.py") and f not in ("testing.py", "families.py"):
                path = os.path.join(directory, f)
                with open(path, encoding="utf-8") as src:
                    tree = ast.parse(src.read(), path)
                found += [f"{os.path.relpath(path, PACKAGE)}:{line} compares with {name!r}"
                          for line, name in _comparisons_with_a_family_name(tree)]
    assert not found, "ask models/families.py instead:\n" + "\n".join(found)


def test_the_check_sees_a_branch_on_a_name():
    tree = ast.parse('if arch == "Qwen2ForCausalLM" or gguf in ("llama", "x"):\n    pass\n')
    assert sorted(name for _, name in _comparisons_with_a_family_name(tree)) == ["Qwen2ForCausalLM", "llama"]


@pytest.mark.parametrize("family", families.FAMILIES, ids=lambda f: f.architecture)
def test_every_family_is_served_and_its_switches_reach_the_config(family):
    raw = {"architectures": [family.architecture], "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 256,
           "head_dim": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4, "linear_key_head_dim": 16,
           "linear_value_head_dim": 16, "linear_conv_kernel_dim": 4}
    config = ModelConfig.from_dict(raw)
    assert config.attention_bias == family.attention_bias and config.qk_norm == family.qk_norm
    assert (config.layer_types is not None) == family.hybrid
    assert model_class_for(family.architecture) is (Qwen3_5CausalLM if family.hybrid else CausalLM)
    assert families.family_of_gguf(family.gguf_architecture) is family
    assert family.tool_call_parser in ("qwen25", "llama3")  # server/tool_calls.PARSERS (a layer above)


@pytest.mark.parametrize("family", [f for f in families.FAMILIES if f.hybrid], ids=lambda f: f.architecture)
def test_a_hybrid_config_without_its_deltanet_dimensions_is_refused_by_name(family):
    raw = {"architectures": [family.architecture], "hidden_size": 64, "intermediate_size": 128,
           "num_hidden_layers": 4, "num_attention_heads": 4, "vocab_size": 256}
    with pytest.raises(ValueError, match=f"config.json of {family.architecture} lacks linear_num_key_heads"):
        ModelConfig.from_dict(raw)


def test_an_unknown_architecture_is_refused_by_name():
    with pytest.raises(ValueError, match="unsupported architecture 'MistralForCausalLM'; supported: Llama"):
        ModelConfig.from_dict({"architectures": ["MistralForCausalLM"], "hidden_size": 64, "intermediate_size": 128,
                               "num_hidden_layers": 1, "num_attention_heads": 4, "vocab_size": 256})
    assert families.family_of_gguf("mistral") is None


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
