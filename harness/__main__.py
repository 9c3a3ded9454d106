"""``python -m harness``: the command line (harness.cli)."""

from harness.cli import run

# Worker processes started by spawn import this module as __mp_main__: they must not run.
if __name__ == "__main__":
    run()
