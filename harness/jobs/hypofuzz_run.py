"""HypoFuzz over the conformance properties (``make dashboard``; docs/fuzzing.md).

Runs HypoFuzz's ``hypothesis fuzz`` command from the environment that ``make
fuzz-env`` builds (``PYTHONPATH=.venvs/hypofuzz``), with one fix to HypoFuzz
25.11.1.  Its hub ends the whole run at its first check, 60 s after the start,
if no worker has yet said which tests it is fuzzing; a worker first says so
after 100 runs of its first test.  For these properties that is vLLM's import
plus 100 streams under HypoFuzz's coverage tracing (about 0.5 s each), well
over a minute, so the hub printed "Found a failing input for every test!" and
stopped having found nothing.  Here each worker says which tests it holds as
soon as it is given them; from then on HypoFuzz's own bookkeeping runs as
before.

    PYTHONPATH=.venvs/hypofuzz .venv/bin/python -m harness.jobs.hypofuzz_run -- tests/test_conformance.py
"""

from __future__ import annotations

import sys


def publish_targets_at_once() -> None:
    """Make each HypoFuzz worker report its tests when the hub assigns them."""
    from hypofuzz.hypofuzz import FuzzWorker
    update = FuzzWorker._update_targets
    if getattr(update, "publishes_at_once", False):
        return

    def update_and_publish(self, nodeids):
        update(self, nodeids)
        self.shared_state["worker_state"]["valid_nodeids"] = [
            target.nodeid for target in self.valid_targets]

    update_and_publish.publishes_at_once = True
    FuzzWorker._update_targets = update_and_publish


def main(argv: list[str] | None = None) -> int:
    try:
        import hypofuzz.entrypoint  # noqa: F401  (adds `fuzz` to hypothesis's command line)
    except ImportError:
        print("error: HypoFuzz is not installed here: run make fuzz-env, then "
              "PYTHONPATH=.venvs/hypofuzz", file=sys.stderr)
        return 2
    publish_targets_at_once()
    from hypothesis.extra.cli import main as hypothesis_cli
    args = sys.argv[1:] if argv is None else argv
    return hypothesis_cli.main(["fuzz", *args], prog_name="hypothesis")


if __name__ == "__main__":
    raise SystemExit(main())
