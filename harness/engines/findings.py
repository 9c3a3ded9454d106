"""Run the finding scripts of ``docs/findings/`` against the installed vLLM, importing it once.

Each script is standalone (``python docs/findings/<finding>.py``) and spends most of its
time importing vLLM.  ``python -m harness.engines.findings SCRIPT...`` sets the environment the
scripts set for themselves (offline, quiet), imports vLLM once, and then runs each script
in a child forked from that process, as ``__main__``, with its own stdout and stderr: the
script sees the same modules it would have imported itself, and nothing a previous script
did.  It prints one JSON object: per script, its exit status, stdout and stderr.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import tempfile
from pathlib import Path

#: What every finding script sets (os.environ.setdefault) before it imports vLLM.
SCRIPT_ENVIRONMENT = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
                      "VLLM_NO_USAGE_STATS": "1", "VLLM_LOGGING_LEVEL": "ERROR",
                      "TRANSFORMERS_VERBOSITY": "error"}


def run_forked(script: Path) -> dict:
    """Run one script in a forked child; its exit status and what it wrote."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: the script as __main__, its output to the two files
            status = 0
            try:
                os.dup2(out.fileno(), 1)
                os.dup2(err.fileno(), 2)
                sys.argv = [str(script)]
                runpy.run_path(str(script), run_name="__main__")
            except SystemExit as exc:
                status = exc.code if isinstance(exc.code, int) else (exc.code is not None)
            except BaseException:  # noqa: BLE001 -- reported as python would, exit 1
                import traceback
                traceback.print_exc()
                status = 1
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(int(status))
        _, wait_status = os.waitpid(pid, 0)
        out.seek(0)
        err.seek(0)
        return {"returncode": os.waitstatus_to_exitcode(wait_status),
                "stdout": out.read().decode(errors="replace"),
                "stderr": err.read().decode(errors="replace")}


def main(argv: list[str]) -> int:
    for key, value in SCRIPT_ENVIRONMENT.items():
        os.environ.setdefault(key, value)
    import torch  # noqa: F401 -- what every script imports first, once for all of them
    import vllm.config  # noqa: F401
    import vllm.v1.core.sched.scheduler  # noqa: F401
    results = {Path(a).name: run_forked(Path(a)) for a in argv}
    print(json.dumps(results))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
