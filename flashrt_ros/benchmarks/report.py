"""Markdown tables and the optional plot of a ``flashrt-bench`` run."""
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


def render(machine: dict[str, Any], models: list[dict[str, Any]], rows: list[dict[str, Any]],
           notes: list[str]) -> str:
    """The whole report: machine, models, three tables (TTFT, decode, capsules), notes."""
    get: Callable[[dict, str], Any] = lambda r, k: r.get(k)
    out = ["# LLM benchmark (`flashrt-bench`)", "", "## Machine", ""]
    out += [f"- {k}: {v}" for k, v in machine.items()]
    out += ["", "## Models", ""]
    for m in models:
        out.append(f"- **{m['name']}**: {m['params'] / 1e6:.1f} M parameters, weights {m['weights']}, "
                   f"decode weight read {m['weight_bytes'] / 2**20:.1f} MiB; transformers baseline: "
                   f"{m['hf'] or NA}")
    ttft = [[r["model"], str(r["context"]), _f(get(r, "cold_ttft_ms")), _f(get(r, "restore_ttft_ms"), "{:.3f}"),
             _f(_ratio(get(r, "cold_ttft_ms"), get(r, "restore_ttft_ms")), "{:.1f}x"),
             _f(get(r, "hf_cold_ttft_ms")), _f(_ratio(get(r, "hf_cold_ttft_ms"), get(r, "cold_ttft_ms")), "{:.2f}x"),
             _f(get(r, "hf_restore_ttft_ms"), "{:.3f}"),
             _f(get(r, "first_token_match")), _f(get(r, "continuation_match")),
             _f(get(r, "hf_continuation_match")),
             _f(None if get(r, "hf_first_token") is None or get(r, "first_token") is None
                else get(r, "hf_first_token") == get(r, "first_token"))] for r in rows]
    out += ["", "## Time to first token (ms)", "",
            _table(["model", "context", "(a) cold prefill→token", "(b) restore→token", "TTFT speedup (a)/(b)",
                    "(c) HF prefill→token", "HF/ours prefill", "(c) HF deepcopy restore→token",
                    "restore token = uninterrupted", f"restore continuation = uninterrupted",
                    "HF restore continuation ok", "HF first token = ours"], ttft)]
    dec = [[r["model"], str(r["context"]), _f(get(r, "decode_ms"), "{:.3f}"), _f(get(r, "decode_floor_ms"), "{:.3f}"),
            _f(_ratio(get(r, "decode_ms"), get(r, "decode_floor_ms")), "{:.1f}x")] for r in rows]
    out += ["", "## Decode at batch 1 (ms/token)", "",
            _table(["model", "context", "(d) decode step", "weight-read floor", "decode/floor"], dec)]
    anatomy = [m for m in models if m.get("decode_anatomy")]
    if anatomy:
        kinds = ("gemm", "triton (ours)", "fla", "other")
        body = [[m["name"], str(m["decode_anatomy"]["position"]), _f(m["decode_anatomy"]["kernels"], "{:.0f}"),
                 _f(m["decode_anatomy"]["kernel_ms"], "{:.3f}")]
                + [f"{m['decode_anatomy'][k + ' kernels']:.0f} / {m['decode_anatomy'][k + ' ms']:.3f}" for k in kinds]
                for m in anatomy]
        out += ["", "### Decode step anatomy (one eager model forward, profiler)", "",
                _table(["model", "position", "kernels", "sum of kernel time (ms)"]
                       + [f"{k}: kernels / ms" for k in kinds], body)]
    cap = [[r["model"], str(r["context"]), _f(None if get(r, "capsule_bytes") is None
                                              else get(r, "capsule_bytes") / 2**20, "{:.3f}"),
            _f(get(r, "snapshot_ms"), "{:.3f}"), _f(get(r, "restore_ms"), "{:.3f}"),
            _f(get(r, "copy_floor_ms"), "{:.3f}"),
            _f(_ratio(get(r, "snapshot_ms"), get(r, "copy_floor_ms")), "{:.1f}x"),
            _f(_ratio(get(r, "restore_ms"), get(r, "copy_floor_ms")), "{:.1f}x"),
            _f(get(r, "hf_snapshot_ms"), "{:.3f}"),
            _f(_ratio(get(r, "hf_snapshot_ms"), get(r, "snapshot_ms")), "{:.1f}x")] for r in rows]
    out += ["", "## Capsules (ms, median)", "",
            _table(["model", "context", "live MiB", "(e) snapshot", "(e) restore", "copy floor",
                    "snapshot/floor", "restore/floor", "HF deepcopy", "HF deepcopy/our snapshot"], cap)]
    if notes:
        out += ["", "## Notes", ""] + [f"- {n}" for n in notes]
    return "\n".join(out) + "\n"


def plot(rows: list[dict[str, Any]], path: Path) -> str | None:
    """TTFT against context, log scale; returns None when written, else why not."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception as exc:
        return f"plot skipped: matplotlib not importable ({type(exc).__name__})"
    fig, ax = plt.subplots(figsize=(7, 4.5))
    series = [("cold_ttft_ms", "ours cold prefill"), ("restore_ttft_ms", "ours restore"),
              ("hf_cold_ttft_ms", "HF cold prefill"), ("hf_restore_ttft_ms", "HF deepcopy restore")]
    for model in dict.fromkeys(r["model"] for r in rows):
        mine = [r for r in rows if r["model"] == model]
        for key, label in series:
            pts = [(r["context"], r[key]) for r in mine if r.get(key) is not None]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"{model}: {label}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("context (tokens)")
    ax.set_ylabel("time to first token (ms)")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return None
