"""What this machine's CPU can do: whether it multiplies bfloat16 in hardware, and the one
warning line of a bfloat16 setting where it does not. Used by the Lightning commands
(:mod:`seq2seq.cli.environment`) and by ``translate``; imports nothing of seq2seq."""

from __future__ import annotations

import sys
from pathlib import Path


def cpu_has_bfloat16_instructions(cpuinfo: str | Path = "/proc/cpuinfo") -> bool | None:
    """Whether the CPU lists AVX512-BF16 or AMX among its flags (``None``: cannot tell, e.g.
    no ``/proc/cpuinfo`` outside Linux)."""
    try:
        flags = Path(cpuinfo).read_text(errors="replace").split()
    except OSError:
        return None
    return "avx512_bf16" in flags or "amx_bf16" in flags


def emulated_bfloat16(setting: str, instead: str) -> str | None:
    """The warning for ``setting`` (bfloat16 on the CPU) where the CPU lacks bfloat16
    instructions (no AVX512-BF16 or AMX) and oneDNN emulates them, naming the float32
    ``instead``; ``None`` where the CPU has them or ``/proc/cpuinfo`` cannot tell. Decoding the
    README model in bfloat16 on a 2-core AMD EPYC without AVX-512 took 4.6x (greedy) and 5.1x
    (beam 5) as long as in float32, on 200 sentences of test_2016_flickr."""
    if cpu_has_bfloat16_instructions() is not False:
        return None
    return (
        f"{setting} on a CPU without bfloat16 instructions (no avx512_bf16 or amx_bf16 in "
        f"/proc/cpuinfo): they are emulated and run several times slower than {instead}"
    )


#: Matches the warnings of :func:`emulated_bfloat16` (the console script prints its own line).
EMULATED_BFLOAT16 = r".* on a CPU without bfloat16 instructions"


def warn_emulated_bfloat16(setting: str, instead: str) -> None:
    """:func:`emulated_bfloat16` as one ``seq2seq: warning:`` line on stderr (the command
    line's settings)."""
    message = emulated_bfloat16(setting, instead)
    if message:
        print(f"seq2seq: warning: {message}", file=sys.stderr)
