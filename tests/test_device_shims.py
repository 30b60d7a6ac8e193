"""The device layer's old module paths still import, warn once, and give the same objects.

``pgmo.cuda_device``, ``pgmo.host_device``, ``pgmo.mappings`` and
``pgmo.device_params`` moved into :mod:`pgmo.device`; code that imports the
old paths keeps working for one release.
"""

from __future__ import annotations

import importlib
import sys

import pytest

#: old path -> {name: the module that defines it now}
SHIMS = {
    "pgmo.cuda_device": {"CudaRange": "pgmo.device.cuda", "CudaAsyncPool": "pgmo.device.cuda",
                         "device_layer": "pgmo.device.cuda",
                         "vmm_granularity": "pgmo.device.cuda_calls",
                         "DeviceError": "pgmo.errors"},
    "pgmo.host_device": {"HostMemory": "pgmo.device.host_memory",
                         "HostRange": "pgmo.device.host_range",
                         "HostAsyncPool": "pgmo.device.host_async_pool",
                         "HostStockPool": "pgmo.device.host_stock_pool",
                         "DRIVER_PAGE": "pgmo.device.host_memory",
                         "SMALL_MAX": "pgmo.device.host_memory",
                         "OWN_PAGES": "pgmo.device.host_memory",
                         "UNBOUNDED_RESERVATION": "pgmo.device.host_memory",
                         "DRIVER_POOL_CHUNK": "pgmo.device.host_async_pool"},
    "pgmo.mappings": {"MappingLedger": "pgmo.device.mappings"},
    "pgmo.device_params": {"PARAMS": "pgmo.device.params", "SOURCE": "pgmo.device.params"},
}


@pytest.mark.parametrize("old", sorted(SHIMS))
def test_an_old_path_warns_and_gives_the_same_objects(old, monkeypatch):
    monkeypatch.delitem(sys.modules, old, raising=False)  # imported afresh, as a user would
    with pytest.warns(DeprecationWarning, match=rf"{old} moved to pgmo\.device.*next release"):
        shim = importlib.import_module(old)
    for name, home in SHIMS[old].items():
        assert getattr(shim, name) is getattr(importlib.import_module(home), name), name
    assert set(shim.__all__) <= set(SHIMS[old])


@pytest.mark.parametrize("old", sorted(SHIMS))
def test_an_old_path_warns_once(old, monkeypatch, recwarn):
    monkeypatch.delitem(sys.modules, old, raising=False)
    importlib.import_module(old)
    importlib.import_module(old)
    assert [str(w.message).split(" moved")[0] for w in recwarn.list
            if w.category is DeprecationWarning] == [old]
