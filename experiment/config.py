"""Typed experiment config: one YAML file per experiment plus dotted ``key=value`` overrides.

The schema is a tree of dataclasses (``experiment.schema.ExperimentConfig``). Loading walks the
YAML against it, so an unknown key or a value of the wrong type fails at once with the dotted key
and, for a typo, the nearest valid key. Strings may use ``${VAR}`` or ``${VAR:-default}`` so that
paths such as the shared benchmark folder can come from the environment.

A credential read that way (a variable ``is_secret_var`` names, by its name or its value's shape:
``${WANDB_API_KEY}``, ``${HF_TOKEN}``, ``${DATABASE_URL}`` holding a password) is
the value the running code sees, but every record of the config (``to_dict``, ``dump_yaml``: the run
folder's ``config.resolved.yaml`` and ``configs/`` copies, the W&B config) keeps the text as written.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import datetime
import difflib
import math
import os
import re
import types
import typing
from pathlib import Path
from typing import Any, Literal, get_args, get_origin, get_type_hints

import yaml

from experiment.batch_split import BatchSplit
from experiment.errors import ConfigError, echo
from experiment.presets import preset_fields
from experiment.schema import ExperimentConfig
from experiment.sections.model import family_axis_rules, model_section_class
from experiment.sections.train import BASE_MESH_AXES, CONTEXT_AXIS, TrainConfig
from experiment.sweep import AnnealConfig, select_variant, variant_experiment_name

_ENV_PATTERN = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
# Variables that hold credentials, by name (case-insensitive): any name containing TOKEN, SECRET, PASSWORD,
# PASSWD, PASSPHRASE, CREDENTIAL, PRIVATE or APIKEY, ending in KEY or KEY_ID, or with KEY(S), PAT, PASS, AUTH, DSN or
# COOKIE as one of its _-separated words: WANDB_API_KEY, HF_TOKEN, AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY,
# GOOGLE_APPLICATION_CREDENTIALS, GCP_SA_KEY, PRIVATE_KEY_PEM, GH_PAT, DB_PASS, SENTRY_DSN. And by value, whatever the
# name: a URL with user information (postgres://user:password@host, https://token@host: DATABASE_URL) or a PEM
# private key. Broad on purpose: a name wrongly taken for one only costs the record its value (reloading expands it).
_SECRET_VAR = re.compile(r"TOKEN|SECRET|PASSWORD|PASSWD|PASSPHRASE|CREDENTIAL|PRIVATE|APIKEY|KEY$|KEY_ID$",
                         re.IGNORECASE)
_SECRET_WORDS = frozenset({"KEY", "KEYS", "PAT", "PASS", "AUTH", "DSN", "COOKIE"})
_SECRET_VALUE = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/?#\s@]+@|-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----")
# expanded string -> the text as written, for every string a credential went into (this process's loads)
_SECRET_EXPANSIONS: dict[str, str] = {}
# a credential's value -> its reference, to hide it inside strings made from such a string
_SECRET_VALUES: dict[str, str] = {}


def is_secret_var(name: str, value: str = "") -> bool:
    """Whether the environment variable ``name`` (holding ``value``) holds a credential that no file may record."""
    return (_SECRET_VAR.search(name) is not None or not _SECRET_WORDS.isdisjoint(name.upper().split("_"))
            or _SECRET_VALUE.search(value) is not None)


def expand_env(text: str, key: str) -> str:
    """Replace ``${VAR}`` / ``${VAR:-default}``; an unset variable without a default is an error."""
    secrets: list[tuple[str, str]] = []

    def substitute(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        value = os.environ.get(name)
        if value is not None and value != "":
            if is_secret_var(name, value):
                secrets.append((value, f"${{{name}}}"))
            return value
        if default is not None:
            return default
        raise ConfigError(f"config key '{key}': environment variable {name} is not set and has no default")

    expanded = _ENV_PATTERN.sub(substitute, text)
    if secrets:
        _SECRET_EXPANSIONS[expanded] = text
        _SECRET_VALUES.update(secrets)
    return expanded


def redact(value: Any) -> Any:
    """``value`` (a string, or mappings and lists of them) as it may be written down: every string that
    a credential from the environment went into back to its ``${VAR}`` text, any other credential value
    inside a string replaced by its ``${VAR}``."""
    if isinstance(value, str):
        if value in _SECRET_EXPANSIONS:
            return _SECRET_EXPANSIONS[value]
        for secret, reference in _SECRET_VALUES.items():
            value = value.replace(secret, reference)
        return value
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return type(value)(redact(v) for v in value)
    return value


def _type_name(tp: Any) -> str:
    return getattr(tp, "__name__", None) or str(tp).replace("typing.", "")


def _shaped_like(value: Any, tp: Any) -> bool:
    """Whether ``value`` is of the kind the annotation ``tp`` takes (whatever its range or fields)."""
    if tp is float:
        if isinstance(value, str):  # YAML 1.1 reads "3e-4" (and "nan") as a string: the float branch takes it
            try:
                float(value)
            except ValueError:
                return False
            return True
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if dataclasses.is_dataclass(tp) or get_origin(tp) is dict:
        return isinstance(value, dict)
    return False


def _coerce(value: Any, tp: Any, key: str) -> Any:
    """Check ``value`` against the annotation ``tp`` and convert where the conversion is lossless."""
    origin = get_origin(tp)
    if tp is Any:
        return value
    if origin in (typing.Union, types.UnionType):
        members = get_args(tp)
        if value is None and type(None) in members:
            return None
        errors: list[tuple[Any, str]] = []
        for member in members:
            if member is type(None):
                continue
            try:
                return _coerce(value, member, key)
            except ConfigError as exc:
                errors.append((member, str(exc)))
        # a value of one member's kind (a number for float, a mapping for a section) is refused by that member's
        # own line: "expected a finite number, got nan" says more than "fits none of float | ContractRate"
        meant = [text for member, text in errors if _shaped_like(value, member)]
        if len(errors) == 1 or len(meant) == 1:
            raise ConfigError((meant or [errors[0][1]])[0])
        raise ConfigError(f"config key '{key}': {echo(value)} fits none of {_type_name(tp)}")
    if origin is Literal:
        allowed = get_args(tp)
        if value not in allowed:
            near = difflib.get_close_matches(value, [str(a) for a in allowed], n=1) if isinstance(value, str) else []
            hint = f" (did you mean '{near[0]}'?)" if near else ""
            raise ConfigError(f"config key '{key}': {echo(value)} is not one of {list(allowed)}{hint}")
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}': expected a mapping, got {type(value).__name__}")
        return build_dataclass(tp, value, key)
    if origin in (list, tuple):
        if not isinstance(value, (list, tuple)):
            raise ConfigError(f"config key '{key}': expected a list, got {type(value).__name__} {echo(value)}")
        (item_tp, *_rest) = get_args(tp) or (Any,)
        items = [_coerce(v, item_tp, f"{key}[{i}]") for i, v in enumerate(value)]
        return items if origin is list else tuple(items)
    if origin is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"config key '{key}': expected a mapping, got {type(value).__name__}")
        key_tp, val_tp = get_args(tp) or (Any, Any)
        return {_coerce(k, key_tp, key): _coerce(v, val_tp, f"{key}.{k}") for k, v in value.items()}
    if tp is bool:
        if isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}': expected true or false, got {echo(value)}")
    if tp is int:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
        raise ConfigError(f"config key '{key}': expected an integer, got {echo(value)}")
    if tp is float:
        number: float | None = None
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            number = float(value)
        elif isinstance(value, str):  # YAML 1.1 reads "3e-4" as a string
            with contextlib.suppress(ValueError):
                number = float(value)
        if number is None:
            raise ConfigError(f"config key '{key}': expected a number, got {echo(value)}")
        # NaN fails every range check (each comparison is false) and inf passes most: neither is a setting
        if not math.isfinite(number):
            raise ConfigError(f"config key '{key}': expected a finite number, got {echo(value)}")
        return number
    if tp is str:
        if isinstance(value, str):
            return expand_env(value, key)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, datetime.date):  # YAML reads an unquoted 2025-01-01 as a date
            return value.isoformat()
        raise ConfigError(f"config key '{key}': expected a string, got {echo(value)}")
    raise ConfigError(f"config key '{key}': unsupported annotation {tp!r} in the schema")


def build_dataclass(cls: type, data: dict[str, Any], prefix: str = "") -> Any:
    """Build ``cls`` from a mapping; every key must be a field, every required field present."""
    hints = get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, value in data.items():
        dotted = f"{prefix}.{name}" if prefix else str(name)
        if name not in fields:
            valid = sorted(fields)
            near = difflib.get_close_matches(str(name), valid, n=1, cutoff=0.5)
            hint = f"; did you mean '{(prefix + '.') if prefix else ''}{near[0]}'?" if near else ""
            raise ConfigError(f"unknown config key '{dotted}'{hint} (valid keys here: {', '.join(valid)})")
        kwargs[name] = _coerce(value, hints[name], dotted)
    for name, f in fields.items():  # defaults may read the environment too (e.g. the shared data folder)
        dotted = f"{prefix}.{name}" if prefix else name
        if name not in kwargs and isinstance(f.default, str) and "${" in f.default:
            kwargs[name] = expand_env(f.default, dotted)
        elif (name not in kwargs and dataclasses.is_dataclass(hints[name])
              and f.default_factory is not dataclasses.MISSING):
            # an absent section is built here like a present one: its defaults are expanded (once, at
            # load; no stage expands again) and validated
            kwargs[name] = build_dataclass(hints[name], {}, dotted)
    missing = [
        n for n, f in fields.items()
        if n not in kwargs and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    if missing:
        where = f" in '{prefix}'" if prefix else ""
        raise ConfigError(f"missing required config key{where}: {', '.join(missing)}")
    obj = cls(**kwargs)
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate(prefix)
    return obj


def yaml_problem(exc: yaml.YAMLError) -> str:
    """What the YAML parser objects to, on one line: the problem and where it is (line and column from 1)."""
    mark = getattr(exc, "problem_mark", None)
    problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
    if mark is None:
        return problem
    where = f"line {mark.line + 1}, column {mark.column + 1}: {problem}"
    context, start = getattr(exc, "context", None), getattr(exc, "context_mark", None)
    if context and start is not None and start.line != mark.line:  # e.g. the '[' a list left open
        where += f" ({context} that starts at line {start.line + 1}, column {start.column + 1})"
    return where


# YAML aliases let a few lines hold billions of values ("billion laughs"), which every walk over the config (type
# checks, copies, records, an error quoting a value) would then visit. What aliases may add to a document: far
# above a shared list or mapping reused in a few places, far below what those walks notice.
MAX_ALIAS_VALUES = 10_000
# nesting deeper than any section, sweep or mixture needs; the checks and copies of the tree recurse into it
MAX_YAML_DEPTH = 32


class YAMLTooLarge(yaml.YAMLError):
    """A YAML document whose aliases add more than MAX_ALIAS_VALUES values, or nested beyond MAX_YAML_DEPTH."""


def _expanded_values(node: yaml.Node, depth: int, sizes: dict[int, int], open_nodes: set[int]) -> int:
    """How many values ``node`` holds once every alias is expanded: each node counted once per use, measured
    once (``sizes``, by node: an alias is the node of its anchor)."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_nodes:
        raise YAMLTooLarge("an alias refers to the anchor it is inside (a document that never ends)")
    if depth > MAX_YAML_DEPTH:
        raise YAMLTooLarge(f"values nested more than {MAX_YAML_DEPTH} levels deep")
    children: list[yaml.Node] = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [part for pair in node.value for part in pair]
    open_nodes.add(id(node))
    sizes[id(node)] = total = 1 + sum(_expanded_values(child, depth + 1, sizes, open_nodes) for child in children)
    open_nodes.discard(id(node))
    return total


