"""The native forward's GDN core on a caller's own weights, state and token rows (forward.c's
`lt_gdn_chain`, `lt_gdn_tree`, `lt_gdn_publish`): the vLLM plugin runs vLLM's GDN layers with it.

Each row runs the native forward's `gdn_row` (conv window along the row's ancestry, SiLU, q/k L2
norm, gates, one recurrent step from its parent's state) and publication its replay, so a chain,
a tree's rows and a published path agree bit for bit as in the native forward. The caller's rows
are float32 or bfloat16 (a bfloat16 model's conv output is rounded to bfloat16, as its own conv
writes it); the recurrent state [HV, V, K] is float32, read and written in place; the conv state
[C, W-1] may be any float view (staged through a float32 copy).
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

from lumotree.model.native.model import (
    _MAX_CONV,
    _MAX_CONV_WIDTH,
    _MAX_HEAD,
    _GdnIO,
    _Layer,
    _library,
    _Model,
    _Rows,
)
from lumotree.tree import TreeDescriptor

_IO_DTYPES = {torch.float32: 0, torch.bfloat16: 1}
MAX_ROWS = 61  # rows of one verification or chain block (the conv publication's 64-entry history)


@dataclass(frozen=True)
class GdnShape:
    """One GDN layer's sizes: conv channels C = 2 H K + HV V, conv width W, key heads H of K, value
    heads HV of V."""

    conv_dim: int
    conv_width: int
    key_heads: int
    value_heads: int
    key_dim: int
    value_dim: int


@dataclass(frozen=True)
class GdnWeights:
    """One layer's weights the core reads: conv weight [C, W], A_log and dt_bias [HV] (any float dtype)."""

    conv: Tensor
    A_log: Tensor
    dt_bias: Tensor


class GdnRecords:
    """What a request's trees leave for publication, for every layer: pre-conv inputs [R, C], the
    rank-1 write vectors u [R, HV, V], exp(g) [R, HV] and normalised keys [R, H, K] (float32)."""

    def __init__(self, shape: GdnShape, layers: int, rows: int) -> None:
        s = shape
        self.x = torch.empty(layers, rows, s.conv_dim)
        self.u = torch.empty(layers, rows, s.value_heads, s.value_dim)
        self.eg = torch.empty(layers, rows, s.value_heads)
        self.k = torch.empty(layers, rows, s.key_heads, s.key_dim)


class TreeRows:
    """A tree's rows as the native GDN core and tree attention read them (logical order, no
    padding, the committed prefix its KV positions start after); keeps the tables its pointers lead
    to alive."""

    def __init__(self, tree: TreeDescriptor) -> None:
        n = tree.n_active
        if tree.rows != n or n > MAX_ROWS:
            raise ValueError(
                f"the native GDN core verifies unpadded trees of <= {MAX_ROWS} rows, got {tree.rows}"
            )
        self._tables = [
            t.to(torch.long).contiguous() for t in (tree.depth, tree.slot_map, tree.ancestor_at_depth)
        ]
        depth, slot, anc = self._tables
        self.struct = _Rows(
            n=n,
            prefix=tree.prefix_len,
            depth=depth.data_ptr(),
            slot=slot.data_ptr(),
            anc=anc.data_ptr(),
            anc_stride=anc.shape[1],
        )


@dataclass(eq=False)
class NativeTree:
    """A tree's rows as the native core reads them and the records its layers leave for publication."""

    rows: TreeRows
    records: GdnRecords


def _chain_rows(rows: int) -> tuple[_Rows, list[Tensor]]:
    """A chain of `rows` rows: depth i, ancestor at depth d = d."""
    depth = torch.arange(rows, dtype=torch.long)
    anc = depth.expand(rows, rows).contiguous()
    struct = _Rows(n=rows, depth=depth.data_ptr(), slot=depth.data_ptr(), anc=anc.data_ptr(), anc_stride=rows)
    return struct, [depth, anc]


def token_rows(x: Tensor, a: Tensor, b: Tensor, o: Tensor) -> _GdnIO:
    """The caller's flat token rows: pre-conv x [N, C], gates a, b [N, HV], outputs o [N, HV, V],
    one dtype (float32 or bfloat16), unit stride within a row."""
    dtype = x.dtype
    if dtype not in _IO_DTYPES or any(t.dtype != dtype for t in (a, b, o)):
        raise ValueError(
            "x, a, b, o must share one dtype, float32 or bfloat16; "
            f"got {x.dtype}, {a.dtype}, {b.dtype}, {o.dtype}"
        )
    o2 = o.flatten(1)  # a view: within a row o is [HV, V] contiguous
    if any(t.stride(-1) != 1 for t in (x, a, b, o2)):
        raise ValueError("rows must have unit stride")
    return _GdnIO(
        x=x.data_ptr(),
        a=a.data_ptr(),
        b=b.data_ptr(),
        o=o2.data_ptr(),
        ldx=x.stride(0),
        lda=a.stride(0),
        ldb=b.stride(0),
        ldo=o2.stride(0),
        bf16=_IO_DTYPES[dtype],
    )


