"""Capsule snapshot/restore cost against the copy floor of the same bytes; prints a markdown table.

For each live-state size the arena is a hybrid-like layout (``--layers`` layers,
each an append-only bf16 KV cache holding 75% of the bytes and an fp32
recurrent state holding 25%, plus int64 meta scalars, rng bytes and a pending
buffer), filled with random bytes and fully live, so the whole state is one
contiguous run and a snapshot is a single ``copy_``.

Measured (median of ``--reps``; CUDA events on GPU, perf_counter on CPU):
* device tier: ``store.snapshot`` and ``store.restore`` vs a device-to-device
  copy of the same number of bytes (the floor). Snapshot includes the one host
  read of the meta scalars; restore includes seeding the rollback ring with
  the restored timeline's start (a copy of the non-append-only 25%), which
  the store defers to the next step and the benchmark forces right after.
* host tier: ``store.restore`` from pinned host memory vs a pinned
  host-to-device copy of the same bytes (percentage of its bandwidth).
* disk: ``store.save`` (D2H, hash, safetensors write, fsync) and ``store.load``
  into the host tier (read, verify every hash), in MB/s; the files are dropped
  from the page cache with posix_fadvise before each load where possible.
* copy merging: the same snapshot as one copy per contiguous run vs one copy
  per buffer (``--layers`` * 2 + 4 copies).

    python -m benchmarks.capsules                  # CUDA, 1 MB .. 1 GB
    python -m benchmarks.capsules --cpu            # CPU, 1 / 16 / 64 MB
    python -m benchmarks.capsules --out docs/benchmarks/capsules.md
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

import torch


from benchmarks.timing import median_event_ms, wall_ms
from flashrt_ros.runtime.arena import POSITION, BufferSpec, StateArena, core_meta_specs
from flashrt_ros.runtime.copyplan import CopyPlan, gather
from flashrt_ros.runtime.store import CapsuleStore

MiB = 1 << 20
KV_WIDTH = 256          # bf16 elements per KV row (512 bytes)


def bench_arena(total_bytes: int, layers: int, device: torch.device) -> StateArena:
    kv_rows = max(1, int(total_bytes * 0.75 / layers) // (KV_WIDTH * 2))
    rec_elems = max(1, int(total_bytes * 0.25 / layers) // 4)
    specs = core_meta_specs()
    for i in range(layers):
        specs.append(BufferSpec(f"kv.{i}", (kv_rows, KV_WIDTH), torch.bfloat16, group="kv", live_axis=0,
                                length_from=POSITION, append_only=True))
        specs.append(BufferSpec(f"rec.{i}", (rec_elems,), torch.float32, group="recurrent"))
    specs.append(BufferSpec("rng.state", (16,), torch.uint8, group="rng"))
    specs.append(BufferSpec("pending", (4,), torch.int64, group="meta"))
    arena = StateArena(specs, device=device)
    gen = torch.Generator(device=device).manual_seed(0)
    arena.block.copy_(torch.randint(0, 256, arena.block.shape, dtype=torch.uint8, device=device, generator=gen))
    arena[POSITION].fill_(kv_rows)                       # every live extent full
    arena["meta.boundary"].fill_(1)
    return arena


def drop_page_cache(directory: Path) -> bool:
    if not hasattr(os, "posix_fadvise"):
        return False
    for path in directory.glob("*"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)
    return True


def measure(size: int, args, device: torch.device, directory: Path) -> dict:
    arena = bench_arena(size, args.layers, device)
    live = arena.live_nbytes()
    budget = 4 * arena.nbytes + MiB
    store = CapsuleStore(arena, "bench", device_budget_bytes=budget, host_budget_bytes=budget,
                         disk_budget_bytes=budget, directory=directory, rollback_depth=1)
    row: dict = {"size": size, "live": live}
    cap = store.snapshot("dev")
    row["copies"] = len(cap.plan.copies())
    row["snapshot"] = median_event_ms(lambda: store.snapshot("dev", overwrite=True), args.reps, device)

    def restore_and_seed() -> None:
        store.restore("dev")
        store.ring.before_step()          # the ring's deferred copy of the restored timeline's start

    row["restore"] = median_event_ms(restore_and_seed, args.reps, device)
    src = torch.empty(live, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    row["floor"] = median_event_ms(lambda: dst.copy_(src), args.reps, device)
    del src, dst

    store.snapshot("host", tier="host")
    row["host_restore"] = median_event_ms(lambda: store.restore("host"), args.reps, device)
    pinned = torch.empty(live, dtype=torch.uint8, pin_memory=device.type == "cuda")
    target = torch.empty(live, dtype=torch.uint8, device=device)
    row["h2d"] = median_event_ms(lambda: target.copy_(pinned, non_blocking=True), args.reps, device)
    del pinned, target
    store.drop("host")

    saves, loads, cold = [], [], True
    reader = CapsuleStore(arena, "bench", device_budget_bytes=0, host_budget_bytes=budget,
                          disk_budget_bytes=budget, directory=directory, rollback_depth=0)
    for i in range(args.disk_reps):
        store.snapshot("disk", overwrite=True)
        saves.append(wall_ms(lambda: store.save("disk"), device)[0] / 1e3)
        cold = drop_page_cache(directory) and cold
        loads.append(wall_ms(lambda: reader.load("disk", tier="host"), device)[0] / 1e3)
        reader.drop("disk", delete_files=False)
        store.drop("disk")
    row["save_mbs"] = live / MiB / statistics.median(saves)
    row["load_mbs"] = live / MiB / statistics.median(loads)
    row["cold"] = cold

    extents = {s.name: (s.shape[0] if s.live_axis is not None else None) for s in arena.specs}
    merged = CopyPlan.build(arena, extents)
    split = CopyPlan.build(arena, extents, merge=False)
    pm, ps = torch.empty(merged.nbytes, dtype=torch.uint8, device=device), \
        torch.empty(split.nbytes, dtype=torch.uint8, device=device)
    row["merged_copies"], row["split_copies"] = len(merged.copies()), len(split.copies())
    row["merged_ms"] = median_event_ms(lambda: gather(arena, merged, pm), args.reps, device)
    row["split_ms"] = median_event_ms(lambda: gather(arena, split, ps), args.reps, device)
    return row


def machine(device: torch.device) -> str:
    host = f"{platform.node() or 'host'}, {platform.machine()}, {os.cpu_count()} CPUs, {platform.platform()}"
    if device.type == "cuda":
        return f"{torch.cuda.get_device_name(device)} (torch {torch.__version__}, CUDA {torch.version.cuda}); {host}"
    return f"CPU only (torch {torch.__version__}); {platform.processor() or platform.machine()}; {host}"


def fmt_size(n: int) -> str:
    return f"{n / MiB:.0f} MiB" if n >= MiB else f"{n / 1024:.0f} KiB"


def render(rows: list[dict], device: torch.device, args) -> str:
    timer = "CUDA events" if device.type == "cuda" else "perf_counter"
    lines = [f"# Capsule benchmark", "", f"Machine: {machine(device)}", "",
             f"Median of {args.reps} reps ({timer}, {torch.get_num_threads()} CPU threads); {args.layers} layers (KV 75% bf16, recurrent 25% fp32), "
             "all live extents full.", "",
             "## Device tier vs device-to-device copy of the same bytes", "",
             "| live state | copies | snapshot ms | restore ms | D2D floor ms | snapshot / floor | restore / floor |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {fmt_size(r['live'])} | {r['copies']} | {r['snapshot']:.4f} | {r['restore']:.4f} | "
                     f"{r['floor']:.4f} | {r['snapshot'] / r['floor']:.2f} | {r['restore'] / r['floor']:.2f} |")
    lines += ["", "## Host tier and disk", "",
              "| live state | host-tier restore ms | pinned H2D ms | % of H2D bandwidth | disk save MB/s | "
              "disk load MB/s |", "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {fmt_size(r['live'])} | {r['host_restore']:.4f} | {r['h2d']:.4f} | "
                     f"{100 * r['h2d'] / r['host_restore']:.0f}% | {r['save_mbs']:.0f} | {r['load_mbs']:.0f}"
                     f"{'' if r['cold'] else ' (page cache warm)'} |")
    lines += ["", "## One copy per contiguous run vs one copy per buffer (snapshot gather only)", "",
              "| live state | merged copies | merged ms | per-buffer copies | per-buffer ms | speed-up |",
              "| --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        lines.append(f"| {fmt_size(r['live'])} | {r['merged_copies']} | {r['merged_ms']:.4f} | "
                     f"{r['split_copies']} | {r['split_ms']:.4f} | {r['split_ms'] / r['merged_ms']:.2f}x |")
    lines += ["", "Snapshot includes one host read of the meta scalars (a sync); restore includes re-seeding "
              "the rollback ring (a copy of the non-append-only state). Disk: save = D2H + blake2b hashing + "
              f"safetensors write + fsync; load = read + verify every hash into pinned host memory; median of "
              f"{args.disk_reps} runs.", ""]
    if device.type == "cpu":
        lines += ["On CPU a snapshot allocates a fresh payload each time (no caching allocator), so large "
                  "snapshots pay first-touch page faults on top of the copy; CUDA's caching allocator reuses "
                  "the freed block of the overwritten capsule.", ""]
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--cpu", action="store_true", help="run on CPU with small sizes (1, 16, 64 MB)")
    p.add_argument("--sizes", type=str, default=None, help="comma-separated live-state sizes in MiB")
    p.add_argument("--reps", type=int, default=50)
    p.add_argument("--disk-reps", type=int, default=3)
    p.add_argument("--layers", type=int, default=24)
    p.add_argument("--disk-dir", type=Path, default=None, help="capsule directory (default: a temp dir)")
    p.add_argument("--out", type=Path, default=None, help="also write the table to this markdown file")
    p.add_argument("--threads", type=int, default=1,
                   help="torch CPU threads (default 1: on a shared machine a pool thread waiting for a core "
                        "costs a scheduler slice per copy)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    if args.reps < 1:
        p.error("--reps must be >= 1")
    device = torch.device("cpu" if args.cpu or not torch.cuda.is_available() else "cuda")
    default = "1,16,64" if device.type == "cpu" else "1,16,200,1024"
    sizes = [int(float(s) * MiB) for s in (args.sizes or default).split(",")]
    rows = []
    with tempfile.TemporaryDirectory(prefix="capsule-bench-", dir=args.disk_dir) as tmp:
        for size in sizes:
            rows.append(measure(size, args, device, Path(tmp)))
            print(f"measured {fmt_size(size)}", file=sys.stderr)
    table = render(rows, device, args)
    print(table)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(table)


if __name__ == "__main__":
    main()
