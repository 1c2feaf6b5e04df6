"""Markdown tables and the optional plot of a ``python -m benchmarks.llm`` run."""
from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

NA = "n/a"


def _f(value: Any, fmt: str = "{:.2f}") -> str:
    if value is None:
        return NA
    if isinstance(value, bool):
        return "yes" if value else "**NO**"
    if isinstance(value, float):
        return fmt.format(value)
    return str(value)


def _ratio(a: Any, b: Any) -> float | None:
    if a is None or b is None or b <= 0:
        return None
    return a / b


def _table(header: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    return "\n".join(lines)


def _anatomy_table(models: list[dict[str, Any]], key: str, title: str) -> list[str]:
    rows = [m for m in models if m.get(key)]
    if not rows:
        return []
    kinds = ("gemm", "triton (ours)", "fla", "other")
    body = [[m["name"], str(m[key]["position"]), str(m[key].get("tokens", 1)), _f(m[key]["kernels"], "{:.0f}"),
             _f(m[key]["kernel_ms"], "{:.3f}")]
            + [f"{m[key][k + ' kernels']:.0f} / {m[key][k + ' ms']:.3f}" for k in kinds] for m in rows]
    return ["", f"### {title}", "",
            _table(["model", "position", "tokens", "kernels", "sum of kernel time (ms)"]
                   + [f"{k}: kernels / ms" for k in kinds], body)]


def render(machine: dict[str, Any], models: list[dict[str, Any]], rows: list[dict[str, Any]],
           notes: list[str]) -> str:
    """The whole report: machine, models, follow-up turn, identity, re-entry, decode, capsules, notes."""
    get: Callable[[dict, str], Any] = lambda r, k: r.get(k)
    out = ["# LLM benchmark (`python -m benchmarks.llm`)", "", "## Machine", ""]
    out += [f"- {k}: {v}" for k, v in machine.items()]
    out += ["", "## Models", ""]
    for m in models:
        out.append(f"- **{m['name']}**: {m['params'] / 1e6:.1f} M parameters, weights {m['weights']}, "
                   f"decode weight read {m['weight_bytes'] / 2**20:.1f} MiB; transformers baseline: "
                   f"{m['hf'] or NA}")
    follow = [[r["model"], str(r["context"]), str(get(r, "turn_tokens") or NA),
               _f(get(r, "cold_turn_ttft_ms")), _f(get(r, "followup_ttft_ms"), "{:.3f}"),
               _f(_ratio(get(r, "cold_turn_ttft_ms"), get(r, "followup_ttft_ms")), "{:.1f}x"),
               _f(get(r, "hf_cold_turn_ttft_ms")), _f(get(r, "hf_followup_deepcopy_ms")),
               _f(get(r, "hf_followup_clone_ms")),
               _f(_ratio(get(r, "hf_cold_turn_ttft_ms"), get(r, "hf_followup_deepcopy_ms")), "{:.1f}x"),
               _f(_ratio(get(r, "hf_cold_turn_ttft_ms"), get(r, "hf_followup_clone_ms")), "{:.1f}x"),
               _f(_ratio(get(r, "hf_cold_turn_ttft_ms"), get(r, "cold_turn_ttft_ms")), "{:.2f}x")] for r in rows]
    out += ["", "## Follow-up turn (ms): N tokens in a capsule, T new tokens, first token", "",
            "(a) cold = reset + prefill of all N+T ids + first token; (f) capsule = restore of the N-token "
            "capsule + prefill of the T new ids + first token. HF: one forward over N+T ids (cold), or "
            "the cache of N restored by `copy.deepcopy` / by `clone()` of every tensor, then one forward "
            "of the T ids.", "",
            _table(["model", "N", "T", "(a) cold N+T→token", "(f) capsule→turn→token", "follow-up speedup (a)/(f)",
                    "HF cold N+T", "HF deepcopy→turn", "HF clone→turn", "HF speedup (deepcopy)",
                    "HF speedup (clone)", "HF/ours cold"], follow)]
    ident = [[r["model"], str(r["context"]), _f(get(r, "followup_aligned")), _f(get(r, "followup_token_match")),
              _f(get(r, "followup_logits_max_diff"), "{:.3g}"),
              str(get(r, "unaligned_prefix") or NA), _f(get(r, "unaligned_token_match")),
              _f(get(r, "unaligned_logits_max_diff"), "{:.3g}"),
              _f(get(r, "hf_followup_token_match")), _f(get(r, "hf_clone_token_match"))] for r in rows]
    out += ["", "### Token identity of the capsule path vs the cold path", "",
            "Tokens: the first 4 greedy tokens. *Prefix on a cold chunk boundary*: the cold run of N+T ids "
            "is cut into the same prefill chunks as N then T. The unaligned prefix (its length in the table; "
            "N-40 ids) is followed by the same T ids and cut differently from the cold run.", "",
            _table(["model", "N", "prefix on a cold chunk boundary", "tokens = cold", "logits max |diff|",
                    "unaligned prefix", "tokens = cold", "logits max |diff|",
                    "HF deepcopy→turn token = HF cold", "HF clone→turn token = HF cold"], ident)]
    reentry = [[r["model"], str(r["context"]), _f(get(r, "cold_ttft_ms")), _f(get(r, "reentry_ttft_ms"), "{:.3f}"),
                _f(_ratio(get(r, "cold_ttft_ms"), get(r, "reentry_ttft_ms")), "{:.1f}x"),
                _f(get(r, "hf_cold_ttft_ms")), _f(get(r, "hf_reentry_ttft_ms"), "{:.3f}"),
                _f(get(r, "first_token_match")), _f(get(r, "continuation_match")),
                _f(get(r, "hf_continuation_match"))] for r in rows]
    out += ["", "## Re-entry (ms): restore → the token the capsule's stored logits give", "",
            "Re-entry = `restore` + sampling the first token from the last prompt token's logits kept in "
            "the capsule; no model forward runs, so this is bytes copied against a prefill and grows with "
            "N by construction. It is what resuming an interrupted generation costs, not a new turn.", "",
            _table(["model", "N", "cold prefill N→token", "re-entry", "cold/re-entry", "HF cold N",
                    "HF deepcopy re-entry", "token = uninterrupted", "4 tokens = uninterrupted",
                    "HF continuation ok"], reentry)]
    dec = [[r["model"], str(r["context"]), _f(get(r, "decode_ms"), "{:.3f}"), _f(get(r, "decode_floor_ms"), "{:.3f}"),
            _f(_ratio(get(r, "decode_ms"), get(r, "decode_floor_ms")), "{:.1f}x")] for r in rows]
    out += ["", "## Decode at batch 1 (ms/token)", "",
            _table(["model", "context", "(d) decode step", "weight-read floor", "decode/floor"], dec)]
    out += _anatomy_table(models, "decode_anatomy", "Decode step anatomy (one eager model forward, profiler)")
    out += _anatomy_table(models, "turn_anatomy", "Follow-up turn prefill anatomy (one eager forward of T "
                                                  "tokens at position N, profiler)")
    cap = [[r["model"], str(r["context"]), _f(None if get(r, "capsule_bytes") is None
                                              else get(r, "capsule_bytes") / 2**20, "{:.3f}"),
            _f(get(r, "snapshot_ms"), "{:.3f}"), _f(get(r, "restore_ms"), "{:.3f}"),
            _f(get(r, "copy_floor_ms"), "{:.3f}"),
            _f(_ratio(get(r, "snapshot_ms"), get(r, "copy_floor_ms")), "{:.1f}x"),
            _f(_ratio(get(r, "restore_ms"), get(r, "copy_floor_ms")), "{:.1f}x"),
            _f(get(r, "hf_snapshot_ms"), "{:.3f}"),
            _f(_ratio(get(r, "hf_snapshot_ms"), get(r, "snapshot_ms")), "{:.1f}x")] for r in rows]
    out += ["", "## Capsules (ms, median)", "",
            "(e) restore includes the rollback ring's seeding of the restored timeline.", "",
            _table(["model", "context", "live MiB", "(e) snapshot", "(e) restore + ring seed", "copy floor",
                    "snapshot/floor", "restore/floor", "HF deepcopy", "HF deepcopy/our snapshot"], cap)]
    if notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> str | None:
    """Follow-up-turn time to first token against N, log scale; returns None when written, else why not."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"plot skipped: matplotlib not importable ({type(exc).__name__})"
    series = [("cold_turn_ttft_ms", "ours cold N+T"), ("followup_ttft_ms", "ours capsule + turn"),
              ("hf_cold_turn_ttft_ms", "HF cold N+T"), ("hf_followup_deepcopy_ms", "HF deepcopy + turn")]
    lines = []
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        for key, label in series:
            pts = [(r["context"], r[key]) for r in mine if r.get(key) is not None]
            if pts:
                lines.append((pts, f"{model}: {label}"))
    if not lines:
        return "plot skipped: no row has a measured follow-up-turn time (all were skipped)"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for pts, label in lines:
        ax.plot(*zip(*pts), marker="o", label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("tokens already in the conversation N")
    ax.set_ylabel("follow-up turn: time to first token (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
