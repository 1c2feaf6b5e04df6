"""The on-disk capsule format (version 2): one file per capsule, ``<dir>/<name>.safetensors``.

Why one file: a capsule must survive a crash or ``kill -9`` at any moment of a
save. With one file the whole write is: write a hidden temp file in the same
directory, fsync it, ``os.replace`` it over the old file, fsync the directory.
A crash before the rename leaves the old capsule untouched (plus an orphaned
temp file, removed the next time a store opens the directory); after it, the
new one is complete. There is no step at which neither version is loadable.

Why we write the safetensors bytes ourselves instead of calling
``safetensors.torch.save_file``: that writer creates its own ``.tmpXXXXXX``
file beside the target and renames it, so a kill during the write left a file
our sweep could not attribute (162 MB survived eleven restarts). Our writer
opens exactly one file, our own temp name (``.<name>.<pid>.<8 hex>.tmp``), so
every byte a killed save can leave is recognised and removed. The sweep also
removes such ``.tmpXXXXXX`` files left by earlier versions (``_LEGACY_TEMP``).

The file is a plain safetensors file (a little-endian u64 header length, a JSON
header, raw tensor bytes; never pickle, so it cannot execute code). Its
``__metadata__`` holds ``format``, ``format_version`` and ``manifest``: a JSON
object with everything needed to judge the capsule before reading its bytes
(name, session, position, boundary id, creation time, fingerprint, layout,
extents, per-buffer blake2b hashes, content hash) and ``manifest_hash``, a
blake2b over every other manifest field, so an edited field is refused.

Reading never trusts the file: it is opened with ``O_NONBLOCK`` and must be a
regular file (a FIFO or device named like a capsule is refused at once, never
waited on); the header is parsed with size limits; every field is type- and
range-checked (so no stored value can later overflow a message field); the
tensor entries must tile the data region exactly and match the file size;
each buffer's bytes are read straight into the caller's payload and hashed;
finally position, boundary and extents must equal the values inside the bytes.
Nothing outside the capsule directory is ever written; temp files start with
``.`` and end with ``.tmp`` so they can never shadow a capsule.

Rooms: ``format`` (what a file says: format tag, dtype names, the manifest and its
checks), ``writer`` (the atomic write and delete), ``reader`` (the distrustful read),
``directory`` (which files are capsules, which are temp files, and the sweep of
orphaned ones). Callers use the names re-exported here.
"""
from __future__ import annotations

from flashrt_ros.runtime.disk.directory import (SUFFIX, TempFile, capsule_path, list_names, remove_orphans,
                                                temp_files)
from flashrt_ros.runtime.disk.format import (FORMAT, FORMAT_VERSION, build_manifest, check_fields, check_manifest,
                                             check_payload_meta, manifest_hash)
from flashrt_ros.runtime.disk.reader import CapsuleFile, load_capsule, open_capsule, read_tensors, scan
from flashrt_ros.runtime.disk.writer import (commit_temp, delete_capsule, discard_temp, write_capsule,
                                             write_safetensors, write_temp)

__all__ = ["FORMAT", "FORMAT_VERSION", "SUFFIX", "CapsuleFile", "TempFile", "build_manifest", "capsule_path",
           "check_fields", "check_manifest", "check_payload_meta", "commit_temp", "delete_capsule", "discard_temp",
           "list_names", "load_capsule", "manifest_hash", "open_capsule", "read_tensors", "remove_orphans", "scan",
           "temp_files", "write_capsule", "write_safetensors", "write_temp"]
