"""The race's markdown page (``benchmarks.policies``, ``benchmarks.smolvla``): the headline first, every side, the
checks, the capsules, the notes.

Why apart from ``benchmarks.race``: that module runs and checks a race; this one only writes what the results
say, so a page can be rewritten from a JSON without racing again.
"""
from __future__ import annotations

import torch

from benchmarks.provenance import summary_line
from benchmarks.race import RaceSettings, tolerance

TIMED = {
    "lerobot": "pre-processor (batch dim, to the device, normalisation; SmolVLA: task tokenisation) + "
               "select_action under torch.inference_mode() (+ torch.autocast bf16) + post-processor "
               "(unnormalisation, to the CPU), from host observation tensors",
    "ours": "PolicyEngine.step under torch.inference_mode() (validation, copy into the static inputs, the replan "
            "or pop graph incl. normalisation and unnormalisation, boundary commit + rollback record, device "
            "synchronisation) + the action to the host, from the same host observation tensors",
    "episode": "wall clock from the reset (included) to the last action on the host; noise for a plan is drawn "
               "before its step (untimed)",
}


def _ci(sp: dict[str, float] | None) -> str:
    if not sp:
        return "n/a"
    return f"**{sp['ratio']:.2f}x** [{sp['low']:.2f}, {sp['high']:.2f}]"


def _ours(r: dict) -> list[str]:
    return r.get("ours_sides", ["ours"])


def _check(c: dict) -> str:
    """A side's check: first chunk, and the whole checked episode when longer."""
    text = f"{c['max_rel']:.2e}"
    if c.get("episode_steps", c["steps"]) > c["steps"]:
        text += f" / {c['episode_max_rel']:.2e}"
    return text + ("" if c["passed"] else " **FAIL**")


