"""The synchronous engine: requests in, TokenEvents out, one step at a time.

A step works on the active sequence: one prefill chunk, or one decode cycle, which reads like
gpt-fast's loop and is the same for every kernel set (DESIGN §5):

    tree   = draft(seq)                  # drafter: the topology below the pending root, from the
                                         # last cycle's MTP proposal (+ suffix lookups for the tree)
    result = runner.cycle(tree, sampler) # verify every row, accept (the walk), publish the path,
                                         # draft the next MTP proposal; one synchronisation on a GPU
    emit(seq, result)                    # stop conditions, events, logprobs, the suffix index

The runner is `ModelRunner` (host kernels) or `DeviceRunner` (the GPU, captured graphs); the engine
never asks which. The pending-token convention (DESIGN §3.5): the last emitted token is the next
tree's root; its state is made by that tree's forward.
"""

from __future__ import annotations

import logging
import random
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from pathlib import Path

import torch
from torch import Tensor

from lumotree.drafting.draft_vocab import load_draft_vocab
from lumotree.drafting.drafter import Drafter
from lumotree.drafting.mtp import MTPProposal
from lumotree.drafting.suffix import SuffixDrafter
from lumotree.engine.acceptance import RowSampler, history_counts, token_logprobs
from lumotree.engine.config import EngineConfig
from lumotree.engine.metrics import EngineMetrics
from lumotree.engine.model_runner import ModelRunner
from lumotree.engine.prefix_cache import PrefixCache
from lumotree.engine.runner import CycleResult, Runner, Sampler
from lumotree.engine.scheduler import Scheduler
from lumotree.engine.sequence import GenerationRequest, Sequence, SequenceStatus, TokenEvent, TokenLogprob
from lumotree.model import HybridLM, default_model_path, load_checkpoint
from lumotree.model.checkpoint import model_eos_ids
from lumotree.model.native.build import NativeBuildError, load_library
from lumotree.model.native.model import unsupported_reason
from lumotree.model.random_weights import preset_config, random_model
from lumotree.sampling import SamplingParams
from lumotree.sampling.forced import ForcedAcceptance
from lumotree.tree import TreeTopology
from lumotree.verify.kernel_sets import CPU_FAST, REFERENCE

log = logging.getLogger(__name__)
MAX_LOGPROBS = 20
RECENT_FINISHED = 64  # finished sequences kept for a late `stop_request`


