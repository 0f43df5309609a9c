"""The model families that ship with the package, registered on import: stages look families up here.

Importing this module registers Llama (model/llama.py) and the Llama-shaped Hugging Face families
Mistral, Qwen2 and Qwen3 (model/hf_families.py); a family defined elsewhere registers itself
with ``model.family.register_family`` when its module is imported (for recipe subprocesses: name the
module in ``RU_PRETRAIN_PLUGINS``).
"""

from __future__ import annotations

import model.hf_families  # noqa: F401  (registers mistral, qwen2, qwen3)
import model.llama  # noqa: F401  (registers the Llama family)
from model.family import FamilyModel, ModelFamily, families, family_of, get_family, register_family

__all__ = ["FamilyModel", "ModelFamily", "families", "family_of", "get_family", "register_family"]
