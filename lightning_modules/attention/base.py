"""What every attention kind shares, and the registry of kinds.

:class:`SelfAttention` owns the Q/K/V/O projections (Q/K/V fused: :class:`InputProjections`), the head split and
the mask contract; a kind subclasses it, registers itself with :func:`register_attention` and implements, as its
equation, either
:meth:`SelfAttention.attend_qkv` (a kind that reads the keys and values of every position: Q, K and V then come
from one product) or :meth:`SelfAttention.attend` (any other kind: it gets X and Q). Shapes: B batch, T sequence
length (≤ n = ``max_len``), d model width, h heads, d_h = d / h.

Mask contract, for every kind: ``mask`` is (B, T) bool, True at real tokens, or None when the batch has no
padding. Appending padding never changes a real token's output, and a padded position never contributes to
a real token's output (a kind zeroes or masks padded keys before anything mixes them). ``causal``: no output
depends on a later position.
"""

from __future__ import annotations

import math
from dataclasses import fields
from typing import Any, ClassVar, Iterable, NamedTuple, Optional

import torch
import torch.nn.functional as F
from omegaconf import DictConfig, OmegaConf
from torch import Tensor, nn

from foundation.configfile import merge
from foundation.errors import ConfigError, require

ATTENTION_KINDS: dict[str, type["SelfAttention"]] = {}


def register_attention(name: str):
    """Class decorator: make a :class:`SelfAttention` subclass the attention kind ``name``
    (``model.attention.kind: name``)."""

    def register(cls: type[SelfAttention]) -> type[SelfAttention]:
        if name in ATTENTION_KINDS and ATTENTION_KINDS[name] is not cls:
            raise ValueError(f"attention kind {name!r} is already registered ({ATTENTION_KINDS[name].__qualname__})")
        cls.kind = name
        ATTENTION_KINDS[name] = cls
        return cls

    return register


def kind_options(att: Any) -> DictConfig:
    """``attention.options`` checked against the kind's ``Options`` dataclass, with its defaults filled in."""
    kind = ATTENTION_KINDS[att.kind]
    given = OmegaConf.to_container(att.options) if isinstance(att.options, DictConfig) else dict(att.options or {})
    if kind.Options is None:
        require(not given, f"model.attention.options: kind {att.kind!r} takes no options, got {given}")
        return OmegaConf.create({})
    try:
        return merge(kind.Options, [given])
    except ConfigError as err:
        key, _, what = str(err).partition(": ")
        if what.startswith("unknown key"):
            what = f"not an option of kind {att.kind!r}" + what.removeprefix("unknown key").replace(
                "allowed here", "its options"
            )
        raise ConfigError(f"model.attention.options.{key}: {what}") from None


def _names(options: type) -> set[str]:
    return {f.name for f in fields(options)}


def misplaced_option(key: str) -> Optional[str]:
    """What to write instead of ``key`` when it is a kind's option given beside ``attention.kind`` (None: it is
    no kind's option)."""
    parent, _, name = key.rpartition(".")
    if parent.rpartition(".")[2] != "attention" or name == "options":
        return None
    owners = [
        kind for kind, cls in ATTENTION_KINDS.items() if cls.Options and name in {f.name for f in fields(cls.Options)}
    ]
    if not owners:
        return None
    return f"an option of kind {' and '.join(map(repr, owners))}: write {parent}.options.{name}"


class Linear(NamedTuple):
    """One projection, y = x Wᵀ + b: its weight (d, d) and bias (d,), views of :class:`InputProjections`' rows."""

    weight: Tensor
    bias: Tensor

    def __call__(self, x: Tensor) -> Tensor:
        return F.linear(x, self.weight, self.bias)