def load_yaml_text(text: str) -> Any:
    """``yaml.safe_load`` of ``text``, refusing (``YAMLTooLarge``) a document whose aliases add more than
    MAX_ALIAS_VALUES values or that nests beyond MAX_YAML_DEPTH, before anything is built from it."""
    loader = yaml.SafeLoader(text)
    try:
        try:
            node = loader.get_single_node()
        except RecursionError:  # the composer recurses once per level: deeper than the interpreter allows
            raise YAMLTooLarge(f"values nested more than {MAX_YAML_DEPTH} levels deep") from None
        if node is None:
            return None
        sizes: dict[int, int] = {}
        added = _expanded_values(node, 0, sizes, set()) - len(sizes)  # the values only aliases hold
        if added > MAX_ALIAS_VALUES:
            raise YAMLTooLarge(f"its aliases expand to {added:,} more values (at most {MAX_ALIAS_VALUES:,}); write "
                               "the values out instead of repeating anchors")
        return loader.construct_document(node)
    finally:
        loader.dispose()


def parse_override(text: str) -> tuple[list[str], Any]:
    if "=" not in text:
        raise ConfigError(f"override '{text}' is not of the form key.sub=value")
    key, raw = text.split("=", 1)
    if not key or any(not part for part in key.split(".")):
        raise ConfigError(f"override '{text}' has an empty key part")
    try:
        value = load_yaml_text(raw) if raw != "" else ""
    except YAMLTooLarge as exc:
        raise ConfigError(f"override '{key}': the value is refused: {exc}") from None
    except yaml.YAMLError as exc:  # the value is read as YAML: a list [a, b], a mapping {k: v}, a number
        raise ConfigError(f"override '{text}': the value is not valid YAML ({yaml_problem(exc)}); "
                          "quote a string that holds YAML syntax") from exc
    except (ValueError, OverflowError) as exc:  # a scalar YAML types but cannot build: a date of month 13
        raise ConfigError(f"override '{text}': the value is not a valid {yaml_scalar_kind(raw)} ({exc})") from exc
    return key.split("."), value


