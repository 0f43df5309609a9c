"""The XLA flags of every JAX process of the test session: CPU compiles that cost less than the default's.

The tests compile hundreds of tiny programs and run each a few times, so XLA:CPU's compile time is a large
part of the suite's time. LLVM without its optimisation passes compiles a tiny train step in 2.3 s instead
of 3 s (jax 0.10.2, 2 cores); the programs compute what they did (the HLO and XLA's own passes are
unchanged), in machine code LLVM has not tuned for speed. The same setting compiles every run-once program
of the package (``model.family.run_once_compile_options``), so it is the path the package itself relies on.

The default optimisation level instead (measured 2026-12-05, 2 vCPU, base-suite runs interleaved with these,
each setting on the compilation cache it had filled): 240 and 288 s against 276 s here, within this VM's
run-to-run spread, though the tests that compute most ran faster (recipe 05 three times on the fixture run,
20 items a task: 12-14 s instead of 23 s). On an empty cache it took 935 s, this setting 576 s (and 718 s in a
later run at 4 items a task: the VM's spread again). A warm cache is most runs, but a new machine's first
run is all compiles, and there the cheaper compile counts for the whole suite.

Not used, on purpose: ``--xla_cpu_use_fusion_emitters=false`` (XLA:CPU's older per-fusion IR emitters) cut
that compile further, to 1.5 s, but the first CI run with it died of a segmentation fault inside a test worker (not
reproduced in a run here; that flag was the change to the native code path since the last green CI), and a
rarely used code generator is not worth a suite that can crash. tests/conftest.py sets these flags for the
session; the subprocesses the tests start inherit them, and those that set XLA_FLAGS themselves add theirs
to these (``with_fast_cpu_compile``). A jaxlib that no longer knows a flag stops at start-up with
"Unknown flag in XLA_FLAGS": drop it here.
"""

from __future__ import annotations

FAST_CPU_COMPILE = ("--xla_backend_optimization_level=0",)


def with_fast_cpu_compile(flags: str) -> str:
    """``flags`` (an XLA_FLAGS value) with FAST_CPU_COMPILE added, each once; flags already given stay as they are."""
    given = flags.split()
    names = {flag.split("=", 1)[0] for flag in given}
    return " ".join(given + [flag for flag in FAST_CPU_COMPILE if flag.split("=", 1)[0] not in names])