class InputProjections(nn.Module):
    """A layer's W_q, W_v, W_k as one weight [W_q; W_v; W_k] (m·d, d) and one bias (m·d,), m ≤ 3 the projections
    its kind has, in that row order: every set a kind projects with in one product (Q, K, V; K, V; Q; Q, V) is a
    contiguous block of rows, which one GEMM reads as a view (nothing concatenated per call).

    The random draws are those of three ``nn.Linear(d, d)`` built for q, k, v in that order (one the kind lacks
    still draws, into nothing) and :meth:`normal_` redraws them in that order: a seed gives the weights that
    separate linears got, bit for bit."""

    ROWS: ClassVar[str] = "qvk"

    def __init__(self, d: int, names: str) -> None:
        super().__init__()
        self.d, self.names = d, "".join(name for name in self.ROWS if name in names)
        self.weight = nn.Parameter(torch.empty(len(self.names) * d, d))  # (m·d, d)
        self.bias = nn.Parameter(torch.empty(len(self.names) * d))  # (m·d,)
        self.reset_parameters()

    def part(self, name: str) -> Optional[Linear]:
        """The projection ``name`` (q, k or v), or a block of consecutive rows (``"vk"``: [W_v; W_k], one product
        for both), as views of the fused rows; None when the kind has none."""
        i = self.names.find(name)
        if i < 0:
            return None
        rows = slice(i * self.d, (i + len(name)) * self.d)
        return Linear(self.weight[rows], self.bias[rows])

    def reset_parameters(self) -> None:
        """As ``nn.Linear(d, d)`` initialises W_q, b_q, then W_k, b_k, then W_v, b_v: U(±1/√d) each."""
        bound = 1 / math.sqrt(self.d)
        for name in "qkv":
            weight, bias = self.part(name) or (self.weight.new_empty(self.d, self.d), self.bias.new_empty(self.d))
            nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
            nn.init.uniform_(bias, -bound, bound)

    def normal_(self, std: float) -> None:
        """W ~ N(0, std²) drawn for W_q, W_k, W_v in that order, biases zero (the encoder's initialisation)."""
        for part in filter(None, map(self.part, "qkv")):
            nn.init.normal_(part.weight, std=std)
            nn.init.zeros_(part.bias)

    def forward(self, x: Tensor, names: str) -> tuple[Tensor, ...]:
        """X W_nᵀ + b_n for each projection n of ``names`` (in that order), (B, T, d) each, from one product over
        their block of rows."""
        at = sorted(self.names.index(name) for name in names)
        first, last = at[0], at[-1] + 1
        if last - first != len(names):
            raise ValueError(f"projections {names!r} are not one block of the rows {self.names!r}")
        rows = slice(first * self.d, last * self.d)
        out = F.linear(x, self.weight[rows], self.bias[rows]).chunk(last - first, -1)  # in row order
        return tuple(out[self.names.index(name) - first] for name in names)


