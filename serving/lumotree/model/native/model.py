"""The native CPU forward of a HybridLM (forward.c through ctypes): tree verification, publication,
logits rows and the MTP draft step over one request's state, with the model's weights packed once
as bfloat16 panels.

It computes what `verify_tree`, `publish_tree_`, `compute_logits` and the MTP pass
(`HybridLM.mtp_hidden`) compute, in float32 arithmetic with a different summation order (equal
within float32 rounding, tested), and every row bitwise independent of the other rows:
autoregressive, chain and tree decoding of one engine agree bit for bit. The durable state is the
runner's own `ModelState` tensors (read and written in place, so prefill and the prefix cache keep
working on them).

Supported: float32 models whose weights are exactly bfloat16 values (a bfloat16 checkpoint loaded as
float32: packing loses nothing), dense MLPs, at most one MTP layer; `unsupported_reason` says why not.
"""

from __future__ import annotations

import ctypes
from ctypes import c_float, c_int32, c_int64, c_void_p

import torch
from torch import Tensor

from lumotree.model.model import HybridLM
from lumotree.model.native.build import NativeBuildError, load_library
from lumotree.model.norms import RMSNorm
from lumotree.model.state import GDNState, KVCache, ModelState
from lumotree.tree import TreeDescriptor


class _Linear(ctypes.Structure):
    _fields_ = [("n_pad", c_int32), ("k", c_int32), ("w", c_void_p)]


class _Layer(ctypes.Structure):
    _fields_ = [
        ("is_gdn", c_int32),
        ("in_norm", c_void_p),
        ("post_norm", c_void_p),
        ("proj", _Linear),
        ("out", _Linear),
        ("gate_up", _Linear),
        ("down", _Linear),
        ("conv_w", c_void_p),
        ("neg_a", c_void_p),
        ("dt_bias", c_void_p),
        ("gnorm", c_void_p),
        ("recurrent", c_void_p),
        ("conv_state", c_void_p),
        ("rec_x", c_void_p),
        ("rec_u", c_void_p),
        ("rec_eg", c_void_p),
        ("rec_k", c_void_p),
        ("q_norm", c_void_p),
        ("k_norm", c_void_p),
        ("k_cache", c_void_p),
        ("v_cache", c_void_p),
    ]


class _Model(ctypes.Structure):
    _fields_ = [
        ("hidden", c_int32),
        ("inter", c_int32),
        ("vocab", c_int32),
        ("n_layers", c_int32),
        ("max_rows", c_int32),
        ("hk", c_int32),
        ("hv", c_int32),
        ("dk", c_int32),
        ("dv", c_int32),
        ("conv_dim", c_int32),
        ("conv_w", c_int32),
        ("hq", c_int32),
        ("hkv", c_int32),
        ("hd", c_int32),
        ("rot", c_int32),
        ("eps", c_float),
        ("kv_capacity", c_int64),
        ("inv_freq", c_void_p),
        ("embed", c_void_p),
        ("final_norm", c_void_p),
        ("lm_head", _Linear),
        ("layers", ctypes.POINTER(_Layer)),
        ("work", c_void_p),
        ("states", c_void_p),
        ("mtp_norm_e", c_void_p),
        ("mtp_norm_h", c_void_p),
        ("mtp_norm", c_void_p),
        ("mtp_fc", _Linear),
        ("mtp_layer", ctypes.POINTER(_Layer)),
        ("draft_head", _Linear),
        ("draft_ids", c_void_p),
        ("draft_n", c_int32),
    ]


class _Rows(ctypes.Structure):
    _fields_ = [
        ("n", c_int32),
        ("prefix", c_int64),
        ("row_prefix", c_void_p),
        ("pos", c_void_p),
        ("depth", c_void_p),
        ("slot", c_void_p),
        ("anc", c_void_p),
        ("anc_stride", c_int32),
    ]


