"""A proposed layout in the formats people quantize with.

* the project's format: the built candidate itself (``quantization.json`` with ``layer_schemes``,
  :mod:`harness.allocation.project_format`);
* llm-compressor (compressed-tensors): a recipe whose ``QuantizationModifier`` has one ``config_group`` per
  distinct choice, its ``targets`` the units as anchored regular expressions (``re:^model\\.layers\\.0\\...$``),
  symmetric integer weights (``strategy: group`` with the group size, or ``channel`` for one scale per row),
  activations left alone, the head ignored (:func:`llmcompressor_recipe`);
* llama.cpp: ``llama-quantize`` arguments, one ``--tensor-type PATTERN=TYPE`` per unit
  (:func:`harness.allocation.gguf_format.tensor_type_lines`); the same overrides go through llama-cpp-python's
  ``tt_overrides`` when the harness builds the file.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from harness.allocation.choices import parse_project


def _sq(text: str) -> str:
    """A YAML single-quoted scalar (backslashes stay literal; a quote doubles)."""
    return "'" + text.replace("'", "''") + "'"


def llmcompressor_recipe(layout: Mapping[str, str]) -> str:
    """The llm-compressor recipe (YAML) of a project-format layout (module docstring)."""
    by_choice: dict[str, list[str]] = {}
    for unit, choice in sorted(layout.items()):
        by_choice.setdefault(choice, []).append(unit)
    lines = ["default_stage:", "  default_modifiers:", "    QuantizationModifier:", "      config_groups:"]
    for i, (choice, units) in enumerate(sorted(by_choice.items())):
        s = parse_project(choice)
        lines += [f"        group_{i}:", "          targets:"]
        lines += [f"          - {_sq('re:^' + re.escape(u) + '$')}" for u in units]
        lines += ["          weights:", f"            num_bits: {s.bits}", "            type: int",
                  "            symmetric: true",
                  f"            strategy: {'group' if s.group_size else 'channel'}"]
        if s.group_size:
            lines.append(f"            group_size: {s.group_size}")
        lines += ["            dynamic: false", "            observer: memoryless_minmax",
                  "          input_activations: null", "          output_activations: null"]
    lines += ["      ignore:", "      - lm_head"]
    return "\n".join(lines) + "\n"
