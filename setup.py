"""Build pgmo; compile its allocation hot path with Cython when possible.

``pgmo/engine/handout.py`` and ``pgmo/engine/frees.py`` are plain Python that
Cython compiles (with the types in their ``.pxd`` files) into extension
modules of the same names.  The
extension is optional: without a C compiler the build goes on and pgmo
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
    return cythonize(hot_path, compiler_directives=DIRECTIVES, quiet=True)


setup(ext_modules=extensions())
