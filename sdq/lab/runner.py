"""Execute one notebook with papermill into a staging folder; one line of error if it fails.

The notebook's `Outputs(...)` writes below the staging root (passed to the kernel through
SDQ_OUTPUTS_ROOT), and papermill writes the executed notebook beside its tables. Only the
caller decides whether the staging folder becomes the real output.
"""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sdq.errors import LabError
from sdq.lab.paths import OUTPUTS_ROOT_ENV

KERNEL = "python3"
INJECTED_TAG = "injected-parameters"


@dataclass(frozen=True)
class Execution:
    seconds: float
    executed_path: Path
    cells: int  # code cells executed


def execute(
    notebook: Path,
    executed_path: Path,
    parameters: dict[str, Any],
    staging_root: Path,
    cwd: Path | None = None,
) -> Execution:
    """Run `notebook` with `parameters`; raise LabError naming the failing cell on error."""
    import papermill as pm

    executed_path.parent.mkdir(parents=True, exist_ok=True)
    saved = os.environ.get(OUTPUTS_ROOT_ENV)
    os.environ[OUTPUTS_ROOT_ENV] = str(staging_root)  # the kernel inherits this environment
    start = time.perf_counter()
    try:
        pm.execute_notebook(
            str(notebook),
            str(executed_path),
            parameters=parameters,
            kernel_name=KERNEL,
            cwd=str(cwd or notebook.parent),
            progress_bar=False,
            log_output=False,
            # the kernel's own log (unencrypted local TCP, interrupt at shutdown) is noise here;
            # cell errors still arrive as messages
            extra_arguments=["--IPKernelApp.log_level=CRITICAL"],
        )
    except pm.PapermillExecutionError as exc:
        raise LabError(_describe_failure(notebook, executed_path, exc)) from None
    except Exception as exc:  # kernel died, could not start, bad notebook JSON ...
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise LabError(f"{notebook.name}: {type(exc).__name__}: {first}") from None
    finally:
        if saved is None:
            os.environ.pop(OUTPUTS_ROOT_ENV, None)
        else:
            os.environ[OUTPUTS_ROOT_ENV] = saved
    seconds = time.perf_counter() - start
    return Execution(seconds, executed_path, count_executed(executed_path))


def count_executed(executed_path: Path) -> int:
    nb = json.loads(executed_path.read_text(encoding="utf-8"))
    return sum(1 for c in nb["cells"] if c["cell_type"] == "code" and c.get("execution_count"))


def _describe_failure(notebook: Path, executed_path: Path, exc) -> str:
    """'00_x.ipynb: cell 7 (`t2 = ...`) raised KeyError: 'gate'', numbered as in the source."""
    index = exc.cell_index
    try:
        cells = json.loads(executed_path.read_text(encoding="utf-8"))["cells"]
        injected = [i for i, c in enumerate(cells) if INJECTED_TAG in c["metadata"].get("tags", [])]
        if injected and injected[0] < index:
            index -= 1
    except (OSError, ValueError, KeyError):
        pass
    source = (exc.source or "").strip().splitlines()
    first = source[0] if source else ""
    if len(first) > 60:
        first = first[:57] + "..."
    evalue = (exc.evalue or "").strip().splitlines()
    return (
        f"{notebook.name}: cell {index + 1} (`{first}`) raised {exc.ename}: "
        f"{evalue[0] if evalue else ''}"
    ).rstrip(": ")
