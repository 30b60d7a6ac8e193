"""The host model's device parameters, fitted to a GPU: generated, do not edit.

Written whole by ``python -m scripts.fit_host_model quick-check.json`` (the
quick GPU check's results).  ``page`` and ``pool_chunk`` are the host
model's ``pgmo.device.host_memory.DRIVER_PAGE`` and
``pgmo.device.host_async_pool.DRIVER_POOL_CHUNK``;
``pool_trim_step`` is what a trim keeps per live block of the driver's pool,
``call_us`` each call's cost (microseconds: ``fixed + per_gib x size``) and
whether it waits for queued kernels.  ``SOURCE`` says where the values come
from.
"""

from typing import Any

PARAMS: dict[str, Any] = {'call_us': {},
 'page': 2097152,
 'pool_chunk': 33554432,
 'pool_trim_step': 33554432}

SOURCE: dict[str, Any] = {'call_us': 'not measured yet: run the quick GPU check',
 'kind': 'documented',
 'page': "the CUDA driver's 2 MiB mapping granularity "
         '(cuMemGetAllocationGranularity on recent GPUs)',
 'pool_chunk': "CuPy's MemoryAsyncPool documentation: the driver's pool "
               'reserves 32 MiB multiples and trims in 32 MiB steps'}