class _GdnIO(ctypes.Structure):
    _fields_ = [
        ("x", c_void_p),
        ("a", c_void_p),
        ("b", c_void_p),
        ("o", c_void_p),
        ("ldx", c_int64),
        ("lda", c_int64),
        ("ldb", c_int64),
        ("ldo", c_int64),
        ("bf16", c_int32),
    ]


class _PagedIO(ctypes.Structure):
    _fields_ = [
        ("cache", c_void_p),
        ("blocks", c_void_p),
        ("block_size", c_int32),
        ("q", c_void_p),
        ("o", c_void_p),
        ("ldq", c_int64),
        ("ldo", c_int64),
        ("bf16", c_int32),
    ]


class _LayoutEntry(ctypes.Structure):
    _fields_ = [("name", ctypes.c_char_p), ("value", c_int64)]


_MIRRORS: dict[str, type[ctypes.Structure]] = {
    "Linear": _Linear,
    "Layer": _Layer,
    "Model": _Model,
    "Rows": _Rows,
    "GdnIO": _GdnIO,
    "PagedIO": _PagedIO,
}


def c_layout(lib: ctypes.CDLL) -> dict[str, int]:
    """forward.c's structure layout as the library was compiled (`lt_layout`): "Struct" -> size,
    "Struct.field" -> offset, in bytes."""
    fn = lib.lt_layout
    fn.argtypes, fn.restype = [], ctypes.POINTER(_LayoutEntry)
    table, out, i = fn(), {}, 0
    while table[i].name is not None:
        out[table[i].name.decode()] = int(table[i].value)
        i += 1
    return out


def mirror_layout() -> dict[str, int]:
    """The same table for the ctypes mirror of this module."""
    out: dict[str, int] = {}
    for name, struct in _MIRRORS.items():
        out[name] = ctypes.sizeof(struct)
        for field, *_ in struct._fields_:
            out[f"{name}.{field}"] = getattr(struct, field).offset
    return out


def layout_mismatches(c: dict[str, int]) -> list[str]:
    """Each size or offset where the table `c` (c_layout, or a driver's --layout) and the mirror
    differ, and each entry only one of them has; [] when they agree."""
    mirror = mirror_layout()
    return [
        f"{key}: C {c.get(key, 'missing')}, ctypes {mirror.get(key, 'missing')}"
        for key in sorted(c.keys() | mirror.keys())
        if c.get(key) != mirror.get(key)
    ]


_P = c_void_p
_SIGNATURES = {
    "lt_pack_bf16": [_P, c_int32, c_int32, c_int32, _P],
    "lt_work_floats": [c_int32, c_int32, c_int32, c_int32, c_int32, c_int64],
    "lt_verify": [_P, _P, _P, _P, _P],
    "lt_publish": [_P, _P, _P, c_int32, _P],
    "lt_logits": [_P, _P, c_int32, _P],
    "lt_mtp_step": [_P, _P, _P, _P, _P, _P, _P],
    "lt_mtp_propose": [_P, _P, _P, _P, c_int32, c_int32, _P, _P, _P, _P],
    "lt_gdn_tree": [_P, _P, _P, _P, c_int64],
    "lt_gdn_chain": [_P, _P, _P, c_int32, _P, c_int64],
    "lt_gdn_publish": [_P, _P, c_int32, _P, c_int32],
    "lt_attn_work_floats": [c_int64],
    "lt_paged_tree_attention": [_P, _P, _P, _P, c_int64, c_int64, _P, _P],
}
# limits of forward.c's fixed-size buffers
_MAX_CONV = 4096  # conv channels
_MAX_MIX = 4096  # hidden size, value heads x dim, query heads x dim
_MAX_HEAD = 256  # any head dim
_MAX_ROT = 256  # rotary dims
_MAX_DEPTH = 31  # tree depth (publication's history)
_MAX_CONV_WIDTH = 16
_MAX_GROUP = 8  # query heads per KV head
_MAX_TOPK = 64


