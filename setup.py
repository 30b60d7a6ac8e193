"""Build pgmo; compile its allocation hot path, its search's nodes and best-fit with Cython.

``pgmo/engine/handout.py``, ``pgmo/engine/frees.py``,
``pgmo/solver/search_nodes.py`` and ``pgmo/solver/bestfit.py`` are plain
Python that Cython compiles (with the types in their ``.pxd`` files) into
extension modules of the same names.
Each extension is optional: without a C compiler the build goes on and pgmo
runs the same code as plain Python (see ``pgmo.engine.compiled()``).
"""

from setuptools import Extension, setup

# binding=False and always_allow_keywords=False make HotPath.malloc a plain
# one-argument C method: the cheapest call CuPy can make per allocation.
# annotation_typing=False: the .pxd files alone declare the C types; the Python
# annotations in the .py files are for type checkers (mypy), not for Cython.
DIRECTIVES = {"language_level": 3, "binding": False, "always_allow_keywords": False,
              "annotation_typing": False}


def extensions():
    try:
        from Cython.Build import cythonize
    except ImportError:  # no Cython in the build environment: plain Python
        return []
    hot_path = [Extension(f"pgmo.engine.{name}", [f"pgmo/engine/{name}.py"], optional=True)
                for name in ("frees", "handout")]
    # The canonical search's work per node: loops over arrays whose indices the
    # search keeps in range (its plain-Python tests index NumPy arrays, which check).
    search = [Extension("pgmo.solver.search_nodes", ["pgmo/solver/search_nodes.py"],
                        optional=True)]
    # The paper's best-fit: its loop over int64 arrays whose indices it keeps in range (its
    # plain-Python tests index NumPy arrays, which check) and which __init__ sets before any
    # use.  binding=True keeps the module's functions' signatures for the API reference
    # (they are called once per packing, not per block).
    bestfit = [Extension("pgmo.solver.bestfit", ["pgmo/solver/bestfit.py"], optional=True)]
    unchecked = dict(DIRECTIVES, boundscheck=False, wraparound=False)
    return (cythonize(hot_path, compiler_directives=DIRECTIVES, quiet=True)
            + cythonize(search, compiler_directives=unchecked, quiet=True)
            + cythonize(bestfit, compiler_directives=dict(unchecked, binding=True,
                                                          initializedcheck=False), quiet=True))


setup(ext_modules=extensions())
