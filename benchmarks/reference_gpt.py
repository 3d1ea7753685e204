"""A plain, single-file PyTorch GPT and training loop: the yardstick the kit is measured against.

Nothing here imports ``transformer_lab``: this is the code a practitioner would write by hand
(decoder-only, pre-norm blocks, learned positions, tied output embedding, fused causal
attention through ``F.scaled_dot_product_attention``, AdamW, a hand-written loop). The
benchmarks compare the kit's GPT, LightningModule and Trainer with it on the same shapes,
data and optimiser, so any gap is the kit's overhead.

It also defines the shared *evaluation* (``evaluate``) used for both sides of the quality
benchmark, so that the two validation losses are computed identically.

Shape letters: B batch, T time, D model width, H heads, Dh head width, V vocabulary.

References: Radford et al. 2019, "Language Models are Unsupervised Multitask Learners" (GPT-2
layout); Karpathy's nanoGPT (the character-level Shakespeare recipes used as baselines).

Run ``python benchmarks/reference_gpt.py --help`` for a stand-alone char-LM training run.
"""

from __future__ import annotations

import argparse
import math
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# ----------------------------------------------------------------------------- model


@dataclass
class RefConfig:
    """Hyper-parameters of the reference GPT."""

    vocab_size: int  # number of distinct tokens
    n_ctx: int = 64  # longest sequence the position table covers
    d_model: int = 128  # residual stream width
    n_layers: int = 4  # transformer blocks
    n_heads: int = 4  # attention heads per block; must divide d_model
    dropout: float = 0.0  # on attention weights, residual branches and embeddings
    bias: bool = True  # biases in Linear and LayerNorm layers

    def __post_init__(self) -> None:
        if self.d_model % self.n_heads != 0:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")
        if min(self.vocab_size, self.n_ctx, self.n_layers) < 1:
            raise ValueError(
                f"vocab_size={self.vocab_size}, n_ctx={self.n_ctx}, n_layers={self.n_layers} "
                "must all be >= 1"
            )


