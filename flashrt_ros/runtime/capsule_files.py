"""One capsule store's directory: what it indexes at start, and its capsules' files written and read back.

Why a room of its own: the store and its budget planner think in capsules and
tiers; this is where a capsule becomes a file of the disk format (``disk``) and
back, checked against this store's arena and fingerprint. It keeps no budget
and takes no lock (the callers account for the bytes and hold the lock when
they must); reading and writing a file need no lock at all, because a capsule
file is only ever replaced atomically.

At start the store removes orphaned temp files of killed saves and indexes the
directory's capsule files (header and manifest checked; bytes verified on first
read), so names persist across restarts; files that fail the checks are not
indexed but keep their name taken (``Catalogue.unowned``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

import torch

from flashrt_ros.runtime import disk
from flashrt_ros.runtime.arena import StateArena
from flashrt_ros.runtime.capsule import Capsule
from flashrt_ros.runtime.copyplan import CopyPlan
from flashrt_ros.runtime.errors import CorruptCapsule


class CapsuleFiles:
    """The capsule files of one store (``directory`` None: the store has no disk tier)."""

    def __init__(self, directory: Path | None, arena: StateArena, fingerprint: str) -> None:
        self.directory = directory
        self.arena = arena
        self.fingerprint = fingerprint
        self.orphans_removed = (0, 0)      # (files, bytes) of killed saves removed at start

    def index(self) -> tuple[list[Capsule], dict[str, str]]:
        """Learn the directory: (its usable capsules, oldest first; name -> why each other file is refused).

        Orphaned temp files of killed saves are removed first. Files that fail
        the checks (another model, damaged, ...) are refused, not deleted.
        """
        self.orphans_removed = disk.remove_orphans(self.directory)
        found, refused = [], {}
        for name, manifest, plan, error in disk.scan(self.directory, self.arena, self.fingerprint):
            if error is not None:
                refused[name] = f"{error.code.name}: {error}"
            else:
                found.append(self.capsule_from_manifest(manifest, plan, "disk"))
        return sorted(found, key=lambda c: c.created_at), refused

    @staticmethod
    def capsule_from_manifest(manifest: Mapping[str, Any], plan: CopyPlan, tier: str) -> Capsule:
        """The capsule a checked manifest describes (no bytes attached), marked as on disk."""
        return Capsule(manifest["name"], manifest["session"], manifest["position"], manifest["boundary_id"],
                       float(manifest["created_at"]), plan.nbytes, manifest["fingerprint"],
                       manifest["layout_key"], dict(manifest["extents"]), tier, False,
                       dict(manifest["buffer_hashes"]), manifest["content_hash"], plan=plan, on_disk=True)

    def path(self, name: str) -> Path:
        return disk.capsule_path(self.directory, name)

    def write(self, c: Capsule) -> None:
        """Write resident ``c`` (hashed first) to its file atomically; marks it ``on_disk``."""
        host = c.payload if c.payload.device.type == "cpu" else c.payload.cpu()
        c.ensure_hashed(host)
        disk.write_capsule(self.directory, c, c.plan.views(host))
        c.on_disk = True

    def write_temp(self, c: Capsule, host: torch.Tensor) -> Path:
        """Write hashed ``c`` from its CPU payload ``host`` to a temp file (``commit_temp`` makes it ``c``'s file)."""
        return disk.write_temp(self.directory, c, c.plan.views(host))

    def commit_temp(self, tmp: Path, c: Capsule) -> None:
        disk.commit_temp(tmp, self.directory, c.name)

    @staticmethod
    def discard_temp(tmp: Path) -> None:
        disk.discard_temp(tmp)

    def load(self, name: str, allocate: Callable[[int], torch.Tensor]
             ) -> tuple[dict[str, Any], CopyPlan, torch.Tensor]:
        """Read and verify the file of ``name``: (manifest, plan, payload from ``allocate``)."""
        return disk.load_capsule(self.directory, name, self.arena, self.fingerprint, allocate=allocate)

    def read(self, c: Capsule, into: torch.Tensor | None = None) -> torch.Tensor:
        """Read ``c``'s verified bytes from disk into ``into`` (CPU) or a transient CPU payload."""
        def allocate(nbytes: int) -> torch.Tensor:
            if nbytes != c.nbytes:
                raise CorruptCapsule(f"capsule {c.name!r}: the file on disk holds other content than indexed")
            return torch.empty(nbytes, dtype=torch.uint8) if into is None else into

        manifest, _, payload = self.load(c.name, allocate)
        if manifest["content_hash"] != c.content_hash:
            raise CorruptCapsule(f"capsule {c.name!r}: the file on disk holds other content than indexed")
        return payload

    def bytes_of(self, c: Capsule) -> torch.Tensor:
        """``c``'s payload, or a verified transient copy read from disk."""
        return c.payload if c.resident else self.read(c)

    def delete(self, name: str) -> None:
        disk.delete_capsule(self.directory, name)

    def temp_files(self) -> list[disk.TempFile]:
        """Temp files of saves in the directory now (none without a directory)."""
        return disk.temp_files(self.directory) if self.directory is not None else []
