"""vLLM's environment for the harness: offline, quiet, no usage reports.

``HARNESS_VLLM_LOGS=1`` lets vLLM's own logging through.

Imported before vLLM by every module of this package that imports vLLM, since
vLLM reads these variables when it is first imported.
"""

from __future__ import annotations

import logging
import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")
# transformers warns once per process about config keys (e.g. torch_dtype) it renamed.
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

warnings.filterwarnings("ignore")


def quiet_vllm_logs() -> None:
    """vLLM's own log lines (INFO and DEBUG) stay out of reports and pytest's failure output.

    Called once vLLM is imported (its import sets its loggers up);
    ``HARNESS_VLLM_LOGS=1`` keeps them.
    """
    if os.environ.get("HARNESS_VLLM_LOGS") != "1":
        logging.getLogger("vllm").setLevel(logging.WARNING)