def yaml_scalar_kind(raw: str) -> str:
    """What YAML took ``raw`` for (the override's error names it)."""
    return "date (YYYY-MM-DD)" if re.fullmatch(r"\s*\d{4}-\d\d?-\d\d?.*", raw) else "YAML scalar"


def apply_override(tree: dict[str, Any], path: list[str], value: Any) -> None:
    node = tree
    for part in path[:-1]:
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            raise ConfigError(f"override '{'.'.join(path)}': '{part}' is not a section")
        node = child
    node[path[-1]] = value


def load_yaml(path: str | os.PathLike[str]) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    try:
        data = load_yaml_text(path.read_text(encoding="utf-8"))
    except YAMLTooLarge as exc:
        raise ConfigError(f"config file {path} is refused: {exc}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {path} is not valid YAML: {yaml_problem(exc)}") from exc
    except (ValueError, OverflowError) as exc:  # a scalar YAML types but cannot build: a date of month 13
        raise ConfigError(f"config file {path}: a value YAML reads as a date or number is not a valid one ({exc}); "
                          "quote it if it is text") from exc
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path} must hold a mapping at the top level")
    return data


# keys that no longer exist -> what to set instead (one line, not a "did you mean" guess)
REMOVED_KEYS = {
    "shards.seq_len": "the sequence length is model.max_seq_len (one knob for shards, training, eval and the planner)",
    "cost.plan_seq_len": "the planner uses the planned model's own length: model.max_seq_len, a preset's or an "
                         "anchor's",
}


