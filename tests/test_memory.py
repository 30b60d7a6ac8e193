"""pgmo.engine.memory: what the pool obtains and releases, and what it says about it.

Mostly exercised through whole runs elsewhere (test_footprint, test_variable_workloads,
test_cuda_device); here, the rules that a run does not show by its bytes alone.
"""

from __future__ import annotations

import importlib
import logging
import re
from pathlib import Path

import pytest

import pgmo
from pgmo.measure.hosts import host_engine
from pgmo.measure.replay import Checker, host_device_of

MiB = 1 << 20
SIZES = [8 * MiB, 6 * MiB, 4 * MiB, 8 * MiB]


def run(engine, checker, iterations: int, scale: int = 1) -> None:
    for _ in range(iterations):
        with engine.iteration():
            live = [checker.alloc(engine, s * scale) for s in SIZES]
            while live:
                assert checker.free(live.pop())


@pytest.mark.parametrize("vmm", [True, False], ids=["reserved range", "cudaMalloc"])
def test_an_arena_the_device_refuses_is_logged_once_not_at_every_boundary(vmm, caplog):
    """A plan whose arena the device cannot hold (a saved one, made for a larger batch) is
    tried again at every boundary while the pool goes on with the plan it has; the warning
    comes once, when the trouble starts (a 150-iteration run once logged it twice per
    boundary), and the trouble is in ``stats().device_reasons`` while it lasts."""
    engine = host_engine(capacity=64 * MiB, vmm=vmm)
    checker = Checker(host=True, device=host_device_of(engine), write="ends")
    run(engine, checker, 3)  # warm-up, profiling, the plan: an arena of 26 MiB
    larger = pgmo.Trace.from_tuples([(k, k, k + 5, 4 * s) for k, s in enumerate(SIZES)])
    caplog.set_level(logging.WARNING, logger="pgmo.pool")
    engine.adopt(larger, pgmo.Plan(larger, pgmo.solve(larger, method="bestfit").offsets))
    run(engine, checker, 40)  # the old plan serves; the larger one is refused at each boundary
    refused = [r.getMessage() for r in caplog.records if "cannot" in r.getMessage()]
    assert len(refused) == 1, refused
    assert "arena refused" in engine.stats().device_reasons
    assert engine.stats().planned_requests > 0
    assert checker.corrupted == 0 and checker.overlaps == 0


def test_arena_kind_says_what_holds_the_arena_now():
    engine = host_engine()
    assert engine.stats().arena_kind == "none"  # nothing mapped yet
    checker = Checker(host=True, device=host_device_of(engine), write="ends")
    run(engine, checker, 3)
    assert engine.stats().arena_kind == "reserved range"
    engine.free_all_blocks()  # between iterations: the idle arena goes back
    assert engine.stats().arena_bytes == 0


# ------------------------------------------------------------------ the rules, written once
# The footprint policy is written once, as the numbered rules of memory.py's docstring; the
# code names them ("rule 4") and the docs quote their titles.  Where text and code can be
# compared, they are: a rule renumbered, renamed or pointing at a name that is gone fails here.
ROOT = Path(__file__).resolve().parent.parent


def _rules() -> dict[int, tuple[str, str]]:
    """memory.py's numbered rules: number -> (title, whole text)."""
    from pgmo.engine import memory

    doc = memory.__doc__ or ""
    found = re.findall(r"^(\d+)\. \*\*(.+?)\*\*(.*?)(?=^\d+\. \*\*|\Z)", doc, re.M | re.S)
    return {int(n): (" ".join(title.split()).rstrip("."), " ".join(f"{title} {rest}".split()))
            for n, title, rest in found}


def test_the_rules_are_numbered_one_to_seven():
    assert sorted(_rules()) == list(range(1, 8))


def test_every_name_a_rule_gives_is_in_the_code():
    """A constant or method a rule cites (``:data:`HEAP_SLACK```) exists where it says."""
    from pgmo.engine import memory

    cited = [name for _, text in _rules().values()
             for name in re.findall(r":(?:data|meth|class):`~?([\w.]+)`", text)]
    assert {"HEAP_SLACK", "TRIM_SLACK", "DeviceMemory.awaiting_plan"} <= set(cited)
    for name in cited:
        where = memory if not name.startswith("pgmo.") else importlib.import_module(
            name.rsplit(".", 1)[0])
        leaf = name.rsplit(".", 1)[-1] if name.startswith("pgmo.") else name
        target: object = where
        for part in leaf.split("."):
            assert hasattr(target, part), f"a rule cites {name}, which memory.py lacks"
            target = getattr(target, part)


def test_every_tuning_constant_is_cited_by_a_rule():
    """memory.py's numbers (slack, growth, steps) are each the measure of some rule."""
    from pgmo.engine import memory

    text = " ".join(text for _, text in _rules().values())
    source = Path(memory.__file__).read_text()
    constants = [name for name in re.findall(r"^([A-Z][A-Z_]+) = ", source, re.M)
                 if isinstance(getattr(memory, name), (int, float))]  # its own numbers
    assert constants
    for name in constants:
        assert f":data:`{name}`" in text, f"memory.{name} is no rule's measure"


