"""Relaunch through an existing engine: recipe 04 as a SkyPilot managed job, or as an xpk workload on GKE.

A spot slice is taken away, a host dies, a step hangs: something has to recreate the machines and run the same
command again, which resumes from the run folder's latest checkpoint (docs/launch.md, section 3). That something
is not a shell loop on one of the machines it is meant to replace. This module writes the job for two engines that
do it, from the run's config and the option of its cost plan it is to run on (``cost.accelerator`` / ``chips`` /
``pricing`` of the config, or one of ``cost.plan_options``):

- a SkyPilot managed-job task (``sky jobs launch <file>``): the option's accelerators (a Cloud TPU slice is one
  SkyPilot node whose ``run`` runs on every host of the slice; GPUs are nodes of 8), ``use_spot`` for spot pricing,
  ``job_recovery`` (SkyPilot's default strategy, ``EAGER_NEXT_REGION``: a preempted cluster is terminated and
  relaunched, in another region first; ``max_restarts_on_errors`` for a failing run; ``recover_on_exit_codes``:
  the trainer's exit after a SIGTERM checkpoint, which is a preemption, never a bug; the hang watchdog's exit
  counts against ``max_restarts_on_errors``: a hang that comes back every time must not loop forever), setup (a
  venv with the project) and the per-host command with ``train.distributed=true`` where the slice has more than one
  host;
- for Cloud TPU slices, the ``xpk workload create`` command (a JobSet on a GKE cluster, restarted up to
  ``--max-restarts`` times, preemptions included; xpk restarts on exit codes 42 and 127-255 by default, which holds
  143, and fails at once on any other: the hang watchdog's 124 is added with ``--restart-on-exit-codes``).

The run folder is a bucket (``experiment.run_root``): a relaunched job runs on new machines, which find the
checkpoints, the shards and the ledger only there. ``recipes/07b_launch_spec.py`` is the command line.
"""

from __future__ import annotations

import importlib.metadata
import os
import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cost.catalog import Catalog, PriceRow
from experiment.config import ExperimentConfig, is_secret_var
from experiment.errors import ConfigError
from experiment.files import atomic_write_text
from experiment.storage import is_bucket, location
from trainer.preemption import PREEMPTED_EXIT_CODE
from trainer.watchdog import HUNG_EXIT_CODE

DEFAULT_MAX_RESTARTS = 3  # SkyPilot: restarts on errors (a crash, a hang the watchdog ended) before the job fails
# xpk: a JobSet's maxRestarts counts every restart, preemptions included, so a spot run needs room for them
DEFAULT_XPK_MAX_RESTARTS = 20
VENV = "$HOME/ru-pretrain-venv"  # written inside double quotes: the host's shell expands $HOME
PYTHON = "3.12"  # the project needs 3.11+; Cloud TPU VM images ship 3.10, so uv brings its own interpreter
COORDINATOR_PORT = 8476  # JAX's coordinator on the first GPU node (any free port)
GPUS_PER_NODE = 8


@dataclass(frozen=True)
class TpuKind:
    """How Cloud TPU names a slice of this generation (what xpk's ``--tpu-type`` and SkyPilot take)."""

    slice_prefix: str  # Cloud TPU's accelerator type: v5litepod-16, v6e-64, v5p-128, tpu7x-8
    sky_prefix: str | None  # SkyPilot's accelerator name prefix (None: SkyPilot names none)
    cores_per_chip: int  # v5p and tpu7x slices are named by TensorCores, v5e and v6e by chips
    one_host_chips: tuple[int, ...]  # the slices of one host (v5e/v6e: 1, 4 and the 8-chip VM; v5p, tpu7x: 4)