class NativeGdn:
    """The native GDN core of a model's GDN layers (index 0.. in model order): chains and trees of
    up to `max_rows` rows a call (chains of any length run in blocks of that many)."""

    def __init__(self, shape: GdnShape, weights: Sequence[GdnWeights], max_rows: int) -> None:
        if not 1 <= max_rows <= MAX_ROWS:
            raise ValueError(f"max_rows must be in 1..{MAX_ROWS}, got {max_rows}")
        s = shape
        if (
            s.value_heads % s.key_heads
            or s.key_dim % 16
            or s.value_dim % 16
            or max(s.key_dim, s.value_dim) > _MAX_HEAD
            or s.conv_dim > _MAX_CONV  # bounds HV V (and HV) too: C = 2 H K + HV V
            or s.conv_width > _MAX_CONV_WIDTH
        ):  # forward.c's fixed-size row buffers
            raise ValueError(f"the native GDN core does not serve {shape}")
        self.lib, self.shape, self.max_rows = _library(), shape, max_rows
        self._keep = [
            t.detach().float().contiguous()
            for w in weights
            for t in (
                w.conv.reshape(s.conv_dim, s.conv_width),
                -torch.exp(w.A_log.detach().float()),
                w.dt_bias,
            )
        ]
        self._layers = (_Layer * len(weights))(
            *(
                _Layer(is_gdn=1, conv_w=c.data_ptr(), neg_a=na.data_ptr(), dt_bias=dt.data_ptr())
                for c, na, dt in zip(self._keep[0::3], self._keep[1::3], self._keep[2::3], strict=True)
            )
        )
        self._states = torch.empty(max_rows, s.value_heads, s.value_dim, s.key_dim)
        self._model = _Model(
            max_rows=max_rows,
            hk=s.key_heads,
            hv=s.value_heads,
            dk=s.key_dim,
            dv=s.value_dim,
            conv_dim=s.conv_dim,
            conv_w=s.conv_width,
            states=self._states.data_ptr(),
        )
        self._conv = torch.empty(len(weights), s.conv_dim, s.conv_width - 1)  # float32 conv states
        self._chain, self._chain_tables = _chain_rows(max_rows)
        self._chain_records = self.new_records()

    def new_records(self) -> GdnRecords:
        """Record buffers for one tree's verification in every layer."""
        return GdnRecords(self.shape, len(self._layers), self.max_rows)

    def new_tree(self, tree: TreeDescriptor) -> NativeTree:
        """A tree's tables and record buffers, for `tree` and `publish`."""
        if tree.n_active > self.max_rows:
            raise ValueError(f"{tree.n_active} tree rows exceed the core's {self.max_rows}")
        return NativeTree(TreeRows(tree), self.new_records())

    def _point(self, layer: int, state: Tensor, records: GdnRecords) -> _Layer:
        """Layer `layer` pointed at a float32 state [HV, V, K], the staged conv state and records."""
        if state.dtype != torch.float32 or not state.is_contiguous():
            raise ValueError(f"the recurrent state must be contiguous float32, got {state.dtype}")
        L = self._layers[layer]
        L.recurrent, L.conv_state = state.data_ptr(), self._conv[layer].data_ptr()
        L.rec_x, L.rec_u = records.x[layer].data_ptr(), records.u[layer].data_ptr()
        L.rec_eg, L.rec_k = records.eg[layer].data_ptr(), records.k[layer].data_ptr()
        return L

    def chain(self, layer: int, io: _GdnIO, start: int, n: int, conv_state: Tensor, state: Tensor) -> None:
        """n known tokens at io rows start.. through layer `layer` from (conv_state [C, W-1], state),
        both advanced in place; their outputs written to io's rows."""
        self._conv[layer].copy_(conv_state)
        L = self._point(layer, state, self._chain_records)
        self.lib.lt_gdn_chain(
            ctypes.byref(self._model), ctypes.byref(L), ctypes.byref(self._chain), n, ctypes.byref(io), start
        )
        conv_state.copy_(self._conv[layer])

    def tree(
        self, layer: int, tree: NativeTree, io: _GdnIO, start: int, conv_state: Tensor, state: Tensor
    ) -> None:
        """A tree's rows (logical row i at io row start + slot_map[i]) through layer `layer` from
        the committed states, which are only read; outputs to io's rows, records for `publish`."""
        self._conv[layer].copy_(conv_state)
        L = self._point(layer, state, tree.records)
        rows = ctypes.byref(tree.rows.struct)
        self.lib.lt_gdn_tree(ctypes.byref(self._model), ctypes.byref(L), rows, ctypes.byref(io), start)

    def publish(
        self, tree: NativeTree, states: Sequence[Tensor], convs: Sequence[Tensor], path: Sequence[int]
    ) -> None:
        """Publish logical nodes `path` (in order; a segment of an accepted path) of `tree` into
        every layer (states[i], convs[i]: layer i's, in place)."""
        records = tree.records
        if len(states) != len(self._layers) or len(convs) != len(self._layers):
            raise ValueError(f"publication needs the states of all {len(self._layers)} layers")
        for layer, (state, conv) in enumerate(zip(states, convs, strict=True)):
            self._conv[layer].copy_(conv)
            self._point(layer, state, records)
        nodes = torch.as_tensor(list(path), dtype=torch.long)
        layers = ctypes.byref(self._layers)
        self.lib.lt_gdn_publish(
            ctypes.byref(self._model), layers, len(self._layers), nodes.data_ptr(), len(nodes)
        )
        for layer, conv in enumerate(convs):
            conv.copy_(self._conv[layer])
