"""Models and policies: each declares its state buffers; none knows about capsules.

A regular package (not a namespace one) so that setup.py's package discovery, and with it
the wheel, includes it and its sub-packages.
"""
