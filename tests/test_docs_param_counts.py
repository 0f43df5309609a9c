"""Plan, docs and README quote one parameter count per shipped config: the family's, as the planner prints it.

Every place a shipped config is introduced by name with a parenthesis (README.md, docs/launch.md) and gives
a parameter figure there must give the count the model family computes for that config at its tokenizer's
vocabulary (``model.family.params_label``); the README's list of configs and each config's header comment
must give it; and recipe 07's plan of the config says the same number.
"""

from __future__ import annotations

import datetime as dt
import re
from pathlib import Path

import pytest

from cost.planner import plan
from cost.rates import UsdRubRate
from experiment.config import load_config
from model.family import params_label
from model.registry import family_of

REPO = Path(__file__).resolve().parents[1]
SHIPPED = ("demo.yaml", "ru-1b-fineweb2-v6e-8.yaml", "ru-8b-v6e-64.yaml", "ru-70b-v5p-128.yaml",
           "qwen3-30b-a3b-ru-v5p-64.yaml", "gigachat3-lightning-ru-v6e-32.yaml")
DOCS = (REPO / "README.md", REPO / "docs" / "launch.md")
FIGURE = re.compile(r"(\d[\d.,]*\s?[MB])[- ]parameters?\b")


def family_label(name: str) -> str:
    cfg = load_config(REPO / "recipes" / "configs" / name)
    return params_label(family_of(cfg.model).param_count(cfg.model, cfg.tokenizer.vocab_size))


@pytest.mark.parametrize("name", SHIPPED)
def test_docs_readme_config_and_plan_agree_on_the_parameter_count(name: str) -> None:
    label = family_label(name)
    introduced = 0
    for doc in DOCS:
        text = " ".join(doc.read_text(encoding="utf-8").split())  # a parenthesis may wrap across lines
        for parenthesis in re.findall(rf"`{re.escape(name)}` \(([^()]*(?:\([^()]*\)[^()]*)*)\)", text):
            for figure in FIGURE.findall(parenthesis):
                assert figure.replace(" ", "") == label, f"{doc.name}: `{name}` ({parenthesis}) says {figure}, " \
                                                          f"the family counts {label}"
                introduced += doc.name == "README.md"
    assert introduced, f"README.md never gives `{name}`'s parameter count ({label} parameters)"
    header = (REPO / "recipes" / "configs" / name).read_text(encoding="utf-8").splitlines()[0]
    assert [f.replace(" ", "") for f in FIGURE.findall(header)] == [label], header
    cfg = load_config(REPO / "recipes" / "configs" / name,
                      ["cost.plan_model=", "cost.plan_options=[{accelerator: tpu-v6e, mfu: 0.4}]"])
    model, _, _, _ = plan(cfg, None, rate=UsdRubRate(100.0, dt.date.today(), "test"))
    assert params_label(model.params) == label


def test_the_demos_plan_is_the_shipped_1b_model_with_the_count_the_docs_give_it() -> None:
    """The demo prices a real run: the 1b preset at the shipped 1B config's vocabulary, so its plan's title carries
    the parameter count README.md gives that config (not the preset at the demo tokenizer's 4,000 pieces)."""
    cfg = load_config(REPO / "recipes" / "configs" / "demo.yaml",
                      ["cost.plan_options=[{accelerator: tpu-v6e, mfu: 0.4}]"])
    shipped = load_config(REPO / "recipes" / "configs" / "ru-1b-fineweb2-v6e-8.yaml")
    model, _, _, _ = plan(cfg, None, rate=UsdRubRate(100.0, dt.date.today(), "test"))
    assert (model.label, model.vocab_size) == (shipped.model.preset, shipped.tokenizer.vocab_size)
    assert params_label(model.params) == family_label("ru-1b-fineweb2-v6e-8.yaml")
    with pytest.raises(Exception, match="cost.plan_vocab_size"):
        load_config(REPO / "recipes" / "configs" / "demo.yaml", ["cost.plan_vocab_size=-1"])
