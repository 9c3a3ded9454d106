"""The second base stack of ``harness.jobs.side_env``, on stand-ins: a release's METADATA, a
constraints file, a base environment and pinned wheels' requirements, all made up here
(no download, no pip)."""

from __future__ import annotations

from pathlib import Path

import pytest
from packaging.requirements import Requirement

from harness.jobs import side_env

# The pinned wheels' own requirements, as their METADATA would state them.
WHEELS = {
    ("transformers", "5.17.0"): ["huggingface-hub<2.0,>=1.5.0", "tokenizers<0.24.0,>=0.23.1"],
    ("transformers", "5.22.2"): ["huggingface-hub<3.0,>=1.31.0", "tokenizers<0.24.0,>=0.23.1"],
    ("tokenizers", "0.23.3"): ["huggingface-hub<3.0,>=0.16.4"],
    ("huggingface-hub", "1.33.0"): [],
    ("huggingface-hub", "2.4.0"): [],
    ("xgrammar", "0.2.8"): ["apache-tvm-ffi>=0.1.11", "transformers>=4.38.0", "torch>=1.10.0"],
    ("xgrammar", "0.2.7"): ["apache-tvm-ffi>=0.1.10", "transformers>=4.38.0"],
    ("xgrammar", "0.2.1"): ["apache-tvm-ffi>=0.1.9", "transformers>=4.38.0"],
    ("apache-tvm-ffi", "0.1.11"): [],
    ("apache-tvm-ffi", "0.1.10"): [],
    ("apache-tvm-ffi", "0.1.9"): [],
}
PINS = """# stand-in constraints
transformers==5.17.0
transformers==5.22.2
tokenizers==0.23.3
huggingface-hub==1.33.0
huggingface-hub==2.4.0   # a comment after a pin
xgrammar==0.2.8
xgrammar==0.2.7
xgrammar==0.2.1
apache-tvm-ffi==0.1.11
apache-tvm-ffi==0.1.10
apache-tvm-ffi==0.1.9
"""
BASE = {"transformers": ("4.57.6", []), "tokenizers": ("0.22.2", ["huggingface-hub<2.0,>=0.16.4"]),
        "huggingface-hub": ("0.36.2", []), "xgrammar": ("0.1.25", ["transformers>=4.38.0"])}


@pytest.fixture
def world(tmp_path, monkeypatch):
    """A side-environment folder, a constraints file and a base environment of stand-ins;
    ``release(version, *requirements)`` makes a release's overlay."""
    monkeypatch.setattr(side_env, "SIDE_ENVS", tmp_path / ".venvs")
    monkeypatch.setattr(side_env, "WHEELS", tmp_path / ".venvs" / "wheels")
    constraints = tmp_path / "constraints-stack.txt"
    constraints.write_text(PINS)
    monkeypatch.setattr(side_env, "STACK_CONSTRAINTS", constraints)
    monkeypatch.setattr(side_env, "base_version", lambda p: BASE.get(p, (None, []))[0])
    monkeypatch.setattr(side_env, "base_requires",
                        lambda p: [Requirement(r) for r in BASE.get(p, (None, []))[1]])
    fetched = []

    def pin_requires(package, version):
        fetched.append((package, version))
        return [Requirement(r) for r in WHEELS[(package, version)]]

    monkeypatch.setattr(side_env, "pin_requires", pin_requires)

    def release(version, *requirements):
        info = tmp_path / ".venvs" / f"vllm-{version}" / f"vllm-{version}.dist-info"
        info.mkdir(parents=True)
        lines = [f"Name: vllm", f"Version: {version}"] + \
            [f"Requires-Dist: {r}" for r in requirements] + \
            ['Requires-Dist: torch==2.13.0', 'Requires-Dist: fastapi<0.137.0,>=0.133.0',
             'Requires-Dist: xgrammar==9.9.9; platform_machine == "no-such-machine"',
             'Requires-Dist: transformers==9.9.9; extra == "audio"']
        (info / "METADATA").write_text("\n".join(lines) + "\n")
        return version

    world = type("World", (), {})()
    world.release, world.fetched, world.constraints = release, fetched, constraints
    return world


def test_the_constraints_file_may_pin_a_package_more_than_once(world):
    pins = side_env.pinned_stack()
    assert pins["xgrammar"] == ["0.2.8", "0.2.7", "0.2.1"]
    assert pins["huggingface-hub"] == ["1.33.0", "2.4.0"]


