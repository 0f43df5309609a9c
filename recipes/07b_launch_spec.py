"""Recipe 07b: the run as a SkyPilot managed job and an xpk workload, relaunched after preemption (see
trainer/launch_spec.py)."""

import sys
from pathlib import Path

from experiment.check import run_stage_checks
from experiment.config import load_config
from experiment.errors import RecipeError
from experiment.plugins import load_plugins
from experiment.runfolder import RunFolder
from experiment.stages import PLAN
from tracking.harness import make_parser
from trainer.launch_spec import DEFAULT_MAX_RESTARTS, DEFAULT_XPK_MAX_RESTARTS, write_launch_files


def main(argv: list[str] | None = None) -> None:
    """The recipe; ``argv`` is its command line without the program name (tests call this in process)."""
    parser = make_parser("Write the SkyPilot managed-job task and the xpk workload command that run recipe 04 on "
                         "an option of the cost plan and relaunch it after preemption, errors and hangs")
    parser.add_argument("--option", type=int, default=None,
                        help="the index of cost.plan_options to run on (as recipe 07 lists them); default: the "
                             "config's own cost.accelerator, cost.chips and cost.pricing")
    parser.add_argument("--out", default=None, help="folder for sky_task.yaml and xpk_workload.sh "
                                                    "(default: runs/launch/<experiment.name>)")
    parser.add_argument("--max-restarts", type=int, default=DEFAULT_MAX_RESTARTS,
                        help="SkyPilot: restarts after a failed run (a crash, a hang the watchdog ended) before the "
                             "job fails (preemptions do not count)")
    parser.add_argument("--xpk-max-restarts", type=int, default=DEFAULT_XPK_MAX_RESTARTS,
                        help="xpk: restarts of the JobSet before it fails, preemptions included")
    args = parser.parse_args(argv)
    try:
        load_plugins()
        cfg = load_config(args.config, args.overrides)
        # what recipe 07 checks of the plan (accelerator, pricing, options, the batch on each slice), before writing
        run_stage_checks(PLAN, cfg, RunFolder.for_config(cfg))
        out = Path(args.out) if args.out else Path("runs") / "launch" / cfg.experiment.name
        files = write_launch_files(cfg, args.config, list(args.overrides), out, args.option, args.max_restarts,
                                   args.xpk_max_restarts)
    except RecipeError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
    target = files.target
    print(f"{target.chips} x {target.accelerator} ({target.pricing}, {target.key}), {target.hosts} host(s):")
    if files.sky_task is not None:
        print(f"  SkyPilot: sky jobs launch {files.sky_task} --secret WANDB_API_KEY")
    if files.xpk_script is not None:
        print(f"  xpk (GKE): XPK_CLUSTER=... XPK_PROJECT=... XPK_ZONE=... {files.xpk_script}")
    for note in files.notes:
        print(f"  note: {note}")


if __name__ == "__main__":
    main()
