"""What the command line accepts: exit codes, the usage error, and argparse types that
refuse bad input with one line naming the option and the rule."""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path
from typing import NoReturn

from harness.engines import ENGINE_NAMES, get_engine

EXIT_OK, EXIT_DIFF, EXIT_BAD_INPUT, EXIT_CANNOT_DRIVE, EXIT_INTERRUPTED = 0, 1, 2, 3, 130


class UsageError(Exception):
    """Bad command-line input: reported in one line, exit 2."""


class Parser(argparse.ArgumentParser):
    """argparse, with a usage error in one line (no usage block) and exit 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(EXIT_BAD_INPUT, f"error: {self.prog.split()[-1]}: {message}\n")


def _positive(convert, kind: str):
    """An argparse type: ``convert`` of the text, which must be > 0."""
    def parse(text: str):
        try:
            value = convert(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {kind}") from None
        if not value > 0:
            raise argparse.ArgumentTypeError(f"{value} must be > 0")
        return value
    return parse


def non_negative_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"{value} must be >= 0")
    return value


def output_folder(text: str, flag: str = "-o") -> Path:
    """An output folder: created if missing; an existing file or an unwritable folder is refused."""
    path = Path(text)
    if path.exists() and not path.is_dir():
        raise UsageError(f"{flag} {text}: is a file, not a folder")
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"{flag} {text}: cannot create the folder: {exc.strerror}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UsageError(f"{flag} {text}: the folder is not writable")
    return path


def engine_name(text: str) -> str:
    """An argparse type: one of ENGINE_NAMES, ``module:Class`` or ``cmd:<command>`` (an
    engine of one's own, loaded when used)."""
    if text in ENGINE_NAMES or ":" in text:
        return text
    raise argparse.ArgumentTypeError(f"invalid choice: {text!r} (choose from "
                                     f"{', '.join(ENGINE_NAMES)}, module:Class or cmd:<command>)")


def vllm_engines(text: str) -> list[str]:
    """The ``--engines`` option: engines to compare with the reference, comma-separated:
    vLLM's (default vllm) or plug-ins (``module:Class``), each loaded now."""
    engines = [e.strip() for e in text.split(",") if e.strip()]
    vllm_side = [e for e in ENGINE_NAMES if e != "reference"]
    for e in engines:
        if e not in vllm_side and ":" not in e:
            raise UsageError(f"--engines: {e!r} is not a vLLM engine ({', '.join(vllm_side)}) "
                             "nor module:Class nor cmd:<command>; each is compared with the "
                             "reference")
    for e in engines:
        if ":" in e:
            get_engine(e)
    return engines or ["vllm"]


#: ``import`` options that set one config field each (None: not given).
IMPORT_CONFIG_OPTIONS = ("block_size", "num_gpu_blocks", "max_num_batched_tokens",
                         "max_num_seqs", "max_model_len", "policy", "num_speculative_tokens",
                         "model")


def fraction(low_open: bool, high: int | None = None):
    """An argparse type: an exact number (``0.25``, ``1/32``), > 0 (or >= 0), at most high."""
    def parse(text: str):
        from harness.formats.public_traces import parse_fraction
        try:
            value = parse_fraction(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        if (value <= 0 if low_open else value < 0) or (high is not None and value > high):
            raise argparse.ArgumentTypeError(
                f"{text} must be {'> 0' if low_open else '>= 0'}"
                + (f" and <= {high}" if high is not None else ""))
        return value
    return parse


def config_file(text: str) -> dict:
    """``--config FILE.json``: a JSON object of stream config fields."""
    from harness.formats.stream import _DuplicateKey, _refuse_duplicate_keys
    try:
        raw = Path(text).read_bytes()
        if len(raw) > 1 << 20:
            raise UsageError(f"--config {text}: larger than 1 MiB")
        data = json.loads(raw.decode("utf-8"), object_pairs_hook=_refuse_duplicate_keys)
    except OSError as exc:
        raise UsageError(f"--config {text}: cannot read: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise UsageError(f"--config {text}: not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise UsageError(f"--config {text}: not valid JSON: {exc.msg} at line {exc.lineno}") from None
    except RecursionError:
        raise UsageError(f"--config {text}: not valid JSON: nested too deeply") from None
    except _DuplicateKey as exc:
        raise UsageError(f"--config {text}: key {exc.args[0]!r} appears twice") from None
    if not isinstance(data, dict):
        raise UsageError(f"--config {text}: must be a JSON object of config fields")
    return data

positive_int = _positive(int, "an integer")


positive_float = _positive(float, "a number")