def test_a_line_that_is_not_a_pin_is_refused(world):
    world.constraints.write_text("transformers>=5\n")
    with pytest.raises(side_env.SideEnvError, match="not name==version"):
        side_env.pinned_stack()


def test_a_release_the_base_environment_meets_gets_no_stack(world):
    v = world.release("0.20.0", "transformers>=4.56.0", "tokenizers>=0.21.1", "xgrammar==0.1.25")
    assert side_env.resolve_stack(v) == {}
    assert side_env.ensure_stack(v, log=pytest.fail) is None
    assert world.fetched == []  # nothing pinned was even looked at


def test_a_release_the_base_transformers_meets_gets_no_stack_whatever_else_it_asks(world):
    """Before 0.24.0 the overlay alone is the drive (shown exact by those releases' checks):
    0.12.0's xgrammar==0.1.27 or llguidance 1.3 neither stack nor refuse anything."""
    v = world.release("0.12.0", "transformers<5,>=4.56.0", "xgrammar==0.1.27",
                      "llguidance<1.4.0,>=1.3.0")
    assert side_env.resolve_stack(v) == {}
    assert world.fetched == []


def test_a_release_with_no_overlay_gets_no_stack(world):
    assert side_env.resolve_stack("0.12.0") == {}


def test_each_release_gets_the_first_pins_that_meet_all_requirements(world):
    """One stack does not serve every release: 0.31.0 pins xgrammar 0.2.7, 0.32.0 0.2.8,
    0.25.1's apache-tvm-ffi==0.1.9 only xgrammar 0.2.1 accepts (backtracking), and 0.34.0's
    huggingface-hub>=2 takes the later transformers, since 5.17.0 refuses hub 2."""
    common = ["transformers>=5.10.4", "tokenizers>=0.21.1"]
    r30 = world.release("0.30.0", *common, "xgrammar<1.0.0,>=0.2.1", "apache-tvm-ffi==0.1.11")
    r31 = world.release("0.31.0", "transformers<5.18.0,>=5.10.4", "xgrammar==0.2.7",
                        "apache-tvm-ffi==0.1.11")
    r32 = world.release("0.32.0", "transformers<5.20.0,>=5.16.1", "tokenizers>=0.23.2",
                        "xgrammar==0.2.8", "apache-tvm-ffi==0.1.11")
    r25 = world.release("0.25.1", "transformers>=5.5.3", "xgrammar<1.0.0,>=0.2.1",
                        "apache-tvm-ffi==0.1.9")
    r34 = world.release("0.34.0", "transformers<5.23.0,>=5.16.1", "huggingface_hub>=2.0.0",
                        "xgrammar==0.2.8", "apache-tvm-ffi==0.1.11")
    five = {"transformers": "5.17.0", "tokenizers": "0.23.3", "huggingface-hub": "1.33.0"}
    assert side_env.resolve_stack(r30) == {**five, "xgrammar": "0.2.8", "apache-tvm-ffi": "0.1.11"}
    assert side_env.resolve_stack(r31) == {**five, "xgrammar": "0.2.7", "apache-tvm-ffi": "0.1.11"}
    assert side_env.resolve_stack(r32) == side_env.resolve_stack(r30)
    assert side_env.resolve_stack(r25) == {**five, "xgrammar": "0.2.1", "apache-tvm-ffi": "0.1.9"}
    assert side_env.resolve_stack(r34) == {"transformers": "5.22.2", "tokenizers": "0.23.3",
                                          "huggingface-hub": "2.4.0", "xgrammar": "0.2.8",
                                          "apache-tvm-ffi": "0.1.11"}
    assert side_env.stack_dir(side_env.resolve_stack(r30)) == side_env.stack_dir(side_env.resolve_stack(r32))
    assert side_env.stack_dir(side_env.resolve_stack(r30)) != side_env.stack_dir(side_env.resolve_stack(r31))


def test_a_package_the_base_meets_stays_out_of_the_stack(world):
    """Only what the base cannot give is stacked: tokenizers and the hub come in because
    transformers 5 asks for them, xgrammar stays the base's when the release accepts it."""
    v = world.release("0.24.0", "transformers>=5.5.3", "xgrammar>=0.1.25")
    assert side_env.resolve_stack(v) == {"transformers": "5.17.0", "tokenizers": "0.23.3",
                                        "huggingface-hub": "1.33.0"}


