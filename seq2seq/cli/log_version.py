"""Where a resumed ``fit`` logs: the TensorBoard version folder of the run it resumes."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from lightning.pytorch.utilities.rank_zero import rank_zero_only

from seq2seq.checkpoint.format import CHECKPOINT_KEY
from seq2seq.files import local_folder


def continue_log_version(config, checkpoint: dict, path: str | Path | None = None) -> None:
    """A resumed ``fit`` logs into the version folder of the run it resumes
    (``lightning_logs/<name>/version_N``), as fairseq's TensorBoard folder continues, instead of
    a new ``version_N+1``: the configured TensorBoard logger, if it has the name the checkpoint
    recorded and no version of its own; under another name it warns (one line, global rank 0)
    and logs into a new version of that name. (Each process writes event files of its own, so
    nothing is overwritten; Lightning's CSV logger would rewrite ``metrics.csv``, so a CSV
    logger keeps starting a new version.)

    A copy of a run's checkpoint folder (``path``, the checkpoint resumed, lies in another
    folder than the one the checkpoint records, which still exists) is another run: it logs
    into a new version, with a note, not into the version of the run it was copied from.
    """
    saved = (checkpoint.get(CHECKPOINT_KEY) or {}).get("log") or {}
    logger = config.get("trainer", {}).get("logger")
    if not saved or not hasattr(logger, "get") or not hasattr(logger.get("init_args"), "get"):
        return
    class_path = str(logger.get("class_path", ""))
    if class_path.rsplit(".", 1)[-1] != "TensorBoardLogger":
        return
    init_args = logger["init_args"]
    name = init_args.get("name") or "lightning_logs"
    if init_args.get("version") is not None:
        return
    run = f"{saved.get('name')}/version_{saved.get('version')}"
    written_in = saved.get("checkpoint_dir")
    here = local_folder(Path(path).parent) if path is not None else None
    if written_in and here and written_in != here and os.path.isdir(written_in):
        if rank_zero_only.rank == 0:
            print(
                f"seq2seq: note: {path} is a copy of a checkpoint of {written_in}, whose run "
                f"logs to TensorBoard as {run}: this run logs as {name}, in a new version",
                file=sys.stderr,
            )
    elif name == saved.get("name"):
        init_args["version"] = saved["version"]
    elif rank_zero_only.rank == 0:  # a flag of the run left out, most likely
        print(
            f"seq2seq: warning: the run being resumed logged to TensorBoard as {run}; this one "
            f"logs as {name}, in a new version: give --trainer.logger.init_args.name "
            f"{saved.get('name')} to continue the run's folder",
            file=sys.stderr,
        )
