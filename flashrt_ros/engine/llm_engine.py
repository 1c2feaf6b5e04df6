"""The LLM engine: chunked prefill, token-by-token decode, over one arena with capsules.

Why it looks like this:
- All state that decides the next token lives in one StateArena: the model's
  buffers plus the engine's (``engine.state``). A capsule is a copy of those
  bytes, so restore -> continue is token-identical to never having stopped.
  The capsule verbs are ``engine.capsules`` (``runtime.capsule_verbs``), the
  same surface the policy engine has.
- Every step runs inside ``gate.step()`` and ends by *committing* a boundary
  (``ModelRunner.run_step``). Requests from other threads (snapshot, restore,
  rollback, ...) run right after a commit, so they always see a committed
  state. A step reports its token through ``on_token`` *before* it commits, so
  a committed state never holds a token the client has not been told about.
- The engine decides what to run (request set-up in ``request_setup``, the
  prefill chunking, the decode loop and its stop rules); the ``ModelRunner``
  runs steps (bodies, CUDA graphs, commits). A prompt is cut into full chunks
  plus its remainder as descending powers of two (``chunk_lengths``), so at
  most ``log2(prefill_chunk) + 2`` prefill graphs exist.
- Speculative decoding (``speculative_tokens = k > 0``, hybrid model): a step
  verifies the pending token and ``k`` drafts in one forward and emits 1 .. k+1
  tokens (``engine.speculative_steps``). Greedy output is the verifier's own
  greedy continuation, sampled output has the same distribution as without
  speculation; boundaries fall between steps, so a capsule holds the drafts and
  the drafter's state too. The drafter is the model's MTP head unless one is given.
"""
from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Sequence

import torch

from flashrt_ros import __version__
from flashrt_ros.engine.config import GenerationResult, StoreConfig
from flashrt_ros.engine.graphs import chunk_lengths
from flashrt_ros.engine.model_runner import ModelRunner
from flashrt_ros.engine.drafters import Drafter, MTPDrafter
from flashrt_ros.engine.request_setup import check_ids, check_fits, prompt_ids, write_request
from flashrt_ros.engine.sampling import SamplingParams
from flashrt_ros.engine.speculative_steps import (MAX_SPECULATIVE_TOKENS, SpeculativeDecoding,
                                                  check_speculative_model, speculation_state_specs)
from flashrt_ros.engine.state import (PENDING, RNG_COUNTER, RNG_SEED, TEMPERATURE, TOKENS, TOP_K, TOP_P,
                                      engine_state_specs)
from flashrt_ros.models.base import CausalLM, FingerprintInputs
from flashrt_ros.models.tokenizer import StreamDecoder, Tokenizer
from flashrt_ros.runtime.arena import BOUNDARY, StateArena, core_meta_specs
from flashrt_ros.runtime.boundary import BoundaryGate
from flashrt_ros.runtime.capsule_verbs import CapsuleVerbs
from flashrt_ros.runtime.errors import Busy, ContextOverflow, InvalidArgument
from flashrt_ros.runtime.fingerprint import compute_fingerprint
from flashrt_ros.runtime.store import CapsuleStore

#: ``on_token(token_id, text_piece, transcript_length)``: called for each emitted token before
#: its boundary commits; ``transcript_length`` counts the token (it is pending).
OnToken = Callable[[int, str, int], None]
ShouldStop = Callable[[], bool]


