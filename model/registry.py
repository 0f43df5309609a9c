"""Where stages look model families up: by name, each shipped family's folder imported when first asked for.

The names that ship are experiment/families.py's table; a family defined elsewhere registers itself
with ``model.family.register_family`` when its module is imported (for recipe subprocesses: name the
module in ``RU_PRETRAIN_PLUGINS``).
"""

from __future__ import annotations

from model.family import FamilyModel, ModelFamily, TrainCosts, families, family_of, get_family, register_family

__all__ = ["FamilyModel", "ModelFamily", "TrainCosts", "families", "family_of", "get_family", "register_family"]
