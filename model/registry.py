"""The model families that ship with the package, registered on import: stages look families up here.

Importing this module registers Llama (model/llama.py); a family defined elsewhere registers itself
with ``model.family.register_family`` when its module is imported (for recipe subprocesses: name the
module in ``RU_PRETRAIN_PLUGINS``).
"""

from __future__ import annotations

import model.llama  # noqa: F401  (registers the Llama family)
from model.family import FamilyModel, ModelFamily, families, family_of, get_family, register_family

__all__ = ["FamilyModel", "ModelFamily", "families", "family_of", "get_family", "register_family"]