class LLMEngine:
    """Hosts one CausalLM over a StateArena, with capsules, a rollback ring and a boundary gate.

    Threading: ``generate``/``prefill``/``decode_step`` run in one engine thread
    at a time (a second one gets Busy). Capsule verbs (``engine.capsules``) may
    be called from any thread; see ``runtime.capsule_verbs`` for which ones wait
    for a boundary. A restore, rollback, reset or session switch that lands
    during ``generate`` ends that generation with ``stop_reason="cancelled"``
    (the state it was extending is gone).
    """

    def __init__(self, model: CausalLM, tokenizer: Tokenizer, *, max_context: int = 2048,
                 device: torch.device | str | None = None, store_config: StoreConfig | None = None,
                 prefill_chunk: int = 128, fingerprint_inputs: FingerprintInputs | None = None,
                 cuda_graphs: bool = False, verb_timeout_s: float | None = 30.0,
                 speculative_tokens: int = 0, drafter: Drafter | None = None) -> None:
        """``speculative_tokens``: drafts verified per step (0 = off, up to 8); ``drafter``: who
        drafts (default: the model's MTP head, ``MTPDrafter``)."""
        if max_context < 1 or prefill_chunk < 1:
            raise InvalidArgument("max_context and prefill_chunk must be >= 1")
        if isinstance(speculative_tokens, bool) or not isinstance(speculative_tokens, int) \
                or not 0 <= speculative_tokens <= MAX_SPECULATIVE_TOKENS:
            raise InvalidArgument(f"speculative_tokens must be an integer in 0..{MAX_SPECULATIVE_TOKENS} "
                                  f"(got {speculative_tokens!r})")
        if speculative_tokens and speculative_tokens + 2 > max_context:
            raise InvalidArgument(f"max_context {max_context} leaves no room to verify {speculative_tokens} drafts")
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.max_context = max_context
        self.prefill_chunk = prefill_chunk
        self.speculative_tokens = speculative_tokens
        self.device = torch.device(device) if device is not None else next(model.parameters()).device
        specs = core_meta_specs() + model.state_specs(max_context) + engine_state_specs(
            max_context, model.vocab_size)
        if speculative_tokens:
            check_speculative_model(model)
            drafter = drafter if drafter is not None else MTPDrafter(model)
            specs += speculation_state_specs(speculative_tokens, model.vocab_size) + drafter.state_specs(
                max_context, speculative_tokens)
        self.drafter = drafter if speculative_tokens else None
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
        self.capsules = CapsuleVerbs(self.gate, self.store, cold_start=self._cold_start,
                                     timeout_s=verb_timeout_s)
        self.speculation = (SpeculativeDecoding(self.model, self.arena, self.drafter, speculative_tokens)
                            if self.drafter is not None else None)
        self.runner = ModelRunner(self.model, self.arena, self.store.ring, self.gate,
                                  prefill_chunk=prefill_chunk, cuda_graphs=cuda_graphs, version=self._version,
                                  speculation=self.speculation)
        self.stats = self.runner.stats
        self.cuda_graphs = self.runner.cuda_graphs
        self._generating = threading.Event()
        self._driver = threading.RLock()      # one thread drives steps at a time
        self._last_result: dict[str, Any] = {}
        self._cold_start()

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
            position, has_pending = self.runner.scalars()
            feed = ([int(self.arena[PENDING].item())] if has_pending else []) + [int(i) for i in ids]
            if position + len(feed) > self.max_context:
                raise ContextOverflow(f"{len(feed)} tokens do not fit: position {position}, "
                                      f"max_context {self.max_context}")
            check_ids(feed, vocab_size=self.model.vocab_size, position=position, has_pending=has_pending)
            tensor = torch.tensor(feed, dtype=torch.int64, device=self.device)
            chunks = list(torch.split(tensor, chunk_lengths(len(feed), self.prefill_chunk)))
            first = chunks.pop(0)
            if self._version() != version:
                return 0
            fed = first.shape[0]
            self.runner.prefill_step(first, after=(position + fed, 0), first=position == 0)
        for chunk in chunks:
            if (should_stop is not None and should_stop()) or self._version() != version:
                break
            fed += chunk.shape[0]
            self.runner.prefill_step(chunk, after=(position + fed, 0))
        return fed

    def warm_up(self, *, timeout: float | None = None) -> int:
        """Capture every step graph now (decode, draw, each prefill length) instead of on first use.

        Changes no state. Returns how many graphs were captured; 0 without CUDA
        graphs. Call it after loading (the node does, on configure) so the first
        request is not slowed by capture and kernel autotuning.
        """
        if not self.cuda_graphs:
            return 0
        with self._driving():
            return self.gate.run_at_boundary(lambda: self.runner.capture_all(self.max_context),
                                             timeout=self.capsules.timeout_s if timeout is None else timeout)

    def decode_step(self, *, greedy: bool | None = None, report: Callable[[int], None] | None = None) -> int:
        """Emit one token: consume the pending token (if any), then sample; returns the token.

        Raises ContextOverflow when a pending token cannot be consumed because
        the context is full.
        """
        with self._driving(), self.gate.step():     # checks and step at one boundary
            position, has_pending = self.runner.scalars()
            if has_pending and position >= self.max_context:
                raise ContextOverflow(f"context full ({self.max_context} tokens)")
            greedy = self._greedy_now() if greedy is None else greedy
            return self.runner.decode_step(greedy=greedy, has_pending=has_pending, report=report,
                                           after=(position + has_pending, 1))

    def generate(self, prompt: str | Sequence[int], *, max_new_tokens: int = 256,
                 sampling: SamplingParams | None = None, stop_ids: Sequence[int] | None = None,
                 chat: bool = False, on_token: OnToken | None = None,
                 should_stop: ShouldStop | None = None) -> GenerationResult:
        """Append ``prompt`` to the transcript and generate up to ``max_new_tokens`` tokens.

        ``prompt``: text (encoded; with ``chat=True`` wrapped as a user turn by
        the chat template) or token ids (fed as they are). ``sampling=None``
        keeps the sampling settings and random stream that are in the arena
        (so a restored capsule continues as it would have). ``stop_ids=None``
        uses the tokenizer's. ``on_token(id, text_piece, transcript_length)`` is
        called for every emitted token (stop token included, with empty text)
        before its boundary commits. ``should_stop()`` is polled at every boundary.
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
                transcript = 0

                def report(token: int) -> None:
                    nonlocal transcript
                    transcript += 1
                    if "ttft_s" not in timings:
                        timings["ttft_s"] = time.perf_counter() - t0
                    piece = decoder.push(token)
                    if on_token is not None:
                        on_token(token, piece, transcript)

                reason = "cancelled" if fed < expected else None
                speculate = self.speculation is not None and self.speculation.set_stops(stops)
                drafted = accepted = 0
                t_decode = time.perf_counter()
                while reason is None:
                    if (should_stop is not None and should_stop()) or self._version() != version:
                        reason = "cancelled"
                    elif len(emitted) >= max_new_tokens:
                        reason = "max_new_tokens"
                    else:
                        position, has_pending = self.runner.scalars()
                        if has_pending and position >= self.max_context:
                            reason = "context_full"
                            break
                        transcript = position + has_pending           # report() counts each token out
                        if speculate and has_pending and position + self.speculative_tokens < self.max_context:
                            tokens = self._speculative_step(greedy, max_new_tokens - len(emitted), report)
                            drafted += self.speculative_tokens
                            accepted += len(tokens) - 1
                        else:
                            tokens = [self.decode_step(greedy=greedy, report=report)]
                        emitted.extend(tokens)
                        if tokens[-1] in stops:
                            reason = "stop_token"
                timings["decode_s"] = time.perf_counter() - t_decode
                timings["new_tokens"] = float(len(emitted))
                if emitted:
                    timings["decode_tokens_per_s"] = len(emitted) / max(timings["decode_s"], 1e-9)
                timings["total_s"] = time.perf_counter() - t0
                position, has_pending = self.runner.scalars()
            finally:
                self._generating.clear()
        text = self.tokenizer.decode([t for t in emitted if t not in stops])
        result = GenerationResult(text=text, token_ids=emitted, stop_reason=reason, prompt_tokens=len(ids),
                                  position=position, transcript_length=position + has_pending,
                                  timings=timings, drafted_tokens=drafted, accepted_tokens=accepted)
        self._last_result = {"stop_reason": reason, "new_tokens": len(emitted), **timings}
        if self.speculation is not None:
            self._last_result.update(drafted_tokens=drafted, accepted_tokens=accepted)
        return result

    def _speculative_step(self, greedy: bool, limit: int, report: Callable[[int], None]) -> list[int]:
        """One verification step (a token pending, room for the drafts): emits 1 .. k+1 tokens."""
        with self._driving(), self.gate.step():
            position, _ = self.runner.scalars()
            return self.runner.speculative_step(greedy=greedy, limit=limit, report=report, position=position)

    def check_fresh_request(self, prompt: str | Sequence[int], *, chat: bool) -> None:
        """Refuse a prompt that could not start an empty transcript, without touching the arena.

        Why: a caller that resets before generating (Generate's ``reset``) asks
        this first, so a refused request leaves the old state in place.
        """
        self._checked_ids(prompt, chat, position=0, has_pending=0)

    def check_request(self, prompt: str | Sequence[int], *, chat: bool) -> None:
        """Refuse a prompt that could not continue the live transcript, without touching the arena.

        Why: a Generate goal that switches sessions first asks this on the
        target session's state (at the switch's boundary), so a refused goal
        undoes the switch instead of leaving the other session live. Call it at
        a boundary.
        """
        position, has_pending = self.runner.scalars()
        self._checked_ids(prompt, chat, position=position, has_pending=has_pending)

    def _checked_ids(self, prompt: str | Sequence[int], chat: bool, *, position: int,
                     has_pending: int) -> tuple[list[int], int]:
        """The prompt's ids and the transcript length after them, every refusal checked (nothing written)."""
        ids = prompt_ids(self.tokenizer, self.arena, prompt, chat=chat, position=position,
                         has_pending=has_pending)
        needed = check_fits(ids, position=position, has_pending=has_pending, max_context=self.max_context)
        check_ids(ids, vocab_size=self.model.vocab_size, position=position, has_pending=has_pending)
        return ids, needed

    def _setup_request(self, prompt: str | Sequence[int], chat: bool,
                       sampling: SamplingParams | None) -> tuple[list[int], int]:
        """Tokenise the prompt and write request settings, as one committed step if anything changed.

        Returns the prompt ids and whether a pending token will be fed before them.
        Everything is checked before anything is written: a refused request
        leaves the arena byte-identical.
        """
        with self.gate.step():
            position, has_pending = self.runner.scalars()
            ids, needed = self._checked_ids(prompt, chat, position=position, has_pending=has_pending)
            if sampling is not None or ids:
                self.store.ring.before_step()
                try:
                    write_request(self.arena, sampling, needed if ids else None)
                    self.runner.commit()
                except BaseException:
                    self.runner.abort_step()
                    raise
        return ids, has_pending

    # ------------------------------------------------------------- state
    def _cold_start(self) -> None:
        """Zero the arena (keeping the boundary counter monotonic) and seed the rollback ring."""
        boundary = int(self.arena[BOUNDARY].item())
        self.arena.zero_()
        self.arena[TOP_P].fill_(1.0)
        self.arena[BOUNDARY].fill_(boundary + 1)
        self.store.ring.restart()

    def _greedy_now(self) -> bool:
        return float(self.arena[TEMPERATURE].item()) == 0.0

    def _version(self) -> tuple[int, int]:
        """Changes whenever the live state is replaced from outside the running generation."""
        return self.capsules.version()

    @contextmanager
    def _driving(self) -> Iterator[None]:
        """Refuse (Busy) a second thread that tries to run steps while one is generating."""
        if not self._driver.acquire(blocking=False):
            raise Busy("the engine is already generating in another thread")
        try:
            yield
        finally:
            self._driver.release()

    # ------------------------------------------------------------- inspection
    @property
    def busy(self) -> bool:
        """Whether a generation is running now."""
        return self._generating.is_set()

    def transcript(self, *, timeout: float | None = None) -> list[int]:
        """Token ids of the whole transcript (consumed tokens, then the pending one)."""
        def read() -> list[int]:
            position, has_pending = self.runner.scalars()
            ids = self.arena[TOKENS][:position].tolist()
            return ids + ([int(self.arena[PENDING].item())] if has_pending else [])
        return self.gate.run_at_boundary(read, timeout=self.capsules.timeout_s if timeout is None else timeout)

    def status(self) -> dict[str, Any]:
        """Diagnostics; reads scalars without waiting for a boundary, so may be one step stale."""
        a = self.arena
        position, has_pending = self.runner.read_scalars()
        return {
            "position": position,
            "boundary": int(a[BOUNDARY].item()),
            "has_pending": bool(has_pending),
            "max_context": self.max_context,
            "context_free": self.max_context - position - has_pending,
            "generating": self.busy,
            "sampling": {"temperature": float(a[TEMPERATURE].item()), "top_k": int(a[TOP_K].item()),
                         "top_p": float(a[TOP_P].item()), "seed": int(a[RNG_SEED].item()),
                         "counter": int(a[RNG_COUNTER].item())},
            "speculation": self.speculation.status() if self.speculation is not None else {"tokens": 0},
            "arena_bytes": a.nbytes,
            "live_bytes": a.live_nbytes(),
            "device": str(self.device),
            "fingerprint": self.fingerprint,
            "latency": self.stats.summary(),
            "last_generation": dict(self._last_result),
            "store": self.store.stats(),
            "session": self.capsules.sessions.current,
            "pending_requests": self.gate.pending,
        }
