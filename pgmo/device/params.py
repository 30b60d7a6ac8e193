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

PARAMS: dict[str, Any] = {'call_us': {'cuMemCreate': {'fixed': 11.73,
                             'per_gib': 30.75,
                             'sizes': 6,
                             'waits': False,
                             'waits_other': False},
             'cuMemMap': {'fixed': 2.26,
                          'per_gib': 5.46,
                          'sizes': 6,
                          'waits': False,
                          'waits_other': False},
             'cuMemRelease': {'fixed': 14.48,
                              'per_gib': 624.83,
                              'sizes': 6,
                              'waits': False,
                              'waits_other': False},
             'cuMemSetAccess': {'fixed': 54.91,
                                'per_gib': 46.1,
                                'sizes': 6,
                                'waits': False,
                                'waits_other': False},
             'cuMemUnmap': {'fixed': 30.14,
                            'per_gib': 10.63,
                            'sizes': 6,
                            'waits': False,
                            'waits_other': False},
             'cudaFree': {'fixed': 16.57,
                          'per_gib': 458.2,
                          'sizes': 6,
                          'waits': True,
                          'waits_other': True},
             'cudaFreeAsync': {'fixed': 1.15,
                               'per_gib': 0.05,
                               'sizes': 6,
                               'waits': False,
                               'waits_other': False},
             'cudaMalloc': {'fixed': 28.76,
                            'per_gib': 61.34,
                            'sizes': 6,
                            'waits': False,
                            'waits_other': False},
             'cudaMallocFromPoolAsync (pool grows)': {'fixed': 31.64,
                                                      'per_gib': 1308.25,
                                                      'sizes': 6,
                                                      'waits': False,
                                                      'waits_other': False},
             'cudaMallocFromPoolAsync (reused)': {'fixed': 1.54,
                                                  'per_gib': 0.06,
                                                  'sizes': 6,
                                                  'waits': False,
                                                  'waits_other': False},
             'cudaMemPoolTrimTo(0)': {'fixed': 41.38,
                                      'per_gib': 1359.9,
                                      'sizes': 6,
                                      'waits': False,
                                      'waits_other': False}},
 'page': 2097152,
 'pool_chunk': 33554432,
 'pool_trim_step': 33554432}

SOURCE: dict[str, Any] = {'command': 'python -m scripts.gpu_quick_check --device 0 --out '
            '/tmp/pgmo-session/quick-check --budget 438',
 'date': '2026-11-27 21:50 UTC',
 'device': 'NVIDIA H100 80GB HBM3',
 'file': 'quick-check.json',
 'kind': 'measured',
 'versions': {'CUDA driver': 13000,
              'CUDA runtime': 13020,
              'NVML driver': '580.159.04',
              'compute capability': '9.0',
              'cuDriverGetVersion': 13000,
              'cuda-bindings': '13.5.0',
              'cuda-pathfinder': '1.9.1',
              'nvidia-ml-py': '13.615.71'}}
