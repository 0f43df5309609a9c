"""Named model sizes: config data each family's folder holds (``PRESETS`` in model/<family>/config.py).

``model.preset: 1b`` fills the shape fields the config does not set; a key the YAML or an override
sets always wins, whatever its value (``model.preset=1b model.n_kv_heads=2`` gives 2 KV heads).
The merge happens once, in ``experiment.config.load_config``, so every stage and the recorded
``config.resolved.yaml`` see the same resolved shape.
"""

from __future__ import annotations

from typing import Any

from experiment.errors import ConfigError
from experiment.sections.model import family_presets, model_section_class


def preset_fields(name: str, family: str = "llama", key: str = "model.preset") -> dict[str, Any]:
    """The shape fields of ``family``'s preset ``name``; an unknown name is one line listing the known ones."""
    presets = family_presets(family)
    if name not in presets:
        known = ", ".join(presets) or "none"
        raise ConfigError(f"config key '{key}': unknown preset '{name}' of the {family} family (known: {known})")
    return dict(presets[name])


def preset_model_config(name: str, family: str = "llama") -> Any:
    """The model section of ``family``'s preset ``name`` alone (schema defaults elsewhere), validated."""
    cfg = model_section_class(family)(family=family, preset=name, **preset_fields(name, family))
    cfg.validate("model")
    return cfg
