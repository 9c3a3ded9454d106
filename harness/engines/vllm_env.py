"""vLLM's environment for the harness: offline, quiet, no usage reports.

Imported before vLLM by every module of this package that imports vLLM, since
vLLM reads these variables when it is first imported.
"""

from __future__ import annotations

import os
import warnings

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("VLLM_LOGGING_LEVEL", "ERROR")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")
os.environ.setdefault("DO_NOT_TRACK", "1")

warnings.filterwarnings("ignore")
