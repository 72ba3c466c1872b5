"""Where a run's numbers come from: the hardware and the kernels that decide its bits.

The same code, config and seed give bit-identical training only on the same
floating-point environment: the torch build, and the kernels it picks for
the device. On CPU, ATen picks its kernels by the processor's instruction
set (``torch.backends.cpu.get_cpu_capability()``; the ``ATEN_CPU_CAPABILITY``
environment variable overrides it) and the BLAS library by the processor;
on CUDA, by the GPU. Another environment sums in another order, a weight's
last bit changes, and a long training turns that into another model of the
same quality (measured on the bundled mixer: up to 1.6 points of accuracy
for one seed, ``docs/results/nm/p-followup``). Runs, checkpoints and
results pages record :func:`numerics` so that such runs are never compared
or resumed as if they were the same.
"""

from __future__ import annotations

import functools
import platform
from pathlib import Path

import torch

__all__ = ["cpu_model", "numerics"]


@functools.cache  # read once: every checkpoint and every reused bench run asks
def cpu_model() -> str:
    """The processor's model name (``/proc/cpuinfo``), else what :mod:`platform` says."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def numerics(device: torch.device | str = "cpu") -> str:
    """One line naming the floating-point environment of work on ``device``.

    Two runs whose lines differ may differ in every bit; two runs whose lines
    agree (with the same code, config and seed) agree to the bit.

    Args:
        device: the device the work runs on.

    Example:
        >>> numerics("cpu")  # doctest: +SKIP
        'torch 2.13.0+cpu, CPU Intel(R) Xeon(R) Processor, AVX512 kernels'
    """
    device = torch.device(device)
    if device.type == "cuda":
        kernels = f"CUDA {torch.cuda.get_device_name(device)}"
    else:
        kernels = f"CPU {cpu_model()}, {torch.backends.cpu.get_cpu_capability()} kernels"
    return f"torch {torch.__version__}, {kernels}"