def explicit_keys(tree: dict[str, Any], prefix: str = "") -> set[str]:
    """Dotted keys the YAML and the overrides set (mappings are walked, any other value is a leaf)."""
    keys: set[str] = set()
    for name, value in tree.items():
        dotted = f"{prefix}.{name}" if prefix else str(name)
        keys.add(dotted)
        if isinstance(value, dict):
            keys |= explicit_keys(value, dotted)
    return keys


def resolve_model_tree(model_tree: dict[str, Any], explicit: set[str], family: str = "llama") -> dict[str, Any]:
    """The model section with its preset's fields (``family``'s) filled in where the user set no key."""
    preset = model_tree.get("preset")
    if not preset:
        return model_tree
    if not isinstance(preset, str):
        raise ConfigError(f"config key 'model.preset': expected a preset name, got {echo(preset)}")
    filled = {name: value for name, value in preset_fields(preset, family).items() if f"model.{name}" not in explicit}
    return {**model_tree, **filled}


def variant_anneal(experiment: dict[str, Any]) -> AnnealConfig | None:
    """A variant's ``experiment.anneal`` built as its section (checked as at load), to expand its runs from before
    the tree is built; None where the tree selects no variant or declares no anneal comparison."""
    anneal = experiment.get("anneal")
    if anneal is None or not experiment.get("variant"):
        return None
    if not isinstance(anneal, dict):
        raise ConfigError(f"config key 'experiment.anneal': expected a mapping, got {echo(anneal)}")
    return build_dataclass(AnnealConfig, anneal, "experiment.anneal")


