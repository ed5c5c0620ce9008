"""setuptools needs this file only to build the cffi module (cffi_modules)."""

from setuptools import setup

setup(cffi_modules=["rqsys/_native/build_spawn.py:ffibuilder"])
