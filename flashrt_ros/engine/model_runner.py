"""Step execution of the LLM engine: the step bodies, their CUDA graphs, committed boundaries.

Why apart from the engine (as nano-vllm keeps its model runner apart from its
engine): the engine decides *what* to run (tokenise, chunk, loop until a stop);
the runner knows *how* a step runs — a pure-tensor body over the arena, eager
or replayed as a graph, then a host read of the new token, the report, and the
commit (``meta.boundary += 1`` plus a rollback-ring record). A step that raises
is undone (``ring.rollback(0)``).

Step bodies only touch arena tensors and static inputs, with positions read
from ``meta.position`` as a tensor: fixed shapes, no host sync, capturable. One
graph per step shape serves every position: decode, the first-token draw, and
each prefill chunk length (prompt ids go through a static feed buffer).

With speculative decoding (``speculation``, see ``engine.speculative_steps``)
the same steps also keep the drafter in step (prefill and decode feed it, every
emitting step drafts), a prefill chunk at position 0 is its own graph (the
drafter has no row before it), and one more step verifies the drafts: one
graph per sampling mode, emitting one to ``k+1`` tokens.
"""
from __future__ import annotations

import time
from typing import Callable

import torch

from flashrt_ros.engine.graphs import StepRunner, prefill_lengths
from flashrt_ros.engine.host_mirror import HostMirror
from flashrt_ros.engine.sampling import greedy_token, sample_token
from flashrt_ros.engine.speculative_steps import SpeculativeDecoding
from flashrt_ros.engine.state import (HAS_PENDING, LAST_TOKEN, LOGITS, PENDING, RNG_COUNTER, RNG_SEED,
                                      TEMPERATURE, TOKENS, TOP_K, TOP_P)
from flashrt_ros.engine.stats import LatencyStats
from flashrt_ros.models.base import CausalLM
from flashrt_ros.runtime.arena import BOUNDARY, POSITION, StateArena
from flashrt_ros.runtime.boundary import BoundaryGate
from flashrt_ros.runtime.errors import InvalidArgument
from flashrt_ros.runtime.rollback import RollbackRing

Version = Callable[[], tuple[int, int]]


