"""The XLA flags of every JAX process of the test session: CPU compiles that cost a fraction of the default's.

The tests compile hundreds of tiny programs and run each a few times, so XLA:CPU's compile time is most of
the suite's time. Two backend settings together cut it 6-7x on a tiny train step (3 s to 0.45 s, jax 0.10.2,
2 cores): LLVM without optimisation passes (alone: 3 s to 1.6-2 s) and the older per-fusion IR emitters
instead of the MLIR fusion emitters (alone: no gain). Neither changes the HLO the tests' code produces or
the HLO passes run on it (fusion, layout, buffer assignment): the programs compute what they did (to the
rounding of another code generator), in machine code LLVM has not tuned for speed. tests/conftest.py sets them for the session; the subprocesses the tests
start inherit them, and those that set XLA_FLAGS themselves add theirs to these (``with_fast_cpu_compile``).
A jaxlib that no longer knows one of them stops at start-up with "Unknown flag in XLA_FLAGS": drop it here.
"""

from __future__ import annotations

FAST_CPU_COMPILE = ("--xla_backend_optimization_level=0", "--xla_cpu_use_fusion_emitters=false")


def with_fast_cpu_compile(flags: str) -> str:
    """``flags`` (an XLA_FLAGS value) with FAST_CPU_COMPILE added, each once; flags already given stay as they are."""
    given = flags.split()
    names = {flag.split("=", 1)[0] for flag in given}
    return " ".join(given + [flag for flag in FAST_CPU_COMPILE if flag.split("=", 1)[0] not in names])
