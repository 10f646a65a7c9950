"""Training loop (main next-token loss + MTP next-next-token losses, jointly) and held-out evaluation."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from lumotree.model import HybridLM


@dataclass(frozen=True)
class TrainSettings:
    """Optimisation settings; the schedule runs on wall time so the budget, not a step count, ends it."""

    seq_len: int = 2048
    batch_size: int = 16
    lr: float = 3e-3
    min_lr_ratio: float = 0.05
    warmup_steps: int = 200
    weight_decay: float = 0.1
    grad_clip: float = 1.0
    train_seconds: float = 330.0
    max_steps: int = 1_000_000
    chat_fraction: float = 0.25  # share of batch rows drawn from the chat stream
    mtp_weight: float = 0.5  # total weight of the MTP losses
    mtp_depths: int = 2  # recursive MTP steps trained (depth k predicts x_{t+k+1})
    log_every: int = 25
    seed: int = 0


class TokenStreams:
    """Random training windows from a code token stream and a chat stream (with its loss mask)."""

    def __init__(self, code: np.ndarray, chat: np.ndarray, chat_mask: np.ndarray, seq_len: int, seed: int):
        self.code = torch.from_numpy(code.astype(np.int64))
        self.chat = torch.from_numpy(chat.astype(np.int64))
        self.chat_mask = torch.from_numpy(chat_mask.astype(np.float32))
        self.window = seq_len + 1
        if len(self.code) <= self.window:
            raise ValueError(f"code stream of {len(self.code)} tokens is shorter than one window")
        self.gen = torch.Generator().manual_seed(seed)

    def batch(self, rows: int, chat_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens int64 [rows, seq_len+1], loss mask fp32 [rows, seq_len+1]); chat rows come last."""
        if len(self.chat) <= self.window:
            chat_rows = 0
        code_rows = rows - chat_rows
        starts = torch.randint(0, len(self.code) - self.window, (code_rows,), generator=self.gen)
        offsets = torch.arange(self.window)
        tokens = [self.code[starts[:, None] + offsets]]
        mask = [torch.ones(code_rows, self.window)]
        if chat_rows:
            starts = torch.randint(0, len(self.chat) - self.window, (chat_rows,), generator=self.gen)
            tokens.append(self.chat[starts[:, None] + offsets])
            mask.append(self.chat_mask[starts[:, None] + offsets])
        return torch.cat(tokens), torch.cat(mask)


