"""Modules that moved keep working at their old paths: the same objects, a warning once.

``pgmo.analysis``, ``pgmo.footprint`` and ``pgmo.plot`` moved into ``pgmo.measure``
(their old paths go in the next release); ``pgmo.testing`` stays, without a warning,
as the short path to ``pgmo.measure.hosts`` and ``pgmo.measure.replay``.
"""

from __future__ import annotations

import importlib
import sys
import warnings

import pytest

MOVED = {"pgmo.analysis": "pgmo.measure.analysis", "pgmo.footprint": "pgmo.measure.footprint",
         "pgmo.plot": "pgmo.measure.plot"}


def fresh_import(name: str) -> tuple[object, list[warnings.WarningMessage]]:
    """``name`` imported anew (as a user's first import of it would), with its warnings."""
    sys.modules.pop(name, None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        module = importlib.import_module(name)
        importlib.import_module(name)  # a second import warns no more
    return module, caught


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_warns_once_and_gives_the_moved_modules_objects(old):
    new = importlib.import_module(MOVED[old])
    module, caught = fresh_import(old)
    deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
    assert [str(w.message) for w in deprecations] == [
        f"{old} moved to {MOVED[old]}; the old path goes in the next release"]
    assert module.__all__ == new.__all__
    for name in new.__all__:
        assert getattr(module, name) is getattr(new, name), name
    # names outside __all__ too (scripts used pgmo.analysis.at_granularity)
    public = [n for n in vars(new) if not n.startswith("_")]
    for name in public:
        assert getattr(module, name) is getattr(new, name), name


def test_pgmo_testing_gives_the_measure_objects_without_a_warning():
    from pgmo.device.host_memory import HostMemory
    from pgmo.device.host_stock_pool import HostStockPool
    from pgmo.measure import hosts, replay

    testing, caught = fresh_import("pgmo.testing")
    assert not [w for w in caught if issubclass(w.category, DeprecationWarning)]
    for name in hosts.__all__:
        assert getattr(testing, name) is getattr(hosts, name), name
    for name in replay.__all__:
        assert getattr(testing, name) is getattr(replay, name), name
    assert testing.HostMemory is HostMemory and testing.HostStockPool is HostStockPool
    assert set(testing.__all__) <= set(vars(testing))


def test_the_package_names_the_moved_objects():
    import pgmo
    from pgmo.measure import analysis, hosts, replay

    assert pgmo.analyze is analysis.analyze and pgmo.Analysis is analysis.Analysis
    assert pgmo.replay is replay.replay and pgmo.host_pool is hosts.host_pool