def test_requirements_on_packages_not_pinned_are_left_alone(world):
    """torch==2.13.0 and fastapi, which the stand-in releases all state, are not pinned:
    they do not stop the stack, and markers that do not hold here are ignored."""
    v = world.release("0.28.0", "transformers>=5.5.3")
    assert set(side_env.resolve_stack(v)) == {"transformers", "tokenizers", "huggingface-hub"}
    assert side_env.requirement(v, "torch") == "torch==2.13.0"
    assert side_env.requirement(v, "Transformers") == "transformers>=5.5.3"


def test_a_requirement_nothing_pinned_meets_is_refused_naming_both(world):
    v = world.release("0.40.0", "transformers>=5.10.4", "xgrammar==0.3.0")
    with pytest.raises(side_env.SideEnvError) as exc:
        side_env.resolve_stack(v)
    assert str(exc.value) == ("vllm 0.40.0 requires xgrammar==0.3.0; constraints-stack.txt pins "
                              "xgrammar 0.2.8, 0.2.7, 0.2.1 and the base environment has 0.1.25")
    assert "\n" not in str(exc.value)


def test_pins_that_meet_each_requirement_but_not_together_are_refused(world):
    v = world.release("0.41.0", "transformers<5.18,>=5.10", "huggingface_hub>=2.0.0")
    with pytest.raises(side_env.SideEnvError, match="no combination of the pins in "
                       "constraints-stack.txt meets its requirements on huggingface_hub>=2.0.0, "
                       "transformers<5.18,>=5.10"):
        side_env.resolve_stack(v)


def test_the_stack_is_made_once_and_a_changed_pin_makes_another(world, monkeypatch):
    installs = []

    def pip(*args, what):
        assert args[0] == "install" and "--no-deps" in args
        target = args[args.index("--target") + 1]
        Path(target).mkdir(parents=True)
        installs.append((target, [a for a in args if a.endswith(".whl")]))

    monkeypatch.setattr(side_env, "_pip", pip)
    monkeypatch.setattr(side_env, "_pin_wheel", lambda p, v, log=None: side_env.WHEELS / f"{p}-{v}.whl")
    v = world.release("0.30.0", "transformers>=5.10.4")
    first = side_env.ensure_stack(v, log=lambda m: None)
    assert first.name.startswith("stack-") and first.parent == side_env.SIDE_ENVS
    assert (first / ".complete").read_text() == (
        "huggingface-hub==1.33.0\ntokenizers==0.23.3\ntransformers==5.17.0\n")
    assert len(installs) == 1 and len(installs[0][1]) == 3
    assert side_env.ensure_stack(v, log=pytest.fail) == first  # cached
    world.constraints.write_text(PINS.replace("tokenizers==0.23.3", "tokenizers==0.23.4"))
    WHEELS[("tokenizers", "0.23.4")] = []
    try:
        second = side_env.ensure_stack(v, log=lambda m: None)
    finally:
        del WHEELS[("tokenizers", "0.23.4")]
    assert second != first and len(installs) == 2 and (first / ".complete").exists()


def test_the_overlay_environment_puts_the_stack_after_the_release(world, monkeypatch):
    v = world.release("0.30.0", "transformers>=5.10.4")
    made = side_env.SIDE_ENVS / "stack-x"
    monkeypatch.setattr(side_env, "ensure_stack", lambda version, log=print: made)
    monkeypatch.delenv("PYTHONPATH", raising=False)
    parts = side_env.overlay_environment(v)["PYTHONPATH"].split(":")
    assert parts == [str(side_env.overlay_dir(v)), str(made), str(side_env.ROOT)]


def test_upgrade_check_refuses_such_a_release_with_exit_3_and_one_line(world, monkeypatch,
                                                                       tmp_path, capsys):
    from harness.jobs import upgrade_check
    v = world.release("0.40.0", "transformers>=5.10.4", "xgrammar==0.3.0")
    monkeypatch.setattr(upgrade_check, "ensure_overlay", lambda version, log=print: None)
    code = upgrade_check.upgrade_check(v, examples=1, seed=0, out=tmp_path / "out", record=False)
    assert code == 3
    assert capsys.readouterr().err.splitlines() == [
        "error: vLLM 0.40.0 cannot be driven: no side environment: vllm 0.40.0 requires "
        "xgrammar==0.3.0; constraints-stack.txt pins xgrammar 0.2.8, 0.2.7, 0.2.1 and the "
        "base environment has 0.1.25"]
