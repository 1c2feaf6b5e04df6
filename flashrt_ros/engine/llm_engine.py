"""The LLM engine: chunked prefill, token-by-token decode, and capsules of its whole state.

Why it looks like this:
- All state that decides the next token lives in one StateArena: the model's
  buffers plus the engine's (``engine.state``). A capsule is a copy of those
  bytes, so restore -> continue is token-identical to never having stopped.
- Every step runs inside ``gate.step()`` and ends by *committing* a boundary
  (``meta.boundary += 1`` and a rollback-ring record). Requests from other
  threads (snapshot, restore, rollback, ...) run right after a commit, so they
  always see a committed state. A step reports its token through ``on_token``
  *before* it commits, so a committed state never holds a token the client has
  not been told about. A step that raises is undone (``ring.rollback(0)``).
- Step bodies only touch arena tensors and static inputs, with positions read
  from ``meta.position`` as a tensor: fixed shapes, no host sync, capturable as
  CUDA graphs (``cuda_graphs=True``). The one host read per step is at the
  boundary, where the engine must look at the new token (stop ids, callback).
- With graphs, one graph per step shape serves every position: decode, the
  first-token draw, and prefill chunks. Prompt ids are copied into a static
  feed buffer before a chunk's replay; a prompt is cut into full chunks plus
  its remainder as descending powers of two, so at most
  ``log2(prefill_chunk) + 2`` prefill graphs exist (``chunk_lengths``).
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

from flashrt_ros import __version__
from flashrt_ros.engine.config import GenerationResult, StoreConfig
from flashrt_ros.engine.graphs import StepRunner, chunk_lengths, prefill_lengths
from flashrt_ros.engine.sampling import SamplingParams, greedy_token, sample_token
from flashrt_ros.engine.state import (HAS_PENDING, LAST_TOKEN, LOGITS, PENDING, PROMPT_LENGTH,
                                      RNG_COUNTER, RNG_SEED, TEMPERATURE, TOKENS, TOP_K, TOP_P,
                                      engine_state_specs)
from flashrt_ros.engine.stats import LatencyStats
from flashrt_ros.models.base import CausalLM, FingerprintInputs
from flashrt_ros.models.tokenizer import StreamDecoder, Tokenizer
from flashrt_ros.runtime.arena import BOUNDARY, POSITION, StateArena, core_meta_specs
from flashrt_ros.runtime.boundary import BoundaryGate
from flashrt_ros.runtime.capsule import CapsuleInfo, VerifyReport
from flashrt_ros.runtime.errors import Busy, ContextOverflow, InvalidArgument
from flashrt_ros.runtime.fingerprint import compute_fingerprint
from flashrt_ros.runtime.store import CapsuleStore

OnToken = Callable[[int, str], None]
ShouldStop = Callable[[], bool]


class LLMEngine:
    """Hosts one CausalLM over a StateArena, with a CapsuleStore, rollback ring and boundary gate.

    Threading: ``generate``/``prefill``/``decode_step`` run in one engine thread
    at a time. Capsule verbs may be called from any thread; the ones that read
    or write the arena (snapshot, restore, rollback, reset, verify against live,
    transcript) run through ``gate.run_at_boundary`` and land between two steps.
    The others (fork, drop, list, get, save, load, stored-hash verify) only
    touch the store, which has its own lock, so they never wait for a step.
    A restore, rollback or reset that lands during ``generate`` ends that
    generation with ``stop_reason="cancelled"`` (the state it was extending is gone).
    """

    def __init__(self, model: CausalLM, tokenizer: Tokenizer, *, max_context: int = 2048,
                 device: torch.device | str | None = None, store_config: StoreConfig | None = None,
                 prefill_chunk: int = 128, fingerprint_inputs: FingerprintInputs | None = None,
                 cuda_graphs: bool = False, verb_timeout_s: float | None = 30.0) -> None:
        if max_context < 1 or prefill_chunk < 1:
            raise InvalidArgument("max_context and prefill_chunk must be >= 1")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.prefill_chunk = prefill_chunk
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        self.verb_timeout_s = verb_timeout_s
        specs = core_meta_specs() + model.state_specs(max_context) + engine_state_specs(
            max_context, model.vocab_size)
        self.arena = StateArena(specs, self.device)
        fp = fingerprint_inputs or FingerprintInputs.from_model(model)
        self.fingerprint = compute_fingerprint(fp.config, fp.named_weights, self.arena, fp.code_version,
                                               {"engine": f"flashrt_ros.llm_engine-{__version__}", **fp.extra})
        sc = store_config or StoreConfig()
        self.store = CapsuleStore(self.arena, self.fingerprint, device_budget_bytes=sc.device_budget_bytes,
                                  host_budget_bytes=sc.host_budget_bytes, disk_budget_bytes=sc.disk_budget_bytes,
                                  directory=sc.directory, rollback_depth=sc.rollback_depth,
                                  default_tier=sc.default_tier)
        self.gate = BoundaryGate()
        self.stats = LatencyStats()
        self._arange = torch.arange(max(prefill_chunk, 1), device=self.device)
        self.cuda_graphs = cuda_graphs and self.device.type == "cuda"
        self._feed = torch.zeros(max(prefill_chunk, 1), dtype=torch.int64, device=self.device)
        pool = torch.cuda.graph_pool_handle() if self.cuda_graphs else None
        self._step_runner = lambda body: StepRunner(body, self.arena, enabled=self.cuda_graphs, pool=pool)
        self._prefill_runners: dict[int, StepRunner] = {}
        self._writes = 0                      # bumped by verbs that replace the live state
        self._generating = threading.Event()
        self._driver = threading.RLock()      # one thread drives steps at a time
        self._last_result: dict[str, Any] = {}
        self._host_scalars: tuple[tuple[int, int], tuple[int, int]] | None = None   # (version, scalars)
        self._runners = {
            ("draw", True): self._step_runner(lambda: self._draw(True)),
            ("draw", False): self._step_runner(lambda: self._draw(False)),
            ("decode", True): self._step_runner(lambda: self._decode(True)),
            ("decode", False): self._step_runner(lambda: self._decode(False)),
        }
        self._cold_start()

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

    def _consume_pending(self) -> None:
        """Feed ``meta.pending_token`` to the model at ``meta.position``."""
        a = self.arena
        position = a[POSITION].view(1)
        token = a[PENDING].view(1)
        a[TOKENS].index_copy_(0, position, token)
        logits = self.model(token, position, a, last_only=True)
        a[LOGITS].copy_(logits[-1])
        a[LAST_TOKEN].copy_(a[PENDING])
        a[HAS_PENDING].zero_()
        a[POSITION].add_(1)

    def _decode(self, greedy: bool) -> None:
        self._consume_pending()
        self._draw(greedy)

    def _prefill_body(self, t: int) -> None:
        """Feed the first ``t`` ids of the static feed buffer at positions ``position .. position+t-1``."""
        a = self.arena
        ids = self._feed[:t]
        positions = a[POSITION] + self._arange[:t]
        a[TOKENS].index_copy_(0, positions, ids)
        logits = self.model(ids, positions, a, last_only=True)
        a[LOGITS].copy_(logits[-1])
        a[LAST_TOKEN].copy_(ids[-1])
        a[HAS_PENDING].zero_()
        a[POSITION].add_(t)

    def _prefill_runner(self, t: int) -> StepRunner:
        runner = self._prefill_runners.get(t)
        if runner is None:
            runner = self._prefill_runners[t] = self._step_runner(lambda: self._prefill_body(t))
        return runner

    def _prefill_chunk(self, chunk: torch.Tensor) -> None:
        """One prefill step: copy ``chunk`` into the feed buffer, run (or replay) the body of its length."""
        t = chunk.shape[0]
        self._feed[:t].copy_(chunk)
        self._prefill_runner(t)()

    # --------------------------------------------------------------- boundaries
    def _commit(self) -> None:
        self.arena[BOUNDARY].add_(1)
        self.store.ring.record()

    def _abort_step(self) -> None:
        """Undo a step that failed half-way: back to the last committed boundary."""
        try:
            self.store.ring.rollback(0)
        except InvalidArgument:       # nothing recorded: cannot happen after _cold_start, be safe
            pass

    def _run_step(self, kind: str, body: Callable[[], None], *, emits: bool,
                  report: Callable[[int], None] | None = None,
                  after: tuple[int, int] | None = None) -> int | None:
        """One committed step: body, host read of the new token, report, commit.

        ``after``: ``(position, has_pending)`` once the step has committed, kept on
        the host so the next step need not read them from the device.
        """
        with self.gate.step():
            start = time.perf_counter()
            self.store.ring.before_step()
            try:
                with torch.no_grad():
                    body()
                token = int(self.arena[PENDING].item()) if emits else None
                if not emits and self.device.type == "cuda":
                    torch.cuda.current_stream().synchronize()
                if report is not None and token is not None:
                    report(token)
                self._commit()
                self._host_scalars = None if after is None else (self._version(), after)
            except BaseException:
                self._abort_step()
                raise
            self.stats.record(kind, time.perf_counter() - start)
        return token

    @contextmanager
    def _driving(self) -> Iterator[None]:
        """Refuse (Busy) a second thread that tries to run steps while one is generating."""
        if not self._driver.acquire(blocking=False):
            raise Busy("the engine is already generating in another thread")
        try:
            yield
        finally:
            self._driver.release()

    def _scalars(self) -> tuple[int, int]:
        """``(position, has_pending)`` at a boundary: as the last step left them, else one device read.

        Why keep them on the host: a decode step would otherwise start with a
        device-to-host sync. Any write of the state from outside the engine's
        steps changes ``_version()`` and so discards the kept values.
        """
        kept = self._host_scalars
        if kept is not None and kept[0] == self._version():
            return kept[1]
        scalars = self._read_scalars()
        self._host_scalars = (self._version(), scalars)
        return scalars

    def _read_scalars(self) -> tuple[int, int]:
        """``(position, has_pending)`` read from the device now."""
        position, has_pending = torch.stack([self.arena[POSITION], self.arena[HAS_PENDING]]).tolist()
        return int(position), int(has_pending)

    def _cold_start(self) -> None:
        """Zero the arena (keeping the boundary counter monotonic) and seed the rollback ring."""
        boundary = int(self.arena[BOUNDARY].item())
        self.arena.zero_()
        self.arena[TOP_P].fill_(1.0)
        self.arena[BOUNDARY].fill_(boundary + 1)
        self.store.ring.restart()

    def _write_sampling(self, params: SamplingParams) -> None:
        a = self.arena
        a[TEMPERATURE].fill_(params.temperature)
        a[TOP_K].fill_(params.top_k)
        a[TOP_P].fill_(params.top_p)
        if params.seed is not None:
            a[RNG_SEED].fill_(params.seed_int64)
            a[RNG_COUNTER].zero_()

    def _greedy_now(self) -> bool:
        return float(self.arena[TEMPERATURE].item()) == 0.0

    def _version(self) -> tuple[int, int]:
        """Changes whenever the live state is replaced from outside the running generation."""
        return self.store.ring.epoch, self._writes

    # ------------------------------------------------------------------ steps
    def prefill(self, ids: Sequence[int], *, should_stop: ShouldStop | None = None) -> int:
        """Feed ``ids`` (preceded by the pending token, if any) in chunks, committing after each.

        Returns how many tokens were fed (the pending one included). Raises
        ContextOverflow, before feeding anything, if they do not fit. Stops
        early, at a boundary, when ``should_stop()`` turns true.
        """
        if not ids:
            return 0
        with self._driving():
            return self._prefill(ids, should_stop, self._version())

    def _prefill(self, ids: Sequence[int], should_stop: ShouldStop | None, version: tuple[int, int]) -> int:
        """Chunked feed; stops early at a boundary on ``should_stop`` or when the state was replaced.

        ``should_stop`` is always polled between steps, never inside one, so a
        verb it calls runs at once (see ``BoundaryGate``) and is seen by the
        version check that follows.
        """
        if should_stop is not None and should_stop():
            return 0
        with self.gate.step():        # read and check at a boundary, before any chunk runs
            position, has_pending = self._scalars()
            feed = ([int(self.arena[PENDING].item())] if has_pending else []) + [int(i) for i in ids]
            if position + len(feed) > self.max_context:
                raise ContextOverflow(f"{len(feed)} tokens do not fit: position {position}, "
                                      f"max_context {self.max_context}")
            bad = [i for i in feed if not 0 <= i < self.model.vocab_size]
            if bad:
                raise InvalidArgument(f"token ids out of range [0, {self.model.vocab_size}): {bad[:5]}")
            tensor = torch.tensor(feed, dtype=torch.int64, device=self.device)
            chunks, offset = [], 0
            for n in chunk_lengths(len(feed), self.prefill_chunk):
                chunks.append(tensor[offset:offset + n])
                offset += n
            first = chunks.pop(0)
            if self._version() != version:
                return 0
            fed = first.shape[0]
            self._run_step("prefill_chunk", lambda: self._prefill_chunk(first), emits=False,
                           after=(position + fed, 0))
        for chunk in chunks:
            if (should_stop is not None and should_stop()) or self._version() != version:
                break
            fed += chunk.shape[0]
            self._run_step("prefill_chunk", lambda c=chunk: self._prefill_chunk(c), emits=False,
                           after=(position + fed, 0))
        return fed

    def warm_up(self, *, timeout: float | None = None) -> int:
        """Capture every step graph now (decode, draw, each prefill length) instead of on first use.

        Changes no state (each capture runs on a copy that is put back). Returns
        how many graphs were captured; 0 without CUDA graphs. Call it after
        loading (the node does, on configure) so the first request is not slowed
        by capture and kernel autotuning.
        """
        if not self.cuda_graphs:
            return 0

        def capture_all() -> int:
            saved = self.arena.block.clone()
            try:
                self.arena[POSITION].zero_()          # every prefill length must fit below max_context
                lengths = [n for n in prefill_lengths(self.prefill_chunk) if n <= self.max_context]
                runners = [*self._runners.values(), *(self._prefill_runner(n) for n in lengths)]
                count = 0
                with torch.no_grad():
                    for runner in runners:
                        count += runner.capture()
                return count
            finally:
                self.arena.block.copy_(saved)
                torch.cuda.current_stream().synchronize()

        with self._driving():
            return self._at_boundary(capture_all, timeout=timeout)

    def decode_step(self, *, greedy: bool | None = None, report: Callable[[int], None] | None = None) -> int:
        """Emit one token: consume the pending token (if any), then sample; returns the token.

        Raises ContextOverflow when a pending token cannot be consumed because
        the context is full.
        """
        with self._driving(), self.gate.step():     # checks and step at one boundary
            position, has_pending = self._scalars()
            if has_pending and position >= self.max_context:
                raise ContextOverflow(f"context full ({self.max_context} tokens)")
            greedy = self._greedy_now() if greedy is None else greedy
            runner = self._runners[("decode" if has_pending else "draw", greedy)]
            return self._run_step("decode" if has_pending else "first_token", runner, emits=True,
                                  report=report, after=(position + has_pending, 1))

    def generate(self, prompt: str | Sequence[int], *, max_new_tokens: int = 256,
                 sampling: SamplingParams | None = None, stop_ids: Sequence[int] | None = None,
                 chat: bool = False, on_token: OnToken | None = None,
                 should_stop: ShouldStop | None = None) -> GenerationResult:
        """Append ``prompt`` to the transcript and generate up to ``max_new_tokens`` tokens.

        ``prompt``: text (encoded; with ``chat=True`` wrapped as a user turn by
        the chat template) or token ids (fed as they are). ``sampling=None``
        keeps the sampling settings and random stream that are in the arena
        (so a restored capsule continues as it would have). ``stop_ids=None``
        uses the tokenizer's. ``on_token(id, text_piece)`` is called for every
        emitted token (stop token included, with empty text) before its
        boundary commits. ``should_stop()`` is polled at every boundary.
        """
        if max_new_tokens < 0:
            raise InvalidArgument("max_new_tokens must be >= 0")
        stops = set(self.tokenizer.stop_ids if stop_ids is None else stop_ids)
        t0 = time.perf_counter()
        timings: dict[str, float] = {}
        emitted: list[int] = []
        decoder = StreamDecoder(self.tokenizer)
        with self._driving(), self.gate.generation():
            self._generating.set()
            try:
                version = self._version()
                ids, has_pending = self._setup_request(prompt, chat, sampling)
                greedy = self._greedy_now()
                fed = self._prefill(ids, should_stop, version) if ids else 0
                expected = len(ids) + has_pending if ids else 0
                timings["prefill_s"] = time.perf_counter() - t0
                timings["prefill_tokens"] = float(fed)
                if fed:
                    timings["prefill_tokens_per_s"] = fed / max(timings["prefill_s"], 1e-9)

                def report(token: int) -> None:
                    if "ttft_s" not in timings:
                        timings["ttft_s"] = time.perf_counter() - t0
                    piece = decoder.push(token)
                    if on_token is not None:
                        on_token(token, piece)

                reason = "cancelled" if fed < expected else None
                t_decode = time.perf_counter()
                while reason is None:
                    if (should_stop is not None and should_stop()) or self._version() != version:
                        reason = "cancelled"
                    elif len(emitted) >= max_new_tokens:
                        reason = "max_new_tokens"
                    else:
                        position, has_pending = self._scalars()
                        if has_pending and position >= self.max_context:
                            reason = "context_full"
                            break
                        token = self.decode_step(greedy=greedy, report=report)
                        emitted.append(token)
                        if token in stops:
                            reason = "stop_token"
                timings["decode_s"] = time.perf_counter() - t_decode
                timings["new_tokens"] = float(len(emitted))
                if emitted:
                    timings["decode_tokens_per_s"] = len(emitted) / max(timings["decode_s"], 1e-9)
                timings["total_s"] = time.perf_counter() - t0
                position, _ = self._scalars()
            finally:
                self._generating.clear()
        text = self.tokenizer.decode([t for t in emitted if t not in stops])
        result = GenerationResult(text=text, token_ids=emitted, stop_reason=reason, prompt_tokens=len(ids),
                                  position=position, timings=timings)
        self._last_result = {"stop_reason": reason, "new_tokens": len(emitted), **timings}
        return result

    def _setup_request(self, prompt: str | Sequence[int], chat: bool,
                       sampling: SamplingParams | None) -> tuple[list[int], int]:
        """Tokenise the prompt and write request settings, as one committed step if anything changed.

        Returns the prompt ids and whether a pending token will be fed before them.
        Everything is checked before anything is written: a refused request
        leaves the arena byte-identical.
        """
        with self.gate.step():
            position, has_pending = self._scalars()
            if isinstance(prompt, str):
                if chat:
                    after = self._last_transcript_token(position, has_pending)
                    ids = self.tokenizer.chat_ids(prompt, after_token=after)
                else:
                    ids = self.tokenizer.encode(prompt) if prompt else []
            else:
                if chat:
                    raise InvalidArgument("chat=True needs a text prompt")
                ids = [int(i) for i in prompt]
            needed = position + (has_pending if ids else 0) + len(ids)
            if needed > self.max_context:
                raise ContextOverflow(f"prompt of {len(ids)} tokens does not fit: position {position}, "
                                      f"max_context {self.max_context}")
            bad = [i for i in ids if not 0 <= i < self.model.vocab_size]
            if bad:
                raise InvalidArgument(f"token ids out of range [0, {self.model.vocab_size}): {bad[:5]}")
            if not ids and position == 0 and not has_pending:
                raise InvalidArgument("empty prompt on an empty context: there is nothing to continue from")
            if sampling is not None or ids:
                self.store.ring.before_step()
                try:
                    if sampling is not None:
                        self._write_sampling(sampling)
                    if ids:
                        self.arena[PROMPT_LENGTH].fill_(needed)
                    self._commit()
                except BaseException:
                    self._abort_step()
                    raise
        return ids, has_pending

    def _last_transcript_token(self, position: int, has_pending: int) -> int | None:
        if has_pending:
            return int(self.arena[PENDING].item())
        if position > 0:
            return int(self.arena[TOKENS][position - 1].item())
        return None

    # ------------------------------------------------------------- capsule verbs
    def _at_boundary(self, fn: Callable[[], Any], *, replaces_state: bool = False,
                     timeout: float | None = None) -> Any:
        def wrapped() -> Any:
            out = fn()
            if replaces_state:
                self._writes += 1
            return out
        return self.gate.run_at_boundary(wrapped, timeout=self.verb_timeout_s if timeout is None else timeout)

    def snapshot(self, name: str, *, session: str = "default", tier: str | None = None,
                 pinned: bool = False, overwrite: bool = False, timeout: float | None = None) -> CapsuleInfo:
        """Capture the live state (at the next boundary) as capsule ``name``."""
        return self._at_boundary(lambda: self.store.snapshot(
            name, session=session, tier=tier, pinned=pinned, overwrite=overwrite).info(), timeout=timeout)

    def restore(self, name: str, *, verify: bool = False, groups: Sequence[str] | None = None,
                timeout: float | None = None) -> CapsuleInfo:
        """Copy capsule ``name`` back into the live buffers (``groups``: only those groups)."""
        return self._at_boundary(lambda: self.store.restore(name, verify=verify, groups=groups).info(),
                                 replaces_state=True, timeout=timeout)

    def rollback(self, steps: int, *, timeout: float | None = None) -> int:
        """Go back ``steps`` committed boundaries (byte-exact); returns the new position."""
        return self._at_boundary(lambda: self.store.rollback(steps), replaces_state=True, timeout=timeout)

    def verify(self, name: str, *, against_live: bool = False, timeout: float | None = None) -> VerifyReport:
        if against_live:
            return self._at_boundary(lambda: self.store.verify(name, against_live=True), timeout=timeout)
        return self.store.verify(name)

    def fork(self, source: str, new_name: str, *, tier: str | None = None) -> CapsuleInfo:
        return self.store.fork(source, new_name, tier=tier).info()

    def drop(self, name: str) -> None:
        self.store.drop(name)

    def list(self) -> list[CapsuleInfo]:
        return self.store.list()

    def get(self, name: str) -> CapsuleInfo:
        return self.store.get(name).info()

    def save(self, name: str) -> CapsuleInfo:
        return self.store.save(name).info()

    def load(self, name: str, *, tier: str | None = None, overwrite: bool = False) -> CapsuleInfo:
        return self.store.load(name, tier=tier, overwrite=overwrite).info()

    def reset(self, *, timeout: float | None = None) -> None:
        """Cold start: empty transcript, default (greedy) sampling, rollback history cleared."""
        self._at_boundary(self._cold_start, replaces_state=True, timeout=timeout)

    # ------------------------------------------------------------- inspection
    def transcript(self, *, timeout: float | None = None) -> list[int]:
        """Token ids of the whole transcript (consumed tokens, then the pending one)."""
        def read() -> list[int]:
            position, has_pending = self._scalars()
            ids = self.arena[TOKENS][:position].tolist()
            return ids + ([int(self.arena[PENDING].item())] if has_pending else [])
        return self._at_boundary(read, timeout=timeout)

    def status(self) -> dict[str, Any]:
        """Diagnostics; reads scalars without waiting for a boundary, so may be one step stale."""
        a = self.arena
        position, has_pending = self._read_scalars()
        return {
            "position": position,
            "boundary": int(a[BOUNDARY].item()),
            "has_pending": bool(has_pending),
            "max_context": self.max_context,
            "context_free": self.max_context - position - has_pending,
            "generating": self._generating.is_set(),
            "sampling": {"temperature": float(a[TEMPERATURE].item()), "top_k": int(a[TOP_K].item()),
                         "top_p": float(a[TOP_P].item()), "seed": int(a[RNG_SEED].item()),
                         "counter": int(a[RNG_COUNTER].item())},
            "arena_bytes": a.nbytes,
            "live_bytes": a.live_nbytes(),
            "device": str(self.device),
            "fingerprint": self.fingerprint,
            "latency": self.stats.summary(),
            "last_generation": dict(self._last_result),
            "store": self.store.stats(),
            "pending_requests": self.gate.pending,
        }
