"""Execution-state runtime: arena, capsules, store. Pure torch, no ROS.

Modules (one concept each):
``arena`` state buffers in one block · ``errors`` typed errors with stable codes ·
``copyplan`` payload layout and merged copies · ``capsule`` the capsule record and hashing ·
``names`` name validation · ``fingerprint`` model identity · ``tiers`` byte budgets ·
``disk`` the on-disk format · ``store`` CapsuleStore · ``rollback`` RollbackRing ·
``boundary`` BoundaryGate (the threading contract) · ``sessions`` SessionManager ·
``toy`` a tiny deterministic engine for tests and benchmarks.
"""