TPU_KINDS = {
    "tpu-v5e": TpuKind("v5litepod", "tpu-v5litepod", 1, (1, 4, 8)),
    "tpu-v6e": TpuKind("v6e", "tpu-v6e", 1, (1, 4, 8)),
    "tpu-v5p": TpuKind("v5p", "tpu-v5p", 2, (4,)),
    "tpu7x": TpuKind("tpu7x", None, 2, (4,)),
}
CHIPS_PER_TPU_HOST = 4  # every multi-host slice of these generations has 4 chips per host
SKY_GPUS = {"nvidia-h100": "H100", "nvidia-h200": "H200", "nvidia-b200": "B200"}  # SkyPilot's accelerator names
# an s3:// run root on the hosts (docs/launch.md, "Run folders in buckets"): the endpoint and addressing travel as
# they are set here, the keys as secrets given at launch
S3_SETTINGS = ("AWS_ENDPOINT_URL_S3", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_S3_ADDRESSING_STYLE")
S3_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")


@dataclass(frozen=True)
class LaunchTarget:
    """The option of the plan a job runs on, with the catalog row that prices it."""

    accelerator: str
    chips: int
    pricing: str
    cloud: str
    region: str  # only when the config pins one: SkyPilot may otherwise fail over to any region
    key: str  # the config key it came from (error messages)

    @property
    def spot(self) -> bool:
        return self.pricing == "spot"

    @property
    def tpu(self) -> TpuKind | None:
        return TPU_KINDS.get(self.accelerator)

    @property
    def hosts(self) -> int:
        tpu = self.tpu
        if tpu is not None:
            return 1 if self.chips <= max(tpu.one_host_chips) else self.chips // CHIPS_PER_TPU_HOST
        return max(1, self.chips // GPUS_PER_NODE)

    @property
    def tpu_slice(self) -> str:
        """Cloud TPU's name of the slice (v6e-64, v5p-128, v5litepod-16)."""
        tpu = self.tpu
        assert tpu is not None
        return f"{tpu.slice_prefix}-{self.chips * tpu.cores_per_chip}"

    def cost_overrides(self, cfg: ExperimentConfig) -> list[str]:
        """The overrides that price the session as this option, where it is not the config's own."""
        cost = cfg.cost
        wanted = {"accelerator": self.accelerator, "chips": self.chips, "pricing": self.pricing, "cloud": self.cloud}
        return [f"cost.{name}={value}" for name, value in wanted.items() if getattr(cost, name) != value]


def launch_target(cfg: ExperimentConfig, option: int | None, catalog: Catalog | None = None) -> LaunchTarget:
    """The config's own accelerator, chips and pricing, or ``cost.plan_options[option]``; checked against the
    catalog (a name or pricing it lacks is the catalog's one-line error naming the key)."""
    cost = cfg.cost
    if option is None:
        key, choice = "cost.accelerator", cost
    else:
        if not 0 <= option < len(cost.plan_options):
            raise ConfigError(f"--option {option}: cost.plan_options has {len(cost.plan_options)} option(s), "
                              f"numbered 0 to {len(cost.plan_options) - 1} as recipe 07 lists them")
        key, choice = f"cost.plan_options[{option}]", cost.plan_options[option]
    catalog = catalog or Catalog.from_config(cost)
    row: PriceRow = catalog.lookup(choice.accelerator, choice.pricing, choice.cloud, choice.region, key=key,
                                   cheapest=True)
    target = LaunchTarget(choice.accelerator, choice.chips, choice.pricing, row.cloud, choice.region, key)
    tpu = target.tpu
    if tpu is None and target.accelerator not in SKY_GPUS:
        raise ConfigError(f"config key '{key}': {target.accelerator} is not a Cloud TPU or NVIDIA GPU option; "
                          f"the launch files are written for {', '.join([*TPU_KINDS, *SKY_GPUS])}")
    if tpu is not None and (target.chips % CHIPS_PER_TPU_HOST if target.chips > max(tpu.one_host_chips)
                            else target.chips not in tpu.one_host_chips):
        raise ConfigError(f"config key '{key}': {target.chips} chips of {target.accelerator} is no Cloud TPU slice "
                          f"(one host: {', '.join(map(str, tpu.one_host_chips))} chips; more hosts: a multiple of "
                          f"{CHIPS_PER_TPU_HOST})")
    if tpu is None and target.chips > GPUS_PER_NODE and target.chips % GPUS_PER_NODE:
        raise ConfigError(f"config key '{key}': {target.chips} GPUs do not fill nodes of {GPUS_PER_NODE}")
    return target


def bucket_run_root(cfg: ExperimentConfig) -> str:
    """``experiment.run_root`` when it is a bucket; a local folder is an error (a relaunched job's new machines
    would not find the checkpoints)."""
    run_root = cfg.experiment.run_root
    if not is_bucket(location(run_root, "experiment.run_root")):
        raise ConfigError(f"config key 'experiment.run_root': {run_root!r} is a folder on this machine; a job that "
                          "is relaunched on new machines resumes only from a bucket: give "
                          "experiment.run_root=gs://<bucket>/runs (or s3://...)")
    return str(run_root)


def config_env(config_path: Path, run_root: str) -> tuple[dict[str, str], list[str]]:
    """The variables the config file names (``${NAME}`` / ``${NAME:-default}``) that are set here, with their values
    here, so every host reads the config as this machine did; ``RU_RUNS`` is the bucket. Only names the config
    refers to travel (never the environment at large: it holds credentials), and of those a credential
    (``experiment.config.is_secret_var``: HF_TOKEN, a URL with a password) travels by name only, as a secret
    given at launch: the second list."""
    names = re.findall(r"\$\{([A-Za-z_][A-Za-z0-9_]*)", config_path.read_text(encoding="utf-8"))
    named = {name: os.environ[name] for name in dict.fromkeys(names) if name in os.environ}
    secrets = [name for name, value in named.items() if is_secret_var(name, value)]
    env = {name: value for name, value in named.items() if name not in secrets}
    if "RU_RUNS" in names:
        env["RU_RUNS"] = run_root
    if run_root.startswith("s3://"):  # where an S3-compatible store is and how to address it (not its keys)
        env.update({name: os.environ[name] for name in S3_SETTINGS if name in os.environ})
    return env, secrets


def sky_secrets(run_root: str, named: list[str]) -> dict[str, None]:
    """The credentials the hosts need, as SkyPilot secrets given at launch (``--secret NAME``): never in the file;
    ``named``: those the config names (``config_env``)."""
    return dict.fromkeys(("WANDB_API_KEY", *(S3_KEYS if run_root.startswith("s3://") else ()), *named))


def jax_version() -> str:
    return importlib.metadata.version("jax")


def setup_script(target: LaunchTarget) -> str:
    """A venv with the project (``pip install -e``) on every host: jax[tpu] for a slice, jax's CUDA build for GPUs."""
    packages = "-e '.[tpu]'" if target.tpu is not None else f"-e . 'jax[cuda12]=={jax_version()}'"
    return (f"set -euo pipefail\n"
            f"command -v uv >/dev/null || curl -LsSf https://astral.sh/uv/install.sh | sh\n"
            f'export PATH="$HOME/.local/bin:$PATH"\n'
            f'uv venv --allow-existing --python {PYTHON} "{VENV}"\n'
            f'VIRTUAL_ENV="{VENV}" uv pip install {packages}\n')


def train_command(config_arg: str, run_root: str, overrides: list[str], target: LaunchTarget,
                  cfg: ExperimentConfig) -> list[str]:
    """Recipe 04's command line on each host."""
    argv = ["python", "recipes/04_pretrain.py", "--config", config_arg, f"experiment.run_root={run_root}"]
    argv += [o for o in overrides if not o.startswith("experiment.run_root=")]
    argv += target.cost_overrides(cfg)
    if target.hosts > 1:
        argv.append("train.distributed=true")
    return argv


def run_script(argv: list[str], target: LaunchTarget) -> str:
    """The per-host command: on GPU nodes JAX's coordinator is the first node (SkyPilot's variables); a Cloud
    TPU slice's hosts find each other (``jax.distributed.initialize``). ``exec``: the trainer's exit code is the
    job's, which SkyPilot's recovery reads."""
    lines = ["set -euo pipefail"]
    if target.tpu is None and target.hosts > 1:
        lines += [f'export JAX_COORDINATOR_ADDRESS="$(echo "$SKYPILOT_NODE_IPS" | head -n1):{COORDINATOR_PORT}"',
                  'export JAX_NUM_PROCESSES="$SKYPILOT_NUM_NODES" JAX_PROCESS_ID="$SKYPILOT_NODE_RANK"']
    lines.append(f'exec "{VENV}/bin/python" ' + shlex.join(argv[1:]))  # the venv's python, whatever is on PATH
    return "\n".join(lines) + "\n"


def sky_task(cfg: ExperimentConfig, target: LaunchTarget, config_arg: str, env: dict[str, str],
             overrides: list[str], max_restarts: int, file_mounts: dict[str, str],
             secrets: list[str] = ()) -> dict[str, Any]:
    """The SkyPilot task (a dict in its task YAML schema: ``sky.Task.from_yaml_config`` reads it)."""
    tpu = target.tpu
    if tpu is not None:
        if tpu.sky_prefix is None:
            raise ConfigError(f"config key '{target.key}': SkyPilot has no accelerator name for {target.accelerator}; "
                              "use the xpk workload")
        accelerators = f"{tpu.sky_prefix}-{target.chips * tpu.cores_per_chip}"
        num_nodes = 1  # SkyPilot runs `run` on every host of a TPU pod slice
    else:
        per_node = min(target.chips, GPUS_PER_NODE)
        accelerators, num_nodes = f"{SKY_GPUS[target.accelerator]}:{per_node}", target.hosts
    infra = "/".join(p for p in (target.cloud, target.region) if p)
    resources: dict[str, Any] = {
        "infra": infra, "accelerators": accelerators, "use_spot": target.spot,
        "job_recovery": {"strategy": "EAGER_NEXT_REGION", "max_restarts_on_errors": max_restarts,
                         "recover_on_exit_codes": [PREEMPTED_EXIT_CODE]},
    }
    run_root = bucket_run_root(cfg)
    task: dict[str, Any] = {
        "name": cfg.experiment.name, "workdir": ".", "num_nodes": num_nodes, "resources": resources,
        "envs": env, "secrets": sky_secrets(run_root, list(secrets)),  # given at launch (--secret): never written here
        "setup": setup_script(target),
        "run": run_script(train_command(config_arg, run_root, overrides, target, cfg), target),
    }
    if file_mounts:
        task["file_mounts"] = file_mounts
    if not env:
        del task["envs"]
    return task


def xpk_argv(cfg: ExperimentConfig, target: LaunchTarget, config_arg: str, env: dict[str, str],
             overrides: list[str], xpk_max_restarts: int) -> list[str]:
    """``xpk workload create`` for a Cloud TPU slice: the repository as the image's script folder on a Python
    image, the setup and the trainer in one command; ``$XPK_CLUSTER`` (and ``$XPK_PROJECT`` / ``$XPK_ZONE``) are
    left for the shell that runs it."""
    if target.tpu is None:
        raise ConfigError(f"config key '{target.key}': the xpk workload is written for Cloud TPU slices")
    run_root = bucket_run_root(cfg)
    command = (f"pip install -q -e '.[tpu]' && exec "
               f"{shlex.join(train_command(config_arg, run_root, overrides, target, cfg))}")
    argv = ["xpk", "workload", "create", "--cluster", "${XPK_CLUSTER}", "--project", "${XPK_PROJECT}",
            "--zone", "${XPK_ZONE}", "--workload", xpk_workload_name(cfg.experiment.name),
            "--tpu-type", target.tpu_slice, "--num-slices", "1", "--base-docker-image", f"python:{PYTHON}",
            "--script-dir", ".", "--max-restarts", str(xpk_max_restarts),
            # the watchdog's exit (a hung step or save) is below xpk's default restart codes (42, 127-255)
            "--restart-on-exit-codes", str(HUNG_EXIT_CODE), "--command", command]
    if target.spot:
        argv.append("--spot")
    for name, value in env.items():
        argv += ["--env", f"{name}={value}"]
    return argv


def xpk_workload_name(name: str) -> str:
    """A JobSet name (a Kubernetes name: lower case, digits and '-', at most 40 characters as xpk checks)."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", name.lower()).strip("-")
    return (cleaned or "ru-pretrain")[:40].rstrip("-")


def xpk_script(argv: list[str]) -> str:
    """The xpk command as a shell script; the cluster, project and zone come from the environment."""
    quoted = " ".join(f'"{a}"' if a.startswith("${XPK_") else shlex.quote(a) for a in argv)
    return ("#!/usr/bin/env bash\n"
            "# Written by recipes/07b_launch_spec.py: the run as an xpk workload (docs/launch.md)\n"
            "set -euo pipefail\n"
            ': "${XPK_CLUSTER:?the GKE cluster (xpk cluster create)}" "${XPK_PROJECT:?the project}" '
            '"${XPK_ZONE:?the zone}"\n'
            f"{quoted}\n")


class _BlockDumper(yaml.SafeDumper):
    """Multi-line strings (setup, run) as YAML literal blocks, as a person would write them."""


_BlockDumper.add_representer(str, lambda dumper, text: dumper.represent_scalar(
    "tag:yaml.org,2002:str", text, style="|" if "\n" in text else None))


@dataclass(frozen=True)
class LaunchFiles:
    sky_task: Path | None
    xpk_script: Path | None
    target: LaunchTarget
    notes: tuple[str, ...] = ()  # what was not written, or is not carried, and why


def write_launch_files(cfg: ExperimentConfig, config_path: str | os.PathLike[str], overrides: list[str],
                       out_dir: Path, option: int | None = None, max_restarts: int = DEFAULT_MAX_RESTARTS,
                       xpk_max_restarts: int = DEFAULT_XPK_MAX_RESTARTS, repo_root: Path | None = None) -> LaunchFiles:
    """Check everything, then write ``sky_task.yaml`` and (for a Cloud TPU slice) ``xpk_workload.sh``."""
    for flag, value in (("--max-restarts", max_restarts), ("--xpk-max-restarts", xpk_max_restarts)):
        if value < 0:
            raise ConfigError(f"{flag}: must be >= 0, got {value}")
    target = launch_target(cfg, option)
    run_root = bucket_run_root(cfg)
    repo_root = (repo_root or Path.cwd()).resolve()
    config_file = Path(config_path).resolve()
    file_mounts: dict[str, str] = {}
    try:
        config_arg = config_file.relative_to(repo_root).as_posix()
    except ValueError:  # a config outside the repository travels as a file mount
        config_arg = f"/tmp/ru-pretrain-config/{config_file.name}"
        file_mounts[config_arg] = str(config_file)
    env, secrets = config_env(config_file, run_root)
    task = sky_task(cfg, target, config_arg, env, overrides, max_restarts, file_mounts, secrets) if (
        target.tpu is None or target.tpu.sky_prefix is not None) else None
    argv, notes = None, []
    if target.tpu is not None and file_mounts:  # xpk's image holds the repository folder only (--script-dir .)
        notes.append(f"no xpk workload: {config_file} is outside the repository, which is all an xpk workload "
                     "carries (--script-dir .); put the config under it to get one")
    elif target.tpu is not None:
        argv = xpk_argv(cfg, target, config_arg, env, overrides, xpk_max_restarts)
        if secrets:  # an xpk command line is no place for a credential: the workload gets it from the cluster
            notes.append(f"the xpk workload does not carry {', '.join(secrets)} (credentials): give them to the "
                         "GKE workload as Kubernetes secrets")
    out_dir.mkdir(parents=True, exist_ok=True)
    sky_path = xpk_path = None
    if task is not None:
        sky_path = out_dir / "sky_task.yaml"
        header = (f"# Written by recipes/07b_launch_spec.py for {target.chips} x {target.accelerator} "
                  f"({target.pricing}, {target.key}).\n# Launch from the repository root: sky jobs launch "
                  f"{sky_path.name} --secret WANDB_API_KEY (docs/launch.md)\n")
        atomic_write_text(sky_path, header + yaml.dump(task, Dumper=_BlockDumper, sort_keys=False, allow_unicode=True))
    if argv is not None:
        xpk_path = out_dir / "xpk_workload.sh"
        atomic_write_text(xpk_path, xpk_script(argv))
        xpk_path.chmod(0o755)
    return LaunchFiles(sky_path, xpk_path, target, tuple(notes))
