"""Build pgmo; compile its allocation hot path with Cython when possible.

``pgmo/engine/handout.py`` is plain Python that Cython compiles (with the
types in ``handout.pxd``) into an extension module of the same name.  The
extension is optional: without a C compiler the build goes on and pgmo
runs the same code as plain Python (see ``pgmo.engine.compiled()``).
"""

from setuptools import Extension, setup

# binding=False and always_allow_keywords=False make HotPath.malloc a plain
# one-argument C method: the cheapest call CuPy can make per allocation.
DIRECTIVES = {"language_level": 3, "binding": False, "always_allow_keywords": False}


def extensions():
    try:
        from Cython.Build import cythonize
    except ImportError:  # no Cython in the build environment: plain Python
        return []
    hot_path = Extension("pgmo.engine.handout", ["pgmo/engine/handout.py"], optional=True)
    return cythonize([hot_path], compiler_directives=DIRECTIVES, quiet=True)


setup(ext_modules=extensions())