def apply_variant(tree: dict[str, Any]) -> dict[str, Any]:
    """The tree of the variant ``experiment.variant`` names (experiment.sweep): its overrides applied, its
    name ``<sweep>-<variant>`` and its W&B group the sweep's (the same when a resolved config is reloaded)."""
    experiment = tree.get("experiment")
    variant = select_variant(experiment, variant_anneal(experiment)) if isinstance(experiment, dict) else None
    if variant is None:
        return tree
    tree = copy.deepcopy(tree)
    for key, value in variant.overrides.items():
        apply_override(tree, key.split("."), value)
    sweep = str(experiment.get("group") or experiment.get("name") or "")
    tree["experiment"].update(group=sweep, name=variant_experiment_name(sweep, variant.name))
    return tree


def build_config(tree: dict[str, Any]) -> ExperimentConfig:
    """The typed, resolved config of a YAML tree (overrides applied): presets merged, family's model
    section built, every section and every cross-section rule checked."""
    tree = apply_variant(tree)
    explicit = explicit_keys(tree)
    for key, instead in REMOVED_KEYS.items():
        if key in explicit:
            raise ConfigError(f"config key '{key}' was removed: {instead}")
    model_tree = tree.get("model") if tree.get("model") is not None else {}
    if not isinstance(model_tree, dict):
        raise ConfigError(f"config key 'model': expected a mapping, got {type(model_tree).__name__}")
    family = model_tree.get("family", "llama")
    if not isinstance(family, str):
        raise ConfigError(f"config key 'model.family': expected a family name, got {echo(family)}")
    model_cls = model_section_class(family)
    model = build_dataclass(model_cls, resolve_model_tree(model_tree, explicit, family), "model")
    cfg = build_dataclass(ExperimentConfig, {k: v for k, v in tree.items() if k != "model"})
    cfg.model = model
    cfg.explicit_keys = frozenset(explicit)
    check_sections(cfg)
    return cfg


def check_sections(cfg: ExperimentConfig) -> None:
    """Every rule that spans two sections, checked once at load (a section's own rules are its validate)."""
    check_context_axis(cfg)
    family_rules = family_axis_rules(cfg.model.family)
    unknown = sorted(set(cfg.train.mesh.rules) - set(family_rules))
    if unknown:
        raise ConfigError(f"config key 'train.mesh.rules': unknown logical axes {unknown} for the {cfg.model.family} "
                          f"family (its parameters and activations use: {', '.join(sorted(family_rules))})")
    run_rules = {**family_rules, **cfg.train.mesh.rules}
    cfg.train.mesh.axes = family_mesh_axes(cfg.train.mesh.axes, run_rules, cfg.model.family)
    check_batch_split(cfg.train, run_rules.get("batch", []))
    check_batch_tokens(cfg)
    if cfg.model.attention == "cudnn" and cfg.train.compute_dtype != "bfloat16":
        raise ConfigError("config key 'model.attention': cudnn flash attention needs train.compute_dtype=bfloat16, "
                          f"got {cfg.train.compute_dtype}; use auto")


def check_context_axis(cfg: ExperimentConfig) -> None:
    """``train.mesh.axes.context`` splits each sequence (model/context.py): it lays the logical axis ``length`` out
    on the context axis (unless train.mesh.rules does), and a split needs a family whose decoder implements it and
    a sequence that cuts into its 2 x context load-balanced chunks."""
    mesh = cfg.train.mesh
    if CONTEXT_AXIS not in mesh.axes:
        return
    mesh.rules.setdefault("length", [CONTEXT_AXIS])
    parts = mesh.axes[CONTEXT_AXIS]
    if parts == 1:
        return
    if not getattr(type(cfg.model), "CONTEXT_PARALLEL", False):
        raise ConfigError(f"config key 'train.mesh.axes.{CONTEXT_AXIS}': context parallelism is built for the llama "
                          f"family's attention (llama, mistral, qwen2, qwen3), not {cfg.model.family}; use 1")
    if cfg.model.max_seq_len % (2 * parts):
        raise ConfigError(f"config key 'train.mesh.axes.{CONTEXT_AXIS}': context parallelism over {parts} devices "
                          f"cuts a sequence into {2 * parts} load-balanced chunks, but model.max_seq_len "
                          f"{cfg.model.max_seq_len} is not divisible by {2 * parts}")


