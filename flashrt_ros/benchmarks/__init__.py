"""Helpers of the ``flashrt-bench`` command: timing, model pairs, measurements, report.

Kept apart from ``flashrt_ros.bench`` (the command line) so each piece stays small
and the measurement code can be read without the argument handling.
"""