class ModelRunner:
    """Runs one CausalLM's steps over its arena, each ending at a committed boundary."""

    def __init__(self, model: CausalLM, arena: StateArena, ring: RollbackRing, gate: BoundaryGate, *,
                 prefill_chunk: int, cuda_graphs: bool, version: Version,
                 speculation: SpeculativeDecoding | None = None) -> None:
        self.model = model
        self.speculation = speculation
        self.arena = arena
        self.ring = ring
        self.gate = gate
        self.device = arena.device
        self.stats = LatencyStats()
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self.version = version            # changes whenever the state is replaced from outside
        self._arange = torch.arange(max(prefill_chunk, 1), device=self.device)
        self._feed = torch.zeros(max(prefill_chunk, 1), dtype=torch.int64, device=self.device)
        self.prefill_chunk = prefill_chunk
        pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        self._step_runner = lambda body: StepRunner(body, arena, enabled=self.cuda_graphs, pool=pool)
        self.prefill_runners: dict[tuple[int, bool], StepRunner] = {}
        self.decode_runners = {
            ("draw", True): self._step_runner(lambda: self._draw_step(True)),
            ("draw", False): self._step_runner(lambda: self._draw_step(False)),
            ("decode", True): self._step_runner(lambda: self._decode(True)),
            ("decode", False): self._step_runner(lambda: self._decode(False)),
        }
        if speculation is not None:
            self.decode_runners[("verify", True)] = self._step_runner(lambda: speculation.verify(True))
            self.decode_runners[("verify", False)] = self._step_runner(lambda: speculation.verify(False))
        self._scalars = HostMirror(version, self.read_scalars)     # (position, has_pending) on the host

    # ------------------------------------------------------------------ bodies
    # Pure tensor code: no host reads, fixed shapes. Safe to capture.
    def _draw(self, greedy: bool) -> None:
        """Sample the next token from ``meta.logits`` into ``meta.pending_token``."""
        a = self.arena
        logits = a[LOGITS]
        if greedy:
            token = greedy_token(logits)
        else:
            token = sample_token(logits, a[TEMPERATURE], a[TOP_K], a[TOP_P], a[RNG_SEED], a[RNG_COUNTER])
        a[PENDING].copy_(token)
        a[HAS_PENDING].fill_(1)
        a[RNG_COUNTER].add_(1)

    def _draw_step(self, greedy: bool) -> None:
        """The first-token draw (nothing pending); with speculation, drafting after it."""
        self._draw(greedy)
        if self.speculation is not None:
            self.speculation.after_draw(greedy)

    def _consume_pending(self) -> torch.Tensor | None:
        """Feed ``meta.pending_token`` to the model at ``meta.position``; with speculation, its hidden state."""
        a = self.arena
        position = a[POSITION].view(1)
        token = a[PENDING].view(1)
        a[TOKENS].index_copy_(0, position, token)
        hidden = None
        if self.speculation is None:
            logits = self.model(token, position, a, last_only=True)
        else:
            hidden = self.model.hidden_states(token, position, a)
            logits = self.model.logits(hidden)
        a[LOGITS].copy_(logits[-1])
        a[LAST_TOKEN].copy_(a[PENDING])
        a[HAS_PENDING].zero_()
        a[POSITION].add_(1)
        return hidden

    def _decode(self, greedy: bool) -> None:
        hidden = self._consume_pending()
        self._draw(greedy)
        if self.speculation is not None:
            self.speculation.after_decode(hidden, greedy)

    def _prefill_body(self, t: int, first: bool) -> None:
        """Feed the first ``t`` ids of the static feed buffer at positions ``position .. position+t-1``.

        ``first``: the chunk starts at position 0 (only the drafter cares).
        """
        a = self.arena
        ids = self._feed[:t]
        positions = a[POSITION] + self._arange[:t]
        a[TOKENS].index_copy_(0, positions, ids)
        if self.speculation is None:
            logits = self.model(ids, positions, a, last_only=True)
        else:
            hidden = self.model.hidden_states(ids, positions, a)
            logits = self.model.logits(hidden[-1:])
            self.speculation.observe_prefill(hidden, ids, a[POSITION], first)
        a[LOGITS].copy_(logits[-1])
        a[LAST_TOKEN].copy_(ids[-1])
        a[HAS_PENDING].zero_()
        a[POSITION].add_(t)

    def _prefill_runner(self, t: int, first: bool = False) -> StepRunner:
        first = first and self.speculation is not None       # the same graph either way without it
        runner = self.prefill_runners.get((t, first))
        if runner is None:
            runner = self.prefill_runners[(t, first)] = self._step_runner(lambda: self._prefill_body(t, first))
        return runner

    # ------------------------------------------------------------------ steps
    def prefill_step(self, chunk: torch.Tensor, *, after: tuple[int, int], first: bool = False) -> None:
        """One committed prefill step: ``chunk`` into the feed buffer, run (or replay) its length.

        ``first``: the chunk starts at position 0.
        """
        def body() -> None:
            t = chunk.shape[0]
            self._feed[:t].copy_(chunk)
            self._prefill_runner(t, first)()
        self.run_step("prefill_chunk", body, emits=False, after=after)

    def decode_step(self, *, greedy: bool, has_pending: int, report: Callable[[int], None] | None,
                    after: tuple[int, int]) -> int:
        """One committed decode step (or, with nothing pending, the first-token draw)."""
        runner = self.decode_runners[("decode" if has_pending else "draw", greedy)]
        token = self.run_step("decode" if has_pending else "first_token", runner, emits=True,
                              report=report, after=after)
        assert token is not None
        return token

    def speculative_step(self, *, greedy: bool, limit: int, report: Callable[[int], None] | None,
                         position: int) -> list[int]:
        """One committed speculative step from ``position`` (a token pending): 1 .. k+1 tokens, each reported.

        ``limit`` (>= 1): the most tokens the request may still emit; stop ids
        are set beforehand (``speculation.set_stops``).
        """
        assert self.speculation is not None
        spec = self.speculation
        runner = self.decode_runners[("verify", greedy)]

        def body() -> None:
            spec.limit.fill_(limit)
            runner()
        tokens = self._run_step("speculative", body, spec.read_output, report,
                                lambda emitted: (position + len(emitted), 1))
        spec.count(tokens)
        return tokens

    def run_step(self, kind: str, body: Callable[[], None], *, emits: bool,
                 report: Callable[[int], None] | None = None,
                 after: tuple[int, int] | None = None) -> int | None:
        """One committed step: body, host read of the new token, report, commit.

        ``after``: ``(position, has_pending)`` once the step has committed, kept on
        the host so the next step need not read them from the device.
        """
        read = (lambda: [int(self.arena[PENDING].item())]) if emits else None
        tokens = self._run_step(kind, body, read, report, lambda _: after)
        return tokens[0] if emits else None

    def _run_step(self, kind: str, body: Callable[[], None], read: Callable[[], list[int]] | None,
                  report: Callable[[int], None] | None,
                  after: Callable[[list[int]], tuple[int, int] | None]) -> list[int]:
        with self.gate.step():
            start = time.perf_counter()
            self.ring.before_step()
            try:
                with torch.no_grad():
                    body()
                tokens = read() if read is not None else []
                if read is None and self.device.type == "cuda":
                    torch.cuda.current_stream().synchronize()
                if report is not None:
                    for token in tokens:
                        report(token)
                self.commit()
                self._scalars.keep(after(tokens))
            except BaseException:
                self.abort_step()
                raise
            self.stats.record(kind, time.perf_counter() - start)
        return tokens

    def commit(self) -> None:
        """End a step: the boundary counter moves on and the ring records the state."""
        self.arena[BOUNDARY].add_(1)
        self.ring.record()

    def abort_step(self) -> None:
        """Undo a step that failed half-way: back to the last committed boundary."""
        try:
            self.ring.rollback(0)
        except InvalidArgument:       # nothing recorded: cannot happen after a cold start, be safe
            pass

    # ------------------------------------------------------------------ scalars
    def scalars(self) -> tuple[int, int]:
        """``(position, has_pending)`` at a boundary: as the last step left them, else one device read.

        Why keep them on the host: a decode step would otherwise start with a
        device-to-host sync. Any write of the state from outside the engine's
        steps changes ``version()`` and so discards the kept values.
        """
        return self._scalars.get()

    def read_scalars(self) -> tuple[int, int]:
        """``(position, has_pending)`` read from the device now."""
        position, has_pending = torch.stack([self.arena[POSITION], self.arena[HAS_PENDING]]).tolist()
        return int(position), int(has_pending)

    # ------------------------------------------------------------------ graphs
    def capture_all(self, max_context: int) -> int:
        """Capture every step graph (decode, draw, each prefill length); changes no state.

        Call at a boundary. Returns how many graphs were captured.
        """
        saved = self.arena.block.clone()
        try:
            lengths = [n for n in prefill_lengths(self.prefill_chunk) if n <= max_context]
            count = 0
            with torch.no_grad():
                self.arena[POSITION].zero_()          # every prefill length must fit below max_context
                for n in lengths:
                    count += self._prefill_runner(n, first=True).capture()
                if self.speculation is not None:      # later chunks (the drafter reads the row before)
                    self.arena[POSITION].fill_(1)
                    for n in lengths:
                        if 1 + n <= max_context:
                            count += self._prefill_runner(n).capture()
                    self.arena[HAS_PENDING].fill_(1)  # decode, draw and verify at position 1 (k+2 <= max_context)
                for runner in self.decode_runners.values():
                    count += runner.capture()
            return count
        finally:
            self.arena.block.copy_(saved)
            torch.cuda.current_stream().synchronize()