def headline_lines(results: dict[str, dict]) -> list[str]:
    """The fair numbers first: ours (our first side) against LeRobot's fastest mode of the precision, then eager
    and compiled."""
    lines = ["| policy | ours | ours episode (median) | LeRobot fastest mode | its episode | speed-up [95 % CI] "
             "| vs LeRobot eager | vs LeRobot compiled | ours check (tolerance) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        sides, head = r["sides"], r.get("headline", {})
        first = _ours(r)[0]
        ours = sides.get(first)
        if ours is None:
            lines.append(f"| {name} | {first} | failed: {r['errors'].get(first, 'no episode')} | | | | | | |")
            continue
        pick = {k: sides[n] for k, n in head.items() if n}
        fast = pick.get("fastest")
        cells = [name, first, f"{ours['episode_ms']:.1f} ms", head.get("fastest") or "none passed the check",
                 f"{fast['episode_ms']:.1f} ms" if fast else "", _ci(fast["speedup"]) if fast else "",
                 _ci(pick["eager"]["speedup"]) if "eager" in pick else "n/a",
                 _ci(pick["compiled"]["speedup"]) if "compiled" in pick else "n/a",
                 f"{_check(ours['first_chunk'])} ({r['tolerance_rel']:.0e})"]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def side_lines(results: dict[str, dict]) -> list[str]:
    """Every side of every race: spread, replans, pops, period misses, the check, the warm-up."""
    lines = ["| policy | side | episode min / median / max ms | speed-up of ours [95 % CI] "
             "| replan p50 / p99 ms (n) | pop p50 / p99 ms | steps > 20 / 33 ms | error (rel): first chunk "
             "[/ episode] | warm-up s (episodes, frames compiled) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        for side_name, v in r["sides"].items():
            e, op = v["episode"], v["over_period"]
            sp = _ci(v.get("speedup")) if side_name != _ours(r)[0] else ""
            skips = v.get("counters", {}).get("inductor.cudagraph_skips", 0)
            warm = (f"{v.get('warmup_s', float('nan')):.1f} ({v.get('warmup_episodes', 0)}, "
                    f"{v.get('compiled_frames', 0)}{'' if v.get('settled', True) else ', still compiling'}"
                    f"{f', CUDA graphs skipped {skips}x' if skips else ''})")
            lines.append(
                f"| {name} | {side_name} | {e['min']:.1f} / {e['median']:.1f} / {e['max']:.1f} | {sp} | "
                f"{v['replan_p50_ms']:.3f} / {v['replan_p99_ms']:.3f} ({v['replans']}) | "
                f"{v['pop_p50_ms']:.3f} / {v['pop_p99_ms']:.3f} | "
                f"{100 * op['20ms']:.1f} % / {100 * op['33ms']:.1f} % | {_check(v['first_chunk'])} | {warm} |")
        for who, err in r["errors"].items():
            lines.append(f"| {name} | {who} | failed: {err.splitlines()[0][:160]} | | | | | | |")
    return lines


def capsule_lines(results: dict[str, dict]) -> list[str]:
    lines = ["| policy | state bytes | live bytes | snapshot ms | restore ms | copy floor ms | bytes copied |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for name, r in results.items():
        c = r.get("capsule")
        if c:
            lines.append(f"| {name} | {c['state_bytes']} | {c['live_bytes']} | {c['snapshot_ms']:.4f} | "
                         f"{c['restore_ms']:.4f} | {c['copy_floor_ms']:.4f} | {c['copy_bytes']} |")
    return lines


def report(title: str, what: str, results: dict[str, dict], s: RaceSettings, prov: dict, command: str,
           inputs: str) -> str:
    """The markdown page: machine, what was timed, the fair headline first, every side, checks, capsules, notes."""
    flags = prov["flags"]
    checked = f"the first chunk [/ all {s.check_steps} steps]" if s.check_steps else "the first chunk"
    lines = [f"# {title}", "",
             f"Machine: {summary_line(prov)}. {what}; {s.steps} steps per episode from a reset, {s.episodes} timed "
             f"episodes per side (after {s.warmup} warm-up; a compiled LeRobot mode: until an episode compiles "
             f"nothing, at most {s.compile_warmup_max}), sides alternating (the first side rotates), at least "
             f"{s.replans} replans per side (episodes + a replan loop); times in ms; load average at the end "
             f"{prov['load_average'][0] if prov['load_average'] else float('nan'):.2f}.", "",
             f"Command: `{command}`", "",
             f"Timed, LeRobot: {TIMED['lerobot']}. Ours: {TIMED['ours']}. Episode: {TIMED['episode']}. "
             f"Observations start on the {inputs}.", "",
             f"Flags on both sides (lerobot_eval's): cudnn.benchmark={flags['cudnn.benchmark']}, "
             f"cuda.matmul.allow_tf32={flags['cuda.matmul.allow_tf32']}, cudnn.allow_tf32={flags['cudnn.allow_tf32']}, "
             f"float32_matmul_precision={flags['float32_matmul_precision']}, every step under torch.inference_mode(). "
             f"Same noise: LeRobot's select_action(noise=...) gets our stream's draw of each plan (seed {s.seed}).", "",
             "## Headline: ours against LeRobot's fastest mode of the precision", "",
             "Speed-up = median LeRobot episode / median ours, 95 % bootstrap interval over episodes. Only a "
             "LeRobot mode whose check passed can be the baseline.", "",
             *headline_lines(results), "",
             "## Every side", "",
             f"Error: max |action - LeRobot eager fp32's| over {checked} of the first timed episode, relative to the "
             f"largest reference action there; tolerance fp32 {tolerance('fp32', s.tolerances):.0e}"
             f" ({'TF32 on' if torch.backends.cuda.matmul.allow_tf32 and prov.get('gpu') is not None else 'no TF32'}),"
             f" bf16 {tolerance('bf16', s.tolerances):.0e}; every side of ours must pass (else the run fails). "
             "Warm-up: seconds, episodes, frames torch.compile compiled (a compiled mode warms up until an episode "
             "compiles nothing).", "",
             *side_lines(results), "",
             "## Capsules (ours)", "", *capsule_lines(results)]
    notes = [f"{name}: {n}" for name, r in results.items() for n in r.get("notes", [])]
    notes += [f"{name}: torch.compile compiled during the timed episodes: {r['compile_counters_during_timing']}"
              for name, r in results.items() if r.get("compile_counters_during_timing", {}).get("frames.total")]
    if notes:
        lines += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    return "\n".join(lines) + "\n"
