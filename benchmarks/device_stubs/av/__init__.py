"""A stand-in for PyAV on the lent GPU machine, whose wheel (40 MB) does not fit the device tool's carry limit.

LeRobot's ``datasets/video_utils.py`` imports ``av`` at module level and reads ``av.logging.WARNING`` in a default
argument; the benchmarks never decode video, so opening anything fails loudly.
"""
from av import logging  # noqa: F401


def open(*args, **kwargs):  # noqa: A001 - PyAV's name
    raise RuntimeError("av is a stand-in on this machine (benchmarks/device_stubs): no video decoding")