class _Block(nn.Module):
    """Pre-norm block: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, cfg: RefConfig) -> None:
        super().__init__()
        d = cfg.d_model
        self.n_heads = cfg.n_heads
        self.p_drop = cfg.dropout
        self.ln1 = nn.LayerNorm(d, bias=cfg.bias)
        self.qkv = nn.Linear(d, 3 * d, bias=cfg.bias)
        self.proj = nn.Linear(d, d, bias=cfg.bias)
        self.ln2 = nn.LayerNorm(d, bias=cfg.bias)
        self.fc = nn.Linear(d, 4 * d, bias=cfg.bias)
        self.fc_out = nn.Linear(4 * d, d, bias=cfg.bias)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: Tensor) -> Tensor:
        B, T, D = x.shape
        H = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(D, dim=-1)  # 3 x (B, T, D)
        q = q.view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, Dh)
        k = k.view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, Dh)
        v = v.view(B, T, H, D // H).transpose(1, 2)  # (B, H, T, Dh)
        p = self.p_drop if self.training else 0.0
        a = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)  # (B, H, T, Dh)
        a = a.transpose(1, 2).reshape(B, T, D)  # (B, T, D)
        x = x + self.drop(self.proj(a))
        return x + self.drop(self.fc_out(F.gelu(self.fc(self.ln2(x)))))


class RefGPT(nn.Module):
    """Decoder-only Transformer language model, written plainly for benchmarking."""

    def __init__(self, cfg: RefConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.n_ctx, cfg.d_model)
        self.drop = nn.Dropout(cfg.dropout)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model, bias=cfg.bias)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.head.weight = self.tok.weight  # tied input/output embedding
        self.apply(self._init)
        # GPT-2: scale the projections that write into the residual stream by 1/sqrt(2L).
        for name, p in self.named_parameters():
            if name.endswith(("proj.weight", "fc_out.weight")):
                nn.init.normal_(p, 0.0, 0.02 / math.sqrt(2 * cfg.n_layers))

    @staticmethod
    def _init(m: nn.Module) -> None:
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, 0.0, 0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)

    def forward(self, idx: Tensor) -> Tensor:
        """Next-token logits.

        Args:
            idx: token ids, shape (B, T) with T <= n_ctx.

        Returns:
            logits of shape (B, T, V).
        """
        T = idx.shape[1]
        if self.cfg.n_ctx < T:
            raise ValueError(f"sequence length T={T} exceeds n_ctx={self.cfg.n_ctx}")
        pos = torch.arange(T, device=idx.device)
        x = self.drop(self.tok(idx) + self.pos(pos))  # (B, T, D)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))  # (B, T, V)


# ----------------------------------------------------------------------------- data


@dataclass
class CharData:
    """A character corpus split 90/10 by characters, as id tensors."""

    train: Tensor  # (N_train,) int64
    val: Tensor  # (N_val,) int64
    chars: list[str]  # id -> character

    @property
    def vocab_size(self) -> int:
        return len(self.chars)


def load_chars(path: Path, train_fraction: float = 0.9) -> CharData:
    """Read a text file, build the sorted character vocabulary, split by characters."""
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction={train_fraction} must be in (0, 1)")
    text = Path(path).read_text(encoding="utf-8")
    chars = sorted(set(text))
    lookup = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([lookup[c] for c in text], dtype=torch.long)
    n = int(train_fraction * len(ids))
    return CharData(train=ids[:n], val=ids[n:], chars=chars)


def get_batch(
    data: Tensor, batch_size: int, block: int, gen: torch.Generator
) -> tuple[Tensor, Tensor]:
    """Random contiguous windows: inputs (B, T) and the same windows shifted by one (B, T)."""
    starts = torch.randint(len(data) - block - 1, (batch_size,), generator=gen)
    offs = torch.arange(block)
    x = data[starts[:, None] + offs]  # (B, T)
    y = data[starts[:, None] + offs + 1]  # (B, T)
    return x, y


@torch.no_grad()
def evaluate(
    model: nn.Module,
    data: Tensor,
    block: int,
    *,
    batch_size: int = 64,
    max_windows: int | None = None,
    device: torch.device | str = "cpu",
) -> float:
    """Mean next-character cross-entropy over consecutive non-overlapping windows of ``data``.

    Deterministic (no sampling), so two models are compared on exactly the same characters.
    ``model`` maps (B, T) ids to (B, T, V) logits (the kit's GPT and ``RefGPT`` both do).
    """
    n_windows = (len(data) - 1) // block
    if max_windows is not None:
        n_windows = min(n_windows, max_windows)
    if n_windows < 1:
        raise ValueError(f"data of length {len(data)} is too short for block={block}")
    was_training = model.training
    model.eval()
    x_all = data[: n_windows * block].view(n_windows, block)  # (W, T)
    y_all = data[1 : n_windows * block + 1].view(n_windows, block)  # (W, T)
    total, count = 0.0, 0
    for i in range(0, n_windows, batch_size):
        x = x_all[i : i + batch_size].to(device)
        y = y_all[i : i + batch_size].to(device)
        logits = model(x).float()  # (B, T, V)
        total += F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="sum").item()
        count += y.numel()
    model.train(was_training)
    return total / count


# ----------------------------------------------------------------------------- training


@dataclass
class TrainConfig:
    """Optimiser and loop settings of the plain training loop (defaults: the laptop recipe)."""

    steps: int = 2000
    batch_size: int = 12
    lr: float = 1e-3  # peak learning rate
    min_lr: float = 1e-4  # floor of the cosine decay
    warmup: int = 100  # linear warm-up steps
    schedule: str = "cosine"  # "cosine" | "constant"
    weight_decay: float = 0.1
    betas: tuple[float, float] = (0.9, 0.99)
    grad_clip: float = 1.0  # 0 disables clipping
    seed: int = 1337
    fused: bool | None = None  # AdamW's fused kernel; None: on CUDA only (torch's own default)


def lr_at(step: int, tc: TrainConfig) -> float:
    """Learning rate at ``step``: linear warm-up, then cosine decay to ``min_lr`` (or constant)."""
    if step < tc.warmup:
        return tc.lr * (step + 1) / tc.warmup
    if tc.schedule == "constant":
        return tc.lr
    frac = min(1.0, (step - tc.warmup) / max(1, tc.steps - tc.warmup))
    return tc.min_lr + 0.5 * (1.0 + math.cos(math.pi * frac)) * (tc.lr - tc.min_lr)


def make_optimizer(model: nn.Module, tc: TrainConfig, device: torch.device) -> torch.optim.AdamW:
    """AdamW with decay on matrices only (not on biases, norms; embeddings are matrices)."""
    decay = [p for p in model.parameters() if p.requires_grad and p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.dim() < 2]
    groups = [
        {"params": decay, "weight_decay": tc.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    fused = device.type == "cuda" if tc.fused is None else tc.fused
    return torch.optim.AdamW(groups, lr=tc.lr, betas=tc.betas, fused=fused)


def train(
    model: nn.Module,
    data: CharData,
    tc: TrainConfig,
    *,
    device: torch.device,
    amp_dtype: torch.dtype | None = None,
    log_every: int = 0,
    skip_steps: int = 0,
    block: int | None = None,
    step_times: list[float] | None = None,
) -> dict[str, float]:
    """Train ``model`` on random windows of ``data.train`` with the plain loop.

    Args:
        model: maps (B, T) ids to (B, T, V) logits.
        data: the corpus.
        tc: loop settings.
        device: where to train.
        amp_dtype: autocast dtype (bf16/fp16) or None for fp32; fp16 uses a GradScaler.
        log_every: print the training loss every this many steps (0: never).
        skip_steps: leave the first steps out of the timing (warm-up of allocator and caches).
        block: window length (default ``model.cfg.n_ctx``; pass it for models without ``cfg``).
        step_times: if given, the clock at the start of every step (device synchronised) and
            at the end of the last one is appended to it.

    Returns:
        ``{"train_seconds", "train_cpu_seconds", "tokens_per_s", "last_loss"}`` (process CPU
        time, all threads, over the same window); evaluation is left to the caller.
    """
    if not 0 <= skip_steps < tc.steps:
        raise ValueError(f"skip_steps={skip_steps} must lie in [0, steps={tc.steps})")
    block = block or model.cfg.n_ctx
    gen = torch.Generator().manual_seed(tc.seed)
    opt = make_optimizer(model, tc, device)
    scaler = torch.amp.GradScaler(device.type, enabled=amp_dtype == torch.float16)
    model.train()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    t0, c0 = time.perf_counter(), time.process_time()
    loss = torch.zeros(())
    for step in range(tc.steps):
        if step_times is not None:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            step_times.append(time.perf_counter())
        if step == skip_steps and step > 0:
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            t0, c0 = time.perf_counter(), time.process_time()
        for g in opt.param_groups:
            g["lr"] = lr_at(step, tc)
        x, y = get_batch(data.train, tc.batch_size, block, gen)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        with torch.autocast(
            device.type, dtype=amp_dtype or torch.float32, enabled=amp_dtype is not None
        ):
            logits = model(x)  # (B, T, V)
            loss = F.cross_entropy(logits.flatten(0, 1).float(), y.flatten())
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        if tc.grad_clip > 0:
            scaler.unscale_(opt)
            nn.utils.clip_grad_norm_(model.parameters(), tc.grad_clip)
        scaler.step(opt)
        scaler.update()
        if log_every and (step % log_every == 0 or step == tc.steps - 1):
            print(f"step {step:5d}  loss {loss.item():.4f}  lr {lr_at(step, tc):.2e}", flush=True)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    seconds, cpu_seconds = time.perf_counter() - t0, time.process_time() - c0
    if step_times is not None:
        step_times.append(time.perf_counter())
    return {
        "train_seconds": seconds,
        "train_cpu_seconds": cpu_seconds,
        "tokens_per_s": (tc.steps - skip_steps) * tc.batch_size * block / seconds,
        "last_loss": float(loss.item()),
    }


def main(argv: list[str] | None = None) -> None:
    """Train the reference GPT on a character corpus and print the validation loss."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = Path(__file__).resolve().parent
    p.add_argument(
        "--data", type=Path, default=here.parent.parent / "shared/data/tinyshakespeare.txt"
    )
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--width", type=int, default=128)
    p.add_argument("--ctx", type=int, default=64)
    p.add_argument("--dropout", type=float, default=0.0)
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--batch", type=int, default=12)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--min-lr", type=float, default=1e-4)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--schedule", default="cosine")
    p.add_argument("--log-every", type=int, default=200)
    a = p.parse_args(argv)
    device = torch.device(a.device)
    data = load_chars(a.data)
    torch.manual_seed(1337)
    cfg = RefConfig(data.vocab_size, a.ctx, a.width, a.layers, a.heads, a.dropout)
    model = RefGPT(cfg).to(device)
    tc = TrainConfig(a.steps, a.batch, a.lr, a.min_lr, a.warmup, a.schedule)
    stats = train(model, data, tc, device=device, log_every=a.log_every)
    val = evaluate(model, data.val, a.ctx, device=device)
    secs, rate = stats["train_seconds"], stats["tokens_per_s"]
    print(f"val_loss {val:.4f}  train {secs:.1f}s  {rate:.0f} tok/s")


if __name__ == "__main__":
    main()
