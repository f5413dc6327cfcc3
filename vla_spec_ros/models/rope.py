"""Rotary position embeddings (RoPE) as Hugging Face Llama computes them: rotate-half, cos/sin
tables in float32 (then cast), each token rotated at its LOGICAL position inside its own
request. Tables are built once per (dtype, device) and each forward gathers its rows once
(``RopeRows``), not once per layer.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..config import LlamaConfig


def rope_tables(head_dim: int, max_positions: int, theta: float, dtype: torch.dtype,
                device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables (max_positions, head_dim), computed in float32 as HF Llama does."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device)
                                .float() / head_dim))
    pos = torch.arange(max_positions, dtype=torch.int64, device=device).float()
    freqs = torch.outer(pos, inv_freq)
    emb = torch.cat([freqs, freqs], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat([-x[..., half:], x[..., :half]], dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x: (T, heads, D); cos/sin: (T, D) rows already gathered at each token's position."""
    return x * cos[:, None, :] + rotate_half(x) * sin[:, None, :]


def combined_rope_table(cos_table: torch.Tensor, sin_table: torch.Tensor) -> torch.Tensor:
    """(max_positions, 2D): each position's cos row, then its sin row with the first half
    negated (what ``RopeRows.apply`` multiplies ``roll(x)`` by): one gather per forward."""
    half = sin_table.shape[-1] // 2
    return torch.cat([cos_table, -sin_table[:, :half], sin_table[:, half:]], dim=-1)


class RopeTablePair(tuple):
    """``(cos_table, sin_table)``, plus ``combined`` (``combined_rope_table``), built with
    them once."""

    combined: torch.Tensor


class RopeTables:
    """cos/sin tables of one Llama config, built once per (dtype, device) and kept (the
    verifier and the draft head each own one)."""

    def __init__(self, cfg: LlamaConfig):
        self.head_dim, self.max_positions, self.theta = (cfg.head_dim,
                                                         cfg.max_position_embeddings,
                                                         cfg.rope_theta)
        self._tables: tuple[torch.Tensor, torch.Tensor] | None = None

    def get(self, dtype: torch.dtype, device) -> tuple[torch.Tensor, torch.Tensor]:
        tables = self._tables
        if tables is None or tables[0].dtype != dtype or tables[0].device != torch.device(device):
            tables = RopeTablePair(rope_tables(self.head_dim, self.max_positions, self.theta,
                                               dtype, device))
            tables.combined = combined_rope_table(*tables)
            self._tables = tables
        return tables


@dataclass
class RopeRows:
    """cos/sin tables (max_positions, D) and their rows at the step's positions (T, D),
    gathered once per forward instead of once per layer."""

    cos_table: torch.Tensor
    sin_table: torch.Tensor
    cos: torch.Tensor           # (T, 1, D)
    sin_signed: torch.Tensor    # (T, 1, D): sin with its first half negated

    @classmethod
    def gather(cls, tables: tuple[torch.Tensor, torch.Tensor], positions: torch.Tensor):
        """One row gather of the combined table (``RopeTables.get``'s, else built here)."""
        cos_table, sin_table = tables
        combined = getattr(tables, 'combined', None)
        if combined is None:
            combined = combined_rope_table(cos_table, sin_table)
        rows = combined.index_select(0, positions)[:, None, :]        # (T, 1, 2D)
        dim = cos_table.shape[-1]
        return cls(cos_table, sin_table, rows[..., :dim], rows[..., dim:])

    def apply(self, x: torch.Tensor) -> torch.Tensor:
        """``apply_rope`` in four ops instead of six: rotate_half(x) * sin equals
        roll(x, D/2) * sin_signed bit for bit ((-a) * b and a * (-b) round alike)."""
        return x * self.cos + x.roll(x.shape[-1] // 2, dims=-1) * self.sin_signed