class SelfAttention(nn.Module):
    """Multi-head self-attention: x (B, T, d) [+ mask (B, T)] → (B, T, d).

    ``forward`` computes Q = X W_qᵀ + b_q split into heads, lets the kind's :meth:`attend` produce the heads'
    outputs, and applies W_o. Class attributes a kind may set:

    * ``Options``: a dataclass of the kind's own options (``model.attention.options``), or None;
    * ``has_causal_form``: False refuses ``causal: true`` in the config check;
    * :meth:`check`: the kind's config rules; :meth:`select`: the class that implements the given options
      (a kind may have several forms); :meth:`build_shared`: one module the whole model shares (built once by the
      encoder, registered there as ``shared``, handed to every layer as its ``shared``).

    The other hooks are grouped below by who asks: the model, training and analysis (``docs/extending.md`` lists
    them all). What the bench times of a kind, and the library it races it against, live with the bench
    (``experiments/benchmarks/variants.py``).
    """

    kind: ClassVar[str] = ""
    Options: ClassVar[Optional[type]] = None
    has_causal_form: ClassVar[bool] = True
    # The input projections the kind has (a subset of "qkv"): the rows of ``in_proj``.
    projections: ClassVar[str] = "qkv"

    def __init__(self, model: DictConfig, layer: int = 0, shared: Optional[nn.Module] = None) -> None:
        super().__init__()
        d = model.d_model
        self.d_model, self.n_heads, self.d_head = d, model.n_heads, d // model.n_heads
        self.causal, self.layer, self.dropout = bool(model.attention.causal), layer, float(model.attention.dropout)
        self.in_proj, self.out_proj = InputProjections(d, self.projections), nn.Linear(d, d)
        # A shared module belongs to the encoder: keep it out of this module's children so it is registered
        # (and counted, and synchronised by DDP) exactly once.
        self.__dict__["shared"] = shared

    @property
    def q_proj(self) -> Optional[Linear]:
        """W_q, b_q (views of ``in_proj``), or None for a kind without queries."""
        return self.in_proj.part("q")

    @property
    def k_proj(self) -> Optional[Linear]:
        """W_k, b_k (views of ``in_proj``), or None for a kind without keys of their own."""
        return self.in_proj.part("k")

    @property
    def v_proj(self) -> Optional[Linear]:
        """W_v, b_v (views of ``in_proj``)."""
        return self.in_proj.part("v")

    def own(self, shared: nn.Module) -> None:
        """Make ``shared`` this layer's child: a standalone layer (no encoder to hold it) moves, converts, saves
        and trains its shared module with itself (``.to()``, ``.double()``, ``state_dict``, ``parameters``)."""
        del self.__dict__["shared"]
        self.shared = shared

    # ---------------------------------------------- hooks of the model: rules, forms, what is shared, weights
    @classmethod
    def check(cls, model: DictConfig) -> None:
        """The kind's own rules (ConfigError naming key, value and what is allowed)."""

    @classmethod
    def select(cls, model: DictConfig) -> type["SelfAttention"]:
        """The class that implements this kind with the given options (itself by default)."""
        return cls

    @classmethod
    def build_shared(cls, model: DictConfig) -> Optional[nn.Module]:
        """A module shared by every layer of the model (None: nothing shared)."""
        return None

    # Options that no weight depends on (they may differ between pretraining and fine-tuning).
    weight_free_options: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def settled_options(cls, options: dict, causal: bool) -> dict:
        """``options`` (plain data, as a config gives them: defaults may be missing) with every option the kind
        resolves from the rest of the config (an ``auto``) written as what it resolves to, so that two configs
        whose settled options are equal start the same model. The given options by default."""
        return options

    @classmethod
    def weight_options(cls, model: DictConfig) -> dict:
        """The kind's options that its weights depend on (defaults filled in): a checkpoint's weights load into a
        model of this kind only when these are equal."""
        options = OmegaConf.to_container(kind_options(model.attention), resolve=True)
        return {key: value for key, value in options.items() if key not in cls.weight_free_options}

    @classmethod
    def extra_parameters(cls, model: DictConfig) -> int:
        """An upper estimate of the parameters and buffers the kind adds to the model beyond each layer's Q/K/V/O
        (the memory preflight's estimate)."""
        return 0

    @classmethod
    def compressed_lengths(cls, model: DictConfig) -> Optional[list[int]]:
        """Per layer, the number of slots a query attends to when the kind compresses the sequence to a fixed
        length (Linformer's k); None for a kind that does not."""
        return None

    # ---------------------------------------------- hooks of training: the optimiser's groups, metrics.json
    def no_decay_parameters(self) -> Iterable[nn.Parameter]:
        """Parameters of this layer (or of its shared module) that AdamW must not decay, beyond the biases and
        norms that no kind decays (``lightning_modules.optim``); none by default."""
        return ()

    @classmethod
    def projection_parameters(cls, shared: Optional[nn.Module]) -> int:
        """The trainable parameters of the kind's sequence projections, held by the model's ``shared`` module
        (``metrics.json``'s ``projection_parameters``); 0 for a kind without."""
        return 0

    # ---------------------------------------------- hooks of analysis: linformer-lab analyze, the spectrum
    # What analysis calls the layer's context-mapping matrix (``analyze``'s figure titles).
    context_label: ClassVar[str] = "P = softmax(QKᵀ/√d)"
    # Every query weighs every key by softmax(q·k/√d_h) (full attention): a reference for other kinds' maps (and the
    # bench's baseline).
    exact: ClassVar[bool] = False
    # Every query still scores all n keys (full attention, and ablations built on it such as one-sided Linformer):
    # never faster per token than full attention, which the study plan says beside its speed ratio.
    quadratic: ClassVar[bool] = False

    def context_matrix(self, calls: list[Tensor], length: int) -> Tensor:
        """The layer's context-mapping matrix (B, h, T, S) from the probabilities of the
        ``scaled_dot_product_attention`` calls it made in one forward (``lightning_modules.analysis``); raises
        ValueError, one line naming what it cannot show, for a kind that forms no such matrix."""
        if len(calls) != 1:
            raise ValueError(
                f"kind {self.kind!r} forms no softmax matrix over the keys to read ({len(calls)} "
                "scaled_dot_product_attention calls in one layer): the attention spectrum cannot be shown"
            )
        return calls[0]

    @classmethod
    def analyze_shared(
        cls, shared: Optional[nn.Module], reference_grams: Optional[list[Tensor]], seed: int
    ) -> tuple[dict, dict]:
        """What the model's ``shared`` module learned (``linformer-lab analyze``): summary entries and figures (name →
        matplotlib Figure). ``reference_grams``: per layer Σ PᵀP of a full-attention run on the same sequences (with
        ``--reference``), ``seed`` the run's. Nothing by default."""
        return {}, {}

    @classmethod
    def report_shared(cls, summary: dict) -> list[str]:
        """The lines of ``analyze``'s text report for the entries :meth:`analyze_shared` put into ``summary``."""
        return []

    @classmethod
    def spectrum_suggestions(
        cls, ks: list[int], run_dir: Any, step: int, energy: float, samples: int
    ) -> dict[str, str]:
        """Config layers (file name → YAML text) that give this kind the compressed length ``ks[l]`` in layer l: the
        smallest length keeping ``energy`` of every head's cumulative singular value in the attention spectrum of
        the run ``run_dir`` at ``step`` on ``samples`` sequences. ``analyze`` writes every registered kind's into the
        run's ``analysis/``, whatever the analysed run's kind. None by default."""
        return {}

    @classmethod
    def spectrum_report(cls, ks: list[int]) -> list[str]:
        """The lines of ``analyze``'s text report that name :meth:`spectrum_suggestions`' lengths ``ks``."""
        return []

    # ------------------------------------------------------------------------------ the equation
    def attend(self, x: Tensor, q: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        """The heads' outputs: x (B, T, d), q (B, h, T, d_h), mask (B, T) or None → (B, h, T, d_h), for a kind that
        does not read K and V of every position (it makes its own from x); the others implement :meth:`attend_qkv`.

        q is this call's own (:meth:`forward` built it and reads it no more): without autograd a kind may write
        its output over it."""
        raise NotImplementedError

    def attend_qkv(self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout_p: float) -> Tensor:
        """The heads' outputs from Q, K, V of every position, each (B, h, T, d_h), mask (B, T) or None →
        (B, h, T, d_h). A kind that implements it gets Q, K and V from one product (:meth:`queries_keys_values`);
        q, k and v are this call's own, as in :meth:`attend`."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------ shared pieces
    def heads(self, x: Tensor) -> Tensor:
        """(B, T, d) → (B, h, T, d_h)."""
        b, t, _ = x.shape
        return x.view(b, t, self.n_heads, self.d_head).transpose(1, 2)

    def projected(self, x: Tensor, names: str) -> tuple[Tensor, ...]:
        """X W_nᵀ + b_n for each projection n of ``names`` (e.g. "kv"), one (B, h, T, d_h) each, from one product
        over their rows of ``in_proj`` (one GEMM of m·d columns runs faster than m of d)."""
        return tuple(self.heads(y) for y in self.in_proj(x, names))

    def queries_keys_values(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Q = X W_qᵀ + b_q, K = X W_kᵀ + b_k, V = X W_vᵀ + b_v, each (B, h, T, d_h), in one product."""
        return self.projected(x, "qkv")

    def keys_values(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """K = X W_kᵀ + b_k and V = X W_vᵀ + b_v, each (B, h, T, d_h), in one product."""
        return self.projected(x, "kv")

    def forward(self, x: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """x: (B, T, d); mask: (B, T) bool, True at real tokens (None: no padding) → (B, T, d)."""
        b, t, _ = x.shape
        p = self.dropout if self.training else 0.0
        if type(self).attend_qkv is not SelfAttention.attend_qkv:  # the kind reads K, V of every position
            out = self.attend_qkv(*self.queries_keys_values(x), mask, p)  # (B, h, T, d_h)
        else:
            out = self.attend(x, self.heads(self.q_proj(x)), mask, p)  # (B, h, T, d_h)
        return self.out_proj(out.transpose(1, 2).reshape(b, t, self.d_model))

    # ------------------------------------------------------------------------------ incremental decoding
    def init_state(self, batch_size: int, capacity: int, device: Any = None, dtype: Any = None) -> dict:
        """Empty decoding state of this layer (kinds with a streaming form override it)."""
        if not self.causal:
            raise ValueError("incremental decoding needs causal attention (attention.causal=true)")
        raise ValueError(
            f"attention kind {self.kind!r} has no streaming form: incremental decoding needs a causal kind that has one"
        )

    def step(self, x: Tensor, state: dict) -> tuple[Tensor, dict]:
        """The output at position state["t"] from its input x (B, 1, d) → ((B, 1, d), state), in place."""
        raise ValueError(f"attention kind {self.kind!r} has no streaming form")

    def kv_cache(self, batch_size: int, capacity: int, device: Any = None, dtype: Any = None) -> dict:
        """The decoding state of a kind that caches every key: ``k``, ``v`` of (B, h, capacity, d_h) and the next
        position ``t`` (a non-causal layer refuses, as :meth:`init_state` does)."""
        if not self.causal:
            return SelfAttention.init_state(self, batch_size, capacity, device, dtype)
        shape = (batch_size, self.n_heads, capacity, self.d_head)
        return {
            "t": 0,
            "k": torch.zeros(shape, device=device, dtype=dtype),
            "v": torch.zeros(shape, device=device, dtype=dtype),
        }

    def cache_step(self, x: Tensor, state: dict) -> tuple[Tensor, int]:
        """Store position t = state["t"]'s key and value (x: (B, 1, d)) in the cache; its query (B, h, 1, d_h), t."""
        t = state["t"]
        if t >= state["k"].shape[2]:
            raise ValueError(f"decoding position {t} exceeds the state's capacity of {state['k'].shape[2]} tokens")
        k, v = self.keys_values(x)  # (B, h, 1, d_h)
        state["k"][:, :, t], state["v"][:, :, t] = k[:, :, 0], v[:, :, 0]
        return self.heads(self.q_proj(x)), t

    def merge_step(self, out: Tensor) -> Tensor:
        """(B, h, 1, d_h) → (B, 1, d) through W_o."""
        return self.out_proj(out.transpose(1, 2).reshape(out.shape[0], 1, self.d_model))