def family_mesh_axes(sized: dict[str, int], run_rules: dict[str, list[str]], family: str) -> dict[str, int]:
    """``train.mesh.axes`` resolved: the axes it sizes, then every other mesh axis beyond data/fsdp/tensor that
    the run's rules (the family's under ``train.mesh.rules``) lay a logical axis out on, at size 1. An axis sized
    there that no rule uses is an error (it would split nothing and only multiply the devices needed)."""
    used = [axis for axes in run_rules.values() for axis in axes if axis not in BASE_MESH_AXES]
    for axis in sized:
        if axis not in used:
            uses = sorted(set(used))
            raise ConfigError(f"config key 'train.mesh.axes.{axis}': no logical axis of the {family} family is laid "
                              f"out on mesh axis '{axis}' (with train.mesh.rules; its rules use "
                              f"{', '.join([*BASE_MESH_AXES, *uses])})")
    return {**sized, **{axis: 1 for axis in used if axis not in sized}}


def check_batch_split(train: TrainConfig, batch_axes: list[str]) -> None:
    """The micro-batch divides the mesh axes that split the batch, as far as train.mesh fixes their sizes
    (``data: -1`` is known once the devices are: trainer/step.py checks it then). Checked at load, or the
    mesh would be refused first, blaming the device count for the batch."""
    mesh = train.mesh
    # data: -1 is a multiple of dcn_data (per-slice data parallelism times the slices)
    sizes = {"data": mesh.dcn_data * (mesh.data if mesh.data != -1 else 1), "fsdp": mesh.fsdp, "tensor": mesh.tensor,
             **mesh.axes}
    split = BatchSplit(train.batch_size, train.grad_accum_steps,
                       {axis: sizes[axis] for axis in batch_axes if sizes.get(axis, 1) > 1})
    if not split.even:
        axes, parts = list(split.axis_sizes), split.parts
        what = (f"the {axes[0]} axis size {parts}" if len(axes) == 1 else
                f"the {' x '.join(axes)} axis sizes {' x '.join(map(str, split.axis_sizes.values()))} = {parts}")
        raise ConfigError(f"config key 'train.batch_size': the micro-batch of {split.micro} sequences (batch_size / "
                          f"grad_accum_steps) is not divisible by {what}, the mesh axes that split the batch "
                          "(train.mesh); change the batch or the mesh")


# The most tokens one step may hold (train.batch_size x model.max_seq_len): 2^28, whose int32 ids alone take 1 GiB of
# host memory before the step starts; the shipped configs' largest step is about a hundredth of it. A batch of
# millions of sequences is a typo, and unchecked it grinds in the loader for minutes before anything says so.
MAX_BATCH_TOKENS = 2**28


def check_batch_tokens(cfg: ExperimentConfig) -> None:
    tokens = cfg.train.batch_size * cfg.model.max_seq_len
    if tokens > MAX_BATCH_TOKENS:
        raise ConfigError(f"config key 'train.batch_size': {cfg.train.batch_size:,} sequences x model.max_seq_len "
                          f"{cfg.model.max_seq_len:,} = {tokens:,} tokens a step, more than the {MAX_BATCH_TOKENS:,} "
                          f"(2^28) a step may hold: its token ids alone would take {tokens * 4 / 2**30:,.0f} GiB of "
                          "host memory")


def load_config(path: str | os.PathLike[str], overrides: list[str] | tuple[str, ...] = ()) -> ExperimentConfig:
    """Load an experiment YAML, apply ``key.sub=value`` overrides, resolve presets and type-check."""
    tree = load_yaml(path)
    for text in overrides:
        key_path, value = parse_override(text)
        apply_override(tree, key_path, value)
    return build_config(tree)


def to_dict(cfg: ExperimentConfig) -> dict[str, Any]:
    """The config as a plain tree to record: credentials from the environment as their ``${VAR}`` (``redact``)."""
    return redact(dataclasses.asdict(cfg))


def dump_yaml(cfg: ExperimentConfig) -> str:
    return yaml.safe_dump(to_dict(cfg), allow_unicode=True, sort_keys=False)
