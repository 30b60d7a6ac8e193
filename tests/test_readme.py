"""What a newcomer copies from the READMEs works on a clone with nothing beside it."""

from __future__ import annotations

import configparser
import re
from pathlib import Path

import pytest

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


def test_the_docs_say_which_device_the_examples_use():
    for text in ((ROOT / "docs" / "quickstart.rst").read_text(),
                 (ROOT / "examples" / "README.rst").read_text()):
        said = " ".join(text.split())
        assert "GPU 0 when CuPy sees a GPU" in said and "--device -1" in said


def _readme() -> str:
    return (ROOT / "README.rst").read_text()


def _section(text: str, title: str) -> str:
    """A section's text, from its title to the next title of the same level."""
    start = text.index(f"\n{title}\n{'-' * len(title)}\n")
    rest = text[start + 2 * len(title) + 3:]
    nxt = re.search(r"\n[^\n]+\n-{3,}\n", rest)
    return rest[:nxt.start()] if nxt else rest


def _code_blocks(text: str, language: str) -> list[str]:
    """The ``.. code-block:: <language>`` blocks of ``text``, dedented."""
    blocks = []
    for match in re.finditer(rf"\.\. code-block:: {language}\n\n((?: {{3}}.*\n|\n)+)", text):
        blocks.append("\n".join(line[3:] for line in match.group(1).rstrip().splitlines()))
    return blocks


def test_the_readme_opens_with_one_honest_headline():
    """What was measured on a GPU (when, which engine), what is only the CPU model, what a
    user can expect, and what ``pgmo analyze`` reports: one paragraph before the commands."""
    text = _readme()
    first = text[:text.index("\nQuick start without a GPU\n")]
    [headline] = [p for p in first.split("\n\n") if p.startswith("**Where it stands.**")]
    said = " ".join(headline.split())
    assert "2026-11-25" in said and "commit 0cd52e9" in said  # the GPU run and its engine
    assert "not a GPU measurement" in said  # the CPU model, said to be one
    assert "2026-11-27" in said and "0.90x" in said and "1.41x" in said  # the GPU check
    assert "So today:" in said and "``pgmo analyze`` says what a plan" in said
    assert first.count("**") == 2  # the one headline; the details live in docs/
    assert len(re.findall(r"\d\.\d+x", first)) <= 4, "a headline, not a table of ratios"


def test_the_cpu_quick_start_runs_as_pasted(monkeypatch, capsys):
    """Each snippet of the quick start (the README's example, then the site's page *More
    without a GPU*), as a user pastes it (the bench_footprint command is run by
    tests/test_scripts_package.py), says what it prints and what it costs."""
    pytest.importorskip("cupy")
    quick = _section(_readme(), "Quick start without a GPU")
    more = (ROOT / "docs" / "quickstart.rst").read_text()
    said = " ".join(quick.split())
    assert 'replan="sync", method="bestfit"' in said and "pgmo.NoGPUError" in said
    [python] = _code_blocks(quick, "python")
    exec(compile(python, "README.rst", "exec"), {})
    printed = capsys.readouterr().out.strip()
    assert f"# {printed}" == python.splitlines()[-1]  # the output the README shows
    assert not _code_blocks(quick, "bash")  # one example on the README's first screen
    said = " ".join(f"{quick} {more}".split())
    analyze, footprint = _code_blocks(more, "bash")
    assert analyze.startswith(".venv/bin/pgmo analyze ")
    from pgmo.cli import main

    monkeypatch.chdir(ROOT)
    assert main(analyze.split()[1:]) == 0
    table = capsys.readouterr().out
    for figure in re.findall(r"\((\d+\.\d\d MiB)\)", more):  # the figures the prose quotes
        assert figure in table
    assert footprint.startswith(".venv/bin/python -m scripts.bench_footprint ")
    # what each costs: the snippet, the analysis, one bench_footprint run and all of them
    costs = re.findall(r"(under a second|about \d+ s|about \d+ minutes)", said)
    assert len(costs) >= 4, costs


def test_the_readme_states_what_the_set_up_commands_cost():
    said = " ".join(_readme()[:_readme().index("\nQuick start without a GPU\n")].split())
    assert re.search(r"``pgmo demo`` about \d+ s and [\d.]+ GB of memory", said)
    assert re.search(r"main job's install about .+ \(\d+ s\)", said)
    assert re.search(r"tests' install and run (\d+ to \d+|about \d+) minutes", said)
    assert "two CPU cores" in said


def test_the_readme_names_the_site_and_pages_that_exist():
    """The README's first screen ends where the site's front page does, and every page its
    *Documentation* section names is a file of ``docs/`` in the site's table of contents."""
    text = _readme()
    assert text.index(".. front-page-start") < text.index("\nQuick start without a GPU\n") \
        < text.index(".. front-page-end")
    index = (ROOT / "docs" / "index.rst").read_text()
    assert ":start-after: .. front-page-start (docs/index.rst shows" in index
    docs = _section(text, "Documentation")
    assert "python -m sphinx -W -b html docs build/docs" in docs
    pages = re.findall(r"``([\w/.-]+\.(?:rst|md)|api/)``", docs)
    assert len(pages) >= 15, pages
    for page in pages:
        path = ROOT / page if page.startswith("examples/") else ROOT / "docs" / page
        assert path.exists(), page
        if not page.startswith("examples/"):
            name = page.rstrip("/").rsplit(".", 1)[0] + ("/index" if page.endswith("/") else "")
            assert f"   {name}\n" in index, f"docs/index.rst's table of contents lacks {name}"
