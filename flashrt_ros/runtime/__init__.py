"""Execution-state runtime: arena, capsules, store. Pure torch, no ROS.

Modules (one concept each):
``arena`` state buffers in one block · ``errors`` typed errors with stable codes ·
``copyplan`` payload layout and merged copies · ``capsule`` the capsule record and hashing ·
``names`` name validation · ``fingerprint`` model identity · ``tiers`` byte budgets ·
``disk`` the on-disk format (package) · ``store`` CapsuleStore, the verbs over its rooms:
``catalogue`` names and LRU order, ``placement`` budgets and demotion between tiers,
``capsule_files`` and ``persistence`` the capsule directory (index, save, load),
``verification`` hashes, files and live state · ``capsule_verbs`` every verb of both engines ·
``rollback`` RollbackRing · ``boundary`` BoundaryGate (the threading contract) ·
``sessions`` SessionManager · ``toy`` a tiny deterministic engine for tests and benchmarks.
"""