def _library() -> ctypes.CDLL:
    lib = load_library()
    mismatches = layout_mismatches(c_layout(lib))
    if mismatches:  # a call would read and write through wrong offsets
        raise NativeBuildError(
            f"forward.c's structures differ from model.py's mirror: {'; '.join(mismatches)}"
        )
    for name, args in _SIGNATURES.items():
        fn = getattr(lib, name)
        fn.argtypes = args
        fn.restype = {
            "lt_work_floats": c_int64,
            "lt_attn_work_floats": c_int64,
            "lt_mtp_propose": c_int32,
        }.get(name)
    return lib


def _pad16(n: int) -> int:
    return -(-n // 16) * 16


def unsupported_reason(model: HybridLM) -> str | None:
    """Why the native forward cannot run `model` (None: it can)."""
    cfg = model.config
    if model.dtype != torch.float32:
        return f"model dtype {model.dtype} (the native forward computes float32)"
    if cfg.num_experts:
        return "sparse MoE layers"
    if model.mtp is not None and len(model.mtp.layers) != 1:
        return f"{len(model.mtp.layers)} MTP layers (one supported)"
    if any(
        d % 16 for d in (cfg.hidden_size, cfg.linear_key_head_dim, cfg.linear_value_head_dim, cfg.head_dim)
    ):
        return "hidden size and head dims must be multiples of 16"
    if (
        cfg.conv_dim > _MAX_CONV
        or max(cfg.hidden_size, cfg.value_dim, cfg.num_attention_heads * cfg.head_dim) > _MAX_MIX
        or cfg.rotary_dim > _MAX_ROT
        or cfg.linear_conv_kernel_dim > _MAX_CONV_WIDTH
    ):
        return "layer widths beyond the native forward's buffers"
    for name, p in model.named_parameters():
        if p.ndim >= 2 and not torch.equal(p.detach().to(torch.bfloat16).float(), p.detach()):
            return f"weight {name} is not exactly bfloat16 (packing would round it)"
    return None


class NativeModel:
    """The native forward of `model` over `state` (the runner's request state): trees of up to
    `tree_rows` rows, MTP passes of up to `max_rows` rows (a prefill chunk commits that many); MTP
    proposals rank `draft_ids` (sorted token ids, a draft vocabulary) when given. `capacity`: the
    KV rows a pass may attend over, when not the state's (a model loaded without its decoder
    layers, drafting only, has none: its MTP caches' length)."""

    def __init__(
        self,
        model: HybridLM,
        state: ModelState,
        tree_rows: int,
        max_rows: int,
        draft_ids: Tensor | None = None,
        capacity: int | None = None,
    ) -> None:
        reason = unsupported_reason(model)
        if reason:
            raise ValueError(f"the native CPU forward does not support this model: {reason}")
        self.lib = _library()
        self.model, self.state = model, state
        self.config = cfg = model.config
        self.tree_rows, self.max_rows = tree_rows, max(max_rows, tree_rows)
        if cfg.num_attention_heads // cfg.num_key_value_heads > _MAX_GROUP:
            raise ValueError(f"more than {_MAX_GROUP} query heads per KV head")
        self._keep: list[Tensor] = []  # every buffer a C pointer refers to
        self._scratch: list[Tensor] = []  # the per-call work buffers among them
        self.capacity = state.capacity if capacity is None else capacity
        layers = [self._layer(layer, s) for layer, s in zip(model.model.layers, state.layers, strict=True)]
        self._layers = (_Layer * len(layers))(*layers)
        self._mtp_layer = None
        m = _Model(
            hidden=cfg.hidden_size,
            inter=cfg.intermediate_size,
            vocab=cfg.vocab_size,
            n_layers=cfg.num_hidden_layers,
            max_rows=self.max_rows,
            hk=cfg.linear_num_key_heads,
            hv=cfg.linear_num_value_heads,
            dk=cfg.linear_key_head_dim,
            dv=cfg.linear_value_head_dim,
            conv_dim=cfg.conv_dim,
            conv_w=cfg.linear_conv_kernel_dim,
            hq=cfg.num_attention_heads,
            hkv=cfg.num_key_value_heads,
            hd=cfg.head_dim,
            rot=cfg.rotary_dim,
            eps=cfg.rms_norm_eps,
            kv_capacity=self.capacity,
            inv_freq=self._ptr(model.rotary.inv_freq.float()),
            embed=self._ptr(model.model.embed_tokens.weight.detach().to(torch.bfloat16)),
            final_norm=self._norm(model.model.norm),
            lm_head=self._linear(model.lm_head.weight),
            layers=self._layers,
        )
        self.vocab_pad = m.lm_head.n_pad
        if model.mtp is not None:
            mtp = model.mtp
            self._mtp_layer = (_Layer * 1)(self._layer(mtp.layers[0], None))
            m.mtp_norm_e = self._norm(mtp.pre_fc_norm_embedding)
            m.mtp_norm_h = self._norm(mtp.pre_fc_norm_hidden)
            m.mtp_norm = self._norm(mtp.norm)
            m.mtp_fc = self._linear(mtp.fc.weight)
            m.mtp_layer = self._mtp_layer
        if draft_ids is not None:  # MTP proposals rank these rows of the vocabulary projection only
            ids = draft_ids.to(torch.int64).contiguous()
            m.draft_head = self._linear(model.lm_head.weight.detach().index_select(0, ids))
            m.draft_ids, m.draft_n = self._ptr(ids), ids.numel()
        self.draft_size = m.draft_n  # 0: the whole vocabulary
        sized = layers + ([self._mtp_layer[0]] if self._mtp_layer is not None else [])
        proj = max(ly.proj.n_pad for ly in sized)
        gate_up = max(ly.gate_up.n_pad for ly in sized)
        mix = max(cfg.value_dim, cfg.num_attention_heads * cfg.head_dim)
        floats = self.lib.lt_work_floats(
            self.max_rows,
            cfg.hidden_size,
            max(proj, gate_up),
            cfg.intermediate_size,
            mix,
            self.capacity + self.max_rows,
        )
        m.work = self._scratch_ptr(int(floats))
        state_shape = (cfg.linear_num_value_heads, cfg.linear_value_head_dim, cfg.linear_key_head_dim)
        m.states = self._scratch_ptr(tree_rows, *state_shape)
        self._model = m
        self._residual = torch.empty(self.max_rows, cfg.hidden_size)
        self._kv_tmp = torch.empty(2 * (_MAX_DEPTH + 1), cfg.num_key_value_heads * cfg.head_dim)
        self._mtp_hidden = torch.empty(self.max_rows, cfg.hidden_size)
        self._mtp_logits = torch.empty(self.vocab_pad)
        self._scratch += [self._residual, self._kv_tmp, self._mtp_hidden, self._mtp_logits]
        self._rows, self._mtp_rows = _Rows(), _Rows()  # the last verification's rows stay for publish
        self._keep_rows: dict[int, tuple[Tensor | None, ...]] = {}
        self._verified: TreeDescriptor | None = None
        self._mtp_cache: KVCache | None = None
        self._chain_tables: dict[int, tuple[Tensor, Tensor]] = {}

    # ---- packing -------------------------------------------------------------------------------
    def _ptr(self, t: Tensor) -> int:
        t = t.detach().contiguous()
        self._keep.append(t)
        return t.data_ptr()

    def _scratch_ptr(self, *shape: int) -> int:
        t = torch.empty(*shape)
        self._scratch.append(t)
        return self._ptr(t)

    def _linear(self, *weights: Tensor) -> _Linear:
        """Rows of `weights` stacked (a fused projection), packed into bfloat16 panels."""
        w = torch.cat([x.detach() for x in weights]).to(torch.bfloat16).contiguous()
        n, k = w.shape
        n_pad = _pad16(n)
        packed = torch.empty(n_pad * k, dtype=torch.bfloat16)
        self.lib.lt_pack_bf16(w.data_ptr(), n, k, n_pad, packed.data_ptr())
        self._keep.append(packed)
        return _Linear(n_pad, k, packed.data_ptr())

    def _norm(self, norm: RMSNorm) -> int:
        """The multiplier 1 + w of a zero-centred RMSNorm."""
        return self._ptr(1.0 + norm.weight.detach().float())

    def _layer(self, layer: torch.nn.Module, s: GDNState | KVCache | None) -> _Layer:
        cfg = self.config
        out = _Layer(
            is_gdn=int(layer.is_linear),
            in_norm=self._norm(layer.input_layernorm),
            post_norm=self._norm(layer.post_attention_layernorm),
            gate_up=self._linear(layer.mlp.gate_proj.weight, layer.mlp.up_proj.weight),
            down=self._linear(layer.mlp.down_proj.weight),
        )
        if layer.is_linear:
            g = layer.linear_attn
            assert isinstance(s, GDNState)
            out.proj = self._linear(
                g.in_proj_qkv.weight, g.in_proj_z.weight, g.in_proj_b.weight, g.in_proj_a.weight
            )
            out.out = self._linear(g.out_proj.weight)
            out.conv_w = self._ptr(g.conv1d.weight.detach()[:, 0].float())
            out.neg_a = self._ptr(-torch.exp(g.A_log.detach().float()))
            out.dt_bias = self._ptr(g.dt_bias.detach().float())
            out.gnorm = self._ptr(g.norm.weight.detach().float())
            out.recurrent, out.conv_state = s.recurrent.data_ptr(), s.conv.data_ptr()
            r, hv = self.tree_rows, cfg.linear_num_value_heads
            out.rec_x = self._scratch_ptr(r, cfg.conv_dim)
            out.rec_u = self._scratch_ptr(r, hv, cfg.linear_value_head_dim)
            out.rec_eg = self._scratch_ptr(r, hv)
            out.rec_k = self._scratch_ptr(r, cfg.linear_num_key_heads, cfg.linear_key_head_dim)
        else:
            a = layer.self_attn
            out.proj = self._linear(a.q_proj.weight, a.k_proj.weight, a.v_proj.weight)
            out.out = self._linear(a.o_proj.weight)
            out.q_norm, out.k_norm = self._norm(a.q_norm), self._norm(a.k_norm)
            if s is not None:
                assert isinstance(s, KVCache)
                out.k_cache, out.v_cache = s.key.data_ptr(), s.value.data_ptr()
        return out

    # ---- the forward modes ---------------------------------------------------------------------
    def verify(self, tree: TreeDescriptor, out: Tensor | None = None) -> Tensor:
        """Post-norm hidden rows [n_active, H] of the tree's active rows (logical order) from the
        committed state (into `out` when given); writes their KV at prefix_len + slot_map and keeps
        the GDN records for `publish`. tree.prefix_len must equal state.length."""
        n = tree.n_active
        if tree.prefix_len != self.state.length:
            raise ValueError(f"tree prefix_len {tree.prefix_len} != committed length {self.state.length}")
        if n > self.tree_rows or tree.prefix_len + n > self.capacity:
            raise ValueError(f"{n} rows at prefix {tree.prefix_len} exceed the native forward's room")
        if tree.max_depth > _MAX_DEPTH:
            raise ValueError(f"tree max_depth {tree.max_depth} > {_MAX_DEPTH}")
        self._set_rows(
            self._rows,
            n,
            tree.prefix_len,
            None,
            tree.position,
            tree.depth,
            tree.slot_map,
            tree.ancestor_at_depth,
        )
        hidden = torch.empty(n, self.config.hidden_size) if out is None else out
        if hidden.shape != (n, self.config.hidden_size) or not hidden.is_contiguous():
            raise ValueError(f"out must be a contiguous [{n}, {self.config.hidden_size}] tensor")
        self._call("lt_verify", self._model, self._rows, tree.tokens, self._residual, hidden)
        self._verified = tree
        return hidden

    def publish(self, tree: TreeDescriptor, accepted: list[int]) -> None:
        """Publish the accepted path (logical nodes, root first) of the last `verify(tree)` into the
        state in place (GDN replay, conv state, KV rows); state.length advances by len(accepted)."""
        if tree is not self._verified:
            raise ValueError("publish needs the tree of the last verification")
        if not 1 <= len(accepted) <= tree.n_active or accepted[0] != 0:
            raise ValueError(f"accepted path {accepted} is not a root path of {tree.n_active} rows")
        path = torch.tensor(accepted, dtype=torch.long)
        self._call("lt_publish", self._model, self._rows, path, len(accepted), self._kv_tmp)
        self.state.length += len(accepted)
        self._verified = None

    def logits(self, hidden: Tensor) -> Tensor:
        """Post-norm hidden [n, H] float32 -> logits [n, vocab]."""
        hidden = hidden.contiguous()
        n = hidden.shape[0]
        out = torch.empty(n, self.vocab_pad)
        self._call("lt_logits", self._model, hidden, n, out)
        return out[:, : self.config.vocab_size]

    def mtp_step(
        self, hidden: Tensor, tokens: Tensor, mtp_state: ModelState, step_idx: int = 0
    ) -> tuple[Tensor, Tensor]:
        """One MTP pass natively (`HybridLM.mtp_hidden`, then the logits of its last row): hidden
        rows [T, H] and their next tokens [T] at positions mtp_state.length.. -> (logits [V] of the
        last row, MTP hidden rows [T, H]); writes the MTP KV rows and advances mtp_state.length by T."""
        hidden, tokens, n = self._mtp_rows_for(hidden, tokens, mtp_state, step_idx, 0)
        out = torch.empty(n, self.config.hidden_size)
        logits = torch.empty(self.vocab_pad)
        self._call("lt_mtp_step", self._model, self._mtp_rows, hidden, tokens, self._residual, out, logits)
        mtp_state.length += n
        return logits[: self.config.vocab_size], out

    def mtp_propose(
        self, hidden: Tensor, tokens: Tensor, mtp_state: ModelState, depth: int, k: int
    ) -> tuple[list[int], list[list[int]]]:
        """`MTPDrafter.propose`'s passes and selection in one native call: the queued true rows
        (hidden [T, H], next tokens [T]) are committed at mtp_state.length.. (which advances by T),
        then depth - 1 speculative single rows follow (their KV rows lie past the committed length:
        rolled back). Returns the spine (depth tokens, each the lowest-index argmax) and each
        depth's ordered top-k (values descending, ties by index ascending; the spine token first),
        over the draft vocabulary when the model was built with one."""
        limit = min(_MAX_TOPK, self.draft_size or _MAX_TOPK)
        if not 1 <= k <= limit or depth < 1:
            raise ValueError(f"depth must be >= 1 and k in 1..{limit}, got {depth}, {k}")
        hidden, tokens, n = self._mtp_rows_for(hidden, tokens, mtp_state, 0, depth - 1)
        topk = torch.empty(depth, k, dtype=torch.long)
        status = self._call(
            "lt_mtp_propose",
            self._model,
            self._mtp_rows,
            hidden,
            tokens,
            depth,
            k,
            self._residual,
            self._mtp_hidden,
            self._mtp_logits,
            topk,
        )
        if status:
            raise ValueError("selection scores contain NaN")
        mtp_state.length += n
        ranked = topk.tolist()
        return [row[0] for row in ranked], ranked

    def _mtp_rows_for(
        self, hidden: Tensor, tokens: Tensor, mtp_state: ModelState, step_idx: int, extra: int
    ) -> tuple[Tensor, Tensor, int]:
        """Point the MTP layer at mtp_state's cache and the MTP rows at T chained rows from
        mtp_state.length (with room for `extra` speculative rows after them)."""
        if self._mtp_layer is None:
            raise ValueError("this model has no MTP module")
        cache = mtp_state.layers[step_idx % len(mtp_state.layers)]
        assert isinstance(cache, KVCache)
        if cache is not self._mtp_cache:
            layer = self._mtp_layer[0]
            layer.k_cache, layer.v_cache = cache.key.data_ptr(), cache.value.data_ptr()
            self._mtp_cache = cache
        start, n = mtp_state.length, hidden.shape[0]
        if not 1 <= n <= self.max_rows or start + n + extra > cache.key.shape[0]:
            raise ValueError(f"{n} MTP rows at {start} exceed the native forward's room")
        positions = torch.arange(start, start + n)
        zeros, own = self._chain_table(n)
        self._set_rows(self._mtp_rows, n, start, positions, positions, zeros, zeros, own)
        return hidden.contiguous(), tokens.to(torch.long).contiguous(), n

    # ---- calls into the library ----------------------------------------------------------------
    def _call(self, name: str, *args: ctypes.Structure | Tensor | int) -> int | None:
        """`name`(args) in the library: structures by reference, tensors by their data pointer.
        An instance may replace it to run the calls elsewhere (`remote.py`)."""
        conv = [
            ctypes.byref(a)
            if isinstance(a, ctypes.Structure)
            else a.data_ptr()
            if isinstance(a, Tensor)
            else a
            for a in args
        ]
        return getattr(self.lib, name)(*conv)

    def tensors(self) -> list[Tensor]:
        """Every tensor the library may read or write besides a call's own arguments: weights,
        scratch, the request state and the rows' tables."""
        out = [*self._keep, *self._scratch, *self._all_state_tensors()]
        return out + [t for rows in self._keep_rows.values() for t in rows if t is not None]

    def structures(self) -> list[ctypes.Structure | ctypes.Array]:
        """The structures the library reads (never writes), whose pointers lead to `tensors()`."""
        out: list[ctypes.Structure | ctypes.Array] = [self._model, self._layers, self._rows, self._mtp_rows]
        return out + ([self._mtp_layer] if self._mtp_layer is not None else [])

    def _all_state_tensors(self) -> list[Tensor]:
        caches = [*self.state.layers] + ([self._mtp_cache] if self._mtp_cache is not None else [])
        out: list[Tensor] = []
        for s in caches:
            out += [s.recurrent, s.conv] if isinstance(s, GDNState) else [s.key, s.value]
        return out

    # ---- helpers -------------------------------------------------------------------------------
    def _chain_table(self, n: int) -> tuple[Tensor, Tensor]:
        """A chain as rows of their own prefix: depth and slot 0, ancestor at depth 0 = the row."""
        table = self._chain_tables.get(n)
        if table is None:
            table = (
                torch.zeros(n, dtype=torch.long),
                torch.arange(n, dtype=torch.long)[:, None].contiguous(),
            )
            self._chain_tables[n] = table
        return table

    def _set_rows(
        self,
        r: _Rows,
        n: int,
        prefix: int,
        row_prefix: Tensor | None,
        pos: Tensor,
        depth: Tensor,
        slot: Tensor,
        anc: Tensor,
    ) -> None:
        r.n, r.prefix = n, prefix
        r.row_prefix = None if row_prefix is None else row_prefix.data_ptr()
        r.pos, r.depth, r.slot, r.anc = pos.data_ptr(), depth.data_ptr(), slot.data_ptr(), anc.data_ptr()
        r.anc_stride = anc.shape[1]
        self._keep_rows[id(r)] = (row_prefix, pos, depth, slot, anc)  # alive while r points at them