def masked_ce(logits: torch.Tensor, targets: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (fp32) over positions where mask is 1. logits [B, T, V], targets/mask [B, T]."""
    loss = F.cross_entropy(logits.float().flatten(0, 1), targets.flatten(), reduction="none")
    m = mask.flatten()
    return (loss * m).sum() / m.sum().clamp_min(1.0)


def mtp_depth_weights(depths: int) -> list[float]:
    """Geometric weights 1, 1/2, 1/4 ... normalised to sum 1."""
    w = [0.5**k for k in range(depths)]
    return [x / sum(w) for x in w]


def losses(
    model: HybridLM, tokens: torch.Tensor, mask: torch.Tensor, mtp_depths: int
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """(main loss, [MTP loss of depth 1..]) on windows tokens [B, L+1] with loss mask [B, L+1].

    Depth k's row t takes depth k-1's hidden row (the main model's for k = 1) and token x_{t+k},
    sits at position t+k-1 and predicts x_{t+k+1}.
    """
    x = tokens[:, :-1]
    hidden = model(x)
    main = masked_ce(model.compute_logits(hidden), tokens[:, 1:], mask[:, 1:])
    mtp_losses = []
    h = hidden
    for k in range(1, mtp_depths + 1):
        h = model.mtp_forward(h[:, :-1], tokens[:, k:-1], start=k - 1)
        mtp_losses.append(masked_ce(model.compute_logits(h), tokens[:, k + 1 :], mask[:, k + 1 :]))
    return main, mtp_losses


def lr_at(step: int, elapsed: float, s: TrainSettings) -> float:
    """Linear warmup over steps, then cosine decay over the wall-time budget to min_lr_ratio * lr."""
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    progress = min(1.0, elapsed / s.train_seconds)
    return s.lr * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress)))


def train(
    model: HybridLM,
    streams: TokenStreams,
    settings: TrainSettings,
    device: torch.device,
    log: Callable[[dict], None],
) -> dict:
    """Train in place until the wall-time budget or max_steps; returns a summary dict."""
    s = settings
    torch.manual_seed(s.seed)
    model.to(device).train()
    decay = [p for p in {id(p): p for p in model.parameters()}.values() if p.ndim >= 2]
    no_decay = [p for p in {id(p): p for p in model.parameters()}.values() if p.ndim < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": s.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=s.lr,
        betas=(0.9, 0.95),
        eps=1e-8,
        fused=device.type == "cuda",
    )
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    weights = mtp_depth_weights(s.mtp_depths)
    chat_rows = round(s.batch_size * s.chat_fraction)
    step, tokens_seen, start = 0, 0, time.perf_counter()
    last: dict = {}
    while step < s.max_steps:
        elapsed = time.perf_counter() - start
        if elapsed >= s.train_seconds:
            break
        lr = lr_at(step, elapsed, s)
        for group in opt.param_groups:
            group["lr"] = lr
        tokens, mask = streams.batch(s.batch_size, chat_rows)
        tokens, mask = tokens.to(device, non_blocking=True), mask.to(device, non_blocking=True)
        with autocast:
            main, mtp = losses(model, tokens, mask, s.mtp_depths)
            total = main + s.mtp_weight * sum(w * m for w, m in zip(weights, mtp, strict=True))
        opt.zero_grad(set_to_none=True)
        total.backward()
        grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), s.grad_clip)
        opt.step()
        step += 1
        tokens_seen += tokens.numel() - tokens.shape[0]
        if step % s.log_every == 0 or step == 1:
            elapsed = time.perf_counter() - start
            last = {
                "step": step,
                "elapsed_s": round(elapsed, 1),
                "lr": lr,
                "loss": round(main.item(), 4),
                **{f"mtp{k + 1}_loss": round(m.item(), 4) for k, m in enumerate(mtp)},
                "grad_norm": round(grad_norm.item(), 3),
                "tokens": tokens_seen,
                "tokens_per_s": round(tokens_seen / max(elapsed, 1e-9)),
            }
            log(last)
    model.eval()
    return {
        "steps": step,
        "tokens": tokens_seen,
        "train_s": round(time.perf_counter() - start, 1),
        "last": last,
    }


@torch.no_grad()
def evaluate(
    model: HybridLM, stream: np.ndarray, seq_len: int, max_windows: int, device: torch.device, batch: int = 8
) -> dict:
    """Held-out metrics on non-overlapping windows of a token stream.

    loss / top1: main model next-token cross-entropy and accuracy. mtpK_loss / mtpK_top1: depth-K MTP
    against the text. mtpK_agree: MTP top-1 equals the target model's own top-1 for the same token
    (depth 1 row t vs main row t+1 -- exactly the quantity that decides greedy MTP acceptance).
    """
    model.to(device).eval()
    window = seq_len + 1
    count = min(max_windows, len(stream) // window)
    if count == 0:
        raise ValueError("held-out stream is shorter than one window")
    data = torch.from_numpy(stream[: count * window].astype(np.int64)).view(count, window)
    sums: dict[str, float] = {}
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda")
    for i in range(0, count, batch):
        tokens = data[i : i + batch].to(device)
        x = tokens[:, :-1]
        with autocast:
            hidden = model(x)
            logits = model.compute_logits(hidden).float()
            target_pred = logits.argmax(-1)  # row t predicts x_{t+1}
            _acc(
                sums, "loss", F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten(), reduction="sum")
            )
            _acc(sums, "top1", (target_pred == tokens[:, 1:]).sum())
            _acc(sums, "n", torch.tensor(tokens[:, 1:].numel()))
            h = hidden
            for k in (1, 2):
                h = model.mtp_forward(h[:, :-1], tokens[:, k:-1], start=k - 1)
                mtp_logits = model.compute_logits(h).float()
                pred = mtp_logits.argmax(-1)  # depth-k row t predicts x_{t+k+1}
                truth = tokens[:, k + 1 :]
                _acc(
                    sums,
                    f"mtp{k}_loss",
                    F.cross_entropy(mtp_logits.flatten(0, 1), truth.flatten(), reduction="sum"),
                )
                _acc(sums, f"mtp{k}_top1", (pred == truth).sum())
                _acc(sums, f"mtp{k}_agree", (pred == target_pred[:, k:]).sum())
                _acc(sums, f"mtp{k}_n", torch.tensor(truth.numel()))
    out = {"windows": count, "tokens": int(sums["n"])}
    out["loss"] = sums["loss"] / sums["n"]
    out["top1"] = sums["top1"] / sums["n"]
    for k in (1, 2):
        n = sums[f"mtp{k}_n"]
        for name in ("loss", "top1", "agree"):
            out[f"mtp{k}_{name}"] = sums[f"mtp{k}_{name}"] / n
    return {k: round(v, 4) if isinstance(v, float) else v for k, v in out.items()}


def _acc(sums: dict[str, float], key: str, value: torch.Tensor) -> None:
    sums[key] = sums.get(key, 0.0) + float(value)