class LLMEngine:
    """One active sequence, a FIFO queue behind it; see the module docstring for the cycle."""

    def __init__(self, config: EngineConfig | None = None) -> None:
        asked = (config or EngineConfig()).kernels
        self.config = config = (config or EngineConfig()).resolved()
        torch.set_num_threads(config.threads)
        self.device = torch.device(config.device)
        self.model_dir = Path(config.model) if config.model else default_model_path()
        self.model = _build_model(config, self.model_dir, self.device)
        draft_ids = (
            None
            if config.draft_vocab is None or config.drafter == "ar"
            else load_draft_vocab(config.draft_vocab, self.model.config.vocab_size)
        )
        ranked = 1 + config.geometry().siblings_per_depth
        if draft_ids is not None and draft_ids.numel() < ranked:
            raise ValueError(
                f"a draft vocabulary of {draft_ids.numel()} ids cannot rank {ranked} candidates a depth"
            )
        if config.kernels == "cpu-native":
            self.config = config = replace(config, kernels=_native_or_fallback(self.model, asked))
        self.config = config = config.shaped()
        mcfg = self.model.config
        self._max_model_len = config.max_model_len or mcfg.max_position_embeddings
        self.geometry = config.geometry()
        self.drafter = Drafter(
            self.geometry,
            SuffixDrafter(min_match=config.suffix_min_match, cache_tokens=config.suffix_cache_tokens),
        )
        forced = None
        if config.forced_acceptance is not None and self.drafter.kind != "ar":
            forced = ForcedAcceptance.parse(config.forced_acceptance, self.drafter.kind)
            log.warning(
                "forced acceptance %r (mean %.2f accepted drafts a cycle): speed work, outputs are not "
                "the model's", forced.spec, forced.mean,
            )  # fmt: skip
        self.forced = forced
        self.runner = _build_runner(config, self.model, self._capacity(), self.drafter, draft_ids, forced)
        self.prefix_cache = (
            PrefixCache(config.cache_block, config.prefix_cache_tokens, mtp=self.runner.mtp_cache is not None)
            if config.prefix_cache
            else None
        )
        self.scheduler = Scheduler()
        self._metrics = EngineMetrics.for_context(self._max_model_len)
        self._eos = model_eos_ids(self.model_dir, mcfg.eos_token_id)
        self._seeds = random.Random(config.seed) if config.seed is not None else random.SystemRandom()
        self._events: list[TokenEvent] = []  # finished-by-abort events, reported by the next step
        # the last finished sequences: a stop string the server matched may arrive after they finished
        self._recent: OrderedDict[str, Sequence] = OrderedDict()
        # per active sequence
        self._prompt_seen: Tensor | None = None
        self._last_hidden: Tensor | None = None  # target hidden row of the last prefilled token
        self._block_keys: list[bytes] = []
        self._sampler: Sampler | None = None
        self._proposal: MTPProposal | None = None  # the next tree's MTP drafts
        self._next_tree: TreeTopology | None = None  # drafted at the end of the last cycle

    def _capacity(self) -> int:
        """KV rows of the state bank: the context, one tree, and the path of a cycle in flight."""
        return self._max_model_len + self.geometry.rows + self.config.max_depth + 1

    # ---- properties the server reads ---------------------------------------------------------
    @property
    def tokenizer_path(self) -> Path:
        """The model folder (tokenizer.json, tokenizer_config.json with the chat template)."""
        return self.model_dir

    @property
    def model_name(self) -> str:
        return self.model_dir.name

    @property
    def max_model_len(self) -> int:
        """Prompt + output tokens one request may reach."""
        return self._max_model_len

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self._eos

    @property
    def vocab_size(self) -> int:
        return self.model.config.vocab_size

    # ---- requests ----------------------------------------------------------------------------
    def add_request(self, req: GenerationRequest) -> None:
        """Queue a request; ValueError (with a message for the user) if it cannot run."""
        self._validate(req)
        seed = req.seed if req.seed is not None else self._seeds.getrandbits(63)
        stop = set(req.stop_token_ids) | (set() if req.ignore_eos else set(self._eos))
        self.scheduler.add(Sequence(req, seed, frozenset(stop), arrival_s=time.monotonic()))
        self._metrics.prompt_tokens += len(req.prompt_token_ids)

    def _validate(self, req: GenerationRequest) -> None:
        if not isinstance(req.request_id, str) or not req.request_id:
            raise ValueError("request_id must be a non-empty string")
        if req.request_id in self.scheduler:
            raise ValueError(f"request id {req.request_id!r} is already in use by an unfinished request")
        if not isinstance(req.sampling, SamplingParams):
            raise ValueError("sampling must be a lumotree.sampling.SamplingParams")
        prompt, vocab = req.prompt_token_ids, self.vocab_size
        if not prompt:
            raise ValueError("the prompt is empty: at least one prompt token is needed")
        bad = [t for t in prompt if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"prompt token ids must be integers in [0, {vocab}); got {bad[:3]}")
        bad = [t for t in req.stop_token_ids if not isinstance(t, int) or not 0 <= t < vocab]
        if bad:
            raise ValueError(f"stop token ids must be integers in [0, {vocab}); got {bad[:3]}")
        bad = [t for t, _ in req.sampling.logit_bias if not 0 <= t < vocab]
        if bad:
            raise ValueError(f"logit_bias token ids must be in [0, {vocab}); got {bad[:3]}")
        if len(prompt) >= self._max_model_len:
            raise ValueError(
                f"the prompt has {len(prompt)} tokens but this model's context limit is "
                f"{self._max_model_len} tokens (prompt + output); shorten the prompt"
            )
        if not isinstance(req.max_tokens, int) or req.max_tokens < 1:
            raise ValueError(f"max_tokens must be an integer >= 1, got {req.max_tokens!r}")
        if req.logprobs is not None and not (
            isinstance(req.logprobs, int) and 0 <= req.logprobs <= MAX_LOGPROBS
        ):
            raise ValueError(f"logprobs must be an integer in [0, {MAX_LOGPROBS}], got {req.logprobs!r}")
        if req.seed is not None and not isinstance(req.seed, int):
            raise ValueError(f"seed must be an integer, got {req.seed!r}")

    def abort(self, request_id: str) -> None:
        """Stop a request now (a no-op if it is unknown or finished); reported as finish "abort"."""
        seq = self.scheduler.get(request_id)
        if seq is not None:
            self._finish(seq, "abort")
            self._events.append(seq.event([], None))

    def stop_request(self, request_id: str, returned: int) -> None:
        """Finish a request as "stop" at `returned` output tokens: the server matched a stop string
        there. What was made after it leaves the counters, and a request that finished meanwhile
        (length, EOS, abort) is counted as stopped instead, so /metrics counts what the client got."""
        seq = self.scheduler.get(request_id) or self._recent.get(request_id)
        if seq is None or not 0 < returned <= len(seq.output):
            return
        if seq.finished and (seq.finish_reason, len(seq.output)) == ("stop", returned):
            return
        if seq.finished:  # its finish was counted: take it back, count the stop
            assert seq.finished_s is not None and seq.finish_reason is not None
            self._metrics.request_done(seq, seq.finished_s, sign=-1)
            self._metrics.requests_finished[seq.finish_reason] -= 1
        self._metrics.take_back(seq, returned)
        if seq.finished:
            seq.finish_reason, seq.finished_s = "stop", time.monotonic()
            self._metrics.finished("stop")
            self._metrics.request_done(seq, seq.finished_s)
        else:
            self._finish(seq, "stop")
            self._events.append(seq.event([], None))

    def has_unfinished(self) -> bool:
        return len(self.scheduler) > 0 or bool(self._events)

    def metrics(self) -> EngineMetrics:
        """A snapshot of the engine-wide counters."""
        active = self.scheduler.running is not None
        self._metrics.running = int(active)
        self._metrics.waiting = len(self.scheduler.waiting)
        self._metrics.kv_cache_usage = self.runner.length / self.runner.capacity if active else 0.0
        return self._metrics.copy()

    # ---- the loop ----------------------------------------------------------------------------
    def step(self) -> list[TokenEvent]:
        """Advance the active sequence by one prefill chunk or one decode cycle."""
        events, self._events = self._events, []
        seq = self.scheduler.next()
        if seq is None:
            return events
        try:
            event = (
                self._prefill_step(seq) if seq.status is not SequenceStatus.DECODE else self._decode_step(seq)
            )
        except Exception as exc:  # a failing request must not take the engine (or the server) down
            log.exception("request %s failed", seq.request_id)
            self._finish(seq, "error")
            event = seq.event([], None, error=f"{type(exc).__name__}: {exc}")
        if event is not None:
            events.append(event)
        return events

    def _finish(self, seq: Sequence, reason: str) -> None:
        was_active = self.scheduler.running is seq
        self.scheduler.finish(seq, reason)
        self._metrics.finished(reason)
        seq.finished_s = time.monotonic()
        self._metrics.request_done(seq, seq.finished_s)
        self._recent[seq.request_id] = seq
        if len(self._recent) > RECENT_FINISHED:
            self._recent.popitem(last=False)
        if was_active:
            self.drafter.finish()

    # ---- prefill -----------------------------------------------------------------------------
    def _begin(self, seq: Sequence) -> None:
        """Make `seq` the active sequence: fresh state, prefix-cache restore, drafter start."""
        try:  # the last request's MTP rows complete its prefix-cache entries
            self.runner.settle()
        except Exception:  # its entries stay unusable; this request starts afresh
            log.exception("the MTP prompt rows of the previous request failed")
        prompt, usable = seq.prompt, 0
        self._last_hidden = None
        self._sampler = self._proposal = self._next_tree = None
        self._block_keys = []
        if self.prefix_cache is not None:
            self._block_keys = self.prefix_cache.block_keys(prompt)
            usable = self.prefix_cache.lookup(self._block_keys, len(prompt))
            self._metrics.prefix_cache_queries += len(prompt)
        cached = usable * self.prefix_cache.block if self.prefix_cache is not None else 0
        self.runner.reset(max(cached - 1, 0))  # MTP row t needs token t+1: B cached tokens hold B-1 rows
        if self.prefix_cache is not None and usable:
            hidden = self.prefix_cache.restore(
                self._block_keys[:usable], self.runner.state, self.runner.mtp_cache
            )
            self._last_hidden = hidden[None]
            self._metrics.prefix_cache_hits += cached
        self.drafter.begin(prompt)
        self.runner.load_drafting(prompt, self.drafter.suffix)
        self._prompt_seen = history_counts(prompt, self.vocab_size) > 0
        seq.prefilled = seq.cached_prompt_tokens = cached
        seq.status = SequenceStatus.PREFILL
        seq.scheduled_s = time.monotonic()

    def _chunk_end(self, seq: Sequence) -> int:
        """End of the next prefill chunk: chunk multiples, and the last block boundary before the
        prompt's last token (so the next turn of a conversation finds its snapshot)."""
        n, start, cfg = len(seq.prompt), seq.prefilled, self.config
        ends = {n, ((n - 1) // cfg.cache_block) * cfg.cache_block}
        ends.update(range(cfg.prefill_chunk, n, cfg.prefill_chunk))
        return min(e for e in ends if e > start)

    def _prefill_step(self, seq: Sequence) -> TokenEvent | None:
        if seq.status is SequenceStatus.WAITING:
            self._begin(seq)
        with self._metrics.span("prefill"):
            start, end, prompt = seq.prefilled, self._chunk_end(seq), seq.prompt
            hidden = self.runner.prefill(prompt[start:end])
            # MTP rows are (h_t, x_{t+1}): the previous chunk's last row joins this chunk's rows
            if self._last_hidden is None:
                rows, next_tokens = hidden[:-1], prompt[start + 1 : end]
            else:
                rows, next_tokens = torch.cat([self._last_hidden, hidden[:-1]]), prompt[start:end]
            self._last_hidden = hidden[-1:]
            seq.prefilled = end
            if end < len(prompt):
                self.runner.commit_mtp_rows(rows, next_tokens, then=self._store_prefix(end, hidden[-1]))
                return None
            # the first token comes from the prompt's last row: output position 0 (sampled on the
            # host on every path: the coins are the same Philox coins as the device walk's); its
            # logits go first, the last chunk's MTP rows after (a runner may write them meanwhile)
            logits = self.runner.logits(self._last_hidden).cpu()
            self.runner.commit_mtp_rows(rows, next_tokens)
            sampler = RowSampler(seq.request.sampling, self._require_prompt_seen(), [], seq.seed)
            token = sampler.choose(logits, [[]])[0]
            # the prompt's MTP rows are prefill work: written before the first token goes out, so
            # the time to first token holds them and the decode window starts with a cycle
            self.runner.settle()
        seq.status = SequenceStatus.DECODE
        kept, reason = self._cut(seq, [token])
        self.drafter.emitted(kept)
        event = self._emit(seq, kept, reason, [0], lambda rows: logits)
        if not seq.finished:  # the first proposal waits for the first decode step: the token goes out first
            self._sampler = self.runner.sampler(seq.request.sampling, seq.seed, seq.prompt, seq.output)
        return event

    def _store_prefix(self, end: int, hidden: Tensor) -> Callable[[], None] | None:
        """At a block boundary `end` inside the prompt: store the target's blocks and the snapshot
        now; returns the store of the MTP rows they complete, to run once those are written."""
        cache = self.prefix_cache
        if cache is None or end % cache.block:
            return None
        keys = self._block_keys[: end // cache.block]
        cache.store(keys, self.runner.state, hidden)
        mtp = self.runner.mtp_cache
        return None if mtp is None else partial(cache.store_mtp, keys, mtp)

    def _require_prompt_seen(self) -> Tensor:
        assert self._prompt_seen is not None, "no active sequence"
        return self._prompt_seen

    # ---- the decode cycle --------------------------------------------------------------------
    def draft(self, seq: Sequence) -> TreeTopology:
        """The draft tree below the pending root."""
        return self.drafter.topology(seq.output[-1], self._proposal)

    def _decode_step(self, seq: Sequence) -> TokenEvent:
        m, sampler = self._metrics, self._sampler
        assert sampler is not None, "decoding before the prefill finished"
        tree, self._next_tree = self._next_tree, None
        if tree is None:  # a request's first cycle; later trees are drafted inside the last cycle
            with m.span("drafter"):  # the first proposal (the prompt's MTP rows settled), the tree
                self._proposal = self.runner.start_decode(self._last_hidden, seq.output[-1])
                tree = self.draft(seq)
        req, made = seq.request, len(seq.prompt) + len(seq.output)
        longest = self.drafter.max_depth + 1  # tokens one cycle may emit
        chain_next = min(req.max_tokens - len(seq.output), self._max_model_len - made) > longest
        cut: list[tuple[list[int], str | None]] = []

        def follow(result: CycleResult) -> TreeTopology | None:
            """As soon as the cycle's results arrive: the tokens kept (up to a stop condition) join
            the suffix index and the next tree is drafted, which the runner may start at once,
            before these tokens are emitted."""
            kept, reason = self._cut(seq, result.emitted)
            cut.append((kept, reason))
            self.drafter.emitted(kept)
            if reason:
                return None
            if result.next_tree is not None:  # the runner drafted it (on the device, in its drafter phase)
                m.spans["drafter"].count += 1
                self._next_tree = result.next_tree
                return self._next_tree
            with m.span("drafter"):
                self._next_tree = self.drafter.topology(kept[-1], result.proposal)
            return self._next_tree

        result = self.runner.cycle(tree, sampler, chain_next=chain_next, follow=follow)
        for phase, seconds in result.spans.items():
            span = m.spans[phase]
            span.seconds += seconds
            span.count += phase != "drafter"  # the drafter spans were counted around the drafting
        m.device_syncs += result.syncs
        sampler.advance(result.emitted)
        self._proposal = result.proposal
        self._record_spec(seq, tree, len(result.accepted))
        assert result.logits_of is not None
        ((kept, reason),) = cut
        return self._emit(seq, kept, reason, result.accepted, result.logits_of)

    def _record_spec(self, seq: Sequence, tree: TreeTopology, path_len: int) -> None:
        """Count one cycle's drafts and accepted drafts (request and engine-wide)."""
        drafts, accepted = tree.n_active - 1, path_len - 1
        seq.spec.record(drafts, accepted, self.drafter.max_depth)
        self._metrics.spec.record(drafts, accepted, self.drafter.max_depth)

    def _cut(self, seq: Sequence, tokens: list[int]) -> tuple[list[int], str | None]:
        """The emitted tokens the request keeps, up to a stop condition, and its finish reason
        (None: it goes on)."""
        req, made = seq.request, len(seq.output)
        for i, token in enumerate(tokens, 1):
            if token in seq.stop_ids:
                return tokens[:i], "stop"
            if made + i >= req.max_tokens or len(seq.prompt) + made + i >= self._max_model_len:
                return tokens[:i], "length"
        return list(tokens), None

    def _emit(
        self,
        seq: Sequence,
        kept: list[int],
        reason: str | None,
        rows: list[int],
        logits_of: Callable[[list[int]], Tensor],
    ) -> TokenEvent:
        """Append the kept tokens (`_cut`) and report them. Row rows[i] produced kept[i];
        logits_of(rows) -> their raw logits [n, V] (for logprobs)."""
        req = seq.request
        seq.output.extend(kept)
        self._metrics.generation_tokens += len(kept)
        self._metrics.emitted(seq, len(kept), time.monotonic())
        logprobs: list[TokenLogprob] | None = None
        if req.logprobs is not None:
            logprobs = token_logprobs(logits_of(rows[: len(kept)]), kept, req.logprobs)
        if reason:
            self._finish(seq, reason)
        return seq.event(kept, logprobs)


def _native_or_fallback(model: HybridLM, asked: str) -> str:
    """The kernel set for a resolved "cpu-native": itself when the native forward builds here and
    supports `model`; else, for an "auto" request, "cpu-fast" with a one-line warning, and for an
    explicit cpu-native a ValueError."""
    reason = unsupported_reason(model)
    if reason is None:
        try:
            load_library()
        except NativeBuildError as exc:
            reason = str(exc).splitlines()[0]  # a compiler's log is long: its first line says it
    if reason is None:
        return "cpu-native"
    if asked == "cpu-native":
        raise ValueError(f"the cpu-native kernels cannot run: {reason}")
    log.warning("native CPU forward unavailable (%s): using the cpu-fast kernels", reason)
    return "cpu-fast"


def _build_model(config: EngineConfig, model_dir: Path, device: torch.device) -> HybridLM:
    """The checkpoint in model_dir, or a random-weight model of a shape preset built on `device`."""
    if config.random_weights:
        shape = preset_config(config.random_weights)
        return random_model(shape, device, config.torch_dtype, seed=config.seed or 0)
    return load_checkpoint(model_dir, dtype=config.torch_dtype, device=device)


def _build_runner(
    config: EngineConfig,
    model: HybridLM,
    capacity: int,
    drafter: Drafter,
    draft_ids: Tensor | None,
    forced: ForcedAcceptance | None,
) -> Runner:
    """The runner of config.kernels for this drafter: its MTP passes (none for AR) rank
    1 + siblings candidates per depth, over `draft_ids` when given."""
    geometry = drafter.geometry
    mtp = (geometry.depth_mtp, 1 + geometry.siblings_per_depth) if drafter.uses_mtp else None
    if config.kernels == "triton":
        from lumotree.engine.device_runner import (
            DeviceRunner,  # needs Triton, which CPU-only installs may lack
        )

        tree = None
        if drafter.kind == "tree" and config.tree_drafting == "device":
            assert drafter.suffix is not None
            tree = (geometry, drafter.suffix)
        return DeviceRunner(
            model, capacity, geometry.rows, config.max_depth, mtp, drafter.kind != "tree",
            not config.eager, draft_ids, forced, tree,
        )  # fmt: skip
    kernels = CPU_FAST if config.kernels in ("cpu-fast", "cpu-native") else REFERENCE
    native = (geometry.rows, config.prefill_chunk) if config.kernels == "cpu-native" else None
    return ModelRunner(
        model, capacity, config.max_depth, kernels, mtp, native, draft_ids, config.draft_head_dtype, forced,
        background=config.overlap_prompt_mtp,
    )  # fmt: skip
