"""What a newcomer copies from the READMEs works on a clone with nothing beside it."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _extras() -> set[str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    return set(cfg["options.extras_require"])


def test_the_examples_readme_gives_one_command_for_a_venv_where_every_example_runs():
    text = (ROOT / "examples" / "README.rst").read_text()
    commands = re.findall(r"^ +(python3 -m venv \.venv && .*pip install -e '\.\[(.*)\]')$",
                          text, re.M)
    assert len(commands) == 1, commands
    command, extras = commands[0]
    named = set(extras.split(","))
    assert named <= _extras() and {"chainer", "mpi"} <= named  # Chainer examples, ChainerMN
    assert {"cuda12", "cuda13"} & named  # CuPy: every example's pool
    constraints = re.findall(r"PIP_(?:BUILD_)?CONSTRAINT=(\S+)", command)
    assert len(constraints) == 2 and all((ROOT / c).is_file() for c in constraints)


def test_the_readmes_say_which_device_the_examples_use():
    for text in ((ROOT / "README.rst").read_text(), (ROOT / "examples" / "README.rst").read_text()):
        said = " ".join(text.split())
        assert "GPU 0 when CuPy sees a GPU" in said and "--device -1" in said