def test_the_mechanisms_memory_py_decides_with_hold_no_numbers_of_their_own():
    """The policy's measures stay beside its rules: the modules whose mechanisms
    ``DeviceMemory`` is built on (its bases) define no tuning constant."""
    from pgmo.engine import memory

    bases = {importlib.import_module(base.__module__) for base in memory.DeviceMemory.__mro__
             if base.__module__ not in (memory.__name__, "builtins")}
    assert len(bases) >= 4  # the reserved arena, the heap, the stock pool, the accounts
    for module in bases:
        numbers = [name for name in re.findall(r"^([A-Z][A-Z_]+) = ",
                                               Path(module.__file__).read_text(), re.M)
                   if isinstance(getattr(module, name), (int, float))]
        assert not numbers, f"{module.__name__} holds {numbers}: a rule's measure, for memory.py"


def test_the_code_and_the_docs_cite_rules_that_exist():
    rules = _rules()
    files = [*sorted((ROOT / "pgmo").rglob("*.py")), *sorted((ROOT / "docs").glob("*.md"))]
    for path in files:
        for n in re.findall(r"\brule (\d+)\b", path.read_text()):
            assert int(n) in rules, f"{path.relative_to(ROOT)} cites rule {n}"


def test_the_footprint_guide_quotes_the_rules_titles():
    text = " ".join((ROOT / "docs" / "footprint.md").read_text().split())
    quoted = text[text.index("numbered, in `pgmo/engine/memory.py`"):]
    quoted = quoted[quoted.index("1. "):quoted.index(". What follows")]
    items = re.split(r"; (?=\d+\. )", quoted)
    assert [re.match(r"(\d+)\. (.*)", item).groups() for item in items] == \
        [(str(n), title[0].lower() + title[1:]) for n, (title, _) in sorted(_rules().items())]


def test_the_boundary_without_a_plan_is_decided_by_rule_4():
    """Rule 4 owns the trim while a plan is awaited: the engine says whether its
    iterations varied, :meth:`DeviceMemory.awaiting_plan` decides, and the rule says so."""
    title, text = _rules()[4]
    assert ":meth:`DeviceMemory.awaiting_plan`" in text and "vary" in text
    engine = host_engine(warmup=2)
    checker = Checker(host=True, device=host_device_of(engine), write="ends")
    run(engine, checker, 1)  # a warm-up iteration: its blocks came from the heap, now idle
    held = engine.stats().exact_bytes
    assert held > 0
    assert engine.memory.awaiting_plan(False) is False  # repeating: the heap keeps it
    assert engine.stats().exact_bytes == held
    assert engine.memory.awaiting_plan(True) is True  # varying: it goes back
    assert engine.stats().exact_bytes < held
    assert checker.corrupted == 0 and checker.overlaps == 0


@pytest.mark.parametrize("books", ["bisected", "a range without starts_in"])
def test_a_steady_run_unmaps_nothing_and_a_smaller_plan_trims_the_arena_end(books,
                                                                           monkeypatch):
    """Repeating iterations leave the reserved arena as it is (no unmap, no search of the
    live blocks' end at their boundaries); a smaller plan gives the mappings beyond it back
    at the boundary that installs it, and its iterations are checked block by block.  The
    same with a reserved range of the user's own backend that cannot say where its
    mappings start (its mappings are read instead)."""
    if books != "bisected":
        from pgmo.device.host_range import HostRange

        monkeypatch.delattr(HostRange, "starts_in")
    MiB = 1 << 20
    engine = host_engine(warmup=0, replan="sync", method="bestfit")
    device = engine.host_device
    checker = Checker(host=True, device=device, write=True)

    def iteration(sizes):
        with engine.iteration():
            blocks = [checker.alloc(engine, size) for size in sizes]
            while blocks:  # freed inside the iteration: none outlives it
                assert checker.free(blocks.pop())

    for _ in range(4):  # profiled, then planned: two 32 MiB blocks live together
        iteration([32 * MiB, 32 * MiB])
    assert engine.mode == "optimized" and engine.hot.arena.size == 64 * MiB
    unmaps, maps = device.unmaps, device.maps
    for _ in range(5):
        iteration([32 * MiB, 32 * MiB])
    assert (device.unmaps, device.maps) == (unmaps, maps)
    small = pgmo.Trace.from_tuples([(0, 0, 1, 4 * MiB)])
    engine.adopt(small, pgmo.Plan(small, (0,)))
    assert 4 * MiB <= engine.hot.arena.size < 8 * MiB and device.unmaps > unmaps
    for _ in range(3):
        iteration([4 * MiB])
    assert engine.mode == "optimized" and engine.hot.arena.size < 8 * MiB
    assert checker.corrupted == 0 and checker.overlaps == 0
    engine.close()
